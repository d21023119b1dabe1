//! Taking a component in: read as trusted code ([`crate::runtime::trust`]), compiled (or taken
//! from the compiled cache), type-checked against the WIT and smoke-run in a scratch store
//! with tight limits — the steps `serve` takes at start and at each hot replace, and `check` and
//! `bootstrap` take from a terminal. It swaps nothing: what serves is `current`'s business.

use std::path::Path;
use std::time::Duration;

use crate::base::error::{Error, ErrorKind, Result};
use crate::runtime::current::Loaded;
use crate::runtime::{Limits, Runtime};
use crate::store::backend::MemoryBackend;

/// Limits of the smoke run: a healthy component answers these in microseconds.
pub fn smoke_limits(limits: Limits) -> Limits {
    Limits { deadline: limits.deadline.min(Duration::from_millis(500)), memory: limits.memory.min(32 << 20) }
}

/// Every step but the swap: compile (or take from `cache`), type-check, smoke-run.
pub async fn prepare(runtime: &Runtime, bytes: &[u8], cache: Option<&Path>, limits: Limits) -> Result<Loaded> {
    // Compiling takes up to seconds: on a blocking thread, so the one runtime thread goes on
    // serving (and renewing the seat) meanwhile.
    let (rt, owned, cache) = (runtime.clone(), bytes.to_vec(), cache.map(Path::to_path_buf));
    let guest = tokio::task::spawn_blocking(move || rt.load(&owned, cache.as_deref()))
        .await
        .map_err(|e| Error::new(ErrorKind::Guest, format!("compiling the component: {e}")))??;
    let smoke = smoke_limits(limits);
    let scratch = MemoryBackend::new();
    let info = guest.info(scratch.clone(), smoke).await?;
    if info.wit_version != crate::WIT_VERSION {
        return Err(Error::new(ErrorKind::Guest, format!("built against {}, this host speaks {}", info.wit_version, crate::WIT_VERSION)));
    }
    let rows = guest.compile_registry(scratch.clone(), smoke).await?;
    if rows.is_empty() {
        return Err(Error::new(ErrorKind::Guest, "the component compiles an empty registry"));
    }
    // Plans are followed from the moment it serves: it must say what they depend on, and
    // refresh an empty mesh.
    fn context(what: &'static str) -> impl Fn(Error) -> Error {
        move |e| Error::new(e.kind(), format!("{what}: {e}"))
    }
    let inputs = guest.plan_inputs(scratch.clone(), smoke).await.map_err(context("asking what plans depend on"))?;
    let Some(named) = inputs.into_iter().find(|b| !b.ends_with('*')) else {
        return Err(Error::new(ErrorKind::Guest, "the component names no bucket plans depend on"));
    };
    let empty = [crate::runtime::Change { bucket: named, key: None }];
    let refreshed = guest.refresh(scratch, smoke, &empty).await.map_err(context("refreshing the plans of an empty mesh"))?;
    if let Err(e) = refreshed {
        return Err(Error::new(ErrorKind::Guest, format!("refreshing the plans of an empty mesh: {e}")));
    }
    Ok(Loaded { guest, info })
}

/// Reads (as trusted code: see [`crate::runtime::trust`]), compiles (or takes from `cache`),
/// type-checks and smoke-runs a component.
pub async fn load(
    runtime: &Runtime,
    path: &std::path::Path,
    cache: Option<&std::path::Path>,
    trust: Option<&crate::runtime::trust::TrustKey>,
    limits: Limits,
) -> Result<Loaded> {
    let (bytes, signed) = crate::runtime::trust::read_component(path, trust)?;
    let started = std::time::Instant::now();
    let loaded = accept(trust, signed.as_deref(), prepare(runtime, &bytes, cache, limits).await?)?;
    tracing::info!(
        component = %path.display(),
        digest = loaded.guest.digest(),
        version = loaded.info.version,
        wit = loaded.info.wit_version,
        from_cache = loaded.guest.from_cache(),
        elapsed = ?started.elapsed(),
        "component loaded"
    );
    Ok(loaded)
}

/// With a trust key: the component's own version must be the one signed, and no older than
/// the highest accepted before (no rollback); then it is remembered.
pub fn accept(trust: Option<&crate::runtime::trust::TrustKey>, signed: Option<&str>, loaded: Loaded) -> Result<Loaded> {
    if let (Some(key), Some(signed)) = (trust, signed) {
        key.check_version(signed, &loaded.info.version)?;
        key.accept_version(&loaded.info.version)?;
    }
    Ok(loaded)
}
