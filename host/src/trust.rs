//! Only trusted code is loaded (SPEC §9–10). Two things the host runs come from files: the
//! component (`--component`, sandboxed, but it decides everything the server answers) and the
//! compiled-component cache (native code, loaded outside the sandbox). Each is taken only when a
//! stranger could not have put it there:
//!
//! - the state directory is created `0700`; a cached artifact is used only when its directory
//!   and the file belong to this user and no one else may write them, and the file's SHA-256
//!   matches the one recorded beside it when it was written (the bytes hashed are the bytes
//!   loaded); anything else is logged and compiled afresh, never loaded;
//! - a component file that group or others may write is refused with the reason, as sshd's
//!   StrictModes refuses a key file; with `--trust-key`, a component is loaded or swapped only
//!   with a valid ed25519 signature beside it (`<file>.sig`, made by `mesh-provisioner sign`).

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::error::{Error, ErrorKind, Result};

/// The user this process runs as.
fn me() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Creates `dir` (and its parents) as this user's own: `0700`. An existing directory that
/// others may enter or write is reported, not silently changed.
pub fn private_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::new(ErrorKind::Config, format!("state directory {}: {e}", dir.display())))?;
    if let Err(why) = owned_and_private(dir) {
        tracing::warn!(dir = %dir.display(), "{why}; the compiled-component cache in it will not be trusted");
    }
    Ok(())
}

/// Why `path` is not this user's alone (owned by another user, or writable by group or others).
pub fn owned_and_private(path: &Path) -> std::result::Result<(), String> {
    let m = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if m.file_type().is_symlink() {
        return Err(format!("{} is a symbolic link", path.display()));
    }
    if m.uid() != me() {
        return Err(format!("{} belongs to uid {}, not to this server's uid {}", path.display(), m.uid(), me()));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!("{} may be written by group or others (mode {:04o})", path.display(), m.mode() & 0o7777));
    }
    Ok(())
}

/// The record of an artifact's digest, beside it.
fn digest_path(artifact: &Path) -> PathBuf {
    artifact.with_extension("cwasm.sha256")
}

/// The cached artifact's bytes, if it may be trusted: its directory and itself this user's
/// alone, and its SHA-256 the one recorded when it was written. `Err` says why not.
pub fn trusted_artifact(artifact: &Path) -> std::result::Result<Vec<u8>, String> {
    let dir = artifact.parent().unwrap_or(Path::new("."));
    owned_and_private(dir)?;
    owned_and_private(artifact)?;
    let record = digest_path(artifact);
    owned_and_private(&record)?;
    let recorded = std::fs::read_to_string(&record).map_err(|e| format!("{}: {e}", record.display()))?;
    let bytes = std::fs::read(artifact).map_err(|e| format!("{}: {e}", artifact.display()))?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if recorded.trim() != actual {
        return Err(format!("{} does not match the digest recorded when it was written", artifact.display()));
    }
    Ok(bytes)
}

/// Writes an artifact and the record of its digest, each `0600` and renamed into place.
pub fn write_artifact(artifact: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = artifact.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let put = |path: &Path, contents: &[u8]| -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, contents)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)
    };
    // The artifact first: a crash between the two leaves a record that does not match, so the
    // artifact is compiled afresh, never trusted.
    put(artifact, bytes)?;
    put(&digest_path(artifact), hex::encode(Sha256::digest(bytes)).as_bytes())
}

/// A public key whose signatures make a component trusted.
#[derive(Clone)]
pub struct TrustKey(VerifyingKey);

impl TrustKey {
    /// Reads a key given as 64 hex digits.
    pub fn parse(text: &str) -> Result<TrustKey> {
        let bad = |why: &str| Error::new(ErrorKind::Config, format!("--trust-key: {why}"));
        let bytes = hex::decode(text.trim()).map_err(|_| bad("an ed25519 public key is 64 hex digits"))?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| bad("an ed25519 public key is 32 bytes (64 hex digits)"))?;
        VerifyingKey::from_bytes(&bytes).map(TrustKey).map_err(|e| bad(&format!("not an ed25519 public key: {e}")))
    }
}

/// Where a component's detached signature is.
pub fn signature_path(component: &Path) -> PathBuf {
    let mut name = component.as_os_str().to_owned();
    name.push(".sig");
    PathBuf::from(name)
}

/// Reads the component at `path` as trusted code: refused when group or others may write it,
/// and, with `key`, unless `<path>.sig` holds a valid signature of exactly these bytes.
pub fn read_component(path: &Path, key: Option<&TrustKey>) -> Result<Vec<u8>> {
    let refuse = |why: String| Error::new(ErrorKind::Guest, why);
    let m = std::fs::metadata(path).map_err(|e| Error::new(ErrorKind::Config, format!("component {}: {e}", path.display())))?;
    if m.mode() & 0o022 != 0 {
        return Err(refuse(format!(
            "component {} may be written by group or others (mode {:04o}); refusing it (chmod go-w)",
            path.display(),
            m.mode() & 0o7777
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| Error::new(ErrorKind::Config, format!("component {}: {e}", path.display())))?;
    if let Some(TrustKey(key)) = key {
        let sig_path = signature_path(path);
        let text = std::fs::read_to_string(&sig_path)
            .map_err(|e| refuse(format!("--trust-key is set and the signature {} cannot be read: {e}", sig_path.display())))?;
        let raw = hex::decode(text.trim()).map_err(|_| refuse(format!("{} is not a signature (128 hex digits)", sig_path.display())))?;
        let sig = Signature::from_slice(&raw).map_err(|_| refuse(format!("{} is not a signature (128 hex digits)", sig_path.display())))?;
        key.verify(&bytes, &sig)
            .map_err(|_| refuse(format!("the signature {} does not verify with the trusted key: not signed by it, or the component changed", sig_path.display())))?;
    }
    Ok(bytes)
}

/// `mesh-provisioner keygen <secret-file>`: a new signing key, its secret written `0600`, its
/// public key (for `--trust-key`) returned.
pub fn keygen(secret: &Path) -> Result<String> {
    let seed = crate::embedded::random_bytes::<32>()?;
    let key = SigningKey::from_bytes(&seed);
    crate::embedded::write_private(secret, hex::encode(seed).as_bytes())
        .map_err(|e| Error::new(ErrorKind::Config, format!("writing {}: {e}", secret.display())))?;
    Ok(hex::encode(key.verifying_key().to_bytes()))
}

/// `mesh-provisioner sign --key <secret-file> <component>`: writes `<component>.sig`.
pub fn sign(secret: &Path, component: &Path) -> Result<PathBuf> {
    let config = |what: String| Error::new(ErrorKind::Config, what);
    let text = std::fs::read_to_string(secret).map_err(|e| config(format!("{}: {e}", secret.display())))?;
    let seed: [u8; 32] = hex::decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| config(format!("{} does not hold a secret key (64 hex digits, as keygen writes)", secret.display())))?;
    let bytes = std::fs::read(component).map_err(|e| config(format!("{}: {e}", component.display())))?;
    let sig = SigningKey::from_bytes(&seed).sign(&bytes);
    let path = signature_path(component);
    std::fs::write(&path, hex::encode(sig.to_bytes())).map_err(|e| config(format!("{}: {e}", path.display())))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_the_bytes_signed_with_the_trusted_key() {
        let dir = tempfile::tempdir().unwrap();
        let (secret, component) = (dir.path().join("key"), dir.path().join("guest.wasm"));
        std::fs::write(&component, b"\0asm component bytes").unwrap();
        let public = TrustKey::parse(&keygen(&secret).unwrap()).unwrap();
        sign(&secret, &component).unwrap();
        assert_eq!(read_component(&component, Some(&public)).unwrap(), b"\0asm component bytes");
        std::fs::write(&component, b"\0asm other bytes").unwrap();
        assert!(read_component(&component, Some(&public)).unwrap_err().message().contains("does not verify"));
        let other = TrustKey::parse(&keygen(&dir.path().join("other")).unwrap()).unwrap();
        sign(&secret, &component).unwrap();
        assert!(read_component(&component, Some(&other)).unwrap_err().message().contains("does not verify"));
        std::fs::remove_file(signature_path(&component)).unwrap();
        assert!(read_component(&component, Some(&public)).unwrap_err().message().contains("cannot be read"));
        assert!(TrustKey::parse("abc").is_err());
    }

    #[test]
    fn refuses_a_component_others_may_write() {
        let dir = tempfile::tempdir().unwrap();
        let component = dir.path().join("guest.wasm");
        std::fs::write(&component, b"\0asm").unwrap();
        std::fs::set_permissions(&component, std::fs::Permissions::from_mode(0o664)).unwrap();
        let e = read_component(&component, None).unwrap_err();
        assert!(e.message().contains("mode 0664") && e.message().contains("chmod go-w"), "{}", e.message());
        std::fs::set_permissions(&component, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_component(&component, None).is_ok());
    }

    #[test]
    fn creates_the_state_directory_for_this_user_alone() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("a/b/state");
        private_dir(&state).unwrap();
        assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(owned_and_private(&state).is_ok());
    }

    #[test]
    fn trusts_an_artifact_only_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("components");
        let artifact = cache.join("abc-0.cwasm");
        write_artifact(&artifact, b"native code").unwrap();
        assert_eq!(trusted_artifact(&artifact).unwrap(), b"native code");
        // Tampered: the bytes no longer match their record.
        std::fs::write(&artifact, b"other code").unwrap();
        assert!(trusted_artifact(&artifact).unwrap_err().contains("does not match"));
        // Planted: no record beside it.
        let planted = cache.join("def-0.cwasm");
        std::fs::write(&planted, b"native code").unwrap();
        assert!(trusted_artifact(&planted).is_err());
        // Written as it should be, in a directory others may write.
        write_artifact(&artifact, b"native code").unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(trusted_artifact(&artifact).unwrap_err().contains("mode 0777"));
    }
}
