//! `rlcr sft`: supervised warm start on assistant targets.
use std::path::PathBuf;

use anyhow::Result;
use serde_json::json;

use super::common::{usage, Global};
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
    crate::train::stage::sft(&plan(g, &a)?)?;
    Ok(())
}

/// The validated call: every flag checked before anything is read (usage errors, exit code 2).
fn plan(g: &Global, a: &Args) -> Result<SftPlan> {
    if a.batch_size == 0 {
        return Err(usage("--batch-size must be at least 1"));
    }
    let lora = a.lora.resolve(&a.model)?;
    let o = &a.optim;
    let train = o.train_config(Objective::Sft, a.lr, 1, 1.0, g.seed)?;
    let chat = a.chat.options()?;
    let mut job = o.job(g, &a.model, lora, &a.input, &a.out, a.lr, train);
    job.config["batch_size"] = json!(a.batch_size);
    job.config["only_correct"] = json!(a.only_correct);
    job.config["min_conf_reward"] = json!(a.min_conf_reward);
    Ok(SftPlan {
        job,
        batch_size: a.batch_size,
        filter: SftFilter {
            only_correct: a.only_correct,
            min_conf_reward: a.min_conf_reward,
        },
        chat,
    })
}
