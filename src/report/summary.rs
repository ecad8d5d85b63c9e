//! From [`Rows`] to the figures of `metrics.json`: calibration metrics, the per-turn
//! logging statistics, the reliability table, diagnostics and the example rows of `report.md`.
//!
//! Design decisions:
//! - **Calibration rows** are the confidence rows (turn 2); each carries its own answer's
//!   `acc_reward` (`docs/schemas.md`), which is the label. With `G_c` confidences per answer every answer
//!   weighs `G_c` times, equally for all answers when `G_c` is constant. A table without confidence
//!   rows whose answer rows carry a `confidence` (single-turn formats such as RLCR's `tabc`) is
//!   evaluated over its answer rows instead; `calibration_rows_from` says which.
//! - **Missing confidences** follow [`MissingConfidence`] (default: 0.0, RLCR's eval).
//! - **Accuracy** is the mean `acc_reward` of answer rows (pass@1 over all samples, `docs/math.md` §4.4).
//! - **Per-turn logging**: reward mean/std and length mean/std of answers and of confidences
//!   separately, and the number of `G_a` groups (answers of one prompt) and `G_c` groups
//!   (confidences of one answer) that carried signal. A group carries signal when its rewards are
//!   not all equal, which is `std > 0` decided exactly (a float std of equal values can come out
//!   as 1e-17); singleton groups carry none (their advantage is 0, `docs/math.md` §2.1). The reward
//!   is the `reward` column (what the advantage is computed from), else `acc_reward` for answers
//!   and `conf_reward` for confidences.
//! - Per `data_source` blocks repeat the same metrics over that source's rows; they are kept in a
//!   `BTreeMap`, so the JSON is ordered and deterministic.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::data::{MissingConfidence, Rows, SampleType};
use super::metrics::{self, Bin, BinRule};

/// Settings of a report.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Options {
    /// Number of calibration bins (`B`).
    pub bins: usize,
    /// Bin rule for `ece` and the reliability table.
    pub ece_rule: BinRule,
    /// What a missing confidence counts as.
    pub missing_confidence: MissingConfidence,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bins: 10,
            ece_rule: BinRule::Floor,
            missing_confidence: MissingConfidence::Zero,
        }
    }
}

/// Reward and length statistics of one turn.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnStats {
    /// Rows of this sample type.
    pub rows: u64,
    /// Column the reward figures come from.
    pub reward_column: String,
    /// Mean reward over rows with a reward.
    pub reward_mean: Option<f64>,
    /// Unbiased std of the rewards.
    pub reward_std: Option<f64>,
    /// Mean response length in tokens.
    pub length_mean: Option<f64>,
    /// Unbiased std of the lengths.
    pub length_std: Option<f64>,
    /// Shortest response.
    pub length_min: Option<u32>,
    /// Longest response.
    pub length_max: Option<u32>,
    /// Groups: prompts for answers (`G_a` groups), answers for confidences (`G_c` groups).
    pub groups: u64,
    /// Groups whose rewards are not all equal (non-zero std).
    pub groups_with_signal: u64,
    /// `groups_with_signal / groups`.
    pub signal_fraction: Option<f64>,
    /// Mean group size.
    pub mean_group_size: Option<f64>,
}

/// Calibration and accuracy figures of a set of rows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// All rows.
    pub rows: u64,
    /// Answer rows.
    pub answers: u64,
    /// Confidence rows.
    pub confidences: u64,
    /// Mean `acc_reward` of answer rows.
    pub accuracy: Option<f64>,
    /// Binomial standard error of `accuracy`, `sqrt(p(1−p)/n)`.
    pub accuracy_se: Option<f64>,
    /// Fraction of answer rows with `format_ok`.
    pub format_rate_answers: Option<f64>,
    /// Fraction of confidence rows with `format_ok`.
    pub format_rate_confidences: Option<f64>,
    /// Fraction of confidence rows with a strictly parsed confidence (the `confidence` column).
    pub parse_rate_strict: Option<f64>,
    /// Fraction of confidence rows whose confidence parses leniently (or strictly).
    pub parse_rate_lenient: Option<f64>,
    /// `"confidence"` or `"answer"`: which rows the calibration figures are over.
    pub calibration_rows_from: String,
    /// Rows used for calibration (after the missing-confidence policy).
    pub calibration_rows: u64,
    /// Of those, rows whose confidence was missing and counted as 0.
    pub missing_confidences_as_zero: u64,
    /// Mean confidence over the calibration rows.
    pub mean_confidence: Option<f64>,
    /// Brier score `mean((c − y)²)`.
    pub brier: Option<f64>,
    /// ECE under the chosen rule.
    pub ece: Option<f64>,
    /// ECE under the floor rule.
    pub ece_floor: Option<f64>,
    /// ECE under RLCR's exact rule.
    pub ece_rlcr: Option<f64>,
    /// AUROC of confidence for correctness (ties ½).
    pub auroc: Option<f64>,
    /// Mean length (tokens) of correct answers.
    pub length_correct_answers: Option<f64>,
    /// Mean length (tokens) of wrong answers.
    pub length_wrong_answers: Option<f64>,
    /// Standard errors (rows taken as independent; see [`metrics`] for each formula): binomial
    /// for the format and parse rates, the mean's for mean confidence and Brier, Hanley–McNeil for
    /// AUROC, the delta method over the bins for ECE.
    #[serde(default)]
    pub se: StandardErrors,
    /// Statistics of the answer turn.
    pub answer_turn: TurnStats,
    /// Statistics of the confidence turn.
    pub confidence_turn: TurnStats,
}

/// Standard errors of a [`Metrics`]' figures (accuracy's is `Metrics::accuracy_se`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StandardErrors {
    pub format_rate_answers: Option<f64>,
    pub format_rate_confidences: Option<f64>,
    pub parse_rate_strict: Option<f64>,
    pub mean_confidence: Option<f64>,
    pub brier: Option<f64>,
    pub ece: Option<f64>,
    pub auroc: Option<f64>,
}

/// Consistency findings that do not stop the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Diagnostics {
    /// Trajectory columns the table lacks (figures that need them are null).
    pub missing_columns: Vec<String>,
    /// Confidence values outside `[0, 1]` or not finite (treated as missing).
    pub invalid_confidences: u64,
    /// Confidence rows with no answer row of the same `(prompt_id, answer_idx)` in the table.
    pub confidences_without_answer: u64,
    /// Confidence rows whose `acc_reward` differs from their answer row's.
    pub label_mismatches: u64,
}

/// The report of one table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The input's name (path as given).
    pub input: String,
    /// The training iteration the input belongs to (`report --iterations`; by default its
    /// position among the inputs, from 1): the x value of the curves across inputs.
    #[serde(default)]
    pub iteration: u64,
    /// Settings.
    pub options: Options,
    /// All rows.
    pub overall: Metrics,
    /// Per `data_source` ("" when the column is missing or null).
    pub per_source: BTreeMap<String, Metrics>,
    /// The reliability table under the chosen rule.
    pub reliability: Vec<Bin>,
    /// The reliability table of each `data_source`.
    #[serde(default)]
    pub per_source_reliability: BTreeMap<String, Vec<Bin>>,
    /// Consistency findings.
    pub diagnostics: Diagnostics,
    /// Accuracy of the same iteration's policy on fixed probe sets (`report --held-in
    /// NAME=PATH`: the same prompts every iteration, e.g. greedy and at the loop's temperature),
    /// by set name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held_in: BTreeMap<String, HeldIn>,
}

/// Accuracy on a fixed probe set (the mean `acc_reward` of its answer rows).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HeldIn {
    /// The scored table.
    pub input: String,
    /// Answer rows.
    pub answers: u64,
    /// Mean `acc_reward` of the answer rows.
    pub accuracy: Option<f64>,
    /// Its binomial standard error.
    pub accuracy_se: Option<f64>,
}

impl HeldIn {
    /// The held-in figures of a report of the probe set's own table.
    pub fn of(r: &Report) -> HeldIn {
        HeldIn {
            input: r.input.clone(),
            answers: r.overall.answers,
            accuracy: r.overall.accuracy,
            accuracy_se: r.overall.accuracy_se,
        }
    }
}

/// The calibration pairs `(confidence, label)` of the rows selected by `keep`, and how many were
/// zero-filled. Also says which sample type they come from.
pub fn calibration_pairs(
    rows: &Rows,
    keep: &dyn Fn(usize) -> bool,
    missing: MissingConfidence,
) -> (Vec<f64>, Vec<f64>, u64, SampleType) {
    let from = calibration_source(rows);
    let (mut c, mut y, mut zeros) = (Vec::new(), Vec::new(), 0u64);
    for i in 0..rows.len() {
        if rows.kind[i] != from || !keep(i) {
            continue;
        }
        let Some(label) = rows.acc[i] else { continue };
        let conf = match (rows.confidence[i], missing) {
            (Some(v), _) => v,
            (None, MissingConfidence::Zero) => {
                zeros += 1;
                0.0
            }
            (None, MissingConfidence::Drop) => continue,
        };
        c.push(conf);
        y.push(label);
    }
    (c, y, zeros, from)
}

/// Confidence rows if the table has any; else answer rows when some carry a confidence.
pub fn calibration_source(rows: &Rows) -> SampleType {
    let has_conf_rows = rows.kind.contains(&SampleType::Confidence);
    let answers_have_conf = rows
        .kind
        .iter()
        .zip(&rows.confidence)
        .any(|(k, c)| *k == SampleType::Answer && c.is_some());
    if !has_conf_rows && answers_have_conf {
        SampleType::Answer
    } else {
        SampleType::Confidence
    }
}

fn rate(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// The column a turn's rewards are read from, and its name: `reward` (what the advantage is
/// computed from) when the table has it, else `acc_reward` for answers and `conf_reward` for
/// confidences.
fn reward_column(rows: &Rows, kind: SampleType) -> (&[Option<f64>], &'static str) {
    if !rows.missing_columns.contains("reward") {
        return (&rows.reward, "reward");
    }
    match kind {
        SampleType::Answer => (&rows.acc, "acc_reward"),
        SampleType::Confidence => (&rows.conf_reward, "conf_reward"),
    }
}

/// Statistics of one turn over the rows selected by `keep`.
#[allow(clippy::needless_range_loop)] // parallel columns, indexed by row
pub fn turn_stats(rows: &Rows, kind: SampleType, keep: &dyn Fn(usize) -> bool) -> TurnStats {
    let (rcol, rname) = reward_column(rows, kind);
    let mut rewards = Vec::new();
    let mut lengths: Vec<u32> = Vec::new();
    let mut n = 0u64;
    // group → (first reward, differs, size); only counts leave this map, so order is irrelevant.
    let mut groups: HashMap<(u32, i32), (Option<f64>, bool, u64)> = HashMap::new();
    for i in 0..rows.len() {
        if rows.kind[i] != kind || !keep(i) {
            continue;
        }
        n += 1;
        if let Some(l) = rows.length[i] {
            lengths.push(l);
        }
        let key = match kind {
            SampleType::Answer => (rows.prompt[i], i32::MIN),
            SampleType::Confidence => (rows.prompt[i], rows.answer_idx[i]),
        };
        let g = groups.entry(key).or_insert((None, false, 0));
        g.2 += 1;
        if let Some(r) = rcol[i] {
            rewards.push(r);
            match g.0 {
                None => g.0 = Some(r),
                Some(first) if first != r => g.1 = true,
                _ => {}
            }
        }
    }
    let lf: Vec<f64> = lengths.iter().map(|&l| l as f64).collect();
    let ngroups = groups.len() as u64;
    let with_signal = groups.values().filter(|g| g.1).count() as u64;
    TurnStats {
        rows: n,
        reward_column: rname.to_string(),
        reward_mean: metrics::mean(&rewards),
        reward_std: metrics::std_unbiased(&rewards),
        length_mean: metrics::mean(&lf),
        length_std: metrics::std_unbiased(&lf),
        length_min: lengths.iter().copied().min(),
        length_max: lengths.iter().copied().max(),
        groups: ngroups,
        groups_with_signal: with_signal,
        signal_fraction: rate(with_signal, ngroups),
        mean_group_size: rate(n, ngroups),
    }
}

/// All metrics over the rows selected by `keep`.
pub fn metrics_for(rows: &Rows, keep: &dyn Fn(usize) -> bool, opts: &Options) -> Metrics {
    let (mut answers, mut confs) = (0u64, 0u64);
    let (mut acc_sum, mut acc_n, mut acc_pos) = (0.0, 0u64, 0u64);
    let (mut fmt_a, mut fmt_a_n, mut fmt_c, mut fmt_c_n) = (0u64, 0u64, 0u64, 0u64);
    let (mut strict, mut lenient) = (0u64, 0u64);
    let (mut len_ok, mut len_bad) = (Vec::new(), Vec::new());
    let mut total = 0u64;
    for i in 0..rows.len() {
        if !keep(i) {
            continue;
        }
        total += 1;
        match rows.kind[i] {
            SampleType::Answer => {
                answers += 1;
                if let Some(a) = rows.acc[i] {
                    acc_sum += a;
                    acc_n += 1;
                    if metrics::is_positive(a) {
                        acc_pos += 1;
                    }
                    if let Some(l) = rows.length[i] {
                        if metrics::is_positive(a) {
                            len_ok.push(l as f64)
                        } else {
                            len_bad.push(l as f64)
                        }
                    }
                }
                if let Some(f) = rows.format_ok[i] {
                    fmt_a_n += 1;
                    fmt_a += f as u64;
                }
            }
            SampleType::Confidence => {
                confs += 1;
                strict += rows.confidence[i].is_some() as u64;
                lenient += rows.lenient[i].is_some() as u64;
                if let Some(f) = rows.format_ok[i] {
                    fmt_c_n += 1;
                    fmt_c += f as u64;
                }
            }
        }
    }
    let (c, y, zeros, from) = calibration_pairs(rows, keep, opts.missing_confidence);
    let reliability = metrics::reliability_bins(&c, &y, opts.bins, opts.ece_rule);
    let auroc = metrics::auroc(&c, &y);
    let n_pos = y.iter().filter(|&&v| metrics::is_positive(v)).count() as u64;
    let no_conf_col = rows.missing_columns.contains("confidence");
    let no_text_col = rows.missing_columns.contains("response_text");
    Metrics {
        rows: total,
        answers,
        confidences: confs,
        accuracy: (acc_n > 0).then(|| acc_sum / acc_n as f64),
        accuracy_se: metrics::binomial_se(acc_pos, acc_n),
        format_rate_answers: rate(fmt_a, fmt_a_n),
        format_rate_confidences: rate(fmt_c, fmt_c_n),
        parse_rate_strict: if no_conf_col {
            None
        } else {
            rate(strict, confs)
        },
        parse_rate_lenient: if no_conf_col && no_text_col {
            None
        } else {
            rate(lenient, confs)
        },
        calibration_rows_from: from.as_str().to_string(),
        calibration_rows: c.len() as u64,
        missing_confidences_as_zero: zeros,
        mean_confidence: metrics::mean(&c),
        brier: metrics::brier(&c, &y),
        ece: metrics::ece_from_bins(&reliability),
        ece_floor: metrics::ece(&c, &y, opts.bins, BinRule::Floor),
        ece_rlcr: metrics::ece(&c, &y, opts.bins, BinRule::Rlcr),
        auroc,
        se: StandardErrors {
            format_rate_answers: metrics::binomial_se(fmt_a, fmt_a_n),
            format_rate_confidences: metrics::binomial_se(fmt_c, fmt_c_n),
            parse_rate_strict: if no_conf_col {
                None
            } else {
                metrics::binomial_se(strict, confs)
            },
            mean_confidence: metrics::standard_error_of_mean(&c),
            brier: metrics::brier_se(&c, &y),
            ece: metrics::ece_se(&c, &y, opts.bins, opts.ece_rule),
            auroc: auroc.and_then(|a| metrics::auroc_se(a, n_pos, c.len() as u64 - n_pos)),
        },
        length_correct_answers: metrics::mean(&len_ok),
        length_wrong_answers: metrics::mean(&len_bad),
        answer_turn: turn_stats(rows, SampleType::Answer, keep),
        confidence_turn: turn_stats(rows, SampleType::Confidence, keep),
    }
}

/// Consistency findings of a table.
pub fn diagnostics(rows: &Rows) -> Diagnostics {
    let answers = rows.answer_rows();
    let (mut orphans, mut mismatches) = (0u64, 0u64);
    for i in 0..rows.len() {
        if rows.kind[i] != SampleType::Confidence {
            continue;
        }
        match answer_row_of(rows, &answers, i) {
            None => orphans += 1,
            Some(a) => {
                if let (Some(x), Some(y)) = (rows.acc[i], rows.acc[a]) {
                    if x != y {
                        mismatches += 1;
                    }
                }
            }
        }
    }
    Diagnostics {
        missing_columns: rows.missing_columns.iter().cloned().collect(),
        invalid_confidences: rows.invalid_confidences,
        confidences_without_answer: orphans,
        label_mismatches: mismatches,
    }
}

/// The reliability table of the rows selected by `keep` (bins and rule of `opts`).
fn reliability(rows: &Rows, keep: &dyn Fn(usize) -> bool, opts: &Options) -> Vec<Bin> {
    let (c, y, _, _) = calibration_pairs(rows, keep, opts.missing_confidence);
    metrics::reliability_bins(&c, &y, opts.bins, opts.ece_rule)
}

/// The whole report of one table.
pub fn build(input: &str, rows: &Rows, opts: &Options) -> Report {
    let all = |_: usize| true;
    let overall = metrics_for(rows, &all, opts);
    let mut per_source = BTreeMap::new();
    let mut per_source_reliability = BTreeMap::new();
    for s in 0..rows.sources.len() as u32 {
        let keep = |i: usize| rows.source[i] == s;
        let name = rows.sources.name(s).to_string();
        per_source.insert(name.clone(), metrics_for(rows, &keep, opts));
        per_source_reliability.insert(name, reliability(rows, &keep, opts));
    }
    Report {
        input: input.to_string(),
        iteration: 1,
        options: *opts,
        overall,
        per_source,
        reliability: reliability(rows, &all, opts),
        per_source_reliability,
        diagnostics: diagnostics(rows),
        held_in: BTreeMap::new(),
    }
}

/// Row indices of the example rows of `report.md` (global, in the order shown).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Examples {
    /// Wrong answers with the highest stated confidence (calibration rows).
    pub most_confident_wrong: Vec<usize>,
    /// Correct answers with the lowest stated confidence (calibration rows).
    pub least_confident_right: Vec<usize>,
    /// Confidence rows without a strictly parsed confidence, in file order.
    pub unparseable: Vec<usize>,
    /// Answer rows with `format_ok = false`, in file order.
    pub malformed_answers: Vec<usize>,
}

impl Examples {
    /// Every row shown, plus the answer row of each confidence row shown (for its answer text).
    pub fn wanted_rows(&self, rows: &Rows) -> BTreeSet<usize> {
        let answers = rows.answer_rows();
        let mut w = BTreeSet::new();
        for &i in self
            .most_confident_wrong
            .iter()
            .chain(&self.least_confident_right)
            .chain(&self.unparseable)
            .chain(&self.malformed_answers)
        {
            w.insert(i);
            if rows.kind[i] == SampleType::Confidence {
                if let Some(a) = answer_row_of(rows, &answers, i) {
                    w.insert(a);
                }
            }
        }
        w
    }
}

/// Pick up to `k` rows of each kind. Ties are broken by file order, so the choice is
/// deterministic.
pub fn select_examples(rows: &Rows, k: usize) -> Examples {
    let from = calibration_source(rows);
    let mut wrong: Vec<(f64, usize)> = Vec::new();
    let mut right: Vec<(f64, usize)> = Vec::new();
    let mut unparseable = Vec::new();
    let mut malformed = Vec::new();
    for i in 0..rows.len() {
        if rows.kind[i] == from {
            if let (Some(c), Some(y)) = (rows.confidence[i], rows.acc[i]) {
                if metrics::is_positive(y) {
                    right.push((c, i));
                } else {
                    wrong.push((c, i));
                }
            }
        }
        if rows.kind[i] == SampleType::Confidence
            && rows.confidence[i].is_none()
            && !rows.missing_columns.contains("confidence")
            && unparseable.len() < k
        {
            unparseable.push(i);
        }
        if rows.kind[i] == SampleType::Answer
            && rows.format_ok[i] == Some(false)
            && malformed.len() < k
        {
            malformed.push(i);
        }
    }
    wrong.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    right.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    Examples {
        most_confident_wrong: wrong.iter().take(k).map(|x| x.1).collect(),
        least_confident_right: right.iter().take(k).map(|x| x.1).collect(),
        unparseable,
        malformed_answers: malformed,
    }
}

/// Reward and length samples of one turn for the histograms (rows in file order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnSamples {
    /// Rewards (same column choice as [`turn_stats`]).
    pub rewards: Vec<f64>,
    /// Response lengths in tokens.
    pub lengths: Vec<u32>,
}

/// The histogram inputs of both turns: `(answers, confidences)`.
pub fn turn_samples(rows: &Rows) -> (TurnSamples, TurnSamples) {
    let (answer_rewards, _) = reward_column(rows, SampleType::Answer);
    let (confidence_rewards, _) = reward_column(rows, SampleType::Confidence);
    let mut out = (TurnSamples::default(), TurnSamples::default());
    for i in 0..rows.len() {
        let (t, rewards) = match rows.kind[i] {
            SampleType::Answer => (&mut out.0, answer_rewards),
            SampleType::Confidence => (&mut out.1, confidence_rewards),
        };
        if let Some(r) = rewards[i] {
            t.rewards.push(r);
        }
        if let Some(l) = rows.length[i] {
            t.lengths.push(l);
        }
    }
    out
}

/// The answer row of row `i`: its `(prompt, answer_idx)` looked up in `answers`
/// ([`Rows::answer_rows`]).
pub fn answer_row_of(rows: &Rows, answers: &HashMap<(u32, i32), usize>, i: usize) -> Option<usize> {
    answers.get(&(rows.prompt[i], rows.answer_idx[i])).copied()
}

#[cfg(test)]
mod tests {
    use super::super::data::tests::{batch, TRow};
    use super::*;

    /// Two prompts, G_a = 2 answers each, G_c = 2 confidences per answer.
    ///   p0/a0 correct, confidences 0.9 and 0.7 → Brier rewards 0.99, 0.91
    ///   p0/a1 wrong,   confidences 0.2 and 0.2 → 0.96, 0.96 (no signal)
    ///   p1/a0 wrong,   confidences 0.6 and missing → 0.64, 0
    ///   p1/a1 wrong,   confidences 0.3 and 0.1 → 0.91, 0.99
    /// p1 has two wrong answers → its answer group carries no signal.
    #[rustfmt::skip]
    fn table() -> Vec<TRow<'static>> {
        vec![
            ("answer", "p0", 0, "countdown", 10, true, 1.0, None, None, 1.0, "a"),
            ("answer", "p0", 1, "countdown", 20, true, 0.0, None, None, 0.0, "a"),
            ("answer", "p1", 0, "math", 30, false, 0.0, None, None, 0.0, "a"),
            ("answer", "p1", 1, "math", 40, true, 0.0, None, None, 0.0, "a"),
            ("confidence", "p0", 0, "countdown", 3, true, 1.0, Some(0.9), Some(0.99), 0.99, ""),
            ("confidence", "p0", 0, "countdown", 5, true, 1.0, Some(0.7), Some(0.91), 0.91, ""),
            ("confidence", "p0", 1, "countdown", 4, true, 0.0, Some(0.2), Some(0.96), 0.96, ""),
            ("confidence", "p0", 1, "countdown", 4, true, 0.0, Some(0.2), Some(0.96), 0.96, ""),
            ("confidence", "p1", 0, "math", 6, true, 0.0, Some(0.6), Some(0.64), 0.64, ""),
            ("confidence", "p1", 0, "math", 2, false, 0.0, None, Some(0.0), 0.0, "<confidence>sixty</confidence>"),
            ("confidence", "p1", 1, "math", 4, true, 0.0, Some(0.3), Some(0.91), 0.91, ""),
            ("confidence", "p1", 1, "math", 4, true, 0.0, Some(0.1), Some(0.99), 0.99, "<confidence>0.1</confidence>"),
        ]
    }

    /// Inputs are float32 columns, so figures match hand calculations to ~1e-7.
    fn close(a: Option<f64>, b: f64) -> bool {
        matches!(a, Some(a) if (a - b).abs() < 1e-6)
    }

    #[test]
    fn metrics_by_hand() {
        let rows = Rows::from_batches([&batch(&table())]).expect("rows");
        let r = build("t", &rows, &Options::default());
        let m = &r.overall;
        assert_eq!((m.rows, m.answers, m.confidences), (12, 4, 8));
        assert!(close(m.accuracy, 0.25));
        assert!(close(m.accuracy_se, (0.25f64 * 0.75 / 4.0).sqrt()));
        assert!(close(m.format_rate_answers, 0.75));
        assert!(close(m.format_rate_confidences, 7.0 / 8.0));
        assert!(close(m.parse_rate_strict, 7.0 / 8.0));
        assert!(close(m.parse_rate_lenient, 7.0 / 8.0)); // "sixty" fails leniently too
                                                         // calibration: c = [0.9,0.7,0.2,0.2,0.6,0(missing),0.3,0.1], y = [1,1,0,0,0,0,0,0]
        assert_eq!(m.calibration_rows, 8);
        assert_eq!(m.missing_confidences_as_zero, 1);
        assert!(close(m.mean_confidence, 3.0 / 8.0));
        // Brier: 0.01 + 0.09 + 0.04 + 0.04 + 0.36 + 0 + 0.09 + 0.01 = 0.64 → 0.08
        assert!(close(m.brier, 0.08));
        // AUROC: positives 0.9, 0.7 beat all 6 negatives → 1
        assert!(close(m.auroc, 1.0));
        // ECE floor, 10 bins: bins 9:(0.9,1) 7:(0.7,1) 2:(0.2,0)(0.2,0) 6:(0.6,0) 0:(0,0) 3:(0.3,0) 1:(0.1,0)
        // |gaps|·n: 0.1 + 0.3 + 0.4 + 0.6 + 0 + 0.3 + 0.1 = 1.8 → 0.225
        assert!(close(m.ece, 0.225));
        assert!(close(m.ece_floor, 0.225));
        // RLCR rule: 0.3 → bin 2 with the 0.2s: |0.7/3 − 0|·3 = 0.7 replaces 0.4 + 0.3 → same total
        assert!(close(m.ece_rlcr, 0.225));
        assert!(close(m.length_correct_answers, 10.0));
        assert!(close(m.length_wrong_answers, 30.0));
        // per-turn statistics
        let a = &m.answer_turn;
        assert_eq!((a.rows, a.groups, a.groups_with_signal), (4, 2, 1));
        assert!(close(a.signal_fraction, 0.5));
        assert!(close(a.reward_mean, 0.25));
        assert!(close(a.reward_std, 0.5)); // [1,0,0,0]: Σ(x−¼)² = 0.75, /3 = 0.25
        assert!(close(a.length_mean, 25.0));
        assert_eq!((a.length_min, a.length_max), (Some(10), Some(40)));
        let c = &m.confidence_turn;
        assert_eq!((c.rows, c.groups, c.groups_with_signal), (8, 4, 3));
        assert!(close(c.signal_fraction, 0.75));
        assert!(close(c.mean_group_size, 2.0));
        assert!(close(
            c.reward_mean,
            (0.99 + 0.91 + 0.96 + 0.96 + 0.64 + 0.0 + 0.91 + 0.99) / 8.0
        ));
        assert!(close(c.length_mean, 4.0));
        // per source
        assert_eq!(r.per_source.len(), 2);
        let cd = &r.per_source["countdown"];
        assert!(close(cd.accuracy, 0.5));
        assert_eq!(cd.answer_turn.groups_with_signal, 1);
        let ma = &r.per_source["math"];
        assert!(close(ma.accuracy, 0.0));
        assert_eq!(ma.auroc, None);
        assert_eq!(r.diagnostics, Diagnostics::default());
        // drop policy: 7 rows, brier 0.64/7
        let opts = Options {
            missing_confidence: MissingConfidence::Drop,
            ..Options::default()
        };
        let m2 = metrics_for(&rows, &|_| true, &opts);
        assert_eq!(m2.calibration_rows, 7);
        assert!(close(m2.brier, 0.64 / 7.0));
    }

    #[test]
    fn reliability_table_sums_to_rows() {
        let rows = Rows::from_batches([&batch(&table())]).expect("rows");
        let r = build("t", &rows, &Options::default());
        assert_eq!(r.reliability.iter().map(|b| b.count).sum::<u64>(), 8);
        assert!(close(metrics::ece_from_bins(&r.reliability), 0.225));
    }

    #[test]
    fn examples_and_diagnostics() {
        let mut t = table();
        // A confidence row without its answer, and one whose label differs from its answer's.
        for (prompt, answer, source) in [("p9", 0, "math"), ("p0", 1, "countdown")] {
            t.push((
                "confidence",
                prompt,
                answer,
                source,
                1,
                true,
                1.0,
                Some(0.5),
                Some(0.75),
                0.75,
                "",
            ));
        }
        let rows = Rows::from_batches([&batch(&t)]).expect("rows");
        let d = diagnostics(&rows);
        assert_eq!(d.confidences_without_answer, 1);
        assert_eq!(d.label_mismatches, 1);
        let ex = select_examples(&rows, 2);
        assert_eq!(ex.most_confident_wrong, vec![8, 10]); // 0.6, then 0.3
        assert_eq!(ex.least_confident_right, vec![12, 13]); // 0.5 (p9), 0.5 (p0/a1) by file order
        assert_eq!(ex.unparseable, vec![9]);
        assert_eq!(ex.malformed_answers, vec![2]);
        let w = ex.wanted_rows(&rows);
        assert!(w.contains(&2) && w.contains(&1) && w.contains(&9));
    }

    #[test]
    fn unscored_table_gives_nulls_not_panics() {
        use arrow::array::{ArrayRef, RecordBatch, StringArray};
        use arrow::datatypes::{DataType, Field, Schema};
        use std::sync::Arc;
        let schema = Schema::new(vec![Field::new("sample_type", DataType::Utf8, false)]);
        let col: ArrayRef = Arc::new(StringArray::from(vec!["answer", "confidence"]));
        let b = RecordBatch::try_new(Arc::new(schema), vec![col]).expect("batch");
        let rows = Rows::from_batches([&b]).expect("rows");
        let r = build("t", &rows, &Options::default());
        let m = &r.overall;
        assert_eq!((m.answers, m.confidences, m.calibration_rows), (1, 1, 0));
        assert_eq!(
            (m.accuracy, m.brier, m.ece, m.auroc),
            (None, None, None, None)
        );
        assert_eq!((m.parse_rate_strict, m.parse_rate_lenient), (None, None));
        assert_eq!(m.answer_turn.groups, 1);
        assert_eq!(m.answer_turn.groups_with_signal, 0);
        assert!(r
            .diagnostics
            .missing_columns
            .contains(&"acc_reward".to_string()));
        let md = crate::report::markdown::render(&[r], None, None, &Default::default(), &[]);
        assert!(md.contains("| Brier score | – |"), "{md}");
    }

    #[test]
    fn single_turn_tables_use_answer_rows() {
        #[rustfmt::skip]
        let t = vec![
            ("answer", "p0", 0, "s", 1, true, 1.0, Some(0.8), None, 1.0, ""),
            ("answer", "p0", 1, "s", 1, true, 0.0, Some(0.4), None, 0.0, ""),
        ];
        let rows = Rows::from_batches([&batch(&t)]).expect("rows");
        let m = metrics_for(&rows, &|_| true, &Options::default());
        assert_eq!(m.calibration_rows_from, "answer");
        assert!(close(m.brier, (0.04 + 0.16) / 2.0));
        assert!(close(m.auroc, 1.0));
    }
}
