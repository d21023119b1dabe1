//! Writing a file the server owns: always into a new temporary file of a unique name beside it,
//! created exclusively (never following a link, never reusing what a stranger planted there),
//! private (`0600`) whatever mode an older file had, synced, then renamed over the old one; and
//! the directory synced, so the rename is durable. And whether a file or directory may be
//! trusted: this user's alone, in directories no stranger can rename things in. Below
//! everything that writes or trusts a file (the embedded server's config, the compiled cache,
//! kept plans, snapshots, signing keys).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::base::error::{Error, ErrorKind, Result};

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

/// Creates `dir` and its parents, each made here private (`0700`); one that exists is left as
/// it is (the state directory's own check, [`state_dir_is_private`], judges it).
pub fn private_dirs(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// A name no one has used beside `path`: `.<name>.<128 random bits>.tmp`.
fn unique_beside(path: &Path) -> std::io::Result<PathBuf> {
    let random = crate::base::random::random_bytes::<16>().map_err(std::io::Error::other)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(path.with_file_name(format!(".{name}.{}.tmp", hex::encode(random))))
}

/// The user this process runs as.
pub fn my_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Creates `dir` (and its parents) as this user's own: `0700`. An existing directory that is
/// not this user's, or that others may read, enter or write, is refused with the fix: it holds
/// passwords, kept plans and native code.
pub fn private_dir(dir: &Path) -> Result<()> {
    private_dirs(dir).map_err(|e| Error::new(ErrorKind::Config, format!("state directory {}: {e}", dir.display())))?;
    state_dir_is_private(dir).map_err(|why| Error::new(ErrorKind::Config, why))
}

/// Why `dir` may not be trusted as the state directory, if it may not: it, and each directory
/// above it, as a component's ([`directories_are_safe`]).
pub fn state_dir_is_private(dir: &Path) -> std::result::Result<(), String> {
    directories_are_safe(dir, "state directory")?;
    owned_and_private(dir).map_err(|why| format!("state directory refused: {why} (chown it to this user and chmod 700 {})", dir.display()))?;
    let mode = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?.mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "state directory {} may be read or entered by group or others (mode {:04o}): chmod 700 {}",
            dir.display(),
            mode & 0o7777,
            dir.display()
        ));
    }
    Ok(())
}

/// Why `path` is not this user's alone (owned by another user, or writable by group or others).
pub fn owned_and_private(path: &Path) -> std::result::Result<(), String> {
    let m = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if m.file_type().is_symlink() {
        return Err(format!("{} is a symbolic link", path.display()));
    }
    if m.uid() != my_uid() {
        return Err(format!("{} belongs to uid {}, not to this server's uid {}", path.display(), m.uid(), my_uid()));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!("{} may be written by group or others (mode {:04o})", path.display(), m.mode() & 0o7777));
    }
    Ok(())
}

/// Why a stranger could replace `path` (the `what`: a component, the state directory) through
/// one of the directories above it, if one could: each, up to the first root owns, must belong
/// to root or this user and be writable by no one else (a sticky directory, as `/tmp`, lets no
/// one else rename or remove what is not theirs).
pub fn directories_are_safe(path: &Path, what: &str) -> std::result::Result<(), String> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let real = std::fs::canonicalize(parent).map_err(|e| format!("the directory of {what} {}: {e}", path.display()))?;
    for dir in real.ancestors() {
        let m = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if m.uid() != 0 && m.uid() != my_uid() {
            return Err(format!(
                "{what} {}: its directory {} belongs to uid {}, neither root nor this server's uid {}; refusing it",
                path.display(),
                dir.display(),
                m.uid(),
                my_uid()
            ));
        }
        let sticky = m.mode() & 0o1000 != 0;
        if m.mode() & 0o022 != 0 && !sticky {
            return Err(format!(
                "{what} {}: its directory {} may be written by group or others (mode {:04o}), who could rename another file over it; refusing it (chmod go-w {})",
                path.display(),
                dir.display(),
                m.mode() & 0o7777,
                dir.display()
            ));
        }
        if m.uid() == 0 {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_the_state_directory_for_this_user_alone() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("a/b/state");
        private_dir(&state).unwrap();
        assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(owned_and_private(&state).is_ok());
    }

    #[test]
    fn refuses_a_state_directory_others_may_read() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        private_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = private_dir(&state).unwrap_err();
        assert!(e.message().contains("mode 0755") && e.message().contains("chmod 700"), "{}", e.message());
    }

    #[test]
    fn refuses_a_state_directory_under_a_directory_others_may_write() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(&open.join("state")).unwrap_err();
        assert!(e.message().contains("state directory") && e.message().contains("may be written by group or others (mode 0777)"), "{}", e.message());
        // A sticky one (as /tmp) lets no one else rename what is not theirs: accepted.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        private_dir(&open.join("state")).unwrap();
    }

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
