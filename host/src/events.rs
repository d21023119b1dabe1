//! The live puts and deletes that notices are made of, recorded by the backend as its mirrors
//! see them and taken by the notifier (`notices`). Kept apart from both so that the backend
//! (`nats`) records without knowing the notifier, which itself stands on the backend.
//!
//! Waiting events are a bounded map from key to its newest revision: a burst of writes to one
//! key is one event, and past [`MAX_PENDING`] keys new events are dropped, counted and logged.

use crate::sync::Locked;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::changes::bucket_matches;
use crate::runtime::ValueEvent;

/// Most keys waiting for their notices; past it new events are dropped (counted and logged).
pub const MAX_PENDING: usize = 100_000;

#[derive(Default)]
struct Pending {
    patterns: Vec<String>,
    events: BTreeMap<(String, String), (u64, bool)>,
}

/// Live puts and deletes of the buckets the guest named, waiting for their notices.
#[derive(Default)]
pub struct Events {
    pending: Mutex<Pending>,
    notify: Notify,
    /// Recording only while this instance holds the seat.
    open: AtomicBool,
    dropped: AtomicU64,
}

impl Events {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.locked()
    }

    pub fn set_patterns(&self, patterns: Vec<String>) {
        self.lock().patterns = patterns;
    }

    pub fn patterns(&self) -> Vec<String> {
        self.lock().patterns.clone()
    }

    /// Starts (holding the seat) or stops recording; stopping forgets what waits.
    pub fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::Release);
        if !open {
            self.lock().events.clear();
        }
    }

    /// Records a live put (or delete) of `key` in `bucket` at `revision`, if notices follow it.
    pub fn record(&self, bucket: &str, key: &str, revision: u64, deleted: bool) {
        if !self.open.load(Ordering::Acquire) {
            return;
        }
        let mut p = self.lock();
        if !p.patterns.iter().any(|pat| bucket_matches(pat, bucket)) {
            return;
        }
        let at = (bucket.to_string(), key.to_string());
        if p.events.len() >= MAX_PENDING && !p.events.contains_key(&at) {
            drop(p);
            if self.dropped.fetch_add(1, Ordering::Relaxed).is_multiple_of(10_000) {
                tracing::warn!(bucket, "{MAX_PENDING} changes already wait for their notices: dropping (holders still read `stale` in status)");
            }
            return;
        }
        p.events.insert(at, (revision, deleted));
        drop(p);
        self.notify.notify_one();
    }

    /// Takes every event waiting, in key order.
    pub fn take(&self) -> Vec<ValueEvent> {
        std::mem::take(&mut self.lock().events).into_iter().map(|((bucket, key), (revision, deleted))| ValueEvent { bucket, key, revision, deleted }).collect()
    }

    /// Events dropped because too many waited.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub(crate) async fn next(&self) {
        loop {
            if !self.lock().events.is_empty() {
                return;
            }
            self.notify.notified().await;
        }
    }
}

/// `<prefix><node>`, if `node` is one subject token: a node the guest names can never widen a
/// publish past its own subject (no `.`, `*`, `>`, space or control byte).
pub fn node_subject(prefix: &str, node: &str) -> Option<String> {
    let ok = !node.is_empty() && node.len() <= 256 && node.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'.' | b'*' | b'>'));
    ok.then(|| format!("{prefix}{node}"))
}
