//! Process-wide allocator settings: keep freed tensor buffers in the process instead of handing
//! them back to the kernel and page-faulting them in again.
//!
//! Why: a training step allocates and frees hundreds of buffers of 1–300 MB (activations,
//! gradients, the `[rows, vocab]` logits). glibc's malloc serves every block above its mmap
//! threshold (128 KiB, adaptive up to 32 MiB) with a fresh `mmap` and returns it with `munmap` on
//! free, and serves the rayon worker threads from their own arenas, which `mmap` anything larger
//! than their 64 MiB heaps whatever the threshold says. Every reuse of such a buffer then costs one
//! page fault per 4 KiB page, zeroing included: measured on this crate's shapes (two threads
//! allocating and freeing 12, 40 and 262 MB twenty times each), 3.1M page faults and 7.9 s with
//! glibc's defaults, 3.1M and 6.3 s with only the mmap threshold raised to its 32 MiB maximum,
//! 2.7M and 5.1 s with mmap switched off, and **0.16M faults and 2.0 s with mmap off, trimming
//! off and a single arena** (peak RSS 538 → 617 MiB: freed blocks stay resident for reuse).
//!
//! So [`retain_freed_memory`] sets, before any worker thread starts: `M_MMAP_MAX = 0` (no
//! per-block `mmap`), `M_TRIM_THRESHOLD` = maximum (the heap top is never returned) and
//! `M_ARENA_MAX = 1` (every thread allocates from the main heap, so freed blocks of one thread
//! serve the next allocation of another; with two to a few dozen threads doing few, large
//! allocations the shared lock costs nothing measurable). The price is that a process keeps its
//! peak heap until it exits (rlcr's stages are short-lived processes; see BENCHMARKS.md for the
//! peak resident memory of the SmolLM2-135M update with and without).
//!
//! An allocator crate (mimalloc, jemalloc) would do the same with more knobs but compiles C on
//! every cold build (the budget of a 2-core CI machine is 90 minutes) and still needs its purge
//! delay disabled to keep huge blocks committed; glibc's own switches are enough.
//!
//! `RLCR_MALLOC=default` keeps glibc's defaults (to measure the difference; see [`crate::switches`]). Other platforms and
//! allocators: nothing to do, the function returns `false`.

/// Apply the settings above (once; later calls do nothing). Returns whether they were applied.
/// Call it first thing in `main`, before rayon's pool or any other thread exists.
pub fn retain_freed_memory() -> bool {
    static APPLIED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *APPLIED.get_or_init(|| {
        if crate::switches::get().malloc == crate::switches::Malloc::Default {
            return false;
        }
        apply()
    })
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> bool {
    use std::os::raw::c_int;
    // <malloc.h>
    const M_TRIM_THRESHOLD: c_int = -1;
    const M_MMAP_MAX: c_int = -4;
    const M_ARENA_MAX: c_int = -8;
    extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    // SAFETY: mallopt only changes malloc's tunables; these three are valid at any time (they
    // govern future allocations), and it returns 1 on success.
    unsafe {
        mallopt(M_MMAP_MAX, 0) == 1
            && mallopt(M_TRIM_THRESHOLD, c_int::MAX) == 1
            && mallopt(M_ARENA_MAX, 1) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> bool {
    false
}
