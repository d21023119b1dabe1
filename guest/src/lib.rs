//! mesh-provisioner's logic: key shapes and escaping, the registry table and its reconciliation,
//! and the verbs. Built as a WebAssembly component (`wasm32-wasip2`), run by the host.
//!
//! Everything here is plain Rust over the [`env::Env`] trait, so it compiles and is tested
//! natively too; `bindings` (wasm only) is the thin layer that ties `Env` to the WIT imports and
//! the WIT exports to these functions. This crate does no I/O and holds no connection (of NATS
//! it knows only the subject syntax keys and filters are written in): it reads and writes only
//! through `Env`. It has no `unsafe`: only the generated bindings and the allocator (a bump
//! arena before the system allocator during an export's call), which the native build (tests,
//! fuzzing) never compiles, may use it.
#![deny(unsafe_code)]

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod allocator;
pub mod arena;
pub mod causes;
pub mod checks;
pub mod env;
pub mod escape;
#[cfg(all(test, feature = "fuzzing"))]
mod every_page_fits;
pub mod fresh;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod holders;
pub mod keys;
#[cfg(any(test, feature = "fuzzing"))]
pub mod mem_env;
pub mod modules;
pub mod plain_json;
pub mod plan;
pub mod provision;
pub mod reconcile;
pub mod record;
pub mod refresh;
pub mod registry;
pub mod reply;
pub mod request;
#[cfg(feature = "schema")]
pub mod schema;
pub mod status;
pub mod transitions;
pub mod value;
pub mod verb;

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod bindings;
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod fixture;

/// The program's name, as build info reports it.
pub const NAME: &str = "mesh-provisioner";
/// The guest's version.
#[cfg(not(feature = "fixture-v2"))]
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The second version test fixture: another registry table.
#[cfg(feature = "fixture-v2")]
pub const VERSION: &str = "0.2.0-fixture";
/// The WIT package this guest implements.
pub const WIT_VERSION: &str = "mesh:provisioner@0.10.0";
