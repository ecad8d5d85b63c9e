//! `rlcr report`: calibration metrics, training-signal statistics and plots for one or more
//! scored tables (iterations), optionally with a faithfulness-probe table.
//!
//! This file gathers the flags into a [`report::stage::Request`], checked into a
//! [`report::stage::Plan`]; [`report::stage::run`] reads the inputs, computes every figure and
//! writes the folder.
use std::path::PathBuf;

use anyhow::Result;
use serde_json::json;

use super::common::Global;
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
curves. An arm labelled more than once has one input per run (seed): every arm as many times,
run i of each belonging together; a table across the runs then gives each figure's mean ± the
standard error from the runs' spread, and each arm minus the first, run by run (metrics.json:
`across_runs`). With --probe, the faithfulness probe's
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
    /// labelled) = arms to compare (e.g. `--input base=b.parquet --input rlcr=c.parquet`), a
    /// label repeated = that arm's next run (seed).
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

pub fn run(g: &Global, a: Args) -> Result<()> {
    let mut config = serde_json::to_value(&a)?;
    config["seed"] = json!(g.seed);
    let plan = report::stage::Request {
        inputs: a.input,
        iterations: a.iterations,
        held_in: a.held_in,
        settings: report::stage::Settings {
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
        },
    }
    .plan()?;
    let done = report::stage::run(&plan)?;
    crate::info!(
        "report: wrote {} files to {} ({})",
        done.files,
        plan.settings.out.display(),
        done.headline
    );
    Ok(())
}
