//! Crash safety: a stage killed (SIGKILL, `Child::kill`) while it writes leaves the previous output
//! intact byte for byte; the temp file it was writing may stay behind, and the next run that writes
//! the same output removes it and succeeds.
//!
//! To kill "while it writes" without racing a fast stage, the runs under test set
//! `RLCR_TEST_SLOW_WRITE=MS`, the test hook of `rlcr::fs::slow_write_hook`: every output
//! write pauses after each Parquet batch and before its final rename. The test waits until the
//! temp file (or folder) of the output exists, then kills the process.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bad_input::{golden, snapshot, temp_names, tree};
use crate::fixtures;

/// Start `rlcr ARGS` in `dir` with the slow-write hook (`slow_ms`, 0 = off).
fn spawn(dir: &Path, args: &[&str], slow_ms: u64) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rlcr"));
    c.current_dir(dir)
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if slow_ms > 0 {
        c.env("RLCR_TEST_SLOW_WRITE", slow_ms.to_string());
    }
    c.spawn().expect("spawning rlcr")
}

/// Run to completion; panics unless it succeeds.
fn run_ok(dir: &Path, args: &[&str]) {
    let o = Command::new(env!("CARGO_BIN_EXE_rlcr"))
        .current_dir(dir)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("running rlcr");
    assert!(
        o.status.success(),
        "rlcr {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Wait until a temp file of the child's own writes (whose name contains `want`) exists under
/// `dir`, then SIGKILL it. Returns the temp names seen at the kill.
fn kill_mid_write(mut child: Child, dir: &Path, want: &str) -> Vec<String> {
    let pid = child.id().to_string();
    let t0 = Instant::now();
    loop {
        let temps: Vec<String> = temp_names(dir)
            .into_iter()
            .filter(|n| n.contains(&pid) && n.contains(want))
            .collect();
        if !temps.is_empty() {
            // Let it write into the temp for a moment, then kill.
            std::thread::sleep(Duration::from_millis(50));
            child.kill().expect("kill");
            child.wait().expect("wait");
            return temps;
        }
        if let Some(st) = child.try_wait().expect("try_wait") {
            panic!("the stage ended ({st}) before any temp file appeared in {dir:?}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no temp file appeared in {dir:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// One Parquet-writing stage: run once (the previous output), kill a second run (with `other`
/// flags, so that its output would differ) mid-write, check the previous output, run again.
fn parquet_stage(args: &[&str], other: &[&str], out: &str) {
    let wd = crate::Workdir::new();
    let dir = wd.root();
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["-o", out]);
    run_ok(dir, &a);
    let out_path = dir.join(out);
    let before = std::fs::read(&out_path).unwrap();
    a.extend(other);
    let killed = kill_mid_write(spawn(dir, &a, 3000), dir, "");
    assert_eq!(
        std::fs::read(&out_path).unwrap(),
        before,
        "{out}: the previous output changed after a kill"
    );
    // The killed run's temp file is left (nothing can remove it at SIGKILL)...
    assert!(!temp_names(dir).is_empty(), "killed at {killed:?}");
    // ...and the next run removes it and succeeds.
    run_ok(dir, &a);
    assert_eq!(temp_names(dir), Vec::<String>::new());
    assert_ne!(std::fs::read(&out_path).unwrap(), before);
    let r = rlcr::table::Reader::open(&out_path).unwrap();
    assert!(r.num_rows() > 0);
    r.read_all().unwrap();
}

#[test]
fn score_killed_mid_write() {
    let gd = golden();
    parquet_stage(
        &["score", "--input", &s(&gd.trajectory)],
        &["--format-gate", "off"],
        "scored.parquet",
    );
}

#[test]
fn generate_answers_killed_mid_write() {
    let gd = golden();
    let m = s(&fixtures().join("tiny-qwen2"));
    parquet_stage(
        &[
            "generate-answers",
            "--model",
            &m,
            "--input",
            &s(&gd.prompts),
            "--num-answers",
            "1",
            "--max-new-tokens",
            "2",
        ],
        &["--temperature", "0"],
        "answers.parquet",
    );
}

#[test]
fn advantage_killed_mid_write() {
    let gd = golden();
    parquet_stage(
        &["advantage", "--input", &s(&gd.scored)],
        &["--estimator", "grpo"],
        "train.parquet",
    );
}

#[test]
fn report_killed_mid_write() {
    let gd = golden();
    let wd = crate::Workdir::new();
    let dir = wd.root();
    let args = [
        "report",
        "--input",
        &s(&gd.scored),
        "--probe",
        &s(&gd.probe),
        "-o",
        "report",
    ];
    run_ok(dir, &args);
    let before = snapshot(&[dir.join("report")]);
    assert!(before.len() >= 7, "{before:?}");
    let mut args = args.to_vec();
    args.extend(["--bins", "5"]);
    // Killed while it renders the second file (the reliability PNG): the first is done by then.
    kill_mid_write(spawn(dir, &args, 1500), &dir.join("report"), ".png");
    // Every earlier file is intact (the killed run's staging folder aside).
    let mut after = snapshot(&[dir.join("report")]);
    after.retain(|p, _| !p.to_string_lossy().contains("rlcr-staging"));
    assert_eq!(after, before);
    assert!(!temp_names(dir).is_empty());
    run_ok(dir, &args);
    assert_eq!(temp_names(dir), Vec::<String>::new());
    let files = tree(&dir.join("report"));
    assert_eq!(files.len(), before.len(), "{files:?}");
}

/// `update` killed while it saves a checkpoint over an earlier one: the earlier folder stays
/// byte-identical and loadable (`--resume auto` continues from it), the half-written temp folder
/// is removed by the next save to the same name.
#[test]
fn update_killed_during_checkpoint_save() {
    let gd = golden();
    let wd = crate::Workdir::new();
    let dir = wd.root();
    let m = s(&fixtures().join("tiny-qwen2"));
    let train = s(&gd.train);
    let first = [
        "update", "--model", &m, "--input", &train, "-o", "ck", "--lr", "1e-3",
    ];
    run_ok(dir, &first);
    let ck: PathBuf = dir.join("ck");
    let before = snapshot(std::slice::from_ref(&ck));
    assert!(ck.join("rlcr-train/trainer_state.json").is_file());
    // The call again with another learning rate, killed during the save.
    let mut second = first.to_vec();
    second.extend(["--lr", "1e-2"]);
    kill_mid_write(spawn(dir, &second, 4000), dir, ".ck.tmp-");
    assert_eq!(
        snapshot(std::slice::from_ref(&ck)),
        before,
        "the checkpoint changed"
    );
    let stale = temp_names(dir);
    assert!(stale.iter().any(|n| n.starts_with(".ck.tmp-")), "{stale:?}");
    // The earlier checkpoint is loadable: the next iteration resumes from it.
    run_ok(
        dir,
        &[
            "update", "--model", "ck", "--input", &train, "-o", "ck2", "--lr", "1e-3", "--resume",
            "auto",
        ],
    );
    let state: serde_json::Value =
        crate::support::json::read(dir.join("ck2/rlcr-train/trainer_state.json"));
    assert_eq!(state["global_step"], 2, "resumed from step 1: {state}");
    // Saving `ck` again removes the killed run's temp folder.
    run_ok(dir, &second);
    assert_eq!(temp_names(dir), Vec::<String>::new());
    assert!(ck.join("model.safetensors").is_file());
}
