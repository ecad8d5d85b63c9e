//! `rlcr generate-confidence`: turn 2 of the RLCR rollout.
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};
use super::generate_answers::SamplingArgs;

pub const ABOUT: &str =
    "Sample G_c confidences per answer, each for exactly one fixed answer (turn 2)";
pub const LONG_ABOUT: &str = "\
For every answer row (j,k), build the conversation system + user prompt + assistant(answer k) +
user(confidence query) and sample G_c (--num-confidences) responses
`[<analysis>...</analysis>]<confidence>...</confidence>`. The G_c samples of one answer share its
prefix, prefilled once. Answer rows pass through unchanged; confidence rows point at their answer
through prompt_id/answer_idx and sample_id `{prompt_id}/a{k}/c{h}`.

Reads: an answers table and the model folder. Writes: the trajectory table (answers + confidences).
Example:
  rlcr generate-confidence --model fixtures/tiny-qwen2 --input answers.parquet \\
       -o trajectory.parquet --num-confidences 4";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Hugging Face model folder.
    #[arg(long)]
    pub model: PathBuf,
    /// Answers table (`generate-answers`).
    #[arg(long)]
    pub input: PathBuf,
    /// Output trajectory table.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Confidences per answer (G_c).
    #[arg(long, default_value_t = 4)]
    pub num_confidences: usize,
    /// The user message that asks for a confidence (default: RLCR-style request for a probability
    /// between 0 and 1 in <confidence> tags, optionally after <analysis>).
    #[arg(long)]
    pub confidence_prompt: Option<String>,
    /// System prompt text (default: the one recorded in the answers, else RLCR's).
    #[arg(long)]
    pub system_prompt: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Only the prompts of shard I of N (`--shard 0/4`).
    #[arg(long)]
    pub shard: Option<String>,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("generate-confidence"))
}
