//! Opening a JetStream key-value bucket, or creating it with its settings: the one step the
//! backend (`nats`) and the seat (`seat`) both take before anything else, kept below both so that
//! neither needs the other to open its buckets.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};

use crate::error::{Error, ErrorKind, Result};

/// Opens `config.bucket`, or creates it with `config`, retrying for a while: a cluster's
/// JetStream may still be electing.
pub async fn open_bucket(js: &jetstream::Context, config: kv::Config) -> Result<kv::Store> {
    let start = Instant::now();
    loop {
        let opened = match js.get_key_value(config.bucket.as_str()).await {
            Ok(kv) => Ok(kv),
            Err(_) => js
                .create_key_value(config.clone())
                .await
                .map_err(|e| Error::new(ErrorKind::Unavailable, format!("creating bucket {}: {e}", config.bucket))),
        };
        match opened {
            Ok(kv) => return Ok(kv),
            Err(e) if start.elapsed() < Duration::from_secs(60) => {
                tracing::info!(bucket = config.bucket, "bucket not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A bucket's settings: `history` values kept per key, `replicas` copies.
pub fn bucket_config(bucket: &str, description: &str, history: i64, replicas: usize) -> kv::Config {
    kv::Config { bucket: bucket.to_string(), description: description.to_string(), history, num_replicas: replicas, ..Default::default() }
}
