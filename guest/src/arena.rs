//! The bookkeeping of a bump arena: where the next allocation of a call goes in a region the
//! allocator reserved once, and what giving one back does. Plain offsets, no pointers and no
//! `unsafe`: the allocator that uses it (`allocator.rs`, wasm only) does the rest.
//!
//! Why: a verb call allocates and frees hundreds of small buffers, each a walk through the
//! general allocator's bins, on lines a call that ran a request ago no longer has in cache.
//! Bumping a pointer through one region that every call starts again from the beginning of
//! costs a few instructions and touches the same lines call after call. Nothing taken in the
//! region may outlive the call it was taken in: the region starts again at the next call.

/// A region of `capacity` bytes at offset 0, handed out front to back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bump {
    capacity: usize,
    /// The first free byte.
    top: usize,
    /// Where the last allocation starts: it alone can grow or be given back in place.
    last: usize,
}

impl Bump {
    pub const fn new(capacity: usize) -> Self {
        Bump { capacity, top: 0, last: 0 }
    }

    /// Everything handed out is free again.
    pub fn reset(&mut self) {
        self.top = 0;
        self.last = 0;
    }

    /// The bytes handed out and not given back.
    pub fn used(&self) -> usize {
        self.top
    }

    /// The offset of `size` bytes aligned to `align` (a power of two) from a region starting at
    /// `base`, or `None` when they do not fit.
    pub fn take(&mut self, base: usize, size: usize, align: usize) -> Option<usize> {
        let mask = align.checked_sub(1)?;
        let start = base.checked_add(self.top)?.checked_add(mask)? & !mask;
        let at = start - base;
        let end = at.checked_add(size)?;
        if end > self.capacity {
            return None;
        }
        self.last = at;
        self.top = end;
        Some(at)
    }

    /// Whether the offset `at` lies in the region.
    pub fn holds(&self, at: usize) -> bool {
        at < self.capacity
    }

    /// Gives back the allocation at `at`: the last one's bytes are free again, any other's only
    /// when the region starts again.
    pub fn give(&mut self, at: usize) {
        if at == self.last && at < self.top {
            self.top = at;
        }
    }

    /// Grows or shrinks the allocation at `at` to `size` bytes in place: only the last one can,
    /// and only within the region.
    pub fn resize(&mut self, at: usize, size: usize) -> bool {
        match at.checked_add(size) {
            Some(end) if at == self.last && end <= self.capacity => {
                self.top = end;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_aligned_bytes_front_to_back() {
        let mut b = Bump::new(64);
        assert_eq!(b.take(1000, 3, 1), Some(0));
        assert_eq!(b.take(1000, 8, 8), Some(8), "1003 rounds up to 1008");
        assert_eq!(b.take(1000, 1, 16), Some(24), "1016 rounds up to 1024");
        assert_eq!(b.used(), 25);
    }

    #[test]
    fn refuses_what_does_not_fit_and_keeps_what_it_had() {
        let mut b = Bump::new(32);
        assert_eq!(b.take(0, 30, 1), Some(0));
        assert_eq!(b.take(0, 3, 1), None);
        assert_eq!(b.used(), 30);
        assert_eq!(b.take(0, 2, 1), Some(30), "exactly to the end fits");
        assert_eq!(b.take(0, 0, 1), Some(32), "an empty allocation at the very end fits");
        assert_eq!(b.take(0, 1, 1), None);
        assert_eq!(b.take(0, usize::MAX, 1), None, "no overflow");
        assert_eq!(b.take(usize::MAX - 1, 1, 8), None, "no overflow aligning");
        assert_eq!(b.take(0, 1, 0), None, "an alignment of zero is refused");
    }

    #[test]
    fn frees_only_the_last_allocation_at_once() {
        let mut b = Bump::new(64);
        let first = b.take(0, 8, 8).unwrap();
        let second = b.take(0, 8, 8).unwrap();
        b.give(first);
        assert_eq!(b.used(), 16, "an earlier allocation waits for the reset");
        b.give(second);
        assert_eq!(b.used(), 8);
        b.give(second);
        assert_eq!(b.used(), 8, "giving back twice frees nothing more");
        assert_eq!(b.take(0, 8, 8), Some(8), "its bytes are handed out again");
    }

    #[test]
    fn grows_the_last_allocation_in_place_within_the_region() {
        let mut b = Bump::new(64);
        let first = b.take(0, 8, 8).unwrap();
        let second = b.take(0, 8, 8).unwrap();
        assert!(!b.resize(first, 16), "another allocation follows the first");
        assert!(b.resize(second, 40));
        assert_eq!(b.used(), 48);
        assert!(b.resize(second, 4), "and shrinks");
        assert_eq!(b.used(), 12);
        assert!(!b.resize(second, 57), "past the region");
        assert!(!b.resize(second, usize::MAX), "no overflow");
        assert_eq!(b.used(), 12);
    }

    #[test]
    fn starts_again_from_the_front_after_a_reset() {
        let mut b = Bump::new(16);
        assert_eq!(b.take(0, 16, 1), Some(0));
        b.reset();
        assert_eq!(b.used(), 0);
        assert_eq!(b.take(0, 16, 1), Some(0));
        assert!(b.holds(15) && !b.holds(16));
    }
}
