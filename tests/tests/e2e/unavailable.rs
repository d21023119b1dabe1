//! The `503` paths (SPEC §5), each end to end with its header and error body: a mirror that
//! is not in sync (not ready), and a bus whose JetStream cannot answer (bus down). The third,
//! a holder that lost the seat, is in `e2e::seat`.

use std::time::{Duration, Instant};

use async_nats::ConnectOptions;
use serde_json::Value;
use tests::nats::{ask_raw, ask_verb, Cluster, Host, RawServer};

/// Asks until the reply is a `503`, returning its body (bounded).
async fn until_503(client: &async_nats::Client, verb: &str, body: &[u8]) -> Value {
    let start = Instant::now();
    loop {
        let got = ask_verb(client, verb, body).await;
        if let Ok((Some(code), v)) = &got {
            if code == "503" {
                return v.clone();
            }
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never a 503 for {}: last {got:?}", String::from_utf8_lossy(body));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_bucket_whose_mirror_cannot_sync_is_answered_503_not_ready() {
    // The provisioner may not create consumers on the collect bucket (a grant forgotten in an
    // operator's config): that mirror can never replay, the others can.
    let server = RawServer::start(
        r#"listen: "127.0.0.1:{{PORT}}"
jetstream { store_dir: "{{DIR}}/js" }
accounts { MESH { jetstream: enabled, users: [
  { user: "prov", password: "prov-pw", permissions: { publish: { allow: [">"], deny: [
      "$JS.API.CONSUMER.CREATE.KV_mesh-provisioner_collect", "$JS.API.CONSUMER.CREATE.KV_mesh-provisioner_collect.>"] } } },
  { user: "asker", password: "asker-pw" }
] } }
"#,
    )
    .await;
    let url = format!("nats://127.0.0.1:{}", server.port);
    let mut host = Host::spawn_as(
        tempfile::tempdir().unwrap(),
        &tests::component_path(),
        &["--nats-url", &url, "--user", "prov", "--password", "prov-pw", "--guest-deadline", "500ms", "--seat-ttl", "2s"],
    );
    let client = ConnectOptions::with_user_and_password("asker".into(), "asker-pw".into()).connect(&url).await.unwrap();
    host.wait_answering(&client).await;
    let (code, v) = ask_raw(&client, br#"{"what":"needs"}"#).await.unwrap();
    assert_eq!(code, None, "the needs mirror is in sync: {v}");
    let (code, v) = ask_raw(&client, br#"{"what":"collect"}"#).await.unwrap();
    assert_eq!(code.as_deref(), Some("503"), "{v}");
    assert_eq!(v["error"]["code"], "unavailable");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("mesh-provisioner_collect's mirror to be in sync"), "{message}");
    assert!(v.get("entries").is_none());
    host.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_bus_whose_jetstream_lost_its_quorum_is_answered_503() {
    let mut cluster = Cluster::start(3).await;
    let bus0 = cluster.bus(0);
    // Every plan input but node gamma's compositions, which its engine makes only at the end.
    for (_, bucket) in tests::nats::PLAN_BUCKETS.iter().filter(|(_, b)| *b != "composed-gamma") {
        cluster.make_bucket(bucket).await;
    }
    bus0.put("mesh-controller", "mesh-controller_assignments", "gamma.app", br#"{"want":"b9"}"#).await;
    // The host and the asker both talk to server 0, which stays up; killing the other two
    // leaves JetStream's meta group without a quorum while core NATS works.
    // A first host makes its own buckets; once it is gone, every bucket made so far moves onto
    // server 0 alone, and the host that follows watches them there: its mirrors outlive the
    // quorum (and its seat is renewed on server 0).
    let args = ["--seat-ttl", "3s"];
    let client = bus0.client("node-alpha").await;
    let mut first = Host::spawn(bus0.url(), &cluster, tempfile::tempdir().unwrap(), &tests::component_path(), &args);
    first.wait_answering(&client).await;
    first.stop().await;
    cluster.pin_streams_to(0).await;
    let mut host = Host::spawn(bus0.url(), &cluster, tempfile::tempdir().unwrap(), &tests::component_path(), &args);
    host.wait_answering(&client).await;
    let start = Instant::now();
    while !matches!(ask_verb(&client, "mesh-provisioner.plan", br#"{"node":"gamma","module":"app"}"#).await, Ok((None, _))) {
        assert!(start.elapsed() < Duration::from_secs(30), "no plan answered after the move\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The operator makes gamma's bucket, and at once two servers die: the host has not mirrored
    // it yet, and following it needs the JetStream API, unavailable now: the plan of gamma/app,
    // read at its want, is a 503. The host is held still meanwhile (well within its lease): it
    // hears of a new bucket at once (the stream-created advisory) and could otherwise mirror it
    // before the servers are gone, and then answer "not yet published" forever.
    host.signal("STOP");
    cluster.make_bucket("composed-gamma").await;
    cluster.kill(1).await;
    cluster.kill(2).await;
    host.signal("CONT");
    let v = until_503(&client, "mesh-provisioner.plan", br#"{"node":"gamma","module":"app"}"#).await;
    assert_eq!(v["error"]["code"], "unavailable", "{v}");
    // The 503 of the bucket it could not follow, not any 503 (a seat lost says another thing).
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("composed-gamma") && !message.contains("seat"), "{v}");
    host.stop().await;
}
