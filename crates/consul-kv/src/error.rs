//! Errors. Every message names what failed and what to check, and none ever
//! contains a token: tokens travel only in a request header, and errors
//! never include header values.

/// A failed Consul request or an invalid configuration.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// HTTP 401/403: the token is unknown ("ACL not found") or lacks a policy
    /// ("Permission denied").
    #[error(
        "Consul denied access to key {key:?} (HTTP {status}: {message}); \
         check that the ACL token exists and has a key_prefix {policy} policy for this key"
    )]
    AccessDenied {
        key: String,
        status: u16,
        message: String,
        /// The policy the request needed: "read" or "write".
        policy: &'static str,
    },

    /// Connection refused, DNS failure, TLS failure or timeout.
    #[error("cannot reach Consul at {address}: {detail}")]
    Unreachable { address: String, detail: String },

    /// 5xx or any other status this client does not expect.
    #[error("Consul at {address} answered HTTP {status} for key {key:?}: {body}")]
    Server {
        address: String,
        key: String,
        status: u16,
        /// A short excerpt of the response body.
        body: String,
    },

    /// The answer outgrew the reader's limit; the rest was never read.
    #[error("Consul's answer for {key:?} is larger than {limit} bytes")]
    TooLarge { key: String, limit: u64 },

    /// A response that does not follow the Consul API (bad header, JSON or base64).
    #[error("unexpected response from Consul: {0}")]
    Protocol(String),

    /// The client configuration is unusable.
    #[error("invalid Consul client configuration: {0}")]
    Config(String),
}

/// The error class, stable enough to use as a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    AccessDenied,
    Unreachable,
    Server,
    Protocol,
    Config,
    TooLarge,
}

impl Error {
    /// Consul refused the request as malformed (HTTP 400), as it does a key with a character
    /// that does not print: asking again will not help, and other keys are not concerned.
    pub fn is_bad_request(&self) -> bool {
        matches!(self, Error::Server { status: 400, .. })
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::AccessDenied { .. } => ErrorKind::AccessDenied,
            Error::Unreachable { .. } => ErrorKind::Unreachable,
            Error::Server { .. } => ErrorKind::Server,
            Error::Protocol(_) => ErrorKind::Protocol,
            Error::Config(_) => ErrorKind::Config,
            Error::TooLarge { .. } => ErrorKind::TooLarge,
        }
    }
}

impl ErrorKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorKind::AccessDenied => "access_denied",
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::Server => "server",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Config => "config",
            ErrorKind::TooLarge => "too_large",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error and its causes on one line: reqwest's own message ("error
/// sending request") hides the useful part ("connection refused") in `source()`.
pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}

/// The first line of a response body, trimmed and cut to a readable length.
pub(crate) fn excerpt(body: &str) -> String {
    const MAX_CHARS: usize = 200;
    let line = body.trim().lines().next().unwrap_or("").trim();
    match line.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None if line.is_empty() => "(empty body)".to_owned(),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_denied_message_is_actionable() {
        let err = Error::AccessDenied {
            key: "app/db".into(),
            status: 403,
            message: "Permission denied".into(),
            policy: "read",
        };
        assert_eq!(
            err.to_string(),
            "Consul denied access to key \"app/db\" (HTTP 403: Permission denied); \
             check that the ACL token exists and has a key_prefix read policy for this key"
        );
        assert_eq!(err.kind().as_str(), "access_denied");
    }

    #[test]
    fn excerpt_keeps_one_short_line() {
        assert_eq!(excerpt("  ACL not found\n"), "ACL not found");
        assert_eq!(excerpt("first\nsecond"), "first");
        assert_eq!(excerpt(""), "(empty body)");
        let long = "x".repeat(500);
        assert_eq!(excerpt(&long).chars().count(), 201);
    }
}
