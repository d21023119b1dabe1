//! `registry`, `check` and `sign`: a component file looked at with no bus, for an operator's
//! eyes — its registry printed, the checks it must pass before it may serve, its signature.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::base::error::Result;
use crate::runtime::{Limits, Runtime};
use crate::store::backend::MemoryBackend;

/// Prints the registry compiled into the component, one kind a line.
pub async fn registry(component: &Path) -> Result<()> {
    let loaded = crate::runtime::component::load(&Runtime::new()?, component, None, None, Limits::default()).await?;
    for (kind, value) in loaded.guest.compile_registry(MemoryBackend::new(), Limits::default()).await? {
        println!("{:<14} {}", crate::base::visible::visible(&kind), crate::base::visible::visible(&String::from_utf8_lossy(&value)));
    }
    Ok(())
}

/// Runs every check a component must pass to serve (the hot-replace steps but the swap): it is
/// wasm, compiles, fits the WIT world, names itself and compiles its registry within tight limits.
pub async fn check(component: &Path) -> Result<()> {
    let runtime = Runtime::new()?;
    let bytes =
        std::fs::read(component).map_err(|e| crate::base::error::Error::new(crate::base::error::ErrorKind::Config, format!("{}: {e}", component.display())))?;
    let loaded = crate::runtime::component::prepare(&runtime, &bytes, None, Limits::default()).await?;
    let rows = loaded.guest.compile_registry(MemoryBackend::new(), crate::runtime::component::smoke_limits(Limits::default())).await?;
    let info = &loaded.info;
    println!("ok: {} {} ({}), digest {}, {} registry kinds", info.name, info.version, info.wit_version, loaded.guest.digest(), rows.len());
    Ok(())
}

/// `sign`: runs the component to learn the version it says it is (the checks of `check`), then
/// signs its bytes bound to that version, and says what it bound.
pub async fn sign(secret: &Path, component: &Path) -> Result<()> {
    let bytes =
        std::fs::read(component).map_err(|e| crate::base::error::Error::new(crate::base::error::ErrorKind::Config, format!("{}: {e}", component.display())))?;
    let loaded = crate::runtime::component::prepare(&Runtime::new()?, &bytes, None, Limits::default()).await?;
    let (path, digest) = crate::runtime::trust::sign(secret, component, &bytes, &loaded.info.version)?;
    println!("signed {}: version {}, sha256 {digest}", component.display(), loaded.info.version);
    println!("{}", path.display());
    Ok(())
}

#[derive(Args, Debug)]
pub struct Keygen {
    /// Where the secret key goes (created 0600).
    pub secret: PathBuf,
}

#[derive(Args, Debug)]
pub struct Sign {
    /// The secret key file `keygen` wrote.
    #[arg(long)]
    pub key: PathBuf,
    /// The component to sign.
    pub component: PathBuf,
}

#[derive(Args, Debug)]
pub struct RegistryCmd {
    #[arg(long, env = "MESH_PROVISIONER_COMPONENT")]
    pub component: PathBuf,
}

#[derive(Args, Debug)]
pub struct Check {
    /// The component to check.
    pub component: PathBuf,
}
