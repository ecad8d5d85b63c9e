//! The loop learns: N iterations of the real RLCR loop on the embedded default (the tiny Qwen2
//! fixture after an `rlcr sft` warm start), stage by stage through the real binary, exactly as
//! `scripts/rl.mk` chains them: prepare → generate-answers → generate-confidence → score →
//! advantage → update, then `report` over every iteration's scored table.
//!
//! Configuration: the main job's (`scripts/rl.mk` defaults): the smallest countdown shape (two
//! numbers in 1..3, targets up to 9: 25 distinct tasks), warm start of 12 epochs over 256 format
//! examples at lr 1e-2, the short confidence question `Confidence?` (in the warm-start examples and
//! in generate-confidence), 20 iterations of 16 prompts × 4 answers × 2 confidences, at most 24 new
//! tokens, `advantage --estimator rlcr --norm-conf mean`, `update --lr 1e-3 --epochs 2
//! --mini-batches 4 --micro-batch 16` (8 optimizer steps per iteration).
//!
//! What is compared: the warm start and the last policy, sampled on one held-out table of 256
//! prompts with the same seed (a policy that did not change gives identical figures, so the noise
//! left is sampling and the seed of the loop). The in-loop curve (each iteration's own 16 new
//! prompts) is printed, not asserted: prompts differ so much in difficulty that a no-update control
//! swings its accuracy 0.11–0.25 across iterations.
//!
//! The check runs five seeds (0–4) in parallel and judges their **means** (`judge`): a single
//! seed's trajectory follows the float rounding of the matrix kernels, which differs between CPUs
//! (gemm picks its blocking and, with AVX-512, its kernels at run time), so one seed's margins
//! chosen on one machine failed on another (issue 17: seed 0 gave Brier +0.040 on a Zen 3 and
//! +0.003 on a Zen 5). Measured, warm start → last policy (256 prompts: 1024 answers, 2048
//! confidences per seed), on three CPU code paths:
//!
//! | path | seed | accuracy | Brier | gap abs(conf − acc) | format ok: answers / confidences |
//! |---|---|---|---|---|---|
//! | Zen 3, AVX2 (2026-11-23) | 0 | 0.207 → 0.414 (+0.207) | 0.316 → 0.277 (+0.040) | 0.312 → 0.150 | 1.00 / 0.99 |
//! | | 1 | 0.199 → 0.487 (+0.288) | 0.295 → 0.261 (+0.034) | 0.251 → 0.088 | 0.99 / 0.99 |
//! | | 2 | 0.204 → 0.285 (+0.081) | 0.291 → 0.215 (+0.076) | 0.220 → 0.004 | 0.99 / 0.96 |
//! | | 3 | 0.244 → 0.368 (+0.124) | 0.340 → 0.240 (+0.100) | 0.295 → 0.008 | 0.99 / 0.98 |
//! | | 4 | 0.271 → 0.348 (+0.077) | 0.318 → 0.209 (+0.109) | 0.247 → 0.026 | 0.82 / 0.73 |
//! | Xeon (AVX-512), gemm's AVX2 kernels (build without burn's `x86-v4`, 2026-11-24) | 0 | 0.201 → 0.477 (+0.275) | 0.314 → 0.310 (+0.003) | 0.314 → 0.211 | 0.99 / 0.98 |
//! | | 1 | 0.229 → 0.465 (+0.236) | 0.301 → 0.252 (+0.049) | 0.240 → 0.011 | 0.99 / 0.99 |
//! | | 2 | 0.199 → 0.364 (+0.165) | 0.296 → 0.240 (+0.056) | 0.242 → 0.064 | 0.98 / 0.98 |
//! | | 3 | 0.169 → 0.457 (+0.288) | 0.382 → 0.259 (+0.123) | 0.417 → 0.071 | 0.99 / 0.98 |
//! | | 4 | 0.180 → 0.511 (+0.331) | 0.284 → 0.277 (+0.007) | 0.275 → 0.118 | 0.94 / 0.92 |
//! | Xeon, gemm's AVX-512 kernels (`x86-v4`, as built now) | 0 | 0.201 → 0.438 (+0.237) | 0.314 → 0.298 (+0.016) | 0.314 → 0.187 | 0.98 / 0.98 |
//! | | 1 | 0.229 → 0.471 (+0.242) | 0.301 → 0.251 (+0.050) | 0.240 → 0.018 | 0.99 / 0.98 |
//! | | 2 | 0.199 → 0.330 (+0.131) | 0.296 → 0.232 (+0.065) | 0.242 → 0.000 | 1.00 / 0.94 |
//! | | 3 | 0.169 → 0.350 (+0.181) | 0.382 → 0.190 (+0.192) | 0.417 → 0.039 | 0.68 / 0.71 |
//! | | 4 | 0.180 → 0.518 (+0.338) | 0.284 → 0.262 (+0.022) | 0.275 → 0.076 | 0.99 / 0.99 |
//!
//! Means over seeds 0–4 (Zen 3 / Xeon AVX2 / Xeon AVX-512): accuracy +0.155 / +0.259 / +0.226,
//! Brier +0.072 / +0.048 / +0.069, gap narrowing 0.210 / 0.203 / 0.233, well-formed answers
//! 0.96 / 0.98 / 0.93. Single seeds range from +0.003 to +0.192 in Brier and 0.68 to 1.00 in
//! answer format: a seed's figures are one draw, a path's mean of five is what the margins judge.
//!
//! Margins, and how they were chosen: (1) the mean accuracy gain is at least 0.05 (path means
//! 0.155–0.259; one SE of a seed's accuracy difference over 1024 clustered answers is ≈ 0.02–0.03,
//! and the seed-to-seed SD ≈ 0.08, so a five-seed mean has an SE ≈ 0.04 and the lowest path mean
//! sits 2.6 SE above the margin); (2) the mean Brier gain is at least 0.02 (path means 0.048–0.072;
//! seed SD ≈ 0.05, five-seed SE ≈ 0.02, so the lowest path mean sits only 1.3 SE above it and
//! the mean of all three ≈ 2 SE: the margin most likely to miss on a new CPU path, and a miss
//! there says "run more seeds", not "the loop broke"; a Brier SE within a seed is ≈ 0.01 over 2048
//! confidences); (3) the mean narrowing of |mean confidence − accuracy| is at least 0.05 (path
//! means 0.20–0.23); (4) on average at least 70 % of answers and of confidences are well formed
//! after the loop and no seed falls below 50 % (weakest seed 0.68 / 0.71, x86-v4 seed 3), which
//! catches a policy that games the reward by dropping the format. The controls fail the check
//! (`learning_controls_fail_the_check`, `#[ignore]`d: they cost two more sets of loops): with
//! `--lr 0` every gain is exactly 0; with `--lambda-ans 0` (confidences trained alone) accuracy
//! fell 0.207 → 0.028 on Zen 3 seed 0. What failed on the way (and why the defaults are what
//! they are): lr 2e-3 with 8 steps breaks the format; one step per iteration at 2e-3 learns
//! calibration but not accuracy; `--norm-conf std` with G_c = 2 pushes every confidence to the
//! majority outcome (Brier worse); 30 iterations at a constant lr collapsed seed 4; an entropy
//! bonus hurt. The model's confidence does not tell right from wrong answers (AUROC ≈ 0.5, the
//! table's AUROC column): it learns the base rate.
//!
//! The ablation of seed 000's choice (confidence rewards normalised over all answers of a prompt,
//! `--estimator grpo`, instead of per answer) is `learning_ablation_pooled_confidence_norm`,
//! `#[ignore]`d: it reports, it does not judge. `RLCR_LEARNING_SEEDS=5,6,7` runs any of the
//! loops with other seeds.
//!
//! Filter: `cargo test --test integration learning_` (it is the slowest test of the suite).
use std::path::Path;

use crate::{fixtures, Workdir};

/// The task shape: two numbers per task (see the doc comment of the test for why).
const TASK: &[&str] = &[
    "--min-numbers",
    "2",
    "--max-numbers",
    "2",
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
    confidence_prompt: &'static str,
    eval_prompts: usize,
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
    confidence_prompt: "Confidence?",
    eval_prompts: 256,
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

    /// `prepare --from countdown-synth` with the test's task shape.
    fn prepare(&self, seed: u64, count: usize, extra: &[String], out: &str) {
        let mut a = vec![s("prepare"), s("--from"), s("countdown-synth")];
        a.extend([s("--count"), s(count)]);
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
        self.stage(&[
            s("score"),
            s("--input"),
            f("trajectory.parquet"),
            s("-o"),
            f("scored.parquet"),
            s("--verifier"),
            s("countdown"),
        ]);
        f("scored.parquet")
    }

    /// `report` over scored tables; returns one point per input.
    fn report(&self, scored: &[String], dir: &str) -> Curve {
        let mut a = vec![s("report")];
        for f in scored {
            a.extend([s("--input"), f.clone()]);
        }
        a.extend([s("-o"), self.path(dir)]);
        self.stage(&a);
        read_curve(&self.wd.path(&format!("{dir}/metrics.json")))
    }
}

/// What one loop produced: the in-loop curve (each iteration's own rollouts, new prompts every
/// iteration) and the paired evaluation of the warm start and the last policy on one held-out
/// prompts table (same prompts, same sampling seed).
struct Outcome {
    curve: Curve,
    eval: Curve,
}

/// Run the whole loop in `wd`.
fn run_loop(wd: &Workdir, c: &LoopConfig) -> Outcome {
    let r = Runner { wd, seed: c.seed };
    let tiny = fixtures().join("tiny-qwen2").to_string_lossy().to_string();

    // Supervised warm start on format examples with known solutions.
    r.prepare(
        c.seed,
        c.sft_count,
        &[
            s("--sft"),
            s("--system-prompt"),
            s(""),
            s("--confidence-prompt"),
            s(c.confidence_prompt),
        ],
        "sft.parquet",
    );
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
        ]);
        r.stage(&[
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
        ]);
        scored.push(sc);
        policy = f("model");
    }
    let curve = r.report(&scored, "report");

    // Paired evaluation: the warm start and the last policy on the same held-out prompts.
    r.prepare(
        EVAL_SEED + c.seed,
        c.eval_prompts,
        &[],
        "eval-prompts.parquet",
    );
    let prompts = r.path("eval-prompts.parquet");
    let mut pair = Vec::new();
    for (name, p) in [("eval-start", r.path("sft")), ("eval-end", policy)] {
        std::fs::create_dir_all(wd.path(name)).expect("eval folder");
        pair.push(r.rollouts(c, &p, &prompts, name));
    }
    let eval = r.report(&pair, "eval-report");
    Outcome { curve, eval }
}

fn read_curve(file: &Path) -> Curve {
    let text = std::fs::read_to_string(file).expect("metrics.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("metrics.json is JSON");
    let reports = v["reports"].as_array().expect("reports");
    let col = |key: &str| -> Vec<f64> {
        reports
            .iter()
            .map(|r| r["overall"][key].as_f64().expect("a number"))
            .collect()
    };
    Curve {
        accuracy: col("accuracy"),
        brier: col("brier"),
        mean_confidence: col("mean_confidence"),
        ece: col("ece"),
        format_answers: col("format_rate_answers"),
        format_confidences: col("format_rate_confidences"),
        auroc: reports
            .iter()
            .map(|r| r["overall"]["auroc"].as_f64())
            .collect(),
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
}

impl SeedFigures {
    fn of(seed: u64, c: &Curve) -> SeedFigures {
        SeedFigures {
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
    /// One line of the README's table.
    fn row(&self) -> String {
        let a = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
        format!(
            "| {} | {:.3} → {:.3} ({:+.3}) | {:.3} → {:.3} | {:.3} → {:.3} ({:+.3}) | {:.3} → {:.3} ({:+.3}) | {:.3} → {:.3} | {} → {} | {:.2} / {:.2} |",
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
        )
    }
}

/// The table the test prints (and the README copies).
fn table(figs: &[SeedFigures]) -> String {
    let mut t = String::from(
        "| seed | accuracy (gain) | mean confidence | Brier (gain) | gap abs(conf − acc) (change) | ECE | AUROC | format ok: answers / confidences |\n|---|---|---|---|---|---|---|---|\n",
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

/// Runs the loop of `c` for every seed, the seeds in parallel (each its own folder).
fn run_seeds(c: &LoopConfig, seeds: &[u64]) -> Vec<SeedFigures> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = seeds
            .iter()
            .map(|&seed| {
                scope.spawn(move || {
                    let c = LoopConfig { seed, ..*c };
                    let wd = Workdir::new();
                    let o = run_loop(&wd, &c);
                    assert_eq!(o.curve.accuracy.len(), c.iters);
                    assert_eq!(o.eval.accuracy.len(), 2);
                    eprintln!(
                        "learning (seed {seed}): in-loop curve {:?}\nlearning (seed {seed}): evaluation (start, end) {:?}",
                        o.curve, o.eval
                    );
                    SeedFigures::of(seed, &o.eval)
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
    })
}

#[test]
fn learning_rlcr_loop_raises_accuracy_and_improves_brier() {
    let seeds = seeds();
    let figs = run_seeds(&DEFAULT, &seeds);
    let t = table(&figs);
    eprintln!("learning: seeds {seeds:?}\n{t}");
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
        let figs = run_seeds(&c, &seeds);
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
        auroc: (Some(0.5), Some(0.5)),
        format: (0.99, 0.98),
    };
    assert_eq!(judge(&[good, good, good]), Ok(()));
    assert!(judge(&[]).is_err());
    // One seed below a margin is carried by the others when the mean holds: 0.003 Brier on one
    // seed (issue 17's AVX-512 run) with two seeds at 0.04 gives a mean of 0.028.
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
    // One seed at issue 17's weakest format (0.68 answers on the x86-v4 build) is carried by the
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

/// Seed 000's ablation: confidence rewards normalised over all G_a·G_c confidences of a prompt
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
    let figs = run_seeds(&c, &seeds);
    eprintln!(
        "ablation pooled (seeds {seeds:?}): {:?}\n{}",
        judge(&figs),
        table(&figs)
    );
}
