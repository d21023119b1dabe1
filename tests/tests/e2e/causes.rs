//! Causes at scale, end to end (SPEC §7.4): a thousand modules on three nodes, written by each
//! node's own user, held by three causes; the real host answers `{"what":"causes"}` in pages
//! (each reply checked against its schema), and `query causes` and `query why` print them.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::nats::{host_binary, Bus, Host};

const NEEDS: &str = "mesh-provisioner_needs";
const ASSIGNMENTS: &str = "mesh-controller_assignments";

fn query(bus: &Bus, args: &[&str]) -> (bool, String) {
    let pw = bus.password("node-alpha");
    let out = std::process::Command::new(host_binary())
        .arg("query")
        .args(args)
        .args(["--nats-url", bus.url(), "--user", "node-alpha", "--password", pw.as_str(), "--timeout", "20s"])
        .output()
        .expect("run the host binary");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test]
async fn a_thousand_modules_held_by_three_causes_are_told_as_three() {
    let _heavy = tests::heavy().await;
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let host = Host::start(&bus, &[]).await;
    // postgres is assigned nowhere; no service answers mesh-vault's verbs, and no node runs
    // it; no domain answers the kind `widget`.
    let causes = ["bound.postgres=2Edb", "secret.api_key", "widget.x"];
    for (node, count) in [("alpha", 334), ("beta", 333), ("gamma", 333)] {
        let kv = bus.js(&format!("node-{node}")).await.get_key_value(NEEDS).await.expect("the needs bucket");
        for i in 0..count {
            let key = format!("{node}.m{i:04}.{}", causes[i % 3]);
            kv.put(&key, "{}".into()).await.unwrap_or_else(|e| panic!("node {node} writes {key}: {e}"));
        }
    }
    // Asked until every module is examined and each cause says since when it has held them
    // (the seat's holder records the states as it hears the writes).
    let start = Instant::now();
    let merged = loop {
        let (ok, out) = query(&bus, &["causes", "--json"]);
        if ok {
            let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("--json prints JSON ({e}): {out}"));
            let every_since = v["entries"].as_array().is_some_and(|c| c.iter().all(|c| c["since"].is_string()));
            if v["examined"] == 1000 && every_since {
                break v;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(120), "the causes never covered the 1000 modules: {}\n{}", tests::shorten(&out), host.log_text());
        // Each ask examines the thousand modules: asked seldom, not to load the cores.
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    assert_eq!(merged["held"], 1000, "{merged}");
    let found: Vec<(String, String, u64, u64)> = merged["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["kind"].as_str().unwrap_or("").into(),
                c["names"].as_str().unwrap_or("").into(),
                c["modules"].as_u64().unwrap_or(0),
                c["nodes"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("provider_unassigned".to_string(), "postgres".to_string(), 334, 3),
            ("no_domain".into(), "widget".into(), 333, 3),
            ("verb_unanswered".into(), "mesh-vault".into(), 333, 3),
        ],
        "{merged}"
    );
    let postgres = &merged["entries"][0];
    assert_eq!(postgres["first"], json!({"node":"alpha","module":"m0000"}));
    assert!(postgres["clear"].as_str().unwrap_or("").contains(&format!("{ASSIGNMENTS} key <node>.postgres")), "{postgres}");

    // One page of the verb itself, narrowed to a node: its schema, and what it examined.
    let c = bus.client("node-beta").await;
    let page = tests::nats::ask_ok(&c, json!({"what":"causes","node":"beta","limit":100})).await;
    assert_eq!((page["examined"].as_u64(), page["next"].as_str()), (Some(100), Some("beta.m0099")), "{page}");

    // The table and one module's chain, as an operator reads them.
    let (ok, table) = query(&bus, &["causes"]);
    assert!(ok && table.contains("3 cause(s) hold 1000 of 1000 module(s)") && table.contains("clear: provider postgres assigned"), "{table}");
    let (ok, why) = query(&bus, &["why", "--node", "beta", "--module", "m0001"]);
    assert!(ok, "{why}");
    assert!(why.contains("secret:api_key  no_provider") && why.contains("← verb_unanswered mesh-vault"), "{why}");
    let (ok, refused) = query(&bus, &["why", "--node", "beta"]);
    assert!(!ok && refused.contains("query why needs --node and --module"), "{refused}");
    host.stop().await;
}
