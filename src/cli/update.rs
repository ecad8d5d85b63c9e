//! `rlcr update`: one policy-gradient update from a training table; writes a new checkpoint.
use std::path::PathBuf;

use anyhow::Result;
use serde_json::json;

use super::common::Global;
use super::flags::{CriticArgs, LoraArgs, ModelFolder, OptimArgs};
use crate::train::diagnostics::Guards;
use crate::train::loss::{ClipConfig, KlEstimator};
use crate::train::stage::UpdatePlan;
use crate::train::trainer::Objective;

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

Diagnostics (in the metrics lines, TensorBoard and the summary line): before the first optimizer
step, the rollout/trainer mismatch of the first update batch (max and mean |response_logprobs −
the trainer's log-prob| over its learnable tokens, `mismatch/logp_max`, `mismatch/logp_mean`, and
of the ratio's deviation |exp(Δ) − 1|, `mismatch/ratio_max`, `mismatch/ratio_mean`; --max-mismatch
refuses a table above a limit); the KL of the behaviour policy to the reference (k3, verl's
low_var_kl, over every learnable token: `ref_kl`) when --ref-model or a ref_logprobs column gives
reference log-probs; each step's mean response length of answer and confidence rows; with
--turn-grad-norms, the first update batch's gradient split by turn (`grad/answer_norm`,
`grad/confidence_norm`, `grad/turn_cosine`): with Adam each step moves a weight by about the
learning rate along the sum of the two, so a confidence turn whose part is a small fraction of the
answers' learns little, and a negative cosine means the turns pull the shared weights apart.

Costs: one forward and backward pass per row per epoch, activations of one micro-batch at a time.
rlcr's samplers record response_logprobs at temperature 1, which is what update compares against by
default; for tables from samplers that record tempered log-probs (verl, TRL), pass --temperature.

Reads: a training table (`rlcr advantage`) and a model folder. Writes: NEW_DIR.
Example:
  rlcr update --model ckpt/iter-0 --input train.parquet -o ckpt/iter-1 --lr 1e-5 --resume auto";

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
    /// Reference model folder for the KL loss (else the table's ref_logprobs column). Loaded
    /// with --kl-coef 0 too: the KL of the policy to it is then reported (one forward pass of
    /// the reference over the table).
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
    /// Refuse the table (exit 1, nothing written) when, before the first optimizer step, the
    /// largest |response_logprobs − the trainer's log-prob| over the first update batch's
    /// learnable tokens is above this: a sampler that does not compute what the trainer computes
    /// (temperature, precision, template, dropout, a stale policy). The gap is measured and
    /// reported either way; rlcr's own rollouts on the CPU in f32 stay below 1e-4.
    #[arg(long, value_name = "NATS")]
    pub max_mismatch: Option<f64>,
    /// Split the first update batch's gradient into its answer rows' and confidence rows' parts
    /// and report their norms and cosine (one more forward and backward pass over the first
    /// batch's confidence rows; the training is unchanged).
    #[arg(long)]
    pub turn_grad_norms: bool,
    #[command(flatten)]
    pub optim: OptimArgs,
    #[command(flatten)]
    pub lora: LoraArgs,
    #[command(flatten)]
    pub critic: CriticArgs,
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let done = crate::train::stage::update(&plan(g, &a)?)?;
    // Once everything is written: a refused table or output gets its error alone.
    if let Some(w) = done.warning {
        eprintln!("rlcr: warning: {w}");
    }
    Ok(())
}

/// The validated call: every flag checked before anything is read (usage errors, exit code 2).
fn plan(g: &Global, a: &Args) -> Result<UpdatePlan> {
    let objective = Objective::Policy {
        clip: ClipConfig {
            clip_low: a.clip_low,
            clip_high: a.clip_high,
            clip_dual: a.clip_dual,
        },
        kl_coef: a.kl_coef,
        kl_kind: a.kl_estimator,
        entropy_coef: a.entropy_coef,
        conf_entropy_coef: a.conf_entropy_coef,
        conf_value_entropy_coef: a.conf_value_entropy_coef,
        // Read from the tokenizer once the model is loaded.
        value_tokens: None,
    };
    let lora = a.lora.resolve(&a.model)?;
    let o = &a.optim;
    let train = o.train_config(objective, a.lr, a.mini_batches, a.temperature, g.seed)?;
    let guards = Guards::new(a.max_mismatch, a.turn_grad_norms)?;
    let mut job = o.job(g, &a.model, lora, &a.input, &a.out, a.lr, train);
    job.config["ref_model"] = json!(a.ref_model);
    job.config["recompute_old_logprobs"] = json!(a.recompute_old_logprobs);
    if let Some(m) = a.max_mismatch {
        job.config["max_mismatch"] = json!(m);
    }
    if a.turn_grad_norms {
        job.config["turn_grad_norms"] = json!(true);
    }
    Ok(UpdatePlan {
        job,
        ref_model: a.ref_model.clone(),
        recompute_old_logprobs: a.recompute_old_logprobs,
        guards,
        critic: a.critic.plan(g, &a.input, o, a.mini_batches),
    })
}
