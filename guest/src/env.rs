//! What the logic may ask of its host, as a plain Rust trait.
//!
//! The component's bindings implement it with the WIT imports; unit tests implement it in memory.
//! Keeping binding types out of the logic is what lets the logic compile and test natively.

use std::fmt;

/// One key of a bucket, as last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub revision: u64,
    pub value: Vec<u8>,
}

impl Entry {
    pub fn borrowed(&self) -> EntryRef<'_> {
        EntryRef { key: &self.key, revision: self.revision, value: &self.value }
    }
}

/// One key of a bucket as a [`Page`] holds it: borrowed from the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRef<'p> {
    pub key: &'p str,
    pub revision: u64,
    pub value: &'p [u8],
}

impl EntryRef<'_> {
    pub fn owned(&self) -> Entry {
        Entry { key: self.key.to_string(), revision: self.revision, value: self.value.to_vec() }
    }
}

/// One page of a scan (the WIT `page`): its keys end to end in one string and its values in
/// one buffer, as the host lowers them, so a page is a few allocations however many entries it
/// holds, and each entry is read from it borrowed ([`Page::entries`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    keys: String,
    values: Vec<u8>,
    /// Two for each entry: where its key ends in `keys`, then where its value ends in `values`.
    /// Checked when the page is made: each end at or past the one before, within its buffer,
    /// every key's on a character's boundary, and the last ones the buffers' lengths.
    ends: Vec<usize>,
    revisions: Vec<u64>,
    pub more: bool,
    pub revision: u64,
}

impl Page {
    /// An empty page that reflects `revision`.
    pub fn new(revision: u64) -> Page {
        Page { revision, ..Page::default() }
    }

    /// The page the host sent, if its `lengths` (a key's then a value's, for each of
    /// `revisions`) cut its buffers whole: a key cut inside a character, a length past its
    /// buffer or bytes left over are refused, naming which.
    pub fn from_parts(keys: String, values: Vec<u8>, lengths: Vec<u32>, revisions: Vec<u64>, more: bool, revision: u64) -> Result<Page, String> {
        if lengths.len() != 2 * revisions.len() {
            return Err(format!("a page of {} entries with {} lengths (two for each)", revisions.len(), lengths.len()));
        }
        let mut at = [0usize; 2];
        let ends: Vec<usize> = lengths
            .into_iter()
            .enumerate()
            .map(|(i, len)| {
                let end = &mut at[i % 2];
                *end = end.saturating_add(len as usize);
                *end
            })
            .collect();
        for (i, pair) in ends.chunks_exact(2).enumerate() {
            if !keys.is_char_boundary(pair[0]) {
                return Err(format!("entry {i}'s key ends at byte {} of {}, not between two characters", pair[0], keys.len()));
            }
            if pair[1] > values.len() {
                return Err(format!("entry {i}'s value ends at byte {} of {}", pair[1], values.len()));
            }
        }
        if at != [keys.len(), values.len()] {
            return Err(format!("a page's entries take {} bytes of keys and {} of values, of {} and {}", at[0], at[1], keys.len(), values.len()));
        }
        Ok(Page { keys, values, ends, revisions, more, revision })
    }

    /// Adds an entry after the last (an in-memory host's way to make a page).
    pub fn push(&mut self, key: &str, revision: u64, value: &[u8]) {
        self.keys.push_str(key);
        self.values.extend_from_slice(value);
        self.ends.extend([self.keys.len(), self.values.len()]);
        self.revisions.push(revision);
    }

    pub fn len(&self) -> usize {
        self.revisions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.revisions.is_empty()
    }

    /// Entry `i`, borrowed from the page.
    fn entry(&self, i: usize) -> EntryRef<'_> {
        let (key_from, value_from) = match i {
            0 => (0, 0),
            _ => (self.ends[2 * i - 2], self.ends[2 * i - 1]),
        };
        EntryRef { key: &self.keys[key_from..self.ends[2 * i]], revision: self.revisions[i], value: &self.values[value_from..self.ends[2 * i + 1]] }
    }

    /// The entries, in the page's order (the key's byte order).
    pub fn entries(&self) -> impl DoubleEndedIterator<Item = EntryRef<'_>> + ExactSizeIterator {
        (0..self.len()).map(|i| self.entry(i))
    }

    pub fn last(&self) -> Option<EntryRef<'_>> {
        self.len().checked_sub(1).map(|i| self.entry(i))
    }
}

/// Why a host operation failed (the WIT `host-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostError {
    Unavailable(String),
    Conflict(String),
    Denied(String),
    Invalid(String),
    Timeout(String),
    NoResponders(String),
    Corrupt(String),
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Unavailable(m) => write!(f, "unavailable: {m}"),
            HostError::Conflict(m) => write!(f, "conflict: {m}"),
            HostError::Denied(m) => write!(f, "denied: {m}"),
            HostError::Invalid(m) => write!(f, "invalid: {m}"),
            HostError::Timeout(m) => write!(f, "timeout: {m}"),
            HostError::NoResponders(m) => write!(f, "no responders: {m}"),
            HostError::Corrupt(m) => write!(f, "corrupt: {m}"),
        }
    }
}

/// What the host knows of a bucket besides its contents (the WIT `bucket-health`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// Settings of its stream that let one writer remove or crowd out another's keys.
    pub unsafe_settings: Vec<String>,
    /// Writers (a key's first token) past the host's quota: writer, keys, bytes.
    pub over_quota: Vec<(String, u64, u64)>,
    /// Writers whose share the bucket no longer sources (nodes that left the mesh): writer,
    /// keys, bytes.
    pub orphaned: Vec<(String, u64, u64)>,
}

/// A revision an answer is to reflect (the WIT `mark`): a bucket's, or a node share's
/// sequence; `None`: the one the bus holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub name: String,
    pub revision: Option<u64>,
}

/// How far the mirrors reflect one [`Mark`] (the WIT `reached`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reached {
    pub name: String,
    pub asked: u64,
    pub revision: u64,
}

impl Reached {
    pub fn is_reached(&self) -> bool {
        self.revision >= self.asked
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// The host, as the logic sees it.
pub trait Env {
    fn get(&self, bucket: &str, key: &str) -> Result<Option<Entry>, HostError>;
    fn scan(&self, bucket: &str, filter: &str, after: Option<&str>, limit: u32) -> Result<Page, HostError>;
    /// Whether `bucket` exists (a missing bucket reads as empty).
    fn exists(&self, bucket: &str) -> Result<bool, HostError>;
    /// What is wrong with `bucket` besides its contents (nothing, unless a host says so).
    fn health(&self, _bucket: &str) -> Result<Health, HostError> {
        Ok(Health::default())
    }
    /// Waits until the mirrors reflect every mark or `wait_ms` ran out; how far each got. A host
    /// whose reads are always current (an in-memory one) reaches every mark at once.
    fn reach(&self, marks: &[Mark], _wait_ms: u32) -> Result<Vec<Reached>, HostError> {
        Ok(marks.iter().map(|m| Reached { name: m.name.clone(), asked: m.revision.unwrap_or(0), revision: m.revision.unwrap_or(0) }).collect())
    }
    /// How many instances of the micro service `service` answer discovery now.
    fn responders(&self, service: &str) -> Result<u32, HostError>;
    fn put_registry(&self, key: &str, value: &[u8], expected: u64) -> Result<u64, HostError>;
    fn delete_registry(&self, key: &str, expected: u64) -> Result<(), HostError>;
    fn log(&self, level: Level, message: &str);
    /// The plan kept for `module` on `node`, as last saved.
    fn load_plan(&self, node: &str, module: &str) -> Result<Option<Vec<u8>>, HostError>;
    /// Keeps `plan` for `module` on `node`.
    fn save_plan(&self, node: &str, module: &str, plan: &[u8]) -> Result<(), HostError>;
    /// Why the last attempt to keep the plan of `module` on `node` failed, if it did.
    fn keep_failure(&self, node: &str, module: &str) -> Option<String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(entries: &[(&str, u64, &[u8])]) -> (String, Vec<u8>, Vec<u32>, Vec<u64>) {
        let mut p = (String::new(), Vec::new(), Vec::new(), Vec::new());
        for (key, revision, value) in entries {
            p.0.push_str(key);
            p.1.extend_from_slice(value);
            p.2.extend([key.len() as u32, value.len() as u32]);
            p.3.push(*revision);
        }
        p
    }

    #[test]
    fn reads_each_entry_back_from_the_buffers_it_was_cut_from() {
        let entries: [(&str, u64, &[u8]); 4] = [("alpha.app.config.é", 3, b"{}"), ("alpha.b", 9, b""), ("", 1, b"\xff\x00"), ("béta.x", u64::MAX, b"v")];
        let (keys, values, lengths, revisions) = parts(&entries);
        let page = Page::from_parts(keys, values, lengths, revisions, true, 12).expect("a page cut whole");
        let read: Vec<(&str, u64, &[u8])> = page.entries().map(|e| (e.key, e.revision, e.value)).collect();
        assert_eq!(read, entries);
        assert_eq!((page.len(), page.more, page.revision), (4, true, 12));
        assert_eq!(page.last().map(|e| e.key), Some("béta.x"));
        let mut pushed = Page::new(12);
        pushed.more = true;
        for (key, revision, value) in entries {
            pushed.push(key, revision, value);
        }
        assert_eq!(pushed, page);
        let empty = Page::from_parts(String::new(), Vec::new(), Vec::new(), Vec::new(), false, 0).expect("an empty page");
        assert!(empty.is_empty() && empty.last().is_none() && empty.entries().next().is_none());
    }

    #[test]
    fn refuses_a_page_whose_lengths_do_not_cut_it_whole() {
        let entries: [(&str, u64, &[u8]); 2] = [("é.a", 1, b"12"), ("b", 2, b"3")];
        let (keys, values, lengths, revisions) = parts(&entries);
        let cut = |lengths: Vec<u32>, revisions: Vec<u64>| Page::from_parts(keys.clone(), values.clone(), lengths, revisions, false, 2).unwrap_err();
        assert!(cut(lengths[..3].to_vec(), revisions.clone()).contains("2 entries with 3 lengths"));
        assert!(cut(vec![1, 2, 4, 1], revisions.clone()).contains("entry 0's key ends at byte 1 of 5, not between two characters"));
        assert!(cut(vec![4, 2, 1, 2], revisions.clone()).contains("entry 1's value ends at byte 4 of 3"));
        assert!(cut(vec![4, 2, 0, 1], revisions.clone()).contains("take 4 bytes of keys and 3 of values, of 5 and 3"));
        assert!(cut(vec![4, 2, 1, 0], revisions.clone()).contains("take 5 bytes of keys and 2 of values"));
        assert!(cut(vec![u32::MAX, 2, u32::MAX, 1], revisions.clone()).contains("entry 0's key ends"));
    }
}
