//! The ground floor: what every other folder may use and which itself uses nothing of the
//! crate but its own files — the error and its kinds, writing a private file, locks a panic
//! cannot poison, text made visible, redacted secrets, the metrics, logging, randomness and
//! the names the bus sees (subjects, headers, the service's endpoints), and the pages of an
//! answer of causes merged.

pub mod causes;
pub mod error;
pub mod files;
pub mod flags;
pub mod logging;
pub mod metrics;
pub mod random;
pub mod secrets;
pub mod sync;
pub mod visible;
pub mod wire;
