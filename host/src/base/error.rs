//! The host's error, with a matchable kind (async-nats style): retry, lease and swap code
//! branches on [`ErrorKind`], never on message text.

use std::fmt;

/// What kind of failure an [`Error`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The bus or a bucket cannot be reached now, or a mirror is not in sync.
    Unavailable,
    /// A compare-and-set lost: another writer was first.
    Conflict,
    /// The account may not do this.
    Denied,
    /// Arguments refused before anything was sent.
    Invalid,
    /// No reply in time.
    Timeout,
    /// Nobody listens on the subject.
    NoResponders,
    /// The guest component trapped, ran past its deadline or its memory, or is not usable.
    Guest,
    /// A file or setting of the operator's is wrong.
    Config,
    /// Stored data could not be read back as written (a damaged kept-plan file).
    Corrupt,
}

/// A host failure: a kind and what happened.
#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;
