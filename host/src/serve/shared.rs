//! The one handle the long-running tasks of `serve` share: the two connections, the backend
//! over the buckets, the seat, the loaded component and the per-call limits. Made once when
//! the bus and the seat are open; each task (serving the verbs, notices, state records, the
//! HTTP side, hot replace) takes a clone instead of its own bundle of the same things.
//!
//! It owns nothing and starts nothing: a clone is a handful of `Arc`s.

use std::sync::Arc;

use crate::nats::seat::Seat;
use crate::nats::NatsBackend;
use crate::runtime::current::Current;
use crate::runtime::Limits;
use crate::store::backend::Backend;

#[derive(Clone)]
pub struct Shared {
    /// The buckets' connection: mirrors, writes, discovery, notices and events.
    pub client: async_nats::Client,
    /// The connection that only serves the verbs (a user whose grant is nothing but replies).
    pub service: async_nats::Client,
    /// The backend as itself: the bus's listing, the hubs of changes and events.
    pub nats: Arc<NatsBackend>,
    /// The same backend, as the guest's imports see it.
    pub backend: Arc<dyn Backend>,
    pub seat: Arc<Seat>,
    pub current: Arc<Current>,
    pub limits: Limits,
    /// The state changes this instance tells, for the status page.
    pub feed: Arc<crate::serve::feed::Feed>,
}
