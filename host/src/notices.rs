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

use crate::backend::Backend;
pub use crate::events::{Events, MAX_PENDING};
use crate::runtime::Limits;

/// The subject a node's notices are published on, before the node's name.
pub const NOTICE_PREFIX: &str = "mesh-provisioner.notice.";
/// How often buckets named by a pattern (`*_bound`, `composed-*`) are looked for on the bus.
const LIST_EVERY: Duration = Duration::from_secs(5);
/// Changes arriving this soon after the first are taken together.
const SETTLE: Duration = Duration::from_millis(20);
/// A call handles many events; it gets more time than a verb call.
const DEADLINE: Duration = Duration::from_secs(30);

/// The subject for `node`'s notices, if `node` is one subject token.
pub fn subject(node: &str) -> Option<String> {
    crate::events::node_subject(NOTICE_PREFIX, node)
}

/// Who follows and publishes: the shared handle (its backend's hub of live events; the
/// buckets plans follow, listed too, so a bucket created later is mirrored).
pub struct Notifier {
    pub shared: crate::shared::Shared,
}

impl Notifier {
    /// Follows the guest's notice inputs and publishes notices while the seat is held.
    pub async fn run(self) {
        let limits = Limits { deadline: self.shared.limits.deadline.max(DEADLINE), ..self.shared.limits };
        let (mut swapped, mut held) = (self.shared.current.subscribe(), self.shared.seat.subscribe());
        let mut following = String::new();
        let mut list = tokio::time::interval(LIST_EVERY);
        let mut published = 0u64;
        let mut listing: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            let loaded = self.shared.current.get();
            if loaded.guest.digest() != following {
                match loaded.guest.notice_inputs(self.shared.backend.clone(), limits).await {
                    Ok(inputs) => {
                        tracing::info!(?inputs, "following the buckets notices come from");
                        self.shared.nats.events().set_patterns(inputs);
                        following = loaded.guest.digest().to_string();
                        list.reset_immediately();
                    }
                    Err(e) => {
                        tracing::warn!("the guest did not say which buckets notices come from: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                }
            }
            self.shared.nats.events().set_open(self.shared.seat.is_held());
            tokio::select! {
                _ = self.shared.nats.events().next() => {}
                _ = list.tick() => {
                    // Off this loop: a first sync of many buckets must not hold notices back.
                    if listing.as_ref().is_none_or(|l| l.is_finished()) {
                        let mut patterns = self.shared.nats.events().patterns();
                        patterns.extend(self.shared.nats.changes().patterns());
                        listing = Some(tokio::spawn(mirror_inputs(self.shared.nats.clone(), self.shared.backend.clone(), patterns)));
                    }
                    continue;
                }
                _ = held.changed() => continue,
                _ = swapped.changed() => continue,
            }
            tokio::time::sleep(SETTLE).await;
            let mut batch = self.shared.nats.events().take();
            while !batch.is_empty() && self.shared.seat.is_held() {
                let report = match loaded.guest.notices(self.shared.backend.clone(), limits, &batch).await {
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
                    let Some(subject) = subject(&n.node) else {
                        tracing::warn!(node = n.node, "the guest named a node that is not a subject token: no notice sent");
                        continue;
                    };
                    match self.shared.client.publish(subject, n.body.clone().into()).await {
                        Ok(()) => published += 1,
                        Err(e) => tracing::warn!(node = n.node, "publishing a notice failed: {e}"),
                    }
                }
                if !report.notices.is_empty() {
                    let _ = self.shared.client.flush().await;
                    tracing::info!(events = batch.len() - report.rest.len(), notices = report.notices.len(), published, "notices published");
                }
                batch = report.rest;
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_only_while_open_and_only_named_buckets() {
        let e = Events::new();
        e.set_patterns(vec!["*_bound".into(), "mesh-config_values".into()]);
        e.record("postgres_bound", "alpha.app.db", 5, false);
        assert!(e.take().is_empty(), "a closed recorder (a standby) records nothing");
        e.set_open(true);
        e.record("postgres_bound", "alpha.app.db", 6, false);
        e.record("postgres_bound", "alpha.app.db", 7, true);
        e.record("mesh-provisioner_needs", "alpha.app.bound.x", 8, false);
        e.record("mesh-config_values", "beta.web.url", 9, false);
        let got = e.take();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].key.as_str(), got[0].revision, got[0].deleted), ("beta.web.url", 9, false));
        assert_eq!((got[1].key.as_str(), got[1].revision, got[1].deleted), ("alpha.app.db", 7, true));
        e.record("postgres_bound", "alpha.app.db", 10, false);
        e.set_open(false);
        assert!(e.take().is_empty(), "losing the seat forgets what waited");
    }

    #[test]
    fn holds_a_bounded_number_of_keys() {
        let e = Events::new();
        e.set_patterns(vec!["b".into()]);
        e.set_open(true);
        for i in 0..MAX_PENDING + 10 {
            e.record("b", &format!("k{i}"), i as u64, false);
        }
        assert_eq!((e.take().len(), e.dropped()), (MAX_PENDING, 10));
    }

    #[test]
    fn publishes_only_to_a_node_token() {
        assert_eq!(subject("alpha").as_deref(), Some("mesh-provisioner.notice.alpha"));
        for bad in ["", "a.b", "*", ">", "a b", "é"] {
            assert_eq!(subject(bad), None, "{bad:?}");
        }
    }
}
