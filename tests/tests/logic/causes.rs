//! Causes (SPEC §7.4), natively: what keeps each module from `applied`, read off its status,
//! and the causes of many modules said once each, over pages. The real bus and component are
//! in `e2e::causes`.

use std::collections::BTreeSet;

use guest::causes;
use guest::status::{self, ModuleState};
use guest::verb::{handle, Code, PROVISIONING};
use mesh_provisioner::base::causes::Merged;
use mesh_provisioner::store::backend::MemoryBackend;
use serde_json::{json, Value};
use tests::native::Native;
use tests::status_mesh::mesh;

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const ASSIGNMENTS: &str = "mesh-controller_assignments";

fn ask(b: &std::sync::Arc<MemoryBackend>, q: Value) -> Value {
    let reply = handle(&Native(b.clone()), PROVISIONING, q.to_string().as_bytes(), 1 << 20);
    assert_eq!(reply.code, Code::Ok, "{}", String::from_utf8_lossy(&reply.body));
    let v: Value = serde_json::from_slice(&reply.body).expect("JSON");
    tests::schema::check("provisioning.reply", &v);
    v
}

/// Every page of `q`, merged as the CLI and the page merge them.
fn every_page(b: &std::sync::Arc<MemoryBackend>, mut q: Value) -> (Merged, usize) {
    let (mut merged, mut pages) = (Merged::default(), 0);
    loop {
        let page = ask(b, q.clone());
        merged.add(&page);
        pages += 1;
        match page.get("next") {
            Some(next) => q["after"] = next.clone(),
            None => return (merged, pages),
        }
    }
}

fn kinds_and_names(causes: &[Value]) -> BTreeSet<(String, String)> {
    causes.iter().map(|c| (c["kind"].as_str().unwrap_or("").to_string(), c["names"].as_str().unwrap_or("").to_string())).collect()
}

#[test]
fn each_module_held_shows_the_cause_that_holds_it() {
    let b = mesh();
    let page = ask(&b, json!({"what":"causes"}));
    let expected: BTreeSet<(String, String)> = [
        ("provider_unassigned", "redis"),
        ("value_missing", "mesh-config_values config:base_url"),
        ("composition", "composed-gamma worker.k1"),
        ("no_domain", "widget"),
    ]
    .iter()
    .map(|(k, n)| (k.to_string(), n.to_string()))
    .collect();
    let entries = page["entries"].as_array().cloned().unwrap_or_default();
    assert_eq!(kinds_and_names(&entries), expected, "{page}");
    assert_eq!((page["examined"].as_u64(), page["held"].as_u64()), (Some(7), Some(4)), "{page}");
    let redis = entries.iter().find(|c| c["names"] == "redis").expect("redis");
    assert_eq!(redis["first"], json!({"node":"beta","module":"cache"}));
    assert_eq!(redis["needs"], json!(["bound:redis.cache"]));
    assert!(redis["clear"].as_str().unwrap_or("").contains("mesh-controller_assignments key <node>.redis"), "{redis}");
}

#[test]
fn a_module_has_a_cause_exactly_when_its_status_is_not_applied() {
    let b = mesh();
    for (node, module) in
        [("alpha", "app"), ("alpha", "web"), ("beta", "cache"), ("beta", "metrics"), ("gamma", "worker"), ("gamma", "odd"), ("gamma", "postgres")]
    {
        let s = status::module(&Native(b.clone()), node, module).expect("status");
        let held = !matches!(s.state, ModuleState::Applied | ModuleState::NothingNeeded);
        assert_eq!(!causes::of_module(&s).is_empty(), held, "{node}/{module}: {:?} {}", s.state, s.reason);
    }
}

#[test]
fn one_cause_holding_many_modules_on_many_nodes_is_said_once_over_pages() {
    let b = MemoryBackend::new();
    b.remove_bucket("postgres_bound");
    b.put(ASSIGNMENTS, "delta.redis", br#"{"want":"r1"}"#);
    for node in ["alpha", "beta", "gamma"] {
        for i in 0..20 {
            b.put(NEEDS, &format!("{node}.m{i:02}.bound.postgres=2Edb"), b"{}");
            // Every third module waits for redis too, assigned to delta and not applied there.
            if i % 3 == 0 {
                b.put(NEEDS, &format!("{node}.m{i:02}.bound.redis=2Ecache"), b"{}");
            }
        }
    }
    b.put(APPLIED, "alpha.m00", br#"{"build":"b1","needs":2}"#);
    // Pages of 7 modules: each node's modules span pages, and a cause's nodes are not counted twice.
    let (merged, pages) = every_page(&b, json!({"what":"causes","limit":7}));
    assert!(pages > 5, "{pages} page(s)");
    let postgres = merged.causes.iter().find(|c| c["kind"] == "provider_unassigned").expect("postgres");
    assert_eq!((postgres["names"].as_str(), postgres["modules"].as_u64(), postgres["nodes"].as_u64()), (Some("postgres"), Some(60), Some(3)));
    assert_eq!((postgres["first"]["node"].as_str(), postgres["last"]["module"].as_str()), (Some("alpha"), Some("m19")));
    let redis = merged.causes.iter().find(|c| c["kind"] == "provider_not_applied").expect("redis");
    assert_eq!((redis["names"].as_str(), redis["modules"].as_u64(), redis["nodes"].as_u64()), (Some("redis on delta"), Some(21), Some(3)));
    // delta/redis itself is assigned, and its engine has published no composition of it.
    let redis_itself = merged.causes.iter().find(|c| c["kind"] == "composition").expect("delta/redis");
    assert_eq!((redis_itself["names"].as_str(), redis_itself["modules"].as_u64()), (Some("composed-delta redis.r1"), Some(1)));
    assert_eq!(merged.causes.len(), 3, "{:?}", merged.causes);
    assert_eq!((merged.examined, merged.held), (61, 61));
    // Narrowed to a node, the same causes of its modules only.
    let (beta, _) = every_page(&b, json!({"what":"causes","node":"beta"}));
    let postgres = beta.causes.iter().find(|c| c["kind"] == "provider_unassigned").expect("postgres");
    assert_eq!((postgres["modules"].as_u64(), postgres["nodes"].as_u64()), (Some(20), Some(1)));
}

#[test]
fn a_limit_above_the_most_a_page_examines_is_clamped() {
    let b = MemoryBackend::new();
    for i in 0..(causes::MAX_CAUSE_MODULES + 3) {
        b.put(NEEDS, &format!("alpha.m{i:04}.widget.x"), b"{}");
    }
    let page = ask(&b, json!({"what":"causes","limit": 1_000_000}));
    assert_eq!(page["examined"].as_u64(), Some(u64::from(causes::MAX_CAUSE_MODULES)), "{}", page["examined"]);
    assert!(page["next"].is_string(), "a next page: {page}");
    let edge = ask(&b, json!({"what":"causes","limit": causes::MAX_CAUSE_MODULES}));
    assert_eq!(edge["examined"], page["examined"]);
}

#[test]
fn a_request_of_causes_refuses_a_field_it_does_not_take() {
    let b = mesh();
    let reply = handle(&Native(b.clone()), PROVISIONING, br#"{"what":"causes","kind":"config"}"#, 1 << 20);
    assert_eq!(reply.code, Code::BadRequest);
    assert!(String::from_utf8_lossy(&reply.body).contains("field `kind` does not apply to what=causes"), "{}", String::from_utf8_lossy(&reply.body));
}
