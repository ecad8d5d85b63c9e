//! `rlcr sft`: supervised warm start on assistant targets.
use std::path::PathBuf;

use anyhow::Result;
use serde_json::json;

use super::common::{Global, UsageError};
use super::flags::{ChatArgs, LoraArgs, ModelFolder, OptimArgs};
use crate::train::sft::SftFilter;
use crate::train::stage::SftPlan;
use crate::train::trainer::Objective;

pub const ABOUT: &str =
    "Supervised warm start (cross-entropy on response tokens), as RLCR's SFT+RLCR";
pub const LONG_ABOUT: &str = "\
Fine-tune a model with cross-entropy on the response tokens of a table whose `messages` end with the
assistant target (the context is the chat template over the earlier turns with the generation
prompt), or of a trajectory table (context_ids/response_ids; --only-correct keeps answers with
acc_reward = 1 and, with --min-conf-reward, confidence rows scoring at least that). Same optimizer,
checkpoint and metrics code as `update`: NEW_DIR gets the weights, rlcr-train/,
train_metrics.jsonl and TensorBoard events (runs/sft/; --tensorboard DIR streams them live).

Costs: one forward and backward pass per row per epoch.

Reads: a table and a model folder. Writes: NEW_DIR (Hugging Face layout).
Example:
  rlcr sft --model fixtures/tiny-qwen2 --input sft.parquet -o ckpt/sft --epochs 2";

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelFolder,
    #[command(flatten)]
    pub chat: ChatArgs,
    /// Table with assistant targets (messages) or a trajectory table.
    #[arg(long)]
    pub input: PathBuf,
    /// Output model folder.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-5)]
    pub lr: f64,
    /// Rows per optimizer step (the rest of the table forms smaller last batches).
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Trajectory tables: keep only correct answer rows (acc_reward = 1).
    #[arg(long)]
    pub only_correct: bool,
    /// With --only-correct: also keep confidence rows whose conf_reward is at least this.
    #[arg(long)]
    pub min_conf_reward: Option<f64>,
    #[command(flatten)]
    pub optim: OptimArgs,
    #[command(flatten)]
    pub lora: LoraArgs,
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let plan = plan(g, &a)?;
    crate::train::stage::sft(&plan, &a.lora.loader(a.model.adapter(), g.seed))?;
    Ok(())
}

/// The validated call: every flag checked before anything is read (usage errors, exit code 2).
fn plan(g: &Global, a: &Args) -> Result<SftPlan> {
    if a.batch_size == 0 {
        return Err(UsageError("--batch-size must be at least 1".into()).into());
    }
    a.lora.spec(&a.model.model)?;
    let train = a
        .optim
        .train_config(Objective::Sft, a.lr, 1, 1.0, &[], g.seed)?;
    let device = g.device.open()?;
    let chat = a.chat.options()?;
    let config = json!({
        "model": a.model.model,
        "adapter": a.model.adapter,
        "input": a.input,
        "lr": a.lr,
        "batch_size": a.batch_size,
        "only_correct": a.only_correct,
        "min_conf_reward": a.min_conf_reward,
        "adamw": a.optim.adamw(),
        "resume": a.optim.resume,
        "tensorboard": a.optim.tensorboard,
        "device": g.device,
        "seed": g.seed,
        "argv": g.argv,
    });
    Ok(SftPlan {
        model: a.model.model.clone(),
        input: a.input.clone(),
        out: a.out.clone(),
        train,
        agg_len: a.optim.agg_len,
        batch_size: a.batch_size,
        filter: SftFilter {
            only_correct: a.only_correct,
            min_conf_reward: a.min_conf_reward,
        },
        chat,
        adamw: a.optim.adamw(),
        resume: a.optim.resume,
        tensorboard: a.optim.tensorboard.clone(),
        device,
        config,
    })
}
