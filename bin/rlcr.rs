//! The `rlcr` binary: a thin main over [`rlcr::cli`]. Exit codes: 0 success, 1 error (bad input,
//! I/O, a bad `RLCR_*` environment variable), 2 usage.
use std::process::ExitCode;

fn main() -> ExitCode {
    // Every `RLCR_*` switch is read and checked before anything runs: a bad value stops here.
    if let Err(e) = rlcr::switches::init() {
        eprintln!("rlcr: error: {e}");
        return ExitCode::from(1);
    }
    // Before any thread exists: freed tensor buffers are reused, not faulted in again.
    rlcr::alloc::retain_freed_memory();
    rlcr::cli::main()
}
