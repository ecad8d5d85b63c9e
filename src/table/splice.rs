//! Write "the input plus a few new columns" without re-encoding the input.
//!
//! `rlcr advantage` passes every input column through unchanged, and a trajectory table's bulk is in
//! those columns (`context_ids`, `response_ids`, log-probs, messages). Decoding and re-encoding them
//! would cost far more than the advantage math, so the output is assembled row group by row group:
//! the input's encoded column chunks are copied byte for byte (`append_column`), and only the new
//! columns are encoded (arrow-rs' `ArrowColumnWriter`) and appended after them. Output row groups
//! therefore match the input's row groups exactly, across all part files of an input folder (in
//! name order), and the output is one file.
//!
//! The output's Parquet schema reuses the input's schema nodes for the kept columns (so the copied
//! chunks' descriptors match whatever tool wrote the input) and converts only the new fields; the
//! Arrow schema hint (`ARROW:schema`) becomes the input's Arrow schema plus the new fields. Writing
//! goes through [`crate::fs::AtomicFile`]: a temp file beside the output, renamed into place only when
//! everything succeeded.
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::datatypes::{Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory,
};
use parquet::arrow::{encode_arrow_schema, ArrowSchemaConverter};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::KeyValue;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;

use crate::table;

/// One part file of the input.
pub struct Part {
    pub path: PathBuf,
    pub file: File,
    pub meta: ArrowReaderMetadata,
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
}

/// Open every part file of `input`; they must share one Parquet schema.
pub fn open_parts(input: &Path) -> Result<Vec<Part>> {
    let mut parts: Vec<Part> = Vec::new();
    for path in table::io::input_files(input)? {
        let file = File::open(&path).with_context(|| format!("{}: cannot open", path.display()))?;
        let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
            .with_context(|| format!("{}: not a readable Parquet file", path.display()))?;
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
        parts.push(Part { path, file, meta });
    }
    Ok(parts)
}

/// An output under construction.
pub struct Splice {
    /// Input leaf columns to copy, in order.
    copy_leaves: Vec<usize>,
    writer: Option<SerializedFileWriter<File>>,
    atomic: Option<crate::fs::AtomicFile>,
    factory: ArrowRowGroupWriterFactory,
    out: PathBuf,
}

impl Splice {
    /// Prepare `out` = the input (without the columns named in `new`) + the `new` fields.
    pub fn create(parts: &[Part], new: &[Field], out: &Path) -> Result<Splice> {
        let Some(p0) = parts.first() else {
            bail!("internal: no input part");
        };
        let in_schema = p0.meta.schema();
        let descr = p0.meta.metadata().file_metadata().schema_descr();
        let root = descr.root_schema();
        let roots = root.get_fields();
        if roots.len() != in_schema.fields().len() {
            bail!(
                "{}: the Parquet and Arrow schemas disagree",
                p0.path.display()
            );
        }
        let keep: Vec<bool> = in_schema
            .fields()
            .iter()
            .map(|f| !new.iter().any(|n| n.name() == f.name()))
            .collect();
        let copy_leaves: Vec<usize> = (0..descr.num_columns())
            .filter(|&c| keep[descr.get_column_root_idx(c)])
            .collect();

        let new_schema = Arc::new(Schema::new(new.to_vec()));
        let new_descr = ArrowSchemaConverter::new()
            .convert(&new_schema)
            .context("converting the new columns to a Parquet schema")?;
        let mut fields: Vec<Arc<Type>> = roots
            .iter()
            .zip(&keep)
            .filter(|(_, &k)| k)
            .map(|(t, _)| t.clone())
            .collect();
        fields.extend(new_descr.root_schema().get_fields().iter().cloned());
        let out_root = Arc::new(
            Type::group_type_builder(root.name())
                .with_fields(fields)
                .build()
                .context("building the output schema")?,
        );
        let mut arrow_fields: Vec<Field> = in_schema
            .fields()
            .iter()
            .zip(&keep)
            .filter(|(_, &k)| k)
            .map(|(f, _)| f.as_ref().clone())
            .collect();
        arrow_fields.extend(new.iter().cloned());
        let out_arrow: SchemaRef = Arc::new(Schema::new_with_metadata(
            arrow_fields,
            in_schema.metadata().clone(),
        ));

        let props = Arc::new(table::io::writer_properties(
            table::io::Encoding::TokenLists,
            Some(vec![KeyValue::new(
                "ARROW:schema".to_string(),
                encode_arrow_schema(&out_arrow),
            )]),
        )?);
        // Column writers for the new columns only, from a throw-away file writer over them; their
        // descriptors equal those of the same fields in the output schema.
        let probe =
            SerializedFileWriter::new(std::io::sink(), new_descr.root_schema_ptr(), props.clone())
                .context("preparing column writers")?;
        let factory = ArrowRowGroupWriterFactory::new(&probe, new_schema);
        drop(probe);

        let mut atomic = crate::fs::AtomicFile::create(out)?;
        let f = atomic.take()?;
        let writer = SerializedFileWriter::new(f, out_root, props)
            .with_context(|| format!("{}: cannot start Parquet writer", out.display()))?;
        Ok(Splice {
            copy_leaves,
            writer: Some(writer),
            atomic: Some(atomic),
            factory,
            out: out.to_path_buf(),
        })
    }

    /// Fresh encoders for the new columns of output row group `index` (one per leaf, in field
    /// order).
    pub fn column_writers(&self, index: usize) -> Result<Vec<ArrowColumnWriter>> {
        self.factory
            .create_column_writers(index)
            .context("creating column writers")
    }

    /// Write row group `rg` of `part`: its kept chunks copied, then the new `chunks`.
    pub fn write_row_group(
        &mut self,
        part: &Part,
        rg: usize,
        chunks: Vec<ArrowColumnChunk>,
    ) -> Result<()> {
        let out = self.out.display().to_string();
        let Some(w) = self.writer.as_mut() else {
            bail!("internal: writer closed");
        };
        let meta = part.meta.metadata().row_group(rg);
        let mut g = w
            .next_row_group()
            .with_context(|| format!("writing {out}"))?;
        for &c in &self.copy_leaves {
            let m = meta.column(c).clone();
            let path = m.column_path().string();
            let close = ColumnCloseResult {
                bytes_written: m.compressed_size() as u64,
                rows_written: meta.num_rows() as u64,
                metadata: m,
                bloom_filter: None,
                column_index: None,
                offset_index: None,
            };
            g.append_column(&part.file, close).with_context(|| {
                format!(
                    "{}: copying column `{path}` of row group {rg} into {out}",
                    part.path.display()
                )
            })?;
        }
        for ch in chunks {
            ch.append_to_row_group(&mut g)
                .with_context(|| format!("writing {out}"))?;
        }
        g.close().with_context(|| format!("writing {out}"))?;
        Ok(())
    }

    /// Close the file with the given key-value metadata, fsync it and rename it into place.
    pub fn finish(mut self, kv: Vec<KeyValue>) -> Result<()> {
        let (Some(mut w), Some(atomic)) = (self.writer.take(), self.atomic.take()) else {
            bail!("internal: writer closed");
        };
        for k in kv {
            w.append_key_value_metadata(k);
        }
        let f = w
            .into_inner()
            .with_context(|| format!("writing {}", self.out.display()))?;
        atomic.commit_file(f)
    }
}
