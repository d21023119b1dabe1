//! The component's global allocator: the system allocator (wasi-libc's dlmalloc), with a bump
//! arena ([`crate::arena::Bump`]) in front of it during an export's call ([`call`]: the verbs,
//! plans, notices and state records).
//!
//! During a call every allocation that fits is taken from one region reserved once, and giving
//! one back is free; the region starts again at the next call, by which time the host has read
//! the last result and run its post-return (which frees the result into the arena: nothing).
//! Outside a call, and for what does not fit, the system allocator serves, and what it handed
//! out it takes back whenever it is freed, whoever frees it. So nothing taken during a call may
//! outlive it: the registry's table and the domains' shapes (the only statics) are built before
//! the arena is entered.
//!
//! wasm32 without threads: the state is touched by one thread only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;

use crate::arena::Bump;

/// The region's size: what a call takes past it comes from the system allocator (the region
/// never grows).
const REGION: usize = 512 << 10;

struct State {
    /// The region's first byte (0 until the first call reserves it; none if that failed).
    base: usize,
    bump: Bump,
    /// Whether a call is in progress.
    active: bool,
}

struct Allocator(UnsafeCell<State>);

// SAFETY: wasm32-wasip2 has no threads; the state is never shared between them.
unsafe impl Sync for Allocator {}

#[global_allocator]
static ALLOCATOR: Allocator = Allocator(UnsafeCell::new(State { base: 0, bump: Bump::new(REGION), active: false }));

impl Allocator {
    /// The offset of `ptr` in the region, when it lies there.
    fn offset(state: &State, ptr: *mut u8) -> Option<usize> {
        let at = (ptr as usize).checked_sub(state.base)?;
        (state.base != 0 && state.bump.holds(at)).then_some(at)
    }
}

unsafe impl GlobalAlloc for Allocator {
    // Out of line, as the three are: inlined at every allocation and drop of the component (its
    // whole program is one unit), they made its code a fifth larger for little or no time saved.
    #[inline(never)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: one thread, and no reference to the state outlives this call.
        let state = unsafe { &mut *self.0.get() };
        if state.active && state.base != 0 {
            if let Some(at) = state.bump.take(state.base, layout.size(), layout.align()) {
                return (state.base + at) as *mut u8;
            }
        }
        unsafe { System.alloc(layout) }
    }

    #[inline(never)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let state = unsafe { &mut *self.0.get() };
        match Self::offset(state, ptr) {
            Some(at) => state.bump.give(at),
            None => unsafe { System.dealloc(ptr, layout) },
        }
    }

    #[inline(never)]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let state = unsafe { &mut *self.0.get() };
        let Some(at) = Self::offset(state, ptr) else {
            return unsafe { System.realloc(ptr, layout, new_size) };
        };
        if state.active && state.bump.resize(at, new_size) {
            return ptr;
        }
        // SAFETY: `new_size` with the old alignment is a valid layout (`GlobalAlloc::realloc`'s
        // contract).
        let moved = unsafe { self.alloc(Layout::from_size_align_unchecked(new_size, layout.align())) };
        if !moved.is_null() {
            unsafe { std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size)) };
            let state = unsafe { &mut *self.0.get() };
            state.bump.give(at);
        }
        moved
    }
}

/// Runs `f` (one export's call) with the arena in front of the system allocator, starting the
/// region again: whatever the previous call took there is free.
pub fn call<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY (here and below): one thread, and the reference ends before anything allocates.
    if unsafe { (*ALLOCATOR.0.get()).base } == 0 {
        // The instance's first call: its statics, built on the system allocator before the
        // arena is ever entered.
        let _ = crate::registry::table();
        crate::provision::prepare();
    }
    {
        let state = unsafe { &mut *ALLOCATOR.0.get() };
        if state.base == 0 {
            // SAFETY: a non-zero size and a power-of-two alignment.
            state.base = unsafe { System.alloc(Layout::from_size_align_unchecked(REGION, 16)) } as usize;
        }
        state.bump.reset();
        state.active = true;
    }
    let r = f();
    let state = unsafe { &mut *ALLOCATOR.0.get() };
    state.active = false;
    r
}
