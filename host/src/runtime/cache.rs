//! The reply cache: a verb's reply kept with what the call read, and served again — without
//! calling the guest — only while every mirror it read is still the one the backend serves, at
//! the same version (`Mirror::version` moves on every change: a put, a delete, a rebuild, a
//! resync). A call that did anything else — asked discovery, read or kept plans, wrote, logged,
//! read a bucket that is not mirrored — is never kept, nor is an `unavailable` reply. One cache
//! per loaded component (a swap starts empty), so the component's digest is part of every key.
//! Every decision stays the guest's: a hit replays the bytes the guest answered to the same
//! request over the same data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::Backend;
use crate::mirror::Mirror;

use super::Reply;

/// Most replies kept, and most bytes of them: past either, the cache starts again empty.
const MAX_ENTRIES: usize = 4096;
const MAX_BYTES: usize = 32 << 20;

/// A mirror a call read, at the version it had before the read.
pub type Read = (String, Arc<Mirror>, u64);

/// (verb, request body, reply budget)
type Key = (String, Vec<u8>, u32);

/// The replies kept, each with what it read, and their bytes in all.
type Kept = (HashMap<Key, (Reply, Vec<Read>)>, usize);

#[derive(Default)]
pub struct ReplyCache {
    kept: Mutex<Kept>,
}

impl ReplyCache {
    /// The kept reply to this request, if every mirror it read is unchanged.
    pub fn get(&self, backend: &dyn Backend, verb: &str, body: &[u8], max_reply: u32) -> Option<Reply> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept.0.is_empty() {
            return None;
        }
        let (reply, reads) = kept.0.get(&(verb.to_string(), body.to_vec(), max_reply))?;
        let unchanged = reads.iter().all(|(bucket, mirror, version)| {
            backend.current_mirror(bucket).is_some_and(|now| Arc::ptr_eq(&now, mirror)) && mirror.version() == *version
        });
        unchanged.then(|| reply.clone())
    }

    /// Keeps `reply` with what the call read (`None`: it did something a replay could not).
    pub fn put(&self, backend: &dyn Backend, verb: &str, body: &[u8], max_reply: u32, reply: &Reply, reads: Option<Vec<Read>>) {
        let Some(mut reads) = reads else { return };
        if matches!(reply.code, super::ReplyCode::Unavailable) {
            return;
        }
        // One entry per bucket, at its oldest version read; a bucket read from two different
        // mirrors (one replaced mid-call) is not kept.
        reads.sort_by(|a, b| a.0.cmp(&b.0).then(a.2.cmp(&b.2)));
        let mut one: Vec<Read> = Vec::with_capacity(reads.len());
        for r in reads {
            match one.last() {
                Some(last) if last.0 == r.0 => {
                    if !Arc::ptr_eq(&last.1, &r.1) {
                        return;
                    }
                }
                _ => one.push(r),
            }
        }
        // Only mirrors the backend serves: a bucket read as missing has no mirror to watch.
        if !one.iter().all(|(bucket, mirror, _)| backend.current_mirror(bucket).is_some_and(|now| Arc::ptr_eq(&now, mirror))) {
            return;
        }
        let size = body.len() + reply.body.len() + verb.len();
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept.0.len() >= MAX_ENTRIES || kept.1 + size > MAX_BYTES {
            kept.0.clear();
            kept.1 = 0;
        }
        if kept.0.insert((verb.to_string(), body.to_vec(), max_reply), (reply.clone(), one)).is_none() {
            kept.1 += size;
        }
    }
}
