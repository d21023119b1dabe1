//! The real guest component in wasmtime, no bus: the verbs, plans, status and registry
//! answered through the host's runtime over in-memory mirrors, and the reply cache.
//!
//! A new test goes in the module of the behaviour it checks; a behaviour that needs the
//! component's own build (its imports, limits, traps) but not NATS gets a module here.

mod plans;
mod registry;
mod reply_cache;
mod status;
mod verb;
