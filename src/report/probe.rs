//! The report's side of the faithfulness probe: reading a probe table (schema
//! `rlcr.probe`, one row per (answer rollout, cut point)) and summarising it into the probe curves.
//!
//! Design decisions:
//! - **Counts are the truth.** A row's Monte-Carlo confidence is recomputed from its counts,
//!   `num_correct / num_samples` (stored so that any later aggregation is exact),
//!   and a stored `probe_confidence` that disagrees by more than 1e-6 is an error, as is
//!   `num_correct > num_samples` or `num_samples = 0`: such a file was not written by `probe`.
//! - **Curves are grouped by `cut_index`**, with x = the mean `cut_fraction` of the group: `probe`
//!   cuts every rollout at the same fractions, so the mean is the fraction itself, and grouping by
//!   index stays right if a future probe stores the realised, token-rounded fraction instead.
//! - The curve's uncertainty is the standard error of the mean **across rollouts** (the spread
//!   that matters for "how does confidence grow with thinking"); the per-row binomial error
//!   `sqrt(p(1−p)/N)` (`docs/math.md` §4.5) is reported per cut as its mean, to show how much of that
//!   spread the Monte-Carlo sampling alone explains.
//! - A rollout's **final probe** is its row with the largest `cut_fraction` (ties: largest
//!   `cut_index`); it is compared with the verbal confidence and with correctness.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use arrow::array::{ArrayRef, RecordBatch};
use serde::{Deserialize, Serialize};

use super::data::{f64s, ints, text};
use super::metrics::{self, BinRule};
use crate::table::intern::Interner;

/// One probe row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeRow {
    /// Interned `sample_id` of the answer rollout.
    pub rollout: u32,
    /// `cut_index`.
    pub cut_index: i64,
    /// `cut_fraction` in `[0, 1]`.
    pub cut_fraction: f64,
    /// `num_samples` (N).
    pub num_samples: u64,
    /// `num_correct` (0 ≤ k ≤ N).
    pub num_correct: u64,
    /// `verbal_confidence` (mean stated confidence of the answer), if any.
    pub verbal: Option<f64>,
    /// `acc_reward` of the answer.
    pub acc: Option<f64>,
}

impl ProbeRow {
    /// `num_correct / num_samples`.
    pub fn confidence(&self) -> f64 {
        self.num_correct as f64 / self.num_samples as f64
    }
}

/// A probe table in memory (it is small: rollouts × cuts).
#[derive(Clone, Debug, Default)]
pub struct ProbeRows {
    /// Rows in file order.
    pub rows: Vec<ProbeRow>,
    /// Rollout ids (`sample_id`).
    pub rollouts: Interner,
}

fn col<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    b.column_by_name(name).with_context(|| {
        format!("the probe table has no `{name}` column (is it an rlcr.probe table?)")
    })
}

impl ProbeRows {
    /// Append a batch, validating counts. Errors name the row (global, 0-based) and column.
    pub fn push_batch(&mut self, b: &RecordBatch) -> Result<()> {
        let base = self.rows.len();
        let sid = text(col(b, "sample_id")?, "sample_id")?;
        let cut_index = ints(col(b, "cut_index")?, "cut_index")?;
        let frac = f64s(col(b, "cut_fraction")?, "cut_fraction")?;
        let n = ints(col(b, "num_samples")?, "num_samples")?;
        let k = ints(col(b, "num_correct")?, "num_correct")?;
        let stored = b
            .column_by_name("probe_confidence")
            .map(|a| f64s(a, "probe_confidence"))
            .transpose()?;
        let verbal = b
            .column_by_name("verbal_confidence")
            .map(|a| f64s(a, "verbal_confidence"))
            .transpose()?;
        let acc = b
            .column_by_name("acc_reward")
            .map(|a| f64s(a, "acc_reward"))
            .transpose()?;
        for i in 0..b.num_rows() {
            let row = base + i;
            let need = |v: Option<i64>, name: &str| {
                v.with_context(|| format!("probe row {row}: `{name}` is null"))
            };
            let (n_i, k_i) = (need(n[i], "num_samples")?, need(k[i], "num_correct")?);
            if n_i <= 0 || k_i < 0 || k_i > n_i {
                bail!("probe row {row}: need 0 ≤ num_correct ≤ num_samples and num_samples > 0, found {k_i}/{n_i}");
            }
            let f = frac[i].with_context(|| format!("probe row {row}: `cut_fraction` is null"))?;
            if !(0.0..=1.0).contains(&f) {
                bail!("probe row {row}: `cut_fraction` {f} is outside [0, 1]");
            }
            let p = k_i as f64 / n_i as f64;
            if let Some(Some(s)) = stored.as_ref().map(|v| v[i]) {
                if !s.is_finite() || (s - p).abs() > 1e-6 {
                    bail!("probe row {row}: `probe_confidence` {s} ≠ num_correct/num_samples = {k_i}/{n_i}");
                }
            }
            let name = sid.get(i).unwrap_or("");
            let verbal_i = verbal.as_ref().and_then(|v| v[i]).filter(|v| v.is_finite());
            self.rows.push(ProbeRow {
                rollout: self.rollouts.intern(name),
                cut_index: cut_index[i].unwrap_or(-1),
                cut_fraction: f,
                num_samples: n_i as u64,
                num_correct: k_i as u64,
                verbal: verbal_i,
                acc: acc.as_ref().and_then(|v| v[i]),
            });
        }
        Ok(())
    }

    /// Build from batches.
    pub fn from_batches<'a>(
        batches: impl IntoIterator<Item = &'a RecordBatch>,
    ) -> Result<ProbeRows> {
        let mut r = ProbeRows::default();
        for b in batches {
            r.push_batch(b)?;
        }
        Ok(r)
    }

    /// Index of each rollout's final row (largest `cut_fraction`, then largest `cut_index`), in
    /// rollout-id order.
    pub fn final_rows(&self) -> Vec<usize> {
        let mut best: BTreeMap<u32, usize> = BTreeMap::new();
        for (i, r) in self.rows.iter().enumerate() {
            let e = best.entry(r.rollout).or_insert(i);
            let b = &self.rows[*e];
            if (r.cut_fraction, r.cut_index) > (b.cut_fraction, b.cut_index) {
                *e = i;
            }
        }
        best.into_values().collect()
    }
}

/// The probe at one cut point, over all rollouts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeCut {
    /// `cut_index`.
    pub cut_index: i64,
    /// Mean `cut_fraction` of the rows with this index.
    pub cut_fraction: f64,
    /// Rollouts with a row at this cut.
    pub rollouts: u64,
    /// `Σ num_samples`.
    pub samples: u64,
    /// `Σ num_correct`.
    pub correct: u64,
    /// Mean over rollouts of `num_correct / num_samples`.
    pub mean_probe: f64,
    /// Standard error of `mean_probe` across rollouts (`None` with one rollout).
    pub se: Option<f64>,
    /// Mean per-row binomial standard error `sqrt(p(1−p)/N)` (`docs/math.md` §4.5).
    pub mean_binomial_se: f64,
    /// `mean_probe` over rollouts whose final answer is correct.
    pub mean_probe_correct: Option<f64>,
    /// `mean_probe` over rollouts whose final answer is wrong.
    pub mean_probe_wrong: Option<f64>,
    /// Brier score of the probe confidence against the answer's correctness.
    pub brier: Option<f64>,
    /// AUROC of the probe confidence for the answer's correctness.
    pub auroc: Option<f64>,
}

/// Calibration of one confidence signal against correctness.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SignalCalibration {
    /// Rollouts with both the signal and a label.
    pub n: u64,
    /// Mean of the signal.
    pub mean: Option<f64>,
    /// Brier score.
    pub brier: Option<f64>,
    /// ECE (bins and rule of the report).
    pub ece: Option<f64>,
    /// AUROC (ties ½).
    pub auroc: Option<f64>,
}

/// Summary of a probe table (`metrics.json` → `probe`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeSummary {
    /// Probe rows.
    pub rows: u64,
    /// Distinct rollouts.
    pub rollouts: u64,
    /// Mean `acc_reward` over rollouts.
    pub accuracy: Option<f64>,
    /// Per cut, ordered by `cut_index`.
    pub cuts: Vec<ProbeCut>,
    /// The final probe (largest cut) against correctness.
    pub final_probe: SignalCalibration,
    /// The verbal confidence against correctness (rollouts that have one).
    pub verbal: SignalCalibration,
    /// Pearson correlation of final probe and verbal confidence.
    pub pearson_final_probe_verbal: Option<f64>,
}

fn calib(c: &[f64], y: &[f64], bins: usize, rule: BinRule) -> SignalCalibration {
    SignalCalibration {
        n: c.len() as u64,
        mean: metrics::mean(c),
        brier: metrics::brier(c, y),
        ece: metrics::ece(c, y, bins, rule),
        auroc: metrics::auroc(c, y),
    }
}

/// Summarise a probe table. `bins` and `rule` are the report's ECE settings.
pub fn summarize(p: &ProbeRows, bins: usize, rule: BinRule) -> ProbeSummary {
    let mut by_cut: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, r) in p.rows.iter().enumerate() {
        by_cut.entry(r.cut_index).or_default().push(i);
    }
    let cuts = by_cut
        .into_iter()
        .map(|(cut_index, idx)| {
            let rows: Vec<&ProbeRow> = idx.iter().map(|&i| &p.rows[i]).collect();
            let conf: Vec<f64> = rows.iter().map(|r| r.confidence()).collect();
            let of = |want: bool| -> Vec<f64> {
                rows.iter()
                    .filter(|r| r.acc.map(metrics::is_positive) == Some(want))
                    .map(|r| r.confidence())
                    .collect()
            };
            let labelled: Vec<(f64, f64)> = rows
                .iter()
                .filter_map(|r| Some((r.confidence(), r.acc?)))
                .collect();
            let (lc, ly): (Vec<f64>, Vec<f64>) = labelled.into_iter().unzip();
            let bse: Vec<f64> = rows
                .iter()
                .map(|r| metrics::binomial_se(r.num_correct, r.num_samples).unwrap_or(0.0))
                .collect();
            let fr: Vec<f64> = rows.iter().map(|r| r.cut_fraction).collect();
            ProbeCut {
                cut_index,
                cut_fraction: metrics::mean(&fr).unwrap_or(0.0),
                rollouts: rows.len() as u64,
                samples: rows.iter().map(|r| r.num_samples).sum(),
                correct: rows.iter().map(|r| r.num_correct).sum(),
                mean_probe: metrics::mean(&conf).unwrap_or(0.0),
                se: metrics::standard_error_of_mean(&conf),
                mean_binomial_se: metrics::mean(&bse).unwrap_or(0.0),
                mean_probe_correct: metrics::mean(&of(true)),
                mean_probe_wrong: metrics::mean(&of(false)),
                brier: metrics::brier(&lc, &ly),
                auroc: metrics::auroc(&lc, &ly),
            }
        })
        .collect();
    let finals = p.final_rows();
    let (mut fc, mut fy, mut vc, mut vy, mut pv, mut pf, mut acc) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for &i in &finals {
        let r = &p.rows[i];
        if let Some(y) = r.acc {
            acc.push(y);
            fc.push(r.confidence());
            fy.push(y);
            if let Some(v) = r.verbal {
                vc.push(v);
                vy.push(y);
            }
        }
        if let Some(v) = r.verbal {
            pv.push(v);
            pf.push(r.confidence());
        }
    }
    ProbeSummary {
        rows: p.rows.len() as u64,
        rollouts: finals.len() as u64,
        accuracy: metrics::mean(&acc),
        cuts,
        final_probe: calib(&fc, &fy, bins, rule),
        verbal: calib(&vc, &vy, bins, rule),
        pearson_final_probe_verbal: metrics::pearson(&pf, &pv),
    }
}

/// Points of the probe-vs-verbal scatter: `(verbal, final probe, correct)` per rollout that has a
/// verbal confidence, in rollout-id order.
pub fn scatter_points(p: &ProbeRows) -> Vec<(f64, f64, Option<bool>)> {
    p.final_rows()
        .into_iter()
        .filter_map(|i| {
            let r = &p.rows[i];
            Some((r.verbal?, r.confidence(), r.acc.map(metrics::is_positive)))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use arrow::array::{Float32Array, Int32Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    /// (sample_id, cut_index, cut_fraction, N, correct, stored probe conf, verbal, acc)
    pub type PRow<'a> = (&'a str, i32, f32, i32, i32, f32, Option<f32>, f32);

    pub fn probe_batch(rows: &[PRow]) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("sample_id", DataType::Utf8, false),
            Field::new("prompt_id", DataType::Utf8, false),
            Field::new("answer_idx", DataType::Int32, false),
            Field::new("cut_index", DataType::Int32, false),
            Field::new("cut_fraction", DataType::Float32, false),
            Field::new("cut_token", DataType::Int32, false),
            Field::new("num_samples", DataType::Int32, false),
            Field::new("num_correct", DataType::Int32, false),
            Field::new("probe_confidence", DataType::Float32, false),
            Field::new("verbal_confidence", DataType::Float32, true),
            Field::new("acc_reward", DataType::Float32, false),
        ]);
        let cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0.split('/').next().unwrap_or("")),
            )),
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|_| 0))),
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(Int32Array::from_iter_values(
                rows.iter().map(|r| (r.2 * 100.0) as i32),
            )),
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.3))),
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.4))),
            Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r.5))),
            Arc::new(Float32Array::from_iter(rows.iter().map(|r| r.6))),
            Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r.7))),
        ];
        // ok: test helper with consistent lengths
        RecordBatch::try_new(Arc::new(schema), cols).expect("batch")
    }

    /// Two rollouts × three cuts, N = 50 (the counts of docs/math.md §4.5 appear: 37/50, 25/50, 0/50, 50/50).
    pub fn sample() -> Vec<PRow<'static>> {
        vec![
            ("p0/a0", 0, 0.0, 50, 25, 0.5, Some(0.9), 1.0),
            ("p0/a0", 1, 0.5, 50, 37, 0.74, Some(0.9), 1.0),
            ("p0/a0", 2, 1.0, 50, 50, 1.0, Some(0.9), 1.0),
            ("p1/a0", 0, 0.0, 50, 0, 0.0, Some(0.6), 0.0),
            ("p1/a0", 1, 0.5, 50, 0, 0.0, Some(0.6), 0.0),
            ("p1/a0", 2, 1.0, 50, 25, 0.5, Some(0.6), 0.0),
        ]
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        matches!(a, Some(a) if (a - b).abs() < 1e-9)
    }

    #[test]
    fn summary_by_hand() {
        let p = ProbeRows::from_batches([&probe_batch(&sample())]).expect("probe");
        let s = summarize(&p, 10, BinRule::Floor);
        assert_eq!((s.rows, s.rollouts), (6, 2));
        assert!(close(s.accuracy, 0.5));
        assert_eq!(s.cuts.len(), 3);
        let c1 = &s.cuts[1];
        assert_eq!((c1.samples, c1.correct), (100, 37));
        assert!(close(Some(c1.mean_probe), 0.37));
        // SE across rollouts of [0.74, 0]: s = 0.74/√2, / √2 → 0.37
        assert!(close(c1.se, 0.37));
        // mean binomial SE: (sqrt(.74·.26/50) + 0)/2 (docs/math.md §4.5: 0.0620)
        assert!(close(
            Some(c1.mean_binomial_se),
            (0.74f64 * 0.26 / 50.0).sqrt() / 2.0
        ));
        assert!(close(c1.mean_probe_correct, 0.74));
        assert!(close(c1.mean_probe_wrong, 0.0));
        assert!(close(c1.brier, (0.26f64.powi(2) + 0.0) / 2.0));
        assert!(close(c1.auroc, 1.0));
        let c0 = &s.cuts[0];
        assert!(close(c0.se, 0.25)); // [0.5, 0] → 0.5/√2/√2
                                     // Final probe: 1.0 (correct) and 0.5 (wrong): Brier (0 + 0.25)/2
        assert!(close(s.final_probe.brier, 0.125));
        assert!(close(s.final_probe.mean, 0.75));
        // Verbal 0.9 (correct), 0.6 (wrong): Brier (0.01 + 0.36)/2 (f32 inputs → loose tolerance)
        assert!(s.verbal.brier.is_some_and(|b| (b - 0.185).abs() < 1e-6));
        assert!(close(s.verbal.auroc, 1.0));
        assert!(close(s.pearson_final_probe_verbal, 1.0));
        let pts = scatter_points(&p);
        assert_eq!(pts.len(), 2);
        assert_eq!(pts[0].1, 1.0);
        assert_eq!(pts[0].2, Some(true));
    }

    #[test]
    fn inconsistent_counts_are_errors() {
        let mut bad = sample();
        bad[4].4 = 51;
        let e = ProbeRows::from_batches([&probe_batch(&bad)]).expect_err("k > N");
        assert!(format!("{e:#}").contains("probe row 4"), "{e:#}");
        let mut bad = sample();
        bad[2].5 = 0.9;
        let e = ProbeRows::from_batches([&probe_batch(&bad)]).expect_err("stored conf");
        assert!(format!("{e:#}").contains("probe_confidence"), "{e:#}");
        let mut bad = sample();
        bad[0].3 = 0;
        bad[0].4 = 0;
        assert!(ProbeRows::from_batches([&probe_batch(&bad)]).is_err());
    }
}
