//! Every known way a mirror drifts from its bucket without a watch message (issue 16, SPEC
//! §8–9), end to end: a whole-bucket purge, a bucket's max age, a per-key TTL, a bucket deleted
//! and made anew, a bus that lost its store, a bus that hangs. Each runs the real host and a
//! real `nats-server`; `verify` (the real binary) compares the answers with the bus.
//!
//! The first four use a server of the test's own with one user allowed everything, since they
//! purge, delete and reconfigure buckets no user of the example config may touch; the last two
//! use the example config itself.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use async_nats::{Client, ConnectOptions};
use serde_json::{json, Value};
use tests::nats::{answered_keys, ask_ok, ask_raw, ask_until, ask_until_else, compiled_kinds, run_verify, stats_data, Bus, Host, RawServer};

const OPEN: &str = r#"listen: "127.0.0.1:{{PORT}}"
jetstream { store_dir: "{{DIR}}/js" }
accounts { MESH { jetstream: enabled, users: [ { user: "all", password: "all-pw" } ] } }
"#;
const NEEDS: &str = "mesh-provisioner_needs";

struct Open {
    server: RawServer,
    host: Host,
    client: Client,
    url: String,
}

/// A server of our own, anything `prepare` does to it first, and the host serving on it.
async fn open(audit_every: &str, prepare: impl AsyncFnOnce(&jetstream::Context)) -> Open {
    open_with(audit_every, &[], prepare).await
}

/// As [`open`], with more flags for the host.
async fn open_with(audit_every: &str, extra: &[&str], prepare: impl AsyncFnOnce(&jetstream::Context)) -> Open {
    let server = RawServer::start(OPEN).await;
    let url = format!("nats://127.0.0.1:{}", server.port);
    let client = ConnectOptions::with_user_and_password("all".into(), "all-pw".into()).connect(&url).await.expect("connect");
    prepare(&jetstream::new(client.clone())).await;
    let mut args = vec!["--nats-url", &url, "--user", "all", "--password", "all-pw", "--audit-every", audit_every, "--seat-ttl", "2s"];
    args.extend_from_slice(extra);
    let mut host = Host::spawn_as(tempfile::tempdir().unwrap(), &tests::component_path(), &args);
    host.wait_answering(&client).await;
    Open { server, host, client, url }
}

/// The keys the verb answers for `what`, every page.
async fn answered(client: &Client, what: &str) -> Vec<String> {
    let keys = answered_keys(client, json!({ "what": what }), Duration::from_secs(5)).await.expect("the verb answers");
    keys.into_iter().map(|(key, _)| key).collect()
}

/// Waits (bounded) until the needs answer holds exactly `n` keys.
async fn until_needs(client: &Client, n: usize, host: &Host) -> Duration {
    let start = Instant::now();
    loop {
        let keys = answered(client, "needs").await;
        if keys.len() == n {
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(30), "needs never answered {n} keys (it answers {}):\n{}", keys.len(), host.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn put_needs(client: &Client, n: usize) -> Vec<u64> {
    let kv = jetstream::new(client.clone()).get_key_value(NEEDS).await.expect("needs bucket");
    let mut revisions = Vec::new();
    for i in 0..n {
        revisions.push(kv.put(format!("alpha.app{i}.config.url"), json!({"n": i}).to_string().into()).await.expect("put"));
    }
    revisions
}

fn repairs(data: &Value, bucket: &str) -> u64 {
    data["mirror_repairs"][bucket].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn verify_names_every_key_a_purge_removed_behind_the_mirrors_back() {
    // No audit in this test's time: the mirror keeps what the purge removed, and verify says so.
    let o = open("1h", async |_| {}).await;
    put_needs(&o.client, 12).await;
    until_needs(&o.client, 12, &o.host).await;
    let (code, report) = run_verify(&o.url, "all", "all-pw").await;
    assert_eq!((code, report["differences"].as_u64()), (Some(0), Some(0)), "{report}");
    jetstream::new(o.client.clone()).get_stream(format!("KV_{NEEDS}")).await.unwrap().purge().await.expect("purge");
    let (code, report) = run_verify(&o.url, "all", "all-pw").await;
    assert_eq!(code, Some(4), "verify exits 4 on a difference: {report}");
    let needs = report["buckets"].as_array().unwrap().iter().find(|b| b["bucket"] == NEEDS).cloned().unwrap();
    assert_eq!((needs["on_bus"].as_u64(), needs["answered"].as_u64()), (Some(0), Some(12)), "{needs}");
    let lines: Vec<&str> = needs["differences"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(lines.len(), 12, "{lines:?}");
    for i in 0..12 {
        let key = format!("\"alpha.app{i}.config.url\"");
        assert!(lines.iter().any(|l| l.starts_with(&key) && l.contains("not on the bus")), "{key} not named: {lines:?}");
    }
    o.host.stop().await;
    o.server.stop().await;
}

#[tokio::test]
async fn the_audit_drops_keys_a_whole_bucket_purge_removed() {
    let o = open("1s", async |_| {}).await;
    put_needs(&o.client, 30).await;
    until_needs(&o.client, 30, &o.host).await;
    jetstream::new(o.client.clone()).get_stream(format!("KV_{NEEDS}")).await.unwrap().purge().await.expect("purge");
    let took = until_needs(&o.client, 0, &o.host).await;
    println!("a purge of 30 keys left the answers after {took:?}");
    let data = stats_data(&o.client).await;
    assert!(repairs(&data, NEEDS) >= 1, "{data}");
    assert!(data["mirror_audits"][NEEDS].as_u64().unwrap_or(0) >= 1, "{data}");
    assert!(o.host.log_text().contains("holds 0 subjects and the mirror 30"), "the log names the difference:\n{}", o.host.log_text());
    // Written again after the purge: followed as ever.
    put_needs(&o.client, 3).await;
    until_needs(&o.client, 3, &o.host).await;
    let (code, report) = run_verify(&o.url, "all", "all-pw").await;
    assert_eq!(code, Some(0), "{report}");
    o.host.stop().await;
    o.server.stop().await;
}

#[tokio::test]
async fn the_audit_drops_keys_their_buckets_max_age_expired() {
    let o = open("1s", async |js| {
        js.create_key_value(kv::Config { bucket: NEEDS.into(), history: 1, max_age: Duration::from_secs(2), ..Default::default() })
            .await
            .expect("needs with a max age");
    })
    .await;
    put_needs(&o.client, 10).await;
    // Answered (so mirrored) before they expired: the audit, not the watch, must drop them.
    until_needs(&o.client, 10, &o.host).await;
    let took = until_needs(&o.client, 0, &o.host).await;
    println!("10 keys with a 2 s max age left the answers after {took:?}");
    assert!(repairs(&stats_data(&o.client).await, NEEDS) >= 1);
    let (code, report) = run_verify(&o.url, "all", "all-pw").await;
    assert_eq!(code, Some(0), "{report}");
    o.host.stop().await;
    o.server.stop().await;
}

#[tokio::test]
async fn the_audit_drops_a_key_whose_own_ttl_ran_out() {
    // A bucket that allows per-message TTLs and places no marker when one runs out: the key
    // simply goes, with no message to any watch.
    let o = open("1s", async |js| {
        js.create_stream(tests::nats::bucket_with_ttls(NEEDS)).await.expect("needs with per-key TTLs");
    })
    .await;
    put_needs(&o.client, 4).await;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-TTL", "2s");
    let js = jetstream::new(o.client.clone());
    js.publish_with_headers(format!("$KV.{NEEDS}.beta.web.secret.token"), headers, "{}".into()).await.unwrap().await.expect("ttl put acknowledged");
    until_needs(&o.client, 5, &o.host).await;
    let took = until_needs(&o.client, 4, &o.host).await;
    println!("a key with a 2 s TTL left the answers after {took:?}");
    assert!(!answered(&o.client, "needs").await.contains(&"beta.web.secret.token".to_string()));
    let (code, report) = run_verify(&o.url, "all", "all-pw").await;
    assert_eq!(code, Some(0), "{report}");
    o.host.stop().await;
    o.server.stop().await;
}

#[tokio::test]
async fn a_bucket_made_anew_is_followed_from_its_new_first_revision() {
    let o = open("1s", async |_| {}).await;
    put_needs(&o.client, 20).await;
    until_needs(&o.client, 20, &o.host).await;
    let js = jetstream::new(o.client.clone());
    js.delete_stream(format!("KV_{NEEDS}")).await.expect("delete the bucket");
    js.create_key_value(kv::Config { bucket: NEEDS.into(), history: 1, ..Default::default() }).await.expect("made anew");
    let revisions = put_needs(&o.client, 3).await;
    assert_eq!(revisions, [1, 2, 3]);
    until_needs(&o.client, 3, &o.host).await;
    let v = ask_ok(&o.client, json!({"what": "needs"})).await;
    let got: Vec<u64> = v["entries"].as_array().unwrap().iter().filter_map(|e| e["revision"].as_u64()).collect();
    assert_eq!(got, [1, 2, 3], "{v}");
    assert_eq!(v["revision"], 3, "the answer's revision is the new stream's: {v}");
    let (code, report) = run_verify(&o.url, "all", "all-pw").await;
    assert_eq!(code, Some(0), "{report}");
    o.host.stop().await;
    o.server.stop().await;
}

#[tokio::test]
async fn a_bus_that_lost_its_store_is_served_again() {
    let bus = Bus::start().await;
    let mut host = Host::start(&bus, &["--seat-ttl", "2s", "--audit-every", "1h"]).await;
    let instance = host_instance(&bus).await;
    let alpha = bus.client("node-alpha").await;
    let before = ask_ok(&alpha, json!({"what": "registry"})).await;
    let kinds = before["entries"].as_array().unwrap().len();
    assert_eq!(kinds, 13, "{before}");
    // The disk is lost: the same server comes back with nothing.
    let started = Instant::now();
    let bus = bus.restart_empty().await;
    let alpha = bus.client("node-alpha").await;
    loop {
        if let Ok((None, v)) = ask_raw(&alpha, br#"{"what":"registry"}"#).await {
            if v["entries"].as_array().map(Vec::len) == Some(kinds) {
                break;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(45), "never served the registry again:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("served again {:?} after the store was lost", started.elapsed());
    // The holder's own lease runs on until its next renewal finds the seat's bucket gone; then
    // it takes the seat again in the bucket made anew (and serves nothing in between).
    let start = Instant::now();
    while bus.seat_holder().await.as_deref() != Some(instance.as_str()) {
        assert!(start.elapsed() < Duration::from_secs(15), "the seat is not held again by {instance}:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bus.until_seat_renewed_twice().await;
    let after = ask_until(&alpha, json!({"what": "registry"}), "the whole registry", |v| v["entries"].as_array().map(Vec::len) == Some(kinds)).await;
    let mut listed: Vec<String> = after["entries"].as_array().unwrap().iter().map(|e| e["key"].as_str().unwrap().to_string()).collect();
    listed.sort();
    assert_eq!(listed, compiled_kinds().await, "the registry bucket equals the compiled table");
    // The node clients' buckets are there again (one stream each, until the operator makes
    // them of the nodes' shares again): a need written now is answered.
    let js = bus.js("node-alpha").await;
    let start = Instant::now();
    loop {
        match js.publish(format!("$KV.{NEEDS}.alpha.app.config.url"), "\"postgres://db\"".into()).await.expect("sent").await {
            Ok(_) => break,
            Err(e) => assert!(start.elapsed() < Duration::from_secs(15), "the needs bucket was not made again: {e}\n{}", host.log_text()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = async || format!("\n{}", host.log_text());
    ask_until_else(&alpha, json!({"what": "needs"}), "the need written after the loss", |v| v["entries"].as_array().map(Vec::len) == Some(1), log).await;
    let (code, report) = run_verify(bus.url(), "mesh-provisioner", &bus.password("mesh-provisioner")).await;
    assert_eq!(code, Some(0), "{report}");
    assert!(host.log_text().contains("the bus had lost these buckets"), "{}", host.log_text());
    host.child.start_kill().ok();
}

async fn host_instance(bus: &Bus) -> String {
    let start = Instant::now();
    loop {
        if let Some(i) = bus.seat_holder().await {
            return i;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "nobody holds the seat");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_bus_that_hangs_is_recovered_from_by_itself() {
    let bus = Bus::start().await;
    let mut host = Host::start(&bus, &["--seat-ttl", "2s", "--audit-every", "1h"]).await;
    let alpha = bus.client("node-alpha").await;
    bus.put("node-alpha", NEEDS, "alpha.app.config.url", b"1").await;
    // Paused past the seat's TTL and every bus deadline; nothing can carry a reply meanwhile.
    bus.signal("STOP");
    tokio::time::sleep(Duration::from_secs(8)).await;
    bus.signal("CONT");
    let resumed = Instant::now();
    host.wait_answering(&alpha).await;
    println!("answering again {:?} after the bus resumed", resumed.elapsed());
    // A server catching up after the pause may answer a renewal late once more: steady once the
    // holder renewed twice.
    bus.until_seat_renewed_twice().await;
    bus.put("node-alpha", NEEDS, "alpha.app.config.url", b"2").await;
    let log = async || format!("\n{}", host.log_text());
    ask_until_else(&alpha, json!({"what": "needs"}), "the write after the pause", |v| v["entries"][0]["value"] == json!(2), log).await;
    assert!(bus.seat_holder().await.is_some());
    let (code, report) = run_verify(bus.url(), "mesh-provisioner", &bus.password("mesh-provisioner")).await;
    assert_eq!(code, Some(0), "{report}");
    host.child.start_kill().ok();
}

#[tokio::test]
async fn the_mirror_of_a_deleted_bucket_nobody_reads_is_dropped() {
    // Nobody reads it: not even the states' periodic sweep, which reads every module's status
    // (gamma/app's reads gamma's compositions) and so keeps a read mirror, as it should.
    let o = open_with("1s", &["--state-sweep-every", "1h"], async |js| {
        js.create_key_value(kv::Config { bucket: "composed-gamma".into(), history: 1, ..Default::default() }).await.expect("composed-gamma");
        js.create_key_value(kv::Config { bucket: "mesh-controller_assignments".into(), history: 1, ..Default::default() }).await.expect("assignments");
    })
    .await;
    let js = jetstream::new(o.client.clone());
    js.get_key_value("mesh-controller_assignments").await.unwrap().put("gamma.app", r#"{"want":"b1"}"#.into()).await.unwrap();
    let mirrors = |m: &Value| m["mirrors"].as_str().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    // The plan reads gamma's compositions (the plans task follows every `composed-*` anyway).
    let (code, v) = tests::nats::ask_verb(&o.client, "mesh-provisioner.plan", br#"{"node":"gamma","module":"app"}"#).await.unwrap();
    assert_eq!(code, None, "{v}");
    // The registry, the three node buckets, the assignments, the states (gamma/app's record),
    // the builds' (missing: never mirrored) and composed-gamma.
    let with = Host::info_until(&o.client, "the composition's mirror", |m| mirrors(m) == 7).await;
    js.delete_stream("KV_composed-gamma").await.expect("delete composed-gamma");
    let start = Instant::now();
    while mirrors(&Host::info(&o.client).await) >= mirrors(&with) {
        assert!(start.elapsed() < Duration::from_secs(45), "the deleted bucket's mirror is kept:\n{}", o.host.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("dropped {:?} after the bucket was deleted", start.elapsed());
    assert!(o.host.log_text().contains("the bucket is gone and nobody reads it: mirror dropped"));
    // Asked again, it reads as missing, without a mirror kept for it.
    let (code, v) = tests::nats::ask_verb(&o.client, "mesh-provisioner.plan", br#"{"node":"gamma","module":"app"}"#).await.unwrap();
    assert_eq!(code, None, "{v}");
    assert!(v.to_string().contains("not published") || v["state"] == "waiting", "{v}");
    o.host.stop().await;
    o.server.stop().await;
}
