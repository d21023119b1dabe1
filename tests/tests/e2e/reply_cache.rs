//! The reply cache over the real bus (issue 14): a `status` that read a bucket as missing and
//! counted a service's responders is served again from the cache — and never after the bucket
//! is made, however soon after. And the verbs' own connection, as the server lists it.

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
    // The needs mirror has both keys once status lists both, and the seat's holder has
    // recorded the module's state once its status says since when (the states bucket, which
    // status reads too, then holds still).
    let start = Instant::now();
    let first = loop {
        let (_, v) = tests::nats::ask_raw(&c, STATUS).await.expect("status answers");
        if v["entries"][0]["needs"].as_array().map_or(0, Vec::len) == 2 && v["entries"][0]["since"].is_string() {
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
    bus.make_bucket("mesh-config_values").await;
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

/// The Architecture Invariant that the verbs have a connection of their own: the server's own
/// list of connections shows the serving one subscribed to the verbs and `$SRV` only, and the
/// mirrors' consumers delivering on the other.
#[tokio::test]
async fn the_verbs_are_served_on_a_connection_no_consumer_delivers_on() {
    const CONFIG: &str = r#"listen: "127.0.0.1:{{PORT}}"
http: "127.0.0.1:-1"
jetstream { store_dir: "{{DIR}}/js" }
accounts { MESH { jetstream: enabled, users: [ { user: "all", password: "all-pw" } ] } }
"#;
    let server = tests::nats::RawServer::start(CONFIG).await;
    let url = format!("nats://127.0.0.1:{}", server.port);
    let client = async_nats::ConnectOptions::with_user_and_password("all".into(), "all-pw".into()).connect(&url).await.expect("connect");
    let mut host = Host::spawn_as(tempfile::tempdir().unwrap(), &tests::component_path(), &["--nats-url", &url, "--user", "all", "--password", "all-pw"]);
    host.wait_answering(&client).await;
    // The monitoring port the server chose, from its log.
    let log = server.log_text();
    let monitor = log
        .lines()
        .find_map(|l| l.split("Starting http monitor on ").nth(1))
        .map(|a| a.trim().trim_start_matches("http://").to_string())
        .unwrap_or_else(|| panic!("no monitor address in the server's log:\n{log}"));
    let (_, _, body) = tests::browser::get(&format!("http://{monitor}/connz?subs=1")).await;
    let connz: Value = serde_json::from_str(&dechunk(&body)).unwrap_or_else(|e| panic!("connz is not JSON ({e}): {body}"));
    let conns = connz["connections"].as_array().cloned().unwrap_or_default();
    let subs_of = |name: &str| -> Vec<String> {
        conns
            .iter()
            .filter(|c| c["name"] == name)
            .flat_map(|c| c["subscriptions_list"].as_array().cloned().unwrap_or_default())
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let served = subs_of("mesh-provisioner-service");
    assert!(served.iter().any(|s| s == "mesh-provisioner.provisioning"), "the serving connection: {served:?}\n{body}");
    assert!(
        served.iter().all(|s| s.starts_with("mesh-provisioner.") || s.starts_with("$SRV.")),
        "the serving connection subscribes to more than the verbs: {served:?}"
    );
    let buckets = subs_of("mesh-provisioner");
    assert!(buckets.iter().any(|s| s.starts_with("_INBOX")), "the mirrors' consumers deliver on the buckets' connection: {buckets:?}");
    host.stop().await;
    server.stop().await;
}

/// An HTTP/1.1 body sent in chunks (`<hex size>\r\n<bytes>\r\n`, ending with size 0), joined.
fn dechunk(body: &str) -> String {
    if body.starts_with('{') {
        return body.to_string();
    }
    let (mut out, mut rest) = (String::new(), body);
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}
