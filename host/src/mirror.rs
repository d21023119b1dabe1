//! In-memory mirrors of buckets, which answer the guest's `store` import.
//!
//! A mirror is fed by whoever owns it (a JetStream watch with history, or a test) and answers
//! `get` and `scan` from memory: a scan starts at the filter's literal prefix, so a narrowed
//! query costs in proportion to its answer, not to the bucket. Matching a subject filter is NATS
//! subject syntax, not a key shape: the host never parses what a key means.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::error::{Error, ErrorKind, Result};

/// Most entries one scan returns, whatever the guest asks.
pub const MAX_SCAN: u32 = 10_000;
/// Longest filter or key accepted from the guest.
pub const MAX_SUBJECT: usize = 4096;

/// One stored value. Boxed slices keep a million-key mirror small.
#[derive(Debug, Clone)]
struct Stored {
    revision: u64,
    value: Box<[u8]>,
}

/// One entry as the guest receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub revision: u64,
    pub value: Vec<u8>,
}

/// One page of a scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    pub entries: Vec<Entry>,
    pub more: bool,
    pub revision: u64,
}

#[derive(Debug, Default)]
struct State {
    entries: BTreeMap<Box<str>, Stored>,
    revision: u64,
    ready: bool,
    /// The bucket does not exist (the mirror is then empty).
    missing: bool,
}

/// A bucket's contents, as of [`Mirror::revision`].
#[derive(Debug, Default)]
pub struct Mirror {
    state: RwLock<State>,
    /// Keys looked at by scans, for proving that narrowed scans stay narrow.
    visited: AtomicU64,
}

impl Mirror {
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A poisoned lock only means a writer panicked mid-update of plain data; the map is
        // still a map.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a put seen at `revision`.
    pub fn put(&self, key: &str, revision: u64, value: &[u8]) {
        let mut s = self.write();
        s.revision = s.revision.max(revision);
        s.entries.insert(key.into(), Stored { revision, value: value.into() });
    }

    /// Records a delete or purge seen at `revision`.
    pub fn delete(&self, key: &str, revision: u64) {
        let mut s = self.write();
        s.revision = s.revision.max(revision);
        s.entries.remove(key);
    }

    /// Marks the mirror as in sync (history replayed) or not (watch lost).
    pub fn set_ready(&self, ready: bool) {
        self.write().ready = ready;
    }

    pub fn is_ready(&self) -> bool {
        self.read().ready
    }

    /// Marks the bucket as not existing (emptied) or existing.
    pub fn set_missing(&self, missing: bool) {
        let mut s = self.write();
        if missing {
            s.entries.clear();
        }
        s.missing = missing;
    }

    /// Whether the bucket exists, as last seen.
    pub fn exists(&self) -> bool {
        !self.read().missing
    }

    /// Empties the mirror before a resync.
    pub fn clear(&self) {
        let mut s = self.write();
        s.entries.clear();
        s.ready = false;
    }

    pub fn revision(&self) -> u64 {
        self.read().revision
    }

    pub fn len(&self) -> usize {
        self.read().entries.len()
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
        Ok(s.entries.get(key).map(|v| Entry { key: key.to_string(), revision: v.revision, value: v.value.to_vec() }))
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
        let prefix = literal_prefix(&pattern);
        let s = self.read();
        let start = match after {
            Some(a) if a >= prefix.as_str() => Bound::Excluded(a),
            _ => Bound::Included(prefix.as_str()),
        };
        let mut page = Page { revision: s.revision, ..Page::default() };
        let mut visited = 0;
        for (key, v) in s.entries.range::<str, _>((start, Bound::Unbounded)) {
            visited += 1;
            if !key.starts_with(prefix.as_str()) {
                break;
            }
            if !matches(&pattern, key) {
                continue;
            }
            if page.entries.len() == limit {
                page.more = true;
                break;
            }
            page.entries.push(Entry { key: key.to_string(), revision: v.revision, value: v.value.to_vec() });
        }
        self.visited.fetch_add(visited, Ordering::Relaxed);
        Ok(page)
    }
}

/// The tokens before the first wildcard, with their trailing dot: every match starts with it.
fn literal_prefix(pattern: &[&str]) -> String {
    let mut prefix = String::new();
    for (i, t) in pattern.iter().enumerate() {
        if *t == "*" || *t == ">" {
            return prefix;
        }
        prefix.push_str(t);
        if i + 1 < pattern.len() {
            prefix.push('.');
        }
    }
    prefix
}

/// NATS subject matching: `*` is one token, a final `>` one or more.
pub fn matches(pattern: &[&str], key: &str) -> bool {
    let mut tokens = key.split('.');
    for (i, p) in pattern.iter().enumerate() {
        if *p == ">" {
            return i + 1 == pattern.len() && tokens.next().is_some();
        }
        match tokens.next() {
            Some(t) if *p == "*" || *p == t => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

/// A key or filter as NATS would accept it: non-empty tokens of printable ASCII without spaces;
/// wildcards only in filters, `>` only last.
pub fn check_subject(s: &str, filter: bool) -> Result<()> {
    let bad = |why: &str| Err(Error::new(ErrorKind::Invalid, format!("{} {:?}: {why}", if filter { "filter" } else { "key" }, s.chars().take(80).collect::<String>())));
    if s.is_empty() || s.len() > MAX_SUBJECT {
        return bad("empty or too long");
    }
    let tokens: Vec<&str> = s.split('.').collect();
    for (i, t) in tokens.iter().enumerate() {
        if t.is_empty() {
            return bad("empty token");
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return bad("not printable ASCII");
        }
        let wild = *t == "*" || *t == ">";
        if wild && !filter {
            return bad("a key holds no wildcard");
        }
        if *t == ">" && i + 1 != tokens.len() {
            return bad("`>` must be the last token");
        }
        if !wild && (t.contains('*') || t.contains('>')) {
            return bad("a wildcard must be a whole token");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mirror(keys: &[&str]) -> Mirror {
        let m = Mirror::new();
        for (i, k) in keys.iter().enumerate() {
            m.put(k, i as u64 + 1, k.as_bytes());
        }
        m
    }

    fn keys(p: &Page) -> Vec<&str> {
        p.entries.iter().map(|e| e.key.as_str()).collect()
    }

    #[test]
    fn matches_like_nats() {
        let m = |f: &str, k| matches(&f.split('.').collect::<Vec<_>>(), k);
        assert!(m("a.>", "a.b.c"));
        assert!(!m("a.>", "a"));
        assert!(m("*.b", "a.b"));
        assert!(!m("*.b", "a.b.c"));
        assert!(m(">", "a"));
        assert!(m("a.b", "a.b"));
    }

    #[test]
    fn scans_only_the_narrowed_range_in_order() {
        let m = mirror(&["beta.x.y", "alpha.app.b", "alpha.app.a", "alpha.apx.a", "alpha.app"]);
        assert_eq!(keys(&m.scan("alpha.app.>", None, 10).unwrap()), ["alpha.app.a", "alpha.app.b"]);
        assert_eq!(keys(&m.scan("*.app.*", None, 10).unwrap()), ["alpha.app.a", "alpha.app.b"]);
        let p = m.scan(">", None, 2).unwrap();
        assert_eq!((keys(&p), p.more, p.revision), (vec!["alpha.app", "alpha.app.a"], true, 5));
        assert_eq!(keys(&m.scan(">", Some("alpha.apx.a"), 10).unwrap()), ["beta.x.y"]);
    }

    #[test]
    fn clamps_the_limit() {
        let m = Mirror::new();
        for i in 0..(MAX_SCAN + 5) {
            m.put(&format!("k{i:06}"), 1, b"");
        }
        let p = m.scan(">", None, u32::MAX).unwrap();
        assert_eq!((p.entries.len(), p.more), (MAX_SCAN as usize, true));
        let p = m.scan(">", None, 0).unwrap();
        assert_eq!((p.entries.len(), p.more), (0, true));
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
