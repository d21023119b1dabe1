//! State changes (SPEC §7.3), natively: which modules a change moves, the record and the event
//! of each one whose state is not the one recorded, and nothing for the rest. The records are
//! written here as the host would (the bytes as given); the real bus is in `e2e::events`.

use std::sync::Arc;

use guest::transitions::{self, Transition, Transitions, MAX_PER_CALL};
use mesh_provisioner::store::backend::MemoryBackend;
use serde_json::Value;
use tests::native::Native;
use tests::status_mesh::mesh;

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const ASSIGNMENTS: &str = "mesh-controller_assignments";
const STATES: &str = "mesh-provisioner_states";

fn run(b: &Arc<MemoryBackend>, changes: &[(&str, Option<&str>)], now: &str) -> Transitions {
    let changes: Vec<(String, Option<String>)> = changes.iter().map(|(b, k)| (b.to_string(), k.map(str::to_string))).collect();
    transitions::transitions(&Native(b.clone()), &changes, now).expect("transitions")
}

/// Writes the records as the host does (a compare-and-set it wins: nothing else writes here).
fn write(b: &Arc<MemoryBackend>, r: &Transitions) {
    for t in &r.transitions {
        let held = b.bucket(STATES).get(&t.key).unwrap().map_or(0, |e| e.revision);
        assert_eq!(held, t.expected, "the revision read for {}", t.key);
        if t.value.is_empty() {
            b.delete(STATES, &t.key);
        } else {
            b.put(STATES, &t.key, &t.value);
        }
    }
}

fn event(t: &Transition) -> Value {
    serde_json::from_slice(t.event.as_ref().expect("an event")).expect("JSON")
}

fn by_key<'a>(r: &'a Transitions, key: &str) -> Option<&'a Transition> {
    r.transitions.iter().find(|t| t.key == key)
}

/// Every module swept and recorded at `now`.
fn recorded(now: &str) -> Arc<MemoryBackend> {
    let b = mesh();
    let r = run(&b, &[(NEEDS, None)], now);
    write(&b, &r);
    b
}

#[test]
fn a_first_sweep_records_every_module_and_tells_nobody() {
    let b = mesh();
    let r = run(&b, &[(APPLIED, None)], "2026-12-01T10:00:00Z");
    assert!(r.rest.is_empty(), "{:?}", r.rest);
    let keys: Vec<&str> = r.transitions.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["alpha.app", "alpha.web", "beta.cache", "beta.metrics", "gamma.odd", "gamma.postgres", "gamma.worker"]);
    assert!(r.transitions.iter().all(|t| t.event.is_none() && t.expected == 0), "a start is not a change");
    let app: Value = serde_json::from_slice(&by_key(&r, "alpha.app").unwrap().value).unwrap();
    assert_eq!(app, serde_json::json!({"state":"applied","since":"2026-12-01T10:00:00Z"}));
    write(&b, &r);
    // The status says since when.
    let s = guest::status::module(&Native(b.clone()), "alpha", "app").unwrap();
    assert_eq!(s.since.as_deref(), Some("2026-12-01T10:00:00Z"));
    // A second sweep finds every state as recorded: nothing to write, nobody told.
    assert!(run(&b, &[(NEEDS, None)], "2026-12-01T11:00:00Z").transitions.is_empty());
    // The host's periodic sweep is live: a module that appeared since is told, even when the
    // sweep finds it before its own change arrives.
    b.put(NEEDS, "beta.late.config.x", b"{}");
    let r = run(&b, &[(STATES, None)], "2026-12-01T11:01:00Z");
    let t = by_key(&r, "beta.late").expect("found by the sweep");
    assert_eq!((event(t)["was"].clone(), event(t)["state"].as_str()), (Value::Null, Some("pending")));
}

#[test]
fn a_change_is_told_once_with_the_state_it_left_and_since_when() {
    let b = recorded("2026-12-01T10:00:00Z");
    b.delete("mesh-config_values", "alpha.app.db_url");
    let r = run(&b, &[("mesh-config_values", Some("alpha.app.db_url"))], "2026-12-01T10:05:00Z");
    assert_eq!(r.transitions.len(), 1, "{:?}", r.transitions);
    let t = &r.transitions[0];
    assert_eq!((t.key.as_str(), t.node.as_str(), t.state), ("alpha.app", "alpha", "degraded"));
    let e = event(t);
    assert_eq!(
        (e["node"].as_str(), e["module"].as_str(), e["state"].as_str(), e["was"].as_str()),
        (Some("alpha"), Some("app"), Some("degraded"), Some("applied"))
    );
    assert_eq!(e["since"], "2026-12-01T10:05:00Z");
    assert!(e["reason"].as_str().unwrap().contains("config:db_url"), "{e}");
    assert!(t.expected > 0, "a compare-and-set on the record read");
    write(&b, &r);
    // Told once: the same change again, or a sweep, finds nothing new.
    assert!(run(&b, &[("mesh-config_values", Some("alpha.app.db_url"))], "2026-12-01T10:06:00Z").transitions.is_empty());
    assert!(run(&b, &[(NEEDS, None)], "2026-12-01T10:07:00Z").transitions.is_empty());
    let s = guest::status::module(&Native(b.clone()), "alpha", "app").unwrap();
    assert_eq!(s.since.as_deref(), Some("2026-12-01T10:05:00Z"));
}

#[test]
fn a_state_not_yet_recorded_has_no_since_rather_than_a_wrong_one() {
    let b = recorded("2026-12-01T10:00:00Z");
    b.delete("mesh-config_values", "alpha.app.db_url");
    let s = guest::status::module(&Native(b.clone()), "alpha", "app").unwrap();
    assert_eq!(s.state.name(), "degraded");
    assert_eq!(s.since, None);
}

#[test]
fn a_change_found_by_a_sweep_is_told_too_and_a_new_module_live_is_told_from_nothing() {
    let b = recorded("2026-12-01T10:00:00Z");
    // Changed while no holder was publishing: the next sweep tells it.
    b.put(APPLIED, "alpha.web", br#"{"build":"w1","needs":1}"#);
    b.put("mesh-config_values", "alpha.web.base_url", b"x");
    let r = run(&b, &[(NEEDS, None)], "2026-12-01T10:01:00Z");
    let e = event(by_key(&r, "alpha.web").expect("alpha.web moved"));
    assert_eq!((e["was"].as_str(), e["state"].as_str()), (Some("pending"), Some("applied")));
    write(&b, &r);
    // A module that appears live is told, from no state.
    b.put(NEEDS, "beta.new.config.x", b"{}");
    let r = run(&b, &[(NEEDS, Some("beta.new.config.x"))], "2026-12-01T10:02:00Z");
    let e = event(by_key(&r, "beta.new").expect("beta.new"));
    assert_eq!((e["was"].clone(), e["state"].as_str()), (Value::Null, Some("pending")));
}

#[test]
fn a_module_gone_from_every_source_is_told_once_and_its_record_deleted() {
    let b = recorded("2026-12-01T10:00:00Z");
    b.delete(NEEDS, "alpha.web.config.base_url");
    let r = run(&b, &[(NEEDS, Some("alpha.web.config.base_url"))], "2026-12-01T10:03:00Z");
    let t = by_key(&r, "alpha.web").expect("alpha.web");
    assert!(t.value.is_empty(), "the record is deleted");
    assert_eq!((event(t)["state"].as_str(), event(t)["was"].as_str()), (Some("gone"), Some("pending")));
    write(&b, &r);
    assert!(run(&b, &[(NEEDS, Some("alpha.web.config.base_url"))], "2026-12-01T10:04:00Z").transitions.is_empty());
}

#[test]
fn a_providers_assignment_moves_every_module_waiting_for_it() {
    let b = recorded("2026-12-01T10:00:00Z");
    b.bucket("redis_bound").set_missing(false);
    // Two more consumers of redis on other nodes, recorded as blocked.
    for n in ["alpha", "gamma"] {
        b.put(NEEDS, &format!("{n}.cache.bound.redis=2Ecache"), b"{}");
    }
    write(&b, &run(&b, &[(NEEDS, None)], "2026-12-01T10:00:30Z"));
    b.put(ASSIGNMENTS, "gamma.redis", br#"{"want":"r1"}"#);
    let r = run(&b, &[(ASSIGNMENTS, Some("gamma.redis"))], "2026-12-01T10:01:00Z");
    let moved: Vec<(&str, Option<String>)> =
        r.transitions.iter().filter(|t| t.event.is_some()).map(|t| (t.key.as_str(), event(t)["state"].as_str().map(str::to_string))).collect();
    assert_eq!(
        moved,
        [
            ("alpha.cache", Some("pending".into())),
            ("beta.cache", Some("pending".into())),
            ("gamma.cache", Some("pending".into())),
            ("gamma.redis", Some("never_ran".into()))
        ],
        "each consumer once, and the provider itself"
    );
    for t in r.transitions.iter().filter(|t| t.key.ends_with(".cache")) {
        assert!(event(t)["reason"].as_str().unwrap().contains("waiting for redis on gamma"), "{}", event(t));
        assert_eq!(event(t)["was"], "blocked");
    }
}

#[test]
fn a_large_mesh_is_swept_a_bounded_page_per_call() {
    let b = MemoryBackend::new();
    let n = MAX_PER_CALL * 2 + 7;
    for i in 0..n {
        b.put(NEEDS, &format!("n{i:04}.app.config.x"), b"{}");
    }
    let (mut changes, mut calls, mut recorded) = (vec![(NEEDS.to_string(), None::<String>)], 0, 0);
    while !changes.is_empty() {
        let r = transitions::transitions(&Native(b.clone()), &changes, "2026-12-01T10:00:00Z").unwrap();
        assert!(r.transitions.len() <= MAX_PER_CALL);
        recorded += r.transitions.len();
        write(&b, &r);
        changes = r.rest;
        calls += 1;
        assert!(calls < 10, "the sweep ends");
    }
    assert_eq!((recorded, calls), (n, 3));
    // Many keyed changes at once: a bounded number now, the rest handed back.
    for i in 0..n {
        b.put(APPLIED, &format!("n{i:04}.app"), br#"{"build":"b","needs":1}"#);
    }
    let keyed: Vec<(String, Option<String>)> = (0..n).map(|i| (APPLIED.to_string(), Some(format!("n{i:04}.app")))).collect();
    let r = transitions::transitions(&Native(b.clone()), &keyed, "2026-12-01T10:01:00Z").unwrap();
    assert_eq!((r.transitions.len(), r.rest.len()), (MAX_PER_CALL, n - MAX_PER_CALL));
    assert!(r.transitions.iter().all(|t| t.event.is_some()), "live changes are told");
}

#[test]
fn follows_every_bucket_a_status_reads() {
    let inputs = transitions::inputs();
    for b in [NEEDS, APPLIED, ASSIGNMENTS, "mesh-indexer_builds", "composed-*", "*_bound", "mesh-config_values", "mesh-provisioner_collect"] {
        assert!(inputs.iter().any(|i| i == b), "{b} in {inputs:?}");
    }
    assert!(!inputs.iter().any(|i| i == STATES), "its own records move nothing");
}

#[test]
fn a_module_known_by_one_source_alone_is_never_gone() {
    let b = recorded("2026-12-01T10:00:00Z");
    // alpha.web's one need goes; each time one other source alone still knows the module.
    b.delete(NEEDS, "alpha.web.config.base_url");
    let sources: [(&str, &str, &[u8]); 3] =
        [(NEEDS, "alpha.web.config", b"{}"), (ASSIGNMENTS, "alpha.web", br#"{"want":"b1"}"#), (APPLIED, "alpha.web", br#"{"build":"b1","needs":0}"#)];
    for (bucket, key, value) in sources {
        b.put(bucket, key, value);
        let r = run(&b, &[(bucket, Some(key))], "2026-12-01T10:03:00Z");
        assert!(by_key(&r, "alpha.web").is_none_or(|t| t.state != "gone"), "known by {bucket} {key} alone: {:?}", by_key(&r, "alpha.web"));
        write(&b, &r);
        b.delete(bucket, key);
    }
    let r = run(&b, &[(NEEDS, Some("alpha.web.config"))], "2026-12-01T10:04:00Z");
    assert_eq!(by_key(&r, "alpha.web").map(|t| t.state), Some("gone"), "no source knows it any more");
}

#[test]
fn the_sweep_finds_each_module_in_the_state_its_status_says() {
    // The sweep reads only what decides a state (a need's part only against the parts an
    // applied record lists): each state it records is the one a status answer shows.
    let b = mesh();
    let r = run(&b, &[(APPLIED, None)], "2026-12-01T10:00:00Z");
    assert_eq!(r.transitions.len(), 7, "{:?}", r.transitions);
    for t in &r.transitions {
        let (node, module) = t.key.split_once('.').expect("<node>.<module>");
        let status = guest::status::module(&Native(b.clone()), node, module).expect("status");
        assert_eq!(t.state, status.state.name(), "{}: {}", t.key, status.reason);
    }
    let app = r.transitions.iter().find(|t| t.key == "alpha.app").expect("alpha.app");
    assert_eq!(app.state, "applied", "a need of a part not installed counts for nothing");
}

/// The model-based check of issue 47: random changes of a small mesh — needs, applied
/// records, a provider's assignment and applied record, its bucket made and deleted, its
/// values, config values, a verb's service answering or not, a build wanted and its
/// composition published, refused or deleted — each handed to `transitions` as
/// the host hands it (a keyed change for a key written, a whole-bucket change for a bucket made
/// or deleted, the periodic live sweep for what is no bucket: discovery), with every rest asked
/// again and every record written. After each step the events told equal the moves of the
/// status answer: each module whose state changed is told once, from the state it had to the
/// one it has, with `since` the step's time; no other module is told anything.
mod model {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const CONFIG: &str = "mesh-config_values";
    const BOUND: &str = "postgres_bound";
    const NODES: [&str; 2] = ["alpha", "beta"];
    const MODULES: [&str; 2] = ["app", "web"];

    #[derive(Debug, Clone)]
    enum Step {
        Need {
            node: usize,
            module: usize,
            which: usize,
            put: bool,
        },
        Applied {
            node: usize,
            module: usize,
            put: bool,
        },
        Assigned(bool),
        ProviderApplied(bool),
        Bucket(bool),
        Value {
            node: usize,
            module: usize,
            put: bool,
        },
        Config {
            node: usize,
            module: usize,
            put: bool,
        },
        VaultAnswers(bool),
        /// The controller wants build b1 of the module, or no build.
        Wants {
            node: usize,
            module: usize,
            put: bool,
        },
        /// The node engine's composition of b1: 0 published needing the provider's value,
        /// 1 published needing a config value, 2 refused, 3 deleted.
        Composed {
            node: usize,
            module: usize,
            which: usize,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        let pair = (0..NODES.len(), 0..MODULES.len());
        prop_oneof![
            (pair.clone(), 0..3usize, any::<bool>()).prop_map(|((node, module), which, put)| Step::Need { node, module, which, put }),
            (pair.clone(), any::<bool>()).prop_map(|((node, module), put)| Step::Applied { node, module, put }),
            any::<bool>().prop_map(Step::Assigned),
            any::<bool>().prop_map(Step::ProviderApplied),
            any::<bool>().prop_map(Step::Bucket),
            (pair.clone(), any::<bool>()).prop_map(|((node, module), put)| Step::Value { node, module, put }),
            (pair.clone(), any::<bool>()).prop_map(|((node, module), put)| Step::Config { node, module, put }),
            any::<bool>().prop_map(Step::VaultAnswers),
            (pair.clone(), any::<bool>()).prop_map(|((node, module), put)| Step::Wants { node, module, put }),
            (pair.clone(), 0..4usize).prop_map(|((node, module), which)| Step::Composed { node, module, which }),
        ]
    }

    /// Applies `step` to the mesh; the changes the host would hand over for it.
    fn apply(b: &Arc<MemoryBackend>, step: &Step) -> Vec<(String, Option<String>)> {
        let keyed = |bucket: &str, key: String| vec![(bucket.to_string(), Some(key))];
        let put_or_delete = |bucket: &str, key: &str, value: &[u8], put: bool| {
            if put {
                b.put(bucket, key, value);
            } else if b.bucket(bucket).get(key).ok().flatten().is_some() {
                b.delete(bucket, key);
            }
        };
        match *step {
            Step::Need { node, module, which, put } => {
                let name = ["bound.postgres=2Edb", "secret.db_password", "config.x"][which];
                let key = format!("{}.{}.{name}", NODES[node], MODULES[module]);
                put_or_delete(NEEDS, &key, b"{}", put);
                keyed(NEEDS, key)
            }
            Step::Applied { node, module, put } => {
                let key = format!("{}.{}", NODES[node], MODULES[module]);
                put_or_delete(APPLIED, &key, br#"{"build":"b1","needs":1}"#, put);
                keyed(APPLIED, key)
            }
            Step::Assigned(put) => {
                put_or_delete(ASSIGNMENTS, "gamma.postgres", br#"{"want":"p1"}"#, put);
                keyed(ASSIGNMENTS, "gamma.postgres".into())
            }
            Step::ProviderApplied(put) => {
                put_or_delete(APPLIED, "gamma.postgres", br#"{"build":"p1","needs":0}"#, put);
                keyed(APPLIED, "gamma.postgres".into())
            }
            Step::Bucket(made) => {
                if made {
                    b.bucket(BOUND);
                } else {
                    b.remove_bucket(BOUND);
                }
                // A bucket made or gone reaches the host as its mirror's whole-bucket change.
                vec![(BOUND.to_string(), None)]
            }
            Step::Value { node, module, put } => {
                let key = format!("{}.{}.db", NODES[node], MODULES[module]);
                if !b.buckets().iter().any(|x| x == BOUND) {
                    // The provider cannot write a bucket that does not exist.
                    return Vec::new();
                }
                put_or_delete(BOUND, &key, br#"{"user":"app"}"#, put);
                keyed(BOUND, key)
            }
            Step::Config { node, module, put } => {
                let key = format!("{}.{}.x", NODES[node], MODULES[module]);
                put_or_delete(CONFIG, &key, b"v", put);
                keyed(CONFIG, key)
            }
            Step::VaultAnswers(up) => {
                b.set_responders("mesh-vault", u32::from(up));
                // Discovery is no bucket: the host's periodic sweep finds what it moved.
                vec![(STATES.to_string(), None)]
            }
            Step::Wants { node, module, put } => {
                let key = format!("{}.{}", NODES[node], MODULES[module]);
                put_or_delete(ASSIGNMENTS, &key, br#"{"want":"b1"}"#, put);
                keyed(ASSIGNMENTS, key)
            }
            Step::Composed { node, module, which } => {
                let bucket = format!("composed-{}", NODES[node]);
                let key = format!("{}.b1", MODULES[module]);
                let value: &[u8] = match which {
                    0 => br#"{"state":"published","plan":{"needs":[{"kind":"bound","name":"postgres.db"}]}}"#,
                    1 => br#"{"state":"published","plan":{"needs":[{"kind":"config","name":"x"}]}}"#,
                    _ => br#"{"state":"refused","reason":"a cycle"}"#,
                };
                put_or_delete(&bucket, &key, value, which < 3);
                keyed(&bucket, key)
            }
        }
    }

    /// Every module's state and since as the status answers now (`None`: no source knows it).
    fn states(b: &Arc<MemoryBackend>) -> BTreeMap<String, Option<(String, Option<String>)>> {
        let mut out = BTreeMap::new();
        for node in NODES.iter().chain(["gamma"].iter()) {
            for module in MODULES.iter().chain(["postgres"].iter()) {
                let env = Native(b.clone());
                let known = guest::modules::known(&env, node, module).expect("known");
                let s = guest::status::module(&env, node, module).expect("status");
                out.insert(format!("{node}.{module}"), known.then(|| (s.state.name().to_string(), s.since.clone())));
            }
        }
        out
    }

    /// Hands `changes` over as the host does, every rest asked again, every record written; the
    /// events told, by module.
    fn told(b: &Arc<MemoryBackend>, changes: Vec<(String, Option<String>)>, now: &str) -> BTreeMap<String, Vec<Value>> {
        let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut work = changes;
        let mut calls = 0;
        while !work.is_empty() {
            calls += 1;
            assert!(calls < 100, "the changes never ran out: {work:?}");
            let r = transitions::transitions(&Native(b.clone()), &work, now).expect("transitions");
            write(b, &r);
            for t in &r.transitions {
                if let Some(e) = &t.event {
                    out.entry(t.key.clone()).or_default().push(serde_json::from_slice(e).expect("an event is JSON"));
                }
            }
            work = r.rest;
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]
        #[test]
        fn the_events_told_are_the_moves_of_the_status(steps in proptest::collection::vec(step(), 1..14)) {
            let b = MemoryBackend::new();
            for bucket in [NEEDS, APPLIED, ASSIGNMENTS, CONFIG, STATES, "composed-alpha", "composed-beta"] {
                b.bucket(bucket);
            }
            // A start: every module recorded silently.
            told(&b, vec![(NEEDS.to_string(), None)], "2026-12-01T10:00:00Z");
            let mut before = states(&b);
            for (i, step) in steps.iter().enumerate() {
                let now = format!("2026-12-01T10:{:02}:00Z", i + 1);
                let changes = apply(&b, step);
                let heard = told(&b, changes, &now);
                let after = states(&b);
                for (module, now_state) in &after {
                    let was = before.get(module).cloned().flatten();
                    let events = heard.get(module).cloned().unwrap_or_default();
                    match (&was, now_state) {
                        (Some((w, _)), Some((s, since))) if w != s => {
                            prop_assert_eq!(events.len(), 1, "step {} {:?}: {} moved {} -> {} and was told {:?}", i, step, module, w, s, events);
                            prop_assert_eq!((events[0]["was"].as_str(), events[0]["state"].as_str()), (Some(w.as_str()), Some(s.as_str())), "step {} {:?}: {}", i, step, module);
                            prop_assert_eq!(events[0]["since"].as_str(), Some(now.as_str()));
                            prop_assert_eq!(since.as_deref(), Some(now.as_str()), "step {} {:?}: {}'s since", i, step, module);
                        }
                        (Some((w, _)), None) => {
                            prop_assert_eq!(events.len(), 1, "step {} {:?}: {} gone from {} and was told {:?}", i, step, module, w, events);
                            prop_assert_eq!(events[0]["state"].as_str(), Some("gone"));
                        }
                        _ => prop_assert!(events.is_empty() || (was.is_none() && events.len() == 1), "step {} {:?}: {} did not move ({:?}) and was told {:?}", i, step, module, was, events),
                    }
                }
                before = after;
            }
        }
    }
}
