//! In-memory mirrors of buckets, which answer the guest's `store` import.
//!
//! A mirror is fed by whoever owns it (a JetStream watch with history, or a test) and answers
//! `get` and `scan` from memory: a scan starts at the filter's literal prefix, so a narrowed
//! query costs in proportion to its answer, not to the bucket. A filter that starts with a
//! wildcard is answered from an index by one of its literal tokens instead: the last one when it
//! is literal (`*.*.bound.postgres=2Edb`: who holds a value), else the first literal among
//! positions 1–3 (`*.app.>`: a module on every node; `*.*.config.>`: one kind). Each index is
//! built the first time a filter needs it and kept up to date from then on (a bucket never asked
//! that way pays nothing for it), at most four per mirror. An index is one ordered set of (hash
//! of the token, key): a slot per key, whatever the tokens, so a writer who makes every token
//! unique costs it no more than one who does not.
//! Matching a subject filter is NATS subject syntax, not a key shape: the host never parses what
//! a key means.
//!
//! A mirror also says what is wrong with its bucket besides its contents ([`Health`]): a stream
//! that is not a bucket (refused: nothing is read from it), settings that put its keys at risk,
//! a mirror dropped for the memory budget, and — for a bucket whose writers are granted one
//! first token each (the node clients' buckets, `<node>.>`) — the writers past their quota. The
//! bytes every mirror holds are summed process-wide ([`total_bytes`]) so the backend can keep
//! them within a budget.

mod log;
mod reach;
mod table;

use crate::base::sync::{Locked, ReadWrite};
pub use log::Log;
pub use reach::Reach;
use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
pub use table::Sorted;
use table::{Slot, Table};

use crate::base::error::{Error, ErrorKind, Result};
use crate::base::wire::{check_subject, matches, MAX_SUBJECT};

/// Most entries one scan returns, whatever the guest asks.
pub const MAX_SCAN: u32 = 10_000;
/// Most bytes (keys and values) one scan copies: a page ends early, with `more`, rather than
/// hand the guest `limit` values of a writer's choosing (a thousand 1 MiB values would be a
/// gigabyte). A page always holds at least one entry, so a scan always moves on.
pub const MAX_PAGE_BYTES: usize = 4 << 20;

/// The bytes (keys and values) held by every mirror of this process, for the memory budget.
static TOTAL_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The bytes (keys and values) every mirror of this process holds now.
pub fn total_bytes() -> usize {
    TOTAL_BYTES.load(Ordering::Relaxed)
}

fn grew(by: usize) {
    TOTAL_BYTES.fetch_add(by, Ordering::Relaxed);
}

fn shrank(by: usize) {
    // Never below zero, whatever the order of updates.
    let _ = TOTAL_BYTES.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(by)));
}

/// How much one writer of a bucket may hold before it is named: keys and bytes (keys and
/// values). A writer is a key's first token, in the buckets whose writers are granted one each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub keys: u64,
    pub bytes: u64,
}

impl Default for Quota {
    fn default() -> Self {
        Quota { keys: 100_000, bytes: 64 << 20 }
    }
}

/// A writer past its quota: its first token, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterShare {
    pub writer: String,
    pub keys: u64,
    pub bytes: u64,
}

/// What is wrong with a mirror's bucket besides its contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// The bucket is not read: its stream is not a bucket, or its mirror was dropped for the
    /// memory budget. Reads of it fail with this reason.
    pub refused: Option<String>,
    /// Settings of its stream that let one writer remove or crowd out another's keys.
    pub unsafe_settings: Vec<String>,
}

/// One entry as the guest receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub revision: u64,
    pub value: Vec<u8>,
}

/// One page of a scan, laid out as the guest receives it (the WIT `page`): the keys end to end
/// in one string, the values in one buffer, and for each entry its key's and value's lengths
/// and its revision. A page is then four allocations and four copies into the guest, however
/// many entries it holds; only the guest cuts it into entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    pub keys: String,
    pub values: Vec<u8>,
    /// Two for each entry: its key's length in `keys`, then its value's in `values`.
    pub lengths: Vec<u32>,
    pub revisions: Vec<u64>,
    pub more: bool,
    pub revision: u64,
}

/// Each writer's (a key's first token's) keys and bytes, counted over keys in order, where a
/// writer's keys are one run: what a restored mirror's [`Quota`] shares start from.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Runs(Vec<(Box<str>, u64, u64)>);

impl Runs {
    /// Counts `key` (which sorts after every key counted before it) and its value's bytes.
    pub fn add(&mut self, key: &str, value_bytes: usize) {
        let size = (key.len() + value_bytes) as u64;
        let writer = key.split('.').next().unwrap_or(key);
        match self.0.last_mut() {
            Some((w, keys, bytes)) if **w == *writer => {
                *keys += 1;
                *bytes += size;
            }
            _ => self.0.push((writer.into(), 1, size)),
        }
    }
}

/// Most token indexes one mirror builds (each a slot per key): positions 1–3 and the last.
const MAX_INDEXES: usize = 4;

#[derive(Debug, Default)]
struct MirrorState {
    /// The entries, packed (see [`table`]).
    table: Table,
    /// Keys whose last message is a delete or purge marker, with the marker's revision: the
    /// stream still holds a message on their subject, so they count in its subjects (see
    /// [`Census`]) until that message is gone from the stream.
    tombstones: HashMap<Arc<str>, u64>,
    /// The bytes of the keys and values held (for metrics and the memory goal).
    bytes: usize,
    revision: u64,
    /// The creation time of the stream these contents come from, in nanoseconds since the Unix
    /// epoch: its identity (a bucket made anew is a new stream with new revisions).
    origin: Option<i128>,
    ready: bool,
    /// The bucket does not exist (the mirror is then empty).
    missing: bool,
    /// Keys and bytes by first token, kept only for a mirror that counts its writers.
    writers: Option<HashMap<Box<str>, (u64, u64)>>,
}

impl MirrorState {
    /// Keeps the mirror's bytes and the process's total together: `added` held now, `removed`
    /// held no more.
    fn account(&mut self, added: usize, removed: usize) {
        self.bytes = self.bytes + added - removed;
        grew(added);
        shrank(removed);
    }

    fn count(&mut self, key: &str, keys: i64, bytes: i64) {
        let Some(writers) = self.writers.as_mut() else { return };
        let writer = key.split('.').next().unwrap_or(key);
        if !writers.contains_key(writer) {
            writers.insert(writer.into(), (0, 0));
        }
        let Some(c) = writers.get_mut(writer) else { return };
        c.0 = c.0.saturating_add_signed(keys);
        c.1 = c.1.saturating_add_signed(bytes);
        if c.0 == 0 {
            writers.remove(writer);
        }
    }

    /// Empties the contents (not the revision or the flags).
    fn empty(&mut self) {
        self.account(0, self.bytes);
        self.table = Table::default();
        self.tombstones.clear();
        if let Some(w) = self.writers.as_mut() {
            w.clear();
        }
    }
}

/// A bucket's contents, as of [`Mirror::revision`].
#[derive(Debug, Default)]
pub struct Mirror {
    /// Shared with the thread building a new base for the table (see [`table`]), which installs
    /// it under the write lock.
    state: Arc<RwLock<MirrorState>>,
    /// Keys looked at by scans, for proving that narrowed scans stay narrow.
    visited: AtomicU64,
    /// When the mirror was last asked for, in milliseconds after [`epoch`].
    touched: AtomicU64,
    /// Messages the bucket held past the last one the mirror applied, as its watch last said.
    lag: AtomicU64,
    /// Woken to make the mirror's follower rebuild it from the bucket (an audit found it
    /// diverged).
    rebuild: tokio::sync::Notify,
    /// Moves whenever the contents or state may change (every write lock taken): a reply read
    /// at one version holds while the version does (the reply cache).
    version: AtomicU64,
    /// The version at the last change of each part of the mirror (see [`reach`]).
    changes: reach::PartChanges,
    /// What is wrong with the bucket (see [`Health`]); changing it moves the version.
    health: Mutex<Health>,
    /// No longer served by its backend (dropped from its registry of mirrors): what a reply
    /// read here may differ from what a read now would find.
    retired: std::sync::atomic::AtomicBool,
    /// Set on a one-off mirror, never served again (a bucket read as missing from the listing
    /// of the bus's buckets): how long that answer holds, if the backend can say.
    once: std::sync::OnceLock<Option<crate::store::holds::Holds>>,
    /// Moves whenever the contents are replaced or emptied whole (adopted, cleared, refused,
    /// missing): a reader walking the mirror in steps (a snapshot) knows its walk saw one copy.
    generation: AtomicU64,
    /// The streams the bucket sources (a shared bucket's nodes' shares), each with its filter,
    /// as its stream's configuration said when the follower last opened it.
    sources: Mutex<Vec<(Box<str>, Box<str>)>>,
    /// For each stream it sources, the sequence through which the mirror is known to hold its
    /// messages (found on the bus by a read-your-writes wait, kept so the next needs no trip).
    held_through: Mutex<HashMap<Box<str>, u64>>,
}

/// How long what was read in a mirror stays what a read now would find (the reply cache).
#[derive(Debug, Clone)]
pub enum Holding {
    /// A mirror its backend serves and keeps current: while its version does not move and it
    /// is not retired.
    Served,
    /// A one-off answer: while the [`Holds`](crate::store::holds::Holds) holds.
    While(crate::store::holds::Holds),
    /// A one-off answer nothing says how long holds.
    Never,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        shrank(self.read().bytes);
    }
}

/// What an audit compares with the bucket's stream: the last revision applied, and the
/// subjects the stream holds a message on if the mirror is right (keys and tombstones). The
/// stream's message count includes older revisions where history is kept, so subjects are
/// what both sides can count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Census {
    pub revision: u64,
    pub subjects: u64,
    pub ready: bool,
}

/// The instant mirror use is measured from.
fn epoch() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

impl Mirror {
    pub fn new() -> Self {
        let m = Self::default();
        m.touch();
        m
    }

    /// An empty mirror of a bucket that does not exist, served once: the answer of a listing of
    /// the bus's buckets, holding as long as `holds` says (never, when `None`).
    pub fn missing_once(holds: Option<crate::store::holds::Holds>) -> Self {
        let m = Self::new();
        m.set_missing(true);
        m.set_ready(true);
        let _ = m.once.set(holds);
        m
    }

    /// Notes the streams the bucket sources, each with its subject filter; whether that
    /// changed. Which writers are orphaned follows from them, so a change of them is a change
    /// of the whole mirror: a reply kept while a retired node's share was still sourced must
    /// not be served after.
    pub fn set_sources(&self, sources: Vec<(Box<str>, Box<str>)>) -> bool {
        let mut kept = self.sources.locked();
        if *kept == sources {
            return false;
        }
        *kept = sources;
        drop(kept);
        drop(self.write());
        true
    }

    /// The subject filter through which the bucket sources the stream `name`, if it does.
    pub fn source_filter(&self, name: &str) -> Option<Box<str>> {
        self.sources.locked().iter().find(|(n, _)| &**n == name).map(|(_, f)| f.clone())
    }

    /// The sequence of the sourced stream `name` the mirror is known to hold every message
    /// of, up to (0: none known).
    pub fn held_through(&self, name: &str) -> u64 {
        self.held_through.locked().get(name).copied().unwrap_or(0)
    }

    /// Notes that the mirror holds every message of the sourced stream `name` up to `sequence`.
    pub fn note_held_through(&self, name: &str, sequence: u64) {
        let mut held = self.held_through.locked();
        match held.get_mut(name) {
            Some(s) => *s = (*s).max(sequence),
            None => {
                held.insert(name.into(), sequence);
            }
        }
    }

    /// Marks the mirror as no longer served by its backend (its version moves too).
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        drop(self.write());
    }

    /// How long what is read here now stays true (see [`Holding`]); read it before reading.
    pub fn holding(&self) -> Holding {
        match self.once.get() {
            _ if self.retired.load(Ordering::Acquire) => Holding::Never,
            None => Holding::Served,
            Some(Some(h)) => Holding::While(h.clone()),
            Some(None) => Holding::Never,
        }
    }

    /// A mirror that counts keys and bytes by first token (its writers), for a bucket whose
    /// writers are granted one first token each.
    pub fn counting_writers() -> Self {
        let m = Self::new();
        m.write().writers = Some(HashMap::new());
        m
    }

    /// A new empty mirror that counts what this one counts (a copy to build aside).
    pub fn like(&self) -> Self {
        if self.read().writers.is_some() {
            Self::counting_writers()
        } else {
            Self::new()
        }
    }

    /// The writers holding more than `quota`, by first token; none for a mirror that does not
    /// count its writers.
    pub fn writers_over(&self, quota: Quota) -> Vec<WriterShare> {
        let s = self.read();
        let mut over: Vec<WriterShare> = s
            .writers
            .iter()
            .flatten()
            .filter(|(_, (k, b))| *k > quota.keys || *b > quota.bytes)
            .map(|(w, (k, b))| WriterShare { writer: w.to_string(), keys: *k, bytes: *b })
            .collect();
        over.sort_by(|a, b| a.writer.cmp(&b.writer));
        over
    }

    /// Writers holding keys that the bucket (named `bucket`), sourcing streams, no longer
    /// sources from any: a node that left the mesh, whose keys are orphaned. None when the
    /// bucket sources nothing (its writers write it directly).
    pub fn writers_unsourced(&self, bucket: &str) -> Vec<WriterShare> {
        let sources = self.sources.locked().clone();
        if sources.is_empty() {
            return Vec::new();
        }
        let filters: Vec<Vec<&str>> = sources.iter().map(|(_, f)| f.split('.').collect()).collect();
        let s = self.read();
        let mut out: Vec<WriterShare> = s
            .writers
            .iter()
            .flatten()
            .filter(|(_, (k, _))| *k > 0)
            .filter(|(w, _)| {
                let subject = format!("$KV.{bucket}.{w}.k");
                !filters.iter().any(|f| crate::base::wire::matches(f, &subject))
            })
            .map(|(w, (k, b))| WriterShare { writer: w.to_string(), keys: *k, bytes: *b })
            .collect();
        out.sort_by(|a, b| a.writer.cmp(&b.writer));
        out
    }

    /// What is wrong with the bucket, as last seen.
    pub fn health(&self) -> Health {
        self.health.locked().clone()
    }

    /// Records the stream's unsafe settings; whether they changed.
    pub fn set_unsafe_settings(&self, unsafe_settings: Vec<String>) -> bool {
        self.update_health(|h| h.unsafe_settings = unsafe_settings)
    }

    /// Refuses the bucket (emptying the mirror: nothing of it is answered) or takes it back;
    /// whether that changed.
    pub fn set_refused(&self, refused: Option<String>) -> bool {
        if refused.is_some() {
            self.write().empty();
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        self.update_health(|h| h.refused = refused)
    }

    /// Why the bucket is not read, if it is not.
    pub fn refused(&self) -> Option<String> {
        self.health.locked().refused.clone()
    }

    fn update_health(&self, change: impl FnOnce(&mut Health)) -> bool {
        let mut h = self.health.locked();
        let before = h.clone();
        change(&mut h);
        let changed = *h != before;
        drop(h);
        if changed {
            // A reply kept over the old health must not outlive it.
            drop(self.write());
        }
        changed
    }

    /// Records that the mirror was asked for now.
    pub fn touch(&self) {
        self.touched.store(epoch().elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long since the mirror was last asked for.
    pub fn unread_for(&self) -> std::time::Duration {
        let now = epoch().elapsed().as_millis() as u64;
        std::time::Duration::from_millis(now.saturating_sub(self.touched.load(Ordering::Relaxed)))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, MirrorState> {
        // A poisoned lock only means a writer panicked mid-update of plain data; the map is
        // still a map.
        self.state.reading()
    }

    /// The lock for a change that leaves the contents as they are (building an index): the
    /// version stays, so a reply kept over these contents stays good.
    fn write_same_contents(&self) -> std::sync::RwLockWriteGuard<'_, MirrorState> {
        self.state.writing()
    }

    /// The lock for a change of anything but one key's value (every read may see it).
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, MirrorState> {
        let (guard, version) = self.write_at();
        self.changes.whole(version);
        guard
    }

    /// The lock for a put or delete of `key` (only reads that reached its part may see it).
    fn write_key(&self, key: &str) -> std::sync::RwLockWriteGuard<'_, MirrorState> {
        let (guard, version) = self.write_at();
        self.changes.key(key, version);
        guard
    }

    fn write_at(&self) -> (std::sync::RwLockWriteGuard<'_, MirrorState>, u64) {
        let guard = self.state.writing();
        // Under the lock: a reader that loads the version before its read sees this write's
        // version or an older one, never a newer one with older contents.
        let version = self.version.fetch_add(1, Ordering::AcqRel) + 1;
        (guard, version)
    }

    /// Whether a read of `reach` made at `version` would find the same now; if so, the
    /// version and the revision now, read together (the revision may have moved on with writes
    /// outside the reach).
    pub fn unchanged_in(&self, reach: &Reach, version: u64) -> Option<(u64, u64)> {
        let s = self.read();
        let now = self.version();
        (!self.changes.since(reach, version, now)).then_some((now, s.revision))
    }

    /// The version of the contents (see the field): read it before reading them.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Records a put seen at `revision`.
    pub fn put(&self, key: &str, revision: u64, value: &[u8]) {
        let mut s = self.write_key(key);
        s.revision = s.revision.max(revision);
        if !s.tombstones.is_empty() {
            s.tombstones.remove(key);
        }
        match s.table.insert(key, revision, value) {
            Some(was) => {
                s.account(value.len(), was);
                s.count(key, 0, value.len() as i64 - was as i64);
            }
            None => {
                s.account(key.len() + value.len(), 0);
                s.count(key, 1, (key.len() + value.len()) as i64);
            }
        }
        self.compact_if_due(&mut s);
    }

    /// Starts building a new base for the table when its delta has grown enough, on a thread
    /// of its own that installs it when built (see [`table`]).
    fn compact_if_due(&self, s: &mut MirrorState) {
        if !s.table.compaction_due(!s.ready) {
            return;
        }
        let job = s.table.start_compaction();
        let started = self.aside("mirror-compaction", move |state| {
            let built = job.build();
            let garbage = state.writing().table.install(built);
            // Freed here, with no lock held: a replay's delta is a million small allocations.
            if let Some(garbage) = garbage {
                let large = garbage.entries() >= 1 << 16 || garbage.base_bytes() >= 64 << 20;
                drop(garbage);
                if large {
                    give_back_freed_memory();
                }
            }
        });
        if !started {
            // The delta keeps growing until a later try.
            s.table.compaction_not_started();
        }
    }

    /// Runs `work` on a thread of its own, with the mirror's state to install its result in;
    /// whether a thread could be had.
    fn aside(&self, name: &str, work: impl FnOnce(&RwLock<MirrorState>) + Send + 'static) -> bool {
        let state = self.state.clone();
        std::thread::Builder::new().name(name.into()).spawn(move || work(&state)).is_ok()
    }

    /// Records a delete or purge seen at `revision`: the key is gone, its marker stays.
    pub fn delete(&self, key: &str, revision: u64) {
        let mut s = self.write_key(key);
        s.revision = s.revision.max(revision);
        if let Some(was) = s.table.remove(key) {
            s.account(0, key.len() + was);
            s.count(key, -1, -((key.len() + was) as i64));
        }
        s.tombstones.insert(key.into(), revision);
        self.compact_if_due(&mut s);
    }

    /// Records that the bucket is at least at `revision` (its stream's last sequence when a
    /// replay began), though no message of it may remain.
    pub fn note_revision(&self, revision: u64) {
        // No key changes: a kept reply stays good, with the revision moved on.
        let (mut s, _) = self.write_at();
        s.revision = s.revision.max(revision);
    }

    /// The revision applied and the subjects held, read together.
    pub fn census(&self) -> Census {
        let s = self.read();
        Census { revision: s.revision, subjects: (s.table.len() + s.tombstones.len()) as u64, ready: s.ready }
    }

    /// The generation of the contents (see the field).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Records the identity of the stream the contents come from (its creation time).
    pub fn set_origin(&self, created_ns: i128) {
        self.write_same_contents().origin = Some(created_ns);
    }

    /// The identity of the stream the contents come from, if known.
    pub fn origin(&self) -> Option<i128> {
        self.read().origin
    }

    /// Visits the entries strictly after `after`, in key order, under one read lock, until
    /// `visit` says stop (returns false) or none is left: the last key visited, `None` once
    /// there was nothing to visit. A walk in steps, so that a writer waits one step at most.
    pub fn visit(&self, after: Option<&str>, visit: &mut dyn FnMut(&str, u64, &[u8]) -> bool) -> Option<Arc<str>> {
        let s = self.read();
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut last = None;
        for (key, revision, value) in s.table.range(start) {
            let stop = !visit(&key, revision, value);
            last = Some(key);
            if stop {
                break;
            }
        }
        last.map(|k| Arc::from(&*k))
    }

    /// The keys whose last message is a delete or purge marker, with its revision.
    pub fn tombstones(&self) -> Vec<(Arc<str>, u64)> {
        self.read().tombstones.iter().map(|(k, r)| (k.clone(), *r)).collect()
    }

    /// Fills an empty mirror at once (a snapshot loaded, a full replay's [`Log`] built):
    /// `entries` (in key order, as a [`Sorted`] holds them), the markers, the revision the
    /// contents are as of and the stream they come from.
    pub fn restore(&self, entries: Sorted, tombstones: Vec<(Arc<str>, u64)>, revision: u64, origin: i128) -> Result<()> {
        self.restore_counted(entries, None, tombstones, revision, origin)
    }

    /// [`Mirror::restore`], with each writer's share already counted as the entries were packed
    /// (`Runs`, from a log's build): nothing is read again.
    pub fn restore_counted(&self, entries: Sorted, runs: Option<Runs>, tombstones: Vec<(Arc<str>, u64)>, revision: u64, origin: i128) -> Result<()> {
        let mut s = self.write();
        if s.table.len() > 0 || !s.tombstones.is_empty() {
            return Err(Error::new(ErrorKind::Invalid, "a mirror is restored only when empty"));
        }
        if s.writers.is_some() {
            let runs = runs.unwrap_or_else(|| {
                let mut runs = Runs::default();
                let mut walk = entries.walk_from(0);
                while let Some((_, key, _, value)) = walk.next_record() {
                    runs.add(key, value.len());
                }
                runs
            });
            if let Some(writers) = s.writers.as_mut() {
                for (writer, keys, b) in runs.0 {
                    let c = writers.entry(writer).or_insert((0, 0));
                    c.0 += keys;
                    c.1 += b;
                }
            }
        }
        s.account(entries.raw_bytes(), 0);
        s.table = Table::from_sorted(entries);
        s.tombstones = tombstones.into_iter().filter(|(k, _)| !s.table.contains(k)).collect();
        s.revision = s.revision.max(revision);
        s.origin = Some(origin);
        Ok(())
    }

    /// Forgets every entry and marker whose message is older than `first` (the stream's first
    /// sequence): such a message is gone from the stream (expired or purged), and so is what it
    /// said. The number forgotten.
    pub fn forget_below(&self, first: u64) -> usize {
        let mut s = self.write();
        // A snapshot's oldest entry is usually the stream's first message: nothing to walk.
        let gone: Vec<Box<str>> = if s.table.none_older_than(first) {
            Vec::new()
        } else {
            s.table.range(Bound::Unbounded).filter(|e| e.1 < first).map(|e| Box::<str>::from(&*e.0)).collect()
        };
        let markers = s.tombstones.len();
        s.tombstones.retain(|_, r| *r >= first);
        let forgotten = gone.len() + markers - s.tombstones.len();
        for key in gone {
            if let Some(was) = s.table.remove(&key) {
                s.account(0, key.len() + was);
                s.count(&key, -1, -((key.len() + was) as i64));
            }
        }
        self.compact_if_due(&mut s);
        forgotten
    }

    /// Asks the mirror's follower to rebuild it from the bucket. Until the rebuilt copy is in
    /// sync, reads are answered from this one.
    pub fn request_rebuild(&self) {
        self.rebuild.notify_one();
    }

    /// Waits until a rebuild is asked for.
    pub async fn rebuild_requested(&self) {
        self.rebuild.notified().await
    }

    /// Takes the contents of `staged` (a copy built aside from the bucket, now in sync) in one
    /// step: a reader sees the old contents or the new, never a half-built mirror. A bucket
    /// read in sync is no longer refused.
    pub fn adopt(&self, staged: &Mirror) {
        let mut new = std::mem::take(&mut *staged.write());
        // A base being built for the staged copy is installed there, in the empty copy (where
        // it is discarded), never here.
        new.table.abandon_work_aside();
        let mut s = self.write();
        let old = std::mem::replace(&mut *s, new);
        // The staged bytes move here (counted once already); the old copy's are freed.
        shrank(old.bytes);
        s.ready = true;
        self.compact_if_due(&mut s);
        self.generation.fetch_add(1, Ordering::AcqRel);
        drop(s);
        self.lag.store(staged.lag(), Ordering::Relaxed);
        self.update_health(|h| h.refused = None);
        // Freeing a large old copy takes a while: not on the thread that serves.
        if old.table.len() > 10_000 {
            std::thread::spawn(move || drop(old));
        }
    }

    /// Marks the mirror as in sync (history replayed) or not (watch lost).
    pub fn set_ready(&self, ready: bool) {
        let mut s = self.write();
        s.ready = ready;
        // Nothing is packed while a replay runs (see [`Table::compaction_due`]): once in sync,
        // what it left in the delta is.
        self.compact_if_due(&mut s);
    }

    pub fn is_ready(&self) -> bool {
        self.read().ready
    }

    /// Marks the bucket as not existing (emptied) or existing.
    pub fn set_missing(&self, missing: bool) {
        let mut s = self.write();
        if missing {
            s.empty();
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        s.missing = missing;
    }

    /// Whether the bucket exists, as last seen.
    pub fn exists(&self) -> bool {
        !self.read().missing
    }

    /// Empties the mirror before a resync, revision included: the bucket may have been deleted
    /// and made again, and a new stream's revisions start again from 1.
    pub fn clear(&self) {
        // Emptied (its bucket gone, refused): what it held of its sources is known no more.
        self.held_through.locked().clear();
        let mut s = self.write();
        s.revision = 0;
        s.origin = None;
        s.empty();
        s.ready = false;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub fn revision(&self) -> u64 {
        self.read().revision
    }

    /// The bytes of the keys and values held.
    pub fn bytes(&self) -> usize {
        self.read().bytes
    }

    /// Records how many messages the bucket holds past the last one applied.
    pub fn set_lag(&self, messages: u64) {
        self.lag.store(messages, Ordering::Relaxed);
    }

    /// Messages the bucket held past the last one applied, as last said by the watch.
    pub fn lag(&self) -> u64 {
        self.lag.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.read().table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many keys scans have looked at so far.
    pub fn visited(&self) -> u64 {
        self.visited.load(Ordering::Relaxed)
    }

    pub fn get(&self, key: &str) -> Result<Option<Entry>> {
        check_subject(key, false)?;
        let s = self.read();
        Ok(s.table.get(key).map(|(revision, value)| Entry { key: key.to_string(), revision, value: value.to_vec() }))
    }

    /// Entries matching `filter`, strictly after `after`, at most `limit` (clamped to
    /// [`MAX_SCAN`]), in key order.
    pub fn scan(&self, filter: &str, after: Option<&str>, limit: u32) -> Result<Page> {
        check_subject(filter, true)?;
        if let Some(a) = after {
            if a.len() > MAX_SUBJECT {
                return Err(Error::new(ErrorKind::Invalid, "scan cursor too long"));
            }
        }
        let limit = limit.min(MAX_SCAN) as usize;
        let pattern: Vec<&str> = filter.split('.').collect();
        let prefix = literal_prefix(filter);
        if prefix.is_empty() {
            if let Some((slot, token)) = index_for(&pattern) {
                return self.scan_by_token(&pattern, slot, token, after, limit);
            }
        }
        Ok(self.walk(&pattern, prefix, after, limit))
    }

    /// A scan of a filter that starts with a wildcard, from the index of the filter's literal
    /// `token` at `slot`: only the keys having that token there are looked at.
    fn scan_by_token(&self, pattern: &[&str], slot: Slot, token: &str, after: Option<&str>, limit: usize) -> Result<Page> {
        if !self.read().table.has_index(slot) {
            let mut s = self.write_same_contents();
            let (keys, room) = (s.table.len(), s.table.indexes() < MAX_INDEXES);
            if room && keys <= table::INLINE_INDEX_KEYS {
                s.table.build_index(slot);
            } else if room && !s.table.has_index(slot) {
                if !s.table.building(slot) {
                    let job = s.table.start_index(slot);
                    let started = self.aside("mirror-index", move |state| {
                        let built = job.build();
                        state.writing().table.install_index(built);
                    });
                    if !started {
                        // The next scan that needs it tries again.
                        s.table.index_not_started(slot);
                    }
                }
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("this bucket's index for filters like {:?} is being built ({keys} keys): ask again shortly", pattern.join(".")),
                ));
            }
        }
        let s = self.read();
        let mut page = Page::new(s.revision, limit);
        let Some(candidates) = s.table.by_token(slot, token, after) else {
            drop(s);
            // (Only when every index a mirror may build is taken: never with the slots chosen.)
            return Ok(self.walk(pattern, "", after, limit));
        };
        let mut visited = 0;
        for (key, revision, value) in candidates {
            visited += 1;
            if slot.token(&key) != Some(token) || !matches(pattern, &key) {
                continue;
            }
            if !page.offer(&key, revision, value, limit) {
                break;
            }
        }
        self.visited.fetch_add(visited, Ordering::Relaxed);
        Ok(page)
    }

    /// The keys from `prefix` on (every key with an empty one), after `after`, matched against
    /// `pattern`: the table walked only while keys start with the prefix.
    fn walk(&self, pattern: &[&str], prefix: &str, after: Option<&str>, limit: usize) -> Page {
        let s = self.read();
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        let mut page = Page::new(s.revision, limit);
        let mut visited = 0;
        for (key, revision, value) in s.table.range(start) {
            visited += 1;
            if !key.starts_with(prefix) {
                break;
            }
            if !matches(pattern, &key) {
                continue;
            }
            if !page.offer(&key, revision, value, limit) {
                break;
            }
        }
        self.visited.fetch_add(visited, Ordering::Relaxed);
        page
    }
}

/// Returns the heap's free pages to the system after a large delta was freed: glibc keeps
/// them otherwise, and a mirror packed after a full replay would look as large as before.
pub(crate) fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heap under its own locks; it reads and
    // writes no memory of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The index a filter that starts with a wildcard is answered from: its last token when that is
/// literal (who holds a value: `*.*.bound.<name>`), else its first literal token among positions
/// 1–3 (`*.app.>`: a module on every node; `*.*.config.>`: a kind). `None`: nothing literal to
/// narrow by (`>`, `*.*.>`), a walk of everything, which is what such a filter asks for.
fn index_for<'a>(pattern: &[&'a str]) -> Option<(Slot, &'a str)> {
    let literal = |t: &str| t != "*" && t != ">";
    if let (true, Some(last)) = (pattern.len() > 1, pattern.last()) {
        if literal(last) {
            return Some((Slot::Last, *last));
        }
    }
    pattern.iter().enumerate().skip(1).take(3).find(|(_, t)| literal(t)).map(|(p, t)| (Slot::At(p), *t))
}

impl Page {
    /// An empty page of a scan of at most `limit` entries, at `revision`, with room for the
    /// first few entries made at once (it grows past them).
    fn new(revision: u64, limit: usize) -> Page {
        let room = limit.min(PAGE_ROOM);
        Page {
            keys: String::with_capacity(room * 48),
            values: Vec::with_capacity(room * 64),
            lengths: Vec::with_capacity(2 * room),
            revisions: Vec::with_capacity(room),
            more: false,
            revision,
        }
    }

    /// How many entries the page holds.
    pub fn len(&self) -> usize {
        self.revisions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.revisions.is_empty()
    }

    /// Adds the entry unless the page is full by count or by bytes (then marks it `more`);
    /// whether it was added.
    fn offer(&mut self, key: &str, revision: u64, value: &[u8], limit: usize) -> bool {
        if self.len() == limit || self.full(key, value) {
            self.more = true;
            return false;
        }
        self.keys.push_str(key);
        self.values.extend_from_slice(value);
        // A NATS message is at most 64 MiB; a length that did not fit would make the guest
        // refuse the page (its lengths would not add up), never misread it.
        self.lengths.extend([key.len(), value.len()].map(|n| u32::try_from(n).unwrap_or(u32::MAX)));
        self.revisions.push(revision);
        true
    }

    /// Whether adding this entry would take the page past [`MAX_PAGE_BYTES`] (never the first).
    fn full(&self, key: &str, value: &[u8]) -> bool {
        !self.is_empty() && self.keys.len() + self.values.len() + key.len() + value.len() > MAX_PAGE_BYTES
    }
}

/// Entries a page has room for when it is made.
const PAGE_ROOM: usize = 16;

/// The tokens before the first wildcard, with their trailing dot: every match starts with it.
fn literal_prefix(filter: &str) -> &str {
    let mut at = 0;
    for t in filter.split('.') {
        if t == "*" || t == ">" {
            return &filter[..at];
        }
        at += t.len() + 1;
    }
    filter
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Page {
        /// The page cut into its entries by its lengths, as the guest cuts it.
        fn entries(&self) -> Vec<Entry> {
            let (mut k, mut v) = (0, 0);
            let mut out = Vec::new();
            for (pair, revision) in self.lengths.chunks_exact(2).zip(&self.revisions) {
                let (kl, vl) = (pair[0] as usize, pair[1] as usize);
                out.push(Entry { key: self.keys[k..k + kl].to_string(), revision: *revision, value: self.values[v..v + vl].to_vec() });
                (k, v) = (k + kl, v + vl);
            }
            assert_eq!((k, v, self.lengths.len()), (self.keys.len(), self.values.len(), 2 * self.revisions.len()), "a page cut whole");
            out
        }
    }

    fn mirror(keys: &[&str]) -> Mirror {
        let m = Mirror::new();
        for (i, k) in keys.iter().enumerate() {
            m.put(k, i as u64 + 1, k.as_bytes());
        }
        m
    }

    #[test]
    fn the_literal_prefix_is_the_filter_up_to_its_first_wildcard() {
        // The tokens before the first wildcard, each with the dot that follows it (the plain way).
        let joined = |filter: &str| {
            let tokens: Vec<&str> = filter.split('.').collect();
            let literal = tokens.iter().take_while(|t| **t != "*" && **t != ">").count();
            let mut prefix = tokens[..literal].join(".");
            if literal > 0 && literal < tokens.len() {
                prefix.push('.');
            }
            prefix
        };
        for filter in [">", "*", "a", "a.b", "a.>", "a.*", "*.b", "a.*.c", "alpha.m000420.>", "a.b.c.*.>", "=2A.b.>", "ab.*.>"] {
            assert_eq!(literal_prefix(filter), joined(filter), "{filter}");
        }
        assert_eq!(literal_prefix("alpha.m000420.>"), "alpha.m000420.");
    }

    fn keys(p: &Page) -> Vec<String> {
        p.entries().into_iter().map(|e| e.key).collect()
    }

    #[test]
    fn names_the_writers_whose_share_is_no_longer_sourced() {
        let m = Mirror::counting_writers();
        m.put("alpha.app.config.k", 1, b"{}");
        m.put("delta.app.config.k", 2, b"{}");
        m.put("delta.app.config.j", 3, b"{}");
        assert!(m.writers_unsourced("needs").is_empty(), "a bucket that sources nothing has no orphans");
        let source = |n: &str| (format!("NODE_{n}").into(), format!("$KV.needs.{n}.>").into());
        assert!(m.set_sources(vec![source("alpha"), source("delta")]));
        assert!(m.writers_unsourced("needs").is_empty());
        let v = m.version();
        assert!(!m.set_sources(vec![source("alpha"), source("delta")]), "the same sources are no change");
        assert_eq!(m.version(), v, "a reply kept over these sources stays good");
        assert!(m.set_sources(vec![source("alpha")]));
        assert!(m.unchanged_in(&Reach::everything(), v).is_none(), "a reply that counted delta's keys as sourced must not be served again");
        let orphaned = m.writers_unsourced("needs");
        assert_eq!(orphaned.iter().map(|w| (w.writer.as_str(), w.keys)).collect::<Vec<_>>(), [("delta", 2)]);
        m.delete("delta.app.config.k", 4);
        m.delete("delta.app.config.j", 5);
        assert!(m.writers_unsourced("needs").is_empty(), "a writer whose keys are all deleted is no orphan");
    }

    #[test]
    fn counts_each_writer_and_names_those_past_their_quota() {
        let m = Mirror::counting_writers();
        for i in 0..5 {
            m.put(&format!("alpha.app.config.k{i}"), i + 1, b"0123456789");
        }
        m.put("beta.web.config.x", 9, b"{}");
        let quota = Quota { keys: 4, bytes: 1 << 20 };
        let over = m.writers_over(quota);
        assert_eq!(over.len(), 1, "{over:?}");
        assert_eq!((over[0].writer.as_str(), over[0].keys), ("alpha", 5));
        assert_eq!(over[0].bytes, 5 * ("alpha.app.config.k0".len() as u64 + 10));
        // A rewrite changes bytes, not keys; a delete gives the key back.
        m.put("alpha.app.config.k0", 20, b"");
        m.delete("alpha.app.config.k1", 21);
        assert!(m.writers_over(quota).is_empty(), "alpha is back within 4 keys");
        assert!(m.writers_over(Quota { keys: 100, bytes: 10 }).iter().any(|w| w.writer == "alpha"), "past the bytes");
        // A copy built aside counts as the mirror does; a plain mirror counts nobody.
        assert!(m.like().read().writers.is_some());
        assert!(mirror(&["alpha.x"]).writers_over(Quota { keys: 0, bytes: 0 }).is_empty());
    }

    #[test]
    fn building_an_index_keeps_the_version_its_contents_have() {
        let m = mirror(&["alpha.app", "beta.app", "beta.web"]);
        let v = m.version();
        let keys: Vec<String> = m.scan("*.app", None, 10).unwrap().entries().into_iter().map(|e| e.key.to_string()).collect();
        assert_eq!(keys, ["alpha.app", "beta.app"]);
        assert_eq!(m.version(), v, "an index is not a change: a reply kept over these contents stays good");
        m.put("gamma.app", 9, b"x");
        assert!(m.version() > v);
    }

    #[test]
    fn a_refused_bucket_holds_nothing_and_moves_the_version() {
        let m = mirror(&["a.b", "a.c"]);
        let v = m.version();
        assert!(m.set_refused(Some("not a bucket".into())));
        assert!(m.is_empty() && m.bytes() == 0);
        assert!(m.version() > v, "a reply kept over the old contents must not outlive them");
        assert!(!m.set_refused(Some("not a bucket".into())), "no change, no news");
        assert!(m.set_unsafe_settings(vec!["allows roll-ups".into()]));
        assert_eq!(m.health().refused.as_deref(), Some("not a bucket"));
    }

    #[test]
    fn scans_only_the_narrowed_range_in_order() {
        let m = mirror(&["beta.x.y", "alpha.app.b", "alpha.app.a", "alpha.apx.a", "alpha.app"]);
        assert_eq!(keys(&m.scan("alpha.app.>", None, 10).unwrap()), ["alpha.app.a", "alpha.app.b"]);
        assert_eq!(keys(&m.scan("*.app.*", None, 10).unwrap()), ["alpha.app.a", "alpha.app.b"]);
        let p = m.scan(">", None, 2).unwrap();
        assert_eq!((keys(&p), p.more, p.revision), (vec!["alpha.app".to_string(), "alpha.app.a".into()], true, 5));
        assert_eq!(keys(&m.scan(">", Some("alpha.apx.a"), 10).unwrap()), ["beta.x.y"]);
    }

    #[test]
    fn finds_keys_by_their_last_token_without_walking_the_rest() {
        let m = mirror(&["alpha.app.bound.pg=2Edb", "beta.web.bound.pg=2Edb", "alpha.app.config.x", "gamma.db.bound.pg=2Edb", "pg=2Edb"]);
        for i in 0..1000 {
            m.put(&format!("n{i}.m.config.x"), 10 + i, b"");
        }
        let before = m.visited();
        let p = m.scan("*.*.bound.pg=2Edb", None, 10).unwrap();
        assert_eq!(keys(&p), ["alpha.app.bound.pg=2Edb", "beta.web.bound.pg=2Edb", "gamma.db.bound.pg=2Edb"]);
        assert!(m.visited() - before <= 4, "visited {}", m.visited() - before);
        // Paged, and kept up to date after it was built.
        let p = m.scan("*.*.bound.pg=2Edb", None, 1).unwrap();
        assert_eq!((keys(&p), p.more), (vec!["alpha.app.bound.pg=2Edb".to_string()], true));
        m.delete("beta.web.bound.pg=2Edb", 2000);
        m.put("delta.app.bound.pg=2Edb", 2001, b"v");
        m.put("alpha.app.bound.pg=2Edb", 2002, b"new");
        let p = m.scan("*.*.bound.pg=2Edb", Some("alpha.app.bound.pg=2Edb"), 10).unwrap();
        assert_eq!(keys(&p), ["delta.app.bound.pg=2Edb", "gamma.db.bound.pg=2Edb"]);
        assert_eq!(m.scan("*.*.bound.pg=2Edb", None, 1).unwrap().entries()[0].value, b"new");
        // Same answers as a walk of everything.
        assert_eq!(keys(&m.scan("*.>", None, 10_000).unwrap()).iter().filter(|k| k.ends_with(".pg=2Edb")).count(), 3);
        m.clear();
        assert!(m.scan("*.*.bound.pg=2Edb", None, 10).unwrap().entries().is_empty());
    }

    #[test]
    fn finds_keys_by_a_middle_token_without_walking_the_rest() {
        let m = Mirror::new();
        for n in 0..200 {
            for (module, kind) in [("app", "config"), ("web", "secret"), ("db", "config")] {
                m.put(&format!("n{n:03}.{module}.{kind}.x"), 1, b"v");
            }
        }
        m.put("short.app", 2, b"v");
        let before = m.visited();
        let p = m.scan("*.app.>", None, 1000).unwrap();
        assert_eq!(p.entries().len(), 200);
        assert!(p.entries().iter().all(|e| e.key.split('.').nth(1) == Some("app")));
        assert!(m.visited() - before <= 201, "visited {}", m.visited() - before);
        let before = m.visited();
        let p = m.scan("*.*.config.>", None, 1000).unwrap();
        assert_eq!(p.entries().len(), 400);
        assert!(m.visited() - before <= 400, "visited {}", m.visited() - before);
        // Paged by the key handed back, in key order, and kept up to date.
        let first = m.scan("*.app.>", None, 150).unwrap();
        let rest = m.scan("*.app.>", Some(&first.entries()[149].key), 150).unwrap();
        assert_eq!((first.more, rest.entries().len(), rest.more), (true, 50, false));
        m.delete("n000.app.config.x", 10);
        m.put("zzz.app.new.y", 11, b"v");
        let keys: Vec<String> = m.scan("*.app.>", None, 1000).unwrap().entries().into_iter().map(|e| e.key).collect();
        assert_eq!(keys.len(), 200);
        assert!(!keys.contains(&"n000.app.config.x".to_string()) && keys.last().map(String::as_str) == Some("zzz.app.new.y"));
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn every_filter_answers_as_a_walk_of_everything_would() {
        // Keys of 1 to 5 tokens from a small alphabet, so tokens and lengths collide a lot.
        let m = Mirror::new();
        let alphabet = ["a", "b", "c", "app", "x"];
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        for i in 0..3000 {
            let len = 1 + next() % 5;
            let key: Vec<&str> = (0..len).map(|_| alphabet[next() % alphabet.len()]).collect();
            if next() % 7 == 0 {
                m.delete(&key.join("."), i + 1);
            } else {
                m.put(&key.join("."), i + 1, b"v");
            }
        }
        let tokens = ["*", "a", "app", ">"];
        let mut filters = Vec::new();
        for len in 1..=4usize {
            let mut idx = vec![0usize; len];
            loop {
                let f: Vec<&str> = idx.iter().map(|i| tokens[*i]).collect();
                if f[..len - 1].iter().all(|t| *t != ">") {
                    filters.push(f.join("."));
                }
                let mut k = 0;
                while k < len && idx[k] == tokens.len() - 1 {
                    idx[k] = 0;
                    k += 1;
                }
                if k == len {
                    break;
                }
                idx[k] += 1;
            }
        }
        for f in &filters {
            let pattern: Vec<&str> = f.split('.').collect();
            let want: Vec<String> = m.walk(&pattern, "", None, MAX_SCAN as usize).entries().into_iter().map(|e| e.key).collect();
            // Read through in pages of 7, each from the last key handed back.
            let (mut got, mut after) = (Vec::new(), None::<String>);
            loop {
                let p = m.scan(f, after.as_deref(), 7).unwrap();
                got.extend(p.entries().iter().map(|e| e.key.clone()));
                match (p.more, p.entries().last()) {
                    (true, Some(last)) => after = Some(last.key.clone()),
                    _ => break,
                }
            }
            assert_eq!(got, want, "filter {f}");
        }
    }

    #[test]
    fn cuts_a_page_by_bytes_before_copying_values() {
        let m = Mirror::new();
        let big = vec![b'x'; 1 << 20];
        for i in 0..10 {
            m.put(&format!("alpha.k{i}"), i + 1, &big);
            m.put(&format!("beta.x.k{i}"), i + 100, &big);
        }
        let p = m.scan("alpha.>", None, 1000).unwrap();
        assert_eq!((p.entries().len(), p.more), (3, true), "4 MiB hold three 1 MiB values and their keys");
        let p = m.scan("*.x.k1", None, 1000).unwrap();
        assert_eq!(p.entries().len(), 1);
        // A value larger than a page still comes, alone.
        m.put("huge.one", 500, &vec![b'y'; MAX_PAGE_BYTES + 1]);
        m.put("huge.two", 501, b"small");
        let p = m.scan("huge.>", None, 1000).unwrap();
        assert_eq!((keys(&p), p.more), (vec!["huge.one".to_string()], true));
        let p = m.scan("huge.>", Some("huge.one"), 1000).unwrap();
        assert_eq!((keys(&p), p.more), (vec!["huge.two".to_string()], false));
    }

    #[test]
    fn forgets_what_is_older_than_the_first_message_in_the_base_and_the_changes_since() {
        for (changed, first) in [false, true].into_iter().flat_map(|c| [1, 4, 5, 6, 8, 10].map(|f| (c, f))) {
            let mut base = Sorted::new();
            for (k, r) in [("a.a", 5), ("a.b", 7), ("a.c", 8)] {
                base.push(k, r, b"v");
            }
            let m = Mirror::new();
            m.restore(base, Vec::new(), 8, 1).unwrap();
            let mut all = vec![("a.a", 5), ("a.b", 7), ("a.c", 8)];
            if changed {
                // Changes since the base: one older than all of it, one replacing a base entry.
                m.put("a.d", 3, b"w");
                m.put("a.a", 9, b"x");
                all = vec![("a.a", 9), ("a.b", 7), ("a.c", 8), ("a.d", 3)];
            }
            let want: Vec<(String, u64)> = all.iter().filter(|(_, r)| *r >= first).map(|(k, r)| (k.to_string(), *r)).collect();
            let gone = m.forget_below(first);
            let mut have = Vec::new();
            m.visit(None, &mut |k, r, _| {
                have.push((k.to_string(), r));
                true
            });
            assert_eq!((have, gone), (want.clone(), all.len() - want.len()), "changed {changed}, the first message {first}");
        }
    }

    #[test]
    fn forgets_the_old_streams_revision_when_cleared() {
        let m = mirror(&["a.b", "a.c"]);
        m.put("a.d", 900, b"x");
        assert_eq!((m.revision(), m.bytes()), (900, 3 + 3 + 3 + 3 + 3 + 1));
        m.clear();
        assert_eq!((m.revision(), m.len(), m.bytes()), (0, 0, 0));
        m.put("a.b", 1, b"new");
        assert_eq!(m.revision(), 1, "a recreated bucket's revisions start again");
    }

    #[test]
    fn counts_a_deleted_keys_marker_as_a_subject_until_the_key_is_put_again() {
        let m = mirror(&["a.b", "a.c"]);
        m.delete("a.b", 3);
        m.delete("never.seen", 4);
        assert_eq!(m.census(), Census { revision: 4, subjects: 3, ready: false });
        m.put("a.b", 5, b"back");
        m.delete("a.b", 6);
        m.delete("a.b", 7);
        assert_eq!((m.census().subjects, m.len()), (3, 1));
        m.clear();
        assert_eq!(m.census().subjects, 0);
    }

    /// Waits for the mirror's compaction under way, if any, to be installed.
    fn settled(m: &Mirror) {
        for _ in 0..2000 {
            if !m.read().table.compacting() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        panic!("a compaction never landed");
    }

    #[test]
    fn a_large_mirror_builds_an_index_aside_and_says_so_until_it_is_built() {
        let m = Mirror::new();
        let mut sorted = Sorted::new();
        let n = table::INLINE_INDEX_KEYS + 1000;
        for i in 0..n {
            assert!(sorted.push(&format!("n{:07}.{}", i, if i % 1000 == 0 { "rare" } else { "common" }), i as u64 + 1, b"v"));
        }
        m.restore(sorted, Vec::new(), n as u64, 1).unwrap();
        m.set_ready(true);
        let e = m.scan("*.rare", None, 100).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.message().contains("is being built") && e.message().contains("*.rare"), "{e}");
        let v = m.version();
        let started = std::time::Instant::now();
        let page = loop {
            match m.scan("*.rare", None, 100) {
                Ok(p) => break p,
                Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable),
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(60), "the index never landed");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(page.entries().len(), 100);
        assert!(page.more && page.entries().iter().all(|e| e.key.ends_with(".rare")));
        assert_eq!(m.version(), v, "an index is not a change of contents");
        assert!(m.visited() < 2000, "answered from the index, not a walk: {} keys looked at", m.visited());
    }

    #[test]
    fn packs_its_entries_in_the_background_without_moving_an_answer_or_the_version() {
        let m = Mirror::counting_writers();
        m.set_ready(true);
        let _ = m.scan("*.*.config", None, 1).unwrap();
        let key = |i: usize| format!("n{}.m{i:05}.{}", i % 7, if i.is_multiple_of(3) { "secret" } else { "config" });
        for i in 0..30_000 {
            m.put(&key(i), i as u64 + 1, format!("v{i}").as_bytes());
            if i % 5 == 4 {
                m.delete(&key(i - 2), i as u64 + 1);
            }
        }
        let v = m.version();
        settled(&m);
        assert_eq!(m.version(), v, "a new base holds the same contents: a reply kept over them stays good");
        assert!(m.read().table.delta_len() < 30_000 / 4, "most entries are packed in the base");
        let want: Vec<String> = (0..30_000).filter(|i| i % 5 != 2).map(key).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        assert_eq!(m.len(), want.len());
        let mut got = Vec::new();
        m.visit(None, &mut |k, _, v| {
            assert_eq!(v, format!("v{}", &k[4..9].trim_start_matches('0').parse::<usize>().unwrap_or(0)).as_bytes());
            got.push(k.to_string());
            true
        });
        assert_eq!(got, want);
        let secrets = m.scan("*.*.secret", None, MAX_SCAN).unwrap();
        assert_eq!(keys(&secrets), want.iter().filter(|k| k.ends_with("secret")).map(String::as_str).collect::<Vec<_>>());
        let configs = m.scan("*.*.config", Some(&want[100]), 5).unwrap();
        assert_eq!(keys(&configs), want[101..].iter().filter(|k| k.ends_with("config")).take(5).map(String::as_str).collect::<Vec<_>>());
        assert_eq!(m.get(&want[17]).unwrap().map(|e| e.key), Some(want[17].clone()));
        assert_eq!(m.get(&key(2)).unwrap(), None, "deleted");
        let held: u64 = want.iter().map(|k| (k.len() + format!("v{}", &k[4..9].trim_start_matches('0').parse::<usize>().unwrap_or(0)).len()) as u64).sum();
        assert_eq!(m.bytes() as u64, held);
        assert_eq!(m.writers_over(Quota { keys: 0, bytes: 0 }).iter().map(|w| w.keys).sum::<u64>(), want.len() as u64);
    }

    #[test]
    fn adopts_a_rebuilt_copy_whole() {
        let m = mirror(&["old.a", "old.b"]);
        m.set_ready(true);
        m.scan("*.a", None, 10).unwrap();
        let staged = Mirror::new();
        staged.put("new.a", 7, b"v");
        staged.delete("new.gone", 8);
        m.adopt(&staged);
        assert_eq!(m.census(), Census { revision: 8, subjects: 2, ready: true });
        assert_eq!(keys(&m.scan(">", None, 10).unwrap()), ["new.a"]);
        assert_eq!(keys(&m.scan("*.a", None, 10).unwrap()), ["new.a"], "the old last-token index went with the old contents");
        assert!(staged.is_empty());
    }

    #[test]
    fn clamps_the_limit() {
        let m = Mirror::new();
        for i in 0..(MAX_SCAN + 5) {
            m.put(&format!("k{i:06}"), 1, b"");
        }
        let p = m.scan(">", None, u32::MAX).unwrap();
        assert_eq!((p.entries().len(), p.more), (MAX_SCAN as usize, true));
        let p = m.scan(">", None, 0).unwrap();
        assert_eq!((p.entries().len(), p.more), (0, true));
    }

    #[test]
    fn refuses_a_malformed_filter() {
        let m = Mirror::new();
        for bad in ["", "a..b", "a.>.b", "a b", "a*", ".a"] {
            assert_eq!(m.scan(bad, None, 1).unwrap_err().kind(), ErrorKind::Invalid, "{bad:?}");
        }
        assert_eq!(m.get("a.*").unwrap_err().kind(), ErrorKind::Invalid);
    }
}
