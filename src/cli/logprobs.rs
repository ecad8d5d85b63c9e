//! `rlcr logprobs`: add a model's per-token log-probs of the responses to a table.
//!
//! Two passes over the input: the first reads only `context_ids` and `response_ids` (and
//! `prompt_id` with `--shard`, to count the shard's rows) and checks every row (nulls, negative
//! ids, ids outside the model's vocabulary, an empty context before a response, context + response
//! beyond the model's positions; an empty table is an error too), so a bad table fails in seconds
//! with file, row and column named and nothing written; the second streams the table record batch
//! by record batch, computes the log-probs with [`crate::model::logprobs`] (the batched,
//! left-padded forward that `update` also uses) and writes every input column through unchanged
//! plus the new one (replacing a column of the same name). Memory stays bounded by one record
//! batch.
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use arrow::array::RecordBatch;
use serde_json::json;

use super::common::{Global, UsageError};
use super::flags::{ModelFolder, TableIo};
use crate::model::{self, Model, ModelConfig};
use crate::progress::Progress;
use crate::table::{self, cols, Meta, Reader, Shard, Writer};

pub const ABOUT: &str = "Add a model's per-token log-probs of response_ids to any table";
pub const LONG_ABOUT: &str = "\
For every row, the log-prob of each response_ids token given context_ids and the preceding response
tokens, written as list<float32> aligned with response_ids (e.g. ref_logprobs for a KL penalty).
Other columns pass through; a column of the same name is replaced. --entropy-column also writes the
entropy of each predicted distribution.

The numbers are those of Hugging Face transformers' forward in float32 (log_softmax of the logits at
temperature 1). Rows are batched by similar length and left-padded; padding does not change them.

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
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// Columns the stage reads to compute (the rest only passes through).
const TOKEN_COLUMNS: [&str; 2] = ["context_ids", "response_ids"];

pub fn run(g: &Global, a: Args) -> Result<()> {
    // Usage checks first (exit code 2, nothing read).
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
    let device = model::device_from_str(&g.device)?;
    crate::fs::check_distinct(&[&a.io.input], &a.io.out)?;

    // Pass 1: validate the table (the one validator) and the token columns against the model's
    // vocabulary (config only).
    let config = ModelConfig::load(&a.model.model)
        .with_context(|| format!("reading the model folder {}", a.model.model.display()))?;
    let name = a.io.input.display().to_string();
    // The token columns and what the validator's rules read (prompt_id among them, for --shard).
    let mut pass1: Vec<&str> = TOKEN_COLUMNS.to_vec();
    pass1.extend(table::validate::RULE_COLUMNS);
    let reader = Reader::open_columns(&a.io.input, &pass1)?;
    table::check_schema(&name, &reader.file_schema(), &table::TRAJECTORY, &[])?;
    let mut validator = table::Validator::new(&name, &table::TRAJECTORY);
    validator.reserve(reader.num_rows());
    for c in TOKEN_COLUMNS {
        if !reader.has_column(c) {
            bail!("{name}: column `{c}` is missing (logprobs needs context_ids and response_ids)");
        }
    }
    if a.shard.is_some() && !reader.has_column("prompt_id") {
        bail!("{name}: column `prompt_id` is missing (--shard splits rows by prompt_id)");
    }
    if reader.num_rows() == 0 {
        bail!("{name}: the table has no rows; nothing was written");
    }
    let limits = (config.vocab_size, config.max_position_embeddings);
    // Every row is checked, also those of other shards (a bad table fails in every shard alike).
    let mut total = 0usize;
    let mut first = 0usize;
    for batch in reader {
        let batch = batch?;
        validator.check_batch(&batch)?;
        rows_of(&batch, &name, first, limits)?;
        total += match &a.shard {
            Some(s) => s.filter(&batch, &name, first)?.num_rows(),
            None => batch.num_rows(),
        };
        first += batch.num_rows();
    }
    validator.finish()?;

    // Pass 2: compute and write.
    let m = Model::load(&a.model.model, &device)
        .with_context(|| format!("loading the model {}", a.model.model.display()))?;
    let reader = Reader::open(&a.io.input)?;
    let spec = reader
        .metadata()
        .get("rlcr.schema")
        .and_then(|s| table::schema::by_name(s))
        .unwrap_or(&table::TRAJECTORY);
    let meta = Meta::new(
        spec,
        "logprobs",
        json!({
            "model": a.model.model,
            "input": a.io.input,
            "column": a.column,
            "entropy_column": a.entropy_column,
            "batch_size": a.batch_size,
            "shard": a.shard,
            "device": g.device,
            "argv": g.argv,
        }),
        &[&a.io.input, &a.model.model],
    );
    let mut progress = Progress::new("logprobs", total as u64, "rows");
    let mut writer: Option<Writer> = None;
    let mut first = 0usize;
    for batch in reader {
        let batch = batch?;
        let at = first;
        first += batch.num_rows();
        let batch = match &a.shard {
            Some(s) => s.filter(&batch, &name, at)?,
            None => batch,
        };
        let rows = rows_of(&batch, &name, at, limits)?;
        let pairs: Vec<(&[u32], &[u32])> = rows
            .iter()
            .map(|(c, r)| (c.as_slice(), r.as_slice()))
            .collect();
        let out = model::logprobs(
            &m.transformer,
            &pairs,
            a.batch_size,
            a.entropy_column.is_some(),
            Some(&mut progress),
        )?;
        let mut new = vec![(a.column.as_str(), cols::build_list_f32(&out.logprobs))];
        if let (Some(col), Some(ent)) = (a.entropy_column.as_deref(), &out.entropy) {
            new.push((col, cols::build_list_f32(ent)));
        }
        let b = cols::set_columns(&batch, spec, new)?;
        if writer.is_none() {
            writer = Some(Writer::create(&a.io.out, b.schema(), &meta)?);
        }
        if let Some(w) = writer.as_mut() {
            w.write(&b)?;
        }
    }
    let secs = progress.finish();
    let rows = writer
        .context("internal: the table has rows but no batch was written")?
        .finish()?;
    crate::info!(
        "logprobs: {rows} rows in {secs:.1} s -> {} (column `{}`)",
        a.io.out.display(),
        a.column
    );
    Ok(())
}

/// The (context, response) ids of every row of a batch; errors name the file, row and column.
/// `(vocab, max_pos)`: the model's vocabulary size and positions (context + response must fit).
fn rows_of(
    b: &RecordBatch,
    table: &str,
    first_row: usize,
    (vocab, max_pos): (usize, usize),
) -> Result<Vec<(Vec<u32>, Vec<u32>)>> {
    let ctx = cols::list_i32(b, table, "context_ids")?;
    let resp = cols::list_i32(b, table, "response_ids")?;
    let mut out = Vec::with_capacity(b.num_rows());
    for i in 0..b.num_rows() {
        let row = first_row + i;
        let ids =
            |v: &cols::ListView<'_, arrow::array::Int32Array>, col: &str| -> Result<Vec<u32>> {
                if v.is_null(i) {
                    bail!("{table}: row {row}, column `{col}`: null");
                }
                v.values.values()[v.range(i)]
                    .iter()
                    .enumerate()
                    .map(|(k, &x)| match u32::try_from(x) {
                        Ok(id) if (id as usize) < vocab => Ok(id),
                        _ => bail!(
                        "{table}: row {row}, column `{col}`, item {k}: token id {x} is outside \
                         the model's vocabulary (0..{vocab})"
                    ),
                    })
                    .collect()
            };
        let c = ids(&ctx, "context_ids")?;
        let r = ids(&resp, "response_ids")?;
        if c.is_empty() && !r.is_empty() {
            bail!(
                "{table}: row {row}, column `context_ids`: empty (the first response token needs \
                 at least one context token)"
            );
        }
        if c.len() + r.len() > max_pos {
            bail!(
                "{table}: row {row}, column `context_ids`: context ({}) + response ({}) is {} \
                 tokens, but the model accepts at most {max_pos} positions",
                c.len(),
                r.len(),
                c.len() + r.len()
            );
        }
        out.push((c, r));
    }
    Ok(out)
}
