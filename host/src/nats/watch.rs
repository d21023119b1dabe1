//! A bucket's watch as a mirror reads it ([`Watch`]): the changes of a bucket, each a key, its
//! value, its revision, how many messages are still to come, and whether it is a delete.
//!
//! A bucket that keeps one message a key, and any watch resumed after a snapshot's revision,
//! is read through an ordered consumer **without a subject filter**: every message of the
//! stream, in order. async-nats's KV watch filters on `$KV.<bucket>.>`, and nats-server then
//! matches each stored message against the filter as it delivers it; a bucket's stream holds
//! nothing else (`bucket::shape` refuses one that does), so the filter selects everything and
//! only costs. Measured on one server with 1M keys, three rounds (the bus bench's
//! `BENCH_WATCHES=1`): 1.53 / 1.92 / 1.67 s unfiltered, 1.78 / 2.09 / 2.05 s the KV watch.
//! With one message a key every message is its key's last, so a full replay reads the same
//! entries as the KV watch's `LastPerSubject`; a bucket with history keeps the KV watch, which
//! does not replay superseded revisions.
//!
//! What this must not do: read a key's tokens. A key is its subject past the bucket's prefix
//! (as the KV watch cuts it); a subject without that prefix is an error, never a panic.

use async_nats::jetstream::consumer::push::{Ordered, OrderedConfig};
use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy};
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::StreamExt;

use crate::base::error::{Error, ErrorKind, Result};

/// The KV headers that say a message is a delete (async-nats's `Operation`).
const KV_OPERATION: &str = "KV-Operation";
/// A marker nats-server writes itself (a key's TTL ran out, or it was removed or purged).
const MARKER_REASON: &str = "Nats-Marker-Reason";

/// One message of a bucket, as a mirror takes it.
pub(super) struct Watched {
    subject: async_nats::Subject,
    /// Where the key begins in `subject`.
    key_at: usize,
    pub value: Bytes,
    pub revision: u64,
    /// Messages still to come to the watch when this one was sent (0: it is in sync).
    pub delta: u64,
    pub deleted: bool,
}

impl Watched {
    pub fn key(&self) -> &str {
        &self.subject[self.key_at..]
    }
}

/// A watch of a bucket, from its start or after a revision.
pub(super) enum Watch {
    /// Every message of the stream, unfiltered; keys cut after `prefix`.
    Stream { messages: Ordered, prefix: String },
    /// async-nats's KV watch (a bucket with history, replayed in full).
    Kv(kv::Watch),
}

impl Watch {
    /// Opens a watch of `kv`'s bucket: after revision `after` (every message since), or in
    /// full (each key's last message, then every change). `history` is the bucket's, as its
    /// stream's configuration says; `js` the context `kv` was opened with.
    pub async fn open(js: &jetstream::Context, kv: &kv::Store, after: Option<u64>, history: i64) -> Result<Watch> {
        let unavailable = |e: &dyn std::fmt::Display| Error::new(ErrorKind::Unavailable, format!("watching {}: {e}", kv.name));
        let deliver_policy = match (after, history) {
            (Some(after), _) => DeliverPolicy::ByStartSequence { start_sequence: after.saturating_add(1) },
            (None, 1) => DeliverPolicy::All,
            (None, _) => return kv.watch_with_history(">").await.map(Watch::Kv).map_err(|e| unavailable(&e)),
        };
        let config = OrderedConfig {
            deliver_subject: js.client().new_inbox(),
            description: Some("mesh-provisioner mirror".to_string()),
            replay_policy: ReplayPolicy::Instant,
            deliver_policy,
            ..Default::default()
        };
        let consumer = kv.stream.create_consumer(config).await.map_err(|e| unavailable(&e))?;
        let messages = consumer.messages().await.map_err(|e| unavailable(&e))?;
        Ok(Watch::Stream { messages, prefix: kv.prefix.clone() })
    }

    /// The next change; `None` when the watch ended.
    pub async fn next(&mut self) -> Option<Result<Watched>> {
        match self {
            Watch::Kv(watch) => Some(watch.next().await?.map_err(|e| Error::new(ErrorKind::Unavailable, e.to_string())).map(|entry| Watched {
                deleted: !matches!(entry.operation, kv::Operation::Put),
                subject: entry.key.into(),
                key_at: 0,
                value: entry.value,
                revision: entry.revision,
                delta: entry.delta,
            })),
            Watch::Stream { messages, prefix } => {
                let message = match messages.next().await? {
                    Ok(m) => m,
                    Err(e) => return Some(Err(Error::new(ErrorKind::Unavailable, e.to_string()))),
                };
                let (revision, delta) = match message.info() {
                    Ok(info) => (info.stream_sequence, info.pending),
                    Err(e) => return Some(Err(Error::new(ErrorKind::Invalid, format!("a message on {} without a stream's reply: {e}", message.subject)))),
                };
                Some(change(message.message, revision, delta, prefix))
            }
        }
    }
}

/// A stream's message, at `revision` with `delta` to come, as a change of the bucket whose
/// subjects begin with `prefix`.
fn change(message: async_nats::Message, revision: u64, delta: u64, prefix: &str) -> Result<Watched> {
    if !message.subject.starts_with(prefix) || message.subject.len() == prefix.len() {
        return Err(Error::new(ErrorKind::Invalid, format!("a message on {}, outside the bucket's {prefix}>", message.subject)));
    }
    // As the KV watch reads them: the operation header when there is one, else a marker's
    // reason; anything else (an unknown value included) is a put.
    let deleted = message.headers.as_ref().is_some_and(|h| match h.get(KV_OPERATION) {
        Some(operation) => matches!(operation.as_str(), "DEL" | "PURGE"),
        None => h.get(MARKER_REASON).is_some_and(|reason| matches!(reason.as_str(), "MaxAge" | "Purge" | "Remove")),
    });
    Ok(Watched { subject: message.subject, key_at: prefix.len(), value: message.payload, revision, delta, deleted })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFIX: &str = "$KV.mesh-provisioner_needs.";

    fn message(subject: &str, headers: &[(&str, &str)]) -> async_nats::Message {
        let mut map = async_nats::HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, *value);
        }
        async_nats::Message {
            subject: subject.into(),
            reply: None,
            payload: Bytes::from_static(b"{\"v\":1}"),
            headers: (!headers.is_empty()).then_some(map),
            status: None,
            description: None,
            length: 0,
        }
    }

    #[test]
    fn reads_a_delete_purge_or_marker_as_the_kv_watch_does() {
        let cases: [(&[(&str, &str)], bool); 11] = [
            (&[], false),
            (&[("KV-Operation", "DEL")], true),
            (&[("KV-Operation", "PURGE")], true),
            (&[("KV-Operation", "PUT")], false),
            // An unknown operation is a put to the KV watch too.
            (&[("KV-Operation", "ERASE")], false),
            (&[("Nats-Marker-Reason", "MaxAge")], true),
            (&[("Nats-Marker-Reason", "Purge")], true),
            (&[("Nats-Marker-Reason", "Remove")], true),
            (&[("Nats-Marker-Reason", "Expired")], false),
            // The operation header, when there is one, is what counts.
            (&[("KV-Operation", "PUT"), ("Nats-Marker-Reason", "Remove")], false),
            (&[("Nats-TTL", "5s")], false),
        ];
        for (headers, deleted) in cases {
            let change = change(message(&format!("{PREFIX}alpha.m1.config.db_url"), headers), 42, 7, PREFIX).expect("a message of the bucket");
            assert_eq!(change.deleted, deleted, "{headers:?}");
            assert_eq!((change.key(), change.revision, change.delta, &change.value[..]), ("alpha.m1.config.db_url", 42, 7, &b"{\"v\":1}"[..]));
        }
    }

    #[test]
    fn refuses_a_message_outside_its_bucket_naming_the_subject() {
        for subject in ["$KV.mesh-provisioner_applied.alpha.m1", "$KV.mesh-provisioner_needs", PREFIX, "alpha.m1"] {
            let refused = change(message(subject, &[]), 1, 0, PREFIX).err().unwrap_or_else(|| panic!("{subject} taken as a key"));
            assert_eq!(refused.kind(), ErrorKind::Invalid);
            assert!(refused.to_string().contains(&format!("a message on {subject}, outside the bucket's {PREFIX}>")), "{refused}");
        }
    }
}
