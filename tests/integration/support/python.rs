//! Running the repository's Python checkers (scripts/*.py, fixtures/rewards/*.py, `python -c`).
//!
//! One rule for every test that compares rlcr with a Python library: a checker that cannot run
//! here (no interpreter, exit code 3 = "a package is missing", or Python's own `No module named`)
//! makes the test say "skipped", unless the variable that requires that kind of tool is `1`
//! (`.ci/run` sets both after installing the packages), and then it fails. Any other failure
//! panics with the checker's stderr. The interpreter is `RLCR_PYTHON` (default `python3`).
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// Which packages a checker needs, and so which variable turns "missing" into a failure.
#[derive(Clone, Copy, Debug)]
pub enum Needs {
    /// pyarrow, polars, DuckDB, pandas, TensorBoard: `RLCR_REQUIRE_PYTHON=1`.
    Tables,
    /// torch, transformers, PEFT: `RLCR_REQUIRE_TORCH=1`.
    Torch,
}

impl Needs {
    fn required(self) -> bool {
        let var = match self {
            Needs::Tables => "RLCR_REQUIRE_PYTHON",
            Needs::Torch => "RLCR_REQUIRE_TORCH",
        };
        std::env::var(var).is_ok_and(|v| v == "1")
    }
}

/// `scripts/NAME` of the repository.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name)
}

/// One run of the interpreter: built up, then [`Py::stdout`] or [`Py::json`].
pub struct Py {
    what: String,
    args: Vec<OsString>,
    cwd: Option<PathBuf>,
    env: Vec<(String, OsString)>,
    needs: Needs,
}

impl Py {
    /// `python SCRIPT`; `what` names it in messages.
    pub fn script(path: impl AsRef<Path>, needs: Needs) -> Py {
        let path = path.as_ref();
        let what = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        Py {
            what,
            args: vec![path.as_os_str().to_owned()],
            cwd: None,
            env: Vec::new(),
            needs,
        }
    }

    /// `python -c CODE`; `what` names it in messages.
    pub fn code(what: &str, code: &str, needs: Needs) -> Py {
        Py {
            what: what.into(),
            args: vec!["-c".into(), code.into()],
            cwd: None,
            env: Vec::new(),
            needs,
        }
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Py {
        self.args.push(a.as_ref().to_owned());
        self
    }

    pub fn args<A: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = A>) -> Py {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn cwd(mut self, dir: impl AsRef<Path>) -> Py {
        self.cwd = Some(dir.as_ref().to_path_buf());
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Py {
        self.env.push((key.into(), value.as_ref().to_owned()));
        self
    }

    /// The checker's stdout; `None` (after saying "skipped") when it cannot run here and is not
    /// required; panics on any other failure.
    pub fn stdout(self) -> Option<Vec<u8>> {
        let python = std::env::var("RLCR_PYTHON").unwrap_or_else(|_| "python3".into());
        let required = self.needs.required();
        let mut cmd = std::process::Command::new(&python);
        cmd.args(&self.args);
        if let Some(d) = &self.cwd {
            cmd.current_dir(d);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let out = match cmd.output() {
            Ok(o) => o,
            Err(e) if !required => {
                eprintln!("skipped: {python} not runnable: {e}");
                return None;
            }
            Err(e) => panic!("{python} not runnable ({}): {e}", self.what),
        };
        if out.status.success() {
            return Some(out.stdout);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let missing = out.status.code() == Some(3) || stderr.contains("No module named");
        if missing && !required {
            eprintln!("skipped: {stderr}");
            return None;
        }
        panic!(
            "{} {:?} failed ({}):\n{stderr}\n{}",
            self.what,
            &self.args[1..],
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
    }

    /// [`Py::stdout`] parsed as JSON (`null` for an empty stdout).
    pub fn json(self) -> Option<serde_json::Value> {
        let what = self.what.clone();
        let out = self.stdout()?;
        if out.iter().all(u8::is_ascii_whitespace) {
            return Some(serde_json::Value::Null);
        }
        match serde_json::from_slice(&out) {
            Ok(v) => Some(v),
            Err(e) => panic!(
                "{what} printed no JSON ({e}):\n{}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}
