//! What a user meets around the stages: the environment switches (checked, recorded in every
//! output), `--version`, shell completions, the run config file, the generated command pages and
//! the warnings of `update`.
use std::path::Path;

use rlcr::switches::Isa;
use rlcr::table::Reader;

use super::support::train::{train_rows, write_rows};
use super::{fixtures, Workdir};

fn switches_of(table: &Path) -> serde_json::Value {
    let r = Reader::open(table).expect("open");
    serde_json::from_str(&r.metadata()["rlcr.switches"]).expect("rlcr.switches is JSON")
}

/// A stage run with switches set records them, beside `rlcr.config`; unset ones are recorded with
/// their defaults, the ISA as the level that ran.
#[test]
fn switches_in_force_are_recorded_in_tables_and_model_folders() {
    let w = Workdir::new();
    let prepare = ["prepare", "--from", "countdown-synth", "--count", "5"];
    let mut c = w.cmd(&prepare);
    c.args(["-o", "a.parquet"])
        .env("RLCR_GEMM", "burn")
        .env("RLCR_CPU_ISA", "avx2")
        .env("RLCR_DECODE_BF16", "round");
    let o = c.output().expect("run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = switches_of(&w.path("a.parquet"));
    assert_eq!(s["RLCR_GEMM"], "burn");
    assert_eq!(s["RLCR_CPU_ISA"], Isa::Avx2.clamp().name());
    assert_eq!(s["RLCR_DECODE_BF16"], "round");
    assert_eq!(s["RLCR_ATTENTION"], "rlcr");
    assert_eq!(s["RLCR_FUSED_HEAD"], "1");
    let r = Reader::open(&w.path("a.parquet")).unwrap();
    assert!(r.metadata().contains_key("rlcr.config"));

    // Without the variables: the defaults.
    w.run(&[&prepare[..], &["-o", "b.parquet"]].concat());
    let s = switches_of(&w.path("b.parquet"));
    assert_eq!(s["RLCR_GEMM"], "rlcr");
    assert_eq!(s["RLCR_CPU_ISA"], Isa::detected().name());

    // A model folder written by `update` records them in its trainer state.
    write_rows(&w.path("train.parquet"), &train_rows());
    let tiny = fixtures().join("tiny-qwen2");
    let mut c = w.cmd(&["update", "--model", tiny.to_str().unwrap()]);
    c.args(["--input", "train.parquet", "-o", "new", "--lr", "0"])
        .env("RLCR_FUSED_HEAD", "0");
    let o = c.output().expect("run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let state: serde_json::Value =
        crate::support::json::read(w.path("new/rlcr-train/trainer_state.json"));
    assert_eq!(state["switches"]["RLCR_FUSED_HEAD"], "0");
    assert_eq!(state["switches"]["RLCR_GEMM"], "rlcr");
    // Informative advantages: no warning.
    assert!(!String::from_utf8_lossy(&o.stderr).contains("every advantage is 0"));
}

/// A bad value stops every command with one line naming the variable (exit 1, nothing written);
/// before, it was reported and the default used.
#[test]
fn a_bad_switch_is_an_error_and_nothing_is_written() {
    let w = Workdir::new();
    for (var, value) in [("RLCR_GEMM", "fast"), ("RLCR_DECODE_BF16", "yes")] {
        let mut c = w.cmd(&["prepare", "--from", "countdown-synth", "--count", "5"]);
        c.args(["-o", "a.parquet"]).env(var, value);
        let o = c.output().expect("run");
        assert_eq!(o.status.code(), Some(1), "{var}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(var) && err.contains(value), "{err}");
        assert!(w.listing().is_empty());
    }
}

#[test]
fn version_names_commit_features_and_cpu_kernels() {
    let w = Workdir::new();
    let out = w.run(&["--version"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], format!("rlcr {}", rlcr::VERSION), "{out}");
    let commit = lines[1].strip_prefix("commit: ").expect("commit line");
    assert!(
        commit == "unknown"
            || commit.len() >= 40 && commit[..40].chars().all(|c| c.is_ascii_hexdigit()),
        "{out}"
    );
    let features: Vec<&str> = [
        ("cuda", cfg!(feature = "cuda")),
        ("wgpu", cfg!(feature = "wgpu")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let want = if features.is_empty() {
        "none (CPU only)".to_string()
    } else {
        features.join(", ")
    };
    assert_eq!(lines[2], format!("features: {want}"), "{out}");
    let kernels = lines[3]
        .strip_prefix("cpu kernels: ")
        .expect("kernels line");
    assert!(kernels.starts_with(Isa::detected().name()), "{out}");
    // Lowered by RLCR_CPU_ISA.
    let o = w
        .cmd(&["--version"])
        .env("RLCR_CPU_ISA", "scalar")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("cpu kernels: scalar (RLCR_CPU_ISA;"), "{out}");
    // `-V` stays one line.
    assert_eq!(w.run(&["-V"]).trim(), format!("rlcr {}", rlcr::VERSION));
}

/// The scripts load in their shell when it is installed (bash here; zsh and fish when present).
#[test]
fn completions_for_each_shell() {
    let w = Workdir::new();
    for shell in ["bash", "zsh", "fish"] {
        let script = w.run(&["completions", shell]);
        assert!(script.contains("generate-answers") && script.contains("num-answers"));
        let path = w.write(&format!("rlcr.{shell}"), &script);
        let check = match shell {
            "bash" => format!("source {} && complete -p rlcr", path.display()),
            "zsh" => format!("zsh -n {}", path.display()),
            _ => format!("fish --no-execute {}", path.display()),
        };
        let exe = if shell == "bash" { "bash" } else { shell };
        match std::process::Command::new(exe)
            .arg("-c")
            .arg(&check)
            .output()
        {
            Ok(o) if shell == "bash" || o.status.code().is_some() => {
                assert!(
                    o.status.success(),
                    "{shell}: {}",
                    String::from_utf8_lossy(&o.stderr)
                )
            }
            _ => assert_ne!(shell, "bash", "bash is needed to check its script"),
        }
    }
    w.fail(&["completions", "tcsh"], 2);
}

/// Each stage's `--help` lists its own options before the global ones.
#[test]
fn stage_help_lists_its_options_before_the_global_ones() {
    let w = Workdir::new();
    let help = w.run(&["update", "--help"]);
    let options = help.find("\nOptions:\n").expect("Options:");
    let own = help.find("\n      --lr <LR>").expect("--lr");
    let heading = help.find("\nGlobal options:\n").expect("heading");
    let seed = help.find("\n      --seed <SEED>").expect("--seed");
    assert!(options < own && own < heading && heading < seed, "{help}");
    assert!(help.contains("--config <FILE>"), "{help}");
    let top = w.run(&["--help"]);
    for want in ["make -f scripts/rl.mk", "Quick start", "rlcr completions"] {
        assert!(top.contains(want), "{want}: {top}");
    }
}

/// One run file for every stage: each stage reads its section and the globals; command-line
/// flags win; a typo names the file, the section and the key (exit 2, nothing written).
#[test]
fn a_run_config_file_gives_each_stage_its_section() {
    let w = Workdir::new();
    w.write(
        "run.toml",
        "seed = 3\n\n[prepare]\nfrom = \"countdown-synth\"\ncount = 6\n\n[update]\nlr = 1e-5\n",
    );
    w.run(&["prepare", "--config", "run.toml", "-o", "a.parquet"]);
    let r = Reader::open(&w.path("a.parquet")).unwrap();
    assert_eq!(r.num_rows(), 6);
    let config: serde_json::Value = serde_json::from_str(&r.metadata()["rlcr.config"]).unwrap();
    assert_eq!(config["seed"], 3, "{config}");
    // The environment names the file too; the command line wins over both.
    let mut c = w.cmd(&["--seed", "4", "prepare", "--count", "2", "-o", "b.parquet"]);
    let o = c.env("RLCR_CONFIG", w.path("run.toml")).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = Reader::open(&w.path("b.parquet")).unwrap();
    assert_eq!(r.num_rows(), 2);
    let config: serde_json::Value = serde_json::from_str(&r.metadata()["rlcr.config"]).unwrap();
    assert_eq!(config["seed"], 4, "{config}");

    w.write(
        "typo.toml",
        "[prepare]\nfrom = \"countdown-synth\"\ncuont = 6\n",
    );
    let err = w.fail(&["prepare", "--config", "typo.toml", "-o", "c.parquet"], 2);
    assert!(
        err.contains("typo.toml") && err.contains("`cuont`") && err.contains("[prepare]"),
        "{err}"
    );
    assert!(err.contains("did you mean `count`?"), "{err}");
    w.write("section.toml", "[generate-answer]\nnum-answers = 2\n");
    let err = w.fail(
        &["prepare", "--config", "section.toml", "-o", "c.parquet"],
        2,
    );
    assert!(
        err.contains("section.toml") && err.contains("[generate-answer]"),
        "{err}"
    );
    // A bad value from the file says where it was written.
    w.write(
        "value.toml",
        "[prepare]\nfrom = \"countdown-synth\"\ncount = \"many\"\n",
    );
    let err = w.fail(&["prepare", "--config", "value.toml", "-o", "c.parquet"], 2);
    assert!(
        err.contains("--count was set by the config file") && err.contains("value.toml [prepare]"),
        "{err}"
    );
    assert!(!w.path("c.parquet").exists());
}

/// `update` warns when no learnable token carries an advantage (the update would only follow the
/// KL and entropy terms), and still writes its folder.
#[test]
fn update_warns_when_every_advantage_is_zero() {
    let w = Workdir::new();
    let mut rows = train_rows();
    for r in &mut rows {
        r.adv.iter_mut().for_each(|a| *a = 0.0);
    }
    write_rows(&w.path("train.parquet"), &rows);
    let tiny = fixtures().join("tiny-qwen2");
    let o = w.output(&[
        "update",
        "--model",
        tiny.to_str().unwrap(),
        "--input",
        "train.parquet",
        "-o",
        "new",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning: train.parquet: every advantage is 0"),
        "{err}"
    );
    assert!(w.path("new/config.json").is_file());
}

/// docs/cli/ holds one page per subcommand, each equal to what the clap definitions generate and
/// containing the binary's `--help` word for word. `RLCR_BLESS=1` rewrites the pages.
#[test]
fn cli_pages() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli");
    let pages = rlcr::cli::docs::pages();
    if std::env::var_os("RLCR_BLESS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in &pages {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }
    let w = Workdir::new();
    let mut names: Vec<String> = pages.iter().map(|(n, _)| n.clone()).collect();
    for (name, text) in &pages {
        let on_disk = std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|_| panic!("docs/cli/{name} is missing (RLCR_BLESS=1 writes it)"));
        assert!(
            on_disk == *text,
            "docs/cli/{name} differs from the command-line definitions (RLCR_BLESS=1 rewrites it)"
        );
        let stage = name.trim_end_matches(".md");
        let args: Vec<&str> = if stage == "index" {
            vec!["--help"]
        } else {
            vec![stage, "--help"]
        };
        let help = w.run(&args);
        assert!(
            on_disk.contains(&help),
            "docs/cli/{name} does not contain `rlcr {}` as printed",
            args.join(" ")
        );
    }
    // No stale page of a removed subcommand.
    names.sort();
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    assert_eq!(found, names);
}

/// docs/environment.md has a row for every variable the binary reads, with its default.
#[test]
fn environment_page_lists_every_variable() {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/environment.md"))
            .expect("docs/environment.md");
    for v in rlcr::switches::VARIABLES {
        let row = page
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", v.name)))
            .unwrap_or_else(|| panic!("docs/environment.md has no row for {}", v.name));
        let default = if v.default == "none" {
            "| none |".to_string()
        } else {
            format!("| `{}` |", v.default)
        };
        assert!(
            row.contains(&default),
            "{}: default {default} not in {row}",
            v.name
        );
    }
}

/// The example files of docs/config.md are valid for every stage they name (the whole file is
/// checked on every run, even with `--help`).
#[test]
fn config_page_examples_are_valid() {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.md"))
            .expect("docs/config.md");
    let blocks: Vec<&str> = page
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(blocks.len(), 2, "a run file and a stage file");
    let w = Workdir::new();
    w.write("run.toml", blocks[0]);
    for stage in [
        "prepare",
        "generate-answers",
        "generate-confidence",
        "score",
        "advantage",
        "update",
    ] {
        assert!(blocks[0].contains(&format!("[{stage}]")), "{stage}");
        w.run(&[stage, "--config", "run.toml", "--help"]);
    }
    w.write("sample.toml", blocks[1]);
    w.run(&["generate-answers", "--config", "sample.toml", "--help"]);
    // The check is real: a typo fails even with --help.
    w.write("bad.toml", format!("{}\nlrr = 1\n", blocks[0]));
    w.fail(&["update", "--config", "bad.toml", "--help"], 2);
}
