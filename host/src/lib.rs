//! The host of mesh-provisioner: runs the guest component (all of the logic) over NATS
//! JetStream. It mirrors buckets, writes the registry on the guest's word, serves the verbs as a
//! NATS micro service, and starts an embedded `nats-server` when given no bus.
//!
//! The host moves bytes: it never parses a key, escapes a name or knows a registry entry; those
//! live in the guest only.

pub mod audit;
pub mod backend;
pub mod bootstrap;
pub mod bucket;
pub mod changes;
pub mod check;
pub mod cli;
pub mod connect;
pub mod current;
pub mod demo;
pub mod embedded;
pub mod error;
pub mod events;
pub mod feed;
pub mod files;
pub mod holds;
pub mod http;
pub mod kept;
pub mod logging;
pub mod metrics;
pub mod mirror;
pub mod nats;
pub mod notices;
pub mod plans;
pub mod prune;
pub mod query;
pub mod reconciler;
pub mod reload;
pub mod runtime;
pub mod seat;
pub mod secrets;
pub mod serve;
pub mod service;
pub mod shared;
pub mod snapshot;
pub mod states;
pub mod sync;
pub mod trust;
pub mod verify;
pub mod visible;

/// The WIT package this host speaks.
pub const WIT_VERSION: &str = "mesh:provisioner@0.8.0";
