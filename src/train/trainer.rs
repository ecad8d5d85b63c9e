//! The training loop shared by `update` (PPO/GRPO) and `sft` (cross-entropy).
//!
//! One call to [`train`] takes the rows of one table through `epochs` passes; each pass splits
//! the rows into `mini_batches` update batches, and each update batch is one optimizer step:
//! 1. aggregation weights are computed over the whole update batch ([`loss::agg_weights`]);
//! 2. its rows are sorted by length (less padding) and cut into micro-batches of `micro_batch`
//!    rows; each micro-batch runs forward and backward on the autodiff device and its gradients
//!    are added up ([`GradientsAccumulator`]); only one micro-batch's activations are alive at a
//!    time;
//! 3. the global gradient norm is measured and clipped (PyTorch `clip_grad_norm_`), and AdamW
//!    steps at the learning rate of the global step.
//!
//! Because the weights are global and the loss is a weighted token sum, the accumulated gradient
//! equals the full-batch gradient whatever the micro-batch size (tested to 1e-5). A step whose
//! gradient norm is not finite is skipped (verl does the same) and reported in the metrics.
use std::time::Instant;

use anyhow::{bail, ensure, Result};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Tensor, TensorData};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::model::ops;
use crate::model::sgemm::Precision;
use crate::model::transfer::{read, upload};
use crate::model::Transformer;

use super::data::TrainRow;
pub use super::diagnostics::{grads_to_host, Guards};
use super::diagnostics::{ref_kl, Mismatch, StepDiagnostics, TurnGrads};
use super::loss::{self, ClipConfig, KlEstimator, LossAgg};
use super::optim::{clip_coef, global_grad_norm, grad_products, AdamW};
use super::policy::{response_logprobs_subset, right_align, EntropyMode};
use super::schedule::Schedule;
use super::tensor::{micro_loss, LossCoefs, MicroInputs};

/// What is minimised.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Objective {
    /// PPO/GRPO clipped policy loss with optional KL loss and entropy bonus (`update`).
    Policy {
        /// Clip parameters.
        clip: ClipConfig,
        /// β of the KL loss (0: off; then no reference log-probs are needed).
        kl_coef: f64,
        /// KL estimator of the KL loss.
        kl_kind: KlEstimator,
        /// α of the entropy bonus.
        entropy_coef: f64,
        /// α_c of the entropy bonus on the confidence rows' tokens only (`--conf-entropy-coef`).
        #[serde(default)]
        conf_entropy_coef: f64,
        /// α_v of the entropy bonus on the confidence value over the digits
        /// (`--conf-value-entropy-coef`; needs `value_tokens`).
        #[serde(default)]
        conf_value_entropy_coef: f64,
        /// How the policy writes a confidence value (from the tokenizer).
        #[serde(default)]
        value_tokens: Option<ValueTokens>,
    },
    /// Negative log-likelihood of the learnable response tokens (`sft`).
    Sft,
}

/// The token ids a confidence value is written with: the ten digits and the decimal point
/// (one token each, as in Qwen2's and SmolLM2's tokenizers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueTokens {
    /// Ids of `0`..`9`.
    pub digits: [u32; 10],
    /// Id of `.`.
    pub point: u32,
}

impl ValueTokens {
    /// The position where a confidence row chooses its value: the last learnable position `t`
    /// of `response` whose token is a digit right after `digit .` (`0.7` → the `7`). All false
    /// when there is none (a malformed confidence).
    pub fn value_mask(&self, response: &[u32], mask: &[bool]) -> Vec<bool> {
        let digit = |x: u32| self.digits.contains(&x);
        let mut out = vec![false; response.len()];
        if let Some(t) = (2..response.len()).rev().find(|&t| {
            mask[t] && digit(response[t]) && response[t - 1] == self.point && digit(response[t - 2])
        }) {
            out[t] = true;
        }
        out
    }
}

/// Everything the loop needs besides the model, the optimizer and the rows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainConfig {
    /// The loss.
    pub objective: Objective,
    /// Loss aggregation over the update batch.
    pub loss_agg: LossAgg,
    /// L_max of `seq-mean-token-sum-norm` (Dr. GRPO's constant).
    pub agg_len: usize,
    /// Learning-rate schedule (at the global step).
    pub schedule: Schedule,
    /// Max global gradient norm (≤ 0 or ∞: no clipping).
    pub grad_clip: f64,
    /// Rows per micro-batch.
    pub micro_batch: usize,
    /// Optimizer steps per epoch (update batches per pass over the rows).
    pub mini_batches: usize,
    /// Passes over the rows.
    pub epochs: usize,
    /// Logits are divided by this before the log-softmax (the sampling temperature).
    pub temperature: f64,
    /// Shuffle the rows before each epoch (seeded).
    pub shuffle: bool,
    /// Seed of the shuffle.
    pub seed: u64,
    /// Precision of the matrix products of forward and backward (f32, or bf16 operands with
    /// f32 accumulation: [`crate::model::sgemm::Precision`]); weights, gradients and optimizer
    /// state are f32 either way.
    #[serde(default)]
    pub precision: Precision,
    /// Activation checkpointing: keep only each decoder layer's input during the forward pass
    /// and recompute the layer in backward ([`Transformer::hidden_checkpointed`]); the same
    /// gradients for less memory and one more forward pass.
    #[serde(default)]
    pub checkpoint_activations: bool,
}

/// Metrics of one optimizer step (one line of `train_metrics.jsonl`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Global optimizer step after this step (1-based; unchanged when skipped).
    pub step: u64,
    /// Epoch (0-based) and update batch within it.
    pub epoch: usize,
    /// Update batch index within the epoch.
    pub mini_batch: usize,
    /// Learning rate used.
    pub lr: f64,
    /// Total loss (`pg_loss + β·kl_loss − α·entropy`; SFT: the NLL).
    pub loss: f64,
    /// Aggregated policy-gradient loss (SFT: the NLL).
    pub pg_loss: f64,
    /// Aggregated KL loss (0 when off).
    pub kl_loss: f64,
    /// Mean per-token entropy over the learnable tokens of the rows that ran a forward pass
    /// (every row but the inert ones, see `inert_rows`).
    pub entropy: f64,
    /// Mean per-token entropy over the learnable tokens of confidence rows (0 without any).
    #[serde(default)]
    pub confidence_entropy: f64,
    /// Mean entropy over the digits at the confidence value positions (0 unless
    /// `--conf-value-entropy-coef` is on).
    #[serde(default)]
    pub confidence_value_entropy: f64,
    /// verl's `ppo_kl`: mean of `old_logp − logp` over the learnable tokens of the rows that ran
    /// a forward pass.
    pub approx_kl: f64,
    /// Fraction of learnable tokens with the low clip active.
    pub clip_frac_low: f64,
    /// Fraction with the high clip active.
    pub clip_frac_high: f64,
    /// Fraction with the dual clip active.
    pub clip_frac_dual: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learnable tokens in the update batch.
    pub tokens: usize,
    /// Rows in the update batch.
    pub rows: usize,
    /// Confidence rows among them.
    pub confidence_rows: usize,
    /// Rows left out of the forward and backward passes because their loss is zero whatever the
    /// weights (every advantage 0 and no KL or entropy term on them): they still count in the
    /// token-mean denominators, so the gradient is the one of the whole batch.
    #[serde(default)]
    pub inert_rows: usize,
    /// Wall time of the step, seconds.
    pub seconds: f64,
    /// True when the step was skipped (non-finite gradient norm or nothing to learn).
    pub skipped: bool,
    /// Lengths, KL to the reference and rollout/trainer mismatch (keys absent when not
    /// measured).
    #[serde(flatten)]
    pub diag: StepDiagnostics,
}

/// Host-side sums of one update batch.
#[derive(Debug, Clone, Default)]
pub struct BatchSums {
    /// Σ of the micro-batch losses.
    pub loss: f64,
    /// Σ w·L_pg (SFT: Σ w·NLL).
    pub pg_loss: f64,
    /// Σ w·kl.
    pub kl_loss: f64,
    /// Σ m·H.
    pub entropy: f64,
    /// Σ m·H over the confidence rows.
    pub conf_entropy: f64,
    /// Σ m_v·H_S over the confidence value positions.
    pub value_entropy: f64,
    /// Σ m·(old − logp).
    pub neg_log_ratio: f64,
    /// Clipped-token counts (low, high, dual).
    pub clipped: [f64; 3],
    /// Learnable tokens.
    pub tokens: usize,
    /// Learnable tokens of the confidence rows.
    pub conf_tokens: usize,
    /// Confidence value positions (when the value bonus is on).
    pub value_tokens: usize,
    /// Learnable tokens of the rows that ran a forward pass (the denominators of the entropy and
    /// approx-KL means), and of the confidence rows among them.
    pub forward_tokens: usize,
    pub forward_conf_tokens: usize,
    /// Rows left out as inert (see [`StepMetrics::inert_rows`]).
    pub inert_rows: usize,
    /// Rollout/trainer mismatch of the forward rows (when measured).
    pub mismatch: Option<Mismatch>,
}

impl TrainConfig {
    /// Check the sizes and coefficients.
    pub fn validate(&self) -> Result<()> {
        ensure!(self.micro_batch > 0, "--micro-batch must be at least 1");
        ensure!(self.mini_batches > 0, "--mini-batches must be at least 1");
        ensure!(self.epochs > 0, "--epochs must be at least 1");
        ensure!(
            self.temperature > 0.0 && self.temperature.is_finite(),
            "--temperature must be > 0, got {}",
            self.temperature
        );
        ensure!(
            !self.grad_clip.is_nan(),
            "--grad-clip must be a number (0 or inf to turn it off)"
        );
        if self.loss_agg == LossAgg::SeqMeanTokenSumNorm {
            ensure!(self.agg_len > 0, "--agg-len must be at least 1");
        }
        if let Objective::Policy {
            clip,
            kl_coef,
            entropy_coef,
            conf_entropy_coef,
            conf_value_entropy_coef,
            value_tokens,
            ..
        } = &self.objective
        {
            clip.validate()?;
            ensure!(
                kl_coef.is_finite() && *kl_coef >= 0.0,
                "--kl-coef must be >= 0, got {kl_coef}"
            );
            ensure!(
                entropy_coef.is_finite(),
                "--entropy-coef must be finite, got {entropy_coef}"
            );
            ensure!(
                conf_entropy_coef.is_finite() && *conf_entropy_coef >= 0.0,
                "--conf-entropy-coef must be >= 0 (a bonus on the confidence tokens' entropy), \
                 got {conf_entropy_coef}"
            );
            ensure!(
                conf_value_entropy_coef.is_finite() && *conf_value_entropy_coef >= 0.0,
                "--conf-value-entropy-coef must be >= 0 (a bonus on the confidence value's \
                 entropy), got {conf_value_entropy_coef}"
            );
            let _ = value_tokens; // set from the tokenizer after the flags are checked
        }
        Ok(())
    }

    /// The value tokens when the confidence value bonus is on.
    fn value_bonus(&self) -> Option<ValueTokens> {
        match self.objective {
            Objective::Policy {
                conf_value_entropy_coef,
                value_tokens,
                ..
            } if conf_value_entropy_coef != 0.0 => value_tokens,
            _ => None,
        }
    }

    /// True when `row`'s loss is zero whatever the weights: a policy objective, every learnable
    /// advantage ±0, no KL term, no entropy bonus (and, on a confidence row, no confidence entropy
    /// bonus) that would reach it. SFT rows are never inert.
    pub fn row_is_inert(&self, row: &TrainRow) -> bool {
        match self.objective {
            Objective::Policy {
                kl_coef,
                entropy_coef,
                conf_entropy_coef,
                conf_value_entropy_coef,
                ..
            } => {
                kl_coef == 0.0
                    && entropy_coef == 0.0
                    && (!row.is_confidence
                        || (conf_entropy_coef == 0.0 && conf_value_entropy_coef == 0.0))
                    && row.adv.iter().zip(&row.mask).all(|(&a, &m)| !m || a == 0.0)
            }
            Objective::Sft => false,
        }
    }

    fn needs_ref(&self) -> bool {
        matches!(self.objective, Objective::Policy { kl_coef, .. } if kl_coef > 0.0)
    }

    fn entropy_mode(&self) -> EntropyMode {
        match self.objective {
            Objective::Policy {
                entropy_coef,
                conf_entropy_coef,
                ..
            } if entropy_coef != 0.0 || conf_entropy_coef != 0.0 => EntropyMode::Differentiable,
            _ => EntropyMode::Detached,
        }
    }
}

/// The update batches of one epoch: row indices, `mini_batches` contiguous chunks of the
/// (optionally shuffled) order, sizes differing by at most one.
pub fn epoch_batches(n_rows: usize, cfg: &TrainConfig, epoch: usize) -> Result<Vec<Vec<usize>>> {
    if cfg.mini_batches > n_rows {
        bail!(
            "--mini-batches {} is more than the {n_rows} rows of the table",
            cfg.mini_batches
        );
    }
    let mut order: Vec<usize> = (0..n_rows).collect();
    if cfg.shuffle {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(
            cfg.seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        order.shuffle(&mut rng);
    }
    let k = cfg.mini_batches;
    let mut out = Vec::with_capacity(k);
    let mut start = 0;
    for j in 0..k {
        let len = n_rows / k + usize::from(j < n_rows % k);
        out.push(order[start..start + len].to_vec());
        start += len;
    }
    Ok(out)
}

/// Forward and backward over one update batch, micro-batch by micro-batch; returns the summed
/// gradients (not yet clipped) and the metric sums. The model is not changed.
pub fn batch_gradients(
    model: &Transformer,
    rows: &[&TrainRow],
    cfg: &TrainConfig,
) -> Result<(GradientsParams, BatchSums)> {
    batch_gradients_measured(model, rows, cfg, false)
}

/// [`batch_gradients`], and with `measure` (policy objective) the rollout/trainer mismatch of
/// the forward rows' learnable tokens in [`BatchSums::mismatch`] (their log-probs read back once).
pub fn batch_gradients_measured(
    model: &Transformer,
    rows: &[&TrainRow],
    cfg: &TrainConfig,
    measure: bool,
) -> Result<(GradientsParams, BatchSums)> {
    batch_gradients_of(model, rows, cfg, measure, false)
}

/// The gradient of the confidence rows' terms alone: the loss of [`batch_gradients`] restricted
/// to the confidence rows, every row keeping its place in the aggregation weights, so that the
/// whole batch's gradient is this plus the answer rows' one. Empty (no parameter) when no
/// confidence row has a term that reaches the weights (RLVR's, trained with `--lambda-conf 0`).
pub fn confidence_gradients(
    model: &Transformer,
    rows: &[&TrainRow],
    cfg: &TrainConfig,
) -> Result<GradientsParams> {
    Ok(batch_gradients_of(model, rows, cfg, false, true)?.0)
}

fn batch_gradients_of(
    model: &Transformer,
    rows: &[&TrainRow],
    cfg: &TrainConfig,
    measure: bool,
    confidence_only: bool,
) -> Result<(GradientsParams, BatchSums)> {
    let masks: Vec<Vec<bool>> = rows.iter().map(|r| r.mask.clone()).collect();
    let weights = loss::agg_weights(&masks, cfg.loss_agg, cfg.agg_len);
    let tokens: usize = rows.iter().map(|r| r.n_learnable()).sum();
    let conf_tokens: usize = rows
        .iter()
        .filter(|r| r.is_confidence)
        .map(|r| r.n_learnable())
        .sum();
    let value = cfg.value_bonus();
    // Every product of the forward and backward passes below in the configured precision.
    crate::model::sgemm::check_device(cfg.precision, &model.device())?;
    let _precision = crate::model::sgemm::autocast(cfg.precision);
    if let Objective::Policy {
        conf_value_entropy_coef,
        value_tokens: None,
        ..
    } = cfg.objective
    {
        ensure!(
            conf_value_entropy_coef == 0.0,
            "--conf-value-entropy-coef needs the value tokens (the digits and `.`)"
        );
    }
    let vmasks: Vec<Vec<bool>> = rows
        .iter()
        .map(|r| match value {
            Some(v) if r.is_confidence => v.value_mask(&r.response, &r.mask),
            _ => vec![false; r.response.len()],
        })
        .collect();
    let value_tokens: usize = vmasks.iter().flatten().filter(|&&m| m).count();
    let mut sums = BatchSums {
        tokens,
        conf_tokens,
        value_tokens,
        ..Default::default()
    };
    // Rows with nothing learnable contribute nothing: leave them out of the forward passes. So do
    // inert rows (every learnable advantage 0 and no KL or entropy term that reaches them): their
    // clipped PPO term is −0·ratio = 0 whatever the weights, so their gradient is exactly zero. A
    // group whose answers all score alike (GRPO's zero-variance groups) and RLVR's confidence
    // rows (`--lambda-conf 0`) are such rows. They keep their place in the aggregation weights
    // above (token-mean denominators), so the gradient is the whole batch's. If every row is
    // inert the first learnable one still runs: the optimizer then takes its step with a zero
    // gradient (momentum and weight decay), as it would with all rows.
    let learnable = |i: usize| !rows[i].response.is_empty() && rows[i].n_learnable() > 0;
    let inert = |i: usize| cfg.row_is_inert(rows[i]);
    let mut live: Vec<usize> = (0..rows.len())
        .filter(|&i| learnable(i) && !inert(i) && (rows[i].is_confidence || !confidence_only))
        .collect();
    if confidence_only && live.is_empty() {
        return Ok((GradientsParams::new(), sums));
    }
    if live.is_empty() {
        live.extend((0..rows.len()).find(|&i| learnable(i)));
    }
    sums.inert_rows = (0..rows.len()).filter(|&i| learnable(i)).count() - live.len();
    sums.forward_tokens = live.iter().map(|&i| rows[i].n_learnable()).sum();
    sums.forward_conf_tokens = live
        .iter()
        .filter(|&&i| rows[i].is_confidence)
        .map(|&i| rows[i].n_learnable())
        .sum();
    live.sort_by_key(|&i| std::cmp::Reverse(rows[i].total_len()));
    let mut acc = GradientsAccumulator::<Transformer>::new();
    let coefs = match cfg.objective {
        Objective::Policy {
            kl_coef,
            kl_kind,
            entropy_coef,
            conf_entropy_coef,
            conf_value_entropy_coef,
            ..
        } => LossCoefs {
            kl_coef,
            kl_kind,
            entropy_coef,
            batch_tokens: tokens as f64,
            conf_entropy_coef,
            conf_tokens: conf_tokens as f64,
            value_entropy_coef: conf_value_entropy_coef,
            value_tokens: value_tokens as f64,
        },
        Objective::Sft => LossCoefs {
            kl_coef: 0.0,
            kl_kind: KlEstimator::K3,
            entropy_coef: 0.0,
            batch_tokens: tokens as f64,
            conf_entropy_coef: 0.0,
            conf_tokens: conf_tokens as f64,
            value_entropy_coef: 0.0,
            value_tokens: 0.0,
        },
    };
    let device = model.device();
    for chunk in live.chunks(cfg.micro_batch) {
        let pairs: Vec<(&[u32], &[u32])> = chunk
            .iter()
            .map(|&i| (rows[i].context.as_slice(), rows[i].response.as_slice()))
            .collect();
        let fwd = crate::trace::span_with("forward (micro-batch)", || {
            vec![("rows", chunk.len().into())]
        });
        let out = response_logprobs_subset(
            model,
            &pairs,
            cfg.temperature,
            cfg.entropy_mode(),
            value.as_ref().map(|v| &v.digits[..]),
            cfg.checkpoint_activations,
        )?;
        let checkpoints = out.checkpoints;
        let (b, r) = (chunk.len(), out.max_resp);
        let t2 = |v: Vec<f32>| -> Tensor<2> { upload(TensorData::new(v, [b, r]), &device) };
        let col = |f: &dyn Fn(&TrainRow) -> Vec<f32>| -> Tensor<2> {
            let vals: Vec<Vec<f32>> = chunk.iter().map(|&i| f(rows[i])).collect();
            let refs: Vec<&[f32]> = vals.iter().map(|v| v.as_slice()).collect();
            t2(right_align(&refs, r, 0.0))
        };
        let mask = col(&|row| row.mask.iter().map(|&m| f32::from(u8::from(m))).collect());
        let vmask = value.map(|_| {
            let vals: Vec<Vec<f32>> = chunk
                .iter()
                .map(|&i| vmasks[i].iter().map(|&m| f32::from(u8::from(m))).collect())
                .collect();
            let refs: Vec<&[f32]> = vals.iter().map(|v| v.as_slice()).collect();
            t2(right_align(&refs, r, 0.0))
        });
        let conf_mask = col(&|row| {
            row.mask
                .iter()
                .map(|&m| f32::from(u8::from(m && row.is_confidence)))
                .collect()
        });
        let wvals: Vec<Vec<f32>> = chunk
            .iter()
            .map(|&i| weights[i].iter().map(|&w| w as f32).collect())
            .collect();
        let wrefs: Vec<&[f32]> = wvals.iter().map(|v| v.as_slice()).collect();
        let weight = t2(right_align(&wrefs, r, 0.0));
        let loss_t = match cfg.objective {
            Objective::Policy { clip, .. } => {
                // The trainer's log-probs for the mismatch, read with the metrics below.
                let measured = measure.then(|| out.logp.clone().detach().reshape([b * r]));
                let ref_logp = if cfg.needs_ref() {
                    if let Some(&i) = chunk.iter().find(|&&i| rows[i].ref_logp.is_none()) {
                        bail!("row {i} has no reference log-probs (needed by --kl-coef > 0)");
                    }
                    Some(col(&|row| row.ref_logp.clone().unwrap_or_default()))
                } else {
                    None
                };
                let m = micro_loss(
                    MicroInputs {
                        logp: out.logp,
                        old_logp: col(&|row| row.old_logp.clone()),
                        adv: col(&|row| row.adv.clone()),
                        mask,
                        weight,
                        ref_logp,
                        entropy: out.entropy,
                        conf_mask,
                        value_entropy: out.subset_entropy.zip(vmask),
                    },
                    &clip,
                    &coefs,
                );
                // Every metric of the micro-batch in one read (one host round trip on a GPU),
                // with the log-probs of the mismatch measurement when it is taken.
                let [a, bb, c] = m.clipped;
                let (v, logp) = scalars_with(
                    vec![
                        m.loss.clone().detach(),
                        m.pg_loss,
                        m.kl_loss,
                        m.entropy_sum,
                        m.neg_log_ratio_sum,
                        a,
                        bb,
                        c,
                        m.conf_entropy_sum,
                        m.value_entropy_sum,
                    ],
                    measured,
                )?;
                if measure {
                    let block: Vec<&TrainRow> = chunk.iter().map(|&i| rows[i]).collect();
                    let mm = sums.mismatch.get_or_insert_with(Mismatch::default);
                    mm.add_right_aligned(&logp, &block, r);
                }
                sums.loss += v[0];
                sums.pg_loss += v[1];
                sums.kl_loss += v[2];
                sums.entropy += v[3];
                sums.neg_log_ratio += v[4];
                sums.clipped[0] += v[5];
                sums.clipped[1] += v[6];
                sums.clipped[2] += v[7];
                sums.conf_entropy += v[8];
                sums.value_entropy += v[9];
                m.loss
            }
            Objective::Sft => {
                let nll = ops::sum(out.logp.neg() * weight);
                let mut read = vec![nll.clone().detach()];
                if let Some(h) = out.entropy {
                    read.push(ops::sum(h.clone() * mask).detach());
                    read.push(ops::sum(h * conf_mask).detach());
                }
                let v = scalars(read)?;
                sums.loss += v[0];
                sums.pg_loss += v[0];
                if let (Some(e), Some(ec)) = (v.get(1), v.get(2)) {
                    sums.entropy += e;
                    sums.conf_entropy += ec;
                }
                nll
            }
        };
        drop(fwd);
        let bwd = crate::trace::span("backward (micro-batch)");
        let grads = match checkpoints {
            Some(c) => c.backward(model, loss_t.backward())?,
            None => GradientsParams::from_grads(loss_t.backward(), model),
        };
        drop(bwd);
        acc.accumulate(model, grads);
    }
    Ok((acc.grads(), sums))
}

/// One-element tensors read back together (one host round trip), as f64.
fn scalars(ts: Vec<Tensor<1>>) -> Result<Vec<f64>> {
    Ok(scalars_with(ts, None)?.0)
}

/// [`scalars`], and the values of `extra` read in the same round trip (as f32: they are f32
/// values, and f32 → f64 → f32 gives the same bits).
fn scalars_with(mut ts: Vec<Tensor<1>>, extra: Option<Tensor<1>>) -> Result<(Vec<f64>, Vec<f32>)> {
    let n = ts.len();
    let want = n + extra.as_ref().map_or(0, |e| e.dims()[0]);
    if let Some(e) = extra {
        let dtype = ts.first().map(|t| t.dtype());
        ts.push(match dtype {
            Some(d) if d != e.dtype() => e.cast(d),
            _ => e,
        });
    }
    let mut v = read(Tensor::cat(ts, 0))?
        .convert::<f64>()
        .try_into_vec::<f64>()
        .map_err(|e| anyhow::anyhow!("reading the loss values: {e:?}"))?;
    ensure!(v.len() == want, "{} loss values for {want}", v.len());
    let rest = v.split_off(n).into_iter().map(|x| x as f32).collect();
    Ok((v, rest))
}

/// Run the whole loop: `epochs × mini_batches` optimizer steps over `rows`. `on_step` sees the
/// metrics of each step as it ends (to stream them to disk and the progress bar).
pub fn train(
    model: Transformer,
    opt: &mut AdamW,
    rows: &[TrainRow],
    cfg: &TrainConfig,
    on_step: impl FnMut(&StepMetrics) -> Result<()>,
) -> Result<(Transformer, Vec<StepMetrics>)> {
    train_guarded(model, opt, rows, cfg, &Guards::default(), on_step)
}

/// [`train`] with [`Guards`]: a first update batch whose rollout/trainer mismatch exceeds
/// `guards.max_mismatch` stops the call before its first optimizer step.
pub fn train_guarded(
    mut model: Transformer,
    opt: &mut AdamW,
    rows: &[TrainRow],
    cfg: &TrainConfig,
    guards: &Guards,
    mut on_step: impl FnMut(&StepMetrics) -> Result<()>,
) -> Result<(Transformer, Vec<StepMetrics>)> {
    cfg.validate()?;
    if let Some(limit) = guards.max_mismatch {
        ensure!(
            limit >= 0.0,
            "--max-mismatch must be a number >= 0, got {limit}"
        );
    }
    let policy = matches!(cfg.objective, Objective::Policy { .. });
    let kl_to_ref = if policy { ref_kl(rows) } else { None };
    ensure!(!rows.is_empty(), "no rows to train on");
    if cfg.needs_ref() {
        if let Some(i) = rows.iter().position(|r| r.ref_logp.is_none()) {
            bail!("row {i} has no reference log-probs (needed by --kl-coef > 0)");
        }
    }
    let mut all = Vec::new();
    for epoch in 0..cfg.epochs {
        for (j, idx) in epoch_batches(rows.len(), cfg, epoch)?
            .into_iter()
            .enumerate()
        {
            let t0 = Instant::now();
            let batch: Vec<&TrainRow> = idx.iter().map(|&i| &rows[i]).collect();
            // LoRA dropout masks are keyed by the seed and the optimizer step.
            let dropout = crate::model::lora::dropout_scope(cfg.seed, opt.step);
            let first = all.is_empty();
            let (grads, sums) = batch_gradients_measured(&model, &batch, cfg, first && policy)?;
            if let (Some(mm), Some(limit)) = (&sums.mismatch, guards.max_mismatch) {
                mm.check(limit)?;
            }
            let norm = global_grad_norm(&model, &grads);
            // The turns' shares of the first batch's gradient: one more forward and backward pass
            // over its confidence rows (under the same dropout masks), the weights unchanged.
            let turns = if first && policy && guards.turn_grad_norms {
                let conf = confidence_gradients(&model, &batch, cfg)?;
                let (full_sq, dot, conf_sq) = grad_products(&model, &grads, &conf);
                Some(TurnGrads::from_products(full_sq, dot, conf_sq))
            } else {
                None
            };
            drop(dropout);
            let lr = cfg.schedule.lr_at(opt.step);
            let skipped = !norm.is_finite() || grads.is_empty() || sums.tokens == 0;
            if skipped {
                if !norm.is_finite() {
                    crate::info!(
                        "warning: step {}: gradient norm is {norm}; the step is skipped",
                        opt.step + 1
                    );
                }
            } else {
                model = opt.step(model, grads, lr, clip_coef(norm, cfg.grad_clip));
            }
            let n = sums.tokens.max(1) as f64;
            let nf = sums.forward_tokens.max(1) as f64;
            let m = StepMetrics {
                step: opt.step,
                epoch,
                mini_batch: j,
                lr,
                loss: sums.loss,
                pg_loss: sums.pg_loss,
                kl_loss: sums.kl_loss,
                entropy: sums.entropy / nf,
                confidence_entropy: sums.conf_entropy / sums.forward_conf_tokens.max(1) as f64,
                confidence_value_entropy: sums.value_entropy / sums.value_tokens.max(1) as f64,
                approx_kl: sums.neg_log_ratio / nf,
                clip_frac_low: sums.clipped[0] / n,
                clip_frac_high: sums.clipped[1] / n,
                clip_frac_dual: sums.clipped[2] / n,
                grad_norm: norm,
                tokens: sums.tokens,
                rows: batch.len(),
                confidence_rows: batch.iter().filter(|r| r.is_confidence).count(),
                inert_rows: sums.inert_rows,
                seconds: t0.elapsed().as_secs_f64(),
                skipped,
                diag: StepDiagnostics::of(
                    batch.iter().copied(),
                    first.then_some(kl_to_ref).flatten(),
                    sums.mismatch.as_ref(),
                    turns.as_ref(),
                ),
            };
            on_step(&m)?;
            all.push(m);
        }
    }
    Ok((model, all))
}

#[cfg(test)]
pub(crate) mod tests;
