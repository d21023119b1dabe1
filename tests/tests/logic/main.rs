//! The pure logic, no bus and no component: the guest's answers over an in-memory store, the
//! wire's schemas, the fuzz corpus replayed, and the structure's invariants read from the
//! sources (`layering`). Fast: a test of a rule goes here, a module per behaviour.
//!
//! A new test goes in the module of the behaviour it checks; a new behaviour gets a module
//! here when it needs neither wasmtime nor NATS (else `component` or `e2e`).

mod causes;
mod fuzz_corpus;
mod holders;
mod layering;
mod schemas;
mod status;
mod transitions;
mod verb_scope;
