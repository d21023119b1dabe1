//! What plans cost in the component: asking one module's plan, and refreshing every plan of a
//! mesh, against the provisioning verb's narrowed query on the same runtime (the baseline) and
//! the same plan logic called natively. A benchmark, not a test: it prints figures.
//!
//! `cargo bench -p tests --bench plans` (after `cargo build -p guest --target wasm32-wasip2 --release`)

use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_provisioner::runtime::{Change, Limits, ReplyCode, Runtime};
use mesh_provisioner::store::backend::{Backend, MemoryBackend};
use mesh_provisioner::store::kept::KeptPlans;
use tests::bench::us;
use tests::native::Native;

const NODES: [&str; 3] = ["alpha", "beta", "gamma"];
const MODULES: usize = 1000;
const CALLS: usize = 3000;
const NEEDS_QUERY: &[u8] = br#"{"what":"needs","node":"alpha","module":"m0420"}"#;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// 3 nodes × 1000 modules: each wanted at b1 with the indexer's newest at b2, both published
/// with 10 needs of mixed kinds, and 10 needs recorded per module for the baseline query.
fn mesh(kept: KeptPlans) -> Arc<MemoryBackend> {
    let b = MemoryBackend::with_kept(kept);
    let composed = tests::sample_composition();
    for m in 0..MODULES {
        let module = format!("m{m:04}");
        b.put("mesh-indexer_builds", &module, br#"{"newest":"b2"}"#);
        for node in NODES {
            for build in ["b1", "b2"] {
                b.put(&format!("composed-{node}"), &format!("{module}.{build}"), composed.as_bytes());
            }
            b.put("mesh-controller_assignments", &format!("{node}.{module}"), br#"{"want":"b1"}"#);
            for k in 0..10 {
                b.put("mesh-provisioner_needs", &format!("{node}.{module}.config.name{k}"), br#"{"placeholder":"${config:x}","part":"api"}"#);
            }
        }
    }
    b
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");
    let dir = tempfile::tempdir().expect("temp dir");
    let b = mesh(KeptPlans::files(dir.path().join("plans")));
    let backend: Arc<dyn Backend> = b.clone();
    let guest = Runtime::new().expect("runtime").load(&std::fs::read(tests::component_path()).expect("component"), None).expect("compile");
    let plan_req = br#"{"node":"alpha","module":"m0420"}"#;

    let (baseline, plan_wasm, plan_bytes) = rt.block_on(async {
        let mut base = Vec::with_capacity(CALLS);
        let mut plan = Vec::with_capacity(CALLS);
        let mut bytes = 0;
        for _ in 0..CALLS {
            let t = Instant::now();
            let r = guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", NEEDS_QUERY, 1 << 20).await.expect("call");
            base.push(t.elapsed());
            assert_eq!(r.code, ReplyCode::Ok);
            let t = Instant::now();
            let r = guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.plan", plan_req, 1 << 20).await.expect("call");
            plan.push(t.elapsed());
            assert_eq!(r.code, ReplyCode::Ok);
            bytes = r.body.len();
        }
        (median(base), median(plan), bytes)
    });
    let native = Native(b.clone());
    let mut times = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        let r = guest::verb::handle(&native, "mesh-provisioner.plan", plan_req, 1 << 20);
        times.push(t.elapsed());
        assert_eq!(r.code, guest::verb::Code::Ok);
    }
    let plan_native = median(times);

    println!("mesh: {} nodes × {MODULES} modules, two published builds each (want b1, newest b2), 10 needs per plan", NODES.len());
    println!("{:<58} {:>10.1} µs   1.00×", "provisioning verb, needs of one module (baseline)", us(baseline));
    println!(
        "{:<58} {:>10.1} µs {:>6.2}×   ({plan_bytes} bytes)",
        "plan verb, one module (wasm, reused instance)",
        us(plan_wasm),
        us(plan_wasm) / us(baseline)
    );
    println!("{:<58} {:>10.1} µs {:>6.2}×", "plan verb, one module (native logic)", us(plan_native), us(plan_native) / us(baseline));

    let whole = vec![Change { bucket: "mesh-controller_assignments".into(), key: None }];
    let limits = Limits { deadline: Duration::from_secs(60), ..Limits::default() };
    for label in ["first: every plan kept (3000 files written)", "again: nothing changed, nothing written"] {
        let t = Instant::now();
        // Slice by slice, as the host does: each call computes a bounded number of plans.
        let (mut batch, mut computed, mut kept, mut calls) = (whole.clone(), 0, 0, 0);
        while !batch.is_empty() {
            let r = rt.block_on(guest.refresh(backend.clone(), limits, &batch)).expect("guest runs").expect("refreshes");
            (computed, kept, calls, batch) = (computed + r.computed, kept + r.kept.len(), calls + 1, r.rest);
        }
        let took = t.elapsed();
        let per = took / computed.max(1);
        println!(
            "{:<58} {:>10.1} ms   {} plans in {calls} calls, {} kept, {:.1} µs a plan = {:.2}× baseline",
            format!("refresh of the whole mesh, {label}"),
            took.as_secs_f64() * 1e3,
            computed,
            kept,
            us(per),
            us(per) / us(baseline)
        );
    }
    let one = vec![Change { bucket: "composed-alpha".into(), key: Some("m0420.b1".into()) }];
    let mut times = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        rt.block_on(guest.refresh(backend.clone(), limits, &one)).expect("guest runs").expect("refreshes");
        times.push(t.elapsed());
    }
    let single = median(times);
    println!("{:<58} {:>10.1} µs {:>6.2}×", "refresh after one composition changed", us(single), us(single) / us(baseline));
}
