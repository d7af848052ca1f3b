//! A bump allocator for policies.
//!
//! The host runs every decision in a fresh instance that is thrown away
//! afterwards, so a policy never needs to give memory back: allocation is a
//! pointer bump and freeing is free. This makes handing a policy thousands of
//! pods (tens of thousands of strings, each allocated through the canonical
//! ABI) several times cheaper than with the default allocator. Memory still
//! counts against the host's limit, so a policy that allocates in a loop
//! without bound is stopped there as before.
//!
//! On by default (feature `bump-allocator`); a policy that wants the standard
//! allocator disables default features.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;

const PAGE: usize = 64 * 1024;

/// The allocator. Single-threaded, as every wasm32-wasip2 instance is.
pub struct BumpAllocator {
    state: UnsafeCell<(usize, usize)>, // (next free byte, end of owned pages)
}

// SAFETY: a policy instance has one thread.
unsafe impl Sync for BumpAllocator {}

impl BumpAllocator {
    pub const fn new() -> Self {
        BumpAllocator {
            state: UnsafeCell::new((0, 0)),
        }
    }
}

impl Default for BumpAllocator {
    fn default() -> Self {
        Self::new()
    }
}

unsafe impl GlobalAlloc for BumpAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: single-threaded; no reference to the state outlives this call.
        let state = unsafe { &mut *self.state.get() };
        let (next, end) = *state;
        let start = (next + layout.align() - 1) & !(layout.align() - 1);
        let Some(new_next) = start.checked_add(layout.size()) else {
            return core::ptr::null_mut();
        };
        if new_next <= end && next != 0 {
            state.0 = new_next;
            return start as *mut u8;
        }
        // Grow: at least what this allocation needs, at least 1 MiB at once.
        let need = layout.size() + layout.align();
        let pages = need.div_ceil(PAGE).max(16);
        let old = core::arch::wasm32::memory_grow(0, pages);
        if old == usize::MAX {
            return core::ptr::null_mut();
        }
        let region = old * PAGE;
        let region_end = region + pages * PAGE;
        // Continue in the new pages; when they follow the old ones, the tail
        // of the old region is still usable.
        let base = if region == end && next != 0 {
            next
        } else {
            region
        };
        let start = (base + layout.align() - 1) & !(layout.align() - 1);
        *state = (start + layout.size(), region_end);
        start as *mut u8
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Give back the most recent allocation only; the rest goes with the
        // instance.
        // SAFETY: single-threaded.
        let state = unsafe { &mut *self.state.get() };
        if ptr as usize + layout.size() == state.0 {
            state.0 = ptr as usize;
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: single-threaded.
        let state = unsafe { &mut *self.state.get() };
        let p = ptr as usize;
        // The last allocation grows in place when there is room.
        if p + layout.size() == state.0 && p + new_size <= state.1 {
            state.0 = p + new_size;
            return ptr;
        }
        // SAFETY: the layout's alignment is valid; sizes as the caller gives.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both regions are valid for the copied length and distinct.
            unsafe { core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
        }
        new
    }
}
