//! The reply cache (issue 14), on the real component over in-memory buckets: a kept reply is
//! served only while everything it read is unchanged — never after a put or a delete where it
//! read, a bucket removed, a mirror rebuilt (a silent expiry) or resynced, a plan kept, a
//! discovery count made again — checked against the guest itself after every step of a seeded
//! random history. A write elsewhere in a bucket it read keeps it, with the revision a fresh
//! answer gives (issue 28).

use std::sync::Arc;

use mesh_provisioner::runtime::Limits;
use mesh_provisioner::store::backend::{Backend, MemoryBackend};
use mesh_provisioner::store::mirror::Mirror;

const BUCKETS: [&str; 4] = ["mesh-provisioner_needs", "mesh-provisioner_applied", "mesh-provisioner_collect", "mesh-provisioner_registry"];

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn key(rng: &mut Rng, bucket: &str) -> String {
    let node = ["alpha", "beta"][rng.below(2) as usize];
    let module = ["app", "web"][rng.below(2) as usize];
    match bucket {
        "mesh-provisioner_needs" => format!("{node}.{module}.config.k{}", rng.below(3)),
        "mesh-provisioner_applied" => format!("{node}.{module}"),
        "mesh-provisioner_collect" => format!("{node}.shell:zsh:normal.{module}"),
        _ => ["config", "secret", "dir"][rng.below(3) as usize].to_string(),
    }
}

/// The requests asked: few enough that they repeat (and hit), narrowed and not.
fn request(rng: &mut Rng) -> Vec<u8> {
    let asks = [
        r#"{"what":"needs"}"#,
        r#"{"what":"needs","node":"alpha"}"#,
        r#"{"what":"needs","node":"beta","module":"web"}"#,
        r#"{"what":"needs","module":"app"}"#,
        r#"{"what":"needs","kind":"config","limit":2}"#,
        r#"{"what":"applied"}"#,
        r#"{"what":"collect","node":"alpha"}"#,
        r#"{"what":"registry"}"#,
        r#"{"what":"nonsense"}"#,
        r#"{"what":"status","node":"alpha","module":"app"}"#,
        r#"{"what":"status","node":"alpha"}"#,
    ];
    asks[rng.below(asks.len() as u64) as usize].as_bytes().to_vec()
}

#[tokio::test]
async fn a_kept_reply_is_never_served_after_a_bucket_it_read_changed() {
    let guest = tests::guest();
    let b = MemoryBackend::new();
    let mut rng = Rng(1414);
    let mut asked = 0;
    b.put("composed-alpha", "app.b1", tests::sample_composition().as_bytes());
    b.put("mesh-controller_assignments", "alpha.app", br#"{"want":"b1"}"#);
    b.put("mesh-provisioner_needs", "alpha.app.secret.db_password", br#"{"part":"api"}"#);
    let (mut last_asked, mut last_write, mut carried) = (std::collections::HashMap::new(), 0, 0);
    for step in 0..4000 {
        match rng.below(10) {
            0..=2 => {
                let bucket = BUCKETS[rng.below(4) as usize];
                let k = key(&mut rng, bucket);
                b.put(bucket, &k, format!("{{\"step\":{step}}}").as_bytes());
                last_write = step;
            }
            3 => {
                let bucket = BUCKETS[rng.below(4) as usize];
                let k = key(&mut rng, bucket);
                b.delete(bucket, &k);
                last_write = step;
            }
            4 => {
                // A rebuild that drops a key without a message (an expiry the audit found):
                // the same revision, one key fewer.
                let bucket = BUCKETS[rng.below(3) as usize];
                let m = b.bucket(bucket);
                let staged = Mirror::new();
                let page = m.scan(">", None, 10_000).expect("scan");
                for e in tests::native::entries(page).iter().skip(1) {
                    staged.put(&e.key, e.revision, &e.value);
                }
                staged.note_revision(m.revision());
                m.adopt(&staged);
            }
            5 if rng.below(20) == 0 => b.remove_bucket(BUCKETS[rng.below(3) as usize]),
            // Discovery counts again (a new cache entry, the same count or another).
            6 if rng.below(3) == 0 => b.set_responders("mesh-vault", rng.below(3) as u32),
            // A plan kept (the module held on it while its want is not published) or the want moved.
            7 if rng.below(3) == 0 => {
                let build = format!("b{}", rng.below(3));
                if rng.below(2) == 0 {
                    let kept = format!(r#"{{"format":1,"node":"alpha","module":"app","build":"{build}","plan":{}}}"#, tests::sample_composition());
                    b.kept().save("alpha", "app", kept.as_bytes()).expect("kept");
                } else {
                    b.put("mesh-controller_assignments", "alpha.app", format!(r#"{{"want":"{build}"}}"#).as_bytes());
                }
            }
            _ => {
                let body = request(&mut rng);
                let hit = served_is_fresh(&guest, &b, step, "mesh-provisioner.provisioning", &body).await;
                // A hit over a bucket written since this request was last asked: kept past a
                // write that touched none of its keys, its revision moved on.
                if hit && last_asked.get(&body).is_some_and(|&at| last_write > at) {
                    carried += 1;
                }
                last_asked.insert(body, step);
                asked += 1;
            }
        }
    }
    assert!(asked > 1000, "asked {asked}");
    assert!(carried > 50, "only {carried} replies were kept past a write elsewhere in their bucket");
}

/// Asks `verb` with `body` through the cache and directly, and checks they agree; then asks
/// again (a hit over the same data). Whether the first ask was a hit (it read nothing).
async fn served_is_fresh(guest: &mesh_provisioner::runtime::Guest, b: &Arc<MemoryBackend>, step: usize, verb: &str, body: &[u8]) -> bool {
    let backend = b.clone() as Arc<dyn Backend>;
    let before = b.reads();
    let served = guest.handle(backend.clone(), Limits::default(), verb, body, 1 << 20).await.expect("answers");
    let hit = b.reads() == before;
    let (fresh, _) = guest.handle_uncached(backend.clone(), Limits::default(), verb, body, 1 << 20).await.expect("answers");
    assert_eq!(
        String::from_utf8_lossy(&served.body),
        String::from_utf8_lossy(&fresh.body),
        "step {step}: {} served a kept reply that the guest no longer gives",
        String::from_utf8_lossy(body)
    );
    assert_eq!(served.code, fresh.code);
    assert_eq!(guest.handle(backend, Limits::default(), verb, body, 1 << 20).await.expect("answers"), served);
    hit
}

/// The same over what `status` and the plan verb read besides buckets: discovery counts made
/// again (the same count or another), plans kept, failed saves, wants moved.
#[tokio::test]
async fn a_kept_status_or_plan_is_never_served_after_a_count_or_a_kept_plan_changed() {
    let guest = tests::guest();
    let dir = tempfile::tempdir().unwrap();
    let b = MemoryBackend::with_kept(mesh_provisioner::store::kept::KeptPlans::files(dir.path().join("plans")));
    let composition = tests::sample_composition();
    for module in ["app", "web"] {
        b.put("composed-alpha", &format!("{module}.b1"), composition.as_bytes());
        b.put("mesh-controller_assignments", &format!("alpha.{module}"), br#"{"want":"b1"}"#);
        b.put("mesh-provisioner_needs", &format!("alpha.{module}.secret.db_password"), br#"{"part":"api"}"#);
    }
    let asks: [(&str, &[u8]); 5] = [
        ("mesh-provisioner.provisioning", br#"{"what":"status","node":"alpha","module":"app"}"#),
        ("mesh-provisioner.provisioning", br#"{"what":"status","node":"alpha"}"#),
        ("mesh-provisioner.plan", br#"{"node":"alpha","module":"app"}"#),
        ("mesh-provisioner.plan", br#"{"node":"alpha","module":"web"}"#),
        ("mesh-provisioner.provisioning", br#"{"what":"needs","node":"alpha"}"#),
    ];
    let mut rng = Rng(1415);
    let (mut hits, mut changes) = (0, 0);
    for step in 0..1500 {
        match rng.below(10) {
            0 => {
                b.set_responders("mesh-vault", rng.below(3) as u32);
                changes += 1;
            }
            1 => {
                let module = ["app", "web"][rng.below(2) as usize];
                let kept = format!(r#"{{"format":1,"node":"alpha","module":"{module}","build":"b1","plan":{composition}}}"#);
                // A failed save (the directory made a file) is kept as the reason the plan verb gives.
                let blocked = rng.below(4) == 0;
                if blocked {
                    let _ = std::fs::remove_dir_all(dir.path().join("plans"));
                    std::fs::write(dir.path().join("plans"), b"not a directory").unwrap();
                }
                let _ = b.kept().save("alpha", module, kept.as_bytes());
                if blocked {
                    std::fs::remove_file(dir.path().join("plans")).unwrap();
                }
                changes += 1;
            }
            2 if rng.below(2) == 0 => {
                let module = ["app", "web"][rng.below(2) as usize];
                b.put("mesh-controller_assignments", &format!("alpha.{module}"), format!(r#"{{"want":"b{}"}}"#, rng.below(2) + 1).as_bytes());
            }
            _ => {
                let (verb, body) = asks[rng.below(asks.len() as u64) as usize];
                hits += served_is_fresh(&guest, &b, step, verb, body).await as u32;
            }
        }
    }
    assert!(hits > 200 && changes > 200, "hits {hits}, changes {changes}");
}

#[tokio::test]
async fn a_reply_kept_for_beta_survives_a_write_to_alpha_with_the_revision_moved_on() {
    let guest = tests::guest();
    let b = MemoryBackend::new();
    b.put("mesh-provisioner_needs", "alpha.app.config.url", b"\"a\"");
    b.put("mesh-provisioner_needs", "beta.web.config.url", b"\"b\"");
    let needs = b.bucket("mesh-provisioner_needs");
    let body = br#"{"what":"needs","node":"beta","module":"web"}"#;
    let ask = |b: &Arc<MemoryBackend>| guest.handle(b.clone() as Arc<dyn Backend>, Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20);
    let revision = |r: &mesh_provisioner::runtime::Reply| serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["revision"].as_u64().unwrap();
    let first = ask(&b).await.unwrap();
    assert_eq!(revision(&first), needs.revision());
    // Nine writes to alpha: the revision gains a digit, so the body grows.
    for i in 0..9 {
        b.put("mesh-provisioner_needs", &format!("alpha.app.config.k{i}"), b"\"a\"");
    }
    let reads = b.reads();
    let carried = ask(&b).await.unwrap();
    assert_eq!(b.reads(), reads, "beta's reply was served without calling the guest");
    let (fresh, _) = guest.handle_uncached(b.clone() as Arc<dyn Backend>, Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&carried.body), String::from_utf8_lossy(&fresh.body));
    assert_eq!(revision(&carried), needs.revision());
    assert!(revision(&carried) >= 10 && revision(&first) < 10, "the revision moved from {} to {}", revision(&first), revision(&carried));
    // A write to beta's own keys is one the reply cannot outlive.
    b.put("mesh-provisioner_needs", "beta.web.config.url", b"\"c\"");
    let reads = b.reads();
    let after = ask(&b).await.unwrap();
    assert!(b.reads() > reads, "the guest was asked again");
    assert!(String::from_utf8_lossy(&after.body).contains("\"c\""));
    // A reply whose guest did not say where its revision is (a status page) holds only while
    // nothing in its buckets moves.
    let status = br#"{"what":"status","node":"beta"}"#;
    let ask_status = || guest.handle(b.clone() as Arc<dyn Backend>, Limits::default(), "mesh-provisioner.provisioning", status, 1 << 20);
    let kept = ask_status().await.unwrap();
    assert_eq!(kept.revision, None);
    b.put("mesh-provisioner_needs", "alpha.app.config.url", b"\"d\"");
    let reads = b.reads();
    ask_status().await.unwrap();
    assert!(b.reads() > reads, "a status page is asked again after any write to a bucket it read");
}

#[tokio::test]
async fn a_repeated_request_over_unchanged_buckets_does_not_call_the_guest() {
    let guest = tests::guest();
    let b = MemoryBackend::new();
    b.put("mesh-provisioner_needs", "alpha.app.config.url", b"\"a\"");
    let backend = b.clone() as Arc<dyn Backend>;
    let body = br#"{"what":"needs","node":"alpha"}"#;
    let first = guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20).await.unwrap();
    let needs = b.bucket("mesh-provisioner_needs");
    let visited = needs.visited();
    let second = guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(needs.visited(), visited, "the second answer read nothing: the guest was not called");
    // Another budget is another request; a put anywhere in what it read makes it asked again.
    b.put("mesh-provisioner_needs", "alpha.app.config.url", b"\"b\"");
    let third = guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20).await.unwrap();
    assert_ne!(third, first);
    assert!(String::from_utf8_lossy(&third.body).contains("\"b\""));
}

#[tokio::test]
async fn a_plan_reply_is_kept_until_a_plan_is_kept() {
    let guest = tests::guest();
    let b = MemoryBackend::new();
    b.put("composed-alpha", "app.b1", tests::sample_composition().as_bytes());
    b.put("mesh-controller_assignments", "alpha.app", br#"{"want":"b1"}"#);
    let backend = b.clone() as Arc<dyn Backend>;
    let ask = || guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.plan", br#"{"node":"alpha","module":"app"}"#, 1 << 20);
    let first = ask().await.unwrap();
    assert!(String::from_utf8_lossy(&first.body).contains("\"planned\""), "{}", String::from_utf8_lossy(&first.body));
    let reads = b.reads();
    assert_eq!(ask().await.unwrap(), first);
    assert_eq!(b.reads(), reads, "the second answer read nothing: the guest was not called");
    // Keeping any plan (here another module's) moves the kept plans' version: asked again.
    b.kept().save("beta", "web", b"{}").unwrap();
    assert_eq!(ask().await.unwrap(), first);
    assert!(b.reads() > reads, "a reply that read kept plans was served after a plan was kept");
}

#[tokio::test]
async fn a_status_reply_is_kept_only_while_its_discovery_count_is() {
    let guest = tests::guest();
    let b = MemoryBackend::new();
    b.put("mesh-provisioner_needs", "alpha.app.secret.db_password", br#"{"part":"api"}"#);
    b.set_responders("mesh-vault", 1);
    let backend = b.clone() as Arc<dyn Backend>;
    let ask =
        || guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", br#"{"what":"status","node":"alpha","module":"app"}"#, 1 << 20);
    let first = ask().await.unwrap();
    assert!(String::from_utf8_lossy(&first.body).contains("\"responders\":1"), "{}", String::from_utf8_lossy(&first.body));
    let reads = b.reads();
    assert_eq!(ask().await.unwrap(), first);
    assert_eq!(b.reads(), reads, "the second answer read nothing: the guest was not called");
    // A new count (the discovery cache's entry made again) is a new answer.
    b.set_responders("mesh-vault", 2);
    let third = ask().await.unwrap();
    assert!(b.reads() > reads, "a reply that used a discovery count was served after the count was made again");
    assert!(String::from_utf8_lossy(&third.body).contains("\"responders\":2"), "{}", String::from_utf8_lossy(&third.body));
}

/// A backend whose mirror reads wait at a gate the test opens: a call is provably still being
/// answered while the same request arrives again.
struct Gated {
    inner: Arc<MemoryBackend>,
    entered: std::sync::atomic::AtomicUsize,
    open: tokio::sync::watch::Sender<bool>,
}

impl Backend for Gated {
    fn mirror<'a>(&'a self, bucket: &'a str) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<Arc<Mirror>>> {
        self.entered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut open = self.open.subscribe();
        Box::pin(async move {
            let _ = open.wait_for(|o| *o).await;
            self.inner.mirror(bucket).await
        })
    }
    fn put_registry<'a>(&'a self, key: &'a str, value: Vec<u8>, expected: u64) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<u64>> {
        self.inner.put_registry(key, value, expected)
    }
    fn delete_registry<'a>(&'a self, key: &'a str, expected: u64) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<()>> {
        self.inner.delete_registry(key, expected)
    }
    fn kept(&self) -> &mesh_provisioner::store::kept::KeptPlans {
        self.inner.kept()
    }
    fn responders<'a>(
        &'a self,
        service: &'a str,
    ) -> futures::future::BoxFuture<'a, mesh_provisioner::base::error::Result<mesh_provisioner::store::backend::Count>> {
        self.inner.responders(service)
    }
    fn discovered(&self) -> Vec<String> {
        self.inner.discovered()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_request_arriving_while_it_is_answered_waits_for_that_answer() {
    // A guest of its own: the binary's shared one has one reply cache for every test, and
    // another test's same request would join this one's flight (or count among its waiters).
    let runtime = mesh_provisioner::runtime::Runtime::new().expect("runtime");
    let guest = runtime.load(&std::fs::read(tests::component_path()).expect("component"), None).expect("compile");
    let b = MemoryBackend::new();
    b.put("mesh-provisioner_needs", "alpha.app.config.k", br#"{"placeholder":"${config:name}","part":"api"}"#);
    let body = br#"{"what":"needs","node":"alpha"}"#;
    // What one answer reads, past the cache, through an open gate.
    let open = Arc::new(Gated { inner: b.clone(), entered: Default::default(), open: tokio::sync::watch::channel(true).0 });
    guest.handle_uncached(open.clone() as Arc<dyn Backend>, Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20).await.unwrap();
    let one = open.entered.load(std::sync::atomic::Ordering::SeqCst);
    assert!(one > 0);
    let gated = Arc::new(Gated { inner: b.clone(), entered: Default::default(), open: tokio::sync::watch::channel(false).0 });
    let backend = gated.clone() as Arc<dyn Backend>;
    // Sixteen at once while the first is held at its first read: the guest is called once, the
    // others wait for its answer (none reads, none is answered from a reply kept before). The
    // deadline is long so that no waiter gives up however slowly a loaded machine starts them.
    let limits = Limits { deadline: std::time::Duration::from_secs(60), ..Limits::default() };
    let asks: Vec<_> = (0..16)
        .map(|_| {
            let (guest, backend) = (guest.clone(), backend.clone());
            tokio::spawn(async move { guest.handle(backend, limits, "mesh-provisioner.provisioning", body, 1 << 20).await })
        })
        .collect();
    let start = std::time::Instant::now();
    while gated.entered.load(std::sync::atomic::Ordering::SeqCst) == 0 || guest.requests_waiting() < 15 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "after 30 s {} calls reached the backend and {} asks wait",
            gated.entered.load(std::sync::atomic::Ordering::SeqCst),
            guest.requests_waiting()
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(guest.requests_waiting(), 15);
    assert_eq!(gated.entered.load(std::sync::atomic::Ordering::SeqCst), 1, "a second call read while the first was being answered");
    gated.open.send_replace(true);
    let mut replies = Vec::new();
    for a in asks {
        replies.push(a.await.expect("the task ends").expect("answers"));
    }
    assert!(replies.iter().all(|r| *r == replies[0]), "the waiting asks got another answer");
    assert_eq!(gated.entered.load(std::sync::atomic::Ordering::SeqCst), one, "16 concurrent asks of one request called the guest more than once");
}

#[tokio::test]
async fn a_reply_kept_over_one_backend_is_never_served_over_another() {
    let guest = tests::guest();
    let body = br#"{"what":"needs","node":"alpha"}"#;
    let (one, two) = (MemoryBackend::new(), MemoryBackend::new());
    one.put("mesh-provisioner_needs", "alpha.app.config.url", b"\"one\"");
    two.put("mesh-provisioner_needs", "alpha.app.config.url", b"\"two\"");
    let first = guest.handle(one.clone() as Arc<dyn Backend>, Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20).await.unwrap();
    let second = guest.handle(two.clone() as Arc<dyn Backend>, Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20).await.unwrap();
    assert!(String::from_utf8_lossy(&first.body).contains("\"one\""));
    assert!(String::from_utf8_lossy(&second.body).contains("\"two\""), "{}", String::from_utf8_lossy(&second.body));
}
