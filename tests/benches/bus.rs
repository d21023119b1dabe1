//! The verb over a real bus against bare NATS echo round trips measured in the same run: p50/p99
//! for a narrowed needs query (10 entries), the plan verb, and `status` (one module; a node's
//! 1 000 modules paged) with the needs bucket at 10 thousand and at 1 million keys, throughput
//! with 32 concurrent requesters, and the host's resident memory against the raw bytes of the
//! mirrored keys and values. Two floors: an echo of the request (the bus's round trip), and a
//! "sized" echo that replies with exactly the bytes of the verb's reply, so the ratio measures
//! the server's work rather than a bigger message. The floors and the verb are asked in turns,
//! a request of each (the throughputs in turns of half a second), so a noisy moment of the
//! machine falls on all of them alike. The requests are made as a node's user, in
//! the node's own account, and the echoes answered as the provisioner's serving user on
//! `$SRV.ECHO.mesh-provisioner.…`: the verb and its echoes cross the same service import; the
//! vault's stand-in counts the discovery pings `status` sends. At the end, starts at
//! the large size: from the snapshot the stopped host wrote, and by a full replay, against a
//! plain watch of the same keys on a server without permissions (written there by the bench),
//! and a standby's takeover. A benchmark, not a test.
//!
//! `cargo build --release -p mesh-provisioner && cargo bench -p tests --bench bus`
//! (uses `target/release/mesh-provisioner` when built, else the debug binary; `BENCH_KEYS` sets
//! the large size, default 1 000 000; `BENCH_STARTS` how many full replays are measured, each
//! against a floor measured just before it, default 3; `BENCH_WATCHES` compares ways of reading
//! the floor's bucket instead of the starts; `BENCH_ANSWER` measures only the uncached answer:
//! the host started with `--no-reply-cache`, the needs query at both sizes, quiet and while
//! `BENCH_WRITES` writes a second, default 5 000, rewrite the node's other needs; each phase
//! also says the host's and the echo process's CPU time a request, the guest's `handle` asked
//! one request at a time, and the state recorder's calls meanwhile).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::Client;
use futures::StreamExt;
use tests::bench::{cache_lookups, guest_calls, latencies, latencies_interleaved, metric, pct, stale_between, stale_reasons, throughput_interleaved, us};
use tests::nats::{Bus, Host};

const NEEDS: &str = "mesh-provisioner_needs";
const VALUE: &[u8] = br#"{"placeholder":"${config:name}","part":"api"}"#;
/// The echoes: the request back, the same from a process of its own, and the verb's reply size.
const ECHO: &str = "$SRV.ECHO.mesh-provisioner.bench";
const ECHO_PROCESS: &str = "$SRV.ECHO.mesh-provisioner.process";
const SIZED: &str = "$SRV.SIZED.mesh-provisioner.bench";
/// The reply-sized echo in a process of its own, started for each measurement.
const SIZED_PROCESS: &str = "$SRV.SIZED.mesh-provisioner.process";

/// How to start an echo process: its binary, the bus's address and the serving user's password.
static ECHO_START: std::sync::OnceLock<(std::path::PathBuf, String, String)> = std::sync::OnceLock::new();

/// An echo in a process of its own on `subject` (answering with `reply`'s bytes when given),
/// subscribed once this returns; stopped when dropped.
async fn echo_process(subject: &str, reply: Option<&std::path::Path>) -> tokio::process::Child {
    use tokio::io::AsyncBufReadExt;
    let (bin, url, password) = ECHO_START.get().expect("the echo binary is known");
    let mut args = vec![url.as_str(), "mesh-provisioner-service", password.as_str(), subject];
    let file = reply.map(|p| p.to_string_lossy().into_owned());
    args.extend(file.as_deref());
    let mut child =
        tokio::process::Command::new(bin).args(args).stdout(std::process::Stdio::piped()).kill_on_drop(true).spawn().expect("start the echo process");
    let out = child.stdout.take().expect("echo stdout");
    let mut line = String::new();
    tokio::io::BufReader::new(out).read_line(&mut line).await.expect("echo says ready");
    child
}

/// Writes `modules` modules × 10 needs for `node`, pipelined, as the node's own user.
async fn fill(bus: &Bus, node: &str, from: usize, to: usize) -> u64 {
    let js = bus.js(&format!("node-{node}")).await;
    // Nine config needs and a secret, so `status` checks buckets and asks discovery.
    let keys: Vec<String> = (from..to)
        .flat_map(|m| (0..10).map(move |k| if k == 9 { format!("{node}.m{m:06}.secret.name{k}") } else { format!("{node}.m{m:06}.config.name{k}") }))
        .collect();
    let raw: u64 = keys.iter().map(|k| (k.len() + VALUE.len()) as u64).sum();
    let mut acks = futures::stream::iter(keys.into_iter().map(|key| {
        let js = js.clone();
        async move {
            let subject = format!("$KV.{NEEDS}.{key}");
            loop {
                match js.publish(subject.clone(), VALUE.into()).await {
                    Ok(ack) => match ack.await {
                        Ok(_) => return,
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    },
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
    }))
    .buffer_unordered(512);
    while acks.next().await.is_some() {}
    drop(acks);
    raw
}

async fn wait_for(c: &Client, node: &str, module: usize) {
    let q = format!(r#"{{"what":"needs","node":"{node}","module":"m{module:06}"}}"#);
    let start = Instant::now();
    loop {
        if let Ok(m) = c.request("mesh-provisioner.provisioning", q.clone().into()).await {
            let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap_or_default();
            if v["entries"].as_array().map_or(0, |e| e.len()) == 10 {
                return;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(600), "mirror never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The sized echo's reply, set to the verb's reply before each measurement.
type Sized = Arc<std::sync::Mutex<bytes::Bytes>>;

/// A node's write, then its read at once: 300 times asking by the share's new sequence (the
/// wait's round trips, nothing kept), 300 times plain (which may miss the write); each ask's
/// time against the echo's p50 measured alongside.
async fn write_then_read(bus: &Bus, c: &Client) {
    let (mut fresh, mut plain, mut missed) = (Vec::new(), Vec::new(), 0);
    // One connection writes, as a node's client does; each write a module's only need.
    let kv = bus.js("node-alpha").await.get_key_value(NEEDS).await.expect("node-alpha binds the needs bucket");
    for i in 0..600 {
        let key = format!("alpha.w{i}.config.x");
        let seq = kv.put(&key, "{}".into()).await.expect("the write is acknowledged");
        let body = match i % 2 {
            0 => format!(r#"{{"what":"needs","node":"alpha","module":"w{i}","min_revision":{{"NODE_alpha":{seq}}}}}"#),
            _ => format!(r#"{{"what":"needs","node":"alpha","module":"w{i}"}}"#),
        };
        let t = Instant::now();
        let m = c.request("mesh-provisioner.provisioning", body.into_bytes().into()).await.expect("the verb answers");
        let took = t.elapsed();
        let answered_it = String::from_utf8_lossy(&m.payload).contains(&format!("\"{key}\""));
        match i % 2 {
            0 => {
                assert!(answered_it, "a read naming NODE_alpha {seq} without the write: {:?}", String::from_utf8_lossy(&m.payload));
                fresh.push(took);
            }
            _ => {
                missed += usize::from(!answered_it);
                plain.push(took);
            }
        }
    }
    let mut echo = latencies(c, ECHO, b"{}", 1000).await;
    let e50 = pct(&mut echo, 0.5);
    let (f50, f99, p50) = (pct(&mut fresh, 0.5), pct(&mut fresh, 0.99), pct(&mut plain, 0.5));
    println!(
        "write then read: by share sequence p50 {:.0} µs = {:.2}× echo ({:.2}× the plain read), p99 {:.0} µs | plain p50 {:.0} µs = {:.2}× echo, missed its own write {missed} of 300 | echo p50 {:.0} µs",
        us(f50), f50.as_secs_f64() / e50.as_secs_f64(), f50.as_secs_f64() / p50.as_secs_f64(), us(f99), us(p50), p50.as_secs_f64() / e50.as_secs_f64(), us(e50)
    );
}

/// The verb `verb` against the echoes, at p50 and p99, then under 32 requesters.
async fn measure(label: &str, c: &Client, sized: &Sized, verb: &str, query: &[u8]) {
    let n = 3000;
    // The first answer, not an error: a wildcard-first narrowing over more than a million keys
    // is told to ask again while its index is built.
    let asked = Instant::now();
    let reply = loop {
        let m = c.request(verb.to_string(), query.to_vec().into()).await.expect("the verb answers");
        if m.headers.as_ref().and_then(|h| h.get("Nats-Service-Error-Code")).is_none() {
            break m.payload;
        }
        assert!(asked.elapsed() < Duration::from_secs(120), "{label}: no answer but {:?}", String::from_utf8_lossy(&m.payload));
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if asked.elapsed() > Duration::from_millis(500) {
        println!("{label}: first answered {:.2} s after first asked", asked.elapsed().as_secs_f64());
    }
    *sized.lock().unwrap() = reply.clone();
    let file = tempfile::NamedTempFile::new().expect("a file for the reply");
    std::fs::write(file.path(), &reply).expect("the reply written");
    let _sized_process = echo_process(SIZED_PROCESS, Some(file.path())).await;
    for subject in [ECHO, ECHO_PROCESS, SIZED, SIZED_PROCESS, verb] {
        let _ = latencies(c, subject, query, 200).await;
    }
    // In turns, one request of each, so that the floors and the verb share the machine's moods.
    let [mut other, mut echo, mut floor, mut other_sized, mut times]: [Vec<Duration>; 5] =
        latencies_interleaved(c, &[ECHO_PROCESS, ECHO, SIZED, SIZED_PROCESS, verb], query, n).await.try_into().expect("five subjects, five lists");
    let (o50, os50) = (pct(&mut other, 0.5), pct(&mut other_sized, 0.5));
    let (e50, e99, f50, f99, v50, v99) =
        (pct(&mut echo, 0.5), pct(&mut echo, 0.99), pct(&mut floor, 0.5), pct(&mut floor, 0.99), pct(&mut times, 0.5), pct(&mut times, 0.99));
    println!(
        "{label}: echo p50 {:.0} µs p99 {:.0} µs | reply-sized echo p50 {:.0} µs p99 {:.0} µs ({} bytes) | verb p50 {:.0} µs = {:.2}× echo, {:.2}× sized; p99 {:.0} µs = {:.2}× echo, {:.2}× sized",
        us(e50), us(e99), us(f50), us(f99), reply.len(),
        us(v50), v50.as_secs_f64() / e50.as_secs_f64(), v50.as_secs_f64() / f50.as_secs_f64(),
        us(v99), v99.as_secs_f64() / e99.as_secs_f64(), v99.as_secs_f64() / f99.as_secs_f64()
    );
    println!(
        "{label}: in a process of its own: echo p50 {:.0} µs, reply-sized echo p50 {:.0} µs | verb p50 {:.2}× that echo, {:.2}× that sized echo",
        us(o50),
        us(os50),
        v50.as_secs_f64() / o50.as_secs_f64(),
        v50.as_secs_f64() / os50.as_secs_f64()
    );
    let rates = throughput_interleaved(c, &[ECHO, SIZED, verb], query, 32, Duration::from_secs(3), Duration::from_millis(500)).await;
    let (et, ft, vt) = (rates[0], rates[1], rates[2]);
    println!("{label}: 32 requesters: echo {et:.0} req/s, sized echo {ft:.0} req/s, verb {vt:.0} req/s ({:.2}× echo, {:.2}× sized)", vt / et, vt / ft);
    let stats = c.request("$SRV.STATS.mesh-provisioner", "".into()).await.expect("STATS");
    let stats: serde_json::Value = serde_json::from_slice(&stats.payload).unwrap_or_default();
    let endpoint = stats["endpoints"].as_array().into_iter().flatten().find(|e| e["subject"] == verb).cloned().unwrap_or_default();
    println!(
        "{label}: host time per request, receipt to reply sent ($SRV.STATS average, all requests so far): {:.0} µs",
        endpoint["average_processing_time"].as_f64().unwrap_or(0.0) / 1000.0
    );
}

/// Waits until the guest's `transitions` calls stop for three seconds (at most `cap`): how
/// long that took, and the calls and their seconds meanwhile.
async fn recorder_done(metrics: &str, cap: Duration) -> (Duration, f64, f64) {
    let started = Instant::now();
    let calls = async || guest_calls(metrics).await.get("transitions").copied().unwrap_or_default();
    let first = calls().await;
    let mut last = first;
    let mut still = Instant::now();
    while still.elapsed() < Duration::from_secs(3) && started.elapsed() < cap {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = calls().await;
        if now.0 != last.0 {
            (last, still) = (now, Instant::now());
        }
    }
    (started.elapsed() - still.elapsed(), last.0 - first.0, last.1 - first.1)
}

/// `BENCH_ANSWER`: the uncached needs query at `label`, quiet and then while `BENCH_WRITES` writes
/// a second rewrite the needs of alpha's other modules (`0..modules`, never the one asked), on a
/// connection of their own as alpha's user: each phase against the echoes of the same moment.
#[allow(clippy::too_many_arguments)]
async fn measure_uncached(label: &str, bus: &Bus, c: &Client, sized: &Sized, query: &[u8], modules: usize, metrics: &str, pid: u32, echo_pid: u32) {
    let per_second: u64 = std::env::var("BENCH_WRITES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    {
        // The host's own round trip without the guest: its `$SRV.PING`, answered by the serving
        // loop itself, against the echo in a process of its own.
        let ping = "$SRV.PING.mesh-provisioner";
        let _ = latencies(c, ping, b"", 300).await;
        let (host, verbs) = (tests::bench::cpu_time(pid), tests::bench::thread_cpu_time(pid, pid));
        let mut p = latencies(c, ping, b"", 3000).await;
        let (host, verbs) = ((tests::bench::cpu_time(pid) - host) / 3000, (tests::bench::thread_cpu_time(pid, pid) - verbs) / 3000);
        let other = tests::bench::cpu_time(echo_pid);
        let mut e = latencies(c, ECHO_PROCESS, query, 3000).await;
        let other = (tests::bench::cpu_time(echo_pid) - other) / 3000;
        let (p50, e50) = (pct(&mut p, 0.5), pct(&mut e, 0.5));
        println!(
            "{label}: the host's $SRV.PING p50 {:.0} µs = {:.2}× the echo in a process of its own ({:.0} µs); CPU a request: the host {:.1} µs (its verbs' thread {:.1} µs), the echo's process {:.1} µs",
            us(p50),
            p50.as_secs_f64() / e50.as_secs_f64(),
            us(e50),
            us(host),
            us(verbs),
            us(other)
        );
    }
    let calls = quiet_calls(metrics, pid).await;
    one_at_a_time(&format!("{label} quiet"), c, query, metrics, pid).await;
    // Its last scrape may have set off a read of every module's status (a second of guest calls
    // at 1M keys, on the followers' thread): quiet means after it.
    let _ = tests::bench::idle(pid, Duration::from_secs(120)).await;
    measure(&format!("{label} uncached quiet"), c, sized, "mesh-provisioner.provisioning", query).await;
    handle_calls(label, &calls, &guest_calls(metrics).await);
    let writer = bus.client("node-alpha").await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    // Alpha's other modules' needs, never the one asked.
    let subject = move |r: u64| {
        let module = match (r % modules as u64) as usize {
            420 => 421 % modules,
            m => m,
        };
        format!("$KV.{NEEDS}.alpha.m{module:06}.config.name{}", (r >> 32) % 9)
    };
    let task = tests::bench::writes(writer, per_second, stop.clone(), written.clone(), subject);
    let began = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rate = written.load(Ordering::Relaxed) as f64 / began.elapsed().as_secs_f64();
    let calls = guest_calls(metrics).await;
    // Under the writes the host is never idle: this gives a read the scrape set off 5 s at most.
    let _ = tests::bench::idle(pid, Duration::from_secs(5)).await;
    one_at_a_time(&format!("{label} {rate:.0} writes/s"), c, query, metrics, pid).await;
    let _ = tests::bench::idle(pid, Duration::from_secs(5)).await;
    measure(&format!("{label} uncached, {rate:.0} writes/s elsewhere"), c, sized, "mesh-provisioner.provisioning", query).await;
    handle_calls(label, &calls, &guest_calls(metrics).await);
    stop.store(true, Ordering::Relaxed);
    let _ = task.await;
    println!("{label}: {:.0} writes/s over the loaded phase", written.load(Ordering::Relaxed) as f64 / began.elapsed().as_secs_f64());
}

/// The guest's `handle` when asked one request at a time, as the p50 is measured (the mean the
/// loaded phases print is mostly the 32 requesters' calls, on caches they keep warm).
async fn one_at_a_time(label: &str, c: &Client, query: &[u8], metrics: &str, pid: u32) {
    let before = guest_calls(metrics).await;
    let (cpu, verbs) = (tests::bench::cpu_time(pid), tests::bench::thread_cpu_time(pid, pid));
    let mut times = latencies(c, "mesh-provisioner.provisioning", query, 2000).await;
    let (cpu, verbs) = ((tests::bench::cpu_time(pid) - cpu) / 2000, (tests::bench::thread_cpu_time(pid, pid) - verbs) / 2000);
    let after = guest_calls(metrics).await;
    print!(
        "{label}: one at a time p50 {:.0} µs, the host's CPU {:.1} µs a request (its verbs' thread {:.1} µs); ",
        us(pct(&mut times, 0.5)),
        us(cpu),
        us(verbs)
    );
    handle_calls(label, &before, &after);
}

/// The guest's calls so far, read once the host is idle: a scrape of `/metrics` refreshes the
/// status it reports in the background (at 1M keys, 100 000 modules read page by page), which
/// a measurement of the verb would otherwise share the thread with.
async fn quiet_calls(metrics: &str, pid: u32) -> std::collections::BTreeMap<String, (f64, f64)> {
    let _ = guest_calls(metrics).await;
    let _ = tests::bench::idle(pid, Duration::from_secs(120)).await;
    guest_calls(metrics).await
}

/// The guest's `handle` calls between two reads of the metrics: how many, and their mean (the
/// part of the host's time per request spent in the component).
fn handle_calls(label: &str, before: &std::collections::BTreeMap<String, (f64, f64)>, after: &std::collections::BTreeMap<String, (f64, f64)>) {
    let (n0, s0) = before.get("handle").copied().unwrap_or_default();
    let (n1, s1) = after.get("handle").copied().unwrap_or_default();
    if n1 > n0 {
        println!("{label}: the guest's handle meanwhile: {:.0} calls, {:.1} µs each", n1 - n0, (s1 - s0) / (n1 - n0) * 1e6);
    }
    // The state recorder's calls share the thread with the verb's.
    let (t0, u0) = before.get("transitions").copied().unwrap_or_default();
    let (t1, u1) = after.get("transitions").copied().unwrap_or_default();
    if t1 > t0 {
        println!(
            "{label}: the guest's transitions meanwhile: {:.0} calls, {:.1} ms in all, {:.0} µs each",
            t1 - t0,
            (u1 - u0) * 1e3,
            (u1 - u0) / (t1 - t0) * 1e6
        );
    }
}

/// Pages `{"what":"status","node":…}` through at most `modules` modules: the pages, the time
/// each took, and the discovery pings the vault saw meanwhile.
async fn status_pages(c: &Client, node: &str, modules: usize, pings: &Arc<AtomicU64>) -> (usize, Vec<Duration>, u64) {
    let before = pings.load(Ordering::Relaxed);
    let mut q = serde_json::json!({"what":"status","node":node,"limit":200});
    let (mut seen, mut times) = (0, Vec::new());
    while seen < modules {
        let t = Instant::now();
        let m = c.request("mesh-provisioner.provisioning", q.to_string().into()).await.expect("status answers");
        times.push(t.elapsed());
        let v: serde_json::Value = serde_json::from_slice(&m.payload).expect("status is JSON");
        let n = v["entries"].as_array().map_or(0, Vec::len);
        assert!(n > 0, "an empty status page: {v}");
        seen += n;
        match v.get("next") {
            Some(next) => q["after"] = next.clone(),
            None => break,
        }
    }
    (seen, times, pings.load(Ordering::Relaxed) - before)
}

async fn measure_status(label: &str, c: &Client, sized: &Sized, pings: &Arc<AtomicU64>, modules: usize) {
    let one = br#"{"what":"status","node":"alpha","module":"m000420"}"#;
    measure(&format!("{label} status of one module (10 needs)"), c, sized, "mesh-provisioner.provisioning", one).await;
    let mut echo = latencies(c, ECHO, b"{}", 500).await;
    let e50 = pct(&mut echo, 0.5);
    let started = Instant::now();
    let (seen, mut times, sent) = status_pages(c, "alpha", modules, pings).await;
    let total = started.elapsed();
    println!(
        "{label}: status of {seen} modules of node alpha, {} pages of ≤ 200: {:.0} ms in all, a page p50 {:.1} ms ({:.0}× echo), {:.0} µs a module; {sent} discovery ping(s) sent",
        times.len(), total.as_secs_f64() * 1e3, pct(&mut times, 0.5).as_secs_f64() * 1e3,
        pct(&mut times, 0.5).as_secs_f64() / e50.as_secs_f64(), total.as_secs_f64() * 1e6 / seen.max(1) as f64
    );
}

/// The plan inputs of alpha/m000420, each written by the user that owns its bucket.
async fn plan_inputs(bus: &Bus) {
    let composed = tests::sample_composition();
    bus.create_plan_buckets().await;
    bus.put("node-alpha", "composed-alpha", "m000420.b1", composed.as_bytes()).await;
    bus.put("node-alpha", "composed-alpha", "m000420.b2", composed.as_bytes()).await;
    bus.put("mesh-controller", "mesh-controller_assignments", "alpha.m000420", br#"{"want":"b1"}"#).await;
    bus.put("mesh-indexer", "mesh-indexer_builds", "m000420", br#"{"newest":"b2"}"#).await;
}

/// Waits (bounded) until the plan of alpha/m000420 is planned: buckets created after the host
/// started are found within its poll for them (a second).
async fn wait_planned(c: &Client) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let (_, plan) = tests::nats::ask_verb(c, "mesh-provisioner.plan", br#"{"node":"alpha","module":"m000420"}"#).await.expect("the plan verb answers");
        if plan["state"] == "planned" {
            return plan;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never planned: {plan}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes `n` holders of `bound:postgres.<provision>` on node alpha (needs and values), pipelined.
async fn holders(bus: &Bus, provision: &str, n: usize) {
    let (node, provider) = (bus.js("node-alpha").await, bus.js("provider-postgres").await);
    let writes = (0..n).flat_map(|i| {
        let need = (node.clone(), format!("$KV.{NEEDS}.alpha.h{i:05}.bound.postgres=2E{provision}"));
        let value = (provider.clone(), format!("$KV.postgres_bound.alpha.h{i:05}.{provision}"));
        [need, value]
    });
    let mut acks = futures::stream::iter(writes.map(|(js, subject)| async move {
        let ack = js.publish(subject, VALUE.into()).await.expect("publish");
        ack.await.expect("ack");
    }))
    .buffer_unordered(256);
    while acks.next().await.is_some() {}
}

/// `holders` of a value held `n` times: its first page against the echoes; then the time from
/// the provider rewriting all `n` values (pipelined) to the last notice heard by the node.
async fn measure_holders(label: &str, bus: &Bus, c: &Client, sized: &Sized, provision: &str, n: usize, metrics: &str) {
    let query = format!(r#"{{"what":"holders","kind":"bound","name":"postgres.{provision}"}}"#);
    let start = Instant::now();
    loop {
        let m = c.request("mesh-provisioner.provisioning", query.clone().into()).await.expect("holders answers");
        let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap_or_default();
        if v["count"].as_u64().unwrap_or(0) >= (n as u64).min(1000) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "holders never listed {n}: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (lag, before, stale) = (
        metric(metrics, "mesh_provisioner_mirror_lag_messages{bucket=\"mesh-provisioner_needs\"}").await,
        cache_lookups(metrics).await,
        stale_reasons(metrics).await,
    );
    measure(&format!("{label} holders of a value held {n} times (first page)"), c, sized, "mesh-provisioner.provisioning", query.as_bytes()).await;
    let after = cache_lookups(metrics).await;
    println!(
        "    (the needs mirror {lag} messages behind its bucket as the measurement began; the reply cache meanwhile: {} hits, {} misses; not served from it because: {})",
        after.0 - before.0, after.1 - before.1, stale_between(&stale, &stale_reasons(metrics).await)
    );
    if lag > 0.0 {
        // Measured again once the mirror has applied every write: a reply cached over a bucket
        // holds only while the bucket does not change.
        let t = Instant::now();
        while metric(metrics, "mesh_provisioner_mirror_lag_messages{bucket=\"mesh-provisioner_needs\"}").await > 0.0 && t.elapsed() < Duration::from_secs(120) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let before = cache_lookups(metrics).await;
        measure(
            &format!("{label} holders of a value held {n} times (first page), the mirror settled"),
            c,
            sized,
            "mesh-provisioner.provisioning",
            query.as_bytes(),
        )
        .await;
        let after = cache_lookups(metrics).await;
        println!(
            "    (settled after {:.1} s; the reply cache meanwhile: {} hits, {} misses)",
            t.elapsed().as_secs_f64(),
            after.0 - before.0,
            after.1 - before.1
        );
    }
    let mut notices = c.subscribe("mesh-provisioner.notice.alpha").await.expect("subscribe");
    c.flush().await.expect("flush");
    let provider = bus.js("provider-postgres").await;
    // Meanwhile a requester asks the narrowed needs query: the burst must not block the verb.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let during = {
        let (c, stop) = (c.clone(), stop.clone());
        tokio::spawn(async move {
            let mut times = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                if c.request("mesh-provisioner.provisioning", br#"{"what":"needs","node":"alpha","module":"m000420"}"#.as_slice().into()).await.is_ok() {
                    times.push(t.elapsed());
                }
            }
            times
        })
    };
    let t = Instant::now();
    let mut acks =
        futures::stream::iter(
            (0..n).map(|i| {
                let provider = provider.clone();
                async move {
                    provider.publish(format!("$KV.postgres_bound.alpha.h{i:05}.{provision}"), "rotated".into()).await.expect("publish").await.expect("ack")
                }
            }),
        )
        .buffer_unordered(256);
    while acks.next().await.is_some() {}
    let written = t.elapsed();
    let mut heard = 0;
    while heard < n {
        match tokio::time::timeout(Duration::from_secs(30), notices.next()).await {
            Ok(Some(_)) => heard += 1,
            _ => break,
        }
    }
    let last = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut times = during.await.unwrap_or_default();
    let (p50, p99) = if times.is_empty() { (Duration::ZERO, Duration::ZERO) } else { (pct(&mut times, 0.5), pct(&mut times, 0.99)) };
    println!(
        "{label}: {n} values rewritten in {:.0} ms; the last of {heard} notices heard {:.0} ms after the first write; meanwhile the needs query p50 {:.0} µs p99 {:.0} µs ({} asked)",
        written.as_secs_f64() * 1e3, last.as_secs_f64() * 1e3, us(p50), us(p99), times.len()
    );
}

/// At 10k, beside the plain query: read-your-writes (by the node's share, and consistent), a
/// node's write then its read, and when `full` status, holders and the plan verb.
async fn read_your_writes_and_more(bus: &Bus, c: &Client, sized: &Sized, query: &[u8], full: bool, pings: &Arc<AtomicU64>, metrics: &str) {
    // Read-your-writes, the same query: naming the node's share at its last acknowledged write
    // (reached at once: two direct gets a shared bucket, then the answer), and consistent (the
    // bus's revision of the bucket read, one STREAM.INFO shared by the requests meanwhile).
    let seq = bus.put("node-alpha", NEEDS, "alpha.m000420.config.fresh", b"{}").await;
    let fresh = format!(r#"{{"what":"needs","node":"alpha","module":"m000420","min_revision":{{"NODE_alpha":{seq}}}}}"#);
    measure("10k min_revision", c, sized, "mesh-provisioner.provisioning", fresh.as_bytes()).await;
    let consistent = br#"{"what":"needs","node":"alpha","module":"m000420","consistent":true}"#;
    measure("10k consistent", c, sized, "mesh-provisioner.provisioning", consistent).await;
    measure("10k plain again", c, sized, "mesh-provisioner.provisioning", query).await;
    write_then_read(bus, c).await;
    if full {
        measure_status("10k", c, sized, pings, 1000).await;
        bus.make_bucket("postgres_bound").await;
        holders(bus, "small", 1000).await;
        holders(bus, "db", 10_000).await;
        measure_holders("10k", bus, c, sized, "small", 1000, metrics).await;
        measure_holders("10k", bus, c, sized, "db", 10_000, metrics).await;

        // One module's plan: wanted at b1, the indexer's newest b2, both published with 10 needs.
        plan_inputs(bus).await;
        let plan_query = br#"{"node":"alpha","module":"m000420"}"#;
        let plan = wait_planned(c).await;
        println!("plan of one module: 2 builds, 10 needs each ({} bytes)", plan.to_string().len());
        measure("plan", c, sized, "mesh-provisioner.plan", plan_query).await;
    }
}

#[tokio::main]
async fn main() {
    let large: usize = std::env::var("BENCH_KEYS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    tests::nats::prefer_release_binary();
    // Each node's share made large enough for its third of the bench's keys: every shared
    // bucket keeps room for every node's whole share, so a share of all the keys would ask the
    // account for three times the room at each of the three buckets (past its 8 GB at 1M).
    let keys = (large as i64) * 6 / 5 / 3 + 50_000;
    let bus = Bus::start_with(
        mesh_provisioner::nats::bucket::BucketLimits::default(),
        mesh_provisioner::nats::bucket::Share { max_bytes: keys * 256, max_keys: keys },
    )
    .await;
    let answer_only = std::env::var_os("BENCH_ANSWER").is_some();
    let args: &[&str] = if answer_only { &["--http", "127.0.0.1:0", "--no-reply-cache"] } else { &["--http", "127.0.0.1:0"] };
    let host = Host::start(&bus, args).await;
    let metrics = format!("{}/metrics", host.http_url().await);
    let pid = host.child.id().expect("host pid");
    let c = bus.client("node-alpha").await;
    // The echoes have a connection of their own, as the host does: its serving user, so an
    // echo asked by the node crosses the same import as the verb. The vault's discovery answer
    // is the vault's own (imported into the provisioner's account).
    let echoes = bus.client("mesh-provisioner-service").await;
    let vault = bus.client("mesh-vault").await;
    let sized: Sized = Arc::new(std::sync::Mutex::new(bytes::Bytes::new()));
    let pings = Arc::new(AtomicU64::new(0));
    for subject in [ECHO, SIZED, "$SRV.PING.mesh-vault"] {
        let responder = if subject == "$SRV.PING.mesh-vault" { &vault } else { &echoes };
        let mut sub = responder.subscribe(subject).await.expect("subscribe");
        let (responder, sized, pings) = (responder.clone(), sized.clone(), pings.clone());
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let Some(r) = m.reply else { continue };
                let body = match subject {
                    ECHO => m.payload,
                    SIZED => sized.lock().unwrap().clone(),
                    _ => {
                        pings.fetch_add(1, Ordering::Relaxed);
                        r#"{"name":"mesh-vault","id":"bench-vault"}"#.into()
                    }
                };
                let _ = responder.publish(r, body).await;
            }
        });
    }
    echoes.flush().await.expect("flush");
    vault.flush().await.expect("flush");
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent()?.parent().map(|d| d.join("echo")))
        .filter(|p| p.exists())
        .expect("the echo binary (cargo bench builds it)");
    ECHO_START.set((bin, bus.url().to_string(), bus.password("mesh-provisioner-service"))).expect("set once");
    let echo_child = echo_process(ECHO_PROCESS, None).await;
    let echo_pid = echo_child.id().unwrap_or_default();
    let query = br#"{"what":"needs","node":"alpha","module":"m000420"}"#;

    // The mesh's default byte limit (256 MiB a bucket, discard new) holds about 1.9M of these
    // keys: the needs bucket is given room for the run, as an operator would for a mesh this size.
    {
        let js = bus.js(tests::nats::OPERATOR).await;
        match js.get_stream(format!("KV_{NEEDS}")).await {
            Ok(mut stream) => {
                let mut config = stream.info().await.expect("stream info").config.clone();
                config.max_bytes = config.max_bytes.max(large as i64 * 256);
                js.update_stream(config).await.expect("room for the run");
            }
            Err(e) => println!("the needs bucket keeps its limits ({e})"),
        }
    }
    let rss0 = tests::rss_kib(pid);
    let mut raw = fill(&bus, "alpha", 0, 1000).await;
    wait_for(&c, "alpha", 999).await;
    println!("needs at 10 000 keys (host RSS {} MiB)", tests::rss_kib(pid) / 1024);
    // BENCH_QUICK: the needs query, its narrowings and the cold start only.
    let full = std::env::var_os("BENCH_QUICK").is_none();
    if answer_only {
        measure_uncached("10k", &bus, &c, &sized, query, 1000, &metrics, pid, echo_pid).await;
    } else {
        measure("10k", &c, &sized, "mesh-provisioner.provisioning", query).await;
        read_your_writes_and_more(&bus, &c, &sized, query, full, &pings, &metrics).await;
    }
    let per_node = large / 10 / 3;
    let t = Instant::now();
    raw += fill(&bus, "alpha", 1000, per_node).await;
    raw += fill(&bus, "beta", 0, per_node).await;
    raw += fill(&bus, "gamma", 0, per_node + (large / 10) % 3).await;
    wait_for(&c, "gamma", per_node + (large / 10) % 3 - 1).await;
    let keys = (per_node * 2 + per_node + (large / 10) % 3) * 10;
    println!("needs at {keys} keys (written and mirrored in {:.1} s)", t.elapsed().as_secs_f64());
    let label = format!("{}k", keys / 1000);
    if answer_only {
        // The mirror packs what a fill added on a thread of its own: measured once the host is
        // idle again, not while it packs.
        let waited = tests::bench::idle(pid, Duration::from_secs(120)).await;
        println!("the host idle again {:.1} s after the fill", waited.as_secs_f64());
        // The state recorder finds the state of every module the fill wrote, paced at a tenth
        // of the thread (the idle check above passes under it): "quiet" is once it is done.
        let (took, calls, spent) = recorder_done(&metrics, Duration::from_secs(300)).await;
        println!("the state recorder done with the fill {:.1} s later: {calls:.0} transitions calls, {spent:.1} s in them", took.as_secs_f64());
        measure_uncached(&label, &bus, &c, &sized, query, per_node.max(1000), &metrics, pid, echo_pid).await;
        return;
    }
    measure(&label, &c, &sized, "mesh-provisioner.provisioning", query).await;
    if full {
        measure_status(&label, &c, &sized, &pings, 10_000.min(per_node)).await;
    }
    let rss1 = tests::rss_kib(pid);
    // The last-token index is built by the first holders query after a restart of the mirror;
    // here it was built at 10k and kept up to date: what it costs shows in the RSS above.
    if full {
        measure_holders(&label, &bus, &c, &sized, "small", 1000, &metrics).await;
        measure_holders(&label, &bus, &c, &sized, "db", 10_000, &metrics).await;
    }
    // Narrowings that start with a wildcard: a module on every node (`*.m000420.>`), and one
    // kind everywhere (`*.*.secret.>`, its first page of 10).
    measure(&format!("{label} by module"), &c, &sized, "mesh-provisioner.provisioning", br#"{"what":"needs","module":"m000420"}"#).await;
    measure(&format!("{label} by kind"), &c, &sized, "mesh-provisioner.provisioning", br#"{"what":"needs","kind":"secret","limit":10}"#).await;
    // Those two built an index each (by module, by kind): the mirror with three.
    let rss2 = tests::rss_kib(pid);
    println!(
        "host RSS: {} MiB before filling, {} MiB with {keys} keys mirrored, {} MiB with the indexes by module and kind too; raw keys+values {} MiB; growth / raw = {:.2}× ({:.2}× with the indexes), total / raw = {:.2}×",
        rss0 / 1024, rss1 / 1024, rss2 / 1024, raw >> 20,
        (rss1 - rss0) as f64 * 1024.0 / raw as f64,
        (rss2 - rss0) as f64 * 1024.0 / raw as f64,
        rss2 as f64 * 1024.0 / raw as f64
    );
    // Stopped as an operator would (SIGTERM gives the seat up), so the cold start measures the
    // start, not a wait for an abandoned lease to run out.
    let mut host = host;
    host.signal("TERM");
    let _ = host.child.wait().await;
    cold_start(&bus, &c, query, keys, raw, host).await;
}

/// Reads the needs bucket the way a mirror's replay does, with nothing else: an ordered consumer
/// over the last message of each key, until none is pending.
async fn plain_watch(js: &async_nats::jetstream::Context) -> (usize, Duration) {
    let kv = js.get_key_value(NEEDS).await.expect("needs");
    let start = Instant::now();
    let mut watch = kv.watch_with_history(">").await.expect("watch");
    let mut n = 0;
    while let Some(Ok(e)) = watch.next().await {
        n += 1;
        if e.delta == 0 {
            break;
        }
    }
    (n, start.elapsed())
}

/// The floor of a start: a server without accounts or permissions, holding a needs bucket of
/// the same keys and values (written here by one pipelined client), read by a plain watch. The
/// server runs until the starts are measured, so that the floor and the host's replay can be
/// measured turn about (a start's time moves by ±15% between runs on a 2-core machine).
struct Floor {
    server: tests::nats::RawServer,
    js: async_nats::jetstream::Context,
}

impl Floor {
    async fn start(keys: usize) -> Floor {
        const OPEN: &str = "listen: \"127.0.0.1:{{PORT}}\"\njetstream { store_dir: \"{{DIR}}/js\" }\n";
        let server = tests::nats::RawServer::start(OPEN).await;
        let client = async_nats::connect(format!("nats://127.0.0.1:{}", server.port)).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        js.create_key_value(async_nats::jetstream::kv::Config { bucket: NEEDS.into(), history: 1, ..Default::default() }).await.expect("bucket");
        let per_node = keys / 10 / 3;
        let names = ["alpha", "beta", "gamma"].into_iter().flat_map(|node| {
            (0..per_node + 1).flat_map(move |m| {
                (0..10).map(move |k| if k == 9 { format!("{node}.m{m:06}.secret.name{k}") } else { format!("{node}.m{m:06}.config.name{k}") })
            })
        });
        let mut acks = futures::stream::iter(names.take(keys).map(|key| {
            let js = js.clone();
            async move { js.publish(format!("$KV.{NEEDS}.{key}"), VALUE.into()).await.expect("publish").await.expect("ack") }
        }))
        .buffer_unordered(512);
        while acks.next().await.is_some() {}
        drop(acks);
        Floor { server, js }
    }

    /// A plain watch of the bucket: how many keys, and how long.
    async fn watch(&self) -> (usize, Duration) {
        plain_watch(&self.js).await
    }

    /// The same watch with everything on one thread.
    fn watch_on_one_thread(&self) -> Duration {
        plain_watch_on_one_thread(format!("nats://127.0.0.1:{}", self.server.port))
    }
}

/// The same plain watch with everything on one thread, as the host runs: the connection's
/// reader and the watch share it (in the bench's own runtime they run on two).
fn plain_watch_on_one_thread(url: String) -> Duration {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async move {
            let client = async_nats::connect(url).await.expect("connect");
            plain_watch(&async_nats::jetstream::new(client)).await.1
        })
    })
    .join()
    .expect("the one-thread watch")
}

/// `BENCH_WATCHES`: the ways to read the floor's bucket whole, three rounds turn about — an
/// ordered consumer filtered on the bucket's subjects (each key's last message, or every
/// message), one without a filter (what the host's replay of a one-message-a-key bucket uses),
/// and async-nats's KV watch — each until the last message.
async fn compare_watches(floor: &Floor) {
    use async_nats::jetstream::consumer::{push::OrderedConfig, DeliverPolicy};
    floor.watch().await;
    for round in 0..3 {
        for (name, filter, policy) in [
            ("last per subject, filtered", format!("$KV.{NEEDS}.>"), DeliverPolicy::LastPerSubject),
            ("all, filtered", format!("$KV.{NEEDS}.>"), DeliverPolicy::All),
            ("all, no filter", String::new(), DeliverPolicy::All),
        ] {
            let stream = floor.js.get_stream(format!("KV_{NEEDS}")).await.expect("stream");
            let start = Instant::now();
            let config = OrderedConfig { deliver_subject: floor.js.client().new_inbox(), filter_subject: filter, deliver_policy: policy, ..Default::default() };
            let mut messages = stream.create_consumer(config).await.expect("consumer").messages().await.expect("messages");
            let mut n = 0;
            while let Some(Ok(m)) = messages.next().await {
                n += 1;
                if m.info().expect("a stream's message").pending == 0 {
                    break;
                }
            }
            println!("round {round}, {name}: {n} messages in {:.3} s", start.elapsed().as_secs_f64());
        }
        let (n, took) = floor.watch().await;
        println!("round {round}, the KV watch: {n} entries in {:.3} s", took.as_secs_f64());
    }
}

/// From `serve` to the first answer to `query` (an answer is current: a mirror answers only
/// once its replay, or its resumed watch, has reached the stream's last revision).
async fn first_answer(bus: &Bus, c: &Client, query: &[u8], state: tempfile::TempDir, extra: &[&str]) -> (Host, Duration) {
    let start = Instant::now();
    let mut args = vec!["--seat-ttl", "3s"];
    args.extend_from_slice(extra);
    let host = Host::spawn(bus.url(), bus, state, &tests::component_path(), &args);
    answered(c, query).await;
    (host, start.elapsed())
}

/// Asks until an answer (not an error) comes. Short request timeouts: a request that went to a
/// killed holder is lost, and waiting the client's default 10 s for it would be measured.
async fn answered(c: &Client, query: &[u8]) {
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < Duration::from_secs(600), "no answer within 10 minutes");
        let req = async_nats::Request::new().payload(query.to_vec().into()).timeout(Some(Duration::from_millis(200)));
        if let Ok(m) = c.send_request("mesh-provisioner.provisioning", req).await {
            if m.headers.is_none() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The last "mirror in sync" line of the needs bucket in a host's log: how long its replay read
/// and packed.
fn in_sync_line(host: &Host) -> Option<String> {
    host.log_text().lines().rfind(|l| l.contains(NEEDS) && l.contains("mirror in sync")).map(str::to_string)
}

/// The snapshot-write line of a host's log: how long writing the snapshots at shutdown took.
fn snapshots_written(log: &str) -> String {
    log.lines().rfind(|l| l.contains("mirror snapshots written")).and_then(|l| l.split("elapsed=").nth(1)).unwrap_or("?").to_string()
}

/// Host RSS once a start's packing of its mirrors (on a thread of its own) has had time to land
/// (a few seconds at ten million keys).
async fn settled_rss(host: &Host) -> u64 {
    tokio::time::sleep(Duration::from_secs(10)).await;
    tests::rss_kib(host.child.id().expect("host pid"))
}

/// Starts at the large size: from `serve` to the first answer, from the snapshot written at
/// the last shutdown and by a full replay, against a plain watch of the same bucket on a
/// server without permissions (and on the example config, as the provisioner's user); then a
/// standby's takeover with warm mirrors.
async fn cold_start(bus: &Bus, c: &Client, query: &[u8], keys: usize, raw: u64, mut stopped: Host) {
    let wrote = snapshots_written(&stopped.log_text());
    let state = std::mem::replace(&mut stopped.state, tempfile::tempdir().unwrap());
    let snapshot = std::fs::metadata(state.path().join("mirrors").join(format!("{NEEDS}.mirror"))).map(|m| m.len()).unwrap_or(0);
    let floor = Floor::start(keys).await;
    if std::env::var_os("BENCH_WATCHES").is_some() {
        compare_watches(&floor).await;
        floor.server.stop().await;
        return;
    }
    // The first read after the fill is slower (the server is still settling its writes).
    floor.watch().await;
    let (n_open, open) = floor.watch().await;
    let one_thread = floor.watch_on_one_thread();
    let (n, example) = plain_watch(&bus.js("mesh-provisioner").await).await;
    let (host, resumed) = first_answer(bus, c, query, state, &[]).await;
    let resumed_rss = settled_rss(&host).await;
    let resumed_peak = tests::peak_rss_kib(host.child.id().expect("host pid"));
    let resumed_log = host.log_text();
    host.signal("TERM");
    let mut host = host;
    let _ = host.child.wait().await;
    let state = std::mem::replace(&mut host.state, tempfile::tempdir().unwrap());
    let (host, full) = first_answer(bus, c, query, state, &["--no-snapshots"]).await;
    let full_rss = settled_rss(&host).await;
    let full_peak = tests::peak_rss_kib(host.child.id().expect("host pid"));
    let replayed =
        |host: &Host| in_sync_line(host).and_then(|l| l.split("replayed=").nth(1).map(|t| t.split(' ').next().unwrap_or(t).to_string())).unwrap_or_default();
    // More full replays, each right after a floor of its own: the ratio of each pair.
    let mut host = host;
    let mut pairs = vec![(full, open, replayed(&host))];
    for _ in 1..std::env::var("BENCH_STARTS").ok().and_then(|v| v.parse().ok()).unwrap_or(3usize) {
        host.signal("TERM");
        let _ = host.child.wait().await;
        let state = std::mem::replace(&mut host.state, tempfile::tempdir().unwrap());
        let (_, open) = floor.watch().await;
        let (again, full) = first_answer(bus, c, query, state, &["--no-snapshots"]).await;
        pairs.push((full, open, replayed(&again)));
        host = again;
    }
    floor.server.stop().await;
    let secs = |d: Duration| d.as_secs_f64();
    println!(
        "start at {keys} keys, floor: a plain watch reads the bucket ({n_open} keys) on a server without permissions in {:.2} s (on the example config as the provisioner's user: {:.2} s, {n} keys, {:.2}×)",
        secs(open), secs(example), secs(example) / secs(open)
    );
    println!(
        "  from its snapshot ({} MiB, written at shutdown in {wrote}): serve to the first answer {:.2} s = {:.2}× the floor",
        snapshot >> 20,
        secs(resumed),
        secs(resumed) / secs(open)
    );
    if let Some(line) = resumed_log.lines().find(|l| l.contains("loaded from its snapshot") && l.contains(NEEDS)) {
        println!("    ({})", line.split("INFO ").nth(1).unwrap_or(line));
    }
    println!("  full replay (--no-snapshots): serve to the first answer {:.2} s = {:.2}× the floor", secs(full), secs(full) / secs(open));
    let mut ratios: Vec<f64> = pairs.iter().map(|(full, open, _)| secs(*full) / secs(*open)).collect();
    let each: Vec<String> = pairs
        .iter()
        .map(|(full, open, replayed)| format!("{:.2} s / {:.2} s = {:.2}× (replayed {replayed})", secs(*full), secs(*open), secs(*full) / secs(*open)))
        .collect();
    ratios.sort_by(f64::total_cmp);
    println!("    ({} full replays, each against a floor measured just before it: {}; median {:.2}×)", pairs.len(), each.join(", "), ratios[ratios.len() / 2]);
    // Where the replay's time went: reading the bucket, then packing what it read.
    if let Some(line) = in_sync_line(&host) {
        println!("    ({})", line.split("INFO ").nth(1).unwrap_or(&line));
    }
    println!(
        "    (the same plain watch on one thread, as the host runs: {:.2} s = {:.2}× the floor; the full replay = {:.2}× that)",
        secs(one_thread),
        secs(one_thread) / secs(open),
        secs(full) / secs(one_thread)
    );
    println!(
        "  host RSS 10 s after the first answer: {} MiB from the snapshot, {} MiB after a full replay ({:.2}× / {:.2}× the raw {} MiB)",
        resumed_rss / 1024,
        full_rss / 1024,
        resumed_rss as f64 * 1024.0 / raw as f64,
        full_rss as f64 * 1024.0 / raw as f64,
        raw >> 20
    );
    println!(
        "  host peak RSS (VmHWM) over each start: {} MiB from the snapshot, {} MiB by a full replay ({:.2}× / {:.2}× the raw)",
        resumed_peak / 1024,
        full_peak / 1024,
        resumed_peak as f64 * 1024.0 / raw as f64,
        full_peak as f64 * 1024.0 / raw as f64
    );
    let mut standby = Host::spawn(bus.url(), bus, tempfile::tempdir().unwrap(), &tests::component_path(), &["--seat-ttl", "3s", "--http", "127.0.0.1:0"]);
    let warm = Instant::now();
    let ready = format!("{}/readyz", standby.http_url().await);
    // Ready: the registry and node buckets' mirrors in sync (a standby answers 200 too).
    while tests::browser::get(&ready).await.0 != 200 {
        assert!(warm.elapsed() < Duration::from_secs(600), "the standby never warmed");
        if let Ok(Some(s)) = standby.child.try_wait() {
            panic!("the standby exited: {s}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("a standby warmed its mirrors of {keys} keys in {:.2} s", warm.elapsed().as_secs_f64());
    let killed = Instant::now();
    host.signal("KILL");
    answered(c, query).await;
    println!("takeover with warm mirrors (holder killed, seat TTL 3 s): the standby answered {:.2} s after the kill", killed.elapsed().as_secs_f64());
    let _ = host.stop().await;
    standby.stop().await;
}
