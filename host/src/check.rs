//! `registry` and `check`: run a component with no bus, for an operator's eyes.

use std::path::Path;

use crate::backend::MemoryBackend;
use crate::error::Result;
use crate::runtime::{Limits, Runtime};

/// Prints the registry compiled into the component, one kind a line.
pub async fn registry(component: &Path) -> Result<()> {
    let loaded = crate::serve::load(&Runtime::new()?, component, &std::env::temp_dir(), Limits::default()).await?;
    for (kind, value) in loaded.guest.compile_registry(MemoryBackend::new(), Limits::default()).await? {
        println!("{kind:<14} {}", String::from_utf8_lossy(&value));
    }
    Ok(())
}

/// Runs every check a component must pass to serve: it is wasm, compiles, fits the WIT world,
/// names itself and compiles its registry within tight limits.
pub async fn check(component: &Path) -> Result<()> {
    let runtime = Runtime::new()?;
    let bytes = std::fs::read(component)
        .map_err(|e| crate::error::Error::new(crate::error::ErrorKind::Config, format!("{}: {e}", component.display())))?;
    let guest = runtime.load(&bytes, None)?;
    let tight = Limits { deadline: std::time::Duration::from_millis(500), memory: 16 << 20 };
    let info = guest.info(MemoryBackend::new(), tight).await?;
    let rows = guest.compile_registry(MemoryBackend::new(), tight).await?;
    println!("ok: {} {} ({}), digest {}, {} registry kinds", info.name, info.version, info.wit_version, guest.digest(), rows.len());
    Ok(())
}
