//! What the benchmarks share: percentiles, microseconds, and request round trips one after
//! another or from many requesters at once. Figures are for printing as ratios to a floor
//! measured in the same run; nothing here asserts a time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::Client;

/// Answers every request on `subject` with its own body, as `client`: a bare NATS echo, the
/// floor a verb's round trip is measured against. Subscribed (and flushed) before it returns.
pub async fn echo(client: &Client, subject: &str) {
    use futures::StreamExt;
    let mut requests = client.subscribe(subject.to_string()).await.expect("the echo subscribes");
    client.flush().await.expect("flush");
    let responder = client.clone();
    tokio::spawn(async move {
        while let Some(m) = requests.next().await {
            if let Some(r) = m.reply {
                let _ = responder.publish(r, m.payload).await;
            }
        }
    });
}

/// The `p` quantile (0–1) of `v` (sorted here).
pub fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `n` round trips of `body` on `subject`, one after another.
pub async fn latencies(c: &Client, subject: &str, body: &[u8], n: usize) -> Vec<Duration> {
    latencies_interleaved(c, &[subject], body, n).await.pop().unwrap_or_default()
}

/// `n` rounds of one round trip on each of `subjects`, in turn (each round starting one further
/// along): each subject's times, taken at the same moments as the others', so a machine that
/// slows down for a while slows each of them alike rather than whichever ran then.
pub async fn latencies_interleaved(c: &Client, subjects: &[&str], body: &[u8], n: usize) -> Vec<Vec<Duration>> {
    let mut out = vec![Vec::with_capacity(n); subjects.len()];
    for round in 0..n {
        for i in 0..subjects.len() {
            let at = (round + i) % subjects.len();
            let t = Instant::now();
            let m = c.request(subjects[at].to_string(), body.to_vec().into()).await.expect("reply");
            out[at].push(t.elapsed());
            std::hint::black_box(m);
        }
    }
    out
}

/// Requests a second answered on each of `subjects` by `tasks` requesters asking `body`, in
/// turns of `turn` until each had `for_`: like [`latencies_interleaved`], each figure from the
/// same stretch of the machine's time as the others.
pub async fn throughput_interleaved(c: &Client, subjects: &[&str], body: &[u8], tasks: usize, for_: Duration, turn: Duration) -> Vec<f64> {
    let bodies = vec![body.to_vec(); tasks];
    let (mut answered, mut spent) = (vec![0usize; subjects.len()], vec![Duration::ZERO; subjects.len()]);
    let turns = (for_.as_secs_f64() / turn.as_secs_f64()).ceil().max(1.0) as usize;
    for round in 0..turns {
        for i in 0..subjects.len() {
            let at = (round + i) % subjects.len();
            let t = Instant::now();
            let (_, times) = requesters(c, subjects[at], &bodies, turn).await;
            spent[at] += t.elapsed();
            answered[at] += times.len();
        }
    }
    answered.iter().zip(&spent).map(|(n, d)| *n as f64 / d.as_secs_f64()).collect()
}

/// Requests a second answered on `subject` by `tasks` requesters asking `body` for `for_`.
pub async fn throughput(c: &Client, subject: &str, body: &[u8], tasks: usize, for_: Duration) -> f64 {
    let bodies = vec![body.to_vec(); tasks];
    requesters(c, subject, &bodies, for_).await.0
}

/// One requester a body, each asking its own on `subject` for `for_`, one request at a time:
/// requests a second answered, and every answered request's round trip.
pub async fn requesters(c: &Client, subject: &str, bodies: &[Vec<u8>], for_: Duration) -> (f64, Vec<Duration>) {
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = bodies
        .iter()
        .map(|body| {
            let (c, count, subject, body) = (c.clone(), count.clone(), subject.to_string(), body.clone());
            tokio::spawn(async move {
                let mut times = Vec::new();
                while start.elapsed() < for_ {
                    let t = Instant::now();
                    if c.request(subject.clone(), body.clone().into()).await.is_ok() {
                        times.push(t.elapsed());
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
                times
            })
        })
        .collect();
    let mut times = Vec::new();
    for h in handles {
        times.extend(h.await.unwrap_or_default());
    }
    (count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(), times)
}

/// One sample of the host's `/metrics` (0 when absent).
pub async fn metric(url: &str, sample: &str) -> f64 {
    let (_, _, text) = crate::browser::get(url).await;
    text.lines().find_map(|l| l.strip_prefix(sample).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
}

/// Why replies were not served from the reply cache so far, by reason (see the metric).
pub async fn stale_reasons(url: &str) -> std::collections::BTreeMap<String, f64> {
    let (_, _, text) = crate::browser::get(url).await;
    text.lines()
        .filter_map(|l| l.strip_prefix("mesh_provisioner_reply_cache_stale_total{read=\""))
        .filter_map(|l| l.split_once("\"} ").and_then(|(read, n)| Some((read.to_string(), n.trim().parse().ok()?))))
        .collect()
}

/// What changed between two samples of [`stale_reasons`].
pub fn stale_between(before: &std::collections::BTreeMap<String, f64>, after: &std::collections::BTreeMap<String, f64>) -> String {
    let moved: Vec<String> = after
        .iter()
        .filter_map(|(k, n)| {
            let d = n - before.get(k).unwrap_or(&0.0);
            (d > 0.0).then(|| format!("{k} {d}"))
        })
        .collect();
    if moved.is_empty() {
        "none".into()
    } else {
        moved.join(", ")
    }
}

/// The reply cache's hits and misses so far.
pub async fn cache_lookups(url: &str) -> (f64, f64) {
    (
        metric(url, "mesh_provisioner_reply_cache_lookups_total{outcome=\"hit\"}").await,
        metric(url, "mesh_provisioner_reply_cache_lookups_total{outcome=\"miss\"}").await,
    )
}

/// CPU seconds (user and system) process `pid` has used so far ([`cpu_time`]).
pub fn cpu_seconds(pid: u32) -> f64 {
    cpu_time(pid).as_secs_f64()
}

/// Time process `pid` has spent on a CPU so far, all its threads, to the nanosecond (the
/// scheduler's own count, `/proc/<pid>/task/*/schedstat`).
pub fn cpu_time(pid: u32) -> Duration {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    tasks.map(|t| on_cpu(&t.path())).sum()
}

/// Time one thread (`tid`) of process `pid` has spent on a CPU so far: the host's verbs run on
/// its main thread (`tid` = `pid`), its followers, HTTP side and epoch ticks on others.
pub fn thread_cpu_time(pid: u32, tid: u32) -> Duration {
    on_cpu(std::path::Path::new(&format!("/proc/{pid}/task/{tid}")))
}

/// The time on a CPU a task's `schedstat` says (its first field, nanoseconds); none when it is
/// gone.
fn on_cpu(task: &std::path::Path) -> Duration {
    let ns = std::fs::read_to_string(task.join("schedstat")).ok().and_then(|s| s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok())).unwrap_or(0);
    Duration::from_nanos(ns)
}

/// Waits until the process `pid` is idle again (under a tenth of a CPU over a second) or
/// `cap` passed; how long it waited.
pub async fn idle(pid: u32, cap: std::time::Duration) -> std::time::Duration {
    let settling = std::time::Instant::now();
    loop {
        let before = cpu_seconds(pid);
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        if cpu_seconds(pid) - before < 0.1 || settling.elapsed() > cap {
            return settling.elapsed();
        }
    }
}

/// Each guest export's calls so far, and the seconds spent in them.
pub async fn guest_calls(url: &str) -> std::collections::BTreeMap<String, (f64, f64)> {
    let (_, _, text) = crate::browser::get(url).await;
    let mut calls = std::collections::BTreeMap::new();
    for l in text.lines() {
        for (suffix, sum) in [("_count{export=\"", false), ("_sum{export=\"", true)] {
            let Some(rest) = l.strip_prefix("mesh_provisioner_guest_call_duration_seconds").and_then(|l| l.strip_prefix(suffix)) else { continue };
            let Some((export, n)) = rest.split_once("\"} ") else { continue };
            let n: f64 = n.trim().parse().unwrap_or(0.0);
            let e: &mut (f64, f64) = calls.entry(export.to_string()).or_default();
            if sum {
                e.1 = n
            } else {
                e.0 = n
            }
        }
    }
    calls
}

/// The next of a xorshift sequence from `state` (never 0), the same sequence every run.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A need's value as the benches write it, `n` making each write differ from the last.
pub fn need_value(n: u64) -> Vec<u8> {
    format!(r#"{{"placeholder":"${{config:name}}","part":"api","w":{n}}}"#).into_bytes()
}

/// Writes `per_second` needs a second through `c` until `stop`, each to the subject `subject`
/// picks from the next random number: a tick of 10 ms, the writes of a tick published at once
/// (no ack awaited: the bus's rate, not the writer's round trips), each counted in `written`.
pub fn writes(
    c: Client,
    per_second: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
    written: Arc<AtomicU64>,
    subject: impl Fn(u64) -> String + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let per_tick = (per_second / 100).max(1);
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut interval = tokio::time::interval(Duration::from_millis(10));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            interval.tick().await;
            for _ in 0..per_tick {
                n += 1;
                if c.publish(subject(xorshift(&mut rng)), need_value(n).into()).await.is_ok() {
                    written.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let _ = c.flush().await;
    })
}
