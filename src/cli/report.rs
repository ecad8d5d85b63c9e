//! `rlcr report`: calibration metrics, training-signal statistics and plots for one or more
//! scored tables (iterations), optionally with a faithfulness-probe table.
//!
//! This file validates the flags into a [`report::stage::Plan`]; [`report::stage::run`] reads the
//! inputs, computes every figure and writes the folder.
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::json;

use super::common::{Global, UsageError};
use crate::report::{self, BinRule, MissingConfidence, Options};

pub const ABOUT: &str =
    "Calibration report: accuracy, Brier, ECE, AUROC, reliability diagram, curves";
pub const LONG_ABOUT: &str = "\
Compute calibration metrics (accuracy, format rate, strict and lenient confidence parse rates, mean
confidence, Brier, ECE, AUROC, lengths, per data_source) and the per-turn training-signal statistics
(reward mean/std and lengths of answers and confidences, G_a / G_c groups with non-zero reward std),
and draw a reliability diagram and reward/length histograms. Calibration is evaluated over the
confidence rows (each carries its answer's acc_reward); a missing confidence counts as 0 (RLCR's
eval) unless --missing-confidence drop.

With several --input files (iterations, in order) the detailed sections describe the last one and
a table and line chart follow the metrics across iterations; --iterations gives each input its
training iteration (default 1, 2, …), e.g. `--iterations 0,5,10` for evaluations every 5. With labelled inputs
(`--input base=… --input rlvr=… --input rlcr=…`: arms evaluated on the same prompts) a comparison
table (accuracy, ECE, Brier, AUROC, mean confidence, format and parse rates, each with its
standard error; all rows, then per data_source, e.g. held-out `countdown-heldout` vs the out-of-domain
`countdown-hard` bucket) and the arms' reliability diagrams side by side replace the iteration
curves. With --probe, the faithfulness probe's
curves (probe confidence against cut fraction; probe vs verbal confidence vs correctness). With
--held-in NAME=PATH (one per input), the accuracy of each iteration's policy on a fixed probe set
beside the sampled batch's. With --train-metrics, the training curves and, per update call, the
KL to the reference, the rollout/trainer mismatch and the response lengths.

Reads: one or more trajectory tables (usually scored), optionally a probe table.
Writes into the folder -o (created if needed; all files replaced together at the end):
  metrics.json          every figure, one entry per input (+ probe summary)
  calibration.parquet   one row per (input, bin): edges, count, mean confidence, accuracy, gap
  reliability.svg/.png  reliability diagram of the last input
  histograms.svg/.png   rewards and lengths of answers vs confidences
  iterations.svg/.png   metrics against iteration (several unlabelled inputs)
  training.svg/.png     loss, KL, clip fractions, entropy, grad norm, lr against step (--train-metrics)
  comparison.md, comparison.svg/.png   table and side-by-side diagrams (labelled inputs)
  probe_curve.svg/.png, probe_vs_verbal.svg/.png   (with --probe)
  report.md             everything above on one page, with example rows
With --tensorboard DIR, also DIR/events.out.tfevents.<step>.rlcr-report: one scalar per figure of
metrics.json's `overall` at each input's iteration (TensorBoard: `tensorboard --logdir` DIR's
parent).

Example:
  rlcr report --input runs/a/iter-0001/scored.parquet --input runs/a/iter-0002/scored.parquet -o report/
  rlcr report --input rlvr=runs/c/rlvr/scored.parquet --input rlcr=runs/c/rlcr/scored.parquet -o cmp/";

#[derive(clap::Args, Debug, serde::Serialize)]
pub struct Args {
    /// Scored table(s): several = one per iteration, in order; `LABEL=PATH` (every input
    /// labelled) = arms to compare (e.g. `--input base=b.parquet --input rlcr=c.parquet`).
    #[arg(long, required = true)]
    pub input: Vec<String>,
    /// Probe table (`rlcr probe` output).
    #[arg(long)]
    pub probe: Option<PathBuf>,
    /// Output folder.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Number of calibration bins.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub bins: u32,
    /// ECE bin rule: `floor` = min(floor(c·B), B−1); `rlcr` = RLCR's float linspace edges + digitize.
    #[arg(long, value_enum, default_value_t = BinRule::Floor)]
    pub ece_rule: BinRule,
    /// A confidence row without a valid confidence counts as `zero` (RLCR's eval) or is `drop`ped.
    #[arg(long, value_enum, default_value_t = MissingConfidence::Zero)]
    pub missing_confidence: MissingConfidence,
    /// Example rows per kind in report.md (0: none, and no second pass over the last input).
    #[arg(long, default_value_t = 3)]
    pub examples: usize,
    /// A training run's `train_metrics.jsonl`, or the checkpoint folder that holds it (the last
    /// iteration's model folder holds the whole loop's): draws its loss, KL, clip fractions,
    /// entropy, gradient norm and learning rate against the global step (training.svg/png).
    #[arg(long, value_name = "PATH")]
    pub train_metrics: Option<PathBuf>,
    /// TensorBoard run folder: every figure of metrics.json's `overall` (accuracy, ece, brier,
    /// auroc, mean_confidence, answer_turn/reward_mean, answer_turn/length_mean, …) as scalars,
    /// at each input's iteration (not for labelled arms).
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
    /// The training iteration of each input, in input order (default 1, 2, …): the x axis of
    /// the curves and the table across inputs, `iteration` in metrics.json and
    /// calibration.parquet, and the TensorBoard step. E.g. `--iterations 0,5,10` for evaluations
    /// of the policies after iterations 0, 5 and 10. Increasing; not with labelled inputs.
    #[arg(long, value_delimiter = ',', value_name = "N,N,…")]
    pub iterations: Vec<u64>,
    /// A fixed probe set's scored answers, one per input in input order, under a set name (e.g.
    /// `--held-in greedy=it1/greedy.parquet --held-in greedy=it2/greedy.parquet`): the accuracy
    /// of each iteration's policy on the same prompts, beside the sampled batch's, in the table
    /// across iterations, the curves, metrics.json (`held_in`) and TensorBoard
    /// (`held_in/NAME/accuracy`). Not with labelled inputs.
    #[arg(long, value_name = "NAME=PATH")]
    pub held_in: Vec<String>,
}

/// `--held-in NAME=PATH` values grouped by name (in order of first appearance), each name with
/// one path per input.
fn held_in_sets(
    given: &[String],
    n_inputs: usize,
    labelled: bool,
) -> Result<Vec<(String, Vec<PathBuf>)>> {
    if given.is_empty() {
        return Ok(vec![]);
    }
    if labelled {
        return Err(
            UsageError("--held-in: labelled inputs are arms, not iterations".to_string()).into(),
        );
    }
    let mut sets: Vec<(String, Vec<PathBuf>)> = Vec::new();
    for g in given {
        let Some((name, path)) = g.split_once('=').filter(|(n, p)| {
            !n.is_empty()
                && !p.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        }) else {
            return Err(UsageError(format!(
                "--held-in {g}: expected NAME=PATH (NAME of letters, digits, `-_.`)"
            ))
            .into());
        };
        match sets.iter_mut().find(|s| s.0 == name) {
            Some(s) => s.1.push(PathBuf::from(path)),
            None => sets.push((name.to_string(), vec![PathBuf::from(path)])),
        }
    }
    for (name, paths) in &sets {
        if paths.len() != n_inputs {
            return Err(UsageError(format!(
                "--held-in: {} tables for set {name:?} and {n_inputs} inputs (one per input, in input order)",
                paths.len()
            ))
            .into());
        }
        if let Some(p) = paths.iter().find(|p| !p.exists()) {
            return Err(
                UsageError(format!("--held-in {name}={}: no such input", p.display())).into(),
            );
        }
    }
    Ok(sets)
}

/// `LABEL=PATH` → (Some(LABEL), PATH) when LABEL is a plain word (letters, digits, `-_.`) and the
/// whole text is not an existing path; otherwise (None, the text).
pub fn split_label(s: &str) -> (Option<String>, PathBuf) {
    match s.split_once('=') {
        Some((l, p))
            if !l.is_empty()
                && !p.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && !Path::new(s).exists() =>
        {
            (Some(l.to_string()), PathBuf::from(p))
        }
        _ => (None, PathBuf::from(s)),
    }
}

/// The inputs' paths and labels (empty when none is labelled); usage error when only some are
/// labelled or a label repeats.
fn inputs(a: &Args) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let parsed: Vec<(Option<String>, PathBuf)> = a.input.iter().map(|s| split_label(s)).collect();
    let n_labelled = parsed.iter().filter(|p| p.0.is_some()).count();
    if n_labelled == 0 {
        return Ok((parsed.into_iter().map(|p| p.1).collect(), vec![]));
    }
    if n_labelled != parsed.len() {
        return Err(
            UsageError("--input: label every input (LABEL=PATH) or none".to_string()).into(),
        );
    }
    let mut seen = std::collections::HashSet::new();
    let mut paths = vec![];
    let mut labels = vec![];
    for (l, p) in parsed {
        let l = l.unwrap_or_default();
        if !seen.insert(l.clone()) {
            return Err(UsageError(format!("--input: label {l:?} is used twice")).into());
        }
        labels.push(l);
        paths.push(p);
    }
    Ok((paths, labels))
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    // Plan: validate before any work.
    let (paths, labels) = inputs(&a)?;
    for p in paths.iter().chain(a.probe.iter()) {
        if !p.exists() {
            return Err(UsageError(format!("{}: no such input", p.display())).into());
        }
    }
    if a.out.is_file() {
        return Err(UsageError(format!(
            "-o {}: is a file; report writes a folder of files",
            a.out.display()
        ))
        .into());
    }
    // The folder must not be (or hold) an input: calibration.parquet would become a part file.
    let ins: Vec<&Path> = paths
        .iter()
        .chain(a.probe.iter())
        .map(|p| p.as_path())
        .collect();
    if crate::fs::folder_is_one_of(&a.out, &ins)? {
        return Err(UsageError(format!(
            "-o {}: is an input folder; write the report somewhere else",
            a.out.display()
        ))
        .into());
    }
    let iterations = iteration_numbers(&a.iterations, paths.len(), !labels.is_empty())?;
    let held_in = held_in_sets(&a.held_in, paths.len(), !labels.is_empty())?;
    if a.tensorboard.is_some() && !labels.is_empty() {
        return Err(UsageError(
            "--tensorboard: labelled inputs are arms, not steps; report them one at a time"
                .to_string(),
        )
        .into());
    }
    if let Some(p) = &a.train_metrics {
        let f = report::training::metrics_path(p);
        if !f.is_file() {
            return Err(UsageError(format!(
                "--train-metrics {}: no such file (give a train_metrics.jsonl or the model folder \
                 that holds one)",
                f.display()
            ))
            .into());
        }
    }
    let mut config = serde_json::to_value(&a)?;
    config["seed"] = json!(g.seed);
    let plan = report::stage::Plan {
        inputs: paths,
        labels,
        iterations,
        held_in,
        probe: a.probe,
        train_metrics: a.train_metrics,
        tensorboard: a.tensorboard,
        out: a.out,
        opts: Options {
            bins: a.bins as usize,
            ece_rule: a.ece_rule,
            missing_confidence: a.missing_confidence,
        },
        examples: a.examples,
        config,
    };
    let done = report::stage::run(&plan)?;
    crate::info!(
        "report: wrote {} files to {} ({})",
        done.files,
        plan.out.display(),
        done.headline
    );
    Ok(())
}

/// The iteration number of each of `n` inputs: `given` (one per input, increasing) or 1, 2, ….
fn iteration_numbers(given: &[u64], n: usize, labelled: bool) -> Result<Vec<u64>> {
    if given.is_empty() {
        return Ok((1..=n as u64).collect());
    }
    if labelled {
        return Err(UsageError(
            "--iterations: labelled inputs are arms, not iterations".to_string(),
        )
        .into());
    }
    if given.len() != n {
        return Err(UsageError(format!(
            "--iterations: {} numbers for {n} inputs (one per input, in input order)",
            given.len()
        ))
        .into());
    }
    if let Some(w) = given.windows(2).find(|w| w[1] <= w[0]) {
        return Err(UsageError(format!(
            "--iterations: {} after {}; the inputs' iterations must increase",
            w[1], w[0]
        ))
        .into());
    }
    Ok(given.to_vec())
}
