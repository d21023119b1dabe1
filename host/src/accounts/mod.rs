//! The mesh's accounts (SPEC §8: accounts are the boundary), rendered from its nodes and
//! providers: one model of the parties and their grants (`parties`), written as a static
//! server config (`conf`) or signed the NATS way for operator mode (`jwt`, `operator`). Pure
//! rendering and the files it keeps (keys, creds); nothing here talks to the bus.

pub mod conf;
pub mod jwt;
pub mod operator;
pub mod parties;

pub use parties::Mesh;
