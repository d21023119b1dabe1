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

use crate::runtime::current::Refusal;
use crate::runtime::Runtime;
use crate::serve::reconciler::Reconciler;

/// How often the component path is looked at.
const POLL: Duration = Duration::from_millis(200);

/// What identifies a file's version without reading it (looked at on a blocking thread: the
/// path may be on a slow mount, and this runs on the verbs' thread every [`POLL`]).
async fn stamp(path: &Path) -> Option<(SystemTime, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = tokio::fs::metadata(path).await.ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// What a hot replace needs: where the component is, how to compile and check it, what serves
/// now, and whom to ask for the reconcile after a swap.
pub struct Reloader {
    /// What serves now (`current`) and the limits a new component is checked under.
    pub shared: crate::serve::shared::Shared,
    pub path: PathBuf,
    pub runtime: Runtime,
    pub cache: PathBuf,
    pub reconciler: Reconciler,
    /// Also look at the file every [`POLL`] (else SIGHUP only).
    pub poll: bool,
    pub trust: Option<crate::runtime::trust::TrustKey>,
}

impl Reloader {
    /// Watches SIGHUP and (with `poll`) the file until the task is dropped, swapping in each
    /// new component.
    pub async fn watch(self) {
        let mut hup = signal(SignalKind::hangup()).ok();
        let mut seen = stamp(&self.path).await;
        loop {
            let hangup = tokio::select! {
                _ = tokio::time::sleep(POLL), if self.poll => false,
                _ = async { match hup.as_mut() { Some(h) => { h.recv().await; } None => std::future::pending::<()>().await } } => true,
            };
            let now = stamp(&self.path).await;
            if !hangup && now == seen {
                continue;
            }
            // A writer may still be at work: wait until the file holds still.
            let mut settled = now;
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let again = stamp(&self.path).await;
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
        let (bytes, signed) = match crate::runtime::trust::read_component(path, trust) {
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
        let prepared = match crate::runtime::component::prepare(runtime, &bytes, Some(cache), limits).await {
            Ok(loaded) => crate::runtime::component::accept(trust, signed.as_deref(), loaded),
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
