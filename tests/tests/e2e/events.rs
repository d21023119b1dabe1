//! Claims kept true, end to end (SPEC §7.3): the real host binary and component against a real
//! `nats-server` with the example config. Each write is made by the user that owns it (the
//! controller assigns, a node applies, the provider writes its bucket); the events are heard
//! as the users the example config lets hear them, and an attacker node tries to hear more.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use tests::nats::{module_status as status, status_until as until, Bus, Host, Vault};

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const ASSIGNMENTS: &str = "mesh-controller_assignments";
const BOUND: &str = "postgres_bound";

/// The events heard on `sub` until none came for `quiet` (or none within `first`), at most a
/// minute.
async fn heard(sub: &mut async_nats::Subscriber, first: Duration, quiet: Duration) -> Vec<Value> {
    let mut out = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut until = tokio::time::Instant::now() + first;
    while let Ok(Some(m)) = tokio::time::timeout_at(until.min(end), sub.next()).await {
        let v: serde_json::Value = serde_json::from_slice(&m.payload).expect("an event is JSON");
        tests::schema::check("event", &v);
        out.push(v);
        until = tokio::time::Instant::now() + quiet;
    }
    out
}

/// The events of `module` among `events`, as (was, state).
fn moves(events: &[Value], node: &str, module: &str) -> Vec<(Value, String)> {
    events.iter().filter(|e| e["node"] == node && e["module"] == module).map(|e| (e["was"].clone(), e["state"].as_str().unwrap_or("").to_string())).collect()
}

#[tokio::test]
async fn a_provider_assigned_applied_and_moved_is_told_once_per_change_to_whom_it_concerns() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    bus.make_bucket(BOUND).await;
    let host = Host::start(&bus, &["--state-sweep-every", "2s", "--http", "127.0.0.1:0"]).await;
    // The status page's feed: server-sent events over plain HTTP.
    let url = host.http_url().await;
    let addr = url.trim_start_matches("http://").to_string();
    let mut page = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    page.write_all(format!("GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n").as_bytes()).await.unwrap();
    let asker = bus.client("node-alpha").await;
    let alpha = bus.client("node-alpha").await;
    let mut alpha_events = alpha.subscribe("mesh-provisioner.event.alpha").await.unwrap();
    let controller = bus.client("mesh-controller").await;
    let mut all_events = controller.subscribe("mesh-provisioner.event.>").await.unwrap();
    // An attacker holding node alpha's password tries to hear beta's, and everyone's.
    let (spy, denials) = bus.watched("node-alpha").await;
    let mut spy_beta = spy.subscribe("mesh-provisioner.event.beta").await.unwrap();
    let mut spy_all = spy.subscribe("mesh-provisioner.event.>").await.unwrap();
    for c in [&alpha, &controller, &spy] {
        c.flush().await.unwrap();
    }
    denials.expect("Subscription to", "mesh-provisioner.event.beta").await;
    denials.expect("Subscription to", "mesh-provisioner.event.>").await;
    // Nor can it forge one, or a state record (a false `since`), for any node, its own included.
    for subject in
        ["mesh-provisioner.event.beta", "mesh-provisioner.event.alpha", "$KV.mesh-provisioner_states.alpha.app", "$KV.mesh-provisioner_states.beta.api"]
    {
        spy.publish(subject, r#"{"node":"beta","module":"api","state":"applied","was":"blocked","reason":"forged","since":"2000-01-01T00:00:00Z"}"#.into())
            .await
            .unwrap();
        spy.flush().await.unwrap();
        denials.expect("Publish to", subject).await;
    }

    // alpha/app and beta/api need postgres's bound value; nothing provides it: blocked.
    bus.put("node-alpha", NEEDS, "alpha.app.bound.postgres=2Edb", b"{}").await;
    bus.put("node-alpha", APPLIED, "alpha.app", br#"{"build":"b1","needs":1}"#).await;
    bus.put("node-beta", NEEDS, "beta.api.bound.postgres=2Edb", b"{}").await;
    let s = until(&asker, "alpha", "app", "blocked, recorded", |s| s["state"] == "blocked" && s["since"].is_string()).await;
    let need = &s["needs"][0];
    assert_eq!((need["check"].as_str(), need["provider"]["module"].as_str()), (Some("no_provider"), Some("postgres")), "{s}");
    until(&asker, "beta", "api", "blocked, recorded", |s| s["state"] == "blocked" && s["since"].is_string()).await;
    let first = heard(&mut alpha_events, Duration::from_secs(5), Duration::from_secs(1)).await;
    assert_eq!(moves(&first, "alpha", "app"), [(Value::Null, "blocked".to_string())], "a module that appears is told once: {first:?}");
    assert!(first.iter().all(|e| e["node"] == "alpha"), "alpha hears only alpha's: {first:?}");
    heard(&mut all_events, Duration::from_secs(1), Duration::from_millis(500)).await;

    // The controller assigns the provider to gamma: pending, waiting for gamma, one event each.
    bus.put("mesh-controller", ASSIGNMENTS, "gamma.postgres", br#"{"want":"p1"}"#).await;
    let events = heard(&mut all_events, Duration::from_secs(10), Duration::from_secs(3)).await;
    assert_eq!(moves(&events, "alpha", "app"), [(json!("blocked"), "pending".to_string())], "{events:?}");
    assert_eq!(moves(&events, "beta", "api"), [(json!("blocked"), "pending".to_string())], "{events:?}");
    let e = events.iter().find(|e| e["module"] == "app").unwrap();
    assert!(e["reason"].as_str().unwrap().contains("waiting for postgres on gamma"), "the event says what it waits for: {e}");
    assert!(e["since"].is_string(), "{e}");
    let s = status(&asker, "alpha", "app").await;
    assert_eq!((s["state"].as_str(), s["needs"][0]["check"].as_str()), (Some("pending"), Some("provider_pending")), "{s}");
    assert_eq!(s["since"], e["since"], "the status says since the change the event told");
    // The page heard it too, as a server-sent event of its own.
    let (mut seen, mut buf) = (String::new(), [0u8; 4096]);
    let start = Instant::now();
    while !(seen.contains("event: state") && seen.contains(r#""module":"app""#) && seen.contains(r#""state":"pending""#)) {
        assert!(start.elapsed() < Duration::from_secs(10), "the page's feed never carried the change: {seen}");
        let n = tokio::time::timeout(Duration::from_secs(10), page.read(&mut buf)).await.expect("the feed stays open").expect("read");
        assert!(n > 0, "the feed closed: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 200") && seen.to_lowercase().contains("content-type: text/event-stream"), "{seen}");

    // The provider writes the value and is applied on gamma: applied, one event.
    bus.put("provider-postgres", BOUND, "alpha.app.db", br#"{"user":"app"}"#).await;
    bus.put("node-gamma", APPLIED, "gamma.postgres", br#"{"build":"p1","needs":0}"#).await;
    let events = heard(&mut all_events, Duration::from_secs(10), Duration::from_secs(3)).await;
    assert_eq!(moves(&events, "alpha", "app"), [(json!("pending"), "applied".to_string())], "{events:?}");
    assert!(moves(&events, "beta", "api").is_empty(), "beta/api stays pending (its value is missing, nothing applied): no event: {events:?}");

    // gamma goes away: the controller moves the provider to beta (the new assignment first),
    // where it is not applied yet. Each consumer back to pending, with one event.
    bus.put("mesh-controller", ASSIGNMENTS, "beta.postgres", br#"{"want":"p1"}"#).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let js = bus.js("mesh-controller").await;
    js.get_key_value(ASSIGNMENTS).await.unwrap().delete("gamma.postgres").await.unwrap();
    let events = heard(&mut all_events, Duration::from_secs(10), Duration::from_secs(3)).await;
    assert_eq!(moves(&events, "alpha", "app"), [(json!("applied"), "pending".to_string())], "{events:?}");
    let e = events.iter().find(|e| e["module"] == "app").unwrap();
    assert!(e["reason"].as_str().unwrap().contains("waiting for postgres on beta"), "{e}");

    // The spy heard nothing of beta's, and alpha's own subscription nothing but alpha's.
    let beta_heard = heard(&mut spy_beta, Duration::from_millis(300), Duration::ZERO).await;
    let all_heard = heard(&mut spy_all, Duration::from_millis(300), Duration::ZERO).await;
    assert!(beta_heard.is_empty() && all_heard.is_empty(), "a node hears no other node's state changes: {beta_heard:?} {all_heard:?}");
    let alpha_heard = heard(&mut alpha_events, Duration::from_millis(500), Duration::from_millis(500)).await;
    assert!(!alpha_heard.is_empty() && alpha_heard.iter().all(|e| e["node"] == "alpha"), "{alpha_heard:?}");

    // A thousand modules change state at once: a thousand events, no more. They wait for
    // postgres (assigned to beta, not applied): pending as they appear; then the controller
    // takes the provider away: each is blocked, with one event.
    const N: usize = 1000;
    let beta = bus.js("node-beta").await;
    let needs = beta.get_key_value(NEEDS).await.unwrap();
    for i in 0..N {
        needs.put(format!("beta.m{i:04}.bound.postgres=2Ecache"), "{}".into()).await.unwrap();
    }
    let appeared = heard(&mut all_events, Duration::from_secs(20), Duration::from_secs(3)).await;
    let pending = appeared.iter().filter(|e| e["state"] == "pending" && e["module"].as_str().is_some_and(|m| m.starts_with('m'))).count();
    assert_eq!(pending, N, "each new module told once as pending:\n{}", host.log_text());
    let started = Instant::now();
    js.get_key_value(ASSIGNMENTS).await.unwrap().delete("beta.postgres").await.unwrap();
    let events = heard(&mut all_events, Duration::from_secs(20), Duration::from_secs(5)).await;
    let took = started.elapsed();
    let mut per_module: BTreeMap<String, usize> = BTreeMap::new();
    for e in events.iter().filter(|e| e["module"].as_str().is_some_and(|m| m.starts_with('m'))) {
        assert_eq!((e["was"].as_str(), e["state"].as_str()), (Some("pending"), Some("blocked")), "{e}");
        *per_module.entry(e["module"].as_str().unwrap().to_string()).or_default() += 1;
    }
    assert_eq!(per_module.len(), N, "every module told");
    assert!(per_module.values().all(|n| *n == 1), "each once");
    println!("{N} modules moved by one assignment: {N} events within {took:?}");
    // Later sweeps (every 2 s here) find them as recorded and tell nothing more.
    let more = heard(&mut all_events, Duration::from_secs(5), Duration::from_secs(1)).await;
    assert!(more.iter().all(|e| !e["module"].as_str().is_some_and(|m| m.starts_with('m'))), "no event twice: {more:?}");

    // The operator's view: modules in their state for a while, and the metric of events.
    let out = tokio::process::Command::new(tests::nats::host_binary())
        .args([
            "query",
            "status",
            "--node",
            "alpha",
            "--since",
            "1s",
            "--nats-url",
            bus.url(),
            "--user",
            "node-alpha",
            "--password",
            &bus.password("node-alpha"),
        ])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("FOR") && text.contains("blocked"), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let out = tokio::process::Command::new(tests::nats::host_binary())
        .args([
            "query",
            "status",
            "--node",
            "alpha",
            "--since",
            "1h",
            "--nats-url",
            bus.url(),
            "--user",
            "node-alpha",
            "--password",
            &bus.password("node-alpha"),
        ])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("0 module(s)"), "nothing on alpha has been in its state for an hour: {text}");
    host.stop().await;
}

#[tokio::test]
async fn since_survives_a_restart_of_the_only_instance_and_nothing_is_told_again() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let args = ["--instance", "sole", "--state-sweep-every", "1s"];
    let host = Host::start(&bus, &args).await;
    bus.make_bucket("mesh-config_values").await;
    let asker = bus.client("node-alpha").await;
    bus.put("node-alpha", NEEDS, "alpha.web.config.base_url", b"{}").await;
    let before = until(&asker, "alpha", "web", "pending, recorded", |s| s["state"] == "pending" && s["since"].is_string()).await;
    let controller = bus.client("mesh-controller").await;
    let mut events = controller.subscribe("mesh-provisioner.event.>").await.unwrap();
    controller.flush().await.unwrap();
    // Stopped, and started again on a state directory of its own (nothing kept on disk): the
    // record on the bus is what keeps since.
    host.stop().await;
    let host = Host::start(&bus, &args).await;
    let swept = |h: &Host| h.log_text().matches("module states swept").count();
    let start = Instant::now();
    while swept(&host) < 2 {
        assert!(start.elapsed() < Duration::from_secs(60), "the restarted instance never swept:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = status(&asker, "alpha", "web").await;
    assert_eq!((&after["state"], &after["since"]), (&before["state"], &before["since"]), "since survives the restart");
    let told = heard(&mut events, Duration::from_millis(500), Duration::ZERO).await;
    assert!(told.is_empty(), "the restarted instance tells nothing that did not change: {told:?}");
    // And tells what does change, once.
    bus.put("node-alpha", APPLIED, "alpha.web", br#"{"build":"w1","needs":1}"#).await;
    let told = heard(&mut events, Duration::from_secs(10), Duration::from_secs(1)).await;
    assert_eq!(moves(&told, "alpha", "web"), [(json!("pending"), "degraded".to_string())], "{told:?}");
    host.stop().await;
}

#[tokio::test]
async fn since_survives_a_takeover_and_the_new_holder_tells_nothing_twice() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let spawn = |name: &str| {
        Host::spawn(
            bus.url(),
            &bus,
            tempfile::tempdir().unwrap(),
            &tests::component_path(),
            &["--seat-ttl", "3s", "--instance", name, "--state-sweep-every", "1s"],
        )
    };
    let (mut one, two) = (spawn("one"), spawn("two"));
    one.wait_serving(&bus).await;
    bus.make_bucket("mesh-config_values").await;
    let asker = bus.client("node-alpha").await;
    bus.put("node-alpha", NEEDS, "alpha.web.config.base_url", b"{}").await;
    let before = until(&asker, "alpha", "web", "pending, recorded", |s| s["state"] == "pending" && s["since"].is_string()).await;
    let controller = bus.client("mesh-controller").await;
    let mut events = controller.subscribe("mesh-provisioner.event.>").await.unwrap();
    controller.flush().await.unwrap();
    // Two instances, one event: the standby tells nothing.
    let start = Instant::now();
    while !(one.log_text().contains("standing by") || two.log_text().contains("standing by")) {
        assert!(start.elapsed() < Duration::from_secs(30), "no standby:\n{}", two.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bus.put("node-alpha", NEEDS, "alpha.other.config.x", b"{}").await;
    let told = heard(&mut events, Duration::from_secs(10), Duration::from_secs(2)).await;
    assert_eq!(moves(&told, "alpha", "other"), [(Value::Null, "pending".to_string())], "told once, by the holder only: {told:?}");
    // The holder dies; the standby takes the seat and sweeps every module.
    let holder = bus.seat_holder().await.expect("a holder");
    let (dead, alive) = if holder == "one" { (&one, &two) } else { (&two, &one) };
    dead.signal("KILL");
    let start = Instant::now();
    loop {
        if bus.seat_holder().await.as_deref() == Some(if holder == "one" { "two" } else { "one" }) {
            if let Ok(v) =
                tokio::time::timeout(Duration::from_secs(1), tests::nats::ask_raw(&asker, br#"{"what":"status","node":"alpha","module":"web"}"#)).await
            {
                if matches!(v, Ok((None, _))) {
                    break;
                }
            }
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no takeover:\n{}", alive.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Two sweeps by the new holder after it took the seat: the state and its since are the
    // ones recorded before, and nothing was told.
    let swept = |h: &tests::nats::Host| h.log_text().matches("module states swept").count();
    let swept_at_takeover = swept(alive);
    let start = Instant::now();
    while swept(alive) < swept_at_takeover + 2 {
        assert!(start.elapsed() < Duration::from_secs(60), "the new holder never swept:\n{}", alive.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = status(&asker, "alpha", "web").await;
    assert_eq!((after["state"].clone(), after["since"].clone()), (before["state"].clone(), before["since"].clone()), "since survives the takeover");
    let told = heard(&mut events, Duration::from_millis(500), Duration::ZERO).await;
    assert!(told.is_empty(), "the new holder tells nothing that did not change: {told:?}");
    // And it tells what does change.
    bus.put("node-alpha", APPLIED, "alpha.web", br#"{"build":"w1","needs":1}"#).await;
    let told = heard(&mut events, Duration::from_secs(10), Duration::from_secs(1)).await;
    assert_eq!(moves(&told, "alpha", "web"), [(json!("pending"), "degraded".to_string())], "{told:?}");
    drop(one);
    drop(two);
}

#[tokio::test]
async fn a_flood_on_the_event_subjects_reaches_no_page_and_cuts_no_connection() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let host = Host::start(&bus, &["--http", "127.0.0.1:0"]).await;
    let url = host.http_url().await;
    let addr = url.trim_start_matches("http://").to_string();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut page = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    page.write_all(format!("GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n").as_bytes()).await.unwrap();
    // A page that never reads, all along.
    let mut idle = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    idle.write_all(format!("GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n").as_bytes()).await.unwrap();
    let holder = bus.seat_holder().await.expect("a holder");

    // Only the provisioner's own user may publish there (no node can: its account imports
    // none of the event subjects to publish); with its password, the event subjects are
    // flooded with big forged events. The controller, who hears every event, hears them all.
    let controller = bus.client("mesh-controller").await;
    let mut heard = controller.subscribe("mesh-provisioner.event.alpha").await.unwrap();
    controller.flush().await.unwrap();
    let forger = bus.client("mesh-provisioner").await;
    let forged =
        json!({"node":"alpha","module":"forged","state":"applied","was":"blocked","reason":"x".repeat(900 * 1024),"since":"2026-12-03T00:00:00Z"}).to_string();
    for _ in 0..100 {
        forger.publish("mesh-provisioner.event.alpha", forged.clone().into()).await.unwrap();
    }
    forger.flush().await.unwrap();
    let mut floods = 0;
    while floods < 100 {
        let m = tokio::time::timeout(Duration::from_secs(30), heard.next()).await.expect("the controller hears the flood").expect("a message");
        floods += usize::from(m.payload.len() > 900 * 1024);
    }

    // Then a real change: the page is told it, and nothing of the flood.
    let asker = bus.client("node-alpha").await;
    bus.put("node-alpha", NEEDS, "alpha.app.bound.postgres=2Edb", b"{}").await;
    until(&asker, "alpha", "app", "blocked, recorded", |s| s["state"] == "blocked" && s["since"].is_string()).await;
    let (mut seen, mut buf) = (String::new(), [0u8; 4096]);
    let start = Instant::now();
    while !(seen.contains("event: state") && seen.contains(r#""module":"app""#)) {
        assert!(start.elapsed() < Duration::from_secs(30), "the page never heard alpha/app: {seen}");
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(1), page.read(&mut buf)).await {
            assert!(n > 0, "the page's stream ended: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    assert!(!seen.contains("forged"), "a page relayed a forged event");
    assert_eq!(bus.seat_holder().await.as_deref(), Some(holder.as_str()));
    let lost = tests::nats::lost_connections(&url).await;
    assert!(lost.is_empty(), "a connection was lost: {lost:?}");
    drop(idle);
}

/// Issue 47's case: a module needs `bound:postgres.db`; the controller assigns the provider
/// before its bucket exists. The status says `pending` (the provider is assigned, not applied)
/// at once, and so does the event: told by the assignment itself (the sweep is an hour away),
/// with the `since` the status then shows.
#[tokio::test]
async fn a_provider_assigned_before_its_bucket_exists_is_told_by_the_assignment() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let host = Host::start(&bus, &["--state-sweep-every", "1h"]).await;
    let asker = bus.client("node-alpha").await;
    let controller = bus.client("mesh-controller").await;
    let mut events = controller.subscribe("mesh-provisioner.event.alpha").await.unwrap();
    controller.flush().await.unwrap();
    bus.put("node-alpha", NEEDS, "alpha.store.bound.postgres=2Edb", b"{}").await;
    let told = heard(&mut events, Duration::from_secs(30), Duration::from_secs(1)).await;
    assert_eq!(moves(&told, "alpha", "store"), [(Value::Null, "blocked".to_string())], "{told:?}");
    until(&asker, "alpha", "store", "blocked, no provider", |s| s["state"] == "blocked").await;

    bus.put("mesh-controller", ASSIGNMENTS, "beta.postgres", br#"{"want":"p1"}"#).await;
    let told = heard(&mut events, Duration::from_secs(30), Duration::from_secs(1)).await;
    assert_eq!(moves(&told, "alpha", "store"), [(json!("blocked"), "pending".to_string())], "{told:?}\n{}", host.log_text());
    let s = status(&asker, "alpha", "store").await;
    assert_eq!((&s["state"], &s["since"]), (&json!("pending"), &told[0]["since"]), "the status and the event agree");
    assert!(s["reason"].as_str().unwrap_or_default().contains("beta"), "{s}");
    host.stop().await;
}

#[tokio::test]
async fn sweeps_every_module_again_only_when_an_answer_of_discovery_moved() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let host = Host::start(&bus, &["--state-sweep-every", "1s", "--http", "127.0.0.1:0"]).await;
    let metrics = format!("{}/metrics", host.http_url().await);
    let counts = async || {
        let swept = tests::bench::metric(&metrics, "mesh_provisioner_state_sweeps_total ").await;
        let skipped = tests::bench::metric(&metrics, "mesh_provisioner_state_sweeps_skipped_total ").await;
        (swept, skipped)
    };
    let asker = bus.client("node-alpha").await;
    let controller = bus.client("mesh-controller").await;
    let mut events = controller.subscribe("mesh-provisioner.event.alpha").await.unwrap();
    controller.flush().await.unwrap();
    // A secret the vault's verb answers: whether it can be had is discovery's to say, and no
    // bucket changes when the vault starts.
    bus.put("node-alpha", NEEDS, "alpha.app.secret.db_password", b"{}").await;
    let before = until(&asker, "alpha", "app", "a state while no vault answers", |s| s["state"].is_string() && s["since"].is_string()).await;
    assert_eq!(before["needs"][0]["check"], "no_provider", "{before}");

    // Ticks with discovery as it was: counted as skipped, and no sweep begins meanwhile but
    // (at most) the one every twentieth tick makes anyway.
    let start = Instant::now();
    let skipped_at_least = async |n: f64, what: &str| loop {
        let now = counts().await;
        if now.1 >= n {
            return now;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{what}: {now:?} {}", host.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (swept, skipped) = skipped_at_least(1.0, "no tick was skipped").await;
    let (swept_later, skipped_later) = skipped_at_least(skipped + 3.0, "ticks stopped being skipped").await;
    assert!(swept_later - swept <= 1.0, "{} sweeps over {} unchanged ticks", swept_later - swept, skipped_later - skipped);

    // The vault starts answering: the next tick sees discovery move and sweeps, and the module's
    // new state is told.
    let _vault = Vault::start(&bus).await;
    let after = until(&asker, "alpha", "app", "the state once the vault answers", |s| s["state"] != before["state"]).await;
    assert_eq!(after["needs"][0]["check"], "answered", "{after}");
    // (The status verb finds the state itself: the event waits for the recorder's next tick.)
    let told_by = Instant::now() + Duration::from_secs(60);
    let mut told = Vec::new();
    while !moves(&told, "alpha", "app").iter().any(|(was, state)| *was == before["state"] && *state == after["state"]) {
        assert!(Instant::now() < told_by, "the move is told: {told:?}");
        told.extend(heard(&mut events, Duration::from_secs(1), Duration::ZERO).await);
    }
    let (swept_after, _) = counts().await;
    assert!(swept_after > swept_later, "a sweep began once discovery moved");
    host.stop().await;
}
