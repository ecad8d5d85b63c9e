//! Parquet reading and writing: streaming record batches, file metadata, atomic output.
//!
//! Reading normalises what other tools write (polars: `LargeList`, `LargeUtf8`; DuckDB/pyarrow:
//! `Utf8View`, dictionaries) into the plain types rlcr's code expects, so stages never see them,
//! and reads the columns of the table's schema that pandas, polars and pyarrow store wider
//! (`int64`, `double`, `list<int64>`, spans of `int64`) in the schema's types where the values fit
//! ([`super::coerce`]). An input may be a file or a folder of part files (`*.parquet`, read in
//! name order).
//!
//! Writing is atomic, through [`crate::fs::AtomicFile`]: a stage that fails, panics or is killed
//! leaves the previous output intact.
//! Provenance goes into the file's key-value metadata through the Parquet writer properties (keys
//! on the Arrow schema would never reach DuckDB's `parquet_kv_metadata()` or polars'
//! `read_parquet_metadata()`), in a fixed order and without timestamps, so the same inputs give
//! byte-identical files.
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use super::schema::TableSpec;
use crate::fs::{check_distinct, slow_write_hook, AtomicFile};

/// Rows per record batch when reading.
pub const READ_BATCH_ROWS: usize = 8192;
/// Rows per Parquet row group when writing.
pub const ROW_GROUP_ROWS: usize = 65536;

/// Provenance written into every output's key-value metadata.
#[derive(Clone, Debug)]
pub struct Meta {
    /// Table kind, e.g. `rlcr.trajectory`.
    pub schema_name: String,
    /// Schema version.
    pub schema_version: u32,
    /// The stage that wrote the file (`score`, ...).
    pub stage: String,
    /// The resolved configuration (flags + config file), JSON. The environment switches in
    /// force are written beside it as `rlcr.switches` ([`crate::switches::Switches::recorded`]).
    pub config: serde_json::Value,
    /// Input files, as given.
    pub inputs: Vec<PathBuf>,
    /// Extra keys (`rlcr.<key>`), e.g. statistics.
    pub extra: BTreeMap<String, String>,
}

impl Meta {
    /// Metadata for a table of kind `spec` written by `stage`.
    pub fn new(spec: &TableSpec, stage: &str, config: serde_json::Value, inputs: &[&Path]) -> Self {
        Meta {
            schema_name: spec.name.to_string(),
            schema_version: spec.version,
            stage: stage.to_string(),
            config,
            inputs: inputs.iter().map(|p| p.to_path_buf()).collect(),
            extra: BTreeMap::new(),
        }
    }

    /// The key-value pairs, in a fixed order.
    pub fn key_values(&self) -> Vec<KeyValue> {
        let inputs: Vec<String> = self
            .inputs
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let mut kv = vec![
            KeyValue::new("rlcr.schema".into(), self.schema_name.clone()),
            KeyValue::new(
                "rlcr.schema_version".into(),
                self.schema_version.to_string(),
            ),
            KeyValue::new("rlcr.stage".into(), self.stage.clone()),
            KeyValue::new("rlcr.config".into(), self.config.to_string()),
            KeyValue::new(
                "rlcr.switches".into(),
                crate::switches::get().recorded_json().to_string(),
            ),
            KeyValue::new(
                "rlcr.inputs".into(),
                serde_json::Value::from(inputs).to_string(),
            ),
            KeyValue::new("rlcr.version".into(), crate::VERSION.to_string()),
        ];
        for (k, v) in &self.extra {
            kv.push(KeyValue::new(format!("rlcr.{k}"), v.clone()));
        }
        kv
    }
}

/// A streaming reader over one Parquet file or a folder of part files.
pub struct Reader {
    files: Vec<PathBuf>,
    next_file: usize,
    current: Option<ParquetRecordBatchReader>,
    schema: SchemaRef,
    file_schema: SchemaRef,
    /// The normalised schema of the file before any conversion to the table's types.
    written_schema: SchemaRef,
    /// The schema whose columns are read in its types ([`super::coerce`]); `None`: as written.
    spec: Option<&'static TableSpec>,
    /// Rows yielded so far (the row numbers of conversion errors).
    rows_read: usize,
    metadata: BTreeMap<String, String>,
    num_rows: usize,
    columns: Option<Vec<String>>,
    /// Utf8 columns read and kept as `Dictionary(Int32, Utf8)` ([`Reader::with_dictionaries`]).
    dictionaries: Vec<String>,
    /// Utf8 columns read and kept as `Utf8View` ([`Reader::with_views`]).
    views: Vec<String>,
    /// Display name for errors.
    pub display: String,
}

impl Reader {
    /// Open a table for reading every column.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_inner(path, None)
    }

    /// Open a table reading only the named columns (those present; check with [`Reader::schema`]).
    pub fn open_columns(path: &Path, columns: &[&str]) -> Result<Self> {
        Self::open_inner(path, Some(columns.iter().map(|s| s.to_string()).collect()))
    }

    fn open_inner(path: &Path, columns: Option<Vec<String>>) -> Result<Self> {
        let files = input_files(path)?;
        let mut num_rows = 0usize;
        let mut first: Option<(SchemaRef, BTreeMap<String, String>)> = None;
        for f in &files {
            let b = builder(f)?;
            num_rows += b.metadata().file_metadata().num_rows().max(0) as usize;
            let schema = normalized_schema(b.schema());
            match &first {
                None => {
                    let mut md = BTreeMap::new();
                    if let Some(kvs) = b.metadata().file_metadata().key_value_metadata() {
                        for kv in kvs {
                            md.insert(kv.key.clone(), kv.value.clone().unwrap_or_default());
                        }
                    }
                    first = Some((schema, md));
                }
                Some((s0, _)) => {
                    if s0.fields() != schema.fields() {
                        bail!(
                            "{}: part file {} has a different schema from {}",
                            path.display(),
                            f.display(),
                            files[0].display()
                        );
                    }
                }
            }
        }
        let Some((written_schema, metadata)) = first else {
            bail!("{}: no Parquet files found", path.display());
        };
        let spec = table_spec_of(&metadata);
        let mut r = Reader {
            files,
            next_file: 0,
            current: None,
            schema: written_schema.clone(),
            file_schema: written_schema.clone(),
            written_schema,
            spec: Some(spec),
            rows_read: 0,
            metadata,
            num_rows,
            columns,
            dictionaries: Vec::new(),
            views: Vec::new(),
            display: path.display().to_string(),
        };
        r.derive_schemas();
        Ok(r)
    }

    /// Read the columns as the file stores them (normalised layouts, no conversion to the table's
    /// types): for files that are not rlcr tables (`prepare`'s datasets) and for `inspect`.
    pub fn as_written(mut self) -> Self {
        self.spec = None;
        self.derive_schemas();
        self
    }

    /// `file_schema` and `schema` from the written schema, the conversions and the projection.
    fn derive_schemas(&mut self) {
        self.file_schema = match self.spec {
            Some(spec) => Arc::new(super::coerce::read_schema(&self.written_schema, spec)),
            None => self.written_schema.clone(),
        };
        self.schema = match &self.columns {
            None => self.file_schema.clone(),
            Some(cols) => Arc::new(Schema::new(
                self.file_schema
                    .fields()
                    .iter()
                    .filter(|f| cols.iter().any(|c| c == f.name()))
                    .map(|f| f.as_ref().clone())
                    .collect::<Vec<Field>>(),
            )),
        };
    }

    /// Read the utf8 columns `names` as `Dictionary(Int32, Utf8)` and keep them so (not
    /// normalised to `Utf8`): for columns that repeat (`prompt_id`, `sample_type`), whose Parquet
    /// dictionary pages are then used as they are instead of a string built per row.
    pub fn with_dictionaries(mut self, names: &[&str]) -> Self {
        self.dictionaries = names.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Read the utf8 columns `names` as `Utf8View` and keep them so: for columns of distinct
    /// short strings read only to be compared (`sample_id`), whose values then stay where Parquet
    /// decoded them (a string of up to 12 bytes inside its view) instead of being copied into one
    /// buffer per batch.
    pub fn with_views(mut self, names: &[&str]) -> Self {
        self.views = names.iter().map(|s| s.to_string()).collect();
        self
    }

    /// The columns kept in the type they were read as ([`Reader::with_dictionaries`],
    /// [`Reader::with_views`]).
    fn kept(&self, name: &str) -> bool {
        self.dictionaries
            .iter()
            .chain(&self.views)
            .any(|d| d == name)
    }

    /// The (normalised) schema of the batches this reader yields.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The (normalised) schema of the whole file, every column.
    pub fn file_schema(&self) -> SchemaRef {
        self.file_schema.clone()
    }

    /// The file's key-value metadata (of the first part file).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The table kind the file records in its `rlcr.schema` metadata; the trajectory table when
    /// it records none (or one this version does not know).
    pub fn table_spec(&self) -> &'static crate::table::schema::TableSpec {
        table_spec_of(&self.metadata)
    }

    /// Total rows over all part files.
    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    /// Whether the file has a column.
    pub fn has_column(&self, name: &str) -> bool {
        self.file_schema.field_with_name(name).is_ok()
    }

    /// The files read, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Read every remaining batch into memory (for small tables: prompts, model-stage inputs).
    pub fn read_all(self) -> Result<Vec<RecordBatch>> {
        self.collect()
    }

    fn open_next(&mut self) -> Result<bool> {
        let Some(f) = self.files.get(self.next_file).cloned() else {
            return Ok(false);
        };
        self.next_file += 1;
        let mut b = builder(&f)?;
        if !self.dictionaries.is_empty() || !self.views.is_empty() {
            let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
            let fields: Vec<Field> = b
                .schema()
                .fields()
                .iter()
                .map(|fld| {
                    let fld = fld.as_ref().clone();
                    let name = fld.name();
                    if fld.data_type() != &DataType::Utf8 {
                        fld
                    } else if self.dictionaries.iter().any(|d| d == name) {
                        fld.with_data_type(dict.clone())
                    } else if self.views.iter().any(|d| d == name) {
                        fld.with_data_type(DataType::Utf8View)
                    } else {
                        fld
                    }
                })
                .collect();
            let hint = Arc::new(Schema::new_with_metadata(
                fields,
                b.schema().metadata().clone(),
            ));
            let meta = ArrowReaderMetadata::try_new(
                b.metadata().clone(),
                ArrowReaderOptions::new().with_schema(hint),
            )
            .with_context(|| format!("{}: cannot read Parquet data", f.display()))?;
            let file = File::open(&f).with_context(|| format!("{}: cannot open", f.display()))?;
            b = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta);
        }
        let b = match &self.columns {
            None => b,
            Some(cols) => {
                let idx: Vec<usize> = b
                    .schema()
                    .fields()
                    .iter()
                    .enumerate()
                    .filter(|(_, fld)| cols.iter().any(|c| c == fld.name()))
                    .map(|(i, _)| i)
                    .collect();
                let mask = ProjectionMask::roots(b.parquet_schema(), idx);
                b.with_projection(mask)
            }
        };
        let r = b
            .with_batch_size(READ_BATCH_ROWS)
            .build()
            .with_context(|| format!("{}: cannot read Parquet data", f.display()))?;
        self.current = Some(r);
        Ok(true)
    }
}

impl Iterator for Reader {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let _t = crate::trace::span("read batch");
        loop {
            if let Some(r) = &mut self.current {
                match r.next() {
                    Some(Ok(b)) => {
                        let first = self.rows_read;
                        self.rows_read += b.num_rows();
                        let b = normalize_batch(&b, |name| self.kept(name));
                        return Some(match self.spec {
                            Some(spec) => b.and_then(|b| {
                                super::coerce::coerce_batch(&b, spec, &self.display, first)
                            }),
                            None => b,
                        });
                    }
                    Some(Err(e)) => {
                        let f = self
                            .files
                            .get(self.next_file.saturating_sub(1))
                            .map(|p| p.display().to_string())
                            .unwrap_or_default();
                        return Some(Err(anyhow::Error::new(e)
                            .context(format!("{f}: corrupt or truncated Parquet data"))));
                    }
                    None => self.current = None,
                }
            }
            match self.open_next() {
                Ok(true) => continue,
                Ok(false) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// The table kind a file's metadata records (`rlcr.schema`); the trajectory table when it records
/// none (a table written by another tool) or one this version does not know.
fn table_spec_of(metadata: &BTreeMap<String, String>) -> &'static TableSpec {
    metadata
        .get("rlcr.schema")
        .and_then(|s| crate::table::schema::by_name(s))
        .unwrap_or(&crate::table::schema::TRAJECTORY)
}

/// A batch a stage decoded from a Parquet file itself (the row-preserving stages read row groups
/// directly), in the types a [`Reader`] yields: layouts normalised (dictionaries and string views
/// the stage asked for kept) and the columns of `spec` converted to its types
/// ([`super::coerce`]); its first row is row `first_row` of the table `file`.
pub fn as_read(
    b: &RecordBatch,
    spec: &TableSpec,
    file: &str,
    first_row: usize,
) -> Result<RecordBatch> {
    let b = normalize_batch(b, |_| true)?;
    super::coerce::coerce_batch(&b, spec, file, first_row)
}

/// The files behind an input path: the file itself, or a folder's `*.parquet` in name order.
pub fn input_files(path: &Path) -> Result<Vec<PathBuf>> {
    let md = std::fs::metadata(path)
        .with_context(|| format!("{}: cannot open input", path.display()))?;
    if md.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("{}: cannot list folder", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
            .filter(|p| {
                !p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        v.sort();
        if v.is_empty() {
            bail!("{}: folder holds no *.parquet files", path.display());
        }
        Ok(v)
    } else {
        Ok(vec![path.to_path_buf()])
    }
}

fn builder(f: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>> {
    check_parquet_file(f)?;
    let file = File::open(f).with_context(|| format!("{}: cannot open", f.display()))?;
    let len = file
        .metadata()
        .with_context(|| format!("{}: cannot stat", f.display()))?
        .len();
    let b = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a readable Parquet file (truncated or corrupt footer?): {e}",
            f.display()
        )
    })?;
    check_footer(f, b.metadata(), len)?;
    Ok(b)
}

/// The cheap checks before a Parquet reader opens `f`, with the messages people can act on: the
/// file is empty, or it does not start with the `PAR1` magic (not Parquet at all).
pub fn check_parquet_file(f: &Path) -> Result<()> {
    let mut head = File::open(f).with_context(|| format!("{}: cannot open", f.display()))?;
    let len = head
        .metadata()
        .with_context(|| format!("{}: cannot stat", f.display()))?
        .len();
    if len == 0 {
        bail!(
            "{}: the file is empty (0 bytes), not a Parquet file",
            f.display()
        );
    }
    let mut magic = [0u8; 4];
    if len < 12 || head.read_exact(&mut magic).is_err() || &magic != b"PAR1" {
        bail!(
            "{}: not a Parquet file (it does not start with the PAR1 magic bytes)",
            f.display()
        );
    }
    Ok(())
}

/// Reject a footer whose column chunks do not lie inside the file: the parquet crate asserts
/// (panics) on a negative offset or size when it reads such a chunk (found by fuzzing,
/// `fixtures/fuzz/parquet/`).
pub fn check_footer(
    f: &Path,
    md: &parquet::file::metadata::ParquetMetaData,
    len: u64,
) -> Result<()> {
    for (r, rg) in md.row_groups().iter().enumerate() {
        for c in rg.columns() {
            let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
            let size = c.compressed_size();
            let inside = start >= 0
                && size >= 0
                && c.data_page_offset() >= 0
                && (start as u64)
                    .checked_add(size as u64)
                    .is_some_and(|e| e <= len);
            if !inside {
                bail!(
                    "{}: corrupt Parquet footer: row group {r}, column `{}` claims bytes \
                     {start}..+{size} of a {len}-byte file",
                    f.display(),
                    c.column_path()
                );
            }
        }
    }
    Ok(())
}

/// The normalised form of a type: `LargeList`→`List`, `LargeUtf8`/`Utf8View`→`Utf8`, dictionaries
/// of strings → `Utf8`, recursively; a list's item field is named `item` (arrow's default, what
/// rlcr writes), whatever the writer called it: pyarrow's default Parquet writer, polars and
/// DuckDB write the Parquet format's compliant name `element`, and a table of such lists could
/// not be joined with rlcr's own rows.
pub fn normalized_type(dt: &DataType) -> DataType {
    match dt {
        DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::Dictionary(_, v) => normalized_type(v),
        DataType::LargeList(f) | DataType::List(f) | DataType::ListView(f) => {
            DataType::List(Arc::new(Field::new(
                Field::LIST_FIELD_DEFAULT_NAME,
                normalized_type(f.data_type()),
                f.is_nullable(),
            )))
        }
        DataType::Struct(fs) => DataType::Struct(
            fs.iter()
                .map(|f| normalized_field(f))
                .collect::<Vec<Field>>()
                .into(),
        ),
        other => other.clone(),
    }
}

fn normalized_field(f: &Field) -> Field {
    Field::new(f.name(), normalized_type(f.data_type()), f.is_nullable())
}

fn normalized_schema(s: &SchemaRef) -> SchemaRef {
    Arc::new(Schema::new(
        s.fields()
            .iter()
            .map(|f| normalized_field(f))
            .collect::<Vec<Field>>(),
    ))
}

/// `b` with its columns' types normalised ([`normalized_type`]), except the dictionaries and
/// string views of the columns `keep` names.
fn normalize_batch(b: &RecordBatch, keep: impl Fn(&str) -> bool) -> Result<RecordBatch> {
    let schema = b.schema();
    // the two forms a stage may ask for and [`super::cols::StrCol`] reads as they are
    let kept_form = |t: &DataType| match t {
        DataType::Dictionary(k, v) => **k == DataType::Int32 && **v == DataType::Utf8,
        t => *t == DataType::Utf8View,
    };
    let want = |f: &Field| match f.data_type() {
        t if kept_form(t) && keep(f.name()) => t.clone(),
        t => normalized_type(t),
    };
    if schema.fields().iter().all(|f| want(f) == *f.data_type()) {
        return Ok(b.clone());
    }
    let mut cols: Vec<ArrayRef> = Vec::with_capacity(b.num_columns());
    let mut fields: Vec<Field> = Vec::with_capacity(b.num_columns());
    for (f, c) in schema.fields().iter().zip(b.columns()) {
        let want = want(f);
        fields.push(Field::new(f.name(), want.clone(), f.is_nullable()));
        if want == *f.data_type() {
            cols.push(c.clone());
        } else {
            cols.push(
                arrow::compute::cast(c.as_ref(), &want)
                    .with_context(|| format!("column `{}`: cannot convert type", f.name()))?,
            );
        }
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
}

/// How a Parquet file is encoded. [`writer_properties`] is the one place that turns this into
/// compression, dictionary, statistics and row-group settings for everything rlcr writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Whole tables ([`Writer`]): zstd level 3, Parquet's dictionaries and statistics, row
    /// groups of [`ROW_GROUP_ROWS`].
    Table,
    /// The score columns a row-preserving stage encodes beside copied chunks (`score`): zstd 1,
    /// no dictionaries (plain + zstd compresses these scalars about as well, without hashing
    /// every value; measured), statistics kept (people filter on rewards).
    Scalars,
    /// Per-token columns encoded beside copied chunks (`advantage`): zstd 1, no dictionaries
    /// (interning every float of a token list would cost more than the stage's math), no
    /// statistics (min/max of token lists help no query), 32k-value write batches.
    TokenLists,
}

/// The writer properties for `enc`, with `kv` as the file's key-value metadata.
pub fn writer_properties(enc: Encoding, kv: Option<Vec<KeyValue>>) -> Result<WriterProperties> {
    use parquet::file::properties::EnabledStatistics;
    let b = WriterProperties::builder().set_key_value_metadata(kv);
    Ok(match enc {
        Encoding::Table => b
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS)),
        Encoding::Scalars => b
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
            .set_dictionary_enabled(false),
        Encoding::TokenLists => b
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
            .set_dictionary_enabled(false)
            .set_statistics_enabled(EnabledStatistics::None)
            .set_write_batch_size(32 * 1024),
    }
    .build())
}

/// A Parquet table writer: zstd, row groups of [`ROW_GROUP_ROWS`], rlcr metadata, atomic.
pub struct Writer {
    atomic: AtomicFile,
    writer: Option<ArrowWriter<File>>,
    schema: SchemaRef,
    rows: usize,
}

impl Writer {
    /// Start writing `out` with `schema`. Refuses an `out` that is one of `meta.inputs`.
    pub fn create(out: &Path, schema: SchemaRef, meta: &Meta) -> Result<Self> {
        let inputs: Vec<&Path> = meta.inputs.iter().map(|p| p.as_path()).collect();
        check_distinct(&inputs, out)?;
        for i in &inputs {
            if let Ok(files) = input_files(i) {
                let fs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
                check_distinct(&fs, out)?;
            }
        }
        let mut atomic = AtomicFile::create(out)?;
        let props = writer_properties(Encoding::Table, Some(meta.key_values()))?;
        let file = atomic.take()?;
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props))
            .with_context(|| format!("{}: cannot start Parquet writer", out.display()))?;
        Ok(Writer {
            atomic,
            writer: Some(writer),
            schema,
            rows: 0,
        })
    }

    /// The schema being written.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Append a batch (its schema must equal the writer's).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let w = self
            .writer
            .as_mut()
            .context("internal error: writer already finished")?;
        if batch.schema().fields() != self.schema.fields() {
            bail!(
                "internal error: batch schema {:?} differs from the table schema {:?}",
                batch.schema(),
                self.schema
            );
        }
        let _t = crate::trace::span_with("write batch", || vec![("rows", batch.num_rows().into())]);
        w.write(batch).context("writing Parquet batch")?;
        self.rows += batch.num_rows();
        slow_write_hook();
        Ok(())
    }

    /// Rows written so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Close the Parquet file, fsync, and rename it into place.
    pub fn finish(mut self) -> Result<usize> {
        let _t = crate::trace::span("finish table (flush, fsync, rename)");
        let w = self
            .writer
            .take()
            .context("internal error: writer already finished")?;
        let file = w.into_inner().context("finishing Parquet file")?;
        let rows = self.rows;
        self.atomic.commit_file(file)?;
        Ok(rows)
    }
}

/// Append `batch` to `writer`, creating the output file on the first batch (with the batch's
/// schema): stages that stream their output and write nothing when no row was produced.
pub fn write_lazily(
    writer: &mut Option<Writer>,
    out: &Path,
    meta: &Meta,
    batch: &RecordBatch,
) -> Result<()> {
    let w = match writer {
        Some(w) => w,
        None => writer.insert(Writer::create(out, batch.schema(), meta)?),
    };
    w.write(batch)
}

/// Write a whole table in one go.
pub fn write_table(
    out: &Path,
    schema: SchemaRef,
    batches: &[RecordBatch],
    meta: &Meta,
) -> Result<usize> {
    let mut w = Writer::create(out, schema, meta)?;
    for b in batches {
        w.write(b)?;
    }
    w.finish()
}

/// Concatenate batches into one (empty schema-shaped batch when none).
pub fn concat(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<RecordBatch> {
    Ok(arrow::compute::concat_batches(schema, batches)?)
}

/// Length of an array as a helper for generic code.
pub fn len(a: &dyn Array) -> usize {
    a.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, StringArray};

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec!["x", "y", "z"])),
            ],
        )
        .unwrap()
    }

    fn meta() -> Meta {
        Meta {
            schema_name: "rlcr.test".into(),
            schema_version: 1,
            stage: "test".into(),
            config: serde_json::json!({"b": 2, "a": 1}),
            inputs: vec![PathBuf::from("in.parquet")],
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn metadata_round_trip_and_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("t.parquet");
        let b = batch();
        write_table(&out, b.schema(), std::slice::from_ref(&b), &meta()).unwrap();
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let r = Reader::open(&out).unwrap();
        let md = r.metadata().clone();
        assert_eq!(md["rlcr.schema"], "rlcr.test");
        assert_eq!(md["rlcr.schema_version"], "1");
        assert_eq!(md["rlcr.stage"], "test");
        assert_eq!(md["rlcr.config"], r#"{"a":1,"b":2}"#);
        assert_eq!(md["rlcr.inputs"], r#"["in.parquet"]"#);
        assert_eq!(md["rlcr.version"], crate::VERSION);
        let switches: serde_json::Value =
            serde_json::from_str(&md["rlcr.switches"]).expect("switches are JSON");
        assert_eq!(switches, crate::switches::get().recorded_json());
        assert_eq!(r.num_rows(), 3);
        let got = r.read_all().unwrap();
        assert_eq!(got, vec![b]);
        // No temp file remains.
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn same_bytes_twice() {
        let d = tempfile::tempdir().unwrap();
        let b = batch();
        let (p1, p2) = (d.path().join("1.parquet"), d.path().join("2.parquet"));
        write_table(&p1, b.schema(), std::slice::from_ref(&b), &meta()).unwrap();
        write_table(&p2, b.schema(), std::slice::from_ref(&b), &meta()).unwrap();
        assert_eq!(std::fs::read(p1).unwrap(), std::fs::read(p2).unwrap());
    }

    #[test]
    fn failed_write_leaves_previous_output() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("t.parquet");
        std::fs::write(&out, b"previous").unwrap();
        {
            let b = batch();
            let mut w = Writer::create(&out, b.schema(), &meta()).unwrap();
            w.write(&b).unwrap();
            // dropped without finish: an error path
        }
        assert_eq!(std::fs::read(&out).unwrap(), b"previous");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn stale_temp_is_removed() {
        let d = tempfile::tempdir().unwrap();
        let stale = d.path().join(".t.parquet.rlcr-tmp-4000000000");
        std::fs::write(&stale, b"junk").unwrap();
        let out = d.path().join("t.parquet");
        let b = batch();
        write_table(&out, b.schema(), &[b], &meta()).unwrap();
        assert!(!stale.exists());
    }

    #[test]
    fn refuses_output_equal_to_input_even_through_links() {
        let d = tempfile::tempdir().unwrap();
        let input = d.path().join("in.parquet");
        let b = batch();
        let mut m = meta();
        m.inputs = vec![];
        write_table(&input, b.schema(), std::slice::from_ref(&b), &m).unwrap();
        let link = d.path().join("link.parquet");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let hard = d.path().join("hard.parquet");
        std::fs::hard_link(&input, &hard).unwrap();
        m.inputs = vec![input.clone()];
        for out in [&input, &link, &hard] {
            let e = write_table(out, b.schema(), std::slice::from_ref(&b), &m).unwrap_err();
            assert!(
                format!("{e:#}").contains("never modifies an input"),
                "{e:#}"
            );
        }
        let rel = d.path().join(".").join("in.parquet");
        assert!(write_table(&rel, b.schema(), std::slice::from_ref(&b), &m).is_err());
    }

    #[test]
    fn not_parquet_empty_truncated() {
        let d = tempfile::tempdir().unwrap();
        let empty = d.path().join("e.parquet");
        std::fs::write(&empty, b"").unwrap();
        let e = Reader::open(&empty).err().unwrap();
        assert!(format!("{e:#}").contains("empty"), "{e:#}");
        let text = d.path().join("t.parquet");
        std::fs::write(&text, b"hello, world, this is csv\n").unwrap();
        let e = Reader::open(&text).err().unwrap();
        assert!(format!("{e:#}").contains("not a Parquet file"), "{e:#}");
        let good = d.path().join("g.parquet");
        let b = batch();
        write_table(&good, b.schema(), &[b], &meta()).unwrap();
        let bytes = std::fs::read(&good).unwrap();
        let trunc = d.path().join("tr.parquet");
        std::fs::write(&trunc, &bytes[..bytes.len() / 2]).unwrap();
        let e = Reader::open(&trunc).err().unwrap();
        assert!(format!("{e:#}").contains("tr.parquet"), "{e:#}");
    }

    /// Fuzzing found a footer with a negative column offset, on which the parquet crate panics
    /// while reading; the reader refuses it when it opens the file.
    #[test]
    fn footer_with_a_negative_offset_is_an_error() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/fuzz/parquet/crash-negative-column-offset.parquet");
        let e = Reader::open(&p).err().expect("an error");
        assert!(format!("{e:#}").contains("corrupt Parquet footer"), "{e:#}");
    }

    #[test]
    fn large_types_are_normalised() {
        use arrow::array::{LargeListArray, LargeStringArray};
        use arrow::datatypes::Int32Type;
        let d = tempfile::tempdir().unwrap();
        let ll = LargeListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            Some(vec![]),
        ]);
        let ls = LargeStringArray::from(vec!["a", "b"]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("ids", ll.data_type().clone(), false),
            Field::new("s", DataType::LargeUtf8, false),
        ]));
        let b = RecordBatch::try_new(schema.clone(), vec![Arc::new(ll), Arc::new(ls)]).unwrap();
        let p = d.path().join("l.parquet");
        write_table(&p, schema, &[b], &meta()).unwrap();
        let r = Reader::open(&p).unwrap();
        assert!(matches!(r.schema().field(0).data_type(), DataType::List(_)));
        assert_eq!(r.schema().field(1).data_type(), &DataType::Utf8);
        let want = r.schema();
        let got = r.read_all().unwrap();
        assert_eq!(got[0].column(0).data_type(), want.field(0).data_type());
    }

    /// A table from another tool (no rlcr metadata: read as a trajectory table) with an int64
    /// `answer_idx`: read as int32, its schema too, unless asked as written; a value beyond int32
    /// in a later batch names the file and its row counted over the whole table.
    #[test]
    fn wide_integers_read_as_the_schema_type() {
        use arrow::array::Int64Array;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("w.parquet");
        let n = READ_BATCH_ROWS + 100;
        let write = |vals: Vec<i64>| {
            let col: ArrayRef = Arc::new(Int64Array::from(vals));
            let b = RecordBatch::try_from_iter_with_nullable([
                ("answer_idx", col.clone(), true),
                ("mine", col, true),
            ])
            .unwrap();
            let mut w = ArrowWriter::try_new(File::create(&p).unwrap(), b.schema(), None).unwrap();
            w.write(&b).unwrap();
            w.close().unwrap();
        };
        write((0..n as i64).collect());
        let r = Reader::open(&p).unwrap();
        assert_eq!(r.schema().field(0).data_type(), &DataType::Int32);
        assert_eq!(r.file_schema().field(1).data_type(), &DataType::Int64);
        let got = r.read_all().unwrap();
        assert_eq!(got[0].column(0).data_type(), &DataType::Int32);
        assert_eq!(got.iter().map(|b| b.num_rows()).sum::<usize>(), n);
        let r = Reader::open(&p).unwrap().as_written();
        assert_eq!(r.schema().field(0).data_type(), &DataType::Int64);
        assert_eq!(
            r.read_all().unwrap()[0].column(0).data_type(),
            &DataType::Int64
        );

        let mut vals: Vec<i64> = (0..n as i64).collect();
        vals[READ_BATCH_ROWS + 7] = 1 << 33;
        write(vals);
        let e = Reader::open(&p).unwrap().read_all().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}, row {}, column `answer_idx`: value 8589934592 does not fit int32",
                p.display(),
                READ_BATCH_ROWS + 7
            )
        );
        // as written: the value is there to read
        Reader::open(&p).unwrap().as_written().read_all().unwrap();
    }

    /// pyarrow, polars and DuckDB name a list's item `element` (Parquet's compliant layout); the
    /// reader gives arrow's `item`, the name of every list rlcr builds, so the two can be joined.
    #[test]
    fn compliant_list_item_names_are_normalised() {
        use arrow::array::{Int32Builder, ListArray, ListBuilder};
        let d = tempfile::tempdir().unwrap();
        let element = Arc::new(Field::new("element", DataType::Int32, true));
        let mut lb = ListBuilder::new(Int32Builder::new()).with_field(element.clone());
        lb.append_value([Some(7), None, Some(9)]);
        lb.append_value([]);
        let ids: ListArray = lb.finish();
        // A list of lists, to check the rename recurses.
        let inner = ListArray::new(
            element.clone(),
            ids.offsets().clone(),
            ids.values().clone(),
            None,
        );
        let outer_field = Arc::new(Field::new("element", inner.data_type().clone(), true));
        let nested = ListArray::new(
            outer_field,
            arrow::buffer::OffsetBuffer::from_lengths([1, 1]),
            Arc::new(inner),
            None,
        );
        let schema = Arc::new(Schema::new(vec![
            Field::new("ids", ids.data_type().clone(), false),
            Field::new("nested", nested.data_type().clone(), false),
        ]));
        let b =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(nested)]).unwrap();
        let p = d.path().join("e.parquet");
        write_table(&p, schema, &[b], &meta()).unwrap();
        // The file itself keeps the writer's name (the test would prove nothing otherwise).
        let file_schema = builder(&p).unwrap().schema().clone();
        assert!(format!("{:?}", file_schema.field(0).data_type()).contains("\"element\""));
        let r = Reader::open(&p).unwrap();
        let item = |t: DataType| DataType::List(Arc::new(Field::new_list_field(t, true)));
        assert_eq!(r.schema().field(0).data_type(), &item(DataType::Int32));
        assert_eq!(
            r.schema().field(1).data_type(),
            &item(item(DataType::Int32))
        );
        let got = r.read_all().unwrap();
        assert_eq!(got[0].schema().field(0).data_type(), &item(DataType::Int32));
        assert_eq!(
            got[0].schema().field(1).data_type(),
            &item(item(DataType::Int32))
        );
        let ids = got[0]
            .column(0)
            .as_any()
            .downcast_ref::<ListArray>()
            .unwrap();
        let v0 = ids.value(0);
        let v0 = v0
            .as_any()
            .downcast_ref::<arrow::array::Int32Array>()
            .unwrap();
        assert_eq!(v0.iter().collect::<Vec<_>>(), vec![Some(7), None, Some(9)]);
        assert_eq!(ids.value(1).len(), 0);
        // Joins with a list rlcr builds (arrow's default item name).
        let mine =
            ListArray::from_iter_primitive::<arrow::datatypes::Int32Type, _, _>(vec![Some(vec![
                Some(1),
            ])]);
        assert_eq!(mine.data_type(), got[0].schema_ref().field(0).data_type());
    }

    #[test]
    fn folder_of_parts() {
        let d = tempfile::tempdir().unwrap();
        let parts = d.path().join("parts");
        let b = batch();
        for part in ["p1.parquet", "p0.parquet"] {
            write_table(
                &parts.join(part),
                b.schema(),
                std::slice::from_ref(&b),
                &meta(),
            )
            .unwrap();
        }
        let r = Reader::open(&parts).unwrap();
        assert_eq!(r.num_rows(), 6);
        assert_eq!(r.read_all().unwrap().len(), 2);
        let r = Reader::open_columns(&parts, &["s"]).unwrap();
        let got = r.read_all().unwrap();
        assert_eq!(got[0].num_columns(), 1);
    }
}
