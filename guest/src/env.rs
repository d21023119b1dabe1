//! What the logic may ask of its host, as a plain Rust trait.
//!
//! The component's bindings implement it with the WIT imports; unit tests implement it in memory.
//! Keeping binding types out of the logic is what lets the logic compile and test natively.

use std::fmt;

/// One key of a bucket, as last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub revision: u64,
    pub value: Vec<u8>,
}

/// One page of a scan.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub entries: Vec<Entry>,
    pub more: bool,
    pub revision: u64,
}

/// Why a host operation failed (the WIT `host-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostError {
    Unavailable(String),
    Conflict(String),
    Denied(String),
    Invalid(String),
    Timeout(String),
    NoResponders(String),
    Corrupt(String),
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Unavailable(m) => write!(f, "unavailable: {m}"),
            HostError::Conflict(m) => write!(f, "conflict: {m}"),
            HostError::Denied(m) => write!(f, "denied: {m}"),
            HostError::Invalid(m) => write!(f, "invalid: {m}"),
            HostError::Timeout(m) => write!(f, "timeout: {m}"),
            HostError::NoResponders(m) => write!(f, "no responders: {m}"),
            HostError::Corrupt(m) => write!(f, "corrupt: {m}"),
        }
    }
}

/// What the host knows of a bucket besides its contents (the WIT `bucket-health`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// Settings of its stream that let one writer remove or crowd out another's keys.
    pub unsafe_settings: Vec<String>,
    /// Writers (a key's first token) past the host's quota: writer, keys, bytes.
    pub over_quota: Vec<(String, u64, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// The host, as the logic sees it.
pub trait Env {
    fn get(&self, bucket: &str, key: &str) -> Result<Option<Entry>, HostError>;
    fn scan(&self, bucket: &str, filter: &str, after: Option<&str>, limit: u32) -> Result<Page, HostError>;
    /// Whether `bucket` exists (a missing bucket reads as empty).
    fn exists(&self, bucket: &str) -> Result<bool, HostError>;
    /// What is wrong with `bucket` besides its contents (nothing, unless a host says so).
    fn health(&self, _bucket: &str) -> Result<Health, HostError> {
        Ok(Health::default())
    }
    /// How many instances of the micro service `service` answer discovery now.
    fn responders(&self, service: &str) -> Result<u32, HostError>;
    fn put_registry(&self, key: &str, value: &[u8], expected: u64) -> Result<u64, HostError>;
    fn delete_registry(&self, key: &str, expected: u64) -> Result<(), HostError>;
    fn log(&self, level: Level, message: &str);
    /// The plan kept for `module` on `node`, as last saved.
    fn load_plan(&self, node: &str, module: &str) -> Result<Option<Vec<u8>>, HostError>;
    /// Keeps `plan` for `module` on `node`.
    fn save_plan(&self, node: &str, module: &str, plan: &[u8]) -> Result<(), HostError>;
    /// Why the last attempt to keep the plan of `module` on `node` failed, if it did.
    fn keep_failure(&self, node: &str, module: &str) -> Option<String>;
}
