//! `rlcr logprobs`: add a model's per-token log-probs of the responses to a table. The engine is
//! [`crate::logprobs`]; this file is the flags, their checks and the summary line.

use anyhow::Result;
use serde_json::json;

use super::common::{Global, UsageError};
use super::flags::{ModelFolder, TableIo};
use crate::logprobs::{self as stage, Plan, TOKEN_COLUMNS};
use crate::model::sgemm::Precision;
use crate::table::Shard;

pub const ABOUT: &str = "Add a model's per-token log-probs of response_ids to any table";
pub const LONG_ABOUT: &str = "\
For every row, the log-prob of each response_ids token given context_ids and the preceding response
tokens, written as list<float32> aligned with response_ids (e.g. ref_logprobs for a KL penalty).
Other columns pass through; a column of the same name is replaced. --entropy-column also writes the
entropy of each predicted distribution.

The numbers are those of Hugging Face transformers' forward in float32 (log_softmax of the logits at
temperature 1). Rows are batched by similar length and left-padded; padding does not change them.
A bf16 checkpoint is held in bf16 (half the memory) and gives the same numbers: every product widens
its weights exactly. --precision bf16 rounds the products' operands to bf16 as torch's autocast does.

--shard I/N keeps only the rows whose prompt_id falls in shard I of N (FNV-1a hash, as
generate-answers): N machines each write one part, and the folder of parts reads as the whole table.

Costs: one forward pass per row (no sampling), --batch-size rows at a time.
Reads: a table with context_ids/response_ids (list<int32>) and a model folder.
Writes: the same table + a column.
Example:
  rlcr logprobs --model ref-model/ --input scored.parquet -o with_ref.parquet --column ref_logprobs";

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelFolder,
    #[command(flatten)]
    pub io: TableIo,
    /// Name of the column to write.
    #[arg(long, default_value = "logprobs")]
    pub column: String,
    /// Also write the per-token entropy of the model's distribution under this column name.
    #[arg(long)]
    pub entropy_column: Option<String>,
    /// Rows per forward batch.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Only the rows of shard I of N (`--shard 0/4`), split by prompt_id.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
    /// Precision of the matrix products: f32, or bf16 (operands rounded to bfloat16, products
    /// summed in f32, as torch's autocast and `update --precision bf16`). CPU and CUDA; wgpu has
    /// no bf16 arithmetic (an error).
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    pub precision: Precision,
}

/// The validated plan (usage errors exit 2, nothing read).
pub fn plan(g: &Global, a: &Args) -> Result<Plan> {
    if a.batch_size == 0 {
        return Err(UsageError("--batch-size must be at least 1".into()).into());
    }
    let mut names = vec![a.column.as_str()];
    names.extend(a.entropy_column.as_deref());
    for n in &names {
        if n.is_empty() || TOKEN_COLUMNS.contains(n) {
            return Err(UsageError(format!(
                "--column/--entropy-column `{n}`: choose a new column name (not empty, not an \
                 input token column)"
            ))
            .into());
        }
    }
    if a.entropy_column.as_deref() == Some(a.column.as_str()) {
        return Err(UsageError("--entropy-column must differ from --column".into()).into());
    }
    Ok(Plan {
        model: a.model.model.clone(),
        adapter: a.model.adapter.clone(),
        input: a.io.input.clone(),
        out: a.io.out.clone(),
        column: a.column.clone(),
        entropy_column: a.entropy_column.clone(),
        batch_size: a.batch_size,
        shard: a.shard,
        device: g.device,
        precision: a.precision,
        config: json!({
            "model": a.model.model,
            "adapter": a.model.adapter,
            "input": a.io.input,
            "column": a.column,
            "entropy_column": a.entropy_column,
            "batch_size": a.batch_size,
            "shard": a.shard,
            "precision": a.precision,
            "device": g.device,
            "argv": g.argv,
        }),
    })
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let s = stage::run(&plan(g, &a)?)?;
    crate::info!(
        "logprobs: {} rows in {:.1} s -> {} (column `{}`)",
        s.rows,
        s.seconds,
        a.io.out.display(),
        a.column
    );
    Ok(())
}
