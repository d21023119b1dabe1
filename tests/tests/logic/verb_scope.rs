//! No key in scope is ever dropped (SPEC §5), proven against a brute-force oracle: random buckets
//! of keys (in shape, too short, too long, badly escaped, empty tokens), every narrowing the verb
//! accepts, random page sizes and reply budgets. Across all pages, every key the narrowing
//! covers appears exactly once (as an entry or out of shape) and no other key does.
//!
//! The guest's logic runs natively over the host's real mirrors (subject matching included):
//! pure logic, no wasm and no bus, so thousands of cases run in seconds.

use std::collections::BTreeSet;

use guest::escape::encode;
use guest::verb::{handle, Code, PROVISIONING};
use mesh_provisioner::store::backend::MemoryBackend;
use proptest::prelude::*;
use serde_json::{json, Value};
use tests::native::Native;

/// Tokens keys are made of: identifiers, good and bad escapes, wildcard-looking and empty ones.
const TOKENS: &[&str] =
    &["alpha", "beta", "app", "web", "config", "secret", "x=2Ey", "shell=3Azsh", "environment", "=3a", "=61", "=4", "a=3Db", "", "-lead", "é"];
const NODES: &[&str] = &["alpha", "beta", "gamma"];
const MODULES: &[&str] = &["app", "web", "config"];
const KINDS: &[&str] = &["config", "secret", "app"];
const COLLECTIONS: &[&str] = &["shell:zsh", "environment", "x.y", "app"];

fn key() -> impl Strategy<Value = String> {
    // A subject is never empty, so neither is a key a mirror holds.
    prop::collection::vec(prop::sample::select(TOKENS), 1..7).prop_map(|t| t.join(".")).prop_filter("a key is never empty", |k| !k.is_empty())
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![Just(b"{}".to_vec()), (0usize..3000).prop_map(|n| format!("\"{}\"", "v".repeat(n)).into_bytes()), prop::collection::vec(any::<u8>(), 0..64),]
}

/// A request: what, its narrowing (field, value), and the tokens the narrowing fixes
/// (position, token) for the oracle.
#[derive(Debug, Clone)]
struct Ask {
    what: &'static str,
    fields: Vec<(&'static str, String)>,
    fixed: Vec<(usize, String)>,
}

fn opt(pool: &'static [&'static str]) -> impl Strategy<Value = Option<&'static str>> {
    prop::option::of(prop::sample::select(pool))
}

fn ask() -> impl Strategy<Value = Ask> {
    let needs = (opt(NODES), opt(MODULES), opt(KINDS)).prop_map(|(n, m, k)| {
        let mut a = Ask { what: "needs", fields: vec![], fixed: vec![] };
        for (i, (field, v)) in [("node", n), ("module", m), ("kind", k)].into_iter().enumerate() {
            if let Some(v) = v {
                a.fields.push((field, v.to_string()));
                a.fixed.push((i, v.to_string()));
            }
        }
        a
    });
    let applied = (opt(NODES), opt(MODULES)).prop_map(|(n, m)| {
        let mut a = Ask { what: "applied", fields: vec![], fixed: vec![] };
        for (i, (field, v)) in [("node", n), ("module", m)].into_iter().enumerate() {
            if let Some(v) = v {
                a.fields.push((field, v.to_string()));
                a.fixed.push((i, v.to_string()));
            }
        }
        a
    });
    let collect = (opt(NODES), opt(COLLECTIONS), opt(MODULES)).prop_map(|(n, c, m)| {
        let mut a = Ask { what: "collect", fields: vec![], fixed: vec![] };
        if let Some(n) = n {
            a.fields.push(("node", n.to_string()));
            a.fixed.push((0, n.to_string()));
        }
        if let Some(c) = c {
            a.fields.push(("collection", c.to_string()));
            a.fixed.push((1, encode(c)));
        }
        if let Some(m) = m {
            a.fields.push(("module", m.to_string()));
            a.fixed.push((2, m.to_string()));
        }
        a
    });
    let registry = opt(KINDS).prop_map(|k| {
        let mut a = Ask { what: "registry", fields: vec![], fixed: vec![] };
        if let Some(k) = k {
            a.fields.push(("kind", k.to_string()));
            a.fixed.push((0, k.to_string()));
        }
        a
    });
    prop_oneof![needs, applied, collect, registry]
}

fn bucket(what: &str) -> &'static str {
    match what {
        "needs" => "mesh-provisioner_needs",
        "applied" => "mesh-provisioner_applied",
        "collect" => "mesh-provisioner_collect",
        _ => "mesh-provisioner_registry",
    }
}

/// The oracle: a key is covered when it has every fixed token, each equal to the one asked.
fn covers(fixed: &[(usize, String)], key: &str) -> bool {
    let tokens: Vec<&str> = key.split('.').collect();
    fixed.iter().all(|(i, t)| tokens.get(*i) == Some(&t.as_str()))
}

/// Every page of `a`, following `next`; the keys listed and the largest reply.
fn all_pages(env: &Native, a: &Ask, limit: u32, budget: u32) -> Result<(Vec<String>, usize), String> {
    let mut listed = Vec::new();
    let mut after: Option<String> = None;
    let mut largest = 0;
    for _ in 0..10_000 {
        let mut q = json!({"what": a.what, "limit": limit});
        for (f, v) in &a.fields {
            q[*f] = json!(v);
        }
        if let Some(n) = &after {
            q["after"] = json!(n);
        }
        let reply = handle(env, PROVISIONING, q.to_string().as_bytes(), budget);
        largest = largest.max(reply.body.len());
        let v: Value = serde_json::from_slice(&reply.body).map_err(|e| format!("not JSON: {e}"))?;
        if reply.code != Code::Ok {
            return Err(format!("{q} → {v}"));
        }
        let page: Vec<String> = ["entries", "out_of_shape"]
            .iter()
            .flat_map(|f| v[*f].as_array().cloned().unwrap_or_default())
            .map(|e| e["key"].as_str().unwrap_or_default().to_string())
            .collect();
        if page.len() > limit as usize {
            return Err(format!("{} keys on a page of limit {limit}", page.len()));
        }
        listed.extend(page.iter().cloned());
        match v.get("next").and_then(Value::as_str) {
            Some(n) => {
                if page.is_empty() {
                    return Err(format!("an empty page with next {n:?}"));
                }
                after = Some(n.to_string());
            }
            None => return Ok((listed, largest)),
        }
    }
    Err("paging never ended".into())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn every_key_in_scope_appears_exactly_once_across_all_pages(
        entries in prop::collection::vec((key(), value()), 0..60),
        a in ask(),
        limit in prop_oneof![1u32..4, Just(1000u32)],
        budget in prop_oneof![Just(4096u32), Just(1 << 20)],
    ) {
        let b = MemoryBackend::new();
        for (k, v) in &entries {
            b.put(bucket(a.what), k, v);
        }
        let env = Native(b.clone());
        let want: BTreeSet<String> = tests::native::entries(b.bucket(bucket(a.what)).scan(">", None, u32::MAX).unwrap()).into_iter()
            .map(|e| e.key).filter(|k| covers(&a.fixed, k)).collect();
        let (listed, largest) = all_pages(&env, &a, limit, budget).map_err(TestCaseError::fail)?;
        let got: BTreeSet<String> = listed.iter().cloned().collect();
        prop_assert_eq!(got.len(), listed.len(), "a key listed twice: {:?}", listed);
        prop_assert_eq!(&got, &want, "asked {:?}", a);
        prop_assert!(largest <= budget.max(guest::verb::MIN_ANSWER) as usize, "a reply of {} bytes over {}", largest, budget);
    }
}

/// The cases the review found, named: each was lost before.
#[test]
fn keys_once_lost_are_listed() {
    let b = MemoryBackend::new();
    b.put("mesh-provisioner_applied", "alpha.app.extra", b"{}");
    b.put("mesh-provisioner_registry", "config.x", b"{}");
    b.put("mesh-provisioner_collect", "alpha.shell.app.more", b"{}");
    b.put("mesh-provisioner_needs", "alpha.app", b"{}");
    b.put("mesh-provisioner_needs", "alpha.app.config", b"{}");
    let env = Native(b);
    let listed = |what: &'static str, fields: &[(&'static str, &str)]| {
        let a = Ask { what, fields: fields.iter().map(|(f, v)| (*f, v.to_string())).collect(), fixed: vec![] };
        all_pages(&env, &a, 1000, 1 << 20).unwrap().0
    };
    assert_eq!(listed("applied", &[("node", "alpha"), ("module", "app")]), ["alpha.app.extra"]);
    assert_eq!(listed("registry", &[("kind", "config")]), ["config.x"]);
    assert_eq!(listed("collect", &[("node", "alpha"), ("collection", "shell"), ("module", "app")]), ["alpha.shell.app.more"]);
    assert_eq!(listed("needs", &[("module", "app")]), ["alpha.app", "alpha.app.config"]);
    assert_eq!(listed("needs", &[("kind", "config")]), ["alpha.app.config"]);
}

/// A key as long as any a bus can hold pages on (its `next` is accepted as `after`); one too
/// long for the reply budget is an error naming it, never an empty page that ends the listing.
#[test]
fn pages_past_a_long_key_and_names_one_that_cannot_fit() {
    let b = MemoryBackend::new();
    let long = format!("alpha.app.config.{}", "n".repeat(4000));
    b.put("mesh-provisioner_needs", "alpha.app.config.a", b"{}");
    b.put("mesh-provisioner_needs", &long, b"{}");
    b.put("mesh-provisioner_needs", "alpha.app.config.z", b"{}");
    let env = Native(b);
    let a = Ask { what: "needs", fields: vec![("node", "alpha".into())], fixed: vec![] };
    let (listed, _) = all_pages(&env, &a, 1, 1 << 20).unwrap();
    assert_eq!(listed, ["alpha.app.config.a".to_string(), long.clone(), "alpha.app.config.z".to_string()]);

    let q = json!({"what":"needs","node":"alpha","after":"alpha.app.config.a","limit":1});
    let reply = handle(&env, PROVISIONING, q.to_string().as_bytes(), 4096);
    assert_eq!(reply.code, Code::Internal);
    let v: Value = serde_json::from_slice(&reply.body).unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("alpha.app.config.nnn") && message.contains("4017 bytes") && message.contains("max_payload"), "{message}");
    assert!(reply.body.len() <= 4096);
}

/// Values at a server's `max_payload` (1 MiB): the host ends a scan's page by bytes, the verb
/// pages on from there, and every key in scope (of both parts: `alpha.app` and `alpha.app.…`)
/// is listed exactly once, no reply over its budget: a part cut short bounds the page.
#[test]
fn pages_of_large_values_lose_no_key_when_the_host_cuts_them_by_bytes() {
    let b = MemoryBackend::new();
    let mut big_json = vec![b'a'; 1 << 20];
    big_json[0] = b'"';
    *big_json.last_mut().unwrap() = b'"';
    let mut want = BTreeSet::new();
    for i in 0..12 {
        let k = format!("alpha.app.config.n{i:02}");
        b.put("mesh-provisioner_needs", &k, &big_json);
        want.insert(k);
    }
    // Shorter keys sort between and after the long ones' pages.
    for k in ["alpha.app", "beta.app", "zeta.app", "alpha.app.config", "alpha.app.config.n05.deeper"] {
        b.put("mesh-provisioner_needs", k, b"{}");
        want.insert(k.to_string());
    }
    let env = Native(b);
    // By module only: two filters (`*.app` and `*.app.>`), read side by side.
    let a = Ask { what: "needs", fields: vec![("module", "app".into())], fixed: vec![] };
    let (listed, largest) = all_pages(&env, &a, 1000, 8 << 20).unwrap();
    let got: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(got.len(), listed.len(), "a key listed twice: {listed:?}");
    assert_eq!(got, want);
    assert!(largest <= 8 << 20, "a reply of {largest} bytes");
}
