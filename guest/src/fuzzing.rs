//! The checks the fuzz targets run (`fuzz/`), one per decoder of bytes others control, kept here
//! so that an ordinary `cargo test` replays every corpus input through the very same checks on
//! stable (`tests/tests/logic/fuzz_corpus.rs`). Each check panics on a broken property, not only on a
//! crash: a key that parses re-encodes to itself, an escape round-trips, a value passed through
//! reads back as the same bytes, every answer is JSON within its budget.
//!
//! Built only with the `fuzzing` feature; the component never contains it.

use serde_json::Value;

use crate::env::Env;
use crate::escape::{decode, encode, is_identifier};
use crate::keys;
use crate::mem_env::MemEnv;

/// A check, by the fuzz target's name.
pub type Target = fn(&[u8]);

/// The reply of `verb` to `body` over `env`: JSON, within `budget`, an error body for every code
/// but ok.
fn answered(env: &dyn Env, verb: &str, body: &[u8], budget: u32) -> Value {
    let r = crate::verb::handle(env, verb, body, budget);
    assert!(r.body.len() <= budget.max(crate::verb::MIN_ANSWER) as usize, "a reply of {} bytes over a budget of {budget}", r.body.len());
    let v: Value = serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("a reply that is not JSON ({e}): {:?}", String::from_utf8_lossy(&r.body)));
    assert_eq!(r.code == crate::verb::Code::Ok, v.get("error").is_none(), "{v}");
    v
}

/// Both verbs' request decoders, over a small mesh: any body gets a JSON answer or a JSON error,
/// and an accepted request never names a node, module or kind that is not an identifier.
pub fn request(data: &[u8]) {
    request_with(crate::request::parse, crate::request::parse_plan, data)
}

/// [`request`] over any pair of readers, so a test can show that a reader breaking the
/// property (taking `*` as a node) fails the check.
pub fn request_with(parse: fn(&[u8]) -> Result<crate::request::Query, String>, parse_plan: fn(&[u8]) -> Result<(String, String), String>, data: &[u8]) {
    if let Ok(q) = parse(data) {
        for id in [&q.node, &q.module, &q.kind].into_iter().flatten() {
            assert!(is_identifier(id), "accepted {id:?} as an identifier");
        }
        assert!(q.limit <= crate::request::MAX_LIMIT);
    }
    if let Ok((n, m)) = parse_plan(data) {
        assert!(is_identifier(&n) && is_identifier(&m));
    }
    let env = small_mesh();
    answered(&env, crate::verb::PROVISIONING, data, 4096);
    answered(&env, crate::verb::PLAN, data, 4096);
}

fn small_mesh() -> MemEnv {
    let env = MemEnv::default();
    env.put(keys::NEEDS, "alpha.app.config.db_url", br#"{"part":"api"}"#);
    env.put(keys::NEEDS, "alpha.app.bound.postgres=2Edb", b"{}");
    env.put(keys::NEEDS, "alpha.app", b"short");
    env.put(keys::APPLIED, "alpha.app", br#"{"build":"b1","needs":2,"values":{"bound:postgres.db":3}}"#);
    env.put(keys::COLLECT, "alpha.shell=3Azsh.app", br#"{"line":"x"}"#);
    env.put("postgres_bound", "alpha.app.db", b"{}");
    env.put("mesh-config_values", "alpha.app.db_url", b"x");
    env
}

/// Every bucket's key parser: a key that parses is written back, token for token, as itself.
pub fn keys(data: &[u8]) {
    let Ok(key) = std::str::from_utf8(data) else { return };
    if let Ok(k) = keys::parse_need(key) {
        assert_eq!(format!("{}.{}.{}.{}", k.node, k.module, k.kind, encode(&k.name)), key);
    }
    for parse in [keys::parse_applied, keys::parse_assignment] {
        if let Ok(k) = parse(key) {
            assert_eq!(format!("{}.{}", k.node, k.module), key);
        }
    }
    if let Ok(k) = keys::parse_composed(key) {
        assert_eq!(format!("{}.{}", k.module, k.build), key);
    }
    if let Ok(k) = keys::parse_collect(key) {
        assert_eq!(format!("{}.{}.{}", k.node, encode(&k.collection), k.contributor), key);
    }
    if let Ok(k) = keys::parse_bound(key) {
        let local = k.local.map(|l| format!(".{l}")).unwrap_or_default();
        assert_eq!(format!("{}.{}.{}{local}", k.node, k.module, k.provision), key);
    }
    for one in [keys::parse_registry(key), keys::parse_builds(key)].into_iter().flatten() {
        assert_eq!(one, key);
    }
}

/// The `=<hex>` escape: what decodes re-encodes to exactly itself, and every string encodes to
/// a token that decodes back to it.
pub fn escape(data: &[u8]) {
    escape_with(encode, decode, data)
}

/// [`escape`] over any codec, so a test can show that a codec breaking the property fails it.
pub fn escape_with(encode: fn(&str) -> String, decode: fn(&str) -> Result<String, String>, data: &[u8]) {
    if let Ok(token) = std::str::from_utf8(data) {
        if let Ok(name) = decode(token) {
            assert_eq!(encode(&name), token, "{token:?} decoded to {name:?}");
        }
    }
    let name = String::from_utf8_lossy(data);
    if !name.is_empty() {
        let token = encode(&name);
        assert!(!token.contains(['.', '*', '>', ' ']), "{token:?}");
        assert_eq!(decode(&token).as_deref(), Ok(name.as_ref()));
    }
}

/// The composition (plan) reader: bytes as the composition of alpha/app at its want and as its
/// kept plan; the plan verb answers JSON whatever they hold, and holders/notices read it too.
pub fn plan(data: &[u8]) {
    let env = small_mesh();
    env.put(keys::ASSIGNMENTS, "alpha.app", br#"{"want":"b1"}"#);
    env.put(keys::BUILDS, "app", br#"{"newest":"b2"}"#);
    env.put("composed-alpha", "app.b1", data);
    env.put("composed-alpha", "app.b2", br#"{"state":"refused","reason":"no"}"#);
    let _ = crate::plan::Kept::from_bytes(data, "alpha", "app");
    let plan = answered(&env, crate::verb::PLAN, br#"{"node":"alpha","module":"app"}"#, 1 << 20);
    // Only a composition read as published carries its content into status, holders and
    // notices; any other is "unreadable" there, which the plan verb's answer covers. (This keeps
    // the target fast enough for the long run's ten million executions.)
    if plan["entries"][0]["state"] != "planned" {
        return;
    }
    answered(&env, crate::verb::PROVISIONING, br#"{"what":"status","node":"alpha"}"#, 1 << 20);
    answered(&env, crate::verb::PROVISIONING, br#"{"what":"holders","kind":"bound","name":"postgres.db"}"#, 1 << 20);
    let event = crate::holders::HolderEvent { bucket: "postgres_bound".into(), key: "alpha.app.db".into(), revision: 9, deleted: false };
    for n in crate::holders::notices(&env, &event).unwrap_or_default() {
        serde_json::from_slice::<Value>(&n.body).expect("a notice is JSON");
    }
}

/// The applied-record reader: bytes as alpha/app's applied record; status and holders answer
/// JSON, and a record that names no revision never makes a holder `current`.
pub fn applied(data: &[u8]) {
    let env = small_mesh();
    env.put(keys::APPLIED, "alpha.app", data);
    answered(&env, crate::verb::PROVISIONING, br#"{"what":"status","node":"alpha","module":"app"}"#, 1 << 20);
    let v = answered(&env, crate::verb::PROVISIONING, br#"{"what":"holders","kind":"bound","name":"postgres.db"}"#, 1 << 20);
    let named = serde_json::from_slice::<Value>(data).ok().and_then(|r| r.get("values")?.get("bound:postgres.db")?.as_u64());
    for h in v["holders"].as_array().into_iter().flatten() {
        if h["state"] == "current" {
            assert_eq!(named, h["revision"].as_u64(), "current without the revision named: {h}");
        }
    }
}

/// Value pass-through: any stored bytes are listed, and read back as exactly those bytes.
pub fn value(data: &[u8]) {
    value_with(|b| crate::value::Shown::of(b), data);
    // The plain path is a shortcut: what it passes through, serde_json passes through alike.
    if std::str::from_utf8(data).is_ok_and(crate::plain_json::is_plain_json) {
        match crate::value::Shown::by_serde(data) {
            crate::value::Shown::Json { value } => assert_eq!(value.as_bytes(), data, "serde passes other text"),
            _ => panic!("plain JSON that serde_json does not pass through: {:?}", String::from_utf8_lossy(data)),
        }
    }
}

/// [`value`] over any way of showing bytes, so a test can show that one losing bytes fails it.
pub fn value_with(show: for<'a> fn(&'a [u8]) -> crate::value::Shown<'a>, data: &[u8]) {
    #[derive(serde::Serialize)]
    struct FuzzLine<'a> {
        k: u8,
        #[serde(flatten)]
        shown: crate::value::Shown<'a>,
    }
    let out = crate::value::to_json(&FuzzLine { k: 0, shown: show(data) });
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    let back = match v["encoding"].as_str() {
        None => {
            let raw: &serde_json::value::RawValue = serde_json::from_slice(data).expect("passed as JSON only when it is");
            assert_eq!(serde_json::from_str::<Value>(raw.get()).ok(), Some(v["value"].clone()));
            return;
        }
        Some("utf-8") => v["value"].as_str().expect("a string").as_bytes().to_vec(),
        Some("base64") => base64_decode(v["value"].as_str().expect("a string")),
        Some(other) => panic!("unknown encoding {other}"),
    };
    assert_eq!(back, data);
}

fn base64_decode(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let v: Vec<u32> = chunk.iter().filter(|&&c| c != b'=').map(|c| ALPHABET.iter().position(|a| a == c).expect("base64") as u32).collect();
        let n = v.iter().enumerate().fold(0u32, |n, (i, d)| n | d << (18 - 6 * i));
        out.extend((0..v.len().saturating_sub(1)).map(|i| (n >> (16 - 8 * i)) as u8));
    }
    out
}

/// The checks by target name, for the corpus replay.
pub const TARGETS: [(&str, Target); 6] = [("request", request), ("keys", keys), ("escape", escape), ("plan", plan), ("applied", applied), ("value", value)];
