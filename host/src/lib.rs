//! The host of mesh-provisioner: runs the guest component (all of the logic) over NATS
//! JetStream. It mirrors buckets, writes the registry on the guest's word, serves the verbs as a
//! NATS micro service, and starts an embedded `nats-server` when given no bus.
//!
//! The host moves bytes: it never parses a key, escapes a name or knows a registry entry; those
//! live in the guest only.
//!
//! Folders by role, each using only those below it (ARCHITECTURE.md's layers): [`cli`] names
//! the commands; [`commands`] (run from a terminal) and [`serve`] (the server and its tasks);
//! [`nats`] (the bus); [`runtime`] (the component); [`store`] (mirrors, snapshots, kept plans);
//! [`accounts`] (the mesh's accounts rendered); [`base`] (errors, files, locks, escaping,
//! metrics, wire names).

pub mod accounts;
pub mod base;
pub mod cli;
pub mod commands;
pub mod nats;
pub mod runtime;
pub mod serve;
pub mod store;

/// The WIT package this host speaks.
pub const WIT_VERSION: &str = "mesh:provisioner@0.10.0";
