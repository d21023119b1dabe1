//! Plans end to end (SPEC §6): the real host binary and component against a real nats-server
//! with the example config. The fixture mesh is written by the users that own each bucket (the
//! controller, the indexer, each node's engine and client), the plans are asked on
//! `mesh-provisioner.plan` and must equal the golden file; kept plans survive a restart.

use std::time::{Duration, Instant};

use async_nats::Client;
use serde_json::{json, Map, Value};
use tests::golden;
use tests::nats::{host_binary, Bus, Host, PLAN_BUCKETS};

async fn write(bus: &Bus, step: &golden::Step) {
    for w in &step.writes {
        bus.put(&w.user, &w.bucket, &w.key, &w.bytes()).await;
    }
}

async fn ask_plan(client: &Client, body: &Value) -> (Option<String>, Value) {
    tests::nats::ask_verb(client, "mesh-provisioner.plan", body.to_string().as_bytes()).await.expect("the plan verb answers")
}

/// Asks every pinned plan until they all equal the golden step (plans follow changes a moment
/// after they land), failing with the differences after a while.
async fn wait_for_step(client: &Client, mesh: &golden::Mesh, step: &str, host: &Host) {
    let start = Instant::now();
    loop {
        let mut plans = Map::new();
        for (node, module) in &mesh.ask {
            let (code, v) = ask_plan(client, &json!({"node": node, "module": module})).await;
            assert_eq!(code, None, "{node}/{module}: {v}");
            plans.insert(golden::name(node, module), v);
        }
        let mut actual = Map::new();
        actual.insert(step.to_string(), Value::Object(plans));
        let diff = golden::differences(&actual, false);
        if diff.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "plans over the bus differ from the golden step {step}:\n{}\nhost log:\n{}",
            diff.join("\n"),
            host.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The modules whose first build's plan step 1 publishes, and step 2 then holds on.
const KEPT_IN_STEP_1: [(&str, &str); 3] = [("alpha/app", "b8"), ("beta/web", "w3"), ("gamma/worker", "k1")];

/// Waits until each module's kept plan in the host's state directory is of its build: the verb
/// answers from the buckets at once, the plans follow (and are kept) a moment later.
async fn wait_kept(host: &Host, modules: &[(&str, &str)]) {
    let start = Instant::now();
    for (m, build) in modules {
        let file = host.state.path().join("plans").join(format!("{m}.plan"));
        let of_build = format!("\"build\":\"{build}\"");
        while !std::fs::read_to_string(&file).is_ok_and(|t| t.contains(&of_build)) {
            assert!(start.elapsed() < Duration::from_secs(20), "{m}'s plan of {build} was not kept:\n{}", host.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Stops the host gracefully (it releases the seat), keeping its state directory.
async fn stop_gracefully(mut host: Host) -> tempfile::TempDir {
    host.signal("TERM");
    let _ = tokio::time::timeout(Duration::from_secs(10), host.child.wait()).await;
    host.stop().await
}

#[tokio::test]
async fn plans_over_the_bus_match_the_golden_file_and_kept_plans_survive_a_restart() {
    let mesh = golden::mesh();
    let bus = Bus::start().await;
    // Started before the plan buckets exist: each is followed from its creation.
    let host = Host::start(&bus, &["--seat-ttl", "2s"]).await;
    bus.create_plan_buckets().await;
    let controller = bus.client("mesh-controller").await;

    write(&bus, &mesh.steps[0]).await;
    wait_for_step(&controller, &mesh, &mesh.steps[0].name, &host).await;
    wait_kept(&host, &KEPT_IN_STEP_1).await;
    let state = stop_gracefully(host).await;

    // The mesh moves while the host is down: the plans a refusal holds on can only come from
    // what the first run kept in its state directory.
    write(&bus, &mesh.steps[1]).await;
    let host = Host::start_in(&bus, state, &["--seat-ttl", "2s"]).await;
    wait_for_step(&controller, &mesh, &mesh.steps[1].name, &host).await;

    // The verb's endpoint is listed beside the provisioning one.
    let info = controller.request("$SRV.INFO.mesh-provisioner", "".into()).await.unwrap();
    let info: Value = serde_json::from_slice(&info.payload).unwrap();
    let subjects: Vec<&str> = info["endpoints"].as_array().unwrap().iter().filter_map(|e| e["subject"].as_str()).collect();
    assert_eq!(subjects, ["mesh-provisioner.provisioning", "mesh-provisioner.plan"]);

    // The same mesh without the kept plans: nothing to hold on, the refused module waits.
    stop_gracefully(host).await;
    let host = Host::start(&bus, &["--seat-ttl", "2s"]).await;
    let (_, v) = ask_plan(&controller, &json!({"node": "alpha", "module": "app"})).await;
    assert_eq!(v["state"], "waiting", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("no plan was kept"), "{v}");
    host.stop().await;
}

#[tokio::test]
async fn query_plan_prints_provisions_and_refuses_a_request_without_a_module() {
    let mesh = golden::mesh();
    let bus = Bus::start().await;
    let host = Host::start(&bus, &[]).await;
    bus.create_plan_buckets().await;
    write(&bus, &mesh.steps[0]).await;
    let controller = bus.client("mesh-controller").await;
    wait_for_step(&controller, &mesh, &mesh.steps[0].name, &host).await;

    let pw = bus.password("mesh-controller");
    let conn = ["--nats-url", bus.url(), "--user", "mesh-controller", "--password", pw.as_str()];
    let run = |args: &[&str]| std::process::Command::new(host_binary()).args(args).args(conn).output().expect("run the host binary");
    let out = run(&["query", "plan", "--node", "alpha", "--module", "app"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for shown in [
        "app on alpha: planned",
        "want b8",
        "postgres_bound alpha.app.db.ro",
        "verb mesh-vault.secret",
        "unanswered: no domain answers the kind \"widget\"",
        "malformed: a bound need",
    ] {
        assert!(text.contains(shown), "{shown:?} not in:\n{text}");
    }
    let out = run(&["query", "plan", "--node", "alpha"]);
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("bad_request (400)") && text.contains("`module` is required"), "{text}");
    host.stop().await;
}

#[tokio::test]
async fn each_writer_of_plan_inputs_is_held_to_its_own_bucket() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    /// Publishes as a core message; the server takes it or refuses it by name.
    async fn publish(c: &Client, subject: &str) {
        c.publish(subject.to_string(), "{}".into()).await.expect("publish");
        c.flush().await.expect("flush");
    }
    let js = |c: &Client, user: &str| {
        let mut js = mesh_provisioner::nats::connect::jetstream_of(c.clone(), user);
        js.set_timeout(Duration::from_millis(1500));
        js
    };
    // A node's engine writes its own node's compositions and no other's.
    let (alpha, denied) = bus.watched("node-alpha").await;
    assert!(js(&alpha, "node-alpha").get_key_value("composed-alpha").await.unwrap().put("app.b1", "{}".into()).await.is_ok());
    assert!(js(&alpha, "node-alpha").get_key_value("composed-beta").await.is_err(), "node-alpha opened composed-beta");
    denied.expect("Publish to", "$JS.mesh.API.STREAM.INFO.KV_composed-beta").await;
    publish(&alpha, "$KV.composed-beta.app.b1").await;
    denied.expect("Publish to", "$KV.composed-beta.app.b1").await;
    assert!(js(&alpha, "node-alpha").get_key_value("mesh-controller_assignments").await.is_err());
    denied.expect("Publish to", "$JS.mesh.API.STREAM.INFO.KV_mesh-controller_assignments").await;
    // The controller writes assignments only; the indexer builds only.
    let (controller, cdenied) = bus.watched("mesh-controller").await;
    assert!(js(&controller, "mesh-controller").get_key_value("mesh-indexer_builds").await.is_err());
    cdenied.expect("Publish to", "$JS.mesh.API.STREAM.INFO.KV_mesh-indexer_builds").await;
    publish(&controller, "$KV.composed-alpha.app.b2").await;
    cdenied.expect("Publish to", "$KV.composed-alpha.app.b2").await;
    let (indexer, idenied) = bus.watched("mesh-indexer").await;
    publish(&indexer, "$KV.mesh-controller_assignments.alpha.app").await;
    idenied.expect("Publish to", "$KV.mesh-controller_assignments.alpha.app").await;
    // The provisioner reads them all and writes none.
    let (prov, pdenied) = bus.watched("mesh-provisioner").await;
    for (_, bucket) in PLAN_BUCKETS {
        let kv = js(&prov, "mesh-provisioner").get_key_value(bucket).await.unwrap_or_else(|e| panic!("the provisioner reads {bucket}: {e}"));
        assert!(kv.put("alpha.app", "{}".into()).await.is_err(), "the provisioner wrote {bucket}");
        pdenied.expect("Publish to", &format!("$KV.{bucket}.alpha.app")).await;
    }
    let pjs = js(&prov, "mesh-provisioner");
    assert_eq!(pjs.get_key_value("composed-alpha").await.unwrap().get("app.b1").await.unwrap().as_deref(), Some(&b"{}"[..]));
    // Nothing refused landed.
    assert!(pjs.get_key_value("composed-beta").await.unwrap().get("app.b1").await.unwrap().is_none());
    assert!(pjs.get_key_value("composed-alpha").await.unwrap().get("app.b2").await.unwrap().is_none());
    assert!(pjs.get_key_value("mesh-controller_assignments").await.unwrap().get("alpha.app").await.unwrap().is_none());
}

#[tokio::test]
async fn a_swapped_component_recomputes_every_plan_and_machine_placement_follows_its_table() {
    let mesh = golden::mesh();
    let bus = Bus::start().await;
    let dir = tempfile::tempdir().unwrap();
    let component = dir.path().join("guest.wasm");
    tests::install(&tests::component_path(), &component);
    let host = Host::start_with(&bus, tempfile::tempdir().unwrap(), &component, &[]).await;
    bus.create_plan_buckets().await;
    let controller = bus.client("mesh-controller").await;
    // Step by step: a plan is kept only if it was current when the plans followed the change.
    write(&bus, &mesh.steps[0]).await;
    wait_for_step(&controller, &mesh, &mesh.steps[0].name, &host).await;
    wait_kept(&host, &KEPT_IN_STEP_1).await;
    write(&bus, &mesh.steps[1]).await;
    wait_for_step(&controller, &mesh, &mesh.steps[1].name, &host).await;
    // Step 2 is followed when gamma/metrics (published in it) is kept.
    wait_kept(&host, &[("gamma/metrics", "m1")]).await;
    let metrics = || async { ask_plan(&controller, &json!({"node": "gamma", "module": "metrics"})).await.1 };
    let machine = metrics().await["entries"][0]["provisions"][1].clone();
    assert_eq!(machine["bucket"], "mesh-controller_assignments", "{machine}");

    // Forget what was kept, then swap in v2 (whose table drops `machine`): everything is
    // recomputed once, so the first builds' plans are kept again without any bucket changing.
    let plans = host.state.path().join("plans");
    std::fs::remove_dir_all(&plans).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!plans.exists(), "the plans were quiet before the swap:\n{}", host.log_text());
    tests::install(&tests::fixture("v2"), &component);
    wait_kept(&host, &[("gamma/metrics", "m1")]).await;
    assert!(!plans.join("gamma/worker.plan").exists(), "gamma/worker's first build (k3) is not published: nothing to keep");
    assert_eq!(Host::info(&controller).await["component_version"], "0.2.0-fixture");
    let machine = metrics().await["entries"][0]["provisions"][1].clone();
    assert_eq!(machine["unanswered"], true, "v2 answers no `machine`: {machine}");
    host.stop().await;
}

#[tokio::test]
async fn a_plan_that_could_not_be_kept_is_kept_once_the_state_directory_allows_it() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let state = tempfile::tempdir().unwrap();
    // A file where the plans' directory goes: nothing can be kept (as root too).
    let plans = state.path().join("plans");
    std::fs::write(&plans, b"in the way").unwrap();
    let host = Host::start_in(&bus, state, &["--seat-ttl", "2s"]).await;
    bus.put("mesh-controller", "mesh-controller_assignments", "alpha.app", br#"{"want":"b1"}"#).await;
    bus.put("node-alpha", "composed-alpha", "app.b1", tests::sample_composition().as_bytes()).await;
    let start = Instant::now();
    while !host.log_text().contains("plans not kept; trying again") {
        assert!(start.elapsed() < Duration::from_secs(20), "the failed keep was not reported:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(host.log_text().contains("could not keep the plan of alpha/app at b1"), "{}", host.log_text());
    std::fs::remove_file(&plans).unwrap();
    wait_kept(&host, &[("alpha/app", "b1")]).await;
    host.stop().await;
}

/// The modules with a plan kept under `plans`, as `node/module`, sorted.
fn kept_files(plans: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for node in std::fs::read_dir(plans).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(node.path()).into_iter().flatten().flatten() {
            if let Some(m) = file.file_name().to_str().and_then(|f| f.strip_suffix(".plan")) {
                out.push(format!("{}/{m}", node.file_name().to_string_lossy()));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn kept_plans_of_modules_no_source_names_go_after_the_grace_and_the_directory_stays_steady() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let host = Host::start(&bus, &["--http", "127.0.0.1:0", "--kept-plan-grace", "2s"]).await;
    let url = host.http_url().await;
    let plans = host.state.path().join("plans");
    // A module that stays: its plan stays kept however long.
    bus.put("mesh-controller", "mesh-controller_assignments", "alpha.app", br#"{"want":"b1"}"#).await;
    bus.put("node-alpha", "composed-alpha", "app.b1", tests::sample_composition().as_bytes()).await;
    wait_kept(&host, &[("alpha/app", "b1")]).await;
    let js = bus.js("node-alpha").await;
    let (applied, composed) =
        (js.get_key_value("mesh-provisioner_applied").await.expect("applied"), js.get_key_value("composed-alpha").await.expect("composed-alpha"));
    // A node's churn: three rounds of ten new module names, each applied and composed, then
    // deleted. Each round's plans are kept, then go once no source names them.
    for round in 0..3 {
        let modules: Vec<String> = (0..10).map(|i| format!("churn{round}x{i}")).collect();
        for m in &modules {
            applied.put(format!("alpha.{m}"), r#"{"build":"b1","needs":0}"#.into()).await.expect("applied");
            composed.put(format!("{m}.b1"), tests::sample_composition().into()).await.expect("composed");
        }
        let named: Vec<(String, &str)> = modules.iter().map(|m| (format!("alpha/{m}"), "b1")).collect();
        wait_kept(&host, &named.iter().map(|(m, b)| (m.as_str(), *b)).collect::<Vec<_>>()).await;
        for m in &modules {
            applied.delete(format!("alpha.{m}")).await.expect("deleted");
            composed.delete(format!("{m}.b1")).await.expect("deleted");
        }
        let start = Instant::now();
        while kept_files(&plans) != ["alpha/app"] {
            assert!(start.elapsed() < Duration::from_secs(30), "round {round}: kept {:?}\n{}", kept_files(&plans), host.log_text());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(host.log_text().contains("kept plan removed: no source names the module any more"), "{}", host.log_text());
    // The directory's size and the plans kept are metrics.
    let start = Instant::now();
    loop {
        let (_, _, m) = tests::browser::get(&format!("{url}/metrics")).await;
        let value = |name: &str| m.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()));
        if value("mesh_provisioner_kept_plans ") == Some(1.0) && value("mesh_provisioner_state_dir_bytes ").is_some_and(|b| b > 0.0) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{m}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    host.stop().await;
}
