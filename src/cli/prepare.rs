//! `rlcr prepare`: build a prompts table from a dataset or from synthetic countdown tasks.
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str =
    "Build a prompts table (countdown-synth, TinyZero countdown, verl Parquet, JSONL)";
pub const LONG_ABOUT: &str = "\
Build a prompts table: one row per prompt with `prompt_id`, `messages` (JSON list of {role, content}),
`data_source` and `ground_truth` (JSON text). This is the input of `generate-answers`.

Sources:
  countdown-synth  seeded synthetic countdown tasks (3-4 numbers in 1..99, a reachable target), with
                   TinyZero's prompt text as the user message; needs --count
  countdown        TinyZero's raw dataset (Parquet or JSONL with `target`, `nums`)
  verl             a verl dataset Parquet (`prompt`, `data_source`, `reward_model.ground_truth`)
  jsonl            one JSON object per line with `prompt` or `messages`, `ground_truth`, optional
                   `data_source` and `id`

Reads: --input (not for countdown-synth). Writes: -o (atomically; never an input).
Example:
  rlcr --seed 1 prepare --from countdown-synth --count 512 -o prompts.parquet";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where the prompts come from.
    #[arg(long, value_enum)]
    pub from: Source,
    /// Input file (Parquet or JSONL), for every source but countdown-synth.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Output prompts table (Parquet).
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Number of prompts (countdown-synth: required; other sources: keep the first N).
    #[arg(long)]
    pub count: Option<usize>,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// Prompt sources.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    CountdownSynth,
    Countdown,
    Verl,
    Jsonl,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("prepare"))
}
