//! The chaos run (issue 16): a real 3-server JetStream cluster with the example accounts config,
//! buckets with 3 replicas, two real hosts (holder and standby), node writers putting and
//! deleting keys and recording every acknowledged revision, the controller moving plan inputs,
//! requesters asking all the time — and faults drawn from a seeded schedule: a server
//! `SIGKILL`ed (the needs stream's leader among them) and restarted, a server paused 1–5 s, the
//! seat's holder `SIGKILL`ed (the standby takes over; the killed one comes back as a standby),
//! the holder paused past its lease.
//!
//! After each fault, a quiet period: writers hold still and, within a bound, `verify` finds no
//! difference, the registry equals the compiled table, every acknowledged write is in the
//! answers (deleted keys absent), and exactly one instance holds the seat and serves. The seed
//! is printed first, so a failure replays with `CHAOS_SEED`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::Client;
use serde_json::{json, Value};
use tokio::sync::RwLock;

use crate::nats::{answered_keys, ask_within, compiled_kinds, try_verify, Cluster, Host};

/// The seat's TTL the hosts run with: short, so takeovers are quick.
const TTL: Duration = Duration::from_secs(3);
/// Longest a quiet period may take to come clean. A share's source into its bucket whose
/// consumer was lost is set up again on nats-server's backoff: 10 s after the first failure, 10 s
/// more after each next one, at most 2 min apart (`calculateRetryBackoff`, `retryMaximum` in its
/// `stream.go`), never reset by a fault ending. So after a few faults an acknowledged write may
/// reach its bucket two minutes and a set-up later: 150 s was seen too short once (seed 16: 16
/// of beta's acknowledged writes missing from the bucket, the answers equal to the bucket, for
/// 150 s after a server's pause). The bound is the cap twice.
const SETTLE_WITHIN: Duration = Duration::from_secs(240);
/// Keys each writer moves among.
const KEYS: usize = 24;

/// splitmix64: a seeded schedule without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn draw(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.draw() % (hi - lo + 1)
    }
}

/// What a writer knows of a key: its last acknowledged put's revision, acknowledged delete, or
/// nothing certain (the last write failed: it may or may not have landed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Put with the value `{"n": <this>}` (a node's writes number their values: the revision
    /// the node is told is its share's sequence, not the bucket's).
    Put(u64),
    Deleted,
    Unsure,
}

/// One node's writer and what it was told.
struct Writer {
    node: &'static str,
    bucket: &'static str,
    known: std::sync::Mutex<BTreeMap<String, Known>>,
    acked: AtomicU64,
    failed: AtomicU64,
}

/// The figures of one run.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub faults: BTreeMap<&'static str, u32>,
    pub acked_writes: u64,
    pub failed_writes: u64,
    pub answers: u64,
    pub refused: u64,
    pub unanswered: u64,
    pub repairs: u64,
    /// What each repair found, as logged.
    pub repair_lines: Vec<String>,
    pub audits: u64,
    /// From the end of each fault to every check passing.
    pub settle_times: Vec<Duration>,
    /// From a holder's kill to another instance answering as holder.
    pub failovers: Vec<Duration>,
}

impl Report {
    pub fn print(&self) {
        let max = self.settle_times.iter().max().copied().unwrap_or_default();
        let mean = self.settle_times.iter().sum::<Duration>().checked_div(self.settle_times.len() as u32).unwrap_or_default();
        println!("chaos seed {}: faults {:?} ({} in all)", self.seed, self.faults, self.faults.values().sum::<u32>());
        println!(
            "  writes acknowledged {}, failed (outcome unknown) {}; answers {}, refused (503) {}, unanswered {}",
            self.acked_writes, self.failed_writes, self.answers, self.refused, self.unanswered
        );
        println!("  verify differences after every quiet period: 0; acknowledged writes missing from answers: 0");
        println!("  mirror audits {}, repairs {}", self.audits, self.repairs);
        for line in &self.repair_lines {
            println!("    {line}");
        }
        println!("  last fault to all checks clean: mean {mean:?}, max {max:?} ({} quiet periods)", self.settle_times.len());
        println!("  failovers (holder killed to the standby answering): {:?}", self.failovers);
    }
}

struct Mesh {
    cluster: Cluster,
    /// Running hosts by instance name.
    hosts: Vec<(String, Host)>,
    next_instance: u32,
    writers: Vec<Arc<Writer>>,
    /// Writers hold a read guard per write; a quiet period takes the write guard.
    gate: Arc<RwLock<()>>,
    asker: Client,
    prov: Client,
}

impl Mesh {
    fn spawn_host(&mut self) {
        let name = format!("chaos-{}", self.next_instance);
        self.next_instance += 1;
        let host = Host::spawn(
            &self.cluster.urls(),
            &self.cluster,
            tempfile::tempdir().expect("temp dir"),
            &crate::component_path(),
            &["--replicas", "3", "--seat-ttl", "3s", "--audit-every", "2s", "--instance", &name],
        );
        self.hosts.push((name, host));
    }

    async fn holder(&self) -> Option<String> {
        let js = jetstream::new(self.prov.clone());
        let kv = tokio::time::timeout(Duration::from_secs(2), js.get_key_value("mesh-provisioner_seat")).await.ok()?.ok()?;
        let v = tokio::time::timeout(Duration::from_secs(2), kv.get("holder")).await.ok()?.ok()??;
        serde_json::from_slice::<Value>(&v).ok()?["instance"].as_str().map(str::to_string)
    }

    /// The distinct instances answering `$SRV.PING.mesh-provisioner` (only the holder serves).
    async fn serving(&self) -> usize {
        let inbox = self.asker.new_inbox();
        let Ok(mut sub) = self.asker.subscribe(inbox.clone()).await else { return 0 };
        if self.asker.publish_with_reply("$SRV.PING.mesh-provisioner", inbox, "".into()).await.is_err() {
            return 0;
        }
        let mut ids = std::collections::BTreeSet::new();
        let until = tokio::time::Instant::now() + Duration::from_millis(500);
        use futures::StreamExt;
        while let Ok(Some(m)) = tokio::time::timeout_at(until, sub.next()).await {
            if let Ok(v) = serde_json::from_slice::<Value>(&m.payload) {
                ids.insert(v["id"].as_str().unwrap_or_default().to_string());
            }
        }
        ids.len()
    }

    /// Every check of a quiet period; the failures found, none when clean.
    async fn check(&self, kinds: &[String]) -> Vec<String> {
        let mut failures = Vec::new();
        let names: Vec<&str> = self.hosts.iter().map(|(n, _)| n.as_str()).collect();
        match self.holder().await {
            Some(h) if names.contains(&h.as_str()) => {}
            other => failures.push(format!("the seat's lease names {other:?}, not a running instance {names:?}")),
        }
        let serving = self.serving().await;
        if serving != 1 {
            failures.push(format!("{serving} instances serve, not exactly one"));
        }
        if !failures.is_empty() {
            return failures;
        }
        match try_verify(&self.cluster.urls(), "mesh-provisioner", &self.cluster.password("mesh-provisioner")).await {
            Ok((Some(0), _)) => {}
            Ok((code, report)) => failures.push(format!("verify exit {code:?}: {report}")),
            Err(e) => failures.push(e),
        }
        match all_keys(&self.asker, json!({"what": "registry"})).await {
            Ok(reg) => {
                let got: Vec<String> = reg.keys().cloned().collect();
                if got != kinds {
                    failures.push(format!("the registry answers {got:?}, the component compiles {kinds:?}"));
                }
            }
            Err(e) => failures.push(format!("registry: {e}")),
        }
        for w in &self.writers {
            let answered = match all_values(&self.asker, json!({"what": "needs", "node": w.node})).await {
                Ok(a) => a,
                Err(e) => {
                    failures.push(format!("needs of {}: {e}", w.node));
                    continue;
                }
            };
            let known = w.known.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for (key, k) in known {
                match (k, answered.get(&key)) {
                    (Known::Put(n), Some(got)) if got["n"] == n => {}
                    (Known::Put(n), got) => failures.push(format!("{}: acknowledged as {{\"n\":{n}}}, answered {got:?}", key)),
                    (Known::Deleted, Some(got)) => failures.push(format!("{key}: acknowledged deleted, answered {got}")),
                    _ => {}
                }
            }
        }
        failures
    }

    /// Holds writers still and waits (bounded) until every check passes.
    async fn quiet(&self, kinds: &[String], seed: u64) -> Duration {
        let _still = self.gate.write().await;
        let start = Instant::now();
        loop {
            let failures = self.check(kinds).await;
            if failures.is_empty() {
                return start.elapsed();
            }
            if start.elapsed() > Duration::from_secs(5) {
                println!("  not clean yet after {:?}: {}", start.elapsed(), failures.join("; ").chars().take(300).collect::<String>());
            }
            if start.elapsed() > SETTLE_WITHIN {
                eprintln!("--- the needs bucket's sources: {}", self.sources().await);
                for (name, h) in &self.hosts {
                    let log = h.log_text();
                    let tail: Vec<&str> = log.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
                    eprintln!("--- {name} (last lines)\n{}", tail.join("\n"));
                }
                panic!("chaos seed {seed}: not clean {:?} after the fault: {failures:#?}\nreplay with CHAOS_SEED={seed}", start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Where the needs bucket's sources stand on the bus (each share's lag and last activity):
    /// an acknowledged write the answers lack while its share's source lags is the bus's
    /// sourcing behind, not the answers.
    async fn sources(&self) -> String {
        let js = jetstream::new(self.prov.clone());
        let info = async {
            let mut stream = js.get_stream("KV_mesh-provisioner_needs").await.map_err(|e| e.to_string())?;
            stream.info().await.map(|i| i.sources.clone()).map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(2), info).await {
            Ok(Ok(sources)) => sources.iter().map(|s| format!("{} lag {} active {:?}", s.name, s.lag, s.active)).collect::<Vec<_>>().join(", "),
            Ok(Err(e)) => format!("not read: {e}"),
            Err(_) => "not read within 2 s".into(),
        }
    }
}

/// Every key the verb answers for `body`, with its value.
async fn all_values(client: &Client, body: Value) -> Result<BTreeMap<String, Value>, String> {
    let items = crate::nats::answered_items(client, body, Duration::from_secs(3)).await?;
    Ok(items.into_iter().map(|mut e| (e["key"].as_str().unwrap_or_default().to_string(), e["value"].take())).collect())
}

/// Every key the verb answers for `body`, with its revision.
async fn all_keys(client: &Client, body: Value) -> Result<BTreeMap<String, u64>, String> {
    Ok(answered_keys(client, body, Duration::from_secs(3)).await?.into_iter().collect())
}

/// A writer: puts and deletes its node's keys, recording each acknowledged outcome.
async fn write(w: Arc<Writer>, client: Client, gate: Arc<RwLock<()>>, stop: Arc<AtomicBool>, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut js = mesh_provisioner::nats::connect::jetstream_of(client, &format!("node-{}", w.node));
    js.set_timeout(Duration::from_secs(2));
    let mut store = None;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let _open = gate.read().await;
        if store.is_none() {
            store = js.get_key_value(w.bucket).await.ok();
        }
        let Some(kv) = store.as_ref() else {
            drop(_open);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let key = format!("{}.app{}.config.k{}", w.node, rng.between(0, 3), rng.between(0, KEYS as u64 / 4 - 1));
        n += 1;
        let outcome = if rng.between(0, 9) < 7 {
            kv.put(&key, json!({ "n": n }).to_string().into()).await.map(|_| Known::Put(n)).map_err(|e| e.to_string())
        } else {
            kv.delete(&key).await.map(|_| Known::Deleted).map_err(|e| e.to_string())
        };
        let known = match outcome {
            Ok(k) => {
                w.acked.fetch_add(1, Ordering::Relaxed);
                k
            }
            Err(_) => {
                w.failed.fetch_add(1, Ordering::Relaxed);
                Known::Unsure
            }
        };
        w.known.lock().unwrap_or_else(|p| p.into_inner()).insert(key, known);
        drop(_open);
        tokio::time::sleep(Duration::from_millis(rng.between(10, 60))).await;
    }
}

/// The controller: moves plan inputs (assignments' wanted builds) now and then.
async fn control(client: Client, stop: Arc<AtomicBool>, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut js = mesh_provisioner::nats::connect::jetstream_of(client, "mesh-controller");
    js.set_timeout(Duration::from_secs(2));
    while !stop.load(Ordering::Relaxed) {
        if let Ok(kv) = js.get_key_value("mesh-controller_assignments").await {
            let key = format!("{}.app{}", ["alpha", "beta"][rng.between(0, 1) as usize], rng.between(0, 3));
            let _ = kv.put(&key, json!({ "want": format!("b{}", rng.between(1, 9)) }).to_string().into()).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.between(100, 400))).await;
    }
}

/// A requester: asks all the time, counting answers, refusals and silence.
async fn ask(client: Client, stop: Arc<AtomicBool>, counts: Arc<[AtomicU64; 3]>) {
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let body = if i.is_multiple_of(2) { json!({"what": "needs", "node": "alpha"}) } else { json!({"what": "applied"}) };
        match ask_within(&client, body.to_string().as_bytes(), Duration::from_secs(2)).await {
            Ok((None, _)) => counts[0].fetch_add(1, Ordering::Relaxed),
            Ok((Some(_), _)) => counts[1].fetch_add(1, Ordering::Relaxed),
            Err(_) => counts[2].fetch_add(1, Ordering::Relaxed),
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Makes a bucket of the example config's as the operator does, with 3 replicas (`_user`, the
/// one that writes it, may not make streams).
async fn make_bucket(cluster: &Cluster, _user: &str, bucket: &str) {
    cluster.make_bucket(bucket).await
}

/// Runs `faults` faults drawn from `seed`, checking after each; panics with the seed on the
/// first check that does not come clean in time.
pub async fn run(seed: u64, faults: u32) -> Report {
    println!("chaos seed {seed} ({faults} faults); replay with CHAOS_SEED={seed}");
    let mut rng = Rng::new(seed);
    let mut report = Report { seed, ..Report::default() };
    let cluster = Cluster::start(3).await;
    make_bucket(&cluster, "mesh-controller", "mesh-controller_assignments").await;
    make_bucket(&cluster, "node-alpha", "composed-alpha").await;
    make_bucket(&cluster, "node-beta", "composed-beta").await;
    let asker = cluster.client("node-alpha").await;
    let prov = cluster.client("mesh-provisioner").await;
    let mut mesh = Mesh { cluster, hosts: Vec::new(), next_instance: 0, writers: Vec::new(), gate: Arc::new(RwLock::new(())), asker, prov };
    mesh.spawn_host();
    {
        let (_, h) = &mut mesh.hosts[0];
        h.wait_answering(&mesh.asker).await;
    }
    mesh.spawn_host();
    let kinds = compiled_kinds().await;

    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let mut tasks = Vec::new();
    for (i, node) in ["alpha", "beta"].into_iter().enumerate() {
        let w = Arc::new(Writer { node, bucket: "mesh-provisioner_needs", known: Default::default(), acked: Default::default(), failed: Default::default() });
        let client = mesh.cluster.client(&format!("node-{node}")).await;
        tasks.push(tokio::spawn(write(w.clone(), client, mesh.gate.clone(), stop.clone(), seed ^ (i as u64 + 1))));
        mesh.writers.push(w);
    }
    tasks.push(tokio::spawn(control(mesh.cluster.client("mesh-controller").await, stop.clone(), seed ^ 0xc0)));
    for _ in 0..2 {
        tasks.push(tokio::spawn(ask(mesh.cluster.client("node-alpha").await, stop.clone(), counts.clone())));
    }
    // Let writes flow, then a first quiet period: the mesh is right before any fault.
    tokio::time::sleep(Duration::from_secs(2)).await;
    mesh.quiet(&kinds, seed).await;

    let mut f = 0;
    while f < faults {
        tokio::time::sleep(Duration::from_millis(rng.between(500, 2000))).await;
        let kind = match rng.between(0, 9) {
            0..=2 => "kill a server",
            3..=4 => "pause a server",
            5..=7 => "kill the holder",
            _ => "pause the holder past its lease",
        };
        let begun = Instant::now();
        match kind {
            "kill a server" => {
                // Half the time the needs stream's leader, else any server.
                let leader = if rng.between(0, 1) == 0 { needs_leader(&mesh).await } else { None };
                let i = leader.unwrap_or(rng.between(0, 2) as usize);
                println!("fault {f}: SIGKILL server {i}{}", if leader.is_some() { " (the needs stream's leader)" } else { "" });
                mesh.cluster.crash(i).await;
                tokio::time::sleep(Duration::from_millis(rng.between(1000, 3000))).await;
                mesh.cluster.restart(i).await;
            }
            "pause a server" => {
                let i = rng.between(0, 2) as usize;
                let pause = Duration::from_millis(rng.between(1000, 5000));
                println!("fault {f}: SIGSTOP server {i} for {pause:?}");
                mesh.cluster.bus(i).signal("STOP");
                tokio::time::sleep(pause).await;
                mesh.cluster.bus(i).signal("CONT");
            }
            "kill the holder" => {
                let Some(holder) = mesh.holder().await else { continue };
                let Some(at) = mesh.hosts.iter().position(|(n, _)| *n == holder) else { continue };
                println!("fault {f}: SIGKILL the holder {holder}");
                let (_, host) = mesh.hosts.remove(at);
                let killed = Instant::now();
                repairs_in(&host, &mut report);
                host.stop().await;
                // The standby takes over: the first answer from another instance.
                loop {
                    if matches!(mesh.holder().await, Some(h) if h != holder)
                        && matches!(ask_within(&mesh.asker, b"{}", Duration::from_secs(1)).await, Ok((None, _)))
                    {
                        report.failovers.push(killed.elapsed());
                        break;
                    }
                    assert!(killed.elapsed() < Duration::from_secs(60), "chaos seed {seed}: no takeover after the holder was killed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                mesh.spawn_host();
            }
            _ => {
                let Some(holder) = mesh.holder().await else { continue };
                let Some((_, host)) = mesh.hosts.iter().find(|(n, _)| *n == holder) else { continue };
                let pause = TTL + Duration::from_millis(rng.between(500, 2000));
                println!("fault {f}: SIGSTOP the holder {holder} for {pause:?}");
                host.signal("STOP");
                tokio::time::sleep(pause).await;
                host.signal("CONT");
            }
        }
        *report.faults.entry(kind).or_default() += 1;
        f += 1;
        let settled = mesh.quiet(&kinds, seed).await;
        println!("  clean {settled:?} after the fault ended (fault lasted {:?})", begun.elapsed() - settled.min(begun.elapsed()));
        report.settle_times.push(settled);
    }

    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    for w in &mesh.writers {
        report.acked_writes += w.acked.load(Ordering::Relaxed);
        report.failed_writes += w.failed.load(Ordering::Relaxed);
    }
    report.answers = counts[0].load(Ordering::Relaxed);
    report.refused = counts[1].load(Ordering::Relaxed);
    report.unanswered = counts[2].load(Ordering::Relaxed);
    for (_, h) in &mesh.hosts {
        repairs_in(h, &mut report);
    }
    if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(2), mesh.asker.request("$SRV.STATS.mesh-provisioner", "".into())).await {
        let v: Value = serde_json::from_slice(&m.payload).unwrap_or_default();
        report.audits = v["endpoints"][0]["data"]["mirror_audits"].as_object().map(|o| o.values().filter_map(Value::as_u64).sum()).unwrap_or(0);
    }
    for (_, h) in mesh.hosts.drain(..) {
        h.stop().await;
    }
    report
}

/// Counts the mirror repairs a host logged, keeping what each found.
fn repairs_in(host: &Host, report: &mut Report) {
    for line in host.log_text().lines().filter(|l| l.contains("it differs from the bucket")) {
        report.repairs += 1;
        let found = line.find("bucket=").map(|at| &line[at..]).unwrap_or(line);
        report.repair_lines.push(found.chars().take(240).collect());
    }
}

/// The server leading the needs stream now, if the bus says.
async fn needs_leader(mesh: &Mesh) -> Option<usize> {
    let js = jetstream::new(mesh.prov.clone());
    let mut stream = tokio::time::timeout(Duration::from_secs(2), js.get_stream("KV_mesh-provisioner_needs")).await.ok()?.ok()?;
    let info = tokio::time::timeout(Duration::from_secs(2), stream.info()).await.ok()?.ok()?;
    let leader = info.cluster.as_ref()?.leader.clone()?;
    mesh.cluster.index_of(&leader)
}
