//! The `rlcr` binary: a thin main over [`rlcr::cli`]. Exit codes: 0 success, 1 error (bad input,
//! I/O), 2 usage.
use std::process::ExitCode;

fn main() -> ExitCode {
    // Before any thread exists: freed tensor buffers are reused, not faulted in again.
    rlcr::alloc::retain_freed_memory();
    rlcr::cli::main()
}
