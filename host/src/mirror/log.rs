//! A full replay's messages as they come, in stream order ([`Log`]), made into a mirror's packed
//! base in one step when the replay ends ([`Log::build`]).
//!
//! A replay delivers every key once, in the order it was last written, not in key order;
//! putting each into an ordered map cost more than reading the message (a start at 1M keys was
//! 1.4× a plain watch of the same bucket). Here a message is two appends (its key and value to
//! one arena, 24 bytes of where to a list); the build sorts the list once, keeps each key's
//! newest message, and writes the base in key order. Nothing is looked up until then.

use std::sync::Arc;

use super::Sorted;

/// Where one message's key and value are in the arena.
struct Op {
    revision: u64,
    at: usize,
    key: u32,
    /// The value's length; `u32::MAX`: a delete or purge marker.
    value: u32,
}

const MARKER: u32 = u32::MAX;

/// What a replay delivered so far.
#[derive(Default)]
pub struct Log {
    arena: Vec<u8>,
    ops: Vec<Op>,
}

/// A log made into what a mirror holds: its entries, its markers, the newest revision.
pub struct Built {
    pub entries: Sorted,
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

    /// Each key's newest message, in key order: its value as an entry, or its marker. CPU work
    /// in proportion to n log n: run it off the runtime thread.
    pub fn build(mut self) -> Built {
        let mut ops = std::mem::take(&mut self.ops);
        // By key, the newest last (a key written again during the replay comes twice).
        ops.sort_unstable_by(|a, b| self.key(a).cmp(self.key(b)).then(a.revision.cmp(&b.revision)));
        let (mut entries, mut markers, mut revision) = (Sorted::with_capacity(ops.len(), self.arena.len()), Vec::new(), 0);
        for (i, op) in ops.iter().enumerate() {
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
                entries.push(key, op.revision, &self.arena[at..at + op.value as usize]);
            }
        }
        entries.shrink_to_fit();
        Built { entries, markers, revision }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn builds_each_keys_newest_message_in_key_order() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut log = Log::default();
        let mut model: BTreeMap<String, (u64, Option<Vec<u8>>)> = BTreeMap::new();
        for revision in 1..5000u64 {
            let r = next();
            // Few keys, so most come again; multi-byte ones among them.
            let key = format!("{}.m{}.é{}", ["alpha", "beta", "b"][(r % 3) as usize], (r >> 8) % 40, (r >> 16) % 5);
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
        assert_eq!(built.revision, 4999);
        let mut walk = built.entries.walk_from(0);
        let mut got: Vec<(String, u64, Vec<u8>)> = Vec::new();
        while let Some((_, k, rev, v)) = walk.next_record() {
            got.push((k.to_string(), rev, v.to_vec()));
        }
        let want: Vec<(String, u64, Vec<u8>)> = model.iter().filter_map(|(k, (rev, v))| Some((k.clone(), *rev, v.clone()?))).collect();
        assert_eq!(got, want);
        let markers: Vec<(String, u64)> = built.markers.iter().map(|(k, r)| (k.to_string(), *r)).collect();
        let want: Vec<(String, u64)> = model.iter().filter(|(_, (_, v))| v.is_none()).map(|(k, (r, _))| (k.clone(), *r)).collect();
        assert_eq!(markers, want);
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
