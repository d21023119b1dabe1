//! Abusive requesters end to end: a node's user asks plans and status for 10 000 nodes that do
//! not exist. Every request is answered, the server follows no bucket it would not follow
//! anyway (the mirror count in `$SRV.INFO` does not grow: a bucket that does not exist is never
//! mirrored), and plans of the real mesh still follow its changes.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use tests::nats::{ask_verb, Bus, Host};

async fn plan_of(c: &async_nats::Client, node: &str, module: &str) -> Value {
    let (code, v) = ask_verb(c, "mesh-provisioner.plan", json!({"node":node,"module":module}).to_string().as_bytes()).await.expect("the plan verb answers");
    assert_eq!(code, None, "{v}");
    v
}

async fn mirrors(c: &async_nats::Client) -> u64 {
    Host::info(c).await["mirrors"].as_str().and_then(|m| m.parse().ok()).expect("INFO names the mirror count")
}

/// The mirror count once it has not moved for longer than a listing (bounded).
async fn settled_mirrors(c: &async_nats::Client) -> u64 {
    let start = Instant::now();
    let (mut count, mut since) = (mirrors(c).await, Instant::now());
    while since.elapsed() < Duration::from_secs(6) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = mirrors(c).await;
        if now != count {
            (count, since) = (now, Instant::now());
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the mirror count never settled: {count}");
    }
    count
}

#[tokio::test]
async fn requests_for_nodes_that_do_not_exist_leave_nothing_behind() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let _host = Host::start(&bus, &[]).await;
    let composed = tests::sample_composition();
    bus.put("node-alpha", "composed-alpha", "app.b1", composed.as_bytes()).await;
    bus.put("mesh-controller", "mesh-controller_assignments", "alpha.app", br#"{"want":"b1"}"#).await;
    // The indexer knows a build of `app`: a plan of `app` on any node once read its composition.
    bus.put("mesh-indexer", "mesh-indexer_builds", "app", br#"{"newest":"b1"}"#).await;
    let c = bus.client("node-alpha").await;
    let start = Instant::now();
    while plan_of(&c, "alpha", "app").await["state"] != "planned" {
        assert!(start.elapsed() < Duration::from_secs(20), "alpha/app never planned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The buckets listed as plan inputs are mirrored within a listing (every 5 s): the count is
    // settled once it held over more than a listing.
    let before = settled_mirrors(&c).await;

    let asked = futures::stream::iter(0..10_000)
        .map(|i| {
            let c = c.clone();
            async move {
                let body = if i % 10 == 0 { json!({"what":"status","node":format!("bogus{i}")}) } else { json!({"node":format!("bogus{i}"),"module":"app"}) };
                let verb = if i % 10 == 0 { "mesh-provisioner.provisioning" } else { "mesh-provisioner.plan" };
                ask_verb(&c, verb, body.to_string().as_bytes()).await
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    let mut answered = 0;
    for r in &asked {
        let (code, v) = r.as_ref().expect("every request is answered");
        assert_eq!(code, &None, "{v}");
        answered += 1;
        if let Some(state) = v.get("state") {
            assert_eq!(state, "waiting", "{v}");
            assert!(v["reason"].as_str().unwrap_or("").contains("it is not on that node"), "{v}");
        } else {
            assert_eq!(v["entries"], json!([]), "{v}");
        }
    }
    assert_eq!(answered, 10_000);
    let after = mirrors(&c).await;
    assert!(after <= before, "10 000 requests for unknown nodes made the server follow {} more bucket(s)", after - before);

    // The real mesh still plans: a new build of alpha/app is followed.
    bus.put("node-alpha", "composed-alpha", "app.b2", composed.as_bytes()).await;
    bus.put("mesh-controller", "mesh-controller_assignments", "alpha.app", br#"{"want":"b2"}"#).await;
    let start = Instant::now();
    loop {
        let p = plan_of(&c, "alpha", "app").await;
        if p["state"] == "planned" && p["want"] == "b2" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "alpha/app never planned at b2: {p}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
