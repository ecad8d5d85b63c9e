//! The engines of `rlcr update` and `rlcr sft`. [`update`]: read and check the training table,
//! load the policy (and the reference model), fill the log-probs the plan asks for, train through
//! [`session`] and write the new folder. [`sft`]: load the model, read its targets (tokenized with
//! the model's chat template), train the same way. The command line turns its flags into an
//! [`UpdatePlan`] / [`SftPlan`] and makes one call.
//!
//! Order of work (each step's errors come before any later step's cost): the table (schema, rows,
//! the flags that need confidence rows), then the policy (vocabulary and positions of the rows,
//! the confidence value tokens), then the reference and behaviour log-probs, then training.
//!
//! Reference log-probs serve two purposes: the KL loss (`--kl-coef > 0`, where they are required)
//! and the KL-to-reference diagnostic of every call ([`super::diagnostics::ref_kl`]), which is
//! reported whenever they are at hand: `--ref-model` is then loaded even with `--kl-coef 0` (one
//! forward pass of the reference over the table), and a table's `ref_logprobs` column is read
//! when it has one.
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use burn::module::Module;
use burn::tensor::Device;

use crate::model::Model;

use super::critic::CriticPlan;
use super::data::{check_positions, check_vocab, read_update_rows_with, RefColumn, TrainRow};
use super::diagnostics::Guards;
use super::load::TrainLora;
use super::optim::AdamWConfig;
use super::policy::host_logprobs;
use super::session::{self, ResumeMode, Session};
use super::sft::{read_sft_rows, SftFilter};
use super::trainer::{Objective, StepMetrics, TrainConfig, ValueTokens};

/// `config` (an object) with the model's LoRA settings as `lora` and `train` as `train`.
fn completed_config(
    mut config: serde_json::Value,
    model: &Model,
    train: &TrainConfig,
) -> Result<serde_json::Value> {
    if let Some(o) = config.as_object_mut() {
        o.insert("lora".into(), model_lora(model));
        o.insert(
            "train".into(),
            serde_json::to_value(train).context("serialising the configuration")?,
        );
    }
    Ok(config)
}

/// What a validated `update` and `sft` call share: the model to train, the table, the output,
/// the loop and optimizer settings, the device, the seed and the configuration to record.
pub struct TrainJob {
    /// Model folder (a model or a LoRA adapter folder).
    pub model: PathBuf,
    /// The adapter and LoRA settings the model is loaded with.
    pub lora: TrainLora,
    /// Training table (`update`), or table of assistant targets or trajectory table (`sft`).
    pub input: PathBuf,
    /// Output folder.
    pub out: PathBuf,
    /// The loop's configuration. Its `agg_len` is replaced by [`TrainJob::agg_len`] or, when
    /// that is `None`, by the table's longest response; each stage says what else it fills in.
    pub train: TrainConfig,
    /// `--agg-len` as given.
    pub agg_len: Option<usize>,
    /// AdamW hyper-parameters.
    pub adamw: AdamWConfig,
    /// Optimizer resume mode.
    pub resume: ResumeMode,
    /// Live TensorBoard run folder.
    pub tensorboard: Option<PathBuf>,
    /// Device to train on (opened first; the autodiff device is derived from it).
    pub device: crate::model::DeviceSpec,
    /// Seed (LoRA initialisation, shuffle).
    pub seed: u64,
    /// The trainer state's `config` as the caller records it (flags, argv); the engine adds
    /// `lora` and `train` (and `sft` its `source` and `chat`).
    pub config: serde_json::Value,
}

impl TrainJob {
    /// The model to train, loaded on the autodiff device over `device` (`what` names it in
    /// errors).
    fn load(&self, device: &Device, what: &str) -> Result<Model> {
        (self.lora)
            .load(&self.model, &device.clone().autodiff(), self.seed)
            .with_context(|| format!("loading {what}{}", self.model.display()))
    }

    /// The [`Session`] of a `stage` call that trains `model` on `table` with the loop
    /// configuration `train`; the trainer state's `config` completed with the model's LoRA
    /// settings and `train` ([`completed_config`]).
    fn session(
        &self,
        stage: &str,
        model: &Model,
        train: TrainConfig,
        config: serde_json::Value,
        table: String,
    ) -> Result<Session> {
        Ok(Session {
            stage: stage.into(),
            out: self.out.clone(),
            resume: self.resume,
            adamw: self.adamw,
            config: completed_config(config, model, &train)?,
            train,
            inputs: vec![self.model.display().to_string(), table],
            tensorboard: self.tensorboard.clone(),
        })
    }
}

/// A validated `update` call.
pub struct UpdatePlan {
    /// The policy, the training table, the output and the loop. The loop's objective's value
    /// tokens are read from the policy's tokenizer when the confidence value bonus is on.
    pub job: TrainJob,
    /// Reference model folder (KL loss, KL diagnostic).
    pub ref_model: Option<PathBuf>,
    /// Recompute the behaviour log-probs with the policy before training.
    pub recompute_old_logprobs: bool,
    /// Checks before the first optimizer step.
    pub guards: Guards,
    /// A critic trained on the same table once the policy is written.
    pub critic: Option<CriticPlan>,
}

/// What [`update`] did.
pub struct UpdateSummary {
    /// One entry per optimizer step.
    pub steps: Vec<StepMetrics>,
    /// A warning to print once everything is written (every advantage 0), if any.
    pub warning: Option<String>,
}

/// Run one `update` call (then the critic's, when the plan has one).
pub fn update(plan: &UpdatePlan) -> Result<UpdateSummary> {
    let job = &plan.job;
    let device: Device = job.device.open()?;
    let (kl_coef, conf_entropy_coef, conf_value_entropy_coef) = match job.train.objective {
        Objective::Policy {
            kl_coef,
            conf_entropy_coef,
            conf_value_entropy_coef,
            ..
        } => (kl_coef, conf_entropy_coef, conf_value_entropy_coef),
        Objective::Sft => bail!("update trains a policy objective"),
    };
    let use_kl = kl_coef > 0.0;
    let ref_mode = match (use_kl, plan.ref_model.is_some()) {
        (_, true) => RefColumn::Skip,
        (true, false) => RefColumn::Required,
        (false, false) => RefColumn::IfPresent,
    };
    let mut rows = read_update_rows_with(&job.input, ref_mode)?;
    if rows.is_empty() {
        bail!(
            "{}: the table has no rows to train on; nothing was written",
            job.input.display()
        );
    }
    for (flag, coef) in [
        ("--conf-entropy-coef", conf_entropy_coef),
        ("--conf-value-entropy-coef", conf_value_entropy_coef),
    ] {
        if coef > 0.0 && !rows.iter().any(|r| r.is_confidence) {
            bail!(
                "{}: {flag} {coef} needs confidence rows (sample_type \"confidence\"), and the \
                 table has none; nothing was written",
                job.input.display(),
            );
        }
    }
    crate::info!("{}: {} rows", job.input.display(), rows.len());
    let model = job.load(&device, "the policy ")?;
    let table = job.input.display().to_string();
    check_vocab(&rows, model.transformer.dims.vocab, &table)?;
    check_positions(&rows, model.config.max_position_embeddings, &table)?;
    let mut train = job.train.clone();
    if conf_value_entropy_coef > 0.0 {
        let vt = value_tokens(&model.tokenizer).with_context(|| {
            format!(
                "--conf-value-entropy-coef: the tokenizer of {}",
                job.model.display()
            )
        })?;
        let n = rows
            .iter()
            .filter(|r| r.is_confidence && vt.value_mask(&r.response, &r.mask).contains(&true))
            .count();
        if n == 0 {
            bail!(
                "{table}: --conf-value-entropy-coef: no confidence row writes a value as digit `.` \
                 digit (e.g. 0.7) in its learnable tokens; nothing was written"
            );
        }
        crate::info!(
            "{table}: {n} of {} confidence rows carry a value position",
            rows.iter().filter(|r| r.is_confidence).count()
        );
        if let Objective::Policy { value_tokens, .. } = &mut train.objective {
            *value_tokens = Some(vt);
        }
    }
    if let Some(dir) = &plan.ref_model {
        let reference = Model::load(dir, &device)
            .with_context(|| format!("loading the reference model {}", dir.display()))?;
        let lps = logprobs_of(
            &reference.transformer,
            &rows,
            train.micro_batch,
            train.temperature,
            "reference log-probs",
        )?;
        for (r, lp) in rows.iter_mut().zip(lps) {
            r.ref_logp = Some(lp);
        }
    }
    if plan.recompute_old_logprobs {
        // The same weights without the autodiff graph.
        let inner = model.transformer.valid();
        let lps = logprobs_of(
            &inner,
            &rows,
            train.micro_batch,
            train.temperature,
            "behaviour log-probs",
        )?;
        for (r, lp) in rows.iter_mut().zip(lps) {
            r.old_logp = lp;
        }
    }
    train.agg_len = job.agg_len.unwrap_or_else(|| longest(&rows));
    let warning = zero_advantage_warning(&rows, &table);
    let s = job.session("update", &model, train, job.config.clone(), table)?;
    let steps = session::run_guarded(model, &rows, &s, &plan.guards)?;
    if let Some(c) = &plan.critic {
        let line = super::critic::run_critic(c)?;
        crate::info!("{line}");
    }
    Ok(UpdateSummary { steps, warning })
}

/// A validated `sft` call.
pub struct SftPlan {
    /// The model, the targets table, the output and the loop (SFT objective). The loop's
    /// `mini_batches` is replaced by the number of `batch_size` batches of the rows kept.
    pub job: TrainJob,
    /// Rows per optimizer step.
    pub batch_size: usize,
    /// Which trajectory rows are targets.
    pub filter: SftFilter,
    /// Chat-template options of the targets' contexts.
    pub chat: crate::model::ChatOptions,
}

/// Run one `sft` call.
pub fn sft(plan: &SftPlan) -> Result<Vec<StepMetrics>> {
    let job = &plan.job;
    let device: Device = job.device.open()?;
    let mut model = job.load(&device, "")?;
    model.set_chat_options(&plan.chat)?;
    let (source, rows) = read_sft_rows(&job.input, &model, plan.filter)?;
    if rows.is_empty() {
        bail!(
            "{}: no rows to train on (after filtering)",
            job.input.display()
        );
    }
    let table = job.input.display().to_string();
    check_vocab(&rows, model.transformer.dims.vocab, &table)?;
    check_positions(&rows, model.config.max_position_embeddings, &table)?;
    let tokens: usize = rows.iter().map(|r| r.response.len()).sum();
    crate::info!(
        "{table}: {} rows ({source:?}), {tokens} target tokens",
        rows.len()
    );
    let mut train = job.train.clone();
    train.mini_batches = rows.len().div_ceil(plan.batch_size.max(1));
    train.agg_len = job.agg_len.unwrap_or_else(|| longest(&rows));
    train.validate()?;
    let mut config = job.config.clone();
    if let Some(o) = config.as_object_mut() {
        o.insert("source".into(), format!("{source:?}").into());
        o.insert("chat".into(), plan.chat.meta());
    }
    let s = job.session("sft", &model, train, config, table)?;
    session::run(model, &rows, &s)
}

/// The default `--agg-len`: the longest response (at least 1).
fn longest(rows: &[TrainRow]) -> usize {
    rows.iter()
        .map(|r| r.response.len())
        .max()
        .unwrap_or(1)
        .max(1)
}

/// The adapter of a model to train, as recorded in the output's configuration (`null` when
/// every weight trains).
pub fn model_lora(m: &Model) -> serde_json::Value {
    match &m.adapter {
        Some(a) => serde_json::json!({
            "from": a.dir,
            "config": a.spec.to_peft_json(),
        }),
        None => serde_json::Value::Null,
    }
}

/// The warning for a table in which every learnable token's advantage is 0 (every group's rewards
/// equal, a filter that kept nothing informative, a wrong column): the policy-gradient term is
/// then zero and the update moves the model only through the KL and entropy terms. Printed after
/// the update is written, so that a refused input gets its one error message alone. A warning, not
/// an error: such an iteration happens in a healthy loop too (every answer right, or every one
/// wrong).
fn zero_advantage_warning(rows: &[TrainRow], table: &str) -> Option<String> {
    let informative = rows
        .iter()
        .any(|r| r.adv.iter().zip(&r.mask).any(|(adv, &m)| m && *adv != 0.0));
    (!informative).then(|| {
        format!(
            "{table}: every advantage is 0 on the {} learnable tokens of its {} rows (e.g. every \
             group's rewards were equal): the policy-gradient term was zero, and this update \
             changed the model only through --kl-coef and the entropy terms",
            rows.iter().map(TrainRow::n_learnable).sum::<usize>(),
            rows.len()
        )
    })
}

/// The token ids of the ten digits and `.`: each must be one token, and `0.7` must encode as the
/// three of them (the value position rule of [`ValueTokens::value_mask`]).
fn value_tokens(tok: &crate::model::Tokenizer) -> Result<ValueTokens> {
    let one = |text: &str| -> Result<u32> {
        match tok.encode(text, false)?.as_slice() {
            [id] => Ok(*id),
            ids => bail!("{text:?} is {} tokens ({ids:?}), not one", ids.len()),
        }
    };
    let mut digits = [0u32; 10];
    for (d, slot) in digits.iter_mut().enumerate() {
        *slot = one(&d.to_string())?;
    }
    let point = one(".")?;
    let seven = tok.encode("0.7", false)?;
    if seven != [digits[0], point, digits[7]] {
        bail!("\"0.7\" encodes as {seven:?}, not as the tokens of 0, . and 7");
    }
    Ok(ValueTokens { digits, point })
}

/// Per-row log-probs of the rows' responses under `model` (no graph), with a progress bar.
pub fn logprobs_of(
    model: &crate::model::Transformer,
    rows: &[TrainRow],
    batch: usize,
    temperature: f64,
    label: &str,
) -> Result<Vec<Vec<f32>>> {
    let pairs: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|r| (r.context.as_slice(), r.response.as_slice()))
        .collect();
    let mut p = crate::progress::Progress::new(label, rows.len() as u64, "rows");
    let out = host_logprobs(model, &pairs, batch, temperature, Some(&mut p))?;
    p.finish();
    Ok(out)
}
