//! Hot replace of the guest (SPEC §9): a new component at the configured path (a write, an
//! atomic rename, or SIGHUP) is read, digested, compiled (cached in the state directory by
//! digest and engine), type-checked against the WIT, smoke-run in a scratch store (info, the
//! registry, what plans depend on, a refresh of an empty mesh) with tight
//! limits, then swapped in; calls in flight finish on the old one; the registry is reconciled
//! with the new one. A component that fails any step is refused with its reason and the old one
//! keeps serving.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};
use tokio::signal::unix::{signal, SignalKind};

use crate::backend::MemoryBackend;
use crate::current::{Loaded, Refusal};
use crate::error::{Error, ErrorKind, Result};
use crate::reconciler::Reconciler;
use crate::runtime::{Limits, Runtime};

/// How often the component path is looked at.
const POLL: Duration = Duration::from_millis(200);

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

/// What identifies a file's version without reading it.
fn stamp(path: &Path) -> Option<(SystemTime, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// What a hot replace needs: where the component is, how to compile and check it, what serves
/// now, and whom to ask for the reconcile after a swap.
pub struct Reloader {
    /// What serves now (`current`) and the limits a new component is checked under.
    pub shared: crate::shared::Shared,
    pub path: PathBuf,
    pub runtime: Runtime,
    pub cache: PathBuf,
    pub reconciler: Reconciler,
    /// Also look at the file every [`POLL`] (else SIGHUP only).
    pub poll: bool,
    pub trust: Option<crate::trust::TrustKey>,
}

impl Reloader {
    /// Watches SIGHUP and (with `poll`) the file until the task is dropped, swapping in each
    /// new component.
    pub async fn watch(self) {
        let mut hup = signal(SignalKind::hangup()).ok();
        let mut seen = stamp(&self.path);
        loop {
            let hangup = tokio::select! {
                _ = tokio::time::sleep(POLL), if self.poll => false,
                _ = async { match hup.as_mut() { Some(h) => { h.recv().await; } None => std::future::pending::<()>().await } } => true,
            };
            let now = stamp(&self.path);
            if !hangup && now == seen {
                continue;
            }
            // A writer may still be at work: wait until the file holds still.
            let mut settled = now;
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let again = stamp(&self.path);
                if again == settled {
                    break;
                }
                settled = again;
            }
            seen = settled;
            self.upgrade(hangup).await;
        }
    }

    /// One upgrade attempt; logs and records the outcome.
    pub async fn upgrade(&self, forced: bool) {
        let Reloader { shared, path, runtime, cache, reconciler, trust, .. } = self;
        let (current, path, limits, trust) = (&shared.current, path.as_path(), shared.limits, trust.as_ref());
        let started = Instant::now();
        let (bytes, signed) = match crate::trust::read_component(path, trust) {
            Ok(b) => b,
            Err(e) => {
                let reason = e.message().to_string();
                tracing::warn!(reason, "component refused");
                current.refuse(Refusal { digest: String::new(), reason });
                return;
            }
        };
        let digest = hex::encode(Sha256::digest(&bytes));
        if digest == current.get().guest.digest() {
            if forced {
                tracing::info!(digest, "component unchanged; nothing to swap");
            }
            return;
        }
        let prepared = match prepare(runtime, &bytes, Some(cache), limits).await {
            Ok(loaded) => accept(trust, signed.as_deref(), loaded),
            Err(e) => Err(e),
        };
        match prepared {
            Ok(loaded) => {
                let (version, from_cache) = (loaded.info.version.clone(), loaded.guest.from_cache());
                let old = current.swap(loaded);
                tracing::info!(
                    digest, version, from_cache, old_version = old.info.version, elapsed = ?started.elapsed(),
                    "component swapped"
                );
                reconciler.request("swapped the component");
            }
            Err(e) => {
                tracing::warn!(digest, reason = e.message(), elapsed = ?started.elapsed(), "component refused; the current one keeps serving");
                current.refuse(Refusal { digest, reason: e.message().to_string() });
            }
        }
    }
}

/// Reads (as trusted code: see [`crate::trust`]), compiles (or takes from `cache`),
/// type-checks and smoke-runs a component.
pub async fn load(
    runtime: &Runtime,
    path: &std::path::Path,
    cache: Option<&std::path::Path>,
    trust: Option<&crate::trust::TrustKey>,
    limits: Limits,
) -> Result<Loaded> {
    let (bytes, signed) = crate::trust::read_component(path, trust)?;
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
fn accept(trust: Option<&crate::trust::TrustKey>, signed: Option<&str>, loaded: Loaded) -> Result<Loaded> {
    if let (Some(key), Some(signed)) = (trust, signed) {
        key.check_version(signed, &loaded.info.version)?;
        key.accept_version(&loaded.info.version)?;
    }
    Ok(loaded)
}
