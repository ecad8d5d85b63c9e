//! The policy-loss math of `rlcr update`, over plain slices: the reference implementation.
//!
//! Everything here is a pure function of numbers (no model, no tensors), written the obvious way,
//! with the formula, the implementation it follows and the edge-case policy in each doc comment. The differentiable
//! versions used in training live in [`super::tensor`] and are checked equal to these on random
//! inputs; the worked numbers of `docs/math.md` §2.7 and §3.1–3.2 pin both.
//!
//! Design decisions:
//! - **Loss aggregation as per-token weights.** Every aggregation mode is a weighted sum
//!   `Σ_{i,t} w[i,t]·L[i,t]` whose weights depend only on the masks (and lengths) of the *whole
//!   update batch*: [`agg_weights`]. The loss is then linear in the per-token losses, so splitting
//!   the batch into micro-batches and adding their gradients gives exactly the full-batch gradient
//!   (D6/D7: the normaliser is global, never the micro-batch's own token count).
//! - **Dual clip** (verl; `docs/math.md` §3.1) applies to negative advantages only and is off with `c = ∞`.
//! - **KL estimators** follow verl's `kl_penalty` (`docs/math.md` §2.7): k3 with the log-ratio clamped to ±20 and
//!   the value to ±10.
//! - **Entropy** is `logsumexp(z) − Σ softmax(z)·z`, computed in f64 on the slice path.
use serde::{Deserialize, Serialize};

/// Clamp applied to the log-ratio `logp − old_logp` before exponentiating (verl).
pub const LOG_RATIO_CLAMP: f64 = 20.0;
/// Epsilon in the per-row token count of `seq-mean-token-mean` (verl `agg_loss`).
pub const SEQ_MEAN_EPS: f64 = 1e-8;

/// Clipping parameters of the PPO/GRPO token loss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClipConfig {
    /// ε_low: the ratio is clipped below at `1 − clip_low` (negative advantages).
    pub clip_low: f64,
    /// ε_high: the ratio is clipped above at `1 + clip_high` (positive advantages); DAPO uses 0.28.
    pub clip_high: f64,
    /// Dual-clip constant c (> 1) for negative advantages: the loss is capped at `−A·c`.
    /// `f64::INFINITY` turns it off (TRL parity).
    pub clip_dual: f64,
}

impl Default for ClipConfig {
    /// verl's defaults: ε = 0.2 on both sides, c = 3.
    fn default() -> Self {
        Self {
            clip_low: 0.2,
            clip_high: 0.2,
            clip_dual: 3.0,
        }
    }
}

impl ClipConfig {
    /// Check the parameters: ε_low in [0, 1), ε_high ≥ 0, c > 1 (verl asserts c > 1).
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(self.clip_low >= 0.0 && self.clip_low < 1.0) {
            anyhow::bail!("--clip-low must be in [0, 1), got {}", self.clip_low);
        }
        if !(self.clip_high >= 0.0 && self.clip_high.is_finite()) {
            anyhow::bail!(
                "--clip-high must be a finite number >= 0, got {}",
                self.clip_high
            );
        }
        if self.clip_dual.is_nan() || self.clip_dual <= 1.0 {
            anyhow::bail!(
                "--clip-dual must be > 1 (or inf to turn it off), got {}",
                self.clip_dual
            );
        }
        Ok(())
    }
}

/// One token's PPO loss and which clip was active.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLoss {
    /// The per-token policy-gradient loss.
    pub loss: f64,
    /// `A < 0` and the ratio fell below `1 − ε_low` (the low clip is active).
    pub clipped_low: bool,
    /// `A > 0` and the ratio rose above `1 + ε_high` (the high clip is active).
    pub clipped_high: bool,
    /// `A < 0` and the dual clip caps the loss (`ratio > c`, more precisely `Lclip > −A·c`).
    pub clipped_dual: bool,
}

/// PPO/GRPO clipped token loss with asymmetric clip and verl's dual clip, in closed form.
///
/// With `r = exp(clamp(logp − old_logp, ±20))`:
/// - `A ≥ 0`: `L = −A · min(r, 1 + ε_high)`
/// - `A < 0`: `L = |A| · min(max(r, 1 − ε_low), c)`
///
/// This is the same function as verl's `compute_policy_loss_vanilla`
/// (`max(−A·r, −A·clip(r))`, then `min(·, −A·c)` where `A < 0`), written per sign of A so that
/// it is an independent check of the tensor version. `docs/math.md` §3.1 gives the worked table.
/// Edge cases: `A = 0` gives 0 and no clip; `c = ∞` disables the dual clip.
pub fn ppo_token_loss(logp: f64, old_logp: f64, adv: f64, clip: &ClipConfig) -> TokenLoss {
    let logr = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    ppo_token_loss_ratio(logr.exp(), adv, clip)
}

/// [`ppo_token_loss`] from the ratio itself (no log-ratio clamp).
pub fn ppo_token_loss_ratio(ratio: f64, adv: f64, clip: &ClipConfig) -> TokenLoss {
    let mut out = TokenLoss {
        loss: 0.0,
        clipped_low: false,
        clipped_high: false,
        clipped_dual: false,
    };
    if adv > 0.0 {
        let hi = 1.0 + clip.clip_high;
        out.clipped_high = ratio > hi;
        out.loss = -adv * ratio.min(hi);
    } else if adv < 0.0 {
        let lo = 1.0 - clip.clip_low;
        out.clipped_low = ratio < lo;
        let clipped = ratio.max(lo);
        out.clipped_dual = clipped > clip.clip_dual;
        out.loss = -adv * clipped.min(clip.clip_dual);
    }
    out
}

/// How per-token losses become one number (`docs/math.md` §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LossAgg {
    /// `Σ L·m / Σ m` over the whole update batch (verl token-mean with the global token count,
    /// TRL `dapo`). The default.
    #[default]
    TokenMean,
    /// Mean over rows with any valid token of `Σ_t L·m / (Σ_t m + 1e-8)` (original GRPO).
    SeqMeanTokenMean,
    /// Mean over rows with any valid token of `Σ_t L·m`.
    SeqMeanTokenSum,
    /// `Σ L·m / (B · L_max)` with B the rows of the update batch and L_max a constant (Dr. GRPO).
    /// verl's variant `Σ L·m / T` is this value times B.
    SeqMeanTokenSumNorm,
}

impl LossAgg {
    /// The name used on the command line and in metadata.
    pub fn name(self) -> &'static str {
        match self {
            LossAgg::TokenMean => "token-mean",
            LossAgg::SeqMeanTokenMean => "seq-mean-token-mean",
            LossAgg::SeqMeanTokenSum => "seq-mean-token-sum",
            LossAgg::SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
        }
    }
}

/// Aggregate a ragged batch of per-token losses: the obvious formula of each mode.
///
/// `loss[i][t]` and `mask[i][t]` are row i's per-token losses and mask; `l_max` is Dr. GRPO's
/// constant (only used by `SeqMeanTokenSumNorm`). Rows with no valid token do not count in the
/// `seq-mean-*` means (verl). An empty batch (no valid token at all) aggregates to 0.
pub fn agg_loss(loss: &[Vec<f64>], mask: &[Vec<bool>], mode: LossAgg, l_max: usize) -> f64 {
    let row_sum = |i: usize| -> f64 {
        loss[i]
            .iter()
            .zip(&mask[i])
            .map(|(l, &m)| if m { *l } else { 0.0 })
            .sum()
    };
    let row_cnt = |i: usize| mask[i].iter().filter(|&&m| m).count();
    let n = loss.len();
    match mode {
        LossAgg::TokenMean => {
            let cnt: usize = (0..n).map(row_cnt).sum();
            if cnt == 0 {
                0.0
            } else {
                (0..n).map(row_sum).sum::<f64>() / cnt as f64
            }
        }
        LossAgg::SeqMeanTokenMean | LossAgg::SeqMeanTokenSum => {
            let valid: Vec<usize> = (0..n).filter(|&i| row_cnt(i) > 0).collect();
            if valid.is_empty() {
                return 0.0;
            }
            let per_row = valid.iter().map(|&i| {
                if mode == LossAgg::SeqMeanTokenMean {
                    row_sum(i) / (row_cnt(i) as f64 + SEQ_MEAN_EPS)
                } else {
                    row_sum(i)
                }
            });
            per_row.sum::<f64>() / valid.len() as f64
        }
        LossAgg::SeqMeanTokenSumNorm => {
            if n == 0 || l_max == 0 {
                return 0.0;
            }
            (0..n).map(row_sum).sum::<f64>() / (n as f64 * l_max as f64)
        }
    }
}

/// The per-token weights `w[i][t]` such that `agg_loss(L) = Σ w·L` for every L.
///
/// Computed once over the whole update batch; each micro-batch then contributes
/// `Σ_{its rows} w·L` and the contributions add up to the full-batch loss, whatever the split.
/// Masked tokens get weight 0.
pub fn agg_weights(mask: &[Vec<bool>], mode: LossAgg, l_max: usize) -> Vec<Vec<f64>> {
    let n = mask.len();
    let counts: Vec<usize> = mask
        .iter()
        .map(|r| r.iter().filter(|&&m| m).count())
        .collect();
    let total: usize = counts.iter().sum();
    let valid_rows = counts.iter().filter(|&&c| c > 0).count();
    // The weight `w`, or 0 when `empty`: a row (or batch) without learnable tokens.
    let unless = |empty: bool, w: f64| if empty { 0.0 } else { w };
    mask.iter()
        .zip(&counts)
        .map(|(row, &cnt)| {
            let w = match mode {
                LossAgg::TokenMean => unless(total == 0, 1.0 / total as f64),
                LossAgg::SeqMeanTokenMean => unless(
                    cnt == 0,
                    1.0 / (cnt as f64 + SEQ_MEAN_EPS) / valid_rows as f64,
                ),
                LossAgg::SeqMeanTokenSum => unless(cnt == 0, 1.0 / valid_rows as f64),
                LossAgg::SeqMeanTokenSumNorm => {
                    unless(n == 0 || l_max == 0, 1.0 / (n as f64 * l_max as f64))
                }
            };
            row.iter().map(|&m| if m { w } else { 0.0 }).collect()
        })
        .collect()
}

/// The KL estimators (`docs/math.md` §2.7) are the reward's: one enum and one parser for
/// `advantage` and `update`.
pub use crate::advantage::kl::{
    kl_value as kl_estimate, KlEstimator, K3_LOG_CLAMP, K3_VALUE_CLAMP,
};

/// Entropy of the softmax of one row of logits: `logsumexp(z) − Σ softmax(z)·z`, in f64.
///
/// Stable for any finite logits (the max is subtracted). An empty row has entropy 0.
pub fn entropy_from_logits(z: &[f32]) -> f64 {
    if z.is_empty() {
        return 0.0;
    }
    let m = z.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let mut s = 0.0f64;
    let mut sz = 0.0f64;
    for &v in z {
        let e = (v as f64 - m).exp();
        s += e;
        sz += e * v as f64;
    }
    let lse = m + s.ln();
    lse - sz / s
}

/// Log-softmax of one row of logits at index `target`, in f64.
pub fn logprob_from_logits(z: &[f32], target: usize) -> f64 {
    let m = z.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let s: f64 = z.iter().map(|&v| (v as f64 - m).exp()).sum();
    z[target] as f64 - m - s.ln()
}

/// Per-token metrics of the policy loss over a batch, aggregated as token means.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ClipFractions {
    /// Fraction of valid tokens with the low clip active.
    pub low: f64,
    /// Fraction of valid tokens with the high clip active.
    pub high: f64,
    /// Fraction of valid tokens with the dual clip active.
    pub dual: f64,
}

/// `approx_kl` as verl logs it (`ppo_kl`): the masked mean of `old_logp − logp` (clamped log-ratio).
pub fn approx_kl(logp: &[f64], old_logp: &[f64], mask: &[bool]) -> f64 {
    let mut s = 0.0;
    let mut n = 0usize;
    for ((l, o), &m) in logp.iter().zip(old_logp).zip(mask) {
        if m {
            s -= (l - o).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
            n += 1;
        }
    }
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::ValueEnum;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    /// The clip rules of [`PPO_TABLE`]'s three loss columns: verl's defaults, TRL's (no dual
    /// clip), and ε_high = 0.28 with the dual clip (DAPO's clip-higher).
    pub(crate) fn ppo_table_rules() -> [ClipConfig; 3] {
        let [verl, mut trl, mut dapo] = [ClipConfig::default(); 3];
        trl.clip_dual = f64::INFINITY;
        dapo.clip_high = 0.28;
        [verl, trl, dapo]
    }

    /// The default clip rule with `set` applied.
    fn clip(set: impl FnOnce(&mut ClipConfig)) -> ClipConfig {
        let mut c = ClipConfig::default();
        set(&mut c);
        c
    }

    /// `docs/math.md` §3.1: (ratio, A, verl dual clip, TRL no dual clip, ε_high = 0.28 with dual clip).
    pub(crate) const PPO_TABLE: [(f64, f64, f64, f64, f64); 8] = [
        (1.00, 1.0, -1.0, -1.0, -1.0),
        (1.50, 1.0, -1.2, -1.2, -1.28),
        (0.50, 1.0, -0.5, -0.5, -0.5),
        (1.50, -1.0, 1.5, 1.5, 1.5),
        (0.50, -1.0, 0.8, 0.8, 0.8),
        (5.00, -1.0, 3.0, 5.0, 3.0),
        (5.00, 1.0, -1.2, -1.2, -1.28),
        (1.25, 2.0, -2.4, -2.4, -2.5),
    ];

    #[test]
    fn ppo_loss_matches_worked_table() {
        let [verl, trl, dapo] = ppo_table_rules();
        for &(r, a, want_verl, want_trl, want_dapo) in &PPO_TABLE {
            let got = ppo_token_loss_ratio(r, a, &verl).loss;
            assert!(close(got, want_verl, 1e-12), "verl r={r} A={a}: {got}");
            let got = ppo_token_loss_ratio(r, a, &trl).loss;
            assert!(close(got, want_trl, 1e-12), "trl r={r} A={a}: {got}");
            let got = ppo_token_loss_ratio(r, a, &dapo).loss;
            assert!(close(got, want_dapo, 1e-12), "dapo r={r} A={a}: {got}");
            // Through log-probs too.
            let got = ppo_token_loss(r.ln() - 0.7, -0.7, a, &verl).loss;
            assert!(close(got, want_verl, 1e-12), "logp r={r} A={a}: {got}");
        }
        // Any ratio with A = 0 gives 0 and no clip.
        for r in [0.01, 1.0, 7.0] {
            let t = ppo_token_loss_ratio(r, 0.0, &verl);
            assert_eq!(t.loss, 0.0);
            assert!(!t.clipped_low && !t.clipped_high && !t.clipped_dual);
            assert_eq!(ppo_token_loss_ratio(r, 0.0, &trl).loss, 0.0);
        }
    }

    #[test]
    fn ppo_clip_flags() {
        let c = ClipConfig::default();
        let t = ppo_token_loss_ratio(5.0, -1.0, &c);
        assert!(t.clipped_dual && !t.clipped_low && !t.clipped_high);
        let t = ppo_token_loss_ratio(0.5, -1.0, &c);
        assert!(t.clipped_low && !t.clipped_dual);
        let t = ppo_token_loss_ratio(1.5, 1.0, &c);
        assert!(t.clipped_high && !t.clipped_low);
        // A > 0 below 1 − ε: not clipped (the unclipped term is the max).
        let t = ppo_token_loss_ratio(0.5, 1.0, &c);
        assert!(!t.clipped_low && !t.clipped_high);
        // A < 0 above 1 + ε but below c: not clipped.
        let t = ppo_token_loss_ratio(1.5, -1.0, &c);
        assert!(!t.clipped_low && !t.clipped_high && !t.clipped_dual);
    }

    /// verl's formula written literally, for the property test below.
    fn verl_literal(r: f64, a: f64, c: &ClipConfig) -> f64 {
        let l1 = -a * r;
        let l2 = -a * r.clamp(1.0 - c.clip_low, 1.0 + c.clip_high);
        let lclip = l1.max(l2);
        if a < 0.0 {
            let l3 = -a * c.clip_dual;
            l3.min(lclip)
        } else {
            lclip
        }
    }

    proptest::proptest! {
        #[test]
        fn closed_form_equals_verl_literal(
            r in 0.0f64..8.0, a in -3.0f64..3.0, lo in 0.0f64..0.9, hi in 0.0f64..1.0,
            c in 1.01f64..10.0,
        ) {
            let cfg = ClipConfig { clip_low: lo, clip_high: hi, clip_dual: c };
            let got = ppo_token_loss_ratio(r, a, &cfg).loss;
            let want = verl_literal(r, a, &cfg);
            proptest::prop_assert!((got - want).abs() <= 1e-12 * (1.0 + want.abs()));
        }

        #[test]
        fn weights_reproduce_aggregation(
            rows in proptest::collection::vec(
                proptest::collection::vec((-5.0f64..5.0, proptest::bool::ANY), 0..12), 0..8),
            l_max in 1usize..20,
        ) {
            let loss: Vec<Vec<f64>> = rows.iter().map(|r| r.iter().map(|x| x.0).collect()).collect();
            let mask: Vec<Vec<bool>> = rows.iter().map(|r| r.iter().map(|x| x.1).collect()).collect();
            for &mode in LossAgg::value_variants() {
                let want = agg_loss(&loss, &mask, mode, l_max);
                let w = agg_weights(&mask, mode, l_max);
                let got: f64 = w.iter().zip(&loss)
                    .map(|(wr, lr)| wr.iter().zip(lr).map(|(a, b)| a * b).sum::<f64>()).sum();
                proptest::prop_assert!((got - want).abs() <= 1e-9 * (1.0 + want.abs()),
                    "{mode:?}: {got} vs {want}");
            }
        }
    }

    /// `docs/math.md` §3.2 aggregation: row 1 length 2, loss 1; row 2 length 4, loss 3; L_max = 4.
    #[test]
    fn aggregation_matches_worked_table() {
        let loss = vec![vec![1.0, 1.0, 0.0, 0.0], vec![3.0; 4]];
        let mask = vec![vec![true, true, false, false], vec![true; 4]];
        let tm = agg_loss(&loss, &mask, LossAgg::TokenMean, 4);
        assert!(close(tm, 2.333333, 1e-6), "{tm}");
        let smtm = agg_loss(&loss, &mask, LossAgg::SeqMeanTokenMean, 4);
        assert!(close(smtm, 2.0, 1e-6), "{smtm}");
        let smts = agg_loss(&loss, &mask, LossAgg::SeqMeanTokenSum, 4);
        assert!(close(smts, 7.0, 1e-12), "{smts}");
        let dr = agg_loss(&loss, &mask, LossAgg::SeqMeanTokenSumNorm, 4);
        assert!(close(dr, 1.75, 1e-12), "{dr}");
        // verl's Σ/T variant = ours × B.
        assert!(close(dr * 2.0, 3.5, 1e-12));
        // Ragged rows (no padding) give the same.
        let loss_r = vec![vec![1.0, 1.0], vec![3.0; 4]];
        let mask_r = vec![vec![true; 2], vec![true; 4]];
        assert!(close(
            agg_loss(&loss_r, &mask_r, LossAgg::TokenMean, 4),
            tm,
            1e-12
        ));
    }

    #[test]
    fn aggregation_edge_cases() {
        // A row with no valid token does not count in the seq means.
        let loss = vec![vec![2.0, 2.0], vec![9.0, 9.0]];
        let mask = vec![vec![true, true], vec![false, false]];
        assert!(close(
            agg_loss(&loss, &mask, LossAgg::SeqMeanTokenSum, 2),
            4.0,
            1e-12
        ));
        assert!(close(
            agg_loss(&loss, &mask, LossAgg::SeqMeanTokenMean, 2),
            2.0,
            1e-7
        ));
        // ... but it does count as a row for Dr. GRPO's B (TRL: B_local rows).
        assert!(close(
            agg_loss(&loss, &mask, LossAgg::SeqMeanTokenSumNorm, 2),
            1.0,
            1e-12
        ));
        // Nothing valid: 0, not NaN.
        let none = vec![vec![false, false]];
        for mode in [
            LossAgg::TokenMean,
            LossAgg::SeqMeanTokenMean,
            LossAgg::SeqMeanTokenSum,
        ] {
            assert_eq!(agg_loss(&[vec![1.0, 1.0]], &none, mode, 2), 0.0);
            assert!(agg_weights(&none, mode, 2)[0].iter().all(|&w| w == 0.0));
        }
    }

    /// `docs/math.md` §2.7, the estimator table.
    #[test]
    fn kl_estimators_match_worked_table() {
        let table: [(f64, f64, f64, f64, f64, f64); 4] = [
            (-1.0, -1.5, 0.5, 0.5, 0.125, 0.106531),
            (-2.0, -1.0, -1.0, 1.0, 0.5, 0.718282),
            (-0.1, -0.1, 0.0, 0.0, 0.0, 0.0),
            (-30.0, -1.0, -29.0, 29.0, 420.5, 10.0),
        ];
        for (lp, rf, k1, ab, k2, k3) in table {
            assert!(close(kl_estimate(lp, rf, KlEstimator::K1), k1, 1e-12));
            assert!(close(kl_estimate(lp, rf, KlEstimator::Abs), ab, 1e-12));
            assert!(close(kl_estimate(lp, rf, KlEstimator::K2), k2, 1e-12));
            let got = kl_estimate(lp, rf, KlEstimator::K3);
            assert!(close(got, k3, 1e-6), "k3({lp},{rf}) = {got}");
        }
    }

    #[test]
    fn entropy_by_hand() {
        // Uniform over 4: ln 4.
        assert!(close(entropy_from_logits(&[3.0; 4]), 4f64.ln(), 1e-12));
        // Two logits 0 and ln 3: p = (1/4, 3/4); H = -(¼ ln ¼ + ¾ ln ¾) = 0.562335.
        let h = entropy_from_logits(&[0.0, 3f32.ln()]);
        assert!(close(h, 0.562335, 1e-6), "{h}");
        // Huge logits do not overflow.
        let h = entropy_from_logits(&[1000.0, 1000.0]);
        assert!(close(h, 2f64.ln(), 1e-12));
        assert_eq!(entropy_from_logits(&[]), 0.0);
        // log-softmax by hand: p(1) = 3/4.
        assert!(close(
            logprob_from_logits(&[0.0, 3f32.ln()], 1),
            0.75f64.ln(),
            1e-7
        ));
    }

    #[test]
    fn approx_kl_by_hand() {
        // old − logp over valid tokens: (0.1 + (−0.3)) / 2 = −0.1.
        let v = approx_kl(
            &[-1.0, -2.0, -5.0],
            &[-0.9, -2.3, 0.0],
            &[true, true, false],
        );
        assert!(close(v, -0.1, 1e-12), "{v}");
        assert_eq!(approx_kl(&[1.0], &[0.0], &[false]), 0.0);
    }

    #[test]
    fn clip_config_validation() {
        assert!(ClipConfig::default().validate().is_ok());
        assert!(clip(|c| c.clip_dual = f64::INFINITY).validate().is_ok());
        for bad in [
            clip(|c| c.clip_dual = 1.0),
            clip(|c| c.clip_low = 1.0),
            clip(|c| c.clip_high = -0.1),
            clip(|c| c.clip_low = f64::NAN),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
