//! The threads beside the verbs': each a single-threaded runtime of its own (a *lane*).
//!
//! - **bus**: the buckets' connection and the mirrors it feeds. Every message a watch delivers
//!   is read, parsed and put in its mirror here, so a burst of writes in the mesh never queues
//!   before a request on the verbs' thread; the verbs read the mirrors from theirs.
//! - **followers**: plans, module states and notices ([`inputs`]), and the HTTP side
//!   (`serve::http`: the status page, its reads of the mesh, `/metrics`, probes). Their calls
//!   are batches (a state sweep, fifty changed modules) of a millisecond and more, so this lane
//!   runs at a lower priority ([`FOLLOWERS_NICE`]): when the cores are short, the kernel gives
//!   them to the answers first, and the bookkeeping catches up after.
//!
//! The lanes share the guest's instance pool, the mirrors and the connections with the verbs'
//! thread. Nothing here decides anything: a lane is a runtime on a thread, stopped (its tasks
//! with it) when it is dropped.
//!
//! [`inputs`]: crate::serve::inputs

use std::future::Future;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::base::error::{Error, ErrorKind, Result};

/// How much nicer the followers are than the verbs: a weight of about a tenth of theirs when
/// both want a core, never none (a nice thread is slowed, not starved).
pub const FOLLOWERS_NICE: i32 = 10;

/// A single-threaded runtime on a thread of its own; dropping it stops the thread and aborts
/// what it runs.
pub struct Lane {
    handle: tokio::runtime::Handle,
    /// Dropped, it ends the thread's `block_on`, and the runtime with it.
    _stop: oneshot::Sender<()>,
}

impl Lane {
    /// Starts a lane named `name` (the thread's name), `nice` steps below the priority of the
    /// thread that starts it (0: the same).
    pub fn start(name: &'static str, nice: i32) -> Result<Lane> {
        let failed = |e: std::io::Error| Error::new(ErrorKind::Config, format!("the {name} thread: {e}"));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(failed)?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if nice != 0 {
                    lower_priority(name, nice);
                }
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(failed)?;
        Ok(Lane { handle, _stop: stop })
    }

    /// Runs `task` on this lane.
    pub fn spawn<F: Future<Output = ()> + Send + 'static>(&self, task: F) -> JoinHandle<()> {
        self.handle.spawn(task)
    }

    /// Runs `task` on this lane and waits for its result: what it creates that spawns tasks of
    /// its own (a connection's reader, a mirror's watch) is then this lane's.
    pub async fn run<T: Send + 'static, F: Future<Output = T> + Send + 'static>(&self, task: F) -> Result<T> {
        self.handle.spawn(task).await.map_err(|e| Error::new(ErrorKind::Config, format!("a task of a lane ended early: {e}")))
    }

    /// This lane's runtime, for what must be registered with it (the HTTP side's listeners).
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.handle.clone()
    }
}

/// Lowers the calling thread's priority; a failure (a sandbox refusing it) only loses the
/// preference, so it is logged, not fatal. Elsewhere than Linux a thread has no niceness of its
/// own: nothing is changed.
fn lower_priority(name: &str, nice: i32) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `gettid`, `getpriority` and `setpriority` take plain integers and touch no
        // memory of ours; on Linux `PRIO_PROCESS` with a thread id is that thread alone. A new
        // thread starts at its creator's niceness: the lane's is that plus `nice`, at most 19.
        let set = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            let now = libc::getpriority(libc::PRIO_PROCESS, tid);
            libc::setpriority(libc::PRIO_PROCESS, tid, now.saturating_add(nice).min(19))
        };
        if set != 0 {
            tracing::warn!(thread = name, nice, "could not lower the thread's priority: {}", std::io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (name, nice);
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The niceness of the calling thread.
    fn own_nice() -> i32 {
        // SAFETY: as in `lower_priority`; `errno` is reset first, since -1 is also a niceness.
        unsafe {
            *libc::__errno_location() = 0;
            libc::getpriority(libc::PRIO_PROCESS, libc::syscall(libc::SYS_gettid) as libc::id_t)
        }
    }

    #[tokio::test]
    async fn runs_what_it_is_given_on_its_own_thread_at_its_own_priority() {
        let lane = Lane::start("lane-under-test", 7).expect("a lane");
        let (name, nice) = lane.run(async { (std::thread::current().name().map(str::to_string), own_nice()) }).await.expect("run");
        assert_eq!(name.as_deref(), Some("lane-under-test"));
        assert_eq!(nice, (own_nice() + 7).min(19), "the lane's niceness is its starter's plus its own");
        // What a task run there spawns stays there.
        let spawned = lane.run(async { tokio::spawn(async { std::thread::current().name().map(str::to_string) }).await }).await.expect("run");
        assert_eq!(spawned.expect("the inner task").as_deref(), Some("lane-under-test"));
    }

    #[tokio::test]
    async fn a_lane_of_niceness_zero_keeps_the_callers_priority() {
        let lane = Lane::start("plain-lane", 0).expect("a lane");
        assert_eq!(lane.run(async { own_nice() }).await.expect("run"), own_nice());
    }

    #[tokio::test]
    async fn a_dropped_lane_stops_what_it_runs() {
        let lane = Lane::start("dropped-lane", 0).expect("a lane");
        let (tx, rx) = oneshot::channel::<()>();
        let task = lane.spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        drop(lane);
        // The task's end drops its sender: the receiver hears it closed.
        assert!(rx.await.is_err(), "the task outlived its lane");
        assert!(task.await.expect_err("aborted").is_cancelled());
    }
}
