//! Rotation end to end (SPEC §7.2): the real host binary and component against a real
//! `nats-server` with the example config. Three nodes hold `bound:postgres.db` (alpha in two
//! modules); the provider rewrites every value; each node's own user hears exactly one notice per
//! holding module (a standby runs beside the holder and sends none); `holders` reads `stale`
//! until each node applies the new revision, then `all_current`, and `query holders` exits 3,
//! then 0. A holder killed and replaced does not send old changes again. Each node may hear
//! only its own notices.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use tests::nats::{ask_ok, host_binary, Bus, Host};

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const BOUND: &str = "postgres_bound";
const TTL: &str = "2s";

/// The holding modules: (node, module).
const HOLDERS: [(&str, &str); 4] = [("alpha", "app"), ("alpha", "worker"), ("beta", "app"), ("gamma", "app")];

fn spawn(bus: &Bus, name: &str) -> Host {
    Host::spawn(bus.url(), bus, tempfile::tempdir().unwrap(), &tests::component_path(), &["--seat-ttl", TTL, "--instance", name])
}

/// The notices each node's own user hears, by node.
#[derive(Clone, Default)]
struct Heard(Arc<Mutex<BTreeMap<String, Vec<Value>>>>);

impl Heard {
    async fn listen(&self, bus: &Bus, node: &str) -> async_nats::Client {
        let client = bus.client(&format!("node-{node}")).await;
        let mut sub = client.subscribe(format!("mesh-provisioner.notice.{node}")).await.unwrap();
        client.flush().await.unwrap();
        let (heard, node) = (self.0.clone(), node.to_string());
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let v: Value = serde_json::from_slice(&m.payload).unwrap_or(json!({"unreadable": String::from_utf8_lossy(&m.payload)}));
                // A notice that does not fit docs/schema/notice.json is heard as that, which no
                // expected notice equals (a panic here would only end this task).
                let misfit = tests::schema::errors("notice", &v);
                let v = if misfit.is_empty() { v } else { json!({"does_not_fit_schema": misfit, "notice": v}) };
                heard.lock().unwrap().entry(node.clone()).or_default().push(v);
            }
        });
        client
    }

    fn take(&self) -> BTreeMap<String, Vec<Value>> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().values().map(Vec::len).sum()
    }

    /// Waits (bounded) until `n` notices were heard, then a little longer for any extra.
    async fn until(&self, n: usize) -> BTreeMap<String, Vec<Value>> {
        let start = Instant::now();
        while self.count() < n {
            assert!(start.elapsed() < Duration::from_secs(20), "heard {} of {n} notices: {:?}", self.count(), self.0.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        self.take()
    }
}

async fn holders(c: &async_nats::Client) -> Value {
    ask_ok(c, json!({"what":"holders","kind":"bound","name":"postgres.db"})).await
}

/// Asks until `cond` holds of the holders (bounded).
async fn holders_until(c: &async_nats::Client, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let v = holders(c).await;
        if cond(&v) {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "holders never showed {what}: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn states(v: &Value) -> Vec<String> {
    v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| format!("{}/{}:{}", h["node"].as_str().unwrap(), h["module"].as_str().unwrap(), h["state"].as_str().unwrap()))
        .collect()
}

/// Each holder applies the revision at its place now.
async fn apply_all(bus: &Bus, revisions: &BTreeMap<(&str, &str), u64>) {
    for ((node, module), rev) in revisions {
        let record = json!({"build":"b1","needs":1,"values":{"bound:postgres.db":rev},"at":"2026-11-30T10:00:00Z"});
        bus.put(&format!("node-{node}"), APPLIED, &format!("{node}.{module}"), record.to_string().as_bytes()).await;
    }
}

/// The provider writes a new generation of every holder's value; the revisions, by holder.
async fn rotate(bus: &Bus, generation: &str) -> BTreeMap<(&'static str, &'static str), u64> {
    let mut out = BTreeMap::new();
    for (node, module) in HOLDERS {
        let value = json!({"user": module, "password": format!("{generation}-{node}")});
        out.insert((node, module), bus.put("provider-postgres", BOUND, &format!("{node}.{module}.db"), value.to_string().as_bytes()).await);
    }
    out
}

/// `query holders` as a rotation script runs it: its exit code and what it printed.
fn query_holders(bus: &Bus) -> (i32, String) {
    let pw = bus.password("node-alpha");
    let out = std::process::Command::new(host_binary())
        .args(["query", "holders", "--kind", "bound", "--name", "postgres.db", "--nats-url", bus.url(), "--user", "node-alpha", "--password", pw.as_str()])
        .output()
        .expect("query runs");
    (out.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test]
async fn each_holder_is_told_once_and_reads_stale_until_it_applies_the_new_value() {
    let bus = Bus::start().await;
    let mut first = spawn(&bus, "first");
    first.wait_serving(&bus).await;
    // A standby beside the holder: were it to send notices, each would be heard twice.
    let mut second = spawn(&bus, "second");
    let start = Instant::now();
    while !second.log_text().contains("standing by") {
        assert!(start.elapsed() < Duration::from_secs(30), "no standby:\n{}", second.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    bus.make_bucket(BOUND).await;
    bus.make_bucket("mesh-controller_assignments").await;
    // The provider runs: assigned to gamma by the controller, applied there (SPEC §7.3).
    bus.put("mesh-controller", "mesh-controller_assignments", "gamma.postgres", br#"{"want":"p1"}"#).await;
    bus.put("node-gamma", "mesh-provisioner_applied", "gamma.postgres", br#"{"build":"p1","needs":0}"#).await;
    for (node, module) in HOLDERS {
        bus.put(&format!("node-{node}"), NEEDS, &format!("{node}.{module}.bound.postgres=2Edb"), br#"{"placeholder":"${bound:postgres.db}"}"#).await;
    }
    let asker = bus.client("node-beta").await;
    let v = holders_until(&asker, "four holders, never applied", |v| v["count"] == 4).await;
    assert!(states(&v).iter().all(|s| s.ends_with(":never_applied")), "{v}");
    let generation_one = rotate(&bus, "one").await;
    apply_all(&bus, &generation_one).await;
    holders_until(&asker, "all current", |v| v["all_current"] == true).await;
    assert_eq!(query_holders(&bus).0, 0, "{}", query_holders(&bus).1);

    let heard = Heard::default();
    let mut listeners = Vec::new();
    for node in ["alpha", "beta", "gamma"] {
        listeners.push(heard.listen(&bus, node).await);
    }
    // The first generation's writes are long done: nothing is heard of them now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(heard.count(), 0, "{:?}", heard.take());

    // The provider rotates every value: each node hears once per holding module.
    let generation_two = rotate(&bus, "two").await;
    let got = heard.until(4).await;
    let by_node: BTreeMap<&str, usize> = got.iter().map(|(n, v)| (n.as_str(), v.len())).collect();
    assert_eq!(by_node, BTreeMap::from([("alpha", 2), ("beta", 1), ("gamma", 1)]), "{got:?}");
    for (node, notices) in &got {
        for n in notices {
            let module = n["module"].as_str().unwrap();
            let rev = generation_two[&(node.as_str(), HOLDERS.iter().find(|(_, m)| *m == module).unwrap().1)];
            assert_eq!(
                n,
                &json!({"node":node,"module":module,"kind":"bound","name":"postgres.db","place":{"bucket":BOUND,"key":format!("{node}.{module}.db")},"revision":rev}),
            );
        }
    }

    // Every holder is stale until its node applies the new revision; the script waits.
    let v = holders(&asker).await;
    assert!(states(&v).iter().all(|s| s.ends_with(":stale")), "{v}");
    assert_eq!(v["all_current"], false);
    let (code, text) = query_holders(&bus);
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("stale") && text.contains("not every holder of bound:postgres.db"), "{text}");
    apply_all(&bus, &generation_two).await;
    holders_until(&asker, "all current again", |v| v["all_current"] == true).await;
    let (code, text) = query_holders(&bus);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("all 4 holder(s) of bound:postgres.db run the value at their place"), "{text}");

    // The holder dies; the standby takes over (replaying its mirrors) and sends nothing old.
    first.signal("KILL");
    let _ = first.child.wait().await;
    second.wait_answering(&asker).await;
    // The new holder took the seat and follows the notice buckets (mirrors it replayed as a
    // standby); a fresh instance replays every mirror as a standby, up to warm: still nothing
    // heard of the old changes.
    for (host, what) in [(&second, "took the seat"), (&second, "following the buckets notices depend on")] {
        let start = Instant::now();
        while !host.log_text().contains(what) {
            assert!(start.elapsed() < Duration::from_secs(30), "the new holder's log never said {what:?}:\n{}", host.log_text());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let third = spawn(&bus, "third");
    let start = Instant::now();
    while !third.log_text().contains("standing by: mirrors warm") {
        assert!(start.elapsed() < Duration::from_secs(30), "the third instance never stood by:\n{}", third.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(heard.count(), 0, "old changes were sent again: {:?}", heard.take());

    // A new change is told once, by the new holder only.
    let rev = bus.put("provider-postgres", BOUND, "gamma.app.db", br#"{"password":"three"}"#).await;
    let got = heard.until(1).await;
    assert_eq!(got.keys().collect::<Vec<_>>(), ["gamma"], "{got:?}");
    assert_eq!((got["gamma"].len(), &got["gamma"][0]["revision"]), (1, &json!(rev)), "{got:?}");
    assert!(second.log_text().contains("notices published"), "{}", second.log_text());
    assert!(!third.log_text().contains("notices published"), "a standby published:\n{}", third.log_text());

    // Narrowed by node: that node's holders only.
    let v = ask_ok(&asker, json!({"what":"holders","kind":"bound","name":"postgres.db","node":"alpha"})).await;
    let named: Vec<String> = states(&v).iter().map(|s| s.split(':').next().unwrap_or_default().to_string()).collect();
    assert_eq!((named, &v["count"]), (vec!["alpha/app".to_string(), "alpha/worker".into()], &json!(2)), "{v}");
    // A value deleted: its one holder is told, the notice saying it was a delete.
    bus.js("provider-postgres").await.get_key_value(BOUND).await.unwrap().delete("beta.app.db").await.unwrap();
    let got = heard.until(1).await;
    assert_eq!(got.keys().collect::<Vec<_>>(), ["beta"], "{got:?}");
    let notice = &got["beta"][0];
    assert_eq!((&notice["module"], &notice["place"]["key"], &notice["deleted"]), (&json!("app"), &json!("beta.app.db"), &json!(true)), "{got:?}");
    drop(listeners);
}

#[tokio::test]
async fn a_node_hears_only_its_own_notices() {
    let bus = Bus::start().await;
    let (alpha, denials) = bus.watched("node-alpha").await;
    let _own = alpha.subscribe("mesh-provisioner.notice.alpha").await.unwrap();
    let _other = alpha.subscribe("mesh-provisioner.notice.beta").await.unwrap();
    let _all = alpha.subscribe("mesh-provisioner.notice.>").await.unwrap();
    alpha.flush().await.unwrap();
    denials.expect("Subscription to", "mesh-provisioner.notice.beta").await;
    denials.expect("Subscription to", "mesh-provisioner.notice.>").await;
    assert!(!denials.all().iter().any(|d| d.contains("notice.alpha\"")), "{:?}", denials.all());
    // Nor can a node publish a notice in the provisioner's name.
    let (beta, denials) = bus.watched("node-beta").await;
    beta.publish("mesh-provisioner.notice.alpha", "{}".into()).await.unwrap();
    beta.flush().await.unwrap();
    denials.expect("Publish to", "mesh-provisioner.notice.alpha").await;
}
