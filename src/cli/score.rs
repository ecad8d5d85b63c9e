//! `rlcr score`: verifiers, Brier, format checks and structured rewards (no model).
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str =
    "Score a trajectory table: accuracy, format, confidence, Brier, structured rewards";
pub const LONG_ABOUT: &str = "\
Score every row of a trajectory table without a model. Answers: acc_reward = 1 iff the verifier
accepts the extracted answer. Confidence rows: the last <confidence> parsed as a finite float in
[0,1]; conf_reward = 1 - (acc - c)^2 with acc taken from the row's own answer; 0 on a parse failure.
Re-scoring an already scored table replaces every score column.

Reads: a trajectory table. Writes: the same rows with answer, format_ok, acc_reward, confidence,
conf_reward, reward, reward_components.
Example:
  rlcr score --input trajectory.parquet -o scored.parquet --verifier countdown";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Trajectory table.
    #[arg(long)]
    pub input: PathBuf,
    /// Output scored table.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Verifier (auto picks by data_source).
    #[arg(long, default_value = "auto")]
    pub verifier: String,
    /// External verifier command speaking JSON lines on stdin/stdout.
    #[arg(long)]
    pub verifier_cmd: Option<String>,
    /// Structured rewards definition (seed 001), TOML.
    #[arg(long)]
    pub rewards: Option<PathBuf>,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("score"))
}
