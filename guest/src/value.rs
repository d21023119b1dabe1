//! Passing stored values through to a reply without losing any (SPEC §3): JSON as it is, other
//! UTF-8 as a string marked `"encoding":"utf-8"`, anything else as base64 marked
//! `"encoding":"base64"`.

use serde_json::value::RawValue;

/// Appends `s` to `out` as a JSON string (RFC 8259 §7: `"`, `\\` and controls escaped).
pub fn push_str(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            out.push_str(&format!("\\u{b:04x}"));
        } else {
            out.push_str(esc);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Appends a JSON list to `out`, each item written by `item`.
pub fn push_list<T>(out: &mut String, items: impl IntoIterator<Item = T>, mut item: impl FnMut(&mut String, T)) {
    out.push('[');
    for (i, it) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        item(out, it);
    }
    out.push(']');
}

/// Appends a JSON list of strings to `out`.
pub fn push_strs<S: AsRef<str>>(out: &mut String, items: &[S]) {
    push_list(out, items, |out, s| push_str(out, s.as_ref()));
}

/// Writes one JSON object field by field, straight into a string: answers are rendered without
/// building a tree of values first.
pub struct Obj<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> Obj<'a> {
    pub fn new(out: &'a mut String) -> Self {
        out.push('{');
        Obj { out, first: true }
    }

    fn key(&mut self, k: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        push_str(self.out, k);
        self.out.push(':');
    }

    /// A string field.
    pub fn str(&mut self, k: &str, v: &str) -> &mut Self {
        self.key(k);
        push_str(self.out, v);
        self
    }

    /// A string field, only when there is a value.
    pub fn opt_str(&mut self, k: &str, v: Option<&str>) -> &mut Self {
        if let Some(v) = v {
            self.str(k, v);
        }
        self
    }

    /// A field whose value is already JSON text.
    pub fn raw(&mut self, k: &str, json: &str) -> &mut Self {
        self.key(k);
        self.out.push_str(json);
        self
    }

    /// A field whose value `f` writes.
    pub fn with(&mut self, k: &str, f: impl FnOnce(&mut String)) -> &mut Self {
        self.key(k);
        f(self.out);
        self
    }

    pub fn end(self) {
        self.out.push('}');
    }
}

/// Appends `,"value":…` (and `,"encoding":…` when the bytes are not JSON) to `out`.
///
/// Only JSON every reader can read is passed through as it is: a number out of any float's
/// range (`7E77777…`, found by fuzzing) fits the grammar but makes common parsers, this
/// project's `query` among them, refuse the whole reply; such a value goes as text.
pub fn push_value(out: &mut String, bytes: &[u8]) {
    out.push_str(",\"value\":");
    let readable = serde_json::from_slice::<&RawValue>(bytes).ok().filter(|raw| serde_json::from_str::<serde_json::Value>(raw.get()).is_ok());
    if let Some(raw) = readable {
        out.push_str(raw.get());
    } else if let Ok(text) = std::str::from_utf8(bytes) {
        push_str(out, text);
        out.push_str(",\"encoding\":\"utf-8\"");
    } else {
        out.push('"');
        out.push_str(&base64(bytes));
        out.push_str("\",\"encoding\":\"base64\"");
    }
}

/// Standard base64 with padding (RFC 4648 §4).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(bytes: &[u8]) -> String {
        let mut s = String::new();
        push_value(&mut s, bytes);
        s
    }

    #[test]
    fn passes_json_through_as_it_is() {
        assert_eq!(render(br#"{"line":"export X=1"}"#), r#","value":{"line":"export X=1"}"#);
        assert_eq!(render(b"42"), r#","value":42"#);
    }

    #[test]
    fn passes_a_number_no_reader_can_hold_as_text() {
        let bytes = b"77777777E77333333333333333333333";
        let out = format!("{{\"k\":0{}}}", render(bytes));
        let v: serde_json::Value = serde_json::from_str(&out).expect("the reply stays readable");
        assert_eq!((v["value"].as_str(), v["encoding"].as_str()), (Some("77777777E77333333333333333333333"), Some("utf-8")));
    }

    #[test]
    fn marks_text_and_binary_values() {
        assert_eq!(render(b"plain text"), r#","value":"plain text","encoding":"utf-8""#);
        assert_eq!(render(b""), r#","value":"","encoding":"utf-8""#);
        assert_eq!(render(&[0xff, 0x00, 0x41]), r#","value":"/wBB","encoding":"base64""#);
    }

    #[test]
    fn writes_json_strings_serde_can_read_back() {
        for text in ["plain", "quote \" and \\ back", "ctl \u{1} \n \t \r", "é ✓", ""] {
            let mut s = String::new();
            push_str(&mut s, text);
            assert_eq!(serde_json::from_str::<String>(&s).unwrap(), text);
            assert_eq!(s, serde_json::to_string(text).unwrap());
        }
    }

    #[test]
    fn encodes_base64_like_rfc_4648() {
        for (input, want) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")] {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }
}
