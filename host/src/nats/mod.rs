//! The real backend: NATS JetStream, as the provisioner's own account. This file is its front:
//! `NatsBackend` (opened with its owned buckets), its [`Backend`] implementation, and the
//! settings; each concern behind it has a file of its own:
//!
//! - `follow.rs` — mirrors fed by watches (first use, replay aside, resync, rebuild, eviction);
//! - `listing.rs` — which buckets exist (one shared listing) and which streams capture our subjects;
//! - `watch.rs` — a bucket's watch as a mirror reads it (unfiltered where that reads the same);
//! - `discovery.rs` — `$SRV.PING` counts, kept a few seconds;
//! - `writes.rs` — compare-and-set on the registry and the state records, seat-gated.
//!
//! A bucket that does not exist yet (a node whose engine has composed nothing) reads as empty
//! and is never mirrored. Every async-nats failure becomes a host [`Error`] here, by its kind.

use crate::base::sync::Locked;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use async_nats::Client;
use futures::future::BoxFuture;
use futures::StreamExt;

use crate::base::error::{Error, ErrorKind, Result};
use crate::nats::bucket::{bounded, ensure_bucket, open_bucket, stream_info, BucketLimits, Shape, Spec};
use crate::nats::changes::Changes;
use crate::nats::seat::Seat;
use crate::store::backend::{check_bucket, Backend, Count, Holds, REGISTRY_BUCKET, STATES_BUCKET};
use crate::store::kept::KeptPlans;
use crate::store::mirror::{Mirror, Quota};

pub mod bucket;
pub mod changes;
pub mod claims;
pub mod connect;
mod discovery;
pub mod embedded;
pub mod events;
mod follow;
mod listing;
pub mod mesh;
mod reach;
pub mod seat;
mod watch;
mod writes;

use writes::{cas_put, update_err};

/// The buckets the node clients write and the provisioner reads.
pub const CLIENT_BUCKETS: [&str; 3] = crate::nats::bucket::SHARED_BUCKETS;
/// The buckets every instance keeps mirrored, standby included (so taking over is quick): the
/// registry and the node clients' buckets. An instance is ready when these are in sync.
pub const WARM_BUCKETS: [&str; 4] = [REGISTRY_BUCKET, CLIENT_BUCKETS[0], CLIENT_BUCKETS[1], CLIENT_BUCKETS[2]];

/// Messages the buckets' connection buffers per subscription (async-nats's default: 65 536).
/// A replay's push consumer may have up to 32 MiB of payload outstanding (nats-server's flow
/// control window); at a few dozen bytes a value that is far more than 65 536 messages, and a
/// server that replays faster than the one thread applying them overflowed the buffer: messages
/// dropped as a slow consumer, the replay stalled, started again, and never finished (seen at
/// 1M keys). The buffer grows only while the mirror is behind; flow control bounds it.
pub const SUBSCRIPTION_CAPACITY: usize = 1 << 22;
/// How long a first use of a bucket may wait for its mirror to replay.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// A replay that delivers nothing for this long is started again (noticed within twice this:
/// the replay looks at its one timer when it rings).
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
pub struct BackendOptions {
    /// Replicas of the buckets this server creates.
    pub replicas: usize,
    /// The limits of the node clients' buckets this server creates.
    pub limits: BucketLimits,
    /// The bytes (keys and values) all mirrors together may hold; a mirror whose growth passes
    /// it is dropped and its bucket refused until there is room (0: no budget).
    pub mirror_budget: usize,
    /// What one node may hold of a node clients' bucket before it is named.
    pub quota: Quota,
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions { replicas: 1, limits: BucketLimits::default(), mirror_budget: 0, quota: Quota::default() }
    }
}

/// The bus's buckets as last listed: when, at which creation count, and their names.
type Listing = (Option<(Instant, u64)>, std::collections::HashSet<String>);

pub struct NatsBackend {
    options: BackendOptions,
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
    /// Where the mirrors' snapshots are kept, once set: a mirror's first replay resumes from
    /// its snapshot.
    snapshots: OnceLock<crate::store::snapshot::Snapshots>,
    /// Bumped to make every mirror replay from scratch (after a reconnect).
    resync: tokio::sync::watch::Sender<u64>,
    changes: Arc<Changes>,
    /// The changes of the buckets a module's state depends on (`status-inputs`).
    state_changes: Arc<Changes>,
    events: Arc<crate::nats::events::Events>,
    kept: KeptPlans,
    /// Round trips asking where a bucket stands on the bus (consistent reads), shared.
    flights: reach::Flights,
}

impl NatsBackend {
    /// Opens (or creates) the provisioner's buckets as `options` say; plans are kept by `kept`.
    pub async fn open(client: Client, options: BackendOptions, kept: KeptPlans) -> Result<Arc<Self>> {
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
            snapshots: OnceLock::new(),
            resync: tokio::sync::watch::channel(0).0,
            changes: Arc::new(Changes::new()),
            state_changes: Arc::new(Changes::new()),
            events: Arc::new(crate::nats::events::Events::new()),
            kept,
            flights: reach::Flights::default(),
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

    /// The live changes of the buckets notices come from.
    pub fn events(&self) -> &Arc<crate::nats::events::Events> {
        &self.events
    }

    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// From now on, registry writes need `seat` to be held at the moment of writing.
    pub fn gate_writes(&self, seat: Arc<Seat>) {
        let _ = self.seat.set(seat);
    }

    /// From now on, a mirror's first replay starts from its snapshot in `snapshots`, when it
    /// has one that fits its stream (set before the first mirror is asked for).
    pub fn resume_from(&self, snapshots: crate::store::snapshot::Snapshots) {
        let _ = self.snapshots.set(snapshots);
    }

    /// Where the mirrors' snapshots are kept, if anywhere.
    pub fn snapshots(&self) -> Option<&crate::store::snapshot::Snapshots> {
        self.snapshots.get()
    }

    /// Makes every mirror replay its bucket from scratch; until each is back in sync, reads of
    /// it wait (bounded) and then fail: never a stale answer presented as complete.
    pub fn resync(&self) {
        self.created.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.resync.send_modify(|g| *g += 1);
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
pub fn owned_buckets(options: &BackendOptions) -> Vec<Spec> {
    // A few dozen kinds of a few hundred bytes each, five revisions kept.
    let registry = BucketLimits { max_bytes: 16 << 20, max_value: BucketLimits::DEFAULT_MAX_VALUE };
    let mut all = vec![
        Spec::new(REGISTRY_BUCKET, "mesh-provisioner: which domain answers each kind", 5, options.replicas, registry),
        Spec::new(STATES_BUCKET, "mesh-provisioner: each module's state and since when", 1, options.replicas, options.limits),
    ];
    all.extend(CLIENT_BUCKETS.iter().map(|b| Spec::new(b, "written by each node's provisioner client", 1, options.replicas, options.limits)));
    all
}

impl Backend for NatsBackend {
    fn mirror<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<Arc<Mirror>>> {
        Box::pin(self.mirror_of(bucket))
    }

    fn put_registry<'a>(&'a self, key: &'a str, value: Vec<u8>, expected: u64) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            self.check_writable()?;
            crate::base::wire::check_subject(key, false)?;
            let rev = cas_put(&self.registry, "registry", key, value, expected).await?;
            self.settle(REGISTRY_BUCKET, rev).await;
            Ok(rev)
        })
    }

    fn delete_registry<'a>(&'a self, key: &'a str, expected: u64) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.check_writable()?;
            crate::base::wire::check_subject(key, false)?;
            bounded(|| format!("deleting registry key {key}"), async {
                self.registry.delete_expect_revision(key, Some(expected)).await.map_err(|e| update_err("registry delete", e))
            })
            .await?;
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

    fn bus_revision<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<u64>> {
        Box::pin(self.bus_revision_of(bucket))
    }

    fn reach<'a>(&'a self, name: &'a str, want: u64, until: Instant) -> BoxFuture<'a, Result<u64>> {
        Box::pin(self.reach_mark(name, want, until))
    }

    fn discovered(&self) -> Vec<String> {
        self.discovered.locked().keys().cloned().collect()
    }

    fn responders<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Count>> {
        Box::pin(async move {
            crate::store::backend::check_service(service)?;
            // A kept count is the answer until it expires: nothing replaces it sooner.
            let kept = |at: Instant, responders: u32| Count { responders, holds: Some(Holds::until(at + DISCOVERY_CACHE)) };
            let cached = self.discovered.locked().get(service).copied();
            if let Some((at, n)) = cached.filter(|(at, _)| at.elapsed() < DISCOVERY_CACHE) {
                return Ok(kept(at, n));
            }
            let n = self.discover(service).await?;
            let mut kept_now = self.discovered.locked();
            if kept_now.len() >= DISCOVERY_KEPT {
                kept_now.retain(|_, (at, _)| at.elapsed() < DISCOVERY_CACHE);
            }
            if kept_now.len() < DISCOVERY_KEPT {
                let at = Instant::now();
                kept_now.insert(service.to_string(), (at, n));
                return Ok(kept(at, n));
            }
            Ok(Count { responders: n, holds: None })
        })
    }
}
