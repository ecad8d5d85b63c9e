//! `rlcr update`: one policy-gradient update from a training table; writes a new checkpoint.
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use burn::module::Module;
use serde_json::json;

use super::common::Global;
use super::flags::{model_lora, CriticArgs, LoraArgs, ModelFolder};
use crate::model::Model;
use crate::train::data::{check_positions, check_vocab, read_update_rows, TrainRow};
use crate::train::loss::{ClipConfig, KlEstimator};
use crate::train::policy::host_logprobs;
use crate::train::session::{self, Session};
use crate::train::trainer::{Objective, ValueTokens};

pub const ABOUT: &str =
    "Train the policy on a training table (PPO/GRPO clipped loss); write a new HF checkpoint";
pub const LONG_ABOUT: &str = "\
Recompute the log-probs of the response tokens, take the PPO/GRPO clipped token loss weighted by
token_advantages and masked by loss_mask (answer and confidence rows in one batch), and step AdamW.
Writes a new Hugging Face folder (same dtype as the input) with the optimizer state beside it
(NEW_DIR/rlcr-train/) and one metrics line per optimizer step (NEW_DIR/train_metrics.jsonl), the
same steps as TensorBoard events (NEW_DIR/runs/update/; --tensorboard DIR streams them live).

The loss (verl's): ratio r = exp(logp − response_logprobs); per token
  A ≥ 0: −A·min(r, 1+clip_high);   A < 0: |A|·min(max(r, 1−clip_low), clip_dual)
aggregated over the whole update batch (--loss-agg; gradient accumulation over --micro-batch rows
does not change it), plus --kl-coef × KL(policy‖--ref-model) (k3 by default), minus
--entropy-coef × the mean token entropy, minus --conf-entropy-coef × the mean entropy of the
confidence rows' tokens alone (an exploration bonus for the confidence turn that leaves the answer
rows' tokens out) and minus --conf-value-entropy-coef × the mean entropy, over the ten digits, of
the position where each confidence row picks its value (the `7` of `0.7`). Gradients are clipped by their global norm (--grad-clip).
Each epoch splits the table into --mini-batches update batches, one optimizer step each.

Costs: one forward and backward pass per row per epoch, activations of one micro-batch at a time.
rlcr's samplers record response_logprobs at temperature 1, which is what update compares against by
default; for tables from samplers that record tempered log-probs (verl, TRL), pass --temperature.

Reads: a training table (`rlcr advantage`) and a model folder. Writes: NEW_DIR.
Example:
  rlcr update --model ckpt/iter-0 --input train.parquet -o ckpt/iter-1 --lr 1e-5 --resume auto";

// `values` (a file of its own) imports the group from here.
use super::flags::OptimArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelFolder,
    /// Training table.
    #[arg(long)]
    pub input: PathBuf,
    /// Output model folder.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-6)]
    pub lr: f64,
    /// ε_low: the ratio is clipped below at 1 − clip_low.
    #[arg(long, default_value_t = 0.2)]
    pub clip_low: f64,
    /// ε_high: the ratio is clipped above at 1 + clip_high (DAPO: 0.28).
    #[arg(long, default_value_t = 0.2)]
    pub clip_high: f64,
    /// Dual-clip constant c for negative advantages (verl; `inf` turns it off).
    #[arg(long, default_value_t = 3.0)]
    pub clip_dual: f64,
    /// β of the KL loss against --ref-model (0: off, no reference model loaded).
    #[arg(long, default_value_t = 0.0)]
    pub kl_coef: f64,
    /// KL estimator of the KL loss (verl names kl, mse, low_var_kl accepted, as in `advantage`).
    #[arg(long, value_enum, default_value_t = KlEstimator::K3)]
    pub kl_estimator: KlEstimator,
    /// Reference model folder for the KL loss (else the table's ref_logprobs column).
    #[arg(long)]
    pub ref_model: Option<PathBuf>,
    /// α of the entropy bonus (subtracts α × mean token entropy).
    #[arg(long, default_value_t = 0.0)]
    pub entropy_coef: f64,
    /// α_c of an entropy bonus on the confidence rows only: subtracts α_c × the mean entropy of
    /// the confidence rows' learnable tokens (answer rows' tokens are not in it). Keeps the
    /// confidence turn exploring without flattening the answers; ≥ 0, needs confidence rows.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub conf_entropy_coef: f64,
    /// α_v of an entropy bonus on the confidence value alone: at the position where each
    /// confidence row picks its value's first decimal (the `7` of `0.7`), subtracts α_v × the
    /// mean entropy of the policy's distribution over the ten digits (renormalised over them, so
    /// no probability moves onto tokens that break the format). ≥ 0; needs confidence rows and a
    /// tokenizer with one token per digit and for `.`.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub conf_value_entropy_coef: f64,
    /// Update batches (optimizer steps) per epoch.
    #[arg(long, default_value_t = 1)]
    pub mini_batches: usize,
    /// Divide the logits by this before the log-softmax. Keep 1 for rlcr's own rollouts (their
    /// response_logprobs are at temperature 1); set the sampling temperature for tables whose
    /// log-probs were recorded at it (verl, TRL).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Recompute the behaviour log-probs with the input model before training, instead of using
    /// the table's response_logprobs (verl's default; the ratio starts at exactly 1).
    #[arg(long)]
    pub recompute_old_logprobs: bool,
    #[command(flatten)]
    pub optim: OptimArgs,
    #[command(flatten)]
    pub lora: LoraArgs,
    #[command(flatten)]
    pub critic: CriticArgs,
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let device = g.device.open()?;
    let clip = ClipConfig {
        clip_low: a.clip_low,
        clip_high: a.clip_high,
        clip_dual: a.clip_dual,
    };
    let mut objective = Objective::Policy {
        clip,
        kl_coef: a.kl_coef,
        kl_kind: a.kl_estimator,
        entropy_coef: a.entropy_coef,
        conf_entropy_coef: a.conf_entropy_coef,
        conf_value_entropy_coef: a.conf_value_entropy_coef,
        // Read from the tokenizer once the model is loaded.
        value_tokens: None,
    };
    // Check every flag before reading anything (usage errors, exit code 2).
    a.lora.spec(&a.model.model)?;
    a.optim
        .train_config(objective, a.lr, a.mini_batches, a.temperature, &[], g.seed)?;
    let use_kl = a.kl_coef > 0.0;
    if !use_kl && a.ref_model.is_some() {
        crate::info!("--kl-coef is 0: the reference model is not loaded");
    }
    let want_ref_column = use_kl && a.ref_model.is_none();
    let mut rows = read_update_rows(&a.input, want_ref_column)?;
    if rows.is_empty() {
        bail!(
            "{}: the table has no rows to train on; nothing was written",
            a.input.display()
        );
    }
    for (flag, coef) in [
        ("--conf-entropy-coef", a.conf_entropy_coef),
        ("--conf-value-entropy-coef", a.conf_value_entropy_coef),
    ] {
        if coef > 0.0 && !rows.iter().any(|r| r.is_confidence) {
            bail!(
                "{}: {flag} {coef} needs confidence rows (sample_type \"confidence\"), and the \
                 table has none; nothing was written",
                a.input.display(),
            );
        }
    }
    crate::info!("{}: {} rows", a.input.display(), rows.len());
    let model = a
        .lora
        .load_model(&a.model.model, &device.clone().autodiff(), g.seed)
        .with_context(|| format!("loading the policy {}", a.model.model.display()))?;
    let table = a.input.display().to_string();
    check_vocab(&rows, model.transformer.dims.vocab, &table)?;
    check_positions(&rows, model.config.max_position_embeddings, &table)?;
    if a.conf_value_entropy_coef > 0.0 {
        let vt = value_tokens(&model.tokenizer).with_context(|| {
            format!(
                "--conf-value-entropy-coef: the tokenizer of {}",
                a.model.model.display()
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
        if let Objective::Policy { value_tokens, .. } = &mut objective {
            *value_tokens = Some(vt);
        }
    }
    if use_kl {
        if let Some(dir) = &a.ref_model {
            let reference = Model::load(dir, &device)
                .with_context(|| format!("loading the reference model {}", dir.display()))?;
            let lps = logprobs_of(
                &reference.transformer,
                &rows,
                a.optim.micro_batch,
                a.temperature,
                "reference log-probs",
            )?;
            for (r, lp) in rows.iter_mut().zip(lps) {
                r.ref_logp = Some(lp);
            }
        }
    }
    if a.recompute_old_logprobs {
        // The same weights without the autodiff graph.
        let inner = model.transformer.valid();
        let lps = logprobs_of(
            &inner,
            &rows,
            a.optim.micro_batch,
            a.temperature,
            "behaviour log-probs",
        )?;
        for (r, lp) in rows.iter_mut().zip(lps) {
            r.old_logp = lp;
        }
    }
    let train = a.optim.train_config(
        objective,
        a.lr,
        a.mini_batches,
        a.temperature,
        &rows,
        g.seed,
    )?;
    let zero_advantages = zero_advantage_warning(&rows, &table);
    let config = json!({
        "model": a.model.model,
        "input": a.input,
        "lr": a.lr,
        "ref_model": a.ref_model,
        "recompute_old_logprobs": a.recompute_old_logprobs,
        "adamw": a.optim.adamw(),
        "lora": model_lora(&model),
        "train": train,
        "resume": a.optim.resume,
        "tensorboard": a.optim.tensorboard,
        "device": g.device,
        "seed": g.seed,
        "argv": g.argv,
    });
    let s = Session {
        stage: "update".into(),
        out: a.out.clone(),
        resume: a.optim.resume,
        adamw: a.optim.adamw(),
        train,
        config,
        inputs: vec![a.model.model.display().to_string(), table],
        tensorboard: a.optim.tensorboard.clone(),
    };
    session::run(model, &rows, &s)?;
    a.critic
        .run_after_update(g, &a.input, &a.optim, a.mini_batches)?;
    // Once everything is written: a refused table or output gets its error alone.
    if let Some(w) = zero_advantages {
        eprintln!("rlcr: warning: {w}");
    }
    Ok(())
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
