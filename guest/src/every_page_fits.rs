//! Every `what` (the four buckets', `status`, `holders`), over random meshes, at the smallest
//! budgets: each page a reply of at most its budget, JSON, and either a page that moves on or
//! the one error that says an item cannot fit at all. The property behind `max_payload`: the
//! bus never refuses a reply for its size. Test-only; it sits above `verb`.

use crate::keys::{APPLIED, ASSIGNMENTS, COLLECT, NEEDS, REGISTRY};
use crate::mem_env::MemEnv;
use crate::verb::{handle, Code, MIN_ANSWER, PROVISIONING};
use proptest::prelude::*;
use serde_json::{json, Value};

/// A token of a key: short, long, escaped, or one a key should not hold at all.
fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop_oneof![Just("alpha"), Just("beta"), Just("app"), Just("web")].prop_map(String::from),
        1 => (1usize..900).prop_map(|n| "n".repeat(n)),
        1 => prop_oneof![Just("q\"uo\\te"), Just("=2Eodd"), Just("-"), Just("tab\there"), Just("é")].prop_map(String::from),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => Just(b"{}".to_vec()),
        3 => (0usize..400).prop_map(|n| format!("\"{}\"", "x".repeat(n)).into_bytes()),
        1 => (0usize..5000).prop_map(|n| format!("{{\"password\":\"{}\"}}", "\"".repeat(n)).into_bytes()),
        1 => proptest::collection::vec(any::<u8>(), 0..3000),
    ]
}

/// One key (and its value) of a mesh: a bucket, its node and module (most often ones the
/// requests ask for), what follows them, and the value.
fn item() -> impl Strategy<Value = (usize, Vec<String>, Vec<u8>)> {
    let named = prop_oneof![3 => Just("alpha".to_string()), 2 => (0..20).prop_map(|i| format!("n{i}")), 1 => token()];
    let kind = prop_oneof![Just("bound"), Just("config"), Just("secret")].prop_map(String::from);
    let name = prop_oneof![2 => Just("postgres=2Edb".to_string()), 2 => Just("db_url".to_string()), 1 => token()];
    let tail = prop_oneof![3 => (kind, name).prop_map(|(k, n)| vec![k, n]), 1 => proptest::collection::vec(token(), 0..3)];
    let module = prop_oneof![2 => Just("app".to_string()), 3 => (0..30).prop_map(|i| format!("m{i}")), 1 => token()];
    (0usize..8, named, module, tail, value()).prop_map(|(bucket, node, module, tail, value)| (bucket, [vec![node, module], tail].concat(), value))
}

const BUCKETS: [&str; 8] = [REGISTRY, NEEDS, NEEDS, APPLIED, COLLECT, ASSIGNMENTS, "postgres_bound", "mesh-config_values"];

fn mesh(items: &[(usize, Vec<String>, Vec<u8>)]) -> MemEnv {
    let env = MemEnv::default();
    // A module with a plan, so that status and holders say more than the recorded needs.
    env.put(APPLIED, "alpha.app", br#"{"build":"b1","needs":2,"values":{"bound:postgres.db":1}}"#);
    env.put(ASSIGNMENTS, "alpha.app", br#"{"want":"b1"}"#);
    env.put("composed-alpha", "app.b1", br#"{"state":"published","plan":{"needs":[{"kind":"bound","name":"postgres.db"}]}}"#);
    for (bucket, tokens, value) in items {
        env.put(BUCKETS[*bucket], &tokens.join("."), value);
    }
    env
}

fn asks() -> impl Strategy<Value = Value> {
    let what = prop_oneof![Just("registry"), Just("needs"), Just("applied"), Just("collect"), Just("status"), Just("holders")];
    let node = prop_oneof![Just(None), Just(Some("alpha")), Just(Some("beta"))];
    let module = prop_oneof![Just(None), Just(Some("app"))];
    let holder = prop_oneof![Just(("bound", "postgres.db")), Just(("config", "db_url"))];
    (what, node, module, holder, prop_oneof![1 => Just(1u32), 1 => Just(3), 6 => Just(1000)]).prop_map(|(what, node, module, (kind, name), limit)| {
        let mut q = json!({"what": what, "limit": limit});
        let allowed = crate::request::What::ALL.into_iter().find(|w| w.name() == what).expect("a what");
        for (field, v) in [("node", node), ("module", module), ("kind", Some(kind)), ("name", Some(name))] {
            if let (Some(v), true) = (v, allowed.allows(field)) {
                q[field] = json!(v);
            }
        }
        q
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn every_page_of_every_what_fits_the_smallest_budgets(
        items in proptest::collection::vec(item(), 0..300),
        ask in asks(),
        budget in prop_oneof![Just(MIN_ANSWER), MIN_ANSWER..MIN_ANSWER + 3000],
    ) {
        let env = mesh(&items);
        let mut q = ask.clone();
        for _ in 0..200 {
            let r = handle(&env, PROVISIONING, q.to_string().as_bytes(), budget);
            prop_assert!(r.body.len() <= budget as usize, "{} bytes over a budget of {budget} for {q}", r.body.len());
            let v: Value = serde_json::from_slice(&r.body).map_err(|e| TestCaseError::fail(format!("not JSON ({e}) for {q}")))?;
            if r.code != Code::Ok {
                let message = v["error"]["message"].as_str().unwrap_or_default();
                prop_assert!(r.code == Code::Internal && message.contains("cannot"), "{q}: {v}");
                return Ok(());
            }
            match v.get("next").and_then(Value::as_str) {
                Some(next) => {
                    prop_assert!(q.get("after").and_then(Value::as_str).is_none_or(|a| next > a), "{q} went back to {next}");
                    q["after"] = json!(next);
                }
                None => return Ok(()),
            }
        }
        prop_assert!(false, "more than 200 pages for {ask}");
    }
}
