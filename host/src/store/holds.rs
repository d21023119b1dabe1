//! How long an answer stays true: until an instant, and, when tied to a counter, while that
//! counter has not moved. Handed out with a read (a one-off mirror of a missing bucket, a
//! count of responders) so that whoever keeps the read (the reply cache) never asks again.
//! Below `backend` and `mirror`; it knows nothing of either.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// How long something a backend answered stays what it would answer again: until an instant,
/// and, when tied to a counter (streams announced created), while the counter has not moved.
/// A read says it itself, so nothing asks the backend afterwards (the reply cache keeps a reply
/// only while every read's [`Holds`] holds).
#[derive(Debug, Clone)]
pub struct Holds {
    until: Instant,
    counter: Option<(Arc<AtomicU64>, u64)>,
}

impl Holds {
    pub fn until(until: Instant) -> Holds {
        Holds { until, counter: None }
    }

    /// ... and only while `counter` is still at `seen`.
    pub fn while_at(self, counter: Arc<AtomicU64>, seen: u64) -> Holds {
        Holds { counter: Some((counter, seen)), ..self }
    }

    pub fn holds(&self) -> bool {
        Instant::now() < self.until && self.counter.as_ref().is_none_or(|(c, seen)| c.load(Ordering::Acquire) == *seen)
    }
}
