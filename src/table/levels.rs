//! Per-row lengths of list columns read from their Parquet repetition and definition levels
//! alone: the values are never decoded.
//!
//! A stage that only needs to know how long each row's token list is (the [`Validator`]'s length
//! and span rules, in `score`) would otherwise decode every token id and log-prob into Arrow
//! arrays to look at their offsets; on a 1M-row table that was most of the validation pass. Here
//! each data page is decompressed (the levels sit inside it) and only its level runs are read.
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
use parquet::basic::{Encoding, Repetition};
use parquet::column::page::{Page, PageReader};
use parquet::file::serialized_reader::SerializedPageReader;

use super::splice::Part;

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
pub fn row_group_lengths(part: &Part, rg: usize, column: &str) -> Result<Lengths> {
    let lf = leaf(part, column)?;
    let rows = part.rg_rows(rg);
    let meta = part.meta.metadata().row_group(rg).column(lf.index);
    let file = File::open(&part.path)
        .with_context(|| format!("{}: cannot reopen", part.path.display()))?;
    let mut pages = SerializedPageReader::new(Arc::new(file), meta, rows, None)
        .with_context(|| format!("{}: cannot read `{column}`", part.path.display()))?;
    let corrupt = || {
        format!(
            "{}: corrupt or truncated Parquet data in row group {rg}, column `{column}`",
            part.path.display()
        )
    };
    let mut out = Lengths {
        len: Vec::with_capacity(rows),
        null: (lf.list_def > 0).then(|| Vec::with_capacity(rows)),
    };
    let (mut rep, mut def) = (Vec::new(), Vec::new());
    let def_width = bit_width(lf.max_def);
    // the row being counted: its length so far (none before the first row)
    let mut open: Option<u32> = None;
    let mut starts: Vec<u32> = Vec::new();
    while let Some(page) = pages.get_next_page().with_context(corrupt)? {
        // the page's repetition and definition level blocks
        let (n, rep_buf, def_buf) = match &page {
            Page::DictionaryPage { .. } => continue,
            Page::DataPage {
                buf,
                num_values,
                def_level_encoding,
                rep_level_encoding,
                ..
            } => {
                if *def_level_encoding != Encoding::RLE || *rep_level_encoding != Encoding::RLE {
                    return Err(Unsupported(format!("`{column}`: levels not RLE-encoded")).into());
                }
                let (r, rest) = prefixed(buf).with_context(corrupt)?;
                let (d, _) = prefixed(rest).with_context(corrupt)?;
                (*num_values as usize, r, d)
            }
            Page::DataPageV2 {
                buf,
                num_values,
                def_levels_byte_len,
                rep_levels_byte_len,
                ..
            } => {
                let (rl, dl) = (*rep_levels_byte_len as usize, *def_levels_byte_len as usize);
                if buf.len() < rl + dl {
                    bail!(corrupt());
                }
                (*num_values as usize, &buf[..rl], &buf[rl..rl + dl])
            }
        };
        let uniform_def =
            decode_rle(def_buf, def_width, n, &mut def, true).with_context(corrupt)?;
        if n == 0 {
            continue;
        }
        if uniform_def.is_some_and(|d| d as i16 >= lf.element_def) {
            // every level an element (no null or empty lists, no null elements): the common
            // case, where only the row starts (repetition level 0) matter, read from the packed
            // bits without expanding them
            row_starts(rep_buf, n, &mut starts).with_context(corrupt)?;
            if open.is_none() && starts.first() != Some(&0) {
                bail!(corrupt());
            }
            let mut prev = 0u32;
            let mut cur = open.unwrap_or(0);
            for &p in &starts {
                cur += p - prev;
                if open.is_some() || p > 0 {
                    out.len.push(cur);
                }
                cur = 0;
                prev = p;
            }
            if let Some(nulls) = &mut out.null {
                nulls.resize(nulls.len() + starts.len(), false);
            }
            open = Some(cur + (n as u32 - prev));
            continue;
        }
        decode_rle(rep_buf, 1, n, &mut rep, false).with_context(corrupt)?;
        if open.is_none() && rep[0] != 0 {
            bail!(corrupt());
        }
        for j in 0..n {
            let d = match uniform_def {
                Some(d) => d,
                None => def[j],
            } as i16;
            if rep[j] == 0 {
                if let Some(c) = open {
                    out.len.push(c);
                }
                open = Some(0);
                if let Some(nulls) = &mut out.null {
                    nulls.push(d < lf.list_def);
                }
            }
            if d >= lf.element_def {
                open = open.map(|c| c + 1);
            }
        }
    }
    if let Some(c) = open {
        out.len.push(c);
    }
    if out.len.len() != rows || out.null.as_ref().is_some_and(|nl| nl.len() != rows) {
        bail!(
            "{}: row group {rg}, column `{column}` has {} rows, its metadata says {rows}",
            part.path.display(),
            out.len.len()
        );
    }
    Ok(out)
}

/// The positions of the zeros among the first `n` repetition levels (width 1) of `buf` (the
/// RLE / bit-packed hybrid encoding): where the rows start.
fn row_starts(buf: &[u8], n: usize, starts: &mut Vec<u32>) -> Result<()> {
    starts.clear();
    let mut pos = 0usize; // byte in buf
    let mut at = 0usize; // level index
    while at < n {
        let mut header = 0u64;
        let mut shift = 0;
        loop {
            let Some(&b) = buf.get(pos) else {
                bail!("level data ends after {at} of {n} levels");
            };
            pos += 1;
            header |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 63 {
                bail!("level run header too long");
            }
        }
        if header & 1 == 1 {
            let groups = (header >> 1) as usize;
            let Some(packed) = buf.get(pos..pos + groups) else {
                bail!("bit-packed levels run past their block");
            };
            pos += groups;
            for &byte in packed {
                if at >= n {
                    break;
                }
                // zeros among this byte's levels that are within n
                let valid = if n - at >= 8 {
                    0xff
                } else {
                    (1u32 << (n - at)) - 1
                };
                let mut z = !(byte as u32) & valid;
                while z != 0 {
                    starts.push((at + z.trailing_zeros() as usize) as u32);
                    z &= z - 1;
                }
                at += 8;
            }
        } else {
            let count = (header >> 1) as usize;
            let Some(&v) = buf.get(pos) else {
                bail!("level run without its value");
            };
            pos += 1;
            let take = count.min(n - at);
            if v & 1 == 0 {
                starts.extend((at..at + take).map(|p| p as u32));
            }
            at += take;
        }
    }
    Ok(())
}

/// Bits of a level up to `max`.
fn bit_width(max: i16) -> u8 {
    (16 - (max as u16).leading_zeros()) as u8
}

/// A v1 page's level block: a 4-byte little-endian length, then that many bytes.
fn prefixed(buf: &[u8]) -> Result<(&[u8], &[u8])> {
    let Some(head) = buf.get(..4) else {
        bail!("level block shorter than its length prefix");
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let Some(block) = buf.get(4..4 + len) else {
        bail!("level block of {len} bytes runs past its page");
    };
    Ok((block, &buf[4 + len..]))
}

/// Decode `n` levels of `width` bits from Parquet's RLE / bit-packed hybrid encoding into `out`
/// (cleared first). With `uniform`, levels that are one run of a single value are not expanded:
/// the value is returned and `out` stays empty. Width 0 means every level is 0.
fn decode_rle(
    buf: &[u8],
    width: u8,
    n: usize,
    out: &mut Vec<u8>,
    uniform: bool,
) -> Result<Option<u8>> {
    out.clear();
    if width == 0 {
        if uniform {
            return Ok(Some(0));
        }
        out.resize(n, 0);
        return Ok(None);
    }
    if width > 8 {
        bail!("level width {width} is over 8 bits");
    }
    let mask = ((1u16 << width) - 1) as u8;
    let mut pos = 0usize;
    out.reserve(n);
    while out.len() < n {
        // ULEB128 run header
        let mut header = 0u64;
        let mut shift = 0;
        loop {
            let Some(&b) = buf.get(pos) else {
                bail!("level data ends after {} of {n} levels", out.len());
            };
            pos += 1;
            header |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 63 {
                bail!("level run header too long");
            }
        }
        if header & 1 == 1 {
            // bit-packed: groups of 8 values, `width` bytes a group, least significant bit first
            let groups = (header >> 1) as usize;
            let Some(packed) = buf.get(pos..pos + groups * width as usize) else {
                bail!("bit-packed levels run past their block");
            };
            pos += groups * width as usize;
            let take = (groups * 8).min(n - out.len());
            let start = out.len();
            if width == 1 {
                for &byte in packed {
                    out.extend_from_slice(&[
                        byte & 1,
                        (byte >> 1) & 1,
                        (byte >> 2) & 1,
                        (byte >> 3) & 1,
                        (byte >> 4) & 1,
                        (byte >> 5) & 1,
                        (byte >> 6) & 1,
                        byte >> 7,
                    ]);
                }
            } else {
                for group in packed.chunks_exact(width as usize) {
                    let mut word = 0u64;
                    for (k, &byte) in group.iter().enumerate() {
                        word |= (byte as u64) << (8 * k);
                    }
                    for k in 0..8 {
                        out.push((word >> (k * width as usize)) as u8 & mask);
                    }
                }
            }
            out.truncate(start + take);
        } else {
            let count = (header >> 1) as usize;
            let Some(&v) = buf.get(pos) else {
                bail!("level run without its value");
            };
            pos += 1; // width ≤ 8: one byte
            if uniform && out.is_empty() && count >= n {
                return Ok(Some(v & mask));
            }
            let take = count.min(n - out.len());
            out.resize(out.len() + take, v & mask);
        }
    }
    Ok(None)
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
mod tests {
    use super::*;

    #[test]
    fn rle_and_bit_packed_runs() {
        let mut out = Vec::new();
        // RLE run: header (5 << 1) = 10, value 1
        assert_eq!(decode_rle(&[10, 1], 1, 5, &mut out, false).unwrap(), None);
        assert_eq!(out, vec![1; 5]);
        // the same run, kept as one value
        assert_eq!(decode_rle(&[10, 1], 1, 5, &mut out, true).unwrap(), Some(1));
        assert!(out.is_empty());
        // two runs are expanded even when asked for uniform
        assert_eq!(
            decode_rle(&[4, 1, 6, 0], 1, 5, &mut out, true).unwrap(),
            None
        );
        assert_eq!(out, vec![1, 1, 0, 0, 0]);
        // bit-packed, width 1, one group (header 0b11): bits 0b1011_0010 -> LSB first
        decode_rle(&[3, 0b1011_0010], 1, 8, &mut out, false).unwrap();
        assert_eq!(out, vec![0, 1, 0, 0, 1, 1, 0, 1]);
        // width 2, one group of 8 (2 bytes): values 0,1,2,3,3,2,1,0
        // byte0 = 0 | 1<<2 | 2<<4 | 3<<6 = 0b11_10_01_00 ; byte1 = 3 | 2<<2 | 1<<4 | 0<<6
        decode_rle(&[3, 0b1110_0100, 0b0001_1011], 2, 8, &mut out, false).unwrap();
        assert_eq!(out, vec![0, 1, 2, 3, 3, 2, 1, 0]);
        // a bit-packed group padded past n
        decode_rle(&[3, 0xff], 1, 3, &mut out, false).unwrap();
        assert_eq!(out, vec![1, 1, 1]);
        // truncated data is an error, not a panic
        assert!(decode_rle(&[3], 1, 8, &mut out, false).is_err());
        assert!(decode_rle(&[10], 1, 5, &mut out, false).is_err());
        assert_eq!(bit_width(0), 0);
        assert_eq!(bit_width(1), 1);
        assert_eq!(bit_width(2), 2);
        assert_eq!(bit_width(3), 2);
    }

    /// Lengths read by levels equal the decoded lists' offsets and nulls: required and nullable
    /// lists, empty lists, null elements, lists with neither (read from the row starts alone),
    /// many pages a row group, several row groups, data pages v1 and v2, with and without
    /// dictionaries.
    #[test]
    fn lengths_match_decoded_lists() {
        use arrow::array::{Array, ArrayRef, Int32Array, ListArray, RecordBatch};
        use arrow::buffer::{NullBuffer, OffsetBuffer};
        use arrow::datatypes::{DataType, Field, Schema};
        use parquet::arrow::ArrowWriter;
        use parquet::file::properties::WriterVersion;

        let n = 300usize;
        // lengths 0..=11 in a scrambled order; every 7th row of `opt` is null, every 5th value
        // of both lists is a null element
        let lens: Vec<usize> = (0..n).map(|i| (i * 7 + i / 3) % 12).collect();
        let list = |nullable: bool| -> ArrayRef {
            let total: usize = lens.iter().sum();
            let values: Int32Array = (0..total)
                .map(|k| (k % 5 != 0).then_some(k as i32 % 97))
                .collect();
            let item = Arc::new(Field::new("item", DataType::Int32, true));
            let nulls = nullable.then(|| NullBuffer::from_iter((0..n).map(|i| i % 7 != 3)));
            Arc::new(ListArray::new(
                item,
                OffsetBuffer::from_lengths(lens.iter().copied()),
                Arc::new(values),
                nulls,
            ))
        };
        // no null element and no empty list: the path that reads only the row starts
        let dense_lens: Vec<usize> = lens.iter().map(|l| l + 1).collect();
        let dense: ArrayRef = Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Int32, false)),
            OffsetBuffer::from_lengths(dense_lens.iter().copied()),
            Arc::new(Int32Array::from_iter_values(
                (0..dense_lens.iter().sum::<usize>()).map(|k| k as i32 % 89),
            )),
            None,
        ));
        let schema = Arc::new(Schema::new(vec![
            Field::new("ids", list(false).data_type().clone(), false),
            Field::new("opt", list(true).data_type().clone(), true),
            Field::new("dense", dense.data_type().clone(), false),
        ]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![list(false), list(true), dense]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        for (version, dict) in [
            (WriterVersion::PARQUET_1_0, true),
            (WriterVersion::PARQUET_1_0, false),
            (WriterVersion::PARQUET_2_0, true),
            (WriterVersion::PARQUET_2_0, false),
        ] {
            let path = dir.path().join(format!("t-{version:?}-{dict}.parquet"));
            // the tables' own settings, with small pages and the page version under test
            let props =
                crate::table::io::writer_properties(crate::table::io::Encoding::Table, None)
                    .unwrap()
                    .into_builder()
                    .set_writer_version(version)
                    .set_dictionary_enabled(dict)
                    .set_data_page_row_count_limit(16)
                    .set_write_batch_size(8)
                    .set_max_row_group_row_count(Some(128))
                    .build();
            let mut w =
                ArrowWriter::try_new(File::create(&path).unwrap(), schema.clone(), Some(props))
                    .unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            let parts = super::super::splice::open_parts(&path).unwrap();
            assert!(parts[0].row_groups() >= 3);
            for name in ["ids", "opt", "dense"] {
                let want = batch.column_by_name(name).unwrap();
                let want = want.as_any().downcast_ref::<ListArray>().unwrap();
                // a null list is written without elements: length 0
                let want_len: Vec<u32> = (0..n)
                    .map(|i| {
                        if want.is_null(i) {
                            0
                        } else {
                            want.value_length(i) as u32
                        }
                    })
                    .collect();
                let want_null: Vec<bool> = (0..n).map(|i| want.is_null(i)).collect();
                assert!(supported(&parts[0], name));
                let mut s = Stream::new(&parts, name);
                // uneven windows that cross row groups
                let mut first = 0;
                for step in [1usize, 50, 77, 100, 72] {
                    s.fill(first, step).unwrap();
                    let (len, null) = s.get(first, step);
                    let ctx = format!("{version:?} dict {dict} {name} rows {first}..+{step}");
                    assert_eq!(len, &want_len[first..first + step], "{ctx}");
                    match name {
                        "opt" => {
                            assert_eq!(null.unwrap(), &want_null[first..first + step], "{ctx}")
                        }
                        _ => assert!(null.is_none(), "{ctx}"),
                    }
                    first += step;
                }
                assert_eq!(first, n);
            }
        }
    }
}
