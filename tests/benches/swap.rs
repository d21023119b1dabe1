//! Hot replace: time from the file change to the new version answering, cold (compiling) and
//! with a warm cache, and the verb's p99 during swaps against steady state; then the same p99
//! while the host computes and keeps (writes and fsyncs) 1 000 plans. Nothing of either may
//! block the one runtime thread for long. A benchmark.
//!
//! `cargo build --release -p mesh-provisioner && cargo bench -p tests --bench swap`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::nats::{Bus, Host};
use tests::{fixture, install};

/// A narrowed needs query (its answer: 10 entries).
const QUERY: &str = r#"{"what":"needs","node":"alpha","module":"m0420"}"#;
const PLANS: usize = 1000;

async fn version(c: &async_nats::Client) -> String {
    Host::info(c).await["component_version"].as_str().unwrap_or_default().to_string()
}

async fn swap_to(c: &async_nats::Client, from: &std::path::Path, to: &std::path::Path, want: &str) -> Duration {
    let t = Instant::now();
    install(from, to);
    while version(c).await != want {
        assert!(t.elapsed() < Duration::from_secs(30), "no swap to {want}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    t.elapsed()
}

/// p50 and p99 of the verb from 8 requesters over `for_`, while `during` runs.
async fn load<F: std::future::Future<Output = ()>>(c: &async_nats::Client, for_: Duration, during: F) -> (Duration, Duration, usize) {
    let times = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (c, times) = (c.clone(), times.clone());
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < for_ {
                let t = Instant::now();
                let ok = c.request("mesh-provisioner.provisioning", QUERY.into()).await.is_ok();
                if ok {
                    times.lock().unwrap().push(t.elapsed());
                }
            }
        }));
    }
    during.await;
    for t in tasks {
        let _ = t.await;
    }
    let mut v = times.lock().unwrap().clone();
    v.sort();
    (v[v.len() / 2], v[v.len() * 99 / 100], v.len())
}

#[tokio::main]
async fn main() {
    tests::nats::prefer_release_binary();
    let bus = Bus::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guest.wasm");
    let (v1, v2) = (tests::component_path(), fixture("v2"));
    install(&v1, &path);
    let host = Host::start_with(&bus, tempfile::tempdir().unwrap(), &path, &[]).await;
    let c = bus.client("node-alpha").await;
    for k in 0..10 {
        bus.put("node-alpha", "mesh-provisioner_needs", &format!("alpha.m0420.config.name{k}"), br#"{"placeholder":"${config:name}","part":"api"}"#).await;
    }
    let cold = swap_to(&c, &v2, &path, "0.2.0-fixture").await;
    let warm_back = swap_to(&c, &v1, &path, "0.1.0").await;
    let warm = swap_to(&c, &v2, &path, "0.2.0-fixture").await;
    swap_to(&c, &v1, &path, "0.1.0").await;
    println!("file change → new version answering (INFO polled every ~2 ms): cold {cold:?}, warm cache {warm:?} and {warm_back:?}");

    let (s50, s99, sn) = load(&c, Duration::from_secs(4), async {}).await;
    let (c2, p) = (c.clone(), path.clone());
    let (w50, w99, wn) = load(&c, Duration::from_secs(4), async move {
        for i in 0..6 {
            tokio::time::sleep(Duration::from_millis(600)).await;
            let (from, want) = if i % 2 == 0 { (fixture("v2"), "0.2.0-fixture") } else { (tests::component_path(), "0.1.0") };
            swap_to(&c2, &from, &p, want).await;
        }
    })
    .await;
    println!(
        "verb under 8 requesters: steady p50 {:.0} µs p99 {:.0} µs ({sn} requests); with 6 swaps p50 {:.0} µs p99 {:.0} µs ({wn} requests); p99 ratio {:.2}×",
        s50.as_secs_f64() * 1e6,
        s99.as_secs_f64() * 1e6,
        w50.as_secs_f64() * 1e6,
        w99.as_secs_f64() * 1e6,
        w99.as_secs_f64() / s99.as_secs_f64()
    );

    // 1 000 modules published (two builds each) before the clock starts; their assignments are
    // written while the requesters ask, so the host plans and keeps all 1 000 meanwhile.
    let composed = tests::sample_composition();
    bus.create_plan_buckets().await;
    publish(&bus, "node-alpha", (0..PLANS).flat_map(|m| ["b1", "b2"].map(|b| (format!("$KV.composed-alpha.m{m:04}.{b}"), composed.clone().into_bytes()))))
        .await;
    let (q50, q99, qn) = load(&c, Duration::from_secs(4), async {}).await;
    let (bus2, plans_dir) = (&bus, host.state.path().join("plans"));
    let kept_in = Arc::new(Mutex::new(Duration::ZERO));
    let kept = kept_in.clone();
    let (k50, k99, kn) = load(&c, Duration::from_secs(6), async move {
        let t = Instant::now();
        publish(bus2, "mesh-controller", (0..PLANS).map(|m| (format!("$KV.mesh-controller_assignments.alpha.m{m:04}"), br#"{"want":"b1"}"#.to_vec()))).await;
        // Kept: every module's plan written (and synced) as a file.
        while plan_files(&plans_dir) < PLANS && t.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        *kept.lock().unwrap() = t.elapsed();
    })
    .await;
    let state = host.stop().await;
    let files = plan_files(&state.path().join("plans"));
    println!(
        "verb under 8 requesters: steady p50 {:.0} µs p99 {:.0} µs ({qn} requests); while {PLANS} plans were computed and kept ({files} plans kept, the last {:.2} s after the first assignment was written) p50 {:.0} µs p99 {:.0} µs ({kn} requests); p99 ratio {:.2}×",
        q50.as_secs_f64() * 1e6, q99.as_secs_f64() * 1e6, kept_in.lock().unwrap().as_secs_f64(), k50.as_secs_f64() * 1e6, k99.as_secs_f64() * 1e6,
        k99.as_secs_f64() / q99.as_secs_f64()
    );
}

/// Writes `(subject, value)`s as `user` through JetStream, pipelined, each acknowledged.
async fn publish(bus: &Bus, user: &str, writes: impl Iterator<Item = (String, Vec<u8>)>) {
    use futures::StreamExt;
    let js = bus.js(user).await;
    let mut acks = futures::stream::iter(writes.map(|(subject, value)| {
        let js = js.clone();
        async move { js.publish(subject, value.into()).await.expect("publish").await.expect("ack") }
    }))
    .buffer_unordered(256);
    while acks.next().await.is_some() {}
}

/// Kept plans under `dir` (one `<node>/<module>.plan` file each).
fn plan_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| if e.path().is_dir() { plan_files(&e.path()) } else { e.path().extension().is_some_and(|x| x == "plan") as usize })
        .sum()
}
