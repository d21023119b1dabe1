//! A live mesh (issue 28): 1 000 nodes with 10 needs each, 5 000 writes a second spread over
//! every node's needs, while 32 requesters each ask for their own node's needs — against a bare
//! NATS echo of the request and one of the reply's size, measured by the same 32 requesters in
//! the same run, quiet and under the same writes. The host runs on the example accounts config;
//! the writes and requests are made by one user standing in for the 1 000 node users (the
//! example names three), allowed to write every node's needs, each node given its share of the
//! buckets as `bootstrap --node …` gives it. It prints how the reply cache
//! answered meanwhile: hits, misses, and replies kept past a write to another node's keys.
//! A benchmark, not a test.
//!
//! `cargo build --release -p mesh-provisioner && cargo bench -p tests --bench mesh`
//! (`BENCH_WRITES` sets the writes a second, default 5 000; `BENCH_SECONDS` each phase's length,
//! default 5).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::Client;
use futures::StreamExt;
use tests::bench::{cache_lookups, cpu_seconds, guest_calls, metric, pct, requesters, stale_between, stale_reasons, us};
use tests::nats::{Bus, Host};

const NEEDS: &str = "mesh-provisioner_needs";
const NODES: usize = 1000;
const NEEDS_A_NODE: usize = 10;
const REQUESTERS: usize = 32;
const ECHO: &str = "$SRV.ECHO.mesh-provisioner.bench";
const SIZED: &str = "$SRV.SIZED.mesh-provisioner.bench";
const VERB: &str = "mesh-provisioner.provisioning";
/// The stand-in for every node's user: what a node's user may do, for every node at once.
const WRITER: &str = "bench-nodes";

fn node(i: usize) -> String {
    format!("n{i:04}")
}

fn need(node: &str, k: usize) -> String {
    format!("$KV.{NEEDS}.{node}.app.config.name{k}")
}

/// Adds [`WRITER`] to the running server's config (the bus's own users stay as they are), and
/// room for the bench's nodes' shares.
async fn add_writer(bus: &Bus) -> String {
    let password = format!("bench-{}", std::process::id());
    let path = bus.dir.path().join("nats-server.conf");
    let conf = std::fs::read_to_string(&path).expect("the server's config");
    let user = format!(
        r#"users: [
      {{ user: "{WRITER}", password: "{password}"
        permissions: {{
          publish: {{ allow: ["$KV.{NEEDS}.>", "{VERB}", "$SRV.>"] }}
          subscribe: {{ allow: ["_INBOX_{WRITER}.>"] }}
        }}
      }}
"#
    );
    let at = conf.find("users: [").expect("the MESH account's users");
    let conf = format!("{}{user}{}", &conf[..at], &conf[at + "users: [".len()..]);
    // Room for a share of each bucket every node writes, a node (the example's 256 streams
    // are for a mesh of a few dozen nodes).
    assert!(conf.contains("max_streams: 256"), "the MESH account's stream limit");
    let conf = conf.replacen("max_streams: 256", &format!("max_streams: {}", 4 * NODES + 256), 1);
    // Each share's bytes are reserved twice (in its stream and in the bucket sourcing it).
    assert!(conf.contains("max_file: 8GB") && conf.contains("max_file_store: 10GB"), "the storage limits");
    let conf = conf.replacen("max_file: 8GB", "max_file: 16GB", 1).replacen("max_file_store: 10GB", "max_file_store: 20GB", 1);
    std::fs::write(&path, conf).expect("write the config");
    bus.signal("HUP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    password
}

/// Gives each of the bench's nodes its share of the buckets every node writes, as `bootstrap
/// --node n0000 … --node n0999` does (beside the example nodes'): a write to a node's keys is
/// stored only in its share.
async fn shares(bus: &Bus) {
    use mesh_provisioner::nats::bucket::{BucketLimits, Share};
    let example = mesh_provisioner::nats::embedded::EXAMPLE_NODES.iter().map(|n| n.to_string());
    let nodes = example.chain((0..NODES).map(node)).collect();
    // A node's share holds its ten needs many times over; the account holds every share.
    let share = Share { max_bytes: 1 << 20, max_keys: 1000 };
    tests::nats::make_shares(&bus.js(tests::nats::OPERATOR).await, nodes, BucketLimits::default(), share, 1).await;
}

async fn connect(bus: &Bus, password: &str) -> Client {
    for _ in 0..50 {
        let c = async_nats::ConnectOptions::with_user_and_password(WRITER.into(), password.into())
            .custom_inbox_prefix(format!("_INBOX_{WRITER}"))
            .connect(bus.url())
            .await;
        if let Ok(c) = c {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{WRITER} cannot connect: was the config reloaded?");
}

/// Writes every need of every node once, pipelined, acknowledged.
async fn fill(c: &Client) {
    let js = async_nats::jetstream::new(c.clone());
    let keys: Vec<String> = (0..NODES).flat_map(|n| (0..NEEDS_A_NODE).map(move |k| need(&node(n), k))).collect();
    let mut acks = futures::stream::iter(keys.into_iter().map(|subject| {
        let js = js.clone();
        async move { js.publish(subject, tests::bench::need_value(0).into()).await.expect("publish").await.expect("stored") }
    }))
    .buffer_unordered(256);
    while acks.next().await.is_some() {}
}

struct Run {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

async fn run(c: &Client, subject: &str, bodies: &[Vec<u8>], for_: Duration) -> Run {
    let (per_second, mut times) = requesters(c, subject, bodies, for_).await;
    Run { per_second, p50: pct(&mut times, 0.5), p99: pct(&mut times, 0.99) }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio");
    rt.block_on(bench());
}

async fn bench() {
    let per_second: u64 = std::env::var("BENCH_WRITES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    let seconds: u64 = std::env::var("BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let phase = Duration::from_secs(seconds);
    tests::nats::prefer_release_binary();
    let bus = Bus::start().await;
    let password = add_writer(&bus).await;
    shares(&bus).await;
    let host = Host::start(&bus, &["--http", "127.0.0.1:0"]).await;
    let metrics = format!("{}/metrics", host.http_url().await);
    let pid = host.child.id().expect("host pid");
    let c = connect(&bus, &password).await;
    let t = Instant::now();
    fill(&c).await;
    let bodies: Vec<Vec<u8>> = (0..REQUESTERS).map(|i| format!(r#"{{"what":"needs","node":"{}"}}"#, node(i)).into_bytes()).collect();
    // In sync: the last node's needs all answered.
    let last = format!(r#"{{"what":"needs","node":"{}"}}"#, node(NODES - 1));
    let reply = loop {
        if let Ok(m) = c.request(VERB, last.clone().into()).await {
            let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap_or_default();
            if v["entries"].as_array().map_or(0, |e| e.len()) == NEEDS_A_NODE {
                break m.payload;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(300), "the needs mirror never caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("{NODES} nodes × {NEEDS_A_NODE} needs written and mirrored in {:.1} s; a node's needs answer {} bytes", t.elapsed().as_secs_f64(), reply.len());

    // The echoes, answered as the vault's user on a connection of its own.
    let responder = bus.client("mesh-provisioner-service").await;
    for subject in [ECHO, SIZED] {
        let mut sub = responder.subscribe(subject).await.expect("subscribe");
        let (responder, sized) = (responder.clone(), reply.clone());
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let Some(r) = m.reply else { continue };
                let body = if subject == ECHO { m.payload } else { sized.clone() };
                let _ = responder.publish(r, body).await;
            }
        });
    }
    responder.flush().await.expect("flush");
    for subject in [ECHO, SIZED, VERB] {
        let _ = run(&c, subject, &bodies, Duration::from_millis(500)).await;
    }

    for writing in [false, true] {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let writer = writing.then(|| {
            // Each write to a node and a need picked at random.
            let subject = |r: u64| need(&node((r % NODES as u64) as usize), ((r >> 20) % NEEDS_A_NODE as u64) as usize);
            tests::bench::writes(c.clone(), per_second, stop.clone(), written.clone(), subject)
        });
        let began = Instant::now();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let echo = run(&c, ECHO, &bodies, phase).await;
        let sized = run(&c, SIZED, &bodies, phase).await;
        let (stale, (hits, misses), carried) =
            (stale_reasons(&metrics).await, cache_lookups(&metrics).await, metric(&metrics, "mesh_provisioner_reply_cache_carried_total").await);
        let (calls, cpu, at) = (guest_calls(&metrics).await, cpu_seconds(pid), Instant::now());
        let verb = run(&c, VERB, &bodies, phase).await;
        let (calls2, cpu2, took) = (guest_calls(&metrics).await, cpu_seconds(pid), at.elapsed().as_secs_f64());
        let (stale2, (hits2, misses2), carried2) =
            (stale_reasons(&metrics).await, cache_lookups(&metrics).await, metric(&metrics, "mesh_provisioner_reply_cache_carried_total").await);
        stop.store(true, Ordering::Relaxed);
        if let Some(w) = writer {
            let _ = w.await;
        }
        let label = if writing {
            format!("{:.0} writes/s over {NODES} nodes", written.load(Ordering::Relaxed) as f64 / began.elapsed().as_secs_f64())
        } else {
            "quiet".to_string()
        };
        println!(
            "{label}, {REQUESTERS} requesters, each its own node's needs: echo {:.0} req/s p50 {:.0} µs p99 {:.0} µs | sized echo ({} bytes) {:.0} req/s p50 {:.0} µs | verb {:.0} req/s p50 {:.0} µs p99 {:.0} µs",
            echo.per_second, us(echo.p50), us(echo.p99), reply.len(), sized.per_second, us(sized.p50), verb.per_second, us(verb.p50), us(verb.p99)
        );
        println!(
            "{label}: verb throughput {:.2}× echo, {:.2}× sized; p50 {:.2}× echo, {:.2}× sized; p99 {:.2}× echo",
            verb.per_second / echo.per_second,
            verb.per_second / sized.per_second,
            verb.p50.as_secs_f64() / echo.p50.as_secs_f64(),
            verb.p50.as_secs_f64() / sized.p50.as_secs_f64(),
            verb.p99.as_secs_f64() / echo.p99.as_secs_f64()
        );
        println!(
            "{label}: the reply cache meanwhile: {} hits ({} of them kept past writes to other nodes' keys), {} misses; not served from it because: {}",
            hits2 - hits,
            carried2 - carried,
            misses2 - misses,
            stale_between(&stale, &stale2)
        );
        let spent: Vec<String> = calls2
            .iter()
            .filter_map(|(export, (n, sum))| {
                let (n0, sum0) = calls.get(export).copied().unwrap_or_default();
                (n > &n0).then(|| format!("{export} {:.0}/s × {:.0} µs", (n - n0) / took, (sum - sum0) / (n - n0) * 1e6))
            })
            .collect();
        println!("{label}: while the verb was asked, the host used {:.2} CPU seconds a second; guest calls: {}", (cpu2 - cpu) / took, spent.join(", "));
    }
    drop(host);
}
