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
//! A bucket every node writes its own keys of (needs, applied, collect) also has a *face*:
//! `FACE_<bucket>`, a stream with the bucket's settings that holds nothing. A node's account
//! maps `STREAM.INFO` of the bucket onto it (deploy/nats-server.conf), because a KV client binds
//! a bucket by asking its stream's info, and the bucket's own info lists every node's keys to
//! whoever asks with a subjects filter.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream};

use crate::error::{Error, ErrorKind, Result};

/// The limits of a bucket made here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The bucket's byte limit: a write past it is refused by the server (discard new).
    pub max_bytes: i64,
    /// The largest value (with its key and headers) one write may carry.
    pub max_value: i32,
}

impl Limits {
    /// 256 MiB: a million needs of ~200 bytes, with room.
    pub const DEFAULT_MAX_BYTES: i64 = 256 << 20;
    /// 64 KiB: the largest legitimate record of a node's buckets is an applied record naming
    /// the revisions of a few hundred values (~20 KiB).
    pub const DEFAULT_MAX_VALUE: i32 = 64 << 10;
    /// 1 MiB: a composition carries a whole plan, and a kept plan is at most a mebibyte.
    pub const COMPOSITION_MAX_VALUE: i32 = 1 << 20;
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_bytes: Self::DEFAULT_MAX_BYTES, max_value: Self::DEFAULT_MAX_VALUE }
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
    pub limits: Limits,
    /// Whether the bucket is shared by writers of their own keys, who bind it through its face.
    pub face: bool,
}

impl Spec {
    pub fn new(bucket: &str, description: &str, history: i64, replicas: usize, limits: Limits) -> Spec {
        let face = SHARED_BUCKETS.contains(&bucket);
        Spec { bucket: bucket.to_string(), description: description.to_string(), history, max_age: Duration::ZERO, replicas, limits, face }
    }

    /// The face of a shared bucket: its settings as a KV client reads them, none of its keys.
    /// It captures one subject of its own that no one is granted, so it stays empty.
    pub fn face_config(&self) -> Option<stream::Config> {
        if !self.face {
            return None;
        }
        Some(stream::Config {
            name: face_stream(&self.bucket),
            description: Some(format!("the face of bucket {}: what a writer's KV client binds; it holds nothing", self.bucket)),
            subjects: vec![format!("mesh-provisioner.face.{}", self.bucket)],
            storage: stream::StorageType::Memory,
            max_bytes: 1024,
            max_messages: 1,
            ..self.stream_config()
        })
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

/// The buckets every node writes its own keys of: each has a face.
pub const SHARED_BUCKETS: [&str; 3] = ["mesh-provisioner_needs", "mesh-provisioner_applied", "mesh-provisioner_collect"];

/// The name of `bucket`'s face stream.
pub fn face_stream(bucket: &str) -> String {
    format!("FACE_{bucket}")
}

/// What a stream is, read as a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// A KV bucket: its subjects exactly `$KV.<bucket>.>`, no mirror, sources, transform or
    /// republish. `unsafe_settings` says what lets one writer remove or crowd out another's
    /// keys (empty when none).
    Bucket { unsafe_settings: Vec<String> },
    /// Not a bucket's stream: never read, and said why.
    Refused(String),
}

/// Reads `config` (the stream `KV_<bucket>`) as a bucket.
pub fn shape(bucket: &str, config: &stream::Config) -> Shape {
    let want = format!("$KV.{bucket}.>");
    if config.subjects.len() != 1 || config.subjects[0] != want {
        return Shape::Refused(format!("stream KV_{bucket} is not a bucket: it captures {:?}, not exactly [{want:?}]", config.subjects));
    }
    if let Some(m) = &config.mirror {
        return Shape::Refused(format!("stream KV_{bucket} is not a bucket: it mirrors stream {}", m.name));
    }
    if let Some(s) = config.sources.as_ref().filter(|s| !s.is_empty()) {
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        return Shape::Refused(format!("stream KV_{bucket} is not a bucket: it sources {names:?}"));
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
    Shape::Bucket { unsafe_settings }
}

/// A stream's settings and state read now; `None` when `bucket` does not exist. An error only
/// when the bus cannot say.
pub async fn stream_info(js: &jetstream::Context, bucket: &str) -> Result<Option<stream::Info>> {
    use async_nats::jetstream::context::GetStreamErrorKind;
    use async_nats::jetstream::ErrorCode;
    bounded(
        || format!("reading the stream of bucket {bucket}"),
        async {
            match js.get_stream(format!("KV_{bucket}")).await {
                Ok(stream) => Ok(Some(stream.cached_info().clone())),
                Err(e) => match e.kind() {
                    GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => Ok(None),
                    _ => Err(Error::new(ErrorKind::Unavailable, format!("bucket {bucket}: {e}"))),
                },
            }
        },
    )
    .await
}

/// Logs each setting of `bucket`'s stream that puts its keys at risk, once per change of them:
/// the one way the host says so, whoever read the stream (an open, a mirror's follower, the
/// audit). With a mirror, they are recorded on it (status and metrics read them there).
pub fn note_unsafe(bucket: &str, mirror: &crate::mirror::Mirror, unsafe_settings: Vec<String>) {
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
    let bucket = spec.bucket.as_str();
    bounded(|| format!("creating bucket {bucket}"), async {
        js.create_stream(spec.stream_config()).await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("creating bucket {bucket}: {e}")))
    })
    .await?;
    ensure_face(js, spec).await?;
    Ok(())
}

/// Makes `spec`'s face if it has one and it does not exist (one attempt, under
/// [`BUS_DEADLINE`]); whether it was made.
pub async fn ensure_face(js: &jetstream::Context, spec: &Spec) -> Result<bool> {
    use async_nats::jetstream::context::GetStreamErrorKind;
    use async_nats::jetstream::ErrorCode;
    let Some(config) = spec.face_config() else { return Ok(false) };
    let bucket = spec.bucket.as_str();
    bounded(|| format!("making the face of bucket {bucket}"), async {
        match js.get_stream(config.name.clone()).await {
            Ok(_) => Ok(false),
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => js
                    .create_stream(config)
                    .await
                    .map(|_| true)
                    .map_err(|e| Error::new(ErrorKind::Unavailable, format!("making the face of bucket {bucket}: {e}"))),
                _ => Err(Error::new(ErrorKind::Unavailable, format!("the face of bucket {bucket}: {e}"))),
            },
        }
    })
    .await
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
        ensure_face(js, spec).await?;
        return Ok(false);
    }
    create_stream(js, spec).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(bucket: &str) -> stream::Config {
        Spec::new(bucket, "test", 1, 1, Limits::default()).stream_config()
    }

    #[test]
    fn a_bucket_made_here_is_a_safe_bucket() {
        let c = made("mesh-provisioner_needs");
        assert_eq!(c.subjects, ["$KV.mesh-provisioner_needs.>"]);
        assert!(!c.allow_rollup && c.deny_delete && c.allow_direct);
        assert_eq!((c.max_bytes, c.max_message_size), (Limits::DEFAULT_MAX_BYTES, Limits::DEFAULT_MAX_VALUE));
        assert_eq!(shape("mesh-provisioner_needs", &c), Shape::Bucket { unsafe_settings: vec![] });
    }

    #[test]
    fn refuses_a_stream_that_is_not_a_bucket() {
        let b = "composed-gamma";
        let wider = stream::Config { subjects: vec!["$KV.composed-gamma.>".into(), "mesh-provisioner.provisioning".into()], ..made(b) };
        let other = stream::Config { subjects: vec!["mesh-provisioner.>".into()], ..made(b) };
        let mirror = stream::Config { mirror: Some(stream::Source { name: "KV_x".into(), ..Default::default() }), ..made(b) };
        let sourced = stream::Config { sources: Some(vec![stream::Source { name: "KV_y".into(), ..Default::default() }]), ..made(b) };
        let republish = stream::Config { republish: Some(stream::Republish { source: ">".into(), destination: "leak.>".into(), headers_only: false }), ..made(b) };
        let no_history = stream::Config { max_messages_per_subject: 0, ..made(b) };
        for (config, says) in [(wider, "captures"), (other, "captures"), (mirror, "mirrors"), (sourced, "sources"), (republish, "republishes"), (no_history, "history")] {
            match shape(b, &config) {
                Shape::Refused(why) => assert!(why.contains(says) && why.contains("KV_composed-gamma"), "{why}"),
                s => panic!("{says}: read as {s:?}"),
            }
        }
    }

    #[test]
    fn names_each_unsafe_setting() {
        let b = "postgres_bound";
        let old = stream::Config { allow_rollup: true, max_bytes: -1, max_message_size: -1, ..made(b) };
        let Shape::Bucket { unsafe_settings } = shape(b, &old) else { panic!("refused") };
        assert_eq!(unsafe_settings.len(), 3, "{unsafe_settings:?}");
        assert!(unsafe_settings[0].contains("roll-ups") && unsafe_settings[1].contains("byte limit") && unsafe_settings[2].contains("value-size"));
    }

    #[test]
    fn a_shared_bucket_has_an_empty_face_with_its_settings_and_no_other_bucket_has_one() {
        let needs = Spec::new("mesh-provisioner_needs", "test", 1, 3, Limits::default());
        let face = needs.face_config().expect("the needs bucket has a face");
        let bucket = needs.stream_config();
        assert_eq!(face.name, "FACE_mesh-provisioner_needs");
        assert_eq!(face.subjects, ["mesh-provisioner.face.mesh-provisioner_needs"]);
        // What a KV client reads of it: one value a key, direct gets, no mirror; the limits shown.
        assert_eq!((face.max_messages_per_subject, face.allow_direct, face.mirror.is_none()), (1, true, true));
        assert_eq!((face.max_message_size, face.num_replicas, face.allow_rollup), (bucket.max_message_size, 3, false));
        assert!(face.max_bytes > 0 && face.max_bytes < 4096 && face.storage == stream::StorageType::Memory);
        for other in ["mesh-provisioner_registry", "mesh-provisioner_seat", "composed-alpha", "postgres_bound"] {
            assert!(Spec::new(other, "test", 1, 1, Limits::default()).face_config().is_none(), "{other} has a face");
        }
    }

    #[test]
    fn a_short_lived_bucket_keeps_its_duplicate_window_within_its_age() {
        let spec = Spec { max_age: Duration::from_secs(10), ..Spec::new("mesh-provisioner_seat", "seat", 1, 1, Limits::default()) };
        assert_eq!(spec.stream_config().duplicate_window, Duration::from_secs(10));
        assert_eq!(made("x").duplicate_window, Duration::from_secs(120));
    }
}
