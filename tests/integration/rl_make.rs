//! `scripts/rl.mk` itself: what the loop keeps on disk.
use std::path::Path;
use std::process::Command;

use crate::Workdir;

/// Run `make -f scripts/rl.mk` with the test binary as RLCR (nothing is rebuilt) and `vars`.
fn rl_make(wd: &Workdir, vars: &[&str]) -> std::process::Output {
    let mk = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/rl.mk");
    Command::new("make")
        .arg("-f")
        .arg(&mk)
        .arg(format!("RLCR={}", env!("CARGO_BIN_EXE_rlcr")))
        .arg(format!("RUNS={}", wd.root().display()))
        .args(vars)
        .current_dir(wd.root())
        .output()
        .expect("make runs")
}

/// `KEEP_CHECKPOINTS=2` on a 4-iteration loop: iterations 1 and 2 lose their weights and optimizer
/// state once iteration 3 and 4 are written; 3 and 4 keep theirs; every iteration keeps its
/// config, metrics and tables, and `make` again is a no-op (nothing re-run from a deleted
/// checkpoint). A value that is not a whole number ≥ 1 is refused before anything runs.
#[test]
fn keep_checkpoints_drops_old_weights_and_stays_resumable() {
    let wd = Workdir::new();
    let vars = [
        "RUN=k",
        "SFT=0",
        "ITERS=4",
        "PROMPTS_PER_ITER=2",
        "G_A=2",
        "G_C=2",
        "MAX_NEW=4",
        "MAX_NEW_CONF=4",
        "EPOCHS=1",
        "MINI_BATCHES=1",
        "KEEP_CHECKPOINTS=2",
        "loop",
    ];
    let o = rl_make(&wd, &vars);
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{log}");
    let model = |i: u32| wd.path(&format!("k/iter-{i:04}/model"));
    for i in 1..=4 {
        assert!(
            model(i).join("config.json").exists(),
            "iteration {i}: {log}"
        );
        assert!(
            model(i).join("train_metrics.jsonl").exists(),
            "iteration {i}"
        );
        let kept = i > 2;
        assert_eq!(
            model(i).join("model.safetensors").exists(),
            kept,
            "iteration {i} weights"
        );
        assert_eq!(
            model(i).join("rlcr-train").exists(),
            kept,
            "iteration {i} optimizer state"
        );
        assert!(wd.path(&format!("k/iter-{i:04}/train.parquet")).exists());
    }
    let again = rl_make(&wd, &vars);
    let out = String::from_utf8_lossy(&again.stdout).to_string();
    assert!(again.status.success(), "{out}");
    assert!(
        !out.contains(env!("CARGO_BIN_EXE_rlcr")),
        "re-ran a stage:\n{out}"
    );
    for bad in ["0", "two", "-1"] {
        let o = rl_make(&wd, &["RUN=k2", &format!("KEEP_CHECKPOINTS={bad}"), "loop"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "KEEP_CHECKPOINTS={bad} accepted");
        assert!(
            err.contains("KEEP_CHECKPOINTS must be a whole number"),
            "{err}"
        );
        assert!(
            !wd.path("k2").exists(),
            "KEEP_CHECKPOINTS={bad}: something ran"
        );
    }
}

/// `LORA_RANK=4`: every iteration's update trains an adapter (the first a fresh one on the
/// starting model, the next continuing it with its optimizer state), the sampling stages read the
/// previous iteration's adapter folder, and `make` again is a no-op.
#[test]
fn lora_rank_runs_the_loop_on_adapters() {
    let wd = Workdir::new();
    let vars = [
        "RUN=l",
        "SFT=0",
        "ITERS=2",
        "PROMPTS_PER_ITER=2",
        "G_A=2",
        "G_C=2",
        "MAX_NEW=4",
        "MAX_NEW_CONF=4",
        "EPOCHS=1",
        "MINI_BATCHES=1",
        "LORA_RANK=4",
        "loop",
    ];
    let o = rl_make(&wd, &vars);
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{log}");
    assert!(log.contains("--lora-rank 4"), "{log}");
    for i in 1..=2 {
        let m = wd.path(&format!("l/iter-{i:04}/model"));
        assert!(m.join("adapter_model.safetensors").exists(), "{i}: {log}");
        assert!(!m.join("model.safetensors").exists(), "{i}: full weights");
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(m.join("adapter_config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg["r"], 4);
        assert!(
            cfg["base_model_name_or_path"]
                .as_str()
                .unwrap()
                .ends_with("fixtures/tiny-qwen2"),
            "{cfg}"
        );
    }
    // Iteration 2 sampled from iteration 1's adapter and resumed its optimizer.
    assert!(log.contains("generate-answers --model ") && log.contains("iter-0001/model --input"));
    let steps: Vec<u64> = std::fs::read_to_string(wd.path("l/iter-0002/model/train_metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, vec![1, 2]);
    let again = rl_make(&wd, &vars);
    let out = String::from_utf8_lossy(&again.stdout).to_string();
    assert!(again.status.success(), "{out}");
    assert!(
        !out.contains(env!("CARGO_BIN_EXE_rlcr")),
        "re-ran a stage:\n{out}"
    );
}
