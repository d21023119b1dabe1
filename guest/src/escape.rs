//! Tokens and the `=<hex>` escape (SPEC §2).
//!
//! A key token may hold only `A-Z a-z 0-9 - _ /`. Identifiers are plain tokens and never escaped;
//! free names are escaped byte by byte. Decoding is strict: a token is accepted only if it
//! re-encodes to exactly itself, so every name has one and only one spelling in a key.

use std::borrow::Cow;

/// Longest identifier or free name accepted anywhere (NATS keys are short; this bounds work).
pub const MAX_NAME_BYTES: usize = 256;

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'/')
}

/// Whether `s` is an identifier: `[A-Za-z0-9][A-Za-z0-9_-]*`, at most [`MAX_NAME_BYTES`].
pub fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && b.len() <= MAX_NAME_BYTES && b[0].is_ascii_alphanumeric() && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

/// Why `s` is not an identifier, for error messages; `None` when it is one.
pub fn identifier_problem(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("is empty".into());
    }
    if s.len() > MAX_NAME_BYTES {
        return Some(format!("is {} bytes, longer than {MAX_NAME_BYTES}", s.len()));
    }
    if is_identifier(s) {
        return None;
    }
    Some(format!("{:?} is not an identifier ([A-Za-z0-9][A-Za-z0-9_-]*)", shorten(s)))
}

/// Why `s` cannot be a free name (empty, or longer than [`MAX_NAME_BYTES`]); `None` when it can.
pub fn name_problem(s: &str) -> Option<String> {
    if s.is_empty() || s.len() > MAX_NAME_BYTES {
        return Some(format!("must be 1 to {MAX_NAME_BYTES} bytes, not {}", s.len()));
    }
    None
}

/// [`encode`], borrowing `name` when it escapes nothing (nearly every name).
pub fn encoded(name: &str) -> Cow<'_, str> {
    if name.bytes().all(is_token_byte) {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(encode(name))
    }
}

/// Writes a free name as one key token: every byte outside the token alphabet, and `=` itself,
/// becomes `=` and two upper-case hex digits.
pub fn encode(name: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(name.len());
    for &b in name.as_bytes() {
        if is_token_byte(b) {
            out.push(b as char);
        } else {
            out.push('=');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 15) as usize] as char);
        }
    }
    out
}

/// Reads one escaped token back into its name, or says why it is out of shape.
pub fn decode(token: &str) -> Result<String, String> {
    decoded(token).map(Cow::into_owned)
}

/// [`decode`], borrowing the token when it escapes nothing: it is then its own name (token
/// bytes are ASCII), as nearly every token is.
pub fn decoded(token: &str) -> Result<Cow<'_, str>, String> {
    if token.is_empty() {
        return Err("empty token".into());
    }
    let bytes = token.as_bytes();
    if bytes.iter().all(|&b| is_token_byte(b)) {
        return Ok(Cow::Borrowed(token));
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'=' {
            let hex = bytes.get(i + 1..i + 3).ok_or_else(|| format!("dangling escape at byte {i} of {:?}", shorten(token)))?;
            let value = hex_value(hex[0])
                .zip(hex_value(hex[1]))
                .map(|(h, l)| h << 4 | l)
                .ok_or_else(|| format!("escape at byte {i} of {:?} is not two upper-case hex digits", shorten(token)))?;
            if is_token_byte(value) {
                return Err(format!("escape at byte {i} of {:?} writes {:?}, which needs no escape", shorten(token), value as char));
            }
            out.push(value);
            i += 3;
        } else if is_token_byte(b) {
            out.push(b);
            i += 1;
        } else {
            return Err(format!("byte {b:#04x} at {i} may not stand in a token"));
        }
    }
    String::from_utf8(out).map(Cow::Owned).map_err(|_| format!("{:?} does not decode to UTF-8", shorten(token)))
}

/// Upper-case hex only: `=3a` is out of shape, so that each name has a single spelling.
fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Cuts a string for an error message, on a character boundary.
pub fn shorten(s: &str) -> &str {
    const MAX: usize = 80;
    if s.len() <= MAX {
        return s;
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escapes_the_examples_of_the_spec() {
        assert_eq!(encode("shell:zsh:normal"), "shell=3Azsh=3Anormal");
        assert_eq!(encode("db.url"), "db=2Eurl");
        assert_eq!(encode("a=b"), "a=3Db");
        assert_eq!(encode("é"), "=C3=A9");
        assert_eq!(encode("a-b_c/d"), "a-b_c/d");
    }

    #[test]
    fn refuses_non_canonical_escapes() {
        assert!(decode("=3a").unwrap_err().contains("upper-case"));
        assert!(decode("=61").unwrap_err().contains("needs no escape"));
        assert!(decode("ab=4").unwrap_err().contains("dangling"));
        assert!(decode("=C3").unwrap_err().contains("UTF-8"));
        assert!(decode("").unwrap_err().contains("empty"));
        assert!(decode("a b").unwrap_err().contains("may not stand"));
    }

    #[test]
    fn tells_identifiers_apart() {
        assert!(is_identifier("alpha-1_x"));
        for bad in ["", "*", ">", "a.b", "-a", "_a", "a b", "é", "a/b", "a=b"] {
            assert!(!is_identifier(bad), "{bad:?}");
            assert!(identifier_problem(bad).is_some());
        }
        assert!(!is_identifier(&"a".repeat(MAX_NAME_BYTES + 1)));
        assert!(is_identifier(&"a".repeat(MAX_NAME_BYTES)));
    }

    /// Any-case hex, any byte: what a careless writer might mean by a token.
    fn loose_decode(token: &str) -> Option<String> {
        let b = token.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'=' {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8(out).ok()
    }

    proptest! {
        #[test]
        fn escaping_round_trips_every_name(name in "\\PC+|[\\x00-\\x7f]+|.+") {
            let token = encode(&name);
            prop_assert!(token.bytes().all(|b| is_token_byte(b) || b == b'='));
            prop_assert_eq!(decode(&token).unwrap(), name);
        }

        #[test]
        fn decoding_accepts_only_what_encoding_writes(token in "[A-Za-z0-9=_/ .-]{1,12}|(=[0-9A-Fa-f]{0,2}){1,4}") {
            match decode(&token) {
                Ok(name) => prop_assert_eq!(encode(&name), token),
                // Read loosely, a refused token may still mean some name; that name's one
                // spelling must then be another token.
                Err(_) => if let Some(name) = loose_decode(&token) {
                    prop_assert_ne!(encode(&name), token);
                },
            }
        }
    }

    /// Every byte, not a sample of 256 draws (which misses about a third of them).
    #[test]
    fn every_lower_case_or_needless_escape_is_rejected() {
        for b in 0u8..=255 {
            let upper = format!("={b:02X}");
            let lower = format!("={b:02x}");
            if is_token_byte(b) {
                assert!(decode(&upper).is_err(), "{upper} decoded though {:?} needs no escape", b as char);
            } else if b.is_ascii() {
                assert_eq!(decode(&upper), Ok((b as char).to_string()), "{upper}");
            } else {
                assert!(decode(&upper).is_err(), "{upper} alone is no UTF-8, yet decoded");
            }
            if lower != upper {
                assert!(decode(&lower).is_err(), "{lower} decoded: an escape is upper case");
            }
        }
    }
}
