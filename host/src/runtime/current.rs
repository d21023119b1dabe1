//! The guest currently serving, swapped atomically: a call takes the current one and finishes
//! on it even if a new one is swapped in meanwhile. Also what the last refused upgrade was, so
//! `$SRV.INFO` can say it.

use crate::base::sync::{Locked, ReadWrite};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use crate::runtime::{BuildInfo, Guest};

/// A loaded component and what it says of itself.
pub struct Loaded {
    pub guest: Guest,
    pub info: BuildInfo,
}

/// A component that was refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub digest: String,
    pub reason: String,
}

pub struct Current {
    slot: RwLock<Arc<Loaded>>,
    refusals: Mutex<(u64, Option<Refusal>)>,
    swaps: Mutex<u64>,
    /// Bumped on every swap or refusal, for whoever shows them.
    changed: watch::Sender<u64>,
}

impl Current {
    pub fn new(loaded: Loaded) -> Arc<Self> {
        Arc::new(Current { slot: RwLock::new(Arc::new(loaded)), refusals: Mutex::new((0, None)), swaps: Mutex::new(0), changed: watch::channel(0).0 })
    }

    pub fn get(&self) -> Arc<Loaded> {
        self.slot.reading().clone()
    }

    /// Puts `loaded` in place, returning the one it replaces.
    pub fn swap(&self, loaded: Loaded) -> Arc<Loaded> {
        let old = {
            let mut slot = self.slot.writing();
            std::mem::replace(&mut *slot, Arc::new(loaded))
        };
        *self.swaps.locked() += 1;
        crate::base::metrics::metrics().swaps.inc();
        self.changed.send_modify(|g| *g += 1);
        old
    }

    /// Records a refused component.
    pub fn refuse(&self, refusal: Refusal) {
        {
            let mut r = self.refusals.locked();
            r.0 += 1;
            r.1 = Some(refusal);
        }
        crate::base::metrics::metrics().refusals.inc();
        self.changed.send_modify(|g| *g += 1);
    }

    /// How many components were refused, and the last one.
    pub fn refusals(&self) -> (u64, Option<Refusal>) {
        self.refusals.locked().clone()
    }

    pub fn swaps(&self) -> u64 {
        *self.swaps.locked()
    }

    /// Wakes on every swap or refusal.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}
