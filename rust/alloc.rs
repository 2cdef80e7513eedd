//! The extension's allocator: big blocks from mimalloc, the others from the system
//! allocator; the mimalloc blocks' bytes are counted.
//!
//! Why big blocks do not come from the system allocator: the columns of image episodes
//! grow to megabytes, and glibc's malloc gives blocks that large back to the OS when they
//! are freed (its mmap threshold and heap trimming). The next episodes' columns then fault
//! their pages in again, each zeroed by the kernel: recording a vector step of eight
//! 84x84x4 uint8 observations (225 KB) took about 140 µs, mostly page faults, where
//! copying the bytes takes about 20. mimalloc keeps freed memory for the next
//! allocations: the image runner went from 76-94 to 59-67 µs per env step (8 sub-envs,
//! metrics reduced after every `sample` call).
//!
//! mimalloc is built without transparent huge pages (its `no_thp` feature, Cargo.toml):
//! with them, a runner whose held episodes keep growing (metrics never reduced) spent a
//! third of its time in the kernel clearing 2 MiB pages, 110-240 against 64-71 µs per
//! env step without.
//!
//! Freed pages are handed back to the kernel lazily (`MADV_FREE`, mimalloc's
//! `purge_decommits=0`; [`hand_back_freed_pages_lazily`]) rather than at once
//! (`MADV_DONTNEED`, its default): mimalloc purges a freed block's pages about a second
//! after the free, and a runner whose returned episodes are dropped between `sample` calls
//! then faulted every page of the next call's columns in again, zeroed. With `MADV_FREE`
//! the kernel takes those pages only under memory pressure, and a write to one it has not
//! taken costs nothing. Image runner (8 sub-envs, side by side with RLlib's runner, which
//! takes long enough for the purge to run): 1.2-1.7 page faults per env step to none,
//! about 60 to 54 µs per env step (bare loop 46). The cost: until the kernel takes them,
//! such pages still count in the process's RSS.
//!
//! Why small blocks stay with the system allocator: mimalloc rounds sizes up to its size
//! classes (up to a fifth more), which for the many small columns of short episodes
//! costs more than it saves (`benches/memory.py`: 1.24x against 1.13x the raw bytes for
//! 200-step CartPole episodes).
//!
//! Only the extension's own (Rust) allocations use this; Python and numpy keep theirs.
//! The count of live mimalloc bytes is what `benches/memory.py` adds to the C heap's and
//! Python's own statistics, which do not see those blocks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use mimalloc::MiMalloc;

// Blocks of at least this many bytes come from mimalloc (below glibc's default mmap
// threshold of 128 KiB); the columns' shrink policy depends on the same split.
use crate::column::BIG_BUFFER_BYTES;

/// Bytes in the mimalloc blocks handed out and not yet freed.
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The allocator: [`MiMalloc`] for blocks of [`BIG_BUFFER_BYTES`] bytes or more (counted),
/// [`System`] for the others. A block's size tells which one owns it: Rust hands every
/// `dealloc` and `realloc` the layout the block was allocated with.
pub struct SplitAllocator;

/// The usable size of a live mimalloc block.
///
/// # Safety
/// `ptr` must be a block allocated by mimalloc and not yet freed.
unsafe fn usable(ptr: *mut u8) -> usize {
    // SAFETY: the caller's contract: a live mimalloc block.
    unsafe { libmimalloc_sys::mi_usable_size(ptr.cast::<c_void>().cast_const()) }
}

/// Counts a block mimalloc just handed out (or nothing for a failed allocation).
///
/// # Safety
/// `ptr` must be null or a live mimalloc block.
unsafe fn counted(ptr: *mut u8) -> *mut u8 {
    if !ptr.is_null() {
        // SAFETY: the caller's contract.
        LIVE_BYTES.fetch_add(unsafe { usable(ptr) }, Ordering::Relaxed);
    }
    ptr
}

// SAFETY: each block is allocated, resized and freed by the same allocator (chosen by
// its size, which the layouts Rust passes always give); a resize across the threshold
// moves the bytes to a block of the other allocator and frees the old one.
unsafe impl GlobalAlloc for SplitAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= BIG_BUFFER_BYTES {
            // SAFETY: forwarded as received; the result is null or a new mimalloc block.
            unsafe { counted(MiMalloc.alloc(layout)) }
        } else {
            // SAFETY: forwarded as received.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= BIG_BUFFER_BYTES {
            // SAFETY: forwarded as received; the result is null or a new mimalloc block.
            unsafe { counted(MiMalloc.alloc_zeroed(layout)) }
        } else {
            // SAFETY: forwarded as received.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= BIG_BUFFER_BYTES {
            // SAFETY: a live mimalloc block (its size says so), freed just after.
            LIVE_BYTES.fetch_sub(unsafe { usable(ptr) }, Ordering::Relaxed);
            // SAFETY: forwarded as received.
            unsafe { MiMalloc.dealloc(ptr, layout) };
        } else {
            // SAFETY: forwarded as received.
            unsafe { System.dealloc(ptr, layout) };
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match (layout.size() >= BIG_BUFFER_BYTES, new_size >= BIG_BUFFER_BYTES) {
            (false, false) => {
                // SAFETY: forwarded as received.
                unsafe { System.realloc(ptr, layout, new_size) }
            }
            (true, true) => {
                // SAFETY: a live mimalloc block (its size says so).
                let old = unsafe { usable(ptr) };
                // SAFETY: forwarded as received.
                let new = unsafe { MiMalloc.realloc(ptr, layout, new_size) };
                if !new.is_null() {
                    // (On failure the old block stays live, and counted.)
                    LIVE_BYTES.fetch_sub(old, Ordering::Relaxed);
                    // SAFETY: `new` is a live mimalloc block.
                    unsafe { counted(new) };
                }
                new
            }
            _ => {
                // SAFETY: `new_size` is non-zero and, rounded up to `layout.align()`, does
                // not overflow isize (GlobalAlloc::realloc's contract).
                let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
                // SAFETY: a non-zero size (above).
                let new = unsafe { self.alloc(new_layout) };
                if !new.is_null() {
                    // SAFETY: both blocks are live, distinct, and hold at least the
                    // smaller size; the old one is then freed with its own layout.
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                new
            }
        }
    }
}

/// Bytes in the live mimalloc blocks (the big ones).
pub fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// mimalloc's index of its `purge_decommits` option (`mi_option_e`, the same in its v2 and
/// v3; the sys crate has no constant for it).
const MI_OPTION_PURGE_DECOMMITS: libmimalloc_sys::mi_option_t = 5;

/// Makes mimalloc purge freed pages with `MADV_FREE` instead of `MADV_DONTNEED` (see the
/// module docs), unless the user chose otherwise through its environment variable
/// (`MIMALLOC_PURGE_DECOMMITS`, or the older `MIMALLOC_RESET_DECOMMITS`).
pub fn hand_back_freed_pages_lazily() {
    let chosen = ["MIMALLOC_PURGE_DECOMMITS", "MIMALLOC_RESET_DECOMMITS"]
        .iter()
        .any(|name| std::env::var_os(name).is_some());
    if !chosen {
        // SAFETY: sets an option value; mimalloc reads its options on every purge.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DECOMMITS, 0) };
    }
}
