//! The demo's application. Like the programs consulbind exists for, it reads its configuration
//! once, at start-up, and never again: Consul keys (`DEMO_KEYS`, comma-separated; a key ending
//! in `/` is a prefix) and the files of a mounted ConfigMap (`DEMO_CONFIG_DIR`).
//!
//! It prints what it read, one line a source, and keeps the same lines in `DEMO_REPORT`
//! (`demo-app report` prints them, for `kubectl exec`). Content it cannot use makes it exit 1, so
//! a bad change crash-loops its pods. `demo-app ready` is its readiness probe.
//!
//! With `DEMO_ONCE` set it exits 0 once it has read and reported everything, as a Job's
//! program would.
//!
//! In a key that ends in `.json` the object must parse. `"expiresAt": T` (seconds since the
//! epoch), as a certificate's end of validity would, makes content refused from T on: a pod that
//! started before exits 2 at T, and every start after it fails.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use std::{env, fs, thread};

const DEFAULT_REPORT: &str = "/tmp/demo-report";

fn main() -> ExitCode {
    let report = env::var("DEMO_REPORT").unwrap_or_else(|_| DEFAULT_REPORT.into());
    match env::args().nth(1).as_deref() {
        None => {}
        // Ready once start-up has read and accepted everything.
        Some("ready") => return if Path::new(&report).is_file() { ExitCode::SUCCESS } else { ExitCode::FAILURE },
        Some("report") => {
            return match fs::read_to_string(&report) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("demo-app: no report at {report}: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(other) => {
            eprintln!("demo-app: unknown command {other:?}; the commands are `ready` and `report`");
            return ExitCode::FAILURE;
        }
    }
    // As PID 1 a signal without a handler is ignored: without this a pod takes its whole grace
    // period to stop, and every rollout waits for it.
    extern "C" fn on_term(_: libc::c_int) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(0) }
    }
    // SAFETY: the handler calls only _exit.
    unsafe {
        libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_term as *const () as libc::sighandler_t);
    }
    match start(&report) {
        Ok(_) if env::var_os("DEMO_ONCE").is_some() => ExitCode::SUCCESS,
        Ok(expires) => {
            if let Some(left) = expires {
                thread::sleep(left);
                eprintln!("demo-app: the configuration expired (expiresAt)");
                return ExitCode::from(2);
            }
            loop {
                thread::park();
            }
        }
        Err(e) => {
            eprintln!("demo-app: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads and checks every source, then writes the report. Returns how long until the content
/// expires, if it does.
fn start(report: &str) -> Result<Option<Duration>, String> {
    let consul = env::var("CONSUL_HTTP_ADDR").unwrap_or_else(|_| "http://127.0.0.1:8500".into());
    let mut read = BTreeMap::new();
    for key in env::var("DEMO_KEYS").unwrap_or_default().split(',').map(str::trim).filter(|k| !k.is_empty()) {
        match key.strip_suffix('/') {
            Some(prefix) => {
                let names = match get(&consul, &format!("/v1/kv/{prefix}/?keys"))? {
                    Some(body) => serde_json::from_str::<Vec<String>>(&body)
                        .map_err(|e| format!("Consul's list of {key}: {e}"))?,
                    None => Vec::new(),
                };
                for name in names.iter().filter(|n| !n.ends_with('/')) {
                    let value = get(&consul, &format!("/v1/kv/{name}?raw"))?.unwrap_or_default();
                    read.insert(format!("consul:{name}"), value);
                }
            }
            None => {
                let value = get(&consul, &format!("/v1/kv/{key}?raw"))?.ok_or(format!("Consul has no key {key}"))?;
                read.insert(format!("consul:{key}"), value);
            }
        }
    }
    if let Ok(dir) = env::var("DEMO_CONFIG_DIR") {
        let entries = fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // The kubelet's atomic-writer links and folders.
            if name.starts_with("..") || !entry.path().is_file() {
                continue;
            }
            let value = fs::read_to_string(entry.path()).map_err(|e| format!("{dir}/{name}: {e}"))?;
            read.insert(format!("file:{name}"), value);
        }
    }
    let mut expires: Option<Duration> = None;
    for (source, value) in read.iter().filter(|(s, _)| s.ends_with(".json")) {
        let parsed: serde_json::Value =
            serde_json::from_str(value).map_err(|e| format!("{source} is not valid JSON ({e}): {value:?}"))?;
        let object = parsed.as_object().ok_or(format!("{source} is not a JSON object: {value:?}"))?;
        if let Some(at) = object.get("expiresAt") {
            let at = at.as_u64().ok_or(format!("{source}: expiresAt is not a whole number of seconds"))?;
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
            let left = Duration::from_secs(at).checked_sub(now).filter(|left| !left.is_zero());
            let left = left.ok_or(format!("{source} expired at {at} (expiresAt)"))?;
            expires = Some(expires.map_or(left, |e| e.min(left)));
        }
    }
    let mut lines = String::new();
    for (source, value) in &read {
        lines += &format!("read {source} = {}\n", value.replace('\n', "\\n"));
    }
    print!("{lines}");
    let _ = std::io::stdout().flush();
    // Written whole and renamed, so the probe never sees half a report.
    let tmp = format!("{report}.tmp");
    fs::write(&tmp, &lines).and_then(|()| fs::rename(&tmp, report)).map_err(|e| format!("{report}: {e}"))?;
    println!("ready");
    Ok(expires)
}

/// A GET on Consul's HTTP API: the body of a 200, none for a 404.
fn get(consul: &str, path: &str) -> Result<Option<String>, String> {
    let host = consul.strip_prefix("http://").ok_or(format!("CONSUL_HTTP_ADDR {consul:?} is not http://HOST:PORT"))?;
    let host = host.trim_end_matches('/');
    let fail = |e: std::io::Error| format!("Consul at {consul}: {e}");
    let mut stream = TcpStream::connect(host).map_err(fail)?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(fail)?;
    let token = env::var("CONSUL_HTTP_TOKEN").map(|t| format!("X-Consul-Token: {t}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {host}\r\n{token}\r\n").map_err(fail)?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).map_err(fail)?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").ok_or(format!("Consul at {consul}: a truncated answer"))?;
    match head.split_whitespace().nth(1) {
        Some("200") => Ok(Some(body.to_owned())),
        Some("404") => Ok(None),
        _ => Err(format!("Consul answered {path} with {}", head.lines().next().unwrap_or_default())),
    }
}
