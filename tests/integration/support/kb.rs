//! The multi-turn tests' start: the example knowledge-base environment (`scripts/kb_env.py`), its
//! prompts through `prepare --from jsonl`, and `score` with its dense turn rewards.
use std::path::{Path, PathBuf};

use crate::Workdir;

/// `scripts/kb_env.py`.
pub fn env_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kb_env.py")
}

/// The command line that serves the environment (`extra`: its flags).
pub fn env_cmd(extra: &str) -> String {
    format!("python3 {} serve {extra}", env_script().display())
}

/// `count` prompts of the environment (its `--seed`), through `rlcr prepare --from jsonl` into
/// `out`.
pub fn prompts(w: &Workdir, count: usize, seed: u64, out: &str) {
    let o = std::process::Command::new("python3")
        .arg(env_script())
        .args([
            "prompts",
            "--count",
            &count.to_string(),
            "--seed",
            &seed.to_string(),
        ])
        .output()
        .expect("python3");
    assert!(o.status.success(), "{o:?}");
    w.write("kb.jsonl", &o.stdout);
    w.run(&[
        "prepare", "--from", "jsonl", "--input", "kb.jsonl", "-o", out,
    ]);
}

/// `score` of multi-turn rollouts: exact match as a global component and the environment's
/// `turn_rewards` as a turn component (written to `rewards.toml`); `extra`: more score flags.
pub fn score_turn_rewards(w: &Workdir, input: &str, out: &str, extra: &[&str]) {
    w.write(
        "rewards.toml",
        "[[turn]]\nname = \"env\"\nweight = 1.0\ncolumn = \"turn_rewards\"\n\n\
         [[global]]\nname = \"exact_match\"\nweight = 1.0\nsource = \"correct\"\n",
    );
    let mut args = vec![
        "score",
        "--input",
        input,
        "-o",
        out,
        "--verifier",
        "exact",
        "--rewards",
        "rewards.toml",
    ];
    args.extend_from_slice(extra);
    w.run(&args);
}
