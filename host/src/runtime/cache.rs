//! The reply cache: a verb's reply kept with what the call read, and served again — without
//! calling the guest — only while everything it read would read the same now:
//!
//! - every mirror is still served by the backend (not retired), at the same version
//!   (`Mirror::version` moves on every change: a put, a delete, a rebuild, a resync, a change
//!   of its bucket's health or of the streams it sources) — or, for
//!   a reply whose guest said where its revision is ([`RevisionSlot`]), with no change since in
//!   the part of the mirror the call reached ([`Reach`]): a reply for node beta's keys survives
//!   a write to alpha's, served with its revision rewritten to what a fresh call would say (the
//!   newest of the slot's floor and its bucket's revision now; the guest's rule, told per reply);
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
//! bytes the guest answered to the same request over the same data, at most with the digits the
//! guest pointed at rewritten by the guest's own rule.

use crate::base::sync::Locked;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use crate::store::backend::{Backend, Count, Holds};
use crate::store::mirror::{Holding, Mirror, Reach};

use super::{Reply, RevisionSlot};

/// Most replies kept, and most bytes of them: past either, the cache starts again empty.
const MAX_ENTRIES: usize = 4096;
const MAX_BYTES: usize = 32 << 20;

/// Something a call read, as it was before the read.
#[derive(Clone)]
pub enum Read {
    /// A bucket's mirror, at its version, served by the backend: the part of it the call reached.
    Mirror { bucket: String, mirror: Arc<Mirror>, version: u64, reach: Reach },
    /// A one-off answer of the backend (a bucket read as missing), while it holds.
    Once { holds: Holds },
    /// The kept plans' failures, at their version.
    Kept { version: u64 },
    /// A count of a service's responders, while it holds.
    Discovery { service: String, holds: Holds },
}

impl Read {
    /// What reading the `reach` of `mirror` of `bucket` now depends on; `None`: nothing could
    /// keep it.
    pub fn of_mirror(bucket: &str, mirror: &Arc<Mirror>, reach: Reach) -> Option<Read> {
        // The holding first, then the version: a retirement between them moves the version.
        match mirror.holding() {
            Holding::Served => Some(Read::Mirror { bucket: bucket.to_string(), version: mirror.version(), mirror: mirror.clone(), reach }),
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

    /// Whether a call now would read the same: exactly (`Same`), or in what it reached of a
    /// mirror that has changed elsewhere (`Moved`, only when `carried`: the reply can say so).
    fn now(&self, backend: &dyn Backend, carried: bool) -> Now {
        let same = match self {
            Read::Mirror { mirror, version, reach, .. } => {
                if !matches!(mirror.holding(), Holding::Served) || !mirror.is_ready() {
                    false
                } else if mirror.version() == *version {
                    true
                } else if !carried {
                    false
                } else {
                    return match mirror.unchanged_in(reach, *version) {
                        Some((version, revision)) => Now::Moved { version, revision },
                        None => Now::Stale,
                    };
                }
            }
            Read::Once { holds } | Read::Discovery { holds, .. } => holds.holds(),
            Read::Kept { version } => backend.kept().version() == *version,
        };
        if same {
            Now::Same
        } else {
            Now::Stale
        }
    }
}

/// What a kept read reads now.
enum Now {
    Same,
    /// A mirror changed, not where the call read it: at this version, with this revision now.
    Moved {
        version: u64,
        revision: u64,
    },
    Stale,
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

impl Kept {
    /// The reply with its revision as a fresh call would give it, the mirrors read having moved
    /// to these (version, revision)s without a change where the call read them: the newest of
    /// the slot's floor and its bucket's revision now (the guest's rule). `None` when the
    /// rewritten reply would not be the guest's to give: outside its body, or past its budget.
    fn carried(&self, moved: &[(usize, u64, u64)]) -> Option<Reply> {
        let slot = self.reply.revision.as_ref()?;
        let revision = moved
            .iter()
            .filter(|&&(i, ..)| matches!(&self.reads[i], Read::Mirror { bucket, .. } if Some(bucket) == slot.bucket.as_ref()))
            .map(|&(.., revision)| revision)
            .max();
        let Some(revision) = revision else {
            // Its bucket did not move: nor did its revision.
            return Some(self.reply.clone());
        };
        let (at, len) = (slot.offset as usize, slot.len as usize);
        let body = &self.reply.body;
        let end = at.checked_add(len).filter(|&end| end <= body.len())?;
        let digits = revision.max(slot.floor).to_string();
        // The same digits said again further on (the answer's `revisions`), rewritten alike.
        let copy = match slot.copy.map(|c| c as usize) {
            Some(c) => Some(Some(c).filter(|&c| c >= end && c.checked_add(len).is_some_and(|e| e <= body.len()))?),
            None => None,
        };
        let places = 1 + usize::from(copy.is_some());
        let size = body.len() - places * len + places * digits.len();
        if size > self.max_reply as usize {
            return None;
        }
        let mut new = Vec::with_capacity(size);
        new.extend_from_slice(&body[..at]);
        new.extend_from_slice(digits.as_bytes());
        match copy {
            Some(c) => {
                new.extend_from_slice(&body[end..c]);
                new.extend_from_slice(digits.as_bytes());
                new.extend_from_slice(&body[c + len..]);
            }
            None => new.extend_from_slice(&body[end..]),
        }
        let moved = |c: u32| (c as usize + digits.len() - len) as u32;
        let revision = Some(RevisionSlot { len: digits.len() as u32, copy: slot.copy.map(moved), ..slot.clone() });
        Some(Reply { code: self.reply.code, body: new.into(), revision })
    }
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
    /// Requests waiting now for another call's answer.
    waiting: std::sync::atomic::AtomicUsize,
    /// Requests (by hash) whose last answer could not be kept (a read-your-writes wait, a kept
    /// plan read from its file): the same request arriving while one is answered calls the
    /// guest at once, since waiting for that answer would find nothing kept.
    unkept: Mutex<std::collections::HashSet<u64>>,
}

/// Most requests remembered as not kept: past it, the set starts again empty.
const MAX_UNKEPT: usize = 4096;

/// The one call answering a request while others wait; they are released when it is dropped,
/// however the call ends.
pub struct Flight<'a> {
    cache: &'a ReplyCache,
    hash: u64,
    _done: tokio::sync::watch::Sender<()>,
}

/// One request counted among those waiting, until it is dropped.
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
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
        if self.unkept.locked().contains(&hash) {
            return Err(());
        }
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
        // Ends when the leader's flight is dropped (the sender with it). Counted while it waits,
        // however the wait ends (a request dropped meanwhile too).
        let _counted = Waiting::new(&self.waiting);
        let _ = tokio::time::timeout(limit, async { while waiting.changed().await.is_ok() {} }).await;
        Err(())
    }

    /// How many requests wait now for the answer another call is computing.
    pub fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The kept reply to this request, if every mirror it read is unchanged. A hit copies
    /// nothing: the reply's bytes are shared. Why a kept reply is not served is counted only
    /// when `count` (a request's first look, so one request is one count however often it looks).
    pub fn get(&self, backend: &Arc<dyn Backend>, verb: &str, body: &[u8], max_reply: u32, count: bool) -> Option<Reply> {
        let stale = |why: &str| {
            if count {
                crate::base::metrics::metrics().reply_cache_stale(why);
            }
        };
        let mut kept = self.kept.locked();
        if kept.entries == 0 {
            return None;
        }
        let hash = self.hash(verb, body, max_reply);
        let k = kept.by_hash.get_mut(&hash)?.iter_mut().find(|k| k.max_reply == max_reply && &*k.verb == verb && &*k.body == body)?;
        // A live `Weak` at the same address is the same backend (a dropped one's never upgrades).
        if !k.backend.upgrade().is_some_and(|b| Arc::ptr_eq(&b, backend)) {
            stale("backend");
            return None;
        }
        let carried = k.reply.revision.is_some();
        let mut moved: Vec<(usize, u64, u64)> = Vec::new();
        for (i, r) in k.reads.iter().enumerate() {
            match r.now(backend.as_ref(), carried) {
                Now::Same => {}
                Now::Moved { version, revision } => moved.push((i, version, revision)),
                Now::Stale => {
                    // Which read goes stale is what decides how long replies stay: counted.
                    stale(r.what());
                    return None;
                }
            }
        }
        if !moved.is_empty() {
            // Kept again as a fresh call would answer now, so the next hit copies nothing.
            let Some(reply) = k.carried(&moved) else {
                stale("(not carried: its revision would not fit)");
                return None;
            };
            for &(i, now, _) in &moved {
                if let Read::Mirror { version, .. } = &mut k.reads[i] {
                    *version = now;
                }
            }
            k.reply = reply;
            crate::base::metrics::metrics().reply_cache_carried();
        }
        Some(k.reply.clone())
    }

    /// Keeps `reply` with what the call read (`None`: it did something a replay could not).
    pub fn put(&self, backend: &Arc<dyn Backend>, verb: &str, body: &[u8], max_reply: u32, reply: &Reply, reads: Option<Vec<Read>>) {
        let hash = self.hash(verb, body, max_reply);
        let Some(mut reads) = reads else {
            crate::base::metrics::metrics().reply_cache_stale("(not kept: read what no replay could)");
            let mut unkept = self.unkept.locked();
            if unkept.len() >= MAX_UNKEPT {
                unkept.clear();
            }
            unkept.insert(hash);
            return;
        };
        self.unkept.locked().remove(&hash);
        if matches!(reply.code, super::ReplyCode::Unavailable | super::ReplyCode::NotCurrent) {
            return;
        }
        // One entry per mirror, at its oldest version read, reaching all its reads reached; a
        // bucket read from two different mirrors (one replaced mid-call) is not kept. Other
        // reads repeated alike (a status page reads the kept plans' version once per module)
        // are checked once.
        let key = |r: &Read| match r {
            Read::Mirror { bucket, version, .. } => (0, bucket.clone(), *version),
            Read::Kept { version } => (1, String::new(), *version),
            Read::Discovery { service, .. } => (2, service.clone(), 0),
            Read::Once { .. } => (3, String::new(), 0),
        };
        reads.sort_by_key(key);
        let mut one: Vec<Read> = Vec::with_capacity(reads.len());
        for r in reads {
            let repeated = match (one.last_mut(), &r) {
                (Some(Read::Mirror { bucket: last, mirror: was, reach: reached, .. }), Read::Mirror { bucket, mirror, reach, .. }) if last == bucket => {
                    if !Arc::ptr_eq(was, mirror) {
                        crate::base::metrics::metrics().reply_cache_stale("(not kept: a mirror replaced mid-call)");
                        return;
                    }
                    *reached = reached.with(*reach);
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
        let mut kept = self.kept.locked();
        if kept.entries >= MAX_ENTRIES || kept.bytes + size > MAX_BYTES {
            crate::base::metrics::metrics().reply_cache_stale("(all dropped: the cache was full)");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::backend::MemoryBackend;

    #[tokio::test]
    async fn a_request_whose_answer_was_not_kept_never_waits_for_another() {
        let cache = ReplyCache::default();
        let backend: Arc<dyn Backend> = MemoryBackend::new();
        let long = std::time::Duration::from_secs(3600);
        let reply = Reply { code: super::super::ReplyCode::Ok, body: bytes::Bytes::from_static(b"{}"), revision: None };
        let Ok(leader) = cache.fly("v", b"{\"consistent\":true}", 8192, long).await else { panic!("the first leads") };
        // Its answer could not be kept (it waited for the mirrors): the same request, while
        // another is answered, is let through at once rather than held for the hour.
        cache.put(&backend, "v", b"{\"consistent\":true}", 8192, &reply, None);
        let next = tokio::time::timeout(std::time::Duration::from_secs(60), cache.fly("v", b"{\"consistent\":true}", 8192, long)).await;
        assert!(matches!(next, Ok(Err(()))), "let through, not led and not held");
        assert_eq!(cache.waiting(), 0);
        drop(leader);
        // Kept once: the request flies again as any other.
        cache.put(&backend, "v", b"{\"consistent\":true}", 8192, &reply, Some(Vec::new()));
        assert!(cache.fly("v", b"{\"consistent\":true}", 8192, long).await.is_ok(), "leads again");
    }
}
