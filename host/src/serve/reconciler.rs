//! Reconciling the registry (SPEC §4), one at a time.
//!
//! Every reason to reconcile — the seat taken, the hourly timer, a reconnect, a swapped guest —
//! asks this one task, which runs them in turn and always with the guest serving when it starts.
//! So two reconciliations never interleave their compare-and-set writes, and the newest guest's
//! table is written last. The holder serves only once the first attempt after taking the seat
//! has finished, so no answer shows a registry half written. A failed one is tried again after a backoff in seconds (1 s doubling to
//! 30 s), not at the next tick; only the seat's holder reconciles.

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{watch, Notify};

use crate::nats::seat::Seat;
use crate::runtime::current::Current;
use crate::runtime::Limits;
use crate::store::backend::Backend;

/// Reconciling writes over the bus; it gets more time than a verb call.
const DEADLINE: Duration = Duration::from_secs(30);
/// First wait before retrying a failed reconcile, and the longest.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(30);

/// Asks for reconciliations; cheap to clone and to call from anywhere.
#[derive(Clone)]
pub struct Reconciler {
    wanted: Arc<Notify>,
    /// Asks made so far; an attempt covers every ask made before it started.
    asked: Arc<AtomicU64>,
    /// The asks covered by the last finished attempt (succeeded or not).
    covered: watch::Receiver<u64>,
}

impl Reconciler {
    /// Starts the task that reconciles whenever asked, until the returned handle is aborted.
    pub fn start(shared: &crate::serve::shared::Shared) -> (Reconciler, tokio::task::JoinHandle<()>) {
        let (wanted, asked) = (Arc::new(Notify::new()), Arc::new(AtomicU64::new(0)));
        let (covered_tx, covered) = watch::channel(0);
        let s = shared.clone();
        let task = tokio::spawn(run(wanted.clone(), asked.clone(), covered_tx, s.current, s.backend, s.seat, s.limits));
        (Reconciler { wanted, asked, covered }, task)
    }

    /// Asks for a reconciliation: after the one running, if any. Asks made while one waits
    /// coalesce into it. Returns the ask's number, for [`Reconciler::finished`].
    pub fn request(&self, why: &'static str) -> u64 {
        tracing::debug!(why, "registry reconcile requested");
        let n = self.asked.fetch_add(1, Ordering::AcqRel) + 1;
        self.wanted.notify_one();
        n
    }

    /// Waits until an attempt that started after ask `n` has finished, whether it succeeded
    /// or failed (a failed one goes on being retried).
    pub async fn finished(&self, n: u64) {
        let mut covered = self.covered.clone();
        let _ = covered.wait_for(|c| *c >= n).await;
    }
}

async fn run(
    wanted: Arc<Notify>,
    asked: Arc<AtomicU64>,
    covered: watch::Sender<u64>,
    current: Arc<Current>,
    backend: Arc<dyn Backend>,
    seat: Arc<Seat>,
    limits: Limits,
) {
    let limits = Limits { deadline: limits.deadline.max(DEADLINE), ..limits };
    let mut retry = FIRST_RETRY;
    loop {
        wanted.notified().await;
        loop {
            let covering = asked.load(Ordering::Acquire);
            if !seat.is_held() {
                // Said, so a standby's skipped ticks can be seen (only the holder writes).
                tracing::info!("registry not reconciled: this instance does not hold the seat");
                covered.send_replace(covering);
                break;
            }
            let outcome = once(&current, &backend, limits).await;
            covered.send_replace(covering);
            match outcome {
                Ok(()) => {
                    retry = FIRST_RETRY;
                    break;
                }
                Err(why) => {
                    tracing::warn!("registry reconcile failed: {why}; trying again in {retry:?}");
                    // A new ask (a swap, say) cuts the wait short.
                    tokio::select! {
                        _ = tokio::time::sleep(retry) => {},
                        _ = wanted.notified() => {},
                    }
                    retry = (retry * 2).min(LAST_RETRY);
                }
            }
        }
    }
}

/// One reconciliation with the guest serving now, logged.
async fn once(current: &Current, backend: &Arc<dyn Backend>, limits: Limits) -> Result<(), String> {
    let loaded = current.get();
    match loaded.guest.reconcile(backend.clone(), limits).await {
        Ok(Ok(r)) => {
            tracing::info!(
                version = loaded.info.version, puts = ?r.puts, deletes = ?r.deletes, unchanged = r.unchanged.len(),
                conflicts = ?r.conflicts, writes = r.writes(), "registry reconciled"
            );
            // A lost compare-and-set means someone wrote between the read and the write: the
            // registry is not yet the table.
            if r.conflicts.is_empty() {
                Ok(())
            } else {
                Err(format!("{} write(s) lost a compare-and-set", r.conflicts.len()))
            }
        }
        Ok(Err(e)) => Err(e),
        Err(e) => Err(format!("the guest failed: {e}")),
    }
}
