//! Text a node or another party wrote, made safe to show: on a terminal (`query`, `verify`,
//! `bootstrap`, the human log), in `/metrics` and anywhere a line is read by a person. A key, a
//! name or a reason may hold any character; shown raw, an ESC or BEL runs as a terminal
//! command, a newline forges a line, a bidi override reorders what is read.
//!
//! Every control character (C0, DEL, C1) and every invisible formatting character (bidi
//! embeddings, overrides and isolates, zero-width marks, the BOM) is shown as Rust writes it
//! escaped, `\u{1b}`; everything else as it is. JSON output needs none of this: JSON escapes
//! control characters itself, and a program reads it.

use std::borrow::Cow;

/// Whether `c` is shown escaped.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
}

/// `s` with every control and invisible formatting character escaped (`\u{1b}`).
pub fn visible(s: &str) -> Cow<'_, str> {
    if !s.chars().any(hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if hidden(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Every string in `v` (keys of objects too) made [`visible`], for a table made of it.
pub fn visible_json(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::String(s) => {
            if let Cow::Owned(shown) = visible(s) {
                *s = shown;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(visible_json),
        Value::Object(fields) => {
            let odd: Vec<String> = fields.keys().filter(|k| k.chars().any(hidden)).cloned().collect();
            for k in odd {
                if let Some(value) = fields.remove(&k) {
                    fields.insert(visible(&k).into_owned(), value);
                }
            }
            fields.values_mut().for_each(visible_json);
        }
        _ => {}
    }
}

/// `bytes` as a person reads a line of a log: every line break but a last one escaped too (a
/// log record is one line), bytes that are not UTF-8 replaced.
pub fn visible_line(bytes: &[u8]) -> Cow<'_, [u8]> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let clean = body.iter().all(|&b| (0x20..0x7f).contains(&b));
    if clean {
        return Cow::Borrowed(bytes);
    }
    let text = String::from_utf8_lossy(body);
    let mut out = visible(&text).into_owned().into_bytes();
    if body.len() < bytes.len() {
        out.push(b'\n');
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidi_characters_are_shown_escaped_and_the_rest_as_is() {
        assert!(matches!(visible("alpha.app=2Edb ünïcode ✓"), Cow::Borrowed(_)));
        assert_eq!(visible("a\u{1b}]0;pwned\u{7}b"), "a\\u{1b}]0;pwned\\u{7}b");
        assert_eq!(visible("x\u{1b}[2J\ny\rz\u{0}\t"), "x\\u{1b}[2J\\u{a}y\\u{d}z\\u{0}\\u{9}");
        assert_eq!(visible("user\u{202e}gpj.exe\u{2066}"), "user\\u{202e}gpj.exe\\u{2066}");
        assert_eq!(visible("\u{9b}31m\u{7f}\u{feff}\u{200b}"), "\\u{9b}31m\\u{7f}\\u{feff}\\u{200b}");
    }

    #[test]
    fn every_string_of_a_reply_is_made_visible_keys_included() {
        let mut v = serde_json::json!({"entries": [{"key": "a\u{1b}[2J", "n": 3}], "bad\nkey": ["\u{7}"]});
        visible_json(&mut v);
        assert_eq!(v, serde_json::json!({"entries": [{"key": "a\\u{1b}[2J", "n": 3}], "bad\\u{a}key": ["\\u{7}"]}));
    }

    #[test]
    fn a_log_line_stays_one_line() {
        assert!(matches!(visible_line(b"INFO plain line\n"), Cow::Borrowed(_)));
        assert_eq!(&*visible_line(b"WARN key a\nFORGED \x1b[2J\n"), b"WARN key a\\u{a}FORGED \\u{1b}[2J\n");
        assert_eq!(&*visible_line(b"bytes \xff\x07"), "bytes \u{fffd}\\u{7}".as_bytes());
    }
}
