//! The row-preserving writer: "the input plus a few new columns" without re-encoding the input.
//! One engine for every stage whose output has its input's rows (`score`, `advantage`).
//!
//! A trajectory table's bulk is in columns such stages pass through unchanged (`context_ids`,
//! `response_ids`, log-probs, messages). Decoding and re-encoding them would cost far more than
//! the stage's own work, so the output is assembled row group by row group: the input's encoded
//! column chunks are copied byte for byte (`append_column`, 1 MiB reads), and only the new
//! columns are encoded (arrow-rs' `ArrowColumnWriter`, on any thread: [`Encoders`]) and spliced
//! in by the [`SpliceWriter`]. Output row groups match the input's row groups across all part
//! files of an input folder (in name order), and the output is one file. A stage that keeps only
//! some rows (a `--shard`) encodes every column of those row groups instead
//! ([`SpliceWriter::write_encoded_row_group`]).
//!
//! The output's Parquet schema reuses the input's schema nodes for the kept columns (so the
//! copied chunks' descriptors match whatever tool wrote the input) and converts only the new
//! fields ([`Layout`]). Input parts are opened with their footers checked against the file
//! length ([`open_parts`]). Writing goes through [`crate::fs::AtomicFile`]: a temp file beside
//! the output, renamed into place only when everything succeeded. Compression, statistics and
//! metadata come from the caller's [`super::io::writer_properties`].
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::datatypes::{Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory, ArrowWriterOptions,
};
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::{SchemaDescriptor, Type};

use super::schema::TableSpec;
use crate::table;

/// Buffer size for copying column chunks and writing the output: parquet's own `File` reader
/// and its writer both buffer 8 KiB, which turns a gigabyte of copying into a quarter of a
/// million system calls.
const COPY_BUFFER: usize = 1 << 20;

/// One part file of the input.
pub struct Part {
    pub path: PathBuf,
    /// Read by the writer for chunk copies; decoding threads open their own handles (a clone
    /// would share the file offset).
    pub file: File,
    pub meta: ArrowReaderMetadata,
    /// Row index of the part's first row in the whole input.
    pub first_row: u64,
}

impl Part {
    /// Rows of row group `rg`.
    pub fn rg_rows(&self, rg: usize) -> usize {
        self.meta.metadata().row_group(rg).num_rows().max(0) as usize
    }

    /// Number of row groups.
    pub fn row_groups(&self) -> usize {
        self.meta.metadata().num_row_groups()
    }

    /// Rows of the part.
    pub fn rows(&self) -> u64 {
        self.meta.metadata().file_metadata().num_rows().max(0) as u64
    }

    /// Row index of the first row of row group `rg` in the whole input.
    pub fn rg_first_row(&self, rg: usize) -> u64 {
        self.first_row + (0..rg).map(|i| self.rg_rows(i) as u64).sum::<u64>()
    }
}

/// Open every part file of `input` (a file or a folder) with its footer checked against the
/// file's length; they must share one Parquet schema.
pub fn open_parts(input: &Path) -> Result<Vec<Part>> {
    let mut parts: Vec<Part> = Vec::new();
    let mut first_row = 0u64;
    for path in table::io::input_files(input)? {
        table::io::check_parquet_file(&path)?;
        let file = File::open(&path).with_context(|| format!("{}: cannot open", path.display()))?;
        let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
            .with_context(|| format!("{}: not a readable Parquet file", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("{}: cannot stat", path.display()))?
            .len();
        table::io::check_footer(&path, meta.metadata(), len)?;
        if let Some(p0) = parts.first() {
            if p0
                .meta
                .metadata()
                .file_metadata()
                .schema_descr()
                .root_schema()
                != meta.metadata().file_metadata().schema_descr().root_schema()
            {
                bail!(
                    "{}: part file has a different schema from {}",
                    path.display(),
                    p0.path.display()
                );
            }
        }
        let part = Part {
            path,
            file,
            meta,
            first_row,
        };
        first_row += part.rows();
        parts.push(part);
    }
    if parts.is_empty() {
        bail!("{}: no Parquet files found", input.display());
    }
    Ok(parts)
}

/// Where the new columns go in the output schema.
#[derive(Clone, Copy)]
pub enum Placement {
    /// Each at its place in the table's canonical column order (`score`).
    Canonical(&'static TableSpec),
    /// After the kept input columns (`advantage`).
    Append,
}

/// Where an output root column comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Input root column index (copied).
    Copy(usize),
    /// Index into the new fields (encoded).
    New(usize),
}

/// The output schema: the kept input columns and the new ones, in output order.
pub struct Layout {
    pub sources: Vec<Source>,
    pub descr: SchemaDescriptor,
    pub arrow: SchemaRef,
    /// Leaf column indices of each input root column.
    pub input_leaves: Vec<Vec<usize>>,
    /// Leaf column indices of each output root column.
    pub output_leaves: Vec<Vec<usize>>,
    /// Input columns left out that no new column replaces.
    pub dropped: Vec<String>,
}

fn leaves_by_root(d: &SchemaDescriptor) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); d.root_schema().get_fields().len()];
    for leaf in 0..d.num_columns() {
        out[d.get_column_root_idx(leaf)].push(leaf);
    }
    out
}

impl Layout {
    /// The output of `part`'s schema without the columns named in `new` or `drop`, plus `new`
    /// placed by `placement`. `keep_metadata`: the output's Arrow schema keeps the input's
    /// schema-level metadata (as `advantage` always wrote it; `score` never did).
    pub fn new(
        part: &Part,
        new: &[Field],
        drop: &[&str],
        placement: Placement,
        keep_metadata: bool,
    ) -> Result<Layout> {
        let in_descr = part.meta.metadata().file_metadata().schema_descr();
        let in_arrow = part.meta.schema();
        let in_root = in_descr.root_schema();
        let in_fields = in_root.get_fields();
        if in_fields.len() != in_arrow.fields().len() {
            bail!(
                "{}: the Arrow and Parquet schemas disagree on the number of columns",
                part.path.display()
            );
        }
        let new_schema = Schema::new(new.to_vec());
        let new_descr = ArrowSchemaConverter::new()
            .convert(&new_schema)
            .context("converting the new columns to a Parquet schema")?;
        let new_types = new_descr.root_schema().get_fields();
        let mut dropped = Vec::new();
        let mut entries: Vec<(Source, Arc<Type>, Field)> = Vec::new();
        for (i, (pt, af)) in in_fields.iter().zip(in_arrow.fields()).enumerate() {
            let name = pt.name();
            let replaced = new.iter().any(|f| f.name() == name);
            if replaced || drop.contains(&name) {
                if !replaced {
                    dropped.push(name.to_string());
                }
                continue;
            }
            entries.push((Source::Copy(i), pt.clone(), af.as_ref().clone()));
        }
        for (j, f) in new.iter().enumerate() {
            let pos = match placement {
                Placement::Append => entries.len(),
                Placement::Canonical(spec) => {
                    let order = spec.order(f.name());
                    entries
                        .iter()
                        .position(|(_, t, _)| spec.order(t.name()) > order)
                        .unwrap_or(entries.len())
                }
            };
            entries.insert(pos, (Source::New(j), new_types[j].clone(), f.clone()));
        }
        let root = Type::group_type_builder(in_root.name())
            .with_fields(entries.iter().map(|(_, t, _)| t.clone()).collect())
            .build()
            .context("building the output schema")?;
        let descr = SchemaDescriptor::new(Arc::new(root));
        let fields: Vec<Field> = entries.iter().map(|(_, _, f)| f.clone()).collect();
        let arrow = Arc::new(if keep_metadata {
            Schema::new_with_metadata(fields, in_arrow.metadata().clone())
        } else {
            Schema::new(fields)
        });
        Ok(Layout {
            sources: entries.into_iter().map(|(s, _, _)| s).collect(),
            input_leaves: leaves_by_root(in_descr),
            output_leaves: leaves_by_root(&descr),
            descr,
            arrow,
            dropped,
        })
    }
}

/// Encoders of output row groups; used from any thread while the [`SpliceWriter`] writes.
pub struct Encoders {
    factory: ArrowRowGroupWriterFactory,
    layout: Arc<Layout>,
}

impl Encoders {
    /// Fresh encoders for the new columns of output row group `index`: one per leaf, in output
    /// order (the order [`SpliceWriter::write_row_group`] takes their chunks in).
    pub fn new_column_writers(&self, index: usize) -> Result<Vec<ArrowColumnWriter>> {
        let mut all: Vec<Option<ArrowColumnWriter>> =
            self.column_writers(index)?.into_iter().map(Some).collect();
        let mut out = Vec::new();
        for (k, src) in self.layout.sources.iter().enumerate() {
            if let Source::New(_) = src {
                for &leaf in &self.layout.output_leaves[k] {
                    out.push(
                        all.get_mut(leaf)
                            .and_then(Option::take)
                            .context("internal: no writer for an output leaf")?,
                    );
                }
            }
        }
        Ok(out)
    }

    /// Fresh encoders for every leaf of output row group `index`, in output order.
    pub fn column_writers(&self, index: usize) -> Result<Vec<ArrowColumnWriter>> {
        self.factory
            .create_column_writers(index)
            .context("creating column writers")
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
}

/// The output file under construction.
pub struct SpliceWriter {
    writer: Option<SerializedFileWriter<BufWriter<File>>>,
    atomic: Option<crate::fs::AtomicFile>,
    layout: Arc<Layout>,
    out: PathBuf,
}

/// Start `out` with `layout`: the file writer and the encoders of its row groups. `props` (from
/// [`super::io::writer_properties`]) carries the key-value metadata known up front; the Arrow
/// schema follows it, and [`SpliceWriter::finish`] appends the rest.
pub fn create(
    layout: Layout,
    props: WriterProperties,
    out: &Path,
) -> Result<(SpliceWriter, Encoders)> {
    let layout = Arc::new(layout);
    let mut atomic = crate::fs::AtomicFile::create(out)?;
    let file = BufWriter::with_capacity(COPY_BUFFER * 4, atomic.take()?);
    let aw = ArrowWriter::try_new_with_options(
        file,
        layout.arrow.clone(),
        ArrowWriterOptions::new()
            .with_properties(props)
            .with_parquet_schema(layout.descr.clone()),
    )
    .with_context(|| format!("{}: cannot start Parquet writer", out.display()))?;
    let (writer, factory) = aw.into_serialized_writer()?;
    Ok((
        SpliceWriter {
            writer: Some(writer),
            atomic: Some(atomic),
            layout: layout.clone(),
            out: out.to_path_buf(),
        },
        Encoders { factory, layout },
    ))
}

/// The input file as a [`parquet::file::reader::ChunkReader`] with large reads (for the
/// column-chunk copies).
struct CopySource<'a>(&'a File);

impl parquet::file::reader::Length for CopySource<'_> {
    fn len(&self) -> u64 {
        parquet::file::reader::Length::len(self.0)
    }
}

impl parquet::file::reader::ChunkReader for CopySource<'_> {
    type T = std::io::BufReader<File>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        use std::io::Seek;
        let mut f = self.0.try_clone()?;
        f.seek(std::io::SeekFrom::Start(start))?;
        Ok(std::io::BufReader::with_capacity(COPY_BUFFER, f))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        self.0.get_bytes(start, length)
    }
}

impl SpliceWriter {
    fn writer(&mut self) -> Result<&mut SerializedFileWriter<BufWriter<File>>> {
        self.writer.as_mut().context("internal: writer closed")
    }

    /// Write row group `rg` of `part` whole: its kept chunks copied, the new columns' `chunks`
    /// (from [`Encoders::new_column_writers`]) spliced in at their places.
    pub fn write_row_group(
        &mut self,
        part: &Part,
        rg: usize,
        chunks: Vec<ArrowColumnChunk>,
    ) -> Result<()> {
        let _t = crate::trace::span("splice: write row group (copy chunks)");
        let out = self.out.display().to_string();
        let layout = self.layout.clone();
        let meta = part.meta.metadata().row_group(rg);
        let mut g = self
            .writer()?
            .next_row_group()
            .with_context(|| format!("writing {out}"))?;
        let mut chunks = chunks.into_iter();
        for (k, src) in layout.sources.iter().enumerate() {
            match src {
                Source::Copy(root) => {
                    for &leaf in &layout.input_leaves[*root] {
                        let m = meta.column(leaf).clone();
                        let path = m.column_path().string();
                        let close = ColumnCloseResult {
                            bytes_written: m.compressed_size() as u64,
                            rows_written: meta.num_rows() as u64,
                            metadata: m,
                            bloom_filter: None,
                            column_index: None,
                            offset_index: None,
                        };
                        g.append_column(&CopySource(&part.file), close)
                            .with_context(|| {
                                format!(
                                    "{}: copying column `{path}` of row group {rg} into {out}",
                                    part.path.display()
                                )
                            })?;
                    }
                }
                Source::New(_) => {
                    for _ in &layout.output_leaves[k] {
                        chunks
                            .next()
                            .context("internal: a new column's chunk is missing")?
                            .append_to_row_group(&mut g)
                            .with_context(|| format!("writing {out}"))?;
                    }
                }
            }
        }
        if chunks.next().is_some() {
            bail!("internal: more chunks than new columns");
        }
        g.close().with_context(|| format!("writing {out}"))?;
        Ok(())
    }

    /// Write a row group whose every column was encoded (from [`Encoders::column_writers`]),
    /// for rows that are a selection of their input row group.
    pub fn write_encoded_row_group(&mut self, chunks: Vec<ArrowColumnChunk>) -> Result<()> {
        let out = self.out.display().to_string();
        if chunks.len() != self.layout.descr.num_columns() {
            bail!(
                "internal: {} chunks for {} columns",
                chunks.len(),
                self.layout.descr.num_columns()
            );
        }
        let mut g = self
            .writer()?
            .next_row_group()
            .with_context(|| format!("writing {out}"))?;
        for c in chunks {
            c.append_to_row_group(&mut g)
                .with_context(|| format!("writing {out}"))?;
        }
        g.close().with_context(|| format!("writing {out}"))?;
        Ok(())
    }

    /// Close the file with `kv` appended to its key-value metadata, fsync it and rename it into
    /// place.
    pub fn finish(mut self, kv: Vec<KeyValue>) -> Result<()> {
        let (Some(mut w), Some(atomic)) = (self.writer.take(), self.atomic.take()) else {
            bail!("internal: writer closed");
        };
        for k in kv {
            w.append_key_value_metadata(k);
        }
        let file = w
            .into_inner()
            .with_context(|| format!("{}: finishing Parquet file", self.out.display()))?;
        let file = file
            .into_inner()
            .map_err(|e| anyhow::anyhow!("{}: write failed: {}", self.out.display(), e.error()))?;
        atomic.commit_file(file)
    }
}
