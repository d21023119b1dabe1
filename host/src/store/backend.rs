//! What the guest's imports are backed by: mirrors to read, the registry to write, plans to keep.
//!
//! `nats::NatsBackend` is the real one; [`MemoryBackend`] serves the guest's tests and
//! the `registry` command, which need no bus. Neither knows what a key means.

use crate::base::sync::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use crate::base::error::{Error, ErrorKind, Result};
pub use crate::store::holds::Holds;
use crate::store::kept::KeptPlans;
use crate::store::mirror::Mirror;

/// The bucket the registry writer addresses; the only bucket the guest can write.
pub const REGISTRY_BUCKET: &str = "mesh-provisioner_registry";
/// The bucket of each module's recorded state and since when (SPEC §7.3): written by the seat's
/// holder with the bytes the guest's `transitions` decided, read by the guest as any bucket.
pub const STATES_BUCKET: &str = "mesh-provisioner_states";

pub trait Backend: Send + Sync + 'static {
    /// The mirror of `bucket`, started on first use and in sync when returned.
    fn mirror<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<Arc<Mirror>>>;
    /// Compare-and-set write of the registry (`expected` 0: the key must not exist).
    fn put_registry<'a>(&'a self, key: &'a str, value: Vec<u8>, expected: u64) -> BoxFuture<'a, Result<u64>>;
    /// Compare-and-set delete of a registry key.
    fn delete_registry<'a>(&'a self, key: &'a str, expected: u64) -> BoxFuture<'a, Result<()>>;
    /// Where the guest's plans are kept.
    fn kept(&self) -> &KeptPlans;
    /// How many instances of the micro service `service` answer `$SRV.PING.<service>`, and for
    /// how long a fresh question would count the same (when the backend keeps its counts).
    fn responders<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Count>>;
    /// The services whose responders were counted (what a module's state may depend on beyond
    /// the buckets), in no order.
    fn discovered(&self) -> Vec<String>;
    /// How many buckets are followed now (shown in `$SRV.INFO`).
    fn mirrored(&self) -> usize {
        0
    }
    /// The mirrors followed now, by bucket name (for metrics).
    fn mirrors(&self) -> Vec<(String, Arc<Mirror>)> {
        Vec::new()
    }
    /// Streams found capturing the provisioner's own subjects, each with the subject it
    /// captures (none for a backend without a bus).
    fn captured(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// What one writer (a key's first token) of a bucket whose writers are granted one each
    /// may hold before it is named.
    fn quota(&self) -> crate::store::mirror::Quota {
        crate::store::mirror::Quota::default()
    }

    /// The revision `bucket` holds at its source now (0: it does not exist), asked after this
    /// call: what a consistent read must reflect. A backend without a bus: its mirror's.
    fn bus_revision<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move { Ok(self.mirror(bucket).await?.revision()) })
    }

    /// Waits, until `until`, for the mirrors to reflect revision `want` of `name` (a bucket, or
    /// where the backend has them, a node's share), and says how far they got.
    fn reach<'a>(&'a self, name: &'a str, want: u64, until: std::time::Instant) -> BoxFuture<'a, Result<u64>> {
        let _ = (want, until);
        Box::pin(async move { Ok(self.mirror(name).await?.revision()) })
    }
}

/// A count of a service's responders, and how long it stays the count a fresh question gets.
#[derive(Debug, Clone)]
pub struct Count {
    pub responders: u32,
    pub holds: Option<Holds>,
}

/// A service name as discovery asks it: one subject token, no wildcard, checked before the bus
/// is asked.
pub fn check_service(service: &str) -> Result<()> {
    let ok = !service.is_empty() && service.len() <= 255 && service.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Invalid, format!("{:?} is not a service name", service.chars().take(80).collect::<String>())))
    }
}

/// Bucket names as JetStream accepts them, checked before anything is asked.
pub fn check_bucket(bucket: &str) -> Result<()> {
    let ok = !bucket.is_empty() && bucket.len() <= 255 && bucket.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Invalid, format!("{:?} is not a bucket name", bucket.chars().take(80).collect::<String>())))
    }
}

/// Buckets in memory. Revisions count per bucket, as in a JetStream stream.
pub struct MemoryBackend {
    mirrors: Mutex<HashMap<String, Arc<Mirror>>>,
    /// Each service's responders, and when that count was set (its discovery cache entry).
    services: Mutex<HashMap<String, u32>>,
    /// Moves on every change of a count: a count holds while it has not moved.
    counted: Arc<std::sync::atomic::AtomicU64>,
    writes: Mutex<u64>,
    kept: KeptPlans,
    /// Reads of a bucket through [`Backend::mirror`] (every read the guest makes).
    reads: std::sync::atomic::AtomicU64,
}

impl MemoryBackend {
    /// Plans kept in memory.
    pub fn new() -> Arc<Self> {
        Self::with_kept(KeptPlans::memory())
    }

    /// Plans kept by `kept` (files, to test what a restart or a damaged file does).
    pub fn with_kept(kept: KeptPlans) -> Arc<Self> {
        Arc::new(MemoryBackend {
            mirrors: Mutex::default(),
            services: Mutex::default(),
            counted: Default::default(),
            writes: Mutex::default(),
            kept,
            reads: Default::default(),
        })
    }

    /// The bucket's mirror, created empty and ready if missing.
    pub fn bucket(&self, bucket: &str) -> Arc<Mirror> {
        let mut m = self.mirrors.locked();
        m.entry(bucket.to_string())
            .or_insert_with(|| {
                let mirror = Arc::new(Mirror::new());
                mirror.set_ready(true);
                mirror
            })
            .clone()
    }

    /// The buckets read or written so far, in name order.
    pub fn buckets(&self) -> Vec<String> {
        let m = self.mirrors.locked();
        let mut names: Vec<String> = m.keys().cloned().collect();
        names.sort();
        names
    }

    /// Writes as a node client would: a new revision, no check.
    pub fn put(&self, bucket: &str, key: &str, value: &[u8]) -> u64 {
        let _w = self.writes.locked();
        let m = self.bucket(bucket);
        let rev = m.revision() + 1;
        m.put(key, rev, value);
        rev
    }

    pub fn delete(&self, bucket: &str, key: &str) -> u64 {
        let _w = self.writes.locked();
        let m = self.bucket(bucket);
        let rev = m.revision() + 1;
        m.delete(key, rev);
        rev
    }

    /// Makes `bucket` not exist: empty, and said to be missing.
    pub fn remove_bucket(&self, bucket: &str) {
        self.bucket(bucket).set_missing(true);
    }

    /// Says that `count` instances of `service` answer discovery: a new count, as a discovery
    /// made now (kept until the next).
    pub fn set_responders(&self, service: &str, count: u32) {
        self.services.locked().insert(service.to_string(), count);
        self.counted.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// How many instances of `service` answer discovery (none unless set).
    pub fn responders_of(&self, service: &str) -> u32 {
        self.services.locked().get(service).copied().unwrap_or(0)
    }

    /// How many times a bucket was read through the backend (each of the guest's reads).
    pub fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many registry writes the guest has made.
    pub fn registry_writes(&self) -> u64 {
        *self.writes.locked()
    }

    fn cas(&self, key: &str, value: Option<&[u8]>, expected: u64) -> Result<u64> {
        crate::base::wire::check_subject(key, false)?;
        let mut writes = self.writes.locked();
        let m = self.bucket(REGISTRY_BUCKET);
        let current = m.get(key)?.map(|e| e.revision).unwrap_or(0);
        if current != expected {
            return Err(Error::new(ErrorKind::Conflict, format!("{key} is at revision {current}, not {expected}")));
        }
        let rev = m.revision() + 1;
        match value {
            Some(v) => m.put(key, rev, v),
            None => m.delete(key, rev),
        }
        *writes += 1;
        Ok(rev)
    }
}

impl Backend for MemoryBackend {
    fn mirror<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<Arc<Mirror>>> {
        Box::pin(async move {
            check_bucket(bucket)?;
            self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(self.bucket(bucket))
        })
    }

    fn put_registry<'a>(&'a self, key: &'a str, value: Vec<u8>, expected: u64) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move { self.cas(key, Some(&value), expected) })
    }

    fn delete_registry<'a>(&'a self, key: &'a str, expected: u64) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.cas(key, None, expected).map(|_| ()) })
    }

    fn kept(&self) -> &KeptPlans {
        &self.kept
    }

    fn discovered(&self) -> Vec<String> {
        self.services.locked().keys().cloned().collect()
    }

    fn responders<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Count>> {
        Box::pin(async move {
            check_service(service)?;
            // A count set by hand holds until the next is set (read before the count).
            let seen = self.counted.load(std::sync::atomic::Ordering::Acquire);
            let forever = std::time::Instant::now() + std::time::Duration::from_secs(86_400);
            Ok(Count { responders: self.responders_of(service), holds: Some(Holds::until(forever).while_at(self.counted.clone(), seen)) })
        })
    }
}
