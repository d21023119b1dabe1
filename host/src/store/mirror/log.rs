//! A full replay's messages as they come, in stream order ([`Log`]), made into a mirror's packed
//! base in one step when the replay ends ([`Log::build`]).
//!
//! A replay delivers every key once, in the order it was last written, not in key order;
//! putting each into an ordered map cost more than reading the message (docs/performance.md).
//! Here a message is two appends (its key and value to
//! one arena, 24 bytes of where to a list); the build sorts the list once, keeps each key's
//! newest message, and writes the base in key order. Nothing is looked up until then.

use std::sync::Arc;

use super::{Runs, Sorted};

/// Where one message's key and value are in the arena.
struct Op {
    revision: u64,
    at: usize,
    key: u32,
    /// The value's length; `u32::MAX`: a delete or purge marker.
    value: u32,
}

const MARKER: u32 = u32::MAX;

/// A log of this many messages or more is sorted on two threads ([`Log::sort`]).
const SORT_IN_TWO_FROM: usize = 1 << 16;
/// Keys read to choose where a log is split.
const PIVOT_SAMPLE: usize = 255;

/// Ops ahead of the one being packed whose key is asked for early ([`prefetch`]).
const PREFETCH_AHEAD: usize = 8;

/// Asks the processor for the cache line holding `arena[at]`, which the build reads a few ops
/// later. In key order a log's messages are read at random (a key's message sits where it was
/// logged, in an arena larger than any cache): each key was a wait for memory.
#[inline]
fn prefetch(arena: &[u8], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(byte) = arena.get(at) {
        // SAFETY: a prefetch is a hint: it cannot fault and changes no memory, and the address
        // is in the arena anyway.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((byte as *const u8).cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (arena, at);
}

/// Moves the ops for which `below` holds before the others; how many there are.
fn partition(ops: &mut [Op], below: impl Fn(&Op) -> bool) -> usize {
    let (mut first, mut last) = (0, ops.len());
    loop {
        while first < last && below(&ops[first]) {
            first += 1;
        }
        while first < last && !below(&ops[last - 1]) {
            last -= 1;
        }
        if first == last {
            return first;
        }
        ops.swap(first, last - 1);
        first += 1;
        last -= 1;
    }
}

/// What a replay delivered so far.
#[derive(Default)]
pub struct Log {
    arena: Vec<u8>,
    ops: Vec<Op>,
}

/// A log made into what a mirror holds: its entries, its markers, the newest revision, and each
/// writer's share of the entries, counted as they were packed.
pub struct Packed {
    pub entries: Sorted,
    pub runs: Runs,
    pub markers: Vec<(Arc<str>, u64)>,
    pub revision: u64,
}

impl Log {
    /// A put of `value` at `key`. A key or value past 4 GiB is not a bucket's (its server's
    /// max payload is far below): refused, with the caller to say so.
    pub fn put(&mut self, key: &str, revision: u64, value: &[u8]) -> bool {
        let (Ok(k), Ok(v)) = (u32::try_from(key.len()), u32::try_from(value.len())) else { return false };
        if v == MARKER {
            return false;
        }
        self.ops.push(Op { revision, at: self.arena.len(), key: k, value: v });
        self.arena.extend_from_slice(key.as_bytes());
        self.arena.extend_from_slice(value);
        true
    }

    /// A delete or purge of `key`.
    pub fn delete(&mut self, key: &str, revision: u64) -> bool {
        let Ok(k) = u32::try_from(key.len()) else { return false };
        self.ops.push(Op { revision, at: self.arena.len(), key: k, value: MARKER });
        self.arena.extend_from_slice(key.as_bytes());
        true
    }

    /// The bytes held: what a memory budget counts.
    pub fn bytes(&self) -> usize {
        self.arena.len() + self.ops.len() * std::mem::size_of::<Op>()
    }

    fn key(&self, op: &Op) -> &[u8] {
        &self.arena[op.at..op.at + op.key as usize]
    }

    /// Sorts `ops` by key, the newest last (a key written again during the replay comes twice).
    ///
    /// The sort reads keys at random in an arena larger than any cache, and it is what a
    /// replay's end waits for (at 1M keys on one thread, ~150 ms of a ~260 ms packing): a large log is split
    /// at a pivot key into the keys below it and the rest, and each side sorted on a thread of
    /// its own. The split reads the keys in the order they were logged, the arena's own. The
    /// replay is over by then: the bus and the runtime thread are idle.
    fn sort(&self, ops: &mut [Op]) {
        let by_key = |a: &Op, b: &Op| self.key(a).cmp(self.key(b)).then(a.revision.cmp(&b.revision));
        let Some(pivot) = (ops.len() >= SORT_IN_TWO_FROM).then(|| self.pivot(ops)) else {
            ops.sort_unstable_by(by_key);
            return;
        };
        let below = partition(ops, |op| self.key(op) < pivot.as_slice());
        let (low, high) = ops.split_at_mut(below);
        let aside = std::thread::scope(|s| {
            let other = std::thread::Builder::new().name("mesh-mirror-pack".into()).spawn_scoped(s, || low.sort_unstable_by(by_key));
            high.sort_unstable_by(by_key);
            other.map_err(|e| tracing::debug!("packing a replay on one thread: {e}")).is_ok()
        });
        // A thread that could not be made leaves its side to this one.
        if !aside {
            low.sort_unstable_by(by_key);
        }
    }

    /// The median of keys sampled evenly over the log (a copy: the sides are sorted in place).
    fn pivot(&self, ops: &[Op]) -> Vec<u8> {
        let mut sample: Vec<&[u8]> = (0..PIVOT_SAMPLE).map(|i| self.key(&ops[i * ops.len() / PIVOT_SAMPLE])).collect();
        sample.sort_unstable();
        sample[PIVOT_SAMPLE / 2].to_vec()
    }

    /// Each key's newest message, in key order: its value as an entry, or its marker. CPU work
    /// in proportion to n log n: run it off the runtime thread.
    pub fn build(mut self) -> Packed {
        let mut ops = std::mem::take(&mut self.ops);
        self.sort(&mut ops);
        let (mut entries, mut markers, mut revision) = (Sorted::with_capacity(ops.len(), self.arena.len()), Vec::new(), 0);
        let mut runs = Runs::default();
        for (i, op) in ops.iter().enumerate() {
            if let Some(ahead) = ops.get(i + PREFETCH_AHEAD) {
                prefetch(&self.arena, ahead.at);
            }
            revision = revision.max(op.revision);
            let key = self.key(op);
            if ops.get(i + 1).is_some_and(|next| self.key(next) == key) {
                continue;
            }
            // Keys came from subjects, which are UTF-8; one that is not would never have been
            // logged (the watch gives `String`s).
            let Ok(key) = std::str::from_utf8(key) else { continue };
            if op.value == MARKER {
                markers.push((Arc::from(key), op.revision));
            } else {
                let at = op.at + op.key as usize;
                let value = &self.arena[at..at + op.value as usize];
                runs.add(key, value.len());
                entries.push_in_order(key, op.revision, value);
            }
        }
        entries.shrink_to_fit();
        Packed { entries, runs, markers, revision }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Logs `messages` puts and deletes over `keys` keys (at random, multi-byte ones among
    /// them) and checks the build against a model of what the last message of each key said.
    fn builds_as_the_model_says(messages: u64, keys: u64) {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut log = Log::default();
        let mut model: BTreeMap<String, (u64, Option<Vec<u8>>)> = BTreeMap::new();
        for revision in 1..=messages {
            let r = next();
            let key = format!("{}.m{}.é{}", ["alpha", "beta", "b"][(r % 3) as usize], (r >> 8) % keys, (r >> 40) % 5);
            if (r >> 24) % 7 == 0 {
                assert!(log.delete(&key, revision));
                model.insert(key, (revision, None));
            } else {
                let value = format!("v{revision}").into_bytes();
                assert!(log.put(&key, revision, &value));
                model.insert(key, (revision, Some(value)));
            }
        }
        let built = log.build();
        assert_eq!(built.revision, messages);
        let mut walk = built.entries.walk_from(0);
        let mut got: Vec<(String, u64, Vec<u8>)> = Vec::new();
        let mut runs = Runs::default();
        while let Some((_, k, rev, v)) = walk.next_record() {
            got.push((k.to_string(), rev, v.to_vec()));
            runs.add(k, v.len());
        }
        assert_eq!(built.runs, runs, "the writers' shares counted while packing differ from the packed entries'");
        let want: Vec<(String, u64, Vec<u8>)> = model.iter().filter_map(|(k, (rev, v))| Some((k.clone(), *rev, v.clone()?))).collect();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the built entries differ from the model");
        let markers: Vec<(String, u64)> = built.markers.iter().map(|(k, r)| (k.to_string(), *r)).collect();
        let want: Vec<(String, u64)> = model.iter().filter(|(_, (_, v))| v.is_none()).map(|(k, (r, _))| (k.clone(), *r)).collect();
        assert!(markers == want, "the built markers differ from the model");
    }

    #[test]
    fn builds_each_keys_newest_message_in_key_order() {
        // Few keys, so most come again.
        builds_as_the_model_says(5000, 40);
    }

    #[test]
    fn a_log_sorted_on_two_threads_builds_the_same() {
        const { assert!(200_000 >= SORT_IN_TWO_FROM) };
        // Keys come again on both sides of the split, and next to it.
        builds_as_the_model_says(200_000, 20_000);
    }

    #[test]
    fn a_split_keeps_each_op_on_its_side_of_the_pivot() {
        for (n, cut) in [(0, 0), (1, 0), (1, 1), (2, 1), (7, 3), (8, 8), (9, 0)] {
            let mut ops: Vec<Op> = (0..n).map(|i| Op { revision: (i * 5 % n.max(1)) as u64, at: 0, key: 0, value: 0 }).collect();
            let below = partition(&mut ops, |op| (op.revision as usize) < cut);
            assert_eq!(below, cut.min(n), "{n} ops, {cut} below");
            assert!(ops[..below].iter().all(|op| (op.revision as usize) < cut) && ops[below..].iter().all(|op| op.revision as usize >= cut));
        }
    }

    #[test]
    fn a_key_written_again_during_the_replay_keeps_its_newest_message_whatever_came_first() {
        let mut log = Log::default();
        log.put("alpha.a", 5, b"new");
        log.put("alpha.b", 2, b"b");
        log.delete("alpha.b", 7);
        log.put("alpha.a", 3, b"old");
        let built = log.build();
        assert_eq!(built.entries.len(), 1);
        assert_eq!(built.entries.get_at(0), ("alpha.a".to_string(), 5, &b"new"[..]));
        assert_eq!(built.markers, vec![(Arc::from("alpha.b"), 7)]);
    }
}
