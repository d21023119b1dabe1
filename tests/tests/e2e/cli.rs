//! The command line, as an operator uses it: `query` against a real bus, `check` and `registry`
//! on real and bad components, SIGHUP.

use std::process::Output;
use std::time::Duration;

use tests::fixture;
use tests::nats::{host_binary, Bus, Host};

fn run(args: &[&str]) -> Output {
    std::process::Command::new(host_binary()).args(args).output().expect("run the host binary")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[tokio::test]
async fn query_prints_a_table_with_odd_keys_and_exits_non_zero_on_an_error_reply() {
    let bus = Bus::start().await;
    let host = Host::start(&bus, &[]).await;
    bus.put("node-alpha", "mesh-provisioner_needs", "alpha.app.config.db=2Eurl", br#"{"placeholder":"${config:db.url}"}"#).await;
    bus.put("node-alpha", "mesh-provisioner_needs", "alpha.app.config.=3a", b"{}").await;
    // The mirror applies writes in order: once the last is listed, both are.
    let c = bus.client("node-alpha").await;
    let start = std::time::Instant::now();
    while tests::out_of_shape(&tests::nats::ask_ok(&c, serde_json::json!({"what":"needs","node":"alpha"})).await).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "the writes never showed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pw = bus.password("node-alpha");
    let conn = ["--nats-url", bus.url(), "--user", "node-alpha", "--password", pw.as_str()];
    let out = run(&[&["query", "needs", "--node", "alpha"][..], &conn].concat());
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("db.url") && t.contains("NODE") && t.contains("1 key(s) out of shape") && t.contains("alpha.app.config.=3a"), "{t}");

    let out = run(&[&["query", "needs", "--node", "alpha", "--json"][..], &conn].concat());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json prints the reply");
    assert_eq!(v["what"], "needs");

    let out = run(&[&["query", "needs", "--node", "*"][..], &conn].concat());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("bad_request (400)") && t.contains("not an identifier"), "{t}");

    // Read-your-writes: a write asked for at once by its share's sequence is in the answer.
    let seq = bus.put("node-alpha", "mesh-provisioner_needs", "alpha.app.config.fresh", b"{}").await;
    let mark = format!("NODE_alpha={seq}");
    let out = run(&[&["query", "needs", "--node", "alpha", "--min-revision", mark.as_str(), "--json"][..], &conn].concat());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert!(tests::keys(&v).contains(&"alpha.app.config.fresh".to_string()), "{v}");
    let out = run(&[&["query", "needs", "--node", "alpha", "--consistent", "--json"][..], &conn].concat());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert!(v["revisions"]["mesh-provisioner_needs"].as_u64().is_some_and(|r| r > 0), "{v}");
    let ahead = format!("NODE_alpha={}", seq + 1000);
    let out = run(&[&["query", "needs", "--node", "alpha", "--min-revision", ahead.as_str(), "--wait", "100ms"][..], &conn].concat());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("not_current") && t.contains(&format!("not yet {}", seq + 1000)), "{t}");
    let out = run(&[&["query", "needs", "--min-revision", "NODE_alpha"][..], &conn].concat());
    assert!(!out.status.success() && text(&out).contains("is not NAME=REVISION"), "{}", text(&out));
    host.stop().await;
}

#[test]
fn check_passes_the_real_component_and_refuses_bad_ones_with_the_reason() {
    let ok = run(&["check", tests::component_path().to_str().unwrap()]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).contains("13 registry kinds"));
    for (name, why) in [
        ("not-wasm", "not a WebAssembly file"),
        ("incompatible", "built for mesh:provisioner@0.11.0"),
        ("publisher", "mesh:provisioner/bus@0.8.0"),
        ("trap-at-start", "trapped"),
        ("loop-at-start", "deadline"),
    ] {
        let out = run(&["check", fixture(name).to_str().unwrap()]);
        assert!(!out.status.success(), "{name} passed the check");
        assert!(text(&out).contains(why), "{name}: {}", text(&out));
    }
    let reg = run(&["registry", "--component", tests::component_path().to_str().unwrap()]);
    assert!(reg.status.success());
    assert_eq!(String::from_utf8_lossy(&reg.stdout).lines().count(), 13);
}

#[tokio::test]
async fn sighup_rereads_the_component() {
    let bus = Bus::start().await;
    let host = Host::start(&bus, &[]).await;
    host.signal("HUP");
    let start = std::time::Instant::now();
    while !host.log_text().contains("component unchanged") {
        assert!(start.elapsed() < Duration::from_secs(10), "SIGHUP not acted on:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    host.stop().await;
}

#[tokio::test]
async fn with_no_watch_only_sighup_swaps_a_changed_component() {
    let bus = Bus::start().await;
    let dir = tempfile::tempdir().unwrap();
    let component = dir.path().join("guest.wasm");
    tests::install(&tests::component_path(), &component);
    let host = Host::start_with(&bus, tempfile::tempdir().unwrap(), &component, &["--no-watch"]).await;
    let c = bus.client("node-alpha").await;
    let version = || async { Host::info(&c).await["component_version"].as_str().unwrap_or_default().to_string() };
    let first = version().await;
    // Beside it, a standby that watches its own copy: the window the --no-watch host is given
    // is however long a watching host takes to swap (a poll, then compiling the new file).
    let watched = tempfile::tempdir().unwrap();
    let watched_component = watched.path().join("guest.wasm");
    tests::install(&tests::component_path(), &watched_component);
    let watcher = Host::spawn(bus.url(), &bus, tempfile::tempdir().unwrap(), &watched_component, &[]);
    let start = std::time::Instant::now();
    while !watcher.log_text().contains("standing by") {
        assert!(start.elapsed() < Duration::from_secs(30), "the watching standby never started:\n{}", watcher.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tests::install(&fixture("v2"), &component);
    tests::install(&fixture("v2"), &watched_component);
    let start = std::time::Instant::now();
    while !watcher.log_text().contains("component swapped") {
        assert!(start.elapsed() < Duration::from_secs(30), "the watching host never swapped:\n{}", watcher.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // With --no-watch the new file is not taken by itself, though a watcher took its own.
    assert_eq!(version().await, first, "swapped without SIGHUP:\n{}", host.log_text());
    assert!(!host.log_text().contains("component swapped"), "swapped without SIGHUP:\n{}", host.log_text());
    drop(watcher);
    host.signal("HUP");
    let start = std::time::Instant::now();
    while version().await != "0.2.0-fixture" {
        assert!(start.elapsed() < Duration::from_secs(20), "SIGHUP did not swap the changed component:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(host.log_text().contains("component swapped"));
    host.stop().await;
}

#[tokio::test]
async fn serve_without_a_bus_starts_its_own_and_query_finds_it_through_the_state_dir() {
    let state = tempfile::tempdir().unwrap();
    tests::nats::private(state.path());
    let mut child = crate::serve_demo(state.path(), &[]).await;
    let log = state.path().join("host.log");
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.contains("embedded nats-server started"), "{logged}");
    let dir = state.path().to_str().unwrap();
    // The demo's writes are followed by the mirrors within moments; ask until they show.
    let start = std::time::Instant::now();
    let out = loop {
        let out = run(&["query", "needs", "--node", "alpha", "--state-dir", dir]);
        if out.status.success() && text(&out).contains("db.url") {
            break out;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "query through the state dir: {}", text(&out));
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let t = text(&out);
    assert!(t.contains("alpha") && t.contains("app") && t.contains("db_password"), "{t}");
    let out = run(&["query", "needs", "--node", "gamma", "--state-dir", dir]);
    assert!(text(&out).contains("gamma.worker.config.queue=3aname"), "the demo's odd key: {}", text(&out));
    let out = run(&["query", "plan", "--node", "alpha", "--module", "app", "--state-dir", dir]);
    assert!(out.status.success(), "{}", text(&out));
    // The record of the embedded server's passwords is the owner's alone.
    let record = std::fs::metadata(state.path().join("embedded.json")).expect("the embedded server's record");
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&record.permissions()) & 0o077, 0, "the embedded server's record is readable by others");
    // The rendered server config holds bcrypt hashes, never a password.
    let access = mesh_provisioner::nats::embedded::Access::load(state.path()).expect("the record reads");
    let conf = std::fs::read_to_string(state.path().join("nats").join("nats-server.conf")).expect("the rendered config");
    assert_eq!(conf.matches("password: \"$2a$").count(), access.passwords.len(), "{conf}");
    for (user, password) in &access.passwords {
        assert!(!conf.contains(password.as_str()), "the config holds {user}'s password");
    }
    // Within a minute a module in each state of SPEC §7.1, and a rotation in progress: gamma/api
    // runs an older api_url than the one at its place, and never catches up.
    let states = |out: &Output| tests::states_of(&serde_json::from_slice(&out.stdout).unwrap_or_default());
    let every = ["never_ran", "pending", "nothing_needed", "applied", "degraded", "blocked"];
    let start = std::time::Instant::now();
    let seen = loop {
        let seen = states(&run(&["query", "status", "--json", "--state-dir", dir]));
        if every.iter().all(|s| seen.values().any(|v| v == s)) && seen.get("gamma/api").map(String::as_str) == Some("degraded") {
            break seen;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "not every state within a minute: {seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(seen.get("beta/queue").map(String::as_str), Some("pending"), "{seen:?}");
    let holders = run(&["query", "holders", "--kind", "config", "--name", "api_url", "--state-dir", dir]);
    assert_eq!(holders.status.code(), Some(3), "a rotation in progress: {}", text(&holders));
    assert!(text(&holders).contains("stale"), "{}", text(&holders));
    // Then it moves on by itself: postgres is applied on gamma and beta/cache with it.
    let start = std::time::Instant::now();
    while states(&run(&["query", "status", "--json", "--node", "beta", "--state-dir", dir])).get("beta/cache").map(String::as_str) != Some("applied") {
        assert!(start.elapsed() < Duration::from_secs(60), "the demo never moved on:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Killed outright, serve takes its embedded server with it: nothing is left on the port
    // (an orphan would hold it and the store, and the next start on this directory would fail).
    let port = access.url.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).expect("the record's port");
    let _ = child.kill().await;
    let start = std::time::Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
        assert!(start.elapsed() < Duration::from_secs(10), "the embedded nats-server outlived serve's SIGKILL");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `s` holds a character a terminal or a reader would act on rather than show.
fn raw_controls(s: &str) -> Vec<char> {
    s.chars().filter(|&c| (c.is_control() && c != '\n') || ('\u{202a}'..='\u{202e}').contains(&c) || ('\u{2066}'..='\u{2069}').contains(&c)).collect()
}

#[tokio::test]
async fn whatever_a_node_wrote_is_shown_escaped_on_every_output() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let host = Host::start(&bus, &["--http", "127.0.0.1:0"]).await;
    let url = host.http_url().await;
    let alpha = bus.client("node-alpha").await;
    // A need whose name holds ESC, BEL and a bidi override (escaped in its key, SPEC §2), and
    // a refused composition whose reason holds every control a terminal acts on.
    bus.put("node-alpha", "mesh-provisioner_needs", "alpha.app.config.x=1B=5B2J=07=E2=80=AE", br#"{"placeholder":"${config:x}"}"#).await;
    bus.put("node-alpha", "mesh-provisioner_applied", "alpha.app", br#"{"build":"b1","needs":1}"#).await;
    bus.put(
        "node-alpha",
        "composed-alpha",
        "app.b1",
        "{\"state\":\"refused\",\"reason\":\"bad\\u001b[2J\\u0007\\nFORGED line\\u0000 \\u202eevil\\\"\"}".as_bytes(),
    )
    .await;
    let s = tests::nats::status_until(&alpha, "alpha", "app", "the need", |s| {
        s["needs"].as_array().is_some_and(|n| n.len() == 1) && s["reason"].as_str().is_some_and(|r| r.contains('\u{1b}'))
    })
    .await;
    assert!(s["needs"][0]["name"].as_str().is_some_and(|n| n.contains('\u{1b}')), "the verb answers the name as it is: {s}");

    // The metrics: the Prometheus project's own parser reads the page (a hostile label value
    // is e2e_dashboards').
    let (_, _, metrics) = tests::browser::get(&format!("{url}/metrics")).await;
    assert!(metrics.contains("mesh_provisioner_mirror_keys{bucket=\"mesh-provisioner_needs\"}"), "{metrics}");
    assert_eq!(raw_controls(&metrics), Vec::<char>::new());
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("metrics.txt"), &metrics).expect("written");
    let checked = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(dir.path().join("metrics.txt")).expect("open"))
        .output()
        .expect("promtool runs (scripts/setup installs it)");
    // `check metrics` also lints names; what matters is that the page parses.
    assert!(!String::from_utf8_lossy(&checked.stderr).contains("parsing error"), "{}", String::from_utf8_lossy(&checked.stderr));

    // Every table of `query`, and `verify`: escaped, one line a row.
    let pw = bus.password("node-alpha");
    let conn = ["--nats-url", bus.url(), "--user", "node-alpha", "--password", pw.as_str()];
    for what in [
        &["query", "needs"][..],
        &["query", "applied"],
        &["query", "status", "--needs"],
        &["query", "plan", "--node", "alpha", "--module", "app"],
        &["query", "registry"],
        &["query", "collect"],
        &["query", "holders", "--kind", "config", "--name", "x\u{1b}[2J\u{7}\u{202e}"],
        &["verify"],
    ] {
        let out = run(&[what, &conn[..]].concat());
        let t = text(&out);
        assert_eq!(raw_controls(&t), Vec::<char>::new(), "{what:?} printed raw controls:\n{t}");
        assert!(!t.lines().any(|l| l.starts_with("FORGED")), "{what:?} let a reason forge a line:\n{t}");
        match what.get(1).copied().unwrap_or_default() {
            "needs" => assert!(t.contains("x\\u{1b}[2J\\u{7}\\u{202e}"), "{t}"),
            "status" => assert!(t.contains("config:x\\u{1b}[2J\\u{7}\\u{202e}"), "{what:?}:\n{t}"),
            "plan" => assert!(t.contains("bad\\u{1b}[2J\\u{7}\\u{a}FORGED line\\u{0} \\u{202e}evil"), "{what:?}:\n{t}"),
            _ => {}
        }
    }
    // JSON stays JSON: the value as it is, escaped by JSON alone.
    let out = run(&[&["query", "plan", "--node", "alpha", "--module", "app", "--json"][..], &conn].concat());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json prints the reply");
    assert!(v.to_string().contains("bad\\u001b[2J\\u0007\\nFORGED"), "{v}");

    // The page: the module's details show its reason (the need's name) escaped.
    let mut b = tests::browser::Browser::open(&format!("{url}/"), 1200, 800).await;
    b.until("!!document.body && document.body.dataset.loaded === 'yes'", Duration::from_secs(20)).await;
    b.click("td.cell[data-node='alpha'][data-module='app']").await;
    b.until("!document.getElementById('details').hidden", Duration::from_secs(5)).await;
    let shown = b.eval("document.body.innerText").await;
    let shown = shown.as_str().unwrap_or_default();
    assert!(shown.contains("config:x\\u{1b}[2J\\u{7}\\u{202e}"), "{shown}");
    assert_eq!(raw_controls(shown).into_iter().filter(|c| *c != '\t').collect::<Vec<_>>(), Vec::<char>::new());
    host.stop().await;
}
