//! The critic of PPO-GAE: the `values` stage (fill a table's `values` column with a critic's
//! predictions) and the critic's update (verl's clipped value loss), both clap-free
//! ([`ValuesPlan`] → [`run_values`], [`CriticPlan`] → [`run_critic`]).
//!
//! Value loss (verl `compute_value_loss`, `docs/math.md` §3.4), per response token `t` of row `i`:
//! ```text
//! v_clip = clamp(v_pred, v_old − cv, v_old + cv)          cv = --cliprange-value (0.5)
//! L[i,t] = max((v_pred − R)², (v_clip − R)²)
//! loss   = vf_coef · 0.5 · agg(L, mask)                    agg = --loss-agg (token-mean)
//! vf_clipfrac = masked mean of [(v_clip − R)² > (v_pred − R)²]
//! ```
//! with `R` = the table's `returns` (advantage `--estimator gae`), `v_old` = its `values` (the
//! critic that produced them, before this update) and `mask` = its `loss_mask` (observation
//! tokens and tokens outside the span never train the critic). The aggregation weights are the
//! policy's ([`loss::agg_weights`]) over each whole update batch, so micro-batches add up to the
//! full-batch gradient. The critic has its own AdamW (verl: separate optimizer, critic lr 1e-5).
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Tensor, TensorData};
use serde::Serialize;

use super::loss::{self, LossAgg};
use super::optim::{clip_coef, global_grad_norm, AdamW, AdamWConfig};
use crate::logprobs::token_ids;
use crate::model::ops;
use crate::model::value::{Critic, ValueModel};
use crate::model::ResponseBatch;
use crate::table::{self, cols, Meta, Reader};

/// One row of the critic's training data.
#[derive(Debug, Clone, PartialEq)]
pub struct CriticRow {
    pub context: Vec<u32>,
    pub response: Vec<u32>,
    pub returns: Vec<f32>,
    pub old_values: Vec<f32>,
    pub mask: Vec<bool>,
}

/// Reference value loss over plain slices (see the module docs): `(0.5·agg(L), clipfrac)` for
/// one batch of rows (`vf_coef` not applied).
pub fn value_loss(
    v_pred: &[Vec<f64>],
    v_old: &[Vec<f64>],
    returns: &[Vec<f64>],
    mask: &[Vec<bool>],
    cliprange_value: f64,
    agg: LossAgg,
    agg_len: usize,
) -> (f64, f64) {
    let mut per_token = Vec::with_capacity(v_pred.len());
    let (mut clipped, mut n) = (0usize, 0usize);
    for i in 0..v_pred.len() {
        let mut row = Vec::with_capacity(v_pred[i].len());
        for t in 0..v_pred[i].len() {
            let (p, o, r) = (v_pred[i][t], v_old[i][t], returns[i][t]);
            let c = p.clamp(o - cliprange_value, o + cliprange_value);
            let (a, b) = ((p - r).powi(2), (c - r).powi(2));
            row.push(a.max(b));
            if mask[i][t] {
                n += 1;
                clipped += usize::from(b > a);
            }
        }
        per_token.push(row);
    }
    let l = 0.5 * loss::agg_loss(&per_token, mask, agg, agg_len);
    (
        l,
        if n == 0 {
            0.0
        } else {
            clipped as f64 / n as f64
        },
    )
}

/// Settings of the critic's update.
#[derive(Debug, Clone, Serialize)]
pub struct CriticConfig {
    pub vf_coef: f64,
    pub cliprange_value: f64,
    pub loss_agg: LossAgg,
    pub agg_len: usize,
    pub lr: f64,
    pub grad_clip: f64,
    pub micro_batch: usize,
    pub mini_batches: usize,
    pub epochs: usize,
    pub adam: AdamWConfig,
    /// Precision of the matrix products (`update --precision`, as the policy's).
    pub precision: crate::model::sgemm::Precision,
}

impl CriticConfig {
    pub fn validate(&self, n_rows: usize) -> Result<()> {
        ensure!(
            self.vf_coef.is_finite() && self.vf_coef > 0.0,
            "--vf-coef must be > 0, got {}",
            self.vf_coef
        );
        ensure!(
            self.cliprange_value.is_finite() && self.cliprange_value > 0.0,
            "--cliprange-value must be > 0, got {}",
            self.cliprange_value
        );
        ensure!(
            self.lr.is_finite() && self.lr >= 0.0,
            "--critic-lr must be >= 0"
        );
        ensure!(
            self.micro_batch > 0 && self.mini_batches > 0 && self.epochs > 0,
            "micro-batch, mini-batches and epochs must be at least 1"
        );
        ensure!(
            self.mini_batches <= n_rows,
            "--mini-batches {} is more than the {n_rows} rows of the table",
            self.mini_batches
        );
        self.adam.validate()
    }
}

/// Metrics of one critic optimizer step.
#[derive(Debug, Clone, Serialize)]
pub struct CriticStep {
    pub step: usize,
    pub epoch: usize,
    /// `0.5·agg(L)` before the step (vf_coef not applied).
    pub vf_loss: f64,
    pub vf_clipfrac: f64,
    pub grad_norm: f64,
    /// Masked mean of the predicted values.
    pub vpred_mean: f64,
}

/// Gradients of `vf_coef · 0.5 · agg(L)` over one update batch (micro-batch by micro-batch), the
/// loss and the clip fraction.
pub fn value_gradients(
    model: &ValueModel,
    rows: &[&CriticRow],
    cfg: &CriticConfig,
) -> Result<(GradientsParams, f64, f64, f64)> {
    crate::model::sgemm::check_device(cfg.precision, &model.body.device())?;
    let _precision = crate::model::sgemm::autocast(cfg.precision);
    let masks: Vec<Vec<bool>> = rows.iter().map(|r| r.mask.clone()).collect();
    let weights = loss::agg_weights(&masks, cfg.loss_agg, cfg.agg_len);
    let live: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].mask.iter().any(|&m| m))
        .collect();
    let device = model.body.device();
    let mut acc = GradientsAccumulator::<ValueModel>::new();
    let (mut loss_sum, mut clipped, mut tokens, mut vsum) = (0f64, 0f64, 0f64, 0f64);
    for chunk in live.chunks(cfg.micro_batch) {
        let pairs: Vec<(&[u32], &[u32])> = chunk
            .iter()
            .map(|&i| (rows[i].context.as_slice(), rows[i].response.as_slice()))
            .collect();
        let batch = ResponseBatch::new(&pairs)?;
        let (b, r) = (chunk.len(), batch.max_resp);
        // values() is left-aligned; the other columns are built left-aligned too.
        let left = |f: &dyn Fn(usize) -> Vec<f32>| -> Tensor<2> {
            let mut v = vec![0f32; b * r];
            for (k, &i) in chunk.iter().enumerate() {
                let x = f(i);
                v[k * r..k * r + x.len()].copy_from_slice(&x);
            }
            crate::model::transfer::upload(TensorData::new(v, [b, r]), &device)
        };
        let v_pred = model.values(&batch)?;
        let v_old = left(&|i| rows[i].old_values.clone());
        let ret = left(&|i| rows[i].returns.clone());
        let mask = left(&|i| {
            rows[i]
                .mask
                .iter()
                .map(|&m| f32::from(u8::from(m)))
                .collect()
        });
        let weight = left(&|i| weights[i].iter().map(|&w| w as f32).collect());
        let cv = cfg.cliprange_value as f32;
        let v_clip = v_pred
            .clone()
            .max_pair(v_old.clone().sub_scalar(cv))
            .min_pair(v_old.add_scalar(cv));
        let l1 = (v_pred.clone() - ret.clone()).powi_scalar(2);
        let l2 = (v_clip - ret).powi_scalar(2);
        let clip_on = l2.clone().greater(l1.clone()).float() * mask.clone();
        let l = l1.max_pair(l2);
        let loss_t = ops::sum(l * weight).mul_scalar(0.5 * cfg.vf_coef);
        loss_sum += scalar(loss_t.clone().detach())? / cfg.vf_coef;
        clipped += scalar(ops::sum(clip_on))?;
        tokens += scalar(ops::sum(mask.clone()))?;
        vsum += scalar(ops::sum(v_pred.detach() * mask))?;
        let grads = GradientsParams::from_grads(loss_t.backward(), model);
        acc.accumulate(model, grads);
    }
    let clipfrac = if tokens > 0.0 { clipped / tokens } else { 0.0 };
    let vmean = if tokens > 0.0 { vsum / tokens } else { 0.0 };
    Ok((acc.grads(), loss_sum, clipfrac, vmean))
}

fn scalar(t: Tensor<1>) -> Result<f64> {
    let v = crate::model::transfer::read(t)?
        .convert::<f64>()
        .try_into_vec::<f64>()
        .map_err(|e| anyhow::anyhow!("reading a loss value: {e:?}"))?;
    v.first().copied().context("empty loss tensor")
}

/// `epochs × mini_batches` AdamW steps of the critic over `rows` (rows split in order into
/// mini-batches; no shuffle, so the result is a function of the table alone).
pub fn train_critic(
    mut model: ValueModel,
    rows: &[CriticRow],
    cfg: &CriticConfig,
    on_step: &mut dyn FnMut(&CriticStep),
) -> Result<(ValueModel, Vec<CriticStep>)> {
    cfg.validate(rows.len())?;
    let mut opt = AdamW::new(cfg.adam);
    let mut steps = Vec::new();
    let k = cfg.mini_batches;
    let n = rows.len();
    for epoch in 0..cfg.epochs {
        let mut start = 0;
        for j in 0..k {
            let len = n / k + usize::from(j < n % k);
            let part: Vec<&CriticRow> = rows[start..start + len].iter().collect();
            start += len;
            let (grads, vf_loss, vf_clipfrac, vpred_mean) = value_gradients(&model, &part, cfg)?;
            let norm = global_grad_norm(&model, &grads);
            if norm.is_finite() {
                let c = clip_coef(norm, cfg.grad_clip);
                model = opt.step(model, grads, cfg.lr, c);
            }
            let s = CriticStep {
                step: steps.len() + 1,
                epoch,
                vf_loss,
                vf_clipfrac,
                grad_norm: norm,
                vpred_mean,
            };
            on_step(&s);
            steps.push(s);
        }
    }
    Ok((model, steps))
}

/// Row `i` of a list-of-floats column: `len` values, each finite.
fn floats(
    v: &cols::ListView<'_, arrow::array::Float32Array>,
    i: usize,
    at: &dyn Fn(&str) -> String,
    col: &str,
    len: usize,
) -> Result<Vec<f32>> {
    let x = &v.values.values()[v.present(i, || at(col))?];
    ensure!(
        x.len() == len,
        "{}: {} values for a response of {len} tokens",
        at(col),
        x.len()
    );
    if let Some(k) = x.iter().position(|f| !f.is_finite()) {
        bail!("{}, item {k}: not a finite number", at(col));
    }
    Ok(x.to_vec())
}

/// Read the critic's training rows (`context_ids`, `response_ids`, `returns`, `values`,
/// `loss_mask`) of a train table.
pub fn read_critic_rows(path: &Path, vocab: usize, max_pos: usize) -> Result<Vec<CriticRow>> {
    let name = path.display().to_string();
    let want = [
        "context_ids",
        "response_ids",
        "returns",
        "values",
        "loss_mask",
    ];
    let reader = Reader::open_columns(path, &want)?;
    for c in want {
        if !reader.has_column(c) {
            bail!(
                "{name}: column `{c}` is missing (the critic trains on `rlcr values` then \
                 `rlcr advantage --estimator gae` output: values, returns, loss_mask)"
            );
        }
    }
    let mut out = Vec::new();
    let mut first = 0usize;
    for b in reader {
        let b = b?;
        let ctx = cols::list_i32(&b, &name, "context_ids")?;
        let resp = cols::list_i32(&b, &name, "response_ids")?;
        let ret = cols::list_f32(&b, &name, "returns")?;
        let val = cols::list_f32(&b, &name, "values")?;
        let mask = cols::list_bool(&b, &name, "loss_mask")?;
        for i in 0..b.num_rows() {
            let row = first + i;
            let at = |c: &str| format!("{name}: row {row}, column `{c}`");
            let context = token_ids(&ctx, i, &at, "context_ids", vocab)?;
            let response = token_ids(&resp, i, &at, "response_ids", vocab)?;
            let n = response.len();
            if context.is_empty() && n > 0 {
                bail!("{}: empty", at("context_ids"));
            }
            if context.len() + n > max_pos {
                bail!(
                    "{}: context + response is {} tokens; the model accepts {max_pos}",
                    at("context_ids"),
                    context.len() + n
                );
            }
            let returns = floats(&ret, i, &at, "returns", n)?;
            let old_values = floats(&val, i, &at, "values", n)?;
            let r = mask.present(i, || at("loss_mask"))?;
            ensure!(
                r.len() == n,
                "{}: {} flags for a response of {n} tokens",
                at("loss_mask"),
                r.len()
            );
            let m: Vec<bool> = r.map(|k| mask.values.value(k)).collect();
            out.push(CriticRow {
                context,
                response,
                returns,
                old_values,
                mask: m,
            });
        }
        first += b.num_rows();
    }
    ensure!(!out.is_empty(), "{name}: the table has no rows");
    Ok(out)
}

/// The critic's update as a stage.
#[derive(Debug, Clone)]
pub struct CriticPlan {
    /// Critic folder (or a policy folder: zero value head).
    pub critic: PathBuf,
    /// Train table (values, returns, loss_mask).
    pub input: PathBuf,
    /// Output critic folder.
    pub out: PathBuf,
    pub cfg: CriticConfig,
    pub device: crate::model::DeviceSpec,
}

/// Train the critic on the table and save it; returns the summary line. The folder gets
/// `critic_metrics.jsonl` (one line per step).
pub fn run_critic(plan: &CriticPlan) -> Result<String> {
    let device: Device = plan.device.open()?.autodiff();
    let critic = Critic::load(&plan.critic, &device)?;
    let rows = read_critic_rows(
        &plan.input,
        critic.config.vocab_size,
        critic.config.max_position_embeddings,
    )?;
    let mut cfg = plan.cfg.clone();
    if cfg.agg_len == 0 {
        // seq-mean-token-sum-norm's L_max: the longest response of the table (as the policy).
        cfg.agg_len = rows
            .iter()
            .map(|r| r.response.len())
            .max()
            .unwrap_or(1)
            .max(1);
    }
    let start = std::time::Instant::now();
    let mut progress = crate::progress::Progress::new(
        "update (critic)",
        (plan.cfg.epochs * plan.cfg.mini_batches) as u64,
        "steps",
    );
    let model = critic.model.clone();
    let (model, steps) = train_critic(model, &rows, &cfg, &mut |s| {
        progress.inc(1);
        progress.message(&format!("vf_loss {:.4}", s.vf_loss));
    })?;
    progress.finish();
    critic.save(&model, &plan.out)?;
    let mut lines = String::new();
    for s in &steps {
        lines += &serde_json::to_string(s)?;
        lines.push('\n');
    }
    let path = plan.out.join("critic_metrics.jsonl");
    std::fs::write(&path, lines).with_context(|| format!("writing {}", path.display()))?;
    let (first, last) = (
        steps.first().map_or(0.0, |s| s.vf_loss),
        steps.last().map_or(0.0, |s| s.vf_loss),
    );
    Ok(format!(
        "update (critic): {} steps in {:.1} s, vf_loss {first:.5} -> {last:.5}, head {:?} -> {}",
        steps.len(),
        start.elapsed().as_secs_f64(),
        critic.head_init,
        plan.out.display()
    ))
}

/// The `values` stage.
#[derive(Debug, Clone)]
pub struct ValuesPlan {
    pub critic: PathBuf,
    pub input: PathBuf,
    pub out: PathBuf,
    pub column: String,
    pub batch_size: usize,
    pub device: crate::model::DeviceSpec,
    pub argv: Vec<String>,
}

/// Add the critic's values of every response token as column `plan.column` (default `values`);
/// every other column passes through. Returns the summary line.
/// Pass 1 of `values`, before the critic is loaded and anything is written: the column types
/// ([`table::check_schema`]) and the one [`table::Validator`] over the columns its rules read
/// (identities, answer↔confidence links, list lengths against `response_ids`, spans in range),
/// as every stage that reads a trajectory table runs it.
fn validate_values_input(input: &Path) -> Result<()> {
    let name = input.display().to_string();
    let mut columns = vec!["context_ids"];
    columns.extend(table::validate::RULE_COLUMNS);
    let reader = Reader::open_columns(input, &columns)?;
    let spec = reader.table_spec();
    table::check_schema(&name, &reader.file_schema(), spec, &[])?;
    let mut validator = table::Validator::new(&name, spec);
    validator.reserve(reader.num_rows());
    for b in reader {
        validator.check_batch(&b?)?;
    }
    validator.finish()?;
    Ok(())
}

pub fn run_values(plan: &ValuesPlan) -> Result<String> {
    ensure!(plan.batch_size > 0, "--batch-size must be at least 1");
    ensure!(
        !plan.column.is_empty() && plan.column != "context_ids" && plan.column != "response_ids",
        "--column `{}`: choose a new column name",
        plan.column
    );
    crate::fs::check_distinct(&[&plan.input], &plan.out)?;
    validate_values_input(&plan.input)?;
    let device = plan.device.open()?;
    let critic = Critic::load(&plan.critic, &device)?;
    let (vocab, max_pos) = (
        critic.config.vocab_size,
        critic.config.max_position_embeddings,
    );
    let name = plan.input.display().to_string();
    let reader = Reader::open(&plan.input)?;
    let spec = reader.table_spec();
    let meta = Meta::new(
        spec,
        "values",
        serde_json::json!({
            "critic": plan.critic,
            "head": critic.head_init,
            "column": plan.column,
            "batch_size": plan.batch_size,
            "device": plan.device,
            "argv": plan.argv,
        }),
        &[&plan.input, &plan.critic],
    );
    let total = reader.num_rows();
    ensure!(
        total > 0,
        "{name}: the table has no rows; nothing was written"
    );
    let mut progress = crate::progress::Progress::new("values", total as u64, "rows");
    let start = std::time::Instant::now();
    let rows = crate::logprobs::map_token_rows(
        reader,
        &name,
        &plan.out,
        &meta,
        None,
        (vocab, max_pos),
        |pairs| {
            let values = critic.predict(pairs, plan.batch_size)?;
            progress.inc(pairs.len() as u64);
            Ok(vec![(plan.column.as_str(), cols::build_list_f32(&values))])
        },
    )?;
    progress.finish();
    Ok(format!(
        "values: {rows} rows in {:.1} s -> {} (column `{}`, head {:?})",
        start.elapsed().as_secs_f64(),
        plan.out.display(),
        plan.column,
        critic.head_init
    ))
}
