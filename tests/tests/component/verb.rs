//! The provisioning verb, answered by the built component in wasmtime over in-memory buckets.

use std::collections::BTreeSet;
use std::sync::Arc;

use mesh_provisioner::runtime::ReplyCode;
use mesh_provisioner::store::backend::{Backend, MemoryBackend};
use serde_json::{json, Value};
use tests::{ask, ask_with, keys, out_of_shape};

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const COLLECT: &str = "mesh-provisioner_collect";

/// A small mesh as the node clients would write it, with one odd key of every kind.
fn mesh() -> Arc<MemoryBackend> {
    let b = MemoryBackend::new();
    for (key, value) in [
        ("alpha.app.config.db=2Eurl", r#"{"placeholder":"${config:db.url}","part":"api"}"#),
        ("alpha.app.secret.db_password", r#"{"placeholder":"${secret:db_password}"}"#),
        ("alpha.app.bound.postgres=2Edb", r#"{"placeholder":"${bound:postgres.db}"}"#),
        ("alpha.web.port.http", "{}"),
        ("beta.app.config.db=2Eurl", "{}"),
        ("beta.app.dir.state", "{}"),
        // out of shape
        ("alpha.app", "{}"),
        ("alpha.app.config.x.y", "{}"),
        ("alpha.app.config.=3a", "{}"),
        ("alpha.app.config.=C3", "{}"),
        ("alpha.a=3Db.config.x", "{}"),
        ("alpha..config.x", "{}"),
    ] {
        b.put(NEEDS, key, value.as_bytes());
    }
    for (key, value) in [
        ("alpha.app", r#"{"build":"b7","needs":3,"at":"2026-11-29T10:00:00Z"}"#),
        ("alpha.web", r#"{"build":"w1","needs":0}"#),
        ("beta.app", r#"{"build":"b7","needs":2}"#),
        ("alpha.app.extra", "{}"),
        ("beta", "{}"),
    ] {
        b.put(APPLIED, key, value.as_bytes());
    }
    b.put(COLLECT, "alpha.shell=3Azsh=3Anormal.app", br#"{"line":"export X=1"}"#);
    b.put(COLLECT, "alpha.shell=3Azsh=3Anormal.web", br#"{"line":"export Y=2"}"#);
    b.put(COLLECT, "alpha.environment.app", b"PATH=/opt/app/bin");
    b.put(COLLECT, "beta.shell=3Azsh=3Anormal.app", &[0xde, 0xad, 0xbe, 0xef]);
    b.put(COLLECT, "alpha.shell", b"{}");
    b.put(COLLECT, "alpha.shell=3azsh.app", b"{}");
    b
}

async fn ok(b: &Arc<MemoryBackend>, body: Value) -> Value {
    let (code, v) = ask(b.clone() as Arc<dyn Backend>, body.to_string().as_bytes()).await;
    assert_eq!(code, ReplyCode::Ok, "{v}");
    v
}

async fn refused(b: &Arc<MemoryBackend>, body: &[u8]) -> String {
    let (code, v) = ask(b.clone() as Arc<dyn Backend>, body).await;
    assert_eq!(code, ReplyCode::BadRequest, "{} answered {v}", String::from_utf8_lossy(&body[..body.len().min(80)]));
    assert_eq!(v["error"]["code"], "bad_request");
    assert!(v.get("entries").is_none(), "an error reply carries no entries: {v}");
    v["error"]["message"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn answers_needs_narrowed_by_node_module_and_kind() {
    let b = mesh();
    let v = ok(&b, json!({"what":"needs","node":"alpha","module":"app","kind":"config"})).await;
    assert_eq!(keys(&v), ["alpha.app.config.db=2Eurl"]);
    let e = &v["entries"][0];
    assert_eq!(
        (e["node"].as_str(), e["module"].as_str(), e["kind"].as_str(), e["name"].as_str()),
        (Some("alpha"), Some("app"), Some("config"), Some("db.url"))
    );
    assert_eq!(e["value"]["part"], "api");
    // `alpha.app` has no kind: out of this scope (it is in node and module's, below).
    assert_eq!(out_of_shape(&v), ["alpha.app.config.=3a", "alpha.app.config.=C3", "alpha.app.config.x.y"]);

    let v = ok(&b, json!({"what":"needs","node":"alpha","module":"app"})).await;
    assert_eq!(keys(&v), ["alpha.app.bound.postgres=2Edb", "alpha.app.config.db=2Eurl", "alpha.app.secret.db_password"]);
    assert_eq!(out_of_shape(&v), ["alpha.app", "alpha.app.config.=3a", "alpha.app.config.=C3", "alpha.app.config.x.y"]);

    let v = ok(&b, json!({"what":"needs","node":"beta"})).await;
    assert_eq!(keys(&v), ["beta.app.config.db=2Eurl", "beta.app.dir.state"]);
    assert!(out_of_shape(&v).is_empty());

    let v = ok(&b, json!({"what":"needs","kind":"config"})).await;
    assert_eq!(keys(&v), ["alpha.app.config.db=2Eurl", "beta.app.config.db=2Eurl"]);

    let v = ok(&b, json!({"what":"needs","module":"web"})).await;
    assert_eq!(keys(&v), ["alpha.web.port.http"]);
}

#[tokio::test]
async fn lists_every_out_of_shape_key_with_its_reason() {
    let b = mesh();
    let v = ok(&b, json!({"what":"needs"})).await;
    assert_eq!(keys(&v).len(), 6);
    let reasons: Vec<(String, String)> =
        v["out_of_shape"].as_array().unwrap().iter().map(|e| (e["key"].as_str().unwrap().to_string(), e["reason"].as_str().unwrap().to_string())).collect();
    let reason = |k: &str| reasons.iter().find(|(key, _)| key == k).map(|(_, r)| r.clone()).unwrap_or_else(|| panic!("{k} not reported"));
    assert_eq!(reason("alpha.app"), "needs keys are <node>.<module>.<kind>.<name>: 2 tokens");
    assert!(reason("alpha.app.config.x.y").contains("5 tokens"));
    assert!(reason("alpha.app.config.=3a").contains("upper-case"));
    assert!(reason("alpha.app.config.=C3").contains("UTF-8"));
    assert!(reason("alpha.a=3Db.config.x").contains("token 2 (<module>)"));
    assert!(reason("alpha..config.x").contains("empty"));
    assert_eq!(reasons.len(), 6);
    for e in v["out_of_shape"].as_array().unwrap() {
        assert!(e["revision"].as_u64().unwrap() > 0);
    }
    let v = ok(&b, json!({"what":"applied"})).await;
    assert_eq!(keys(&v), ["alpha.app", "alpha.web", "beta.app"]);
    assert_eq!(out_of_shape(&v), ["alpha.app.extra", "beta"]);
    let v = ok(&b, json!({"what":"collect","node":"alpha"})).await;
    assert_eq!(out_of_shape(&v), ["alpha.shell", "alpha.shell=3azsh.app"]);
    assert_eq!(v["out_of_shape"][0]["reason"], "collect keys are <node>.<collection>.<contributor>: 2 tokens");
}

#[tokio::test]
async fn answers_applied_and_collect_with_their_narrowing() {
    let b = mesh();
    let v = ok(&b, json!({"what":"applied","node":"alpha","module":"web"})).await;
    assert_eq!(keys(&v), ["alpha.web"]);
    assert_eq!(v["entries"][0]["value"]["needs"], 0);

    let v = ok(&b, json!({"what":"collect","collection":"shell:zsh:normal"})).await;
    assert_eq!(keys(&v), ["alpha.shell=3Azsh=3Anormal.app", "alpha.shell=3Azsh=3Anormal.web", "beta.shell=3Azsh=3Anormal.app"]);
    assert_eq!(v["entries"][0]["collection"], "shell:zsh:normal");
    assert_eq!(v["entries"][0]["contributor"], "app");
    assert_eq!(v["entries"][0]["value"]["line"], "export X=1");
    assert_eq!(v["entries"][2]["encoding"], "base64");
    assert_eq!(v["entries"][2]["value"], "3q2+7w==");

    let v = ok(&b, json!({"what":"collect","node":"alpha","collection":"shell:zsh:normal","module":"web"})).await;
    assert_eq!(keys(&v), ["alpha.shell=3Azsh=3Anormal.web"]);

    let v = ok(&b, json!({"what":"collect","node":"alpha","module":"app"})).await;
    assert_eq!(keys(&v), ["alpha.environment.app", "alpha.shell=3Azsh=3Anormal.app"]);
    assert_eq!(v["entries"][0]["value"], "PATH=/opt/app/bin");
    assert_eq!(v["entries"][0]["encoding"], "utf-8");
    assert!(v["revision"].as_u64().unwrap() >= 6);
}

#[tokio::test]
async fn answers_the_registry_by_default_and_by_kind() {
    let b = mesh();
    let report = tests::guest().reconcile(b.clone(), Default::default()).await.unwrap().unwrap();
    assert_eq!(report.puts.len(), 13);
    let v = ok(&b, json!({})).await;
    assert_eq!(v["what"], "registry");
    assert_eq!(keys(&v).len(), 13);
    let (code, empty) = ask(b.clone() as Arc<dyn Backend>, b"").await;
    assert_eq!((code, &empty), (ReplyCode::Ok, &v));
    let v = ok(&b, json!({"what":"registry","kind":"secret"})).await;
    assert_eq!(keys(&v), ["secret"]);
    assert_eq!(v["entries"][0]["value"], json!({"kind":"secret","owner":"mesh-vault","verb":"mesh-vault.secret"}));
}

#[tokio::test]
async fn pages_across_many_keys_without_losing_or_repeating_one() {
    let b = MemoryBackend::new();
    let mut want = BTreeSet::new();
    for n in 0..40 {
        for m in 0..5 {
            for k in ["config", "secret"] {
                let key = format!("node{n:02}.mod{m}.{k}.name=2E{n}");
                b.put(NEEDS, &key, b"{}");
                want.insert(key);
            }
        }
    }
    b.put(NEEDS, "node07.mod1", b"{}"); // out of shape, in the middle
    want.insert("node07.mod1".into());
    for limit in [1usize, 7, 100, 1000] {
        let mut got = Vec::new();
        let mut after: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut q = json!({"what":"needs","limit":limit});
            if let Some(a) = &after {
                q["after"] = json!(a);
            }
            let v = ok(&b, q).await;
            let page: Vec<String> = keys(&v).into_iter().chain(out_of_shape(&v)).collect();
            assert!(page.len() <= limit);
            got.extend(page);
            pages += 1;
            match v.get("next") {
                Some(n) => after = Some(n.as_str().unwrap().to_string()),
                None => break,
            }
        }
        let set: BTreeSet<String> = got.iter().cloned().collect();
        assert_eq!(set.len(), got.len(), "a key was repeated at limit {limit}");
        assert_eq!(set, want, "a key was lost at limit {limit}");
        assert_eq!(pages, want.len().div_ceil(limit), "pages at limit {limit}");
    }
}

#[tokio::test]
async fn pages_by_bytes_so_no_reply_exceeds_the_budget() {
    let b = MemoryBackend::new();
    let big = format!("{{\"blob\":\"{}\"}}", "x".repeat(1500));
    for i in 0..20 {
        b.put(NEEDS, &format!("alpha.app.config.v{i:02}"), big.as_bytes());
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut q = json!({"what":"needs","node":"alpha"});
        if let Some(a) = &after {
            q["after"] = json!(a);
        }
        let (code, v) = ask_with(b.clone() as Arc<dyn Backend>, q.to_string().as_bytes(), 4096).await;
        assert_eq!(code, ReplyCode::Ok);
        let page = keys(&v);
        assert!(!page.is_empty() && page.len() <= 2, "{} entries in 4 KiB", page.len());
        seen.extend(page);
        match v.get("next") {
            Some(n) => after = Some(n.as_str().unwrap().to_string()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 20);
    // A value larger than any reply is named, not dropped.
    b.put(NEEDS, "beta.app.config.huge", format!("\"{}\"", "y".repeat(10_000)).as_bytes());
    let (_, v) = ask_with(b.clone() as Arc<dyn Backend>, br#"{"what":"needs","node":"beta"}"#, 4096).await;
    assert_eq!(keys(&v), ["beta.app.config.huge"]);
    assert_eq!(v["entries"][0]["value_omitted"]["bytes"], 10_002);
}

#[tokio::test]
async fn a_page_led_by_a_large_value_holds_no_more_memory_than_the_page_may() {
    // A thousand keys, the first with a value of 64 KiB: the page is cut by bytes, and its
    // lines are never given the room of a thousand first lines (65 MB, past the guest's limit).
    let b = MemoryBackend::new();
    b.put(NEEDS, "alpha.app.config.a000", format!("{{\"blob\":\"{}\"}}", "x".repeat(64 << 10)).as_bytes());
    for i in 1..1000 {
        b.put(NEEDS, &format!("alpha.app.config.a{i:03}"), b"{}");
    }
    let (code, v) = ask(b.clone() as Arc<dyn Backend>, br#"{"what":"needs","node":"alpha","module":"app"}"#).await;
    assert_eq!(code, ReplyCode::Ok, "{v}");
    let page = keys(&v);
    assert_eq!(page.first().map(String::as_str), Some("alpha.app.config.a000"));
    assert_eq!(page.len(), 1000, "a page of 1 MiB holds them all");
}

#[tokio::test]
async fn a_narrowed_query_reads_only_its_scope() {
    let b = MemoryBackend::new();
    for n in 0..200 {
        for m in 0..10 {
            for k in 0..5 {
                b.put(NEEDS, &format!("n{n:03}.m{m}.config.k{k}"), b"{}");
            }
        }
    }
    let mirror = b.bucket(NEEDS);
    let before = mirror.visited();
    let v = ok(&b, json!({"what":"needs","node":"n123","module":"m4"})).await;
    assert_eq!(keys(&v).len(), 5);
    let visited = mirror.visited() - before;
    assert!(visited <= 6, "a query answering 5 keys of 10 000 looked at {visited}");
}

#[tokio::test]
async fn refuses_hostile_requests_without_a_wider_answer() {
    let b = mesh();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (br#"{"what":"needs","node":"*"}"#.to_vec(), "not an identifier"),
        (br#"{"what":"needs","node":">"}"#.to_vec(), "not an identifier"),
        (br#"{"what":"needs","node":"alpha","module":"a.b"}"#.to_vec(), "not an identifier"),
        (br#"{"what":"needs","node":"al pha"}"#.to_vec(), "not an identifier"),
        (br#"{"what":"needs","node":""}"#.to_vec(), "empty"),
        (br#"{"what":"needs","node":"alpha","colour":"red"}"#.to_vec(), "unknown field"),
        (br#"{"what":"applied","kind":"config"}"#.to_vec(), "does not apply to what=applied"),
        (br#"{"what":"registry","node":"alpha"}"#.to_vec(), "does not apply to what=registry"),
        (br#"{"what":"needs","collection":"shell"}"#.to_vec(), "does not apply to what=needs"),
        (br#"{"what":"needs","node":7}"#.to_vec(), "must be a string, not a number"),
        (br#"{"what":"needs","node":null}"#.to_vec(), "must be a string, not null"),
        (br#"{"what":["needs"]}"#.to_vec(), "must be a string, not an array"),
        (br#"{"what":"everything"}"#.to_vec(), "one of registry"),
        (br#"{"limit":"10"}"#.to_vec(), "whole number"),
        (br#"{"limit":0}"#.to_vec(), "at least 1"),
        (br#"{"after":""}"#.to_vec(), "1 to 4096 bytes"),
        (format!("{{\"after\":\"{}\"}}", "a".repeat(4097)).into_bytes(), "not 4097"),
        (br#"{"what":"needs","node":"alpha","node":"*"}"#.to_vec(), "given twice"),
        (br#"["needs"]"#.to_vec(), "JSON object"),
        (br#""needs""#.to_vec(), "JSON object"),
        (br#"{"what":"needs""#.to_vec(), "JSON object"),
        (br#"{"what":"needs"} {}"#.to_vec(), "JSON object"),
        (b"null".to_vec(), "JSON object"),
        (vec![b'{', 0xff, 0xfe, b'}'], "not UTF-8"),
        ([b"{\"what\":\"needs\",\"x\":\"".as_slice(), &vec![b'a'; 1 << 20], b"\"}"].concat(), "at most"),
        (br#"{"what":"collect","collection":""}"#.to_vec(), "collection"),
    ];
    for (body, why) in cases {
        let message = refused(&b, &body).await;
        assert!(message.contains(why), "{} → {message:?}, wanted {why:?}", String::from_utf8_lossy(&body[..body.len().min(60)]));
    }
    // And the next good request is answered in full.
    let v = ok(&b, json!({"what":"needs","node":"beta"})).await;
    assert_eq!(keys(&v).len(), 2);
}

#[tokio::test]
async fn refuses_an_unknown_verb() {
    let reply = tests::guest().handle(mesh(), Default::default(), "mesh-provisioner.everything", b"{}", 1 << 20).await.unwrap();
    assert_eq!(reply.code, ReplyCode::BadRequest);
    assert!(String::from_utf8_lossy(&reply.body).contains("unknown verb"));
}

#[tokio::test]
async fn the_guest_sees_no_environment_files_or_network() {
    let runtime = mesh_provisioner::runtime::Runtime::new().unwrap();
    let bytes = std::fs::read(tests::fixture("misbehave")).unwrap();
    let guest = runtime.load(&bytes, None).unwrap();
    // Something listens on the port the guest tries: the host itself can connect to it, the
    // guest must not.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(), "the test's own listener does not answer");
    let _ = listener.accept().unwrap();
    listener.set_nonblocking(true).unwrap();
    let body = json!({"fixture":"probe","port":port}).to_string();
    let reply = guest.handle(mesh(), Default::default(), "mesh-provisioner.provisioning", body.as_bytes(), 1 << 20).await.unwrap();
    let seen: Value = serde_json::from_slice(&reply.body).unwrap();
    assert!(matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock), "the guest reached the listener");
    assert_eq!(
        seen,
        json!({"env":0,"args":0,"read_root":false,"read_dot":false,"read_file":false,"write_file":false,"tcp":false,"dns":false}),
        "the sandbox let the guest see something"
    );
}

/// A bus that never answers: every mirror waits for a sync that never comes, every write for an
/// acknowledgement.
struct Stalled(mesh_provisioner::store::kept::KeptPlans);

impl Backend for Stalled {
    fn mirror<'a>(&'a self, _: &'a str) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<Arc<mesh_provisioner::store::mirror::Mirror>>> {
        Box::pin(std::future::pending())
    }
    fn put_registry<'a>(&'a self, _: &'a str, _: Vec<u8>, _: u64) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<u64>> {
        Box::pin(std::future::pending())
    }
    fn delete_registry<'a>(&'a self, _: &'a str, _: u64) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<()>> {
        Box::pin(std::future::pending())
    }
    fn kept(&self) -> &mesh_provisioner::store::kept::KeptPlans {
        &self.0
    }
    fn responders<'a>(&'a self, _: &'a str) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<mesh_provisioner::store::backend::Count>> {
        Box::pin(std::future::pending())
    }
    fn discovered(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A bus that answers every read of `mesh()` but never answers one kind of import: so a call
/// gets past the others to the one under test.
struct StallsOn(Arc<MemoryBackend>, Stall);

#[derive(PartialEq)]
enum Stall {
    Discovery,
    RegistryWrites,
}

impl Backend for StallsOn {
    fn mirror<'a>(
        &'a self,
        bucket: &'a str,
    ) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<Arc<mesh_provisioner::store::mirror::Mirror>>> {
        self.0.mirror(bucket)
    }
    fn put_registry<'a>(&'a self, key: &'a str, value: Vec<u8>, expected: u64) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<u64>> {
        if self.1 == Stall::RegistryWrites {
            Box::pin(std::future::pending())
        } else {
            self.0.put_registry(key, value, expected)
        }
    }
    fn delete_registry<'a>(&'a self, key: &'a str, expected: u64) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<()>> {
        if self.1 == Stall::RegistryWrites {
            Box::pin(std::future::pending())
        } else {
            self.0.delete_registry(key, expected)
        }
    }
    fn kept(&self) -> &mesh_provisioner::store::kept::KeptPlans {
        self.0.kept()
    }
    fn responders<'a>(
        &'a self,
        service: &'a str,
    ) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<mesh_provisioner::store::backend::Count>> {
        if self.1 == Stall::Discovery {
            Box::pin(std::future::pending())
        } else {
            self.0.responders(service)
        }
    }
    fn discovered(&self) -> Vec<String> {
        self.0.discovered()
    }
}

#[tokio::test]
async fn every_import_a_call_makes_ends_with_the_calls_deadline() {
    let stalled: Arc<dyn Backend> = Arc::new(Stalled(mesh_provisioner::store::kept::KeptPlans::memory()));
    let limits = mesh_provisioner::runtime::Limits { deadline: std::time::Duration::from_millis(300), memory: 64 << 20 };
    let started = std::time::Instant::now();
    let reply = tests::guest().handle(stalled.clone(), limits, "mesh-provisioner.provisioning", br#"{"what":"needs","node":"alpha"}"#, 1 << 20).await.unwrap();
    let took = started.elapsed();
    assert_eq!(reply.code, ReplyCode::Unavailable, "{}", String::from_utf8_lossy(&reply.body));
    let body = String::from_utf8_lossy(&reply.body).to_string();
    assert!(body.contains("deadline passed during the wait for mesh-provisioner_needs's mirror to be in sync"), "{body}");
    assert!(took < std::time::Duration::from_secs(2), "a stalled read held the call {took:?}");

    // Every mirror answers; discovery never does: the secret's check is `unknown`, naming the
    // deadline, and the answer still comes in time.
    let no_discovery: Arc<dyn Backend> = Arc::new(StallsOn(mesh(), Stall::Discovery));
    let started = std::time::Instant::now();
    let r = tests::guest()
        .handle(no_discovery, limits, "mesh-provisioner.provisioning", br#"{"what":"status","node":"alpha","module":"app"}"#, 1 << 20)
        .await
        .unwrap();
    let took = started.elapsed();
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(r.code, ReplyCode::Ok, "{v}");
    let secret = v["entries"][0]["needs"].as_array().unwrap().iter().find(|n| n["kind"] == "secret").cloned().unwrap_or_default();
    assert_eq!(secret["check"], "unknown", "{v}");
    assert!(secret["reason"].as_str().unwrap_or_default().contains("deadline passed"), "{secret}");
    assert!(took < std::time::Duration::from_secs(2), "a stalled discovery held the call {took:?}");

    // The registry read answers (empty), its writes never do: the reconcile ends at the deadline.
    let no_writes: Arc<dyn Backend> = Arc::new(StallsOn(MemoryBackend::new(), Stall::RegistryWrites));
    let started = std::time::Instant::now();
    let r = tests::guest().reconcile(no_writes, limits).await.unwrap();
    let why = r.expect_err("a reconcile whose writes never land cannot succeed");
    assert!(why.contains("deadline passed") && why.contains("registry"), "{why}");
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}

#[tokio::test]
async fn a_guest_past_the_memory_budget_is_stopped_and_the_others_keep_answering() {
    use mesh_provisioner::runtime::{EngineOptions, Limits, Runtime};
    // A budget below one call's own limit, so the hoarder meets the budget first, whatever the
    // timing (`serve` itself refuses a total below --guest-memory).
    let runtime = Runtime::with_options(EngineOptions { memory_total: 48 << 20, ..Default::default() }).unwrap();
    let guest = runtime.load(&std::fs::read(tests::fixture("misbehave")).unwrap(), None).unwrap();
    let limits = Limits { memory: 64 << 20, deadline: std::time::Duration::from_secs(10) };
    let b = mesh();
    let ask = |body: &'static [u8]| guest.handle(b.clone(), limits, "mesh-provisioner.provisioning", body, 1 << 20);
    // Four instances kept warm.
    for r in futures::future::join_all((0..4).map(|_| ask(br#"{"what":"registry"}"#))).await {
        assert_eq!(r.unwrap().code, ReplyCode::Ok);
    }
    let warm = runtime.budget().used();
    assert!(warm > 0, "the warm instances hold memory, counted");
    // One guest hoards; the four others answer meanwhile.
    let others = futures::future::join_all((0..4).map(|_| ask(br#"{"what":"registry"}"#)));
    let (others, hoarder) = tokio::join!(others, ask(br#"{"fixture":"alloc"}"#));
    for r in others {
        assert_eq!(r.expect("the others answer").code, ReplyCode::Ok);
    }
    let stopped = hoarder.expect_err("the hoarder is stopped").message().to_string();
    assert!(stopped.contains("memory budget of 50331648 bytes is spent"), "{stopped}");
    // What it held is given back: the budget holds what the warm instances hold, and a fresh
    // call has room again.
    assert!(runtime.budget().used() <= warm, "{} bytes held after, {warm} before", runtime.budget().used());
    assert_eq!(ask(br#"{"what":"registry"}"#).await.unwrap().code, ReplyCode::Ok);
}

#[tokio::test]
async fn an_instance_whose_heap_grew_past_keep_below_is_let_go_and_one_that_did_not_is_kept() {
    use mesh_provisioner::runtime::{EngineOptions, Limits, Runtime};
    let bytes = std::fs::read(tests::component_path()).unwrap();
    let small = br#"{"what":"needs","node":"alpha","module":"app"}"#;
    let b = mesh();
    // Values that make a page of ~1 MiB: the heap grows well past a small call's.
    let big = MemoryBackend::new();
    let value = format!("{{\"x\":\"{}\"}}", "v".repeat(4000));
    for i in 0..300 {
        big.put(NEEDS, &format!("n{i:03}.app.config.x"), value.as_bytes());
    }
    let large = br#"{"what":"needs","limit":1000}"#;
    // What one instance holds after a small call, with nothing let go.
    let measured = Runtime::with_options(EngineOptions { reply_cache: false, ..Default::default() }).unwrap();
    let guest = measured.load(&bytes, None).unwrap();
    assert_eq!(guest.handle(b.clone(), Limits::default(), "mesh-provisioner.provisioning", small, 1 << 20).await.unwrap().code, ReplyCode::Ok);
    let base = measured.budget().used();
    assert!(base > 0, "a kept instance's memory is counted");

    let runtime = Runtime::with_options(EngineOptions { reply_cache: false, keep_below: base, ..Default::default() }).unwrap();
    let guest = runtime.load(&bytes, None).unwrap();
    for _ in 0..3 {
        assert_eq!(guest.handle(b.clone(), Limits::default(), "mesh-provisioner.provisioning", small, 1 << 20).await.unwrap().code, ReplyCode::Ok);
        assert_eq!(runtime.budget().used(), base, "an instance at keep_below is kept, and reused (no second one made)");
    }
    let r = guest.handle(big.clone(), Limits::default(), "mesh-provisioner.provisioning", large, 1 << 20).await.unwrap();
    assert_eq!(r.code, ReplyCode::Ok);
    assert!(r.body.len() > 512 << 10, "the large page is large: {} bytes", r.body.len());
    assert_eq!(runtime.budget().used(), 0, "the instance that grew past keep_below was let go");
    // The next call makes a fresh one, and answers.
    assert_eq!(guest.handle(b.clone(), Limits::default(), "mesh-provisioner.provisioning", small, 1 << 20).await.unwrap().code, ReplyCode::Ok);
    assert_eq!(runtime.budget().used(), base);
}

#[tokio::test]
async fn an_instance_reused_for_every_call_answers_each_as_a_fresh_one_does() {
    // What one call leaves in an instance (its heap, the allocator's arena) must never show in
    // the next: every kind of request, and the state records between them, on one instance and
    // then each on a fresh one, in turns.
    use mesh_provisioner::runtime::{Change, EngineOptions, Limits, Runtime};
    let bytes = std::fs::read(tests::component_path()).unwrap();
    let b = mesh();
    let big = format!("{{\"blob\":\"{}\"}}", "x".repeat(3000));
    for i in 0..400 {
        b.put(NEEDS, &format!("gamma.m{:02}.config.v{i:03}", i % 7), big.as_bytes());
    }
    let requests: Vec<(&str, Vec<u8>)> = vec![
        ("mesh-provisioner.provisioning", br#"{"what":"needs","node":"alpha","module":"app"}"#.to_vec()),
        ("mesh-provisioner.provisioning", br#"{"what":"needs","node":"gamma"}"#.to_vec()),
        ("mesh-provisioner.provisioning", br#"{"what":"needs","limit":3,"after":"alpha.app.secret.db_password"}"#.to_vec()),
        ("mesh-provisioner.provisioning", br#"{"what":"applied","node":"alpha"}"#.to_vec()),
        ("mesh-provisioner.provisioning", br#"{"what":"collect"}"#.to_vec()),
        ("mesh-provisioner.provisioning", br#"{"what":"registry"}"#.to_vec()),
        ("mesh-provisioner.provisioning", br#"{"what":"registry","kind":"secret"}"#.to_vec()),
        ("mesh-provisioner.provisioning", br#"{"what":"status","node":"alpha"}"#.to_vec()),
        ("mesh-provisioner.provisioning", br#"{"what":"holders","kind":"bound","name":"postgres.db"}"#.to_vec()),
        ("mesh-provisioner.provisioning", br#"{"what":"needs","node":"alpha.>"}"#.to_vec()),
        ("mesh-provisioner.provisioning", b"{not json".to_vec()),
        ("mesh-provisioner.provisioning", br#"{"what":"nonsense"}"#.to_vec()),
        ("mesh-provisioner.plan", br#"{"node":"alpha","module":"app"}"#.to_vec()),
    ];
    let moved: Vec<Change> = ["alpha.app.config.db=2Eurl", "beta.app.dir.state", "gamma.m03.config.v003", "gamma.m05.config.v005"]
        .into_iter()
        .map(|key| Change { bucket: NEEDS.into(), key: Some(key.into()) })
        .collect();
    let answers = |reuse: u32| {
        let runtime = Runtime::with_options(EngineOptions { reply_cache: false, reuse, ..Default::default() }).unwrap();
        let guest = runtime.load(&bytes, None).unwrap();
        let (b, requests, moved) = (b.clone(), requests.clone(), moved.clone());
        async move {
            let mut all = Vec::new();
            // Forward, backward, forward: each request after a different one.
            for order in [false, true, false] {
                let mut round = Vec::new();
                let mut at: Vec<usize> = (0..requests.len()).collect();
                if order {
                    at.reverse();
                }
                for i in at {
                    let (verb, body) = &requests[i];
                    let r = guest.handle(b.clone() as Arc<dyn Backend>, Limits::default(), verb, body, 1 << 20).await.expect("the guest answers");
                    let records = guest.transitions(b.clone() as Arc<dyn Backend>, Limits::default(), &moved, "2026-12-07T12:00:00Z").await;
                    let records = records.expect("the guest runs").expect("the records");
                    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                    let records: Vec<String> = records
                        .transitions
                        .iter()
                        .map(|t| format!("{} {} {} {}", t.key, t.state, text(&t.value), text(t.event.as_deref().unwrap_or_default())))
                        .collect();
                    round.push((i, r.code, r.body, records));
                }
                round.sort_by_key(|a| a.0);
                all.push(round);
            }
            all
        }
    };
    let fresh = answers(1).await;
    let reused = answers(4096).await;
    let large = fresh[0].iter().filter(|(_, _, body, _)| body.len() > 512 << 10).count();
    assert!(large > 0, "one answer is past the allocator's arena");
    assert_eq!(fresh[0][0].3.len(), 4, "a record for each module moved: {:?}", fresh[0][0].3);
    for (round, (f, r)) in fresh.iter().zip(&reused).enumerate() {
        for ((i, fc, fb, fs), (_, rc, rb, rs)) in f.iter().zip(r) {
            let request = String::from_utf8_lossy(&requests[*i].1);
            assert_eq!((fc, fb), (rc, rb), "round {round}, request {request}: a reused instance answered otherwise");
            assert_eq!(fs, rs, "round {round}, after request {request}: a reused instance recorded otherwise");
        }
        assert_eq!(f, &fresh[0], "round {round}: a fresh instance answers the same each time");
    }
}
