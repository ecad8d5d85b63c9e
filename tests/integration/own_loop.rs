//! The loop as a user coming from verl or TRL runs it: a dataset as they keep it on disk, a
//! reward function written for their library, `make -f scripts/rl.mk` with PROMPTS, EVAL_PROMPTS,
//! EVAL_EVERY and VERIFIER_CMD (and `--format-gate off`, so that the function judges every
//! response), and nothing else of theirs but a column mapping. Checked: the
//! loop's rewards are the user's function called directly on the same rows, the evaluations sit
//! at the training iterations they evaluate, and TensorBoard's own reader gets back
//! `train_metrics.jsonl` and the reports' figures per iteration.
use std::path::Path;

use serde_json::Value;

use crate::support::rlmk;
use crate::Workdir;

/// The user's reward code: one function written for verl, one for TRL. Both add a small bonus
/// from a column of the dataset, so that the rewards differ from row to row and show that the
/// columns reach the function.
const MY_REWARDS: &str = r#"import re


def _answer(text):
    found = re.findall(r"<answer>(.*?)</answer>", text, re.S)
    return found[-1].strip() if found else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    right = _answer(solution_str) == str(ground_truth)
    return (1.0 if right else 0.0) + 0.01 * extra_info["index"]


def correctness(prompts, completions, solution, level, **kwargs):
    return [(1.0 if _answer(c) == s else 0.0) + 0.01 * lv
            for c, s, lv in zip(completions, solution, level)]
"#;

const ITERS: i64 = 4;
const EVALS: [i64; 3] = [0, 2, 4];

/// `make … summary` of run `run` with `vars`, the user's module on PYTHONPATH; then every check.
fn run_and_check(wd: &Workdir, run: &str, vars: &[&str], reward: &[&str]) {
    wd.write("my_rewards.py", MY_REWARDS);
    let mut all = rlmk::small_loop(ITERS as u32, 1, &[&format!("RUN={run}")]);
    all.extend([
        "EVAL_EVERY=2".into(),
        "EVAL_G_A=1".into(),
        "EVAL_G_C=1".into(),
        // Every response to the user's function (the tiny model never writes rlcr's answer
        // format, which the default gate requires before asking the function).
        "SCORE_FLAGS=--format-gate off".into(),
    ]);
    all.extend(vars.iter().map(|v| v.to_string()));
    let o = rlmk::command(wd, &all)
        .arg("summary")
        .env("PYTHONPATH", wd.root())
        .output()
        .expect("make runs");
    let log = rlmk::log(&o);
    assert!(o.status.success(), "{log}");
    let dir = wd.path(run);
    let json = |p: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p:?}: {e}")))
            .unwrap()
    };

    // The evaluations: the starting policy and every second iteration's, nothing else.
    let mut evals: Vec<String> = std::fs::read_dir(dir.join("eval"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("iter-"))
        .collect();
    evals.sort();
    let want: Vec<String> = EVALS.iter().map(|i| format!("iter-{i:04}")).collect();
    assert_eq!(evals, want, "{log}");
    for e in &want {
        assert!(
            dir.join("eval").join(e).join("scored.parquet").is_file(),
            "{e}"
        );
    }
    // … reported against the iteration of the policy evaluated.
    let ev = json(&dir.join("eval/report/metrics.json"));
    let ev_reports = ev["reports"].as_array().unwrap();
    let its: Vec<i64> = ev_reports
        .iter()
        .map(|r| r["iteration"].as_i64().unwrap())
        .collect();
    assert_eq!(its, EVALS);
    let page = std::fs::read_to_string(dir.join("eval/report/report.md")).unwrap();
    for (i, e) in EVALS.iter().zip(&want) {
        assert!(
            page.contains(&format!(
                "\n| {i} | `{}",
                dir.join("eval").join(e).display()
            )),
            "evaluation {i} not in the table:\n{page}"
        );
    }
    // The summary report: one input per iteration, the training curves.
    let sum = json(&dir.join("report/metrics.json"));
    let sum_reports = sum["reports"].as_array().unwrap();
    let its: Vec<i64> = sum_reports
        .iter()
        .map(|r| r["iteration"].as_i64().unwrap())
        .collect();
    assert_eq!(its, (1..=ITERS).collect::<Vec<_>>());
    assert!(dir.join("report/training.svg").is_file());

    // The loop's rewards are the user's function on the same rows.
    let mut check = vec![dir.join("iter-0001/scored.parquet").display().to_string()];
    check.extend(reward.iter().map(|s| s.to_string()));
    let check: Vec<&str> = check.iter().map(String::as_str).collect();
    if let Some(r) = crate::own_data::check_adapter(wd.root(), &check) {
        assert!(
            r.contains(" 0 mismatches") && !r.contains(" 1 distinct"),
            "{r}"
        );
    }

    // TensorBoard: the optimizer steps equal train_metrics.jsonl (the last iteration's holds the
    // whole loop's); rollouts and evaluations equal the reports' figures at their iterations.
    let tb = dir.join("tb");
    let runs = [tb.join("update"), tb.join("rollouts"), tb.join("eval")];
    let refs: Vec<&Path> = runs.iter().map(|d| d.as_path()).collect();
    let Some(read) = crate::tensorboard::read_runs(&refs) else {
        return;
    };
    let lines = crate::support::train::metrics(&dir.join(format!("iter-{ITERS:04}/model")));
    assert_eq!(
        lines.len() as i64,
        ITERS,
        "one optimizer step per iteration"
    );
    let steps = crate::tensorboard::expected_from_metrics(&lines);
    crate::tensorboard::assert_run_equals(&read[0], &steps, "tb/update");
    let per_iter: Vec<(i64, &Value)> = sum_reports
        .iter()
        .map(|r| (r["iteration"].as_i64().unwrap(), &r["overall"]))
        .collect();
    crate::tensorboard::assert_report_scalars(&read[1], &per_iter, "tb/rollouts");
    // Each iteration's own report says the same as the summary.
    for (i, o) in &per_iter {
        let own = json(&dir.join(format!("iter-{i:04}/report/metrics.json")));
        assert_eq!(&own["reports"][0]["overall"], *o, "iteration {i}");
    }
    let per_eval: Vec<(i64, &Value)> = ev_reports
        .iter()
        .map(|r| (r["iteration"].as_i64().unwrap(), &r["overall"]))
        .collect();
    crate::tensorboard::assert_report_scalars(&read[2], &per_eval, "tb/eval");
}

/// verl: its Parquet format (prompt as chat messages, `reward_model.ground_truth`, `data_source`,
/// `extra_info`) needs no mapping; the reward is a `compute_score`.
#[test]
fn verl_dataset_and_compute_score_through_the_loop() {
    let wd = Workdir::new();
    let data = crate::fixtures()
        .join("data/verl.parquet")
        .display()
        .to_string();
    let cmd = format!(
        "VERIFIER_CMD=python3 {} my_rewards:compute_score",
        crate::own_data::adapter("verl_reward.py")
    );
    run_and_check(
        &wd,
        "verl",
        &[
            &format!("PROMPTS={data}"),
            &format!("EVAL_PROMPTS={data}"),
            &cmd,
        ],
        &["verl", "my_rewards:compute_score"],
    );
}

/// TRL: a JSON lines file whose prompt column is named `question` (the one mapping,
/// `--prompt-key question`), the label `solution` and another column `level` (one per row), both passed to a
/// batched TRL reward function as keyword lists.
#[test]
fn trl_dataset_and_reward_function_through_the_loop() {
    let wd = Workdir::new();
    let rows = |range: std::ops::Range<i32>| -> String {
        range
            .map(|i| {
                format!(
                    "{{\"question\": \"What is {i} + 2? Put it in <answer></answer>.\", \"solution\": \"{}\", \"level\": {}}}\n",
                    i + 2,
                    i
                )
            })
            .collect()
    };
    wd.write("train.jsonl", rows(0..5));
    wd.write("test.jsonl", rows(10..12));
    let cmd = format!(
        "VERIFIER_CMD=python3 {} my_rewards:correctness",
        crate::own_data::adapter("trl_reward.py")
    );
    run_and_check(
        &wd,
        "trl",
        &[
            "PROMPTS=train.jsonl",
            "EVAL_PROMPTS=test.jsonl",
            "PREPARE_FLAGS=--prompt-key question",
            &cmd,
        ],
        &["trl", "my_rewards:correctness"],
    );
}
