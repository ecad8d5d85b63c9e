//! `rlcr update`: one policy-gradient update from a training table; writes a new checkpoint.
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str =
    "Train the policy on a training table (PPO/GRPO clipped loss); write a new HF checkpoint";
pub const LONG_ABOUT: &str = "\
Recompute the log-probs of the response tokens, take the PPO/GRPO clipped token loss weighted by
token_advantages and masked by loss_mask (answer and confidence rows in one batch), and step AdamW.
Writes a new Hugging Face folder (same dtype as the input) with the optimizer state beside it.

Reads: a training table (`rlcr advantage`) and a model folder. Writes: NEW_DIR.
Example:
  rlcr update --model ckpt/iter-0 --input train.parquet -o ckpt/iter-1 --lr 1e-5";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Policy model folder.
    #[arg(long)]
    pub model: PathBuf,
    /// Training table.
    #[arg(long)]
    pub input: PathBuf,
    /// Output model folder.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-6)]
    pub lr: f64,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("update"))
}
