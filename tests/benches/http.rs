//! What the HTTP side costs: the narrowed needs query (p50, and throughput with 32 requesters)
//! on a host without `--http`, then on one with `--http` scraped every second (as a harsh
//! Prometheus would), each against a bare NATS echo measured in the same run; and how long the
//! status page takes for a mesh of 1 000 modules (`/api/status` read cold and shared, and the
//! page in headless Chromium until its grid is drawn); then, on a mesh of `BENCH_STATUS_MODULES`
//! modules (default 100 000, over the three example nodes), `/api/status` read cold and shared,
//! and the verb's p50 and p99 while a page reads it every 100 ms against the same verb quiet,
//! each against the echo's in the same run. A benchmark, not a test.
//!
//! `cargo build --release -p mesh-provisioner && cargo bench -p tests --bench http`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::Client;
use tests::bench::throughput;
use tests::browser::{get, Browser};
use tests::nats::{Bus, Host};

const ECHO: &str = "$SRV.ECHO.mesh-provisioner.http-bench";
const QUERY: &[u8] = br#"{"what":"needs","node":"alpha","module":"m0500"}"#;

async fn p50(c: &Client, subject: &str, body: &[u8], n: usize) -> Duration {
    quantiles(c, subject, body, n).await.0
}

/// The p50 and p99 of `n` requests in a row.
async fn quantiles(c: &Client, subject: &str, body: &[u8], n: usize) -> (Duration, Duration) {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        std::hint::black_box(c.request(subject.to_string(), body.to_vec().into()).await.expect("reply"));
        v.push(t.elapsed());
    }
    v.sort();
    (v[n / 2], v[n * 99 / 100])
}

/// A bare echo through the node's import of the provisioner's $SRV subjects, answered as its
/// serving user (which may answer $SRV.*.mesh-provisioner.>): the verb's own path.
async fn serve_echo(bus: &Bus) {
    tests::bench::echo(&bus.client("mesh-provisioner-service").await, ECHO).await;
}

/// (p50 ratio to echo, throughput ratio to echo) of the needs query against `host`.
async fn measure(c: &Client) -> (f64, f64) {
    for _ in 0..200 {
        let _ = c.request("mesh-provisioner.provisioning", QUERY.to_vec().into()).await;
    }
    let (echo, verb) = (p50(c, ECHO, QUERY, 2000).await, p50(c, "mesh-provisioner.provisioning", QUERY, 2000).await);
    let (echo_t, verb_t) =
        (throughput(c, ECHO, QUERY, 32, Duration::from_secs(3)).await, throughput(c, "mesh-provisioner.provisioning", QUERY, 32, Duration::from_secs(3)).await);
    (verb.as_secs_f64() / echo.as_secs_f64(), verb_t / echo_t)
}

#[tokio::main]
async fn main() {
    tests::nats::prefer_release_binary();
    let bus = Bus::start().await;
    serve_echo(&bus).await;
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
    drop(bus);
    status_at_scale().await;
}

/// `/api/status` over many modules, and what reading it costs the verbs.
async fn status_at_scale() {
    let modules: usize = std::env::var("BENCH_STATUS_MODULES").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let share = mesh_provisioner::nats::bucket::Share { max_bytes: 256 << 20, max_keys: modules as i64 + 1000 };
    let bus = Bus::start_with(mesh_provisioner::nats::bucket::BucketLimits::default(), share).await;
    serve_echo(&bus).await;
    let per_node = modules.to_string();
    let host = Host::start(&bus, &["--http", "127.0.0.1:0", "--status-page-per-node", &per_node]).await;
    let url = host.http_url().await;
    // Half the modules on alpha, the rest on beta and gamma; each an applied record.
    let nodes =
        [("node-alpha", "alpha", modules / 2), ("node-beta", "beta", modules * 3 / 10), ("node-gamma", "gamma", modules - modules / 2 - modules * 3 / 10)];
    let t = Instant::now();
    for (user, node, n) in nodes {
        let js = bus.js(user).await;
        let mut acks = Vec::new();
        for i in 0..n {
            acks.push(js.publish(format!("$KV.mesh-provisioner_applied.{node}.m{i:06}"), r#"{"build":"b1","needs":0}"#.into()).await.expect("publish"));
            if acks.len() >= 4096 {
                for a in acks.drain(..) {
                    a.await.expect("ack");
                }
            }
        }
        for a in acks {
            a.await.expect("ack");
        }
    }
    let c = bus.client("node-alpha").await;
    let (last_node, last) = (nodes[2].1, format!("m{:06}", nodes[2].2 - 1));
    tests::nats::status_until(&c, last_node, &last, "the last module", |s| s["state"].is_string()).await;
    println!("status at scale: {modules} modules written and mirrored in {:?}", t.elapsed());
    let query = br#"{"what":"status","node":"beta","module":"m000100"}"#;
    for _ in 0..200 {
        let _ = c.request("mesh-provisioner.provisioning", query.to_vec().into()).await;
    }
    // Quiet: no page reads the status.
    let (echo_q, verb_q) = (quantiles(&c, ECHO, query, 3000).await, quantiles(&c, "mesh-provisioner.provisioning", query, 3000).await);
    // Cold: until the page's first read of the whole status is served (a reader waits at most
    // 10 s for it; the page asks again).
    let t = Instant::now();
    let (code, body) = loop {
        let (code, _, body) = get(&format!("{url}/api/status")).await;
        if code == 200 || t.elapsed() > Duration::from_secs(300) {
            break (code, body);
        }
    };
    let cold = t.elapsed();
    let read = serde_json::from_str::<serde_json::Value>(&body).ok().and_then(|v| v["entries"].as_array().map(Vec::len)).unwrap_or(0);
    assert_eq!((code, read), (200, modules), "{:.300}", body);
    let t = Instant::now();
    let _ = get(&format!("{url}/api/status")).await;
    let shared = t.elapsed();
    // Read: a read is reused as long as it took; once it is that old, a page's fetch starts a
    // new read of the whole status, and the verb is measured while it runs, a page fetching
    // /api/status every 100 ms meanwhile.
    tokio::time::sleep(cold).await;
    let t = Instant::now();
    let _ = get(&format!("{url}/api/status")).await;
    let stale = t.elapsed();
    let stop = Arc::new(AtomicBool::new(false));
    let fetched = Arc::new(AtomicU64::new(0));
    let reader = {
        let (url, stop, fetched) = (url.clone(), stop.clone(), fetched.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let (code, _, _) = get(&format!("{url}/api/status")).await;
                assert_eq!(code, 200);
                fetched.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let t = Instant::now();
    let (echo_r, verb_r) = (quantiles(&c, ECHO, query, 10_000).await, quantiles(&c, "mesh-provisioner.provisioning", query, 10_000).await);
    let window = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    reader.await.expect("reader");
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!("status at scale, {modules} modules: /api/status {} MiB, cold {cold:?} (the first read of the whole status), shared {shared:?} ({:.0}x echo p50), while a new read runs {stale:?}", body.len() >> 20, ratio(shared, echo_q.0));
    println!("status at scale: the verb measured for {window:?} while the new read ran (it takes about as long as the cold one)");
    println!(
        "status at scale: one module's status (beta/m000100) quiet p50 {:.2}x / p99 {:.2}x echo's (echo p50 {:?}, p99 {:?}); while a page reads /api/status every 100 ms ({} reads): p50 {:.2}x / p99 {:.2}x echo's (echo p50 {:?}, p99 {:?}); p99 read/quiet {:.2}x",
        ratio(verb_q.0, echo_q.0),
        ratio(verb_q.1, echo_q.1),
        echo_q.0,
        echo_q.1,
        fetched.load(Ordering::Relaxed),
        ratio(verb_r.0, echo_r.0),
        ratio(verb_r.1, echo_r.1),
        echo_r.0,
        echo_r.1,
        ratio(verb_r.1, verb_q.1)
    );
    drop(host);
}
