//! The account model held against the mesh's own users (SPEC §8, "No user reaches past its
//! grant, whatever it sends"): the real host binary, the real component and a real
//! `nats-server` with the example config, each attack made as the user it limits, with only
//! that user's password — a node, a provider, the config domain — and each checked for what it
//! must not do: nothing landed, nothing leaked, and the verb, plans, notices and the seat carried
//! on.
//!
//! One server and one host serve every attack but the memory budget (which needs a host of its
//! own, with a budget small enough to pass).

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use async_nats::{Client, HeaderMap};
use futures::StreamExt;
use serde_json::{json, Value};
use tests::browser::get;
use tests::nats::{ask_ok, ask_raw, ask_verb, module_status as status, stats_data, status_until, Bus, Host, OPERATOR};

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const SEAT: &str = "mesh-provisioner_seat";
const REGISTRY: &str = "mesh-provisioner_registry";
const BOUND: &str = "postgres_bound";
const CONFIG: &str = "mesh-config_values";

/// What a stream holds now: its last sequence and message count.
async fn stream_state(js: &jetstream::Context, bucket: &str) -> (u64, u64) {
    let mut s = js.get_stream(format!("KV_{bucket}")).await.unwrap_or_else(|e| panic!("stream of {bucket}: {e}"));
    let info = s.info().await.unwrap_or_else(|e| panic!("info of {bucket}: {e}"));
    (info.state.last_sequence, info.state.messages)
}



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
    let bus = Bus::start().await;
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
    bus.put("node-alpha", "composed-alpha", "app.b1", br#"{"state":"published","plan":{"parts":["api"],"needs":[{"kind":"bound","name":"postgres.db","part":"api"}],"dirs":[]}}"#).await;
    bus.put("node-alpha", NEEDS, "alpha.app.bound.postgres=2Edb", br#"{"placeholder":"${bound:postgres.db}"}"#).await;
    bus.put("node-alpha", NEEDS, "alpha.app.config.db_url", br#"{"placeholder":"${config:db_url}"}"#).await;
    bus.put("node-beta", NEEDS, "beta.web.config.base_url", br#"{"placeholder":"${config:base_url}"}"#).await;
    bus.put("node-beta", APPLIED, "beta.web", br#"{"build":"w1","needs":1,"at":"2026-12-01T00:00:00Z"}"#).await;
    let holder = bus.seat_holder().await.expect("a holder");
    status_until(&alpha, "alpha", "app", "its needs", |s| s["needs"].as_array().is_some_and(|n| n.len() == 2)).await;

    // 1. Replies aimed at the seat, the registry and another node's notices land nowhere.
    let (beta_stop, beta_heard) = listen(beta.clone(), vec!["mesh-provisioner.notice.beta".into()]);
    let seat_before = stream_state(&js, SEAT).await;
    let registry_before = stream_state(&js, REGISTRY).await;
    let aims = ["$KV.mesh-provisioner_seat.holder", "$KV.mesh-provisioner_registry.config", "$KV.mesh-provisioner_registry.forged", "mesh-provisioner.notice.beta"];
    let asks: [(&str, &[u8]); 5] = [
        ("mesh-provisioner.provisioning", b"{}"),
        ("mesh-provisioner.plan", br#"{"node":"alpha","module":"app"}"#),
        ("$SRV.PING", b""),
        ("$SRV.INFO.mesh-provisioner", b""),
        ("$SRV.STATS.mesh-provisioner", b""),
    ];
    for _ in 0..3 {
        for aim in aims {
            for (subject, body) in asks {
                alpha.publish_with_reply(subject, aim, bytes::Bytes::copy_from_slice(body)).await.expect("publish");
            }
        }
    }
    alpha.flush().await.expect("flush");
    // The refusals are counted: 3 rounds × 4 aims for each endpoint, and for the $SRV subjects.
    let start = Instant::now();
    let data = loop {
        let d = stats_data(&alpha).await;
        if d["refused_replies"].as_u64().unwrap_or(0) >= 12 && d["srv_refused_replies"].as_u64().unwrap_or(0) >= 36 {
            break d;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the refusals were not counted: {d}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(data["srv_refused_replies"], 36, "{data}");
    let seat_keys: Vec<String> = js.get_key_value(SEAT).await.expect("seat").keys().await.expect("keys").filter_map(|k| async { k.ok() }).collect().await;
    assert_eq!(seat_keys, ["holder"], "nothing but the lease in the seat's bucket");
    assert!(stream_state(&js, SEAT).await.1 <= seat_before.1.max(1), "the seat's bucket holds the lease alone");
    let registry_after = stream_state(&js, REGISTRY).await;
    assert_eq!(registry_after, registry_before, "nothing was written into the registry");
    let seat_kv = js.get_key_value(SEAT).await.expect("seat bucket");
    let lease: Value = serde_json::from_slice(&seat_kv.get("holder").await.expect("read").expect("a lease")).expect("the lease is the holder's JSON");
    assert_eq!(lease["instance"], holder, "the seat still names its holder: {lease}");
    let keys: Vec<String> = js.get_key_value(REGISTRY).await.expect("registry").keys().await.expect("keys").filter_map(|k| async { k.ok() }).collect().await;
    assert!(!keys.iter().any(|k| k == "forged"), "{keys:?}");
    // Logged once per requester, not per request.
    let log = host.log_text();
    for aim in aims {
        let requester = aim.rsplit_once('.').map_or(aim, |(h, _)| h);
        let lines = log.lines().filter(|l| l.contains("not an inbox") && l.contains(&format!("{requester:?}"))).count();
        assert_eq!(lines, 1, "refusals toward {requester} logged {lines} times:\n{log}");
    }
    assert_eq!(metric(&http, "mesh_provisioner_refused_replies_total{endpoint=\"provisioning\"}").await, Some(12.0));
    // The verb carries on, for alpha on its own inbox.
    assert!(ask_ok(&alpha, json!({"what":"needs","node":"alpha"})).await["entries"].as_array().is_some_and(|e| e.len() == 2));
    // The JetStream API answers wherever a request names, too, and no config of one account
    // stops it: a node lands the API's answer on the seat's key, again and again for longer
    // than the lease. That is no lease: the holder writes over it and never stops serving.
    for _ in 0..15 {
        alpha.publish_with_reply("$JS.API.INFO", "$KV.mesh-provisioner_seat.holder", "".into()).await.expect("sent");
        let (code, v) = ask_raw(&alpha, b"{}").await.expect("the verb answers");
        assert_eq!(code, None, "the holder stopped serving: {v}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The last answer landed is written over at the holder's next renewal (a third of the TTL).
    let start = Instant::now();
    while bus.seat_holder().await.as_deref() != Some(holder.as_str()) {
        assert!(start.elapsed() < Duration::from_secs(3), "the holder did not write over the API's answer within a TTL");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(host.log_text().contains("no lease was written on the seat's key"), "{}", host.log_text());

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
    bus.put("node-beta", NEEDS, "beta.web.secret.beta_marker", br#"{"placeholder":"beta-marker-5520"}"#).await;
    for _ in 0..5 {
        let v = ask_ok(&beta, json!({"what":"needs","node":"beta"})).await;
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
    let ajs = jetstream::new(alpha.clone());
    for rollup in ["all", "sub"] {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Rollup", rollup);
        let ack = ajs.publish_with_headers("$KV.mesh-provisioner_needs.alpha.app.config.wipe", headers, "{}".into()).await.expect("sent");
        let err = ack.await.expect_err("a roll-up is refused by the bucket");
        assert!(err.to_string().to_lowercase().contains("rollup"), "{rollup}: {err}");
    }
    let akv = ajs.get_key_value(NEEDS).await.expect("alpha opens the needs");
    assert!(akv.purge("alpha.app.config.db_url").await.is_err(), "a KV purge is a roll-up: refused");
    for api in ["$JS.API.STREAM.PURGE.KV_mesh-provisioner_needs", "$JS.API.STREAM.MSG.DELETE.KV_mesh-provisioner_needs", "$JS.API.STREAM.UPDATE.KV_mesh-provisioner_needs", "$JS.API.STREAM.DELETE.KV_mesh-provisioner_needs"] {
        alpha.publish(api, r#"{"filter":"$KV.mesh-provisioner_needs.beta.>"}"#.into()).await.expect("sent");
        alpha_denied.expect("Publish to", api).await;
    }
    akv.delete("alpha.app.config.db_url").await.expect("a node deletes its own key");
    let beta_keys_after = tests::nats::answered_keys(&beta, json!({"what":"needs","node":"beta"}), Duration::from_secs(5)).await.expect("beta's needs");
    assert_eq!(beta_keys_after, beta_keys_before, "beta's keys are all there");
    status_until(&alpha, "alpha", "app", "its deleted need gone", |s| s["needs"].as_array().is_some_and(|n| n.len() == 1)).await;

    // 4. Streams are made by the operator alone; one not shaped as a bucket is refused, said in
    // status, and never takes status down for the rest; one capturing the verbs is reported.
    let capture = stream::Config { name: "KV_composed-gamma".into(), subjects: vec!["$KV.composed-gamma.>".into(), "mesh-provisioner.notice.gamma".into()], max_bytes: 1 << 20, ..Default::default() };
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
    js.create_stream(stream::Config { name: "capture".into(), subjects: vec!["mesh-provisioner.plan".into()], max_bytes: 1 << 20, ..Default::default() }).await.expect("made");
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
    // Bytes: the host made the needs with a 1 MiB limit (--bucket-max-mib 1).
    let chunk = vec![b'y'; 60 << 10];
    let mut refused = None;
    for i in 0..40 {
        if let Err(e) = akv.put(format!("alpha.fill.config.c{i}"), chunk.clone().into()).await {
            refused = Some(e.to_string());
            break;
        }
    }
    let refused = refused.expect("the bucket's byte limit refuses writes past it");
    assert!(refused.to_lowercase().contains("maximum bytes"), "{refused}");
    for i in 0..30 {
        akv.put(format!("alpha.many.config.k{i}"), "{}".into()).await.ok();
    }
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
    let _ = beta_stop.send(());
    let beta_notices = beta_heard.await.expect("listener");
    assert!(beta_notices.iter().all(|(_, p)| serde_json::from_slice::<Value>(p).is_ok_and(|v| v["module"] == "web")), "a notice to beta that the holder did not send: {beta_notices:?}");
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
    let kv = jetstream::new(alpha.clone()).get_key_value(NEEDS).await.expect("needs");
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
    let bus = Bus::start().await;
    let js = bus.js(OPERATOR).await;
    // Made before: the config domain's bucket with roll-ups allowed and no value-size limit.
    js.create_key_value(jetstream::kv::Config { bucket: CONFIG.into(), max_bytes: 1 << 20, ..Default::default() }).await.expect("an old bucket");
    let (code, out) = bootstrap(&bus, &["--node", "alpha", "--node", "beta", "--provider", "postgres"]).await;
    assert_eq!(code, Some(0), "{out}");
    for bucket in [REGISTRY, SEAT, NEEDS, APPLIED, "mesh-provisioner_collect", "mesh-controller_assignments", "mesh-indexer_builds", "composed-alpha", "composed-beta", BOUND] {
        assert!(out.lines().any(|l| l.starts_with(bucket) && l.trim_end().ends_with("made")), "{bucket} not made:\n{out}");
        let info = js.get_stream(format!("KV_{bucket}")).await.expect("made").cached_info().config.clone();
        assert!(!info.allow_rollup && info.deny_delete && info.max_bytes > 0 && info.max_message_size > 0, "{bucket}: {info:?}");
    }
    assert!(out.lines().any(|l| l.starts_with(CONFIG) && l.contains("made safe: roll-ups refused, value-size limit 65536")), "{out}");
    let config = js.get_stream(format!("KV_{CONFIG}")).await.expect("kept").cached_info().config.clone();
    assert!(!config.allow_rollup && config.max_bytes == 1 << 20, "made safe, its own byte limit kept: {config:?}");
    assert!(js.get_stream("KV_composed-gamma").await.is_err(), "only the nodes named");
    // Again: nothing to do.
    let (code, again) = bootstrap(&bus, &["--node", "alpha", "--node", "beta", "--provider", "postgres"]).await;
    assert_eq!(code, Some(0), "{again}");
    assert!(again.lines().filter(|l| !l.trim().is_empty()).all(|l| l.trim_end().ends_with("safe")), "{again}");
    // A stream of a bucket's name that is not a bucket is refused and left alone.
    js.create_stream(stream::Config { name: "KV_composed-gamma".into(), subjects: vec!["$KV.composed-gamma.>".into(), "gamma.extra".into()], max_bytes: 1 << 20, ..Default::default() })
        .await
        .expect("made");
    let (code, out) = bootstrap(&bus, &["--node", "gamma"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("composed-gamma") && out.contains("REFUSED") && out.contains("not a bucket"), "{out}");
    assert_eq!(js.get_stream("KV_composed-gamma").await.expect("left alone").cached_info().config.subjects.len(), 2);
    // A name that is no node.
    let (code, out) = bootstrap(&bus, &["--node", "*"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("is not a node or provider name"), "{out}");
}
