//! Randomness, from the OS only: the embedded server's passwords, an instance's id, the
//! names of temporary files. One home, so no second source of random bytes creeps in.

use crate::base::error::{Error, ErrorKind, Result};

/// A random password from the OS: 144 bits, as hex.
pub fn random_password() -> Result<String> {
    random_bytes::<18>().map(hex::encode)
}

/// `N` random bytes from the OS (`getrandom`).
pub fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| Error::new(ErrorKind::Config, format!("the OS gave no random bytes: {e}")))?;
    Ok(bytes)
}
