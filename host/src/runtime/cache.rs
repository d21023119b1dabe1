//! The reply cache: a verb's reply kept with what the call read, and served again — without
//! calling the guest — only while everything it read would read the same now:
//!
//! - every mirror is still served by the backend (not retired), at the same version
//!   (`Mirror::version` moves on every change: a put, a delete, a rebuild, a resync);
//! - the kept plans' failures are at the same version (`KeptPlans::version` moves on every save
//!   and every failed save); a kept plan read from its file is never kept (nothing versions a
//!   file someone else may change);
//! - every discovery count still holds (its [`Holds`]: the discovery cache's entry not yet
//!   expired), so a fresh call could not have counted otherwise;
//! - a bucket read as missing (not mirrored) still holds (its [`Holds`]: the listing of the
//!   bus's buckets it came from is still the one in use).
//!
//! What a read depends on comes with the read ([`Holding`], [`Count::holds`]), so the
//! backend is never asked afterwards and its trait carries nothing for the cache alone.
//!
//! A call that did anything else — read or kept a plan, wrote, logged, counted responders the
//! discovery cache did not keep — is never kept, nor is an
//! `unavailable` reply. One cache per loaded component (a swap starts empty), so the
//! component's digest is part of every key. Every decision stays the guest's: a hit replays the
//! bytes the guest answered to the same request over the same data.

use crate::sync::Locked;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use crate::backend::{Backend, Count, Holds};
use crate::mirror::{Holding, Mirror};

use super::Reply;

/// Most replies kept, and most bytes of them: past either, the cache starts again empty.
const MAX_ENTRIES: usize = 4096;
const MAX_BYTES: usize = 32 << 20;

/// Something a call read, as it was before the read.
#[derive(Clone)]
pub enum Read {
    /// A bucket's mirror, at its version, served by the backend.
    Mirror { bucket: String, mirror: Arc<Mirror>, version: u64 },
    /// A one-off answer of the backend (a bucket read as missing), while it holds.
    Once { holds: Holds },
    /// The kept plans' failures, at their version.
    Kept { version: u64 },
    /// A count of a service's responders, while it holds.
    Discovery { service: String, holds: Holds },
}

impl Read {
    /// What reading `mirror` of `bucket` now depends on; `None`: nothing could keep it.
    pub fn of_mirror(bucket: &str, mirror: &Arc<Mirror>) -> Option<Read> {
        // The holding first, then the version: a retirement between them moves the version.
        match mirror.holding() {
            Holding::Served => Some(Read::Mirror { bucket: bucket.to_string(), version: mirror.version(), mirror: mirror.clone() }),
            Holding::While(holds) => Some(Read::Once { holds }),
            Holding::Never => None,
        }
    }

    /// What a count of `service`'s responders depends on; `None`: nothing says how long it holds.
    pub fn of_count(service: &str, count: &Count) -> Option<Read> {
        count.holds.clone().map(|holds| Read::Discovery { service: service.to_string(), holds })
    }

    /// What this read was of, for the metrics: the bucket, or its kind.
    fn what(&self) -> &str {
        match self {
            Read::Mirror { bucket, .. } => bucket,
            Read::Once { .. } => "once",
            Read::Discovery { .. } => "discovery",
            Read::Kept { .. } => "kept plans",
        }
    }

    /// Whether a call now would read the same.
    fn unchanged(&self, backend: &dyn Backend) -> bool {
        match self {
            Read::Mirror { mirror, version, .. } => matches!(mirror.holding(), Holding::Served) && mirror.is_ready() && mirror.version() == *version,
            Read::Once { holds } | Read::Discovery { holds, .. } => holds.holds(),
            Read::Kept { version } => backend.kept().version() == *version,
        }
    }
}

/// A kept reply: the request it answers (verb, body, reply budget), the reply, what it read,
/// and the backend it read from (a reply is never served over another: a mirror is served,
/// and a count holds, only for the backend that gave it).
struct Kept {
    backend: std::sync::Weak<dyn Backend>,
    verb: Box<str>,
    body: Box<[u8]>,
    max_reply: u32,
    reply: Reply,
    reads: Vec<Read>,
}

/// The replies kept, by the hash of their request (a lookup builds no key: it hashes the
/// borrowed request and compares), and their bytes in all.
#[derive(Default)]
struct Replies {
    by_hash: HashMap<u64, Vec<Kept>>,
    entries: usize,
    bytes: usize,
}

#[derive(Default)]
pub struct ReplyCache {
    kept: Mutex<Replies>,
    hasher: std::collections::hash_map::RandomState,
    /// Requests being answered by the guest now, by hash: the same request arriving meanwhile
    /// waits for that answer instead of calling the guest too (a stampede when a kept reply
    /// expires under load: 32 requesters each computed the same 20 ms `holders` page).
    flights: Mutex<HashMap<u64, tokio::sync::watch::Receiver<()>>>,
}

/// The one call answering a request while others wait; they are released when it is dropped,
/// however the call ends.
pub struct Flight<'a> {
    cache: &'a ReplyCache,
    hash: u64,
    _done: tokio::sync::watch::Sender<()>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.cache.flights.locked().remove(&self.hash);
    }
}

impl ReplyCache {
    fn hash(&self, verb: &str, body: &[u8], max_reply: u32) -> u64 {
        self.hasher.hash_one((verb, body, max_reply))
    }

    /// Either leads the answer to this request (`Ok`: call the guest, keep the reply, then drop
    /// the flight), or waits, at most `limit`, for the call already answering it and returns
    /// (`Err`) — the caller then looks in the cache again and calls the guest only on a miss.
    pub async fn fly(&self, verb: &str, body: &[u8], max_reply: u32, limit: std::time::Duration) -> Result<Flight<'_>, ()> {
        let hash = self.hash(verb, body, max_reply);
        let mut waiting = {
            let mut flights = self.flights.locked();
            match flights.get(&hash) {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = tokio::sync::watch::channel(());
                    flights.insert(hash, rx);
                    return Ok(Flight { cache: self, hash, _done: tx });
                }
            }
        };
        // Ends when the leader's flight is dropped (the sender with it).
        let _ = tokio::time::timeout(limit, async { while waiting.changed().await.is_ok() {} }).await;
        Err(())
    }

    /// The kept reply to this request, if every mirror it read is unchanged. A hit copies
    /// nothing: the reply's bytes are shared.
    pub fn get(&self, backend: &Arc<dyn Backend>, verb: &str, body: &[u8], max_reply: u32) -> Option<Reply> {
        let kept = self.kept.locked();
        if kept.entries == 0 {
            return None;
        }
        let same = kept.by_hash.get(&self.hash(verb, body, max_reply))?;
        let k = same.iter().find(|k| k.max_reply == max_reply && &*k.verb == verb && &*k.body == body)?;
        // A live `Weak` at the same address is the same backend (a dropped one's never upgrades).
        let same_backend = k.backend.upgrade().is_some_and(|b| Arc::ptr_eq(&b, backend));
        let stale = match same_backend {
            false => Some("backend"),
            true => k.reads.iter().find(|r| !r.unchanged(backend.as_ref())).map(Read::what),
        };
        match stale {
            None => Some(k.reply.clone()),
            Some(what) => {
                // Which read goes stale is what decides how long replies stay: counted.
                crate::metrics::metrics().reply_cache_stale(what);
                None
            }
        }
    }

    /// Keeps `reply` with what the call read (`None`: it did something a replay could not).
    pub fn put(&self, backend: &Arc<dyn Backend>, verb: &str, body: &[u8], max_reply: u32, reply: &Reply, reads: Option<Vec<Read>>) {
        let Some(mut reads) = reads else {
            crate::metrics::metrics().reply_cache_stale("(not kept: read what no replay could)");
            return;
        };
        if matches!(reply.code, super::ReplyCode::Unavailable) {
            return;
        }
        // One entry per mirror, at its oldest version read; a bucket read from two different
        // mirrors (one replaced mid-call) is not kept. Other reads repeated alike (a status
        // page reads the kept plans' version once per module) are checked once.
        let key = |r: &Read| match r {
            Read::Mirror { bucket, version, .. } => (0, bucket.clone(), *version),
            Read::Kept { version } => (1, String::new(), *version),
            Read::Discovery { service, .. } => (2, service.clone(), 0),
            Read::Once { .. } => (3, String::new(), 0),
        };
        reads.sort_by_key(key);
        let mut one: Vec<Read> = Vec::with_capacity(reads.len());
        for r in reads {
            let repeated = match (one.last(), &r) {
                (Some(Read::Mirror { bucket: last, mirror: was, .. }), Read::Mirror { bucket, mirror, .. }) if last == bucket => {
                    if !Arc::ptr_eq(was, mirror) {
                        crate::metrics::metrics().reply_cache_stale("(not kept: a mirror replaced mid-call)");
                        return;
                    }
                    true
                }
                (Some(Read::Kept { version: a }), Read::Kept { version: b }) => a == b,
                (Some(Read::Discovery { service: s, .. }), Read::Discovery { service, .. }) => s == service,
                _ => false,
            };
            if !repeated {
                one.push(r);
            }
        }
        let size = body.len() + reply.body.len() + verb.len();
        let hash = self.hash(verb, body, max_reply);
        let mut kept = self.kept.locked();
        if kept.entries >= MAX_ENTRIES || kept.bytes + size > MAX_BYTES {
            crate::metrics::metrics().reply_cache_stale("(all dropped: the cache was full)");
            *kept = Replies::default();
        }
        let entry = Kept { backend: Arc::downgrade(backend), verb: verb.into(), body: body.into(), max_reply, reply: reply.clone(), reads: one };
        let same = kept.by_hash.entry(hash).or_default();
        match same.iter_mut().find(|k| k.max_reply == max_reply && *k.verb == *verb && *k.body == *body) {
            Some(k) => *k = entry,
            None => {
                same.push(entry);
                kept.entries += 1;
                kept.bytes += size;
            }
        }
    }
}
