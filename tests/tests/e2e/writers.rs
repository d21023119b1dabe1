//! Abusive writers end to end: node-alpha's own client, within its own permissions, writes
//! values at the server's `max_payload`, 100 000 out-of-shape keys, keys as long as a subject
//! may be, and churns one key at up to 10 000 writes a second — against the real host on a real
//! `nats-server`. The server stays up and keeps the seat, its memory grows by at most 3× the raw
//! bytes it mirrors, and the verb answers every page of `needs` (none over `max_payload`), lists
//! every shaped key, names every out-of-shape one exactly once, and follows the churned key to
//! its last acknowledged revision. `WRITERS_JUNK` sets the out-of-shape keys (100 000).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use serde_json::{json, Value};
use tests::nats::{ask_raw, Bus, Host};

/// Writes every (key, value) into the needs bucket, acknowledgements pipelined `window` deep;
/// returns the revision acknowledged for each write, in the order given.
async fn put_all(js: &jetstream::Context, writes: impl Iterator<Item = (String, Vec<u8>)>, window: usize) -> Vec<u64> {
    futures::stream::iter(writes)
        .map(|(key, value)| {
            let js = js.clone();
            async move {
                let ack = js.publish(format!("$KV.mesh-provisioner_needs.{key}"), value.into()).await.unwrap_or_else(|e| panic!("publish {key:.60}: {e}"));
                ack.await.unwrap_or_else(|e| panic!("ack of {key:.60}: {e}")).sequence
            }
        })
        .buffered(window)
        .collect()
        .await
}

/// The start of `v`, for a failure's message.
fn short(v: &Value) -> String {
    v.to_string().chars().take(300).collect()
}

/// Every page of `needs` for alpha: (entries, out-of-shape keys, largest reply in bytes, pages).
async fn all_needs(c: &async_nats::Client) -> (Vec<Value>, Vec<String>, usize, usize) {
    let (mut entries, mut shapes, mut largest, mut pages) = (Vec::new(), Vec::new(), 0, 0);
    let mut after: Option<String> = None;
    loop {
        let mut q = json!({"what":"needs","node":"alpha","limit":1000});
        if let Some(a) = &after {
            q["after"] = json!(a);
        }
        let reply = c.request("mesh-provisioner.provisioning", q.to_string().into()).await.expect("a page is answered");
        largest = largest.max(reply.payload.len());
        pages += 1;
        let v: Value = serde_json::from_slice(&reply.payload).expect("a page is JSON");
        assert!(v.get("error").is_none(), "page after {after:?}: {}", short(&v));
        tests::schema::check("provisioning.reply", &v);
        entries.extend(v["entries"].as_array().expect("entries").iter().cloned());
        shapes.extend(tests::out_of_shape(&v));
        match v["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => return (entries, shapes, largest, pages),
        }
    }
}

#[tokio::test]
async fn writers_within_their_permissions_cannot_bring_the_server_down() {
    let junk: usize = std::env::var("WRITERS_JUNK").ok().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    // The buckets as an operator who raised the value-size limit to the bus's largest message
    // and gave each node a large share would make them (the default, 64 KiB, refuses the
    // largest values at the bus): the host must hold up to what any bucket could be made to
    // take.
    let limits = mesh_provisioner::nats::bucket::BucketLimits { max_value: 1 << 20, ..Default::default() };
    let bus = Bus::start_with(limits, mesh_provisioner::nats::bucket::Share { max_bytes: 256 << 20, max_keys: 200_000 }).await;
    let host = Host::start(&bus, &["--instance", "abused", "--value-max-kib", "1024"]).await;
    let pid = host.pid();
    let c = bus.client("node-alpha").await;
    let js = jetstream::new(c.clone());
    // A first answer, so the mirror and an instance exist before the baseline.
    put_all(&js, std::iter::once(("alpha.app.config.url".to_string(), b"{}".to_vec())), 1).await;
    let _ = all_needs(&c).await;
    let before = tests::rss_kib(pid);
    let max_payload = c.server_info().max_payload;
    let mut raw = 0usize;

    // Values as large as the server takes.
    let big = |i: usize| {
        let mut v = format!("{{\"i\":{i},\"pad\":\"").into_bytes();
        v.resize(max_payload - 2, b'x');
        v.extend_from_slice(b"\"}");
        v
    };
    let bigs: Vec<(String, Vec<u8>)> = (0..24).map(|i| (format!("alpha.big.config.v{i:02}"), big(i))).collect();
    raw += bigs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    put_all(&js, bigs.into_iter(), 4).await;

    // Out-of-shape keys of three kinds: too few tokens, too many, a kind that is no identifier (`-kind`).
    let shape = |i: usize| match i % 3 {
        0 => format!("alpha.junk{i}"),
        1 => format!("alpha.m{i}.config.a.b"),
        _ => format!("alpha.m{i}.-kind.x"),
    };
    let junk_keys: Vec<String> = (0..junk).map(shape).collect();
    raw += junk_keys.iter().map(|k| k.len() + 2).sum::<usize>();
    let started = Instant::now();
    put_all(&js, junk_keys.iter().map(|k| (k.clone(), b"{}".to_vec())), 2000).await;
    println!("{junk} out-of-shape keys written in {:?}", started.elapsed());

    // Keys as long as the server's control line lets a client publish (4 KiB, less the command,
    // the bucket's prefix and the reply inbox): shaped and out of shape.
    let room = 4096 - "HPUB $KV.mesh-provisioner_needs.  1234567 1234567\r\n".len() - c.new_inbox().len() - 8;
    let long_shaped: Vec<String> = (0..5).map(|i| format!("alpha.long.config.{i}{}", "n".repeat(room - 19))).collect();
    let long_junk: Vec<String> = (0..5).map(|i| format!("alpha.long{i}{}", "j".repeat(room - 11))).collect();
    assert!(long_shaped.iter().chain(&long_junk).all(|k| k.len() >= room - 1 && k.len() <= room), "{room}");
    raw += long_shaped.iter().chain(&long_junk).map(|k| k.len() + 2).sum::<usize>();
    put_all(&js, long_shaped.iter().chain(&long_junk).map(|k| (k.clone(), b"{}".to_vec())), 10).await;

    // Churn: one key rewritten at up to 10 000 writes a second for 3 s, while the verb is asked.
    let asker = {
        let c = c.clone();
        tokio::spawn(async move {
            let (mut answered, mut refused) = (0u32, Vec::new());
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                match ask_raw(&c, br#"{"what":"needs","node":"alpha","module":"churn"}"#).await {
                    Ok((None, _)) => answered += 1,
                    other => refused.push(format!("{other:?}")),
                }
            }
            (answered, refused)
        })
    };
    let started = Instant::now();
    // Writes in flight together land in any order: the last is the highest revision acknowledged.
    let (mut last_churn, mut last_n) = (0, 0);
    let mut churned = 0usize;
    for second in 0..3u64 {
        let batch = (0..10_000).map(|i| ("alpha.churn.config.hot".to_string(), format!("{{\"n\":{}}}", second * 10_000 + i).into_bytes()));
        for (i, revision) in put_all(&js, batch, 1000).await.into_iter().enumerate() {
            if revision > last_churn {
                (last_churn, last_n) = (revision, second * 10_000 + i as u64);
            }
        }
        churned += 10_000;
        let due = Duration::from_secs(second + 1);
        if let Some(rest) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }
    let churn_rate = churned as f64 / started.elapsed().as_secs_f64();
    raw += "alpha.churn.config.hot".len() + 9;
    let (answered, refused) = asker.await.expect("the asker ran");
    assert!(refused.is_empty(), "asked during the churn: {refused:?}");

    // The churned key is followed to its last acknowledged write (the revision alpha is told is
    // its share's; the bucket sources the share in its order, so the last one is the value).
    let start = Instant::now();
    loop {
        let (code, v) = ask_raw(&c, br#"{"what":"needs","node":"alpha","module":"churn"}"#).await.expect("answered");
        assert_eq!(code, None, "{v}");
        if v["entries"][0]["value"] == json!({ "n": last_n }) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the churned key stuck at {v}, the last write is {{\"n\":{last_n}}} (share revision {last_churn})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (entries, shapes, largest, pages) = all_needs(&c).await;
    // Holders build the mirror's index by last token: its memory counts too.
    let (code, v) = ask_raw(&c, br#"{"what":"holders","kind":"config","name":"url"}"#).await.expect("holders answers");
    assert_eq!((code, v["count"].as_u64()), (None, Some(1)), "{}", short(&v));
    let after = tests::rss_kib(pid);
    let growth = (after.saturating_sub(before) * 1024) as f64 / raw as f64;
    println!(
        "abusive writers: 24 values of {max_payload} bytes, {junk} out-of-shape keys, 10 keys of {room} bytes, {churned} churn writes at {churn_rate:.0}/s ({answered} needs answered meanwhile); \
         needs listed in {pages} pages, the largest {largest} bytes; raw {:.1} MiB, host RSS {} → {} MiB: growth {growth:.2}× raw",
        raw as f64 / 1048576.0,
        before / 1024,
        after / 1024
    );

    // Every page fits a message; every shaped key is listed, each big value said too big to carry.
    assert!(largest <= max_payload, "a reply of {largest} bytes over max_payload {max_payload}");
    let listed: BTreeSet<&str> = entries.iter().filter_map(|e| e["key"].as_str()).collect();
    assert_eq!(listed.len(), entries.len(), "a key listed twice");
    for i in 0..24 {
        let key = format!("alpha.big.config.v{i:02}");
        let e = entries.iter().find(|e| e["key"] == json!(key)).unwrap_or_else(|| panic!("{key} is not listed"));
        assert_eq!(e["value_omitted"]["bytes"], json!(max_payload), "{}", short(e));
    }
    for key in long_shaped.iter().chain(["alpha.app.config.url".to_string(), "alpha.churn.config.hot".to_string()].iter()) {
        assert!(listed.contains(key.as_str()), "{key:.60} is not listed");
    }
    assert_eq!(entries.len(), 24 + 5 + 2, "entries beyond those written");
    // Every out-of-shape key named, once.
    let named: BTreeSet<&str> = shapes.iter().map(String::as_str).collect();
    assert_eq!(named.len(), shapes.len(), "an out-of-shape key named twice");
    let written: BTreeSet<&str> = junk_keys.iter().chain(&long_junk).map(String::as_str).collect();
    assert_eq!(named, written, "the out-of-shape keys named differ from those written");

    // Up and still the seat's holder (the memory figure is printed above; the budget that bounds
    // it is tested where mirrors past it are refused).
    assert_eq!(bus.seat_holder().await.as_deref(), Some("abused"));
    let (code, v) = ask_raw(&c, br#"{"what":"status","node":"alpha","module":"app"}"#).await.expect("status answers");
    assert_eq!(code, None, "{v}");
    drop(host);
}
