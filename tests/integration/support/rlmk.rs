//! `make -f scripts/rl.mk` as the tests run it: the test binary as RLCR (nothing is rebuilt), the
//! work folder as RUNS and as the current folder.
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use crate::Workdir;

/// The command `make -f scripts/rl.mk RLCR=… RUNS=… VARS…` in `wd` (add targets, environment).
pub fn command(wd: &Workdir, vars: &[impl AsRef<OsStr>]) -> Command {
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

/// The variables of a loop small enough for a test: `iters` iterations without a warm start, of
/// 2 prompts, 2 answers and `g_c` confidences each (4 tokens at most), one epoch of one
/// mini-batch; then `extra` (`RUN=…`, the test's own variables, targets).
pub fn small_loop(iters: u32, g_c: u32, extra: &[&str]) -> Vec<String> {
    let mut vars: Vec<String> = [
        "SFT=0".to_string(),
        format!("ITERS={iters}"),
        "PROMPTS_PER_ITER=2".into(),
        "G_A=2".into(),
        format!("G_C={g_c}"),
        "MAX_NEW=4".into(),
        "MAX_NEW_CONF=4".into(),
        "EPOCHS=1".into(),
        "MINI_BATCHES=1".into(),
    ]
    .into();
    vars.extend(extra.iter().map(|v| v.to_string()));
    vars
}

/// stdout and stderr of a finished command, for assertion messages.
pub fn log(o: &std::process::Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
