//! The one loop that follows the guest's inputs, shared by plans, state records and notices.
//!
//! Each of the three asks the guest which buckets it depends on (again after every swap: a new
//! guest may follow others), waits for work, lets what comes within [`SETTLE`] of the first
//! change join it, and hands it to the guest serving when it came. A seat taken or lost or a
//! guest swapped wakes the loop, so each follower looks again at who holds the seat and what
//! serves before it waits. What differs between the three — which inputs, what it waits on,
//! what a batch becomes — is a [`Follower`]; the loop itself is written once, here.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::base::error::Result;
use crate::runtime::{Guest, Limits};
use crate::serve::shared::Shared;
use crate::store::backend::Backend;

/// Changes arriving this soon after the first are taken in the same call.
pub const SETTLE: Duration = Duration::from_millis(20);
/// Wait before asking the guest again for its inputs after it did not say.
const RETRY: Duration = Duration::from_secs(1);

/// One follower of the guest's inputs: what it asks, waits on and does.
pub trait Follower: Send {
    /// What the buckets followed decide, for the log ("plans", "module states", "notices").
    const DECIDE: &'static str;
    /// A call's deadline at least: a batch reads more than a verb call.
    const DEADLINE: Duration;
    /// What one wake-up hands over.
    type Work: Send;

    /// The buckets `guest` says this follower depends on.
    fn inputs(&self, guest: &Guest, backend: Arc<dyn Backend>, limits: Limits) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// Follows the buckets a (new) guest named.
    fn follow(&mut self, inputs: Vec<String>);

    /// Waits for work; `None` when there is none after all (the loop looks again first).
    fn next(&mut self) -> impl Future<Output = Option<Self::Work>> + Send;

    /// Does `work` with `guest`, the one serving when it came.
    fn handle(&mut self, guest: &Guest, limits: Limits, work: Self::Work) -> impl Future<Output = ()> + Send;
}

/// Runs `follower` until the task is dropped.
pub async fn follow<F: Follower>(shared: Shared, mut follower: F) {
    let limits = Limits { deadline: shared.limits.deadline.max(F::DEADLINE), ..shared.limits };
    let (mut swapped, mut held) = (shared.current.subscribe(), shared.seat.subscribe());
    let mut following = String::new();
    loop {
        let loaded = shared.current.get();
        if loaded.guest.digest() != following {
            match follower.inputs(&loaded.guest, shared.backend.clone(), limits).await {
                Ok(inputs) => {
                    tracing::info!(?inputs, "following the buckets {} depend on", F::DECIDE);
                    follower.follow(inputs);
                    following = loaded.guest.digest().to_string();
                }
                Err(e) => {
                    tracing::warn!("the guest did not say which buckets {} depend on: {e}", F::DECIDE);
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
        }
        let work = tokio::select! {
            work = follower.next() => work,
            _ = held.changed() => continue,
            _ = swapped.changed() => continue,
        };
        let Some(work) = work else { continue };
        tokio::time::sleep(SETTLE).await;
        follower.handle(&loaded.guest, limits, work).await;
    }
}
