//! Failover of the seat over 20 holder kills, and the time to answer again after a
//! `nats-server` restart. A benchmark, not a test: it prints figures against the TTL.
//!
//! `cargo build --release -p mesh-provisioner && cargo bench -p tests --bench seat`

use std::time::{Duration, Instant};

use tests::nats::{ask_within, Bus, Host};

const TTL: &str = "2s";

fn spawn(bus: &Bus, name: &str) -> Host {
    Host::spawn(bus.url(), bus, tempfile::tempdir().unwrap(), &tests::component_path(), &["--seat-ttl", TTL, "--instance", name])
}

async fn until_answering(c: &async_nats::Client) -> Duration {
    let start = Instant::now();
    while !matches!(ask_within(c, b"{}", Duration::from_millis(500)).await, Ok((None, _))) {
        assert!(start.elapsed() < Duration::from_secs(60), "no answer within a minute");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

#[tokio::main]
async fn main() {
    tests::nats::prefer_release_binary();
    let bus = Bus::start().await;
    let c = bus.client("node-alpha").await;
    let mut hosts: Vec<(String, Host)> = vec![("h0".into(), spawn(&bus, "h0")), ("h1".into(), spawn(&bus, "h1"))];
    until_answering(&c).await;
    let mut times = Vec::new();
    for round in 0..20 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let held = bus.seat_holder().await.expect("a holder");
        let at = hosts.iter().position(|(n, _)| *n == held).expect("holder is ours");
        let (_, victim) = hosts.remove(at);
        victim.signal("KILL");
        let t = until_answering(&c).await;
        times.push(t);
        let _ = victim.stop().await;
        let name = format!("h{}", round + 2);
        hosts.push((name.clone(), spawn(&bus, &name)));
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "failover over {} SIGKILLs, TTL {TTL} (renewal every TTL/3): median {:.0} ms ({:.2}× TTL), max {:.0} ms ({:.2}× TTL), min {:.0} ms",
        times.len(),
        ms(times[times.len() / 2]),
        ms(times[times.len() / 2]) / 2000.0,
        ms(times[times.len() - 1]),
        ms(times[times.len() - 1]) / 2000.0,
        ms(times[0])
    );
    let mut bus = bus;
    let mut restarts = Vec::new();
    for _ in 0..3 {
        bus = bus.restart(Duration::from_millis(200)).await;
        let back = Instant::now();
        let c = bus.client("node-alpha").await;
        until_answering(&c).await;
        restarts.push(back.elapsed());
    }
    println!("answering again after a nats-server restart (200 ms down), from the server being back: {:?}", restarts);
    for (_, h) in hosts {
        h.stop().await;
    }
}
