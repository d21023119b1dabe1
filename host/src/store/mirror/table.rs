//! The compact ordered table a mirror keeps its entries in.
//!
//! Most entries live in a *base*: one byte arena holding every record in key order (the
//! revision and the key's and value's lengths as varints, then the key, then the value) and one
//! `u32` offset per record. A million 70-byte entries cost about 80 MiB this way, where an
//! ordered map of boxed keys and values costs three times the raw bytes (a tree slot and two
//! allocations per entry). A base never changes once built; what changes after it is an ordered
//! *delta* (new and rewritten keys) and one bit per base record saying it is no longer current
//! (rewritten or deleted). When the delta outgrows a sixteenth of the table, a new base is built
//! from both on a thread of its own, from a copy taken under the mirror's lock, and installed
//! under the write lock with the changes made meanwhile (its journal) laid over it: readers
//! never wait for a build, only for an install, which costs in proportion to those changes.
//!
//! A token index (see the mirror's doc) is, over the base, its positions sorted by (hash of the
//! token, position) — 4 bytes a key — and over the delta an ordered set of (hash, key).
//! The table splits a key at dots only to find an index's token; it knows nothing of what a key
//! means.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, RandomState};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Which token of a key an index is by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Slot {
    /// The token at this position (from 0; 0 itself is never indexed: the table is in key order).
    At(usize),
    /// The last token, whatever the key's length.
    Last,
}

impl Slot {
    pub(crate) fn token(self, key: &str) -> Option<&str> {
        match self {
            Slot::At(p) => key.split('.').nth(p),
            Slot::Last => Some(key.rsplit('.').next().unwrap_or(key)),
        }
    }
}

/// One entry changed since the base was built.
#[derive(Debug, Clone)]
struct Stored {
    revision: u64,
    /// Shared, so that the copy a compaction builds from costs a count, not the bytes.
    value: Arc<[u8]>,
}

/// Records a block holds: a block's first key is whole, the others say only how they differ
/// from the key before (a reader decodes at most this many records to reach one).
const BLOCK: usize = 16;

/// Entries in strictly ascending key order, packed: what a table's base is, and what a
/// snapshot is read into. Records go in blocks of [`BLOCK`]; each record is its revision, the
/// bytes its key shares with the key before (0 for a block's first), the rest of the key's
/// length and the value's length, as varints, then the rest of the key and the value. Sorted
/// keys share most of their bytes (`alpha.m000420.config.name3` after `…name2`), so a key costs
/// a few bytes here.
#[derive(Debug, Default)]
pub struct Sorted {
    arena: Vec<u8>,
    /// The low 32 bits of each block's offset in `arena`.
    blocks: Vec<u32>,
    /// The blocks from which offsets are one more 4 GiB further (offsets only grow).
    wraps: Vec<u32>,
    /// Each block's first key's [`head`]: a search reads the arena only among blocks whose
    /// heads equal the key's (at a million keys a probe of the arena is a cache miss; this
    /// array's upper levels stay cached).
    heads: Vec<u128>,
    len: usize,
    /// The last key pushed (the next is coded against it).
    last: String,
    /// The bytes of the keys and values.
    raw: usize,
    max_revision: u64,
    /// The oldest revision of a record (0 while there is none).
    min_revision: u64,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint(b: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    while let Some(&byte) = b.get(*at) {
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift.min(63);
        if byte < 0x80 {
            break;
        }
        shift += 7;
    }
    v
}

/// How many leading bytes `a` and `b` have in common, found eight at a time: a record's key is
/// stored as what it shares with the one before and the rest, and every key packed is measured.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let words = a.chunks_exact(8).zip(b.chunks_exact(8));
    let mut n = 0;
    for (x, y) in words {
        let diff = u64::from_le_bytes([x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]]) ^ u64::from_le_bytes([y[0], y[1], y[2], y[3], y[4], y[5], y[6], y[7]]);
        if diff != 0 {
            // Little-endian: the first differing byte holds the lowest set bit.
            return n + (diff.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    n + a[n..].iter().zip(&b[n..]).take_while(|(x, y)| x == y).count()
}

/// The largest character boundary of `s` at or before `n`.
fn boundary(s: &str, n: usize) -> usize {
    let mut n = n.min(s.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// A reader of a base's records in order, from any position: keeps the key it is at.
pub(crate) struct Walk<'a> {
    base: &'a Sorted,
    pos: usize,
    at: usize,
    key: String,
}

impl<'a> Walk<'a> {
    /// Decodes the record at `self.at` (which is `self.pos`): the key into `self.key`.
    fn step(&mut self) -> Option<(u64, &'a [u8])> {
        if self.pos >= self.base.len {
            return None;
        }
        let arena = &self.base.arena[..];
        let revision = varint(arena, &mut self.at);
        let shared = varint(arena, &mut self.at) as usize;
        let rest = varint(arena, &mut self.at) as usize;
        let vlen = varint(arena, &mut self.at) as usize;
        let suffix = arena.get(self.at..self.at + rest).unwrap_or_default();
        let value = arena.get(self.at + rest..self.at + rest + vlen).unwrap_or_default();
        self.at += rest + vlen;
        self.pos += 1;
        // Keys went in as `&str` and split only after a shared prefix of whole bytes: a
        // prefix of two keys' common bytes ends on a character boundary (both are UTF-8).
        let keep = boundary(&self.key, shared);
        self.key.truncate(keep);
        self.key.push_str(std::str::from_utf8(suffix).unwrap_or_default());
        Some((revision, value))
    }

    /// The next record: its position, key, revision and value.
    pub(crate) fn next_record(&mut self) -> Option<(usize, &str, u64, &'a [u8])> {
        let pos = self.pos;
        let (revision, value) = self.step()?;
        Some((pos, &self.key, revision, value))
    }
}

impl Sorted {
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for `entries` records of about `bytes` packed bytes in all.
    pub fn with_capacity(entries: usize, bytes: usize) -> Self {
        let blocks = entries / BLOCK + 1;
        Sorted { arena: Vec::with_capacity(bytes), blocks: Vec::with_capacity(blocks), heads: Vec::with_capacity(blocks), ..Self::default() }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes of the keys and values held.
    pub fn raw_bytes(&self) -> usize {
        self.raw
    }

    /// The newest revision of a record.
    pub fn max_revision(&self) -> u64 {
        self.max_revision
    }

    /// The oldest revision of a record, if there is one.
    pub fn min_revision(&self) -> Option<u64> {
        (self.len > 0).then_some(self.min_revision)
    }

    /// Adds a record after the last; false (nothing added) unless `key` sorts after it.
    pub fn push(&mut self, key: &str, revision: u64, value: &[u8]) -> bool {
        if self.len > 0 && self.last.as_str() >= key {
            return false;
        }
        self.push_unchecked(key, revision, value);
        true
    }

    /// Adds a record after the last, whose key its caller knows sorts after the last one's (a
    /// log's build, which writes each key once, in order): one comparison fewer a key.
    pub(crate) fn push_in_order(&mut self, key: &str, revision: u64, value: &[u8]) {
        debug_assert!(self.len == 0 || self.last.as_str() < key, "{key:?} pushed after {:?}", self.last);
        self.push_unchecked(key, revision, value);
    }

    fn push_unchecked(&mut self, key: &str, revision: u64, value: &[u8]) {
        let shared = if self.len.is_multiple_of(BLOCK) {
            let at = self.arena.len();
            while (at >> 32) > self.wraps.len() {
                self.wraps.push(self.blocks.len() as u32);
            }
            self.blocks.push(at as u32);
            self.heads.push(head(key.as_bytes()));
            0
        } else {
            boundary(key, common_prefix(self.last.as_bytes(), key.as_bytes()))
        };
        put_varint(&mut self.arena, revision);
        put_varint(&mut self.arena, shared as u64);
        put_varint(&mut self.arena, (key.len() - shared) as u64);
        put_varint(&mut self.arena, value.len() as u64);
        self.arena.extend_from_slice(&key.as_bytes()[shared..]);
        self.arena.extend_from_slice(value);
        self.last.clear();
        self.last.push_str(key);
        self.len += 1;
        self.raw += key.len() + value.len();
        self.max_revision = self.max_revision.max(revision);
        self.min_revision = if self.len == 1 { revision } else { self.min_revision.min(revision) };
    }

    /// Gives back the room reserved and not used.
    pub fn shrink_to_fit(&mut self) {
        self.arena.shrink_to_fit();
        self.blocks.shrink_to_fit();
        self.heads.shrink_to_fit();
        self.last = String::new();
    }

    fn block_offset(&self, block: usize) -> usize {
        let high = self.wraps.partition_point(|&w| w as usize <= block);
        (high << 32) | self.blocks[block] as usize
    }

    /// A reader at the start of `block`.
    fn walk_block(&self, block: usize) -> Walk<'_> {
        Walk { base: self, pos: block * BLOCK, at: self.block_offset(block), key: String::new() }
    }

    /// A reader from position `pos` on.
    pub(crate) fn walk_from(&self, pos: usize) -> Walk<'_> {
        if pos >= self.len {
            return Walk { base: self, pos: self.len, at: self.arena.len(), key: String::new() };
        }
        let mut w = self.walk_block(pos / BLOCK);
        while w.pos < pos {
            w.step();
        }
        w
    }

    /// The revision and value of the record at `pos`.
    fn value_at(&self, pos: usize) -> (u64, &[u8]) {
        self.walk_from(pos).step().unwrap_or((0, &[]))
    }

    /// The record at `pos`: its key, revision and value.
    pub(crate) fn get_at(&self, pos: usize) -> (String, u64, &[u8]) {
        let mut w = self.walk_from(pos);
        match w.step() {
            Some((revision, value)) => (w.key, revision, value),
            None => (String::new(), 0, &[]),
        }
    }

    /// The first key of `block`, whole in the arena.
    fn block_key(&self, block: usize) -> &[u8] {
        let mut at = self.block_offset(block);
        let _revision = varint(&self.arena, &mut at);
        let _shared = varint(&self.arena, &mut at);
        let rest = varint(&self.arena, &mut at) as usize;
        let _vlen = varint(&self.arena, &mut at);
        self.arena.get(at..at + rest).unwrap_or_default()
    }

    /// Where `key` is, or where it would go: the block by its first key, then the block read.
    fn find(&self, key: &str) -> Result<usize, usize> {
        // Heads order blocks as their keys do, ties aside: only the blocks whose head ties
        // with the key's need their first key read.
        let probe = head(key.as_bytes());
        let mut lo = self.heads.partition_point(|&h| h < probe);
        let mut hi = lo + ties(&self.heads[lo..], probe);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.block_key(mid) <= key.as_bytes() {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        // `lo` blocks start at or before `key`: it is in the last of them, if anywhere.
        let Some(block) = lo.checked_sub(1) else { return Err(0) };
        let mut w = self.walk_block(block);
        while let Some((pos, k, _, _)) = w.next_record() {
            match k.cmp(key) {
                std::cmp::Ordering::Less => continue,
                std::cmp::Ordering::Equal => return Ok(pos),
                std::cmp::Ordering::Greater => return Err(pos),
            }
        }
        Err(self.len)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// The first position at or after `start`.
    fn lower_bound(&self, start: Bound<&str>) -> usize {
        match start {
            Bound::Unbounded => 0,
            Bound::Included(k) => self.find(k).unwrap_or_else(|p| p),
            Bound::Excluded(k) => self.find(k).map(|p| p + 1).unwrap_or_else(|p| p),
        }
    }
}

/// A key's first 16 bytes as a big-endian number, zero-padded: `head(a) < head(b)` only when
/// `a < b`, and `head(a) > head(b)` only when `a > b` (they differ first where the two keys do,
/// or where the shorter one ends); equal heads say nothing.
fn head(key: &[u8]) -> u128 {
    let mut bytes = [0u8; 16];
    let n = key.len().min(16);
    bytes[..n].copy_from_slice(&key[..n]);
    u128::from_be_bytes(bytes)
}

/// How many of `heads` (sorted, none below `probe`) equal `probe`, by galloping: mostly none
/// or one, found in a step or two rather than by another search of the whole rest.
fn ties(heads: &[u128], probe: u128) -> usize {
    let mut past = 1;
    while past <= heads.len() && heads[past - 1] == probe {
        past *= 2;
    }
    // The first `past / 2` tie; the answer is below `past`.
    let known = past / 2;
    let end = past.min(heads.len());
    known + heads[known..end].partition_point(|&h| h == probe)
}

/// One bit per base record: set when the record is no longer current.
#[derive(Debug, Clone, Default)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(len: usize) -> Self {
        Bits(vec![0; len.div_ceil(64)])
    }
    fn get(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }
    /// Sets bit `i`; whether it was clear.
    fn set(&mut self, i: usize) -> bool {
        let Some(w) = self.0.get_mut(i / 64) else { return false };
        let was = *w >> (i % 64) & 1 == 1;
        *w |= 1 << (i % 64);
        !was
    }
}

/// One token index: the base's positions by (hash of the token, position), the delta's keys by
/// (hash, key). A base record not current is skipped on reading.
#[derive(Debug)]
struct Index {
    slot: Slot,
    base: Vec<u32>,
    delta: BTreeSet<(u32, Arc<str>)>,
}

/// The hash an index orders a token by: 32 bits of the table's hasher (a collision only makes a
/// scan look at a key it then passes over).
fn hash32(hasher: &RandomState, token: &str) -> u32 {
    (hasher.hash_one(token) >> 32) as u32
}

/// Sorts the base's positions that have `slot`'s token by (hash of it, position).
fn index_base(base: &Sorted, slot: Slot, hasher: &RandomState) -> Vec<u32> {
    let mut by: Vec<(u32, u32)> = Vec::new();
    let mut w = base.walk_from(0);
    while let Some((p, key, _, _)) = w.next_record() {
        if let Some(t) = slot.token(key) {
            by.push((hash32(hasher, t), p as u32));
        }
    }
    by.sort_unstable();
    let mut positions: Vec<u32> = by.into_iter().map(|(_, p)| p).collect();
    positions.shrink_to_fit();
    positions
}

/// The delta's part of the index of `slot`: its keys having that token, by (hash, key).
fn index_delta(delta: &BTreeMap<Arc<str>, Stored>, slot: Slot, hasher: &RandomState) -> BTreeSet<(u32, Arc<str>)> {
    delta.keys().filter_map(|k| slot.token(k).map(|t| (hash32(hasher, t), k.clone()))).collect()
}

/// A compaction under way: its identity, and the keys changed since its copy was taken.
#[derive(Debug)]
struct Compaction {
    id: u64,
    journal: Vec<Arc<str>>,
}

/// Identities of tables and compactions, unique in the process: a base built for one table
/// never lands in another (a table moved whole to another mirror, or emptied).
fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Fewest changed entries worth a new base.
const MIN_DELTA: usize = 4096;

/// A mirror's entries (see the module's doc).
#[derive(Debug, Default)]
pub(crate) struct Table {
    base: Arc<Sorted>,
    dead: Bits,
    dead_count: usize,
    delta: BTreeMap<Arc<str>, Stored>,
    indexes: Vec<Index>,
    /// The hasher every index of this table uses (random per table: no writer can aim keys at
    /// one hash).
    hasher: RandomState,
    pending: Option<Compaction>,
    /// Indexes being built on a thread of their own (see [`Table::start_index`]).
    building: Vec<Slot>,
}

/// Most keys whose index is built inline, while the scan that needs it waits (~0.1 s a million
/// keys); a larger table builds it on a thread of its own (seconds at ten million), and the scan
/// is told to ask again.
pub(crate) const INLINE_INDEX_KEYS: usize = 1 << 20;

/// An index to build off the lock: over this base, by this slot.
pub(crate) struct IndexJob {
    slot: Slot,
    base: Arc<Sorted>,
    hasher: RandomState,
}

/// An index built off the lock, to install.
pub(crate) struct BuiltIndex {
    slot: Slot,
    base: Arc<Sorted>,
    positions: Vec<u32>,
}

impl IndexJob {
    pub(crate) fn build(self) -> BuiltIndex {
        let positions = index_base(&self.base, self.slot, &self.hasher);
        BuiltIndex { slot: self.slot, base: self.base, positions }
    }
}

/// What a compaction builds from, taken under the lock: the base, its bits, the delta.
pub(crate) struct Job {
    id: u64,
    base: Arc<Sorted>,
    dead: Bits,
    delta: Vec<(Arc<str>, Stored)>,
    slots: Vec<Slot>,
    hasher: RandomState,
}

/// A new base, built off the lock, to install.
pub(crate) struct NewBase {
    id: u64,
    base: Sorted,
    indexes: Vec<(Slot, Vec<u32>)>,
}

impl Job {
    /// Merges the base's current records and the delta into a new base (no lock held).
    pub(crate) fn build(self) -> NewBase {
        let mut out = Sorted::with_capacity(
            self.base.len() + self.delta.len(),
            self.base.arena.len() + self.delta.iter().map(|(k, v)| k.len() + v.value.len()).sum::<usize>(),
        );
        let mut delta = self.delta.iter().peekable();
        let mut w = self.base.walk_from(0);
        while let Some((pos, key, revision, value)) = w.next_record() {
            if self.dead.get(pos) {
                continue;
            }
            while let Some((k, v)) = delta.next_if(|(k, _)| **k < *key) {
                out.push_unchecked(k, v.revision, &v.value);
            }
            out.push_unchecked(key, revision, value);
        }
        for (k, v) in delta {
            out.push_unchecked(k, v.revision, &v.value);
        }
        out.shrink_to_fit();
        let indexes = self.slots.iter().map(|&s| (s, index_base(&out, s, &self.hasher))).collect();
        NewBase { id: self.id, base: out, indexes }
    }
}

impl Table {
    /// A table whose base is `base`.
    pub(crate) fn from_sorted(base: Sorted) -> Self {
        let dead = Bits::new(base.len());
        Table { base: Arc::new(base), dead, ..Self::default() }
    }

    pub(crate) fn len(&self) -> usize {
        self.base.len() - self.dead_count + self.delta.len()
    }

    /// Entries in the delta (changed since the base was built).
    #[cfg(test)]
    pub(crate) fn delta_len(&self) -> usize {
        self.delta.len()
    }

    fn base_pos(&self, key: &str) -> Option<usize> {
        self.base.find(key).ok().filter(|&p| !self.dead.get(p))
    }

    pub(crate) fn get(&self, key: &str) -> Option<(u64, &[u8])> {
        if let Some(v) = self.delta.get(key) {
            return Some((v.revision, &v.value));
        }
        self.base_pos(key).map(|p| self.base.value_at(p))
    }

    pub(crate) fn contains(&self, key: &str) -> bool {
        self.delta.contains_key(key) || self.base_pos(key).is_some()
    }

    fn journal(&mut self, key: &Arc<str>) {
        if let Some(p) = self.pending.as_mut() {
            p.journal.push(key.clone());
        }
    }

    /// Sets `key`; the length of the value it replaces, if it had one.
    pub(crate) fn insert(&mut self, key: &str, revision: u64, value: &[u8]) -> Option<usize> {
        let stored = Stored { revision, value: value.into() };
        if let Some((k, old)) = self.delta.get_key_value(key) {
            let (k, was) = (k.clone(), old.value.len());
            self.delta.insert(k.clone(), stored);
            self.journal(&k);
            return Some(was);
        }
        let was = self.base_pos(key).map(|p| {
            self.dead.set(p);
            self.dead_count += 1;
            self.base.value_at(p).1.len()
        });
        let key: Arc<str> = key.into();
        for index in self.indexes.iter_mut() {
            if let Some(t) = index.slot.token(&key) {
                index.delta.insert((hash32(&self.hasher, t), key.clone()));
            }
        }
        self.journal(&key);
        self.delta.insert(key, stored);
        was
    }

    /// Removes `key`; the length of its value, if it had one.
    pub(crate) fn remove(&mut self, key: &str) -> Option<usize> {
        if let Some((k, old)) = self.delta.remove_entry(key) {
            for index in self.indexes.iter_mut() {
                if let Some(t) = index.slot.token(&k) {
                    index.delta.remove(&(hash32(&self.hasher, t), k.clone()));
                }
            }
            self.journal(&k);
            return Some(old.value.len());
        }
        let p = self.base_pos(key)?;
        self.dead.set(p);
        self.dead_count += 1;
        self.journal(&Arc::from(key));
        Some(self.base.value_at(p).1.len())
    }

    /// Whether no current entry is older than `revision`, told without walking the base: its
    /// oldest record (a removed one too: the answer errs towards a walk) and the delta's.
    pub(crate) fn none_older_than(&self, revision: u64) -> bool {
        self.base.min_revision().is_none_or(|m| m >= revision) && self.delta.values().all(|v| v.revision >= revision)
    }

    /// The current entries from `start` on, in key order.
    pub(crate) fn range<'a>(&'a self, start: Bound<&str>) -> impl Iterator<Item = Record<'a>> + 'a {
        let base = BaseRecords { walk: self.base.walk_from(self.base.lower_bound(start)), dead: &self.dead };
        let delta = self.delta.range::<str, _>((start, Bound::Unbounded)).map(|(k, v)| (Cow::Borrowed(&**k), v.revision, &*v.value));
        Merge { a: base.peekable(), b: delta.peekable() }
    }

    pub(crate) fn has_index(&self, slot: Slot) -> bool {
        self.indexes.iter().any(|i| i.slot == slot)
    }

    pub(crate) fn indexes(&self) -> usize {
        self.indexes.len()
    }

    /// Builds the index of `slot` (a scan needs it), unless it exists.
    pub(crate) fn build_index(&mut self, slot: Slot) {
        if self.has_index(slot) {
            return;
        }
        let base = index_base(&self.base, slot, &self.hasher);
        let delta = index_delta(&self.delta, slot, &self.hasher);
        self.indexes.push(Index { slot, base, delta });
    }

    /// The current entries whose `slot` token hashes as `token` does, after `after`, in key
    /// order: a superset of those whose token is `token` (hashes collide), `None` when there is
    /// no index of `slot`.
    pub(crate) fn by_token<'a>(&'a self, slot: Slot, token: &str, after: Option<&str>) -> Option<impl Iterator<Item = Record<'a>> + 'a> {
        let index = self.indexes.iter().find(|i| i.slot == slot)?;
        let hash = hash32(&self.hasher, token);
        let hash_of = move |key: &str| slot.token(key).map(|t| hash32(&self.hasher, t));
        let from = index.base.partition_point(|&p| {
            let key = self.base.get_at(p as usize).0;
            match hash_of(&key) {
                Some(h) if h != hash => h < hash,
                _ => after.is_some_and(|a| *key <= *a),
            }
        });
        let base = index.base[from..]
            .iter()
            .map(|&p| (p as usize, self.base.get_at(p as usize)))
            .take_while(move |(_, (key, _, _))| hash_of(key) == Some(hash))
            .filter(|(p, _)| !self.dead.get(*p))
            .map(|(_, (key, revision, value))| (Cow::Owned(key), revision, value));
        let start = (hash, Arc::<str>::from(after.unwrap_or("")));
        let start = if after.is_some() { Bound::Excluded(start) } else { Bound::Included(start) };
        let delta = index
            .delta
            .range((start, Bound::Unbounded))
            .take_while(move |(h, _)| *h == hash)
            .filter_map(|(_, k)| self.delta.get_key_value(&**k))
            .map(|(k, v)| (Cow::Borrowed(&**k), v.revision, &*v.value));
        Some(Merge { a: base.peekable(), b: delta.peekable() })
    }

    /// Whether the delta is large enough to be built into a new base. Never while
    /// `replaying`: the table grows as fast as the bus delivers, each build would soon be
    /// outgrown, and every put would look its key up in a base that keeps growing; what a
    /// replay leaves in the delta is packed once it is in sync.
    pub(crate) fn compaction_due(&self, replaying: bool) -> bool {
        !replaying && self.pending.is_none() && self.delta.len() >= MIN_DELTA.max(self.len() / 16)
    }

    /// Starts a compaction: what to build a new base from. Changes from now on are journaled.
    pub(crate) fn start_compaction(&mut self) -> Job {
        let id = next_id();
        self.pending = Some(Compaction { id, journal: Vec::new() });
        Job {
            id,
            base: self.base.clone(),
            dead: self.dead.clone(),
            delta: self.delta.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            slots: self.indexes.iter().map(|i| i.slot).collect(),
            hasher: self.hasher.clone(),
        }
    }

    /// Forgets the work under way aside: a compaction's base will not be installed (its
    /// changes are no longer journaled), nor an index (the table was moved or emptied).
    pub(crate) fn abandon_work_aside(&mut self) {
        self.pending = None;
        self.building.clear();
    }

    /// Forgets a compaction that could not be started (no thread to build it on).
    pub(crate) fn compaction_not_started(&mut self) {
        self.pending = None;
    }

    /// Forgets an index build that could not be started (no thread to build it on).
    pub(crate) fn index_not_started(&mut self, slot: Slot) {
        self.building.retain(|s| *s != slot);
    }

    /// Whether the index of `slot` is being built.
    pub(crate) fn building(&self, slot: Slot) -> bool {
        self.building.contains(&slot)
    }

    /// Starts building the index of `slot` off the lock (see [`INLINE_INDEX_KEYS`]).
    pub(crate) fn start_index(&mut self, slot: Slot) -> IndexJob {
        self.building.push(slot);
        IndexJob { slot, base: self.base.clone(), hasher: self.hasher.clone() }
    }

    /// Installs an index built off the lock, with the delta's part made now; whether it was
    /// (not when the base was packed anew meanwhile: the next scan that needs it starts again).
    pub(crate) fn install_index(&mut self, built: BuiltIndex) -> bool {
        self.building.retain(|s| *s != built.slot);
        if !Arc::ptr_eq(&self.base, &built.base) || self.has_index(built.slot) {
            return false;
        }
        let slot = built.slot;
        let delta = index_delta(&self.delta, slot, &self.hasher);
        self.indexes.push(Index { slot, base: built.positions, delta });
        true
    }

    /// Whether a compaction is under way.
    #[cfg(test)]
    pub(crate) fn compacting(&self) -> bool {
        self.pending.is_some()
    }

    /// Installs a built base, the changes made since its copy laid over it, in time in
    /// proportion to those changes; nothing when it is not this table's compaction under way.
    /// What it replaced is handed back, to be freed once the lock is given up.
    pub(crate) fn install(&mut self, built: NewBase) -> Option<Garbage> {
        if self.pending.as_ref().map(|p| p.id) != Some(built.id) {
            return None;
        }
        let journal = self.pending.take().map(|p| p.journal).unwrap_or_default();
        let base = built.base;
        let mut dead = Bits::new(base.len());
        let mut dead_count = 0;
        let mut delta = BTreeMap::new();
        for k in &journal {
            if let Ok(p) = base.find(k) {
                if dead.set(p) {
                    dead_count += 1;
                }
            }
            // Changed since the copy: still current only here. (The rest of the delta is in the
            // new base.)
            if let Some((k, v)) = self.delta.remove_entry(&**k) {
                delta.insert(k, v);
            }
        }
        let mut indexes = Vec::with_capacity(self.indexes.len());
        let mut built_indexes = built.indexes;
        for slot in self.indexes.iter().map(|i| i.slot) {
            let base_index = match built_indexes.iter().position(|(s, _)| *s == slot) {
                Some(i) => built_indexes.swap_remove(i).1,
                // NewBase since the copy was taken: built again over the new base.
                None => index_base(&base, slot, &self.hasher),
            };
            let delta = index_delta(&delta, slot, &self.hasher);
            indexes.push(Index { slot, base: base_index, delta });
        }
        self.dead = dead;
        self.dead_count = dead_count;
        Some(Garbage {
            base: std::mem::replace(&mut self.base, Arc::new(base)),
            delta: std::mem::replace(&mut self.delta, delta),
            indexes: std::mem::replace(&mut self.indexes, indexes),
        })
    }
}

/// What an install replaced: freed by whoever drops it, after the lock.
pub(crate) struct Garbage {
    base: Arc<Sorted>,
    delta: BTreeMap<Arc<str>, Stored>,
    indexes: Vec<Index>,
}

impl Garbage {
    /// Entries it holds apart from the base (the delta packed into the new one).
    pub(crate) fn entries(&self) -> usize {
        self.delta.len() + self.indexes.iter().map(|i| i.delta.len()).sum::<usize>()
    }

    /// The packed bytes of the base it replaced.
    pub(crate) fn base_bytes(&self) -> usize {
        self.base.arena.len()
    }
}

/// One entry as a table reads it: its key (made whole from the base's packed record, or
/// borrowed from the delta), revision and value.
pub(crate) type Record<'a> = (Cow<'a, str>, u64, &'a [u8]);

/// The base's current records, in order.
struct BaseRecords<'a> {
    walk: Walk<'a>,
    dead: &'a Bits,
}

impl<'a> Iterator for BaseRecords<'a> {
    type Item = Record<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (pos, key, revision, value) = self.walk.next_record()?;
            if !self.dead.get(pos) {
                return Some((Cow::Owned(key.to_string()), revision, value));
            }
        }
    }
}

/// Two iterators in ascending key order, merged (no key is in both).
struct Merge<A: Iterator, B: Iterator> {
    a: std::iter::Peekable<A>,
    b: std::iter::Peekable<B>,
}

impl<'a, A, B> Iterator for Merge<A, B>
where
    A: Iterator<Item = Record<'a>>,
    B: Iterator<Item = Record<'a>>,
{
    type Item = Record<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        match (self.a.peek(), self.b.peek()) {
            (Some(x), Some(y)) if y.0 < x.0 => self.b.next(),
            (Some(_), _) => self.a.next(),
            (None, _) => self.b.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (no dependency for it).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn key(r: &mut Rng) -> String {
        format!("n{}.m{}.{}", r.below(5), r.below(40), ["config", "secret", "dir"][r.below(3) as usize])
    }

    fn contents(t: &Table) -> Vec<(String, u64, Vec<u8>)> {
        t.range(Bound::Unbounded).map(|(k, r, v)| (k.into_owned(), r, v.to_vec())).collect()
    }

    fn model_contents(m: &BTreeMap<String, (u64, Vec<u8>)>) -> Vec<(String, u64, Vec<u8>)> {
        m.iter().map(|(k, (r, v))| (k.clone(), *r, v.clone())).collect()
    }

    #[test]
    fn finds_the_common_prefix_wherever_the_keys_part() {
        let base = "alpha.m000123.config.nam=C3=A9.é".as_bytes();
        for len in 0..=base.len() {
            for at in 0..=len {
                let mut other = base[..len].to_vec();
                if let Some(b) = other.get_mut(at) {
                    *b ^= 0x20;
                }
                let want = base.iter().zip(&other).take_while(|(x, y)| x == y).count();
                assert_eq!(common_prefix(base, &other), want, "{len} bytes, parted at {at}");
                assert_eq!(common_prefix(&other, base), want, "{len} bytes, parted at {at}, the other way");
            }
        }
        assert_eq!(common_prefix(b"", b"abc"), 0);
    }

    #[test]
    fn packs_records_and_finds_them_by_key() {
        let mut s = Sorted::new();
        assert!(s.push("a.b", 7, b"one"));
        assert!(s.push("a.c", 300, b""));
        assert!(s.push("b", u64::MAX, &[0xff; 200]));
        assert!(!s.push("a.z", 1, b"x"), "out of order is refused");
        assert!(!s.push("b", 1, b"x"), "a key twice is refused");
        assert_eq!((s.len(), s.raw_bytes(), s.max_revision()), (3, 3 + 3 + 3 + 1 + 200, u64::MAX));
        assert_eq!(s.get_at(1), ("a.c".to_string(), 300, &b""[..]));
        assert_eq!(s.get_at(2).2.len(), 200);
        assert!(s.contains("a.b") && !s.contains("a") && !s.contains("c"));
        assert_eq!(s.lower_bound(Bound::Excluded("a.b")), 1);
        assert_eq!(s.lower_bound(Bound::Included("a.bb")), 1);
    }

    #[test]
    fn finds_every_key_whether_blocks_tie_on_their_heads_or_not() {
        // Many blocks with one head (their first 16 bytes equal), keys shorter than a head,
        // and keys that differ only past it.
        let mut keys: Vec<String> = (0..200).map(|i| format!("alpha.m000420.config.name{i:03}")).collect();
        keys.extend(["a", "a.b", "alpha", "alpha.m000420.c", "alpha.m000420.co", "alpha.m000420.config", "b"].map(String::from));
        keys.extend((0..40).map(|i| format!("beta.m{i:06}.secret.x")));
        keys.sort();
        let mut s = Sorted::new();
        for (i, k) in keys.iter().enumerate() {
            assert!(s.push(k, i as u64 + 1, k.as_bytes()));
        }
        let mut asked: Vec<String> = keys.clone();
        asked.extend(["", "0", "alpha.m000420.config.name0", "alpha.m000420.config.name1999", "alpha.m000420.cz", "zz"].map(String::from));
        for key in &asked {
            let want = keys.partition_point(|k| k < key);
            let exact = keys.get(want) == Some(key);
            assert_eq!(s.find(key), if exact { Ok(want) } else { Err(want) }, "{key:?}");
        }
    }

    #[test]
    fn a_head_orders_keys_as_their_bytes_do_unless_it_ties() {
        let keys = ["", "a", "a.b", "alpha.m000420.co", "alpha.m000420.config", "alpha.m000420.cz", "b", "é"];
        for a in keys {
            for b in keys {
                let (ha, hb) = (head(a.as_bytes()), head(b.as_bytes()));
                if ha != hb {
                    assert_eq!(ha < hb, a < b, "{a:?} {b:?}");
                }
            }
        }
        assert_eq!(head(b"alpha.m000420.co"), head(b"alpha.m000420.config"));
    }

    #[test]
    fn counts_the_ties_of_a_head_at_any_length() {
        for len in 0..70 {
            for equal in 0..=len {
                let heads: Vec<u128> = (0..len).map(|i| if i < equal { 7 } else { 9 }).collect();
                assert_eq!(ties(&heads, 7), equal, "{equal} of {len}");
            }
        }
    }

    #[test]
    fn offsets_past_4_gib_are_told_apart_by_their_wraps() {
        // The arithmetic without 4 GiB of memory: a wrap at block 2.
        let s = Sorted { blocks: vec![10, 20, 5, 9], wraps: vec![2], ..Sorted::default() };
        assert_eq!((s.block_offset(1), s.block_offset(2), s.block_offset(3)), (20, (1 << 32) | 5, (1 << 32) | 9));
    }

    #[test]
    fn keys_sharing_a_prefix_are_stored_once_and_read_back_whole_from_any_position() {
        let keys: Vec<String> = (0..100)
            .map(|i| format!("alpha.m{:06}.config.name{}", i / 10, i % 10))
            .chain(["alpha.é.x".to_string(), "alpha.é.y".to_string(), "alpha.éa".to_string()])
            .collect();
        let mut keys = keys;
        keys.sort();
        let mut s = Sorted::new();
        for (i, k) in keys.iter().enumerate() {
            assert!(s.push(k, i as u64, k.as_bytes()));
        }
        let raw: usize = keys.iter().map(|k| 2 * k.len()).sum();
        assert!(s.arena.len() < raw * 3 / 4, "{} packed bytes for {raw} raw", s.arena.len());
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(s.get_at(i), (k.clone(), i as u64, k.as_bytes()));
            assert_eq!(s.find(k), Ok(i));
            let mut w = s.walk_from(i);
            let rest: Vec<String> = std::iter::from_fn(|| w.next_record().map(|r| r.1.to_string())).collect();
            assert_eq!(rest, keys[i..]);
        }
        assert_eq!(s.find("alpha.m000003.config.name55"), Err(keys.iter().position(|k| k.as_str() > "alpha.m000003.config.name55").unwrap()));
        assert_eq!(s.find("a"), Err(0));
        assert_eq!(s.find("zzz"), Err(keys.len()));
    }

    #[test]
    fn answers_as_an_ordered_map_would_through_writes_compactions_and_journaled_changes() {
        for seed in 1..40u64 {
            let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut t = Table::default();
            let mut model: BTreeMap<String, (u64, Vec<u8>)> = BTreeMap::new();
            let mut job: Option<Job> = None;
            if seed % 3 == 0 {
                t.build_index(Slot::Last);
                t.build_index(Slot::At(1));
            }
            for step in 0..600u64 {
                let k = key(&mut r);
                match r.below(10) {
                    0..=5 => {
                        let v = vec![b'v'; r.below(8) as usize];
                        let was = t.insert(&k, step, &v);
                        assert_eq!(was, model.insert(k, (step, v)).map(|o| o.1.len()));
                    }
                    6..=7 => assert_eq!(t.remove(&k), model.remove(&k).map(|o| o.1.len())),
                    8 if job.is_none() && !t.compacting() => job = Some(t.start_compaction()),
                    _ => {
                        if let Some(j) = job.take() {
                            assert!(t.install(j.build()).is_some());
                        }
                    }
                }
                if step % 50 == 0 && seed % 2 == 0 {
                    t.build_index(Slot::At(2));
                }
                assert_eq!(t.len(), model.len(), "seed {seed} step {step}");
            }
            assert_eq!(contents(&t), model_contents(&model), "seed {seed}");
            for (k, (rev, v)) in &model {
                assert_eq!(t.get(k), Some((*rev, &v[..])));
            }
            assert_eq!(t.get("n9.none"), None);
            // Ranges from every key and between keys.
            for (k, _) in model.iter().step_by(7) {
                let want: Vec<&String> = model.range::<String, _>((Bound::Excluded(k), Bound::Unbounded)).map(|e| e.0).collect();
                let got: Vec<String> = t.range(Bound::Excluded(k)).map(|e| e.0.into_owned()).collect();
                assert_eq!(got.iter().collect::<Vec<_>>(), want);
            }
            // Every index answers by token, from any cursor.
            for slot in [Slot::Last, Slot::At(1), Slot::At(2)] {
                if !t.has_index(slot) {
                    continue;
                }
                for token in ["config", "m3", "secret", "n1"] {
                    let want: Vec<&String> = model.keys().filter(|k| slot.token(k) == Some(token)).collect();
                    let got: Vec<String> = t.by_token(slot, token, None).unwrap().map(|e| e.0.into_owned()).filter(|k| slot.token(k) == Some(token)).collect();
                    assert_eq!(got.iter().collect::<Vec<_>>(), want, "seed {seed} {slot:?} {token}");
                    if let Some(mid) = want.get(want.len() / 2) {
                        let rest: Vec<String> =
                            t.by_token(slot, token, Some(mid)).unwrap().map(|e| e.0.into_owned()).filter(|k| slot.token(k) == Some(token)).collect();
                        assert_eq!(rest, want[want.len() / 2 + 1..].iter().map(|k| k.to_string()).collect::<Vec<_>>());
                    }
                }
            }
        }
    }

    #[test]
    fn a_packed_table_of_a_node_clients_keys_costs_less_than_their_raw_bytes() {
        // The bus bench's shape: a 26-byte key, a 45-byte value.
        let value = br#"{"placeholder":"${config:name}","part":"api"}"#;
        let mut t = Table::default();
        t.build_index(Slot::Last);
        for i in 0..100_000u64 {
            t.insert(&format!("alpha.m{:06}.config.name{}", i / 10, i % 10), i + 1, value);
            if t.compaction_due(false) {
                let job = t.start_compaction();
                assert!(t.install(job.build()).is_some());
            }
        }
        let job = t.start_compaction();
        assert!(t.install(job.build()).is_some());
        let raw = t.base.raw_bytes();
        assert_eq!(raw, 100_000 * (26 + value.len()));
        let held = t.base.arena.capacity()
            + t.base.blocks.capacity() * 4
            + t.base.heads.capacity() * 16
            + t.dead.0.capacity() * 8
            + t.indexes.iter().map(|i| i.base.capacity() * 4).sum::<usize>();
        // 45 bytes of value, ~5 of key past what it shares with the key before, 4 of lengths and
        // revision, 4 of index, 1 of the blocks' heads: ~0.84 of the raw 71.
        assert!(held < raw * 85 / 100, "{held} bytes held for {raw} raw: sorted keys share most of their bytes");
        assert_eq!(t.delta_len(), 0);
    }

    #[test]
    fn an_index_built_off_the_lock_lands_only_over_the_base_it_was_built_from() {
        let mut t = Table::default();
        for i in 0..5000u64 {
            t.insert(&format!("n{}.m{i:05}.config", i % 3), i + 1, b"v");
        }
        let job = t.start_compaction();
        assert!(t.install(job.build()).is_some());
        let index = t.start_index(Slot::At(2));
        assert!(t.building(Slot::At(2)));
        t.insert("n9.m99999.config", 9999, b"new");
        assert!(t.install_index(index.build()));
        assert!(!t.building(Slot::At(2)) && t.has_index(Slot::At(2)));
        let found = t.by_token(Slot::At(2), "config", Some("n8")).unwrap().map(|e| e.0.into_owned()).collect::<Vec<_>>();
        assert_eq!(found, ["n9.m99999.config"], "the delta's keys are indexed at install");
        // A base packed anew meanwhile: the index is not installed, and may be asked for again.
        let stale = t.start_index(Slot::Last);
        let job = t.start_compaction();
        assert!(t.install(job.build()).is_some());
        assert!(!t.install_index(stale.build()));
        assert!(!t.has_index(Slot::Last) && !t.building(Slot::Last));
    }

    #[test]
    fn a_compaction_of_another_table_or_an_abandoned_one_is_not_installed() {
        let mut a = Table::default();
        a.insert("x", 1, b"1");
        let job = a.start_compaction();
        a.abandon_work_aside();
        assert!(a.install(job.build()).is_none());
        let mut b = Table::default();
        let job = a.start_compaction();
        let _ = b.start_compaction();
        assert!(b.install(job.build()).is_none(), "b's compaction is another");
        assert_eq!(contents(&a), vec![("x".to_string(), 1, b"1".to_vec())]);
    }

    #[test]
    fn a_compaction_leaves_a_small_delta_and_is_due_again_only_when_it_grows() {
        let mut t = Table::default();
        for i in 0..MIN_DELTA * 2 {
            t.insert(&format!("k{i:06}"), i as u64, b"value");
        }
        assert!(t.compaction_due(false));
        let job = t.start_compaction();
        assert!(!t.compaction_due(false), "one at a time");
        t.insert("k000001", 99, b"new");
        t.remove("k000002");
        t.insert("z", 100, b"z");
        assert!(t.install(job.build()).is_some());
        assert_eq!((t.delta_len(), t.len()), (2, MIN_DELTA * 2), "only what changed meanwhile stays in the delta");
        assert_eq!(t.get("k000001"), Some((99, &b"new"[..])));
        assert_eq!(t.get("k000002"), None);
        assert!(!t.compaction_due(false));
    }
}
