//! Keeps the state directory bounded: a kept plan (`kept`) of a module that no source names any
//! more — no need, applied record, composition or assignment: the `status` question answers
//! nothing for it — is removed once it has been so for `--kept-plan-grace`. And the state
//! directory's size is measured (`mesh_provisioner_state_dir_bytes`), with the plans kept.
//!
//! Whether a module is named is the guest's to say (the host never parses a key): the question
//! is the one a node would ask the verb. A module is removed only on an answer that lists
//! nothing for it, twice, a grace apart; any failure to ask keeps it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::runtime::ReplyCode;
use crate::serve::shared::Shared;

/// The reply budget of one question (one module's status, states only).
const BUDGET: u32 = 64 * 1024;

/// What the pruner keeps between rounds.
pub struct Pruner {
    shared: Shared,
    state_dir: PathBuf,
    grace: Duration,
    /// Each kept module found named by nothing, and since when.
    unnamed: HashMap<(String, String), Instant>,
}

impl Pruner {
    pub fn new(shared: Shared, state_dir: PathBuf, grace: Duration) -> Pruner {
        Pruner { shared, state_dir, grace, unnamed: HashMap::new() }
    }

    /// How often a round runs: a quarter of the grace, between a second and five minutes.
    pub fn every(&self) -> Duration {
        (self.grace / 4).clamp(Duration::from_secs(1), Duration::from_secs(300))
    }

    /// Rounds until the task is aborted.
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(self.every());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.round().await;
        }
    }

    /// One round: asks after every kept module, removes those unnamed past the grace, and
    /// measures the directory. Returns the modules removed.
    pub async fn round(&mut self) -> Vec<(String, String)> {
        let kept = self.shared.backend.kept();
        let plans = self.state_dir.join("plans");
        let listed = tokio::task::spawn_blocking(move || crate::store::kept::KeptPlans::files(plans).list()).await.unwrap_or_default();
        let now = Instant::now();
        let mut removed = Vec::new();
        let mut still = HashMap::new();
        let kept_before = listed.len();
        for (node, module) in listed {
            // Named, or not known now: kept, and its grace starts again.
            if self.named(&node, &module).await != Some(false) {
                continue;
            }
            let since = self.unnamed.get(&(node.clone(), module.clone())).copied().unwrap_or(now);
            if now.duration_since(since) < self.grace {
                still.insert((node, module), since);
                continue;
            }
            match kept.remove(&node, &module) {
                Ok(()) => {
                    tracing::info!(node = %crate::base::visible::visible(&node), module = %crate::base::visible::visible(&module), "kept plan removed: no source names the module any more");
                    removed.push((node, module));
                }
                Err(e) => tracing::warn!("{e}"),
            }
        }
        self.unnamed = still;
        let dir = self.state_dir.clone();
        // The plans kept now: those listed, less those removed (no second walk of the folder).
        let plans = kept_before - removed.len();
        let bytes = tokio::task::spawn_blocking(move || size_of(&dir)).await.unwrap_or_default();
        let m = crate::base::metrics::metrics();
        m.state_dir_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        m.kept_plans.set(i64::try_from(plans).unwrap_or(i64::MAX));
        removed
    }

    /// Whether any source names `module` on `node` now: `None` when the guest could not say.
    async fn named(&self, node: &str, module: &str) -> Option<bool> {
        let loaded = self.shared.current.get();
        let q = serde_json::json!({"what": "status", "node": node, "module": module, "limit": 1});
        let reply = loaded
            .guest
            .handle(self.shared.backend.clone(), self.shared.limits, crate::base::wire::PROVISIONING, q.to_string().as_bytes(), BUDGET)
            .await
            .ok()?;
        if reply.code != ReplyCode::Ok {
            return None;
        }
        let page: serde_json::Value = serde_json::from_slice(&reply.body).ok()?;
        Some(!page["entries"].as_array()?.is_empty())
    }
}

/// Bytes of the files under `dir`, links not followed.
fn size_of(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}
