//! The policy loss over burn tensors: the differentiable twin of [`super::loss`].
//!
//! Inputs are padded `[B, T]` tensors of one micro-batch (B rows, T = its longest response);
//! padded and non-learnable positions carry weight 0, so they contribute neither loss nor gradient.
//! The formulas are written the way verl writes them (`max(L1, L2)`, then `min(·, L3)` where
//! `A < 0`); the slice versions use a per-sign closed form, and the tests check the two agree on
//! random inputs and on the table of `docs/math.md` §3.1.
//!
//! Design decisions:
//! - The aggregation weights `w[i,t]` arrive precomputed over the whole update batch
//!   ([`super::loss::agg_weights`]), so the micro-batch loss is `Σ w·L` and micro-batch gradients
//!   add up to the full-batch gradient exactly (`docs/math.md` §3.2).
//! - Metric sums (clipped tokens, log-ratio, entropy, KL) are returned as *sums* over valid tokens
//!   and divided by the update batch's token count by the caller, for the same reason.
//! - When `c = ∞` the dual-clip branch is skipped instead of computing `−A·∞` (NaN at A = 0).
use anyhow::{ensure, Result};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, Int, Tensor, TensorData};

use crate::model::ops;

use super::loss::{ClipConfig, KlEstimator, K3_LOG_CLAMP, K3_VALUE_CLAMP, LOG_RATIO_CLAMP};

/// Per-token PPO loss and the clip indicators, all `[B, T]`.
pub struct PpoTokens {
    /// Per-token loss (differentiable in `logp`).
    pub loss: Tensor<2>,
    /// `A < 0 & r < 1 − ε_low`.
    pub clipped_low: Tensor<2, Bool>,
    /// `A > 0 & r > 1 + ε_high`.
    pub clipped_high: Tensor<2, Bool>,
    /// `A < 0 & Lclip > −A·c`.
    pub clipped_dual: Tensor<2, Bool>,
    /// The clamped log-ratio `logp − old_logp` (detached), for `approx_kl`.
    pub log_ratio: Tensor<2>,
}

/// verl's `compute_policy_loss_vanilla` per token (`docs/math.md` §3.1).
///
/// `logp` is the current policy's log-prob (carries the gradient), `old_logp` the behaviour
/// policy's, `adv` the token advantages; all `[B, T]`.
pub fn ppo_token_loss(
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    adv: Tensor<2>,
    clip: &ClipConfig,
) -> PpoTokens {
    let logr = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = logr.clone().exp();
    let neg_adv = adv.clone().neg();
    let l1 = neg_adv.clone() * ratio.clone();
    let l2 = neg_adv.clone()
        * ratio
            .clone()
            .clamp(1.0 - clip.clip_low, 1.0 + clip.clip_high);
    let lclip = l1.max_pair(l2);
    let adv_neg = adv.clone().lower_elem(0.0);
    let adv_pos = adv.greater_elem(0.0);
    let clipped_low = adv_neg
        .clone()
        .bool_and(ratio.clone().lower_elem(1.0 - clip.clip_low));
    let clipped_high = adv_pos.bool_and(ratio.greater_elem(1.0 + clip.clip_high));
    let (loss, clipped_dual) = if clip.clip_dual.is_finite() {
        let l3 = neg_adv.mul_scalar(clip.clip_dual);
        let dual = adv_neg.clone().bool_and(lclip.clone().greater(l3.clone()));
        let ldual = lclip.clone().min_pair(l3);
        (lclip.mask_where(adv_neg, ldual), dual)
    } else {
        let none = adv_neg.clone().bool_and(adv_neg.bool_not());
        (lclip, none)
    };
    PpoTokens {
        loss,
        clipped_low,
        clipped_high,
        clipped_dual,
        log_ratio: logr.detach(),
    }
}

/// KL estimate per token from `d = logp − ref_logp` (verl `kl_penalty`, `docs/math.md` §2.7).
pub fn kl_estimate(logp: Tensor<2>, ref_logp: Tensor<2>, kind: KlEstimator) -> Tensor<2> {
    let d = logp - ref_logp;
    match kind {
        KlEstimator::K1 => d,
        KlEstimator::Abs => d.abs(),
        KlEstimator::K2 => d.square().mul_scalar(0.5),
        KlEstimator::K3 => {
            let x = d.neg().clamp(-K3_LOG_CLAMP, K3_LOG_CLAMP);
            (x.clone().exp() - x)
                .sub_scalar(1.0)
                .clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)
        }
    }
}

/// Entropy per position from logits `[B, T, V]`: `logsumexp(z) − Σ softmax(z)·z`, shape `[B, T]`.
pub fn entropy_from_logits(logits: Tensor<3>) -> Tensor<2> {
    entropy_from_log_probs(log_softmax(logits, 2))
}

/// Entropy per position from log-probs `[B, T, V]`: `−Σ exp(lp)·lp`, shape `[B, T]`.
///
/// The same value as [`entropy_from_logits`] (`lp = z − logsumexp(z)`), reusing a log-softmax the
/// caller already has.
pub fn entropy_from_log_probs(lp: Tensor<3>) -> Tensor<2> {
    let p = lp.clone().exp();
    (p * lp).sum_dim(2).squeeze_dim::<2>(2).neg()
}

/// Entropy of each row of `logits: [N, V]` restricted to the token ids `ids` and renormalised
/// over them, at `temperature`: with `q = softmax(z_S / T)`, `H_S = −Σ_{s∈S} q_s·ln q_s`, shape
/// `[N]`. It depends only on the differences between the logits of `S`: raising it spreads
/// probability among the tokens of `S` and moves none into or out of `S` (the confidence value
/// bonus: spread over the digits, never onto a token that breaks the format).
pub fn subset_entropy(logits: Tensor<2>, ids: &[u32], temperature: f64) -> Result<Tensor<1>> {
    let [n, v] = logits.dims();
    ensure!(!ids.is_empty(), "the token subset is empty");
    ensure!(
        temperature > 0.0 && temperature.is_finite(),
        "temperature must be > 0, got {temperature}"
    );
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= v) {
        anyhow::bail!("token id {bad} of the subset is outside the vocabulary of {v}");
    }
    let idx: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
    let idx: Tensor<1, Int> =
        crate::model::transfer::upload(TensorData::new(idx, [ids.len()]), &logits.device());
    let zs = logits.select(1, idx).div_scalar(temperature);
    let lp = log_softmax(zs, 1);
    Ok((lp.clone().exp() * lp).sum_dim(1).reshape([n]).neg())
}

/// Everything one micro-batch contributes to an optimizer step.
pub struct MicroLoss {
    /// The differentiable micro-batch loss (`Σ w·(pg + β·kl) − α·Σ w_tok·H`), shape `[1]`.
    pub loss: Tensor<1>,
    /// Sums over this micro-batch (detached, f64 on the host after [`MicroLoss::sums`]).
    pub pg_loss: Tensor<1>,
    /// `Σ w·kl` (0 when no reference).
    pub kl_loss: Tensor<1>,
    /// `Σ m·H` over valid tokens (0 when entropy was not computed).
    pub entropy_sum: Tensor<1>,
    /// `Σ m_c·H` over the valid tokens of confidence rows (0 when entropy was not computed).
    pub conf_entropy_sum: Tensor<1>,
    /// `Σ m_v·H_S` over the confidence value positions (0 when not computed).
    pub value_entropy_sum: Tensor<1>,
    /// `Σ m·(old_logp − logp)` over valid tokens.
    pub neg_log_ratio_sum: Tensor<1>,
    /// Counts of valid tokens with the low / high / dual clip active.
    pub clipped: [Tensor<1>; 3],
}

/// The inputs of [`micro_loss`], all `[B, T]` on one device.
pub struct MicroInputs {
    /// Current log-probs of the response tokens (differentiable).
    pub logp: Tensor<2>,
    /// Behaviour-policy log-probs (`response_logprobs`).
    pub old_logp: Tensor<2>,
    /// Token advantages.
    pub adv: Tensor<2>,
    /// 1.0 on learnable tokens, 0.0 elsewhere (padding included).
    pub mask: Tensor<2>,
    /// Aggregation weights over the whole update batch (0 where `mask` is 0).
    pub weight: Tensor<2>,
    /// Reference-policy log-probs, when the KL loss is on.
    pub ref_logp: Option<Tensor<2>>,
    /// Per-token entropy, when computed (differentiable when an entropy bonus is on).
    pub entropy: Option<Tensor<2>>,
    /// 1.0 on the learnable tokens of confidence rows, 0.0 elsewhere (a part of `mask`).
    pub conf_mask: Tensor<2>,
    /// Per-token entropy restricted to the value tokens ([`subset_entropy`]) and the mask of the
    /// confidence value positions, when the value entropy bonus is on.
    pub value_entropy: Option<(Tensor<2>, Tensor<2>)>,
}

/// Coefficients of the total loss.
#[derive(Debug, Clone, Copy)]
pub struct LossCoefs {
    /// β of the KL loss.
    pub kl_coef: f64,
    /// KL estimator of the KL loss.
    pub kl_kind: KlEstimator,
    /// α of the entropy bonus (subtracted).
    pub entropy_coef: f64,
    /// Valid tokens of the whole update batch: the entropy bonus is a token mean (`docs/math.md` §3.3).
    pub batch_tokens: f64,
    /// α_c of the confidence-only entropy bonus (subtracted; answer rows untouched).
    pub conf_entropy_coef: f64,
    /// Valid tokens of the confidence rows of the whole update batch: the confidence bonus is a
    /// token mean over them.
    pub conf_tokens: f64,
    /// α_v of the confidence value entropy bonus (subtracted).
    pub value_entropy_coef: f64,
    /// Confidence value positions of the whole update batch (the value bonus is a mean over them).
    pub value_tokens: f64,
}

/// The micro-batch loss: `Σ w·L_pg + β·Σ w·kl − α·Σ (m/N)·H − α_c·Σ (m_c/N_c)·H` (verl's actor
/// total with the global normaliser, `docs/math.md` §3.3, plus rlcr's confidence-only entropy bonus:
/// `m_c` marks the learnable tokens of confidence rows, `N_c` their count in the whole update
/// batch, so the last term is α_c × the mean entropy of the confidence tokens; no answer-row
/// token enters it, it moves the answer turn only through the weights the two turns share),
/// minus `α_v·Σ (m_v/N_v)·H_S` when the value bonus is on: `H_S` the entropy restricted to the
/// value tokens ([`subset_entropy`]) at the `N_v` confidence value positions `m_v` of the update
/// batch.
pub fn micro_loss(x: MicroInputs, clip: &ClipConfig, c: &LossCoefs) -> MicroLoss {
    let device = x.logp.device();
    let zero = || Tensor::<1>::zeros([1], &device);
    let ppo = ppo_token_loss(x.logp.clone(), x.old_logp, x.adv, clip);
    let pg_loss = ops::sum(ppo.loss * x.weight.clone());
    let mut loss = pg_loss.clone();
    let kl_loss = match x.ref_logp {
        Some(r) => {
            let kl = ops::sum(kl_estimate(x.logp, r, c.kl_kind) * x.weight);
            loss = loss + kl.clone().mul_scalar(c.kl_coef);
            kl
        }
        None => zero(),
    };
    let (entropy_sum, conf_entropy_sum) = match x.entropy {
        Some(h) => {
            let s = ops::sum(h.clone() * x.mask.clone());
            let sc = ops::sum(h * x.conf_mask);
            if c.entropy_coef != 0.0 && c.batch_tokens > 0.0 {
                loss = loss - s.clone().mul_scalar(c.entropy_coef / c.batch_tokens);
            }
            if c.conf_entropy_coef != 0.0 && c.conf_tokens > 0.0 {
                loss = loss - sc.clone().mul_scalar(c.conf_entropy_coef / c.conf_tokens);
            }
            (s.detach(), sc.detach())
        }
        None => (zero(), zero()),
    };
    let value_entropy_sum = match x.value_entropy {
        Some((hs, mv)) => {
            let s = ops::sum(hs * mv);
            if c.value_entropy_coef != 0.0 && c.value_tokens > 0.0 {
                loss = loss - s.clone().mul_scalar(c.value_entropy_coef / c.value_tokens);
            }
            s.detach()
        }
        None => zero(),
    };
    let count = |b: Tensor<2, Bool>| ops::sum(b.float() * x.mask.clone());
    let neg_log_ratio_sum = ops::sum(ppo.log_ratio.neg() * x.mask.clone());
    MicroLoss {
        loss,
        pg_loss: pg_loss.detach(),
        kl_loss: kl_loss.detach(),
        entropy_sum,
        conf_entropy_sum,
        value_entropy_sum,
        neg_log_ratio_sum,
        clipped: [
            count(ppo.clipped_low),
            count(ppo.clipped_high),
            count(ppo.clipped_dual),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::loss;
    use burn::tensor::{Device, TensorData};
    use clap::ValueEnum;
    use rand::{Rng, SeedableRng};

    fn dev() -> Device {
        Device::flex()
    }

    fn t2(v: &[f32], b: usize, t: usize, d: &Device) -> Tensor<2> {
        Tensor::from_data(TensorData::new(v.to_vec(), [b, t]), d)
    }

    fn host(x: Tensor<2>) -> Vec<f32> {
        x.into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .expect("f32 data")
    }

    fn host_b(x: Tensor<2, Bool>) -> Vec<bool> {
        x.into_data().try_into_vec::<bool>().expect("bool data")
    }

    fn scalar(x: Tensor<1>) -> f64 {
        x.into_data()
            .convert::<f64>()
            .try_into_vec::<f64>()
            .expect("f64")[0]
    }

    #[test]
    fn tensor_ppo_matches_worked_table() {
        let d = dev();
        for (rule, cfg) in loss::tests::ppo_table_rules().into_iter().enumerate() {
            let rows = &loss::tests::PPO_TABLE;
            let n = rows.len();
            let logp: Vec<f32> = rows.iter().map(|r| (r.0 as f32).ln()).collect();
            let adv: Vec<f32> = rows.iter().map(|r| r.1 as f32).collect();
            let out = ppo_token_loss(
                t2(&logp, 1, n, &d),
                t2(&vec![0.0; n], 1, n, &d),
                t2(&adv, 1, n, &d),
                &cfg,
            );
            let got = host(out.loss);
            for (i, r) in rows.iter().enumerate() {
                let want = [r.2, r.3, r.4][rule];
                assert!(
                    (got[i] as f64 - want).abs() < 1e-5,
                    "{cfg:?} row {i}: {}",
                    got[i]
                );
            }
        }
    }

    #[test]
    fn tensor_equals_slice_on_random_inputs() {
        let d = dev();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for case in 0..20 {
            let (b, t) = (3, 7);
            let n = b * t;
            let logp: Vec<f32> = (0..n).map(|_| rng.random_range(-6.0..0.0)).collect();
            let old: Vec<f32> = logp
                .iter()
                .map(|l| l + rng.random_range(-1.5f32..1.5))
                .collect();
            let adv: Vec<f32> = (0..n)
                .map(|i| {
                    if i % 5 == 0 {
                        0.0
                    } else {
                        rng.random_range(-2.0..2.0)
                    }
                })
                .collect();
            let cfg = ClipConfig {
                clip_low: rng.random_range(0.05..0.5),
                clip_high: rng.random_range(0.05..0.5),
                clip_dual: if case % 3 == 0 {
                    f64::INFINITY
                } else {
                    rng.random_range(1.5..4.0)
                },
            };
            let out = ppo_token_loss(
                t2(&logp, b, t, &d),
                t2(&old, b, t, &d),
                t2(&adv, b, t, &d),
                &cfg,
            );
            let got = host(out.loss);
            let lo = host_b(out.clipped_low);
            let hi = host_b(out.clipped_high);
            let du = host_b(out.clipped_dual);
            for i in 0..n {
                // The slice reference on the same f32 ratio.
                let r = ((logp[i] - old[i]) as f64).exp();
                let want = loss::ppo_token_loss(logp[i] as f64, old[i] as f64, adv[i] as f64, &cfg);
                assert!(
                    (got[i] as f64 - want.loss).abs() <= 1e-5 * (1.0 + want.loss.abs()),
                    "case {case} token {i}: r={r} A={} got {} want {}",
                    adv[i],
                    got[i],
                    want.loss
                );
                // Flags may differ only within f32 rounding of a boundary.
                let near = |x: f64| (r - x).abs() < 1e-5;
                if !near(1.0 - cfg.clip_low) {
                    assert_eq!(lo[i], want.clipped_low, "low flag {i}");
                }
                if !near(1.0 + cfg.clip_high) {
                    assert_eq!(hi[i], want.clipped_high, "high flag {i}");
                }
                if !near(cfg.clip_dual) {
                    assert_eq!(du[i], want.clipped_dual, "dual flag {i}");
                }
            }
        }
    }

    #[test]
    fn tensor_kl_matches_slice() {
        let d = dev();
        let lp = [-1.0f32, -2.0, -0.1, -30.0, -0.3, -4.0];
        let rf = [-1.5f32, -1.0, -0.1, -1.0, -0.9, -0.2];
        for kind in [
            KlEstimator::K1,
            KlEstimator::Abs,
            KlEstimator::K2,
            KlEstimator::K3,
        ] {
            let got = host(kl_estimate(t2(&lp, 2, 3, &d), t2(&rf, 2, 3, &d), kind));
            for i in 0..6 {
                let want = loss::kl_estimate(lp[i] as f64, rf[i] as f64, kind);
                assert!(
                    (got[i] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{kind:?} {i}: {} vs {want}",
                    got[i]
                );
            }
        }
    }

    #[test]
    fn tensor_entropy_matches_slice() {
        let d = dev();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (b, t, v) = (2, 3, 11);
        let z: Vec<f32> = (0..b * t * v)
            .map(|_| rng.random_range(-4.0..4.0))
            .collect();
        let logits = Tensor::<3>::from_data(TensorData::new(z.clone(), [b, t, v]), &d);
        let got = host(entropy_from_logits(logits));
        for i in 0..b * t {
            let want = loss::entropy_from_logits(&z[i * v..(i + 1) * v]);
            assert!(
                (got[i] as f64 - want).abs() < 1e-5,
                "{i}: {} vs {want}",
                got[i]
            );
        }
    }

    /// The confidence-only entropy bonus against a hand calculation. Two rows of two positions
    /// over 3 tokens; row 0 is an answer, row 1 a confidence row whose second position is masked.
    /// Advantages are 0, so the loss is the bonus alone. Row 1 position 0 has logits
    /// (0, 0, ln 2): p = (1/4, 1/4, 1/2), H = ¼·ln 4 + ¼·ln 4 + ½·ln 2 = 1.5·ln 2, and
    /// ∂H/∂z_j = −p_j·(ln p_j + H) = (+ln 2/8, +ln 2/8, −ln 2/4). With α_c = 0.6 and N_c = 1
    /// (the whole update batch's confidence tokens) the loss is −0.6·1.5·ln 2 and its gradient
    /// −0.6·∂H/∂z: the likeliest token's logit gets +0.6·ln 2/4 (a descent step lowers it, the
    /// distribution flattens). The answer row and the masked position get exactly 0.
    #[test]
    fn conf_entropy_bonus_matches_hand_calculation() {
        let d = Device::flex().autodiff();
        let ln2 = std::f64::consts::LN_2;
        // [B=2, T=2, V=3]; row 0 (answer) peaked logits, row 1 position 1 masked.
        let z = vec![
            2.0f32, -1.0, 0.5, 0.3, 0.1, -0.7, // answer row
            0.0, 0.0, ln2 as f32, 1.0, -2.0, 0.0, // confidence row
        ];
        let logits =
            Tensor::<3>::from_data(TensorData::new(z.clone(), [2, 2, 3]), &d).require_grad();
        let zeros = Tensor::<2>::zeros([2, 2], &d);
        let mask = t2(&[1.0, 1.0, 1.0, 0.0], 2, 2, &d);
        let conf_mask = t2(&[0.0, 0.0, 1.0, 0.0], 2, 2, &d);
        let alpha_c = 0.6;
        // The micro-batch loss of `logits` with the bonus at `coef` over `n_c` confidence tokens
        // (the whole update batch's), 3 valid tokens in all.
        let bonus_loss = |logits: Tensor<3>, coef: f64, n_c: f64| {
            micro_loss(
                MicroInputs {
                    // logp only feeds the PPO term, whose advantages are 0.
                    logp: zeros.clone(),
                    old_logp: zeros.clone(),
                    adv: zeros.clone(),
                    mask: mask.clone(),
                    weight: mask.clone().div_scalar(3.0),
                    ref_logp: None,
                    entropy: Some(entropy_from_logits(logits)),
                    conf_mask: conf_mask.clone(),
                    value_entropy: None,
                },
                &ClipConfig::default(),
                &LossCoefs {
                    kl_coef: 0.0,
                    kl_kind: KlEstimator::K3,
                    entropy_coef: 0.0,
                    batch_tokens: 3.0,
                    conf_entropy_coef: coef,
                    conf_tokens: n_c,
                    value_entropy_coef: 0.0,
                    value_tokens: 0.0,
                },
            )
        };
        let out = bonus_loss(logits.clone(), alpha_c, 1.0);
        let h_conf = 1.5 * ln2;
        let loss = scalar(out.loss.clone());
        assert!((loss - (-alpha_c * h_conf)).abs() < 1e-6, "loss {loss}");
        let sc = scalar(out.conf_entropy_sum.clone());
        assert!((sc - h_conf).abs() < 1e-6, "Σ m_c·H {sc}");
        // The metric over all valid tokens counts the answer row's entropies too.
        let all = scalar(out.entropy_sum.clone());
        let ent = |v: &[f32]| loss::entropy_from_logits(v);
        let want_all = ent(&z[0..3]) + ent(&z[3..6]) + h_conf;
        assert!((all - want_all).abs() < 1e-5, "Σ m·H {all} vs {want_all}");
        let grads = out.loss.backward();
        let g = logits
            .grad(&grads)
            .expect("gradient of the logits")
            .into_data()
            .convert::<f64>()
            .try_into_vec::<f64>()
            .expect("f64");
        let want = [
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0, // answer row: not in the bonus
            -alpha_c * ln2 / 8.0,
            -alpha_c * ln2 / 8.0,
            alpha_c * ln2 / 4.0,
            0.0,
            0.0,
            0.0, // masked position
        ];
        for (i, (a, b)) in g.iter().zip(want).enumerate() {
            assert!((a - b).abs() < 1e-6, "d loss / d z[{i}] = {a}, hand {b}");
        }
        // The bonus is off with α_c = 0 (and with no confidence tokens in the batch): the same
        // inputs give a loss of exactly 0.
        for (coef, n_c) in [(0.0, 1.0), (alpha_c, 0.0)] {
            let logits =
                Tensor::<3>::from_data(TensorData::new(z.clone(), [2, 2, 3]), &d).require_grad();
            let off = bonus_loss(logits, coef, n_c);
            assert_eq!(scalar(off.loss), 0.0, "α_c {coef}, N_c {n_c}");
        }
    }

    /// The entropy over a token subset against a hand calculation: logits (0, 0, ln 2, 5) over
    /// the subset {0, 1, 2} renormalise to q = (1/4, 1/4, 1/2), H_S = 1.5·ln 2 whatever token 3's
    /// logit is, ∂H_S/∂z = (+ln 2/8, +ln 2/8, −ln 2/4, 0). At temperature 2 the logits
    /// (0, 0, 2·ln 2, ·) give the same q. A second row, uniform over the subset, has H_S = ln 3
    /// and a zero gradient (the maximum).
    #[test]
    fn subset_entropy_matches_hand_calculation() {
        let d = Device::flex().autodiff();
        let ln2 = std::f64::consts::LN_2;
        for (temp, scale) in [(1.0, 1.0f32), (2.0, 2.0)] {
            let z = vec![0.0f32, 0.0, scale * ln2 as f32, 5.0, 1.5, 1.5, 1.5, -3.0];
            let logits = Tensor::<2>::from_data(TensorData::new(z, [2, 4]), &d).require_grad();
            let h = subset_entropy(logits.clone(), &[0, 1, 2], temp).expect("subset entropy");
            let hv = h
                .clone()
                .into_data()
                .convert::<f64>()
                .try_into_vec::<f64>()
                .expect("f64");
            assert!((hv[0] - 1.5 * ln2).abs() < 1e-6, "T={temp}: {}", hv[0]);
            assert!((hv[1] - 3f64.ln()).abs() < 1e-6, "T={temp}: {}", hv[1]);
            let g = logits
                .grad(&h.sum().backward())
                .expect("gradient")
                .into_data()
                .convert::<f64>()
                .try_into_vec::<f64>()
                .expect("f64");
            // dH/dz_j = (1/T)·(−q_j·(ln q_j + H)).
            let t = temp;
            let want = [
                ln2 / 8.0 / t,
                ln2 / 8.0 / t,
                -ln2 / 4.0 / t,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0,
            ];
            for (i, (a, b)) in g.iter().zip(want).enumerate() {
                assert!((a - b).abs() < 1e-6, "T={temp}: dH/dz[{i}] = {a}, hand {b}");
            }
        }
        let z = Tensor::<2>::zeros([1, 4], &Device::flex());
        assert!(subset_entropy(z.clone(), &[], 1.0).is_err());
        assert!(subset_entropy(z.clone(), &[4], 1.0).is_err());
        assert!(subset_entropy(z, &[1], 0.0).is_err());
    }

    /// The micro-batch loss with global weights: splitting a batch in two and adding the two
    /// losses gives the full-batch loss (the accumulation invariant), and the metric sums add up.
    #[test]
    fn micro_losses_add_up_to_the_batch_loss() {
        let d = dev();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let (b, t) = (4, 5);
        let lens = [5usize, 2, 4, 3];
        let mask: Vec<Vec<bool>> = lens
            .iter()
            .map(|&l| (0..t).map(|j| j < l && rng.random_bool(0.8)).collect())
            .collect();
        let logp: Vec<f32> = (0..b * t).map(|_| rng.random_range(-3.0..-0.1)).collect();
        let old: Vec<f32> = logp
            .iter()
            .map(|l| l + rng.random_range(-0.5f32..0.5))
            .collect();
        let adv: Vec<f32> = (0..b * t).map(|_| rng.random_range(-1.0..1.0)).collect();
        let refl: Vec<f32> = logp
            .iter()
            .map(|l| l + rng.random_range(-0.3f32..0.3))
            .collect();
        let clip = ClipConfig::default();
        for &mode in loss::LossAgg::value_variants() {
            let w = loss::agg_weights(&mask, mode, 6);
            let wf: Vec<f32> = w.iter().flatten().map(|&x| x as f32).collect();
            let mf: Vec<f32> = mask
                .iter()
                .flatten()
                .map(|&m| if m { 1.0 } else { 0.0 })
                .collect();
            let ntok: f64 = mf.iter().map(|&x| x as f64).sum();
            let coefs = LossCoefs {
                kl_coef: 0.1,
                kl_kind: KlEstimator::K3,
                entropy_coef: 0.0,
                batch_tokens: ntok,
                conf_entropy_coef: 0.0,
                conf_tokens: 0.0,
                value_entropy_coef: 0.0,
                value_tokens: 0.0,
            };
            let run = |r0: usize, r1: usize| {
                let sl = |v: &[f32]| t2(&v[r0 * t..r1 * t], r1 - r0, t, &d);
                micro_loss(
                    MicroInputs {
                        logp: sl(&logp),
                        old_logp: sl(&old),
                        adv: sl(&adv),
                        mask: sl(&mf),
                        weight: sl(&wf),
                        ref_logp: Some(sl(&refl)),
                        entropy: None,
                        conf_mask: sl(&vec![0.0; b * t]),
                        value_entropy: None,
                    },
                    &clip,
                    &coefs,
                )
            };
            let full = run(0, 4);
            let a = run(0, 1);
            let bb = run(1, 4);
            let full_loss = scalar(full.loss);
            let split = scalar(a.loss) + scalar(bb.loss);
            assert!(
                (full_loss - split).abs() < 1e-6,
                "{mode:?}: {full_loss} vs {split}"
            );
            // Against the slice reference.
            let mut lrows = vec![];
            let mut klrows = vec![];
            for i in 0..b {
                let mut lr = vec![];
                let mut kr = vec![];
                for j in 0..t {
                    let k = i * t + j;
                    lr.push(
                        loss::ppo_token_loss(logp[k] as f64, old[k] as f64, adv[k] as f64, &clip)
                            .loss,
                    );
                    kr.push(loss::kl_estimate(
                        logp[k] as f64,
                        refl[k] as f64,
                        KlEstimator::K3,
                    ));
                }
                lrows.push(lr);
                klrows.push(kr);
            }
            let want = loss::agg_loss(&lrows, &mask, mode, 6)
                + 0.1 * loss::agg_loss(&klrows, &mask, mode, 6);
            assert!(
                (full_loss - want).abs() < 1e-5,
                "{mode:?}: {full_loss} vs ref {want}"
            );
        }
    }
}
