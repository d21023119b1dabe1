//! A node behind its own leaf server (deploy/leaf-node.conf), joined as a leaf node to a hub of
//! three servers (the example accounts config with a `leafnodes` block) with the node's
//! credentials. Two leaves, alpha and beta. Through its leaf, a node asks both verbs, hears its
//! own notices and events and nothing of another node's, and writes only its own keys; when the
//! leaf's link to the hub is cut and restored, every request asked after it came back is
//! answered, and notices flow again.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::{Client, ConnectOptions};
use futures::StreamExt;
use serde_json::{json, Value};
use tests::nats::{ask_ok, ask_verb, ask_within, Cluster, Host, RawServer};
use tests::proxy::Relay;

const NEEDS: &str = "mesh-provisioner_needs";
const BOUND: &str = "postgres_bound";

/// A node's leaf server, rendered from the example file, reaching the hub through `relay`.
async fn leaf(node: &str, password: &str, relay: &Relay) -> RawServer {
    let template = std::fs::read_to_string(tests::root().join("deploy/leaf-node.conf")).expect("deploy/leaf-node.conf");
    let config = template.replace("{{NODE}}", node).replace("{{HUB_URLS}}", &format!("\"nats-leaf://leaf-{node}:{password}@127.0.0.1:{}\"", relay.port));
    RawServer::start(&config).await
}

/// A client of the node's leaf server, as the node's processes connect: no password (the leaf
/// listens on loopback), the library's default inbox.
async fn local(leaf: &RawServer, node: &str) -> Client {
    ConnectOptions::new().connect(format!("nats://127.0.0.1:{}", leaf.port)).await.unwrap_or_else(|e| panic!("connect to {node}'s leaf: {e}"))
}

/// Asks until the verb answers through the leaf (bounded): the leaf's link is up and the hub
/// knows its interest.
async fn until_answered(c: &Client, what: &str) {
    let start = Instant::now();
    loop {
        if let Ok((None, _)) = ask_within(c, b"{}", Duration::from_secs(2)).await {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never answered through the leaf: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a JetStream publish of `subject` is stored (acknowledged by a stream).
async fn stored(js: &jetstream::Context, subject: String) -> bool {
    match js.publish(subject, "forged".into()).await {
        Ok(ack) => ack.await.is_ok(),
        Err(_) => false,
    }
}

/// Everything heard on `sub` for `within`.
async fn heard(sub: &mut async_nats::Subscriber, within: Duration) -> Vec<Value> {
    let mut out = Vec::new();
    let end = tokio::time::Instant::now() + within;
    while let Ok(Some(m)) = tokio::time::timeout_at(end, sub.next()).await {
        out.push(serde_json::from_slice(&m.payload).unwrap_or(json!({"unreadable": String::from_utf8_lossy(&m.payload)})));
    }
    out
}

/// Longest a write acknowledged by a node's share may take to be sourced into its bucket across
/// the cluster: a source whose consumer could not be made retries on nats-server's backoff,
/// seen to take past a minute on two busy cores.
const SOURCED_WITHIN: u64 = 150;

#[tokio::test]
async fn a_node_behind_its_leaf_asks_hears_and_writes_only_its_own_and_survives_its_link() {
    let hub = Cluster::start_hub(3, true).await;
    for bucket in [NEEDS, "mesh-provisioner_applied", "mesh-provisioner_collect", BOUND, "mesh-controller_assignments"] {
        hub.make_bucket(bucket).await;
    }
    let mut host = Host::spawn(&hub.urls(), &hub, tempfile::tempdir().unwrap(), &tests::component_path(), &[]);
    let relays = [Relay::start(hub.leaf_ports[0]).await, Relay::start(hub.leaf_ports[1]).await];
    let leaves = [leaf("alpha", &hub.password("leaf-alpha"), &relays[0]).await, leaf("beta", &hub.password("leaf-beta"), &relays[1]).await];
    let (alpha, beta) = (local(&leaves[0], "alpha").await, local(&leaves[1], "beta").await);
    host.wait_answering(&hub.client("node-gamma").await).await;
    until_answered(&alpha, "alpha").await;
    until_answered(&beta, "beta").await;

    // Both verbs, through the leaf.
    let js = jetstream::new(alpha.clone());
    let ack = js.publish(format!("kv.{NEEDS}.alpha.app.bound.postgres=2Edb"), r#"{"placeholder":"${bound:postgres.db}"}"#.into()).await.expect("published");
    ack.await.expect("alpha writes its own need, acknowledged by the stream");
    let start = Instant::now();
    loop {
        let v = ask_ok(&alpha, json!({"what":"needs","node":"alpha"})).await;
        if tests::keys(&v) == ["alpha.app.bound.postgres=2Edb"] {
            break;
        }
        // Sourced from alpha's share into the bucket across the cluster: a source whose consumer
        // could not be made retries on the server's backoff (seen to take past a minute).
        assert!(start.elapsed() < Duration::from_secs(SOURCED_WITHIN), "alpha's need never answered: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, plan) = ask_verb(&alpha, "mesh-provisioner.plan", br#"{"node":"alpha","module":"app"}"#).await.expect("the plan verb answers through the leaf");
    assert_eq!((code, &plan["module"]), (None, &json!("app")), "{plan}");

    // Only its own keys: beta's need, written from alpha's leaf, never reaches the bucket.
    let mut short = jetstream::new(alpha.clone());
    short.set_timeout(Duration::from_millis(1500));
    for forged in [format!("kv.{NEEDS}.beta.app.config.x"), format!("$KV.{NEEDS}.beta.app.config.x")] {
        assert!(!stored(&short, forged.clone()).await, "{forged} from alpha's leaf was stored");
    }
    let v = ask_ok(&beta, json!({"what":"needs","node":"beta"})).await;
    assert_eq!(tests::keys(&v), Vec::<String>::new(), "beta's keys: {v}");
    // Nor, holding the leaf's password, straight at the hub: its account has no JetStream API
    // (no stream to make that would capture another's subjects) and no other node's subject.
    let thief = ConnectOptions::with_user_and_password("leaf-alpha".into(), hub.password("leaf-alpha"))
        .connect(hub.urls().split(',').next().unwrap())
        .await
        .expect("the leaf's user connects");
    let mut thief_js = jetstream::new(thief.clone());
    thief_js.set_timeout(Duration::from_millis(1500));
    let made = thief_js
        .create_stream(jetstream::stream::Config { name: "grab".into(), subjects: vec!["mesh-provisioner.notice.>".into()], ..Default::default() })
        .await;
    assert!(made.is_err(), "the leaf's user made a stream");
    for forged in [format!("kv.{NEEDS}.beta.app.config.x"), format!("$KV.{NEEDS}.beta.app.config.x")] {
        assert!(!stored(&thief_js, forged.clone()).await, "{forged} from the leaf's user at the hub was stored");
    }
    let v = ask_ok(&beta, json!({"what":"needs","node":"beta"})).await;
    assert_eq!(tests::keys(&v), Vec::<String>::new(), "beta's keys after the leaf's user tried: {v}");

    // Its own notices and events, nothing of another node's: alpha listens on its own subjects,
    // beta's and every node's; beta needs the same value, so a rotation tells both.
    let mut own = alpha.subscribe("mesh-provisioner.notice.alpha").await.unwrap();
    let mut other = alpha.subscribe("mesh-provisioner.notice.beta").await.unwrap();
    let mut every = alpha.subscribe("mesh-provisioner.>").await.unwrap();
    let mut beta_own = beta.subscribe("mesh-provisioner.notice.beta").await.unwrap();
    alpha.flush().await.unwrap();
    beta.flush().await.unwrap();
    jetstream::new(beta.clone())
        .publish(format!("kv.{NEEDS}.beta.app.bound.postgres=2Edb"), "{}".into())
        .await
        .unwrap()
        .await
        .expect("beta writes its own need");
    let provider = mesh_provisioner::nats::connect::jetstream_of(hub.client("provider-postgres").await, "provider-postgres");
    let bound = provider.get_key_value(BOUND).await.unwrap();
    // The mirrors follow both needs first (the verb lists both holders), so the value's change
    // is told to each.
    let start = std::time::Instant::now();
    loop {
        let v = ask_ok(&beta, json!({"what":"holders","kind":"bound","name":"postgres.db"})).await;
        let nodes: Vec<&str> = v["holders"].as_array().into_iter().flatten().filter_map(|e| e["node"].as_str()).collect();
        if nodes.contains(&"alpha") && nodes.contains(&"beta") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(SOURCED_WITHIN), "the holders never listed alpha and beta: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rev_alpha = bound.put("alpha.app.db", r#"{"password":"one"}"#.into()).await.unwrap();
    bound.put("beta.app.db", r#"{"password":"one"}"#.into()).await.unwrap();
    let got = heard(&mut own, Duration::from_secs(10)).await;
    assert!(got.iter().any(|n| n["node"] == "alpha" && n["revision"] == rev_alpha), "alpha's notice not heard through its leaf: {got:?}");
    for n in &got {
        tests::schema::check("notice", n);
    }
    assert!(!heard(&mut beta_own, Duration::from_secs(3)).await.is_empty(), "beta heard no notice through its leaf");
    let leaked = heard(&mut other, Duration::from_millis(500)).await;
    assert!(leaked.is_empty(), "alpha heard beta's notices: {leaked:?}");
    let all = heard(&mut every, Duration::from_millis(500)).await;
    assert!(all.iter().all(|m| m["node"] == "alpha"), "alpha heard another node's messages: {all:?}");

    // The link cut: nothing reaches the hub (no responder is known on the leaf)...
    relays[0].cut();
    let start = Instant::now();
    while ask_within(&alpha, b"{}", Duration::from_millis(500)).await.is_ok() {
        assert!(start.elapsed() < Duration::from_secs(15), "alpha's leaf still answered with its link cut");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ...a value changes meanwhile...
    let rev_two = bound.put("alpha.app.db", r#"{"password":"two"}"#.into()).await.unwrap();
    // ...and restored: once answered again, every request asked is answered.
    relays[0].restore();
    until_answered(&alpha, "after the link came back").await;
    // A node's client asks as a client does, a few at a time (a hundred at once would be shed
    // past --max-in-flight, an answer too, but not the one asked for).
    let answers: Vec<_> = futures::stream::iter(0..100)
        .map(|i| {
            let c = alpha.clone();
            async move {
                let body = if i % 2 == 0 { json!({"what":"needs","node":"alpha"}) } else { json!({"what":"status","node":"alpha","module":"app"}) };
                ask_within(&c, body.to_string().as_bytes(), Duration::from_secs(10)).await
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let mut answered = 0;
    for r in answers {
        let (code, v) = r.unwrap_or_else(|e| panic!("a request after the link came back was lost: {e}"));
        assert_eq!(code, None, "{v}");
        answered += 1;
    }
    assert_eq!(answered, 100);
    // The leaf's subscriptions came back with it: a new change is heard.
    let rev_three = bound.put("alpha.app.db", r#"{"password":"three"}"#.into()).await.unwrap();
    let got = heard(&mut own, Duration::from_secs(10)).await;
    assert!(got.iter().any(|n| n["revision"] == rev_three), "no notice through the restored link (the cut one was {rev_two}): {got:?}");
    drop(relays);
    drop(host);
}
