//! The self-audit (SPEC §8–9): every answer comes from a mirror, and a mirror that missed one
//! message would answer wrongly forever. So each mirror is compared with its bucket's stream on
//! a timer (`--audit-every`) and after every reconnect, and rebuilt from the bucket when they
//! differ.
//!
//! What is compared is what both sides can count without reading values: the stream's last
//! sequence against the last revision the mirror applied, and — when those are equal — the
//! stream's number of subjects against the mirror's keys and tombstones (a deleted key's marker
//! is still a message on its subject). Expiry (a bucket's max age, a per-key TTL), a purge of
//! the whole stream or of deleted keys' markers, a bucket made anew: none of these sends the
//! watch a message, and each shows here as a difference. A mirror still behind its stream after
//! [`BEHIND_GRACE`] without moving is rebuilt too. A rebuild is made aside and swapped in whole
//! (`Mirror::adopt`): readers see the old contents until the new ones are in sync.
//!
//! Before comparing, the buckets this server owns (the registry, the node clients' buckets,
//! the seat's) are made again if the bus lost them (a server restarted with an empty store).
//! The audit reads stream states only; it never parses a key.

use crate::base::sync::Locked;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::base::error::Result;
use crate::nats::bucket::{stream_info, Shape};
use crate::serve::reconciler::Reconciler;
use crate::store::mirror::Mirror;

/// How long a mirror may stay behind its stream without moving before it is rebuilt.
pub const BEHIND_GRACE: Duration = Duration::from_secs(3);
/// How often one audit looks again while a bucket is being written (its stream moves past
/// the mirror's census between the two reads), before calling it inconclusive.
const ATTEMPTS: u32 = 40;
const PAUSE: Duration = Duration::from_millis(25);
/// How long an audit after a reconnect waits for the mirrors to replay first.
const AFTER_RECONNECT: Duration = Duration::from_secs(15);

/// What one audit of one mirror found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Same last revision, same subjects.
    InSync,
    /// Different: the mirror is being rebuilt. The text says how they differed.
    Repaired(String),
    /// The mirror was being replayed, or the bucket kept moving under the audit.
    Inconclusive(&'static str),
}

/// Audits and repairs made, per bucket (for `$SRV.STATS`).
#[derive(Debug, Default)]
pub struct Counts {
    by_bucket: Mutex<BTreeMap<String, (u64, u64)>>,
    /// Audit rounds finished (all mirrors looked at).
    rounds: AtomicU64,
}

impl Counts {
    fn count(&self, bucket: &str, repaired: bool) {
        let mut map = self.by_bucket.locked();
        let c = map.entry(bucket.to_string()).or_default();
        c.0 += 1;
        c.1 += repaired as u64;
        let m = crate::base::metrics::metrics();
        let label = crate::base::metrics::Bucket { bucket: bucket.into() };
        m.mirror_audits.get_or_create(&label).inc();
        if repaired {
            m.mirror_repairs.get_or_create(&label).inc();
        }
    }

    /// `(audits, repairs)` per bucket.
    pub fn snapshot(&self) -> BTreeMap<String, (u64, u64)> {
        self.by_bucket.locked().clone()
    }

    /// Audit rounds finished so far.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Acquire)
    }
}

/// Compares one mirror with its bucket's stream, and asks for a rebuild when they differ.
pub async fn audit_one(js: &async_nats::jetstream::Context, bucket: &str, mirror: &Mirror) -> Result<Verdict> {
    // (the mirror's revision, when it was first seen behind at that revision)
    let mut behind: Option<(u64, Instant)> = None;
    for _ in 0..ATTEMPTS {
        let before = mirror.census();
        if !before.ready {
            return Ok(Verdict::Inconclusive("the mirror is replaying"));
        }
        if mirror.refused().is_some() {
            // Its follower looks at the bucket again on its own.
            return Ok(Verdict::Inconclusive("the bucket is refused"));
        }
        let info = stream_info(js, bucket).await?;
        if let Some(info) = &info {
            match crate::nats::bucket::shape(bucket, &info.config) {
                Shape::Refused(why) => {
                    mirror.request_rebuild();
                    return Ok(Verdict::Repaired(why));
                }
                Shape::Bucket { unsafe_settings } => {
                    crate::nats::bucket::note_unsafe(bucket, mirror, unsafe_settings);
                    // A node retired since the bucket was opened: its keys are orphaned now.
                    crate::nats::bucket::note_sources(mirror, &info.config);
                }
            }
        }
        let Some(stream) = info.map(|i| i.state) else {
            if mirror.exists() {
                let why = "the bucket is gone from the bus while the mirror still holds it".to_string();
                mirror.request_rebuild();
                return Ok(Verdict::Repaired(why));
            }
            return Ok(Verdict::InSync);
        };
        if !mirror.exists() {
            mirror.request_rebuild();
            return Ok(Verdict::Repaired("the bucket exists but the mirror holds it as missing".into()));
        }
        if stream.last_sequence < before.revision {
            // A stream never goes back: this one is not the one the mirror followed.
            let why = format!("the stream's last revision {} is below the mirror's {}: the bucket was made anew", stream.last_sequence, before.revision);
            mirror.request_rebuild();
            return Ok(Verdict::Repaired(why));
        }
        if stream.last_sequence == before.revision {
            if stream.subjects_count == before.subjects {
                return Ok(Verdict::InSync);
            }
            let why = format!(
                "at revision {} the stream holds {} subjects and the mirror {} (expired, purged or missed messages)",
                before.revision, stream.subjects_count, before.subjects
            );
            mirror.request_rebuild();
            return Ok(Verdict::Repaired(why));
        }
        // Behind: the watch may simply not have delivered the newest messages yet.
        match behind {
            Some((rev, since)) if rev == before.revision && since.elapsed() >= BEHIND_GRACE => {
                let why = format!("the mirror stayed at revision {} for {:?} while the stream is at {}", rev, since.elapsed(), stream.last_sequence);
                mirror.request_rebuild();
                return Ok(Verdict::Repaired(why));
            }
            Some((rev, _)) if rev == before.revision => {}
            _ => behind = Some((before.revision, Instant::now())),
        }
        let pause = if behind.is_some_and(|(_, since)| since.elapsed() < BEHIND_GRACE) { PAUSE * 4 } else { PAUSE };
        tokio::time::sleep(pause).await;
    }
    Ok(Verdict::Inconclusive("the bucket kept moving under the audit"))
}

/// The audit task: one round every `every`, and one after each reconnect once the mirrors had
/// a chance to replay.
pub struct Auditor {
    pub shared: crate::serve::shared::Shared,
    pub reconciler: Reconciler,
    pub every: Duration,
    pub counts: Arc<Counts>,
}

impl Auditor {
    pub async fn run(self, mut reconnections: watch::Receiver<u64>) {
        let mut timer = tokio::time::interval(self.every);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        timer.tick().await;
        self.check_captures().await;
        loop {
            let after_reconnect = tokio::select! {
                _ = timer.tick() => false,
                changed = reconnections.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // The first connection is not a reconnection.
                    *reconnections.borrow_and_update() >= 2
                }
            };
            if after_reconnect {
                tracing::info!("reconnected: auditing the mirrors once they replayed");
            }
            self.round(after_reconnect).await;
        }
    }

    /// Looks for streams that capture the provisioner's own subjects, and says so loudly
    /// (log, `/readyz`, metric) while one does.
    async fn check_captures(&self) {
        match self.shared.nats.captures().await {
            Ok(found) => {
                if self.shared.nats.set_captures(found.clone()) {
                    for (stream, subject) in &found {
                        tracing::error!(stream, subject, "stream {stream} captures subjects of {subject}: requesters get its acknowledgements instead of answers, and notices are stored; delete it");
                    }
                    if found.is_empty() {
                        tracing::info!("no stream captures the provisioner's subjects any more");
                    }
                }
            }
            Err(e) => tracing::warn!("could not look for streams capturing the provisioner's subjects: {e}"),
        }
    }

    /// One round: the owned buckets made again if the bus lost them, streams capturing the
    /// provisioner's subjects looked for, then every mirror.
    pub async fn round(&self, after_reconnect: bool) {
        self.check_captures().await;
        match self.shared.nats.ensure_owned().await {
            Ok(made) if !made.is_empty() => {
                tracing::warn!(buckets = ?made, "the bus had lost these buckets: made them again");
                self.reconciler.request("buckets made again");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("could not check this server's buckets: {e}"),
        }
        match self.shared.seat.ensure_bucket().await {
            Ok(true) => tracing::warn!("the bus had lost the seat's bucket: made it again"),
            Ok(false) => {}
            Err(e) => tracing::warn!("could not check the seat's bucket: {e}"),
        }
        let mirrors = crate::store::backend::Backend::mirrors(self.shared.nats.as_ref());
        if after_reconnect {
            let start = Instant::now();
            while start.elapsed() < AFTER_RECONNECT && mirrors.iter().any(|(_, m)| !m.is_ready()) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        for (bucket, mirror) in &mirrors {
            match audit_one(self.shared.nats.jetstream(), bucket, mirror).await {
                Ok(Verdict::InSync) => {
                    self.counts.count(bucket, false);
                    tracing::debug!(bucket, "mirror audited: in sync");
                }
                Ok(Verdict::Repaired(why)) => {
                    self.counts.count(bucket, true);
                    tracing::warn!(bucket, difference = why, "mirror audited: it differs from the bucket; rebuilding it");
                    if bucket == crate::store::backend::REGISTRY_BUCKET {
                        self.reconciler.request("the registry mirror was rebuilt");
                    }
                }
                Ok(Verdict::Inconclusive(why)) => {
                    self.counts.count(bucket, false);
                    tracing::debug!(bucket, why, "mirror audit inconclusive");
                }
                Err(e) => tracing::warn!(bucket, "could not audit the mirror: {e}"),
            }
        }
        self.counts.rounds.fetch_add(1, Ordering::AcqRel);
    }
}
