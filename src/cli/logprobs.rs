//! `rlcr logprobs`: add a model's per-token log-probs of the responses to a table.
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str = "Add a model's per-token log-probs of response_ids to any table";
pub const LONG_ABOUT: &str = "\
For every row, the log-prob of each response_ids token given context_ids and the preceding response
tokens, written as list<float32> aligned with response_ids (e.g. ref_logprobs for a KL penalty).
Other columns pass through.

Reads: a table with context_ids/response_ids and a model folder. Writes: the same table + a column.
Example:
  rlcr logprobs --model ref-model/ --input scored.parquet -o with_ref.parquet --column ref_logprobs";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model folder.
    #[arg(long)]
    pub model: PathBuf,
    /// Input table.
    #[arg(long)]
    pub input: PathBuf,
    /// Output table.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Name of the column to write.
    #[arg(long, default_value = "logprobs")]
    pub column: String,
    /// Rows per forward batch.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("logprobs"))
}
