//! Plans and provisions (SPEC §6), by the built component in wasmtime over in-memory buckets and
//! kept plans in files: the golden fixture mesh, damaged kept plans, hostile plan requests, and
//! which changes move which plans.

use std::sync::Arc;

use mesh_provisioner::runtime::{Change, Limits, RefreshReport, ReplyCode};
use mesh_provisioner::store::backend::{Backend, MemoryBackend};
use mesh_provisioner::store::kept::KeptPlans;
use serde_json::{json, Map, Value};
use tests::golden;

const PLAN: &str = "mesh-provisioner.plan";

async fn plan_of(b: &Arc<MemoryBackend>, body: &[u8]) -> (ReplyCode, Value) {
    let reply = tests::guest().handle(b.clone() as Arc<dyn Backend>, Limits::default(), PLAN, body, 1 << 20).await.expect("the guest answers");
    (reply.code, serde_json::from_slice(&reply.body).expect("the reply is JSON"))
}

async fn plan(b: &Arc<MemoryBackend>, node: &str, module: &str) -> Value {
    let (code, v) = plan_of(b, json!({"node": node, "module": module}).to_string().as_bytes()).await;
    assert_eq!(code, ReplyCode::Ok, "{v}");
    v
}

async fn refresh(b: &Arc<MemoryBackend>, changes: &[Change]) -> RefreshReport {
    tests::guest().refresh(b.clone() as Arc<dyn Backend>, Limits::default(), changes).await.expect("guest runs").expect("refreshes")
}

/// Applies a step's writes and reports exactly those keys as changed, as the host would.
async fn apply(b: &Arc<MemoryBackend>, step: &golden::Step) -> RefreshReport {
    let mut changes = Vec::new();
    for w in &step.writes {
        b.put(&w.bucket, &w.key, &w.bytes());
        changes.push(Change { bucket: w.bucket.clone(), key: Some(w.key.clone()) });
    }
    refresh(b, &changes).await
}

fn files() -> (tempfile::TempDir, Arc<MemoryBackend>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let b = MemoryBackend::with_kept(KeptPlans::files(dir.path().join("plans")));
    (dir, b)
}

#[tokio::test]
async fn plans_and_provisions_match_the_golden_file() {
    let mesh = golden::mesh();
    let (_dir, b) = files();
    let mut actual = Map::new();
    let mut reports = Vec::new();
    for step in &mesh.steps {
        reports.push(apply(&b, step).await);
        let mut plans = Map::new();
        for (node, module) in &mesh.ask {
            plans.insert(golden::name(node, module), plan(&b, node, module).await);
        }
        actual.insert(step.name.clone(), Value::Object(plans));
    }
    if golden::regenerating() {
        golden::regenerate(&actual);
        return;
    }
    let diff = golden::differences(&actual, true);
    assert!(
        diff.is_empty(),
        "plans differ from tests/golden/plans/expected.json (set {}=1 to regenerate, then review):\n{}",
        golden::REGENERATE,
        diff.join("\n")
    );
    // Only a published plan of a module's first build is kept, and only once.
    assert_eq!(reports[0].kept, ["alpha/app@b8", "beta/web@w3", "gamma/worker@k1"]);
    assert!(reports[1].kept.iter().all(|k| k == "gamma/metrics@m1"), "{:?}", reports[1].kept);
}

#[tokio::test]
async fn a_refresh_of_unchanged_buckets_keeps_nothing_again() {
    let mesh = golden::mesh();
    let (_dir, b) = files();
    apply(&b, &mesh.steps[0]).await;
    let whole: Vec<Change> = ["mesh-controller_assignments", "mesh-provisioner_applied", "mesh-indexer_builds", "composed-alpha"]
        .iter()
        .map(|bucket| Change { bucket: bucket.to_string(), key: None })
        .collect();
    let again = refresh(&b, &whole).await;
    assert!(again.kept.is_empty(), "{:?}", again.kept);
    assert!(again.computed >= 6, "every module of the mesh is recomputed: {}", again.computed);
}

#[tokio::test]
async fn a_damaged_kept_plan_makes_the_module_wait_with_the_reason_and_is_replaced_when_published() {
    let mesh = golden::mesh();
    let (dir, b) = files();
    apply(&b, &mesh.steps[0]).await;
    let file = dir.path().join("plans/alpha/app.plan");
    let mut bytes = std::fs::read(&file).expect("alpha/app's plan is kept as a file");
    let last = bytes.len() - 2;
    bytes[last] ^= 0x20;
    std::fs::write(&file, &bytes).unwrap();

    // want b9 is refused: with the kept plan unreadable the module waits, saying why.
    apply(&b, &mesh.steps[1]).await;
    let v = plan(&b, "alpha", "app").await;
    assert_eq!(v["state"], "waiting", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.contains("refused") && reason.contains("corrupt") && reason.contains("damaged"), "{reason}");

    // A file that is not a kept plan at all, and one in a later format, say so too.
    for (contents, says) in [(&b"hello"[..], "no header"), (&b"mesh-provisioner kept-plan 9\nsha256 00\n{}"[..], "format \"9\" is unknown")] {
        std::fs::write(&file, contents).unwrap();
        let v = plan(&b, "alpha", "app").await;
        assert!(v["reason"].as_str().unwrap().contains(says), "{v}");
    }

    // A published want is kept again over the damaged file.
    b.put("mesh-controller_assignments", "alpha.app", br#"{"want":"b8"}"#);
    let r = refresh(&b, &[Change { bucket: "mesh-controller_assignments".into(), key: Some("alpha.app".into()) }]).await;
    assert_eq!(r.kept, ["alpha/app@b8"]);
    b.put("mesh-controller_assignments", "alpha.app", br#"{"want":"b9"}"#);
    let v = plan(&b, "alpha", "app").await;
    assert_eq!((v["state"].as_str(), v["entries"][0]["plan_build"].as_str()), (Some("held"), Some("b8")), "{v}");
}

#[tokio::test]
async fn a_kept_plan_of_another_module_or_format_is_not_used() {
    let b = MemoryBackend::new();
    b.put("mesh-controller_assignments", "alpha.app", br#"{"want":"b2"}"#);
    for (kept, says) in [
        (json!({"format": 1, "node": "alpha", "module": "web", "build": "b1", "plan": {}}), "another module"),
        (json!({"format": 7, "node": "alpha", "module": "app", "build": "b1", "plan": {}}), "format 7"),
        (json!({"format": 1, "node": "alpha", "module": "app", "build": "b1", "plan": []}), "no plan object"),
    ] {
        b.kept().save("alpha", "app", kept.to_string().as_bytes()).unwrap();
        let v = plan(&b, "alpha", "app").await;
        assert_eq!(v["state"], "waiting", "{v}");
        assert!(v["reason"].as_str().unwrap().contains(says), "{v}");
    }
}

#[tokio::test]
async fn odd_compositions_and_sources_hold_or_wait_with_a_reason() {
    let b = MemoryBackend::new();
    let cases: [(&str, &[u8], &str); 8] = [
        ("a1", b"not json", "not a JSON object"),
        ("a0", br#"{"state":"published","plan":{"needs":[]}"#, "not JSON"),
        ("a7", br#"{"state":"published","plan":[]}"#, "without a plan object"),
        ("a2", br#"{"state":"published"}"#, "without a plan object"),
        ("a3", br#"{"state":"published","plan":{"needs":{"kind":"config"}}}"#, "`needs` is not a list"),
        ("a4", br#"{"state":"drafted"}"#, "neither published nor refused"),
        ("a5", br#"{"plan":{}}"#, "has no state"),
        ("a6", br#"{"state":"refused"}"#, "refused: no reason given"),
    ];
    for (build, value, says) in cases {
        b.put("composed-alpha", &format!("app.{build}"), value);
        b.put("mesh-controller_assignments", "alpha.app", json!({"want": build}).to_string().as_bytes());
        let v = plan(&b, "alpha", "app").await;
        assert_eq!(v["state"], "waiting", "{build}: {v}");
        assert!(v["reason"].as_str().unwrap().contains(says), "{build}: {v}");
    }
    for (value, says) in [(&br#"{"want":7}"#[..], "not a build name"), (&br#"{"want":"b.1"}"#[..], "not an identifier"), (&br#"[1]"#[..], "not a JSON object")]
    {
        b.put("mesh-controller_assignments", "alpha.app", value);
        let v = plan(&b, "alpha", "app").await;
        assert_eq!((v["state"].as_str(), v["entries"][0]["build"].is_null()), (Some("waiting"), true), "{v}");
        assert!(v["reason"].as_str().unwrap().contains(says), "{v}");
    }
    // A want that names no build (null) falls back to the have.
    b.put("mesh-controller_assignments", "alpha.app", br#"{"want":null}"#);
    b.put("mesh-provisioner_applied", "alpha.app", br#"{"build":"a6","needs":0}"#);
    assert_eq!(plan(&b, "alpha", "app").await["entries"][0]["as"], json!(["have"]));
}

#[tokio::test]
async fn refuses_bad_plan_requests_before_reading_anything() {
    let b = MemoryBackend::new();
    for (body, says) in [
        (&b""[..], "`node` is required"),
        (br#"{"node":"alpha"}"#, "`module` is required"),
        (br#"{"module":"app"}"#, "`node` is required"),
        (br#"{"node":"*","module":"app"}"#, "field `node`"),
        (br#"{"node":"alpha","module":">"}"#, "field `module`"),
        (br#"{"node":"al.pha","module":"app"}"#, "field `node`"),
        (br#"{"node":"","module":"app"}"#, "field `node`"),
        (br#"{"node":"alpha","module":"app","what":"needs"}"#, "unknown field"),
        (br#"{"node":"alpha","module":"app","node":"beta"}"#, "given twice"),
        (br#"{"node":1,"module":"app"}"#, "must be a string"),
        (br#"["alpha","app"]"#, "one JSON object"),
        (b"\xff\xfe", "not UTF-8"),
    ] {
        let (code, v) = plan_of(&b, body).await;
        assert_eq!(code, ReplyCode::BadRequest, "{body:?}: {v}");
        assert_eq!(v["error"]["code"], "bad_request");
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{body:?}: {v}");
    }
    let big = format!(r#"{{"node":"alpha","module":"app","pad":"{}"}}"#, "x".repeat(20_000));
    let (code, v) = plan_of(&b, big.as_bytes()).await;
    assert_eq!(code, ReplyCode::BadRequest);
    assert!(v["error"]["message"].as_str().unwrap().contains("at most"), "{v}");
    assert_eq!(b.buckets(), Vec::<String>::new(), "a refused request reads no bucket");
    // A good request does read them (so the check above can fail).
    plan(&b, "alpha", "app").await;
    assert!(b.buckets().contains(&"mesh-controller_assignments".to_string()), "{:?}", b.buckets());
}

#[tokio::test]
async fn an_indexer_change_moves_the_module_on_every_node_that_has_it() {
    let b = MemoryBackend::new();
    for node in ["alpha", "beta", "gamma"] {
        b.put(&format!("composed-{node}"), "app.b2", br#"{"state":"published","plan":{"needs":[]}}"#);
    }
    b.put("mesh-controller_assignments", "alpha.app", br#"{}"#);
    b.put("mesh-provisioner_applied", "beta.app", br#"{"build":"b1"}"#);
    b.put("mesh-controller_assignments", "gamma.web", br#"{"want":"w1"}"#);
    b.put("mesh-indexer_builds", "app", br#"{"newest":"b2"}"#);
    let r = refresh(&b, &[Change { bucket: "mesh-indexer_builds".into(), key: Some("app".into()) }]).await;
    assert_eq!(r.computed, 2, "alpha/app and beta/app, not gamma/web");
    assert_eq!(r.kept, ["alpha/app@b2"], "beta/app's first build is its have, b1, not published");
    assert_eq!(r.waiting.len(), 1, "{:?}", r.waiting);
    assert!(r.waiting[0].starts_with("beta/app: the composition of app at b1 is not yet published"), "{:?}", r.waiting);
    // A change of a composition bucket moves that node's module only.
    let r = refresh(&b, &[Change { bucket: "composed-gamma".into(), key: Some("web.w1".into()) }]).await;
    assert_eq!(r.computed, 1);
    // Keys out of shape and buckets plans do not read move nothing.
    let r = refresh(
        &b,
        &[
            Change { bucket: "composed-gamma".into(), key: Some("web".into()) },
            Change { bucket: "mesh-provisioner_needs".into(), key: Some("alpha.app.config.x".into()) },
            Change { bucket: "composed-".into(), key: None },
        ],
    )
    .await;
    assert_eq!(r.computed, 0);
}

#[tokio::test]
async fn a_module_nothing_names_waits_and_says_so() {
    let b = MemoryBackend::new();
    let v = plan(&b, "alpha", "ghost").await;
    assert_eq!(v["state"], "waiting");
    assert_eq!(v["entries"], json!([]));
    assert!(v["reason"].as_str().unwrap().contains("no want, no applied build"), "{v}");
}

#[tokio::test]
async fn a_plan_too_large_for_a_reply_is_an_error_that_says_so() {
    let b = MemoryBackend::new();
    let needs: Vec<Value> = (0..400).map(|i| json!({"kind":"config","name":format!("n{i}"),"part":"p"})).collect();
    b.put("composed-alpha", "app.b1", json!({"state":"published","plan":{"needs":needs}}).to_string().as_bytes());
    b.put("mesh-controller_assignments", "alpha.app", br#"{"want":"b1"}"#);
    let reply = tests::guest().handle(b.clone() as Arc<dyn Backend>, Limits::default(), PLAN, br#"{"node":"alpha","module":"app"}"#, 4096).await.unwrap();
    assert_eq!(reply.code, ReplyCode::Internal);
    let v: Value = serde_json::from_slice(&reply.body).unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("more than a reply may hold"), "{v}");
    assert!(reply.body.len() <= 4096);
}

/// Refreshes `changes` and every rest handed back until none is left; the reports.
async fn refresh_through(b: &Arc<MemoryBackend>, limits: Limits, changes: Vec<Change>) -> Vec<RefreshReport> {
    let (mut reports, mut batch) = (Vec::new(), changes);
    while !batch.is_empty() {
        let r = tests::guest().refresh(b.clone() as Arc<dyn Backend>, limits, &batch).await.expect("guest runs").expect("refreshes");
        batch = r.rest.clone();
        reports.push(r);
        assert!(reports.len() < 10_000, "the rest never ran out");
    }
    reports
}

#[tokio::test]
async fn a_large_mesh_is_refreshed_a_bounded_slice_per_call_and_the_rest_handed_back() {
    let b = MemoryBackend::new();
    for m in 0..2500 {
        b.put("mesh-controller_assignments", &format!("alpha.m{m:04}"), br#"{"want":"b1"}"#);
        b.put("composed-alpha", &format!("m{m:04}.b1"), br#"{"state":"published","plan":{"needs":[]}}"#);
    }
    let reports = refresh_through(&b, Limits::default(), vec![Change { bucket: "mesh-controller_assignments".into(), key: None }]).await;
    // The bucket is read a page per call; the continuation is the guest's, handed back as is.
    assert_eq!(reports[0].computed, 1000);
    assert_eq!(reports[0].rest, [Change { bucket: "mesh-controller_assignments".into(), key: Some(">alpha.m0999".into()) }]);
    assert_eq!(reports.iter().map(|r| r.computed).sum::<u32>(), 2500);
    let kept: Vec<&String> = reports.iter().flat_map(|r| &r.kept).collect();
    assert_eq!(kept.len(), 2500);
    assert_eq!(kept.last().map(|s| s.as_str()), Some("alpha/m2499@b1"));
    // Many single-module changes still cut at the most plans one call computes.
    let many: Vec<Change> = (0..2500).map(|m| Change { bucket: "mesh-controller_assignments".into(), key: Some(format!("alpha.m{m:04}")) }).collect();
    let one = refresh(&b, &many).await;
    assert_eq!((one.computed, one.rest.len()), (2000, 500));
    assert_eq!(one.rest[0], Change { bucket: "mesh-controller_assignments".into(), key: Some("alpha.m2000".into()) });
}

#[tokio::test]
async fn plans_follow_a_mesh_of_100_000_modules_within_the_guests_memory() {
    // 100 000 assignments of ~700 bytes: 70 MB, more than the guest's whole memory (64 MiB).
    // Read whole, the refresh could never finish; read a page per call, it follows them all.
    let b = MemoryBackend::new();
    let note = "x".repeat(640);
    for i in 0..100_000u32 {
        let (node, module) = (format!("n{:03}", i % 500), format!("m{:03}", i / 500));
        b.put("mesh-controller_assignments", &format!("{node}.{module}"), json!({"want": "b1", "note": note}).to_string().as_bytes());
    }
    b.put("composed-n000", "m000.b1", br#"{"state":"published","plan":{"needs":[]}}"#);
    let started = std::time::Instant::now();
    let reports = refresh_through(&b, Limits::default(), vec![Change { bucket: "mesh-indexer_builds".into(), key: None }]).await;
    let computed: u32 = reports.iter().map(|r| r.computed).sum();
    println!("100 000 modules: {computed} plans in {} calls, {:?}", reports.len(), started.elapsed());
    assert!(computed >= 100_000, "every module's plan computed: {computed}");
    let kept: Vec<&String> = reports.iter().flat_map(|r| &r.kept).collect();
    assert_eq!(kept, ["n000/m000@b1"]);
    let waiting = reports.iter().map(|r| r.waiting.len()).sum::<usize>();
    assert!(waiting >= 99_999, "the others wait for their compositions: {waiting}");
}

#[tokio::test]
async fn one_module_the_guest_cannot_plan_costs_that_module_not_the_mesh() {
    // One composition larger than the guest's whole memory: computing that module's plan
    // traps, every time. The other 63 modules are planned and kept all the same.
    let (_dir, b) = files();
    let limits = Limits { memory: 16 << 20, ..Limits::default() };
    let mut changes = Vec::new();
    for m in 0..64 {
        let module = format!("m{m:02}");
        b.put("mesh-controller_assignments", &format!("alpha.{module}"), br#"{"want":"b1"}"#);
        let plan = if m == 41 {
            json!({"state":"published","plan":{"needs":[], "pad": "x".repeat(20 << 20)}})
        } else {
            json!({"state":"published","plan":{"needs":[]}})
        };
        b.put("composed-alpha", &format!("{module}.b1"), plan.to_string().as_bytes());
        changes.push(Change { bucket: "mesh-controller_assignments".into(), key: Some(format!("alpha.{module}")) });
    }
    let backend = b.clone() as Arc<dyn Backend>;
    let followed = mesh_provisioner::serve::plans::refresh_through(&tests::guest(), &backend, limits, changes).await.expect("no host failure");
    assert_eq!(followed.computed, 63);
    assert_eq!(followed.given_up.len(), 1, "{:?}", followed.given_up);
    let (change, why) = &followed.given_up[0];
    assert_eq!(change.key.as_deref(), Some("alpha.m41"));
    assert!(why.contains("memory"), "the reason says why: {why}");
    for m in [0, 40, 42, 63] {
        let v = plan(&b, "alpha", &format!("m{m:02}")).await;
        assert_eq!(v["state"], "planned", "{v}");
    }
}
