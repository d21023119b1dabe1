//! Changes of the buckets plans depend on, gathered for the guest's `refresh`.
//!
//! The guest names the buckets (`plan-inputs`: names, or a prefix ending in `*`); mirrors
//! record each put or delete of a matching bucket here, and a whole-bucket change when a mirror
//! (re)plays. PendingChanges changes are a set, so a burst of writes to one key is one change; past
//! [`MAX_PENDING`] each bucket's keys collapse into one whole-bucket change, so memory stays
//! bounded whatever the writers do. The host matches bucket names only: what a key means is the
//! guest's business.

use crate::base::sync::Locked;
use std::collections::BTreeSet;
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::runtime::Change;

/// Most keyed changes held before a bucket's collapse into one whole-bucket change.
pub const MAX_PENDING: usize = 10_000;

#[derive(Default)]
struct PendingChanges {
    patterns: Vec<String>,
    set: BTreeSet<Change>,
}

#[derive(Default)]
pub struct Changes {
    pending: Mutex<PendingChanges>,
    notify: Notify,
}

impl Changes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Follows the buckets `patterns` name from now on.
    pub fn set_patterns(&self, patterns: Vec<String>) {
        self.lock().patterns = patterns;
    }

    /// The patterns followed now.
    pub fn patterns(&self) -> Vec<String> {
        self.lock().patterns.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PendingChanges> {
        self.pending.locked()
    }

    fn matches(patterns: &[String], bucket: &str) -> bool {
        patterns.iter().any(|p| bucket_matches(p, bucket))
    }

    /// Records that `key` of `bucket` changed (`None`: maybe all of it), if plans depend on it.
    pub fn record(&self, bucket: &str, key: Option<&str>) {
        let mut p = self.lock();
        if !Self::matches(&p.patterns, bucket) {
            return;
        }
        let whole = Change { bucket: bucket.to_string(), key: None };
        if p.set.contains(&whole) {
            return;
        }
        if p.set.len() >= MAX_PENDING {
            let buckets: BTreeSet<String> = p.set.iter().map(|c| c.bucket.clone()).collect();
            p.set = buckets.into_iter().map(|bucket| Change { bucket, key: None }).collect();
        }
        match key {
            None => {
                p.set.retain(|c| c.bucket != bucket);
                p.set.insert(whole);
            }
            Some(_) if p.set.contains(&whole) => {}
            Some(k) => {
                p.set.insert(Change { bucket: bucket.to_string(), key: Some(k.to_string()) });
            }
        }
        drop(p);
        self.notify.notify_one();
    }

    /// Waits for changes, then takes all there are.
    pub async fn next_batch(&self) -> Vec<Change> {
        loop {
            let taken = self.next_batch_now();
            if !taken.is_empty() {
                return taken;
            }
            self.notify.notified().await;
        }
    }

    /// Takes whatever changes wait, without waiting.
    pub fn next_batch_now(&self) -> Vec<Change> {
        std::mem::take(&mut self.lock().set).into_iter().collect()
    }

    /// How many changes wait.
    pub fn pending(&self) -> usize {
        self.lock().set.len()
    }
}

/// Most changes one call of the guest is handed.
pub const MOST_A_CALL: usize = 256;

/// The batches of changes still to hand to the guest, split where it fails: a batch the guest
/// fails (a trap, its deadline, its memory: the same input would fail the same way) is tried in
/// halves, each on its own, down to the single changes it fails on, which are given up with
/// why. So one module that cannot be computed (a composition too large for the guest's memory,
/// a bucket that cannot be read within the deadline) costs that module, never the whole mesh's.
/// Used by every task that follows changes (plans, module states):
///
/// ```text
/// while let Some(batch) = work.take_batch() { call the guest: answered(rest) / guest_failed / left }
/// ```
#[derive(Default)]
pub struct Split {
    work: Vec<Vec<Change>>,
    given_up: Vec<(Change, String)>,
}

impl Split {
    pub fn new(batch: Vec<Change>) -> Split {
        Split { work: vec![batch], given_up: Vec::new() }
    }

    /// The next batch to hand to the guest: at most [`MOST_A_CALL`] changes, the others
    /// waiting under what the guest hands back. A backlog of thousands of changes (a mesh
    /// written faster than its states are found) is then not handed over, and back, whole at
    /// every call: a call costs what it decides, not what waits.
    pub fn take_batch(&mut self) -> Option<Vec<Change>> {
        while let Some(mut batch) = self.work.pop() {
            if batch.len() > MOST_A_CALL {
                let later = batch.split_off(MOST_A_CALL);
                self.work.push(later);
            }
            if !batch.is_empty() {
                return Some(batch);
            }
        }
        None
    }

    /// The guest answered a batch and handed back `rest` for another call.
    pub fn answered(&mut self, rest: Vec<Change>) {
        self.work.push(rest);
    }

    /// The guest itself failed on `batch`.
    pub fn guest_failed(&mut self, mut batch: Vec<Change>, why: String) {
        if batch.len() > 1 {
            tracing::warn!(changes = batch.len(), "the guest failed on a batch of changes ({why}); trying it in halves to find the ones it fails on");
            let second = batch.split_off(batch.len() / 2);
            self.work.push(second);
            self.work.push(batch);
        } else if let Some(change) = batch.into_iter().next() {
            tracing::warn!(bucket = change.bucket, key = ?change.key, "what this change moves cannot be computed: {why}; the rest is, and this one is tried again when it changes");
            self.given_up.push((change, why));
        }
    }

    /// The host could not serve `batch` (the bus's failure, not the input's): every change not
    /// yet answered, to be asked again later.
    pub fn left(self, batch: Vec<Change>) -> Vec<Change> {
        let mut left: Vec<Change> = self.work.into_iter().flatten().collect();
        left.extend(batch);
        left
    }

    /// The single changes the guest failed on every time, with why.
    pub fn given_up(self) -> Vec<(Change, String)> {
        self.given_up
    }
}

/// Whether `bucket` is named by `pattern`: a name, or a name with one `*` standing for a
/// non-empty part of it (`composed-*`, `*_bound`). Bucket names only, never keys.
pub fn bucket_matches(pattern: &str, bucket: &str) -> bool {
    match pattern.split_once('*') {
        Some((prefix, suffix)) => bucket.len() > prefix.len() + suffix.len() && bucket.starts_with(prefix) && bucket.ends_with(suffix),
        None => pattern == bucket,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(bucket: &str, key: Option<&str>) -> Change {
        Change { bucket: bucket.into(), key: key.map(Into::into) }
    }

    #[tokio::test]
    async fn keeps_only_the_buckets_plans_depend_on() {
        let c = Changes::new();
        c.set_patterns(vec!["mesh-indexer_builds".into(), "composed-*".into()]);
        c.record("mesh-provisioner_needs", Some("alpha.app.config.x"));
        c.record("composed-alpha", Some("app.b7"));
        c.record("composed-alpha", Some("app.b7"));
        c.record("mesh-indexer_builds", None);
        c.record("mesh-indexer_builds", Some("app"));
        assert_eq!(c.next_batch().await, vec![change("composed-alpha", Some("app.b7")), change("mesh-indexer_builds", None)]);
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn names_buckets_by_a_prefix_or_a_suffix() {
        assert!(bucket_matches("composed-*", "composed-alpha"));
        assert!(bucket_matches("*_bound", "postgres_bound"));
        assert!(!bucket_matches("*_bound", "_bound"));
        assert!(!bucket_matches("composed-*", "composed-"));
        assert!(!bucket_matches("*_bound", "postgres_bound_x"));
        assert!(bucket_matches("mesh-config_values", "mesh-config_values"));
        assert!(!bucket_matches("mesh-config_values", "mesh-config_values2"));
    }

    #[test]
    fn collapses_a_flood_into_one_whole_bucket_change() {
        let c = Changes::new();
        c.set_patterns(vec!["composed-*".into()]);
        for i in 0..MAX_PENDING {
            c.record("composed-alpha", Some(&format!("m{i}.b1")));
        }
        assert_eq!(c.pending(), MAX_PENDING);
        c.record("composed-beta", Some("web.b1"));
        c.record("composed-alpha", Some("app.b1"));
        c.record("composed-beta", None);
        assert_eq!(c.pending(), 2);
    }

    #[test]
    fn a_batch_the_guest_fails_on_is_split_down_to_the_change_it_fails_on() {
        let batch: Vec<Change> = (0..5).map(|i| change("b", Some(&format!("k{i}")))).collect();
        let bad = change("b", Some("k3"));
        let mut work = Split::new(batch);
        let (mut answered, mut calls) = (Vec::new(), 0);
        while let Some(batch) = work.take_batch() {
            calls += 1;
            if batch.contains(&bad) {
                work.guest_failed(batch, "trapped".into());
            } else {
                answered.extend(batch);
                work.answered(Vec::new());
            }
        }
        answered.sort();
        assert_eq!(answered.len(), 4, "every other change answered: {answered:?}");
        assert!(!answered.contains(&bad));
        assert!(calls <= 7, "halves, not one call per change and more: {calls}");
        assert_eq!(work.given_up(), vec![(bad, "trapped".to_string())]);
    }

    #[test]
    fn a_backlog_is_handed_over_a_bounded_batch_at_a_time_and_nothing_is_lost() {
        let backlog: Vec<Change> = (0..MOST_A_CALL * 2 + 1).map(|i| change("b", Some(&format!("k{i:04}")))).collect();
        let mut work = Split::new(backlog.clone());
        let (mut seen, mut sizes) = (Vec::new(), Vec::new());
        let handed_back = change("b", Some("again"));
        while let Some(batch) = work.take_batch() {
            sizes.push(batch.len());
            if batch == [handed_back.clone()] {
                continue;
            }
            // The guest decides the batch and hands a change back, as a rest, each call.
            seen.extend(batch);
            work.answered(vec![handed_back.clone()]);
        }
        assert!(sizes.iter().all(|&n| n <= MOST_A_CALL), "batches of {sizes:?}");
        assert_eq!(sizes[0], MOST_A_CALL);
        seen.sort();
        assert_eq!(seen, backlog, "every change handed over exactly once");
    }

    #[test]
    fn a_host_failure_hands_back_everything_not_answered() {
        let mut work = Split::new(vec![change("b", Some("k0")), change("b", Some("k1"))]);
        let first = work.take_batch().unwrap();
        work.guest_failed(first, "deadline".into());
        let half = work.take_batch().unwrap();
        let mut left = work.left(half);
        left.sort();
        assert_eq!(left, vec![change("b", Some("k0")), change("b", Some("k1"))]);
    }
}
