//! The dashboard (`deploy/grafana/mesh-provisioner.json`) and the alerting rules
//! (`deploy/prometheus/alerts.yml`) beside `/metrics`: every metric a panel or a rule names is
//! in a real scrape of the real host, every panel's query and every rule is PromQL that the
//! Prometheus project's own checker (`promtool`, installed by scripts/setup) accepts, and each
//! alert fires on its fixture series (`promtool test rules`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use tests::browser::get;
use tests::nats::{ask_ok, ask_raw, Bus, Host};

fn deploy(path: &str) -> PathBuf {
    tests::root().join("deploy").join(path)
}

/// Every `mesh_provisioner_…` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("mesh_provisioner_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        out.insert(text[start..end].to_string());
        i = end;
    }
    out
}

/// Every query of the dashboard's panels, with Grafana's variables given values.
fn panel_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy("grafana/mesh-provisioner.json")).expect("the dashboard");
    let d: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("a target of {} without expr", p["title"]));
            let expr = expr.replace("$__rate_interval", "5m").replace("$__range", "6h").replace("$job", "mesh-provisioner");
            out.push((p["title"].as_str().unwrap_or_default().to_string(), expr));
        }
    }
    assert!(out.len() >= 20, "{} queries", out.len());
    out
}

/// `promtool`, which scripts/setup installs; a test that needs it fails without it rather
/// than passing unchecked.
fn promtool(args: &[&str], dir: &Path) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("promtool cannot run ({e}): scripts/setup installs it (Debian's prometheus package)"));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn the_alert_rules_pass_promtool_and_each_alert_fires_on_its_fixture() {
    let dir = deploy("prometheus");
    let (ok, out) = promtool(&["check", "rules", "alerts.yml"], &dir);
    assert!(ok, "promtool check rules:\n{out}");
    let (ok, out) = promtool(&["test", "rules", "alerts.test.yml"], &dir);
    assert!(ok, "promtool test rules:\n{out}");
    // Every alert has a runbook line and a fixture that names it.
    let rules = std::fs::read_to_string(dir.join("alerts.yml")).unwrap();
    let fixtures = std::fs::read_to_string(dir.join("alerts.test.yml")).unwrap();
    let alerts: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).collect();
    assert!(alerts.len() >= 6, "{alerts:?}");
    assert_eq!(rules.matches("runbook:").count(), alerts.len(), "an alert without a runbook line");
    for a in &alerts {
        assert!(fixtures.contains(&format!("alertname: {a}\n")), "no fixture tests {a}");
    }
}

#[test]
fn a_rule_that_no_longer_fires_fails_its_fixture() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["alerts.yml", "alerts.test.yml"] {
        std::fs::copy(deploy("prometheus").join(f), dir.path().join(f)).unwrap();
    }
    let rules = std::fs::read_to_string(dir.path().join("alerts.yml")).unwrap();
    let broken = rules.replace("state=\"blocked\"} > 1800", "state=\"blocked\"} > 86400");
    assert_ne!(broken, rules, "the blocked rule moved: update this test");
    std::fs::write(dir.path().join("alerts.yml"), broken).unwrap();
    let (ok, out) = promtool(&["test", "rules", "alerts.test.yml"], dir.path());
    assert!(!ok && out.contains("MeshProvisionerModulesBlocked"), "{out}");
}

#[test]
fn every_panel_query_is_promql() {
    // promtool parses a query only inside a rule: each panel's becomes a recording rule.
    let dir = tempfile::tempdir().unwrap();
    let mut rules = String::from("groups:\n  - name: panels\n    rules:\n");
    for (i, (_, expr)) in panel_queries().iter().enumerate() {
        rules.push_str(&format!("      - record: panel:{i}\n        expr: {}\n", json!(expr)));
    }
    std::fs::write(dir.path().join("panels.yml"), rules).unwrap();
    let (ok, out) = promtool(&["check", "rules", "panels.yml"], dir.path());
    assert!(ok, "a panel's query is not PromQL:\n{out}");
}

/// The metric families a scrape declares (`# TYPE <name> <kind>`), with the sample names each
/// kind has: a counter's `_total`, a histogram's `_bucket`, `_count`, `_sum`.
fn families(text: &str) -> BTreeSet<String> {
    let mut scraped = BTreeSet::new();
    for l in text.lines() {
        let mut words = l.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) = (words.next(), words.next(), words.next(), words.next()) {
            scraped.insert(name.to_string());
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_count", "_sum"],
                _ => &[],
            };
            scraped.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        }
    }
    scraped
}

#[tokio::test]
async fn every_metric_a_panel_or_rule_names_is_in_a_real_scrape() {
    let bus = Bus::start().await;
    // What only shows while it happens, made to happen: a stream capturing the notices (before
    // the start, so the first audit names it), a node past its quota, a mirror drifting.
    let operator = async_nats::jetstream::new(bus.client("mesh-operator").await);
    operator
        .create_stream(async_nats::jetstream::stream::Config {
            name: "capture".into(),
            subjects: vec!["mesh-provisioner.notice.>".into()],
            max_bytes: 1 << 20,
            ..Default::default()
        })
        .await
        .expect("the operator makes a capturing stream");
    let host = Host::start(&bus, &["--http", "127.0.0.1:0", "--node-quota-keys", "1", "--audit-every", "1s"]).await;
    let url = host.http_url().await;
    let c = bus.client("node-alpha").await;
    ask_ok(&c, json!({"what":"needs","node":"alpha"})).await;
    let (code, _) = ask_raw(&c, br#"{"what":"nothing"}"#).await.expect("an answer");
    assert_eq!(code.as_deref(), Some("400"));
    // A request whose reply subject is no inbox: refused and counted. Only a user of the
    // buckets' own account can send one (another account's reply crosses as `_R_.…`): the
    // provisioner's own user, which may ask its verbs.
    let own = bus.client("mesh-provisioner").await;
    own.publish_with_reply("mesh-provisioner.provisioning", "$KV.mesh-provisioner_seat.holder", "{}".into()).await.unwrap();
    own.flush().await.unwrap();
    // Two needs of one node past a quota of one key; its module changes state (an event, a record).
    bus.put("node-alpha", "mesh-provisioner_needs", "alpha.app.config.a", b"{}").await;
    bus.put("node-alpha", "mesh-provisioner_needs", "alpha.app.config.b", b"{}").await;
    // A collection purged behind the mirror's back: the audit repairs it.
    bus.put("node-alpha", "mesh-provisioner_collect", "alpha.shell.app", b"{}").await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    operator.get_stream("KV_mesh-provisioner_collect").await.unwrap().purge().await.expect("purge");

    let dashboard = std::fs::read_to_string(deploy("grafana/mesh-provisioner.json")).unwrap();
    let rules = std::fs::read_to_string(deploy("prometheus/alerts.yml")).unwrap();
    let named: BTreeSet<String> = metric_names(&dashboard).into_iter().chain(metric_names(&rules)).collect();
    assert!(named.len() >= 20, "{named:?}");
    let start = std::time::Instant::now();
    loop {
        let (status, _, text) = get(&format!("{url}/metrics")).await;
        assert_eq!(status, 200, "{text}");
        let scraped = families(&text);
        let missing: Vec<&String> = named.iter().filter(|n| !scraped.contains(*n)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(40), "named by a panel or a rule but not in /metrics: {missing:?}\n{text}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    host.stop().await;
}

#[test]
fn a_label_a_party_wrote_keeps_the_metrics_page_readable_by_prometheus() {
    use mesh_provisioner::base::metrics::{BucketWriter, Label};
    use prometheus_client::metrics::{family::Family, gauge::Gauge};
    // Every character a label value could be given that the text format or a reader minds:
    // quotes, backslashes, a newline, ESC and BEL, NUL, a bidi override.
    let hostile = ["q\"x", "back\\slash\\", "two\nlines", "\u{1b}]0;title\u{7}\u{1b}[2J", "nul\u{0}", "user\u{202e}gpj.exe"];
    let family = Family::<BucketWriter, Gauge>::default();
    for (i, writer) in hostile.iter().enumerate() {
        family.get_or_create(&BucketWriter { bucket: Label::from("mesh-provisioner_needs"), writer: Label::from(*writer) }).set(i as i64 + 1);
    }
    let mut registry = prometheus_client::registry::Registry::with_prefix("mesh_provisioner");
    registry.register("writer_over_quota_keys", "Keys held by a writer past its quota", family);
    let mut page = String::new();
    prometheus_client::encoding::text::encode(&mut page, &registry).expect("encoded");
    assert!(!page.chars().any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'), "{page:?}");
    assert_eq!(page.lines().filter(|l| l.starts_with("mesh_provisioner_writer_over_quota_keys{")).count(), hostile.len(), "{page}");
    assert!(page.contains(r#"writer="q\"x""#) && page.contains(r#"writer="back\\slash\\""#) && page.contains(r#"writer="two\\u{a}lines""#), "{page}");
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("metrics.txt"), &page).expect("written");
    let out = Command::new("sh").args(["-c", "promtool check metrics < metrics.txt"]).current_dir(dir.path()).output().expect("sh runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool refused the page:\n{said}\n{page}");
}
