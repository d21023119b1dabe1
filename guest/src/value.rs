//! Answers as JSON, written by serde from borrowed structs, and stored values passed through to
//! a reply without losing any (SPEC §3): JSON as it is, other UTF-8 as a string marked
//! `"encoding":"utf-8"`, anything else as base64 marked `"encoding":"base64"`.
//!
//! Every answer is a `#[derive(Serialize)]` struct over the data it shows (values as
//! [`RawValue`], never parsed into a tree); pages are cut by size, so an entry is rendered on its
//! own ([`raw`]) and its length counted before it joins the page. The two lines answers have
//! most of — an entry of a bucket's page, a module of a status page — and their pages are
//! written by [`Object`] instead, into one string each, the same bytes as their structs' derive
//! (which stays: the schema is made from it, and the tests hold the two equal). What made that
//! pay is the string writing: [`write_str`] looks at eight bytes at a time, serde_json at one
//! (written by hand a byte at a time, a status page measured the same as by serde). A stored
//! value is read twice (as JSON, then as a tree would) only when it could hold what a tree
//! refuses ([`plainly_readable`]).

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Serialize;
use serde_json::value::RawValue;

/// The last value of `name` in `bytes` read as one JSON object, without building the object
/// (as serde_json's `Value` reads it: a repeated field is its last, the same depth limit); `Err`
/// when `bytes` is not exactly one JSON object. A record's one field read this way costs no
/// tree of the rest (a status reads a `part`, a `want`, a `build` from every module's records).
// What is wrong with a value that is no object is the caller's to say: no error to carry.
#[allow(clippy::result_unit_err)]
pub fn field<'a>(bytes: &'a [u8], name: &str) -> Result<Option<&'a RawValue>, ()> {
    struct Field<'n>(&'n str);
    impl<'de> de::DeserializeSeed<'de> for Field<'_> {
        type Value = Option<&'de RawValue>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Field<'_> {
        type Value = Option<&'de RawValue>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(is) = map.next_key_seed(Is(self.0))? {
                if is {
                    let raw = map.next_value::<&RawValue>()?;
                    // Kept as it is, but read as a tree would read it (a lone surrogate in a
                    // string fails the record either way).
                    read_as_a_tree(raw).map_err(de::Error::custom)?;
                    found = Some(raw);
                } else {
                    // Read as a tree would read it (strings decoded), and dropped.
                    map.next_value::<Readable>()?;
                }
            }
            Ok(found)
        }
    }
    /// Whether a key is `name`, read without copying it.
    struct Is<'n>(&'n str);
    impl<'de> de::DeserializeSeed<'de> for Is<'_> {
        type Value = bool;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_str(self)
        }
    }
    impl<'de> Visitor<'de> for Is<'_> {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a key")
        }
        fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
            Ok(key == self.0)
        }
    }
    let mut d = serde_json::Deserializer::from_slice(bytes);
    let found = de::DeserializeSeed::deserialize(Field(name), &mut d).map_err(|_| ())?;
    d.end().map_err(|_| ())?;
    Ok(found)
}

/// `v` as JSON text. Serializing the answers' own structs cannot fail (string keys only, no
/// fallible `Serialize`); were it ever to, the text says so instead of panicking.
pub fn to_json<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":{{\"code\":\"internal\",\"message\":{:?}}}}}", e.to_string()))
}

/// `v` rendered alone, to be counted and then placed in a page as it is.
pub fn raw<T: Serialize + ?Sized>(v: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(v).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

/// A JSON object written field by field into a string, for the lines an answer has many of
/// (every entry of a bucket's page, every module of a status page): the same bytes serde's
/// derive writes for the line's struct (which stays, for the schema and as the tests'
/// reference), without its per-field machinery, a string grown twice, and a copy into a
/// `RawValue` and another into the page. Objects nested in it are written into the same string.
pub struct Object<'o> {
    out: &'o mut String,
    first: bool,
}

impl<'o> Object<'o> {
    /// Opens an object at the end of `out`; [`Object::end`] closes it.
    pub fn new(out: &'o mut String) -> Object<'o> {
        out.push('{');
        Object { out, first: true }
    }

    /// Starts the field `name`: a literal of this crate, which needs no escape. Inlined, so
    /// that the name's copy has a constant length: in wasm a copy of unknown length is a call
    /// out of the guest (`memory.copy`), and a line starts a field ten times.
    #[inline(always)]
    fn name(&mut self, name: &'static str) {
        debug_assert!(name.bytes().all(|b| escaped_byte_len(b) == 1), "{name:?} is written unescaped");
        if !std::mem::take(&mut self.first) {
            self.out.push(',');
        }
        self.out.push('"');
        self.out.push_str(name);
        self.out.push_str("\":");
    }

    pub fn str(&mut self, name: &'static str, value: &str) {
        self.name(name);
        write_str(self.out, value);
    }

    /// A string known to escape nothing (a key that parsed, a token borrowed from one: every
    /// byte of either is of the key alphabet), written without looking for escapes.
    pub fn plain_str(&mut self, name: &'static str, value: &str) {
        debug_assert!(value.bytes().all(|b| escaped_byte_len(b) == 1), "{value:?} escapes nothing");
        self.name(name);
        self.out.push('"');
        self.out.push_str(value);
        self.out.push('"');
    }

    /// A token of a key that parsed: borrowed, it escapes nothing; decoded from escapes, it may.
    pub fn token(&mut self, name: &'static str, value: std::borrow::Cow<str>) {
        match value {
            std::borrow::Cow::Borrowed(v) => self.plain_str(name, v),
            std::borrow::Cow::Owned(v) => self.str(name, &v),
        }
    }

    /// The field when there is a value; nothing when not (`skip_serializing_if = "Option::is_none"`).
    pub fn some_str(&mut self, name: &'static str, value: Option<&str>) {
        if let Some(value) = value {
            self.str(name, value);
        }
    }

    pub fn u64(&mut self, name: &'static str, value: u64) {
        self.name(name);
        write_u64(self.out, value);
    }

    pub fn bool(&mut self, name: &'static str, value: bool) {
        self.name(name);
        self.out.push_str(if value { "true" } else { "false" });
    }

    /// `value`, JSON text already (a line or a stored value read as JSON), as it is.
    pub fn raw(&mut self, name: &'static str, value: &str) {
        self.name(name);
        self.out.push_str(value);
    }

    /// `"name":[…]`, its items JSON text already, joined by commas.
    pub fn joined(&mut self, name: &'static str, items: &str) {
        self.items(name, &[items], |out, joined| out.push_str(joined));
    }

    /// `"name":["…",…]`, each of `items` a string.
    pub fn strs<S: AsRef<str>>(&mut self, name: &'static str, items: &[S]) {
        self.items(name, items, |out, item| write_str(out, item.as_ref()));
    }

    /// `"name":{…}`, its fields written by `fields`.
    pub fn object(&mut self, name: &'static str, fields: impl FnOnce(&mut Object)) {
        self.name(name);
        let mut o = Object::new(self.out);
        fields(&mut o);
        o.end();
    }

    /// `"name":[{…},…]`, one object for each of `items`, its fields written by `fields`.
    pub fn objects<T>(&mut self, name: &'static str, items: &[T], mut fields: impl FnMut(&mut Object, &T)) {
        self.items(name, items, |out, item| {
            let mut o = Object::new(out);
            fields(&mut o, item);
            o.end();
        });
    }

    /// `"name":[…]`, each of `items` written by `each`, commas between.
    fn items<T>(&mut self, name: &'static str, items: &[T], mut each: impl FnMut(&mut String, &T)) {
        self.name(name);
        self.out.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            each(self.out, item);
        }
        self.out.push(']');
    }

    /// A stored value's fields, as [`Shown`] serializes flattened into a line.
    pub fn shown(&mut self, value: &Shown) {
        match value {
            Shown::Json { value } => self.raw("value", value),
            Shown::Text { value, encoding } => {
                self.str("value", value);
                self.str("encoding", encoding);
            }
            Shown::Binary { value, encoding } => {
                self.str("value", value);
                self.str("encoding", encoding);
            }
        }
    }

    pub fn end(self) {
        self.out.push('}');
    }
}

/// A value [`Object`] writes as a field: a string or a number.
pub trait Scalar: Copy + Serialize {
    fn write(self, o: &mut Object, name: &'static str);
}

impl Scalar for &str {
    fn write(self, o: &mut Object, name: &'static str) {
        o.str(name, self);
    }
}

impl Scalar for u64 {
    fn write(self, o: &mut Object, name: &'static str) {
        o.u64(name, self);
    }
}

/// A few fields that a type flattens into the line holding it (a need's place, what its check
/// found), in order: serde (as a map) and [`Object`] both write from this one list, so the two
/// writings cannot disagree.
pub struct Flat<T, const N: usize> {
    fields: [Option<(&'static str, T)>; N],
}

impl<T: Scalar, const N: usize> Flat<T, N> {
    pub fn new() -> Self {
        Flat { fields: [None; N] }
    }

    /// With the field `name` next; past `N` fields (a type's own literal list) it is dropped
    /// in a release build, never a panic.
    pub fn with(mut self, name: &'static str, value: T) -> Self {
        let free = self.fields.iter_mut().find(|f| f.is_none());
        debug_assert!(free.is_some(), "more than {N} fields flattened");
        if let Some(slot) = free {
            *slot = Some((name, value));
        }
        self
    }

    fn iter(&self) -> impl Iterator<Item = (&'static str, T)> + '_ {
        self.fields.iter().map_while(|f| *f)
    }
}

impl<T: Scalar, const N: usize> Default for Flat<T, N> {
    fn default() -> Self {
        Flat::new()
    }
}

impl<T: Scalar, const N: usize> Serialize for Flat<T, N> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        for (name, value) in self.iter() {
            m.serialize_entry(name, &value)?;
        }
        m.end()
    }
}

impl Object<'_> {
    /// The fields of `flat`, into this object as their own.
    pub fn flat<T: Scalar, const N: usize>(&mut self, flat: &Flat<T, N>) {
        for (name, value) in flat.iter() {
            value.write(self, name);
        }
    }
}

/// An object written alone into a string of about `bytes` (a guess: it grows past it).
pub fn object(bytes: usize, fields: impl FnOnce(&mut Object)) -> String {
    let mut out = String::with_capacity(bytes);
    let mut o = Object::new(&mut out);
    fields(&mut o);
    o.end();
    out
}

/// `s` as a JSON string, escaped as serde_json escapes it (the characters [`escaped_byte_len`]
/// counts as more than one byte, `\u00xx` in lower-case hex), runs of plain bytes copied whole
/// and looked at eight at a time ([`any_escaped`]): a line is mostly keys, names and values
/// that escape nothing.
pub fn write_str(out: &mut String, s: &str) {
    out.push('"');
    let bytes = s.as_bytes();
    let (mut plain, mut i) = (0, 0);
    while i < bytes.len() {
        if let Some(word) = bytes.get(i..i + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
            if !any_escaped(u64::from_le_bytes(word)) {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        i += 1;
        if escaped_byte_len(b) == 1 {
            continue;
        }
        // Every byte escaped is ASCII: the cuts fall on character boundaries.
        out.push_str(&s[plain..i - 1]);
        plain = i;
        let short = match b {
            b'"' => '"',
            b'\\' => '\\',
            b'\n' => 'n',
            b'\r' => 'r',
            b'\t' => 't',
            0x08 => 'b',
            0x0c => 'f',
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("\\u00");
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 15)] as char);
                continue;
            }
        };
        out.push('\\');
        out.push(short);
    }
    out.push_str(&s[plain..]);
    out.push('"');
}

/// Whether any of the eight bytes of `word` is one a JSON string escapes: below 0x20, `"` or
/// `\` (the bit tricks "has a byte less than n" and "has a zero byte", each exact as a yes or
/// no for n up to 128).
pub(crate) fn any_escaped(word: u64) -> bool {
    let below = word.wrapping_sub(ONES * 0x20) & !word & HIGH;
    below != 0 || has_byte(word, b'"') || has_byte(word, b'\\')
}

/// A byte of ones, in each of a word's eight bytes; and each byte's high bit.
const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Whether any of the eight bytes of `word` is `b` (the bit trick "has a zero byte" on the word
/// with `b` in every byte xored out: exact as a yes or no).
fn has_byte(word: u64, b: u8) -> bool {
    let v = word ^ (ONES * u64::from(b));
    v.wrapping_sub(ONES) & !v & HIGH != 0
}

/// `n` in decimal, as serde_json writes an integer (and `format!` does, without its machinery:
/// the reasons a state sweep writes for every need join numbers by hand).
pub fn write_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(d as char);
    }
}

/// The bytes `s` takes as a JSON string, quotes included, as serde_json writes it.
pub fn escaped_len(s: &str) -> usize {
    // By bytes, not characters: a character's UTF-8 bytes are written as they are, and every
    // character that is escaped is one ASCII byte (every key of a page is counted here).
    2 + s.bytes().map(escaped_byte_len).sum::<usize>()
}

/// The bytes one character takes inside a JSON string, as serde_json writes it.
pub fn escaped_char_len(c: char) -> usize {
    if c.is_ascii() {
        escaped_byte_len(c as u8)
    } else {
        c.len_utf8()
    }
}

/// The bytes one byte of a string's UTF-8 takes inside a JSON string: only ASCII is escaped.
fn escaped_byte_len(b: u8) -> usize {
    match b {
        b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
        0..0x20 => 6,
        _ => 1,
    }
}

/// Which of `recorded` and `planned` a holder or need comes from, as a list.
/// Where a need of a module was learnt: its recorded needs, its plan.
pub const SOURCES: [&str; 2] = ["recorded", "planned"];

pub fn sources(recorded: bool, planned: bool) -> &'static [&'static str] {
    match (recorded, planned) {
        (true, true) => &SOURCES,
        (true, false) => &SOURCES[..1],
        (false, true) => &SOURCES[1..],
        (false, false) => &[],
    }
}

/// A stored value as a reply shows it, flattened into its entry: `value`, and `encoding` when
/// the bytes are not JSON.
///
/// Only JSON every reader can read is passed through as it is: a number out of any float's
/// range (`7E77777…`, found by fuzzing) fits the grammar but makes common parsers, this
/// project's `query` among them, refuse the whole reply; such a value goes as text.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum Shown<'a> {
    /// A value that is JSON, as it is.
    Json {
        #[serde(serialize_with = "as_raw")]
        #[cfg_attr(feature = "schema", schemars(with = "Box<RawValue>"))]
        value: &'a str,
    },
    /// A value that is UTF-8 but not JSON.
    Text {
        value: &'a str,
        #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::utf8"))]
        encoding: &'static str,
    },
    /// Any other value, in base64.
    Binary {
        value: String,
        #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::base64"))]
        encoding: &'static str,
    },
}

impl<'a> Shown<'a> {
    pub fn of(bytes: &'a [u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) if crate::plain_json::is_plain_json(text) => Shown::Json { value: text },
            _ => Self::by_serde(bytes),
        }
    }

    /// [`Shown::of`] as serde_json reads the bytes, whatever they are: what the plain path
    /// must agree with.
    pub(crate) fn by_serde(bytes: &'a [u8]) -> Self {
        let readable = serde_json::from_slice::<&RawValue>(bytes).ok().filter(|raw| read_as_a_tree(raw).is_ok());
        if let Some(raw) = readable {
            Shown::Json { value: raw.get() }
        } else if let Ok(text) = std::str::from_utf8(bytes) {
            Shown::Text { value: text, encoding: "utf-8" }
        } else {
            Shown::Binary { value: base64(bytes), encoding: "base64" }
        }
    }
}

/// JSON text written as it is by serde (it was read as JSON before it was kept).
fn as_raw<S: serde::Serializer>(json: &&str, s: S) -> Result<S::Ok, S::Error> {
    let raw: &RawValue = serde_json::from_str(json).map_err(serde::ser::Error::custom)?;
    raw.serialize(s)
}

/// Well-formed JSON (`raw`, as serde_json took it) read as a tree reader would read it, or why a
/// tree refuses it; read in full only when it is not [`plainly_readable`].
fn read_as_a_tree(raw: &RawValue) -> Result<(), serde_json::Error> {
    if plainly_readable(raw.get().as_bytes()) {
        return Ok(());
    }
    serde_json::from_str::<Readable>(raw.get()).map(|Readable| ())
}

/// Whether well-formed JSON plainly holds nothing a tree reader refuses, without reading it as
/// one: a tree refuses only a number out of a float's range (which takes an exponent or hundreds
/// of digits) and an escape it cannot decode (a lone surrogate). With no backslash, no digit
/// followed by `e`/`E`, and no run of 300 digits, there is neither. `false` says only "read it
/// in full" (a string `"v1e"` is fine, and is read in full): most values of a mesh are plain,
/// and this one pass costs a fraction of the reading it saves.
///
/// The bytes are looked at eight at a time: a word without a backslash, an `e` or an `E` needs
/// no byte of its own looked at. A run of 300 digits holds at least [`DIGIT_WORDS`] whole words
/// of digits in a row, so only a value with such a stretch is read again byte by byte
/// ([`plainly_readable_bytewise`], the rule as stated).
fn plainly_readable(json: &[u8]) -> bool {
    let digit_before = |i: usize| i > 0 && json[i - 1].is_ascii_digit();
    let words = json.chunks_exact(8);
    let tail = words.remainder();
    let mut digit_words = 0;
    for (w, word) in words.enumerate() {
        let word_at = w * 8;
        let v = u64::from_le_bytes([word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7]]);
        if has_byte(v, b'\\') {
            return false;
        }
        // `e` and `E` differ in the 0x20 bit only, and no other byte becomes `e` when it is set.
        if has_byte(v | (ONES * 0x20), b'e') {
            let exponent = word.iter().enumerate().any(|(j, &b)| b | 0x20 == b'e' && digit_before(word_at + j));
            if exponent {
                return false;
            }
        }
        // All eight ASCII, none below '0', none above '9'.
        let digits = v & HIGH == 0 && v.wrapping_add(ONES * (0x80 - 0x30)) & HIGH == HIGH && v.wrapping_add(ONES * (0x80 - 0x3a)) & HIGH == 0;
        digit_words = if digits { digit_words + 1 } else { 0 };
        if digit_words == DIGIT_WORDS {
            return plainly_readable_bytewise(json);
        }
    }
    let tail_at = json.len() - tail.len();
    tail.iter().enumerate().all(|(j, &b)| b != b'\\' && !(b | 0x20 == b'e' && digit_before(tail_at + j)))
}

/// Whole eight-byte words of digits in a row that any run of 300 digits covers: its first word
/// may hold as few as one of them, which leaves at least 293 from a word's start, 36 whole words.
const DIGIT_WORDS: usize = 36;

/// [`plainly_readable`] one byte at a time: the rule as stated.
fn plainly_readable_bytewise(json: &[u8]) -> bool {
    let mut digits = 0;
    for &b in json {
        match b {
            b'0'..=b'9' => {
                digits += 1;
                if digits >= 300 {
                    return false;
                }
            }
            b'e' | b'E' if digits > 0 => return false,
            b'\\' => return false,
            _ => digits = 0,
        }
    }
    true
}

/// JSON a reader can hold: read through `deserialize_any` as a tree would be (so numbers are
/// checked against a float's range and strings' escapes decoded), but nothing is kept.
struct Readable;

impl<'de> Deserialize<'de> for Readable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Readable)
    }
}

impl<'de> Visitor<'de> for Readable {
    type Value = Readable;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Readable, A::Error> {
        while seq.next_element::<Readable>()?.is_some() {}
        Ok(Readable)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Readable, A::Error> {
        while map.next_key::<Readable>()?.is_some() {
            map.next_value::<Readable>()?;
        }
        Ok(Readable)
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
        #[derive(Serialize)]
        struct ShownLine<'a> {
            k: u8,
            #[serde(flatten)]
            shown: Shown<'a>,
        }
        to_json(&ShownLine { k: 0, shown: Shown::of(bytes) })
    }

    #[test]
    fn passes_json_through_as_it_is() {
        assert_eq!(render(br#"{"line":"export X=1"}"#), r#"{"k":0,"value":{"line":"export X=1"}}"#);
        assert_eq!(render(b"42"), r#"{"k":0,"value":42}"#);
        assert_eq!(render(br#"{"b":[1,{"c":null}],"a":"\u00e9"}"#), r#"{"k":0,"value":{"b":[1,{"c":null}],"a":"\u00e9"}}"#);
    }

    #[test]
    fn passes_what_no_reader_can_hold_as_text() {
        for bytes in [&b"77777777E77333333333333333333333"[..], br#"{"x":[1e999]}"#, br#"{"\ud800":1}"#, br#"["\udfff"]"#] {
            let v: serde_json::Value = serde_json::from_str(&render(bytes)).expect("the reply stays readable");
            assert_eq!((v["value"].as_str(), v["encoding"].as_str()), (std::str::from_utf8(bytes).ok(), Some("utf-8")));
        }
    }

    #[test]
    fn marks_text_and_binary_values() {
        assert_eq!(render(b"plain text"), r#"{"k":0,"value":"plain text","encoding":"utf-8"}"#);
        assert_eq!(render(b""), r#"{"k":0,"value":"","encoding":"utf-8"}"#);
        assert_eq!(render(&[0xff, 0x00, 0x41]), r#"{"k":0,"value":"/wBB","encoding":"base64"}"#);
    }

    #[test]
    fn counts_a_string_as_serde_writes_it() {
        for text in ["plain", "quote \" and \\ back", "ctl \u{1} \n \t \r \u{8} \u{c} \u{1f} \u{7f}", "é ✓ 😀", ""] {
            assert_eq!(escaped_len(text), serde_json::to_string(text).unwrap().len(), "{text:?}");
        }
    }

    #[test]
    fn writes_a_string_as_serde_writes_it() {
        let every_byte: String = (0u8..0x80).map(char::from).collect();
        for text in ["plain", "quote \" and \\ back", "ctl \u{1} \n \t \r \u{8} \u{c} \u{1f} \u{7f}", "é ✓ 😀", "", &every_byte, "\u{0}end", "start\u{1b}"]
        {
            let mut out = String::new();
            write_str(&mut out, text);
            assert_eq!(out, serde_json::to_string(text).unwrap(), "{text:?}");
        }
    }

    #[test]
    fn finds_an_escaped_byte_wherever_it_is_in_a_word() {
        for b in 0..=255u8 {
            for at in 0..8 {
                for filler in [b'a', 0x7f, 0x80, 0xff, b' '] {
                    let mut word = [filler; 8];
                    word[at] = b;
                    let want = word.iter().any(|&b| escaped_byte_len(b) > 1);
                    assert_eq!(any_escaped(u64::from_le_bytes(word)), want, "{word:?}");
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn any_word_is_judged_byte_by_byte(word in proptest::prelude::any::<[u8; 8]>()) {
            proptest::prop_assert_eq!(any_escaped(u64::from_le_bytes(word)), word.iter().any(|&b| escaped_byte_len(b) > 1));
        }

        #[test]
        fn any_text_is_written_as_serde_writes_it(text in "(\\PC|[\\x00-\\x1f\"\\\\]){0,40}") {
            let mut out = String::new();
            write_str(&mut out, &text);
            proptest::prop_assert_eq!(out, serde_json::to_string(&text).unwrap());
        }
    }

    #[test]
    fn writes_an_object_as_serde_writes_it() {
        #[derive(Serialize)]
        struct Inner<'a> {
            on: bool,
            names: &'a [&'a str],
        }
        #[derive(Serialize)]
        struct ObjectLine<'a> {
            key: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            absent: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            present: Option<&'a str>,
            revision: u64,
            lines: [&'a RawValue; 2],
            inner: Inner<'a>,
            each: Vec<Inner<'a>>,
            #[serde(flatten)]
            shown: Shown<'a>,
        }
        let two: [&RawValue; 2] = [serde_json::from_str("{\"a\":1}").unwrap(), serde_json::from_str("[]").unwrap()];
        let names = ["a", "b\"c"];
        for (key, revision, bytes) in [("a.b", 0, &b"{\"x\":[1,2]}"[..]), ("q\"k", u64::MAX, b"text \n"), ("", 10, &[0xff, 0xfe]), ("n", 1234567890, b"")] {
            let shown = Shown::of(bytes);
            let each = [(false, &names[..1]), (true, &names[..])];
            let written = object(0, |o| {
                o.str("key", key);
                o.some_str("absent", None);
                o.some_str("present", Some(key));
                o.u64("revision", revision);
                o.joined("lines", &two.map(|r| r.get()).join(","));
                o.object("inner", |o| {
                    o.bool("on", true);
                    o.strs("names", &names[..0]);
                });
                o.objects("each", &each, |o, (on, names)| {
                    o.bool("on", *on);
                    o.strs("names", names);
                });
                o.shown(&shown);
            });
            let each = each.iter().map(|&(on, names)| Inner { on, names }).collect();
            let line = ObjectLine { key, absent: None, present: Some(key), revision, lines: two, inner: Inner { on: true, names: &[] }, each, shown };
            assert_eq!(written, to_json(&line));
        }
        assert_eq!(object(0, |_| {}), "{}");
    }

    #[test]
    fn encodes_base64_like_rfc_4648() {
        for (input, want) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")] {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }

    /// [`field`] reads what a `Value` tree reads, whatever the bytes.
    fn by_tree(bytes: &[u8], name: &str) -> Result<Option<serde_json::Value>, ()> {
        match serde_json::from_slice::<serde_json::Value>(bytes) {
            Ok(serde_json::Value::Object(o)) => Ok(o.get(name).cloned()),
            _ => Err(()),
        }
    }

    #[test]
    fn reads_one_field_as_a_tree_would() {
        let cases: [&[u8]; 14] = [
            br#"{"part":"api","x":[1,{"y":2}]}"#,
            br#"{"part":"a","part":"b"}"#,
            br#"{"p\u0061rt":"escaped key"}"#,
            br#"{"x":1}"#,
            br#"{"part":null}"#,
            br#"{"part":[1, 2]}"#,
            br#"[{"part":"a"}]"#,
            br#""part""#,
            br#"{"part":"a"} trailing"#,
            br#"{"part":"a"}  "#,
            br#"{"part":"a",}"#,
            b"not json",
            b"",
            br#"{"x":"\ud800"}"#,
        ];
        for c in cases {
            let got = field(c, "part").map(|o| o.map(|r| serde_json::from_str::<serde_json::Value>(r.get()).expect("a value")));
            assert_eq!(got, by_tree(c, "part"), "{}", String::from_utf8_lossy(c));
        }
        let deep = format!("{{\"x\":{}1{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(field(deep.as_bytes(), "part").is_err(), by_tree(deep.as_bytes(), "part").is_err());
    }

    /// What the plain test lets through without the full reading, the full reading accepts.
    fn read_in_full(text: &str) -> bool {
        serde_json::from_str::<&RawValue>(text).is_ok_and(|raw| serde_json::from_str::<Readable>(raw.get()).is_ok())
    }

    #[test]
    fn sends_every_value_a_tree_may_refuse_to_the_full_reading() {
        let near = format!("[{}]", "9".repeat(299));
        let far = format!("[{}]", "9".repeat(400));
        for text in ["1e999", "[-2.5E+400]", r#"{"a":"\ud800"}"#, r#"["\udfff"]"#, &far] {
            assert!(!read_in_full(text), "{text} should be refused by a tree");
            assert!(!plainly_readable(text.as_bytes()), "{text} passed as plain");
        }
        for text in [r#"{"placeholder":"${config:x}","part":"api"}"#, "[1.5,-2,0]", "true", r#""e9""#, &near] {
            assert!(plainly_readable(text.as_bytes()) && read_in_full(text), "{text}");
        }
    }

    #[test]
    fn finds_a_run_of_300_digits_wherever_it_starts() {
        for at in 0..16 {
            for run in 280..=310 {
                for (before, after) in [("", ""), ("[", "]"), ("\"", "\""), ("1", "e")] {
                    let text = format!("{before}{}{}{}{after}", " ".repeat(at), "7".repeat(run), " ".repeat(at % 5));
                    assert_eq!(plainly_readable(text.as_bytes()), plainly_readable_bytewise(text.as_bytes()), "{text}");
                }
            }
        }
        assert!(!plainly_readable("7".repeat(300).as_bytes()) && plainly_readable("7".repeat(299).as_bytes()));
    }

    proptest::proptest! {
        #[test]
        fn a_plain_value_is_one_a_tree_reads(
            atoms in proptest::collection::vec(proptest::prop_oneof![
                proptest::strategy::Just("1e400".to_string()), proptest::strategy::Just("1E-400".to_string()), proptest::strategy::Just("\"\\ud800\"".to_string()),
                proptest::strategy::Just("\"\\u00e9\"".to_string()), proptest::strategy::Just("[".to_string()), proptest::strategy::Just("]".to_string()),
                proptest::strategy::Just("9".repeat(310)), "[0-9]{1,4}", "[0-9]\\.[0-9][eE][+-]?[0-9]{1,3}", "\"[ -~]{0,5}\"", "[ -~]{0,4}",
            ], 1..6),
        ) {
            let text = format!("[{}]", atoms.join(","));
            if plainly_readable(text.as_bytes()) && serde_json::from_str::<&RawValue>(&text).is_ok() {
                proptest::prop_assert!(read_in_full(&text), "{}", text);
            }
        }

        #[test]
        fn reads_eight_bytes_at_a_time_as_one_at_a_time(
            parts in proptest::collection::vec(proptest::prop_oneof![
                "[0-9]{1,12}", "[eE\\\\]", "[ -~]{0,9}", "[a-f\u{80}-\u{3ff}]{0,3}", proptest::strategy::Just("9".repeat(297)),
            ], 0..12),
        ) {
            let text = parts.concat();
            proptest::prop_assert_eq!(plainly_readable(text.as_bytes()), plainly_readable_bytewise(text.as_bytes()), "{}", text);
        }

        #[test]
        fn reads_any_bytes_as_a_tree_would(
            keys in proptest::collection::vec(proptest::prop_oneof![proptest::strategy::Just("part".to_string()), "[a-z]{0,3}"], 0..5),
            values in proptest::collection::vec(proptest::prop_oneof![proptest::strategy::Just("\"s\"".to_string()), proptest::strategy::Just("null".to_string()), proptest::strategy::Just("[1,{}]".to_string()), proptest::strategy::Just("\"\\ud800\"".to_string()), proptest::strategy::Just("{\"\\u00e9\":[\"\\ud800\"]}".to_string()), proptest::strategy::Just("1e400".to_string()), "[0-9]{1,3}", "[ -~]{0,6}"], 5),
            tail in proptest::prop_oneof![proptest::strategy::Just(String::new()), proptest::strategy::Just(" ".to_string()), "[ -~]{0,3}"],
        ) {
            let body: Vec<String> = keys.iter().zip(&values).map(|(k, v)| format!("{k:?}:{v}")).collect();
            let text = format!("{{{}}}{tail}", body.join(","));
            let got = field(text.as_bytes(), "part").map(|o| o.map(|r| serde_json::from_str::<serde_json::Value>(r.get()).expect("a value")));
            proptest::prop_assert_eq!(got, by_tree(text.as_bytes(), "part"), "{}", text);
        }
    }
}
