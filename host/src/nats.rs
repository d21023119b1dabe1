//! The real backend: NATS JetStream, as the provisioner's own account.
//!
//! Buckets the guest reads are mirrored on first use (a watch with history, replayed before the
//! mirror says it is in sync, resynced from scratch if the watch ends). A bucket that does not
//! exist yet (a node whose engine has composed nothing) is an empty mirror, in sync, watched for
//! its creation. Every change a mirror sees is offered to [`Changes`]; the registry writer is
//! KV create/update/delete on the expected revision. Every
//! async-nats failure becomes a host [`Error`] here, by its kind.

use crate::sync::Locked;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use async_nats::Client;
use futures::future::BoxFuture;
use futures::StreamExt;

use crate::backend::{check_bucket, Backend, REGISTRY_BUCKET, STATES_BUCKET};
use crate::bucket::{bounded, ensure_bucket, open_bucket, stream_info, Limits, Shape, Spec};
use crate::changes::Changes;
use crate::error::{Error, ErrorKind, Result};
use crate::kept::KeptPlans;
use crate::mirror::{Mirror, Quota};
use crate::seat::Seat;

/// The buckets the node clients write and the provisioner reads.
pub const CLIENT_BUCKETS: [&str; 3] = ["mesh-provisioner_needs", "mesh-provisioner_applied", "mesh-provisioner_collect"];
/// The buckets every instance keeps mirrored, standby included (so taking over is quick): the
/// registry and the node clients' buckets. An instance is ready when these are in sync.
pub const WARM_BUCKETS: [&str; 4] = [REGISTRY_BUCKET, CLIENT_BUCKETS[0], CLIENT_BUCKETS[1], CLIENT_BUCKETS[2]];

/// How long a first use of a bucket may wait for its mirror to replay.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// A replay that delivers nothing for this long is started again.
const REPLAY_STALL: Duration = Duration::from_secs(5);
/// How often a mirrored bucket that was deleted is looked for again.
const MISSING_POLL: Duration = Duration::from_secs(1);
/// A mirror of a bucket that no longer exists, unread this long, is dropped.
/// (Reading it again costs one listing of the bus's buckets, which says it is missing.)
const MISSING_EVICT: Duration = Duration::from_secs(10);
/// How long a listing of the bus's buckets is used when no creation was announced since (the
/// server's stream-created advisories end it at once; this bounds it if they cannot arrive).
const NAMES_FOR: Duration = Duration::from_secs(5);
/// The server's advisory of each stream created.
const STREAM_CREATED: &str = "$JS.EVENT.ADVISORY.STREAM.CREATED.>";
/// How long a discovery answer is reused: a status page over many modules pings a service once.
const DISCOVERY_CACHE: Duration = Duration::from_secs(3);
/// How long discovery waits for the first responder, and for more after the last one.
const DISCOVERY_WAIT: Duration = Duration::from_millis(250);
const DISCOVERY_SETTLE: Duration = Duration::from_millis(30);
/// Most services whose discovery answers are kept.
const DISCOVERY_KEPT: usize = 1024;
/// Most buckets mirrored at once: the guest names buckets, and each costs a watch.
pub const MAX_MIRRORS: usize = 4096;
/// How often a refused bucket (not a bucket's stream, or dropped for the memory budget) is
/// looked at again.
const REFUSED_POLL: Duration = Duration::from_secs(10);

/// How the backend makes and keeps its buckets.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Replicas of the buckets this server creates.
    pub replicas: usize,
    /// The limits of the node clients' buckets this server creates.
    pub limits: Limits,
    /// The bytes (keys and values) all mirrors together may hold; a mirror whose growth passes
    /// it is dropped and its bucket refused until there is room (0: no budget).
    pub mirror_budget: usize,
    /// What one node may hold of a node clients' bucket before it is named.
    pub quota: Quota,
}

impl Default for Options {
    fn default() -> Self {
        Options { replicas: 1, limits: Limits::default(), mirror_budget: 0, quota: Quota::default() }
    }
}

/// The bus's buckets as last listed: when, at which creation count, and their names.
type Listing = (Option<(Instant, u64)>, std::collections::HashSet<String>);

pub struct NatsBackend {
    options: Options,
    client: Client,
    /// Discovery answers by service: when asked and how many responded.
    discovered: std::sync::Mutex<HashMap<String, (Instant, u32)>>,
    /// Discovery pings sent (each a cache miss).
    pings: std::sync::atomic::AtomicU64,
    js: jetstream::Context,
    registry: kv::Store,
    /// Each module's recorded state (written only by `write_state`, while the seat is held).
    states: kv::Store,
    mirrors: Arc<std::sync::Mutex<HashMap<String, Arc<Mirror>>>>,
    /// The buckets on the bus, as last listed, and when. A bucket not on the bus reads as
    /// empty and is never mirrored: a request naming buckets nobody made costs no mirror, and
    /// no call the account may not make (the stream listing is one call, shared by every read
    /// waiting for it).
    names: tokio::sync::Mutex<Listing>,
    /// Streams announced created (and reconnections): a listing made before the latest is stale.
    created: Arc<std::sync::atomic::AtomicU64>,
    /// Streams found capturing the provisioner's subjects, with the subject (see
    /// [`NatsBackend::captures`]).
    captured: std::sync::Mutex<Vec<(String, String)>>,
    /// The seat gating registry writes; none set means this instance may write (tests, tools).
    seat: OnceLock<Arc<Seat>>,
    /// Bumped to make every mirror replay from scratch (after a reconnect).
    resync: tokio::sync::watch::Sender<u64>,
    changes: Arc<Changes>,
    /// The changes of the buckets a module's state depends on (`status-inputs`).
    state_changes: Arc<Changes>,
    events: Arc<crate::events::Events>,
    kept: KeptPlans,
}

impl NatsBackend {
    /// Opens (or creates) the provisioner's buckets as `options` say; plans are kept by `kept`.
    pub async fn open(client: Client, options: Options, kept: KeptPlans) -> Result<Arc<Self>> {
        let js = jetstream::new(client.clone());
        let (mut registry, mut states) = (None, None);
        for spec in owned_buckets(&options) {
            let store = open_bucket(&js, &spec).await?;
            match spec.bucket.as_str() {
                REGISTRY_BUCKET => registry = Some(store),
                STATES_BUCKET => states = Some(store),
                _ => {}
            }
        }
        let (Some(registry), Some(states)) = (registry, states) else {
            return Err(Error::new(ErrorKind::Config, "the registry and states buckets are not among the owned buckets"));
        };
        Ok(Arc::new(NatsBackend {
            options,
            client,
            discovered: Default::default(),
            pings: Default::default(),
            js,
            registry,
            states,
            mirrors: Default::default(),
            names: Default::default(),
            captured: Default::default(),
            created: Default::default(),
            seat: OnceLock::new(),
            resync: tokio::sync::watch::channel(0).0,
            changes: Arc::new(Changes::new()),
            state_changes: Arc::new(Changes::new()),
            events: Arc::new(crate::events::Events::new()),
            kept,
        }))
    }

    /// Makes again each bucket this server owns that the bus no longer has (a server restarted
    /// with an empty store): the names of those made.
    pub async fn ensure_owned(&self) -> Result<Vec<String>> {
        let mut made = Vec::new();
        for spec in owned_buckets(&self.options) {
            let bucket = spec.bucket.clone();
            if ensure_bucket(&self.js, &spec).await? {
                made.push(bucket);
            }
        }
        if !made.is_empty() {
            // The listing of the bus's buckets is stale, and the mirrors see them at once.
            self.created.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            let mirrors = self.mirrors.locked();
            for b in &made {
                if let Some(m) = mirrors.get(b) {
                    m.request_rebuild();
                }
            }
        }
        Ok(made)
    }

    /// The changes the mirrors have seen of the buckets plans depend on.
    pub fn changes(&self) -> &Arc<Changes> {
        &self.changes
    }

    /// The changes the mirrors have seen of the buckets a module's state depends on.
    pub fn state_changes(&self) -> &Arc<Changes> {
        &self.state_changes
    }

    /// Writes a module's state record as the guest decided it: compare-and-set on `expected`
    /// (0: none may exist), an empty `value` deletes it. Only while the seat is held; the
    /// mirror is waited for (briefly) so the next decision reads this write.
    pub async fn write_state(&self, key: &str, value: Vec<u8>, expected: u64) -> Result<()> {
        self.check_writable()?;
        crate::mirror::check_subject(key, false)?;
        if value.is_empty() {
            // A delete's marker is not the next decision's concern: no record reads as none.
            return bounded(|| format!("deleting state record {key}"), async {
                self.states.delete_expect_revision(key, Some(expected)).await.map_err(|e| update_err("state record delete", e))
            })
            .await;
        }
        let rev = cas_put(&self.states, "state record", key, value, expected).await?;
        self.settle(STATES_BUCKET, rev).await;
        Ok(())
    }

    /// The live changes of the buckets notices come from.
    pub fn events(&self) -> &Arc<crate::events::Events> {
        &self.events
    }

    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// From now on, registry writes need `seat` to be held at the moment of writing.
    pub fn gate_writes(&self, seat: Arc<Seat>) {
        let _ = self.seat.set(seat);
    }

    /// Makes every mirror replay its bucket from scratch; until each is back in sync, reads of
    /// it wait (bounded) and then fail: never a stale answer presented as complete.
    pub fn resync(&self) {
        self.created.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.resync.send_modify(|g| *g += 1);
    }

    async fn mirror_of(&self, bucket: &str) -> Result<Arc<Mirror>> {
        let existing = self.mirrors.locked().get(bucket).cloned();
        let mirror = match existing {
            Some(m) => m,
            None => {
                check_bucket(bucket)?;
                // Fails fast when the bus cannot be asked, rather than wait for a sync.
                if !self.bucket_exists(bucket).await? {
                    let m = Mirror::new();
                    m.set_missing(true);
                    m.set_ready(true);
                    return Ok(Arc::new(m));
                }
                let mut map = self.mirrors.locked();
                match map.get(bucket) {
                    Some(m) => m.clone(),
                    None if map.len() >= MAX_MIRRORS => {
                        return Err(Error::new(ErrorKind::Invalid, format!("{MAX_MIRRORS} buckets are mirrored already; not {bucket}")));
                    }
                    None => {
                        // The node clients' buckets: each node writes `<node>.>`, so a key's
                        // first token is its writer, counted against the quota.
                        let m = Arc::new(if CLIENT_BUCKETS.contains(&bucket) { Mirror::counting_writers() } else { Mirror::new() });
                        map.insert(bucket.to_string(), m.clone());
                        let follower = Follower {
                            budget: self.options.mirror_budget,
                            js: self.js.clone(),
                            bucket: bucket.to_string(),
                            mirror: m.clone(),
                            changes: self.changes.clone(),
                            state_changes: self.state_changes.clone(),
                            events: self.events.clone(),
                            mirrors: self.mirrors.clone(),
                        };
                        tokio::spawn(follower.run(self.resync.subscribe()));
                        m
                    }
                }
            }
        };
        mirror.touch();
        let start = Instant::now();
        while !mirror.is_ready() {
            if start.elapsed() > SYNC_TIMEOUT {
                return Err(Error::new(ErrorKind::Unavailable, format!("the mirror of {bucket} is not in sync")));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if let Some(why) = mirror.refused() {
            return Err(Error::new(ErrorKind::Denied, why));
        }
        Ok(mirror)
    }

    /// Records the streams last found capturing the provisioner's subjects; whether that
    /// changed.
    pub fn set_captures(&self, found: Vec<(String, String)>) -> bool {
        let mut c = self.captured.locked();
        let changed = *c != found;
        *c = found;
        changed
    }

    /// The streams that capture a subject the provisioner answers or publishes on (its verbs,
    /// its notices and events, the micro-service subjects): a requester's answer would be
    /// the stream's publish acknowledgement, a notice would be stored. Each with the subject it
    /// captures.
    pub async fn captures(&self) -> Result<Vec<(String, String)>> {
        #[derive(serde::Deserialize)]
        struct Names {
            streams: Option<Vec<String>>,
        }
        let mut found = Vec::new();
        for subject in CAPTURED_NEVER {
            let names: jetstream::response::Response<Names> = bounded(
                || format!("listing streams that capture {subject}"),
                async {
                    self.js
                        .request("STREAM.NAMES", &serde_json::json!({ "subject": subject }))
                        .await
                        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("listing streams that capture {subject}: {e}")))
                },
            )
            .await?;
            match names {
                jetstream::response::Response::Ok(n) => found.extend(n.streams.unwrap_or_default().into_iter().map(|s| (s, subject.to_string()))),
                jetstream::response::Response::Err { error } => {
                    return Err(Error::new(ErrorKind::Unavailable, format!("listing streams that capture {subject}: {error}")))
                }
            }
        }
        found.sort();
        found.dedup_by(|a, b| a.0 == b.0);
        Ok(found)
    }

    /// Follows the server's stream-created advisories, so that a listing of the buckets is
    /// known stale the moment a bucket is made.
    pub async fn follow_creations(self: &Arc<Self>) {
        match self.client.subscribe(STREAM_CREATED).await {
            Ok(mut sub) => {
                let created = self.created.clone();
                tokio::spawn(async move {
                    while sub.next().await.is_some() {
                        created.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    }
                });
            }
            Err(e) => tracing::warn!("not following stream creations ({e}): new buckets are seen within {NAMES_FOR:?}"),
        }
    }

    /// The bus's buckets, by a listing of its streams made since the last creation announced
    /// and at most [`NAMES_FOR`] ago (one listing at a time; those waiting share it). Every
    /// question of which buckets exist — a read of one not yet mirrored, the notice and plan
    /// inputs' patterns — is answered from this one listing.
    async fn listing(&self) -> Result<tokio::sync::MutexGuard<'_, Listing>> {
        let mut names = self.names.lock().await;
        // Read after the lock: a creation announced while waiting for it makes a new listing.
        let generation = self.created.load(std::sync::atomic::Ordering::Acquire);
        if matches!(names.0, Some((at, g)) if g == generation && at.elapsed() < NAMES_FOR) {
            return Ok(names);
        }
        let listed_at = Instant::now();
        let listed = bounded(|| "listing the buckets".to_string(), async {
            let mut listed = std::collections::HashSet::new();
            let mut streams = self.js.stream_names();
            while let Some(name) = streams.next().await {
                let name = name.map_err(|e| Error::new(ErrorKind::Unavailable, format!("listing the buckets: {e}")))?;
                if let Some(b) = name.strip_prefix("KV_") {
                    listed.insert(b.to_string());
                }
            }
            Ok(listed)
        })
        .await?;
        *names = (Some((listed_at, generation)), listed);
        Ok(names)
    }

    /// Whether `bucket` is on the bus now (see [`NatsBackend::listing`]).
    async fn bucket_exists(&self, bucket: &str) -> Result<bool> {
        Ok(self.listing().await?.1.contains(bucket))
    }

    /// The buckets on the bus that `patterns` name (a name, or one `*` in a name), at most
    /// [`MAX_MIRRORS`] of them.
    pub async fn buckets_matching(&self, patterns: &[String]) -> Result<Vec<String>> {
        let names = self.listing().await?;
        let mut out: Vec<String> = names.1.iter().filter(|b| patterns.iter().any(|p| crate::changes::bucket_matches(p, b))).cloned().collect();
        out.sort();
        out.truncate(MAX_MIRRORS);
        Ok(out)
    }

    /// Waits (briefly) until the mirror of `bucket` shows `revision`, so a reconcile (or the
    /// next state decision) right after a write reads its own write.
    async fn settle(&self, bucket: &str, revision: u64) {
        if let Ok(m) = self.mirror_of(bucket).await {
            let start = Instant::now();
            while m.revision() < revision && start.elapsed() < Duration::from_secs(2) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    /// Discovery pings sent so far (cache misses).
    pub fn pings(&self) -> u64 {
        self.pings.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Pings `$SRV.PING.<service>` and counts the distinct instances that answer: wait for the
    /// first up to [`DISCOVERY_WAIT`], then for more until none came for [`DISCOVERY_SETTLE`].
    /// With the connection down the answer is unknown (an error), never "none".
    async fn discover(&self, service: &str) -> Result<u32> {
        let down = |why: String| Error::new(ErrorKind::Unavailable, format!("discovery of {service}: {why}"));
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(down("not connected to the bus".into()));
        }
        let inbox = self.client.new_inbox();
        let mut replies = self.client.subscribe(inbox.clone()).await.map_err(|e| down(e.to_string()))?;
        self.client
            .publish_with_reply(format!("$SRV.PING.{service}"), inbox, bytes::Bytes::new())
            .await
            .map_err(|e| down(e.to_string()))?;
        self.pings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        let mut ids = std::collections::HashSet::new();
        let mut until = started + DISCOVERY_WAIT;
        while let Ok(reply) = tokio::time::timeout_at(until, replies.next()).await {
            let Some(m) = reply else { return Err(down("the reply subscription ended".into())) };
            if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                break;
            }
            // Each instance names itself; an answer without an id still counts once.
            let id = serde_json::from_slice::<serde_json::Value>(&m.payload).ok().and_then(|v| v["id"].as_str().map(str::to_string));
            ids.insert(id.unwrap_or_else(|| format!("anonymous-{}", ids.len())));
            until = (tokio::time::Instant::now() + DISCOVERY_SETTLE).min(started + DISCOVERY_WAIT);
        }
        let _ = replies.unsubscribe().await;
        Ok(ids.len() as u32)
    }

    fn check_writable(&self) -> Result<()> {
        match self.seat.get() {
            Some(seat) if !seat.is_held() => Err(Error::new(ErrorKind::Denied, "this instance does not hold the seat")),
            _ => Ok(()),
        }
    }
}

/// Subjects no stream may capture: the verbs, the notices and events, the micro-service
/// protocol.
pub const CAPTURED_NEVER: [&str; 2] = ["mesh-provisioner.>", "$SRV.>"];

/// The buckets this server creates (the registry first), with their settings.
pub fn owned_buckets(options: &Options) -> Vec<Spec> {
    // A few dozen kinds of a few hundred bytes each, five revisions kept.
    let registry = Limits { max_bytes: 16 << 20, max_value: Limits::DEFAULT_MAX_VALUE };
    let mut all = vec![
        Spec::new(REGISTRY_BUCKET, "mesh-provisioner: which domain answers each kind", 5, options.replicas, registry),
        Spec::new(STATES_BUCKET, "mesh-provisioner: each module's state and since when", 1, options.replicas, options.limits),
    ];
    all.extend(CLIENT_BUCKETS.iter().map(|b| Spec::new(b, "written by each node's provisioner client", 1, options.replicas, options.limits)));
    all
}

/// How one follow of a bucket ended.
enum Followed {
    /// The watch ended or failed: replay from scratch.
    Lost(Result<()>),
    /// The bucket does not exist (any more): the mirror is empty and in sync.
    Missing,
    /// The bucket is not read (see [`Mirror::set_refused`]), for this reason.
    Refused(String),
}

/// Keeps one mirror equal to its bucket.
struct Follower {
    /// The bytes all mirrors may hold (0: no budget).
    budget: usize,
    js: jetstream::Context,
    bucket: String,
    mirror: Arc<Mirror>,
    changes: Arc<Changes>,
    state_changes: Arc<Changes>,
    events: Arc<crate::events::Events>,
    /// The mirrors, to drop this one from when its bucket is gone and nobody reads it.
    mirrors: Arc<std::sync::Mutex<HashMap<String, Arc<Mirror>>>>,
}

impl Follower {
    /// Offers a change (`None`: the whole bucket) to the plans and the states that follow it.
    fn record(&self, key: Option<&str>) {
        self.changes.record(&self.bucket, key);
        self.state_changes.record(&self.bucket, key);
    }

    /// Follows the bucket, resyncing from scratch whenever the watch ends, and looking again
    /// every [`MISSING_POLL`] for a bucket that does not exist.
    async fn run(self, mut resync: tokio::sync::watch::Receiver<u64>) {
        let mut backoff = Duration::from_millis(50);
        // Whether the mirror already shows the bucket as missing (empty and in sync).
        let mut was_missing = false;
        loop {
            resync.borrow_and_update();
            let outcome = tokio::select! {
                r = self.once() => r,
                _ = resync.changed() => {
                    tracing::info!(bucket = self.bucket, "resyncing the mirror");
                    self.mirror.set_ready(false);
                    backoff = Duration::from_millis(50);
                    was_missing = false;
                    continue;
                }
                // An audit found the mirror diverged: rebuild it aside, answering from it
                // meanwhile.
                _ = self.mirror.rebuild_requested() => {
                    tracing::info!(bucket = self.bucket, "rebuilding the mirror from the bucket");
                    backoff = Duration::from_millis(50);
                    was_missing = false;
                    continue;
                }
            };
            match outcome {
                Followed::Refused(why) => {
                    if self.mirror.set_refused(Some(why.clone())) {
                        tracing::error!(bucket = self.bucket, "bucket refused: {why}");
                        self.record(None);
                    }
                    self.mirror.set_ready(true);
                    was_missing = false;
                    tokio::select! {
                        _ = tokio::time::sleep(REFUSED_POLL) => {},
                        _ = resync.changed() => {},
                        _ = self.mirror.rebuild_requested() => {},
                    }
                    continue;
                }
                Followed::Missing => {
                    if !was_missing {
                        self.mirror.set_refused(None);
                        self.mirror.clear();
                        self.mirror.set_missing(true);
                        self.mirror.set_ready(true);
                        self.record(None);
                        tracing::debug!(bucket = self.bucket, "bucket does not exist yet: mirrored as empty");
                    }
                    was_missing = true;
                    if self.mirror.unread_for() > MISSING_EVICT {
                        let mut map = self.mirrors.locked();
                        if map.get(&self.bucket).is_some_and(|m| Arc::ptr_eq(m, &self.mirror)) {
                            map.remove(&self.bucket);
                        }
                        tracing::info!(bucket = self.bucket, "the bucket is gone and nobody reads it: mirror dropped");
                        return;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(MISSING_POLL) => {},
                        _ = resync.changed() => {},
                        _ = self.mirror.rebuild_requested() => {},
                    }
                    continue;
                }
                Followed::Lost(Ok(())) => tracing::warn!(bucket = self.bucket, "watch ended; resyncing the mirror"),
                Followed::Lost(Err(e)) => tracing::warn!(bucket = self.bucket, "mirror lost: {e}; resyncing"),
            }
            was_missing = false;
            self.mirror.set_ready(false);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// Replays the bucket into a copy built aside and, once that copy is in sync, makes it the
    /// mirror in one step (readers see the old contents until then, never a half-built
    /// mirror); then follows the bucket live until the watch ends.
    async fn once(&self) -> Followed {
        let (bucket, mirror) = (self.bucket.as_str(), &self.mirror);
        let unavailable = |what: &str, e: &dyn std::fmt::Display| Error::new(ErrorKind::Unavailable, format!("{what} {bucket}: {e}"));
        match stream_info(&self.js, bucket).await {
            Ok(Some(info)) => match crate::bucket::shape(bucket, &info.config) {
                Shape::Refused(why) => return Followed::Refused(why),
                Shape::Bucket { unsafe_settings } => crate::bucket::note_unsafe(bucket, mirror, unsafe_settings),
            },
            Ok(None) => return Followed::Missing,
            Err(e) => return Followed::Lost(Err(e)),
        }
        let opened = bounded(
            || format!("watching {bucket}"),
            async {
                let kv = self.js.get_key_value(bucket).await.map_err(|e| unavailable("opening", &e))?;
                // The watch first, then the state: a bucket emptied between the two reads as
                // empty (ready at once), where the other order would wait for a replay of
                // nothing. The state is read fresh: a store's status is as of its opening.
                let watch = kv.watch_with_history(">").await.map_err(|e| unavailable("watching", &e))?;
                let state = crate::bucket::stream_state(&self.js, bucket).await?.ok_or_else(|| Error::new(ErrorKind::Unavailable, format!("bucket {bucket} was deleted while its watch started")))?;
                Ok::<_, Error>((state, watch))
            },
        );
        let (state, mut watch) = match opened.await {
            Ok(o) => o,
            Err(e) => return Followed::Lost(Err(e)),
        };
        let staged = mirror.like();
        // The stream's last revision, even when its newest messages are gone (expired,
        // purged): the mirror is then as far as the stream, not behind it.
        staged.note_revision(state.last_sequence);
        let mut live = false;
        let started = Instant::now();
        if state.messages == 0 {
            mirror.adopt(&staged);
            live = true;
            self.record(None);
        }
        loop {
            let next = if live {
                watch.next().await
            } else {
                // A replay that stalls (the messages it was to deliver expired meanwhile) is
                // started again rather than waited for.
                match tokio::time::timeout(REPLAY_STALL, watch.next()).await {
                    Ok(next) => next,
                    Err(_) => return Followed::Lost(Err(Error::new(ErrorKind::Timeout, format!("the replay of {bucket} stalled for {REPLAY_STALL:?}")))),
                }
            };
            let Some(entry) = next else { break };
            let entry = match entry {
                Ok(e) => e,
                Err(e) => return Followed::Lost(Err(unavailable("watching", &e))),
            };
            let target = if live { mirror.as_ref() } else { &staged };
            target.set_lag(entry.delta);
            let deleted = match entry.operation {
                kv::Operation::Put => {
                    target.put(&entry.key, entry.revision, &entry.value);
                    if self.budget > 0 && crate::mirror::total_bytes() > self.budget {
                        // Dropped rather than grown until the process is killed: this bucket
                        // is refused (said in /readyz, status and the metrics) until there is
                        // room again.
                        staged.clear();
                        let why = format!("the mirrors' memory budget of {} bytes is spent: {bucket} is not mirrored until there is room", self.budget);
                        return Followed::Refused(why);
                    }
                    false
                }
                kv::Operation::Delete | kv::Operation::Purge => {
                    target.delete(&entry.key, entry.revision);
                    true
                }
            };
            if live {
                // Live, not replayed: plans may move, and holders are told.
                self.record(Some(&entry.key));
                self.events.record(bucket, &entry.key, entry.revision, deleted);
            } else if entry.delta == 0 {
                mirror.adopt(&staged);
                live = true;
                self.record(None);
                tracing::debug!(bucket, keys = mirror.len(), elapsed = ?started.elapsed(), "mirror in sync");
            }
        }
        Followed::Lost(Ok(()))
    }
}

/// A compare-and-set write of `key` in `store` (`what` names the bucket in errors): created
/// when `expected` is 0, else updated from that revision; the new revision.
async fn cas_put(store: &kv::Store, what: &str, key: &str, value: Vec<u8>, expected: u64) -> Result<u64> {
    bounded(|| format!("writing {what} key {key}"), async {
        if expected == 0 {
            store.create(key, value.into()).await.map_err(|e| create_err(&format!("{what} create"), e))
        } else {
            store.update(key, value.into(), expected).await.map_err(|e| update_err(&format!("{what} write"), e))
        }
    })
    .await
}

fn create_err(what: &str, e: kv::CreateError) -> Error {
    let kind = match e.kind() {
        kv::CreateErrorKind::AlreadyExists => ErrorKind::Conflict,
        kv::CreateErrorKind::InvalidKey => ErrorKind::Invalid,
        _ => ErrorKind::Unavailable,
    };
    Error::new(kind, format!("{what}: {e}"))
}

fn update_err(what: &str, e: kv::UpdateError) -> Error {
    let kind = match e.kind() {
        kv::UpdateErrorKind::WrongLastRevision => ErrorKind::Conflict,
        kv::UpdateErrorKind::InvalidKey => ErrorKind::Invalid,
        kv::UpdateErrorKind::TimedOut => ErrorKind::Timeout,
        _ => ErrorKind::Unavailable,
    };
    Error::new(kind, format!("{what}: {e}"))
}

impl Backend for NatsBackend {
    fn current_mirror(&self, bucket: &str) -> Option<Arc<Mirror>> {
        self.mirrors.locked().get(bucket).cloned().filter(|m| m.is_ready())
    }

    fn mirror<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<Arc<Mirror>>> {
        Box::pin(self.mirror_of(bucket))
    }

    fn put_registry<'a>(&'a self, key: &'a str, value: Vec<u8>, expected: u64) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            self.check_writable()?;
            crate::mirror::check_subject(key, false)?;
            let rev = cas_put(&self.registry, "registry", key, value, expected).await?;
            self.settle(REGISTRY_BUCKET, rev).await;
            Ok(rev)
        })
    }

    fn delete_registry<'a>(&'a self, key: &'a str, expected: u64) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.check_writable()?;
            crate::mirror::check_subject(key, false)?;
            bounded(|| format!("deleting registry key {key}"), async { self.registry.delete_expect_revision(key, Some(expected)).await.map_err(|e| update_err("registry delete", e)) }).await?;
            // The delete's revision is not returned: its marker, read back, has it.
            let marker = bounded(|| format!("reading registry key {key}"), async {
                self.registry.entry(key).await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("reading registry key {key}: {e}")))
            })
            .await?;
            if let Some(m) = marker {
                self.settle(REGISTRY_BUCKET, m.revision).await;
            }
            Ok(())
        })
    }

    fn mirrors(&self) -> Vec<(String, Arc<Mirror>)> {
        let map = self.mirrors.locked();
        let mut all: Vec<(String, Arc<Mirror>)> = map.iter().map(|(b, m)| (b.clone(), m.clone())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    fn mirrored(&self) -> usize {
        self.mirrors.locked().len()
    }

    fn kept(&self) -> &KeptPlans {
        &self.kept
    }

    fn captured(&self) -> Vec<(String, String)> {
        self.captured.locked().clone()
    }

    fn quota(&self) -> Quota {
        self.options.quota
    }

    fn listing_stamp(&self) -> Option<(Instant, u64)> {
        // Never waits: a listing being made now is not the one a cached reply read.
        let names = self.names.try_lock().ok()?;
        let generation = self.created.load(std::sync::atomic::Ordering::Acquire);
        names.0.filter(|(at, g)| *g == generation && at.elapsed() < NAMES_FOR)
    }

    fn discovered_at(&self, service: &str) -> Option<Instant> {
        let kept = self.discovered.locked();
        kept.get(service).map(|(at, _)| *at).filter(|at| at.elapsed() < DISCOVERY_CACHE)
    }

    fn responders<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<u32>> {
        Box::pin(async move {
            crate::backend::check_service(service)?;
            let cached = self.discovered.locked().get(service).copied();
            if let Some((_, n)) = cached.filter(|(at, _)| at.elapsed() < DISCOVERY_CACHE) {
                return Ok(n);
            }
            let n = self.discover(service).await?;
            let mut kept = self.discovered.locked();
            if kept.len() >= DISCOVERY_KEPT {
                kept.retain(|_, (at, _)| at.elapsed() < DISCOVERY_CACHE);
            }
            if kept.len() < DISCOVERY_KEPT {
                kept.insert(service.to_string(), (Instant::now(), n));
            }
            Ok(n)
        })
    }
}
