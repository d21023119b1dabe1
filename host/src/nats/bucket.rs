//! A bucket's stream: the settings the mesh's buckets are made with (by `serve` for its own,
//! by `bootstrap` for all), the shape a stream must have to be read as a bucket, and opening a
//! bucket or creating it — the one step the backend (`nats`), the seat (`seat`) and
//! `bootstrap` take before anything else, kept below all three.
//!
//! A bucket is made as a plain stream rather than through async-nats' `create_key_value`,
//! because that always allows roll-ups: with `Nats-Rollup: all` on a write to its own key, any
//! writer of a shared bucket (a node, in the needs) would remove every other writer's keys.
//! Here roll-ups are refused, message deletes by the API are refused (a KV delete is a marker
//! message, which still works), and every bucket has a byte limit and a value-size limit.
//!
//! A bucket every node writes its own keys of (needs, applied, collect) is made by `bootstrap
//! --node` of the nodes' shares ([`Share`]): each node's keys live in a stream of its own,
//! limited, which the bucket's stream sources. Made here without nodes (`serve` finding it
//! missing), it is one stream, as any bucket; `bootstrap` turns it into shares.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream};

use crate::base::error::{Error, ErrorKind, Result};

/// The limits of a bucket made here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketLimits {
    /// The bucket's byte limit: a write past it is refused by the server (discard new).
    pub max_bytes: i64,
    /// The largest value (with its key and headers) one write may carry.
    pub max_value: i32,
}

impl BucketLimits {
    /// 256 MiB: a million needs of ~200 bytes, with room.
    pub const DEFAULT_MAX_BYTES: i64 = 256 << 20;
    /// 64 KiB: the largest legitimate record of a node's buckets is an applied record naming
    /// the revisions of a few hundred values (~20 KiB).
    pub const DEFAULT_MAX_VALUE: i32 = 64 << 10;
    /// 1 MiB: a composition carries a whole plan, and a kept plan is at most a mebibyte.
    pub const COMPOSITION_MAX_VALUE: i32 = 1 << 20;
}

impl Default for BucketLimits {
    fn default() -> Self {
        BucketLimits { max_bytes: Self::DEFAULT_MAX_BYTES, max_value: Self::DEFAULT_MAX_VALUE }
    }
}

/// Everything a bucket is made with.
#[derive(Debug, Clone)]
pub struct Spec {
    pub bucket: String,
    pub description: String,
    /// Values kept per key.
    pub history: i64,
    /// How long a value lives (zero: for ever).
    pub max_age: Duration,
    pub replicas: usize,
    pub limits: BucketLimits,
    /// Whether every node writes its own keys of it (needs, applied, collect): such a bucket is
    /// made of the nodes' shares by `bootstrap --node`.
    pub shared: bool,
}

impl Spec {
    pub fn new(bucket: &str, description: &str, history: i64, replicas: usize, limits: BucketLimits) -> Spec {
        let shared = SHARED_BUCKETS.contains(&bucket);
        Spec { bucket: bucket.to_string(), description: description.to_string(), history, max_age: Duration::ZERO, replicas, limits, shared }
    }

    /// A shared bucket as the sum of `nodes`' shares: no subject of its own, each node's keys
    /// of it sourced from the node's stream, room for every node's whole share.
    pub fn sourced_config(&self, nodes: &[&str], share: Share) -> stream::Config {
        let sources = nodes
            .iter()
            .map(|n| stream::Source { name: node_stream(n), filter_subject: Some(format!("$KV.{}.{n}.>", self.bucket)), ..Default::default() })
            .collect();
        stream::Config {
            subjects: Vec::new(),
            sources: Some(sources),
            max_bytes: share.room().saturating_mul(nodes.len().max(1) as i64),
            // A message its share took must never be refused here for the header sourcing adds
            // (its subject again, and the overhead): the node's sourcing would stop at it.
            max_message_size: self.limits.max_value.saturating_mul(2).saturating_add(Share::SOURCE_OVERHEAD as i32),
            // A sourced message's `Nats-Msg-Id` is checked again here across every node's: the
            // window is kept short, so no node's id can take another's write for a duplicate
            // but by sending it in the same instant.
            duplicate_window: Duration::from_millis(100),
            ..self.stream_config()
        }
    }

    /// The stream this bucket is: a KV bucket's subjects and settings, with roll-ups and API
    /// deletes refused and the limits set.
    pub fn stream_config(&self) -> stream::Config {
        // The server requires a duplicate window no longer than the max age.
        let two_minutes = Duration::from_secs(120);
        let duplicate_window = if self.max_age > Duration::ZERO && self.max_age < two_minutes { self.max_age } else { two_minutes };
        stream::Config {
            name: format!("KV_{}", self.bucket),
            description: Some(self.description.clone()),
            subjects: vec![format!("$KV.{}.>", self.bucket)],
            max_messages_per_subject: self.history,
            max_bytes: self.limits.max_bytes,
            max_message_size: self.limits.max_value,
            max_age: self.max_age,
            duplicate_window,
            storage: stream::StorageType::File,
            num_replicas: self.replicas.max(1),
            discard: stream::DiscardPolicy::New,
            allow_rollup: false,
            deny_delete: true,
            deny_purge: false,
            allow_direct: true,
            ..Default::default()
        }
    }
}

/// Each node's share of the buckets every node writes (SPEC §8: one node's use of storage never
/// refuses another's). Made by `bootstrap --node`: each node's keys of all of them live in a
/// stream of the node's own, `NODE_<node>`, limited to its share (discard new), and each shared
/// bucket's stream has no subject of its own but sources every node's stream, filtered to its
/// keys of that bucket. Readers see the bucket's name and key shapes as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// The bytes a node's keys of the shared buckets may take together.
    pub max_bytes: i64,
    /// The messages (keys and delete markers) it may hold together.
    pub max_keys: i64,
}

impl Share {
    /// 8 MiB: forty thousand needs of ~200 bytes.
    pub const DEFAULT_MAX_BYTES: i64 = 8 << 20;
    pub const DEFAULT_MAX_KEYS: i64 = 16_384;
    /// What a message grows by when a shared bucket sources it, besides its subject again: the
    /// `Nats-Stream-Source` header names the node's stream and sequence (and repeats the
    /// subject, which is at most as long as the message was).
    pub const SOURCE_OVERHEAD: i64 = 384;

    /// The bytes a shared bucket keeps room for, for one node: all of its share were all of it
    /// in this bucket, each message with its subject repeated and the header's overhead. A
    /// shared bucket never fills while each node keeps to its share, so no node's sourcing
    /// stops at a full bucket.
    pub fn room(&self) -> i64 {
        self.max_bytes.saturating_mul(2).saturating_add(self.max_keys.saturating_mul(Self::SOURCE_OVERHEAD))
    }
}

impl Default for Share {
    fn default() -> Self {
        Share { max_bytes: Self::DEFAULT_MAX_BYTES, max_keys: Self::DEFAULT_MAX_KEYS }
    }
}

/// The stream holding `node`'s keys of the shared buckets.
pub fn node_stream(node: &str) -> String {
    format!("NODE_{node}")
}

/// `node`'s stream: its keys of every shared bucket, within its share, with the settings of
/// `spec`, a shared bucket's (one value a key, no roll-ups or API deletes, direct gets).
pub fn node_config(node: &str, share: Share, spec: &Spec) -> stream::Config {
    stream::Config {
        name: node_stream(node),
        description: Some(format!("node {node}'s keys of the shared buckets, within its share")),
        subjects: SHARED_BUCKETS.iter().map(|b| format!("$KV.{b}.{node}.>")).collect(),
        max_bytes: share.max_bytes,
        max_messages: share.max_keys,
        ..spec.stream_config()
    }
}

/// The buckets every node writes its own keys of.
pub const SHARED_BUCKETS: [&str; 3] = ["mesh-provisioner_needs", "mesh-provisioner_applied", "mesh-provisioner_collect"];

/// What a stream is, read as a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// A KV bucket: its subjects exactly `$KV.<bucket>.>`, no mirror, sources, transform or
    /// republish — or, for a shared bucket, no subjects and exactly its nodes' shares as
    /// sources. `unsafe_settings` says what lets one writer remove or crowd out another's keys
    /// (empty when none).
    Bucket { unsafe_settings: Vec<String> },
    /// Not a bucket's stream: never read, and said why.
    Refused(String),
}

/// Reads `config` (the stream `KV_<bucket>`) as a bucket.
pub fn shape(bucket: &str, config: &stream::Config) -> Shape {
    let want = format!("$KV.{bucket}.>");
    let sources = config.sources.as_deref().unwrap_or_default();
    if SHARED_BUCKETS.contains(&bucket) && config.subjects.is_empty() && !sources.is_empty() {
        // Made of its nodes' shares: each source a node's stream, filtered to that node's keys
        // of this bucket, untransformed.
        for s in sources {
            let node = s.name.strip_prefix("NODE_").unwrap_or_default();
            let filter = format!("$KV.{bucket}.{node}.>");
            if node.is_empty() || s.filter_subject.as_deref() != Some(filter.as_str()) || !s.subject_transforms.is_empty() || s.external.is_some() {
                return Shape::Refused(format!("stream KV_{bucket} is not a bucket: it sources {} other than as one node's share ({filter})", s.name));
            }
        }
    } else {
        if config.subjects.len() != 1 || config.subjects[0] != want {
            return Shape::Refused(format!("stream KV_{bucket} is not a bucket: it captures {:?}, not exactly [{want:?}]", config.subjects));
        }
        if !sources.is_empty() {
            let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
            return Shape::Refused(format!("stream KV_{bucket} is not a bucket: it sources {names:?}"));
        }
    }
    if let Some(m) = &config.mirror {
        return Shape::Refused(format!("stream KV_{bucket} is not a bucket: it mirrors stream {}", m.name));
    }
    if config.subject_transform.is_some() {
        return Shape::Refused(format!("stream KV_{bucket} is not a bucket: it transforms its subjects"));
    }
    if let Some(r) = &config.republish {
        return Shape::Refused(format!("stream KV_{bucket} is not a bucket: it republishes its messages to {:?}", r.destination));
    }
    if config.max_messages_per_subject < 1 {
        return Shape::Refused(format!("stream KV_{bucket} is not a bucket: it keeps no history per key"));
    }
    let mut unsafe_settings = Vec::new();
    if config.allow_rollup {
        unsafe_settings.push("allows roll-ups (Nats-Rollup): one writer's write may remove every other writer's keys".to_string());
    }
    if config.max_bytes <= 0 {
        unsafe_settings.push("has no byte limit".to_string());
    }
    if config.max_message_size <= 0 {
        unsafe_settings.push("has no value-size limit".to_string());
    }
    if config.discard == stream::DiscardPolicy::Old {
        unsafe_settings.push("discards its oldest messages when full: one writer's writes evict every other writer's oldest keys".to_string());
    }
    if config.max_messages > 0 {
        unsafe_settings.push(format!("keeps at most {} messages in all: one writer's keys use up every other writer's", config.max_messages));
    }
    Shape::Bucket { unsafe_settings }
}

/// A stream's settings and state read now; `None` when `bucket` does not exist. An error only
/// when the bus cannot say.
pub async fn stream_info(js: &jetstream::Context, bucket: &str) -> Result<Option<stream::Info>> {
    named_stream_info(js, &format!("KV_{bucket}"), &format!("bucket {bucket}")).await
}

/// The stream `name`'s settings and state read now; `None` when it does not exist. `what` names
/// it in an error, which comes only when the bus cannot say.
pub async fn named_stream_info(js: &jetstream::Context, name: &str, what: &str) -> Result<Option<stream::Info>> {
    use async_nats::jetstream::context::GetStreamErrorKind;
    use async_nats::jetstream::ErrorCode;
    bounded(|| format!("reading the stream of {what}"), async {
        match js.get_stream(name).await {
            Ok(stream) => Ok(Some(stream.cached_info().clone())),
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => Ok(None),
                _ => Err(Error::new(ErrorKind::Unavailable, format!("{what}: {e}"))),
            },
        }
    })
    .await
}

/// Logs each setting of `bucket`'s stream that puts its keys at risk, once per change of them:
/// the one way the host says so, whoever read the stream (an open, a mirror's follower, the
/// audit). With a mirror, they are recorded on it (status and metrics read them there).
/// Notes on `mirror` the streams its bucket's stream sources (a shared bucket's nodes' shares),
/// each with its filter, as `config` says.
pub fn note_sources(mirror: &crate::store::mirror::Mirror, config: &async_nats::jetstream::stream::Config) {
    let sources = config.sources.iter().flatten();
    mirror.set_sources(sources.map(|s| (s.name.as_str().into(), s.filter_subject.as_deref().unwrap_or(">").into())).collect());
}

pub fn note_unsafe(bucket: &str, mirror: &crate::store::mirror::Mirror, unsafe_settings: Vec<String>) {
    if mirror.set_unsafe_settings(unsafe_settings.clone()) {
        warn_unsafe(bucket, &unsafe_settings);
    }
}

fn warn_unsafe(bucket: &str, unsafe_settings: &[String]) {
    for why in unsafe_settings {
        tracing::warn!(bucket, "bucket {bucket} {why}: `mesh-provisioner bootstrap` makes it safe");
    }
}

/// Opens `spec.bucket`, or creates it as `spec` says, retrying for a while: a cluster's
/// JetStream may still be electing. A stream of that name that is not a bucket is refused
/// (`Denied`); an unsafe one is opened, and what is unsafe logged.
pub async fn open_bucket(js: &jetstream::Context, spec: &Spec) -> Result<kv::Store> {
    let start = Instant::now();
    loop {
        let opened = match stream_info(js, &spec.bucket).await {
            Ok(Some(info)) => match shape(&spec.bucket, &info.config) {
                Shape::Refused(why) => return Err(Error::new(ErrorKind::Denied, why)),
                Shape::Bucket { unsafe_settings } => js
                    .get_key_value(spec.bucket.as_str())
                    .await
                    .map(|kv| (kv, unsafe_settings))
                    .map_err(|e| Error::new(ErrorKind::Unavailable, format!("opening bucket {}: {e}", spec.bucket))),
            },
            Ok(None) => create(js, spec).await.map(|kv| (kv, Vec::new())),
            Err(e) => Err(e),
        };
        match opened {
            Ok((kv, unsafe_settings)) => {
                warn_unsafe(&spec.bucket, &unsafe_settings);
                return Ok(kv);
            }
            Err(e) if start.elapsed() < Duration::from_secs(60) => {
                tracing::info!(bucket = spec.bucket, "bucket not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Creates `spec.bucket`'s stream (one attempt, under [`BUS_DEADLINE`]).
pub async fn create_stream(js: &jetstream::Context, spec: &Spec) -> Result<()> {
    create_stream_as(js, spec.stream_config(), &format!("bucket {}", spec.bucket)).await
}

/// Creates a stream of `config` (one attempt, under [`BUS_DEADLINE`]); `what` names it in an
/// error.
pub async fn create_stream_as(js: &jetstream::Context, config: stream::Config, what: &str) -> Result<()> {
    bounded(|| format!("creating {what}"), async {
        js.create_stream(config).await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("creating {what}: {e}")))
    })
    .await?;
    Ok(())
}

/// Creates `spec.bucket` and opens it.
async fn create(js: &jetstream::Context, spec: &Spec) -> Result<kv::Store> {
    create_stream(js, spec).await?;
    let bucket = spec.bucket.as_str();
    bounded(|| format!("opening bucket {bucket}"), async {
        js.get_key_value(bucket).await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("opening bucket {bucket}: {e}")))
    })
    .await
}

/// The longest any one bus operation of the host may take: a server that hangs (paused, cut
/// off, electing forever) makes the operation a [`ErrorKind::Timeout`], never a wait. JetStream
/// calls carry async-nats' own timeout too; this bounds what they do not (listings of many
/// pages, watches being set up, a drain).
pub const BUS_DEADLINE: Duration = Duration::from_secs(5);

/// Runs one bus operation under [`BUS_DEADLINE`]; `what` names it in the error.
pub async fn bounded<T>(what: impl FnOnce() -> String, op: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(BUS_DEADLINE, op).await {
        Ok(r) => r,
        Err(_) => Err(Error::new(ErrorKind::Timeout, format!("{}: no answer from the bus within {BUS_DEADLINE:?}", what()))),
    }
}

/// The state of `bucket`'s stream, read now (a `kv::Store`'s status is what was read when it
/// was opened); `None` when the bucket does not exist. An error only when the bus cannot say.
pub async fn stream_state(js: &jetstream::Context, bucket: &str) -> Result<Option<jetstream::stream::State>> {
    Ok(stream_info(js, bucket).await?.map(|info| info.state))
}

/// Creates `spec.bucket` if it does not exist, in one attempt (under [`BUS_DEADLINE`]): how a
/// bucket the bus lost (a server restarted with an empty store) is made again. Whether it was
/// created.
pub async fn ensure_bucket(js: &jetstream::Context, spec: &Spec) -> Result<bool> {
    if stream_state(js, &spec.bucket).await?.is_some() {
        return Ok(false);
    }
    create_stream(js, spec).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(bucket: &str) -> stream::Config {
        Spec::new(bucket, "test", 1, 1, BucketLimits::default()).stream_config()
    }

    #[test]
    fn a_bucket_made_here_is_a_safe_bucket() {
        let c = made("mesh-provisioner_needs");
        assert_eq!(c.subjects, ["$KV.mesh-provisioner_needs.>"]);
        assert!(!c.allow_rollup && c.deny_delete && c.allow_direct);
        assert_eq!((c.max_bytes, c.max_message_size), (BucketLimits::DEFAULT_MAX_BYTES, BucketLimits::DEFAULT_MAX_VALUE));
        assert_eq!(shape("mesh-provisioner_needs", &c), Shape::Bucket { unsafe_settings: vec![] });
    }

    #[test]
    fn refuses_a_stream_that_is_not_a_bucket() {
        let b = "composed-gamma";
        let wider = stream::Config { subjects: vec!["$KV.composed-gamma.>".into(), "mesh-provisioner.provisioning".into()], ..made(b) };
        let other = stream::Config { subjects: vec!["mesh-provisioner.>".into()], ..made(b) };
        let mirror = stream::Config { mirror: Some(stream::Source { name: "KV_x".into(), ..Default::default() }), ..made(b) };
        let sourced = stream::Config { sources: Some(vec![stream::Source { name: "KV_y".into(), ..Default::default() }]), ..made(b) };
        let republish =
            stream::Config { republish: Some(stream::Republish { source: ">".into(), destination: "leak.>".into(), headers_only: false }), ..made(b) };
        let no_history = stream::Config { max_messages_per_subject: 0, ..made(b) };
        for (config, says) in
            [(wider, "captures"), (other, "captures"), (mirror, "mirrors"), (sourced, "sources"), (republish, "republishes"), (no_history, "history")]
        {
            match shape(b, &config) {
                Shape::Refused(why) => assert!(why.contains(says) && why.contains("KV_composed-gamma"), "{why}"),
                s => panic!("{says}: read as {s:?}"),
            }
        }
    }

    #[test]
    fn names_each_unsafe_setting() {
        let b = "postgres_bound";
        let old =
            stream::Config { allow_rollup: true, max_bytes: -1, max_message_size: -1, discard: stream::DiscardPolicy::Old, max_messages: 1000, ..made(b) };
        let Shape::Bucket { unsafe_settings } = shape(b, &old) else { panic!("refused") };
        assert_eq!(unsafe_settings.len(), 5, "{unsafe_settings:?}");
        assert!(unsafe_settings[0].contains("roll-ups") && unsafe_settings[1].contains("byte limit") && unsafe_settings[2].contains("value-size"));
        assert!(unsafe_settings[3].contains("evict"), "{unsafe_settings:?}");
        assert!(unsafe_settings[4].contains("at most 1000 messages"), "{unsafe_settings:?}");
        // The edge: no count limit (-1, or 0 as a config may say it) is safe.
        for none in [-1, 0] {
            assert_eq!(shape(b, &stream::Config { max_messages: none, ..made(b) }), Shape::Bucket { unsafe_settings: vec![] });
        }
    }

    #[test]
    fn a_shared_bucket_is_its_nodes_shares_each_in_a_stream_of_its_own() {
        let share = Share { max_bytes: 1 << 20, max_keys: 100 };
        let needs = Spec::new("mesh-provisioner_needs", "test", 1, 3, BucketLimits::default());
        assert!(needs.shared && !Spec::new("composed-alpha", "test", 1, 1, BucketLimits::default()).shared);
        let node = node_config("alpha", share, &needs);
        assert_eq!(node.name, "NODE_alpha");
        assert_eq!(node.subjects, ["$KV.mesh-provisioner_needs.alpha.>", "$KV.mesh-provisioner_applied.alpha.>", "$KV.mesh-provisioner_collect.alpha.>"]);
        // The bus refuses a write past the share; it never evicts an older key for it.
        assert_eq!((node.max_bytes, node.max_messages, node.discard), (1 << 20, 100, stream::DiscardPolicy::New));
        assert!(!node.allow_rollup && node.deny_delete && node.allow_direct && node.max_messages_per_subject == 1 && node.num_replicas == 3);
        let bucket = needs.sourced_config(&["alpha", "beta"], share);
        assert!(bucket.subjects.is_empty(), "{:?}", bucket.subjects);
        let sources: Vec<(String, Option<String>)> = bucket.sources.iter().flatten().map(|s| (s.name.clone(), s.filter_subject.clone())).collect();
        assert_eq!(
            sources,
            [
                ("NODE_alpha".to_string(), Some("$KV.mesh-provisioner_needs.alpha.>".to_string())),
                ("NODE_beta".to_string(), Some("$KV.mesh-provisioner_needs.beta.>".to_string()))
            ]
        );
        // Room for both nodes' whole shares with their sourcing headers: it never fills first.
        assert_eq!(bucket.max_bytes, 2 * (2 * (1 << 20) + 100 * Share::SOURCE_OVERHEAD));
        assert!(!bucket.allow_rollup && bucket.max_messages_per_subject == 1 && bucket.duplicate_window < Duration::from_secs(1));
        assert_eq!(bucket.max_message_size, 2 * node.max_message_size + Share::SOURCE_OVERHEAD as i32, "a message the share took is never refused sourced");
        assert_eq!(shape("mesh-provisioner_needs", &bucket), Shape::Bucket { unsafe_settings: vec![] });
    }

    #[test]
    fn refuses_a_shared_bucket_that_sources_anything_but_its_nodes_keys() {
        let share = Share::default();
        let b = "mesh-provisioner_applied";
        let made = Spec::new(b, "test", 1, 1, BucketLimits::default()).sourced_config(&["alpha"], share);
        let source = |name: &str, filter: &str| stream::Config {
            sources: Some(vec![stream::Source { name: name.into(), filter_subject: Some(filter.into()), ..Default::default() }]),
            ..made.clone()
        };
        for (config, says) in [
            (source("NODE_alpha", "$KV.mesh-provisioner_applied.beta.>"), "NODE_alpha"),
            (source("NODE_alpha", "$KV.mesh-provisioner_applied.>"), "NODE_alpha"),
            (source("KV_other", "$KV.mesh-provisioner_applied.other.>"), "KV_other"),
            (stream::Config { sources: Some(vec![stream::Source { name: "NODE_alpha".into(), ..Default::default() }]), ..made.clone() }, "NODE_alpha"),
        ] {
            match shape(b, &config) {
                Shape::Refused(why) => assert!(why.contains(says) && why.contains("one node's share"), "{why}"),
                s => panic!("{says}: read as {s:?}"),
            }
        }
        // Sources only make a shared bucket: another bucket that sources is refused as before.
        let composed = stream::Config { name: "KV_composed-alpha".into(), ..made };
        assert!(matches!(shape("composed-alpha", &composed), Shape::Refused(_)));
    }

    #[test]
    fn a_short_lived_bucket_keeps_its_duplicate_window_within_its_age() {
        let spec = Spec { max_age: Duration::from_secs(10), ..Spec::new("mesh-provisioner_seat", "seat", 1, 1, BucketLimits::default()) };
        assert_eq!(spec.stream_config().duplicate_window, Duration::from_secs(10));
        assert_eq!(made("x").duplicate_window, Duration::from_secs(120));
    }
}
