//! `rlcr sft`: supervised warm start on assistant targets.
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str =
    "Supervised warm start (cross-entropy on response tokens), as RLCR's SFT+RLCR";
pub const LONG_ABOUT: &str = "\
Fine-tune a model with cross-entropy on the response tokens of a table whose `messages` end with the
assistant target (or a trajectory table filtered to correct rows). Same optimizer, checkpoint and
metrics code as `update`.

Reads: a table and a model folder. Writes: NEW_DIR (Hugging Face layout).
Example:
  rlcr sft --model fixtures/tiny-qwen2 --input sft.parquet -o ckpt/sft";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model folder.
    #[arg(long)]
    pub model: PathBuf,
    /// Table with assistant targets.
    #[arg(long)]
    pub input: PathBuf,
    /// Output model folder.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-4)]
    pub lr: f64,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("sft"))
}
