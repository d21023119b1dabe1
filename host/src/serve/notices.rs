//! Notices (SPEC §7.2): telling each holder of a value that its place changed.
//!
//! The guest names the buckets whose values answer needs (`notice-inputs`) and decides who is
//! told of each change (`notices`); the host follows those buckets, records each live put or
//! delete in them — only while this instance holds the seat, never from a mirror's replay at
//! start or after a reconnect — and publishes the guest's notices on
//! `mesh-provisioner.notice.<node>` (core NATS: a hint, at most once; the status is the truth).
//! Waiting events are a bounded map from key to its newest revision, so a burst of writes to one
//! key is one notice, and a flood past [`MAX_PENDING`] keys is dropped with a warning rather
//! than held (see `events`, which the backend feeds).

use std::sync::Arc;
use std::time::Duration;

use crate::base::error::Result;
use crate::runtime::{Guest, Limits};
use crate::serve::inputs::Follower;
use crate::serve::shared::Shared;
use crate::store::backend::Backend;

/// How often buckets named by a pattern (`*_bound`, `composed-*`) are looked for on the bus.
const LIST_EVERY: Duration = Duration::from_secs(5);
/// A call handles many events; it gets more time than a verb call.
const DEADLINE: Duration = Duration::from_secs(30);

/// Who follows and publishes: a follower of the guest's notice inputs
/// ([`crate::serve::inputs`]) that publishes notices while the seat is held; the buckets plans
/// follow are listed too, so a bucket created later is mirrored.
pub struct Notifier {
    shared: Shared,
    list: tokio::time::Interval,
    listing: Option<tokio::task::JoinHandle<()>>,
    published: u64,
}

impl Notifier {
    pub fn new(shared: Shared) -> Notifier {
        Notifier { shared, list: tokio::time::interval(LIST_EVERY), listing: None, published: 0 }
    }
}

impl Follower for Notifier {
    const DECIDE: &'static str = "notices";
    const DEADLINE: Duration = DEADLINE;
    type Work = ();

    async fn inputs(&self, guest: &Guest, backend: Arc<dyn Backend>, limits: Limits) -> Result<Vec<String>> {
        guest.notice_inputs(backend, limits).await
    }

    fn follow(&mut self, inputs: Vec<String>) {
        self.shared.nats.events().set_patterns(inputs);
        self.list.reset_immediately();
    }

    async fn next(&mut self) -> Option<()> {
        let events = self.shared.nats.events().clone();
        events.set_open(self.shared.seat.is_held());
        tokio::select! {
            _ = events.next() => Some(()),
            _ = self.list.tick() => {
                // Off this loop: a first sync of many buckets must not hold notices back.
                if self.listing.as_ref().is_none_or(|l| l.is_finished()) {
                    let mut patterns = events.patterns();
                    patterns.extend(self.shared.nats.changes().patterns());
                    self.listing = Some(tokio::spawn(mirror_inputs(self.shared.nats.clone(), self.shared.backend.clone(), patterns)));
                }
                None
            }
        }
    }

    async fn handle(&mut self, guest: &Guest, limits: Limits, (): ()) {
        let mut batch = self.shared.nats.events().take();
        while !batch.is_empty() && self.shared.seat.is_held() {
            let report = match guest.notices(self.shared.backend.clone(), limits, &batch).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    tracing::warn!(events = batch.len(), "deciding notices failed: {e}; these changes send none");
                    break;
                }
                Err(e) => {
                    tracing::warn!(events = batch.len(), "the guest failed deciding notices: {e}; these changes send none");
                    break;
                }
            };
            for n in &report.notices {
                // Checked again for each: a holder that lost the seat sends nothing more.
                if !self.shared.seat.is_held() {
                    break;
                }
                let Some(subject) = crate::base::wire::notice_subject(&n.node) else {
                    tracing::warn!(node = n.node, "the guest named a node that is not a subject token: no notice sent");
                    continue;
                };
                match self.shared.client.publish(subject, n.body.clone().into()).await {
                    Ok(()) => self.published += 1,
                    Err(e) => tracing::warn!(node = n.node, "publishing a notice failed: {e}"),
                }
            }
            if !report.notices.is_empty() {
                let _ = self.shared.client.flush().await;
                tracing::info!(events = batch.len() - report.rest.len(), notices = report.notices.len(), published = self.published, "notices published");
            }
            batch = report.rest;
        }
    }
}

/// Mirrors every bucket the notice and plan inputs name that is on the bus (a provider
/// installed or a node composing later is found within [`LIST_EVERY`]). Buckets that do not
/// exist are never mirrored.
async fn mirror_inputs(nats: Arc<crate::nats::NatsBackend>, backend: Arc<dyn Backend>, patterns: Vec<String>) {
    let buckets = match nats.buckets_matching(&patterns).await {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!("listing the buckets notices and plans come from: {e}");
            return;
        }
    };
    for b in buckets {
        if let Err(e) = backend.mirror(&b).await {
            tracing::debug!(bucket = b, "not mirrored yet: {e}");
        }
    }
}
