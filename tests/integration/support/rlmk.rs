//! `make -f scripts/rl.mk` as the tests run it: the test binary as RLCR (nothing is rebuilt), the
//! work folder as RUNS and as the current folder.
use std::path::Path;
use std::process::Command;

use crate::Workdir;

/// The command `make -f scripts/rl.mk RLCR=… RUNS=… VARS…` in `wd` (add targets, environment).
pub fn command(wd: &Workdir, vars: &[&str]) -> Command {
    let mk = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/rl.mk");
    let mut c = Command::new("make");
    c.arg("-f")
        .arg(&mk)
        .arg(format!("RLCR={}", env!("CARGO_BIN_EXE_rlcr")))
        .arg(format!("RUNS={}", wd.root().display()))
        .args(vars)
        .current_dir(wd.root());
    c
}

/// stdout and stderr of a finished command, for assertion messages.
pub fn log(o: &std::process::Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
