//! The live puts and deletes that notices are made of, recorded by the backend as its mirrors
//! see them and taken by the notifier (`notices`). Kept apart from both so that the backend
//! (`nats`) records without knowing the notifier, which itself stands on the backend.
//!
//! Waiting events are a bounded map from key to its newest revision: a burst of writes to one
//! key is one event, and past [`MAX_PENDING`] keys new events are dropped, counted and logged.

use crate::base::sync::Locked;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::nats::changes::bucket_matches;
use crate::runtime::ValueEvent;

/// Most keys waiting for their notices; past it new events are dropped (counted and logged).
pub const MAX_PENDING: usize = 100_000;

#[derive(Default)]
struct PendingEvents {
    patterns: Vec<String>,
    events: BTreeMap<(String, String), (u64, bool)>,
}

/// Live puts and deletes of the buckets the guest named, waiting for their notices.
#[derive(Default)]
pub struct Events {
    pending: Mutex<PendingEvents>,
    notify: Notify,
    /// Recording only while this instance holds the seat.
    open: AtomicBool,
    dropped: AtomicU64,
}

impl Events {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PendingEvents> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_only_while_open_and_only_named_buckets() {
        let e = Events::new();
        e.set_patterns(vec!["*_bound".into(), "mesh-config_values".into()]);
        e.record("postgres_bound", "alpha.app.db", 5, false);
        assert!(e.take().is_empty(), "a closed recorder (a standby) records nothing");
        e.set_open(true);
        e.record("postgres_bound", "alpha.app.db", 6, false);
        e.record("postgres_bound", "alpha.app.db", 7, true);
        e.record("mesh-provisioner_needs", "alpha.app.bound.x", 8, false);
        e.record("mesh-config_values", "beta.web.url", 9, false);
        let got = e.take();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].key.as_str(), got[0].revision, got[0].deleted), ("beta.web.url", 9, false));
        assert_eq!((got[1].key.as_str(), got[1].revision, got[1].deleted), ("alpha.app.db", 7, true));
        e.record("postgres_bound", "alpha.app.db", 10, false);
        e.set_open(false);
        assert!(e.take().is_empty(), "losing the seat forgets what waited");
    }

    #[test]
    fn holds_a_bounded_number_of_keys() {
        let e = Events::new();
        e.set_patterns(vec!["b".into()]);
        e.set_open(true);
        for i in 0..MAX_PENDING + 10 {
            e.record("b", &format!("k{i}"), i as u64, false);
        }
        assert_eq!((e.take().len(), e.dropped()), (MAX_PENDING, 10));
    }
}
