//! The operator's commands, run from a terminal and ended with an exit code: `query` (and its `causes`),
//! `verify`, `registry`/`check`/`sign`, `bootstrap`, `accounts`. Each module owns its command's flags and
//! its `run`; they ask the running server or the bus, and never share a task with `serve`.

pub mod accounts;
pub mod bootstrap;
pub mod causes;
pub mod inspect;
pub mod query;
pub mod verify;

/// How a command that ran to its end came out, when that is more than done: what a script
/// waits on (its exit code), not a failure of the bus or the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Done,
    /// Not every holder of a value runs the one at its place yet (`query holders`): exit 3.
    NotCurrent,
    /// The server's answers differ from the bus (`verify`): exit 4.
    Diverged,
}

impl Exit {
    pub fn exit_code(self) -> u8 {
        match self {
            Exit::Done => 0,
            Exit::NotCurrent => 3,
            Exit::Diverged => 4,
        }
    }
}
