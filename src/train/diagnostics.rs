//! What an update shows besides its loss: the rollout/trainer mismatch, the KL of the policy to
//! the reference (the warm start in the loop) and the response lengths. Pure functions over plain
//! slices; the trainer feeds them and writes their figures into the step metrics
//! ([`super::trainer::StepMetrics`]), and so into `train_metrics.jsonl`, TensorBoard and `report`.
//!
//! - **Rollout/trainer mismatch** ([`Mismatch`]): before the first optimizer step the trainer's
//!   log-prob of each learnable token and the behaviour log-prob the sampler recorded
//!   (`response_logprobs`) describe the same weights, so they must agree to rounding. A gap is a
//!   bug of the pipeline (another temperature, precision, tokenisation, chat template, dropout or
//!   a stale policy) that turns every ratio into a bias. Measured on the first update batch of a
//!   call, over the learnable tokens of the rows that run a forward pass: `max` and `mean` of
//!   `|old − logp|`, and of the ratio's deviation `|exp(logp − old) − 1|` (the log-ratio clamped to
//!   ±20 as the loss clamps it). On the CPU, f32, temperature 1 both sides: ≤ 1e-4
//!   (`update --max-mismatch` turns a larger one into an error).
//! - **KL to the reference** ([`ref_kl`]): Schulman's k3 with verl's clamps (`low_var_kl`):
//!   `x = clamp(ref − old, ±20)`, `kl = clamp(eˣ − x − 1, ±10)`, averaged over every learnable token
//!   of the table. The tokens were sampled by the behaviour policy, so this estimates
//!   KL(behaviour ‖ reference): how far the policy that wrote this batch has moved from the warm
//!   start. It needs no forward pass of the policy (only the reference log-probs).
//! - **Response length** ([`mean_lengths`]): mean tokens of the answer rows and of the confidence
//!   rows of an update batch.
//! - **The turns' gradients** ([`TurnGrads`], `update --turn-grad-norms`): the first update
//!   batch's gradient is the answer rows' part plus the confidence rows' part (the loss is a sum
//!   over rows with fixed aggregation weights); their norms and the cosine between them say which
//!   turn moves the shared weights and whether the two pull against each other. A confidence
//!   turn whose part is a small fraction of the answers' learns little: Adam's step is about the
//!   learning rate per weight, spent along the sum.
use anyhow::{bail, Result};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

use super::data::TrainRow;
use super::loss::{kl_estimate, KlEstimator, LOG_RATIO_CLAMP};

/// Rollout/trainer mismatch over a set of tokens (sums, so micro-batches merge).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    /// max |old − logp|.
    pub logp_max: f64,
    /// Σ |old − logp|.
    pub logp_sum: f64,
    /// max |exp(clamp(logp − old, ±20)) − 1|.
    pub ratio_max: f64,
    /// Σ |exp(clamp(logp − old, ±20)) − 1|.
    pub ratio_sum: f64,
    /// Tokens counted.
    pub tokens: usize,
}

impl Mismatch {
    /// Add the tokens `t` with `mask[t]` of one row (or of a right-aligned block: the three
    /// slices are parallel). A non-finite difference makes the maxima NaN (never hidden).
    pub fn add(&mut self, logp: &[f32], old: &[f32], mask: &[bool]) {
        for ((&l, &o), &m) in logp.iter().zip(old).zip(mask) {
            if !m {
                continue;
            }
            let d = l as f64 - o as f64;
            let r = (d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp() - 1.0).abs();
            self.logp_sum += d.abs();
            self.ratio_sum += r;
            self.logp_max = nan_max(self.logp_max, d.abs());
            self.ratio_max = nan_max(self.ratio_max, r);
            self.tokens += 1;
        }
    }

    /// Add the learnable tokens of a micro-batch: `logp` is its `[rows.len(), width]` block of
    /// trainer log-probs, right-aligned (each row's response ends at the last column).
    pub fn add_right_aligned(&mut self, logp: &[f32], rows: &[&TrainRow], width: usize) {
        for (j, row) in rows.iter().enumerate() {
            let n = row.response.len().min(width);
            let end = (j + 1) * width;
            if let Some(lp) = logp.get(end - n..end) {
                let k = row.old_logp.len() - n;
                self.add(lp, &row.old_logp[k..], &row.mask[k..]);
            }
        }
    }

    /// An error when the largest gap is above `limit` ([`Mismatch::exceeds`]).
    pub fn check(&self, limit: f64) -> Result<()> {
        if self.exceeds(limit) {
            bail!(
                "rollout/trainer mismatch: before any optimizer step, max |behaviour log-prob − \
                 trainer log-prob| is {:.3e} (mean {:.3e}; ratio |r − 1| max {:.3e}, mean {:.3e}) \
                 over the {} learnable tokens of the first update batch, above --max-mismatch \
                 {limit:e}: the table's response_logprobs were not computed as the trainer computes \
                 them (another model, temperature, precision, tokenisation or dropout); nothing \
                 was written",
                self.logp_max,
                self.logp_mean(),
                self.ratio_max,
                self.ratio_mean(),
                self.tokens
            );
        }
        Ok(())
    }

    /// Both sets together.
    pub fn merge(&mut self, o: &Mismatch) {
        self.logp_max = nan_max(self.logp_max, o.logp_max);
        self.ratio_max = nan_max(self.ratio_max, o.ratio_max);
        self.logp_sum += o.logp_sum;
        self.ratio_sum += o.ratio_sum;
        self.tokens += o.tokens;
    }

    /// mean |old − logp| (0 over no tokens).
    pub fn logp_mean(&self) -> f64 {
        self.logp_sum / self.tokens.max(1) as f64
    }

    /// mean |ratio − 1| (0 over no tokens).
    pub fn ratio_mean(&self) -> f64 {
        self.ratio_sum / self.tokens.max(1) as f64
    }

    /// True when the largest log-prob gap is above `limit` or not a number.
    pub fn exceeds(&self, limit: f64) -> bool {
        self.logp_max.is_nan() || self.logp_max > limit
    }
}

/// max that keeps a NaN on either side.
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// The first update batch's gradient `g` split by turn: `g = g_a + g_c`, `g_c` the gradient of
/// the confidence rows' terms alone and `g_a` the answer rows'. From `‖g‖²`, `⟨g, g_c⟩` and
/// `‖g_c‖²` (one extra pass over the confidence rows):
/// `‖g_a‖² = ‖g‖² − 2⟨g, g_c⟩ + ‖g_c‖²` and `cos(g_a, g_c) = (⟨g, g_c⟩ − ‖g_c‖²) / (‖g_a‖ ‖g_c‖)`,
/// undefined when either part is 0. The three products are f32 sums, so `‖g_a‖²` is known to
/// about 1e-6 of `‖g‖² + ‖g_c‖²`: below that it is 0 (the answers' part is below the measurement's
/// resolution, as when every answer group scored alike and `g = g_c`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TurnGrads {
    /// ‖g_a‖: the answer rows' part.
    #[serde(rename = "grad/answer_norm")]
    pub answer_norm: f64,
    /// ‖g_c‖: the confidence rows' part.
    #[serde(rename = "grad/confidence_norm")]
    pub confidence_norm: f64,
    /// cos(g_a, g_c), below 0 when the turns pull the shared weights apart; `None` when either
    /// part is 0.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "grad/turn_cosine"
    )]
    pub cosine: Option<f64>,
}

/// Relative resolution of `‖g_a‖²` in [`TurnGrads::from_products`].
const ROUNDING: f64 = 1e-6;

impl TurnGrads {
    /// The split from `‖g‖²`, `⟨g, g_c⟩` and `‖g_c‖²` (formulas above).
    pub fn from_products(full_sq: f64, dot: f64, conf_sq: f64) -> TurnGrads {
        let answer_sq = full_sq - 2.0 * dot + conf_sq;
        let answer_sq = if answer_sq <= ROUNDING * (full_sq + conf_sq) {
            0.0
        } else {
            answer_sq
        };
        let (answer_norm, confidence_norm) = (answer_sq.sqrt(), conf_sq.max(0.0).sqrt());
        let cosine = (answer_norm > 0.0 && confidence_norm > 0.0)
            .then(|| ((dot - conf_sq) / (answer_norm * confidence_norm)).clamp(-1.0, 1.0));
        TurnGrads {
            answer_norm,
            confidence_norm,
            cosine,
        }
    }
}

/// The diagnostics of one optimizer step, flattened into its metrics line
/// ([`super::trainer::StepMetrics`]); each key is absent when not measured. TensorBoard groups
/// the `mismatch/…` tags in a section of their own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepDiagnostics {
    /// Mean response length (tokens) of the update batch's answer rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_length: Option<f64>,
    /// Mean response length (tokens) of the update batch's confidence rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence_length: Option<f64>,
    /// KL of the behaviour policy to the reference ([`ref_kl`]); first step of a call only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ref_kl: Option<f64>,
    /// max |behaviour − trainer log-prob| ([`Mismatch`]); first step of a call only.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "mismatch/logp_max"
    )]
    pub mismatch_logp_max: Option<f64>,
    /// mean |behaviour − trainer log-prob|.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "mismatch/logp_mean"
    )]
    pub mismatch_logp_mean: Option<f64>,
    /// max |exp(trainer − behaviour) − 1|: the ratio's deviation from 1.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "mismatch/ratio_max"
    )]
    pub mismatch_ratio_max: Option<f64>,
    /// mean |exp(trainer − behaviour) − 1|.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "mismatch/ratio_mean"
    )]
    pub mismatch_ratio_mean: Option<f64>,
    /// The first batch's gradient split by turn (`grad/answer_norm`, `grad/confidence_norm`,
    /// `grad/turn_cosine`); first step of a call only, when asked for.
    #[serde(default, flatten, skip_serializing_if = "Option::is_none")]
    pub turns: Option<TurnGrads>,
}

impl StepDiagnostics {
    /// The figures of one update batch: its lengths, and the call's KL, mismatch and turn
    /// gradients when given.
    pub fn of<'a>(
        batch: impl IntoIterator<Item = &'a TrainRow>,
        ref_kl: Option<f64>,
        mismatch: Option<&Mismatch>,
        turns: Option<&TurnGrads>,
    ) -> StepDiagnostics {
        let (response_length, confidence_length) = mean_lengths(batch);
        StepDiagnostics {
            response_length,
            confidence_length,
            ref_kl,
            mismatch_logp_max: mismatch.map(|m| m.logp_max),
            mismatch_logp_mean: mismatch.map(Mismatch::logp_mean),
            mismatch_ratio_max: mismatch.map(|m| m.ratio_max),
            mismatch_ratio_mean: mismatch.map(Mismatch::ratio_mean),
            turns: turns.copied(),
        }
    }
}

/// Mean k3 KL (verl's `low_var_kl`, clamps included) of the behaviour log-probs to the reference
/// log-probs over every learnable token of `rows`. `None` when a row has no reference log-probs
/// or there is no learnable token.
pub fn ref_kl(rows: &[TrainRow]) -> Option<f64> {
    let mut sum = 0.0;
    let mut n = 0usize;
    for r in rows {
        let reference = r.ref_logp.as_ref()?;
        for ((&m, &old), &rf) in r.mask.iter().zip(&r.old_logp).zip(reference) {
            if m {
                sum += kl_estimate(old as f64, rf as f64, KlEstimator::K3);
                n += 1;
            }
        }
    }
    (n > 0).then(|| sum / n as f64)
}

/// Mean response length (tokens) of the answer rows and of the confidence rows of `rows`; `None`
/// for a kind with no row.
pub fn mean_lengths<'a>(
    rows: impl IntoIterator<Item = &'a TrainRow>,
) -> (Option<f64>, Option<f64>) {
    let (mut a, mut na, mut c, mut nc) = (0usize, 0usize, 0usize, 0usize);
    for r in rows {
        if r.is_confidence {
            c += r.response.len();
            nc += 1;
        } else {
            a += r.response.len();
            na += 1;
        }
    }
    let mean = |s: usize, n: usize| (n > 0).then(|| s as f64 / n as f64);
    (mean(a, na), mean(c, nc))
}

/// What the first update batch of a call is checked and measured for: checks that stop the call
/// before its first optimizer step, and measurements that cost a pass of their own.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Guards {
    /// Largest rollout/trainer log-prob gap accepted on the first update batch
    /// ([`Mismatch::exceeds`]); `None`: measured and reported only.
    pub max_mismatch: Option<f64>,
    /// Split the first batch's gradient by turn ([`TurnGrads`]): one more forward and backward
    /// pass over its confidence rows.
    pub turn_grad_norms: bool,
}

impl Guards {
    /// The guards of a `--max-mismatch` limit (a number ≥ 0; anything else is a usage error)
    /// and of `--turn-grad-norms`.
    pub fn new(max_mismatch: Option<f64>, turn_grad_norms: bool) -> anyhow::Result<Guards> {
        match max_mismatch {
            Some(m) if m.is_nan() || m < 0.0 => Err(crate::usage::usage(format!(
                "--max-mismatch must be a number >= 0, got {m}"
            ))),
            max_mismatch => Ok(Guards {
                max_mismatch,
                turn_grad_norms,
            }),
        }
    }
}

/// Gradients on the host, by module path, for tests and diagnostics.
pub fn grads_to_host<M: Module>(module: &M, grads: &GradientsParams) -> Vec<(String, Vec<f32>)> {
    struct V<'a> {
        path: Vec<String>,
        grads: &'a GradientsParams,
        out: Vec<(String, Vec<f32>)>,
    }
    impl ModuleVisitor for V<'_> {
        fn enter_module(&mut self, name: &str, _c: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _c: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.get::<D>(param.id) {
                if let Ok(v) = g.into_data().convert::<f32>().try_into_vec::<f32>() {
                    self.out.push((self.path.join("."), v));
                }
            }
        }
    }
    let mut v = V {
        path: Vec::new(),
        grads,
        out: Vec::new(),
    };
    module.visit(&mut v);
    v.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(old: Vec<f32>, reference: Option<Vec<f32>>, mask: Vec<bool>, conf: bool) -> TrainRow {
        let n = old.len();
        TrainRow {
            context: vec![1, 2],
            response: (0..n as u32).collect(),
            old_logp: old,
            adv: vec![0.0; n],
            mask,
            ref_logp: reference,
            is_confidence: conf,
        }
    }

    /// Hand figures: logp − old = (+0.5, −0.25, masked, 0): |Δ| = 0.5, 0.25, 0 → max 0.5, mean
    /// 0.25; |eᐞ − 1| = e^0.5 − 1 = 0.6487212707, 1 − e^−0.25 = 0.2211992169, 0 → max 0.6487212707,
    /// mean 0.2899734959.
    #[test]
    fn mismatch_by_hand() {
        let mut m = Mismatch::default();
        m.add(
            &[-1.0, -2.25, -9.0, -0.5],
            &[-1.5, -2.0, -0.1, -0.5],
            &[true, true, false, true],
        );
        assert_eq!(m.tokens, 3);
        assert!((m.logp_max - 0.5).abs() < 1e-12);
        assert!((m.logp_mean() - 0.25).abs() < 1e-12);
        assert!((m.ratio_max - 0.648_721_270_7).abs() < 1e-9);
        assert!((m.ratio_mean() - 0.289_973_495_9).abs() < 1e-9);
        assert!(m.exceeds(0.4) && !m.exceeds(0.5));
        // Split into two parts and merged: the same figures.
        let (mut a, mut b) = (Mismatch::default(), Mismatch::default());
        a.add(&[-1.0], &[-1.5], &[true]);
        b.add(
            &[-2.25, -9.0, -0.5],
            &[-2.0, -0.1, -0.5],
            &[true, false, true],
        );
        a.merge(&b);
        assert_eq!(a.tokens, 3);
        assert!((a.logp_sum - m.logp_sum).abs() < 1e-12 && a.logp_max == m.logp_max);
        assert!((a.ratio_sum - m.ratio_sum).abs() < 1e-12 && a.ratio_max == m.ratio_max);
        // A NaN is never hidden by a max and always exceeds.
        let mut n = Mismatch::default();
        n.add(&[f32::NAN, -1.0], &[-1.0, -3.0], &[true, true]);
        assert!(n.logp_max.is_nan() && n.exceeds(1e9));
        // No tokens: zeros.
        assert_eq!(Mismatch::default().logp_mean(), 0.0);
        assert!(!Mismatch::default().exceeds(0.0));
        // A huge gap: the ratio is clamped at e^20 − 1, not infinite.
        let mut h = Mismatch::default();
        h.add(&[-0.0], &[-90.0], &[true]);
        assert!((h.ratio_max - (20f64.exp() - 1.0)).abs() < 1e-3);
    }

    /// k3 by hand (x = ref − old): x = −0.5 → e^−0.5 + 0.5 − 1 = 0.1065306597; x = 1 → e − 2 =
    /// 0.7182818285; x = 0 → 0; a masked token left out; x = 30 → clamped to 10. numpy:
    /// `x = np.array([-0.5, 1.0, 0.0]); (np.exp(x) - x - 1).mean()` = 0.2749374961.
    #[test]
    fn ref_kl_is_verls_low_var_kl() {
        let rows = vec![
            row(
                vec![-1.0, -2.0, -0.3],
                Some(vec![-1.5, -1.0, -7.0]),
                vec![true, true, false],
                false,
            ),
            row(vec![-0.7], Some(vec![-0.7]), vec![true], true),
        ];
        let kl = ref_kl(&rows).expect("kl");
        assert!((kl - 0.274_937_496_1).abs() < 1e-9, "{kl}");
        // The clamp: x = 30 (ref far above old) gives 10, not e^30.
        let far = vec![row(vec![-31.0], Some(vec![-1.0]), vec![true], false)];
        assert_eq!(ref_kl(&far), Some(10.0));
        // A row without reference log-probs: no figure.
        let mut none = rows.clone();
        none[1].ref_logp = None;
        assert_eq!(ref_kl(&none), None);
        // Nothing learnable: no figure.
        let masked = vec![row(vec![-1.0], Some(vec![-2.0]), vec![false], false)];
        assert_eq!(ref_kl(&masked), None);
    }

    /// The trainer's own measurement on the tiny model (CPU, f32): behaviour log-probs from the
    /// batched no-graph path, trainer log-probs from the training forward. Rounding level, on the
    /// first step only; the KL to a reference 0.05 below the behaviour on every token is
    /// e^−0.05 + 0.05 − 1 = 0.0012294245; the lengths are the first batch's.
    #[test]
    fn trainer_measures_mismatch_kl_and_lengths_before_its_first_step() {
        use crate::train::loss::LossAgg;
        use crate::train::optim::{AdamW, AdamWConfig};
        use crate::train::trainer::tests::{config, rows, tiny};
        use crate::train::trainer::{train_guarded, Guards};
        let m = tiny();
        let rows = rows(&m.transformer, 6, 11, 0.0);
        let mut cfg = config(LossAgg::TokenMean, 2);
        cfg.mini_batches = 2;
        let strict = Guards {
            max_mismatch: Some(1e-4),
            ..Guards::default()
        };
        let mut opt = AdamW::new(AdamWConfig::default());
        let (_, steps) = train_guarded(
            m.transformer.clone(),
            &mut opt,
            &rows,
            &cfg,
            &strict,
            |_| Ok(()),
        )
        .expect("train");
        let s0 = &steps[0];
        let (lmax, lmean) = (
            s0.diag.mismatch_logp_max.expect("max"),
            s0.diag.mismatch_logp_mean.expect("mean"),
        );
        let (rmax, rmean) = (
            s0.diag.mismatch_ratio_max.expect("max"),
            s0.diag.mismatch_ratio_mean.expect("mean"),
        );
        eprintln!(
            "CPU mismatch: logp max {lmax:e} mean {lmean:e}; ratio max {rmax:e} mean {rmean:e}"
        );
        assert!(lmax <= 1e-4 && rmax <= 1e-4, "{lmax:e} {rmax:e}");
        assert!(lmean <= lmax && rmean <= rmax);
        let kl = s0.diag.ref_kl.expect("reference log-probs given");
        assert!((kl - 0.001_229_424_5).abs() < 1e-6, "{kl}");
        // Once per call: the second step carries none of them.
        let s1 = &steps[1];
        assert!(s1.diag.mismatch_logp_max.is_none() && s1.diag.ref_kl.is_none());
        // Rows 0, 1 (answers) and 2 (confidence) make the first update batch.
        assert!(!rows[0].is_confidence && !rows[1].is_confidence && rows[2].is_confidence);
        let la = (rows[0].response.len() + rows[1].response.len()) as f64 / 2.0;
        assert_eq!(s0.diag.response_length, Some(la));
        assert_eq!(
            s0.diag.confidence_length,
            Some(rows[2].response.len() as f64)
        );
        let line = crate::train::checkpoint::metrics_value("update", s0).expect("json");
        assert_eq!(line["mismatch/logp_max"], serde_json::json!(lmax));
        assert!(crate::train::checkpoint::metrics_value("update", s1)
            .expect("json")
            .get("mismatch/logp_max")
            .is_none());
    }

    /// Behaviour log-probs shifted by +0.5 on purpose: the measurement reports a gap of 0.5
    /// (mean 0.5; ratio exp(−0.5) − 1, |·| = 0.3934693403) and --max-mismatch stops the call
    /// before any optimizer step.
    #[test]
    fn shifted_behaviour_logprobs_are_reported_and_refused() {
        use crate::train::loss::LossAgg;
        use crate::train::optim::{AdamW, AdamWConfig};
        use crate::train::trainer::tests::{config, rows, tiny};
        use crate::train::trainer::{train_guarded, Guards};
        let m = tiny();
        let mut rows = rows(&m.transformer, 4, 12, 0.0);
        for r in &mut rows {
            r.old_logp.iter_mut().for_each(|x| *x += 0.5);
        }
        let cfg = config(LossAgg::TokenMean, 2);
        let mut opt = AdamW::new(AdamWConfig::default());
        let guard = Guards {
            max_mismatch: Some(1e-3),
            ..Guards::default()
        };
        let e = train_guarded(m.transformer.clone(), &mut opt, &rows, &cfg, &guard, |_| {
            Ok(())
        })
        .map(|_| ())
        .expect_err("a shifted table must be refused");
        let msg = format!("{e:#}");
        assert!(
            msg.contains("rollout/trainer mismatch") && msg.contains("--max-mismatch"),
            "{msg}"
        );
        assert_eq!(opt.step, 0, "no optimizer step before the check");
        let (_, steps) = train_guarded(
            m.transformer.clone(),
            &mut opt,
            &rows,
            &cfg,
            &Guards::default(),
            |_| Ok(()),
        )
        .expect("reported only");
        let s0 = &steps[0];
        let (lmax, lmean) = (
            s0.diag.mismatch_logp_max.expect("max"),
            s0.diag.mismatch_logp_mean.expect("mean"),
        );
        assert!(
            (lmax - 0.5).abs() < 1e-4 && (lmean - 0.5).abs() < 1e-4,
            "{lmax} {lmean}"
        );
        let r = 1.0 - (-0.5f64).exp();
        assert!((r - 0.393_469_340_3).abs() < 1e-9);
        let (rmax, rmean) = (
            s0.diag.mismatch_ratio_max.expect("max"),
            s0.diag.mismatch_ratio_mean.expect("mean"),
        );
        assert!(
            (rmax - r).abs() < 1e-4 && (rmean - r).abs() < 1e-4,
            "{rmax} {rmean}"
        );
    }

    #[test]
    fn lengths_per_kind() {
        let rows = [
            row(vec![-1.0; 4], None, vec![true; 4], false),
            row(vec![-1.0; 6], None, vec![true; 6], false),
            row(vec![-1.0; 3], None, vec![true; 3], true),
        ];
        assert_eq!(mean_lengths(&rows), (Some(5.0), Some(3.0)));
        assert_eq!(mean_lengths(&rows[..2]), (Some(5.0), None));
        assert_eq!(mean_lengths(&[]), (None, None));
    }

    /// By hand: g = (3, 4), g_c = (1, 0), so g_a = (2, 4): ‖g‖² = 25, ⟨g, g_c⟩ = 3, ‖g_c‖² = 1,
    /// ‖g_a‖ = √20 = 4.472135955, cos(g_a, g_c) = 2 / √20 = 0.4472135955. Opposed parts
    /// g_a = (−1, 0), g_c = (2, 0): g = (1, 0), cosine −1. No confidence part: no cosine.
    #[test]
    fn turn_grads_by_hand() {
        let t = TurnGrads::from_products(25.0, 3.0, 1.0);
        assert!((t.answer_norm - 4.472_135_955).abs() < 1e-9, "{t:?}");
        assert!((t.confidence_norm - 1.0).abs() < 1e-12);
        assert!((t.cosine.expect("both parts") - 0.447_213_595_5).abs() < 1e-9);
        let t = TurnGrads::from_products(1.0, 2.0, 4.0);
        assert!((t.answer_norm - 1.0).abs() < 1e-12 && (t.confidence_norm - 2.0).abs() < 1e-12);
        assert!((t.cosine.expect("both parts") + 1.0).abs() < 1e-12);
        let t = TurnGrads::from_products(9.0, 0.0, 0.0);
        assert_eq!(
            (t.answer_norm, t.confidence_norm, t.cosine),
            (3.0, 0.0, None)
        );
        // g = g_c up to rounding: ‖g_a‖² within 1e-6 of ‖g‖² + ‖g_c‖² of 0, either sign, is 0.
        for dot in [4.0 + 1e-12, 4.0 - 1e-6] {
            let t = TurnGrads::from_products(4.0, dot, 4.0);
            assert_eq!((t.answer_norm, t.cosine), (0.0, None), "{dot}");
        }
        let t = TurnGrads::from_products(4.0, 4.0 - 1e-4, 4.0);
        assert!((t.answer_norm - 2e-4f64.sqrt()).abs() < 1e-12 && t.cosine.is_some());
    }

    /// The split the trainer reports equals each turn measured alone on the tiny model: the
    /// gradient of the table with the confidence rows' advantages set to 0 (the answers' part)
    /// and with the answers' set to 0 (the confidences' part), norms and cosine computed on the
    /// host in f64. The measurement leaves the training as it was (every step's loss and
    /// gradient norm the same bits), and with the confidence rows inert (RLVR's) it reports a
    /// zero confidence part and no cosine.
    #[test]
    fn turn_grad_norms_equal_each_turn_alone() {
        use crate::train::loss::LossAgg;
        use crate::train::optim::{AdamW, AdamWConfig};
        use crate::train::trainer::tests::{config, rows, tiny};
        use crate::train::trainer::{batch_gradients, train_guarded, Objective, StepMetrics};
        let m = tiny();
        let rows = rows(&m.transformer, 12, 21, 0.0);
        let mut cfg = config(LossAgg::TokenMean, 2);
        // Two update batches of 6 rows (rows 2 and 5 of the first are confidence rows).
        cfg.mini_batches = 2;
        // No KL or entropy term: a row whose advantages are all 0 then has no gradient at all.
        if let Objective::Policy {
            kl_coef,
            entropy_coef,
            conf_entropy_coef,
            ..
        } = &mut cfg.objective
        {
            (*kl_coef, *entropy_coef, *conf_entropy_coef) = (0.0, 0.0, 0.0);
        }
        let on = Guards {
            turn_grad_norms: true,
            ..Guards::default()
        };
        let train = |rows: &[TrainRow], g: &Guards| {
            let mut opt = AdamW::new(AdamWConfig::default());
            train_guarded(m.transformer.clone(), &mut opt, rows, &cfg, g, |_| Ok(()))
                .expect("train")
                .1
        };
        let steps = train(&rows, &on);
        let d = &steps[0].diag;
        // The rows with the advantages of one kind (confidence rows or answer rows) set to 0.
        let zero_adv = |rows: &[TrainRow], confidence: bool| -> Vec<TrainRow> {
            rows.iter()
                .map(|r| {
                    let mut r = r.clone();
                    if r.is_confidence == confidence {
                        r.adv.iter_mut().for_each(|a| *a = 0.0);
                    }
                    r
                })
                .collect()
        };
        let zeroed = |confidence: bool| -> Vec<f64> {
            let kept = zero_adv(&rows[..6], !confidence);
            let refs: Vec<&TrainRow> = kept.iter().collect();
            let (g, _) = batch_gradients(&m.transformer, &refs, &cfg).expect("grads");
            grads_to_host(&m.transformer, &g)
                .into_iter()
                .flat_map(|(_, v)| v)
                .map(f64::from)
                .collect()
        };
        let (ga, gc) = (zeroed(false), zeroed(true));
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let (na, nc) = (norm(&ga), norm(&gc));
        let cos = ga.iter().zip(&gc).map(|(a, c)| a * c).sum::<f64>() / (na * nc);
        let t = d.turns.expect("measured");
        let (ra, rc, rcos) = (
            t.answer_norm,
            t.confidence_norm,
            t.cosine.expect("both parts"),
        );
        eprintln!("turns: answers {ra} ({na}), confidences {rc} ({nc}), cosine {rcos} ({cos})");
        assert!(na > 0.0 && nc > 0.0);
        assert!((ra - na).abs() <= 1e-4 * na, "{ra} vs {na}");
        assert!((rc - nc).abs() <= 1e-4 * nc, "{rc} vs {nc}");
        assert!((rcos - cos).abs() <= 1e-3, "{rcos} vs {cos}");
        // The training is the same with the measurement off.
        let plain = train(&rows, &Guards::default());
        assert_eq!(plain.len(), steps.len());
        for (a, b) in plain.iter().zip(&steps) {
            let bits = |m: &StepMetrics| (m.loss.to_bits(), m.grad_norm.to_bits());
            assert_eq!(bits(a), bits(b));
        }
        assert!(plain[0].diag.turns.is_none());
        // In the metrics line under the keys TensorBoard and the report read.
        let line = crate::train::checkpoint::metrics_value("update", &steps[0]).expect("json");
        assert_eq!(line["grad/answer_norm"], serde_json::json!(ra));
        assert_eq!(line["grad/turn_cosine"], serde_json::json!(rcos));
        assert!(crate::train::checkpoint::metrics_value("update", &steps[1])
            .expect("json")
            .get("grad/answer_norm")
            .is_none());
        // Confidence rows with nothing to learn (RLVR's): no confidence part, no cosine.
        let t = train(&zero_adv(&rows, true), &on)[0]
            .diag
            .turns
            .expect("measured");
        assert_eq!((t.confidence_norm, t.cosine), (0.0, None));
        assert!((t.answer_norm - na).abs() <= 1e-4 * na);
        // Answers with nothing to learn (every group scored alike): the gradient is the
        // confidences' alone, no answers' part and no cosine.
        let t = train(&zero_adv(&rows, false), &on)[0]
            .diag
            .turns
            .expect("measured");
        assert_eq!((t.answer_norm, t.cosine), (0.0, None), "{t:?}");
        assert!((t.confidence_norm - nc).abs() <= 1e-4 * nc);
    }
}
