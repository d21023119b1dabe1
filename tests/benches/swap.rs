//! Hot replace: time from the file change to the new version answering, cold (compiling) and
//! with a warm cache, and the verb's p99 during swaps against steady state. A benchmark.
//!
//! `cargo build --release -p mesh-provisioner && cargo bench -p tests --bench swap`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::nats::{Bus, Host};
use tests::{fixture, install};

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
                let ok = c.request("mesh-provisioner.provisioning", "{}".into()).await.is_ok();
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
        s50.as_secs_f64() * 1e6, s99.as_secs_f64() * 1e6, w50.as_secs_f64() * 1e6, w99.as_secs_f64() * 1e6,
        w99.as_secs_f64() / s99.as_secs_f64()
    );
    host.stop().await;
}
