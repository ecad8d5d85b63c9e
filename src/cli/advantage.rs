//! `rlcr advantage`: advantage estimators over a scored table (no model).
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str =
    "Compute advantages, token advantages and loss masks (RLCR tree, GRPO, RLOO, GAE)";
pub const LONG_ABOUT: &str = "\
Compute per-row advantages from the rewards of a scored table. The default estimator `rlcr` (seed
000) normalises answer rewards per prompt over its G_a answers and confidence rewards per answer over
its G_c confidences, never pooling confidences of different answers.

Reads: a scored table. Writes: the same rows with advantage, token_advantages, loss_mask (and
returns, trajectory_score for GAE).
Example:
  rlcr advantage --input scored.parquet -o train.parquet --estimator rlcr";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scored table.
    #[arg(long)]
    pub input: PathBuf,
    /// Output training table.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Estimator.
    #[arg(long, default_value = "rlcr")]
    pub estimator: String,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("advantage"))
}
