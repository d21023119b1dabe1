//! A mesh of thousands in operator mode (`accounts --operator`): every node an account of its
//! own, signed with nkeys, read by `nats-server` from a full resolver preloaded with them. Each
//! figure against a floor measured in the same run:
//! - rendering `BENCH_RENDER` (10 000) node accounts, against the ed25519 signatures alone that
//!   rendering must make; starting a server with them, against one with the example mesh's ten;
//! - `BENCH_NODES` (1 000) node accounts on one server and on a cluster of three: each server's
//!   start and memory, against the same servers with the example mesh;
//! - on the one server: every node writing 100 needs at once, each as its own user over its own
//!   connection, until every write is acknowledged (the floor) and until the provisioner
//!   answers every node's needs; the provisioner's start by full replay and from its snapshot,
//!   against a bare client listing the same keys; the verb's p50 and p99 asked by a node,
//!   against an echo of the same size answered by the provisioner's serving user through the
//!   same import (`--no-reply-cache`); a node joining the running mesh, from the push of its
//!   account until the provisioner answers its first need, against that write acknowledged.
//!
//! `cargo build --release -p mesh-provisioner && cargo bench -p tests --bench operator`
//! A benchmark, not a test.

use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use mesh_provisioner::accounts::{operator, Mesh};
use mesh_provisioner::nats::bucket::{BucketLimits as Limits, Share, Spec, SHARED_BUCKETS};
use mesh_provisioner::nats::embedded::{free_ports, Access, Server};
use tests::bench::{latencies, pct, us};
use tests::nats::Host;

const NEEDS: &str = "mesh-provisioner_needs";
const PER_NODE: usize = 100;
const SIZED: &str = "$SRV.SIZED.mesh-provisioner.bench";

/// A process's resident memory, in MiB.
fn rss_mib(pid: u32) -> f64 {
    tests::rss_kib(pid) as f64 / 1024.0
}

fn mesh(n: usize) -> Mesh {
    Mesh::new((0..n).map(|i| format!("n{i:05}")).collect(), vec!["postgres".into()]).expect("a mesh")
}

/// Renders `mesh` into `dir`: the time, and the count of signatures it made.
fn render(mesh: &Mesh, dir: &Path) -> (Duration, usize, operator::Signed) {
    let t = Instant::now();
    let signed = operator::render_into(mesh, dir, &[]).expect("rendered");
    let took = t.elapsed();
    // One activation an account and subject it imports by token (every subject from MESH but
    // the verbs' and discovery's).
    let activations: usize = mesh
        .accounts()
        .iter()
        .map(|a| {
            let subjects: std::collections::BTreeSet<&str> = a
                .imports
                .iter()
                .filter(|i| i.account == "MESH" && !i.subject.starts_with("mesh-provisioner.p") && !i.subject.starts_with("$SRV"))
                .map(|i| i.subject.as_str())
                .collect();
            subjects.len()
        })
        .sum();
    (took, signed.accounts.len() + 1 + signed.creds.len() + activations, signed)
}

/// The config rendered in `dir` with its placeholders filled for a server at `port` in `sub`.
fn filled(dir: &Path, sub: &Path, port: u16, cluster: &str) -> String {
    // Each server's resolver seeded with every account, as an operator copies `resolver/`.
    std::fs::create_dir_all(sub.join("resolver")).expect("dir");
    for e in std::fs::read_dir(dir.join("resolver")).expect("the rendered resolver").flatten() {
        std::fs::copy(e.path(), sub.join("resolver").join(e.file_name())).expect("seed the resolver");
    }
    std::fs::read_to_string(dir.join("nats-server.conf"))
        .expect("the rendered config")
        .replace("{{PORT}}", &port.to_string())
        .replace("{{STORE_DIR}}", &sub.join("js").display().to_string())
        .replace("{{RESOLVER_DIR}}", &sub.join("resolver").display().to_string())
        .replace("{{CLUSTER}}", cluster)
}

/// Starts `servers` servers (a cluster if more than one) of the accounts rendered in `dir`:
/// the time until every one listens and a node's user logs in, and each one's memory then.
async fn start(dir: &Path, signed: &operator::Signed, servers: usize, node_user: &str) -> (Duration, Vec<f64>, Vec<Server>) {
    let picked = free_ports(2 * servers).expect("free ports");
    let ports: Vec<(u16, u16)> = (0..servers).map(|i| (picked[i], picked[servers + i])).collect();
    let t = Instant::now();
    let mut running = Vec::new();
    for (i, (port, cport)) in ports.iter().enumerate() {
        let cluster = if servers > 1 {
            let routes: Vec<String> = ports.iter().filter(|(p, _)| p != port).map(|(_, c)| format!("\"nats-route://127.0.0.1:{c}\"")).collect();
            format!("cluster {{\n  name: \"mesh\"\n  listen: \"127.0.0.1:{cport}\"\n  routes: [{}]\n}}", routes.join(", "))
        } else {
            String::new()
        };
        let sub = dir.join(format!("server{i}"));
        std::fs::create_dir_all(&sub).expect("dir");
        let conf = filled(dir, &sub, *port, &cluster);
        let access = Access { url: format!("nats://127.0.0.1:{port}"), passwords: vec![], creds: signed.creds.clone() };
        running.push(Server::start_config(&sub, *port, &conf, access).await.expect("nats-server starts"));
    }
    for s in &running {
        let options = mesh_provisioner::nats::connect::embedded_options(&s.access, node_user, "bench").expect("creds");
        let c = loop {
            match options.clone().connect(&s.access.url).await {
                Ok(c) => break c,
                Err(_) if t.elapsed() < Duration::from_secs(120) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(e) => panic!("{node_user} logs in: {e}"),
            }
        };
        c.flush().await.expect("a round trip");
    }
    let took = t.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = running.iter().map(|s| rss_mib(s.pid().expect("running"))).collect();
    (took, rss, running)
}

async fn stop(servers: Vec<Server>) {
    for s in servers {
        s.stop().await;
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

async fn connect(access: &Access, user: &str) -> async_nats::Client {
    mesh_provisioner::nats::connect::embedded_options(access, user, "bench").expect("creds").connect(&access.url).await.expect("connect")
}

/// Until the provisioner answers `node`'s needs with every one of them.
async fn until_answered(asker: &async_nats::Client, node: &str, since: Instant, host: &Host) -> Duration {
    let query = serde_json::json!({"what":"needs","node":node});
    loop {
        if tests::nats::answered_keys(asker, query.clone(), Duration::from_secs(5)).await.is_ok_and(|k| k.len() == PER_NODE) {
            return since.elapsed();
        }
        assert!(since.elapsed() < Duration::from_secs(600), "{node}'s needs never answered:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() {
    tests::nats::prefer_release_binary();
    let n: usize = std::env::var("BENCH_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let big: usize = std::env::var("BENCH_RENDER").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let root = tempfile::tempdir().expect("dir");

    // Rendering, against the signatures alone.
    let (took, signatures, signed) = render(&mesh(big), &root.path().join("big"));
    let kp = nkeys::KeyPair::new_account();
    let payload = vec![b'x'; 900];
    let t = Instant::now();
    for _ in 0..signatures {
        std::hint::black_box(kp.sign(&payload).expect("signed"));
    }
    let floor = t.elapsed();
    println!(
        "render {big} nodes: {} accounts, {signatures} signatures in {:.2} s = {:.2}× the signatures alone ({:.2} s); config {:.1} MiB",
        signed.accounts.len(),
        took.as_secs_f64(),
        took.as_secs_f64() / floor.as_secs_f64(),
        floor.as_secs_f64(),
        std::fs::metadata(root.path().join("big/nats-server.conf")).map(|m| m.len()).unwrap_or(0) as f64 / (1 << 20) as f64
    );
    let (_, _, example) =
        render(&Mesh { nodes: vec!["alpha".into(), "beta".into(), "gamma".into()], providers: vec!["postgres".into()] }, &root.path().join("example"));
    let (base_start, base_rss, servers) = start(&root.path().join("example"), &example, 1, "node-alpha").await;
    stop(servers).await;
    let last = format!("node-n{:05}", big - 1);
    let (big_start, big_rss, servers) = start(&root.path().join("big"), &signed, 1, &last).await;
    stop(servers).await;
    println!(
        "start with {big} node accounts: {:.2} s = {:.2}× the example mesh's ({:.2} s); memory {:.0} MiB = {:.2}× ({:.0} MiB)",
        big_start.as_secs_f64(),
        big_start.as_secs_f64() / base_start.as_secs_f64(),
        base_start.as_secs_f64(),
        mean(&big_rss),
        mean(&big_rss) / mean(&base_rss),
        mean(&base_rss)
    );

    // A cluster of three, the example mesh's and n nodes'.
    let (_, _, signed) = render(&mesh(n), &root.path().join("n"));
    let (c_base, c_base_rss, servers) = start(&root.path().join("example"), &example, 3, "node-alpha").await;
    stop(servers).await;
    let (c_start, c_rss, servers) = start(&root.path().join("n"), &signed, 3, &format!("node-n{:05}", n - 1)).await;
    stop(servers).await;
    println!(
        "cluster of 3 with {n} node accounts: started in {:.2} s = {:.2}× the example mesh's ({:.2} s); memory a server {:.0} MiB = {:.2}× ({:.0} MiB)",
        c_start.as_secs_f64(),
        c_start.as_secs_f64() / c_base.as_secs_f64(),
        c_base.as_secs_f64(),
        mean(&c_rss),
        mean(&c_rss) / mean(&c_base_rss),
        mean(&c_base_rss)
    );

    // One server with n nodes: the operator makes every node's share.
    let (one_start, one_rss, mut servers) = start(&root.path().join("n"), &signed, 1, &format!("node-n{:05}", n - 1)).await;
    let server = servers.remove(0);
    println!("one server with {n} node accounts: started in {:.2} s, {:.0} MiB", one_start.as_secs_f64(), mean(&one_rss));
    let access = server.access.clone();
    let mut js = jetstream::new(connect(&access, "mesh-operator").await);
    js.set_timeout(Duration::from_secs(30));
    let limits = Limits { max_bytes: 1 << 30, ..Limits::default() };
    let nodes = mesh(n).nodes;
    let plan = mesh_provisioner::nats::mesh::Plan {
        buckets: SHARED_BUCKETS.iter().map(|b| Spec::new(b, "bench", 1, 1, limits)).collect(),
        nodes: nodes.clone(),
        share: Share { max_bytes: 1 << 20, max_keys: 1024 },
    };
    mesh_provisioner::nats::mesh::apply(&js, &plan).await.result().expect("the shares are made");

    // The provisioner serves (an empty mesh yet); every node writes its needs at once.
    let state = tempfile::tempdir().expect("dir");
    let provisioner = root.path().join("n/creds/mesh-provisioner.creds");
    let service = root.path().join("n/creds/mesh-provisioner-service.creds");
    let args = [
        "--nats-url",
        access.url.as_str(),
        "--creds",
        provisioner.to_str().expect("path"),
        "--service-creds",
        service.to_str().expect("path"),
        "--no-reply-cache",
    ];
    let host = Host::spawn_as(state, &tests::component_path(), &args);
    let asker = connect(&access, "node-n00000").await;
    let t = Instant::now();
    loop {
        if tests::nats::answered_keys(&asker, serde_json::json!({"what":"needs","node":"n00000"}), Duration::from_secs(2)).await.is_ok() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "the provisioner never served:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut clients = Vec::new();
    for node in &nodes {
        clients.push((node.clone(), connect(&access, &format!("node-{node}")).await));
    }
    let t = Instant::now();
    let writes = clients.iter().flat_map(|(node, c)| (0..PER_NODE).map(move |k| (node.clone(), c.clone(), k)));
    futures::stream::iter(writes)
        .map(|(node, c, k)| async move {
            let js = mesh_provisioner::nats::connect::jetstream_of(c, &format!("node-{node}"));
            js.publish(format!("$KV.{NEEDS}.{node}.m{}.config.k{k}", k % 10), r#"{"placeholder":"${config:name}","part":"api"}"#.into())
                .await
                .expect("sent")
                .await
                .expect("stored")
        })
        .buffer_unordered(2048)
        .collect::<Vec<_>>()
        .await;
    let acked = t.elapsed();
    let mut answered = Duration::ZERO;
    for node in &nodes {
        answered = until_answered(&asker, node, t, &host).await;
    }
    println!(
        "{n} nodes × {PER_NODE} needs written at once, each node its own connection: acknowledged in {:.2} s; every node's needs answered in {:.2} s = {:.2}× the acknowledgements",
        acked.as_secs_f64(),
        answered.as_secs_f64(),
        answered.as_secs_f64() / acked.as_secs_f64()
    );

    // A node joining the running mesh: its account rendered with the others' keys and pushed
    // alone, its share made; from the push until the provisioner answers its first need,
    // against until that write is acknowledged.
    let joined = format!("n{n:05}");
    let mut bigger = mesh(n);
    bigger.nodes.push(joined.clone());
    let signed = operator::render_into(&bigger, &root.path().join("n"), &[]).expect("rendered with the new node");
    let account = signed.account(&mesh_provisioner::accounts::parties::node_account_name(&joined)).expect("its account").clone();
    let system = connect(&access, "system").await;
    let mut joined_access = access.clone();
    joined_access.creds = signed.creds.clone();
    let t = Instant::now();
    mesh_provisioner::nats::claims::push(&system, &account.name, &account.jwt).await.expect("pushed");
    let plan = mesh_provisioner::nats::mesh::Plan {
        buckets: SHARED_BUCKETS.iter().map(|b| Spec::new(b, "bench", 1, 1, limits)).collect(),
        nodes: vec![joined.clone()],
        share: Share { max_bytes: 1 << 20, max_keys: 1024 },
    };
    mesh_provisioner::nats::mesh::apply(&js, &plan).await.result().expect("its share is made");
    let newcomer = connect(&joined_access, &format!("node-{joined}")).await;
    let njs = mesh_provisioner::nats::connect::jetstream_of(newcomer.clone(), &format!("node-{joined}"));
    njs.publish(format!("$KV.{NEEDS}.{joined}.m0.config.k0"), r#"{"placeholder":"${config:name}","part":"api"}"#.into())
        .await
        .expect("sent")
        .await
        .expect("stored");
    let acked = t.elapsed();
    let query = serde_json::json!({"what":"needs","node":joined});
    loop {
        if tests::nats::answered_keys(&newcomer, query.clone(), Duration::from_secs(5)).await.is_ok_and(|k| k.len() == 1) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "the new node's need was never answered:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let answered = t.elapsed();
    println!(
        "a node joining the running mesh: pushed, its share made, logged in, its first need answered {:.0} ms after the push = {:.2}× its write acknowledged ({:.0} ms)",
        answered.as_secs_f64() * 1e3,
        answered.as_secs_f64() / acked.as_secs_f64(),
        acked.as_secs_f64() * 1e3
    );

    // The verb asked by a node, against an echo of its size through the same import.
    let body = serde_json::json!({"what":"needs","node":nodes[n / 2],"module":"m3"}).to_string();
    let asker = connect(&access, &format!("node-{}", nodes[n / 2])).await;
    let size = asker.request("mesh-provisioner.provisioning", body.clone().into()).await.expect("the verb answers").payload.len();
    let responder = connect(&access, "mesh-provisioner-service").await;
    let mut requests = responder.subscribe(SIZED).await.expect("subscribe");
    responder.flush().await.expect("flush");
    let reply = bytes::Bytes::from(vec![b'x'; size]);
    tokio::spawn(async move {
        while let Some(m) = requests.next().await {
            if let Some(r) = m.reply {
                let _ = responder.publish(r, reply.clone()).await;
            }
        }
    });
    let mut verb = latencies(&asker, "mesh-provisioner.provisioning", body.as_bytes(), 1000).await;
    let mut echo = latencies(&asker, SIZED, body.as_bytes(), 1000).await;
    let (v50, v99, e50, e99) = (pct(&mut verb, 0.5), pct(&mut verb, 0.99), pct(&mut echo, 0.5), pct(&mut echo, 0.99));
    println!(
        "verb asked by a node ({size} B reply): p50 {:.0} µs = {:.2}× the sized echo ({:.0} µs), p99 {:.0} µs = {:.2}× ({:.0} µs)",
        us(v50),
        us(v50) / us(e50),
        us(e50),
        us(v99),
        us(v99) / us(e99),
        us(e99)
    );

    // The provisioner's start: by full replay, then from the snapshot its stop wrote; against a
    // bare client listing every key of the needs bucket.
    // A graceful stop writes the snapshot the second start loads.
    let mut host = host;
    host.signal("TERM");
    let _ = host.child.wait().await;
    let state = host.state;
    let t = Instant::now();
    // As the provisioner's user: its grant answers the consumer's flow control (`$JS.FC`).
    let reader = jetstream::new(connect(&access, "mesh-provisioner").await);
    let kv = reader.get_key_value(NEEDS).await.expect("the bucket");
    let mut keys = kv.keys().await.expect("the keys");
    let want = n * PER_NODE;
    for _ in 0..want {
        tokio::time::timeout(Duration::from_secs(30), keys.next()).await.expect("a key within 30 s").expect("a key").expect("readable");
    }
    let read = t.elapsed();
    let mut replay = Duration::ZERO;
    let mut snapshot = Duration::ZERO;
    let mut state = Some(state);
    for (i, extra) in [["--no-snapshots", ""], ["", ""]].iter().enumerate() {
        let dir = if i == 0 { tempfile::tempdir().expect("dir") } else { state.take().expect("the state with its snapshot") };
        let mut a: Vec<&str> = args.to_vec();
        a.extend(extra.iter().filter(|s| !s.is_empty()));
        let t = Instant::now();
        let h = Host::spawn_as(dir, &tests::component_path(), &a);
        let took = until_answered(&asker, &nodes[n - 1], t, &h).await;
        if i == 0 {
            replay = took;
        } else {
            snapshot = took;
        }
        // Stopped gracefully: it gives the seat up, so the next start does not wait out its lease.
        let mut h = h;
        h.signal("TERM");
        let _ = h.child.wait().await;
    }
    println!(
        "provisioner start with {} keys: by full replay {:.2} s = {:.2}× a bare client listing the keys ({:.2} s); from its snapshot {:.2} s = {:.2}×",
        want,
        replay.as_secs_f64(),
        replay.as_secs_f64() / read.as_secs_f64(),
        read.as_secs_f64(),
        snapshot.as_secs_f64(),
        snapshot.as_secs_f64() / read.as_secs_f64()
    );
    server.stop().await;
}
