//! Per-row lengths of list columns read from their Parquet repetition and definition levels
//! alone: the values are never decoded.
//!
//! A stage that only needs to know how long each row's token list is (the [`Validator`]'s length
//! and span rules, in `score`) would otherwise decode every token id and log-prob into Arrow
//! arrays to look at their offsets; on a 1M-row table that was most of the validation pass. Here
//! only the level runs of each data page are read: a v2 page keeps them uncompressed, a v1 page's
//! lead its body and are decompressed alone (zstd; other codecs decompress the whole page).
//!
//! Scope: a list of a primitive (`list<int32>`, `list<float32>`, …: one leaf, one repeated level)
//! in data pages v1 or v2 with RLE levels (what every current writer produces). Anything else —
//! deeper nesting, the deprecated BIT_PACKED level encoding — is [`Unsupported`], and the caller
//! decodes the column the ordinary way.
//!
//! [`Validator`]: super::Validator
use std::fs::File;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use parquet::basic::{Compression, Encoding, Repetition};
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::serialized_reader::SerializedPageReader;

use super::splice::Part;

mod pages;
mod rle;
use pages::raw_pages;
use rle::{bit_width, decode_rle, prefixed, row_starts};

/// This column or page cannot be read by levels alone (decode it instead).
#[derive(Debug)]
pub struct Unsupported(pub String);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "list lengths by levels: {}", self.0)
    }
}

impl std::error::Error for Unsupported {}

/// The lengths of one list column's rows; `null[i]` where row `i` is a null list (only for a
/// column whose list may be null).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Lengths {
    pub len: Vec<u32>,
    pub null: Option<Vec<bool>>,
}

/// Where a list column's single leaf is, and the definition levels that matter.
#[derive(Clone, Copy, Debug)]
struct Leaf {
    index: usize,
    max_def: i16,
    /// A level at or above this is an element (present or null) of the list.
    element_def: i16,
    /// A level below this is a null list (0 when the list cannot be null).
    list_def: i16,
}

fn leaf(part: &Part, column: &str) -> std::result::Result<Leaf, Unsupported> {
    let descr = part.meta.metadata().file_metadata().schema_descr();
    let leaves: Vec<usize> = (0..descr.num_columns())
        .filter(|&i| descr.column(i).path().parts().first().map(String::as_str) == Some(column))
        .collect();
    let [index] = leaves[..] else {
        return Err(Unsupported(format!(
            "`{column}` is not a list of a primitive"
        )));
    };
    let c = descr.column(index);
    if c.max_rep_level() != 1 {
        return Err(Unsupported(format!(
            "`{column}` is not a list of a primitive"
        )));
    }
    let max_def = c.max_def_level();
    let element_def = match c.self_type().get_basic_info().repetition() {
        Repetition::OPTIONAL => max_def - 1,
        _ => max_def,
    };
    // the list itself is optional when its root group is
    let root = descr.get_column_root(index);
    let list_def = match root.get_basic_info().repetition() {
        Repetition::OPTIONAL => 1,
        _ => 0,
    };
    if element_def < 1 || list_def >= element_def {
        return Err(Unsupported(format!("`{column}`: unexpected levels")));
    }
    Ok(Leaf {
        index,
        max_def,
        element_def,
        list_def,
    })
}

/// Whether `column` of `part` can be read by levels.
pub fn supported(part: &Part, column: &str) -> bool {
    leaf(part, column).is_ok()
}

/// The row lengths of list `column` in row group `rg` of `part`. Errors are either
/// [`Unsupported`] (decode instead) or a corrupt file.
///
/// Column chunks compressed with zstd (what rlcr writes) or not at all are read page by page from
/// their bytes ([`raw_pages`]): a v2 page's levels are read where they lie, uncompressed, and a v1
/// page is decompressed only as far as its level blocks reach (they lead the page; the values,
/// most of it, are never decompressed). Other codecs go through the parquet crate's page reader,
/// which decompresses whole pages.
pub fn row_group_lengths(part: &Part, rg: usize, column: &str) -> Result<Lengths> {
    let lf = leaf(part, column)?;
    let meta = part.meta.metadata().row_group(rg).column(lf.index);
    let raw = matches!(
        meta.compression(),
        Compression::UNCOMPRESSED | Compression::ZSTD(_)
    );
    lengths_by(part, rg, column, raw.then_some(FRONT))
}

/// Bytes of a v1 page read at first ([`raw_pages`] reads more when its levels reach further).
const FRONT: u64 = 64 * 1024;

/// [`row_group_lengths`] with the page source chosen: the raw pages reading `front` bytes of a
/// page at first, or (`None`) the parquet crate's page reader (every codec; the tests compare the
/// two).
fn lengths_by(part: &Part, rg: usize, column: &str, raw: Option<u64>) -> Result<Lengths> {
    let lf = leaf(part, column)?;
    let rows = part.rg_rows(rg);
    let meta = part.meta.metadata().row_group(rg).column(lf.index);
    let corrupt = || {
        format!(
            "{}: corrupt or truncated Parquet data in row group {rg}, column `{column}`",
            part.path.display()
        )
    };
    let file = File::open(&part.path)
        .with_context(|| format!("{}: cannot reopen", part.path.display()))?;
    let mut count = Count::new(lf, rows);
    if let Some(front) = raw {
        raw_pages(&file, meta, column, front, &mut |n, rep, def| {
            count.page(n, rep, def)
        })
        .with_context(corrupt)?;
    } else {
        let mut pages = SerializedPageReader::new(Arc::new(file), meta, rows, None)
            .with_context(|| format!("{}: cannot read `{column}`", part.path.display()))?;
        while let Some(page) = pages.get_next_page().with_context(corrupt)? {
            // the page's repetition and definition level blocks
            match &page {
                Page::DictionaryPage { .. } => continue,
                Page::DataPage {
                    buf,
                    num_values,
                    def_level_encoding,
                    rep_level_encoding,
                    ..
                } => {
                    let rle = *def_level_encoding == Encoding::RLE
                        && *rep_level_encoding == Encoding::RLE;
                    rle_levels(rle, column)?;
                    let (r, d) = v1_blocks(buf)?;
                    count.page(*num_values as usize, r, d)
                }
                Page::DataPageV2 {
                    buf,
                    num_values,
                    def_levels_byte_len,
                    rep_levels_byte_len,
                    ..
                } => {
                    let (rl, dl) = (*rep_levels_byte_len as usize, *def_levels_byte_len as usize);
                    let (r, d) = v2_blocks(buf, rl, dl)?;
                    count.page(*num_values as usize, r, d)
                }
            }
            .with_context(corrupt)?;
        }
    }
    count.finish(part, rg, column)
}

/// Levels in another encoding than RLE (the deprecated BIT_PACKED) are [`Unsupported`].
fn rle_levels(rle: bool, column: &str) -> Result<()> {
    if !rle {
        return Err(Unsupported(format!("`{column}`: levels not RLE-encoded")).into());
    }
    Ok(())
}

/// A v1 page's repetition and definition level blocks (each a 4-byte length, then the RLE runs),
/// from the start of its decompressed body.
fn v1_blocks(buf: &[u8]) -> Result<(&[u8], &[u8])> {
    let (r, rest) = prefixed(buf)?;
    let (d, _) = prefixed(rest)?;
    Ok((r, d))
}

/// A v2 page's repetition and definition level blocks: the first `rep` and next `def` bytes of
/// its body, never compressed.
fn v2_blocks(buf: &[u8], rep: usize, def: usize) -> Result<(&[u8], &[u8])> {
    let Some(levels) = buf.get(..rep + def) else {
        bail!(
            "v2 page levels of {} bytes in a {}-byte page",
            rep + def,
            buf.len()
        );
    };
    Ok(levels.split_at(rep))
}

/// Row lengths counted page by page from the level blocks.
struct Count {
    lf: Leaf,
    rows: usize,
    out: Lengths,
    def_width: u8,
    /// The row being counted: its length so far (none before the first row).
    open: Option<u32>,
    rep: Vec<u8>,
    def: Vec<u8>,
    starts: Vec<u32>,
}

impl Count {
    fn new(lf: Leaf, rows: usize) -> Self {
        Count {
            lf,
            rows,
            out: Lengths {
                len: Vec::with_capacity(rows),
                null: (lf.list_def > 0).then(|| Vec::with_capacity(rows)),
            },
            def_width: bit_width(lf.max_def),
            open: None,
            rep: Vec::new(),
            def: Vec::new(),
            starts: Vec::new(),
        }
    }

    /// One data page of `n` levels, its repetition and definition level blocks.
    fn page(&mut self, n: usize, rep_buf: &[u8], def_buf: &[u8]) -> Result<()> {
        let lf = self.lf;
        let uniform_def = decode_rle(def_buf, self.def_width, n, &mut self.def, true)?;
        if n == 0 {
            return Ok(());
        }
        let out = &mut self.out;
        if uniform_def.is_some_and(|d| d as i16 >= lf.element_def) {
            // every level an element (no null or empty lists, no null elements): the common
            // case, where only the row starts (repetition level 0) matter, read from the packed
            // bits without expanding them
            let starts = &mut self.starts;
            row_starts(rep_buf, n, starts)?;
            if self.open.is_none() && starts.first() != Some(&0) {
                bail!("the first level of the column chunk does not start a row");
            }
            let mut prev = 0u32;
            let mut cur = self.open.unwrap_or(0);
            for &p in starts.iter() {
                cur += p - prev;
                if self.open.is_some() || p > 0 {
                    out.len.push(cur);
                }
                cur = 0;
                prev = p;
            }
            if let Some(nulls) = &mut out.null {
                nulls.resize(nulls.len() + starts.len(), false);
            }
            self.open = Some(cur + (n as u32 - prev));
            return Ok(());
        }
        decode_rle(rep_buf, 1, n, &mut self.rep, false)?;
        let rep = &self.rep;
        if self.open.is_none() && rep[0] != 0 {
            bail!("the first level of the column chunk does not start a row");
        }
        for (j, &r) in rep.iter().enumerate() {
            let d = match uniform_def {
                Some(d) => d,
                None => self.def[j],
            } as i16;
            if r == 0 {
                if let Some(c) = self.open {
                    out.len.push(c);
                }
                self.open = Some(0);
                if let Some(nulls) = &mut out.null {
                    nulls.push(d < lf.list_def);
                }
            }
            if d >= lf.element_def {
                self.open = self.open.map(|c| c + 1);
            }
        }
        Ok(())
    }

    /// The lengths, once every page was counted.
    fn finish(mut self, part: &Part, rg: usize, column: &str) -> Result<Lengths> {
        if let Some(c) = self.open {
            self.out.len.push(c);
        }
        let rows = self.rows;
        let out = self.out;
        if out.len.len() != rows || out.null.as_ref().is_some_and(|nl| nl.len() != rows) {
            bail!(
                "{}: row group {rg}, column `{column}` has {} rows, its metadata says {rows}",
                part.path.display(),
                out.len.len()
            );
        }
        Ok(out)
    }
}

/// Lengths of a list column over the whole input, served in row order for consecutive batches
/// (row groups are read as the batches reach them, and dropped once passed).
pub struct Stream<'a> {
    parts: &'a [Part],
    column: &'a str,
    /// Next row group to read: (part, row group).
    next: (usize, usize),
    /// Global row of `buf.len[0]`.
    start: usize,
    buf: Lengths,
}

impl<'a> Stream<'a> {
    /// A stream over `column` of `parts` (check [`supported`] first).
    pub fn new(parts: &'a [Part], column: &'a str) -> Self {
        let nullable = leaf(&parts[0], column).is_ok_and(|l| l.list_def > 0);
        Stream {
            parts,
            column,
            next: (0, 0),
            start: 0,
            buf: Lengths {
                len: Vec::new(),
                null: nullable.then(Vec::new),
            },
        }
    }

    /// Read up to global row `first + n` (calls must move forward: rows before `first` may be
    /// dropped).
    pub fn fill(&mut self, first: usize, n: usize) -> Result<()> {
        if first < self.start {
            bail!("internal: list lengths asked for rows already passed");
        }
        let passed = (first - self.start).min(self.buf.len.len());
        if passed > 0 && passed >= self.buf.len.len() / 2 {
            self.buf.len.drain(..passed);
            if let Some(nl) = &mut self.buf.null {
                nl.drain(..passed);
            }
            self.start += passed;
        }
        while self.start + self.buf.len.len() < first + n {
            let (pi, rg) = self.next;
            let Some(p) = self.parts.get(pi) else {
                bail!("internal: list lengths asked past the end of the table");
            };
            if rg >= p.row_groups() {
                self.next = (pi + 1, 0);
                continue;
            }
            let l = row_group_lengths(p, rg, self.column)?;
            self.buf.len.extend_from_slice(&l.len);
            match (&mut self.buf.null, l.null) {
                (Some(a), Some(b)) => a.extend_from_slice(&b),
                (None, None) => {}
                _ => bail!("internal: list nullability differs between parts"),
            }
            self.next = (pi, rg + 1);
        }
        Ok(())
    }

    /// Lengths (and null flags) of global rows `first..first + n`, after [`Stream::fill`].
    pub fn get(&self, first: usize, n: usize) -> (&[u32], Option<&[bool]>) {
        let a = first - self.start;
        (
            &self.buf.len[a..a + n],
            self.buf.null.as_deref().map(|nl| &nl[a..a + n]),
        )
    }
}

#[cfg(test)]
mod tests;
