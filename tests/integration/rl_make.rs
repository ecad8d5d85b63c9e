//! `scripts/rl.mk` itself: what the loop keeps on disk.
use std::path::Path;
use std::process::Command;

use crate::support::rlmk::small_loop;
use crate::Workdir;

/// Run `make -f scripts/rl.mk` with the test binary as RLCR (nothing is rebuilt) and `vars`.
fn rl_make(wd: &Workdir, vars: &[impl AsRef<std::ffi::OsStr>]) -> std::process::Output {
    crate::support::rlmk::command(wd, vars)
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
    let vars = small_loop(4, 2, &["RUN=k", "KEEP_CHECKPOINTS=2", "loop"]);
    let o = rl_make(&wd, &vars);
    let log = crate::support::rlmk::log(&o);
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
    let vars = small_loop(2, 2, &["RUN=l", "LORA_RANK=4", "loop"]);
    let o = rl_make(&wd, &vars);
    let log = crate::support::rlmk::log(&o);
    assert!(o.status.success(), "{log}");
    assert!(log.contains("--lora-rank 4"), "{log}");
    for i in 1..=2 {
        let m = wd.path(&format!("l/iter-{i:04}/model"));
        assert!(m.join("adapter_model.safetensors").exists(), "{i}: {log}");
        assert!(!m.join("model.safetensors").exists(), "{i}: full weights");
        let cfg: serde_json::Value = crate::support::json::read(m.join("adapter_config.json"));
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

/// The processes below `pid` (from /proc), depth first.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = vec![];
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for c in children
        .split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
    {
        out.push(c);
        out.extend(descendants(c));
    }
    out
}

/// The ids of a prompts table, in its order.
fn prompt_ids(p: &Path) -> Vec<String> {
    let b = crate::support::table::read(p);
    let ids = rlcr::table::cols::str_col(&b, "prompts", "prompt_id").unwrap();
    (0..b.num_rows())
        .map(|i| ids.value(i).to_string())
        .collect()
}

/// `PROMPTS=FILE` (a template and a label column mapped with PREPARE_FLAGS, the reward from a
/// verl compute_score through VERIFIER_CMD): two epochs of a 5-prompt file at 2 prompts per
/// iteration (draws of 2, 2 and 1 per epoch), every prompt drawn exactly once per epoch and the
/// second epoch in another order; EVAL_PROMPTS evaluated every 3 iterations (the starting policy,
/// iterations 3 and 6) with accuracy, ECE, Brier and AUROC in the evaluation report. A run killed
/// in its fourth iteration resumes: the draws written before the kill are untouched and every
/// iteration draws what an uninterrupted run draws.
#[test]
fn dataset_loop_draws_each_prompt_once_per_epoch_and_resumes() {
    let wd = Workdir::new();
    let mut train = String::new();
    for i in 0..5 {
        train.push_str(&format!(
            "{{\"question\": \"What is {i} + 1?\", \"answer\": \"{}\", \"level\": {i}}}\n",
            i + 1
        ));
    }
    wd.write("train.jsonl", train);
    wd.write(
        "test.jsonl",
        "{\"question\": \"What is 7 + 1?\", \"answer\": \"8\"}\n{\"question\": \"What is 2 + 2?\", \"answer\": \"4\"}\n",
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let verifier = format!(
        "VERIFIER_CMD=python3 {} user_rewards:compute_score",
        root.join("scripts/rewards/verl_reward.py").display()
    );
    let vars = small_loop(
        6,
        1,
        &[
            "PROMPTS=train.jsonl",
            "EVAL_PROMPTS=test.jsonl",
            "EVAL_EVERY=3",
            "EVAL_G_A=1",
            "EVAL_G_C=1",
            "PREPARE_FLAGS=--input-template '{question} Put the answer in <answer></answer>.' --label-key answer",
            "SHUFFLE_SEED=11",
            verifier.as_str(),
        ],
    );
    let make = |run: &str, targets: &[&str]| {
        let mut c = crate::support::rlmk::command(&wd, &[&format!("RUN={run}")]);
        c.args(&vars)
            .args(targets)
            .env("PYTHONPATH", root.join("fixtures/rewards"));
        c
    };
    let prompts = |run: &str, i: u32| wd.path(&format!("{run}/iter-{i:04}/prompts.parquet"));

    // killed in the fourth iteration (its prompts drawn, iteration 3 updating or later)
    let mut child = make("d", &["summary"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("make runs");
    let t = std::time::Instant::now();
    while !prompts("d", 4).exists() {
        assert!(child.try_wait().unwrap().is_none(), "make stopped early");
        assert!(t.elapsed().as_secs() < 600, "iteration 4 never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "make finished before the kill"
    );
    // make and every process it started, by pid (children first listed, parent killed first)
    let pids = descendants(child.id());
    let status = Command::new("kill")
        .arg("-KILL")
        .arg(child.id().to_string())
        .args(pids.iter().map(|p| p.to_string()))
        .status()
        .unwrap();
    assert!(status.success() || !pids.is_empty());
    let _ = child.wait();
    let before: Vec<(u32, Vec<u8>)> = (1..=6)
        .filter(|&i| prompts("d", i).exists())
        .map(|i| (i, std::fs::read(prompts("d", i)).unwrap()))
        .collect();
    assert!(before.len() >= 4);

    let o = make("d", &["summary"]).output().unwrap();
    let log = crate::support::rlmk::log(&o);
    assert!(o.status.success(), "{log}");
    for (i, bytes) in &before {
        assert_eq!(
            &std::fs::read(prompts("d", *i)).unwrap(),
            bytes,
            "iteration {i} redrawn"
        );
    }
    // an uninterrupted run's draws (the prompts targets alone need no model)
    let targets: Vec<String> = (1..=6)
        .map(|i| format!("{}", prompts("fresh", i).display()))
        .collect();
    let t: Vec<&str> = targets.iter().map(String::as_str).collect();
    let o = make("fresh", &t).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let draws: Vec<Vec<String>> = (1..=6).map(|i| prompt_ids(&prompts("d", i))).collect();
    for (i, d) in draws.iter().enumerate() {
        assert_eq!(
            d,
            &prompt_ids(&prompts("fresh", i as u32 + 1)),
            "iteration {}",
            i + 1
        );
        assert_eq!(
            d.len(),
            if i % 3 == 2 { 1 } else { 2 },
            "iteration {}",
            i + 1
        );
    }
    let all: Vec<String> = {
        let mut v = prompt_ids(&wd.path("d/dataset.parquet"));
        v.sort();
        v
    };
    assert_eq!(all.len(), 5);
    let epoch = |k: usize| -> Vec<String> { draws[3 * k..3 * k + 3].concat() };
    for k in 0..2 {
        let mut e = epoch(k);
        e.sort();
        assert_eq!(e, all, "epoch {k}");
    }
    assert_ne!(
        epoch(0),
        epoch(1),
        "the second epoch repeats the first one's order"
    );

    // evaluations: the starting policy, iterations 3 and 6
    for i in [0, 3, 6] {
        assert!(
            wd.path(&format!("d/eval/iter-{i:04}/scored.parquet"))
                .exists(),
            "evaluation {i}: {log}"
        );
    }
    let m: serde_json::Value = crate::support::json::read(wd.path("d/eval/report/metrics.json"));
    let reports = m["reports"].as_array().unwrap();
    assert_eq!(reports.len(), 3);
    let its: Vec<&serde_json::Value> = reports.iter().map(|r| &r["iteration"]).collect();
    assert_eq!(its, [0, 3, 6], "evaluations against the training iteration");
    for r in reports {
        for k in ["accuracy", "ece", "brier", "auroc"] {
            assert!(r["overall"].get(k).is_some(), "{k} missing: {r}");
        }
    }
}

/// What the loop shows of RL, per iteration, through `make`: the held-in probe set (the same 4
/// prompts every iteration, answered greedily and at the loop's temperature) in each iteration's
/// report, the summary report and TensorBoard beside the sampled batch's accuracy; and per update
/// the rollout/trainer mismatch (sampler against trainer on the CPU: at rounding level, and
/// `MAX_MISMATCH=1e-4` would have stopped the loop otherwise) and the KL to the starting policy
/// (`REF_KL=1`, the default: 0 in iteration 1, whose policy is the starting one), and the answer
/// and confidence turns' parts of the first batch's gradient (`TURN_GRADS=1`, the default).
#[test]
fn loop_shows_held_in_accuracy_mismatch_and_kl_per_iteration() {
    let wd = Workdir::new();
    let vars = small_loop(
        2,
        2,
        &[
            "RUN=h",
            "HELDIN=4",
            "HELDIN_G_A=2",
            "MAX_MISMATCH=1e-4",
            "summary",
        ],
    );
    let o = rl_make(&wd, &vars);
    let log = crate::support::rlmk::log(&o);
    assert!(o.status.success(), "{log}");
    let rows = |p: &Path| crate::support::table::read(p).num_rows();
    assert_eq!(rows(&wd.path("h/heldin/prompts.parquet")), 4);
    for i in 1..=2 {
        let d = wd.path(&format!("h/iter-{i:04}/heldin"));
        assert_eq!(rows(&d.join("greedy.parquet")), 4, "{log}");
        assert_eq!(rows(&d.join("sampled.parquet")), 8, "{log}");
        let it: serde_json::Value =
            crate::support::json::read(wd.path(&format!("h/iter-{i:04}/report/metrics.json")));
        for k in ["greedy", "sampled"] {
            let h = &it["reports"][0]["held_in"][k];
            assert!(h["accuracy"].is_number(), "{it}");
        }
    }
    let m: serde_json::Value = crate::support::json::read(wd.path("h/report/metrics.json"));
    let calls = m["update_calls"].as_array().expect("update_calls");
    assert_eq!(calls.len(), 2, "{m}");
    for (i, c) in calls.iter().enumerate() {
        let mm = c["mismatch_logp_max"].as_f64().expect("mismatch measured");
        let rm = c["mismatch_ratio_max"].as_f64().expect("ratio measured");
        eprintln!(
            "iteration {}: rollout/trainer mismatch logp max {mm:e}, ratio max {rm:e}",
            i + 1
        );
        assert!(mm <= 1e-4 && rm <= 1e-4, "iteration {}: {c}", i + 1);
        assert!(c["ref_kl"].as_f64().expect("KL to the start") >= 0.0);
        // TURN_GRADS=1 (the default): the first batch's gradient split by turn; the RLCR loop's
        // confidence rows carry advantages, so their part is not 0.
        let ga = c["grad_answer_norm"]
            .as_f64()
            .expect("answers' part measured");
        let gc = c["grad_confidence_norm"]
            .as_f64()
            .expect("confidences' part measured");
        eprintln!(
            "iteration {}: gradient parts: answers {ga:.4}, confidences {gc:.4}",
            i + 1
        );
        assert!(ga >= 0.0 && gc >= 0.0, "iteration {}: {c}", i + 1);
    }
    assert!(calls[0]["ref_kl"].as_f64().unwrap() < 1e-6, "{}", calls[0]);
    for i in 0..2 {
        assert!(m["reports"][i]["held_in"]["greedy"]["accuracy"].is_number());
    }
    let page = std::fs::read_to_string(wd.path("h/report/report.md")).unwrap();
    assert!(page.contains("## Update diagnostics"), "{page}");
    assert!(
        page.contains("held-in greedy | held-in sampled |"),
        "{page}"
    );
    assert!(page.contains("KL to ref. | mismatch max |"), "{page}");
    assert!(
        page.contains("| grad answers | grad conf. | cos |"),
        "{page}"
    );
    // TensorBoard: the held-in accuracies in the rollouts run at steps 1 and 2, next to the
    // batch's accuracy; the mismatch and KL in the update run at each iteration's first step.
    let dirs = [wd.path("h/tb/rollouts"), wd.path("h/tb/update")];
    let refs: Vec<&Path> = dirs.iter().map(|d| d.as_path()).collect();
    let Some(runs) = crate::tensorboard::read_runs(&refs) else {
        return;
    };
    for tag in [
        "accuracy",
        "held_in/greedy/accuracy",
        "held_in/sampled/accuracy",
    ] {
        let steps: Vec<i64> = runs[0][tag].iter().map(|p| p.0).collect();
        assert_eq!(steps, vec![1, 2], "{tag}");
    }
    for tag in [
        "mismatch/logp_max",
        "mismatch/ratio_max",
        "ref_kl",
        "response_length",
        "grad/answer_norm",
        "grad/confidence_norm",
    ] {
        let steps: Vec<i64> = runs[1][tag].iter().map(|p| p.0).collect();
        assert_eq!(steps, vec![1, 2], "{tag}");
    }
}

/// `FILTER_G=4`: the warm start answers a 32-prompt pool 4 times each, and iteration 1 draws only
/// from the prompts whose answers were neither all right nor all wrong (each one's mean
/// `acc_reward` in the pool's scored table strictly between 0 and 1), none of the others.
#[test]
fn pass_rate_filter_feeds_the_loop_learnable_prompts() {
    let wd = Workdir::new();
    let first = wd.path("f/iter-0001/prompts.parquet");
    let o = rl_make(
        &wd,
        &[
            "RUN=f",
            "ITERS=1",
            "FILTER_G=4",
            "FILTER_POOL=32",
            "PROMPTS_PER_ITER=4",
            &first.display().to_string(),
        ],
    );
    assert!(o.status.success(), "{}", crate::support::rlmk::log(&o));
    let pool = prompt_ids(&wd.path("f/pool/prompts.parquet"));
    assert_eq!(pool.len(), 32);
    let b = crate::support::table::read(&wd.path("f/pool/scored.parquet"));
    let ids = rlcr::table::cols::str_col(&b, "scored", "prompt_id").unwrap();
    let acc = rlcr::table::cols::f32_col(&b, "scored", "acc_reward").unwrap();
    let mut rate: std::collections::HashMap<String, (f64, f64)> = Default::default();
    for i in 0..b.num_rows() {
        let r = rate.entry(ids.value(i).to_string()).or_default();
        r.0 += 1.0;
        r.1 += acc.value(i) as f64;
    }
    let learnable: Vec<String> = pool
        .iter()
        .filter(|id| {
            let (n, s) = rate[id.as_str()];
            assert_eq!(n, 4.0, "{id}: 4 answers");
            s > 0.0 && s < n
        })
        .cloned()
        .collect();
    assert!(
        !learnable.is_empty() && learnable.len() < pool.len(),
        "{} of {} learnable",
        learnable.len(),
        pool.len()
    );
    assert_eq!(prompt_ids(&wd.path("f/pool/learnable.parquet")), learnable);
    let drawn = prompt_ids(&first);
    assert_eq!(drawn.len(), 4.min(learnable.len()));
    assert!(drawn.iter().all(|id| learnable.contains(id)), "{drawn:?}");
}

/// `make -n TARGET` for SmolLM2's settings from the tiny fixture as the warm start (run `c`),
/// with `vars` besides: its printed commands, after checking that it succeeded.
fn smollm2_dry_run(wd: &Workdir, target: &str, vars: &[&str]) -> String {
    let warm = crate::fixtures().join("tiny-qwen2");
    let mut args = vec![
        "-n".to_string(),
        target.into(),
        "MODEL=smollm2".into(),
        format!("SMOL_DIR={}", wd.path("smol").display()),
        format!("WARM_START={}", warm.display()),
        "RUN=c".into(),
    ];
    args.extend(vars.iter().map(|v| v.to_string()));
    let o = crate::support::rlmk::command(wd, &args)
        .output()
        .expect("make runs");
    let log = crate::support::rlmk::log(&o);
    assert!(o.status.success(), "{log}");
    log
}

/// [`smollm2_dry_run`] of `compare`.
fn compare_dry_run(wd: &Workdir, vars: &[&str]) -> String {
    smollm2_dry_run(wd, "compare", vars)
}

/// `compare` hands the pass-rate filter's settings to both arms, the model's defaults included
/// (`MODEL=smollm2` sets `FILTER_G=8`, `FILTER_POOL=1024`, `FILTER_KEEP_DECIDED=0.25` and
/// `LAMBDA_CONF=10` in the makefile, which a sub-make would not see otherwise) or what the command
/// line sets instead: the arms' command lines, printed by `make -n`, carry them, the pool's filter
/// keeps the share of decided prompts, and the evaluation asks SmolLM2's 2 answers a problem.
#[test]
fn compare_passes_the_pass_rate_filter_to_its_arms() {
    let arm_lines = |log: &str| -> Vec<String> {
        let arms: Vec<String> = log
            .lines()
            .filter(|l| l.contains("RUN=rlvr") || l.contains("RUN=rlcr"))
            .map(str::to_string)
            .collect();
        assert_eq!(arms.len(), 2, "{log}");
        arms
    };
    let wd = Workdir::new();
    let log = compare_dry_run(&wd, &[]);
    for a in arm_lines(&log) {
        assert!(
            a.contains("FILTER_G=8")
                && a.contains("FILTER_POOL=1024")
                && a.contains("FILTER_KEEP_DECIDED=0.25")
                && a.contains("ITERS=12"),
            "{a}"
        );
        let lambda = if a.contains("RUN=rlcr") {
            "LAMBDA_CONF=10"
        } else {
            "LAMBDA_CONF=0"
        };
        assert!(a.contains(lambda), "{lambda}: {a}");
    }
    assert!(
        log.lines()
            .any(|l| l.contains("--pass-rates") && l.contains("--keep-decided 0.25")),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("generate-answers")
            && l.contains("eval-base")
            && l.contains("--num-answers 2 ")),
        "{log}"
    );
    let wd = Workdir::new();
    let log = compare_dry_run(
        &wd,
        &[
            "FILTER_POOL=512",
            "FILTER_KEEP_DECIDED=0.5",
            "LAMBDA_CONF=3",
        ],
    );
    for a in arm_lines(&log) {
        assert!(
            a.contains("FILTER_POOL=512") && a.contains("FILTER_KEEP_DECIDED=0.5"),
            "{a}"
        );
        assert!(
            !a.contains("RUN=rlcr") || a.contains("LAMBDA_CONF=3"),
            "{a}"
        );
    }
    assert!(
        log.lines()
            .any(|l| l.contains("--pass-rates") && l.contains("--keep-decided 0.5")),
        "{log}"
    );
}

/// `seeds` runs `compare` once per seed, each in its own run folder with its own `--seed`, then
/// one `report` over all of them with every arm labelled once per seed, in seed order (what
/// `report` reads as runs), into the run's `seeds/` folder.
#[test]
fn seeds_runs_compare_per_seed_and_reports_across_them() {
    let wd = Workdir::new();
    let log = smollm2_dry_run(&wd, "seeds", &["SEEDS=3 5"]);
    let runs = wd.root();
    for s in [3, 5] {
        let d = runs.join(format!("c-s{s}"));
        assert!(
            log.lines().any(|l| l.contains(&format!("--seed {s} "))
                && l.contains("report")
                && l.contains(&format!("{}/eval-base/scored.parquet", d.display()))),
            "seed {s}: {log}"
        );
    }
    let across = log
        .lines()
        .find(|l| l.contains(" report ") && l.matches("--input ").count() == 6)
        .unwrap_or_else(|| panic!("no report over both seeds: {log}"));
    let inputs: Vec<&str> = across
        .split("--input ")
        .skip(1)
        .map(|x| x.split_whitespace().next().unwrap_or(""))
        .collect();
    let want: Vec<String> = [3, 5]
        .iter()
        .flat_map(|s| {
            ["base", "rlvr", "rlcr"]
                .map(|a| format!("{a}={}/c-s{s}/eval-{a}/scored.parquet", runs.display()))
        })
        .collect();
    assert_eq!(inputs, want, "{across}");
    assert!(
        log.contains(&format!("-o {}/c/seeds", runs.display())),
        "{log}"
    );
}

/// `RLCR_LR` sets the RLCR arm's learning rate alone: the RLVR arm keeps `LR`.
#[test]
fn compare_gives_the_rlcr_arm_its_own_learning_rate() {
    let wd = Workdir::new();
    let log = compare_dry_run(&wd, &["ITERS=1", "RLCR_LR=1e-5"]);
    // `make -n` prints the arms' sub-makes without running them: run each printed line with
    // `-n` and read the update it would run (a variable given twice takes its last value).
    for (arm, lr) in [("rlvr", "3e-6"), ("rlcr", "1e-5")] {
        let lines: Vec<&str> = log.lines().collect();
        let start = lines
            .iter()
            .position(|l| l.contains("rl.mk") && l.contains(&format!(" RUN={arm} ")))
            .unwrap_or_else(|| panic!("no {arm} arm:\n{log}"));
        // The command goes on over the lines its recipe continues with `\`.
        let end = (start..lines.len())
            .find(|&i| !lines[i].ends_with('\\'))
            .unwrap_or(lines.len() - 1);
        let line = lines[start..=end].join("\n");
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{line} -n"))
            .current_dir(wd.path(""))
            .output()
            .expect("sh runs");
        let sub = crate::support::rlmk::log(&o);
        assert!(o.status.success(), "{arm}:\n{sub}");
        let updates: Vec<&str> = sub
            .lines()
            .filter(|l| l.contains(" update ") && l.contains(&format!("/{arm}/iter-0001/model")))
            .collect();
        assert_eq!(updates.len(), 1, "{arm}:\n{sub}");
        assert!(
            updates[0].contains(&format!("--lr {lr} ")),
            "{arm}: {}",
            updates[0]
        );
    }
}

/// `compare` judges the pass-rate pool once, in its own run folder, and both arms draw their
/// prompts from that one pool: they start from the same policy with the same seed, so a pool of
/// their own would be the same answers sampled twice. A larger `ITERS` on the finished run goes
/// on from its last iteration (the pool not judged again), and `make` again is then a no-op.
#[test]
fn compare_judges_one_pool_for_both_arms() {
    let wd = Workdir::new();
    let arms = ["rlvr", "rlcr"].map(|a| wd.path(&format!("c/{a}/report/metrics.json")));
    // From the tiny model's own warm start (the untrained fixture gets every pool prompt wrong).
    let o = rl_make(
        &wd,
        &[
            "RUN=c",
            "ITERS=1",
            "FILTER_G=4",
            "FILTER_POOL=32",
            "PROMPTS_PER_ITER=4",
            &arms[0].display().to_string(),
            &arms[1].display().to_string(),
        ],
    );
    let log = crate::support::rlmk::log(&o);
    assert!(o.status.success(), "{log}");
    let pool_runs = log
        .lines()
        .filter(|l| l.contains("generate-answers") && l.contains("pool/prompts.parquet"))
        .count();
    assert_eq!(pool_runs, 1, "the pool is answered once:\n{log}");
    for a in ["rlvr", "rlcr"] {
        assert!(
            !wd.path(&format!("c/{a}/pool")).exists(),
            "{a} judged a pool of its own"
        );
    }
    let learnable = prompt_ids(&wd.path("c/pool/learnable.parquet"));
    assert!(!learnable.is_empty());
    for a in ["rlvr", "rlcr"] {
        let drawn = prompt_ids(&wd.path(&format!("c/{a}/iter-0001/prompts.parquet")));
        assert_eq!(drawn.len(), 4.min(learnable.len()), "{a}");
        assert!(
            drawn.iter().all(|id| learnable.contains(id)),
            "{a}: {drawn:?}"
        );
    }

    let more = |iters: &str| {
        let vars = [
            "RUN=c".to_string(),
            format!("ITERS={iters}"),
            "FILTER_G=4".into(),
            "FILTER_POOL=32".into(),
            "PROMPTS_PER_ITER=4".into(),
            arms[0].display().to_string(),
            arms[1].display().to_string(),
        ];
        let o = rl_make(&wd, &vars);
        let log = crate::support::rlmk::log(&o);
        assert!(o.status.success(), "{log}");
        // The stages run (the sub-makes' own command lines name the binary too).
        let stages: Vec<String> = log
            .lines()
            .filter(|l| l.contains(env!("CARGO_BIN_EXE_rlcr")) && !l.contains("rl.mk"))
            .map(str::to_string)
            .collect();
        (log, stages)
    };
    let (log, stages) = more("2");
    for a in ["rlvr", "rlcr"] {
        let it = wd.path(&format!("c/{a}/iter-0002"));
        assert!(it.join("model/config.json").exists(), "{a}:\n{log}");
        assert!(
            stages.iter().any(|l| l.contains(&format!(
                " update --model {}",
                wd.path(&format!("c/{a}/iter-0001/model")).display()
            ))),
            "{a}: iteration 2 does not start from iteration 1:\n{log}"
        );
    }
    assert!(
        !stages.iter().any(|l| l.contains("pool/prompts.parquet")),
        "the pool was judged again:\n{log}"
    );
    assert!(
        !stages.iter().any(|l| l
            .split(" -o ")
            .nth(1)
            .is_some_and(|o| o.contains("iter-0001/"))),
        "iteration 1 ran again:\n{log}"
    );
    let (log, stages) = more("2");
    assert!(stages.is_empty(), "make again re-ran a stage:\n{log}");
}
