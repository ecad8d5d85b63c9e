//! One integration-test binary (xsv style): every test makes a fresh folder with [`Workdir`], runs
//! the real `rlcr` binary and, on failure, prints the command, status, stdout and stderr.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};

mod advantage;
mod bad_input;
mod checkpoint;
mod cli;
mod crash;
mod critic;
mod determinism;
mod devices;
mod docs_blocks;
mod ecosystem;
mod fuzz_regressions;
mod gguf;
mod import;
mod learning;
mod lora;
mod model;
mod multiturn;
mod own_data;
mod own_loop;
mod own_reward;
mod probe;
mod product;
mod python_tables;
mod qwen3;
mod report;
mod rl_make;
mod sample;
mod score;
mod shards;
mod support;
mod tensorboard;
mod train;

/// A fresh folder for one test plus helpers to run the binary in it.
pub struct Workdir {
    dir: tempfile::TempDir,
}

impl Default for Workdir {
    fn default() -> Self {
        Self::new()
    }
}

impl Workdir {
    pub fn new() -> Self {
        Workdir {
            dir: tempfile::Builder::new()
                .prefix("rlcr-test-")
                .tempdir()
                .expect("temp dir"),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
        let p = self.path(name);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(&p, bytes).unwrap();
        p
    }

    /// A command for the real binary, running in this folder.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rlcr"));
        c.current_dir(self.dir.path())
            .args(args)
            .env("NO_COLOR", "1");
        c
    }

    /// Run and return the output (any status).
    pub fn output(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("running rlcr")
    }

    /// Run, require success, return stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let o = self.output(args);
        if !o.status.success() {
            panic!("{}", describe(args, &o));
        }
        String::from_utf8_lossy(&o.stdout).to_string()
    }

    /// Run, require exit code `code`, return stderr.
    pub fn fail(&self, args: &[&str], code: i32) -> String {
        let o = self.output(args);
        if o.status.code() != Some(code) {
            panic!("expected exit {code}\n{}", describe(args, &o));
        }
        String::from_utf8_lossy(&o.stderr).to_string()
    }

    /// Run and require a refusal: exit code `code`, an error naming `needle`, nothing written at
    /// `out`; return stderr.
    pub fn refuse(&self, args: &[&str], code: i32, needle: &str, out: &str) -> String {
        let e = self.fail(args, code);
        assert!(e.contains(needle), "{e}");
        assert!(!self.path(out).exists(), "{out} written");
        e
    }

    /// Names of the entries in the folder (sorted), for "nothing written" checks.
    pub fn listing(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        v.sort();
        v
    }
}

/// One run of the binary in the test binary's working directory (for tests that name every path
/// absolutely): its status and its output as text.
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Run `rlcr ARGS` (any status).
pub fn rlcr(args: &[&str]) -> Ran {
    let o = Command::new(env!("CARGO_BIN_EXE_rlcr"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("running rlcr");
    Ran {
        status: o.status,
        stdout: String::from_utf8_lossy(&o.stdout).to_string(),
        stderr: String::from_utf8_lossy(&o.stderr).to_string(),
    }
}

/// Run `rlcr ARGS` and require success (printing the command and its output otherwise).
pub fn rlcr_ok(args: &[&str]) -> Ran {
    let r = rlcr(args);
    assert!(
        r.status.success(),
        "command: rlcr {}\nstatus: {}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        r.status,
        r.stdout,
        r.stderr
    );
    r
}

pub fn describe(args: &[&str], o: &Output) -> String {
    format!(
        "command: rlcr {}\nstatus: {}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The repository's fixtures folder.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}
