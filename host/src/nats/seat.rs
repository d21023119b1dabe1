//! The seat (SPEC §8): held once for the mesh, as a lease on key `holder` of
//! `mesh-provisioner_seat` (history 1, max age = the TTL, so a dead holder's lease expires).
//!
//! Taken with create, renewed with compare-and-set every TTL/3, the value naming the instance. A
//! standby takes over a lease whose revision has not moved for a whole TTL — the TTL written in
//! the lease by its holder, not the standby's own — by compare-and-set.
//! The lease is held only until a monotonic deadline (¾ TTL after the last renewal was sent), so
//! a holder that is paused, partitioned or fails to renew stops serving and writing at once,
//! before the TTL can pass, even before this task gets to run again. A renewal that fails while
//! no one else holds the seat (a stream electing a leader, a server dying under the
//! connection) is tried again every poll until the lease runs out: the seat is kept through
//! faults shorter than the lease. A renewal answered after the lease ran out renews nothing
//! (a standby may have taken over meanwhile), and a bucket found gone gives the lease up at
//! once (whoever makes it again may create the key).

use crate::base::sync::Locked;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use serde_json::json;
use tokio::sync::watch;

use crate::base::error::Result;

pub const SEAT_BUCKET: &str = "mesh-provisioner_seat";
pub const HOLDER: &str = "holder";
/// The lease's default length (`--seat-ttl`), and the seat bucket's max age when `bootstrap`
/// makes it.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

pub struct Seat {
    js: jetstream::Context,
    /// The seat bucket's settings, to make it again if the bus loses it.
    config: crate::nats::bucket::Spec,
    kv: kv::Store,
    instance: String,
    /// A random tag of this process, written in its leases: a lease is this process's own only
    /// if it carries it (two processes given the same `--instance` must not both hold).
    run: String,
    /// How long this instance's leases last (at most the bucket's max age).
    ttl: Duration,
    /// The seat bucket's max age (zero: none): no lease outlives it unrenewed.
    max_age: Duration,
    /// The lease's revision and the monotonic instant it is held until.
    lease: Mutex<Option<(u64, Instant)>>,
    /// As a standby: the holder's revision last seen and when it was first seen.
    /// With the server's time of that write (a bucket made again numbers revisions from 1
    /// anew, and a revision seen before it was lost must not count as the new lease's) and
    /// how long its holder may go without renewing.
    observed: Mutex<Option<Observed>>,
    held: watch::Sender<bool>,
    /// Counts the times the seat was taken: the current term.
    terms: std::sync::atomic::AtomicU64,
    /// Since when renewals have failed (none while they succeed).
    failing: Mutex<Option<Instant>>,
}

impl Seat {
    /// Opens (or creates) the seat bucket for `ttl`.
    pub async fn open(js: &jetstream::Context, ttl: Duration, replicas: usize, instance: String) -> Result<Arc<Seat>> {
        let config = seat_bucket(ttl, replicas);
        let kv = crate::nats::bucket::open_bucket(js, &config).await?;
        // The bucket was created by whoever came first, perhaps with a shorter TTL: its max age
        // expires a lease that is not renewed within it, so this instance may hold no longer.
        let max_age = match kv.status().await {
            Ok(s) => s.max_age(),
            Err(e) => return Err(crate::base::error::Error::new(crate::base::error::ErrorKind::Unavailable, format!("status of {SEAT_BUCKET}: {e}"))),
        };
        let ttl = if max_age > Duration::ZERO && max_age < ttl {
            tracing::warn!(?ttl, ?max_age, "the seat bucket expires leases sooner than --seat-ttl: holding for its max age instead");
            max_age
        } else {
            ttl
        };
        let run = crate::base::random::random_password()?.chars().take(16).collect();
        Ok(Arc::new(Seat {
            js: js.clone(),
            config,
            kv,
            instance,
            run,
            ttl,
            max_age,
            lease: Mutex::new(None),
            observed: Mutex::new(None),
            held: watch::channel(false).0,
            terms: Default::default(),
            failing: Mutex::new(None),
        }))
    }

    /// Makes the seat's bucket again if the bus lost it (a server restarted with an empty
    /// store); whether it was made.
    pub async fn ensure_bucket(&self) -> Result<bool> {
        crate::nats::bucket::ensure_bucket(&self.js, &self.config).await
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// How often the holder renews.
    pub fn interval(&self) -> Duration {
        self.ttl / 3
    }

    /// How often a standby looks at the lease.
    pub fn poll(&self) -> Duration {
        self.interval().min(Duration::from_millis(250))
    }

    /// Whether the lease is held right now (by the monotonic clock, not by what this task last saw).
    pub fn is_held(&self) -> bool {
        self.term().is_some()
    }

    /// The term of the lease held right now: it changes whenever the seat is taken anew, so a
    /// caller that saw the same term before and after some work held the seat throughout it.
    pub fn term(&self) -> Option<u64> {
        let held = matches!(*self.lease.locked(), Some((_, until)) if Instant::now() < until);
        held.then(|| self.terms.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Wakes on every change of holding.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.held.subscribe()
    }

    fn value(&self) -> bytes::Bytes {
        json!({"instance": self.instance, "run": self.run, "pid": std::process::id(), "ttl_ms": self.ttl.as_millis() as u64}).to_string().into()
    }

    /// Whether `lease` is this process's own.
    fn is_own(&self, lease: &serde_json::Value) -> bool {
        is_own_lease(lease, &self.instance, &self.run)
    }

    /// Holds the lease at `revision`, written by a request sent at `sent`; whether it is held.
    fn hold(&self, revision: u64, sent: Instant) -> bool {
        let mut lease = self.lease.locked();
        match *lease {
            // A renewal that came back after the lease ran out renews nothing: a standby may
            // have taken over meanwhile. The seat is contended for anew, in a new term.
            Some((_, until)) if Instant::now() >= until => {
                drop(lease);
                self.drop_lease("the lease ran out while it was being renewed");
                return false;
            }
            Some(_) => {}
            None => {
                self.terms.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
        }
        *lease = Some((revision, sent + self.ttl * 3 / 4));
        drop(lease);
        if let Some(since) = self.failing.locked().take() {
            tracing::info!(instance = self.instance, after = ?since.elapsed(), "renewed the lease again");
        }
        if self.held.send_if_modified(|h| !std::mem::replace(h, true)) {
            crate::base::metrics::metrics().seat_transitions.inc();
        }
        true
    }

    /// A renewal failed without anyone else holding the seat: said once, tried again at
    /// [`Seat::poll`] until it succeeds or the lease runs out; whether it still holds.
    fn renewal_failed(&self, why: &str, until: Instant) -> bool {
        crate::base::metrics::metrics().seat_renewals_failed.inc();
        let mut failing = self.failing.locked();
        if failing.is_none() {
            *failing = Some(Instant::now());
            let left = until.saturating_duration_since(Instant::now());
            tracing::warn!(instance = self.instance, ?left, "renewal failed: {why}; serving on while the lease holds, trying again");
        }
        drop(failing);
        self.is_held()
    }

    /// Whether the last renewal failed, so the next is tried soon rather than in an interval.
    fn renewal_failing(&self) -> bool {
        self.failing.locked().is_some()
    }

    fn drop_lease(&self, why: &str) {
        self.failing.locked().take();
        let had = self.lease.locked().take().is_some();
        if had {
            tracing::warn!(instance = self.instance, "lost the seat: {why}; no longer serving or writing");
        }
        if self.held.send_if_modified(|h| std::mem::replace(h, false)) {
            crate::base::metrics::metrics().seat_transitions.inc();
        }
    }

    /// One step: renew if holding, else try to take. Returns whether the seat is held.
    pub async fn step(&self) -> bool {
        let sent = Instant::now();
        let current = *self.lease.locked();
        match current {
            Some((_, until)) if sent >= until => {
                self.drop_lease("the lease ran out before it was renewed (paused or cut off)");
                false
            }
            // A renewal may take as long as the lease holds: a stream whose leader died has no
            // responder until its group elects another, and a connection to a dying server
            // loses what was in flight. Neither lets anyone else take the seat before the
            // lease runs out, so the holder keeps serving and tries again until then.
            Some((revision, until)) => {
                match tokio::time::timeout(until.saturating_duration_since(sent), self.kv.update(HOLDER, self.value(), revision)).await {
                    Ok(Ok(rev)) => self.hold(rev, sent),
                    Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => self.write_over(revision, until, sent, &e.to_string()).await,
                    Ok(Err(e)) => {
                        // No responder is also what a bucket that is gone answers (a server
                        // back with an empty store): that is no election, and whoever makes
                        // the bucket again may create the key at once. Given up now.
                        let left = until.saturating_duration_since(Instant::now());
                        if let Ok(Ok(None)) = tokio::time::timeout(left, crate::nats::bucket::stream_info(&self.js, SEAT_BUCKET)).await {
                            self.drop_lease("the seat's bucket is gone");
                            return false;
                        }
                        self.renewal_failed(&e.to_string(), until)
                    }
                    Err(_) => {
                        self.drop_lease("the lease ran out while its renewal went unanswered");
                        false
                    }
                }
            }
            None => self.take(sent).await,
        }
    }

    /// A renewal found another revision than this holder's: another instance took the seat —
    /// or something that is not a holder wrote on its key. Within one account any responder
    /// publishes its reply wherever a request names (the JetStream API answers `$JS.API.INFO`
    /// on `$KV.mesh-provisioner_seat.holder` if a node asks so), and such a value is no lease:
    /// the holder writes over it at once, by compare-and-set on its revision, and holds on.
    /// No one else takes the seat before `until`: until then a read or write that fails is
    /// tried again, as a failed renewal is, and each waits no longer than the lease holds.
    async fn write_over(&self, held: u64, until: Instant, sent: Instant, why: &str) -> bool {
        let left = || until.saturating_duration_since(Instant::now());
        let entry = match tokio::time::timeout(left(), self.kv.entry(HOLDER)).await {
            Ok(Ok(Some(entry))) => entry,
            Ok(Ok(None)) => {
                self.drop_lease(&format!("renewal refused: {why}; the key is gone"));
                return false;
            }
            Ok(Err(e)) => return self.renewal_failed(&format!("{why}; reading the key: {e}"), until),
            Err(_) => {
                self.drop_lease("the lease ran out while its renewal went unanswered");
                return false;
            }
        };
        // A renewal whose answer was lost (its server died after storing it) moved the
        // revision under this holder's own lease: renewed over, as any other renewal.
        let lease = lease_of(&entry.value);
        let own = lease.as_ref().is_some_and(|l| self.is_own(l));
        if entry.operation != kv::Operation::Put || (lease.is_some() && !own) {
            self.drop_lease(&format!("renewal refused: {why}"));
            return false;
        }
        if entry.revision <= held {
            // A replica behind the leader answered the read: asked again.
            return self.renewal_failed(&format!("{why}; the key read at revision {} of {held}", entry.revision), until);
        }
        match tokio::time::timeout(left(), self.kv.update(HOLDER, self.value(), entry.revision)).await {
            Ok(Ok(rev)) if own => {
                tracing::info!(instance = self.instance, revision = entry.revision, "a renewal whose answer was lost had landed: renewed over it");
                self.hold(rev, sent)
            }
            Ok(Ok(rev)) => {
                let shown: String = String::from_utf8_lossy(&entry.value).chars().take(120).collect();
                tracing::warn!(
                    instance = self.instance,
                    revision = entry.revision,
                    "a value that is no lease was written on the seat's key (a reply aimed there?): written over: {shown}"
                );
                self.hold(rev, sent)
            }
            Ok(Err(e)) => self.renewal_failed(&format!("{why}; writing over revision {}: {e}", entry.revision), until),
            Err(_) => {
                self.drop_lease("the lease ran out while its renewal went unanswered");
                false
            }
        }
    }

    async fn take(&self, sent: Instant) -> bool {
        // A key with no entry at all where a lease was seen here: the bucket was made again (a
        // server back with an empty store) or the lease expired. Its holder may hold on until
        // it finds out, ¾ TTL past its last renewal at most, so the key is created only once
        // the lease seen has not moved for a whole TTL, as for one that is still there. A
        // released lease leaves a delete marker, taken at once.
        let waiting = self.observed.locked().as_ref().is_some_and(|o| o.since.elapsed() < o.ttl);
        if waiting && !matches!(tokio::time::timeout(self.interval(), self.kv.entry(HOLDER)).await, Ok(Ok(Some(_)))) {
            return false;
        }
        match tokio::time::timeout(self.interval(), self.kv.create(HOLDER, self.value())).await {
            Ok(Ok(rev)) => {
                tracing::info!(instance = self.instance, revision = rev, "took the seat");
                self.hold(rev, sent)
            }
            Ok(Err(e)) if e.kind() == kv::CreateErrorKind::AlreadyExists => self.contend(sent).await,
            Ok(Err(e)) => {
                tracing::debug!("seat not taken: {e}");
                false
            }
            Err(_) => false,
        }
    }

    /// The lease exists. Take it by compare-and-set on its revision when it is this process's own
    /// (after a bus outage), or when its holder has not renewed for a whole TTL by this
    /// instance's clock: the holder stopped itself ¾ TTL after sending its last renewal, which
    /// was before it was seen here. Waiting for the bucket's max age to expire the key would
    /// add the server's expiry granularity to every failover.
    async fn contend(&self, sent: Instant) -> bool {
        let Ok(Ok(Some(entry))) = tokio::time::timeout(self.interval(), self.kv.entry(HOLDER)).await else {
            return false;
        };
        if entry.operation != kv::Operation::Put {
            return false;
        }
        let lease = lease_of(&entry.value);
        let ours = lease.as_ref().is_some_and(|l| self.is_own(l));
        let ttl = self.lease_ttl(lease.as_ref());
        let stale = {
            let mut seen = self.observed.locked();
            match *seen {
                Some(ref o) if o.revision == entry.revision && o.created == entry.created => o.since.elapsed() >= o.ttl,
                // A value that is no lease (see `write_over`) does not restart the wait: the
                // holder is judged by its last real lease, so such writes can neither hold
                // off a takeover from a dead holder nor hurry one from a live one.
                Some(ref o) if lease.is_none() => o.since.elapsed() >= o.ttl,
                _ => {
                    *seen = Some(Observed { revision: entry.revision, created: entry.created, since: Instant::now(), ttl });
                    false
                }
            }
        };
        if !ours && !stale {
            return false;
        }
        match tokio::time::timeout(self.interval(), self.kv.update(HOLDER, self.value(), entry.revision)).await {
            Ok(Ok(rev)) => {
                let how = if ours { "took the seat back" } else { "took the seat from a holder that stopped renewing" };
                tracing::info!(instance = self.instance, revision = rev, "{how}");
                self.hold(rev, sent)
            }
            _ => false,
        }
    }

    /// How long the holder of `lease` may go without renewing: the TTL written in the lease
    /// (its holder's, not this instance's), bounded by the bucket's max age, which expires the
    /// key anyway. A lease that names no TTL is judged by the bucket's max age, else by this
    /// instance's own.
    fn lease_ttl(&self, lease: Option<&serde_json::Value>) -> Duration {
        let written = lease.and_then(|v| v["ttl_ms"].as_u64()).filter(|ms| *ms > 0).map(Duration::from_millis);
        let bound = (self.max_age > Duration::ZERO).then_some(self.max_age);
        match (written, bound) {
            (Some(w), Some(b)) => w.min(b),
            (Some(w), None) => w,
            (None, Some(b)) => b,
            (None, None) => self.ttl,
        }
    }

    /// Renews every interval, or as a standby looks at the lease every poll, until dropped.
    pub async fn run(self: Arc<Self>) {
        loop {
            let held = self.step().await;
            tokio::time::sleep(if held && !self.renewal_failing() { self.interval() } else { self.poll() }).await;
        }
    }

    /// Gives the seat up at shutdown so a standby takes over at once.
    pub async fn release(&self) {
        let lease = self.lease.locked().take();
        if self.held.send_if_modified(|h| std::mem::replace(h, false)) {
            crate::base::metrics::metrics().seat_transitions.inc();
        }
        if let Some((revision, _)) = lease {
            match self.kv.delete_expect_revision(HOLDER, Some(revision)).await {
                Ok(()) => tracing::info!(instance = self.instance, "released the seat"),
                Err(e) => tracing::warn!("could not release the seat: {e}"),
            }
        }
    }
}

/// A lease as a standby saw it.
struct Observed {
    revision: u64,
    /// The server's time of the write.
    created: async_nats::datetime::DateTime,
    /// When this instance first saw it.
    since: Instant,
    /// How long its holder may go without renewing.
    ttl: Duration,
}

/// `value` read as a lease as a holder writes it (JSON naming an instance and its TTL), if it
/// is one.
fn lease_of(value: &[u8]) -> Option<serde_json::Value> {
    serde_json::from_slice::<serde_json::Value>(value).ok().filter(|v| v["instance"].is_string() && v["ttl_ms"].is_u64())
}

/// Whether `lease` was written by `instance` in its process's run `run`.
fn is_own_lease(lease: &serde_json::Value, instance: &str, run: &str) -> bool {
    lease["instance"] == instance && lease["run"] == run
}

/// The seat bucket: one value kept, expired after the TTL.
pub fn seat_bucket(ttl: Duration, replicas: usize) -> crate::nats::bucket::Spec {
    // One lease of a few hundred bytes: a small limit, so nothing else fits in it.
    let limits = crate::nats::bucket::BucketLimits { max_bytes: 1 << 20, max_value: 4 << 10 };
    crate::nats::bucket::Spec { max_age: ttl, ..crate::nats::bucket::Spec::new(SEAT_BUCKET, "mesh-provisioner: who holds the seat", 1, replicas, limits) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_what_a_holder_writes_and_nothing_else() {
        assert!(lease_of(br#"{"instance":"h-1","pid":7,"ttl_ms":10000}"#).is_some());
        for not in [
            &br#"{"type":"io.nats.jetstream.api.v1.account_info_response","memory":0}"#[..],
            b"",
            b"garbage",
            br#"{"instance":"h-1"}"#,
            br#"{"instance":7,"ttl_ms":1}"#,
        ] {
            assert!(lease_of(not).is_none(), "{}", String::from_utf8_lossy(not));
        }
    }

    #[test]
    fn an_own_lease_names_this_instance_and_this_run() {
        let own = |value: &[u8], instance, run| lease_of(value).is_some_and(|l| is_own_lease(&l, instance, run));
        let lease = br#"{"instance":"h-1","run":"r1","pid":7,"ttl_ms":10000}"#;
        assert!(own(lease, "h-1", "r1"));
        assert!(!own(lease, "h-2", "r1"));
        assert!(!own(lease, "h-1", "r2"), "another process given the same instance name");
        assert!(!own(br#"{"instance":"h-1","pid":7,"ttl_ms":10000}"#, "h-1", "r1"), "no run: an older holder's");
        assert!(!own(br#"{"instance":"h-1","run":"r1"}"#, "h-1", "r1"), "no TTL: no lease");
    }
}
