//! The loop learns: N iterations of the real RLCR loop on the embedded default (the tiny Qwen2
//! fixture after an `rlcr sft` warm start), stage by stage through the real binary, exactly as
//! `scripts/rl.mk` chains them: prepare → generate-answers → generate-confidence → score →
//! advantage → update, then `report` over every iteration's scored table.
//!
//! Configuration: the main job's (`scripts/rl.mk` defaults): a mixed-difficulty countdown task
//! (two or three numbers in 1..3, targets up to 9, `--prompt-style short`: the difficulty, how many
//! numbers, is in the prompt), the warm start and every iteration drawing `--split train`; warm
//! start of 12 epochs over 256 format examples at lr 1e-2 whose stated confidences depend on the
//! number count (`prepare --sft-confidence 2=0.6-0.9,3=0.0-0.3`: uniform tenths in those ranges,
//! whether the example's answer is right or not), the short confidence question `Confidence?`,
//! 20 iterations of 16 prompts × 4 answers × 2 confidences, at most 24 new tokens, `score
//! --format-weight 0.1` (a well-formed answer earns 0.1), `advantage --estimator rlcr --norm-conf
//! mean`, `update --lr 1e-3 --epochs 2 --mini-batches 4 --micro-batch 16` (8 optimizer steps per
//! iteration).
//!
//! What is compared: the warm start and the last policy, sampled with the same seed on one
//! evaluation folder of three parts: 160 new prompts of the training distribution (judged), 48
//! problems held out of training (`--split heldout`: a hash of the sorted numbers and the target;
//! the shape has 14 + 47 training problems and 2 + 11 held-out ones) and 48 out-of-domain ones
//! (`--split hard`, four numbers). `report` breaks them out by data_source (`countdown`,
//! `countdown-heldout`, `countdown-hard`). The in-loop curve is printed, not asserted.
//!
//! Five seeds (0–4) of RLCR run in parallel with a sixth loop, the RLVR control (seed 0,
//! `--lambda-conf 0`: confidences sampled, never trained), whose warm start is the same model
//! (same seed, deterministic `sft`); the test prints the base / RLVR / RLCR comparison of seed 0
//! (`report` with labelled inputs). The check judges the five RLCR seeds' **means** (`judge`): a
//! single seed's trajectory follows the float rounding of the matrix kernels, which differs
//! between CPUs (seed 0 measured Brier +0.040 on a Zen 3 and +0.003 on a Zen 5).
//!
//! Measured on this configuration (8b754cc, rlcr's GEMM and attention, Xeon, 2026-11-24; 640
//! answers and 1280 confidences per seed on the training distribution; 7.5 min wall, 6.6 min user
//! for the six loops at load 22–25; a separate sweep harness gave the same digits):
//!
//! | seed | accuracy | Brier | gap abs(conf − acc) | AUROC | format ok | held out: acc / ECE / AUROC | out of domain: acc / ECE |
//! |---|---|---|---|---|---|---|---|
//! | 0 | 0.181 → 0.394 | 0.242 → 0.206 | 0.244 → 0.022 | 0.697 → 0.700 | 1.00 / 0.99 | 0.010 / 0.358 / 0.327 | 0.000 / 0.154 |
//! | 1 | 0.136 → 0.350 | 0.256 → 0.196 | 0.288 → 0.017 | 0.691 → 0.728 | 0.99 / 0.97 | 0.000 / 0.246 / - | 0.005 / 0.022 |
//! | 2 | 0.153 → 0.289 | 0.270 → 0.216 | 0.288 → 0.132 | 0.693 → 0.625 | 1.00 / 0.99 | 0.047 / 0.133 / 0.547 | 0.000 / 0.098 |
//! | 3 | 0.145 → 0.348 | 0.286 → 0.175 | 0.320 → 0.019 | 0.691 → 0.762 | 0.99 / 0.99 | 0.005 / 0.315 / 0.724 | 0.000 / 0.343 |
//! | 4 | 0.120 → 0.330 | 0.275 → 0.209 | 0.325 → 0.071 | 0.687 → 0.691 | 0.99 / 0.98 | 0.000 / 0.368 / - | 0.000 / 0.396 |
//!
//! Means: accuracy +0.195, Brier +0.065, gap narrowing 0.241, answers / confidences well formed
//! 0.99 / 0.98, AUROC of the last policies 0.701 (warm starts 0.692; seed SD 0.051, five-seed SE
//! 0.023). The tiny model's goal, AUROC ≥ 0.65 on three seeds, holds on four of the five
//! (seeds 0, 1, 3, 4: 0.700 / 0.728 / 0.762 / 0.691; seed 2 0.625; `RLCR_LEARNING_SEEDS=5,6,7`
//! through the sweep harness: 0.653 / 0.659 / 0.741). The warm start carries the
//! ordering (its examples' confidences follow the number count, not whether they are right:
//! AUROC 0.69–0.70 before any RL step, with ECE 0.28–0.34); the loop calibrates the levels (ECE
//! 0.06–0.13) and keeps the ordering. The RLVR control (same warm start, `--lambda-conf 0`) keeps
//! its answers well formed now that they earn the format reward (0.98; accuracy 0.322 on seed 0)
//! and its untrained confidence keeps the warm start's ordering as well (AUROC 0.709, ECE 0.144,
//! 0.79 parsed; RLCR 0.700, 0.055, 0.99): on this model RLCR's gain over RLVR is calibration and
//! accuracy, not discrimination. With the warm start `2=0.5-0.9,3=0.1-0.5` the same
//! test gave 0.653 / 0.660 / 0.666 / 0.569 / 0.752 (mean 0.660; accuracy +0.134, Brier +0.048).
//!
//! Why the warm start states difficulty-aware confidences and the format earns 0.1: with uniform
//! warm-start confidences 0.1–0.9 and no format reward the same test gave, on gemm's AVX-512
//! kernels, accuracy 0.094 → 0.336 / 0.163 → 0.314 / 0.123 → 0.250 / 0.144 → 0.244 / 0.128 →
//! 0.239, AUROC 0.608 / 0.732 / 0.533 / 0.481 / 0.509 (means: accuracy +0.146, Brier +0.098, gap
//! narrowing 0.264, answers well formed 0.90, AUROC 0.573, warm starts 0.552; seed SD ≈ 0.10); on
//! rlcr's GEMM and attention means accuracy +0.096, Brier +0.085, gap narrowing 0.182, formats
//! 0.84 / 0.90, AUROC 0.537; with the fused LM head as well: accuracy +0.138, Brier +0.084, gap
//! narrowing 0.231, formats 0.93 / 0.98, AUROC 0.547. Why the fused LM head is the default: on the
//! current defaults (inert rows skipped) it passes with more room than the composite head (360d504
//! with the fused head: AUROC 0.688 / 0.674 / 0.710 / 0.746 / 0.757, mean 0.715; accuracy +0.197,
//! Brier +0.065; the composite head at c5c6071: 0.691, +0.176, +0.056).
//!
//! Margins: (1) mean accuracy gain ≥ 0.05, (2) mean Brier gain ≥ 0.02, (3) mean narrowing of
//! |mean confidence − accuracy| ≥ 0.05, (4) ≥ 70 % well-formed answers and confidences on average
//! and ≥ 50 % on every seed — kept from the two-number task (where path means were accuracy
//! +0.155–0.259, Brier +0.048–0.072, narrowing 0.20–0.23); on the table above the means sit 9.7,
//! 3.6 and 7.7 five-seed SEs above them. (5) The mean AUROC of the last policies ≥ 0.67, chosen
//! from the five seeds above: 1.2 SEs (0.027) below their mean of 0.701, the rule that chose 0.52
//! from the previous defaults' 0.573, and above 0.5 (confidence no better than chance). The
//! previous defaults fail it (0.573 and 0.537); `learning_judge_margins` checks both by hand.
//! With the uniform warm start, a sweep of ten settings (confidence weight ×4, G_c = 4, a warm
//! start on correct examples only, a hotter confidence turn, an entropy bonus, a two-to-four-number
//! mix, 40 iterations, the tree's prompt-level scaling `--conf-norm answer+prompt`) and exploration
//! bonuses on the confidence turn alone (`update --conf-value-entropy-coef 0.002`, 40 iterations:
//! 0.641 / 0.662 / 0.638 on seeds 0–2) fell short of 0.65 on three seeds: the ordering has to come
//! from the warm start. `learning_conf_value_entropy_report` reruns the bonus configuration (the
//! uniform warm start, no format reward).
//!
//! What the held-out split shows: the tiny model learns the training problems, not arithmetic.
//! On problems held out of training its accuracy is 0.00–0.05 after the loop, on four numbers 0.
//! With the uniform warm start RLCR lowered its confidence there (mean ≈ 0.2), so calibration
//! transferred as "say low"; with the difficulty-aware one it states there what it learned for
//! seen problems of the same size (ECE 0.13–0.37, held-out AUROC 0.33–0.72): the difficulty
//! read off the prompt is the wrong signal on problems it has not memorised. On the previous
//! defaults the RLVR control lost the answer format by iteration 4 (accuracy 0, well-formed
//! answers 0.00); the format reward fixed that. Judging on held-out problems (the first attempt)
//! failed the accuracy margin for that reason (mean gain −0.032).
//!
//! The ablation of the per-answer normalisation (confidence rewards normalised over all answers of a prompt,
//! `--estimator grpo`, instead of per answer) is `learning_ablation_pooled_confidence_norm`,
//! `#[ignore]`d: it reports, it does not judge. The controls (`--lr 0`, `--lambda-ans 0`) are
//! `learning_controls_fail_the_check`, `#[ignore]`d. `RLCR_LEARNING_SEEDS=5,6,7` runs any of the
//! loops with other seeds.
//!
//! Filter: `cargo test --test integration learning_` (it is the slowest test of the suite).
use std::path::Path;

use crate::{fixtures, Workdir};

/// The task shape: two or three numbers in 1..3, targets up to 9 (the difficulty, how many
/// numbers, is in the prompt); training and the warm start draw `--split train`, the evaluation
/// the held-out problems and the out-of-domain bucket (four numbers), see the module doc.
const TASK: &[&str] = &[
    "--min-numbers",
    "2",
    "--max-numbers",
    "3",
    "--max-number",
    "3",
    "--max-target",
    "9",
    "--prompt-style",
    "short",
];

/// Settings of one loop (the figures in the module doc were measured with these).
#[derive(Clone, Copy)]
struct LoopConfig {
    seed: u64,
    sft_count: usize,
    sft_epochs: usize,
    sft_lr: &'static str,
    iters: usize,
    prompts: usize,
    g_a: usize,
    g_c: usize,
    max_new: usize,
    lr: &'static str,
    epochs: usize,
    mini_batches: usize,
    estimator: &'static str,
    /// `advantage --lambda-ans` (weight of the answers' advantages; 1 by default).
    lambda_ans: &'static str,
    /// `advantage --lambda-conf` (weight of the confidences' advantages; 0 = RLVR: confidences
    /// sampled, never trained).
    lambda_conf: &'static str,
    /// `update --conf-value-entropy-coef` (entropy bonus over the digits at the confidence value
    /// position; "0" = off, as in the RLVR control).
    conf_value_entropy: &'static str,
    /// `prepare --sft-confidence` of the warm start's examples ("" = the uniform 0.1–0.9).
    sft_confidence: &'static str,
    /// `score --format-weight` in the loop (reward of a well-formed answer; "0" = none).
    format_weight: &'static str,
    confidence_prompt: &'static str,
    /// Evaluation prompts drawn anew from the training distribution (`--split train`), judged.
    eval_prompts: usize,
    /// Held-out evaluation prompts (`--split heldout`: problems training never sees), reported.
    eval_heldout_prompts: usize,
    /// `update --lora-rank` (alpha 16, every projection) in every iteration; "" = every weight.
    lora_rank: &'static str,
    /// Out-of-domain evaluation prompts (`--split hard`: four numbers).
    eval_hard_prompts: usize,
}

/// Least accuracy rise (warm start → last policy, paired evaluation); see the module doc.
const ACC_MARGIN: f64 = 0.05;
/// Least Brier improvement; see the module doc.
const BRIER_MARGIN: f64 = 0.02;
/// Least narrowing of |mean confidence − accuracy|; see the module doc.
const GAP_MARGIN: f64 = 0.05;
/// Least fraction of well-formed answers and of well-formed confidences after the loop, on average
/// over the seeds.
const FORMAT_FLOOR: f64 = 0.70;
/// Least fraction of well-formed answers and of well-formed confidences of every seed's last policy.
const FORMAT_FLOOR_EACH: f64 = 0.50;
/// Least mean AUROC of the last policies (training distribution); see the module doc.
const AUROC_MARGIN: f64 = 0.67;

/// Seed of the held-out evaluation prompts (plus the loop's seed); far from the iterations' seeds.
const EVAL_SEED: u64 = 777_777;

const DEFAULT: LoopConfig = LoopConfig {
    seed: 0,
    sft_count: 256,
    sft_epochs: 12,
    sft_lr: "1e-2",
    iters: 20,
    prompts: 16,
    g_a: 4,
    g_c: 2,
    max_new: 24,
    lr: "1e-3",
    epochs: 2,
    mini_batches: 4,
    estimator: "rlcr",
    lambda_ans: "1",
    lambda_conf: "1",
    conf_value_entropy: "0",
    sft_confidence: "2=0.6-0.9,3=0.0-0.3",
    format_weight: "0.1",
    confidence_prompt: "Confidence?",
    eval_prompts: 160,
    eval_heldout_prompts: 48,
    eval_hard_prompts: 48,
    lora_rank: "",
};

/// Seeds the check runs (in parallel): `RLCR_LEARNING_SEEDS=0,1,2,3,4` to run others.
const SEEDS: &[u64] = &[0, 1, 2, 3, 4];

/// The seeds of `RLCR_LEARNING_SEEDS` (comma-separated), or [`SEEDS`].
fn seeds() -> Vec<u64> {
    match std::env::var("RLCR_LEARNING_SEEDS") {
        Ok(v) => v
            .split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .expect("RLCR_LEARNING_SEEDS is a comma-separated list of integers")
            })
            .collect(),
        Err(_) => SEEDS.to_vec(),
    }
}

/// Per-iteration figures of the summary report.
#[derive(Debug)]
struct Curve {
    accuracy: Vec<f64>,
    brier: Vec<f64>,
    mean_confidence: Vec<f64>,
    ece: Vec<f64>,
    format_answers: Vec<f64>,
    format_confidences: Vec<f64>,
    auroc: Vec<Option<f64>>,
}

fn s(x: impl ToString) -> String {
    x.to_string()
}

/// Runs the binary with the global flags `--seed SEED -q` in front.
struct Runner<'a> {
    wd: &'a Workdir,
    seed: u64,
}

impl Runner<'_> {
    fn run(&self, seed: u64, args: &[String]) {
        let mut all = vec![s("--seed"), s(seed), s("-q")];
        all.extend(args.iter().cloned());
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        self.wd.run(&refs);
    }

    fn stage(&self, args: &[String]) {
        self.run(self.seed, args)
    }

    fn path(&self, p: &str) -> String {
        self.wd.path(p).to_string_lossy().to_string()
    }

    /// `prepare --from countdown-synth` with the test's task shape, tasks of `split`.
    fn prepare(&self, seed: u64, count: usize, split: &str, extra: &[String], out: &str) {
        let mut a = vec![s("prepare"), s("--from"), s("countdown-synth")];
        a.extend([s("--count"), s(count), s("--split"), s(split)]);
        a.extend(TASK.iter().map(s));
        a.extend(extra.iter().cloned());
        a.extend([s("-o"), self.path(out)]);
        self.run(seed, &a);
    }

    /// Both sampling turns and the score of one policy on one prompts table, in folder `dir`.
    fn rollouts(&self, c: &LoopConfig, policy: &str, prompts: &str, dir: &str) -> String {
        let f = |name: &str| self.path(&format!("{dir}/{name}"));
        let sampling = |n_flag: &str, n: usize| {
            vec![
                s(n_flag),
                s(n),
                s("--max-new-tokens"),
                s(c.max_new),
                s("--temperature"),
                s("1.0"),
                s("--system-prompt"),
                s(""),
            ]
        };
        let mut a = vec![s("generate-answers"), s("--model"), s(policy)];
        a.extend([s("--input"), s(prompts), s("-o"), f("answers.parquet")]);
        a.extend(sampling("--num-answers", c.g_a));
        self.stage(&a);
        let mut a = vec![s("generate-confidence"), s("--model"), s(policy)];
        a.extend([s("--confidence-prompt"), s(c.confidence_prompt)]);
        a.extend([s("--input"), f("answers.parquet")]);
        a.extend([s("-o"), f("trajectory.parquet")]);
        a.extend(sampling("--num-confidences", c.g_c));
        self.stage(&a);
        let mut score = vec![
            s("score"),
            s("--input"),
            f("trajectory.parquet"),
            s("-o"),
            f("scored.parquet"),
            s("--verifier"),
            s("countdown"),
        ];
        if c.format_weight != "0" {
            score.extend([s("--format-weight"), s(c.format_weight)]);
        }
        self.stage(&score);
        f("scored.parquet")
    }

    /// `report` over scored tables; returns its metrics.json.
    fn report(&self, scored: &[String], dir: &str) -> std::path::PathBuf {
        let mut a = vec![s("report")];
        for f in scored {
            a.extend([s("--input"), f.clone()]);
        }
        a.extend([s("-o"), self.path(dir)]);
        self.stage(&a);
        self.wd.path(&format!("{dir}/metrics.json"))
    }
}

/// What one loop produced: the in-loop curve (each iteration's own rollouts, new prompts every
/// iteration) and the paired evaluation of the warm start and the last policy on one held-out
/// prompts table (same prompts, same sampling seed).
struct Outcome {
    curve: Curve,
    /// New draws of the training distribution (judged).
    eval: Curve,
    /// Problems held out of training.
    eval_heldout: Curve,
    /// Out-of-domain bucket.
    eval_hard: Curve,
    /// The evaluation's scored tables (warm start, last policy).
    scored: Vec<String>,
}

/// Run the whole loop in `wd`.
fn run_loop(wd: &Workdir, c: &LoopConfig) -> Outcome {
    let r = Runner { wd, seed: c.seed };
    let tiny = fixtures().join("tiny-qwen2").to_string_lossy().to_string();

    // Supervised warm start on format examples with known solutions.
    let mut sft = vec![
        s("--sft"),
        s("--system-prompt"),
        s(""),
        s("--confidence-prompt"),
        s(c.confidence_prompt),
    ];
    if !c.sft_confidence.is_empty() {
        sft.extend([s("--sft-confidence"), s(c.sft_confidence)]);
    }
    r.prepare(c.seed, c.sft_count, "train", &sft, "sft.parquet");
    r.stage(&[
        s("sft"),
        s("--model"),
        tiny,
        s("--input"),
        r.path("sft.parquet"),
        s("-o"),
        r.path("sft"),
        s("--lr"),
        s(c.sft_lr),
        s("--epochs"),
        s(c.sft_epochs),
    ]);

    let mut policy = r.path("sft");
    let mut scored = Vec::new();
    for i in 1..=c.iters {
        let d = format!("iter-{i:04}");
        std::fs::create_dir_all(wd.path(&d)).expect("iteration folder");
        let f = |name: &str| r.path(&format!("{d}/{name}"));
        // Each iteration draws new prompts (rl.mk: seed = iteration + 1000 * SEED).
        r.prepare(
            i as u64 + 1000 * c.seed,
            c.prompts,
            "train",
            &[],
            &format!("{d}/prompts.parquet"),
        );
        let sc = r.rollouts(c, &policy, &f("prompts.parquet"), &d);
        r.stage(&[
            s("advantage"),
            s("--input"),
            sc.clone(),
            s("-o"),
            f("train.parquet"),
            s("--estimator"),
            s(c.estimator),
            s("--norm-conf"),
            s("mean"),
            s("--lambda-ans"),
            s(c.lambda_ans),
            s("--lambda-conf"),
            s(c.lambda_conf),
        ]);
        let mut update = vec![
            s("update"),
            s("--model"),
            policy.clone(),
            s("--input"),
            f("train.parquet"),
            s("-o"),
            f("model"),
            s("--lr"),
            s(c.lr),
            s("--epochs"),
            s(c.epochs),
            s("--mini-batches"),
            s(c.mini_batches),
            s("--micro-batch"),
            s("16"),
            s("--loss-agg"),
            s("token-mean"),
            s("--grad-clip"),
            s("1.0"),
            s("--resume"),
            s("auto"),
        ];
        if c.conf_value_entropy != "0" {
            update.extend([s("--conf-value-entropy-coef"), s(c.conf_value_entropy)]);
        }
        if !c.lora_rank.is_empty() {
            update.extend([s("--lora-rank"), s(c.lora_rank), s("--lora-alpha"), s("16")]);
        }
        r.stage(&update);
        scored.push(sc);
        policy = f("model");
    }
    let curve = read_curve(&r.report(&scored, "report"), None);

    // Paired evaluation: the warm start and the last policy on the same new prompts (one
    // folder, three parts: new draws of the training distribution, judged; problems held out of
    // training; the out-of-domain bucket).
    std::fs::create_dir_all(wd.path("eval-prompts")).expect("eval prompts folder");
    for (split, n, file) in [
        ("train", c.eval_prompts, "1-train"),
        ("heldout", c.eval_heldout_prompts, "2-heldout"),
        ("hard", c.eval_hard_prompts, "3-hard"),
    ] {
        r.prepare(
            EVAL_SEED + c.seed,
            n,
            split,
            &[],
            &format!("eval-prompts/{file}.parquet"),
        );
    }
    let prompts = r.path("eval-prompts");
    let mut pair = Vec::new();
    for (name, p) in [("eval-start", r.path("sft")), ("eval-end", policy)] {
        std::fs::create_dir_all(wd.path(name)).expect("eval folder");
        pair.push(r.rollouts(c, &p, &prompts, name));
    }
    let file = r.report(&pair, "eval-report");
    Outcome {
        curve,
        eval: read_curve(&file, Some(IN_DOMAIN)),
        eval_heldout: read_curve(&file, Some(HELD_OUT)),
        eval_hard: read_curve(&file, Some(OUT_OF_DOMAIN)),
        scored: pair,
    }
}

/// The buckets (data_source) of the evaluation: new draws of the training distribution, held-out
/// problems, out-of-domain problems.
const IN_DOMAIN: &str = "countdown";
const HELD_OUT: &str = "countdown-heldout";
const OUT_OF_DOMAIN: &str = "countdown-hard";

/// One point per report of `file`: all rows, or the rows of one data_source.
fn read_curve(file: &Path, bucket: Option<&str>) -> Curve {
    let text = std::fs::read_to_string(file).expect("metrics.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("metrics.json is JSON");
    let reports = v["reports"].as_array().expect("reports");
    let m = |r: &serde_json::Value| -> serde_json::Value {
        match bucket {
            None => r["overall"].clone(),
            Some(b) => r["per_source"][b].clone(),
        }
    };
    let col = |key: &str| -> Vec<f64> {
        reports
            .iter()
            .map(|r| m(r)[key].as_f64().expect("a number"))
            .collect()
    };
    Curve {
        accuracy: col("accuracy"),
        brier: col("brier"),
        mean_confidence: col("mean_confidence"),
        ece: col("ece"),
        format_answers: col("format_rate_answers"),
        format_confidences: col("format_rate_confidences"),
        auroc: reports.iter().map(|r| m(r)["auroc"].as_f64()).collect(),
    }
}

/// Paired figures of one seed: the warm start and the last policy on the same held-out prompts.
#[derive(Debug, Clone, Copy)]
struct SeedFigures {
    seed: u64,
    acc: (f64, f64),
    brier: (f64, f64),
    conf: (f64, f64),
    ece: (f64, f64),
    auroc: (Option<f64>, Option<f64>),
    /// Well-formed answers / confidences of the last policy.
    format: (f64, f64),
    /// The last policy on the held-out problems: accuracy, ECE, AUROC.
    heldout: (f64, f64, Option<f64>),
    /// The last policy on the out-of-domain bucket: accuracy, ECE, AUROC.
    hard: (f64, f64, Option<f64>),
}

impl SeedFigures {
    fn of(seed: u64, c: &Curve, heldout: &Curve, hard: &Curve) -> SeedFigures {
        SeedFigures {
            heldout: (heldout.accuracy[1], heldout.ece[1], heldout.auroc[1]),
            hard: (hard.accuracy[1], hard.ece[1], hard.auroc[1]),
            seed,
            acc: (c.accuracy[0], c.accuracy[1]),
            brier: (c.brier[0], c.brier[1]),
            conf: (c.mean_confidence[0], c.mean_confidence[1]),
            ece: (c.ece[0], c.ece[1]),
            auroc: (c.auroc[0], c.auroc[1]),
            format: (c.format_answers[1], c.format_confidences[1]),
        }
    }
    fn acc_gain(&self) -> f64 {
        self.acc.1 - self.acc.0
    }
    fn brier_gain(&self) -> f64 {
        self.brier.0 - self.brier.1
    }
    /// How much closer |mean confidence − accuracy| came.
    fn gap_narrowing(&self) -> f64 {
        (self.conf.0 - self.acc.0).abs() - (self.conf.1 - self.acc.1).abs()
    }
    /// The last policy's in-domain AUROC (0.5 when undefined: one class only).
    fn auroc_end(&self) -> f64 {
        self.auroc.1.unwrap_or(0.5)
    }
    /// One line of the table in docs/results.md.
    fn row(&self) -> String {
        let a = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
        format!(
            "| {} | {:.3} → {:.3} ({:+.3}) | {:.3} → {:.3} | {:.3} → {:.3} ({:+.3}) | {:.3} → {:.3} ({:+.3}) | {:.3} → {:.3} | {} → {} | {:.2} / {:.2} | {:.3} / {:.3} / {} | {:.3} / {:.3} / {} |",
            self.seed,
            self.acc.0,
            self.acc.1,
            self.acc_gain(),
            self.conf.0,
            self.conf.1,
            self.brier.0,
            self.brier.1,
            self.brier_gain(),
            (self.conf.0 - self.acc.0).abs(),
            (self.conf.1 - self.acc.1).abs(),
            -self.gap_narrowing(),
            self.ece.0,
            self.ece.1,
            a(self.auroc.0),
            a(self.auroc.1),
            self.format.0,
            self.format.1,
            self.heldout.0,
            self.heldout.1,
            a(self.heldout.2),
            self.hard.0,
            self.hard.1,
            a(self.hard.2),
        )
    }
}

/// The table the test prints (and docs/results.md copies).
fn table(figs: &[SeedFigures]) -> String {
    let mut t = String::from(
        "| seed | accuracy (gain) | mean confidence | Brier (gain) | gap abs(conf − acc) (change) | ECE | AUROC | format ok: answers / confidences | held out, last policy: accuracy / ECE / AUROC | out of domain, last policy: accuracy / ECE / AUROC |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for f in figs {
        t.push_str(&f.row());
        t.push('\n');
    }
    t
}

fn mean(figs: &[SeedFigures], f: impl Fn(&SeedFigures) -> f64) -> f64 {
    figs.iter().map(f).sum::<f64>() / figs.len() as f64
}

/// The verdict over several seeds: the mean accuracy gain, Brier gain, gap narrowing and format
/// rates reach their margins, and no seed's last policy has lost the format. Means, not single
/// seeds: one seed's trajectory follows the float rounding of the CPU's matrix kernels (the same
/// seed 0 gave Brier +0.040 on a Zen 3 and +0.003 on a Zen 5 or a Xeon), the mean of five moves
/// far less (see the module doc for the spread that chose the margins).
fn judge(figs: &[SeedFigures]) -> Result<(), String> {
    if figs.is_empty() {
        return Err("no seeds".into());
    }
    let mut why = Vec::new();
    let acc = mean(figs, SeedFigures::acc_gain);
    if acc < ACC_MARGIN {
        why.push(format!("mean accuracy gain {acc:.3} < {ACC_MARGIN}"));
    }
    let brier = mean(figs, SeedFigures::brier_gain);
    if brier < BRIER_MARGIN {
        why.push(format!("mean Brier gain {brier:.3} < {BRIER_MARGIN}"));
    }
    let gap = mean(figs, SeedFigures::gap_narrowing);
    if gap < GAP_MARGIN {
        why.push(format!(
            "mean narrowing of abs(confidence − accuracy) {gap:.3} < {GAP_MARGIN}"
        ));
    }
    let auroc = mean(figs, SeedFigures::auroc_end);
    if auroc < AUROC_MARGIN {
        why.push(format!(
            "mean AUROC of the last policies {auroc:.3} < {AUROC_MARGIN}"
        ));
    }
    for (what, rate) in [
        ("answers", mean(figs, |f| f.format.0)),
        ("confidences", mean(figs, |f| f.format.1)),
    ] {
        if rate < FORMAT_FLOOR {
            why.push(format!(
                "on average only {rate:.3} of the last policies' {what} are well formed (< {FORMAT_FLOOR})"
            ));
        }
    }
    for f in figs {
        for (what, rate) in [("answers", f.format.0), ("confidences", f.format.1)] {
            if rate < FORMAT_FLOOR_EACH {
                why.push(format!(
                    "seed {}: only {rate:.3} of the last policy's {what} are well formed (< {FORMAT_FLOOR_EACH})",
                    f.seed
                ));
            }
        }
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why.join("; "))
    }
}

/// Runs the loop of `c` for every seed, and the RLVR control (`--lambda-conf 0`) on the first
/// seed, all in parallel (each its own folder; the control's warm start is the same model as its
/// seed's RLCR warm start: same seed, same examples, deterministic `sft`). Returns the RLCR
/// figures and the control's comparison table (base / RLVR / RLCR, `report` with labelled inputs).
fn run_seeds(c: &LoopConfig, seeds: &[u64]) -> (Vec<SeedFigures>, String) {
    let mut jobs: Vec<LoopConfig> = seeds
        .iter()
        .map(|&seed| LoopConfig { seed, ..*c })
        .collect();
    if let Some(&first) = seeds.first() {
        jobs.push(LoopConfig {
            seed: first,
            lambda_conf: "0",
            conf_value_entropy: "0",
            ..*c
        });
    }
    let done: Vec<(LoopConfig, Workdir, Outcome)> = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|&c| {
                scope.spawn(move || {
                    let wd = Workdir::new();
                    let o = run_loop(&wd, &c);
                    assert_eq!(o.curve.accuracy.len(), c.iters);
                    assert_eq!(o.eval.accuracy.len(), 2);
                    eprintln!(
                        "learning (seed {}, lambda-conf {}): in-loop curve {:?}\nevaluation, training distribution (start, end) {:?}\nheld out {:?}\nout of domain {:?}",
                        c.seed, c.lambda_conf, o.curve, o.eval, o.eval_heldout, o.eval_hard
                    );
                    (c, wd, o)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .expect("a seed's loop panicked (its message is above)")
            })
            .collect()
    });
    let figs = done
        .iter()
        .filter(|(j, _, _)| j.lambda_conf != "0")
        .map(|(j, _, o)| SeedFigures::of(j.seed, &o.eval, &o.eval_heldout, &o.eval_hard))
        .collect();
    let control = match (
        done.iter().find(|(j, _, _)| j.lambda_conf != "0"),
        done.iter().find(|(j, _, _)| j.lambda_conf == "0"),
    ) {
        (Some((j, wd, rlcr)), Some((_, _, rlvr))) => {
            let r = Runner { wd, seed: j.seed };
            let out = r.path("comparison");
            r.stage(&[
                s("report"),
                s("--input"),
                format!("base={}", rlcr.scored[0]),
                s("--input"),
                format!("rlvr={}", rlvr.scored[1]),
                s("--input"),
                format!("rlcr={}", rlcr.scored[1]),
                s("--examples"),
                s("0"),
                s("-o"),
                out.clone(),
            ]);
            std::fs::read_to_string(wd.path("comparison/comparison.md")).expect("comparison.md")
        }
        _ => String::new(),
    };
    (figs, control)
}

#[test]
fn learning_rlcr_loop_raises_accuracy_and_improves_brier() {
    let seeds = seeds();
    let (figs, control) = run_seeds(&DEFAULT, &seeds);
    let t = table(&figs);
    eprintln!(
        "learning: seeds {seeds:?}\n{t}\ncontrol (seed {}): base / RLVR / RLCR\n{control}",
        seeds[0]
    );
    if let Err(why) = judge(&figs) {
        panic!("the loop did not learn: {why}\n{t}");
    }
}

/// The controls of the check: a loop that does not learn (`--lr 0`: the policy never changes) and
/// one that games the reward (`--lambda-ans 0`: only confidences are trained, accuracy collapses)
/// must both be judged failures. Slow (two more sets of loops), so run by hand.
#[test]
#[ignore = "controls of the learning check (several minutes): cargo test --test integration learning_controls -- --ignored --nocapture"]
fn learning_controls_fail_the_check() {
    let seeds = seeds();
    for (name, c) in [
        ("lr 0", LoopConfig { lr: "0", ..DEFAULT }),
        (
            "lambda-ans 0",
            LoopConfig {
                lambda_ans: "0",
                ..DEFAULT
            },
        ),
    ] {
        let (figs, _) = run_seeds(&c, &seeds);
        let t = table(&figs);
        let verdict = judge(&figs);
        eprintln!("control {name}: {verdict:?}\n{t}");
        assert!(
            verdict.is_err(),
            "control {name} passed the learning check:\n{t}"
        );
    }
}

#[test]
fn learning_judge_margins() {
    let good = SeedFigures {
        seed: 0,
        acc: (0.2, 0.4),
        brier: (0.31, 0.27),
        conf: (0.5, 0.3),
        ece: (0.3, 0.15),
        auroc: (Some(0.5), Some(0.7)),
        format: (0.99, 0.98),
        heldout: (0.1, 0.2, Some(0.6)),
        hard: (0.1, 0.2, Some(0.6)),
    };
    assert_eq!(judge(&[good, good, good]), Ok(()));
    assert!(judge(&[]).is_err());
    // One seed below a margin is carried by the others when the mean holds: 0.003 Brier on one
    // seed (a measured AVX-512 run) with two seeds at 0.04 gives a mean of 0.028.
    let weak = SeedFigures {
        brier: (0.314, 0.311),
        ..good
    };
    assert_eq!(judge(&[weak, good, good]), Ok(()));
    // A policy that did not change fails every margin.
    let same = SeedFigures {
        acc: (0.2, 0.2),
        brier: (0.3, 0.3),
        conf: (0.5, 0.5),
        ..good
    };
    let e = judge(&[same, same, same]).unwrap_err();
    assert!(
        e.contains("accuracy") && e.contains("Brier") && e.contains("narrowing"),
        "{e}"
    );
    // Accuracy collapsing (confidences trained alone) fails on accuracy even when Brier improves.
    let collapse = SeedFigures {
        acc: (0.207, 0.028),
        brier: (0.316, 0.05),
        conf: (0.5, 0.03),
        ..good
    };
    let e = judge(&[collapse, collapse, collapse]).unwrap_err();
    assert!(e.contains("accuracy gain -0.179"), "{e}");
    // One seed at the weakest measured format (0.68 answers on the x86-v4 build) is carried by the
    // mean; a seed that lost the format (< 0.5) fails whatever the means say.
    let weak_format = SeedFigures {
        format: (0.68, 0.71),
        ..good
    };
    assert_eq!(judge(&[good, weak_format, good, good, good]), Ok(()));
    let unformatted = SeedFigures {
        format: (0.99, 0.49),
        ..good
    };
    let e = judge(&[good, unformatted, good, good, good]).unwrap_err();
    assert!(
        e.contains("seed 0: only 0.490 of the last policy's confidences"),
        "{e}"
    );
    // Confidence that does not tell right from wrong (AUROC 0.5 on every seed) fails even when
    // accuracy and Brier improve; one strong seed carries weaker ones only through the mean.
    let blind = SeedFigures {
        auroc: (Some(0.5), Some(0.5)),
        ..good
    };
    let e = judge(&[blind, blind, blind]).unwrap_err();
    assert!(
        e.contains(&format!(
            "mean AUROC of the last policies 0.500 < {AUROC_MARGIN}"
        )),
        "{e}"
    );
    let strong = SeedFigures {
        auroc: (Some(0.5), Some(0.75)),
        ..good
    };
    let weak_auroc = SeedFigures {
        auroc: (Some(0.6), Some(0.52)),
        ..good
    };
    // (0.75 + 0.75 + 0.52) / 3 = 0.6733 ≥ 0.67; (0.75 + 0.52 + 0.52) / 3 = 0.5967 is not.
    assert_eq!(judge(&[strong, strong, weak_auroc]), Ok(()));
    let e = judge(&[strong, weak_auroc, weak_auroc]).unwrap_err();
    assert!(
        e.contains("mean AUROC of the last policies 0.597 < 0.67"),
        "{e}"
    );
    // The margin was raised from 0.52 with the difficulty-aware warm start (module doc): the
    // previous defaults' last policies (RLCR_GEMM=rlcr) averaged (0.559 + 0.692 + 0.506
    // + 0.549 + 0.500) / 5 = 0.5612 and now fail; this warm start's five seeds, (0.700 + 0.728 +
    // 0.625 + 0.762 + 0.691) / 5 = 0.7012, pass.
    let at = |a: f64| SeedFigures {
        auroc: (Some(0.5), Some(a)),
        ..good
    };
    let before: Vec<SeedFigures> = [0.559, 0.692, 0.506, 0.549, 0.500].map(at).to_vec();
    let e = judge(&before).unwrap_err();
    assert!(
        e.contains("mean AUROC of the last policies 0.561 < 0.67"),
        "{e}"
    );
    let now: Vec<SeedFigures> = [0.700, 0.728, 0.625, 0.762, 0.691].map(at).to_vec();
    assert_eq!(judge(&now), Ok(()));
    // A format that erodes on every seed fails on the mean.
    let eroded = SeedFigures {
        format: (0.65, 0.95),
        ..good
    };
    let e = judge(&[eroded, eroded, eroded]).unwrap_err();
    assert!(
        e.contains("on average only 0.650 of the last policies' answers"),
        "{e}"
    );
}

/// The exploration bonus that came closest to the tiny-model AUROC goal on the uniform warm start
/// (uniform confidences, no format reward; the current defaults reach the goal): the
/// confidence value entropy bonus (`update --conf-value-entropy-coef 0.002`: entropy over the ten
/// digits where each confidence row picks its value) and 40 iterations. It keeps the confidence
/// from collapsing to one value (top value's share 0.2–0.3 of the samples at the end instead of
/// 0.4–0.8; groups without signal 0.1–0.2 instead of 0.5–0.6) and the difficulty is learned late:
/// AUROC 0.641 / 0.662 / 0.638 on seeds 0–2 (this test on 9ea0c56, RLCR_GEMM=rlcr, 6.9 min wall
/// for the four loops at load ≈ 14; a separate sweep harness gave the same digits), 0.743 / 0.526 on seeds
/// 3–4: short of 0.65 on two of the first three seeds, with answers well formed only 0.57 (seed 1)
/// and 0.55 (seed 3) of the time (burn's attention). Reports; judges nothing.
/// `RLCR_LEARNING_SEEDS=0,1,2` for the three documented seeds.
#[test]
#[ignore = "the value-entropy configuration (40 iterations, several minutes): cargo test --test integration learning_conf_value -- --ignored --nocapture"]
fn learning_conf_value_entropy_report() {
    let seeds = seeds();
    let c = LoopConfig {
        iters: 40,
        conf_value_entropy: "0.002",
        sft_confidence: "",
        format_weight: "0",
        ..DEFAULT
    };
    let (figs, control) = run_seeds(&c, &seeds);
    eprintln!(
        "control (RLVR, 40 iterations):\n{control}\nconf value entropy 0.002, 40 iterations (seeds {seeds:?}): {:?}\n{}",
        judge(&figs),
        table(&figs)
    );
}

/// Ablation of the per-answer normalisation: confidence rewards normalised over all G_a·G_c confidences of a prompt
/// (`--estimator grpo`: groups by prompt and sample type) instead of over the G_c confidences of
/// their own answer. Reports the same paired figures as the learning test; no pass/fail on them.
#[test]
#[ignore = "an ablation report (several minutes): cargo test --test integration learning_ablation -- --ignored --nocapture"]
fn learning_ablation_pooled_confidence_norm() {
    let seeds = seeds();
    let c = LoopConfig {
        estimator: "grpo",
        ..DEFAULT
    };
    let (figs, control) = run_seeds(&c, &seeds);
    eprintln!(
        "control:\n{control}\nablation pooled (seeds {seeds:?}): {:?}\n{}",
        judge(&figs),
        table(&figs)
    );
}

/// The loop on LoRA adapters (`scripts/rl.mk LORA_RANK=8`'s settings: rank 8, alpha 16, every
/// projection, lr 3e-3; the warm start stays a full fine-tune): every iteration's update trains
/// the adapter, the next iteration samples from base + adapter. Reports the learning check's
/// figures and verdict; asserts nothing.
#[test]
#[ignore = "the LoRA loop report (several minutes): cargo test --test integration learning_lora -- --ignored --nocapture"]
fn learning_lora_report() {
    let seeds = seeds();
    let c = LoopConfig {
        lora_rank: "8",
        lr: "3e-3",
        ..DEFAULT
    };
    let (figs, control) = run_seeds(&c, &seeds);
    eprintln!(
        "control (RLVR, LoRA):\n{control}\nLoRA rank 8 (seeds {seeds:?}): {:?}\n{}",
        judge(&figs),
        table(&figs)
    );
}
