//! Operator mode (issue: a mesh of thousands): the accounts `mesh-provisioner accounts
//! --operator` renders, signed with nkeys and read by a real `nats-server` from its full
//! resolver; a node joining a running mesh by a push (no restart of the server or the
//! provisioner), a user revoked and cut off, and `serve --demo --operator`. The boundary's
//! attacks on this rendering are `accounts::no_user_reaches_past_its_grant_in_operator_mode_either`.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use tests::nats::{ask_ok, host_binary, status_until, Bus, Host, OPERATOR};

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const BOUND: &str = "postgres_bound";

async fn cli(args: &[&str]) -> Output {
    tokio::process::Command::new(host_binary()).args(args).env_remove("MESH_PROVISIONER_NATS_URL").output().await.expect("run the host binary")
}

fn said(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `accounts --operator` over the bus's accounts directory, for the example mesh and `more`.
async fn render(bus: &Bus, nodes: &str, extra: &[&str]) -> Output {
    let out = bus.accounts_dir();
    let mut args = vec!["accounts", "--operator", "--out", out.to_str().expect("utf-8 path"), "--nodes", nodes, "--providers", "postgres"];
    args.extend_from_slice(extra);
    cli(&args).await
}

/// `bootstrap` as the operator, for the example nodes alpha, beta and gamma and then `extra`.
async fn bootstrap(bus: &Bus, operator: &Path, extra: &[&str]) -> Output {
    let component = tests::component_path();
    let mut args = vec!["bootstrap", "--nats-url", bus.url(), "--creds", operator.to_str().expect("path")];
    args.extend(["--component", component.to_str().expect("path"), "--node", "alpha", "--node", "beta", "--node", "gamma"]);
    args.extend_from_slice(extra);
    cli(&args).await
}

/// A client of `creds` (a file), with its user's inbox prefix, whose server errors are kept.
async fn login(bus: &Bus, user: &str, creds: &Path) -> Result<(async_nats::Client, tokio::sync::mpsc::UnboundedReceiver<String>), String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::with_credentials_file(creds)
        .await
        .map_err(|e| format!("{user}'s creds: {e}"))?
        .custom_inbox_prefix(tests::nats::inbox_of(user))
        .connection_timeout(Duration::from_secs(10))
        .max_reconnects(Some(1))
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(format!("{event}"));
            }
        })
        .connect(bus.url())
        .await
        .map_err(|e| e.to_string())?;
    // The server may refuse a login after the client's handshake (while it looks the account
    // up): only a round trip says the login held.
    let mut rx = rx;
    let flushed = tokio::time::timeout(Duration::from_secs(20), client.flush()).await;
    let mut seen = Vec::new();
    while let Ok(e) = rx.try_recv() {
        seen.push(e);
    }
    if seen.iter().any(|e| e.contains("authorization violation") || e.contains("authentication")) || !matches!(flushed, Ok(Ok(()))) {
        return Err(format!("{user} refused: {seen:?}"));
    }
    Ok((client, rx))
}

#[tokio::test]
async fn a_node_joins_a_running_mesh_by_a_push_is_cut_off_when_revoked_and_its_keys_orphaned_when_it_leaves() {
    let bus = Bus::start_operator().await;
    bus.make_bucket(BOUND).await;
    let mut host = Host::start(&bus, &["--state-sweep-every", "2s", "--audit-every", "2s"]).await;
    let alpha = bus.client("node-alpha").await;
    bus.put("node-alpha", NEEDS, "alpha.app.config.db_url", br#"{"placeholder":"${config:db_url}"}"#).await;
    status_until(&alpha, "alpha", "app", "its need", |s| s["needs"].as_array().is_some_and(|n| n.len() == 1)).await;

    // A user with no account yet is refused: delta is no party of this mesh.
    let out = render(&bus, "alpha,beta,gamma,delta", &[]).await;
    assert!(out.status.success(), "{}", said(&out));
    let delta_creds = bus.accounts_dir().join("creds/node-delta.creds");
    let refused = login(&bus, "node-delta", &delta_creds).await.expect_err("delta logged in before its account was pushed");
    assert!(refused.contains("authorization violation"), "{refused}");

    // Pushed to the running server's resolver, and its share made by the operator's bootstrap.
    let out = render(&bus, "alpha,beta,gamma,delta", &["--push", bus.url()]).await;
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("pushed"), "{}", said(&out));
    let operator = bus.creds_file(OPERATOR).expect("the operator's creds");
    let out = bootstrap(&bus, &operator, &["--node", "delta", "--provider", "postgres"]).await;
    assert!(out.status.success(), "bootstrap gives delta its share: {}", said(&out));

    let (delta, mut delta_events) = login(&bus, "node-delta", &delta_creds).await.expect("delta logs in once pushed");
    let mut events = delta.subscribe("mesh-provisioner.event.delta").await.expect("subscribe");
    let mut notices = delta.subscribe("mesh-provisioner.notice.delta").await.expect("subscribe");
    delta.flush().await.expect("flush");
    let js = mesh_provisioner::nats::connect::jetstream_of(delta.clone(), "node-delta");
    let needs = js.get_key_value(NEEDS).await.expect("delta binds the needs bucket");
    needs.put("delta.app.bound.postgres=2Edb", b"{}".to_vec().into()).await.expect("delta writes its need");
    let applied = js.get_key_value(APPLIED).await.expect("delta binds the applied bucket");
    applied.put("delta.app", br#"{"build":"b1","needs":1}"#.to_vec().into()).await.expect("delta applies");
    // It may not write another node's keys.
    assert!(needs.put("alpha.app.config.planted", b"{}".to_vec().into()).await.is_err(), "delta wrote alpha's key");
    // Both verbs answer it, about its own node.
    let s = status_until(&delta, "delta", "app", "blocked", |s| s["state"] == "blocked").await;
    assert_eq!(s["needs"][0]["check"], "no_provider", "{s}");
    let plan = ask_ok(&delta, json!({"what":"needs","node":"delta"})).await;
    assert!(tests::keys(&plan).iter().any(|k| k == "delta.app.bound.postgres=2Edb"), "{plan}");
    tests::nats::ask_verb(&delta, "mesh-provisioner.plan", br#"{"node":"delta","module":"app"}"#).await.expect("the plan verb answers delta");
    // Its events, and its notices when the provider writes its value.
    let e = tokio::time::timeout(Duration::from_secs(30), events.next()).await.expect("an event for delta").expect("open");
    let e: Value = serde_json::from_slice(&e.payload).expect("an event is JSON");
    assert_eq!((e["node"].as_str(), e["module"].as_str()), (Some("delta"), Some("app")), "{e}");
    let start = Instant::now();
    let mut told = None;
    for i in 0..30 {
        bus.put("provider-postgres", BOUND, "delta.app.db", format!("{{\"password\":\"v{i}\"}}").as_bytes()).await;
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(1), notices.next()).await {
            told = Some(m);
            break;
        }
    }
    let told = told.unwrap_or_else(|| panic!("delta was never told its bound value changed ({:?})", start.elapsed()));
    let notice: Value = serde_json::from_slice(&told.payload).expect("a notice is JSON");
    assert_eq!(notice["module"], "app", "{notice}");

    // Revoked and pushed: its connection is closed and its creds refused from then on.
    let kept = bus.dir.path().join("node-delta.creds");
    std::fs::copy(&delta_creds, &kept).expect("a copy of delta's creds, as a thief would keep");
    let out = render(&bus, "alpha,beta,gamma,delta", &["--revoke", "node-delta", "--push", bus.url()]).await;
    assert!(out.status.success(), "{}", said(&out));
    assert!(!delta_creds.exists(), "a revoked user's creds are not written again");
    let start = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), delta_events.recv()).await {
            Ok(Some(e)) if e.contains("disconnected") || e.to_lowercase().contains("revoked") || e.contains("closed") => break,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!("delta's connection stayed open after its revocation ({:?})", start.elapsed()),
        }
    }
    let again = login(&bus, "node-delta", &kept).await.expect_err("a revoked user's creds still log in");
    assert!(again.contains("authorization violation"), "{again}");
    // It leaves: dropped from the list (its account retired, every user refused), its share no
    // longer sourced. Its keys stay, and its modules' status names them orphaned.
    let out = render(&bus, "alpha,beta,gamma", &["--push", bus.url()]).await;
    assert!(out.status.success() && said(&out).contains("(1 retired)"), "{}", said(&out));
    // Its status asked just before, so a reply kept over the old sources is there to go stale.
    for _ in 0..2 {
        let s = tests::nats::module_status(&alpha, "delta", "app").await;
        assert!(!s["warnings"].to_string().contains("left the mesh"), "delta has not left yet: {s}");
    }
    let out = bootstrap(&bus, &operator, &["--retire-node", "delta"]).await;
    assert!(out.status.success() && said(&out).contains("no longer sources NODE_delta"), "{}", said(&out));
    // The audit (every 2 s) reads the buckets' new sources one after another: delta wrote to
    // two shared buckets, so one may be named before the other. If not, the host's counts of
    // audits per bucket and its log say why.
    let orphaned_in_both = |s: &Value| {
        let w = s["warnings"].to_string();
        ["mesh-provisioner_needs", "mesh-provisioner_applied"].iter().all(|b| w.contains(&format!("left the mesh: {b} no longer sources its share")))
    };
    tests::nats::status_until_else(&alpha, "delta", "app", "its keys orphaned in both buckets", orphaned_in_both, async || {
        let stats = tokio::time::timeout(Duration::from_secs(2), alpha.request("$SRV.STATS.mesh-provisioner", "".into())).await;
        let audits = match stats {
            Ok(Ok(m)) => String::from_utf8_lossy(&m.payload).into_owned(),
            other => format!("no stats: {other:?}"),
        };
        format!("\nthe host's $SRV.STATS: {audits}\nthe host's log:\n{}", host.log_text())
    })
    .await;
    let s = tests::nats::module_status(&alpha, "alpha", "app").await;
    assert!(!s["warnings"].to_string().contains("left the mesh"), "alpha stays: {s}");
    // The rest of the mesh carried on: alpha still asks and is answered; the provisioner never
    // restarted.
    ask_ok(&alpha, json!({"what":"needs","node":"alpha"})).await;
    assert!(host.child.try_wait().expect("the host").is_none(), "the provisioner stayed up");
    host.signal("TERM");
    let _ = host.child.wait().await;
}

#[tokio::test]
async fn serve_demo_operator_runs_the_example_mesh_signed() {
    let state = tempfile::tempdir().expect("dir");
    tests::nats::private(state.path());
    let mut child = crate::serve_demo(state.path(), &["--operator"]).await;
    let dir = state.path().to_str().expect("path");
    let start = Instant::now();
    loop {
        let out = cli(&["query", "needs", "--node", "alpha", "--state-dir", dir]).await;
        if out.status.success() && said(&out).contains("db.url") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "query through the state dir: {}", said(&out));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The server runs in operator mode: no password anywhere, a creds file a user, private.
    let conf = std::fs::read_to_string(state.path().join("nats/nats-server.conf")).expect("the rendered config");
    assert!(conf.contains("operator: \"eyJ") && conf.contains("resolver_preload") && !conf.contains("password"), "{conf}");
    let creds = state.path().join("nats/accounts/creds/node-alpha.creds");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&creds).expect("alpha's creds").permissions());
    assert_eq!(mode & 0o077, 0, "creds are the owner's alone");
    let _ = child.kill().await;
}

#[tokio::test]
async fn accounts_refuses_a_bad_mesh_naming_it_and_renders_one_from_a_file() {
    let dir = tempfile::tempdir().expect("dir");
    let out = dir.path().join("out");
    let o = out.to_str().expect("path");
    let bad = cli(&["accounts", "--nodes", "alpha,Beta", "--out", o]).await;
    assert!(!bad.status.success() && said(&bad).contains("\"Beta\" is not a name"), "{}", said(&bad));
    let twice = cli(&["accounts", "--nodes", "alpha", "--providers", "alpha", "--out", o]).await;
    assert!(!twice.status.success() && said(&twice).contains("named twice"), "{}", said(&twice));
    assert!(!out.join("nats-server.conf").exists(), "nothing written for a refused mesh");
    let file = dir.path().join("mesh.json");
    std::fs::write(&file, r#"{"nodes": ["alpha", "beta", "gamma"], "extra": 1}"#).expect("write");
    let unknown = cli(&["accounts", "--mesh", file.to_str().expect("path"), "--out", o]).await;
    assert!(!unknown.status.success() && said(&unknown).contains("unknown field `extra`"), "{}", said(&unknown));
    std::fs::write(&file, r#"{"nodes": ["alpha", "beta", "gamma"], "providers": ["postgres"]}"#).expect("write");
    let ok = cli(&["accounts", "--mesh", file.to_str().expect("path"), "--out", o]).await;
    assert!(ok.status.success(), "{}", said(&ok));
    let example = std::fs::read_to_string(tests::root().join("deploy/nats-server.conf")).expect("the example");
    assert_eq!(std::fs::read_to_string(out.join("nats-server.conf")).expect("rendered"), example, "the example is this rendering");
    // Signed: every user's creds, private; the keys kept; nothing but the operator's own JWT
    // in the config's `operator`.
    let signed = cli(&["accounts", "--operator", "--mesh", file.to_str().expect("path"), "--out", o]).await;
    assert!(signed.status.success(), "{}", said(&signed));
    let creds: Vec<String> = std::fs::read_dir(out.join("creds")).expect("creds").flatten().map(|e| e.file_name().to_string_lossy().to_string()).collect();
    assert_eq!(creds.len(), 15, "a creds file a user: {creds:?}");
    for e in std::fs::read_dir(out.join("keys")).expect("keys").flatten().chain(std::fs::read_dir(out.join("creds")).expect("creds").flatten()) {
        let mode = std::os::unix::fs::PermissionsExt::mode(&e.metadata().expect("meta").permissions());
        assert_eq!(mode & 0o077, 0, "{} is the owner's alone", e.path().display());
    }
}
