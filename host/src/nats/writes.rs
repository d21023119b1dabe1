//! The writes this backend makes: compare-and-set on the registry and the state records, only
//! while the seat is held, each waiting (briefly) for its mirror to show it; async-nats' KV
//! errors mapped to host error kinds.

use super::*;

impl NatsBackend {
    /// Writes a module's state record as the guest decided it: compare-and-set on `expected`
    /// (0: none may exist), an empty `value` deletes it. Only while the seat is held. The
    /// revision written (none for a delete): the caller waits for the mirror to show the last
    /// of a batch ([`NatsBackend::settle_states`]) rather than for each record in turn.
    pub async fn write_state(&self, key: &str, value: Vec<u8>, expected: u64) -> Result<Option<u64>> {
        self.check_writable()?;
        crate::base::wire::check_subject(key, false)?;
        if value.is_empty() {
            // A delete's marker is not the next decision's concern: no record reads as none.
            return bounded(|| format!("deleting state record {key}"), async {
                self.states.delete_expect_revision(key, Some(expected)).await.map_err(|e| update_err("state record delete", e))
            })
            .await
            .map(|()| None);
        }
        cas_put(&self.states, "state record", key, value, expected).await.map(Some)
    }

    /// Waits (briefly) until the states mirror shows `revision`, so the next decision reads
    /// the records written up to it.
    pub async fn settle_states(&self, revision: u64) {
        self.settle(STATES_BUCKET, revision).await;
    }
}

/// A compare-and-set write of `key` in `store` (`what` names the bucket in errors): created
/// when `expected` is 0, else updated from that revision; the new revision.
pub(super) async fn cas_put(store: &kv::Store, what: &str, key: &str, value: Vec<u8>, expected: u64) -> Result<u64> {
    bounded(|| format!("writing {what} key {key}"), async {
        if expected == 0 {
            store.create(key, value.into()).await.map_err(|e| create_err(&format!("{what} create"), e))
        } else {
            store.update(key, value.into(), expected).await.map_err(|e| update_err(&format!("{what} write"), e))
        }
    })
    .await
}

pub(super) fn create_err(what: &str, e: kv::CreateError) -> Error {
    let kind = match e.kind() {
        kv::CreateErrorKind::AlreadyExists => ErrorKind::Conflict,
        kv::CreateErrorKind::InvalidKey => ErrorKind::Invalid,
        _ => ErrorKind::Unavailable,
    };
    Error::new(kind, format!("{what}: {e}"))
}

pub(super) fn update_err(what: &str, e: kv::UpdateError) -> Error {
    let kind = match e.kind() {
        kv::UpdateErrorKind::WrongLastRevision => ErrorKind::Conflict,
        kv::UpdateErrorKind::InvalidKey => ErrorKind::Invalid,
        kv::UpdateErrorKind::TimedOut => ErrorKind::Timeout,
        _ => ErrorKind::Unavailable,
    };
    Error::new(kind, format!("{what}: {e}"))
}
