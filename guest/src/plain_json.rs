//! The plainest JSON, recognised in one pass: what [`crate::value::Shown::of`] passes through
//! without asking serde_json. Most values of a mesh are small objects of strings and integers,
//! and every line of every answer shows one; serde_json's `RawValue` read and the tree check
//! after it were an eighth of the guest's time a request.
//!
//! The rule is a subset, never a superset: [`is_plain_json`] says `true` only for text that
//! serde_json reads whole as a `RawValue` (the same bytes, no whitespace around them) and that
//! a tree reader holds. Anything else — an escape in a string, an exponent, a number of 300
//! digits, nesting past [`MAX_DEPTH`], whitespace around the value — is `false`, which means only
//! "ask serde_json"; it never decides how a value is shown.

/// Nesting taken here; deeper goes to serde_json (whose limit is 128).
const MAX_DEPTH: usize = 64;
/// Digits one number may have here; more go to serde_json (a float's range ends past 300).
const MAX_DIGITS: usize = 100;

/// Whether `text` is plain JSON (see the module): a value with nothing around it, strings
/// without escapes, numbers without exponents.
pub fn is_plain_json(text: &str) -> bool {
    let json = text.as_bytes();
    let mut at = 0;
    // One bit a level: set for an object, clear for an array.
    let mut objects: u64 = 0;
    let mut depth = 0;
    'value: loop {
        // A value is expected at `at`.
        match json.get(at) {
            Some(&open @ (b'{' | b'[')) => {
                if depth == MAX_DEPTH {
                    return false;
                }
                let object = open == b'{';
                if object {
                    objects |= 1 << depth;
                } else {
                    objects &= !(1 << depth);
                }
                depth += 1;
                at = skip_space(json, at + 1);
                if json.get(at) == Some(if object { &b'}' } else { &b']' }) {
                    depth -= 1;
                    at += 1;
                } else if !object {
                    continue 'value;
                } else {
                    match member(json, at) {
                        Some(next) => {
                            at = next;
                            continue 'value;
                        }
                        None => return false,
                    }
                }
            }
            Some(b'"') => match string(json, at) {
                Some(next) => at = next,
                None => return false,
            },
            Some(b't') if json[at..].starts_with(b"true") => at += 4,
            Some(b'f') if json[at..].starts_with(b"false") => at += 5,
            Some(b'n') if json[at..].starts_with(b"null") => at += 4,
            Some(b'-' | b'0'..=b'9') => match number(json, at) {
                Some(next) => at = next,
                None => return false,
            },
            _ => return false,
        }
        // A value ended at `at`: close what it ends, or go on to the next one.
        loop {
            if depth == 0 {
                return at == json.len();
            }
            let in_object = objects >> (depth - 1) & 1 == 1;
            at = skip_space(json, at);
            match json.get(at) {
                Some(b',') => {
                    at = skip_space(json, at + 1);
                    if in_object {
                        match member(json, at) {
                            Some(next) => at = next,
                            None => return false,
                        }
                    }
                    continue 'value;
                }
                Some(b'}') if in_object => {
                    depth -= 1;
                    at += 1;
                }
                Some(b']') if !in_object => {
                    depth -= 1;
                    at += 1;
                }
                _ => return false,
            }
        }
    }
}

/// After the first byte of a value: whitespace as JSON has it.
fn skip_space(json: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = json.get(at) {
        at += 1;
    }
    at
}

/// `"name"` and `:` from `at`; where the member's value starts.
fn member(json: &[u8], at: usize) -> Option<usize> {
    if json.get(at) != Some(&b'"') {
        return None;
    }
    let at = skip_space(json, string(json, at)?);
    (json.get(at) == Some(&b':')).then(|| skip_space(json, at + 1))
}

/// A string without escapes or control bytes starting at `at` (its quote); just past its
/// closing quote. (The text is UTF-8 already: its bytes past ASCII need no look.)
fn string(json: &[u8], at: usize) -> Option<usize> {
    let mut i = at + 1;
    loop {
        match *json.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' | 0..0x20 => return None,
            _ => i += 1,
        }
    }
}

/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?` from `at`, not followed by an exponent; just past it.
fn number(json: &[u8], mut at: usize) -> Option<usize> {
    let digits = |json: &[u8], from: usize| {
        let mut end = from;
        while json.get(end).is_some_and(u8::is_ascii_digit) {
            end += 1;
        }
        end - from
    };
    if json[at] == b'-' {
        at += 1;
    }
    let whole = digits(json, at);
    if whole == 0 || (json[at] == b'0' && whole > 1) {
        return None;
    }
    at += whole;
    let mut count = whole;
    if json.get(at) == Some(&b'.') {
        let fraction = digits(json, at + 1);
        if fraction == 0 {
            return None;
        }
        at += 1 + fraction;
        count += fraction;
    }
    (count <= MAX_DIGITS && !matches!(json.get(at), Some(b'e' | b'E'))).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What serde_json says: the text it reads whole as a `RawValue`, when a tree holds it too.
    fn by_serde(json: &[u8]) -> Option<String> {
        let raw: &serde_json::value::RawValue = serde_json::from_slice(json).ok()?;
        serde_json::from_str::<serde_json::Value>(raw.get()).ok()?;
        Some(raw.get().to_string())
    }

    #[test]
    fn takes_the_plain_values_of_a_mesh() {
        for json in [
            r#"{"line":"export X=1"}"#,
            "42",
            "-0.5",
            "0",
            "true",
            "null",
            "\"\"",
            "[]",
            "{}",
            r#"{"a":[1,{"b":null}],"c":"é ✓ 😀","d":false}"#,
            "{ \"a\" : [ 1 , 2 ] ,\n\t\"b\":{}\r}",
        ] {
            assert!(is_plain_json(json), "{json:?}");
            assert_eq!(by_serde(json.as_bytes()).as_deref(), Some(json), "serde agrees");
        }
    }

    #[test]
    fn leaves_to_serde_whatever_is_not_plain() {
        let deep = format!("{}1{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let long = "9".repeat(MAX_DIGITS + 1);
        for json in [
            " 1",
            "1 ",
            r#""a\"b""#,
            r#"{"a":"\u00e9"}"#,
            "1e5",
            "1.5E-3",
            "01",
            "1.",
            ".5",
            "-",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{1:2}",
            "[1 2]",
            "[1}",
            "{\"a\":1]",
            "tru",
            "nulls",
            "\"\x01\"",
            "\"unterminated",
            "",
            &deep,
            &long,
        ] {
            assert!(!is_plain_json(json), "{json:?}");
        }
    }

    proptest::proptest! {
        /// Over text made of JSON's own bytes (and a few others), plain is only ever said of
        /// what serde_json passes through as the same text.
        #[test]
        fn says_plain_only_of_what_serde_passes_whole(text in "[\\[\\]{}:,\" 0-9.eE+\\-truefalsn\\\\aé\\x01]{0,40}") {
            if is_plain_json(&text) {
                proptest::prop_assert_eq!(by_serde(text.as_bytes()), Some(text.clone()));
            }
        }

        /// Any value serde_json writes is plain unless it wrote an escape or an exponent, and
        /// passes through as it was written.
        #[test]
        fn takes_any_value_serde_writes_without_escapes_or_exponents(v in json_value()) {
            let text = serde_json::to_string(&v).unwrap();
            if !text.contains('\\') && !number_has_exponent(&text) {
                proptest::prop_assert!(is_plain_json(&text), "{}", text);
            }
            if is_plain_json(&text) {
                proptest::prop_assert_eq!(by_serde(text.as_bytes()), Some(text));
            }
        }
    }

    /// An `e` or `E` after a digit anywhere (in a string too: this only ever says more).
    fn number_has_exponent(text: &str) -> bool {
        let b = text.as_bytes();
        b.iter().enumerate().any(|(i, &c)| (c == b'e' || c == b'E') && i > 0 && b[i - 1].is_ascii_digit())
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(serde_json::Value::from),
            (-1.0e6f64..1.0e6).prop_map(serde_json::Value::from),
            "[a-z é\"\\\\\\x01]{0,12}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                prop::collection::btree_map("[a-z]{1,4}", inner, 0..6).prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
