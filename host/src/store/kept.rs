//! Kept plans (SPEC §6, §10): the guest's last published plan of each module, kept in the state
//! directory so that a refusal after a restart still holds the module on it.
//!
//! One file per module, `<state>/plans/<node>/<module>.plan`: a header line naming this format
//! and its version, a line with the SHA-256 of the contents, then the guest's bytes, which the
//! host never reads. Written to a temporary file, synced and renamed, so a crash leaves the old
//! file or the new one. A file that is not this format, of an unknown version, or whose
//! contents do not match their digest is [`ErrorKind::Corrupt`]: the guest reports it and the
//! module waits; nothing here panics or stops the server.

use crate::base::sync::Locked;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::base::error::{Error, ErrorKind, Result};

/// The header's words before the version.
const MAGIC: &str = "mesh-provisioner kept-plan";
/// The file format this host writes and reads.
pub const FORMAT: u32 = 1;
/// Largest plan kept (a composition is one bucket value, far smaller).
pub const MAX_PLAN: usize = 1 << 20;
/// Longest file name most file systems take (NAME_MAX).
const MAX_FILE_NAME: usize = 255;
/// Kept plans of one node, unless told otherwise: past it a new module's plan is not kept (and
/// the plan verb says why), so one node's churn of module names cannot fill the disk.
pub const MAX_PER_NODE: usize = 10_000;
/// The suffix of a kept plan's file.
const SUFFIX: &str = ".plan";

/// Where kept plans live: files under a directory, or memory (tests, tools).
pub struct KeptPlans {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<(String, String), Vec<u8>>>,
    /// Why the last save of a module failed, until one succeeds: the plan verb says so. Only
    /// modules whose plan changed while the directory failed are here, and a success removes
    /// them, so it holds no more than the mesh's modules.
    failures: Mutex<HashMap<(String, String), String>>,
    /// Moves on every save and every failed save (the reply cache's check that kept plans are
    /// as a reply read them).
    version: std::sync::atomic::AtomicU64,
    /// Most plans kept for one node.
    per_node: std::sync::atomic::AtomicUsize,
}

impl KeptPlans {
    /// Plans kept as files under `dir` (created on first save).
    pub fn files(dir: impl Into<PathBuf>) -> Self {
        KeptPlans { dir: Some(dir.into()), memory: Mutex::default(), failures: Mutex::default(), version: Default::default(), per_node: MAX_PER_NODE.into() }
    }

    /// At most `n` plans kept for one node (at least one).
    pub fn with_per_node(self, n: usize) -> Self {
        self.per_node.store(n.max(1), std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// Plans kept in memory only, gone with the process.
    pub fn memory() -> Self {
        KeptPlans { dir: None, memory: Mutex::default(), failures: Mutex::default(), version: Default::default(), per_node: MAX_PER_NODE.into() }
    }

    /// Moves on every save (and failed save): whenever what `last_failure` answers, or what
    /// this server wrote, may have changed.
    pub fn version(&self) -> u64 {
        self.version.load(std::sync::atomic::Ordering::Acquire)
    }

    fn bump(&self) {
        self.version.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// The file of `module` on `node`, both checked to be plain file names first.
    pub fn path(&self, node: &str, module: &str) -> Result<Option<PathBuf>> {
        check_name("node", node, "")?;
        check_name("module", module, ".plan.tmp")?;
        Ok(self.dir.as_ref().map(|d| d.join(node).join(format!("{module}{SUFFIX}"))))
    }

    pub fn load(&self, node: &str, module: &str) -> Result<Option<Vec<u8>>> {
        let Some(path) = self.path(node, module)? else {
            let m = self.memory.locked();
            return Ok(m.get(&(node.to_string(), module.to_string())).cloned());
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::new(ErrorKind::Corrupt, format!("cannot read {}: {e}", path.display()))),
        };
        decode(&bytes).map(Some).map_err(|why| Error::new(ErrorKind::Corrupt, format!("{}: {why}", path.display())))
    }

    /// As [`KeptPlans::load`], with the file read on a blocking thread: the runtime's one
    /// thread never waits for a disk.
    pub async fn load_off_thread(&self, node: &str, module: &str) -> Result<Option<Vec<u8>>> {
        let Some(path) = self.path(node, module)? else {
            return self.load(node, module);
        };
        let shown = path.display().to_string();
        let read =
            tokio::task::spawn_blocking(move || std::fs::read(&path)).await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("reading {shown}: {e}")))?;
        let bytes = match read {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::new(ErrorKind::Corrupt, format!("cannot read {shown}: {e}"))),
        };
        decode(&bytes).map(Some).map_err(|why| Error::new(ErrorKind::Corrupt, format!("{shown}: {why}")))
    }

    /// As [`KeptPlans::save`], with the file written and synced on a blocking thread.
    pub async fn save_off_thread(&self, node: &str, module: &str, plan: &[u8]) -> Result<()> {
        let Some(path) = self.checked_path(node, module, plan)? else {
            return self.save(node, module, plan);
        };
        let (at, bytes, most) = (path.clone(), encode(plan), self.per_node.load(std::sync::atomic::Ordering::Relaxed));
        let written = tokio::task::spawn_blocking(move || room_for(&at, most).and_then(|()| write_atomically(&at, &bytes)))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        self.record(node, module, &path, written)
    }

    /// The file a plan is saved to, once its size and names are checked; `None` in memory.
    fn checked_path(&self, node: &str, module: &str, plan: &[u8]) -> Result<Option<PathBuf>> {
        if plan.len() > MAX_PLAN {
            return Err(Error::new(ErrorKind::Invalid, format!("a kept plan is at most {MAX_PLAN} bytes, not {}", plan.len())));
        }
        self.path(node, module)
    }

    pub fn save(&self, node: &str, module: &str, plan: &[u8]) -> Result<()> {
        let most = self.per_node.load(std::sync::atomic::Ordering::Relaxed);
        let Some(path) = self.checked_path(node, module, plan)? else {
            let mut m = self.memory.locked();
            let key = (node.to_string(), module.to_string());
            if !m.contains_key(&key) && m.keys().filter(|(n, _)| n == node).count() >= most {
                return Err(Error::new(ErrorKind::Unavailable, format!("node {node} has {most} kept plans, the most kept for one node")));
            }
            m.insert(key, plan.to_vec());
            self.bump();
            return Ok(());
        };
        let written = room_for(&path, most).and_then(|()| write_atomically(&path, &encode(plan)));
        self.record(node, module, &path, written)
    }

    /// Every (node, module) with a plan kept, in no order; a file that is not a kept plan's
    /// is left out.
    pub fn list(&self) -> Vec<(String, String)> {
        let Some(dir) = &self.dir else {
            return self.memory.locked().keys().cloned().collect();
        };
        let mut out = Vec::new();
        for node in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let Ok(name) = node.file_name().into_string() else { continue };
            for file in std::fs::read_dir(node.path()).into_iter().flatten().flatten() {
                if let Some(module) = file.file_name().to_str().and_then(|f| f.strip_suffix(SUFFIX)) {
                    out.push((name.clone(), module.to_string()));
                }
            }
        }
        out
    }

    /// Forgets the plan kept of `module` on `node` (and its node's folder once empty).
    pub fn remove(&self, node: &str, module: &str) -> Result<()> {
        let Some(path) = self.path(node, module)? else {
            self.memory.locked().remove(&(node.to_string(), module.to_string()));
            self.bump();
            return Ok(());
        };
        let removed = match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::new(ErrorKind::Unavailable, format!("removing {}: {e}", path.display()))),
            _ => Ok(()),
        };
        if let Some(folder) = path.parent() {
            // Fails while other plans are kept there: as it should.
            let _ = std::fs::remove_dir(folder);
        }
        self.failures.locked().remove(&(node.to_string(), module.to_string()));
        self.bump();
        removed
    }

    /// Records how a save went: a failure is kept (for `last_failure`) until a save succeeds.
    fn record(&self, node: &str, module: &str, path: &std::path::Path, written: std::io::Result<()>) -> Result<()> {
        let mut failures = self.failures.locked();
        self.bump();
        match written {
            Ok(()) => {
                failures.remove(&(node.to_string(), module.to_string()));
                Ok(())
            }
            Err(e) => {
                let why = format!("keeping {}: {e}", path.display());
                failures.insert((node.to_string(), module.to_string()), why.clone());
                Err(Error::new(ErrorKind::Unavailable, why))
            }
        }
    }

    /// Why the last save of `module` on `node` failed, if it did (and none succeeded since).
    pub fn last_failure(&self, node: &str, module: &str) -> Option<String> {
        let failures = self.failures.locked();
        failures.get(&(node.to_string(), module.to_string())).cloned()
    }
}

/// Node and module become path segments. What a name may be is the guest's rule; the host asks
/// only that each be one plain file name: not empty, `.` or `..`, without `/` or NUL, and short
/// enough for the file system (`<module>.plan` included).
fn check_name(what: &str, name: &str, suffix: &str) -> Result<()> {
    let ok = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0']) && name.len() + suffix.len() <= MAX_FILE_NAME;
    if ok {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Invalid, format!("{what} {:?} cannot name a kept plan", name.chars().take(80).collect::<String>())))
    }
}

fn encode(plan: &[u8]) -> Vec<u8> {
    let mut out = format!("{MAGIC} {FORMAT}\nsha256 {}\n", hex::encode(Sha256::digest(plan))).into_bytes();
    out.extend_from_slice(plan);
    out
}

fn decode(bytes: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let mut lines = bytes.splitn(3, |b| *b == b'\n');
    let header = lines.next().and_then(|l| std::str::from_utf8(l).ok()).unwrap_or("");
    let Some(version) = header.strip_prefix(MAGIC).and_then(|v| v.strip_prefix(' ')) else {
        return Err("not a kept-plan file (no header)".into());
    };
    if version != FORMAT.to_string() {
        return Err(format!("kept-plan format {:?} is unknown; this host reads format {FORMAT}", version.chars().take(20).collect::<String>()));
    }
    let digest = lines.next().and_then(|l| std::str::from_utf8(l).ok()).and_then(|l| l.strip_prefix("sha256 "));
    let (Some(digest), Some(plan)) = (digest, lines.next()) else {
        return Err("the file is cut short".into());
    };
    if hex::encode(Sha256::digest(plan)) != digest {
        return Err("the contents do not match their digest: the file is damaged".into());
    }
    Ok(plan.to_vec())
}

/// Whether `path` may be written: it exists already, or its node's folder holds fewer than
/// `most` plans.
fn room_for(path: &Path, most: usize) -> std::io::Result<()> {
    if path.exists() {
        return Ok(());
    }
    let held = path
        .parent()
        .and_then(|d| std::fs::read_dir(d).ok())
        .map_or(0, |d| d.flatten().filter(|f| f.file_name().to_str().is_some_and(|n| n.ends_with(SUFFIX))).count());
    if held >= most {
        return Err(std::io::Error::other(format!("the node has {held} kept plans, the most kept for one node (--kept-plans-per-node)")));
    }
    Ok(())
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    crate::base::files::write_private(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_what_it_kept() {
        let dir = tempfile::tempdir().unwrap();
        let kept = KeptPlans::files(dir.path());
        assert_eq!(kept.load("alpha", "app").unwrap(), None);
        kept.save("alpha", "app", b"{\"plan\":1}").unwrap();
        assert_eq!(kept.load("alpha", "app").unwrap().as_deref(), Some(&b"{\"plan\":1}"[..]));
        kept.save("alpha", "app", b"").unwrap();
        assert_eq!(kept.load("alpha", "app").unwrap().as_deref(), Some(&b""[..]));
    }

    #[test]
    fn lists_and_removes_kept_plans_and_keeps_at_most_its_cap_a_node() {
        let dir = tempfile::tempdir().unwrap();
        let kept = KeptPlans::files(dir.path()).with_per_node(2);
        kept.save("alpha", "a", b"1").unwrap();
        kept.save("alpha", "b", b"2").unwrap();
        let e = kept.save("alpha", "c", b"3").unwrap_err();
        assert!(e.message().contains("the most kept for one node"), "{e}");
        assert!(kept.last_failure("alpha", "c").is_some());
        // A plan already kept is replaced; another node has a cap of its own.
        kept.save("alpha", "a", b"1 again").unwrap();
        kept.save("beta", "a", b"1").unwrap();
        std::fs::write(dir.path().join("alpha").join("stray.txt"), b"x").unwrap();
        let mut listed = kept.list();
        listed.sort();
        assert_eq!(listed, [("alpha".to_string(), "a".to_string()), ("alpha".into(), "b".into()), ("beta".into(), "a".into())]);
        kept.remove("alpha", "b").unwrap();
        kept.save("alpha", "c", b"3").unwrap();
        kept.remove("beta", "a").unwrap();
        assert!(!dir.path().join("beta").exists(), "an empty node folder goes with its last plan");
        kept.remove("beta", "a").unwrap();
        let memory = KeptPlans::memory().with_per_node(1);
        memory.save("alpha", "a", b"1").unwrap();
        assert!(memory.save("alpha", "b", b"2").is_err());
        memory.remove("alpha", "a").unwrap();
        memory.save("alpha", "b", b"2").unwrap();
        assert_eq!(memory.list(), [("alpha".to_string(), "b".to_string())]);
    }

    #[test]
    fn calls_a_damaged_or_foreign_file_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let kept = KeptPlans::files(dir.path());
        kept.save("alpha", "app", b"{\"plan\":1}").unwrap();
        let path = kept.path("alpha", "app").unwrap().unwrap();
        let good = std::fs::read(&path).unwrap();
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        for (bytes, says) in [
            (flipped, "damaged"),
            (b"hello".to_vec(), "no header"),
            (String::from_utf8(good.clone()).unwrap().replacen(" 1\n", " 2\n", 1).into_bytes(), "format \"2\" is unknown"),
            (good[..good.len() - 4].to_vec(), "damaged"),
            (good[..30].to_vec(), "cut short"),
        ] {
            std::fs::write(&path, bytes).unwrap();
            let e = kept.load("alpha", "app").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt);
            assert!(e.message().contains(says), "{e}");
        }
    }

    #[test]
    fn refuses_names_that_are_not_plain_file_names() {
        let kept = KeptPlans::files("/nonexistent");
        for bad in ["", "..", ".", "a/b", "/etc", "a\0b", &"a".repeat(256)] {
            assert_eq!(kept.save(bad, "app", b"x").unwrap_err().kind(), ErrorKind::Invalid, "{bad:?}");
            assert_eq!(kept.load("alpha", bad).unwrap_err().kind(), ErrorKind::Invalid, "{bad:?}");
        }
        // The edge: a module name is as long as its file name (with the temporary suffix) allows.
        assert!(kept.load("alpha", &"m".repeat(246)).is_ok());
        assert_eq!(kept.load("alpha", &"m".repeat(247)).unwrap_err().kind(), ErrorKind::Invalid);
        assert!(kept.load(&"n".repeat(255), "app").is_ok());
        // What a name may be beyond that is the guest's rule, not the host's.
        for plain in ["a.b", "-a", "É"] {
            assert!(kept.load(plain, "app").is_ok(), "{plain:?}");
        }
        let big = vec![b' '; MAX_PLAN + 1];
        assert_eq!(KeptPlans::memory().save("alpha", "app", &big).unwrap_err().kind(), ErrorKind::Invalid);
        assert!(KeptPlans::memory().save("alpha", "app", &big[..MAX_PLAN]).is_ok());
    }
}
