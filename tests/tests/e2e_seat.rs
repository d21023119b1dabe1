//! The seat held once for the mesh, and surviving bus faults: several real host binaries, real
//! `nats-server`s on loopback. Every wait is bounded; every process is stopped on drop.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::Client;
use futures::StreamExt;
use serde_json::Value;
use tests::nats::{ask_raw, ask_within, Bus, Cluster, Host};

const TTL: &str = "2s";
const TTL_S: f64 = 2.0;

fn spawn(bus: &Bus, name: &str, extra: &[&str]) -> Host {
    let mut args = vec!["--seat-ttl", TTL, "--instance", name];
    args.extend_from_slice(extra);
    Host::spawn(bus.url(), &bus.password("mesh-provisioner"), tempfile::tempdir().unwrap(), &tests::component_path(), &args)
}

/// The instance the lease names, if any.
async fn holder(bus: &Bus) -> Option<String> {
    let kv = bus.js("mesh-provisioner").await.get_key_value("mesh-provisioner_seat").await.ok()?;
    let v = kv.get("holder").await.ok()??;
    serde_json::from_slice::<Value>(&v).ok()?["instance"].as_str().map(str::to_string)
}

/// Every instance answering `$SRV.PING.mesh-provisioner` within 300 ms.
async fn pingers(c: &Client) -> Vec<String> {
    let inbox = c.new_inbox();
    let mut sub = c.subscribe(inbox.clone()).await.unwrap();
    c.publish_with_reply("$SRV.PING.mesh-provisioner", inbox, "".into()).await.unwrap();
    let mut out = Vec::new();
    let deadline = tokio::time::sleep(Duration::from_millis(300));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            Some(m) = sub.next() => {
                let v: Value = serde_json::from_slice(&m.payload).unwrap();
                out.push(v["metadata"]["instance"].as_str().unwrap_or_default().to_string());
            }
            _ = &mut deadline => return out,
        }
    }
}

/// Whether the verb answers; a request lost with a dying responder is retried by the caller.
async fn answers(c: &Client) -> bool {
    matches!(ask_within(c, b"{}", Duration::from_millis(500)).await, Ok((None, _)))
}

/// Waits until the verb answers, returning how long it took (bounded by `limit`).
async fn until_answering(c: &Client, limit: Duration) -> Duration {
    let start = Instant::now();
    while !answers(c).await {
        assert!(start.elapsed() < limit, "the verb did not answer again within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

async fn registry_last_seq(bus: &Bus) -> u64 {
    let js = bus.js("mesh-provisioner").await;
    let mut s = js.get_stream("KV_mesh-provisioner_registry").await.unwrap();
    s.info().await.unwrap().state.last_sequence
}

#[tokio::test]
async fn of_three_instances_started_together_exactly_one_holds_the_seat_and_answers() {
    let bus = Bus::start().await;
    let hosts: Vec<Host> = ["one", "two", "three"].iter().map(|n| spawn(&bus, n, &[])).collect();
    let c = bus.client("node-alpha").await;
    until_answering(&c, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = holder(&bus).await.expect("someone holds the seat");
    let answering = pingers(&c).await;
    assert_eq!(answering, vec![held.clone()], "exactly the holder answers");
    // The registry was written once, by the holder only.
    assert_eq!(registry_last_seq(&bus).await, 13);
    for h in hosts {
        h.stop().await;
    }
}

#[tokio::test]
async fn a_killed_holder_is_replaced_within_the_ttl_and_a_renewal() {
    let bus = Bus::start().await;
    let hosts: Vec<Host> = ["one", "two"].iter().map(|n| spawn(&bus, n, &[])).collect();
    let c = bus.client("node-alpha").await;
    until_answering(&c, Duration::from_secs(30)).await;
    let first = holder(&bus).await.expect("a holder");
    let i = if first == "one" { 0 } else { 1 };
    let killed = Instant::now();
    hosts[i].signal("KILL");
    // TTL plus a renewal interval, plus slack for a loaded two-core CI machine.
    let limit = Duration::from_secs_f64(TTL_S + TTL_S / 3.0 + 2.0);
    loop {
        let last = ask_within(&c, b"{}", Duration::from_millis(500)).await;
        if matches!(last, Ok((None, _))) {
            break;
        }
        assert!(killed.elapsed() < limit, "no answer within {limit:?} of the kill (last: {last:?}):\n{}", hosts[1 - i].log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = killed.elapsed();
    let second = holder(&bus).await.expect("a new holder");
    assert_ne!(second, first);
    assert_eq!(pingers(&c).await, vec![second]);
    println!("failover after SIGKILL: {took:?} (TTL {TTL})");
    for h in hosts {
        h.stop().await;
    }
}

#[tokio::test]
async fn a_paused_holder_finds_it_lost_the_seat_and_writes_nothing() {
    let bus = Bus::start().await;
    let hosts: Vec<Host> = ["one", "two"].iter().map(|n| spawn(&bus, n, &["--registry-every", "1s"])).collect();
    let c = bus.client("node-alpha").await;
    until_answering(&c, Duration::from_secs(30)).await;
    let first = holder(&bus).await.expect("a holder");
    let (paused, other) = if first == "one" { (&hosts[0], "two") } else { (&hosts[1], "one") };
    paused.signal("STOP");
    tokio::time::sleep(Duration::from_secs_f64(TTL_S * 2.0)).await;
    until_answering(&c, Duration::from_secs(10)).await;
    assert_eq!(holder(&bus).await.as_deref(), Some(other));
    let before = registry_last_seq(&bus).await;
    paused.signal("CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(registry_last_seq(&bus).await, before, "a registry write after the paused holder resumed");
    assert_eq!(pingers(&c).await, vec![other.to_string()], "only the new holder answers");
    let log = paused.log_text();
    assert!(log.contains("lost the seat"), "{log}");
    for h in hosts {
        h.stop().await;
    }
}

#[tokio::test]
async fn the_service_returns_after_a_server_restart_with_the_registry_intact() {
    let bus = Bus::start().await;
    let host = spawn(&bus, "one", &[]);
    let c = bus.client("node-alpha").await;
    until_answering(&c, Duration::from_secs(30)).await;
    let seq = registry_last_seq(&bus).await;
    assert_eq!(seq, 13);
    // Requests keep running across the restart; none may be answered wrongly.
    let stop = Arc::new(AtomicBool::new(false));
    let wrong = Arc::new(AtomicU64::new(0));
    let load = {
        let (c, stop, wrong) = (c.clone(), stop.clone(), wrong.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok((None, v)) = ask_raw(&c, b"{}").await {
                    if v["entries"].as_array().map_or(0, |e| e.len()) != 13 {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bus = bus.restart(Duration::from_millis(500)).await;
    let back = Instant::now();
    let c2 = bus.client("node-alpha").await;
    let took = until_answering(&c2, Duration::from_secs(20)).await;
    println!("answering again {:?} after the server came back", took.max(back.elapsed()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert_eq!(wrong.load(Ordering::Relaxed), 0, "a partial answer was given as complete");
    let kv = bus.js("mesh-provisioner").await.get_key_value("mesh-provisioner_registry").await.unwrap();
    let keys: Vec<String> = kv.keys().await.unwrap().map(|k| k.unwrap()).collect().await;
    assert_eq!(keys.len(), 13);
    assert_eq!(registry_last_seq(&bus).await, seq, "registry entries rewritten after the restart");
    let log = host.log_text();
    assert!(log.contains("reconnected to the bus"), "{log}");
    host.stop().await;
}

#[tokio::test]
async fn a_three_server_cluster_keeps_answering_when_one_server_dies() {
    let mut cluster = Cluster::start(3).await;
    let password = cluster.bus(0).password("mesh-provisioner");
    let host = Host::spawn(&cluster.urls(), &password, tempfile::tempdir().unwrap(), &tests::component_path(), &["--replicas", "3", "--seat-ttl", TTL]);
    let c = cluster.bus(0).client("node-alpha").await;
    until_answering(&c, Duration::from_secs(60)).await;
    cluster.kill(2).await;
    let took = until_answering(&c, Duration::from_secs(20)).await;
    // And it keeps answering for a while, not just once.
    let start = Instant::now();
    let mut ok = 0;
    while start.elapsed() < Duration::from_secs(3) {
        if answers(&c).await {
            ok += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok > 20, "only {ok} answers in 3 s after losing a server:\n{}", host.log_text());
    println!("after killing one of three servers: answering within {took:?}, {ok} answers in 3 s");
    host.stop().await;
}
