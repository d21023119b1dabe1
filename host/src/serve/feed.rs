//! The state changes this instance told, for the status page's event stream (`/api/events`):
//! handed over in process by the recorder (`states`) as each is published, never heard back
//! from the bus, so nothing another party publishes reaches a page or the connections.
//!
//! Bounded in bytes: an event is kept as its compact JSON text, at most [`MAX_EVENT_BYTES`]
//! (a bigger one is told as a `resync`), and at most [`KEPT`] of them wait for the slowest page
//! (one that falls further behind is told to `resync`). So a page that never reads holds at
//! most `KEPT × MAX_EVENT_BYTES`, shared by every page.

use std::sync::Arc;

use tokio::sync::broadcast;

/// Events kept for a page that falls behind.
pub const KEPT: usize = 1024;
/// Longest event kept (its compact JSON); a longer one reaches the pages as a `resync`.
pub const MAX_EVENT_BYTES: usize = 16 * 1024;

/// One event as a page receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Told {
    /// A state change: one line of compact JSON, an object.
    State(Arc<str>),
    /// Read `/api/status` again: a change could not be passed on as it was.
    Resync,
}

/// The hub the recorder tells and the pages follow.
pub struct Feed {
    sender: broadcast::Sender<Told>,
}

impl Default for Feed {
    fn default() -> Self {
        Feed { sender: broadcast::channel(KEPT).0 }
    }
}

impl Feed {
    /// Passes one published event on to every page following; `body` is what was published.
    /// An event too long, not JSON or not an object is told as a `resync` (never a page
    /// handed what it cannot read).
    pub fn tell(&self, body: &[u8]) {
        if self.sender.receiver_count() == 0 {
            return;
        }
        let told = match (body.len() <= MAX_EVENT_BYTES).then(|| serde_json::from_slice::<serde_json::Value>(body).ok()).flatten() {
            // Written again compactly: an event's data must be one line.
            Some(v @ serde_json::Value::Object(_)) => Told::State(v.to_string().into()),
            _ => Told::Resync,
        };
        let _ = self.sender.send(told);
    }

    /// A page's following, from now on.
    pub fn follow(&self) -> broadcast::Receiver<Told> {
        self.sender.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_gets_each_event_as_one_line_and_a_resync_for_what_it_cannot_read() {
        let feed = Feed::default();
        feed.tell(br#"{"node":"a"}"#);
        let mut page = feed.follow();
        feed.tell(b"{\n \"node\": \"alpha\",\n \"state\": \"applied\"\n}");
        feed.tell(b"[1]");
        feed.tell(b"not json");
        let long = format!(r#"{{"reason":"{}"}}"#, "x".repeat(MAX_EVENT_BYTES));
        feed.tell(long.as_bytes());
        let edge = format!(r#"{{"r":"{}"}}"#, "x".repeat(MAX_EVENT_BYTES - 8));
        assert_eq!(edge.len(), MAX_EVENT_BYTES);
        feed.tell(edge.as_bytes());
        assert_eq!(page.try_recv().unwrap(), Told::State(r#"{"node":"alpha","state":"applied"}"#.into()));
        for _ in 0..3 {
            assert_eq!(page.try_recv().unwrap(), Told::Resync);
        }
        assert_eq!(page.try_recv().unwrap(), Told::State(edge.into()));
        assert!(page.try_recv().is_err());
    }

    #[test]
    fn a_page_that_never_reads_holds_at_most_the_kept_events_and_is_told_it_lagged() {
        let feed = Feed::default();
        let mut page = feed.follow();
        for i in 0..KEPT * 3 {
            feed.tell(format!(r#"{{"n":{i}}}"#).as_bytes());
        }
        assert_eq!(feed.sender.len(), KEPT);
        assert!(matches!(page.try_recv(), Err(broadcast::error::TryRecvError::Lagged(n)) if n == (KEPT * 2) as u64));
        assert_eq!(page.try_recv().unwrap(), Told::State(format!(r#"{{"n":{}}}"#, KEPT * 2).into()));
    }
}
