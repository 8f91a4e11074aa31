//! The allocator of every muster binary, and the one call that makes it give
//! freed memory back to the system.
//!
//! mimalloc keeps what a thread frees in that thread's own heap, for the
//! thread to reuse, and returns a heap's empty pages to the system only when
//! the thread that owns the heap next allocates enough to look at them. A
//! Tokio worker thread that goes idle after a burst of load therefore keeps
//! the burst's memory for as long as it stays idle: the notifier, 24 MB
//! idle and 70–75 MB with 500 subscribers, still held 55–62 MB thirty
//! seconds after they had all left (docs/benchmarks.md, "Memory given back
//! after a burst"). [`release_freed_memory`], called on a thread as it goes
//! idle, hands that memory back.
//!
//! This crate exists so that the rest of muster can keep
//! `#![forbid(unsafe_code)]`: the call is a foreign function, and this is the
//! only place muster calls one itself. It owns nothing else: when to call it
//! is the runtime's business (`muster_runtime::process`).

pub use mimalloc::MiMalloc as Allocator;

/// Frees the calling thread's empty mimalloc pages and returns the memory of
/// every empty page to the system at once (mimalloc otherwise waits, and
/// waits for an allocation to notice).
///
/// It visits every page of the thread's heap, so it costs more than an
/// allocation: call it when a thread goes idle, not on a hot path.
pub fn release_freed_memory() {
    // SAFETY: `mi_collect` takes no pointers and has no preconditions: it
    // works on the calling thread's own heap (nothing if the thread has none
    // yet) and on the process-wide arenas under mimalloc's own
    // synchronisation, so it is sound from any thread at any time. Blocks
    // still in use are left where they are.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
