//! Overload end to end: 256 concurrent requesters against the real host (a bounded backlog of
//! 8 requests in flight) on a real `nats-server`. Requests past the backlog get a fast `503`
//! with code `overloaded`, counted in `$SRV.STATS`; the others are answered; the seat is held
//! throughout; and once the flood stops the next request is answered. `OVERLOAD_SECS` sets the
//! flood's length (8 s here; the note's run: 60). How fast a request is shed, how long the next
//! one takes and the memory used are printed, not asserted: speed is the benchmarks' to judge.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::nats::{ask_within, Bus, Host};

#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    overloaded: AtomicU64,
    other: AtomicU64,
}

#[tokio::test]
async fn a_flood_is_shed_fast_and_the_server_recovers() {
    let secs: u64 = std::env::var("OVERLOAD_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let bus = Bus::start().await;
    let host = Host::start(&bus, &["--max-in-flight", "8", "--instance", "flooded", "--seat-ttl", "3s"]).await;
    let pid = host.pid();
    for i in 0..50 {
        bus.put("node-alpha", "mesh-provisioner_needs", &format!("alpha.m{i:02}.config.url"), b"{}").await;
    }
    let before = tests::rss_kib(pid) / 1024;
    assert_eq!(bus.seat_holder().await.as_deref(), Some("flooded"));

    let (tally, stop) = (Arc::new(Tally::default()), Arc::new(AtomicBool::new(false)));
    let mut tasks = Vec::new();
    for c in 0..4 {
        let client = bus.client("node-alpha").await;
        for _ in 0..64 {
            let (client, tally, stop) = (client.clone(), tally.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let body = if c % 2 == 0 { br#"{"what":"status","node":"alpha"}"#.as_slice() } else { br#"{"what":"needs","node":"alpha"}"# };
                    match ask_within(&client, body, Duration::from_secs(5)).await {
                        Ok((None, _)) => tally.answered.fetch_add(1, Ordering::Relaxed),
                        Ok((Some(code), v)) if code == "503" && v["error"]["code"] == "overloaded" => tally.overloaded.fetch_add(1, Ordering::Relaxed),
                        _ => tally.other.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
    }
    let (start, mut peak, mut seat_kept) = (Instant::now(), before, true);
    while start.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak = peak.max(tests::rss_kib(pid) / 1024);
        seat_kept &= bus.seat_holder().await.as_deref() == Some("flooded");
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let (answered, overloaded, other) = (tally.answered.load(Ordering::Relaxed), tally.overloaded.load(Ordering::Relaxed), tally.other.load(Ordering::Relaxed));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = tests::rss_kib(pid) / 1024;
    let client = bus.client("node-alpha").await;
    let t = Instant::now();
    let next = ask_within(&client, br#"{"what":"needs","node":"alpha","module":"m07"}"#, Duration::from_secs(10)).await;
    let next_took = t.elapsed();
    let stats = client.request("$SRV.STATS.mesh-provisioner", "".into()).await.expect("STATS");
    let stats: Value = serde_json::from_slice(&stats.payload).unwrap();
    let shed_counted: u64 = stats["endpoints"].as_array().unwrap().iter().map(|e| e["data"]["overloaded"].as_u64().unwrap_or(0)).sum();
    println!(
        "flood of {secs} s, 256 requesters: {answered} answered, {overloaded} shed as overloaded, {other} other; RSS {before} MiB before, peak {peak} MiB, {after} MiB after; the next request took {next_took:?}; seat held throughout: {seat_kept}"
    );

    assert!(answered > 0 && overloaded > 0, "answered {answered}, overloaded {overloaded}");
    assert_eq!(other, 0, "requests neither answered nor shed");
    assert_eq!(shed_counted, overloaded, "$SRV.STATS counts every shed request: {stats}");
    assert!(seat_kept, "the seat changed hands during the flood:\n{}", host.log_text());
    assert!(!host.log_text().contains("lost the seat"), "the renewals starved:\n{}", host.log_text());
    let (code, v) = next.expect("the next request after the flood is answered");
    assert_eq!(code, None, "{v}");
    assert_eq!(v["entries"].as_array().map(Vec::len), Some(1), "{v}");
}
