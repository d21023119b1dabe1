//! Reading a snapshot file: a reader thread reads it in chunks and hashes them while the
//! caller's thread parses the records of the chunks already read, so a load costs the slower
//! of the two, not their sum, and no buffer of the file's size is ever allocated (fresh pages
//! cost a 2-core VM ~0.6 s a GiB to fault in, before a byte is copied).
//!
//! The reader hands the parser everything but the file's last 32 bytes (the checksum, once the
//! end is reached). What the parser makes of a file is used only once the reader has read it
//! all and its checksum holds: a damaged file is refused as damaged, whatever the parser met
//! first. The parser trusts nothing either: every length is bounded, and a record cut by a
//! chunk's end is completed from the next chunk, never read past its bytes.

use std::fs::File;
use std::io::Read;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::{END, ENTRY, MAGIC, MARKER, MAX_VALUE, VERSION};
use crate::base::wire::MAX_SUBJECT;
use crate::store::mirror::Sorted;

/// Bytes read and handed to the parser at a time: a chunk is still in a shared cache when
/// the parser reads what the reader just hashed.
pub(super) const CHUNK: usize = 256 << 10;
/// Chunks read ahead of the parser.
const AHEAD: usize = 8;
/// How much of the next chunk is first joined to a record a chunk's end cut (doubled, with what
/// it holds, until the record is whole): most records are far smaller.
const JOIN: usize = 8 << 10;

/// A snapshot as read, checksum checked.
pub(super) struct Read_ {
    pub origin: i128,
    pub revision: u64,
    pub entries: Sorted,
    pub markers: Vec<(Arc<str>, u64)>,
}

/// What reading a file took, for the log: time in `read`, in hashing, in parsing (each busy,
/// not waiting on the other), and from the start until both were done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Took {
    pub read: Duration,
    pub hashed: Duration,
    pub parsed: Duration,
    pub elapsed: Duration,
}

/// Reads and parses a snapshot file of `bucket` (`size` its length as the file system says,
/// a hint for the mirror's capacity): the snapshot, or why it may not be used.
pub(super) fn read(file: File, size: u64, bucket: &str) -> (Result<Read_, String>, Took) {
    let started = Instant::now();
    let (full, chunks) = std::sync::mpsc::sync_channel::<Vec<u8>>(AHEAD);
    let (empty, spent) = std::sync::mpsc::channel::<Vec<u8>>();
    let mut parse = Parse::new(bucket, size);
    let (checked, parsed) = std::thread::scope(|s| {
        let reader = std::thread::Builder::new().name("snapshot-read".into()).spawn_scoped(s, move || read_and_hash(file, full, spent));
        let reader = match reader {
            Ok(r) => r,
            Err(e) => return (Err(format!("cannot be read: no thread to read it: {e}")), Duration::ZERO),
        };
        let mut busy = Duration::ZERO;
        for chunk in chunks.iter() {
            let lap = Instant::now();
            parse.feed(&chunk);
            busy += lap.elapsed();
            // Back to the reader, whose next read fills it again rather than fresh pages.
            let _ = empty.send(chunk);
        }
        let checked = reader.join().unwrap_or_else(|_| Err("cannot be read: its reader failed".into()));
        (checked, busy)
    });
    let mut took = Took { parsed, ..Took::default() };
    let verdict = checked.and_then(|r| {
        took.read = r.read;
        took.hashed = r.hashed;
        let lap = Instant::now();
        let parsed = parse.finish();
        took.parsed += lap.elapsed();
        parsed
    });
    took.elapsed = started.elapsed();
    (verdict, took)
}

/// What the reader found: the file whole and its checksum holding, and the time it spent.
struct Checked {
    read: Duration,
    hashed: Duration,
}

/// Reads `file` to its end, handing all but its last 32 bytes to the parser (`full`) as they
/// come and hashing them: `Ok` when the file is a snapshot whose checksum holds.
fn read_and_hash(mut file: File, full: SyncSender<Vec<u8>>, spent: Receiver<Vec<u8>>) -> Result<Checked, String> {
    let mut hash = Sha256::new();
    let (mut read, mut hashed) = (Duration::ZERO, Duration::ZERO);
    // The last bytes read, held back until more follow: the checksum, at the end.
    let mut held: Vec<u8> = Vec::with_capacity(32);
    let mut head: Vec<u8> = Vec::with_capacity(MAGIC.len());
    let mut parsing = true;
    loop {
        let mut buf = spent.try_recv().unwrap_or_else(|_| Vec::with_capacity(CHUNK + 32));
        buf.clear();
        buf.extend_from_slice(&held);
        let lap = Instant::now();
        let got = fill(&mut file, &mut buf, held.len() + CHUNK).map_err(|e| format!("cannot be read: {e}"))?;
        read += lap.elapsed();
        if got == 0 {
            break;
        }
        if head.len() < MAGIC.len() {
            let more = (MAGIC.len() - head.len()).min(got);
            head.extend_from_slice(&buf[held.len()..held.len() + more]);
        }
        let keep = buf.len().min(32);
        held.clear();
        held.extend_from_slice(&buf[buf.len() - keep..]);
        buf.truncate(buf.len() - keep);
        let lap = Instant::now();
        hash.update(&buf);
        hashed += lap.elapsed();
        // The loading side drains every chunk, even past a bad record; were it gone, the file is
        // still read to its end: the checksum decides what is said of it.
        if parsing && !buf.is_empty() && full.send(buf).is_err() {
            parsing = false;
        }
    }
    drop(full);
    if head != MAGIC {
        return Err("it is not a mirror snapshot".into());
    }
    if held.len() < 32 {
        return Err("it ends before its checksum (truncated)".into());
    }
    if hash.finalize()[..] != held[..] {
        return Err("its checksum does not match (damaged or truncated)".into());
    }
    Ok(Checked { read, hashed })
}

/// Reads into `buf` until it holds `want` bytes or the file ends: how many bytes were read.
fn fill(file: &mut File, buf: &mut Vec<u8>, want: usize) -> std::io::Result<usize> {
    file.take(want.saturating_sub(buf.len()) as u64).read_to_end(buf)
}

/// Why a record could not be read: its bytes ended (more may come) or it is wrong.
enum Halt {
    Short(&'static str),
    Bad(String),
}

impl From<String> for Halt {
    fn from(why: String) -> Self {
        Halt::Bad(why)
    }
}

/// The bytes of a record, read from the front.
#[derive(Clone, Copy)]
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Halt> {
        if self.rest.len() < n {
            return Err(Halt::Short(what));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Halt> {
        let mut b = [0u8; N];
        b.copy_from_slice(self.take(N, what)?);
        Ok(b)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, Halt> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, Halt> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, Halt> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// `len` bytes, refused past `max` (before waiting for them).
    fn bytes(&mut self, len: u32, max: usize, what: &'static str) -> Result<&'a [u8], Halt> {
        let len = len as usize;
        if len > max {
            return Err(Halt::Bad(format!("{what} of {len} bytes is longer than {max}")));
        }
        self.take(len, what)
    }

    fn key(&mut self, what: &'static str) -> Result<&'a str, Halt> {
        let len = self.u32(what)?;
        let b = self.bytes(len, MAX_SUBJECT, what)?;
        let key = std::str::from_utf8(b).map_err(|_| format!("{what} is not UTF-8"))?;
        // Any key a mirror took from its bucket, as the bus gave it: a node may write a
        // wildcard, a control byte or an empty token into its own keys, and a snapshot that
        // refused them would make every start a full replay.
        if key.is_empty() {
            return Err(Halt::Bad(format!("{what} is empty")));
        }
        Ok(key)
    }
}

/// The header as read.
struct Header {
    origin: i128,
    revision: u64,
}

/// The records of a snapshot's body, fed in chunks of any size.
pub(super) struct Parse<'b> {
    bucket: &'b str,
    header: Option<Header>,
    entries: Sorted,
    markers: Vec<(Arc<str>, u64)>,
    ended: bool,
    failed: Option<String>,
    /// The start of a record the last chunk's end cut.
    carry: Vec<u8>,
}

impl<'b> Parse<'b> {
    /// A parser of `bucket`'s snapshot of about `size` bytes.
    pub(super) fn new(bucket: &'b str, size: u64) -> Self {
        let size = usize::try_from(size).unwrap_or(usize::MAX).min(isize::MAX as usize / 2);
        // The packed records take about the file's bytes; a record per 64 of them is about the
        // size of an entry of a node client's bucket: one allocation each, most of the time.
        let entries = Sorted::with_capacity(size / 64, size);
        Parse { bucket, header: None, entries, markers: Vec::new(), ended: false, failed: None, carry: Vec::new() }
    }

    /// Parses the records `chunk` completes; keeps the start of one it cuts.
    pub(super) fn feed(&mut self, chunk: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        let mut at = 0;
        if !self.carry.is_empty() {
            let had = self.carry.len();
            loop {
                if at == chunk.len() {
                    return;
                }
                let take = (chunk.len() - at).min(self.carry.len().max(JOIN));
                self.carry.extend_from_slice(&chunk[at..at + take]);
                at += take;
                let carry = std::mem::take(&mut self.carry);
                let used = self.records(&carry);
                self.carry = carry;
                if self.failed.is_some() {
                    return;
                }
                // The first record read is the cut one, begun in `had` bytes it did not fit in:
                // what else was read came from this chunk, and is read there from now on.
                if used > had {
                    at = used - had;
                    self.carry.clear();
                    break;
                }
            }
        }
        let used = self.records(&chunk[at..]);
        if self.failed.is_none() {
            self.carry.extend_from_slice(&chunk[at + used..]);
        }
    }

    /// Reads the whole records at the front of `buf`: how many bytes they took.
    fn records(&mut self, buf: &[u8]) -> usize {
        let mut src = Cursor { rest: buf };
        while !src.rest.is_empty() {
            let mut next = src;
            match self.one(&mut next) {
                Ok(()) => src = next,
                Err(Halt::Short(_)) => break,
                Err(Halt::Bad(why)) => {
                    self.failed = Some(why);
                    break;
                }
            }
        }
        buf.len() - src.rest.len()
    }

    /// Reads one record (the header first); nothing is kept of one whose bytes end.
    fn one(&mut self, src: &mut Cursor) -> Result<(), Halt> {
        if self.ended {
            return Err(Halt::Bad("bytes follow its last record".into()));
        }
        if self.header.is_none() {
            if src.take(MAGIC.len(), "the header")? != MAGIC {
                return Err(Halt::Bad("it is not a mirror snapshot".into()));
            }
            let version = src.u32("the header")?;
            if version != VERSION {
                return Err(Halt::Bad(format!("it is of version {version}; this server reads version {VERSION}")));
            }
            let len = u16::from_le_bytes(src.array("the header")?);
            let name = src.bytes(len.into(), u16::MAX.into(), "the bucket's name")?;
            let origin = i128::from_le_bytes(src.array("the header")?);
            let revision = src.u64("the header")?;
            if name != self.bucket.as_bytes() {
                return Err(Halt::Bad(format!("it is of bucket {:?}, not {}", String::from_utf8_lossy(name), self.bucket)));
            }
            self.header = Some(Header { origin, revision });
            return Ok(());
        }
        match src.u8("a record")? {
            ENTRY => {
                let key = src.key("a key")?;
                let rev = src.u64("a revision")?;
                let len = src.u32("a value")?;
                let value = src.bytes(len, MAX_VALUE, "a value")?;
                if !self.entries.push(key, rev, value) {
                    return Err(Halt::Bad(format!("key {key:?} is out of order")));
                }
            }
            MARKER => {
                let key = src.key("a marker's key")?;
                let rev = src.u64("a revision")?;
                self.markers.push((Arc::from(key), rev));
            }
            END => self.ended = true,
            other => return Err(Halt::Bad(format!("a record of unknown kind {other}"))),
        }
        Ok(())
    }

    /// The snapshot, once every chunk was fed.
    pub(super) fn finish(mut self) -> Result<Read_, String> {
        if let Some(why) = self.failed.take() {
            return Err(why);
        }
        let Some(Header { origin, revision }) = self.header.take() else {
            return Err("it ends inside the header (truncated)".into());
        };
        if !self.ended {
            // What the cut record was reading when its bytes ended.
            let carry = std::mem::take(&mut self.carry);
            let what = match self.one(&mut Cursor { rest: &carry }) {
                Err(Halt::Short(what)) => what,
                _ => "a record",
            };
            return Err(format!("it ends inside {what} (truncated)"));
        }
        let mut seen = std::collections::HashSet::with_capacity(self.markers.len());
        for (k, _) in &self.markers {
            if !seen.insert(k.clone()) {
                return Err(format!("the marker of {k:?} is there twice"));
            }
            if self.entries.contains(k) {
                return Err(format!("key {k:?} is both held and deleted"));
            }
        }
        let mut entries = self.entries;
        entries.shrink_to_fit();
        Ok(Read_ { origin, revision, entries, markers: self.markers })
    }
}
