//! `rlcr probe`: the faithfulness probe of seed 002.
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str =
    "Faithfulness probe: cut the thinking, force an answer, Monte-Carlo its accuracy";
pub const LONG_ABOUT: &str = "\
For each answer rollout, cut its <think> at several points, force `</think><answer>`, sample N
continuations (default 50), verify each with the training verifier (correct iff score == 1.0) and
write probe_confidence = correct / N, one row per (rollout, cut point).

Reads: a scored table and the model folder. Writes: a probe table (schema rlcr.probe).
Example:
  rlcr probe --model ckpt/iter-3 --input scored.parquet -o probe.parquet --cuts 4 --samples 50";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model folder.
    #[arg(long)]
    pub model: PathBuf,
    /// Scored table.
    #[arg(long)]
    pub input: PathBuf,
    /// Output probe table.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Number of cut points (evenly spaced fractions of the thinking).
    #[arg(long, default_value_t = 4)]
    pub cuts: usize,
    /// Continuations per cut.
    #[arg(long, default_value_t = 50)]
    pub samples: usize,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("probe"))
}
