//! The reply cache over the real bus (issue 14): a `status` that read a bucket as missing and
//! counted a service's responders is served again from the cache — and never after the bucket
//! is made, however soon after.

use std::time::{Duration, Instant};

use serde_json::Value;
use tests::nats::{Bus, Host};

const STATUS: &[u8] = br#"{"what":"status","node":"alpha","module":"m1"}"#;

async fn lookups(url: &str) -> (u64, u64) {
    let (_, _, body) = tests::browser::get(url).await;
    let count = |outcome: &str| {
        body.lines()
            .find(|l| l.starts_with(&format!("mesh_provisioner_reply_cache_lookups_total{{outcome=\"{outcome}\"}}")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    (count("hit"), count("miss"))
}

fn check_of(status: &Value, kind: &str) -> String {
    let needs = status["entries"][0]["needs"].as_array().cloned().unwrap_or_default();
    needs.iter().find(|n| n["kind"] == kind).map(|n| n["check"].as_str().unwrap_or_default().to_string()).unwrap_or_default()
}

#[tokio::test]
async fn a_status_is_served_from_the_cache_until_a_bucket_it_read_as_missing_is_made() {
    let bus = Bus::start().await;
    let host = Host::start(&bus, &["--http", "127.0.0.1:0"]).await;
    let metrics = format!("{}/metrics", host.http_url().await);
    let c = bus.client("node-alpha").await;
    bus.put("node-alpha", "mesh-provisioner_needs", "alpha.m1.config.db_url", br#"{"part":"api"}"#).await;
    bus.put("node-alpha", "mesh-provisioner_needs", "alpha.m1.secret.db_password", br#"{"part":"api"}"#).await;
    // The needs mirror has both keys once status lists both.
    let start = Instant::now();
    let first = loop {
        let (_, v) = tests::nats::ask_raw(&c, STATUS).await.expect("status answers");
        if v["entries"][0]["needs"].as_array().map_or(0, Vec::len) == 2 {
            break v;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never both needs: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(check_of(&first, "config"), "no_provider", "mesh-config_values does not exist yet: {first}");
    let (hits, _) = lookups(&metrics).await;
    for _ in 0..10 {
        let (_, v) = tests::nats::ask_raw(&c, STATUS).await.expect("status answers");
        assert_eq!(v, first);
    }
    let (more, _) = lookups(&metrics).await;
    assert!(more >= hits + 5, "a repeated status over unchanged buckets is served from the cache: {hits} → {more} hits");

    // The bucket is made and the value written: the very next status sees it.
    let js = bus.js("mesh-config").await;
    js.create_key_value(async_nats::jetstream::kv::Config { bucket: "mesh-config_values".into(), ..Default::default() }).await.expect("mesh-config makes its bucket");
    bus.put("mesh-config", "mesh-config_values", "alpha.m1.db_url", b"\"postgres://db\"").await;
    let start = Instant::now();
    loop {
        let (_, v) = tests::nats::ask_raw(&c, STATUS).await.expect("status answers");
        if check_of(&v, "config") == "present" {
            break;
        }
        // The stream-created advisory ends the listing the missing read came from; the mirror
        // then replays the new bucket. Both take moments: well under the 3 s the discovery count it also read is kept.
        assert!(start.elapsed() < Duration::from_millis(1500), "a kept status outlived the bucket it read as missing: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    host.stop().await;
}
