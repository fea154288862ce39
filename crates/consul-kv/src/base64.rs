//! Decoder for the standard, padded base64 that Consul uses for KV values
//! (Go's `encoding/base64.StdEncoding`). Small enough not to need a crate.

/// Decodes standard-alphabet base64 with `=` padding. Returns `None` on any
/// malformed input.
pub(crate) fn decode(input: &str) -> Option<Vec<u8>> {
    let input = input.as_bytes();
    if !input.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(input.len() / 4 * 3);
    let chunks = input.chunks_exact(4);
    let last = chunks.len().wrapping_sub(1);
    for (i, chunk) in chunks.enumerate() {
        let padding = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if padding > 2 || (padding > 0 && i != last) {
            return None;
        }
        let mut bits = 0u32;
        for &c in &chunk[..4 - padding] {
            bits = bits << 6 | sextet(c)?;
        }
        bits <<= 6 * padding;
        out.extend_from_slice(&bits.to_be_bytes()[1..4 - padding]);
    }
    Some(out)
}

fn sextet(c: u8) -> Option<u32> {
    let value = match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    };
    Some(value.into())
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn decodes_rfc4648_vectors() {
        let vectors = [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ];
        for (encoded, plain) in vectors {
            assert_eq!(decode(encoded).as_deref(), Some(plain.as_bytes()), "{encoded}");
        }
    }

    #[test]
    fn decodes_binary_with_plus_and_slash() {
        assert_eq!(decode("+/8A").unwrap(), [0xfb, 0xff, 0x00]);
        assert_eq!(decode("AAEC/w==").unwrap(), [0, 1, 2, 255]);
    }

    #[test]
    fn rejects_malformed_input() {
        for bad in ["Zg", "Zg=", "Z===", "Zg==Zm9v", "Zm9v!A==", "Zm9-", "Zm9_", "Zm 9"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
