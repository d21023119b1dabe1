//! What each node's share costs (SPEC §8: one node's use of storage never refuses another's):
//! the buckets every node writes made as one stream each (the layout before shares, and what
//! `serve` makes without `bootstrap`) against the same buckets made of `BENCH_NODES` (1 000)
//! nodes' shares — a stream a node, sourced by each bucket (`bootstrap --node …`). Each layout on
//! a fresh `nats-server` without accounts or permissions (so the figures are the layout's, not a
//! grant's), the same run:
//! - the bus's memory and CPU, idle, once the layout is made;
//! - 100 needs a node written at once (acknowledged, then all in the bucket), and the memory then;
//! - a write to a node's key until a watch of the bucket sees it (p50/p99, 200 writes);
//! - the real host's start (`serve` to the last node's needs answered) and its narrowed needs
//!   query (p50, against an echo on the same server, `--no-reply-cache`).
//!
//! `cargo build --release -p mesh-provisioner && cargo bench -p tests --bench shares`
//! A benchmark, not a test.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use mesh_provisioner::nats::bucket::{BucketLimits as Limits, Share, Spec, SHARED_BUCKETS};
use mesh_provisioner::nats::mesh::{apply, Plan};
use tests::bench::{latencies, pct, us};
use tests::nats::{Host, RawServer};

const CONFIG: &str = r#"listen: "127.0.0.1:{{PORT}}"
jetstream { store_dir: "{{DIR}}/js", max_file_store: 64GB }
accounts { MESH { jetstream: enabled, users: [ { user: "all", password: "all-pw" } ] } }
"#;
const NEEDS: &str = "mesh-provisioner_needs";
const PER_NODE: usize = 100;
const ECHO: &str = "bench.echo";

/// A process's resident memory, in MiB.
fn rss_mib(pid: u32) -> f64 {
    tests::rss_kib(pid) as f64 / 1024.0
}

struct Figures {
    made: Duration,
    idle_rss: f64,
    idle_cpu: f64,
    acked: Duration,
    stored: Duration,
    rss: f64,
    seen_p50: Duration,
    seen_p99: Duration,
    start: Duration,
    verb_p50: Duration,
    echo_p50: Duration,
}

async fn measure(nodes: &[String], shares: bool) -> Figures {
    let server = RawServer::start(CONFIG).await;
    let pid = server.pid().expect("nats-server running");
    let url = format!("nats://127.0.0.1:{}", server.port);
    let client = async_nats::ConnectOptions::with_user_and_password("all".into(), "all-pw".into()).connect(&url).await.expect("connect");
    let mut js = jetstream::new(client.clone());
    js.set_timeout(Duration::from_secs(30));

    let limits = Limits { max_bytes: 1 << 30, ..Limits::default() };
    let buckets = SHARED_BUCKETS.iter().map(|b| Spec::new(b, "bench", 1, 1, limits)).collect();
    let plan = Plan { buckets, nodes: if shares { nodes.to_vec() } else { Vec::new() }, share: Share { max_bytes: 1 << 20, max_keys: 1024 } };
    let t = Instant::now();
    apply(&js, &plan).await.result().expect("the layout is made");
    let made = t.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_rss = rss_mib(pid);
    let cpu0 = tests::bench::cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_cpu = (tests::bench::cpu_seconds(pid) - cpu0) / 10.0;

    // Every node writes its needs at once.
    let t = Instant::now();
    let writes = nodes.iter().flat_map(|n| (0..PER_NODE).map(move |k| format!("$KV.{NEEDS}.{n}.m{}.config.k{k}", k % 10)));
    let acks: Vec<_> = futures::stream::iter(writes)
        .map(|subject| {
            let js = js.clone();
            async move { js.publish(subject, r#"{"placeholder":"${config:name}","part":"api"}"#.into()).await.expect("sent").await.expect("stored") }
        })
        .buffer_unordered(2048)
        .collect()
        .await;
    let acked = t.elapsed();
    let want = (nodes.len() * PER_NODE) as u64;
    loop {
        let info = js.get_stream(format!("KV_{NEEDS}")).await.expect("the bucket").cached_info().clone();
        if info.state.messages >= want {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(600), "the bucket never held every write: {:?}", info.state);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stored = t.elapsed();
    drop(acks);
    let rss = rss_mib(pid);

    // A write until a watch of the bucket sees it.
    let kv = js.get_key_value(NEEDS).await.expect("the bucket");
    let mut watch = kv.watch(format!("{}.lat.>", nodes[0])).await.expect("watch");
    let mut seen = Vec::new();
    for i in 0..200 {
        let t = Instant::now();
        js.publish(format!("$KV.{NEEDS}.{}.lat.config.x", nodes[0]), i.to_string().into()).await.expect("sent").await.expect("stored");
        loop {
            let entry = tokio::time::timeout(Duration::from_secs(10), watch.next()).await.expect("seen within 10 s").expect("an entry").expect("readable");
            if entry.value.as_ref() == i.to_string().as_bytes() {
                break;
            }
        }
        seen.push(t.elapsed());
    }

    // The real host: its start, and the narrowed query against an echo on the same server.
    tests::bench::echo(&client, ECHO).await;
    let t = Instant::now();
    let args = ["--nats-url", url.as_str(), "--user", "all", "--password", "all-pw", "--no-reply-cache", "--no-snapshots"];
    let host = Host::spawn_as(tempfile::tempdir().expect("dir"), &tests::component_path(), &args);
    let last = nodes.last().expect("a node");
    let query = serde_json::json!({"what":"needs","node":last});
    loop {
        if let Ok(keys) = tests::nats::answered_keys(&client, query.clone(), Duration::from_secs(5)).await {
            if keys.len() == PER_NODE {
                break;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(300), "the host never answered {last}'s needs:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start = t.elapsed();
    let body = serde_json::json!({"what":"needs","node":nodes[nodes.len() / 2],"module":"m3"}).to_string();
    let mut verb = latencies(&client, "mesh-provisioner.provisioning", body.as_bytes(), 500).await;
    let mut echoed = latencies(&client, ECHO, body.as_bytes(), 500).await;
    host.stop().await;
    server.stop().await;
    Figures {
        made,
        idle_rss,
        idle_cpu,
        acked,
        stored,
        rss,
        seen_p50: pct(&mut seen, 0.5),
        seen_p99: pct(&mut seen, 0.99),
        start,
        verb_p50: pct(&mut verb, 0.5),
        echo_p50: pct(&mut echoed, 0.5),
    }
}

fn print(label: &str, f: &Figures) {
    println!(
        "{label}: made in {:.2} s; idle {:.0} MiB, {:.3} CPU s/s; writes acknowledged in {:.2} s, all in the bucket in {:.2} s, then {:.0} MiB; a write seen by a watch p50 {:.0} µs p99 {:.0} µs; host start {:.2} s; narrowed query p50 {:.0} µs = {:.2}× echo ({:.0} µs)",
        f.made.as_secs_f64(),
        f.idle_rss,
        f.idle_cpu,
        f.acked.as_secs_f64(),
        f.stored.as_secs_f64(),
        f.rss,
        us(f.seen_p50),
        us(f.seen_p99),
        f.start.as_secs_f64(),
        us(f.verb_p50),
        us(f.verb_p50) / us(f.echo_p50),
        us(f.echo_p50),
    );
}

#[tokio::main]
async fn main() {
    tests::nats::prefer_release_binary();
    let n: usize = std::env::var("BENCH_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let nodes: Vec<String> = (0..n).map(|i| format!("n{i:05}")).collect();
    println!("{n} nodes × {PER_NODE} needs, the three shared buckets (each figure of the shares against one stream a bucket, same run)");
    let one = measure(&nodes, false).await;
    print("one stream a bucket", &one);
    let shares = measure(&nodes, true).await;
    print("a share a node", &shares);
    let r = |a: f64, b: f64| a / b;
    println!(
        "shares / one stream: idle memory {:.2}×, idle CPU {:.2}×, writes acknowledged {:.2}×, all in the bucket {:.2}×, memory after {:.2}×, write seen p50 {:.2}× p99 {:.2}×, host start {:.2}×, narrowed query (to its echo) {:.2}×",
        r(shares.idle_rss, one.idle_rss),
        r(shares.idle_cpu.max(1e-3), one.idle_cpu.max(1e-3)),
        r(shares.acked.as_secs_f64(), one.acked.as_secs_f64()),
        r(shares.stored.as_secs_f64(), one.stored.as_secs_f64()),
        r(shares.rss, one.rss),
        r(us(shares.seen_p50), us(one.seen_p50)),
        r(us(shares.seen_p99), us(one.seen_p99)),
        r(shares.start.as_secs_f64(), one.start.as_secs_f64()),
        r(us(shares.verb_p50) / us(shares.echo_p50), us(one.verb_p50) / us(one.echo_p50)),
    );
}
