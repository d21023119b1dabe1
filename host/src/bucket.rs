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

/// The longest any one bus operation of the host may take: a server that hangs (paused, cut
/// off, electing forever) makes the operation a [`ErrorKind::Timeout`], never a wait. JetStream
/// calls carry async-nats' own timeout too; this bounds what they do not (listings of many
/// pages, watches being set up, a drain).
pub const BUS_DEADLINE: Duration = Duration::from_secs(5);

/// Runs one bus operation under [`BUS_DEADLINE`]; `what` names it in the error.
pub async fn bounded<T>(what: impl FnOnce() -> String, op: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(BUS_DEADLINE, op).await {
        Ok(r) => r,
        Err(_) => Err(Error::new(ErrorKind::Timeout, format!("{}: no answer from the bus within {BUS_DEADLINE:?}", what()))),
    }
}

/// The state of `bucket`'s stream, read now (a `kv::Store`'s status is what was read when it
/// was opened); `None` when the bucket does not exist. An error only when the bus cannot say.
pub async fn stream_state(js: &jetstream::Context, bucket: &str) -> Result<Option<jetstream::stream::State>> {
    use async_nats::jetstream::context::GetStreamErrorKind;
    use async_nats::jetstream::ErrorCode;
    bounded(
        || format!("reading the state of bucket {bucket}"),
        async {
            match js.get_stream(format!("KV_{bucket}")).await {
                Ok(stream) => Ok(Some(stream.cached_info().state.clone())),
                Err(e) => match e.kind() {
                    GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => Ok(None),
                    _ => Err(Error::new(ErrorKind::Unavailable, format!("bucket {bucket}: {e}"))),
                },
            }
        },
    )
    .await
}

/// Creates `config.bucket` if it does not exist, in one attempt (under [`BUS_DEADLINE`]):
/// how a bucket the bus lost (a server restarted with an empty store) is made again. Whether
/// it was created.
pub async fn ensure_bucket(js: &jetstream::Context, config: kv::Config) -> Result<bool> {
    if stream_state(js, &config.bucket).await?.is_some() {
        return Ok(false);
    }
    let bucket = config.bucket.clone();
    bounded(
        || format!("creating bucket {bucket}"),
        async { js.create_key_value(config).await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("creating bucket {bucket}: {e}"))) },
    )
    .await?;
    Ok(true)
}
