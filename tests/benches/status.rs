//! What a node's `status` costs a module, in the component and natively, against its floor:
//! the needs verb reading the same keys (the same modules' needs, the same page size). The
//! mesh is the bus bench's (node alpha, modules of nine config needs and a secret, nothing
//! applied or assigned) and, beside it, one where every module is assigned, applied and planned
//! from a published composition. A benchmark, not a test: it prints figures.
//!
//! `cargo bench -p tests --bench status` (after `cargo build -p guest --target wasm32-wasip2 --release`);
//! with `BENCH_AGAINST=<another component>`, also the two components' status compared page by
//! page (in turn, so a noisy machine slows both alike): the median of the pages' ratios;
//! `BENCH_SHAPE=needs` or `planned` times that mesh alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_provisioner::runtime::{Change, EngineOptions, Limits, ReplyCode, Runtime};
use mesh_provisioner::store::backend::{Backend, MemoryBackend};
use tests::native::Native;

const MODULES: usize = 2000;
const PAGE: usize = 200;
const ROUNDS: usize = 5;

fn mesh(planned: bool) -> Arc<MemoryBackend> {
    let b = MemoryBackend::new();
    b.set_responders("mesh-vault", 1);
    let composed = tests::sample_composition();
    for m in 0..MODULES {
        let module = format!("m{m:06}");
        for k in 0..10 {
            let key = if k == 9 { format!("alpha.{module}.secret.name{k}") } else { format!("alpha.{module}.config.name{k}") };
            b.put("mesh-provisioner_needs", &key, br#"{"placeholder":"${config:x}","part":"api"}"#);
        }
        if planned {
            b.put("mesh-controller_assignments", &format!("alpha.{module}"), br#"{"want":"b1"}"#);
            b.put("composed-alpha", &format!("{module}.b1"), composed.as_bytes());
            b.put("mesh-provisioner_applied", &format!("alpha.{module}"), br#"{"build":"b1","needs":10}"#);
            b.put("mesh-config_values", &format!("alpha.{module}.name0"), b"x");
        }
    }
    b
}

/// Every page of `query` (a `what` for node alpha, `PAGE` a page), answered by `ask`: the time
/// the answers took in all (not the reading of them here: a tree of a page's JSON costs about
/// what the answer does) and the lines listed.
fn pages(what: &str, limit: usize, mut ask: impl FnMut(&[u8]) -> Vec<u8>) -> (Duration, usize) {
    let mut q = serde_json::json!({"what": what, "node": "alpha", "limit": limit});
    let (mut took, mut lines) = (Duration::ZERO, 0);
    loop {
        let request = q.to_string();
        let start = Instant::now();
        let body = ask(request.as_bytes());
        took += start.elapsed();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        let n = v["entries"].as_array().map_or(0, Vec::len);
        assert!(n > 0, "an empty page: {v}");
        lines += n;
        match v.get("next") {
            Some(next) => q["after"] = next.clone(),
            None => return (took, lines),
        }
    }
}

fn best(mut run: impl FnMut() -> (Duration, usize)) -> (Duration, usize) {
    (0..ROUNDS).map(|_| run()).min_by_key(|(d, _)| *d).expect("rounds")
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");
    // Every request calls the guest: the cost of an answer, not of a kept one.
    let runtime = Runtime::with_options(EngineOptions { reply_cache: false, ..EngineOptions::default() }).expect("runtime");
    let guest = runtime.load(&std::fs::read(tests::component_path()).expect("component"), None).expect("compile");
    let against = std::env::var_os("BENCH_AGAINST").map(|path| runtime.load(&std::fs::read(&path).expect("the component to compare"), None).expect("compile"));
    // `BENCH_SHAPE=needs` or `planned`: that mesh alone (for `perf record`).
    let shape = std::env::var("BENCH_SHAPE").ok();
    for (label, planned) in [("needs only (the bus bench's mesh)", false), ("assigned, applied and planned", true)] {
        if shape.as_deref().is_some_and(|s| s != if planned { "planned" } else { "needs" }) {
            continue;
        }
        let b = mesh(planned);
        let backend: Arc<dyn Backend> = b.clone();
        let native = Native(b.clone());
        // One page from component `g`, which must answer it.
        let ask = |g: &mesh_provisioner::runtime::Guest, q: &[u8]| {
            let r = rt.block_on(g.handle(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", q, 1 << 20)).expect("call");
            assert_eq!(r.code, ReplyCode::Ok, "{}", String::from_utf8_lossy(&r.body));
            r.body.to_vec()
        };
        let wasm = |what: &str, limit: usize| best(|| pages(what, limit, |q| ask(&guest, q)));
        if let Some(other) = &against {
            // Page by page, the two in turn (who goes first alternating): a ratio a page, so a
            // slow second of a noisy machine weighs on both sides of one ratio, not on one side.
            let mut requests = Vec::new();
            pages("status", PAGE, |q| {
                requests.push(q.to_vec());
                ask(&guest, q)
            });
            let time = |g: &mesh_provisioner::runtime::Guest, q: &[u8]| {
                let start = Instant::now();
                std::hint::black_box(ask(g, q));
                start.elapsed().as_secs_f64()
            };
            let mut ratios = Vec::new();
            let (mut this, mut that) = (0.0, 0.0);
            for round in 0..ROUNDS * 4 {
                for q in &requests {
                    let (a, b) = if round % 2 == 0 {
                        let a = time(&guest, q);
                        (a, time(other, q))
                    } else {
                        let b = time(other, q);
                        (time(&guest, q), b)
                    };
                    ratios.push(a / b);
                    (this, that) = (this + a, that + b);
                }
            }
            ratios.sort_by(f64::total_cmp);
            let at = |p: usize| ratios[(ratios.len() - 1) * p / 100];
            let n = (ROUNDS * 4 * MODULES) as f64;
            println!(
                "  {label}: this component's status {:.1} µs a module, the one compared {:.1} µs; page by page, median {:.3}× (quartiles {:.3}–{:.3}, {} pages)",
                this * 1e6 / n,
                that * 1e6 / n,
                at(50),
                at(25),
                at(75),
                ratios.len()
            );
        }
        let natively =
            |what: &str, limit: usize| best(|| pages(what, limit, |q| guest::verb::handle(&native, "mesh-provisioner.provisioning", q, 1 << 20).body));
        // The floor: the same modules' needs, read through the verb in pages of as many keys.
        let (floor, keys) = wasm("needs", PAGE * 10);
        let before = b.reads();
        let (status, modules) = wasm("status", PAGE);
        // Every store import (get, scan, exists, health) a module's status made, over the rounds.
        let imports = (b.reads() - before) as f64 / (modules * ROUNDS) as f64;
        let (floor_native, _) = natively("needs", PAGE * 10);
        let (status_native, _) = natively("status", PAGE);
        let per = |d: Duration, n: usize| d.as_secs_f64() * 1e6 / n as f64;
        println!("{MODULES} modules of node alpha × 10 needs, {label}; pages of {PAGE} modules (status) or {} keys (needs):", PAGE * 10);
        println!(
            "  component: status {:.1} µs a module ({imports:.1} store imports); its floor, the needs of a module ({} keys), {:.1} µs: {:.2}×",
            per(status, modules),
            keys / modules,
            per(floor, modules),
            status.as_secs_f64() / floor.as_secs_f64()
        );
        // The state sweep: `transitions` of its most modules a call, each moved by a write to one
        // of its needs (the states bucket empty: every module is found a state to record).
        let changes: Vec<Vec<Change>> = (0..MODULES)
            .collect::<Vec<_>>()
            .chunks(guest::transitions::MAX_PER_CALL)
            .map(|c| c.iter().map(|m| Change { bucket: "mesh-provisioner_needs".into(), key: Some(format!("alpha.m{m:06}.config.name0")) }).collect())
            .collect();
        let before = b.reads();
        let (sweep, swept) = best(|| {
            let start = Instant::now();
            let mut swept = 0;
            for call in &changes {
                let r = rt.block_on(guest.transitions(backend.clone(), Limits::default(), call, "2026-12-01T10:00:00Z")).expect("call").expect("transitions");
                swept += r.computed as usize;
            }
            (start.elapsed(), swept)
        });
        let sweep_imports = (b.reads() - before) as f64 / (swept * ROUNDS) as f64;
        println!(
            "  the state sweep (component): {:.1} µs a module ({sweep_imports:.1} store imports), {:.2}× its status",
            per(sweep, swept),
            sweep.as_secs_f64() / swept as f64 / (status.as_secs_f64() / modules as f64)
        );
        println!(
            "  native:    status {:.1} µs a module; the needs of a module {:.1} µs: {:.2}×; the component's status is {:.2}× the native",
            per(status_native, modules),
            per(floor_native, modules),
            status_native.as_secs_f64() / floor_native.as_secs_f64(),
            status.as_secs_f64() / status_native.as_secs_f64()
        );
    }
}
