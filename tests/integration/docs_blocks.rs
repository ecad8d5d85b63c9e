//! Docs that are tests: the command blocks of README.md and docs/*.md run as a reader types them,
//! in a fresh folder per page, against the bundled tiny model; `rlcr --help`'s quick start too.
//!
//! **Why this runner and not trycmd.** trycmd (cargo's and clap's) runs one command per `$ ` line
//! and compares its whole output with a snapshot. The pages' blocks are shell scripts (variables,
//! line continuations, `for` loops, `export`, `make` loops) whose output holds wall times and
//! figures that move with the machine, and a page's blocks build on each other (the iteration by
//! hand samples from the main job's warm start). So each page runs here as a reader follows it:
//! every block in order, in one fresh folder, with bash; the markdown stays what the reader sees,
//! and the runner is one module of the one integration binary, with no crate to add to the build.
//!
//! **What runs.** A ```sh (`bash`, `shell`, `console`) block runs with `bash -euo pipefail`: any
//! failing line fails the page. A `python` or `toml` block whose first line is `# NAME.EXT` is a
//! file the page asks the reader to create: it is written as NAME.EXT. Other `python` blocks run
//! with python3, each after the page's earlier ones (a reader's session: `df` of one block is
//! there in the next); `sql` blocks run in DuckDB (its Python module). Blocks of any other kind
//! (`text`, `json`, plain) are output or formats and are not run; one holding a command line
//! (`rlcr …`, `make -f …`, `python3 …`, `cargo …`) is an error, so that no command hides from the
//! runner in a plain block. The folder looks like the root
//! of a clone, which is where the pages are typed (getting-started: `cd rlcr`): `scripts` and
//! `fixtures` are links to the repository's, and `rlcr` on `PATH` is the binary under test (also
//! as `RLCR`, so `make -f scripts/rl.mk` builds nothing). `DOCS_TEST_REPO` is the repository, for a
//! block that names the clone from elsewhere (`replace: CLONE=~/rlcr => CLONE=$DOCS_TEST_REPO`).
//!
//! **Directives**: an HTML comment right before a block (invisible on the rendered page):
//! - `<!-- norun: REASON -->`: the block does not run; the reason (a GPU, a cluster, the network,
//!   a big download, hours of CPU, the test suite itself) is required.
//! - `<!-- docs-test` … `-->`, one directive per line:
//!   - `setup: SHELL` runs before the block (what the page assumes exists: a model folder named as
//!     the page's placeholder, a dataset); several lines run in order;
//!   - `replace: OLD => NEW` shrinks a figure in the block for CI (`ITERS=60 => ITERS=5`); OLD must
//!     occur in the block;
//!   - `expect: TEXT`: the block's stdout or stderr contains TEXT;
//!   - `check: CODE` runs after the block and must succeed: shell for shell blocks, Python
//!     appended to the session for Python blocks;
//!   - `env: NAME=VALUE` sets a variable for the block (e.g. `RLCR_CONFIG` with a file that shortens
//!     the sampling of a command that runs with its defaults);
//!   - `needs: NAME…`: commands (`duckdb`, `jq`) or Python modules (`python:polars`) the block
//!     needs. When one is missing the rest of the page is skipped with a note, except that a
//!     missing Python module fails under `RLCR_REQUIRE_PYTHON=1` (CI, `.ci/run`), as the other
//!     Python-backed tests do.
//!
//! A block that fails fails its page's test, naming the file, the line, the block as run, its
//! status and its output. A page of docs/ without a test of its own runs in `other_pages`; the generated
//! pages of `docs/cli/` are checked against the binary by `product::cli_pages`.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The kinds of fenced blocks the runner knows.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lang {
    Shell,
    Python,
    Sql,
    Toml,
    Other,
}

impl Lang {
    fn of(info: &str) -> Lang {
        match info.split_whitespace().next().unwrap_or("") {
            "sh" | "bash" | "shell" | "console" => Lang::Shell,
            "python" | "py" => Lang::Python,
            "sql" => Lang::Sql,
            "toml" => Lang::Toml,
            _ => Lang::Other,
        }
    }
}

/// What the comment before a block asks.
#[derive(Debug, Default, Clone)]
struct Directives {
    norun: Option<String>,
    setup: Vec<String>,
    replace: Vec<(String, String)>,
    expect: Vec<String>,
    check: Vec<String>,
    needs: Vec<String>,
    env: Vec<(String, String)>,
}

impl Directives {
    fn is_empty(&self) -> bool {
        self.norun.is_none()
            && self.setup.is_empty()
            && self.replace.is_empty()
            && self.expect.is_empty()
            && self.check.is_empty()
            && self.needs.is_empty()
            && self.env.is_empty()
    }
}

/// One fenced block of a page.
#[derive(Debug, Clone)]
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    lang: Lang,
    text: String,
    directives: Directives,
}

/// Parse a directive comment's body (between `<!--` and `-->`); `None` when it is not one.
fn directives(body: &str, at: &str) -> Option<Directives> {
    let body = body.trim();
    let mut d = Directives::default();
    if let Some(reason) = body.strip_prefix("norun:") {
        let reason = reason.trim();
        assert!(!reason.is_empty(), "{at}: `norun:` without a reason");
        d.norun = Some(reason.to_string());
        return Some(d);
    }
    let rest = body.strip_prefix("docs-test")?;
    for line in rest.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (key, value) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("{at}: directive `{line}` has no `key:`"));
        let value = value.trim().to_string();
        match key.trim() {
            "setup" => d.setup.push(value),
            "expect" => d.expect.push(value),
            "check" => d.check.push(value),
            "needs" => d.needs.extend(value.split_whitespace().map(str::to_string)),
            "env" => {
                let (k, v) = value
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{at}: `env: {value}` is not NAME=VALUE"));
                d.env.push((k.to_string(), v.to_string()));
            }
            "replace" => {
                let (old, new) = value
                    .split_once(" => ")
                    .unwrap_or_else(|| panic!("{at}: `replace: {value}` has no ` => `"));
                d.replace.push((old.to_string(), new.to_string()));
            }
            other => panic!("{at}: unknown directive `{other}`"),
        }
    }
    Some(d)
}

/// The fenced blocks of a markdown page, each with the directive comment right before it (blank
/// lines between them allowed).
fn blocks(name: &str, md: &str) -> Vec<Block> {
    let lines: Vec<&str> = md.lines().collect();
    let mut out = Vec::new();
    let mut pending: Option<(usize, Directives)> = None;
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim_start();
        if let Some(info) = t.strip_prefix("```") {
            let start = i;
            let mut body = Vec::new();
            i += 1;
            while i < lines.len() && !lines[i].trim_start().starts_with("```") {
                body.push(lines[i]);
                i += 1;
            }
            assert!(i < lines.len(), "{name}:{}: unclosed block", start + 1);
            let lang = Lang::of(info);
            let typed = |l: &&str| {
                ["rlcr ", "make -f ", "python3 ", "cargo "]
                    .iter()
                    .any(|c| l.starts_with(c))
            };
            assert!(
                lang != Lang::Other || !body.iter().any(typed),
                "{name}:{}: commands in a block that is not ```sh: make it one (with \
                 `<!-- norun: why -->` before it if it must not run)",
                start + 1
            );
            let d = pending.take().map(|(_, d)| d).unwrap_or_default();
            assert!(
                lang != Lang::Other || d.is_empty(),
                "{name}:{}: a directive before a block that is never run",
                start + 1
            );
            out.push(Block {
                line: start + 1,
                lang,
                text: body.join("\n") + "\n",
                directives: d,
            });
        } else if t.starts_with("<!--") {
            let start = i;
            let mut text = t.trim_start_matches("<!--").to_string();
            while !text.contains("-->") {
                i += 1;
                assert!(i < lines.len(), "{name}:{}: unclosed comment", start + 1);
                text.push('\n');
                text.push_str(lines[i]);
            }
            let body = text.split("-->").next().unwrap_or("");
            pending = directives(body, &format!("{name}:{}", start + 1)).map(|d| (start + 1, d));
        } else if !t.is_empty() {
            if let Some((at, _)) = pending.take() {
                panic!("{name}:{at}: a directive comment not followed by a block");
            }
        }
        i += 1;
    }
    if let Some((at, _)) = pending {
        panic!("{name}:{at}: a directive comment at the end of the page");
    }
    out
}

/// The file a `python`/`toml` block stands for: its first line is `# NAME.EXT`.
fn file_name(b: &Block) -> Option<String> {
    let first = b.text.lines().next()?.trim();
    let name = first.strip_prefix('#')?.trim();
    let ok = !name.is_empty()
        && !name.contains(char::is_whitespace)
        && name.contains('.')
        && !name.contains("..")
        && !name.starts_with('/');
    ok.then(|| name.to_string())
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python_required() -> bool {
    std::env::var("RLCR_REQUIRE_PYTHON").is_ok_and(|v| v == "1")
}

/// A page's folder: a fresh temporary folder laid out as a clone's root, and `rlcr` on PATH.
struct Folder {
    dir: tempfile::TempDir,
    bin: tempfile::TempDir,
}

impl Folder {
    fn new() -> Folder {
        let dir = tempfile::Builder::new()
            .prefix("rlcr-docs-")
            .tempdir()
            .expect("temp dir");
        let bin = tempfile::Builder::new()
            .prefix("rlcr-docs-bin-")
            .tempdir()
            .expect("temp dir");
        for link in ["scripts", "fixtures"] {
            std::os::unix::fs::symlink(repo().join(link), dir.path().join(link)).unwrap();
        }
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rlcr"), bin.path().join("rlcr")).unwrap();
        Folder { dir, bin }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// `program args…` in the folder with the page's environment, stopped after 15 minutes.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.bin.path().to_path_buf()];
        paths.extend(std::env::split_paths(&path));
        let mut c = Command::new("timeout");
        c.args(["-k", "10", "900", program])
            .args(args)
            .current_dir(self.root())
            .env("PATH", std::env::join_paths(paths).unwrap())
            .env("RLCR", env!("CARGO_BIN_EXE_rlcr"))
            .env("DOCS_TEST_REPO", repo())
            .env("NO_COLOR", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("RLCR_CONFIG");
        c
    }

    fn bash(&self, script: &str) -> Output {
        self.bash_with(script, &[])
    }

    fn bash_with(&self, script: &str, env: &[(String, String)]) -> Output {
        self.command("bash", &["-euo", "pipefail", "-c", script])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("bash runs")
    }

    fn python(&self, script: &str) -> Output {
        self.command("python3", &["-c", script])
            .output()
            .expect("python3 runs")
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Panic with everything needed to see why `what` failed.
fn fail(at: &str, what: &str, script: &str, o: &Output) -> ! {
    panic!(
        "{at}: {what} failed ({})\n--- ran:\n{script}--- stdout:\n{}\n--- stderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs DuckDB statements read from stdin, printing each result.
const DUCKDB: &str = "import sys, duckdb
con = duckdb.connect()
for s in con.extract_statements(sys.stdin.read()):
    print(con.execute(s).fetchall())
";

/// What is missing of `needs` (commands, or `python:MODULE`s), `None` when nothing is.
fn missing(f: &Folder, needs: &[String]) -> Option<String> {
    let mut gone = Vec::new();
    for n in needs {
        let found = match n.strip_prefix("python:") {
            Some(module) => f.python(&format!("import {module}")).status.success(),
            None => f.bash(&format!("command -v {n}")).status.success(),
        };
        if !found {
            if n.starts_with("python:") && python_required() {
                panic!("{n} is needed and RLCR_REQUIRE_PYTHON=1");
            }
            gone.push(n.as_str());
        }
    }
    (!gone.is_empty()).then(|| gone.join(", "))
}

/// Run every block of `page` (relative to the repository) in order in one fresh folder; return the
/// folder for checks of its own.
fn run_page(page: &str) -> Folder {
    let md = std::fs::read_to_string(repo().join(page)).unwrap();
    let f = Folder::new();
    let mut session = String::new(); // the page's earlier Python blocks
    for b in blocks(page, &md) {
        let at = format!("{page}:{}", b.line);
        let d = &b.directives;
        if b.lang == Lang::Other || d.norun.is_some() {
            continue;
        }
        if let Some(gone) = missing(&f, &d.needs) {
            eprintln!("{at}: skipped with the rest of the page: {gone} not found");
            return f;
        }
        let mut body = b.text.clone();
        for (old, new) in &d.replace {
            assert!(
                body.contains(old.as_str()),
                "{at}: `{old}` is not in the block"
            );
            body = body.replace(old.as_str(), new);
        }
        if !d.setup.is_empty() {
            let s = d.setup.join("\n") + "\n";
            let o = f.bash(&s);
            if !o.status.success() {
                fail(&at, "the block's setup", &s, &o);
            }
        }
        let (o, ran) = match (b.lang, file_name(&b)) {
            (Lang::Python | Lang::Toml, Some(name)) => {
                std::fs::write(f.root().join(&name), &body).unwrap();
                continue;
            }
            (Lang::Toml, None) => continue,
            (Lang::Shell, _) => (f.bash_with(&body, &d.env), body.clone()),
            (Lang::Python, None) => {
                let mut script = format!("{session}{body}");
                for c in &d.check {
                    script.push_str(c);
                    script.push('\n');
                }
                session.push_str(&body);
                (f.python(&script), script)
            }
            (Lang::Sql, _) => {
                use std::io::Write;
                let mut child = f
                    .command("python3", &["-c", DUCKDB])
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("python3 runs");
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(body.as_bytes())
                    .unwrap();
                (child.wait_with_output().unwrap(), body.clone())
            }
            (Lang::Other, _) => unreachable!("skipped above"),
        };
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            if b.lang != Lang::Shell && err.contains("No module named") && !python_required() {
                eprintln!("{at}: skipped with the rest of the page: {err}");
                return f;
            }
            fail(&at, "the block", &ran, &o);
        }
        let all = text(&o);
        for e in &d.expect {
            assert!(
                all.contains(e.as_str()),
                "{at}: the output lacks `{e}`\n--- ran:\n{ran}--- output:\n{all}"
            );
        }
        if b.lang == Lang::Shell && !d.check.is_empty() {
            let s = d.check.join("\n") + "\n";
            let o = f.bash(&s);
            if !o.status.success() {
                fail(&at, "the block's check", &s, &o);
            }
        }
    }
    f
}

/// One test per page, so that a failure names its page and pages run in parallel.
macro_rules! pages {
    ($($test:ident => $page:literal,)*) => {
        $(
            #[test]
            fn $test() {
                run_page($page);
            }
        )*
        const PAGES: &[&str] = &[$($page),*];
    };
}

pages! {
    readme => "README.md",
    backends => "docs/backends.md",
    cluster => "docs/cluster.md",
    concepts => "docs/concepts.md",
    config => "docs/config.md",
    development => "docs/development.md",
    environment => "docs/environment.md",
    getting_started => "docs/getting-started.md",
    loop_page => "docs/loop.md",
    lora => "docs/lora.md",
    math => "docs/math.md",
    models => "docs/models.md",
    own_data => "docs/own-data.md",
    protocols => "docs/protocols.md",
    results => "docs/results.md",
    schemas => "docs/schemas.md",
}

/// A page of docs/ without its test above (a new one) runs here, so that no page goes unchecked.
#[test]
fn other_pages() {
    let mut pages: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .filter(|p| !PAGES.contains(&p.as_str()))
        .collect();
    pages.sort();
    for p in pages {
        run_page(&p);
    }
}

/// The parser: directives attach to the next block, a norun needs a reason, a file block is
/// recognised, and a stray directive is an error.
#[test]
fn blocks_and_directives_parse() {
    let md = "# t\n\n<!-- norun: needs a GPU -->\n```sh\ngpu\n```\n\n<!-- docs-test\nsetup: ln -s a MODEL\nreplace: ITERS=60 => ITERS=2\nexpect: done\n-->\n\n```sh\nmake ITERS=60\n```\n```python\n# my_rewards.py\nx = 1\n```\n```text\nout\n```\n";
    let b = blocks("t.md", md);
    assert_eq!(b.len(), 4);
    assert_eq!(b[0].directives.norun.as_deref(), Some("needs a GPU"));
    assert_eq!(b[0].line, 4);
    assert_eq!(b[1].directives.setup, ["ln -s a MODEL"]);
    assert_eq!(
        b[1].directives.replace,
        [("ITERS=60".to_string(), "ITERS=2".to_string())]
    );
    assert_eq!(b[1].directives.expect, ["done"]);
    assert_eq!(b[1].text, "make ITERS=60\n");
    assert_eq!(file_name(&b[2]).as_deref(), Some("my_rewards.py"));
    assert_eq!(b[3].lang, Lang::Other);
    for bad in [
        "<!-- norun: -->\n```sh\nx\n```\n",
        "<!-- norun: why -->\ntext\n```sh\nx\n```\n",
        "<!-- docs-test\nsetup: x\n-->\n```text\nx\n```\n",
        "<!-- docs-test\nfrobnicate: x\n-->\n```sh\nx\n```\n",
        "```\nrlcr score --input t.parquet -o s.parquet\n```\n",
    ] {
        assert!(
            std::panic::catch_unwind(|| blocks("bad.md", bad)).is_err(),
            "accepted: {bad}"
        );
    }
}

/// `rlcr --help`'s quick start, line by line as printed, on a model folder named `MODEL` (the
/// tiny model): every command runs, `update` writes `MODEL-1` and `report` its folder.
#[test]
fn quick_start_in_help_runs() {
    let f = Folder::new();
    let help = f.bash("rlcr --help");
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    let start = help
        .find("Quick start")
        .unwrap_or_else(|| panic!("no quick start in:\n{help}"));
    let lines: Vec<&str> = help[start..]
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    assert!(lines.len() >= 6, "{lines:?}");
    assert!(lines.iter().all(|l| l.starts_with("rlcr ")), "{lines:?}");
    std::os::unix::fs::symlink(repo().join("fixtures/tiny-qwen2"), f.root().join("MODEL")).unwrap();
    let script = lines.join("\n") + "\n";
    // The sampling defaults (512 new tokens) on the untrained tiny model, which rarely stops,
    // take minutes: a run file shortens the responses, the command lines stay as printed.
    let short = (
        "RLCR_CONFIG".to_string(),
        "fixtures/docs/short-sampling.toml".to_string(),
    );
    let o = f.bash_with(&script, &[short]);
    if !o.status.success() {
        fail("rlcr --help, quick start", "the quick start", &script, &o);
    }
    assert!(f.root().join("MODEL-1/config.json").is_file());
    assert!(f.root().join("report/metrics.json").is_file());
}

/// docs/schemas.md: a table's `rlcr.config` holds the command line (`argv`) and the seed, as
/// every stage records them; `prepare`'s too.
#[test]
fn prepare_config_records_argv_and_seed() {
    let w = crate::Workdir::new();
    let args = [
        "--seed",
        "3",
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        "4",
        "-o",
        "p.parquet",
    ];
    w.run(&args);
    let r = rlcr::table::Reader::open(&w.path("p.parquet")).unwrap();
    let cfg: serde_json::Value = serde_json::from_str(&r.metadata()["rlcr.config"]).unwrap();
    assert_eq!(cfg["seed"], 3, "{cfg}");
    let argv: Vec<&str> = cfg["argv"]
        .as_array()
        .unwrap_or_else(|| panic!("no argv in {cfg}"))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(argv[1..], args, "{cfg}");
}
