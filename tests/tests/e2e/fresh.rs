//! Read-your-writes end to end (SPEC §5): a node's write acknowledged by its share, then a
//! request naming that share's sequence, answered from mirrors that hold it; `consistent`
//! answers over what the bus held when the request came; a revision not reached in time is a
//! `503 not_current` naming it. The real host binary, the real component, the example config.

use serde_json::{json, Value};
use tests::nats::{ask_ok, ask_raw, ask_verb, Bus, Host};

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const CONFIG: &str = "mesh-config_values";

fn keys(v: &Value) -> Vec<String> {
    v["entries"].as_array().into_iter().flatten().filter_map(|e| e["key"].as_str().map(str::to_string)).collect()
}

#[tokio::test]
async fn a_node_reads_its_own_writes_by_its_shares_sequence() {
    let bus = Bus::start().await;
    let host = Host::start(&bus, &[]).await;
    let c = bus.client("node-alpha").await;
    ask_ok(&c, json!({"what":"registry"})).await;
    for i in 0..20 {
        // Each write's acknowledgement is the share's sequence: the request names the share.
        let need = format!("alpha.app.config.k{i}");
        let seq = bus.put("node-alpha", NEEDS, &need, b"{}").await;
        let v = ask_ok(&c, json!({"what":"needs","node":"alpha","module":"app","min_revision":{"NODE_alpha": seq}})).await;
        assert!(keys(&v).contains(&need), "write {i} at NODE_alpha {seq} not in the answer: {v}");
        assert!(v["revisions"][NEEDS].as_u64().is_some_and(|r| r > 0), "the answer says the revision it read: {v}");
        let seq = bus.put("node-alpha", APPLIED, "alpha.app", format!(r#"{{"build":"b{i}","needs":{}}}"#, i + 1).as_bytes()).await;
        let s = ask_ok(&c, json!({"what":"status","node":"alpha","module":"app","min_revision":{"NODE_alpha": seq}})).await;
        let module = &s["entries"][0];
        assert_eq!(module["needs"].as_array().map(Vec::len), Some(i + 1), "status after write {i}: {s}");
        assert_eq!(module["have"], format!("b{i}"), "the applied record written at NODE_alpha {seq}: {s}");
        assert!(s["revisions"][APPLIED].as_u64().is_some() && s["revisions"][NEEDS].as_u64().is_some(), "{s}");
    }
    // The plan verb takes the same fields.
    let (code, plan) =
        ask_verb(&c, "mesh-provisioner.plan", json!({"node":"alpha","module":"app","min_revision":{"NODE_alpha": 1}}).to_string().as_bytes()).await.unwrap();
    assert_ne!(code.as_deref(), Some("400"), "{plan}");
    host.stop().await;
}

#[tokio::test]
async fn a_revision_not_reached_in_time_is_not_current_naming_it() {
    let bus = Bus::start().await;
    let host = Host::start(&bus, &[]).await;
    let c = bus.client("node-alpha").await;
    let seq = bus.put("node-alpha", NEEDS, "alpha.app.config.x", b"{}").await;
    // Reached first: the share's own write is answered.
    ask_ok(&c, json!({"what":"needs","node":"alpha","min_revision":{"NODE_alpha": seq},"wait":"4s"})).await;
    // A sequence the share has not got to: not reached, whatever the buckets hold.
    let ahead = seq + 1000;
    let (code, v) =
        ask_raw(&c, json!({"what":"needs","node":"alpha","min_revision":{"NODE_alpha": ahead},"wait":"300ms"}).to_string().as_bytes()).await.unwrap();
    assert_eq!(code.as_deref(), Some("503"), "{v}");
    let e = &v["error"];
    assert_eq!((e["code"].as_str(), e["name"].as_str(), e["asked"].as_u64()), (Some("not_current"), Some("NODE_alpha"), Some(ahead)), "{v}");
    assert!(e["revision"].as_u64().is_some_and(|r| r < ahead), "{v}");
    assert!(e["message"].as_str().unwrap_or_default().contains("waited 300 ms"), "{v}");
    // A bucket's own revision, likewise.
    let (code, v) = ask_raw(&c, json!({"what":"needs","min_revision":{NEEDS: 1_000_000},"wait":"0s"}).to_string().as_bytes()).await.unwrap();
    assert_eq!((code.as_deref(), v["error"]["name"].as_str()), (Some("503"), Some(NEEDS)), "{v}");
    // What is not a name is refused before anything waits.
    let (code, v) = ask_raw(&c, json!({"what":"needs","min_revision":{"KV_x.>": 1}}).to_string().as_bytes()).await.unwrap();
    assert_eq!(code.as_deref(), Some("400"), "{v}");
    let (code, v) = ask_raw(&c, json!({"what":"needs","wait":"1s"}).to_string().as_bytes()).await.unwrap();
    assert_eq!(code.as_deref(), Some("400"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("`wait` applies only with"), "{v}");
    host.stop().await;
}

#[tokio::test]
async fn a_consistent_answer_holds_every_write_acknowledged_before_it() {
    let bus = Bus::start().await;
    let host = Host::start(&bus, &[]).await;
    bus.make_bucket(CONFIG).await;
    let c = bus.client("node-alpha").await;
    bus.put("node-alpha", NEEDS, "alpha.app.config.db_url", b"{}").await;
    bus.put("node-alpha", APPLIED, "alpha.app", br#"{"build":"b1","needs":1}"#).await;
    tests::nats::status_until(&c, "alpha", "app", "its need", |s| s["needs"].as_array().is_some_and(|n| n.len() == 1)).await;
    for i in 0..20 {
        // Written by the config provider into its own bucket; asked at once by the node.
        let value = format!("postgres://db{i}");
        let revision = bus.put("mesh-config", CONFIG, "alpha.app.db_url", value.as_bytes()).await;
        let s = ask_ok(&c, json!({"what":"status","node":"alpha","module":"app","consistent":true,"wait":"4s"})).await;
        let need = &s["entries"][0]["needs"][0];
        assert_eq!((need["check"].as_str(), need["revision"].as_u64()), (Some("present"), Some(revision)), "write {i} of {CONFIG}: {s}");
        assert!(s["revisions"][CONFIG].as_u64().is_some_and(|r| r >= revision), "write {i} at {revision} of {CONFIG}: {s}");
    }
    host.stop().await;
}

/// The value of the metric line starting `name` (0 when absent).
async fn metric(http: &str, name: &str) -> f64 {
    let (_, _, page) = tests::browser::get(&format!("{http}/metrics")).await;
    page.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

#[tokio::test]
async fn requests_waiting_for_revisions_far_ahead_hold_at_most_half_the_calls() {
    let bus = Bus::start().await;
    // Four calls in flight: two may wait for the mirrors.
    let mut host = Host::start(&bus, &["--max-in-flight", "4", "--http", "127.0.0.1:0"]).await;
    let http = host.http_url().await;
    let c = bus.client("node-alpha").await;
    host.wait_answering(&c).await;
    let seq = bus.put("node-alpha", NEEDS, "alpha.app.config.x", b"{}").await;
    let far = json!({"what":"needs","node":"alpha","min_revision":{"NODE_alpha": seq + 1000},"wait":"6s"}).to_string();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let (c, far) = (c.clone(), far.clone());
            tokio::spawn(async move { tests::nats::ask_within(&c, far.as_bytes(), std::time::Duration::from_secs(20)).await })
        })
        .collect();
    let start = std::time::Instant::now();
    while metric(&http, "mesh_provisioner_reach_waiting ").await < 2.0 {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "the two waits never began");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Both permits taken: a third asks the same, and is answered at once with what is there.
    let (code, v) = ask_raw(&c, far.as_bytes()).await.unwrap();
    assert_eq!((code.as_deref(), v["error"]["code"].as_str()), (Some("503"), Some("not_current")), "{v}");
    assert!(waiters.iter().all(|w| !w.is_finished()), "the third was answered while the two still wait");
    // And a plain request is answered meanwhile.
    assert_eq!(ask_ok(&c, json!({"what":"needs","node":"alpha"})).await["entries"][0]["key"], "alpha.app.config.x");
    assert_eq!(metric(&http, "mesh_provisioner_reach_waits_total{outcome=\"not_waited\"}").await, 1.0);
    for w in waiters {
        let (code, v) = w.await.unwrap().unwrap();
        assert_eq!((code.as_deref(), v["error"]["code"].as_str()), (Some("503"), Some("not_current")), "{v}");
    }
    assert_eq!(metric(&http, "mesh_provisioner_reach_waits_total{outcome=\"not_reached\"}").await, 2.0);
    host.stop().await;
}
