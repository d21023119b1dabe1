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

fn spawn(bus: &Bus, name: &str, extra: &[&str]) -> Host {
    spawn_with(bus, name, &tests::component_path(), TTL, extra)
}

/// An instance serving `component` with a lease of `ttl`.
fn spawn_with(bus: &Bus, name: &str, component: &std::path::Path, ttl: &str, extra: &[&str]) -> Host {
    let mut args = vec!["--seat-ttl", ttl, "--instance", name];
    args.extend_from_slice(extra);
    Host::spawn(bus.url(), bus, tempfile::tempdir().unwrap(), component, &args)
}

/// Waits (bounded) until `host`'s log shows `what`.
async fn log_shows(host: &Host, what: &str) {
    let start = Instant::now();
    while !host.log_text().contains(what) {
        assert!(start.elapsed() < Duration::from_secs(30), "the log never showed {what:?}:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The registry's keys, sorted.
async fn registry_kinds(bus: &Bus) -> Vec<String> {
    let kv = bus.js("mesh-provisioner").await.get_key_value("mesh-provisioner_registry").await.unwrap();
    let mut keys: Vec<String> = kv.keys().await.unwrap().map(|k| k.unwrap()).collect().await;
    keys.sort();
    keys
}

/// Waits (bounded) until the registry holds `has` and not `lacks`.
async fn registry_until(bus: &Bus, has: &str, lacks: &str) {
    let start = Instant::now();
    loop {
        let kinds = registry_kinds(bus).await;
        if kinds.iter().any(|k| k == has) && !kinds.iter().any(|k| k == lacks) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "the registry never held {has} without {lacks}: {kinds:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every instance answering `$SRV.PING.mesh-provisioner`: the first answer waited for up to
/// 5 s (a loaded machine is slow, not silent), any other within 300 ms after it.
async fn pingers(c: &Client) -> Vec<String> {
    let inbox = c.new_inbox();
    let mut sub = c.subscribe(inbox.clone()).await.unwrap();
    c.publish_with_reply("$SRV.PING.mesh-provisioner", inbox, "".into()).await.unwrap();
    let mut out = Vec::new();
    let deadline = tokio::time::sleep(Duration::from_secs(5));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            Some(m) = sub.next() => {
                let v: Value = serde_json::from_slice(&m.payload).unwrap();
                out.push(v["metadata"]["instance"].as_str().unwrap_or_default().to_string());
                if out.len() == 1 {
                    deadline.as_mut().reset(tokio::time::Instant::now() + Duration::from_millis(300));
                }
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
    let held = bus.seat_holder().await.expect("someone holds the seat");
    // The two others are up and stand by before anyone is asked who answers.
    for (h, _) in hosts.iter().zip(["one", "two", "three"]).filter(|(_, n)| *n != held) {
        log_shows(h, "standing by").await;
    }
    let answering = pingers(&c).await;
    assert_eq!(answering, vec![held.clone()], "exactly the holder answers");
    // The registry was written once, by the holder only.
    assert_eq!(registry_last_seq(&bus).await, 13);
    for h in hosts {
        h.stop().await;
    }
}

#[tokio::test]
async fn a_killed_holder_is_replaced_by_its_standby() {
    let bus = Bus::start().await;
    let hosts: Vec<Host> = ["one", "two"].iter().map(|n| spawn(&bus, n, &[])).collect();
    let c = bus.client("node-alpha").await;
    until_answering(&c, Duration::from_secs(30)).await;
    let first = bus.seat_holder().await.expect("a holder");
    let i = if first == "one" { 0 } else { 1 };
    let killed = Instant::now();
    hosts[i].signal("KILL");
    // How soon is the seat bench's to measure; here only that the standby takes over.
    let limit = Duration::from_secs(60);
    loop {
        let last = ask_within(&c, b"{}", Duration::from_millis(500)).await;
        if matches!(last, Ok((None, _))) {
            break;
        }
        assert!(killed.elapsed() < limit, "no answer within {limit:?} of the kill (last: {last:?}):\n{}", hosts[1 - i].log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = killed.elapsed();
    let second = bus.seat_holder().await.expect("a new holder");
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
    // The paused holder serves another table (v2: `archive`, no `machine`), so any write it
    // made after resuming would show in the registry.
    let v2 = tests::fixture("v2");
    let paused = spawn_with(&bus, "one", &v2, TTL, &["--registry-every", "1s"]);
    let c = bus.client("node-alpha").await;
    until_answering(&c, Duration::from_secs(30)).await;
    assert_eq!(bus.seat_holder().await.as_deref(), Some("one"));
    registry_until(&bus, "archive", "machine").await;
    let other = spawn(&bus, "two", &["--registry-every", "1s"]);
    log_shows(&other, "standing by").await;

    paused.signal("STOP");
    let start = Instant::now();
    while bus.seat_holder().await.as_deref() != Some("two") {
        assert!(start.elapsed() < Duration::from_secs(15), "the standby never took the seat:\n{}", other.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until_answering(&c, Duration::from_secs(10)).await;
    registry_until(&bus, "machine", "archive").await;
    let before = registry_last_seq(&bus).await;
    let skipped = |h: &Host| h.log_text().matches("registry not reconciled: this instance does not hold the seat").count();
    let skipped_before = skipped(&paused);
    paused.signal("CONT");
    log_shows(&paused, "lost the seat").await;
    // Three of its reconcile ticks, each seen to find the seat held elsewhere.
    let start = Instant::now();
    while skipped(&paused) < skipped_before + 3 {
        assert!(start.elapsed() < Duration::from_secs(60), "the resumed holder's reconcile ticks never came:\n{}", paused.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(registry_last_seq(&bus).await, before, "a registry write after the paused holder resumed:\n{}", paused.log_text());
    assert!(registry_kinds(&bus).await.contains(&"machine".to_string()));
    assert_eq!(pingers(&c).await, vec!["two".to_string()], "only the new holder answers");
    for h in [paused, other] {
        h.stop().await;
    }
}

#[tokio::test]
async fn a_standby_with_a_short_ttl_judges_the_lease_by_the_holders_ttl() {
    let bus = Bus::start().await;
    let long = spawn_with(&bus, "long", &tests::component_path(), "6s", &[]);
    let c = bus.client("node-alpha").await;
    until_answering(&c, Duration::from_secs(30)).await;
    assert_eq!(bus.seat_holder().await.as_deref(), Some("long"));
    let short = spawn_with(&bus, "short", &tests::component_path(), "1s", &[]);
    log_shows(&short, "standing by").await;
    // The holder renews every 2 s; a standby judging by its own 1 s would take the seat at once.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        assert_eq!(bus.seat_holder().await.as_deref(), Some("long"), "a live holder lost its seat:\n{}", short.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(pingers(&c).await, vec!["long".to_string()]);
    // It still takes over once the holder is gone.
    long.signal("KILL");
    let killed = Instant::now();
    while bus.seat_holder().await.as_deref() != Some("short") {
        assert!(killed.elapsed() < Duration::from_secs(60), "the standby never took over:\n{}", short.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("took over {:?} after the kill (holder's TTL 6s)", killed.elapsed());
    for h in [long, short] {
        h.stop().await;
    }
}

#[tokio::test]
async fn two_processes_given_one_instance_name_never_both_hold() {
    let bus = Bus::start().await;
    let first = spawn(&bus, "twin", &[]);
    let c = bus.client("node-alpha").await;
    until_answering(&c, Duration::from_secs(30)).await;
    let second = spawn(&bus, "twin", &[]);
    // The second finds a lease naming its own instance: not its own lease all the same (another
    // process's run), so it stands by while the first renews.
    log_shows(&second, "standing by").await;
    bus.until_seat_renewed_twice().await;
    bus.until_seat_renewed_twice().await;
    assert!(!second.log_text().contains("took the seat"), "{}", second.log_text());
    assert!(!first.log_text().contains("lost the seat"), "{}", first.log_text());
    assert_eq!(pingers(&c).await.len(), 1, "exactly one answers");
    // Still a standby: it takes over once the first is gone.
    first.signal("KILL");
    log_shows(&second, "took the seat").await;
    until_answering(&c, Duration::from_secs(30)).await;
    second.stop().await;
}

#[tokio::test]
async fn a_lease_gone_from_the_bus_is_not_taken_by_a_standby_before_the_holder_finds_out() {
    let bus = Bus::start().await;
    // Renewals every 2 s; the standby looks every 250 ms.
    let holder = spawn_with(&bus, "holder", &tests::component_path(), "6s", &[]);
    let c = bus.client("node-alpha").await;
    until_answering(&c, Duration::from_secs(30)).await;
    let standby = spawn_with(&bus, "standby", &tests::component_path(), "6s", &[]);
    log_shows(&standby, "standing by").await;
    bus.until_seat_renewed_twice().await;
    // The key goes with no delete marker, as when the bus loses the bucket's messages: the
    // holder holds on until its next renewal finds it gone, so the standby must not create it.
    let js = bus.js(tests::nats::OPERATOR).await;
    js.get_stream("KV_mesh-provisioner_seat").await.unwrap().purge().await.unwrap();
    log_shows(&holder, "the key is gone").await;
    bus.until_seat_renewed_twice().await;
    assert_eq!(bus.seat_holder().await.as_deref(), Some("holder"));
    assert!(!standby.log_text().contains("took the seat"), "{}", standby.log_text());
    assert_eq!(pingers(&c).await, vec!["holder".to_string()]);
    for h in [holder, standby] {
        h.stop().await;
    }
}

#[tokio::test]
async fn a_holder_that_loses_the_seat_while_the_guest_runs_does_not_answer() {
    let bus = Bus::start().await;
    let host = spawn_with(&bus, "one", &tests::fixture("misbehave"), "1500ms", &["--guest-deadline", "5s"]);
    let c = bus.client("node-alpha").await;
    until_answering(&c, Duration::from_secs(30)).await;
    let slow = {
        let c = c.clone();
        tokio::spawn(async move { ask_within(&c, br#"{"fixture":"slow"}"#, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Someone else's lease, long-lived: the holder's next renewal fails and it cannot take the
    // seat back before the slow call ends.
    let kv = bus.js("mesh-provisioner").await.get_key_value("mesh-provisioner_seat").await.unwrap();
    kv.put("holder", r#"{"instance":"intruder","ttl_ms":60000}"#.into()).await.unwrap();
    let (code, v) = slow.await.unwrap().expect("a reply");
    assert_eq!(code.as_deref(), Some("503"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("lost the seat while answering"), "{v}");
    log_shows(&host, "lost the seat").await;
    host.stop().await;
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
    let (wrong, right) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (c, stop, wrong, right) = (c.clone(), stop.clone(), wrong.clone(), right.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok((None, v)) = ask_raw(&c, b"{}").await {
                    let counter = if v["entries"].as_array().map_or(0, |e| e.len()) == 13 { &right } else { &wrong };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let start = Instant::now();
    while right.load(Ordering::Relaxed) < 10 {
        assert!(start.elapsed() < Duration::from_secs(10), "no load before the restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before_restart = right.load(Ordering::Relaxed);
    let bus = bus.restart(Duration::from_millis(500)).await;
    let back = Instant::now();
    let c2 = bus.client("node-alpha").await;
    let took = until_answering(&c2, Duration::from_secs(20)).await;
    println!("answering again {:?} after the server came back", took.max(back.elapsed()));
    // The load's own client reconnects too, and is answered again.
    let start = Instant::now();
    while right.load(Ordering::Relaxed) < before_restart + 10 {
        assert!(start.elapsed() < Duration::from_secs(20), "the load was not answered again after the restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert_eq!(wrong.load(Ordering::Relaxed), 0, "a partial answer was given as complete");
    println!("under load: {} complete answers, {before_restart} of them before the restart", right.load(Ordering::Relaxed));
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
    let host = Host::spawn(&cluster.urls(), &cluster, tempfile::tempdir().unwrap(), &tests::component_path(), &["--replicas", "3", "--seat-ttl", TTL]);
    let c = cluster.bus(0).client("node-alpha").await;
    until_answering(&c, Duration::from_secs(60)).await;
    let killed = Instant::now();
    cluster.kill(2).await;
    // The streams the dead server led are leaderless until their groups elect another (seconds);
    // a lease that cannot be renewed that long is lost, and taken back once it can. The holder
    // is steady again when the streams are led and it has renewed twice since.
    let elected = cluster.until_every_stream_is_led().await;
    cluster.any().until_seat_renewed_twice().await;
    until_answering(&c, Duration::from_secs(60)).await;
    let took = killed.elapsed();
    // And it keeps answering, not just once: twenty requests in a row.
    // Each is waited for as long as a client would (the 500 ms of the polling above is a
    // retry interval, not a bound on an answer): a loaded machine may be slow, never silent.
    for i in 0..20 {
        let answered = matches!(ask_within(&c, b"{}", Duration::from_secs(10)).await, Ok((None, _)));
        assert!(answered, "request {i} after losing a server was not answered:\n{}", host.log_text());
    }
    println!("after killing one of three servers: every stream led after {elected:?}, answering steadily after {took:?}");
    host.stop().await;
}

#[tokio::test]
async fn a_holder_keeps_the_seat_while_the_server_leading_its_lease_dies() {
    let mut cluster = Cluster::start(3).await;
    // A lease of 30 s is renewed every 10 s and held 22.5 s past a renewal: longer than the
    // seconds (up to ten, measured) a stream's group takes to elect a leader after its leader dies.
    let host = Host::spawn(
        &cluster.urls(),
        &cluster,
        tempfile::tempdir().unwrap(),
        &tests::component_path(),
        &["--replicas", "3", "--seat-ttl", "30s", "--http", "127.0.0.1:0"],
    );
    let c = cluster.bus(0).client("node-alpha").await;
    until_answering(&c, Duration::from_secs(60)).await;
    let js = cluster.bus(0).js(tests::nats::OPERATOR).await;
    let (holder, revision) = cluster.bus(0).seat_lease().await.expect("a lease");
    // Just after a renewal, wait until 1.5 s before the next one, then kill the server leading
    // the seat's stream: that renewal meets a stream with no leader.
    let start = Instant::now();
    while cluster.bus(0).seat_lease().await.map(|(_, r)| r) == Some(revision) {
        assert!(start.elapsed() < Duration::from_secs(20), "the lease was not renewed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(8500)).await;
    let mut stream = js.get_stream("KV_mesh-provisioner_seat").await.unwrap();
    let leader = stream.info().await.unwrap().cluster.as_ref().and_then(|c| c.leader.clone()).expect("the seat's stream is led");
    let dead = cluster.index_of(&leader).expect("a server of the cluster leads");
    let killed = Instant::now();
    cluster.kill(dead).await;
    let elected = cluster.until_every_stream_is_led().await;
    let c = cluster.any().client("node-alpha").await;
    // The renewal after the election lands on the same holder: the seat was never given up.
    let start = Instant::now();
    while !host.log_text().contains("renewed the lease again") {
        assert!(start.elapsed() < Duration::from_secs(30), "no renewal after the election:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let renewed = killed.elapsed();
    let log = host.log_text();
    assert!(log.contains("renewal failed"), "the renewal never met the leaderless stream:\n{log}");
    assert!(!log.contains("lost the seat"), "the seat was given up:\n{log}");
    assert_eq!(cluster.any().seat_holder().await, Some(holder));
    // Said to the operator: the failed renewals counted, the seat taken once and never lost.
    let http = host.http_url().await;
    assert!(tests::bench::metric(&format!("{http}/metrics"), "mesh_provisioner_seat_renewals_failed_total ").await >= 1.0);
    assert_eq!(tests::bench::metric(&format!("{http}/metrics"), "mesh_provisioner_seat_transitions_total ").await, 1.0);
    // A connection the dead server held resyncs its mirrors once their streams are led again
    // (503 until then); then the holder answers as before.
    until_answering(&c, Duration::from_secs(60)).await;
    for i in 0..20 {
        let answered = matches!(ask_within(&c, b"{}", Duration::from_secs(10)).await, Ok((None, _)));
        assert!(answered, "request {i} after the election was not answered:\n{}", host.log_text());
    }
    println!("the seat's leader killed: every stream led after {elected:?}, renewed after {renewed:?}, seat kept");
    host.stop().await;
}
