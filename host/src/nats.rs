//! The real backend: NATS JetStream, as the provisioner's own account.
//!
//! Buckets the guest reads are mirrored on first use (a watch with history, replayed before the
//! mirror says it is in sync, resynced from scratch if the watch ends); the registry writer is
//! KV create/update/delete on the expected revision; the bus import is a timed request. Every
//! async-nats failure becomes a host [`Error`] here, by its kind.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use async_nats::Client;
use futures::future::BoxFuture;
use futures::StreamExt;

use crate::backend::{check_bucket, Backend, REGISTRY_BUCKET};
use crate::error::{Error, ErrorKind, Result};
use crate::mirror::Mirror;
use crate::seat::Seat;

/// The buckets the node clients write and the provisioner reads.
pub const CLIENT_BUCKETS: [&str; 3] = ["mesh-provisioner_needs", "mesh-provisioner_applied", "mesh-provisioner_collect"];

/// How long a first use of a bucket may wait for its mirror to replay.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

pub struct NatsBackend {
    client: Client,
    js: jetstream::Context,
    registry: kv::Store,
    mirrors: std::sync::Mutex<HashMap<String, Arc<Mirror>>>,
    /// The seat gating registry writes; none set means this instance may write (tests, tools).
    seat: OnceLock<Arc<Seat>>,
    /// Bumped to make every mirror replay from scratch (after a reconnect).
    resync: tokio::sync::watch::Sender<u64>,
}

impl NatsBackend {
    /// Opens (or creates) the provisioner's buckets with `replicas` replicas.
    pub async fn open(client: Client, replicas: usize) -> Result<Arc<Self>> {
        let js = jetstream::new(client.clone());
        let registry = open_bucket(&js, bucket_config(REGISTRY_BUCKET, "mesh-provisioner: which domain answers each kind", 5, replicas)).await?;
        for b in CLIENT_BUCKETS {
            open_bucket(&js, bucket_config(b, "written by each node's provisioner client", 1, replicas)).await?;
        }
        Ok(Arc::new(NatsBackend {
            client,
            js,
            registry,
            mirrors: Default::default(),
            seat: OnceLock::new(),
            resync: tokio::sync::watch::channel(0).0,
        }))
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
        self.resync.send_modify(|g| *g += 1);
    }

    async fn mirror_of(&self, bucket: &str) -> Result<Arc<Mirror>> {
        let existing = self.mirrors.lock().unwrap_or_else(|p| p.into_inner()).get(bucket).cloned();
        let mirror = match existing {
            Some(m) => m,
            None => {
                check_bucket(bucket)?;
                // Fail fast on a bucket that does not exist rather than wait for a sync.
                self.js.get_key_value(bucket).await.map_err(|e| {
                    Error::new(ErrorKind::Unavailable, format!("bucket {bucket}: {e}"))
                })?;
                let mut map = self.mirrors.lock().unwrap_or_else(|p| p.into_inner());
                match map.get(bucket) {
                    Some(m) => m.clone(),
                    None => {
                        let m = Arc::new(Mirror::new());
                        map.insert(bucket.to_string(), m.clone());
                        tokio::spawn(follow(self.js.clone(), bucket.to_string(), m.clone(), self.resync.subscribe()));
                        m
                    }
                }
            }
        };
        let start = Instant::now();
        while !mirror.is_ready() {
            if start.elapsed() > SYNC_TIMEOUT {
                return Err(Error::new(ErrorKind::Unavailable, format!("the mirror of {bucket} is not in sync")));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(mirror)
    }

    /// Waits (briefly) until the registry mirror shows `revision`, so a reconcile right after
    /// a write reads its own write.
    async fn settle(&self, revision: u64) {
        if let Ok(m) = self.mirror_of(REGISTRY_BUCKET).await {
            let start = Instant::now();
            while m.revision() < revision && start.elapsed() < Duration::from_secs(2) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    fn check_writable(&self) -> Result<()> {
        match self.seat.get() {
            Some(seat) if !seat.is_held() => Err(Error::new(ErrorKind::Denied, "this instance does not hold the seat")),
            _ => Ok(()),
        }
    }
}

/// Opens `config.bucket`, or creates it with `config`, retrying for a while: a cluster's
/// JetStream may still be electing.
pub async fn open_bucket(js: &jetstream::Context, config: kv::Config) -> Result<kv::Store> {
    let start = Instant::now();
    loop {
        let opened = match js.get_key_value(config.bucket.as_str()).await {
            Ok(kv) => Ok(kv),
            Err(_) => js
                .create_key_value(config.clone())
                .await
                .map_err(|e| Error::new(ErrorKind::Unavailable, format!("creating bucket {}: {e}", config.bucket))),
        };
        match opened {
            Ok(kv) => return Ok(kv),
            Err(e) if start.elapsed() < Duration::from_secs(60) => {
                tracing::info!(bucket = config.bucket, "bucket not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A bucket's settings: `history` values kept per key, `replicas` copies.
fn bucket_config(bucket: &str, description: &str, history: i64, replicas: usize) -> kv::Config {
    kv::Config { bucket: bucket.to_string(), description: description.to_string(), history, num_replicas: replicas, ..Default::default() }
}

/// Keeps `mirror` equal to `bucket`, resyncing from scratch whenever the watch ends.
async fn follow(js: jetstream::Context, bucket: String, mirror: Arc<Mirror>, mut resync: tokio::sync::watch::Receiver<u64>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        resync.borrow_and_update();
        let outcome = tokio::select! {
            r = follow_once(&js, &bucket, &mirror) => r,
            _ = resync.changed() => {
                tracing::info!(bucket, "resyncing the mirror");
                mirror.set_ready(false);
                backoff = Duration::from_millis(50);
                continue;
            }
        };
        match outcome {
            Ok(()) => tracing::warn!(bucket, "watch ended; resyncing the mirror"),
            Err(e) => tracing::warn!(bucket, "mirror lost: {e}; resyncing"),
        }
        mirror.set_ready(false);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn follow_once(js: &jetstream::Context, bucket: &str, mirror: &Mirror) -> Result<()> {
    let unavailable = |what: &str, e: &dyn std::fmt::Display| Error::new(ErrorKind::Unavailable, format!("{what} {bucket}: {e}"));
    let kv = js.get_key_value(bucket).await.map_err(|e| unavailable("opening", &e))?;
    let status = kv.status().await.map_err(|e| unavailable("status of", &e))?;
    let mut watch = kv.watch_with_history(">").await.map_err(|e| unavailable("watching", &e))?;
    mirror.clear();
    if status.values() == 0 {
        mirror.set_ready(true);
    }
    let started = Instant::now();
    while let Some(entry) = watch.next().await {
        let entry = entry.map_err(|e| unavailable("watching", &e))?;
        match entry.operation {
            kv::Operation::Put => mirror.put(&entry.key, entry.revision, &entry.value),
            kv::Operation::Delete | kv::Operation::Purge => mirror.delete(&entry.key, entry.revision),
        }
        if entry.delta == 0 && !mirror.is_ready() {
            mirror.set_ready(true);
            tracing::debug!(bucket, keys = mirror.len(), elapsed = ?started.elapsed(), "mirror in sync");
        }
    }
    Ok(())
}

fn create_err(e: kv::CreateError) -> Error {
    let kind = match e.kind() {
        kv::CreateErrorKind::AlreadyExists => ErrorKind::Conflict,
        kv::CreateErrorKind::InvalidKey => ErrorKind::Invalid,
        _ => ErrorKind::Unavailable,
    };
    Error::new(kind, format!("registry create: {e}"))
}

fn update_err(e: kv::UpdateError) -> Error {
    let kind = match e.kind() {
        kv::UpdateErrorKind::WrongLastRevision => ErrorKind::Conflict,
        kv::UpdateErrorKind::InvalidKey => ErrorKind::Invalid,
        kv::UpdateErrorKind::TimedOut => ErrorKind::Timeout,
        _ => ErrorKind::Unavailable,
    };
    Error::new(kind, format!("registry write: {e}"))
}

fn request_err(subject: &str, e: async_nats::RequestError) -> Error {
    let kind = match e.kind() {
        async_nats::RequestErrorKind::NoResponders => ErrorKind::NoResponders,
        async_nats::RequestErrorKind::TimedOut => ErrorKind::Timeout,
        async_nats::RequestErrorKind::InvalidSubject => ErrorKind::Invalid,
        _ => ErrorKind::Unavailable,
    };
    Error::new(kind, format!("request on {subject}: {e}"))
}

impl Backend for NatsBackend {
    fn mirror<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<Arc<Mirror>>> {
        Box::pin(self.mirror_of(bucket))
    }

    fn put_registry<'a>(&'a self, key: &'a str, value: Vec<u8>, expected: u64) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            self.check_writable()?;
            crate::mirror::check_subject(key, false)?;
            let rev = if expected == 0 {
                self.registry.create(key, value.into()).await.map_err(create_err)?
            } else {
                self.registry.update(key, value.into(), expected).await.map_err(update_err)?
            };
            self.settle(rev).await;
            Ok(rev)
        })
    }

    fn delete_registry<'a>(&'a self, key: &'a str, expected: u64) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.check_writable()?;
            crate::mirror::check_subject(key, false)?;
            // The delete's revision is not returned; only the holder writes the registry, so it
            // is the first one after what the mirror shows now.
            let before = self.mirror_of(REGISTRY_BUCKET).await?.revision();
            self.registry.delete_expect_revision(key, Some(expected)).await.map_err(update_err)?;
            self.settle(before + 1).await;
            Ok(())
        })
    }

    fn request<'a>(&'a self, subject: &'a str, body: Vec<u8>, timeout: Duration) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(async move {
            crate::mirror::check_subject(subject, false)?;
            let req = async_nats::Request::new().payload(body.into()).timeout(Some(timeout));
            let msg = self.client.send_request(subject.to_string(), req).await.map_err(|e| request_err(subject, e))?;
            Ok(msg.payload.to_vec())
        })
    }
}
