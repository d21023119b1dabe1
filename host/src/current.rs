//! The guest currently serving, swapped atomically: a call takes the current one and finishes
//! on it even if a new one is swapped in meanwhile.

use std::sync::{Arc, RwLock};

use crate::runtime::{BuildInfo, Guest};

/// A loaded component and what it says of itself.
pub struct Loaded {
    pub guest: Guest,
    pub info: BuildInfo,
}

pub struct Current {
    slot: RwLock<Arc<Loaded>>,
}

impl Current {
    pub fn new(loaded: Loaded) -> Arc<Self> {
        Arc::new(Current { slot: RwLock::new(Arc::new(loaded)) })
    }

    pub fn get(&self) -> Arc<Loaded> {
        self.slot.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Puts `loaded` in place, returning the one it replaces.
    pub fn swap(&self, loaded: Loaded) -> Arc<Loaded> {
        let mut slot = self.slot.write().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *slot, Arc::new(loaded))
    }
}
