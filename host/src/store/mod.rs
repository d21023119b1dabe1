//! What answers the guest's reads and keeps its plans, knowing nothing of the bus: the
//! [`backend::Backend`] the imports stand on (and its in-memory [`backend::MemoryBackend`]),
//! in-memory mirrors of buckets, their snapshots on disk, kept plans, and how long an answer
//! holds. The bus feeds them (`nats`); nothing here opens a connection.

pub mod backend;
pub mod holds;
pub mod kept;
pub mod mirror;
pub mod snapshot;
