//! The HTTP side end to end: the real host binary, a real `nats-server` with the example
//! accounts, and — for the status page — a real headless Chromium on a running demo mesh.
//!
//! Probes: `/healthz` always `200`; `/readyz` `200` for the seat's holder and for a warm standby
//! (the role in the body), `503` while the bus is gone, `200` again once it is back. Metrics:
//! the Prometheus names move with the requests made. The page: the states a person sees are the
//! verb's own, a click on a module opens its needs, no bucket value is ever on it, and a
//! screenshot is saved (`target/screenshots/status-page.png`; with
//! `MESH_PROVISIONER_REGENERATE_GOLDEN=1` also `docs/status-page.png`, which the README shows).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::browser::{get, Browser};
use tests::nats::{ask_raw, Bus, Host};

/// Waits (bounded) until `GET url` answers `status`; the body.
async fn until_status(url: &str, status: u16, what: &str) -> Value {
    let start = Instant::now();
    loop {
        let (code, _, body) = get(url).await;
        if code == status {
            return serde_json::from_str(&body).unwrap_or(Value::String(body));
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{url} never answered {status} ({what}); last {code}: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of the sample `name` (labels included, as written) in a scrape.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

#[tokio::test]
async fn probes_say_the_role_and_readiness_and_metrics_follow_the_requests() {
    let bus = Bus::start().await;
    let holder = Host::start(&bus, &["--http", "127.0.0.1:0", "--instance", "one"]).await;
    let standby = Host::start(&bus, &["--http", "127.0.0.1:0", "--instance", "two"]).await;
    let (one, two) = (holder.http_url().await, standby.http_url().await);

    let (code, _, body) = get(&format!("{one}/healthz")).await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let r = until_status(&format!("{one}/readyz"), 200, "the holder ready").await;
    assert_eq!((r["role"].as_str(), r["instance"].as_str(), r["connected"].as_bool()), (Some("holder"), Some("one"), Some(true)), "{r}");
    let r = until_status(&format!("{two}/readyz"), 200, "a warm standby ready").await;
    assert_eq!(r["role"], "standby", "{r}");

    // Requests, one refused, show in the holder's metrics.
    let c = bus.client("node-alpha").await;
    bus.put("node-alpha", "mesh-provisioner_needs", "alpha.app.config.url", b"{}").await;
    for _ in 0..5 {
        let (code, v) = ask_raw(&c, br#"{"what":"needs","node":"alpha"}"#).await.expect("answered");
        assert_eq!(code, None, "{v}");
    }
    let (code, _) = ask_raw(&c, br#"{"what":"nonsense"}"#).await.expect("answered");
    assert_eq!(code.as_deref(), Some("400"));
    let (code, ctype, text) = get(&format!("{one}/metrics")).await;
    assert_eq!(code, 200);
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    assert!(sample(&text, "mesh_provisioner_requests_total{endpoint=\"provisioning\"}").unwrap_or(0.0) >= 6.0, "{text}");
    assert!(sample(&text, "mesh_provisioner_request_errors_total{endpoint=\"provisioning\",code=\"bad_request\"}") >= Some(1.0), "{text}");
    assert!(sample(&text, "mesh_provisioner_request_duration_seconds_count{endpoint=\"provisioning\"}").unwrap_or(0.0) >= 6.0, "{text}");
    // The same request over unchanged buckets is answered from the reply cache after the first.
    let calls = sample(&text, "mesh_provisioner_guest_call_duration_seconds_count{export=\"handle\"}").unwrap_or(0.0);
    let hits = sample(&text, "mesh_provisioner_reply_cache_lookups_total{outcome=\"hit\"}").unwrap_or(0.0);
    assert!(calls >= 2.0 && hits >= 1.0 && calls + hits >= 6.0, "guest calls {calls}, cache hits {hits}: {text}");
    assert_eq!(sample(&text, "mesh_provisioner_seat_holder"), Some(1.0), "{text}");
    assert!(sample(&text, "mesh_provisioner_mirror_keys{bucket=\"mesh-provisioner_needs\"}") >= Some(1.0), "{text}");
    assert_eq!(sample(&text, "mesh_provisioner_mirror_in_sync{bucket=\"mesh-provisioner_registry\"}"), Some(1.0), "{text}");
    let modules: f64 =
        text.lines().filter(|l| l.starts_with("mesh_provisioner_modules{state=")).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum();
    assert_eq!(modules, 1.0, "alpha/app by its status state: {text}");
    assert!(sample(&text, "mesh_provisioner_guest_instances_created_total") >= Some(1.0), "{text}");
    let (_, _, standby_text) = get(&format!("{two}/metrics")).await;
    assert_eq!(sample(&standby_text, "mesh_provisioner_seat_holder"), Some(0.0), "{standby_text}");

    // The bus gone: not ready (the process is alive); back: ready again, by itself.
    let restarted = tokio::spawn(bus.restart(Duration::from_secs(4)));
    let r = until_status(&format!("{one}/readyz"), 503, "not ready without the bus").await;
    assert_eq!(r["connected"], false, "{r}");
    let (code, _, _) = get(&format!("{one}/healthz")).await;
    assert_eq!(code, 200, "alive without the bus");
    let _bus = restarted.await.expect("the bus restarted");
    until_status(&format!("{one}/readyz"), 200, "ready once the bus is back").await;
    drop((holder, standby));
}

#[tokio::test]
async fn the_status_page_shows_the_mesh_as_the_verb_says_it_in_a_real_browser() {
    let state = tempfile::tempdir().expect("temp dir");
    let dir = state.path().to_path_buf();
    // A demo that does not move on while the page is compared with the verb.
    let host = Host::spawn_as(state, &tests::component_path(), &["--demo", "--demo-every", "1h"]);
    let url = host.http_url().await;
    // The demo is written once the seat is held; wait for its four modules.
    let start = Instant::now();
    let status = loop {
        let (code, _, body) = get(&format!("{url}/api/status")).await;
        let s: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        if code == 200 && s["entries"].as_array().map_or(0, Vec::len) >= 4 {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(40), "the demo mesh never showed: {code} {body}\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // What the verb says, through the CLI and the bus: the page must agree with it.
    let out = std::process::Command::new(tests::nats::host_binary()).args(["query", "status", "--json", "--state-dir"]).arg(&dir).output().expect("query runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let verb: Value = serde_json::from_slice(&out.stdout).expect("query --json prints JSON");
    let states = tests::states_of;
    assert_eq!(states(&status), states(&verb), "the page's data and the verb disagree");

    let mut b = Browser::open(&format!("{url}/"), 1200, 800).await;
    b.until("!!document.body && document.body.dataset.loaded === 'yes'", Duration::from_secs(20)).await;
    let seen = b
        .eval("Object.fromEntries([...document.querySelectorAll('td.cell')].map(td => [td.dataset.node + '/' + td.dataset.module, td.firstChild.textContent]))")
        .await;
    let seen: BTreeMap<String, String> = serde_json::from_value(seen).expect("cells");
    assert_eq!(seen, states(&verb), "what a person sees differs from the verb");
    // The top causes above the grid, the first as `query causes` says it.
    let out = std::process::Command::new(tests::nats::host_binary()).args(["query", "causes", "--json", "--state-dir"]).arg(&dir).output().expect("query runs");
    let causes: Value = serde_json::from_slice(&out.stdout).expect("query causes --json prints JSON");
    let top = &causes["entries"][0];
    b.until("!document.getElementById('causes').hidden", Duration::from_secs(10)).await;
    let first = b.eval("document.querySelector('#causes li.cause').firstChild.textContent").await;
    let first = first.as_str().unwrap_or_default();
    let names = format!("{} {}", top["kind"].as_str().unwrap_or("?"), top["names"].as_str().unwrap_or("?"));
    assert!(first.starts_with(&names), "the page's top cause {first:?} is not the verb's {names:?}");
    // Each cell is coloured by its state.
    let classes = b.eval("[...document.querySelectorAll('td.cell')].every(td => td.classList.contains(td.firstChild.textContent))").await;
    assert_eq!(classes, json!(true));

    // A click on alpha/app opens its needs.
    assert_eq!(b.eval("document.getElementById('details').hidden").await, json!(true));
    b.click("td.cell[data-node='alpha'][data-module='app']").await;
    b.until("!document.getElementById('details').hidden", Duration::from_secs(5)).await;
    let title = b.eval("document.getElementById('details-title').textContent").await;
    assert!(title.as_str().unwrap_or("").starts_with("alpha / app"), "{title}");
    let needs = b.eval("[...document.querySelectorAll('#needs tr.need')].map(tr => [...tr.children].map(td => td.textContent))").await;
    let wanted: Vec<(String, String)> = verb["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["node"] == "alpha" && e["module"] == "app")
        .flat_map(|e| e["needs"].as_array().cloned().unwrap_or_default())
        .map(|n| (n["kind"].as_str().unwrap_or("").to_string(), n["name"].as_str().unwrap_or("").to_string()))
        .collect();
    let shown: Vec<(String, String)> =
        needs.as_array().into_iter().flatten().map(|r| (r[0].as_str().unwrap_or("").to_string(), r[1].as_str().unwrap_or("").to_string())).collect();
    assert!(!wanted.is_empty());
    assert_eq!(shown, wanted, "the needs opened are not alpha/app's");

    // The filters: beta only.
    b.eval("(() => { const s = document.getElementById('node'); s.value = 'beta'; s.dispatchEvent(new Event('change')); })()").await;
    let nodes = b.eval("[...new Set([...document.querySelectorAll('td.cell')].map(td => td.dataset.node))]").await;
    assert_eq!(nodes, json!(["beta"]));
    b.eval("(() => { const s = document.getElementById('node'); s.value = ''; s.dispatchEvent(new Event('change')); })()").await;

    // No value from a bucket anywhere on the page (the demo's bound value and collected lines).
    let html = b.eval("document.documentElement.outerHTML").await;
    let html = html.as_str().unwrap_or_default();
    for value in ["5432", "APP_HOME", "WEB_PORT", "\"database\""] {
        assert!(!html.contains(value), "the page shows a bucket value ({value})");
    }

    let shot = tests::target_dir().join("screenshots/status-page.png");
    b.screenshot(&shot).await;
    assert!(std::fs::metadata(&shot).map(|m| m.len() > 1000).unwrap_or(false), "no screenshot at {}", shot.display());
    if tests::golden::regenerating() {
        let docs = tests::root().join("docs/status-page.png");
        std::fs::create_dir_all(docs.parent().expect("docs")).expect("docs dir");
        std::fs::copy(&shot, &docs).expect("copy the screenshot");
    }
    drop(host);
}

#[tokio::test]
async fn a_node_with_more_modules_than_the_page_shows_of_one_pushes_no_other_node_off() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let host = Host::start(&bus, &["--http", "127.0.0.1:0", "--status-page-per-node", "3"]).await;
    let url = host.http_url().await;
    // alpha has 600 modules (more than two of the pages the status read asks, past the three
    // the page shows of one node); beta and gamma a few.
    for (user, node, modules) in [("node-alpha", "alpha", 600), ("node-beta", "beta", 1), ("node-gamma", "gamma", 3)] {
        let js = bus.js(user).await;
        let mut acks = Vec::new();
        for i in 0..modules {
            acks.push(js.publish(format!("$KV.mesh-provisioner_applied.{node}.m{i:03}"), r#"{"build":"b1","needs":0}"#.into()).await.expect("sent"));
        }
        for a in acks {
            a.await.expect("stored");
        }
    }
    let asker = bus.client("node-beta").await;
    tests::nats::status_until(&asker, "gamma", "m002", "gamma's last module", |s| s["state"].is_string()).await;
    let start = std::time::Instant::now();
    let status = loop {
        let (code, _, body) = get(&format!("{url}/api/status")).await;
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        if code == 200 && v["entries"].as_array().is_some_and(|e| e.len() == 7) {
            break v;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{code} {body}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let shown: Vec<String> = status["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| format!("{}/{}", e["node"].as_str().unwrap_or(""), e["module"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(shown, ["alpha/m000", "alpha/m001", "alpha/m002", "beta/m000", "gamma/m000", "gamma/m001", "gamma/m002"]);
    assert_eq!(status["cut"], json!([{"node": "alpha", "shown": 3}]));
    assert_eq!(status["complete"], json!(true));
    // The metrics count what the page shows, and say a node was cut.
    let (_, _, metrics) = get(&format!("{url}/metrics")).await;
    assert!(metrics.lines().any(|l| l == "mesh_provisioner_status_nodes_cut 1"), "{metrics}");
    // And the page says so.
    let mut b = Browser::open(&format!("{url}/"), 1200, 800).await;
    b.until("!!document.body && document.body.dataset.loaded === 'yes'", Duration::from_secs(20)).await;
    let said = b.eval("document.getElementById('error').textContent").await;
    assert!(said.as_str().is_some_and(|s| s.contains("alpha (first 3 modules)")), "{said}");
    assert_eq!(
        b.eval("[...document.querySelectorAll('#grid td.cell')].map(td => td.dataset.node + '/' + td.dataset.module).join(' ')").await,
        json!(shown.join(" "))
    );
}
