//! Holders and notices (SPEC §7.2), natively: the guest's logic over the host's in-memory
//! mirrors. Who holds a value, each holder's generation, paging, the cost of finding holders,
//! and who is told of a change. The component and the real server are in `e2e::holders`.

use std::collections::BTreeSet;
use std::sync::Arc;

use guest::holders::{self, HolderEvent};
use guest::verb::{handle, Code, PROVISIONING};
use mesh_provisioner::store::backend::MemoryBackend;
use serde_json::{json, Value};
use tests::native::Native;

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const ASSIGNMENTS: &str = "mesh-controller_assignments";
const BOUND: &str = "postgres_bound";

fn ask(b: &Arc<MemoryBackend>, body: Value) -> (Code, Value) {
    let r = handle(&Native(b.clone()), PROVISIONING, body.to_string().as_bytes(), 1 << 20);
    (r.code, serde_json::from_slice(&r.body).expect("a reply is JSON"))
}

fn holders_of(b: &Arc<MemoryBackend>) -> Value {
    let (code, v) = ask(b, json!({"what":"holders","kind":"bound","name":"postgres.db"}));
    assert_eq!(code, Code::Ok, "{v}");
    v
}

fn state_of<'a>(v: &'a Value, node: &str, module: &str) -> &'a Value {
    v["holders"].as_array().unwrap().iter().find(|h| h["node"] == node && h["module"] == module).unwrap_or_else(|| panic!("no holder {node}/{module} in {v}"))
}

/// Three nodes hold `bound:postgres.db`, each at its own place in `postgres_bound`.
fn three_holders() -> Arc<MemoryBackend> {
    let b = MemoryBackend::new();
    for node in ["alpha", "beta", "gamma"] {
        b.put(NEEDS, &format!("{node}.app.bound.postgres=2Edb"), b"{}");
        b.put(NEEDS, &format!("{node}.app.config.db_url"), b"{}");
        b.put(BOUND, &format!("{node}.app.db"), br#"{"password":"one"}"#);
    }
    // A module needing another value is no holder.
    b.put(NEEDS, "alpha.web.bound.postgres=2Ereports", b"{}");
    // The provider runs (SPEC §7.3): assigned to gamma and applied there.
    b.put("mesh-controller_assignments", "gamma.postgres", br#"{"want":"p1"}"#);
    b.put(APPLIED, "gamma.postgres", br#"{"build":"p1","needs":0}"#);
    b
}

fn apply(b: &Arc<MemoryBackend>, node: &str, revision: u64) {
    let record = json!({"build":"b1","needs":2,"values":{"bound:postgres.db":revision},"at":"2026-11-30T10:00:00Z"});
    b.put(APPLIED, &format!("{node}.app"), record.to_string().as_bytes());
}

fn revision_at(b: &Arc<MemoryBackend>, node: &str) -> u64 {
    b.bucket(BOUND).get(&format!("{node}.app.db")).unwrap().unwrap().revision
}

#[test]
fn lists_every_holder_with_its_place_and_generation() {
    let b = three_holders();
    apply(&b, "alpha", revision_at(&b, "alpha"));
    apply(&b, "beta", revision_at(&b, "beta") - 1);
    b.put(APPLIED, "gamma.app", br#"{"build":"b1","needs":2}"#);
    let v = holders_of(&b);
    assert_eq!(v["count"], 3, "{v}");
    let alpha = state_of(&v, "alpha", "app");
    assert_eq!((&alpha["state"], &alpha["bucket"], &alpha["key"]), (&json!("current"), &json!(BOUND), &json!("alpha.app.db")));
    assert_eq!(alpha["applied_revision"], alpha["revision"]);
    assert_eq!(alpha["source"], json!(["recorded"]));
    let beta = state_of(&v, "beta", "app");
    assert_eq!(beta["state"], "stale");
    assert!(beta["reason"].as_str().unwrap().contains(&format!("revision {} is at its place", revision_at(&b, "beta"))), "{beta}");
    // A record without `values` cannot say: unknown, never current.
    let gamma = state_of(&v, "gamma", "app");
    assert_eq!(gamma["state"], "unknown");
    assert!(gamma["reason"].as_str().unwrap().contains("no `values`"), "{gamma}");
    assert_eq!(v["all_current"], false);
}

#[test]
fn all_current_only_when_every_holder_runs_what_is_at_its_place() {
    let b = three_holders();
    let v = holders_of(&b);
    assert!(v["holders"].as_array().unwrap().iter().all(|h| h["state"] == "never_applied"), "{v}");
    assert_eq!(v["all_current"], false);
    for node in ["alpha", "beta", "gamma"] {
        apply(&b, node, revision_at(&b, node));
    }
    assert_eq!(holders_of(&b)["all_current"], true);
    // The provider rewrites one value: that holder is stale until it applies the new revision.
    b.put(BOUND, "beta.app.db", br#"{"password":"two"}"#);
    let v = holders_of(&b);
    assert_eq!((&state_of(&v, "beta", "app")["state"], &v["all_current"]), (&json!("stale"), &json!(false)));
    apply(&b, "beta", revision_at(&b, "beta"));
    assert_eq!(holders_of(&b)["all_current"], true);
    // A value retired from under its holder: what it runs is no longer there.
    b.delete(BOUND, "gamma.app.db");
    let v = holders_of(&b);
    let gamma = state_of(&v, "gamma", "app");
    assert_eq!((&gamma["state"], &gamma["revision"]), (&json!("stale"), &Value::Null));
}

#[test]
fn narrows_by_node_and_refuses_what_does_not_apply() {
    let b = three_holders();
    let (code, v) = ask(&b, json!({"what":"holders","kind":"bound","name":"postgres.db","node":"beta"}));
    assert_eq!(code, Code::Ok);
    let nodes: Vec<&str> = v["holders"].as_array().unwrap().iter().map(|h| h["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["beta"]);
    for (body, why) in [
        (json!({"what":"holders","kind":"bound"}), "field `name` is required"),
        (json!({"what":"holders","name":"postgres.db"}), "field `kind` is required"),
        (json!({"what":"holders","kind":"bound","name":"postgres.db","module":"app"}), "field `module` does not apply to what=holders"),
        (json!({"what":"holders","kind":"b*","name":"postgres.db"}), "field `kind`"),
        (json!({"what":"holders","kind":"bound","name":""}), "field `name`"),
    ] {
        let (code, v) = ask(&b, body.clone());
        assert_eq!(code, Code::BadRequest, "{body}");
        assert!(v["error"]["message"].as_str().unwrap().contains(why), "{body}: {v}");
    }
}

#[test]
fn finds_a_module_that_only_plans_the_value() {
    let b = three_holders();
    b.put(ASSIGNMENTS, "delta.api", br#"{"want":"b9"}"#);
    b.put("composed-delta", "api.b9", br#"{"state":"published","plan":{"parts":["api"],"needs":[{"kind":"bound","name":"postgres.db","part":"api"}]}}"#);
    b.put(ASSIGNMENTS, "delta.other", br#"{"want":"b9"}"#);
    b.put("composed-delta", "other.b9", br#"{"state":"published","plan":{"needs":[{"kind":"config","name":"x"}]}}"#);
    let v = holders_of(&b);
    let delta = state_of(&v, "delta", "api");
    assert_eq!((&delta["source"], &delta["state"], &delta["key"]), (&json!(["planned"]), &json!("never_applied"), &json!("delta.api.db")));
    assert!(v["holders"].as_array().unwrap().iter().all(|h| h["module"] != "other"), "{v}");
    assert_eq!(v["count"], 4);
}

#[test]
fn pages_through_every_holder_exactly_once() {
    let b = MemoryBackend::new();
    let mut want = BTreeSet::new();
    for i in 0..37 {
        // `app` and `app-x` sort differently as modules than as needs keys.
        for module in ["app", "app-x"] {
            let node = format!("n{i:02}");
            b.put(NEEDS, &format!("{node}.{module}.bound.postgres=2Edb"), b"{}");
            want.insert(format!("{node}.{module}"));
        }
        if i % 3 == 0 {
            b.put(ASSIGNMENTS, &format!("n{i:02}.idle"), br#"{"want":"b1"}"#);
        }
    }
    for limit in [1, 7, 1000] {
        let (mut seen, mut after) = (Vec::new(), None::<String>);
        for _ in 0..200 {
            let mut body = json!({"what":"holders","kind":"bound","name":"postgres.db","limit":limit});
            if let Some(a) = &after {
                body["after"] = json!(a);
            }
            let (code, v) = ask(&b, body);
            assert_eq!(code, Code::Ok, "{v}");
            seen.extend(v["holders"].as_array().unwrap().iter().map(|h| format!("{}.{}", h["node"].as_str().unwrap(), h["module"].as_str().unwrap())));
            match v.get("next").and_then(Value::as_str) {
                Some(n) => after = Some(n.to_string()),
                None => break,
            }
        }
        let unique: BTreeSet<String> = seen.iter().cloned().collect();
        assert_eq!(unique.len(), seen.len(), "limit {limit}: a holder listed twice");
        assert_eq!(unique, want, "limit {limit}");
    }
}

#[test]
fn finding_holders_reads_the_holders_not_the_needs_bucket() {
    let b = MemoryBackend::new();
    for i in 0..20_000 {
        b.put(NEEDS, &format!("n{:03}.m{}.config.x{i}", i % 500, i % 7), b"{}");
    }
    for i in 0..50 {
        b.put(NEEDS, &format!("n{i:03}.app.bound.postgres=2Edb"), b"{}");
    }
    holders_of(&b); // builds the index once
    let needs = b.bucket(NEEDS);
    let before = needs.visited();
    let v = holders_of(&b);
    assert_eq!(v["count"], 50);
    let visited = needs.visited() - before;
    assert!(visited <= 100, "finding 50 holders looked at {visited} needs keys of 20 050");
}

#[test]
fn a_reply_never_exceeds_its_budget_and_pages_on() {
    let b = MemoryBackend::new();
    for i in 0..300 {
        b.put(NEEDS, &format!("node{i:04}.app.bound.postgres=2Edb"), b"{}");
    }
    let r = handle(&Native(b.clone()), PROVISIONING, br#"{"what":"holders","kind":"bound","name":"postgres.db"}"#, 8192);
    assert!(r.body.len() <= 8192, "{} bytes", r.body.len());
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert!(v["next"].is_string() && v["count"].as_u64().unwrap() > 0, "{v}");
}

fn event(bucket: &str, key: &str, revision: u64) -> HolderEvent {
    HolderEvent { bucket: bucket.into(), key: key.into(), revision, deleted: false }
}

fn notices(b: &Arc<MemoryBackend>, e: &HolderEvent) -> Vec<Value> {
    holders::notices(&Native(b.clone()), e)
        .expect("notices")
        .iter()
        .map(|n| {
            let v: Value = serde_json::from_slice(&n.body).unwrap();
            assert_eq!(v["node"], n.node.as_str());
            v
        })
        .collect()
}

#[test]
fn a_changed_value_notifies_its_one_holder() {
    let b = three_holders();
    let got = notices(&b, &event(BOUND, "beta.app.db", 42));
    assert_eq!(got, [json!({"node":"beta","module":"app","kind":"bound","name":"postgres.db","place":{"bucket":BOUND,"key":"beta.app.db"},"revision":42})]);
    // Recorded and planned: still one notice.
    b.put(ASSIGNMENTS, "beta.app", br#"{"want":"b1"}"#);
    b.put("composed-beta", "app.b1", br#"{"state":"published","plan":{"needs":[{"kind":"bound","name":"postgres.db"}]}}"#);
    assert_eq!(notices(&b, &event(BOUND, "beta.app.db", 43)).len(), 1);
    // A delete says so.
    let got = holders::notices(&Native(b.clone()), &HolderEvent { deleted: true, ..event(BOUND, "alpha.app.db", 44) }).unwrap();
    assert!(String::from_utf8_lossy(&got[0].body).contains("\"deleted\":true"));
}

#[test]
fn a_change_nobody_holds_notifies_nobody() {
    let b = three_holders();
    for e in [
        event(BOUND, "beta.app.other", 5),
        event(BOUND, "delta.app.db", 5),
        event("redis_bound", "beta.app.db", 5),
        event("mesh-provisioner_needs", "beta.app.bound.postgres=2Edb", 5),
        event(BOUND, "*.app.db", 5),
        event(BOUND, "", 5),
    ] {
        assert!(notices(&b, &e).is_empty(), "{e:?}");
    }
}

#[test]
fn a_collection_change_notifies_each_reader_on_its_node() {
    let b = MemoryBackend::new();
    b.put(NEEDS, "alpha.app.shell.zsh", b"{}");
    b.put(NEEDS, "alpha.web.shell.zsh", b"{}");
    b.put(NEEDS, "beta.app.shell.zsh", b"{}");
    let got = notices(&b, &event("mesh-provisioner_collect", "alpha.shell.tools", 9));
    let who: Vec<String> = got.iter().map(|n| format!("{}/{}", n["node"].as_str().unwrap(), n["module"].as_str().unwrap())).collect();
    assert_eq!(who, ["alpha/app", "alpha/web"]);
}

#[test]
fn names_every_bucket_notices_come_from() {
    assert_eq!(holders::inputs(), ["*_bound", "mesh-config_values", "mesh-controller_assignments", "mesh-provisioner_collect"]);
}
