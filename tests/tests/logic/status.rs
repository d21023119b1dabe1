//! The status state table (SPEC §7.1), natively: the guest's logic over the host's in-memory
//! mirrors, every module state and every check, and the listing of modules from every source,
//! paged. No wasm and no bus: the component and the real server are in `component_status` and
//! `e2e::status`.

use std::collections::BTreeSet;

use guest::checks::Check;
use guest::env::{Entry, Env, HostError, Level, Page};
use guest::status::{self, ModuleState};
use guest::verb::{handle, Code, PROVISIONING};
use mesh_provisioner::store::backend::MemoryBackend;
use serde_json::{json, Value};
use tests::native::Native;
use tests::status_mesh::mesh;

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const ASSIGNMENTS: &str = "mesh-controller_assignments";
const CONFIG: &str = "mesh-config_values";

fn of(b: &std::sync::Arc<MemoryBackend>, node: &str, module: &str) -> status::ModuleStatus {
    status::module(&Native(b.clone()), node, module).expect("status")
}

fn check_of<'a>(s: &'a status::ModuleStatus, kind: &str, name: &str) -> &'a status::NeedStatus {
    s.needs.iter().find(|n| n.kind == kind && n.name == name).unwrap_or_else(|| panic!("no need {kind}:{name} in {s:?}"))
}

#[test]
fn an_applied_module_whose_every_grant_holds_is_applied() {
    let b = mesh();
    let s = of(&b, "alpha", "app");
    assert_eq!(s.state, ModuleState::Applied, "{}", s.reason);
    assert_eq!(s.have.as_deref(), Some("b7"));
    assert_eq!(s.applied_at.as_deref(), Some("2026-11-30T10:00:00Z"));
    let config = b.bucket(CONFIG).get("alpha.app.db_url").unwrap().unwrap().revision;
    assert_eq!(check_of(&s, "config", "db_url").check, Check::Present { revision: config, applied: None });
    assert_eq!(check_of(&s, "secret", "db_password").check, Check::Answered { responders: 2 });
    assert!(matches!(check_of(&s, "bound", "postgres.db").check, Check::Present { .. }));
    let report = check_of(&s, "config", "report_url");
    assert_eq!(report.check, Check::NotInstalled);
    assert!(report.reason.contains("part reports is not installed"), "{}", report.reason);
    assert!(s.reason.contains("1 of parts not installed"), "{}", s.reason);
}

#[test]
fn a_value_that_vanished_degrades_an_applied_module() {
    let b = mesh();
    b.delete(CONFIG, "alpha.app.db_url");
    let s = of(&b, "alpha", "app");
    assert_eq!(s.state, ModuleState::Degraded);
    assert_eq!(check_of(&s, "config", "db_url").check, Check::Missing);
    assert!(s.reason.contains("config:db_url") && s.reason.contains("no longer hold"), "{}", s.reason);
}

#[test]
fn a_missing_value_before_anything_is_applied_is_pending() {
    let b = mesh();
    let s = of(&b, "alpha", "web");
    assert_eq!(check_of(&s, "config", "base_url").check, Check::Missing);
    assert_eq!(s.state, ModuleState::Pending, "{}", s.reason);
}

#[test]
fn a_provider_assigned_nowhere_blocks_even_an_applied_module() {
    let b = mesh();
    let s = of(&b, "beta", "cache");
    let need = check_of(&s, "bound", "redis.cache");
    assert_eq!(need.check, Check::NoProvider);
    assert!(need.reason.contains("no node is assigned provider redis"), "{}", need.reason);
    assert_eq!(need.provider.as_ref().map(|p| (p.module.as_str(), p.nodes.len())), Some(("redis", 0)));
    assert_eq!(s.state, ModuleState::Blocked);
    assert!(s.reason.contains("bound:redis.cache"), "{}", s.reason);
}

#[test]
fn a_provider_goes_from_none_to_pending_to_present_as_it_is_assigned_applied_and_writes() {
    let b = mesh();
    // Assigned to gamma, not applied anywhere: pending, naming the node waited for, even
    // though the module itself is applied.
    b.put(ASSIGNMENTS, "gamma.redis", br#"{"want":"r1"}"#);
    let s = of(&b, "beta", "cache");
    let need = check_of(&s, "bound", "redis.cache");
    assert_eq!(need.check, Check::ProviderPending { node: "gamma".into() });
    assert!(need.reason.contains("waiting for redis on gamma"), "{}", need.reason);
    assert_eq!(s.state, ModuleState::Pending, "{}", s.reason);
    assert!(s.reason.contains("wait for a provider") && s.reason.contains("gamma"), "{}", s.reason);
    // Applied on gamma, its bucket not yet made: the value is missing, not the provider.
    b.put(APPLIED, "gamma.redis", br#"{"build":"r1","needs":0}"#);
    let need = check_of(&of(&b, "beta", "cache"), "bound", "redis.cache").clone();
    assert_eq!(need.check, Check::Missing, "{}", need.reason);
    assert!(need.reason.contains("applied on gamma and has written nothing"), "{}", need.reason);
    let p = need.provider.expect("the provider is named");
    assert_eq!((p.module.as_str(), p.nodes[0].node.as_str(), p.nodes[0].applied), ("redis", "gamma", true));
    // It writes the value: present, and the module is applied again.
    b.bucket("redis_bound").set_missing(false);
    b.put("redis_bound", "beta.cache.cache", b"{}");
    let s = of(&b, "beta", "cache");
    assert!(matches!(check_of(&s, "bound", "redis.cache").check, Check::Present { .. }));
    assert_eq!(s.state, ModuleState::Applied);
    // Its node goes away and the controller moves it to alpha, where it is not applied yet:
    // the value written by the old one is not trusted; the consumer waits again.
    b.delete(ASSIGNMENTS, "gamma.redis");
    b.put(ASSIGNMENTS, "alpha.redis", br#"{"want":"r1"}"#);
    let s = of(&b, "beta", "cache");
    assert_eq!(check_of(&s, "bound", "redis.cache").check, Check::ProviderPending { node: "alpha".into() });
    assert_eq!(s.state, ModuleState::Pending, "{}", s.reason);
}

#[test]
fn a_verb_whose_service_is_assigned_but_not_answering_is_pending() {
    let b = mesh();
    b.set_responders("mesh-vault", 0);
    b.put(ASSIGNMENTS, "beta.mesh-vault", br#"{"want":"v1"}"#);
    let s = of(&b, "alpha", "app");
    let need = check_of(&s, "secret", "db_password");
    assert_eq!(need.check, Check::ProviderPending { node: "beta".into() });
    assert!(need.reason.contains("no instance answers discovery yet"), "{}", need.reason);
    assert_eq!(s.state, ModuleState::Pending, "{}", s.reason);
    // Answering: answered, and the assignment is shown.
    b.set_responders("mesh-vault", 1);
    let s = of(&b, "alpha", "app");
    let need = check_of(&s, "secret", "db_password");
    assert_eq!(need.check, Check::Answered { responders: 1 });
    assert_eq!(need.provider.as_ref().map(|p| p.nodes.len()), Some(1));
}

#[test]
fn a_verb_with_no_responders_blocks() {
    let b = mesh();
    b.set_responders("mesh-vault", 0);
    let s = of(&b, "alpha", "app");
    assert_eq!(check_of(&s, "secret", "db_password").check, Check::NoProvider);
    assert_eq!(s.state, ModuleState::Blocked);
    assert!(s.reason.contains("secret:db_password"), "{}", s.reason);
}

#[test]
fn applied_with_nothing_needed_is_not_never_ran() {
    let b = mesh();
    let s = of(&b, "beta", "metrics");
    assert_eq!(s.state, ModuleState::NothingNeeded, "{}", s.reason);
    let s = of(&b, "gamma", "worker");
    assert_eq!(s.state, ModuleState::NeverRan, "{}", s.reason);
    assert_eq!(s.want.as_deref(), Some("k1"));
    assert!(s.reason.contains("assigned (want k1)"), "{}", s.reason);
}

#[test]
fn a_kind_no_domain_answers_blocks() {
    let b = mesh();
    let s = of(&b, "gamma", "odd");
    assert_eq!(check_of(&s, "widget", "x").check, Check::Unanswered);
    assert_eq!(s.state, ModuleState::Blocked);
}

/// The mesh's env, but discovery cannot be made (the bus is down).
struct NoDiscovery(Native);

impl Env for NoDiscovery {
    fn get(&self, b: &str, k: &str) -> Result<Option<Entry>, HostError> {
        self.0.get(b, k)
    }
    fn scan(&self, b: &str, f: &str, a: Option<&str>, l: u32) -> Result<Page, HostError> {
        self.0.scan(b, f, a, l)
    }
    fn exists(&self, b: &str) -> Result<bool, HostError> {
        self.0.exists(b)
    }
    fn responders(&self, _: &str) -> Result<u32, HostError> {
        Err(HostError::Timeout("the bus did not answer".into()))
    }
    fn put_registry(&self, k: &str, v: &[u8], e: u64) -> Result<u64, HostError> {
        self.0.put_registry(k, v, e)
    }
    fn delete_registry(&self, k: &str, e: u64) -> Result<(), HostError> {
        self.0.delete_registry(k, e)
    }
    fn log(&self, l: Level, m: &str) {
        self.0.log(l, m)
    }
    fn load_plan(&self, n: &str, m: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.0.load_plan(n, m)
    }
    fn save_plan(&self, n: &str, m: &str, p: &[u8]) -> Result<(), HostError> {
        self.0.save_plan(n, m, p)
    }
    fn keep_failure(&self, n: &str, m: &str) -> Option<String> {
        self.0.keep_failure(n, m)
    }
}

#[test]
fn a_check_that_cannot_be_made_is_unknown_and_never_passes() {
    let b = mesh();
    let s = status::module(&NoDiscovery(Native(b)), "alpha", "app").unwrap();
    let secret = check_of(&s, "secret", "db_password");
    assert_eq!(secret.check, Check::Unknown);
    assert!(secret.reason.contains("could not be made now"), "{}", secret.reason);
    assert_eq!(s.state, ModuleState::Degraded, "an unknown check must not look applied: {}", s.reason);
}

#[test]
fn planned_needs_join_recorded_ones_by_kind_and_name() {
    let b = mesh();
    b.put(ASSIGNMENTS, "alpha.app", br#"{"want":"b7"}"#);
    let plan = json!({"state":"published","plan":{"parts":["api"],"needs":[
        {"kind":"config","name":"db_url","part":"api"},
        {"kind":"dir","name":"state","part":"api"}]}});
    b.put("composed-alpha", "app.b7", plan.to_string().as_bytes());
    let s = of(&b, "alpha", "app");
    let db = check_of(&s, "config", "db_url");
    assert!(db.recorded && db.planned);
    let dir = check_of(&s, "dir", "state");
    assert!(!dir.recorded && dir.planned);
    // Placement values live in the assignment, which exists.
    assert!(matches!(dir.check, Check::Present { .. }), "{dir:?}");
}

fn page(b: &std::sync::Arc<MemoryBackend>, q: Value, budget: u32) -> Value {
    let reply = handle(&Native(b.clone()), PROVISIONING, q.to_string().as_bytes(), budget);
    let v: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(reply.code, Code::Ok, "{v}");
    assert!(reply.body.len() <= budget.max(guest::verb::MIN_ANSWER) as usize);
    v
}

/// Every module across all pages of `q`, in order.
fn listed(b: &std::sync::Arc<MemoryBackend>, q: Value, budget: u32) -> Vec<String> {
    let mut out = Vec::new();
    let mut q = q;
    loop {
        let v = page(b, q.clone(), budget);
        for e in v["entries"].as_array().unwrap() {
            out.push(format!("{}.{}", e["node"].as_str().unwrap(), e["module"].as_str().unwrap()));
        }
        match v.get("next") {
            Some(n) => q["after"] = n.clone(),
            None => return out,
        }
    }
}

#[test]
fn lists_every_module_known_from_any_source_once_in_key_order() {
    let b = mesh();
    // Modules whose names extend others with '-' (their needs keys sort first), and one known
    // only from its node engine's composition.
    b.put(NEEDS, "alpha.app-x.config.a", b"{}");
    b.put(NEEDS, "alpha.app-x-y.config.a", b"{}");
    b.put(APPLIED, "alpha.ap", br#"{"build":"b1","needs":0}"#);
    b.put("composed-gamma", "engine-only.e1", br#"{"state":"refused","reason":"no"}"#);
    let all = [
        "alpha.ap",
        "alpha.app",
        "alpha.app-x",
        "alpha.app-x-y",
        "alpha.web",
        "beta.cache",
        "beta.metrics",
        "gamma.engine-only",
        "gamma.odd",
        "gamma.postgres",
        "gamma.worker",
    ];
    for limit in [1, 2, 3, 1000] {
        assert_eq!(listed(&b, json!({"what":"status","limit":limit}), 1 << 20), all, "limit {limit}");
    }
    let gamma = listed(&b, json!({"what":"status","node":"gamma","limit":1}), 1 << 20);
    assert_eq!(gamma, ["gamma.engine-only", "gamma.odd", "gamma.postgres", "gamma.worker"]);
    assert_eq!(listed(&b, json!({"what":"status","module":"app"}), 1 << 20), ["alpha.app"]);
    assert_eq!(listed(&b, json!({"what":"status","node":"gamma","module":"engine-only"}), 1 << 20), ["gamma.engine-only"]);
    assert_eq!(listed(&b, json!({"what":"status","node":"beta","module":"metrics"}), 1 << 20), ["beta.metrics"]);
    assert!(listed(&b, json!({"what":"status","node":"beta","module":"nothing"}), 1 << 20).is_empty());
    // Paged by bytes too: a small reply still reaches every module.
    assert_eq!(listed(&b, json!({"what":"status"}), 4096), all);
    let set: BTreeSet<_> = all.iter().collect();
    assert_eq!(set.len(), all.len());
}

#[test]
fn names_the_out_of_shape_keys_of_each_module() {
    let b = mesh();
    b.put(NEEDS, "alpha.app.config.=3a", b"{}");
    b.put(APPLIED, "alpha.app.extra", b"{}");
    let v = page(&b, json!({"what":"status","node":"alpha","module":"app"}), 1 << 20);
    let odd: Vec<(&str, &str)> = v["out_of_shape"].as_array().unwrap().iter().map(|o| (o["bucket"].as_str().unwrap(), o["key"].as_str().unwrap())).collect();
    assert_eq!(odd, [(NEEDS, "alpha.app.config.=3a"), (APPLIED, "alpha.app.extra")]);
    assert!(v["out_of_shape"][0]["reason"].as_str().unwrap().contains("upper-case"));
    assert!(v["out_of_shape"][1]["reason"].as_str().unwrap().contains("applied keys"), "{v}");
}

#[test]
fn a_page_says_each_modules_deeper_keys_as_its_own_status_does() {
    // A page reads the deeper applied and assignments keys once for all its modules; a module
    // asked alone scans its own. Both say the same keys, in the same order.
    let b = mesh();
    b.put(APPLIED, "alpha.app.zz", b"{}");
    b.put(APPLIED, "alpha.app.extra", b"{}");
    b.put(ASSIGNMENTS, "alpha.app.more", b"{}");
    b.put(ASSIGNMENTS, "alpha.web.x.y", b"{}");
    b.put(APPLIED, "beta.cache.v2", b"{}");
    b.put(APPLIED, "alpha.ghost.extra", b"{}");
    let key = |o: &Value| format!("{} {}", o["bucket"].as_str().unwrap(), o["key"].as_str().unwrap());
    for q in [json!({"what":"status"}), json!({"what":"status","node":"alpha"}), json!({"what":"status","module":"app"})] {
        for limit in [1, 2, 1000] {
            let (mut said, mut own) = (Vec::new(), Vec::new());
            let mut q = q.clone();
            q["limit"] = json!(limit);
            loop {
                let v = page(&b, q.clone(), 1 << 20);
                for e in v["entries"].as_array().unwrap() {
                    let alone = of(&b, e["node"].as_str().unwrap(), e["module"].as_str().unwrap());
                    own.extend(alone.out_of_shape.iter().map(|o| format!("{} {}", o.bucket, o.key)));
                }
                said.extend(v["out_of_shape"].as_array().unwrap().iter().map(key).filter(|k| !k.ends_with("alpha.ghost.extra")));
                match v.get("next") {
                    Some(n) => q["after"] = n.clone(),
                    None => break,
                }
            }
            assert_eq!(said, own, "{q}");
            if q.get("module").is_none() {
                assert!(said.contains(&format!("{ASSIGNMENTS} alpha.web.x.y")), "{q}: {said:?}");
            }
            assert!(said.iter().position(|k| k.ends_with("alpha.app.zz")) < said.iter().position(|k| k.ends_with("alpha.app.more")), "{said:?}");
        }
    }
}

#[test]
fn a_value_newer_than_the_one_applied_is_stale_and_degrades() {
    let b = mesh();
    let now = b.bucket(CONFIG).get("alpha.app.db_url").unwrap().unwrap().revision;
    let record = |applied: u64| json!({"build":"b7","needs":4,"parts":["api"],"values":{"config:db_url": applied}}).to_string();
    b.put(APPLIED, "alpha.app", record(now).as_bytes());
    let s = of(&b, "alpha", "app");
    assert_eq!(check_of(&s, "config", "db_url").check, Check::Present { revision: now, applied: Some(now) });
    assert_eq!(s.state, ModuleState::Applied, "{}", s.reason);
    // The value is rotated; the holder still runs the old one.
    let rotated = b.put(CONFIG, "alpha.app.db_url", b"postgres://db-rotated");
    let s = of(&b, "alpha", "app");
    assert_eq!(check_of(&s, "config", "db_url").check, Check::Stale { applied: now, revision: rotated });
    assert_eq!(s.state, ModuleState::Degraded);
    assert!(s.reason.contains(&format!("applied at revision {now}; revision {rotated}")), "{}", s.reason);
    // The holder applies the new one.
    b.put(APPLIED, "alpha.app", record(rotated).as_bytes());
    assert_eq!(of(&b, "alpha", "app").state, ModuleState::Applied);
}

#[test]
fn a_status_page_after_a_node_starts_with_the_next_nodes_first_module() {
    let b = MemoryBackend::new();
    for (node, module) in [("alpha", "a1"), ("alpha", "a2"), ("alpha", "zz"), ("alpha-1", "x"), ("beta", "b1"), ("gamma", "g1")] {
        b.put(APPLIED, &format!("{node}.{module}"), br#"{"build":"b1","needs":0}"#);
    }
    assert_eq!(listed(&b, json!({"what":"status"}), 1 << 20), ["alpha-1.x", "alpha.a1", "alpha.a2", "alpha.zz", "beta.b1", "gamma.g1"]);
    let first = |after_node: &str| page(&b, json!({"what":"status","after_node":after_node,"limit":1}), 1 << 20)["entries"][0]["module"].clone();
    assert_eq!(first("alpha-1"), json!("a1"));
    assert_eq!(first("alpha"), json!("b1"));
    assert_eq!(first("beta"), json!("g1"));
    assert_eq!(first("gamma"), Value::Null);
    // A node that holds no module: the first of the nodes after it.
    assert_eq!(first("alpha-0"), json!("x"));
    // The page goes on from there as any page does.
    let v = page(&b, json!({"what":"status","after_node":"alpha","limit":1}), 1 << 20);
    assert_eq!(listed(&b, json!({"what":"status","after":v["next"]}), 1 << 20), ["gamma.g1"]);
    // Not with `after`, and only an identifier.
    for (q, says) in [
        (json!({"what":"status","after_node":"alpha","after":"x"}), "both given"),
        (json!({"what":"status","after_node":"a.b"}), "not an identifier"),
        (json!({"what":"needs","after_node":"alpha"}), "does not apply"),
    ] {
        let reply = handle(&Native(b.clone()), PROVISIONING, q.to_string().as_bytes(), 1 << 20);
        assert_eq!(reply.code, Code::BadRequest);
        assert!(String::from_utf8_lossy(&reply.body).contains(says), "{q}: {}", String::from_utf8_lossy(&reply.body));
    }
}
