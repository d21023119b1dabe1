//! Writing a file the server owns: always into a new temporary file of a unique name beside it,
//! created exclusively (never following a link, never reusing what a stranger planted there),
//! private (`0600`) whatever mode an older file had, synced, then renamed over the old one; and
//! the directory synced, so the rename is durable. Below everything that writes a file
//! (`embedded`, `trust`, `kept`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A file for a child process to write as it runs (the embedded server's log): created anew
/// or emptied, private (`0600`), never through a link.
pub fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)
}

/// Writes `bytes` to `path`, readable by this user alone, atomically.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_private_with(path, |f| f.write_all(bytes))
}

/// Writes what `write` writes to `path`, readable by this user alone, atomically: the file is
/// replaced only if `write` succeeds (an error leaves the old file as it was).
pub fn write_private_with(path: &Path, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> std::io::Result<()> {
    let tmp = unique_beside(path)?;
    let written = (|| {
        let f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&tmp)?;
        let mut buffered = std::io::BufWriter::with_capacity(1 << 20, f);
        write(&mut buffered)?;
        let f = buffered.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// A name no one has used beside `path`: `.<name>.<128 random bits>.tmp`.
fn unique_beside(path: &Path) -> std::io::Result<PathBuf> {
    let mut random = [0u8; 16];
    getrandom::fill(&mut random).map_err(|e| std::io::Error::other(format!("the OS gave no random bytes: {e}")))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(path.with_file_name(format!(".{name}.{}.tmp", hex::encode(random))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_file_written_is_private_whatever_was_there_and_a_planted_link_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signing.key");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, b"secret").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // A link planted where the old fixed temporary name was is neither followed nor written.
        let elsewhere = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("signing.tmp")).unwrap();
        write_private(&path, b"again").unwrap();
        assert!(!elsewhere.exists());
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp") && e.file_name() != "signing.tmp")
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
