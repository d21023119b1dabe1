//! State changes pushed (SPEC §7.3): while this instance holds the seat, every change of a
//! bucket a module's state depends on is handed to the guest's `transitions`, which says whose
//! state is no longer the one recorded; the host writes each record (compare-and-set, in
//! `mesh-provisioner_states`) and, once it has landed, publishes its event on
//! `mesh-provisioner.event.<node>`.
//!
//! The record on the bus is what makes `since` survive a restart and a takeover: a standby's
//! mirror holds it, and a new holder compares with it rather than starting every clock again.
//! A record that loses its compare-and-set publishes nothing and its module is found again, so
//! a change is told at most once; a standby publishes nothing and decides nothing. A batch the
//! guest fails on is split down to the changes it fails on, as plans are. Discovery
//! is not a bucket, so discovery is asked again now and then (`--state-sweep-every`) and the
//! whole mesh swept, a page per call, when an answer moved (and every twentieth time anyway).
//! However fast changes come, the calls take at most about a third of the followers' thread
//! ([`crate::serve::followers`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::base::error::{ErrorKind, Result};
use crate::nats::changes::{Changes, Split};
use crate::runtime::{Change, Guest, Limits, TransitionReport};
use crate::serve::inputs::Follower;
use crate::serve::shared::Shared;
use crate::store::backend::{Backend, STATES_BUCKET};

/// After a call, the sweep waits this many times as long as the call took (see `through`).
const YIELD: u32 = 2;
/// The same, for a call of a periodic sweep alone: a mesh of a hundred thousand modules is
/// swept in about a minute at a tenth of the thread, rather than forever at a third of it.
const SWEEP_YIELD: u32 = 9;
/// A call finds many states; it gets more time than a verb call.
const DEADLINE: Duration = Duration::from_secs(30);
/// Wait before asking again after the host could not serve a call.
const RETRY: Duration = Duration::from_secs(1);
/// State records written at once: each is a round trip to the stream.
const IN_FLIGHT: usize = 64;
/// Every how many periodic ticks the whole mesh is swept though no discovery answer moved: a
/// net under anything a sweep would find that no change told.
const SWEEP_ANYWAY: u32 = 20;

/// What discovery answered when the last periodic sweep began: each service counted, and its
/// count (`None`: it could not be asked).
type Discovered = std::collections::BTreeMap<String, Option<u32>>;

/// The change that sweeps every module from the start as a live one (the guest's word for a
/// whole-bucket change of the states bucket itself): a module that appeared is told.
fn sweep() -> Change {
    Change { bucket: STATES_BUCKET.to_string(), key: None }
}

/// The changes that sweep every module after a start, a swap or the seat's taking: each input
/// bucket changed as a whole (a module never recorded is recorded without telling anyone).
fn start_sweep(changes: &Changes) -> Vec<Change> {
    changes.patterns().into_iter().filter(|p| !p.contains('*')).map(|bucket| Change { bucket, key: None }).collect()
}

/// Who decides, writes and publishes: a follower of the guest's status inputs
/// ([`crate::serve::inputs`]) that records and publishes state changes while the seat is held.
pub struct Recorder {
    shared: Shared,
    /// How often every module is looked at again (discovery changes no bucket).
    timer: tokio::time::Interval,
    /// Changes of this task's own: sweeps, and records to find again.
    own: Vec<Change>,
    was_held: bool,
    /// Discovery as the last periodic sweep began (none yet: the first tick sweeps).
    discovered: Option<Discovered>,
    /// Ticks since that sweep.
    ticks: u32,
}

impl Recorder {
    pub fn new(shared: Shared, sweep_every: Duration) -> Recorder {
        let mut timer = tokio::time::interval(sweep_every.max(Duration::from_secs(1)));
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Recorder { shared, timer, own: Vec::new(), was_held: false, discovered: None, ticks: 0 }
    }

    fn changes(&self) -> &Arc<Changes> {
        self.shared.nats.state_changes()
    }

    /// Whether a periodic tick sweeps every module: when a discovery answer moved since the
    /// last sweep (a service counted differently, counted for the first time, or not
    /// countable now), at the first tick, and at least every [`SWEEP_ANYWAY`] ticks. Every
    /// other input of a state is a bucket, whose changes come as changes: without this a mesh
    /// of a hundred thousand modules would be swept without end, at a tenth of the thread.
    async fn sweep_due(&mut self) -> bool {
        let backend = self.shared.backend.clone();
        // Asked together: each answer waits for its instances to settle.
        let services = backend.discovered();
        let counts = futures::future::join_all(services.iter().map(|s| backend.responders(s))).await;
        let now: Discovered = services.into_iter().zip(counts).map(|(s, c)| (s, c.ok().map(|c| c.responders))).collect();
        self.ticks += 1;
        let moved = self.discovered.as_ref() != Some(&now) || now.values().any(Option::is_none);
        if moved || self.ticks >= SWEEP_ANYWAY {
            self.discovered = Some(now);
            self.ticks = 0;
            return true;
        }
        crate::base::metrics::metrics().state_sweeps_skipped.inc();
        tracing::debug!(services = now.len(), "module states not swept: no discovery answer moved");
        false
    }
}

impl Follower for Recorder {
    const DECIDE: &'static str = "module states";
    const DEADLINE: Duration = DEADLINE;
    type Work = Vec<Change>;

    async fn inputs(&self, guest: &Guest, backend: Arc<dyn Backend>, limits: Limits) -> Result<Vec<String>> {
        guest.status_inputs(backend, limits).await
    }

    fn follow(&mut self, inputs: Vec<String>) {
        self.changes().set_patterns(inputs);
        // A new guest may find states differently: everything once.
        let sweep = start_sweep(self.changes());
        self.own.extend(sweep);
    }

    async fn next(&mut self) -> Option<Vec<Change>> {
        let is_held = self.shared.seat.is_held();
        if is_held && !self.was_held {
            // Taken (or retaken): whatever changed while another held it, or none did.
            let sweep = start_sweep(self.changes());
            self.own.extend(sweep);
        }
        self.was_held = is_held;
        let batch = if self.own.is_empty() || !is_held {
            let changes = self.shared.nats.state_changes().clone();
            let batch = tokio::select! {
                batch = changes.next_batch() => Some(batch),
                _ = self.timer.tick() => None,
            };
            match batch {
                Some(batch) => batch,
                // A standby asks nothing (it is let go just below): the next holder sweeps at
                // its taking.
                None if !self.shared.seat.is_held() => Vec::new(),
                None if self.sweep_due().await => vec![sweep()],
                None => return None,
            }
        } else {
            Vec::new()
        };
        if !self.shared.seat.is_held() {
            // A standby decides nothing; what it saw, the next holder sweeps.
            self.own.clear();
            return None;
        }
        Some(batch)
    }

    async fn handle(&mut self, guest: &Guest, limits: Limits, mut batch: Vec<Change>) {
        batch.extend(self.changes().next_batch_now());
        batch.append(&mut self.own);
        batch.sort();
        batch.dedup();
        let sweep = batch.iter().any(|c| c.key.is_none());
        if sweep {
            crate::base::metrics::metrics().state_sweeps.inc();
        }
        self.own = self.through(guest, limits, batch, sweep).await;
        if sweep && self.shared.seat.is_held() {
            // Said once a sweep (every `--state-sweep-every`): whoever reads the log knows the
            // holder looked at every module, whether or not one moved.
            tracing::info!(again = self.own.len(), "module states swept");
        }
    }
}

impl Recorder {
    /// Hands `batch` and every rest to the guest until none is left or the seat is lost, split
    /// where the guest fails ([`Split`]: a module whose state cannot be found within the
    /// deadline costs that module, never the others' events); what is to be asked again later
    /// comes back. The changes that come meanwhile join the rest, so a long sweep holds no
    /// change back; a call of the periodic sweep alone (`sweeping`, and no change joined) is
    /// paced at [`SWEEP_YIELD`].
    async fn through(&self, guest: &Guest, limits: Limits, batch: Vec<Change>, sweeping: bool) -> Vec<Change> {
        let mut again = Vec::new();
        let mut work = Split::new(batch);
        let mut live = true;
        while let Some(batch) = work.take_batch() {
            if !self.shared.seat.is_held() {
                break;
            }
            if self.shared.current.get().guest.digest() != guest.digest() {
                // Swapped meanwhile: the new guest is asked for what is left.
                again.extend(work.left(batch));
                break;
            }
            let now = crate::base::wire::rfc3339(SystemTime::now());
            let started = Instant::now();
            let report = match guest.transitions(self.shared.backend.clone(), limits, &batch, &now).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    tracing::warn!(changes = batch.len(), "finding module states failed: {e}; asking again");
                    tokio::time::sleep(RETRY).await;
                    again.extend(work.left(batch));
                    return again;
                }
                Err(e) => {
                    work.guest_failed(batch, e.to_string());
                    continue;
                }
            };
            let took = started.elapsed();
            again.extend(self.apply(&report).await);
            // However busy the mesh, a call is followed by a pause of twice its length: the verbs
            // keep at least two thirds of the one thread, and the changes that come meanwhile
            // are taken together in the next call (a module written five times is found once).
            let pause = if sweeping && !live { SWEEP_YIELD } else { YIELD };
            tokio::time::sleep(took * pause).await;
            let mut rest = report.rest;
            // Only into a sweep: any other batch ends soon, and the next takes what came.
            let joined = if sweeping { self.changes().next_batch_now() } else { Vec::new() };
            live = !joined.is_empty();
            rest.extend(joined);
            rest.sort();
            rest.dedup();
            work.answered(rest);
        }
        // What the guest failed on every time (logged by `Split`) waits for its next change or
        // the next sweep; the status verb still answers each module.
        again
    }

    /// Writes each record and publishes its event once written; the records that lost their
    /// compare-and-set (or could not be written) come back as changes to find again. The
    /// records are written [`IN_FLIGHT`] at a time (a mesh's first sweep records every module),
    /// and the events told in the report's order once the mirror shows the records.
    async fn apply(&self, report: &TransitionReport) -> Vec<Change> {
        use futures::StreamExt;
        let m = crate::base::metrics::metrics();
        let nats = &self.shared.nats;
        // By index: a closure over `&Transition` is not general enough for a `Send` future.
        let written: Vec<_> = futures::stream::iter(0..report.transitions.len())
            .map(|i| async move {
                let t = &report.transitions[i];
                // Checked for each: a holder that lost the seat writes nothing more.
                if !self.shared.seat.is_held() {
                    return None;
                }
                Some((t, nats.write_state(&t.key, t.value.clone(), t.expected).await))
            })
            .buffered(IN_FLIGHT)
            .collect()
            .await;
        let mut again = Vec::new();
        let (mut landed, mut failed) = (Vec::new(), false);
        for (t, outcome) in written.into_iter().flatten() {
            match outcome {
                Ok(revision) => {
                    m.state_records.inc();
                    landed.push((t, revision));
                }
                Err(e) => {
                    if e.kind() == ErrorKind::Conflict {
                        m.state_conflicts.inc();
                    } else {
                        tracing::warn!(key = t.key, "writing a state record failed: {e}; it is found again");
                        failed = true;
                    }
                    again.push(Change { bucket: STATES_BUCKET.to_string(), key: Some(t.key.clone()) });
                }
            }
        }
        if let Some(last) = landed.iter().filter_map(|(_, r)| *r).max() {
            nats.settle_states(last).await;
        }
        let mut published = 0usize;
        for (t, _) in landed {
            // A holder that lost the seat tells nothing more.
            if !self.shared.seat.is_held() {
                break;
            }
            let Some(body) = &t.event else { continue };
            let Some(subject) = crate::base::wire::event_subject(&t.node) else {
                tracing::warn!(node = t.node, "the guest named a node that is not a subject token: no event sent");
                continue;
            };
            match self.shared.client.publish(subject, body.clone().into()).await {
                Ok(()) => {
                    self.shared.feed.tell(body);
                    published += 1;
                    m.state_events.get_or_create(&crate::base::metrics::StateLabel { state: label(&t.state) }).inc();
                }
                Err(e) => tracing::warn!(node = t.node, "publishing a state change failed: {e}"),
            }
        }
        if published > 0 {
            let _ = self.shared.client.flush().await;
            tracing::info!(computed = report.computed, records = report.transitions.len(), published, "module state changes published");
        }
        if failed {
            // The bus refused or is away: not again at once.
            tokio::time::sleep(RETRY).await;
        }
        again
    }
}

/// A state as a metric label: the guest's word, bounded (a label set must stay small).
fn label(state: &str) -> String {
    if state.len() <= 32 && state.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
        state.to_string()
    } else {
        "other".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_a_count_only_with_a_plain_state_name() {
        assert_eq!(label("provider_pending"), "provider_pending");
        assert_eq!(label("Pending\n"), "other");
        assert_eq!(label(&"x".repeat(33)), "other");
    }
}
