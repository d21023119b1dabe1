//! Discovery: how many instances of a service answer `$SRV.PING.<service>` now (answers kept
//! for a few seconds; not connected is an error, never "none").

use super::*;

/// Longest ping answer read (nats-server's `$SRV.PING` answers are a few hundred bytes).
const MAX_ANSWER: usize = 4096;
/// Most instances counted: enough to say a service answers, bounded whoever answers.
const MAX_INSTANCES: usize = 1024;

impl NatsBackend {
    /// Discovery pings sent so far (cache misses).
    pub fn pings(&self) -> u64 {
        self.pings.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Pings `$SRV.PING.<service>` and counts the distinct instances that answer: wait for the
    /// first up to [`DISCOVERY_WAIT`], then for more until none came for [`DISCOVERY_SETTLE`].
    /// With the connection down the answer is unknown (an error), never "none".
    pub(super) async fn discover(&self, service: &str) -> Result<u32> {
        let down = |why: String| Error::new(ErrorKind::Unavailable, format!("discovery of {service}: {why}"));
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(down("not connected to the bus".into()));
        }
        let inbox = self.client.new_inbox();
        let mut replies = self.client.subscribe(inbox.clone()).await.map_err(|e| down(e.to_string()))?;
        self.client.publish_with_reply(format!("$SRV.PING.{service}"), inbox, bytes::Bytes::new()).await.map_err(|e| down(e.to_string()))?;
        self.pings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        let mut ids = std::collections::HashSet::new();
        let mut until = started + DISCOVERY_WAIT;
        while let Ok(reply) = tokio::time::timeout_at(until, replies.next()).await {
            let Some(m) = reply else { return Err(down("the reply subscription ended".into())) };
            if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                break;
            }
            // Each instance names itself; an answer without an id (or too long to be a ping's
            // answer: another account's service answers this) still counts once.
            let id = (m.payload.len() <= MAX_ANSWER)
                .then(|| serde_json::from_slice::<serde_json::Value>(&m.payload).ok())
                .flatten()
                .and_then(|v| v["id"].as_str().map(str::to_string));
            ids.insert(id.unwrap_or_else(|| format!("anonymous-{}", ids.len())));
            if ids.len() >= MAX_INSTANCES {
                break;
            }
            until = (tokio::time::Instant::now() + DISCOVERY_SETTLE).min(started + DISCOVERY_WAIT);
        }
        let _ = replies.unsubscribe().await;
        Ok(ids.len() as u32)
    }
}
