//! Snapshots of the mirrors in the state directory, so that a restart resumes each bucket's
//! watch where its snapshot ends instead of replaying the whole bucket.
//!
//! One file per bucket, `<state>/mirrors/<bucket>.mirror`, little-endian:
//!
//! ```text
//! "MPMIRROR"  u32 version (1)  u16 bucket length, bucket  i128 stream creation (ns)  u64 revision
//! records: 1, u32 key length, key, u64 revision, u32 value length, value   (ascending keys)
//!          2, u32 key length, key, u64 revision                          (a delete marker)
//!          0                                                              (the end)
//! the SHA-256 of everything before it
//! ```
//!
//! A snapshot is written in steps (a read lock per step, so the follower's writes wait one step
//! at most) off the runtime thread, into a new private file renamed over the old one. Entries
//! may be newer than the header's revision (written while the walk went on): a watch resumed
//! after that revision replays every change since, in order, so the mirror ends as the bus is.
//! A walk that saw the mirror replaced (a resync, a rebuild) is abandoned.
//!
//! Nothing in a file is trusted: it is read whole, its checksum checked before anything in it
//! is read, every length bounded, and refused (with the reason) when it is damaged, of another
//! version, of another bucket or of another stream (the bucket made anew), or ahead of its
//! stream. The host does not look inside a key here either: keys are bytes in order.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::backend::Backend;
use crate::error::{Error, ErrorKind, Result};
use crate::mirror::{Mirror, Sorted, MAX_SUBJECT};

const MAGIC: &[u8; 8] = b"MPMIRROR";
const VERSION: u32 = 1;
/// The largest value a snapshot may hold: NATS's own largest payload.
const MAX_VALUE: usize = 64 << 20;
/// Bytes encoded under one read lock of the mirror.
const STEP: usize = 1 << 20;
const ENTRY: u8 = 1;
const MARKER: u8 = 2;
const END: u8 = 0;

/// The stream a snapshot is loaded against: its identity and how far it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream {
    /// The stream's creation time, in nanoseconds since the Unix epoch.
    pub created_ns: i128,
    pub last_sequence: u64,
}

/// What a save wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    pub revision: u64,
    pub entries: u64,
    pub markers: u64,
    pub bytes: u64,
}

/// What a load restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    pub revision: u64,
    pub entries: usize,
    pub markers: usize,
    /// What the load took, step by step: the file read, its checksum, its records parsed, the
    /// mirror built from them.
    pub took: [Duration; 4],
}

/// The snapshots of one server, in one directory of its state directory.
#[derive(Debug, Clone)]
pub struct Snapshots {
    dir: PathBuf,
}

impl Snapshots {
    pub fn new(dir: PathBuf) -> Self {
        Snapshots { dir }
    }

    /// The file of `bucket`'s snapshot (a bucket's name is a stream's: letters, digits, `-`, `_`).
    pub fn path(&self, bucket: &str) -> PathBuf {
        self.dir.join(format!("{bucket}.mirror"))
    }

    /// Writes `mirror`'s snapshot (blocking: call it off the runtime thread). `None` when there
    /// is nothing to keep: the mirror is replaying, refused, of a missing bucket, or of no
    /// known stream. An error when the file cannot be written or the mirror was replaced while
    /// it was (the old file stays).
    pub fn save(&self, bucket: &str, mirror: &Mirror) -> Result<Option<Saved>> {
        let generation = mirror.generation();
        let census = mirror.census();
        let Some(origin) = mirror.origin() else { return Ok(None) };
        if !census.ready || mirror.refused().is_some() || !mirror.exists() {
            return Ok(None);
        }
        let io = |e: std::io::Error| Error::new(ErrorKind::Unavailable, format!("writing the snapshot of {bucket}: {e}"));
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let mut saved = Saved { revision: census.revision, entries: 0, markers: 0, bytes: 0 };
        crate::files::write_private_with(&self.path(bucket), |out| {
            let mut out = Hashing { inner: out, hash: Sha256::new() };
            let mut head = Vec::with_capacity(64 + bucket.len());
            head.extend_from_slice(MAGIC);
            head.extend_from_slice(&VERSION.to_le_bytes());
            head.extend_from_slice(&(bucket.len() as u16).to_le_bytes());
            head.extend_from_slice(bucket.as_bytes());
            head.extend_from_slice(&origin.to_le_bytes());
            head.extend_from_slice(&census.revision.to_le_bytes());
            out.write_all(&head)?;
            let mut step = Vec::with_capacity(STEP + 4096);
            let mut after: Option<Arc<str>> = None;
            loop {
                step.clear();
                let last = mirror.visit(after.as_deref(), &mut |key, revision, value| {
                    step.push(ENTRY);
                    step.extend_from_slice(&(key.len() as u32).to_le_bytes());
                    step.extend_from_slice(key.as_bytes());
                    step.extend_from_slice(&revision.to_le_bytes());
                    step.extend_from_slice(&(value.len() as u32).to_le_bytes());
                    step.extend_from_slice(value);
                    saved.entries += 1;
                    saved.bytes += (key.len() + value.len()) as u64;
                    step.len() < STEP
                });
                out.write_all(&step)?;
                match last {
                    Some(k) => after = Some(k),
                    None => break,
                }
            }
            step.clear();
            for (key, revision) in mirror.tombstones() {
                step.push(MARKER);
                step.extend_from_slice(&(key.len() as u32).to_le_bytes());
                step.extend_from_slice(key.as_bytes());
                step.extend_from_slice(&revision.to_le_bytes());
                saved.markers += 1;
            }
            step.push(END);
            out.write_all(&step)?;
            let digest = out.hash.finalize();
            out.inner.write_all(&digest)?;
            if mirror.generation() != generation {
                return Err(std::io::Error::other("the mirror was replaced while its snapshot was written"));
            }
            Ok(())
        })
        .map_err(io)?;
        Ok(Some(saved))
    }

    /// Fills `into` (an empty mirror) from `bucket`'s snapshot, checked against `stream`
    /// (blocking). `None` when there is no snapshot; an error ([`ErrorKind::Corrupt`], saying
    /// why) when there is one that may not be used — `into` is then left empty.
    pub fn load(&self, bucket: &str, stream: Stream, into: &Mirror) -> Result<Option<Loaded>> {
        let path = self.path(bucket);
        let file = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(refused(&path, format!("cannot be opened: {e}"))),
        };
        let mut took = [Duration::ZERO; 4];
        let mut lap = Instant::now();
        let mut step = |i: usize| {
            took[i] = lap.elapsed();
            lap = Instant::now();
        };
        let mut bytes = Vec::new();
        let mut file = file;
        file.read_to_end(&mut bytes).map_err(|e| refused(&path, format!("cannot be read: {e}")))?;
        step(0);
        let body = verified(&bytes).map_err(|why| refused(&path, why))?;
        step(1);
        let read = parse(body, bucket).map_err(|why| refused(&path, why))?;
        step(2);
        drop(bytes);
        if read.origin != stream.created_ns {
            return Err(refused(&path, "it is of another stream (the bucket was made anew)".into()));
        }
        let newest = read.markers.iter().map(|m| m.1).max().unwrap_or(0).max(read.entries.max_revision()).max(read.revision);
        if newest > stream.last_sequence {
            return Err(refused(&path, format!("it holds revision {newest}, past the stream's last {} (the bucket was made anew)", stream.last_sequence)));
        }
        let (revision, entries, markers) = (read.revision, read.entries.len(), read.markers.len());
        into.restore(read.entries, read.markers, read.revision, read.origin).map_err(|e| refused(&path, e.to_string()))?;
        step(3);
        Ok(Some(Loaded { revision, entries, markers, took }))
    }
}

/// Keeps the snapshots of a backend's mirrors: each mirror whose contents moved since its last
/// snapshot is written again, one at a time, off the runtime thread.
pub struct Keeper {
    backend: Arc<dyn Backend>,
    snapshots: Snapshots,
    /// What each bucket's last snapshot was of: its stream and revision.
    saved: HashMap<String, (Option<i128>, u64)>,
}

impl Keeper {
    pub fn new(backend: Arc<dyn Backend>, snapshots: Snapshots) -> Self {
        Keeper { backend, snapshots, saved: HashMap::new() }
    }

    /// Saves every `every`, until dropped.
    pub async fn run(mut self, every: Duration) {
        let mut t = tokio::time::interval(every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t.tick().await;
        loop {
            t.tick().await;
            self.save_all().await;
        }
    }

    /// Saves each mirror that moved since its last snapshot; how many were written.
    pub async fn save_all(&mut self) -> usize {
        let mut written = 0;
        for (bucket, mirror) in self.backend.mirrors() {
            let now = (mirror.origin(), mirror.revision());
            if self.saved.get(&bucket) == Some(&now) {
                continue;
            }
            let (snapshots, name) = (self.snapshots.clone(), bucket.clone());
            let started = Instant::now();
            match tokio::task::spawn_blocking(move || snapshots.save(&name, &mirror)).await {
                Ok(Ok(Some(saved))) => {
                    tracing::debug!(bucket, revision = saved.revision, keys = saved.entries, bytes = saved.bytes, elapsed = ?started.elapsed(), "mirror snapshot written");
                    self.saved.insert(bucket, (now.0, saved.revision));
                    written += 1;
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => tracing::warn!(bucket, "{e}"),
                Err(e) => tracing::warn!(bucket, "writing the snapshot failed: {e}"),
            }
        }
        written
    }
}

fn refused(path: &Path, why: String) -> Error {
    Error::new(ErrorKind::Corrupt, format!("the snapshot {} is not used: {why}", path.display()))
}

/// A writer that hashes what it writes.
struct Hashing<'a> {
    inner: &'a mut dyn Write,
    hash: Sha256,
}

impl Write for Hashing<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A snapshot as read, checksum checked.
struct Read_ {
    origin: i128,
    revision: u64,
    entries: Sorted,
    markers: Vec<(Arc<str>, u64)>,
}

/// The bytes of a snapshot, read from the front; says what it was reading when they ended.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> std::result::Result<&'a [u8], String> {
        if self.rest.len() < n {
            return Err(format!("it ends inside {what} (truncated)"));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &str) -> std::result::Result<[u8; N], String> {
        let mut b = [0u8; N];
        b.copy_from_slice(self.take(N, what)?);
        Ok(b)
    }

    fn u8(&mut self, what: &str) -> std::result::Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// `len` bytes, refused past `max`.
    fn bytes(&mut self, len: u32, max: usize, what: &str) -> std::result::Result<&'a [u8], String> {
        let len = len as usize;
        if len > max {
            return Err(format!("{what} of {len} bytes is longer than {max}"));
        }
        self.take(len, what)
    }

    fn key(&mut self, what: &str) -> std::result::Result<&'a str, String> {
        let len = self.u32(what)?;
        let b = self.bytes(len, MAX_SUBJECT, what)?;
        let key = std::str::from_utf8(b).map_err(|_| format!("{what} is not UTF-8"))?;
        crate::mirror::check_subject(key, false).map_err(|e| format!("{what} {key:?}: {e}"))?;
        Ok(key)
    }
}

/// Reads a snapshot file whole: its checksum is checked before anything in it is read.
#[cfg(test)]
fn read(file: &[u8], bucket: &str) -> std::result::Result<Read_, String> {
    parse(verified(file)?, bucket)
}

/// The body of a snapshot file (all before its checksum) when it is one and its checksum holds.
fn verified(file: &[u8]) -> std::result::Result<&[u8], String> {
    if file.len() < MAGIC.len() || &file[..MAGIC.len()] != MAGIC {
        return Err("it is not a mirror snapshot".into());
    }
    let Some(body_len) = file.len().checked_sub(32) else { return Err("it ends before its checksum (truncated)".into()) };
    let (body, stored) = file.split_at(body_len);
    if Sha256::digest(body)[..] != stored[..] {
        return Err("its checksum does not match (damaged or truncated)".into());
    }
    Ok(body)
}

/// The records of a verified body.
fn parse(body: &[u8], bucket: &str) -> std::result::Result<Read_, String> {
    let mut src = Cursor { rest: &body[MAGIC.len()..] };
    let version = src.u32("the header")?;
    if version != VERSION {
        return Err(format!("it is of version {version}; this server reads version {VERSION}"));
    }
    let len = u16::from_le_bytes(src.array("the header")?);
    let name = src.bytes(len.into(), u16::MAX.into(), "the bucket's name")?;
    if name != bucket.as_bytes() {
        return Err(format!("it is of bucket {:?}, not {bucket}", String::from_utf8_lossy(name)));
    }
    let origin = i128::from_le_bytes(src.array("the header")?);
    let revision = src.u64("the header")?;
    // The packed records take about the file's bytes; a record per 64 of them is about the
    // size of an entry of a node client's bucket: one allocation each, most of the time.
    let mut entries = Sorted::with_capacity(body.len() / 64, body.len());
    let mut markers: Vec<(Arc<str>, u64)> = Vec::new();
    loop {
        match src.u8("a record")? {
            ENTRY => {
                let key = src.key("a key")?;
                let rev = src.u64("a revision")?;
                let len = src.u32("a value")?;
                let value = src.bytes(len, MAX_VALUE, "a value")?;
                if !entries.push(key, rev, value) {
                    return Err(format!("key {key:?} is out of order"));
                }
            }
            MARKER => {
                let key = src.key("a marker's key")?;
                let rev = src.u64("a revision")?;
                markers.push((Arc::from(key), rev));
            }
            END => break,
            other => return Err(format!("a record of unknown kind {other}")),
        }
    }
    if !src.rest.is_empty() {
        return Err("bytes follow its last record".into());
    }
    let mut seen = std::collections::HashSet::with_capacity(markers.len());
    for (k, _) in &markers {
        if !seen.insert(k.clone()) {
            return Err(format!("the marker of {k:?} is there twice"));
        }
        if entries.contains(k) {
            return Err(format!("key {k:?} is both held and deleted"));
        }
    }
    entries.shrink_to_fit();
    Ok(Read_ { origin, revision, entries, markers })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATED: i128 = 1_764_000_000_123_456_789;

    fn mirror_with(keys: &[(&str, u64, &str)], deleted: &[(&str, u64)]) -> Mirror {
        let m = Mirror::new();
        for (k, r, v) in keys {
            m.put(k, *r, v.as_bytes());
        }
        for (k, r) in deleted {
            m.delete(k, *r);
        }
        m.set_origin(CREATED);
        m.set_ready(true);
        m
    }

    fn stream(last: u64) -> Stream {
        Stream { created_ns: CREATED, last_sequence: last }
    }

    fn contents(m: &Mirror) -> Vec<(String, u64, Vec<u8>)> {
        let mut all = Vec::new();
        m.visit(None, &mut |k, r, v| {
            all.push((k.to_string(), r, v.to_vec()));
            true
        });
        all
    }

    #[test]
    fn a_saved_mirror_loads_as_it_was_markers_and_revision_included() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshots::new(dir.path().join("mirrors"));
        let m = mirror_with(&[("alpha.app.config.db", 3, "\"x\""), ("beta.app.secret.pw", 5, "{}"), ("gamma.m.dir.s", 6, "")], &[("alpha.old.config.a", 7)]);
        let saved = snaps.save("needs", &m).unwrap().expect("saved");
        assert_eq!((saved.revision, saved.entries, saved.markers), (7, 3, 1));
        let back = Mirror::new();
        let loaded = snaps.load("needs", stream(9), &back).unwrap().expect("loaded");
        assert_eq!((loaded.revision, loaded.entries, loaded.markers), (7, 3, 1));
        assert_eq!(contents(&back), contents(&m));
        assert_eq!(back.census().subjects, m.census().subjects);
        assert_eq!((back.revision(), back.bytes(), back.origin()), (7, m.bytes(), Some(CREATED)));
        // The file is this user's alone.
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(snaps.path("needs")).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_large_mirror_is_written_in_steps_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshots::new(dir.path().to_path_buf());
        let m = Mirror::new();
        let value = vec![b'v'; 300];
        for i in 0..10_000u64 {
            m.put(&format!("n{}.m.config.k{i:05}", i % 7), i + 1, &value);
        }
        m.set_origin(CREATED);
        m.set_ready(true);
        assert_eq!(snaps.save("b", &m).unwrap().unwrap().entries, 10_000);
        let back = Mirror::new();
        snaps.load("b", stream(10_000), &back).unwrap().unwrap();
        assert_eq!(contents(&back), contents(&m));
    }

    #[test]
    fn nothing_is_saved_of_a_mirror_not_in_sync_or_of_no_known_stream() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshots::new(dir.path().to_path_buf());
        let m = mirror_with(&[("a.b", 1, "1")], &[]);
        m.set_ready(false);
        assert_eq!(snaps.save("b", &m).unwrap(), None);
        let unknown = Mirror::new();
        unknown.put("a.b", 1, b"1");
        unknown.set_ready(true);
        assert_eq!(snaps.save("b", &unknown).unwrap(), None);
        assert!(!snaps.path("b").exists());
    }

    #[test]
    fn no_snapshot_is_none_and_leaves_the_mirror_empty() {
        let dir = tempfile::tempdir().unwrap();
        let m = Mirror::new();
        assert_eq!(Snapshots::new(dir.path().to_path_buf()).load("b", stream(1), &m).unwrap(), None);
        assert!(m.is_empty());
    }

    fn refusal(snaps: &Snapshots, bucket: &str, s: Stream) -> String {
        let m = Mirror::new();
        let e = snaps.load(bucket, s, &m).expect_err("refused");
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(m.is_empty() && m.tombstones().is_empty(), "nothing of a refused snapshot is kept");
        e.to_string()
    }

    #[test]
    fn refuses_a_snapshot_of_another_stream_bucket_or_ahead_of_its_stream() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshots::new(dir.path().to_path_buf());
        snaps.save("needs", &mirror_with(&[("a.b", 4, "1")], &[])).unwrap().unwrap();
        let anew = refusal(&snaps, "needs", Stream { created_ns: CREATED + 1, last_sequence: 9 });
        assert!(anew.contains("another stream"), "{anew}");
        let behind = refusal(&snaps, "needs", stream(3));
        assert!(behind.contains("past the stream's last 3"), "{behind}");
        // Another bucket's file put in its place.
        std::fs::copy(snaps.path("needs"), snaps.path("applied")).unwrap();
        let foreign = refusal(&snaps, "applied", stream(9));
        assert!(foreign.contains("of bucket \"needs\", not applied"), "{foreign}");
    }

    #[test]
    fn refuses_a_damaged_truncated_or_other_version_file_whatever_byte_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshots::new(dir.path().to_path_buf());
        snaps.save("b", &mirror_with(&[("a.b", 1, "one"), ("a.c", 2, "two")], &[("a.d", 3)])).unwrap().unwrap();
        let good = std::fs::read(snaps.path("b")).unwrap();
        // Every byte flipped in turn, every length cut: each refused, none panics.
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x5a;
            std::fs::write(snaps.path("b"), &bad).unwrap();
            refusal(&snaps, "b", stream(9));
        }
        for n in 0..good.len() {
            std::fs::write(snaps.path("b"), &good[..n]).unwrap();
            refusal(&snaps, "b", stream(9));
        }
        let mut longer = good.clone();
        longer.push(0);
        std::fs::write(snaps.path("b"), &longer).unwrap();
        assert!(refusal(&snaps, "b", stream(9)).contains("checksum does not match"));
        // Another version, checksum and all.
        let mut other = good[..good.len() - 32].to_vec();
        other[8..12].copy_from_slice(&2u32.to_le_bytes());
        let digest = Sha256::digest(&other);
        other.extend_from_slice(&digest);
        std::fs::write(snaps.path("b"), &other).unwrap();
        assert!(refusal(&snaps, "b", stream(9)).contains("version 2"));
        std::fs::write(snaps.path("b"), b"not a snapshot at all").unwrap();
        assert!(refusal(&snaps, "b", stream(9)).contains("not a mirror snapshot"));
        std::fs::write(snaps.path("b"), &good).unwrap();
        assert!(snaps.load("b", stream(9), &Mirror::new()).unwrap().is_some());
    }

    #[test]
    fn a_length_past_its_bound_is_refused_even_under_a_good_checksum() {
        let mut file = Vec::new();
        file.extend_from_slice(MAGIC);
        file.extend_from_slice(&VERSION.to_le_bytes());
        file.extend_from_slice(&1u16.to_le_bytes());
        file.push(b'b');
        file.extend_from_slice(&CREATED.to_le_bytes());
        file.extend_from_slice(&1u64.to_le_bytes());
        file.push(ENTRY);
        file.extend_from_slice(&u32::MAX.to_le_bytes());
        let digest = Sha256::digest(&file);
        file.extend_from_slice(&digest);
        let why = read(&file, "b").err().expect("refused");
        assert!(why.contains("longer than 4096"), "{why}");
    }

    #[test]
    fn a_snapshot_loaded_forgets_what_the_stream_no_longer_holds() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshots::new(dir.path().to_path_buf());
        snaps.save("b", &mirror_with(&[("a.old", 2, "1"), ("a.new", 8, "2")], &[("a.gone", 3), ("a.late", 9)])).unwrap().unwrap();
        let m = Mirror::new();
        snaps.load("b", stream(12), &m).unwrap().unwrap();
        // The stream's first message is now 5: what was older expired or was purged.
        assert_eq!(m.forget_below(5), 2);
        assert_eq!(contents(&m), vec![("a.new".to_string(), 8, b"2".to_vec())]);
        assert_eq!(m.tombstones().iter().map(|(k, r)| (k.to_string(), *r)).collect::<Vec<_>>(), vec![("a.late".to_string(), 9)]);
        assert_eq!(m.census().subjects, 2);
    }
}
