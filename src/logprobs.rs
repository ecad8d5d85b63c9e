//! The `logprobs` stage's engine: a model's per-token log-probs of every row's `response_ids`
//! (and optionally the entropies) added to a table, behind a clap-free [`Plan`] and [`run`]. The
//! math is [`crate::model::logprobs`] (the batched, left-padded forward that `update` also uses);
//! this is the table around it.
//!
//! Two passes over the input: the first reads only `context_ids` and `response_ids` and what the
//! one [`Validator`](crate::table::Validator) reads (`prompt_id` among them, for a shard), and
//! checks every row (nulls, negative ids, ids outside the model's vocabulary, an empty context
//! before a response, context + response beyond the model's positions; an empty table is an error
//! too), so a bad table fails in seconds with file, row and column named and nothing written; the
//! second streams the table record batch by record batch and writes every input column through
//! unchanged plus the new ones (replacing columns of the same names). Memory stays bounded by one
//! record batch.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use arrow::array::{ArrayRef, RecordBatch};

use crate::model::{self, Model, ModelConfig};
use crate::progress::Progress;
use crate::table::{self, cols, Meta, Reader, Shard, Writer};

/// Columns the stage reads to compute (the rest only passes through).
pub const TOKEN_COLUMNS: [&str; 2] = ["context_ids", "response_ids"];

/// What to compute: the validated form of `rlcr logprobs`'s flags.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Model folder.
    pub model: PathBuf,
    /// A LoRA adapter folder merged into `model` at load.
    pub adapter: Option<PathBuf>,
    pub input: PathBuf,
    pub out: PathBuf,
    /// The log-prob column to write.
    pub column: String,
    /// Also the entropies, under this name.
    pub entropy_column: Option<String>,
    /// Rows per forward batch (at least 1).
    pub batch_size: usize,
    /// Only this shard's rows (by `prompt_id`).
    pub shard: Option<Shard>,
    /// `cpu`, `wgpu[:N]`, `cuda[:N]`.
    pub device: model::DeviceSpec,
    /// Precision of the matrix products ([`crate::model::sgemm::autocast`]).
    pub precision: crate::model::sgemm::Precision,
    /// The settings recorded in the output's `rlcr.config`.
    pub config: serde_json::Value,
}

/// What [`run`] did.
#[derive(Debug, Clone)]
pub struct Summary {
    pub rows: usize,
    pub seconds: f64,
}

/// Validate the input (pass 1), then compute and write (pass 2).
pub fn run(plan: &Plan) -> Result<Summary> {
    let device = plan.device.open()?;
    model::sgemm::check_device(plan.precision, &device)?;
    crate::fs::check_distinct(&[&plan.input], &plan.out)?;

    // Pass 1: validate the table (the one validator) and the token columns against the model's
    // vocabulary (config only).
    // A LoRA adapter folder: its base's config (the adapter does not change the vocabulary).
    let (base, _) = model::lora::resolve(&plan.model, plan.adapter.as_deref())?;
    let config = ModelConfig::load(&base)
        .with_context(|| format!("reading the model folder {}", plan.model.display()))?;
    let name = plan.input.display().to_string();
    // The token columns and what the validator's rules read (prompt_id among them, for a shard).
    let mut pass1: Vec<&str> = TOKEN_COLUMNS.to_vec();
    pass1.extend(table::validate::RULE_COLUMNS);
    let reader = Reader::open_columns(&plan.input, &pass1)?;
    table::check_schema(&name, &reader.file_schema(), &table::TRAJECTORY, &[])?;
    let mut validator = table::Validator::new(&name, &table::TRAJECTORY);
    validator.reserve(reader.num_rows());
    for c in TOKEN_COLUMNS {
        if !reader.has_column(c) {
            bail!("{name}: column `{c}` is missing (logprobs needs context_ids and response_ids)");
        }
    }
    if plan.shard.is_some() && !reader.has_column("prompt_id") {
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
        token_rows(&batch, &name, first, limits)?;
        total += match &plan.shard {
            Some(s) => s.filter(&batch, &name, first)?.num_rows(),
            None => batch.num_rows(),
        };
        first += batch.num_rows();
    }
    validator.finish()?;

    // Pass 2: compute and write.
    let m = Model::open(
        &plan.model,
        plan.adapter.as_deref(),
        &device,
        model::AdapterUse::Merge,
    )
    .with_context(|| format!("loading the model {}", plan.model.display()))?;
    let reader = Reader::open(&plan.input)?;
    let spec = reader.table_spec();
    let meta = Meta::new(
        spec,
        "logprobs",
        plan.config.clone(),
        &[&plan.input, &plan.model],
    );
    let mut progress = Progress::new("logprobs", total as u64, "rows");
    let rows = map_token_rows(
        reader,
        &name,
        &plan.out,
        &meta,
        plan.shard.as_ref(),
        limits,
        |pairs| {
            let _precision = model::sgemm::autocast(plan.precision);
            let out = model::logprobs(
                &m.transformer,
                pairs,
                plan.batch_size,
                plan.entropy_column.is_some(),
                Some(&mut progress),
            )?;
            let mut new = vec![(plan.column.as_str(), cols::build_list_f32(&out.logprobs))];
            if let (Some(col), Some(ent)) = (plan.entropy_column.as_deref(), &out.entropy) {
                new.push((col, cols::build_list_f32(ent)));
            }
            Ok(new)
        },
    )?;
    let seconds = progress.finish();
    Ok(Summary { rows, seconds })
}

/// The batched model loop of the stages that add per-token columns computed by a model
/// (`logprobs`, `values`): every record batch of `reader` (only `shard`'s rows), its rows'
/// (context, response) ids checked against the model's `(vocabulary, positions)` limits
/// ([`token_rows`]), `new_columns` of them added to the batch (replacing columns of the same
/// names) and written to `out`. Returns the rows written; an empty result is an error.
pub fn map_token_rows<'a>(
    reader: Reader,
    name: &str,
    out: &Path,
    meta: &Meta,
    shard: Option<&Shard>,
    limits: (usize, usize),
    mut new_columns: impl FnMut(&[(&[u32], &[u32])]) -> Result<Vec<(&'a str, ArrayRef)>>,
) -> Result<usize> {
    let spec = reader.table_spec();
    let mut writer: Option<Writer> = None;
    let mut first = 0usize;
    for batch in reader {
        let batch = batch?;
        let at = first;
        first += batch.num_rows();
        let batch = match shard {
            Some(s) => s.filter(&batch, name, at)?,
            None => batch,
        };
        let rows = token_rows(&batch, name, at, limits)?;
        let pairs: Vec<(&[u32], &[u32])> = rows
            .iter()
            .map(|(c, r)| (c.as_slice(), r.as_slice()))
            .collect();
        let new = new_columns(&pairs)?;
        let b = cols::set_columns(&batch, spec, new)?;
        table::io::write_lazily(&mut writer, out, meta, &b)?;
    }
    writer
        .context("internal: the table has rows but no batch was written")?
        .finish()
}

/// The (context, response) ids of every row of a batch; errors name the file, row and column.
/// `(vocab, max_pos)`: the model's vocabulary size and positions (context + response must fit).
/// `first_row` is the batch's first row in the table (before any shard filter: row numbers
/// name rows of the input).
fn token_rows(
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
        let at = |c: &str| format!("{table}: row {row}, column `{c}`");
        let c = token_ids(&ctx, i, &at, "context_ids", vocab)?;
        let r = token_ids(&resp, i, &at, "response_ids", vocab)?;
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

/// Row `i` of token-id list `v` (column `col`; `at(col)` names the file, row and column in
/// errors): null and ids outside the model's vocabulary `0..vocab` are errors.
pub(crate) fn token_ids(
    v: &cols::ListView<'_, arrow::array::Int32Array>,
    i: usize,
    at: &dyn Fn(&str) -> String,
    col: &str,
    vocab: usize,
) -> Result<Vec<u32>> {
    v.values.values()[v.present(i, || at(col))?]
        .iter()
        .enumerate()
        .map(|(k, &x)| match u32::try_from(x) {
            Ok(id) if (id as usize) < vocab => Ok(id),
            _ => bail!(
                "{}, item {k}: token id {x} is outside the model's vocabulary (0..{vocab})",
                at(col)
            ),
        })
        .collect()
}
