//! Tables written by rlcr open in polars and DuckDB with the documented types and metadata
//! (`scripts/check_tables.py`). `.ci/run` installs both and sets `RLCR_REQUIRE_PYTHON=1`, which turns
//! a missing module into a failure; elsewhere the test says it was skipped.
use std::path::Path;
use std::process::Command;

use crate::Workdir;

/// Run the checker on tables; panics on a failed check.
pub fn check_tables(files: &[&Path]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check_tables.py");
    let out = match Command::new("python3").arg(&script).args(files).output() {
        Ok(o) => o,
        Err(e) => {
            if std::env::var("RLCR_REQUIRE_PYTHON").is_ok_and(|v| v == "1") {
                panic!("python3 not runnable: {e}");
            }
            eprintln!("skipped: python3 not runnable: {e}");
            return;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(3) {
        if std::env::var("RLCR_REQUIRE_PYTHON").is_ok_and(|v| v == "1") {
            panic!("polars/duckdb missing: {stderr}");
        }
        eprintln!("skipped: {stderr}");
        return;
    }
    assert!(
        out.status.success(),
        "check_tables.py failed:\n{stderr}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn prompts_table_opens_in_polars_and_duckdb() {
    let wd = Workdir::new();
    wd.run(&[
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        "20",
        "-o",
        "p.parquet",
    ]);
    check_tables(&[&wd.path("p.parquet")]);
}
