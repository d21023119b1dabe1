//! `registry` and `check`: run a component with no bus, for an operator's eyes.

use std::path::Path;

use crate::backend::MemoryBackend;
use crate::error::Result;
use crate::runtime::{Limits, Runtime};

/// Prints the registry compiled into the component, one kind a line.
pub async fn registry(component: &Path) -> Result<()> {
    let loaded = crate::reload::load(&Runtime::new()?, component, None, None, Limits::default()).await?;
    for (kind, value) in loaded.guest.compile_registry(MemoryBackend::new(), Limits::default()).await? {
        println!("{:<14} {}", crate::visible::visible(&kind), crate::visible::visible(&String::from_utf8_lossy(&value)));
    }
    Ok(())
}

/// Runs every check a component must pass to serve (the hot-replace steps but the swap): it is
/// wasm, compiles, fits the WIT world, names itself and compiles its registry within tight limits.
pub async fn check(component: &Path) -> Result<()> {
    let runtime = Runtime::new()?;
    let bytes = std::fs::read(component).map_err(|e| crate::error::Error::new(crate::error::ErrorKind::Config, format!("{}: {e}", component.display())))?;
    let loaded = crate::reload::prepare(&runtime, &bytes, None, Limits::default()).await?;
    let rows = loaded.guest.compile_registry(MemoryBackend::new(), crate::reload::smoke_limits(Limits::default())).await?;
    let info = &loaded.info;
    println!("ok: {} {} ({}), digest {}, {} registry kinds", info.name, info.version, info.wit_version, loaded.guest.digest(), rows.len());
    Ok(())
}

/// `sign`: runs the component to learn the version it says it is (the checks of `check`), then
/// signs its bytes bound to that version, and says what it bound.
pub async fn sign(secret: &Path, component: &Path) -> Result<()> {
    let bytes = std::fs::read(component).map_err(|e| crate::error::Error::new(crate::error::ErrorKind::Config, format!("{}: {e}", component.display())))?;
    let loaded = crate::reload::prepare(&Runtime::new()?, &bytes, None, Limits::default()).await?;
    let (path, digest) = crate::trust::sign(secret, component, &bytes, &loaded.info.version)?;
    println!("signed {}: version {}, sha256 {digest}", component.display(), loaded.info.version);
    println!("{}", path.display());
    Ok(())
}
