//! Following plans (SPEC §6): the host reports each change of a bucket a plan depends on, and
//! the guest recomputes what it moves and keeps each newly published plan.
//!
//! Which buckets matter is the guest's word (`plan-inputs`), asked again after every swap, when
//! everything is refreshed once: a new guest may plan differently. Changes wait in
//! [`Changes`] (deduplicated, bounded) while a refresh runs. A refresh the host could not serve
//! (a mirror out of sync) is retried with its changes; one the guest itself fails is split until
//! the changes it fails on are found, and only those are left ([`refresh_through`]); modules whose plan the guest could not keep (the state directory failed)
//! are handed back and asked again after a backoff (1 s doubling to a minute). Runs on every instance, holder or standby: each keeps its own plans warm.

use std::sync::Arc;
use std::time::Duration;

use crate::base::error::Result;
use crate::nats::changes::{Changes, Split};
use crate::runtime::{Change, Guest, Limits};
use crate::serve::inputs::Follower;
use crate::serve::shared::Shared;
use crate::store::backend::Backend;

/// A refresh reads many keys; it gets more time than a verb call.
const REFRESH_DEADLINE: Duration = Duration::from_secs(30);
/// Wait before retrying a refresh that failed.
const RETRY: Duration = Duration::from_secs(1);
/// Longest wait before asking again for plans that could not be kept.
const LAST_RETRY: Duration = Duration::from_secs(60);

/// The first lines of a list, for the log; a long list ends with how many more there are.
fn first(lines: &[String]) -> Vec<String> {
    const SHOWN: usize = 10;
    let mut out: Vec<String> = lines.iter().take(SHOWN).cloned().collect();
    if lines.len() > SHOWN {
        out.push(format!("… and {} more", lines.len() - SHOWN));
    }
    out
}

/// How a refresh call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failed {
    /// The guest said the host could not answer (a mirror out of sync, the bus away): the same
    /// changes are asked again later.
    Host(String),
    /// The guest itself failed (a trap, its deadline or memory): the same input would fail the
    /// same way, so it is split to find the changes that cannot be refreshed.
    Guest(String),
}

/// One refresh, logged; the changes left for another call and those to retry later.
async fn refresh_once(guest: &Guest, backend: &Arc<dyn Backend>, limits: Limits, batch: &[Change]) -> Result<(u32, Vec<Change>, Vec<Change>), Failed> {
    let started = std::time::Instant::now();
    match guest.refresh(backend.clone(), limits, batch).await {
        Ok(Ok(r)) => {
            let elapsed = started.elapsed();
            tracing::info!(changes = batch.len(), computed = r.computed, kept = ?first(&r.kept), held = r.held.len(), waiting = r.waiting.len(), rest = r.rest.len(), not_kept = r.retry.len(), ?elapsed, "plans refreshed");
            let m = crate::base::metrics::metrics();
            m.plans_refreshed.inc();
            let planned = r.computed.saturating_sub((r.held.len() + r.waiting.len()) as u32);
            for (state, n) in [("planned", planned as u64), ("held", r.held.len() as u64), ("waiting", r.waiting.len() as u64)] {
                m.plans_computed.get_or_create(&crate::base::metrics::StateLabel { state: state.into() }).inc_by(n);
            }
            // What is held or waits, by name and reason (the first few; `query plan` has all).
            for line in first(&r.held) {
                tracing::info!("held: {line}");
            }
            for line in first(&r.waiting) {
                tracing::info!("waiting: {line}");
            }
            Ok((r.computed, r.rest, r.retry))
        }
        Ok(Err(e)) => Err(Failed::Host(e)),
        Err(e) => Err(Failed::Guest(e.to_string())),
    }
}

/// What refreshing a batch through to its end did.
#[derive(Debug, Default)]
pub struct Refreshed {
    /// Plans computed.
    pub computed: u32,
    /// Changes whose plans could not be kept, for a retry after a backoff.
    pub not_kept: Vec<Change>,
    /// Single changes the guest failed on every time, with why: each costs only the plans it
    /// moves, and is left until its key changes again.
    pub given_up: Vec<(Change, String)>,
}

/// Refreshes `batch` and every rest the guest hands back until none is left, split where the
/// guest fails ([`Split`]): one module whose plan cannot be computed costs that module, never
/// the whole mesh's refresh. A host failure stops the whole batch, which is handed back (`Err`,
/// with the plans not kept so far) to be asked again later: it is the bus's, not the input's.
pub async fn refresh_through(guest: &Guest, backend: &Arc<dyn Backend>, limits: Limits, batch: Vec<Change>) -> Result<Refreshed, (Vec<Change>, String)> {
    let mut followed = Refreshed::default();
    let mut work = Split::new(batch);
    while let Some(batch) = work.take_batch() {
        match refresh_once(guest, backend, limits, &batch).await {
            Ok((computed, rest, retry)) => {
                followed.computed += computed;
                followed.not_kept.extend(retry);
                work.answered(rest);
            }
            Err(Failed::Host(e)) => {
                let mut left = work.left(batch);
                left.extend(followed.not_kept);
                return Err((left, e));
            }
            Err(Failed::Guest(e)) => work.guest_failed(batch, e),
        }
    }
    followed.given_up = work.given_up();
    Ok(followed)
}

/// Plans as a follower of the guest's inputs ([`crate::serve::inputs`]): every instance, holder
/// or standby, keeps its own plans warm.
pub struct Plans {
    changes: Arc<Changes>,
    backend: Arc<dyn Backend>,
    /// The wait before plans not kept are asked again: grows while the state directory fails.
    backoff: Duration,
}

impl Plans {
    pub fn new(shared: &Shared) -> Plans {
        Plans { changes: shared.nats.changes().clone(), backend: shared.backend.clone(), backoff: RETRY }
    }
}

impl Follower for Plans {
    const DECIDE: &'static str = "plans";
    const DEADLINE: Duration = REFRESH_DEADLINE;
    type Work = Vec<Change>;

    async fn inputs(&self, guest: &Guest, backend: Arc<dyn Backend>, limits: Limits) -> Result<Vec<String>> {
        guest.plan_inputs(backend, limits).await
    }

    fn follow(&mut self, inputs: Vec<String>) {
        self.changes.set_patterns(inputs.clone());
        // Everything, once: a whole-bucket change of each named bucket reaches every module
        // (and through them each node's compositions).
        for bucket in inputs.iter().filter(|b| !b.ends_with('*')) {
            self.changes.record(bucket, None);
        }
    }

    async fn next(&mut self) -> Option<Vec<Change>> {
        Some(self.changes.next_batch().await)
    }

    async fn handle(&mut self, guest: &Guest, limits: Limits, mut batch: Vec<Change>) {
        batch.extend(self.changes.next_batch_now());
        // One call computes a bounded slice of a large mesh; the rest it hands back is asked
        // at once (each call is awaited, so the verbs are served in between).
        let not_kept = match refresh_through(guest, &self.backend, limits, batch).await {
            Ok(followed) => followed.not_kept,
            Err((left, e)) => {
                tracing::warn!("refreshing plans failed: {e}; retrying");
                for c in &left {
                    self.changes.record(&c.bucket, c.key.as_deref());
                }
                tokio::time::sleep(RETRY).await;
                Vec::new()
            }
        };
        // Plans that could not be kept are asked again later, not lost; the wait grows while
        // the state directory keeps failing.
        if not_kept.is_empty() {
            self.backoff = RETRY;
        } else {
            tracing::warn!(modules = not_kept.len(), "plans not kept; trying again in {:?}", self.backoff);
            let (changes, wait) = (self.changes.clone(), self.backoff);
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                for c in &not_kept {
                    changes.record(&c.bucket, c.key.as_deref());
                }
            });
            self.backoff = (self.backoff * 2).min(LAST_RETRY);
        }
    }
}
