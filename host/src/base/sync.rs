//! Locks that a panic cannot poison for everyone after it.
//!
//! Every lock in the host guards plain data (counters, maps, the last value seen) that stays
//! consistent between statements: a task that panicked while holding one must not make every
//! later request panic too. So a poisoned lock is taken as it is, in this one place, rather than
//! `unwrap_or_else(|p| p.into_inner())` at each of sixty call sites.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `lock()` that takes a poisoned mutex as it is.
pub trait Locked<T> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `read()` and `write()` that take a poisoned lock as it is.
pub trait ReadWrite<T> {
    fn reading(&self) -> RwLockReadGuard<'_, T>;
    fn writing(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T> ReadWrite<T> for RwLock<T> {
    fn reading(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }
    fn writing(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_poisoned_by_a_panic_is_still_taken() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *m.locked() += 1;
        assert_eq!(*m.locked(), 2);
        let rw = std::sync::Arc::new(RwLock::new(1));
        let rw2 = rw.clone();
        let _ = std::thread::spawn(move || {
            let _g = rw2.write().unwrap();
            panic!("poison it");
        })
        .join();
        *rw.writing() += 1;
        assert_eq!(*rw.reading(), 2);
    }
}
