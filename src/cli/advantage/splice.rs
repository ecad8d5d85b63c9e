//! Write "the input plus a few new columns" without re-encoding the input.
//!
//! `rlcr advantage` passes every input column through unchanged, and a trajectory table's bulk is in
//! those columns (`context_ids`, `response_ids`, log-probs, messages). Decoding and re-encoding them
//! would cost far more than the advantage math, so the output is assembled row group by row group:
//! the input's encoded column chunks are copied byte for byte (`append_column`), and only the new
//! columns are encoded (with arrow-rs' `ArrowColumnWriter`) and appended after them. Output row
//! groups therefore match the input's row groups exactly.
//!
//! The output's Parquet schema reuses the input's schema nodes for the kept columns (so the copied
//! chunks' descriptors match bit for bit, whatever tool wrote the input) and converts only the new
//! fields; the Arrow schema hint (`ARROW:schema`) is rewritten to the input's Arrow schema plus the
//! new fields. Writes are atomic: a temporary file in the output's folder, fsync, permissions 0644,
//! rename; the temporary file is removed on any error.
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow::datatypes::{Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory,
};
use parquet::arrow::{encode_arrow_schema, ArrowSchemaConverter};
use parquet::basic::Compression;
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;

/// An output under construction.
pub struct Splice {
    input: File,
    in_meta: ArrowReaderMetadata,
    /// Input leaf columns to copy, in order.
    copy_leaves: Vec<usize>,
    writer: Option<SerializedFileWriter<File>>,
    factory: ArrowRowGroupWriterFactory,
    tmp: PathBuf,
    out: PathBuf,
}

impl Splice {
    /// Prepare `out` = the input (without the columns named in `new`) + the `new` fields.
    pub fn create(
        input: &Path,
        in_meta: &ArrowReaderMetadata,
        new: &[Field],
        out: &Path,
    ) -> Result<Splice> {
        let in_schema = in_meta.schema();
        let descr = in_meta.metadata().file_metadata().schema_descr();
        let root = descr.root_schema();
        let roots = root.get_fields();
        if roots.len() != in_schema.fields().len() {
            bail!(
                "the Parquet and Arrow schemas of {} disagree",
                input.display()
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

        let props = Arc::new(
            WriterProperties::builder()
                .set_compression(Compression::ZSTD(Default::default()))
                // Only the new columns are encoded here: float lists of repeated values compress
                // well with zstd, and dictionary interning would cost more than the rest together.
                .set_dictionary_enabled(false)
                .set_statistics_enabled(EnabledStatistics::None)
                .set_write_batch_size(32 * 1024)
                .set_key_value_metadata(Some(vec![KeyValue::new(
                    "ARROW:schema".to_string(),
                    encode_arrow_schema(&out_arrow),
                )]))
                .build(),
        );
        // Column writers for the new columns only, from a throw-away file writer over them.
        let probe =
            SerializedFileWriter::new(std::io::sink(), new_descr.root_schema_ptr(), props.clone())
                .context("preparing column writers")?;
        let factory = ArrowRowGroupWriterFactory::new(&probe, new_schema);
        drop(probe);

        let dir = match out.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = out
            .file_name()
            .ok_or_else(|| anyhow!("{}: not a file path", out.display()))?
            .to_string_lossy()
            .to_string();
        let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        let f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let writer = SerializedFileWriter::new(f, out_root, props)
            .with_context(|| format!("writing {}", out.display()));
        let writer = match writer {
            Ok(w) => w,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        Ok(Splice {
            input: File::open(input).with_context(|| format!("opening {}", input.display()))?,
            in_meta: in_meta.clone(),
            copy_leaves,
            writer: Some(writer),
            factory,
            tmp,
            out: out.to_path_buf(),
        })
    }

    /// Fresh encoders for the new columns of row group `rg` (one per leaf, in field order).
    pub fn column_writers(&self, rg: usize) -> Result<Vec<ArrowColumnWriter>> {
        self.factory
            .create_column_writers(rg)
            .context("creating column writers")
    }

    /// Write row group `rg`: the input's kept chunks copied, then the new `chunks`.
    pub fn write_row_group(&mut self, rg: usize, chunks: Vec<ArrowColumnChunk>) -> Result<()> {
        let out = self.out.display().to_string();
        let w = self
            .writer
            .as_mut()
            .ok_or_else(|| anyhow!("internal: writer closed"))?;
        let meta = self.in_meta.metadata().row_group(rg);
        let mut g = w
            .next_row_group()
            .with_context(|| format!("writing {out}"))?;
        for &c in &self.copy_leaves {
            let m = meta.column(c).clone();
            let close = ColumnCloseResult {
                bytes_written: m.compressed_size() as u64,
                rows_written: meta.num_rows() as u64,
                metadata: m,
                bloom_filter: None,
                column_index: None,
                offset_index: None,
            };
            g.append_column(&self.input, close)
                .with_context(|| format!("copying column {c} of row group {rg} into {out}"))?;
        }
        for ch in chunks {
            ch.append_to_row_group(&mut g)
                .with_context(|| format!("writing {out}"))?;
        }
        g.close().with_context(|| format!("writing {out}"))?;
        Ok(())
    }

    /// Close the file with the given key-value metadata, fsync and rename it into place.
    pub fn finish(mut self, kv: Vec<(String, String)>) -> Result<()> {
        let mut w = self
            .writer
            .take()
            .ok_or_else(|| anyhow!("internal: writer closed"))?;
        for (k, v) in kv {
            w.append_key_value_metadata(KeyValue::new(k, v));
        }
        let f = w
            .into_inner()
            .with_context(|| format!("writing {}", self.out.display()))?;
        f.sync_all()
            .with_context(|| format!("writing {}", self.out.display()))?;
        set_mode_644(&f);
        drop(f);
        std::fs::rename(&self.tmp, &self.out).with_context(|| {
            format!("renaming {} to {}", self.tmp.display(), self.out.display())
        })?;
        Ok(())
    }
}

#[cfg(unix)]
fn set_mode_644(f: &File) {
    use std::os::unix::fs::PermissionsExt;
    let _ = f.set_permissions(std::fs::Permissions::from_mode(0o644));
}

#[cfg(not(unix))]
fn set_mode_644(_: &File) {}

impl Drop for Splice {
    fn drop(&mut self) {
        if self.writer.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
