//! The thread the guest's followers run on: plans, module states and notices ([`inputs`]), and
//! the HTTP side (`serve::http`: the status page, its reads of the mesh, `/metrics`, probes).
//!
//! Their calls are batches (a state sweep, a hundred changed modules) of a millisecond and more.
//! On the serving thread a request that arrived during one waited for it to yield at the
//! next epoch tick; here the two threads share the guest's instance pool, the mirrors and the
//! connection, and the kernel shares the cores between them. Nothing here decides anything:
//! it is a runtime on a thread, stopped (its tasks with it) when it is dropped.
//!
//! [`inputs`]: crate::serve::inputs

use std::future::Future;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::base::error::{Error, ErrorKind, Result};

/// A single-threaded runtime on a thread of its own; dropping it stops the thread and aborts
/// what it runs.
pub struct Followers {
    handle: tokio::runtime::Handle,
    /// Dropped, it ends the thread's `block_on`, and the runtime with it.
    _stop: oneshot::Sender<()>,
}

impl Followers {
    pub fn start() -> Result<Followers> {
        let failed = |e: std::io::Error| Error::new(ErrorKind::Config, format!("the followers' thread: {e}"));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(failed)?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("followers".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(failed)?;
        Ok(Followers { handle, _stop: stop })
    }

    /// Runs `task` on this thread.
    pub fn spawn<F: Future<Output = ()> + Send + 'static>(&self, task: F) -> JoinHandle<()> {
        self.handle.spawn(task)
    }

    /// This thread's runtime, for what must be registered with it (the HTTP side's listeners).
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.handle.clone()
    }
}
