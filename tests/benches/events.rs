//! The verb's latency while the seat's holder records and publishes a thousand module state
//! changes at once (SPEC §7.3), against a bare NATS echo round trip measured in the same run
//! (the floor: the example config's node user asking, the vault's user echoing) and against the
//! verb itself while nothing changes. A benchmark, not a test: it prints figures.
//!
//! `cargo bench -p tests --bench events` (after `cargo build -p guest --target wasm32-wasip2
//! --release` and `cargo build --release -p mesh-provisioner`); `BENCH_MODULES` sets how many
//! modules move (default 1000).

use std::time::{Duration, Instant};

use async_nats::Client;
use futures::StreamExt;
use tests::bench::{pct, us};
use tests::nats::{Bus, Host};

const ECHO: &str = "$SRV.ECHO.mesh-provisioner.bench";
const QUERY: &[u8] = br#"{"what":"needs","node":"beta","module":"m0042"}"#;

/// Request round trips on `subject` until `until` says stop (at least `min` of them).
async fn asked(c: &Client, subject: &str, body: &[u8], min: usize, until: impl Fn() -> bool) -> Vec<Duration> {
    let mut out = Vec::new();
    while out.len() < min || !until() {
        let t = Instant::now();
        let m = c.request(subject.to_string(), body.to_vec().into()).await.expect("reply");
        out.push(t.elapsed());
        std::hint::black_box(m);
        if out.len() > 200_000 {
            break;
        }
    }
    out
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio");
    rt.block_on(run());
}

async fn run() {
    let n: usize = std::env::var("BENCH_MODULES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    tests::nats::prefer_release_binary();
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    bus.make_bucket("postgres_bound").await;
    let host = Host::start(&bus, &[]).await;
    let c = bus.client("node-beta").await;
    tests::bench::echo(&bus.client("mesh-provisioner-service").await, ECHO).await;
    let controller = bus.client("mesh-controller").await;
    let mut events = controller.subscribe("mesh-provisioner.event.>").await.expect("subscribe");
    controller.flush().await.expect("flush");

    // n modules on beta waiting for postgres, which nothing provides: blocked, and recorded.
    let kv = bus.js("node-beta").await.get_key_value("mesh-provisioner_needs").await.expect("needs");
    for i in 0..n {
        kv.put(format!("beta.m{i:04}.bound.postgres=2Ecache"), "{}".into()).await.expect("put");
    }
    let mut seen = 0;
    while seen < n {
        match tokio::time::timeout(Duration::from_secs(60), events.next()).await {
            Ok(Some(_)) => seen += 1,
            _ => panic!("only {seen} of {n} modules were recorded"),
        }
    }

    let mut floor = asked(&c, ECHO, QUERY, 2000, || true).await;
    let mut steady = asked(&c, "mesh-provisioner.provisioning", QUERY, 2000, || true).await;
    // One assignment moves all n: the verb is asked until every event has been heard.
    let moved = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = moved.clone();
    let listen = tokio::spawn(async move {
        while counter.load(std::sync::atomic::Ordering::Relaxed) < n {
            match tokio::time::timeout(Duration::from_secs(60), events.next()).await {
                Ok(Some(m)) if m.payload.windows(9).any(|w| w == b"\"pending\"") => {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(Some(_)) => {}
                _ => break,
            }
        }
    });
    let started = Instant::now();
    bus.put("mesh-controller", "mesh-controller_assignments", "gamma.postgres", br#"{"want":"p1"}"#).await;
    let mut during = asked(&c, "mesh-provisioner.provisioning", QUERY, 200, || moved.load(std::sync::atomic::Ordering::Relaxed) >= n).await;
    let all_told = started.elapsed();
    let _ = listen.await;

    let (f50, f99) = (pct(&mut floor, 0.5), pct(&mut floor, 0.99));
    let (s50, s99) = (pct(&mut steady, 0.5), pct(&mut steady, 0.99));
    let (d50, d99) = (pct(&mut during, 0.5), pct(&mut during, 0.99));
    println!("floor: echo as node-beta → the provisioner's account (the verbs' import) p50 {:.0} µs p99 {:.0} µs", us(f50), us(f99));
    println!(
        "needs of one module, nothing changing: p50 {:.0} µs = {:.2}× echo; p99 {:.0} µs = {:.2}× echo",
        us(s50),
        s50.as_secs_f64() / f50.as_secs_f64(),
        us(s99),
        s99.as_secs_f64() / f99.as_secs_f64()
    );
    println!(
        "needs of one module while {n} modules change state ({} requests, all {n} events heard in {:.2} s): p50 {:.0} µs = {:.2}× echo ({:.2}× steady); p99 {:.0} µs = {:.2}× echo ({:.2}× steady)",
        during.len(),
        all_told.as_secs_f64(),
        us(d50),
        d50.as_secs_f64() / f50.as_secs_f64(),
        d50.as_secs_f64() / s50.as_secs_f64(),
        us(d99),
        d99.as_secs_f64() / f99.as_secs_f64(),
        d99.as_secs_f64() / s99.as_secs_f64()
    );
    host.stop().await;
}
