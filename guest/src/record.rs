//! The record of each module's state (SPEC §7.3), kept by the seat's holder in
//! `mesh-provisioner_states` under `<node>.<module>`: the state it last saw and since when.
//!
//! The bucket is on the bus so that a standby taking the seat, or the holder after a restart,
//! knows since when each module has been in its state; only `transitions` decides what is
//! written there, and the host writes it (compare-and-set) without reading it. Status reads it
//! to say `since`, and only when the record's state is the state found now: a state the holder
//! has not yet recorded has no `since` rather than a wrong one.

use serde::{Deserialize, Serialize};

use crate::env::{Env, HostError};

/// The bucket of state records.
pub const STATES: &str = "mesh-provisioner_states";

/// One module's recorded state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Record {
    /// The state's name (`pending`, `applied`, …).
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::module_state"))]
    pub state: String,
    /// When the holder first saw the module in it (RFC 3339, UTC).
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::timestamp"))]
    pub since: String,
}

impl Record {
    /// The record's bytes as kept.
    pub fn to_bytes(&self) -> Vec<u8> {
        crate::value::to_json(self).into_bytes()
    }
}

/// The record of `<node>.<module>` and its revision; `None` when there is none or it cannot
/// be read (a damaged record is written over at the next change, never trusted).
pub fn read(env: &dyn Env, node: &str, module: &str) -> Result<Option<(Record, u64)>, HostError> {
    let Some(e) = env.get(STATES, &[node, ".", module].concat())? else { return Ok(None) };
    Ok(match serde_json::from_slice::<Record>(&e.value) {
        Ok(r) => Some((r, e.revision)),
        // Unreadable: kept as a revision to write over, with no state anything equals.
        Err(_) => Some((Record { state: String::new(), since: String::new() }, e.revision)),
    })
}

/// Since when `module` on `node` has been in `state`, if the holder recorded it so. A record
/// that cannot be read now says nothing: `since` is a hint about time, never a reason to fail
/// a status.
pub fn since(env: &dyn Env, node: &str, module: &str, state: &str) -> Option<String> {
    since_in(read(env, node, module).ok().flatten().as_ref().map(|(r, _)| r), state)
}

/// [`since`] from a record already read.
pub fn since_in(record: Option<&Record>, state: &str) -> Option<String> {
    record.filter(|r| r.state == state && !r.since.is_empty()).map(|r| r.since.clone())
}
