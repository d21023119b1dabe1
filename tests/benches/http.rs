//! What the HTTP side costs: the narrowed needs query (p50, and throughput with 32 requesters)
//! on a host without `--http`, then on one with `--http` scraped every second (as a harsh
//! Prometheus would), each against a bare NATS echo measured in the same run; and how long the
//! status page takes for a mesh of 1 000 modules (`/api/status` read cold and shared, and the
//! page in headless Chromium until its grid is drawn). A benchmark, not a test.
//!
//! `cargo build --release -p mesh-provisioner && cargo bench -p tests --bench http`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::Client;
use futures::StreamExt;
use tests::bench::throughput;
use tests::browser::{get, Browser};
use tests::nats::{Bus, Host};

const ECHO: &str = "$SRV.ECHO.mesh-provisioner.http-bench";
const QUERY: &[u8] = br#"{"what":"needs","node":"alpha","module":"m0500"}"#;

async fn p50(c: &Client, subject: &str, body: &[u8], n: usize) -> Duration {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        std::hint::black_box(c.request(subject.to_string(), body.to_vec().into()).await.expect("reply"));
        v.push(t.elapsed());
    }
    v.sort();
    v[n / 2]
}


/// (p50 ratio to echo, throughput ratio to echo) of the needs query against `host`.
async fn measure(c: &Client) -> (f64, f64) {
    for _ in 0..200 {
        let _ = c.request("mesh-provisioner.provisioning", QUERY.to_vec().into()).await;
    }
    let (echo, verb) = (p50(c, ECHO, QUERY, 2000).await, p50(c, "mesh-provisioner.provisioning", QUERY, 2000).await);
    let (echo_t, verb_t) = (throughput(c, ECHO, QUERY, 32, Duration::from_secs(3)).await, throughput(c, "mesh-provisioner.provisioning", QUERY, 32, Duration::from_secs(3)).await);
    (verb.as_secs_f64() / echo.as_secs_f64(), verb_t / echo_t)
}

#[tokio::main]
async fn main() {
    tests::nats::prefer_release_binary();
    let bus = Bus::start().await;
    // A bare echo through the node's import of the provisioner's $SRV subjects, answered as its
    // serving user (which may answer $SRV.*.mesh-provisioner.>): the verb's own path.
    let vault = bus.client("mesh-provisioner-service").await;
    let mut echo = vault.subscribe(ECHO).await.expect("echo");
    let responder = vault.clone();
    tokio::spawn(async move {
        while let Some(m) = echo.next().await {
            if let Some(r) = m.reply {
                let _ = responder.publish(r, m.payload).await;
            }
        }
    });
    // The first host makes the buckets; then 1 000 modules on alpha, each with two needs and an
    // applied record.
    let off = Host::start(&bus, &["--instance", "off"]).await;
    let js = bus.js("node-alpha").await;
    let mut acks = Vec::new();
    for i in 0..1000 {
        for (bucket, key, value) in [
            ("mesh-provisioner_needs", format!("alpha.m{i:04}.config.url"), r#"{"part":"api"}"#.to_string()),
            ("mesh-provisioner_needs", format!("alpha.m{i:04}.dir.state"), r#"{"part":"api"}"#.to_string()),
            ("mesh-provisioner_applied", format!("alpha.m{i:04}"), r#"{"build":"b1","needs":2,"at":"2026-12-01T00:00:00Z"}"#.to_string()),
        ] {
            acks.push(js.publish(format!("$KV.{bucket}.{key}"), value.into_bytes().into()).await.expect("publish"));
        }
    }
    for a in acks {
        a.await.expect("ack");
    }
    let c = bus.client("node-alpha").await;
    let (p_off, t_off) = measure(&c).await;
    drop(off.stop().await);

    let on = Host::start(&bus, &["--instance", "on", "--http", "127.0.0.1:0"]).await;
    let url = on.http_url().await;
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let (url, stop) = (url.clone(), stop.clone());
        tokio::spawn(async move {
            let mut scrapes = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let (code, _, _) = get(&format!("{url}/metrics")).await;
                assert_eq!(code, 200);
                scrapes += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            scrapes
        })
    };
    let (p_on, t_on) = measure(&c).await;
    stop.store(true, Ordering::Relaxed);
    let scrapes = scraper.await.expect("scraper");

    println!("needs query, host without --http: p50 {p_off:.2}x echo, throughput {t_off:.2}x echo (32 requesters)");
    println!("needs query, host with --http, /metrics scraped every 1 s ({scrapes} scrapes): p50 {p_on:.2}x echo, throughput {t_on:.2}x echo");
    println!("metrics on vs off: p50 {:.3}x, throughput {:.3}x", p_on / p_off, t_on / t_off);

    // The page for 1 000 modules (after the last scrape's status read has aged out).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let t = Instant::now();
    let (code, _, body) = get(&format!("{url}/api/status")).await;
    let cold = t.elapsed();
    let modules = serde_json::from_str::<serde_json::Value>(&body).ok().and_then(|v| v["entries"].as_array().map(Vec::len)).unwrap_or(0);
    assert_eq!((code, modules), (200, 1000), "{body:.300}");
    let t = Instant::now();
    let _ = get(&format!("{url}/api/status")).await;
    let shared = t.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t = Instant::now();
    let mut b = Browser::open(&format!("{url}/"), 1600, 1000).await;
    b.until("!!document.body && document.body.dataset.loaded === 'yes' && document.querySelectorAll('td.cell').length === 1000", Duration::from_secs(60)).await;
    let page = t.elapsed();
    let echo = p50(&c, ECHO, QUERY, 200).await;
    println!(
        "status page, 1 000 modules: /api/status {cold:?} cold ({:.0}x echo), {shared:?} shared; Chromium from start to the grid drawn: {page:?}",
        cold.as_secs_f64() / echo.as_secs_f64()
    );
    drop(on);
}
