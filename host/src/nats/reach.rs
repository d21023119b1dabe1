//! Read-your-writes on the bus (SPEC §5): where a bucket stands on the bus now — asked once for
//! every request waiting ([`Flights`]) — and how far the mirrors reflect a bucket or a node's
//! share.
//!
//! A node's writes to its own keys of the shared buckets are acknowledged by its share (the
//! stream `NODE_<node>`, with the share's sequence) and reach each bucket through the bus's
//! sourcing, in order. So a shared bucket holds the share's writes through sequence `N` when
//! the last message of the node's keys in it was sourced from `N` or later, or when the share
//! holds nothing of those keys past that message up to `N` — two direct gets, one on each
//! stream. The mirror then reflects them once it reaches that last message's revision. What
//! this reads of a message is its sequence and its `Nats-Stream-Source` header, never its key.

use crate::base::sync::Locked;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};

use super::NatsBackend;
use crate::base::error::{Error, ErrorKind, Result};
use crate::nats::bucket::{bounded, stream_info, SHARED_BUCKETS};
use crate::store::mirror::Mirror;

/// How often a wait looks again at a mirror (in memory).
const POLL: Duration = Duration::from_millis(2);
/// How long a wait for a share's sourcing pauses before it asks the bus again: the first pause,
/// doubled after each look, up to the longest (a wait for a sequence far ahead costs the bus a
/// few direct gets a second, not hundreds).
const SHARE_POLL: Duration = Duration::from_millis(1);
const SHARE_POLL_MAX: Duration = Duration::from_millis(64);

/// The header a sourced message carries: the source's (index) name and sequence, first.
const STREAM_SOURCE: &str = "Nats-Stream-Source";
/// The header a direct get's answer says its message's sequence in.
const SEQUENCE: &str = "Nats-Sequence";

type Answer = std::result::Result<u64, (ErrorKind, String)>;
type Flight = Shared<BoxFuture<'static, Answer>>;

/// Round trips that ask the bus where a bucket stands: per bucket, at most one in flight and
/// one waiting to start. A request joins the waiting one (it starts after the request came, so
/// its answer is at least as new as anything acknowledged before); when only a started one is
/// there, it sets up the next, which starts when that one lands. Under any load, one round trip
/// in flight per bucket answers every request that came meanwhile.
#[derive(Default)]
pub struct Flights {
    by_bucket: Mutex<HashMap<String, (Arc<AtomicBool>, Flight)>>,
}

impl Flights {
    /// The answer of a round trip (`trip`) that starts after this call.
    pub async fn ask(&self, bucket: &str, trip: impl FnOnce() -> BoxFuture<'static, Answer>) -> Result<u64> {
        let flight = {
            let mut map = self.by_bucket.locked();
            match map.get(bucket) {
                Some((started, flight)) if !started.load(Ordering::Acquire) => flight.clone(),
                previous => {
                    let before = previous.map(|(_, f)| f.clone());
                    let started = Arc::new(AtomicBool::new(false));
                    let (flag, trip) = (started.clone(), trip());
                    let flight = async move {
                        if let Some(before) = before {
                            let _ = before.await;
                        }
                        flag.store(true, Ordering::Release);
                        trip.await
                    }
                    .boxed()
                    .shared();
                    map.insert(bucket.to_string(), (started, flight.clone()));
                    flight
                }
            }
        };
        flight.await.map_err(|(kind, message)| Error::new(kind, message))
    }
}

impl NatsBackend {
    /// The revision `bucket`'s stream holds on the bus now (0: it does not exist), from a round
    /// trip that began after this call.
    pub(super) async fn bus_revision_of(&self, bucket: &str) -> Result<u64> {
        crate::store::backend::check_bucket(bucket)?;
        let (js, name) = (self.js.clone(), bucket.to_string());
        self.flights
            .ask(bucket, move || {
                async move {
                    match stream_info(&js, &name).await {
                        Ok(info) => Ok(info.map_or(0, |i| i.state.last_sequence)),
                        Err(e) => Err((e.kind(), e.message().to_string())),
                    }
                }
                .boxed()
            })
            .await
    }

    /// Waits, until `until`, for the mirrors to reflect revision `want` of `name` — a node's
    /// share when a shared bucket sources a stream of that name, else a bucket — and says how
    /// far they got (a bucket that does not exist is at 0).
    pub(super) async fn reach_mark(&self, name: &str, want: u64, until: Instant) -> Result<u64> {
        let shared = self.sourcing(name).await?;
        if shared.is_empty() {
            let m = self.mirror_of(name).await?;
            caught_up(&m, want, until, POLL).await;
            return Ok(m.revision());
        }
        // Whether the share has got to `want` at all, asked once and only when a bucket does not
        // show it already (a sequence asked before the share got to it is not reached).
        let got_there = AtomicBool::new(false);
        let buckets = shared.iter().map(|(bucket, mirror, filter)| self.share_reach(bucket, mirror, name, filter, want, until, &got_there));
        let through = futures::future::try_join_all(buckets).await?;
        Ok(through.into_iter().min().unwrap_or(want))
    }

    /// The shared buckets that source the stream `name`, each with its mirror and its filter.
    async fn sourcing(&self, name: &str) -> Result<Vec<(&'static str, Arc<Mirror>, Box<str>)>> {
        if !name.starts_with("NODE_") {
            return Ok(Vec::new());
        }
        let mut found = Vec::new();
        for bucket in SHARED_BUCKETS {
            let m = self.mirror_of(bucket).await?;
            if let Some(filter) = m.source_filter(name) {
                found.push((bucket, m, filter));
            }
        }
        Ok(found)
    }

    /// How far `mirror` (of the shared `bucket`) reflects the share `share`, waiting for it to
    /// reach `want` until `until`: `want` when it does; else the share's sequence the bucket is
    /// known to hold and the mirror to reflect (0 when the mirror is behind even that).
    #[allow(clippy::too_many_arguments)]
    async fn share_reach(&self, bucket: &str, mirror: &Mirror, share: &str, filter: &str, want: u64, until: Instant, got_there: &AtomicBool) -> Result<u64> {
        if mirror.held_through(share) >= want {
            return Ok(want);
        }
        let mut pause = SHARE_POLL;
        loop {
            let (at, sourced) = self.last_sourced(bucket, filter, share).await?;
            let complete = sourced >= want || (self.none_between(share, filter, sourced, want).await? && self.got_to(share, want, got_there).await?);
            let reflected = if complete { caught_up(mirror, at, until, POLL).await } else { mirror.revision() >= at };
            if complete && reflected {
                mirror.note_held_through(share, want);
                return Ok(want);
            }
            if reflected {
                mirror.note_held_through(share, sourced.min(want));
            }
            if Instant::now() >= until {
                return Ok(if reflected { sourced.min(want) } else { mirror.held_through(share) });
            }
            tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now()))).await;
            pause = (pause * 2).min(SHARE_POLL_MAX);
        }
    }

    /// The revision of the last message of `filter` in `bucket` and the sequence of `share` it
    /// was sourced from; `(0, 0)` when it holds none.
    async fn last_sourced(&self, bucket: &str, filter: &str, share: &str) -> Result<(u64, u64)> {
        let body = serde_json::json!({ "last_by_subj": filter });
        let Some((at, headers)) = self.direct_get(&format!("KV_{bucket}"), body).await? else {
            return Ok((0, 0));
        };
        let sourced = headers.get(STREAM_SOURCE).and_then(|h| source_sequence(h.as_str(), share)).unwrap_or(0);
        Ok((at, sourced))
    }

    /// Whether `share` holds no message of `filter` after sequence `after` up to `want`.
    async fn none_between(&self, share: &str, filter: &str, after: u64, want: u64) -> Result<bool> {
        let body = serde_json::json!({ "seq": after.saturating_add(1), "next_by_subj": filter });
        Ok(self.direct_get(share, body).await?.is_none_or(|(seq, _)| seq > want))
    }

    /// [`Self::holds_up_to`], asked once a wait (of all its buckets) once it said yes.
    async fn got_to(&self, share: &str, want: u64, known: &AtomicBool) -> Result<bool> {
        if known.load(Ordering::Acquire) {
            return Ok(true);
        }
        let got = self.holds_up_to(share, want).await?;
        if got {
            known.store(true, Ordering::Release);
        }
        Ok(got)
    }

    /// Whether `share` has acknowledged a write at `want` or later (a sequence asked before the
    /// share got to it is not reached, however current the buckets are). The newest message of a
    /// stream is never superseded, so one at `want` or later is there once it was written.
    async fn holds_up_to(&self, share: &str, want: u64) -> Result<bool> {
        let body = serde_json::json!({ "seq": want, "next_by_subj": ">" });
        Ok(self.direct_get(share, body).await?.is_some())
    }

    /// One direct get on `stream`: the message's sequence and headers; `None`: no such message.
    async fn direct_get(&self, stream: &str, body: serde_json::Value) -> Result<Option<(u64, async_nats::HeaderMap)>> {
        let subject = format!("$JS.API.DIRECT.GET.{stream}");
        let asked = bounded(|| format!("a direct get on {stream}"), async {
            self.client
                .request(subject, body.to_string().into())
                .await
                .map_err(|e| Error::new(ErrorKind::Unavailable, format!("a direct get on {stream}: {e}")))
        })
        .await?;
        if asked.status.is_some_and(|s| s == async_nats::StatusCode::NOT_FOUND) {
            return Ok(None);
        }
        if let Some(status) = asked.status.filter(|s| *s != async_nats::StatusCode::OK) {
            let description = asked.description.unwrap_or_default();
            return Err(Error::new(ErrorKind::Unavailable, format!("a direct get on {stream}: {status} {description}")));
        }
        let headers = asked.headers.unwrap_or_default();
        let sequence = headers.get(SEQUENCE).and_then(|s| s.as_str().parse::<u64>().ok());
        match sequence {
            Some(seq) => Ok(Some((seq, headers))),
            None => Err(Error::new(ErrorKind::Corrupt, format!("a direct get on {stream} answered without a {SEQUENCE} header"))),
        }
    }
}

/// Waits, looking every `poll`, until `mirror` reaches `revision` or `until` passes; whether it
/// reached it.
pub(super) async fn caught_up(mirror: &Mirror, revision: u64, until: Instant, poll: Duration) -> bool {
    while mirror.revision() < revision && Instant::now() < until {
        tokio::time::sleep(poll).await;
    }
    mirror.revision() >= revision
}

/// The sequence of `share` a sourced message came from, by its `Nats-Stream-Source` header:
/// `<name>[:<hash>] <sequence> …` (nats-server 2.10 on), or the acknowledgement subject
/// `$JS.ACK.<name>.<consumer>.<delivered>.<sequence>.…` older servers wrote. `None` when the
/// header names another stream or cannot be read.
pub fn source_sequence(header: &str, share: &str) -> Option<u64> {
    let mut words = header.split(' ');
    let first = words.next()?;
    if let Some(ack) = first.strip_prefix("$JS.ACK.") {
        let tokens: Vec<&str> = ack.split('.').collect();
        return (tokens.first() == Some(&share)).then(|| tokens.get(3)?.parse().ok()).flatten();
    }
    let name = first.split_once(':').map_or(first, |(name, _)| name);
    (name == share).then(|| words.next()?.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_source_sequence_of_either_header_form_for_its_share_only() {
        let cases = [
            ("NODE_alpha:8f3a0c 17 $KV.mesh-provisioner_needs.alpha.> >", Some(17)),
            ("NODE_alpha 17", Some(17)),
            ("NODE_beta:8f3a0c 17 $KV.mesh-provisioner_needs.beta.> >", None),
            ("NODE_alphabet:1 17", None),
            ("NODE_alpha:8f3a0c x", None),
            ("NODE_alpha", None),
            ("", None),
            ("$JS.ACK.NODE_alpha.c1.1.17.9.1700000000.0", Some(17)),
            ("$JS.ACK.NODE_beta.c1.1.17.9.1700000000.0", None),
            ("$JS.ACK.NODE_alpha.c1", None),
        ];
        for (header, want) in cases {
            assert_eq!(source_sequence(header, "NODE_alpha"), want, "{header:?}");
        }
    }

    #[tokio::test]
    async fn a_request_joins_a_round_trip_not_yet_started_never_one_under_way() {
        let flights = Arc::new(Flights::default());
        let trips = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (release, gate) = tokio::sync::watch::channel(false);
        let trip = |trips: Arc<std::sync::atomic::AtomicU64>, mut gate: tokio::sync::watch::Receiver<bool>| {
            move || -> BoxFuture<'static, Answer> {
                async move {
                    let n = trips.fetch_add(1, Ordering::SeqCst) + 1;
                    let _ = gate.wait_for(|open| *open).await;
                    Ok(n)
                }
                .boxed()
            }
        };
        // The first starts at once and waits at the gate; the next three come while it is
        // under way: they share one round trip, started after it lands.
        let first = tokio::spawn({
            let (f, t, g) = (flights.clone(), trips.clone(), gate.clone());
            async move { f.ask("b", trip(t, g)).await }
        });
        while trips.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let later: Vec<_> = (0..3)
            .map(|_| {
                let (f, t, g) = (flights.clone(), trips.clone(), gate.clone());
                tokio::spawn(async move { f.ask("b", trip(t, g)).await })
            })
            .collect();
        tokio::task::yield_now().await;
        release.send_replace(true);
        assert_eq!(first.await.unwrap().unwrap(), 1);
        for l in later {
            assert_eq!(l.await.unwrap().unwrap(), 2, "joined the round trip that began after it asked");
        }
        assert_eq!(trips.load(Ordering::SeqCst), 2);
        // Another bucket has flights of its own.
        assert_eq!(flights.ask("c", trip(trips.clone(), gate.clone())).await.unwrap(), 3);
    }
}
