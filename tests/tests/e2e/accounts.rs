//! The account model held against the mesh's own users (SPEC §8, "No user reaches past its
//! grant, whatever it sends"): the real host binary, the real component and a real
//! `nats-server` with the example config, each attack made as the user it limits, with only
//! that user's password — a node, a provider, the config domain — and each checked for what it
//! must not do: nothing landed, nothing leaked, and the verb, plans, notices and the seat carried
//! on.
//!
//! Every attack runs twice: on the static config and on its operator-mode rendering.
//!
//! One server and one host serve every attack but the memory budget (which needs a host of its
//! own, with a budget small enough to pass).

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use async_nats::{Client, HeaderMap};
use futures::StreamExt;
use serde_json::{json, Value};
use tests::browser::get;
use tests::nats::{ask_ok, ask_raw, ask_verb, module_status as status, status_until, Bus, Host, OPERATOR};

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const SEAT: &str = "mesh-provisioner_seat";
const REGISTRY: &str = "mesh-provisioner_registry";
const BOUND: &str = "postgres_bound";
const CONFIG: &str = "mesh-config_values";
const STATES: &str = "mesh-provisioner_states";

fn warnings(s: &Value) -> Vec<String> {
    s["warnings"].as_array().into_iter().flatten().filter_map(|w| w.as_str().map(str::to_string)).collect()
}

/// `/readyz`'s status and body.
async fn readyz(http: &str) -> (u16, Value) {
    let (code, _, body) = get(&format!("{http}/readyz")).await;
    (code, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Waits (bounded) until `/readyz` satisfies `cond`.
async fn readyz_until(http: &str, what: &str, cond: impl Fn(u16, &Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let (code, v) = readyz(http).await;
        if cond(code, &v) {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "/readyz never showed {what}: {code} {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The value of the first line of `/metrics` that starts with `series`.
async fn metric(http: &str, series: &str) -> Option<f64> {
    let (_, _, body) = get(&format!("{http}/metrics")).await;
    body.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

/// The subject and payload of each message heard.
type Heard = tokio::task::JoinHandle<Vec<(String, Vec<u8>)>>;

/// Every message `client` receives on `subjects` from now on, until the returned sender stops
/// it; the messages come back when it is awaited.
fn listen(client: Client, subjects: Vec<String>) -> (tokio::sync::oneshot::Sender<()>, Heard) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut subs = Vec::new();
        for s in subjects {
            subs.push(client.subscribe(s).await.expect("subscribe"));
        }
        let _ = client.flush().await;
        let mut all = futures::stream::select_all(subs);
        let mut got = Vec::new();
        loop {
            tokio::select! {
                m = all.next() => match m {
                    Some(m) => got.push((m.subject.to_string(), m.payload.to_vec())),
                    None => break,
                },
                _ = &mut stopped => break,
            }
        }
        got
    });
    (stop, task)
}

#[tokio::test]
async fn no_user_reaches_past_its_grant_whatever_it_sends() {
    attack(Bus::start().await).await
}

/// The same attacks on the same accounts signed the NATS way (`accounts --operator`): each
/// party logs in with its creds, and MESH lends by activation what the static config lends by
/// account name.
#[tokio::test]
async fn no_user_reaches_past_its_grant_in_operator_mode_either() {
    attack(Bus::start_operator().await).await
}

async fn attack(bus: Bus) {
    bus.create_plan_buckets().await;
    bus.make_bucket(CONFIG).await;
    // The provider's bucket as someone made it before bootstrap existed: roll-ups allowed, no
    // value-size limit (made here with the operator's rights; the account requires a byte
    // limit of every stream).
    let operator = bus.js(OPERATOR).await;
    operator.create_key_value(jetstream::kv::Config { bucket: BOUND.into(), max_bytes: 1 << 20, ..Default::default() }).await.expect("an old-style bucket");
    let mut host = Host::start(&bus, &["--http", "127.0.0.1:0", "--node-quota-keys", "40", "--seat-ttl", "3s", "--bucket-max-mib", "1"]).await;
    let http = host.http_url().await;
    let (alpha, alpha_denied) = bus.watched("node-alpha").await;
    let beta = bus.client("node-beta").await;
    let js = bus.js(OPERATOR).await;

    // A small mesh: alpha/app needs a bound value and a config value, beta/web one config value.
    bus.put("mesh-controller", "mesh-controller_assignments", "alpha.app", br#"{"want":"b1"}"#).await;
    bus.put(
        "node-alpha",
        "composed-alpha",
        "app.b1",
        br#"{"state":"published","plan":{"parts":["api"],"needs":[{"kind":"bound","name":"postgres.db","part":"api"}],"dirs":[]}}"#,
    )
    .await;
    bus.put("node-alpha", NEEDS, "alpha.app.bound.postgres=2Edb", br#"{"placeholder":"${bound:postgres.db}"}"#).await;
    bus.put("node-alpha", NEEDS, "alpha.app.config.db_url", br#"{"placeholder":"${config:db_url}"}"#).await;
    bus.put("node-beta", NEEDS, "beta.web.config.base_url", br#"{"placeholder":"${config:base_url}"}"#).await;
    bus.put("node-beta", APPLIED, "beta.web", br#"{"build":"w1","needs":1,"at":"2026-12-01T00:00:00Z"}"#).await;
    let holder = bus.seat_holder().await.expect("a holder");
    status_until(&alpha, "alpha", "app", "its needs", |s| s["needs"].as_array().is_some_and(|n| n.len() == 2)).await;

    // 1. Every party is an account of its own (SPEC §8). As a node (with and without a
    // permission list: its client and its leaf server's user), a provider and the config
    // domain, each stores a lease, a delete marker, a plan and an event under a key of its own,
    // then asks every responder it can reach — the JetStream API, a direct get of what it
    // stored, a consumer delivering anywhere, the verbs, discovery — with the reply aimed at
    // each subject it may not write. An answer crosses back only to the account that asked:
    // nothing lands, nothing is forged, the seat never moves.
    let targets: [(&str, &str); 13] = [
        (SEAT, "holder"),
        (REGISTRY, "config"),
        (REGISTRY, "forged"),
        (STATES, "beta.forged"),
        (STATES, "forged"),
        (NEEDS, "beta.web.config.base_url"),
        (NEEDS, "beta.web.config.planted"),
        (APPLIED, "beta.web"),
        ("composed-beta", "web.w1"),
        (BOUND, "beta.web.db"),
        (CONFIG, "beta.web.base_url"),
        ("mesh-controller_assignments", "beta.web"),
        ("mesh-indexer_builds", "web"),
    ];
    let revisions = |js: jetstream::Context| async move {
        let mut out = Vec::new();
        for (bucket, key) in targets {
            let kv = js.get_key_value(bucket).await.unwrap_or_else(|e| panic!("the operator opens {bucket}: {e}"));
            let entry = kv.entry(key).await.unwrap_or_else(|e| panic!("the operator reads {bucket}/{key}: {e}"));
            // The seat's lease is renewed all along: its holder is what must not move.
            let value =
                if bucket == SEAT { entry.as_ref().and_then(|e| serde_json::from_slice::<Value>(&e.value).ok()).map(|v| v["instance"].clone()) } else { None };
            out.push((bucket, key, if bucket == SEAT { None } else { entry.map(|e| e.revision) }, value));
        }
        out
    };
    let consumers = |js: jetstream::Context| async move {
        let mut out = Vec::new();
        for bucket in [NEEDS, BOUND, CONFIG] {
            out.push((bucket, js.get_stream(format!("KV_{bucket}")).await.expect("stream").cached_info().state.consumer_count));
        }
        out
    };
    let before = revisions(js.clone()).await;
    let consumers_before = consumers(js.clone()).await;
    let (beta_stop, beta_heard) = listen(beta.clone(), vec!["mesh-provisioner.notice.beta".into(), "mesh-provisioner.event.beta".into()]);
    let mut aims: Vec<String> = targets.iter().map(|(b, k)| format!("$KV.{b}.{k}")).collect();
    aims.extend(
        ["mesh-provisioner.notice.beta", "mesh-provisioner.event.beta", "mesh-provisioner.provisioning", "$JS.EVENT.ADVISORY.STREAM.CREATED.KV_x"]
            .map(String::from),
    );
    let lease = br#"{"instance":"forged-lease","renewed":"2026-12-03T00:00:00Z"}"#.to_vec();
    let plan = br#"{"state":"published","plan":{"parts":["x"],"needs":[{"kind":"secret","name":"forged","part":"x"}],"dirs":[{"name":"state","unknown_files":"delete"}]}}"#.to_vec();
    let event = br#"{"node":"beta","module":"web","state":"blocked","was":"applied","reason":"forged","since":"2026-12-03T00:00:00Z"}"#.to_vec();
    // Each party, and the bucket and key prefix it may write.
    let parties = [
        ("node-alpha", NEEDS, "alpha.evil.config"),
        ("leaf-alpha", NEEDS, "alpha.evil.config"),
        ("provider-postgres", BOUND, "evil"),
        ("mesh-config", CONFIG, "evil"),
    ];
    for (party, bucket, prefix) in parties {
        let c = bus.client(party).await;
        let pjs = mesh_provisioner::nats::connect::jetstream_of(c.clone(), party);
        let mut stored = Vec::new();
        for (name, payload, marker) in [("lease", &lease, false), ("plan", &plan, false), ("event", &event, false), ("marker", &Vec::new(), true)] {
            let subject = format!("$KV.{bucket}.{prefix}.{name}");
            let mut headers = HeaderMap::new();
            if marker {
                headers.insert("KV-Operation", "DEL");
            }
            let ack = pjs.publish_with_headers(subject.clone(), headers, payload.clone().into()).await.expect("sent");
            ack.await.unwrap_or_else(|e| panic!("{party} writes its own {subject}: {e}"));
            stored.push(subject);
        }
        let mut asks: Vec<(String, Vec<u8>)> = vec![
            ("$JS.API.INFO".into(), vec![]),
            ("$JS.API.STREAM.NAMES".into(), vec![]),
            (format!("$JS.API.STREAM.INFO.KV_{NEEDS}"), br#"{"subjects_filter":">"}"#.to_vec()),
            (format!("$JS.API.STREAM.INFO.KV_{bucket}"), br#"{"subjects_filter":">"}"#.to_vec()),
            (format!("$JS.API.STREAM.MSG.GET.KV_{NEEDS}"), br#"{"last_by_subj":"$KV.mesh-provisioner_needs.beta.web.config.base_url"}"#.to_vec()),
            ("mesh-provisioner.provisioning".into(), b"{}".to_vec()),
            ("mesh-provisioner.plan".into(), br#"{"node":"alpha","module":"app"}"#.to_vec()),
            ("$SRV.PING".into(), vec![]),
            ("$SRV.PING.mesh-provisioner".into(), vec![]),
            ("$SRV.INFO.mesh-provisioner".into(), vec![]),
            ("$SRV.STATS.mesh-provisioner".into(), vec![]),
        ];
        for subject in &stored {
            asks.push((format!("$JS.API.DIRECT.GET.KV_{bucket}.{subject}"), vec![]));
        }
        // Each JetStream request again through the party's domain, where its account's
        // imports of the API are (a direct get of what it stored is answered there).
        let domain: Vec<(String, Vec<u8>)> =
            asks.iter().filter_map(|(s, b)| s.strip_prefix("$JS.API.").map(|rest| (format!("$JS.mesh.API.{rest}"), b.clone()))).collect();
        asks.extend(domain);
        for aim in &aims {
            let consumer = json!({"stream_name": format!("KV_{bucket}"), "config": {"deliver_subject": aim, "ack_policy": "none", "deliver_policy": "all"}});
            for api in ["$JS.API", "$JS.mesh.API"] {
                c.publish_with_reply(format!("{api}.CONSUMER.CREATE.KV_{bucket}"), aim.clone(), serde_json::to_vec(&consumer).expect("json").into())
                    .await
                    .expect("sent");
            }
            for (subject, body) in &asks {
                c.publish_with_reply(subject.clone(), aim.clone(), body.clone().into()).await.expect("sent");
            }
        }
        c.flush().await.expect("flush");
        // What a node's KV client sees of the shared bucket: its own share (its keys, no
        // other node's), and no other node's value through a get.
        if party.starts_with("node-") || party.starts_with("leaf-") {
            let kv = pjs.get_key_value(NEEDS).await.unwrap_or_else(|e| panic!("{party}'s KV client binds the needs: {e}"));
            assert_eq!(kv.stream.cached_info().config.name, "NODE_alpha", "{party} bound another stream than its share");
            let listed =
                c.request(format!("$JS.mesh.API.STREAM.INFO.KV_{NEEDS}"), br#"{"subjects_filter":">"}"#.to_vec().into()).await.expect("its share answers");
            let text = String::from_utf8_lossy(&listed.payload);
            assert!(text.contains("alpha.app") && !text.contains("beta."), "{party} listed: {text}");
            assert!(kv.get("alpha.evil.config.lease").await.expect("a get of its own key").is_some(), "{party} reads its own key back");
            assert!(!matches!(kv.get("beta.web.config.base_url").await, Ok(Some(_))), "{party} read beta's need");
        }
        // The verb answers all along.
        let (code, v) = ask_raw(&alpha, b"{}").await.expect("the verb answers");
        assert_eq!(code, None, "the verb stopped answering during {party}'s attacks: {v}");
    }
    // A positive event after every attack: alpha's next write answered by the verb.
    bus.put("node-alpha", NEEDS, "alpha.app.config.after_attacks", br#"{"placeholder":"${config:after_attacks}"}"#).await;
    let start = Instant::now();
    while !tests::keys(&ask_ok(&alpha, json!({"what":"needs","node":"alpha","module":"app"})).await).iter().any(|k| k == "alpha.app.config.after_attacks") {
        assert!(start.elapsed() < Duration::from_secs(10), "alpha's write after the attacks was never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = revisions(js.clone()).await;
    assert_eq!(after, before, "a key another party may not write changed");
    assert_eq!(bus.seat_holder().await.as_deref(), Some(holder.as_str()), "the seat stayed with its holder");
    let seat_keys: Vec<String> = js.get_key_value(SEAT).await.expect("seat").keys().await.expect("keys").filter_map(|k| async { k.ok() }).collect().await;
    assert_eq!(seat_keys, ["holder"], "nothing but the lease in the seat's bucket");
    assert_eq!(consumers(js.clone()).await, consumers_before, "a party made a consumer");
    // A forced reconnect: the bus restarts, and the provisioner makes its mirrors again (no
    // party could have taken the consumers it needs).
    let bus = bus.restart(Duration::from_millis(300)).await;
    // A renewal still unanswered when the lease runs out (¾ of the 3 s TTL here) loses the
    // seat, even once the verbs' own connection is back and answering: the holder stops
    // serving until it takes the seat again. It is steady once it has renewed twice.
    bus.until_seat_renewed_twice().await;
    let start = Instant::now();
    while !tests::nats::answered_keys(&beta, json!({"what":"needs","node":"beta"}), Duration::from_secs(2)).await.is_ok_and(|k| k.len() == 1) {
        assert!(start.elapsed() < Duration::from_secs(30), "the provisioner did not serve again after the reconnect:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(js.get_stream("KV_x").await.is_err(), "no stream was made");
    // Each party's own key took what it wrote, and nothing else.
    let needs = tests::keys(&ask_ok(&alpha, json!({"what":"needs","node":"beta"})).await);
    assert_eq!(needs, ["beta.web.config.base_url"], "beta's needs: {needs:?}");
    let _ = beta_stop.send(());
    let beta_told = beta_heard.await.expect("listener");
    for (subject, payload) in &beta_told {
        let text = String::from_utf8_lossy(payload);
        assert!(!text.contains("forged") && !text.contains("io.nats") && !text.contains("mesh-provisioner_needs"), "beta was told {text} on {subject}");
    }
    // The verb carries on, for alpha on its own inbox.
    assert!(ask_ok(&alpha, json!({"what":"needs","node":"alpha","module":"app"})).await["entries"].as_array().is_some_and(|e| e.len() == 3));

    // 2. Listening on every subject its grant allows, a node hears no one else's values or
    // answers, while the provider, mesh-config and another node work.
    for forbidden in ["_INBOX.>", "_INBOX_node-beta.>", "_INBOX_mesh-provisioner.>", "mesh-provisioner.notice.beta", ">"] {
        let (c, denied) = bus.watched("node-alpha").await;
        let _sub = c.subscribe(forbidden).await.expect("the client sends the subscription");
        denied.expect("Subscription to", forbidden).await;
    }
    let (alpha_stop, alpha_heard) = listen(alpha.clone(), vec!["_INBOX_node-alpha.>".into(), "mesh-provisioner.notice.alpha".into()]);
    bus.put("provider-postgres", BOUND, "beta.web.db", br#"{"password":"beta-secret-7731"}"#).await;
    bus.put("mesh-config", CONFIG, "beta.web.base_url", b"\"https://beta-private.example\"").await;
    let marker = bus.put("node-beta", NEEDS, "beta.web.secret.beta_marker", br#"{"placeholder":"beta-marker-5520"}"#).await;
    // After the restart a share's source may wait out a retry of the server's before it is
    // linked again: the first read of beta's write waits for it, the others must hold at once.
    let fresh = json!({"what":"needs","node":"beta","min_revision":{"NODE_beta":marker},"wait":"4s"});
    tests::nats::ask_until(&beta, fresh, "beta's write read back", |v| v.to_string().contains("beta-marker-5520")).await;
    for _ in 0..5 {
        // Its own write, read back by its share's sequence (the revision its put was told).
        let v = ask_ok(&beta, json!({"what":"needs","node":"beta","min_revision":{"NODE_beta":marker}})).await;
        assert!(v.to_string().contains("beta-marker-5520"), "beta's own answer: {v}");
        let _ = ask_ok(&beta, json!({"what":"status","node":"beta"})).await;
    }
    // Alpha's own asks are answered on its inbox all along.
    let _ = ask_ok(&alpha, json!({"what":"status","node":"alpha"})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = alpha_stop.send(());
    let heard = alpha_heard.await.expect("listener");
    assert!(!heard.is_empty(), "alpha heard not even its own answers");
    for (subject, payload) in &heard {
        let text = String::from_utf8_lossy(payload);
        for secret in ["beta-secret-7731", "beta-private.example", "beta-marker-5520"] {
            assert!(!text.contains(secret), "alpha heard {secret} on {subject}: {text}");
        }
    }

    // 3. A node's roll-up or purge removes nothing of another's; its own delete still works.
    let beta_keys_before = tests::nats::answered_keys(&beta, json!({"what":"needs","node":"beta"}), Duration::from_secs(5)).await.expect("beta's needs");
    let ajs = mesh_provisioner::nats::connect::jetstream_of(alpha.clone(), "node-alpha");
    for rollup in ["all", "sub"] {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Rollup", rollup);
        let ack = ajs.publish_with_headers("$KV.mesh-provisioner_needs.alpha.app.config.wipe", headers, "{}".into()).await.expect("sent");
        let err = ack.await.expect_err("a roll-up is refused by the bucket");
        assert!(err.to_string().to_lowercase().contains("rollup"), "{rollup}: {err}");
    }
    let akv = ajs.get_key_value(NEEDS).await.expect("alpha opens the needs");
    assert!(akv.purge("alpha.app.config.db_url").await.is_err(), "a KV purge is a roll-up: refused");
    for api in [
        "$JS.API.STREAM.PURGE.KV_mesh-provisioner_needs",
        "$JS.API.STREAM.MSG.DELETE.KV_mesh-provisioner_needs",
        "$JS.API.STREAM.UPDATE.KV_mesh-provisioner_needs",
        "$JS.API.STREAM.DELETE.KV_mesh-provisioner_needs",
    ] {
        alpha.publish(api, r#"{"filter":"$KV.mesh-provisioner_needs.beta.>"}"#.into()).await.expect("sent");
        alpha_denied.expect("Publish to", api).await;
    }
    akv.delete("alpha.app.config.db_url").await.expect("a node deletes its own key");
    let beta_keys_after = tests::nats::answered_keys(&beta, json!({"what":"needs","node":"beta"}), Duration::from_secs(5)).await.expect("beta's needs");
    assert_eq!(beta_keys_after, beta_keys_before, "beta's keys are all there");
    status_until(&alpha, "alpha", "app", "its deleted need gone", |s| s["needs"].as_array().is_some_and(|n| n.len() == 2 && !s.to_string().contains("db_url")))
        .await;

    // 4. Streams are made by the operator alone; one not shaped as a bucket is refused, said in
    // status, and never takes status down for the rest; one capturing the verbs is reported.
    let capture = stream::Config {
        name: "KV_composed-gamma".into(),
        subjects: vec!["$KV.composed-gamma.>".into(), "mesh-provisioner.notice.gamma".into()],
        max_bytes: 1 << 20,
        ..Default::default()
    };
    for (user, name, subject) in [
        ("node-gamma", "KV_composed-gamma", "$JS.API.STREAM.CREATE.KV_composed-gamma"),
        ("provider-postgres", "KV_postgres_bound", "$JS.API.STREAM.CREATE.KV_postgres_bound"),
        ("mesh-config", "KV_mesh-config_values", "$JS.API.STREAM.CREATE.KV_mesh-config_values"),
        ("node-alpha", "steal", "$JS.API.STREAM.CREATE.steal"),
    ] {
        let (c, denied) = bus.watched(user).await;
        let config = stream::Config { name: name.into(), ..capture.clone() };
        c.publish(subject, serde_json::to_vec(&config).expect("json").into()).await.expect("sent");
        denied.expect("Publish to", subject).await;
    }
    assert!(js.get_stream("steal").await.is_err(), "no node made a stream");
    // The operator (or an old deployment) made gamma's compositions a stream of another shape.
    js.delete_stream("KV_composed-gamma").await.expect("the operator deletes gamma's bucket");
    js.create_stream(capture.clone()).await.expect("the operator makes a stream of another shape");
    bus.put("mesh-controller", "mesh-controller_assignments", "gamma.worker", br#"{"want":"g1"}"#).await;
    let s = status_until(&alpha, "gamma", "worker", "the refusal", |s| s.to_string().contains("not a bucket")).await;
    assert_eq!(s["state"], "never_ran", "{s}");
    let (code, plan) = ask_verb(&alpha, "mesh-provisioner.plan", br#"{"node":"gamma","module":"worker"}"#).await.expect("the plan verb answers");
    assert_eq!(code, None, "{plan}");
    assert!(plan.to_string().contains("not a bucket"), "the plan says why it waits: {plan}");
    let whole = ask_ok(&alpha, json!({"what":"status"})).await;
    assert!(whole["entries"].as_array().is_some_and(|e| e.iter().any(|m| m["node"] == "alpha")), "status answers for the rest: {whole}");
    let ready = readyz_until(&http, "the refused bucket", |code, v| code == 503 && v["buckets_refused"].to_string().contains("composed-gamma")).await;
    assert!(ready["buckets_refused"].to_string().contains("not a bucket"), "{ready}");
    assert_eq!(metric(&http, "mesh_provisioner_bucket_refused{bucket=\"composed-gamma\"}").await, Some(1.0));
    js.delete_stream("KV_composed-gamma").await.expect("deleted");
    tests::nats::make_bucket(&js, &tests::nats::spec("composed-gamma", 1)).await;
    // A stream capturing the plan verb: found by the audit, loudly.
    js.create_stream(stream::Config { name: "capture".into(), subjects: vec!["mesh-provisioner.plan".into()], max_bytes: 1 << 20, ..Default::default() })
        .await
        .expect("made");
    // The audit looks at start and every --audit-every; a reconnect-free way to ask it: a host
    // that starts now, as a standby, sees it at once.
    let standby = Host::spawn(bus.url(), &bus, tempfile::tempdir().expect("dir"), &tests::component_path(), &["--http", "127.0.0.1:0", "--seat-ttl", "3s"]);
    let standby_http = standby.http_url().await;
    let ready = readyz_until(&standby_http, "the capture", |code, v| code == 503 && v["streams_capturing"].to_string().contains("capture")).await;
    // Named by what it overlaps (the provisioner may not read another's stream's config).
    assert_eq!(ready["streams_capturing"][0]["subject"], "mesh-provisioner.>", "{ready}");
    assert_eq!(metric(&standby_http, "mesh_provisioner_stream_captures{stream=\"capture\",subject=\"mesh-provisioner.>\"}").await, Some(1.0));
    assert!(standby.log_text().contains("stream capture captures subjects of mesh-provisioner.>"), "{}", standby.log_text());
    js.delete_stream("capture").await.expect("deleted");
    standby.stop().await;

    // 5. Limits: a value past the bucket's size is refused, a node past its quota is named, an
    // unsafe bucket is said in the status of the modules it serves.
    let big = vec![b'x'; 70 << 10];
    let err = akv.put("alpha.app.config.huge", big.into()).await.expect_err("a value past 64 KiB is refused");
    assert!(err.to_string().to_lowercase().contains("maximum"), "{err}");
    // Keys past the quota (--node-quota-keys 40), while the bucket still has room.
    for i in 0..30 {
        akv.put(format!("alpha.many.config.k{i}"), "{}".into()).await.expect("a small need fits");
    }
    // A write near the value limit under a long key reaches the bucket, though sourcing adds a
    // header that repeats the key: alpha's share is never held behind it.
    let long = format!("alpha.app.config.{}", "l".repeat(3000));
    akv.put(&long, vec![b'x'; (64 << 10) - 200].into()).await.expect("within the value limit");
    let start = Instant::now();
    while !tests::keys(&ask_ok(&alpha, json!({"what":"needs","node":"alpha","module":"app"})).await).contains(&long) {
        assert!(start.elapsed() < Duration::from_secs(10), "alpha's long key never reached the bucket");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Bytes: alpha fills its share (8 MiB, its stream NODE_alpha) and is refused past it; beta,
    // whose share it is not, still writes, and is answered.
    let chunk = vec![b'y'; 60 << 10];
    let mut refused = None;
    for i in 0..200 {
        if let Err(e) = akv.put(format!("alpha.fill.config.c{i}"), chunk.clone().into()).await {
            refused = Some(e.to_string());
            break;
        }
    }
    let refused = refused.expect("alpha's share refuses its writes past it");
    assert!(refused.to_lowercase().contains("maximum bytes"), "{refused}");
    let bkv = bus.js("node-beta").await.get_key_value(NEEDS).await.expect("beta binds the needs");
    bkv.put("beta.web.config.after_alpha_filled", r#"{"placeholder":"${config:after}"}"#.into()).await.expect("beta writes while alpha's share is full");
    let start = Instant::now();
    while !tests::keys(&ask_ok(&beta, json!({"what":"needs","node":"beta"})).await).iter().any(|k| k == "beta.web.config.after_alpha_filled") {
        assert!(start.elapsed() < Duration::from_secs(10), "beta's write after alpha filled its share was never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // What a node's KV client sees of the bucket is its own share: its keys and usage.
    let own = akv.stream.cached_info().clone();
    assert_eq!(own.config.name, "NODE_alpha", "{:?}", own.config);
    let s = status_until(&alpha, "alpha", "app", "alpha past its quota and the unsafe bucket", |s| {
        let w = warnings(s).join("\n");
        w.contains("node alpha holds") && w.contains("bucket postgres_bound allows roll-ups")
    })
    .await;
    assert!(warnings(&s).iter().any(|w| w.contains("past its quota") && w.contains(NEEDS)), "{s}");
    let b = status(&beta, "beta", "web").await;
    assert!(!warnings(&b).iter().any(|w| w.contains("holds")), "beta is not named: {b}");
    assert!(metric(&http, "mesh_provisioner_writer_over_quota_keys{bucket=\"mesh-provisioner_needs\",writer=\"alpha\"}").await.is_some_and(|k| k > 40.0));
    assert_eq!(metric(&http, "mesh_provisioner_bucket_unsafe_settings{bucket=\"postgres_bound\"}").await, Some(2.0));

    // Through it all: the seat never moved, notices reach their node, and the plans follow.
    assert_eq!(bus.seat_holder().await.as_deref(), Some(holder.as_str()), "the seat stayed with its holder");
    let mut notices = alpha.subscribe("mesh-provisioner.notice.alpha").await.expect("subscribe");
    alpha.flush().await.expect("flush");
    let start = Instant::now();
    let mut told = None;
    for i in 0..20 {
        // The notifier follows a provider's bucket from its next listing (every 5 s).
        bus.put("provider-postgres", BOUND, "alpha.app.db", format!("{{\"password\":\"v{i}\"}}").as_bytes()).await;
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(1), notices.next()).await {
            told = Some(m);
            break;
        }
    }
    let told = told.unwrap_or_else(|| panic!("alpha was never told its bound value changed ({:?})", start.elapsed()));
    let notice: Value = serde_json::from_slice(&told.payload).expect("a notice is JSON");
    assert_eq!(notice["module"], "app", "{notice}");
    let (code, plan) = ask_verb(&alpha, "mesh-provisioner.plan", br#"{"node":"alpha","module":"app"}"#).await.expect("the plan verb answers");
    assert_eq!(code, None, "{plan}");
    assert!(plan.to_string().contains("postgres_bound"), "alpha/app's provisions: {plan}");
    host.signal("TERM");
    let _ = host.child.wait().await;
}

#[tokio::test]
async fn mirrors_past_the_memory_budget_are_refused_and_said_not_grown() {
    let bus = Bus::start().await;
    let host = Host::start(&bus, &["--http", "127.0.0.1:0", "--mirror-budget-mib", "1"]).await;
    let http = host.http_url().await;
    let alpha = bus.client("node-alpha").await;
    let kv = mesh_provisioner::nats::connect::jetstream_of(alpha.clone(), "node-alpha").get_key_value(NEEDS).await.expect("needs");
    let value = vec![b'z'; 60 << 10];
    for i in 0..24 {
        kv.put(format!("alpha.app.config.v{i}"), value.clone().into()).await.expect("within the bucket's limits");
    }
    let ready = readyz_until(&http, "the needs refused", |code, v| code == 503 && v["buckets_refused"].to_string().contains(NEEDS)).await;
    assert!(ready["buckets_refused"].to_string().contains("memory budget"), "{ready}");
    let (code, v) = ask_raw(&alpha, br#"{"what":"status","node":"alpha"}"#).await.expect("an answer");
    assert!(code.is_some(), "status cannot be answered without the needs: {v}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("memory budget"), "{v}");
    let held = metric(&http, "mesh_provisioner_mirrors_memory_bytes").await.expect("the figure");
    assert!(held <= (1 << 20) as f64, "the mirrors hold {held} bytes, past the 1 MiB budget");
    assert_eq!(metric(&http, &format!("mesh_provisioner_bucket_refused{{bucket=\"{NEEDS}\"}}")).await, Some(1.0));
    // The other buckets are answered as before.
    let v = ask_ok(&alpha, json!({"what":"registry"})).await;
    assert!(v["entries"].as_array().is_some_and(|e| !e.is_empty()), "{v}");
    host.stop().await;
}

/// Runs `mesh-provisioner bootstrap` as the operator against `bus`: its exit code, and what it
/// printed (a line per bucket), then its error if any.
async fn bootstrap(bus: &Bus, extra: &[&str]) -> (Option<i32>, String) {
    let password = bus.password(OPERATOR);
    let component = tests::component_path();
    let out = tokio::process::Command::new(tests::nats::host_binary())
        .args(["bootstrap", "--nats-url", bus.url(), "--user", OPERATOR, "--password", &password, "--component"])
        .arg(&component)
        .args(extra)
        .output()
        .await
        .expect("run bootstrap");
    let error = String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("mesh-provisioner:")).collect::<Vec<_>>().join("\n");
    (out.status.code(), format!("{}{error}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test]
async fn bootstrap_makes_every_bucket_safe_and_refuses_what_is_not_a_bucket() {
    let bus = Bus::start_bare().await;
    let js = bus.js(OPERATOR).await;
    // Made before: the config domain's bucket with roll-ups allowed and no value-size limit.
    js.create_key_value(jetstream::kv::Config { bucket: CONFIG.into(), max_bytes: 1 << 20, ..Default::default() }).await.expect("an old bucket");
    // And the indexer's, full of a byte limit and a count of messages that evict the oldest
    // keys (discard old).
    let evicting = stream::Config { discard: stream::DiscardPolicy::Old, max_messages: 1000, ..tests::nats::spec("mesh-indexer_builds", 1).stream_config() };
    js.create_stream(evicting).await.expect("an evicting bucket");
    let (code, out) = bootstrap(&bus, &["--node", "alpha", "--node", "beta", "--provider", "postgres"]).await;
    assert_eq!(code, Some(0), "{out}");
    let builds = js.get_stream("KV_mesh-indexer_builds").await.expect("kept").cached_info().config.clone();
    assert_eq!((builds.discard, builds.max_messages), (stream::DiscardPolicy::New, -1), "{builds:?}");
    assert!(
        out.lines().any(|l| l.starts_with("mesh-indexer_builds")
            && l.contains("made safe")
            && l.contains("discard new")
            && l.contains("no limit on the count of messages")),
        "{out}"
    );
    for bucket in [REGISTRY, SEAT, NEEDS, APPLIED, "mesh-provisioner_collect", "mesh-controller_assignments", "composed-alpha", "composed-beta", BOUND] {
        assert!(out.lines().any(|l| l.starts_with(bucket) && l.trim_end().ends_with("made")), "{bucket} not made:\n{out}");
        let info = js.get_stream(format!("KV_{bucket}")).await.expect("made").cached_info().config.clone();
        assert!(!info.allow_rollup && info.deny_delete && info.max_bytes > 0 && info.max_message_size > 0, "{bucket}: {info:?}");
    }
    assert!(out.lines().any(|l| l.starts_with(CONFIG) && l.contains("made safe: roll-ups refused, value-size limit 65536")), "{out}");
    let config = js.get_stream(format!("KV_{CONFIG}")).await.expect("kept").cached_info().config.clone();
    assert!(!config.allow_rollup && config.max_bytes == 1 << 20, "made safe, its own byte limit kept: {config:?}");
    assert!(js.get_stream("KV_composed-gamma").await.is_err(), "only the nodes named");
    // The buckets every node writes are made of the nodes' shares: a stream a node, which each
    // bucket sources, capturing nothing itself.
    for node in ["alpha", "beta"] {
        assert!(out.lines().any(|l| l.starts_with(&format!("NODE_{node}")) && l.trim_end().ends_with("made")), "NODE_{node} not made:\n{out}");
    }
    let needs = js.get_stream(format!("KV_{NEEDS}")).await.expect("made").cached_info().config.clone();
    let sources: Vec<&str> = needs.sources.iter().flatten().map(|s| s.name.as_str()).collect();
    assert!(needs.subjects.is_empty() && sources == ["NODE_alpha", "NODE_beta"], "{needs:?}");
    // Again: nothing to do.
    let (code, again) = bootstrap(&bus, &["--node", "alpha", "--node", "beta", "--provider", "postgres"]).await;
    assert_eq!(code, Some(0), "{again}");
    assert!(again.lines().filter(|l| !l.trim().is_empty()).all(|l| l.trim_end().ends_with("safe")), "{again}");
    // A stream of a bucket's name that is not a bucket is refused and left alone.
    js.create_stream(stream::Config {
        name: "KV_composed-gamma".into(),
        subjects: vec!["$KV.composed-gamma.>".into(), "gamma.extra".into()],
        max_bytes: 1 << 20,
        ..Default::default()
    })
    .await
    .expect("made");
    let (code, out) = bootstrap(&bus, &["--node", "gamma"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("composed-gamma") && out.contains("REFUSED") && out.contains("not a bucket"), "{out}");
    assert_eq!(js.get_stream("KV_composed-gamma").await.expect("left alone").cached_info().config.subjects.len(), 2);
    // Yet the node joined: its share made, and each bucket every node writes sources it too,
    // the other shares kept.
    assert!(out.lines().any(|l| l.starts_with("NODE_gamma") && l.trim_end().ends_with("made")), "{out}");
    assert!(out.lines().any(|l| l.starts_with(NEEDS) && l.contains("sources NODE_gamma")), "{out}");
    let needs = js.get_stream(format!("KV_{NEEDS}")).await.expect("made").cached_info().config.clone();
    let sources: Vec<&str> = needs.sources.iter().flatten().map(|s| s.name.as_str()).collect();
    assert_eq!(sources, ["NODE_alpha", "NODE_beta", "NODE_gamma"], "{needs:?}");
    // With room for the three whole shares (a bucket that filled would stop every sourcing).
    assert!(needs.max_bytes >= 3 * mesh_provisioner::nats::bucket::Share::default().room(), "{needs:?}");
    // A name that is no node.
    let (code, out) = bootstrap(&bus, &["--node", "*"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("is not a node or provider name"), "{out}");
}

/// A node's client speaking the protocol by hand, so it can send what no client library would:
/// bytes that are not UTF-8 in a subject or a header, a header block that is no NATS header.
struct RawNode {
    reader: tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl RawNode {
    async fn connect(bus: &Bus, user: &str) -> RawNode {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let address = bus.url().trim_start_matches("nats://").to_string();
        let stream = tokio::net::TcpStream::connect(&address).await.expect("the bus listens");
        let (read, mut writer) = stream.into_split();
        let mut reader = tokio::io::BufReader::new(read);
        let mut info = String::new();
        reader.read_line(&mut info).await.expect("INFO");
        assert!(info.starts_with("INFO "), "{info}");
        let connect = json!({"user": user, "pass": bus.password(user), "headers": true, "verbose": false, "pedantic": false, "protocol": 1});
        writer.write_all(format!("CONNECT {connect}\r\n").as_bytes()).await.expect("CONNECT");
        let mut node = RawNode { reader, writer };
        node.round_trip().await;
        node
    }

    /// Sends one `HPUB` of exactly these bytes.
    async fn hpub(&mut self, subject: &[u8], reply: Option<&str>, header: &[u8], payload: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let mut frame = b"HPUB ".to_vec();
        frame.extend_from_slice(subject);
        if let Some(reply) = reply {
            frame.extend_from_slice(format!(" {reply}").as_bytes());
        }
        frame.extend_from_slice(format!(" {} {}\r\n", header.len(), header.len() + payload.len()).as_bytes());
        frame.extend_from_slice(header);
        frame.extend_from_slice(payload);
        frame.extend_from_slice(b"\r\n");
        self.writer.write_all(&frame).await.expect("HPUB");
    }

    async fn send(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt;
        self.writer.write_all(line.as_bytes()).await.expect("sent");
    }

    /// `PING` until `PONG`: everything sent before was taken (a refusal would be an `-ERR`).
    async fn round_trip(&mut self) {
        self.send("PING\r\n").await;
        loop {
            let (line, _) = self.next().await;
            assert!(!line.starts_with("-ERR"), "the server refused: {line}");
            if line.starts_with("PONG") {
                return;
            }
        }
    }

    /// The next protocol line, and a message's bytes (header and payload) when it is one.
    async fn next(&mut self) -> (String, Vec<u8>) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), self.reader.read_until(b'\n', &mut raw)).await.expect("the bus says something").expect("read");
        let line = String::from_utf8_lossy(&raw).trim_end().to_string();
        if line.starts_with("PING") {
            self.writer.write_all(b"PONG\r\n").await.expect("PONG");
        }
        let mut body = Vec::new();
        if line.starts_with("MSG ") || line.starts_with("HMSG ") {
            let total: usize = line.rsplit(' ').next().and_then(|n| n.parse().ok()).expect("a length");
            body.resize(total + 2, 0);
            self.reader.read_exact(&mut body).await.expect("the message");
            body.truncate(total);
        }
        (line, body)
    }
}

#[tokio::test]
async fn no_bytes_a_node_writes_cut_the_provisioner_off() {
    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let host = Host::start(&bus, &["--http", "127.0.0.1:0"]).await;
    let http = host.http_url().await;
    let beta = bus.client("node-beta").await;
    bus.put("node-beta", NEEDS, "beta.web.config.base_url", br#"{"placeholder":"${config:base_url}"}"#).await;
    status_until(&beta, "beta", "web", "its need", |s| s["needs"].as_array().is_some_and(|n| n.len() == 1)).await;
    let holder = bus.seat_holder().await.expect("a holder");
    let transitions = metric(&http, "mesh_provisioner_seat_transitions_total").await;

    // nats-server checks neither subjects nor headers for UTF-8, and JetStream stores them as
    // sent: each of these is kept in alpha's share and delivered to the provisioner's mirror,
    // again after every reconnect if reading it cut the connection.
    let mut alpha = RawNode::connect(&bus, "node-alpha").await;
    let need = br#"{"placeholder":"${config:x}"}"#;
    alpha.hpub(b"$KV.mesh-provisioner_needs.alpha.\xff.config.x", None, b"NATS/1.0\r\nX: \xff\r\n\r\n", need).await;
    alpha.hpub(b"$KV.mesh-provisioner_applied.alpha.\xfe", None, b"NATS/1.0\r\n\r\n", b"{}").await;
    // A key in shape under a header block that is no NATS header: still alpha's need.
    alpha
        .hpub(
            b"$KV.mesh-provisioner_needs.alpha.app.config.odd",
            None,
            b"HTTP/1.1 abc\r\nno colon\r\nbad name: 1\r\n\r\n",
            br#"{"placeholder":"${config:odd}"}"#,
        )
        .await;
    alpha.round_trip().await;
    // The verb asked with the same header: the serving connection reads it and answers.
    alpha.send("SUB _INBOX_node-alpha.raw 1\r\n").await;
    alpha
        .hpub(b"mesh-provisioner.provisioning", Some("_INBOX_node-alpha.raw"), b"NATS/1.0\r\nX: \xff\r\nY\r\n\r\n", br#"{"what":"needs","node":"beta"}"#)
        .await;
    let answer = loop {
        let (line, body) = alpha.next().await;
        assert!(!line.starts_with("-ERR"), "the server refused: {line}");
        if line.starts_with("MSG ") || line.starts_with("HMSG ") {
            break body;
        }
    };
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("beta.web.config.base_url"), "the verb answers a request with a hostile header: {text}");

    // The mirror read past every one of them: the key in shape is listed, the others are said
    // out of shape (with U+FFFD for the bytes that were not UTF-8), never dropped.
    let start = Instant::now();
    let needs = loop {
        let v = ask_ok(&beta, json!({"what":"needs","node":"alpha"})).await;
        if tests::keys(&v).iter().any(|k| k == "alpha.app.config.odd") && !tests::out_of_shape(&v).is_empty() {
            break v;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "alpha's needs never showed what it wrote: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(tests::out_of_shape(&needs), ["alpha.\u{FFFD}.config.x"]);
    let applied = ask_ok(&beta, json!({"what":"applied","node":"alpha"})).await;
    assert_eq!(tests::out_of_shape(&applied), ["alpha.\u{FFFD}"]);

    // And after it all: a later write of beta's is read, the seat never moved, no connection
    // of the provisioner's was lost.
    bus.put("node-beta", NEEDS, "beta.web.config.later", br#"{"placeholder":"${config:later}"}"#).await;
    status_until(&beta, "beta", "web", "its later need", |s| s["needs"].as_array().is_some_and(|n| n.len() == 2)).await;
    assert_eq!(bus.seat_holder().await.as_deref(), Some(holder.as_str()));
    assert_eq!(metric(&http, "mesh_provisioner_seat_transitions_total").await, transitions);
    let lost = tests::nats::lost_connections(&http).await;
    assert!(lost.is_empty(), "a connection was lost: {lost:?}");
    assert!(host.log_text().lines().all(|l| !l.contains("disconnected from the bus")), "{}", host.log_text());
}

/// The operator reads a bucket whole (`nats kv ls`, `nats stream view` are ordered consumers)
/// past the server's flow control: its grant answers `$JS.FC`, so a listing of more than the
/// consumer's window (a few MB) is never refused its replies and stalled; and what that grant
/// lets it send, aimed at the buckets, lands in none.
#[tokio::test]
async fn the_operator_reads_a_large_bucket_answering_its_flow_control() {
    for bus in [Bus::start().await, Bus::start_operator().await] {
        // Node alpha's share, filled with ~6 MB (the first flow-control window is 2 MB).
        let alpha = bus.js("node-alpha").await;
        let (values, size) = (100, 60_000);
        let mut acks = Vec::new();
        for i in 0..values {
            let ack = alpha.publish(format!("$KV.{NEEDS}.alpha.big.config.v{i:03}"), vec![b'x'; size].into()).await.expect("alpha writes its keys");
            acks.push(ack);
        }
        for ack in acks {
            ack.await.expect("stored in alpha's share");
        }
        let (client, denials) = bus.watched(OPERATOR).await;
        let js = mesh_provisioner::nats::connect::jetstream_of(client, OPERATOR);
        let kv = js.get_key_value(NEEDS).await.expect("the operator opens the bucket");
        let mut watch = kv.watch_with_history("alpha.big.>").await.expect("the operator lists the bucket");
        let mut read = 0;
        while read < values {
            let entry = tokio::time::timeout(Duration::from_secs(60), watch.next()).await.expect("the listing goes on").expect("an entry").expect("readable");
            assert_eq!(entry.value.len(), size, "{}", entry.key);
            read += 1;
        }
        let refused: Vec<String> = denials.all().into_iter().filter(|m| m.contains("$JS.FC")).collect();
        assert!(refused.is_empty(), "the operator's flow-control replies were refused: {refused:?}");

        // What the grant lets the operator send, aimed at the buckets: forged flow-control
        // replies named after streams, consumers and keys. No stream stores them.
        let counts = async || {
            let mut names: Vec<String> = js.stream_names().filter_map(|n| async move { n.ok() }).collect().await;
            names.sort();
            let mut counts = Vec::new();
            for name in names {
                let messages = js.get_stream(&name).await.expect("stream info").info().await.expect("stream info").state.messages;
                counts.push((name, messages));
            }
            counts
        };
        let before = counts().await;
        assert!(before.iter().any(|(n, m)| n.starts_with("KV_mesh-provisioner_needs") && *m >= values as u64), "the listing's keys: {before:?}");
        let forger = js.client();
        for subject in [
            format!("$JS.FC.KV_{NEEDS}.x.y"),
            format!("$JS.FC.KV_{NEEDS}.alpha.big.config.v000"),
            format!("$JS.FC.KV_{SEAT}.holder"),
            format!("$JS.FC.KV_{REGISTRY}.config"),
            "$JS.FC.x".to_string(),
        ] {
            forger.publish(subject, br#"{"forged":true}"#.as_slice().into()).await.expect("published");
        }
        forger.flush().await.expect("flushed");
        assert!(denials.all().iter().all(|m| !m.contains("$JS.FC")), "refused: {:?}", denials.all());
        assert_eq!(counts().await, before, "a forged flow-control reply landed in a stream");
    }
}
