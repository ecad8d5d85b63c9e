//! The scoring stage's input: the trajectory table read in batches (the repetitive columns as
//! dictionaries, a shard's rows picked with their input row numbers), validated first with the
//! one [`Validator`], and each batch's columns the verifiers read ([`RgCols`]).
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{Array, ArrayRef, Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;

use super::STALE_COLUMNS;
use crate::table::splice::Part;
use crate::table::validate::{answer_key, Links};
use crate::table::{self, SampleType, Shard, Validator, TRAJECTORY};

/// The input row numbers of a batch's rows: errors and the external verifier's request ids
/// name rows of the whole input table, also when a shard keeps only some of them.
#[derive(Debug, Clone)]
pub(super) enum RowIds {
    /// Consecutive rows from this one.
    Run(u64),
    /// The rows a filter kept.
    Picked(Vec<u64>),
}

impl RowIds {
    #[inline]
    pub(super) fn at(&self, i: usize) -> u64 {
        match self {
            RowIds::Run(first) => first + i as u64,
            RowIds::Picked(rows) => rows[i],
        }
    }
}

/// The input parts, how they are decoded, and the optional row filter (`--shard`).
pub(super) struct Input<'a> {
    pub(super) parts: &'a [Part],
    /// Per part: the metadata reading [`DICTIONARY_COLUMNS`] as dictionaries.
    pub(super) read_metas: Vec<ArrowReaderMetadata>,
    pub(super) shard: Option<Shard>,
}

impl Input<'_> {
    /// Read `columns` (those present) of row group `rg` of part `pi`, in batches of
    /// [`BATCH_ROWS`], with their input row numbers. With a shard, every column is read (the
    /// kept rows' columns are encoded again, not copied) and only the shard's rows are kept.
    pub(super) fn batches(
        &self,
        pi: usize,
        rg: usize,
        columns: &[&str],
    ) -> Result<impl Iterator<Item = Result<(RecordBatch, RowIds)>> + '_> {
        let p = &self.parts[pi];
        let meta = match self.shard {
            None => &self.read_metas[pi],
            Some(_) => &p.meta,
        };
        let idx: Vec<usize> = meta
            .schema()
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| self.shard.is_some() || columns.contains(&f.name().as_str()))
            .map(|(i, _)| i)
            .collect();
        // a fresh open file description: `try_clone` would share the file offset with the writer
        // thread, which copies column chunks from `p.file` at the same time
        let file =
            File::open(&p.path).with_context(|| format!("{}: cannot reopen", p.path.display()))?;
        let b = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone());
        let mask = ProjectionMask::roots(b.parquet_schema(), idx);
        let r = b
            .with_projection(mask)
            .with_row_groups(vec![rg])
            .with_batch_size(BATCH_ROWS)
            .build()
            .with_context(|| format!("{}: cannot read row group {rg}", p.path.display()))?;
        let mut first = p.rg_first_row(rg);
        let shard = self.shard;
        Ok(r.map(move |b| {
            let b = b.with_context(|| {
                format!(
                    "{}: corrupt or truncated Parquet data in row group {rg}",
                    p.path.display()
                )
            })?;
            let start = first;
            first += b.num_rows() as u64;
            match shard {
                None => Ok((b, RowIds::Run(start))),
                Some(sh) => {
                    let name = p.path.display().to_string();
                    let keep = sh.selection(&b, &name, start as usize)?;
                    let rows = (0..b.num_rows())
                        .filter(|&i| keep.value(i))
                        .map(|i| start + i as u64)
                        .collect();
                    let kept = arrow::compute::filter_record_batch(&b, &keep)?;
                    Ok((kept, RowIds::Picked(rows)))
                }
            }
        }))
    }
}

/// Rows decoded at a time.
pub(super) const BATCH_ROWS: usize = 32768;

/// Columns read as Arrow dictionaries: they repeat within a table (one or two sample types, a few
/// data sources, one ground truth per prompt), so their Parquet dictionary pages are used as they
/// are instead of materialising a string per row.
const DICTIONARY_COLUMNS: [&str; 3] = ["sample_type", "data_source", "ground_truth"];

/// Reader metadata asking for [`DICTIONARY_COLUMNS`] as dictionaries (the plain reader when the
/// hint does not apply).
pub(super) fn dictionary_hints(meta: &ArrowReaderMetadata) -> ArrowReaderMetadata {
    let schema = meta.schema();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let f = f.as_ref().clone();
            if DICTIONARY_COLUMNS.contains(&f.name().as_str()) && f.data_type() == &DataType::Utf8 {
                let dt = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
                f.with_data_type(dt)
            } else {
                f
            }
        })
        .collect();
    let hint = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    ArrowReaderMetadata::try_new(
        meta.metadata().clone(),
        ArrowReaderOptions::new().with_schema(hint),
    )
    .unwrap_or_else(|_| meta.clone())
}

fn utf8(b: &RecordBatch, file: &Path, name: &str) -> Result<StringArray> {
    table::cols::utf8(b, &file.display().to_string(), name)
}

fn int32(b: &RecordBatch, file: &Path, name: &str) -> Result<Int32Array> {
    table::cols::int32(b, &file.display().to_string(), name)
}

/// Row access to a utf8 column, plain or dictionary-encoded.
pub(super) trait Strs {
    fn is_null_at(&self, i: usize) -> bool;
    fn value_at(&self, i: usize) -> &str;
}

impl Strs for StringArray {
    fn is_null_at(&self, i: usize) -> bool {
        self.is_null(i)
    }
    fn value_at(&self, i: usize) -> &str {
        self.value(i)
    }
}

/// A utf8 column read either way (plain, or a dictionary with int32 keys), read through
/// [`table::StrCol`]: a dictionary keeps its keys, so that equal keys can skip a string
/// comparison.
pub(super) struct TextCol(ArrayRef);

impl TextCol {
    /// The column as text.
    #[inline]
    fn view(&self) -> table::StrCol<'_> {
        table::StrCol::of_array(self.0.as_ref()).expect("a text column") // ok: built only from arrays `StrCol` reads (checked in `str_col`)
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// The dictionary key of row `i` when the row holds a value (`None` for plain columns and
    /// null rows). Equal keys of one batch are equal strings, so a cache keyed by them (per batch)
    /// need not fetch and compare the string.
    #[inline]
    pub(super) fn valid_key(&self, i: usize) -> Option<i32> {
        self.view().key(i)
    }
}

impl Strs for TextCol {
    fn is_null_at(&self, i: usize) -> bool {
        self.view().is_null(i)
    }
    fn value_at(&self, i: usize) -> &str {
        self.view().value(i)
    }
}

/// A utf8 column that may have been read as a dictionary.
fn str_col(b: &RecordBatch, file: &Path, name: &str) -> Result<TextCol> {
    let c = b.column_by_name(name).ok_or_else(|| {
        anyhow!(
            "{}: column `{name}` is missing (is this a trajectory table?)",
            file.display()
        )
    })?;
    let c: ArrayRef = if let DataType::Dictionary(kt, vt) = c.data_type() {
        if **kt == DataType::Int32 && **vt == DataType::Utf8 {
            c.clone()
        } else {
            let dt = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
            arrow::compute::cast(c, &dt)?
        }
    } else {
        Arc::new(utf8(b, file, name)?)
    };
    if table::StrCol::of_array(c.as_ref()).is_none() {
        bail!("internal: {name} is not text after its cast");
    }
    Ok(TextCol(c))
}

pub(super) fn str_at<'a, S: Strs + ?Sized>(
    a: &'a S,
    i: usize,
    file: &Path,
    name: &str,
    row: u64,
) -> Result<&'a str> {
    if a.is_null_at(i) {
        bail!("{}, row {row}: column `{name}` is null", file.display());
    }
    Ok(a.value_at(i))
}

/// The kind of every row of a batch (dictionaries: once per distinct value).
pub(super) fn kinds_of(st: &TextCol, path: &Path, rows: &RowIds) -> Result<Vec<SampleType>> {
    let view = st.view();
    // Per dictionary value (empty for plain columns).
    let per_value = view.per_value(|v| v.and_then(|v| SampleType::from_bytes(v.as_bytes())));
    (0..st.len())
        .map(|i| match view.key(i).and_then(|k| per_value[k as usize]) {
            Some(k) => Ok(k),
            None => {
                let row = rows.at(i);
                kind_of(str_at(st, i, path, "sample_type", row)?, path, row)
            }
        })
        .collect()
}

fn kind_of(s: &str, file: &Path, row: u64) -> Result<SampleType> {
    match s {
        "answer" => Ok(SampleType::Answer),
        "confidence" => Ok(SampleType::Confidence),
        other => bail!(
            "{}, row {row}, column `sample_type`: {other:?} is neither \"answer\" nor \"confidence\"",
            file.display()
        ),
    }
}

/// The first pass: the one [`Validator`] over the columns its rules read (types, identities,
/// list lengths, spans, answer<->confidence links), before anything is scored. Its links tell the
/// scoring pass whether confidence rows need their answers looked up ahead.
///
/// The token lists are not decoded: their row lengths come from the Parquet levels
/// ([`table::levels`]), which is most of this pass's cost saved on light rows. A list the level
/// reader does not support is decoded the ordinary way (the whole pass again, decoded).
pub(super) fn validate(read: &Path, parts: &[Part]) -> Result<Links> {
    let _t = crate::trace::span("score: validate");
    let has = |c: &str| parts[0].meta.schema().field_with_name(c).is_ok();
    let lists: Vec<&str> = std::iter::once("response_ids")
        .chain(table::validate::PER_TOKEN)
        .filter(|c| !STALE_COLUMNS.contains(c) && has(c))
        .collect();
    if lists.contains(&"response_ids")
        && lists.iter().all(|c| table::levels::supported(&parts[0], c))
    {
        match validate_with(read, parts, &lists) {
            Err(e) if e.downcast_ref::<table::levels::Unsupported>().is_some() => {
                crate::debug!("{e:#}; validating with the lists decoded");
            }
            r => return r,
        }
    }
    validate_with(read, parts, &[])
}

/// [`validate`], with the row lengths of `by_levels` read from their levels (the rest decoded).
fn validate_with(read: &Path, parts: &[Part], by_levels: &[&str]) -> Result<Links> {
    let names: Vec<&str> = table::validate::RULE_COLUMNS
        .into_iter()
        .filter(|c| !STALE_COLUMNS.contains(c) && !by_levels.contains(c))
        .collect();
    let reader = table::Reader::open_columns(read, &names)?
        .with_dictionaries(&["sample_type", "prompt_id"])
        .with_views(&["sample_id"]);
    table::check_schema(&reader.display, &reader.file_schema(), &TRAJECTORY, &[])?;
    let mut v = Validator::new(&reader.display.clone(), &TRAJECTORY);
    v.reserve(reader.num_rows());
    let mut streams: Vec<table::levels::Stream> = by_levels
        .iter()
        .map(|c| table::levels::Stream::new(parts, c))
        .collect();
    for b in reader {
        let b = b?;
        let (first, n) = (v.rows(), b.num_rows());
        v.check_rows(&b, first)?;
        if let Some((resp, others)) = streams.split_first_mut() {
            resp.fill(first, n)?;
            for s in others.iter_mut() {
                s.fill(first, n)?;
            }
            let others: Vec<table::validate::ListLens> = others
                .iter()
                .zip(&by_levels[1..])
                .map(|(s, name)| {
                    let (l, nl) = s.get(first, n);
                    (*name, l, nl)
                })
                .collect();
            v.check_lengths(&b, first, resp.get(first, n), &others)?;
        }
        v.check_links(&b)?;
    }
    v.finish()
}

// ---------------------------------------------------------------------------------------------
// scoring one row group

/// The columns a batch is scored from (the optional ones only when some setting needs them).
pub(super) struct RgCols {
    /// Input row numbers.
    pub(super) rows: RowIds,
    pub(super) sample_type: TextCol,
    pub(super) prompt_id: Option<StringArray>,
    pub(super) answer_idx: Option<Int32Array>,
    pub(super) sample_id: Option<StringArray>,
    pub(super) data_source: TextCol,
    pub(super) ground_truth: TextCol,
    pub(super) response: StringArray,
    pub(super) messages: Option<StringArray>,
    pub(super) extra: HashMap<String, ArrayRef>,
}

/// Which optional columns to read.
#[derive(Clone, Copy)]
pub(super) struct Needs {
    pub(super) ids: bool,
    pub(super) sample_id: bool,
    pub(super) messages: bool,
}

pub(super) fn column_names(needs: Needs, spec_cols: &[String]) -> Vec<&str> {
    let mut names: Vec<&str> = vec![
        "sample_type",
        "data_source",
        "ground_truth",
        "response_text",
    ];
    if needs.ids {
        names.extend(["prompt_id", "answer_idx"]);
    }
    if needs.sample_id {
        names.push("sample_id");
    }
    if needs.messages {
        names.push("messages");
    }
    names.extend(spec_cols.iter().map(String::as_str));
    names
}

impl RgCols {
    pub(super) fn from_batch(
        b: &RecordBatch,
        rows: RowIds,
        path: &Path,
        needs: Needs,
        spec_cols: &[String],
    ) -> Result<RgCols> {
        let mut extra = HashMap::new();
        for c in spec_cols {
            let a = b.column_by_name(c).ok_or_else(|| {
                anyhow!(
                    "{}: column `{c}` (read by the rewards TOML) is missing",
                    path.display()
                )
            })?;
            extra.insert(c.clone(), a.clone());
        }
        Ok(RgCols {
            rows,
            sample_type: str_col(b, path, "sample_type")?,
            prompt_id: if needs.ids {
                Some(utf8(b, path, "prompt_id")?)
            } else {
                None
            },
            answer_idx: if needs.ids {
                Some(int32(b, path, "answer_idx")?)
            } else {
                None
            },
            sample_id: if needs.sample_id {
                Some(utf8(b, path, "sample_id")?)
            } else {
                None
            },
            data_source: str_col(b, path, "data_source")?,
            ground_truth: str_col(b, path, "ground_truth")?,
            response: utf8(b, path, "response_text")?,
            messages: if needs.messages {
                Some(table::cols::messages(b, &path.display().to_string())?)
            } else {
                None
            },
            extra,
        })
    }

    /// The answer key of row `i` (only when the ids were read).
    pub(super) fn key(&self, i: usize) -> Result<u128> {
        match (&self.prompt_id, &self.answer_idx) {
            (Some(p), Some(a)) => Ok(answer_key(p.value(i), a.value(i))),
            _ => bail!("internal: answer ids not read"),
        }
    }
}
