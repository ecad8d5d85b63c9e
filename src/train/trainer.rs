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

use crate::model::sgemm::Precision;
use crate::model::transfer::{read, upload};
use crate::model::Transformer;

use super::data::TrainRow;
pub use super::diagnostics::{grads_to_host, Guards};
use super::diagnostics::{ref_kl, Mismatch, StepDiagnostics};
use super::loss::{self, ClipConfig, KlEstimator, LossAgg};
use super::optim::{clip_coef, global_grad_norm, AdamW};
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
        .filter(|&i| learnable(i) && !inert(i))
        .collect();
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
                let nll = (out.logp.neg() * weight).sum();
                let mut read = vec![nll.clone().detach()];
                if let Some(h) = out.entropy {
                    read.push((h.clone() * mask).sum().detach());
                    read.push((h * conf_mask).sum().detach());
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
            drop(dropout);
            if let (Some(mm), Some(limit)) = (&sums.mismatch, guards.max_mismatch) {
                mm.check(limit)?;
            }
            let norm = global_grad_norm(&model, &grads);
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
                ),
            };
            on_step(&m)?;
            all.push(m);
        }
    }
    Ok((model, all))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::Model;
    use crate::train::optim::AdamWConfig;
    use crate::train::policy::{host_logprobs, response_logprobs};
    use crate::train::schedule::ScheduleKind;
    use burn::module::{Module, ModuleMapper, Param};
    use burn::tensor::Device;
    use rand::{Rng, SeedableRng};
    use std::path::PathBuf;

    pub(crate) fn tiny_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-qwen2")
    }

    pub(crate) fn tiny() -> Model {
        Model::load(&tiny_dir(), &Device::flex().autodiff()).expect("tiny-qwen2 fixture")
    }

    /// Ragged rows of random ids; behaviour log-probs = current ones + noise within ±`noise`
    /// (so ratios stay inside the clip range when `noise` is small), advantages ±, a few masked
    /// tokens.
    pub(crate) fn rows(model: &Transformer, n: usize, seed: u64, noise: f32) -> Vec<TrainRow> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut out: Vec<TrainRow> = (0..n)
            .map(|i| {
                let c = rng.random_range(2..7);
                let r = rng.random_range(2..9);
                let context: Vec<u32> = (0..c).map(|_| rng.random_range(0..360)).collect();
                let response: Vec<u32> = (0..r).map(|_| rng.random_range(0..360)).collect();
                let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
                let adv: Vec<f32> = (0..r)
                    .map(|_| sign * rng.random_range(0.2f32..1.5))
                    .collect();
                let mask: Vec<bool> = (0..r).map(|t| t == 0 || rng.random_bool(0.85)).collect();
                TrainRow {
                    context,
                    response,
                    old_logp: vec![0.0; r],
                    adv,
                    mask,
                    ref_logp: None,
                    is_confidence: i % 3 == 2,
                }
            })
            .collect();
        let pairs: Vec<(&[u32], &[u32])> = out
            .iter()
            .map(|r| (r.context.as_slice(), r.response.as_slice()))
            .collect();
        let lp = host_logprobs(&model.valid(), &pairs, 8, 1.0, None).expect("logprobs");
        for (row, lp) in out.iter_mut().zip(lp) {
            let mut noisy: Vec<f32> = lp
                .iter()
                .map(|l| (l + rng.random_range(-noise..=noise)).min(0.0))
                .collect();
            row.ref_logp = Some(lp.iter().map(|l| (l - 0.05).min(0.0)).collect());
            std::mem::swap(&mut row.old_logp, &mut noisy);
        }
        out
    }

    pub(crate) fn config(agg: LossAgg, micro: usize) -> TrainConfig {
        TrainConfig {
            objective: Objective::Policy {
                clip: ClipConfig::default(),
                kl_coef: 0.1,
                kl_kind: KlEstimator::K3,
                entropy_coef: 0.01,
                conf_entropy_coef: 0.05,
                conf_value_entropy_coef: 0.0,
                value_tokens: None,
            },
            loss_agg: agg,
            agg_len: 8,
            schedule: Schedule::new(1e-3, 0.0, ScheduleKind::Constant, None).expect("schedule"),
            grad_clip: 1.0,
            micro_batch: micro,
            mini_batches: 1,
            epochs: 1,
            temperature: 1.0,
            shuffle: false,
            seed: 0,
            precision: Precision::F32,
            checkpoint_activations: false,
        }
    }

    fn max_abs_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> (f32, f32) {
        assert_eq!(a.len(), b.len());
        let mut diff = 0f32;
        let mut scale = 0f32;
        for ((na, va), (nb, vb)) in a.iter().zip(b) {
            assert_eq!(na, nb);
            for (x, y) in va.iter().zip(vb) {
                diff = diff.max((x - y).abs());
                scale = scale.max(x.abs());
            }
        }
        (diff, scale)
    }

    /// Inert rows (every advantage 0, no KL or entropy term) are left out of the passes without
    /// changing the gradient: the same batch whose zero advantages are replaced by 1e-30 (not
    /// inert, so every row runs; their terms are ~1e-30 of the others', far below f32's
    /// resolution) gives the same gradient up to the summation order of other micro-batches, for
    /// every aggregation mode. The denominators keep the inert rows: halving the batch's learnable
    /// tokens would double a token-mean gradient. A batch of inert rows alone still takes its
    /// (zero-gradient) optimizer step.
    #[test]
    fn inert_rows_are_skipped_without_changing_the_gradient() {
        let m = tiny();
        let mut base = rows(&m.transformer, 6, 7, 0.3);
        for r in base.iter_mut().skip(1).step_by(2) {
            r.adv.iter_mut().for_each(|a| *a = 0.0);
        }
        let mut tiny_adv = base.clone();
        for r in tiny_adv.iter_mut().skip(1).step_by(2) {
            r.adv.iter_mut().for_each(|a| *a = 1e-30);
        }
        let plain = |agg, micro| {
            let mut c = config(agg, micro);
            if let Objective::Policy {
                kl_coef,
                entropy_coef,
                conf_entropy_coef,
                ..
            } = &mut c.objective
            {
                *kl_coef = 0.0;
                *entropy_coef = 0.0;
                *conf_entropy_coef = 0.0;
            }
            c
        };
        for agg in [
            LossAgg::TokenMean,
            LossAgg::SeqMeanTokenMean,
            LossAgg::SeqMeanTokenSum,
            LossAgg::SeqMeanTokenSumNorm,
        ] {
            let cfg = plain(agg, 2);
            assert!(cfg.row_is_inert(&base[1]) && !cfg.row_is_inert(&tiny_adv[1]));
            let a: Vec<&TrainRow> = base.iter().collect();
            let b: Vec<&TrainRow> = tiny_adv.iter().collect();
            let (ga, sa) = batch_gradients(&m.transformer, &a, &cfg).expect("skipping");
            let (gb, sb) = batch_gradients(&m.transformer, &b, &cfg).expect("all rows");
            assert_eq!((sa.inert_rows, sb.inert_rows), (3, 0));
            assert_eq!(sa.tokens, sb.tokens);
            assert!(sa.forward_tokens < sb.forward_tokens);
            let (diff, scale) = max_abs_diff(
                &grads_to_host(&m.transformer, &ga),
                &grads_to_host(&m.transformer, &gb),
            );
            assert!(scale > 1e-3, "{agg:?}: gradients vanish ({scale})");
            assert!(
                diff <= 1e-6 * scale,
                "{agg:?}: |Δgrad| {diff:e} of {scale:e}"
            );
            assert!((sa.loss - sb.loss).abs() <= 1e-6 * sb.loss.abs().max(1e-3));
            // With an entropy bonus or a KL term no row is inert.
            let (_, s) = batch_gradients(&m.transformer, &a, &config(agg, 2)).expect("bonus");
            assert_eq!(s.inert_rows, 0);
        }
        // A batch of inert rows alone: one row still runs and the step is taken, not skipped.
        let only: Vec<TrainRow> = base.iter().skip(1).step_by(2).cloned().collect();
        let cfg = plain(LossAgg::TokenMean, 2);
        let mut opt = AdamW::new(AdamWConfig::default());
        let (_, steps) =
            train(m.transformer.clone(), &mut opt, &only, &cfg, |_| Ok(())).expect("train");
        assert_eq!(steps.len(), 1);
        assert!(!steps[0].skipped);
        assert_eq!(steps[0].inert_rows, 2);
        assert_eq!(steps[0].grad_norm, 0.0);
    }

    /// D6/D7: 4 micro-batches of one row give the same gradient as one batch of four rows, for
    /// every aggregation mode (with KL loss, entropy bonus and confidence entropy bonus on).
    #[test]
    fn accumulation_over_micro_batches_equals_full_batch() {
        let m = tiny();
        let rows = rows(&m.transformer, 4, 1, 0.3);
        let refs: Vec<&TrainRow> = rows.iter().collect();
        for agg in [
            LossAgg::TokenMean,
            LossAgg::SeqMeanTokenMean,
            LossAgg::SeqMeanTokenSum,
            LossAgg::SeqMeanTokenSumNorm,
        ] {
            let (g4, s4) = batch_gradients(&m.transformer, &refs, &config(agg, 4)).expect("full");
            let (g1, s1) = batch_gradients(&m.transformer, &refs, &config(agg, 1)).expect("micro");
            let h4 = grads_to_host(&m.transformer, &g4);
            let h1 = grads_to_host(&m.transformer, &g1);
            let (diff, scale) = max_abs_diff(&h4, &h1);
            assert!(scale > 1e-3, "{agg:?}: gradients vanish ({scale})");
            eprintln!(
                "{agg:?}: max |Δgrad| {diff:e}, max |grad| {scale:e}, loss {} vs {}",
                s4.loss, s1.loss
            );
            assert!(
                diff <= 1e-5,
                "{agg:?}: max |Δgrad| = {diff} (scale {scale})"
            );
            assert!(
                (s4.loss - s1.loss).abs() < 1e-6,
                "{agg:?}: {} vs {}",
                s4.loss,
                s1.loss
            );
            assert_eq!(s4.tokens, s1.tokens);
        }
    }

    /// Replace one coordinate of the parameter at `path` by `value + delta`.
    struct Perturb {
        path: Vec<String>,
        target: String,
        index: usize,
        delta: f32,
    }

    impl ModuleMapper for Perturb {
        fn enter_module(&mut self, name: &str, _c: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _c: &str) {
            self.path.pop();
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            if self.path.join(".") != self.target {
                return param;
            }
            let (id, t, mapper) = param.consume();
            let dims = t.dims();
            let device = t.device();
            let mut v = t
                .into_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .expect("f32");
            v[self.index] += self.delta;
            let t = Tensor::<D>::from_data(TensorData::new(v, dims), &device).require_grad();
            Param::from_mapped_value(id, t, mapper)
        }
    }

    /// The gradient of the PPO loss (with KL, entropy and confidence-entropy terms) against central finite
    /// differences of the loss, at the largest-gradient coordinate of several parameters.
    /// In f32 (the model's RoPE tables are f32, so an f64 copy of the module does not run): with
    /// h = 1e-2 the observed relative error is about 1e-4; the tolerance is 2e-3.
    #[test]
    fn ppo_gradient_matches_finite_differences() {
        let m = tiny();
        // Small noise: every ratio stays well inside [0.8, 1.2], so no clip switches on or off
        // within ±h.
        let rows = rows(&m.transformer, 4, 2, 0.05);
        let refs: Vec<&TrainRow> = rows.iter().collect();
        let cfg = config(LossAgg::TokenMean, 2);
        let (g, _) = batch_gradients(&m.transformer, &refs, &cfg).expect("grads");
        let host = grads_to_host(&m.transformer, &g);
        let h = 1e-2f32;
        let mut checked = 0;
        for target in [
            "embed",
            "layers.0.attn.qkv",
            "layers.1.attn.o",
            "layers.0.mlp.gate_up",
            "layers.1.mlp.down",
            "layers.1.post_norm",
            "norm",
        ] {
            let Some((_, gv)) = host.iter().find(|(n, _)| n == target) else {
                panic!(
                    "no gradient for {target}; have {:?}",
                    host.iter().map(|x| &x.0).collect::<Vec<_>>()
                );
            };
            let (index, &grad) = gv
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                .expect("non-empty");
            let loss_at = |delta: f32| {
                let mut p = Perturb {
                    path: vec![],
                    target: target.to_string(),
                    index,
                    delta,
                };
                let pm = m.transformer.clone().map(&mut p);
                batch_gradients(&pm, &refs, &cfg).expect("loss").1.loss
            };
            let fd = (loss_at(h) - loss_at(-h)) / (2.0 * h as f64);
            let err = (fd - grad as f64).abs();
            eprintln!(
                "{target}[{index}]: autodiff {grad:e} fd {fd:e} rel err {:e}",
                err / (grad as f64).abs()
            );
            assert!(
                err <= 2e-3 * (grad as f64).abs() + 2e-5,
                "{target}[{index}]: autodiff {grad:e} vs finite difference {fd:e}"
            );
            checked += 1;
        }
        assert_eq!(checked, 7);
    }

    /// Repeated on-policy updates on a fixed batch raise the log-probs of positive-advantage
    /// responses and lower those of negative ones.
    #[test]
    fn repeated_updates_move_log_probs_the_right_way() {
        let m = tiny();
        let mut rows = rows(&m.transformer, 6, 3, 0.0);
        for r in &mut rows {
            r.mask = vec![true; r.response.len()];
            let s = if r.adv[0] > 0.0 { 1.0 } else { -1.0 };
            r.adv = vec![s; r.response.len()];
        }
        let mean_lp = |model: &Transformer, rows: &[TrainRow]| -> (f64, f64) {
            let pairs: Vec<(&[u32], &[u32])> = rows
                .iter()
                .map(|r| (r.context.as_slice(), r.response.as_slice()))
                .collect();
            let lp = host_logprobs(&model.valid(), &pairs, 8, 1.0, None).expect("lp");
            let (mut pos, mut neg) = (0.0, 0.0);
            for (r, l) in rows.iter().zip(&lp) {
                let s: f64 = l.iter().map(|&x| x as f64).sum::<f64>() / l.len() as f64;
                if r.adv[0] > 0.0 {
                    pos += s;
                } else {
                    neg += s;
                }
            }
            (pos, neg)
        };
        let (pos0, neg0) = mean_lp(&m.transformer, &rows);
        let mut cfg = config(LossAgg::TokenMean, 2);
        cfg.objective = Objective::Policy {
            clip: ClipConfig::default(),
            kl_coef: 0.0,
            kl_kind: KlEstimator::K3,
            entropy_coef: 0.0,
            conf_entropy_coef: 0.0,
            conf_value_entropy_coef: 0.0,
            value_tokens: None,
        };
        cfg.schedule = Schedule::new(1e-2, 0.0, ScheduleKind::Constant, None).expect("schedule");
        let mut opt = AdamW::new(AdamWConfig::default());
        let mut model = m.transformer;
        for _ in 0..5 {
            // On-policy: behaviour log-probs are the current ones (ratio 1 at the start).
            let pairs: Vec<(&[u32], &[u32])> = rows
                .iter()
                .map(|r| (r.context.as_slice(), r.response.as_slice()))
                .collect();
            let lp = host_logprobs(&model.valid(), &pairs, 8, 1.0, None).expect("lp");
            for (r, l) in rows.iter_mut().zip(lp) {
                r.old_logp = l;
            }
            let (m2, steps) = train(model, &mut opt, &rows, &cfg, |_| Ok(())).expect("train");
            model = m2;
            assert!(!steps[0].skipped);
            assert!(steps[0].clip_frac_low == 0.0 && steps[0].clip_frac_high == 0.0);
            assert!(steps[0].approx_kl.abs() < 1e-6, "on-policy ratio is 1");
        }
        let (pos1, neg1) = mean_lp(&model, &rows);
        eprintln!("positive {pos0} -> {pos1}; negative {neg0} -> {neg1}");
        assert!(pos1 > pos0 + 0.1, "positive rows: {pos0} -> {pos1}");
        assert!(neg1 < neg0 - 0.1, "negative rows: {neg0} -> {neg1}");
        assert_eq!(opt.step, 5);
    }

    /// Entropy and log-probs of the training path against transformers' figures (oracle refs,
    /// f64): a sequence cut into context and response.
    #[test]
    fn training_logprobs_and_entropy_match_transformers() {
        let m = tiny();
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/refs/tiny-qwen2.rand.f64.json");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("refs")).expect("json");
        let seqs = v["sequences"].as_array().expect("sequences");
        let mut pairs = Vec::new();
        let mut want_lp = Vec::new();
        let mut want_ent = Vec::new();
        for (j, s) in seqs.iter().enumerate() {
            let ids: Vec<u32> = s["input_ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|x| x.as_u64().expect("id") as u32)
                .collect();
            let f = |k: &str| -> Vec<f64> {
                s[k].as_array()
                    .expect(k)
                    .iter()
                    .map(|x| x.as_f64().expect("f64"))
                    .collect()
            };
            let cut = 5 + 7 * j; // ragged: different context lengths per row
            let end = ids.len() - 3 * j; // and different response lengths
            pairs.push((ids[..cut].to_vec(), ids[cut..end].to_vec()));
            want_lp.push(f("logprobs")[cut - 1..end - 1].to_vec());
            want_ent.push(f("entropy")[cut - 1..end - 1].to_vec());
        }
        let out =
            response_logprobs(&m.transformer, &pairs, 1.0, EntropyMode::Detached).expect("lp");
        let lp = crate::model::read_f32(out.logp).expect("host");
        let ent = crate::model::read_f32(out.entropy.expect("entropy")).expect("host");
        let lp = crate::train::policy::split_right_aligned(&lp, &out.resp_lens, out.max_resp);
        let ent = crate::train::policy::split_right_aligned(&ent, &out.resp_lens, out.max_resp);
        let mut worst = 0f64;
        for j in 0..pairs.len() {
            assert_eq!(lp[j].len(), want_lp[j].len());
            for t in 0..lp[j].len() {
                worst = worst.max((lp[j][t] as f64 - want_lp[j][t]).abs());
                worst = worst.max((ent[j][t] as f64 - want_ent[j][t]).abs());
            }
        }
        eprintln!("max deviation from transformers: {worst:e}");
        assert!(worst < 1e-4, "max deviation from transformers: {worst}");
        // At temperature 1 the training path gives the numbers of `rlcr logprobs`.
        let rows: Vec<(&[u32], &[u32])> = pairs
            .iter()
            .map(|(c, r)| (c.as_slice(), r.as_slice()))
            .collect();
        let inner = m.transformer.valid();
        let a = crate::model::logprobs(&inner, &rows, 2, false, None)
            .expect("logprobs")
            .logprobs;
        let b = host_logprobs(&inner, &rows, 3, 1.0, None).expect("host");
        for (x, y) in a.iter().zip(&b) {
            for (p, q) in x.iter().zip(y) {
                assert!((p - q).abs() < 2e-6, "{p} vs {q}");
            }
        }
        // Temperature divides the logits: at T = 2 the log-probs differ.
        let c = host_logprobs(&inner, &rows, 3, 2.0, None).expect("host");
        assert!((c[0][0] - b[0][0]).abs() > 1e-3);
    }

    /// The value position of a confidence row: the last learnable digit right after `digit .`.
    #[test]
    fn value_mask_finds_the_first_decimal_of_the_last_value() {
        // digits 0..9 are ids 10..19, `.` is 5.
        let v = ValueTokens {
            digits: [10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
            point: 5,
        };
        let all = |n: usize| vec![true; n];
        let at = |m: Vec<bool>| -> Vec<usize> { (0..m.len()).filter(|&i| m[i]).collect() };
        // `<c>0.7</c>`: the 7.
        assert_eq!(at(v.value_mask(&[3, 10, 5, 17, 4], &all(5))), vec![3]);
        // `0.75`: the first decimal only.
        assert_eq!(at(v.value_mask(&[10, 5, 17, 15], &all(4))), vec![2]);
        // Two numbers: the last one (the confidence tag comes last).
        let r = [10, 5, 13, 40, 10, 5, 17, 2];
        assert_eq!(at(v.value_mask(&r, &all(8))), vec![6]);
        // The last one masked: the one before.
        let mut m = all(8);
        m[6] = false;
        assert_eq!(at(v.value_mask(&r, &m)), vec![2]);
        // No value (`.7`, `0.` then a letter, no digit before the point): none.
        assert!(at(v.value_mask(&[5, 17, 4], &all(3))).is_empty());
        assert!(at(v.value_mask(&[10, 5, 40], &all(3))).is_empty());
        assert!(at(v.value_mask(&[40, 5, 17], &all(3))).is_empty());
        assert!(at(v.value_mask(&[], &[])).is_empty());
    }

    #[test]
    fn epoch_batches_split_and_shuffle() {
        let mut cfg = config(LossAgg::TokenMean, 1);
        cfg.mini_batches = 3;
        let b = epoch_batches(7, &cfg, 0).expect("batches");
        assert_eq!(b, vec![vec![0, 1, 2], vec![3, 4], vec![5, 6]]);
        cfg.shuffle = true;
        let s0 = epoch_batches(7, &cfg, 0).expect("batches");
        let s1 = epoch_batches(7, &cfg, 1).expect("batches");
        assert_ne!(s0, s1);
        assert_eq!(s0, epoch_batches(7, &cfg, 0).expect("batches"));
        let mut all: Vec<usize> = s0.concat();
        all.sort();
        assert_eq!(all, (0..7).collect::<Vec<_>>());
        cfg.mini_batches = 8;
        assert!(epoch_batches(7, &cfg, 0).is_err());
    }
}
