//! `verify`: the running server's answers compared with the bus itself (SPEC §8–9).
//!
//! For each served bucket (registry, needs, applied, collect) it reads the bucket straight from
//! the bus — a fresh ordered listing of every key's last message: key, revision, value — and
//! every page of the server's verb over it, and prints each difference: a key the server does
//! not answer, a key it answers that the bus does not hold, a different revision, a different
//! value, a key answered twice. It exits non-zero on any. An operator runs it after an incident;
//! the chaos test runs it after every quiet period.
//!
//! Values are compared as the verb's wire format carries them (SPEC §3: JSON as is, a string
//! marked `utf-8`, base64 marked `base64`, or only the size when `value_omitted`). Keys are
//! compared as bytes: nothing here knows what a key means.
//!
//! Each bucket's stream is looked at too: one that is not a bucket is a difference (the server
//! refuses to read it), and settings that let one writer remove or crowd out another's keys
//! (roll-ups allowed, no byte or value-size limit) are reported as warnings.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use clap::Args;

use crate::base::flags::parse_duration;
use crate::nats::connect::Connect;

use crate::base::error::{Error, ErrorKind, Result};
use crate::nats::bucket::{bounded, shape, stream_info, stream_state, Shape};

/// The buckets the verb serves, by the `what` that lists each.
pub const SERVED: [(&str, &str); 4] = [
    ("registry", "mesh-provisioner_registry"),
    ("needs", "mesh-provisioner_needs"),
    ("applied", "mesh-provisioner_applied"),
    ("collect", "mesh-provisioner_collect"),
];

/// Most pages read of one bucket's answer (at the verb's largest page, millions of keys).
const MAX_PAGES: usize = 100_000;

/// One key's last message, as the bus holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OnBus {
    revision: u64,
    value: Vec<u8>,
}

/// One key as the server answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answered {
    revision: u64,
    /// `None` when the answer carries no value (out of shape, or omitted); then `size`.
    value: Option<Vec<u8>>,
    size: Option<u64>,
}

/// What one bucket's comparison found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub bucket: String,
    pub on_bus: usize,
    pub answered: usize,
    pub differences: Vec<String>,
    /// Settings of the bucket's stream that put its keys at risk.
    pub warnings: Vec<String>,
}

/// Reads every key of `bucket` from the bus: a new ordered consumer over the last message of
/// each subject, read until it has nothing pending. Deleted keys are left out.
async fn read_bus(js: &jetstream::Context, bucket: &str, within: Duration) -> Result<BTreeMap<String, OnBus>> {
    let mut out = BTreeMap::new();
    let Some(state) = stream_state(js, bucket).await? else {
        return Ok(out);
    };
    let unavailable = |e: &dyn std::fmt::Display| Error::new(ErrorKind::Unavailable, format!("reading {bucket} from the bus: {e}"));
    let store = bounded(|| format!("opening {bucket}"), async { js.get_key_value(bucket).await.map_err(|e| unavailable(&e)) }).await?;
    let mut watch = bounded(|| format!("watching {bucket}"), async { store.watch_with_history(">").await.map_err(|e| unavailable(&e)) }).await?;
    if state.messages == 0 {
        return Ok(out);
    }
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let next = tokio::time::timeout_at(deadline, watch.next())
            .await
            .map_err(|_| Error::new(ErrorKind::Timeout, format!("reading {bucket} from the bus took over {within:?}")))?;
        let Some(entry) = next else { break };
        let entry = entry.map_err(|e| unavailable(&e))?;
        match entry.operation {
            kv::Operation::Put => {
                out.insert(entry.key.clone(), OnBus { revision: entry.revision, value: entry.value.to_vec() });
            }
            kv::Operation::Delete | kv::Operation::Purge => {
                out.remove(&entry.key);
            }
        }
        if entry.delta == 0 {
            break;
        }
    }
    Ok(out)
}

#[derive(Deserialize)]
struct ListedPage<'a> {
    #[serde(borrow, default)]
    entries: Vec<&'a RawValue>,
    #[serde(borrow, default)]
    out_of_shape: Vec<&'a RawValue>,
    next: Option<String>,
}

#[derive(Deserialize)]
struct ListedKey<'a> {
    key: String,
    revision: u64,
    #[serde(borrow)]
    value: Option<&'a RawValue>,
    encoding: Option<String>,
    value_omitted: Option<Omitted>,
}

#[derive(Deserialize)]
struct Omitted {
    bytes: u64,
}

/// The bytes an answered value stands for (SPEC §3).
fn decode(raw: &RawValue, encoding: Option<&str>) -> std::result::Result<Vec<u8>, String> {
    use base64::Engine;
    match encoding {
        None => Ok(raw.get().as_bytes().to_vec()),
        Some("utf-8") => serde_json::from_str::<String>(raw.get()).map(String::into_bytes).map_err(|e| format!("a utf-8 value that is not a string: {e}")),
        Some("base64") => {
            let text = serde_json::from_str::<String>(raw.get()).map_err(|e| format!("a base64 value that is not a string: {e}"))?;
            base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| format!("a base64 value that does not decode: {e}"))
        }
        Some(other) => Err(format!("an unknown encoding {other:?}")),
    }
}

/// Every page of the server's answer for `what`: each key once, or a difference naming the key
/// answered twice or an answer that cannot be read.
async fn read_server(client: &async_nats::Client, what: &str, timeout: Duration, differences: &mut Vec<String>) -> Result<BTreeMap<String, Answered>> {
    let mut out = BTreeMap::new();
    let mut body = json!({ "what": what });
    for _ in 0..MAX_PAGES {
        let reply = crate::commands::query::ask_bytes(client, crate::base::wire::PROVISIONING, &body, timeout).await?;
        let page: ListedPage =
            serde_json::from_slice(&reply).map_err(|e| Error::new(ErrorKind::Invalid, format!("an answer for {what} not in the verb's shape: {e}")))?;
        for (raw, in_shape) in page.entries.iter().map(|r| (r, true)).chain(page.out_of_shape.iter().map(|r| (r, false))) {
            let item: ListedKey = match serde_json::from_str(raw.get()) {
                Ok(i) => i,
                Err(e) => {
                    differences.push(format!("an answered item cannot be read ({e}): {}", raw.get().chars().take(200).collect::<String>()));
                    continue;
                }
            };
            let value = match (in_shape, item.value) {
                (true, Some(raw)) => match decode(raw, item.encoding.as_deref()) {
                    Ok(v) => Some(v),
                    Err(why) => {
                        differences.push(format!("{:?}: the server's value is {why}", item.key));
                        continue;
                    }
                },
                _ => None,
            };
            let answered = Answered { revision: item.revision, value, size: item.value_omitted.map(|o| o.bytes) };
            if out.insert(item.key.clone(), answered).is_some() {
                differences.push(format!("{:?}: answered more than once", item.key));
            }
        }
        match page.next {
            Some(next) => body["after"] = json!(next),
            None => return Ok(out),
        }
    }
    Err(Error::new(ErrorKind::Invalid, format!("the answer for {what} did not end within {MAX_PAGES} pages")))
}

/// The differences between a bucket on the bus and the server's answer.
fn compare(bus: &BTreeMap<String, OnBus>, server: &BTreeMap<String, Answered>, differences: &mut Vec<String>) {
    for (key, b) in bus {
        let Some(s) = server.get(key) else {
            differences.push(format!("{key:?}: on the bus at revision {}, not in the server's answer", b.revision));
            continue;
        };
        if s.revision != b.revision {
            differences.push(format!("{key:?}: revision {} on the bus, {} in the server's answer", b.revision, s.revision));
            continue;
        }
        let same = match (&s.value, s.size) {
            (Some(v), _) => *v == b.value || (v.as_slice() == b.value.trim_ascii() && !v.is_empty()),
            (None, Some(size)) => size == b.value.len() as u64,
            // Out of shape: the answer names the key and revision only.
            (None, None) => true,
        };
        if !same {
            differences.push(format!("{key:?}: at revision {} the server's value differs from the bus's ({} bytes)", b.revision, b.value.len()));
        }
    }
    for (key, s) in server {
        if !bus.contains_key(key) {
            differences.push(format!("{key:?}: in the server's answer at revision {}, not on the bus", s.revision));
        }
    }
}

/// Compares one served bucket once.
pub async fn verify_bucket(client: &async_nats::Client, what: &str, bucket: &str, timeout: Duration) -> Result<Report> {
    let js = jetstream::new(client.clone());
    let mut differences = Vec::new();
    let mut warnings = Vec::new();
    if let Some(info) = stream_info(&js, bucket).await? {
        match shape(bucket, &info.config) {
            Shape::Refused(why) => {
                differences.push(format!("the server does not read this bucket: {why}"));
                return Ok(Report { bucket: bucket.to_string(), on_bus: info.state.messages as usize, answered: 0, differences, warnings });
            }
            Shape::Bucket { unsafe_settings } => warnings.extend(unsafe_settings.into_iter().map(|w| format!("bucket {bucket} {w}"))),
        }
    }
    // The server first: a write landing in between shows as the bus being ahead, which a
    // second attempt settles; the other order would show the server ahead.
    let server = read_server(client, what, timeout, &mut differences).await?;
    let bus = read_bus(&js, bucket, timeout * 12).await?;
    compare(&bus, &server, &mut differences);
    Ok(Report { bucket: bucket.to_string(), on_bus: bus.len(), answered: server.len(), differences, warnings })
}

/// Compares every served bucket, each up to `attempts` times (a second apart) while it differs,
/// so writes in flight settle; the last attempt's differences are the ones reported.
pub async fn verify_all(client: &async_nats::Client, attempts: u32, timeout: Duration) -> Result<Vec<Report>> {
    let mut reports = Vec::new();
    for (what, bucket) in SERVED {
        let mut report = verify_bucket(client, what, bucket, timeout).await?;
        for _ in 1..attempts.max(1) {
            if report.differences.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            report = verify_bucket(client, what, bucket, timeout).await?;
        }
        reports.push(report);
    }
    Ok(reports)
}

pub async fn run(v: Verify) -> Result<crate::commands::Exit> {
    let client = crate::nats::connect::connect_cli(&v.connect, "mesh-provisioner verify").await?;
    let reports = verify_all(&client, v.attempts, v.timeout).await?;
    let total: usize = reports.iter().map(|r| r.differences.len()).sum();
    if v.json {
        let buckets: Vec<Value> = reports
            .iter()
            .map(|r| json!({ "bucket": r.bucket, "on_bus": r.on_bus, "answered": r.answered, "differences": r.differences, "warnings": r.warnings }))
            .collect();
        println!("{}", json!({ "buckets": buckets, "differences": total }));
    } else {
        for r in &reports {
            let verdict = if r.differences.is_empty() { "the same".to_string() } else { format!("{} differences", r.differences.len()) };
            use crate::base::visible::visible;
            println!("{}: {} keys on the bus, {} answered: {verdict}", visible(&r.bucket), r.on_bus, r.answered);
            for d in &r.differences {
                println!("  {}", visible(&d.to_string()));
            }
            for w in &r.warnings {
                println!("  warning: {} (`mesh-provisioner bootstrap` makes it safe)", visible(&w.to_string()));
            }
        }
    }
    if total > 0 {
        eprintln!("mesh-provisioner: the server's answers differ from the bus in {total} places");
        return Ok(crate::commands::Exit::Diverged);
    }
    Ok(crate::commands::Exit::Done)
}

#[derive(Args, Debug)]
pub struct Verify {
    /// Compare a bucket again (a second apart) while it differs, up to this many times, so
    /// writes in flight settle.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub attempts: u32,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// How long one page of an answer may take.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub connect: Connect,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bus(items: &[(&str, u64, &[u8])]) -> BTreeMap<String, OnBus> {
        items.iter().map(|(k, r, v)| (k.to_string(), OnBus { revision: *r, value: v.to_vec() })).collect()
    }

    fn answered(items: &[(&str, u64, Option<&[u8]>)]) -> BTreeMap<String, Answered> {
        items.iter().map(|(k, r, v)| (k.to_string(), Answered { revision: *r, value: v.map(<[u8]>::to_vec), size: None })).collect()
    }

    #[test]
    fn names_every_kind_of_difference() {
        let b = bus(&[("a.same", 1, b"{}"), ("a.missing", 2, b"x"), ("a.rev", 3, b"x"), ("a.val", 4, b"old"), ("a.shape", 5, b"x")]);
        let s = answered(&[("a.same", 1, Some(b"{}")), ("a.rev", 2, Some(b"x")), ("a.val", 4, Some(b"new")), ("a.shape", 5, None), ("a.extra", 9, Some(b"x"))]);
        let mut d = Vec::new();
        compare(&b, &s, &mut d);
        assert_eq!(
            d,
            [
                "\"a.missing\": on the bus at revision 2, not in the server's answer",
                "\"a.rev\": revision 3 on the bus, 2 in the server's answer",
                "\"a.val\": at revision 4 the server's value differs from the bus's (3 bytes)",
                "\"a.extra\": in the server's answer at revision 9, not on the bus",
            ]
        );
    }

    #[test]
    fn reads_values_as_the_verb_carries_them() {
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        assert_eq!(decode(&raw(r#"{"a":1}"#), None).unwrap(), br#"{"a":1}"#);
        assert_eq!(decode(&raw(r#""line\nbreak""#), Some("utf-8")).unwrap(), b"line\nbreak");
        assert_eq!(decode(&raw(r#""/w8=""#), Some("base64")).unwrap(), [0xff, 0x0f]);
        assert!(decode(&raw(r#""%%""#), Some("base64")).unwrap_err().contains("does not decode"));
        assert!(decode(&raw("1"), Some("rot13")).unwrap_err().contains("unknown encoding"));
        // JSON with surrounding blanks is passed on without them.
        let mut d = Vec::new();
        compare(&bus(&[("k", 1, b" [1] ")]), &answered(&[("k", 1, Some(b"[1]"))]), &mut d);
        assert!(d.is_empty(), "{d:?}");
    }
}
