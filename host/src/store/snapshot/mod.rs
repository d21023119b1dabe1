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
//! Nothing in a file is trusted: it is read in chunks, hashed by one thread while another
//! parses them (`load.rs`), nothing parsed is used unless the whole file's checksum holds, every
//! length is bounded, and a file is refused (with the reason) when it is damaged, of another
//! version, of another bucket or of another stream (the bucket made anew), or ahead of its
//! stream. The host does not look inside a key here either: keys are bytes in order.

mod load;

pub use load::Took;

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::base::error::{Error, ErrorKind, Result};
use crate::store::backend::Backend;
use crate::store::mirror::Mirror;

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
pub struct StreamPosition {
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
pub struct Restored {
    pub revision: u64,
    pub entries: usize,
    pub markers: usize,
    /// What reading the file took: its reads, its checksum and its parse (the parse beside
    /// the other two, on another thread), and in all.
    pub took: Took,
    /// Building the mirror from what was read.
    pub built: Duration,
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
        crate::base::files::private_dirs(&self.dir).map_err(io)?;
        let mut saved = Saved { revision: census.revision, entries: 0, markers: 0, bytes: 0 };
        crate::base::files::write_private_with(&self.path(bucket), |out| {
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
    pub fn load(&self, bucket: &str, stream: StreamPosition, into: &Mirror) -> Result<Option<Restored>> {
        let path = self.path(bucket);
        let file = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(refused(&path, format!("cannot be opened: {e}"))),
        };
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let (read, took) = load::read(file, size, bucket);
        let read = read.map_err(|why| refused(&path, why))?;
        let lap = Instant::now();
        if read.origin != stream.created_ns {
            return Err(refused(&path, "it is of another stream (the bucket was made anew)".into()));
        }
        let newest = read.markers.iter().map(|m| m.1).max().unwrap_or(0).max(read.entries.max_revision()).max(read.revision);
        if newest > stream.last_sequence {
            return Err(refused(&path, format!("it holds revision {newest}, past the stream's last {} (the bucket was made anew)", stream.last_sequence)));
        }
        let (revision, entries, markers) = (read.revision, read.entries.len(), read.markers.len());
        into.restore(read.entries, read.markers, read.revision, read.origin).map_err(|e| refused(&path, e.to_string()))?;
        Ok(Some(Restored { revision, entries, markers, took, built: lap.elapsed() }))
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

    fn stream(last: u64) -> StreamPosition {
        StreamPosition { created_ns: CREATED, last_sequence: last }
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
    fn keys_no_subject_syntax_allows_load_as_they_were_saved() {
        // The bus stores what a node wrote: wildcards, control bytes, empty tokens, U+FFFD.
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshots::new(dir.path().to_path_buf());
        let odd =
            [("alpha.*.config.x", 1, "1"), ("alpha.>", 2, "2"), ("alpha.\u{1}\u{1b}[2J.config.y", 3, "3"), ("alpha..x", 4, "4"), ("alpha.\u{FFFD}", 5, "5")];
        let m = mirror_with(&odd, &[("alpha.\u{7}", 6)]);
        snaps.save("needs", &m).unwrap().expect("saved");
        let back = Mirror::new();
        let loaded = snaps.load("needs", stream(9), &back).unwrap().expect("loaded");
        assert_eq!((loaded.entries, loaded.markers), (5, 1));
        assert_eq!(contents(&back), contents(&m));
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

    fn refusal(snaps: &Snapshots, bucket: &str, s: StreamPosition) -> String {
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
        let anew = refusal(&snaps, "needs", StreamPosition { created_ns: CREATED + 1, last_sequence: 9 });
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
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshots::new(dir.path().to_path_buf());
        std::fs::write(snaps.path("b"), &file).unwrap();
        let why = refusal(&snaps, "b", stream(9));
        assert!(why.contains("longer than 4096"), "{why}");
    }

    /// `m` saved as bucket `b`'s snapshot: the file's body (all but its checksum).
    fn saved_body(snaps: &Snapshots, m: &Mirror) -> Vec<u8> {
        snaps.save("b", m).unwrap().unwrap();
        let mut file = std::fs::read(snaps.path("b")).unwrap();
        file.truncate(file.len() - 32);
        file
    }

    /// What a parse made: entries (key, revision, value), markers (key, revision), revision.
    type Parsed = (Vec<(String, u64, Vec<u8>)>, Vec<(String, u64)>, u64);

    /// The entries and markers a parse of `body` fed in pieces of `sizes` (round and round) made.
    fn parsed_in_pieces(body: &[u8], sizes: &[usize]) -> std::result::Result<Parsed, String> {
        let mut parse = load::Parse::new("b", body.len() as u64);
        let (mut at, mut i) = (0, 0);
        while at < body.len() {
            let n = sizes[i % sizes.len()].min(body.len() - at);
            parse.feed(&body[at..at + n]);
            at += n;
            i += 1;
        }
        let read = parse.finish()?;
        let m = Mirror::new();
        m.restore(read.entries, read.markers, read.revision, read.origin).unwrap();
        let mut markers: Vec<(String, u64)> = m.tombstones().iter().map(|(k, r)| (k.to_string(), *r)).collect();
        markers.sort();
        Ok((contents(&m), markers, read.revision))
    }

    #[test]
    fn a_record_cut_anywhere_by_a_chunk_reads_as_the_whole_file_does() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshots::new(dir.path().to_path_buf());
        let m = Mirror::new();
        // Small records, values longer than the first join (8 KiB) and than a chunk.
        for i in 0..300u64 {
            let len = match i % 50 {
                7 => 20_000,
                31 => load::CHUNK + 3,
                _ => (i % 13) as usize,
            };
            m.put(&format!("n{}.m{i:03}.config.k", i % 3), i + 1, &vec![b'a' + (i % 26) as u8; len]);
        }
        m.delete("n1.zz.config.gone", 400);
        m.delete("n2.zz.config.gone", 401);
        m.set_origin(CREATED);
        m.set_ready(true);
        let body = &saved_body(&snaps, &m);
        let whole = parsed_in_pieces(body, &[body.len()]).expect("read whole");
        assert!(whole.0 == contents(&m), "read whole, not as saved");
        assert_eq!((whole.1.clone(), whole.2), (vec![("n1.zz.config.gone".to_string(), 400), ("n2.zz.config.gone".to_string(), 401)], 401));
        for sizes in [&[1][..], &[2, 3], &[7, 1, 4096], &[8191, 1], &[9000], &[load::CHUNK], &[1, load::CHUNK + 1, 13]] {
            // (Not `assert_eq!`: the values are long.)
            let pieces = parsed_in_pieces(body, sizes);
            assert!(pieces.as_ref() == Ok(&whole), "pieces of {sizes:?}: {:?}", pieces.map(|p| (p.0.len(), p.1, p.2)));
        }
        // Cut short anywhere, in pieces: refused as truncated, never read past its bytes.
        for n in [1, 20, 40, 47, body.len() / 2, body.len() - 1] {
            let why = parsed_in_pieces(&body[..n], &[5, 1000]).expect_err("truncated");
            assert!(why.contains("truncated"), "{n}: {why}");
        }
        // And read from the file by the reader thread, a chunk at a time.
        let back = Mirror::new();
        let loaded = snaps.load("b", stream(401), &back).unwrap().unwrap();
        assert_eq!((contents(&back), loaded.entries, loaded.markers), (contents(&m), 300, 2));
        assert!(loaded.took.elapsed >= loaded.took.parsed, "{:?}", loaded.took);
        // A damaged body (every byte of a small one flipped in turn) gives the same verdict, the
        // same reason, however it is cut.
        let good = saved_body(&snaps, &mirror_with(&[("a.b", 1, "one"), ("a.c", 2, "two")], &[("a.d", 3)]));
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x5a;
            let whole = parsed_in_pieces(&bad, &[bad.len()]);
            for sizes in [&[1][..], &[2, 3], &[5, 8]] {
                assert_eq!(parsed_in_pieces(&bad, sizes), whole, "byte {i} flipped, in pieces of {sizes:?}");
            }
        }
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
