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
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Tensor, TensorData};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::model::Transformer;

use super::data::TrainRow;
use super::loss::{self, ClipConfig, KlEstimator, LossAgg};
use super::optim::{clip_coef, global_grad_norm, AdamW};
use super::policy::{response_logprobs, right_align, EntropyMode};
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
    },
    /// Negative log-likelihood of the learnable response tokens (`sft`).
    Sft,
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
    /// Mean per-token entropy over learnable tokens.
    pub entropy: f64,
    /// verl's `ppo_kl`: mean of `old_logp − logp` over learnable tokens.
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
    /// Wall time of the step, seconds.
    pub seconds: f64,
    /// True when the step was skipped (non-finite gradient norm or nothing to learn).
    pub skipped: bool,
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
    /// Σ m·(old − logp).
    pub neg_log_ratio: f64,
    /// Clipped-token counts (low, high, dual).
    pub clipped: [f64; 3],
    /// Learnable tokens.
    pub tokens: usize,
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
        }
        Ok(())
    }

    fn needs_ref(&self) -> bool {
        matches!(self.objective, Objective::Policy { kl_coef, .. } if kl_coef > 0.0)
    }

    fn entropy_mode(&self) -> EntropyMode {
        match self.objective {
            Objective::Policy { entropy_coef, .. } if entropy_coef != 0.0 => {
                EntropyMode::Differentiable
            }
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
    let masks: Vec<Vec<bool>> = rows.iter().map(|r| r.mask.clone()).collect();
    let weights = loss::agg_weights(&masks, cfg.loss_agg, cfg.agg_len);
    let tokens: usize = rows.iter().map(|r| r.n_learnable()).sum();
    let mut sums = BatchSums {
        tokens,
        ..Default::default()
    };
    // Rows with nothing learnable contribute nothing: leave them out of the forward passes.
    let mut live: Vec<usize> = (0..rows.len())
        .filter(|&i| !rows[i].response.is_empty() && rows[i].n_learnable() > 0)
        .collect();
    live.sort_by_key(|&i| std::cmp::Reverse(rows[i].total_len()));
    let mut acc = GradientsAccumulator::<Transformer>::new();
    let coefs = match cfg.objective {
        Objective::Policy {
            kl_coef,
            kl_kind,
            entropy_coef,
            ..
        } => LossCoefs {
            kl_coef,
            kl_kind,
            entropy_coef,
            batch_tokens: tokens as f64,
        },
        Objective::Sft => LossCoefs {
            kl_coef: 0.0,
            kl_kind: KlEstimator::K3,
            entropy_coef: 0.0,
            batch_tokens: tokens as f64,
        },
    };
    let device = model.device();
    for chunk in live.chunks(cfg.micro_batch) {
        let pairs: Vec<(&[u32], &[u32])> = chunk
            .iter()
            .map(|&i| (rows[i].context.as_slice(), rows[i].response.as_slice()))
            .collect();
        let out = response_logprobs(model, &pairs, cfg.temperature, cfg.entropy_mode())?;
        let (b, r) = (chunk.len(), out.max_resp);
        let t2 = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [b, r]), &device);
        let col = |f: &dyn Fn(&TrainRow) -> Vec<f32>| -> Tensor<2> {
            let vals: Vec<Vec<f32>> = chunk.iter().map(|&i| f(rows[i])).collect();
            let refs: Vec<&[f32]> = vals.iter().map(|v| v.as_slice()).collect();
            t2(right_align(&refs, r, 0.0))
        };
        let mask = col(&|row| row.mask.iter().map(|&m| f32::from(u8::from(m))).collect());
        let wvals: Vec<Vec<f32>> = chunk
            .iter()
            .map(|&i| weights[i].iter().map(|&w| w as f32).collect())
            .collect();
        let wrefs: Vec<&[f32]> = wvals.iter().map(|v| v.as_slice()).collect();
        let weight = t2(right_align(&wrefs, r, 0.0));
        let loss_t = match cfg.objective {
            Objective::Policy { clip, .. } => {
                let ref_logp = if cfg.needs_ref() {
                    let mut missing = None;
                    let t = col(&|row| match &row.ref_logp {
                        Some(v) => v.clone(),
                        None => {
                            vec![0.0; row.response.len()]
                        }
                    });
                    if let Some(&i) = chunk.iter().find(|&&i| rows[i].ref_logp.is_none()) {
                        missing = Some(i);
                    }
                    if let Some(i) = missing {
                        bail!("row {i} has no reference log-probs (needed by --kl-coef > 0)");
                    }
                    Some(t)
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
                    },
                    &clip,
                    &coefs,
                );
                sums.pg_loss += scalar(m.pg_loss)?;
                sums.kl_loss += scalar(m.kl_loss)?;
                sums.entropy += scalar(m.entropy_sum)?;
                sums.neg_log_ratio += scalar(m.neg_log_ratio_sum)?;
                let [a, bb, c] = m.clipped;
                sums.clipped[0] += scalar(a)?;
                sums.clipped[1] += scalar(bb)?;
                sums.clipped[2] += scalar(c)?;
                m.loss
            }
            Objective::Sft => {
                let nll = (out.logp.neg() * weight).sum();
                if let Some(h) = out.entropy {
                    sums.entropy += scalar((h * mask).sum().detach())?;
                }
                sums.pg_loss += scalar(nll.clone().detach())?;
                nll
            }
        };
        sums.loss += scalar(loss_t.clone().detach())?;
        let grads = GradientsParams::from_grads(loss_t.backward(), model);
        acc.accumulate(model, grads);
    }
    Ok((acc.grads(), sums))
}

fn scalar(t: Tensor<1>) -> Result<f64> {
    let v = t
        .into_data()
        .convert::<f64>()
        .try_into_vec::<f64>()
        .map_err(|e| anyhow::anyhow!("reading a loss value: {e:?}"))?;
    v.first()
        .copied()
        .ok_or_else(|| anyhow::anyhow!("empty loss tensor"))
}

/// Run the whole loop: `epochs × mini_batches` optimizer steps over `rows`. `on_step` sees the
/// metrics of each step as it ends (to stream them to disk and the progress bar).
pub fn train(
    mut model: Transformer,
    opt: &mut AdamW,
    rows: &[TrainRow],
    cfg: &TrainConfig,
    mut on_step: impl FnMut(&StepMetrics) -> Result<()>,
) -> Result<(Transformer, Vec<StepMetrics>)> {
    cfg.validate()?;
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
            let (grads, sums) = batch_gradients(&model, &batch, cfg)?;
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
            let m = StepMetrics {
                step: opt.step,
                epoch,
                mini_batch: j,
                lr,
                loss: sums.loss,
                pg_loss: sums.pg_loss,
                kl_loss: sums.kl_loss,
                entropy: sums.entropy / n,
                approx_kl: sums.neg_log_ratio / n,
                clip_frac_low: sums.clipped[0] / n,
                clip_frac_high: sums.clipped[1] / n,
                clip_frac_dual: sums.clipped[2] / n,
                grad_norm: norm,
                tokens: sums.tokens,
                rows: batch.len(),
                confidence_rows: batch.iter().filter(|r| r.is_confidence).count(),
                seconds: t0.elapsed().as_secs_f64(),
                skipped,
            };
            on_step(&m)?;
            all.push(m);
        }
    }
    Ok((model, all))
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
