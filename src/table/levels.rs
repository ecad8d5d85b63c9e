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

/// What [`raw_pages`] calls for each data page: `(num_values, repetition level block,
/// definition level block)`.
type PageLevels<'a> = dyn FnMut(usize, &[u8], &[u8]) -> Result<()> + 'a;

/// Call `page(num_values, repetition levels, definition levels)` for every data page of a column
/// chunk compressed with zstd or not at all, read from the file's bytes: the page headers are
/// parsed here ([`PageHeader`]), dictionary and index pages skipped, and a v1 page decompressed
/// only up to the end of its definition levels.
fn raw_pages(
    file: &File,
    meta: &ColumnChunkMetaData,
    column: &str,
    front: u64,
    page: &mut PageLevels<'_>,
) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let zstd = match meta.compression() {
        Compression::UNCOMPRESSED => false,
        Compression::ZSTD(_) => true,
        c => bail!("internal: raw pages of a {c} column chunk"),
    };
    let (start, len) = meta.byte_range();
    let size = file.metadata()?.len();
    if start.checked_add(len).is_none_or(|end| end > size) {
        bail!("column chunk at {start}+{len} runs past the end of the file ({size} bytes)");
    }
    // bytes `at..at + n` of the chunk into `buf`
    let read = |at: u64, n: u64, buf: &mut Vec<u8>| -> Result<()> {
        if at.checked_add(n).is_none_or(|end| end > len) {
            bail!("page of {n} bytes at {at} runs past its column chunk of {len}");
        }
        buf.resize(n as usize, 0);
        file.read_exact_at(buf, start + at)?;
        Ok(())
    };
    // only what the levels need is read: the page headers, a v2 page's level blocks, the front of
    // a v1 page (more when its levels reach further)
    let (mut head, mut body) = (Vec::new(), Vec::new());
    let mut unzstd = if zstd { Some(Unzstd::new()?) } else { None };
    let mut pos = 0u64;
    let mut values = 0u64;
    while pos < len && values < meta.num_values().max(0) as u64 {
        let mut n = front.min(256);
        let (h, hlen) = loop {
            let n_here = n.min(len - pos);
            read(pos, n_here, &mut head)?;
            match PageHeader::parse(&head) {
                Ok(h) => break h,
                // perhaps a header longer than what was read
                Err(_) if n_here < len - pos => n *= 16,
                Err(e) => return Err(e),
            }
        };
        let at = pos + hlen as u64;
        let compressed = h.compressed as u64;
        if at + compressed > len {
            bail!("page of {compressed} bytes runs past its column chunk");
        }
        pos = at + compressed;
        match h.data {
            PageData::Other => {}
            PageData::V1 { num_values, rle } => {
                values += num_values as u64;
                rle_levels(rle, column)?;
                let mut n = front.min(compressed);
                read(at, n, &mut body)?;
                let (r, d) = match &mut unzstd {
                    None => loop {
                        match v1_blocks(&body) {
                            Err(_) if n < compressed => {
                                n = compressed;
                                read(at, n, &mut body)?;
                            }
                            r => break r?,
                        }
                    },
                    Some(z) => {
                        let k = loop {
                            match z.v1_levels(&body, h.uncompressed, n == compressed)? {
                                Some(k) => break k,
                                None => {
                                    n = (n * 4).min(compressed);
                                    read(at, n, &mut body)?;
                                }
                            }
                        };
                        v1_blocks(&z.out[..k])?
                    }
                };
                page(num_values, r, d)?;
            }
            PageData::V2 {
                num_values,
                rep_len,
                def_len,
            } => {
                values += num_values as u64;
                read(at, ((rep_len + def_len) as u64).min(compressed), &mut body)?;
                let (r, d) = v2_blocks(&body, rep_len, def_len)?;
                page(num_values, r, d)?;
            }
        }
    }
    if values != meta.num_values().max(0) as u64 {
        bail!(
            "the pages hold {values} values, the column chunk's metadata says {}",
            meta.num_values()
        );
    }
    Ok(())
}

/// A zstd stream decoder that decompresses a v1 page only as far as its level blocks reach.
struct Unzstd {
    dec: zstd::stream::raw::Decoder<'static>,
    out: Vec<u8>,
}

impl Unzstd {
    fn new() -> Result<Self> {
        Ok(Unzstd {
            dec: zstd::stream::raw::Decoder::new()?,
            out: Vec::new(),
        })
    }

    /// How many leading bytes of the page `body` (`full` bytes decompressed) hold its two level
    /// blocks, decompressed into `self.out`. `body` may be the front of the page only
    /// (`complete` false): `None` when the levels reach past what it decompresses to.
    fn v1_levels(&mut self, body: &[u8], full: usize, complete: bool) -> Result<Option<usize>> {
        use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
        self.dec.reinit()?;
        self.out.clear();
        let mut input = InBuffer::around(body);
        let mut filled = 0usize;
        // the bytes needed: the repetition block's prefix, then its block and the definition
        // block's prefix, then that block
        let mut want = 4usize;
        loop {
            if want > full {
                bail!("level blocks of {want} bytes in a page of {full}");
            }
            while filled < want {
                self.out.resize(want, 0);
                let mut output = OutBuffer::around_pos(&mut self.out[..], filled);
                let before = (input.pos(), filled);
                self.dec.run(&mut input, &mut output)?;
                filled = output.pos();
                if (input.pos(), filled) == before {
                    if !complete && input.pos() == body.len() {
                        return Ok(None);
                    }
                    bail!("page decompresses to {filled} bytes, its levels need {want}");
                }
            }
            let at = |k: usize| {
                u32::from_le_bytes([
                    self.out[k],
                    self.out[k + 1],
                    self.out[k + 2],
                    self.out[k + 3],
                ]) as usize
            };
            let rep = at(0);
            let next = if want == 4 {
                8 + rep
            } else if want == 8 + rep {
                8 + rep + at(4 + rep)
            } else {
                return Ok(Some(want));
            };
            if next == want {
                return Ok(Some(want));
            }
            want = next;
        }
    }
}

/// What rlcr reads of a page header (Parquet's `PageHeader`, Thrift compact protocol).
#[derive(Debug, PartialEq)]
struct PageHeader {
    uncompressed: usize,
    compressed: usize,
    data: PageData,
}

#[derive(Debug, PartialEq)]
enum PageData {
    /// A dictionary or index page.
    Other,
    V1 {
        num_values: usize,
        /// Both level blocks RLE-encoded (Encoding 3; the other is the deprecated BIT_PACKED).
        rle: bool,
    },
    V2 {
        num_values: usize,
        rep_len: usize,
        def_len: usize,
    },
}

impl PageHeader {
    /// The header at the start of `buf` and its length in bytes.
    fn parse(buf: &[u8]) -> Result<(PageHeader, usize)> {
        let mut t = Thrift { buf, pos: 0 };
        let (mut kind, mut uncompressed, mut compressed) = (None, None, None);
        let (mut v1, mut v2) = (None, None);
        let mut id = 0i16;
        while let Some((f, ty)) = t.field(&mut id)? {
            match (f, ty) {
                (1, 5) => kind = Some(t.i32()?),
                (2, 5) => uncompressed = Some(t.len()?),
                (3, 5) => compressed = Some(t.len()?),
                (5, 12) => {
                    // DataPageHeader: num_values, encoding, definition and repetition level
                    // encodings, statistics
                    let [Some(n), Some(_), Some(d), Some(r)] = t.i32_fields::<4>()? else {
                        bail!("data page header without its required fields");
                    };
                    v1 = Some(PageData::V1 {
                        num_values: usize::try_from(n)?,
                        rle: r == 3 && d == 3,
                    });
                }
                (8, 12) => {
                    // DataPageHeaderV2: num_values, num_nulls, num_rows, encoding, definition and
                    // repetition level byte lengths, is_compressed, statistics
                    let [Some(n), _, _, _, Some(d), Some(r)] = t.i32_fields::<6>()? else {
                        bail!("data page v2 header without its required fields");
                    };
                    v2 = Some(PageData::V2 {
                        num_values: usize::try_from(n)?,
                        rep_len: usize::try_from(r)?,
                        def_len: usize::try_from(d)?,
                    });
                }
                _ => t.skip(ty, 0)?,
            }
        }
        let (Some(kind), Some(uncompressed), Some(compressed)) = (kind, uncompressed, compressed)
        else {
            bail!("page header without its type or sizes");
        };
        // PageType: DATA_PAGE 0, INDEX_PAGE 1, DICTIONARY_PAGE 2, DATA_PAGE_V2 3
        let data = match (kind, v1, v2) {
            (0, Some(v1), _) => v1,
            (3, _, Some(v2)) => v2,
            (1 | 2, _, _) => PageData::Other,
            (k, _, _) => bail!("page of type {k} without its header"),
        };
        let h = PageHeader {
            uncompressed,
            compressed,
            data,
        };
        Ok((h, t.pos))
    }
}

/// A reader of the Thrift compact protocol, as far as page headers need it.
struct Thrift<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Thrift<'_> {
    fn byte(&mut self) -> Result<u8> {
        let Some(&b) = self.buf.get(self.pos) else {
            bail!("page header truncated");
        };
        self.pos += 1;
        Ok(b)
    }
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        bail!("page header varint too long")
    }
    fn i64(&mut self) -> Result<i64> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::try_from(self.i64()?)?)
    }
    /// A non-negative i32, as a size.
    fn len(&mut self) -> Result<usize> {
        Ok(usize::try_from(self.i32()?)?)
    }
    /// The next field's id and type; `None` at the struct's end. `last` is the previous field's
    /// id (field ids are deltas).
    fn field(&mut self, last: &mut i16) -> Result<Option<(i16, u8)>> {
        let b = self.byte()?;
        if b == 0 {
            return Ok(None);
        }
        let delta = (b >> 4) as i16;
        *last = if delta == 0 {
            i16::try_from(self.i64()?)?
        } else {
            last.checked_add(delta)
                .context("page header field id overflows")?
        };
        Ok(Some((*last, b & 0x0f)))
    }
    /// A struct's i32 fields with ids 1..=K (the others skipped).
    fn i32_fields<const K: usize>(&mut self) -> Result<[Option<i32>; K]> {
        let mut h = [None; K];
        let mut id = 0i16;
        while let Some((f, ty)) = self.field(&mut id)? {
            match (f, ty) {
                (1.., 5) if f as usize <= K => h[f as usize - 1] = Some(self.i32()?),
                _ => self.skip(ty, 0)?,
            }
        }
        Ok(h)
    }
    /// Skip a value of compact type `ty` (`depth` levels deep in containers).
    fn skip(&mut self, ty: u8, depth: u32) -> Result<()> {
        if depth > 16 {
            bail!("page header nested too deeply");
        }
        match ty {
            1 | 2 => {}
            3 => {
                self.byte()?;
            }
            4..=6 => {
                self.varint()?;
            }
            7 => self.bytes(8)?,
            8 => {
                let n = self.varint()?;
                self.bytes(usize::try_from(n)?)?;
            }
            9 | 10 => {
                let h = self.byte()?;
                let n = match h >> 4 {
                    15 => usize::try_from(self.varint()?)?,
                    n => n as usize,
                };
                for _ in 0..n {
                    self.element(h & 0x0f, depth)?;
                }
            }
            11 => {
                let n = usize::try_from(self.varint()?)?;
                if n > 0 {
                    let kv = self.byte()?;
                    for _ in 0..n {
                        self.element(kv >> 4, depth)?;
                        self.element(kv & 0x0f, depth)?;
                    }
                }
            }
            12 => {
                let mut id = 0i16;
                while let Some((_, ty)) = self.field(&mut id)? {
                    self.skip(ty, depth + 1)?;
                }
            }
            t => bail!("page header holds unknown type {t}"),
        }
        Ok(())
    }
    /// A container element: booleans take a byte here.
    fn element(&mut self, ty: u8, depth: u32) -> Result<()> {
        match ty {
            1 | 2 => self.byte().map(|_| ()),
            t => self.skip(t, depth + 1),
        }
    }
    fn bytes(&mut self, n: usize) -> Result<()> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.buf.len() => {
                self.pos = end;
                Ok(())
            }
            _ => bail!("page header truncated"),
        }
    }
}

/// The positions of the zeros among the first `n` repetition levels (width 1) of `buf` (the
/// RLE / bit-packed hybrid encoding): where the rows start.
fn row_starts(buf: &[u8], n: usize, starts: &mut Vec<u32>) -> Result<()> {
    starts.clear();
    let mut pos = 0usize; // byte in buf
    let mut at = 0usize; // level index
    while at < n {
        let header = run_header(buf, &mut pos, at, n)?;
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

/// The ULEB128 header of the level run at `pos` (moved past it): the run's length, shifted left
/// once, with the low bit set for a bit-packed run. `at` of `n` levels were read before it.
#[inline]
fn run_header(buf: &[u8], pos: &mut usize, at: usize, n: usize) -> Result<u64> {
    let mut header = 0u64;
    let mut shift = 0;
    loop {
        let Some(&b) = buf.get(*pos) else {
            bail!("level data ends after {at} of {n} levels");
        };
        *pos += 1;
        header |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return Ok(header);
        }
        shift += 7;
        if shift > 63 {
            bail!("level run header too long");
        }
    }
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
        let header = run_header(buf, &mut pos, out.len(), n)?;
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
        let zstd = Compression::ZSTD(parquet::basic::ZstdLevel::try_new(3).unwrap());
        for (version, dict, codec, page_stats) in [
            (WriterVersion::PARQUET_1_0, true, zstd, false),
            (WriterVersion::PARQUET_1_0, false, zstd, true),
            (WriterVersion::PARQUET_2_0, true, zstd, false),
            (WriterVersion::PARQUET_2_0, false, zstd, true),
            (
                WriterVersion::PARQUET_1_0,
                true,
                Compression::UNCOMPRESSED,
                true,
            ),
            (
                WriterVersion::PARQUET_2_0,
                false,
                Compression::UNCOMPRESSED,
                false,
            ),
            (
                WriterVersion::PARQUET_1_0,
                false,
                Compression::SNAPPY,
                false,
            ),
            (WriterVersion::PARQUET_2_0, true, Compression::SNAPPY, true),
        ] {
            let path = dir
                .path()
                .join(format!("t-{version:?}-{dict}-{codec}-{page_stats}.parquet"));
            // the tables' own settings, with small pages and the page version under test
            let props =
                crate::table::io::writer_properties(crate::table::io::Encoding::Table, None)
                    .unwrap()
                    .into_builder()
                    .set_writer_version(version)
                    .set_dictionary_enabled(dict)
                    .set_compression(codec)
                    .set_write_page_header_statistics(page_stats)
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
                // the raw pages and the parquet crate's page reader agree, page header by
                // page header and in the lengths they give
                let raw = codec != Compression::SNAPPY;
                for rg in 0..parts[0].row_groups() {
                    let a = lengths_by(&parts[0], rg, name, None).unwrap();
                    assert_eq!(row_group_lengths(&parts[0], rg, name).unwrap(), a);
                    if raw {
                        // pages read a few bytes at first, then more as the headers and levels
                        // need them
                        for front in [1, 3, 17, FRONT] {
                            let b = lengths_by(&parts[0], rg, name, Some(front)).unwrap();
                            assert_eq!(b, a, "front {front}");
                        }
                        same_headers(&parts[0], rg, name);
                    }
                }
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

    /// The headers [`PageHeader::parse`] reads from a column chunk's bytes, beside the pages
    /// the parquet crate reads from it: the same kinds, sizes, value counts, level encodings and
    /// v2 level lengths.
    fn same_headers(part: &Part, rg: usize, column: &str) {
        use std::os::unix::fs::FileExt;
        let lf = leaf(part, column).unwrap();
        let meta = part.meta.metadata().row_group(rg).column(lf.index);
        let (start, len) = meta.byte_range();
        let mut chunk = vec![0u8; len as usize];
        part.file.read_exact_at(&mut chunk, start).unwrap();
        let file = Arc::new(File::open(&part.path).unwrap());
        let mut pages = SerializedPageReader::new(file, meta, part.rg_rows(rg), None).unwrap();
        let mut pos = 0;
        let mut n = 0;
        while let Some(page) = pages.get_next_page().unwrap() {
            let (h, hlen) = PageHeader::parse(&chunk[pos..]).unwrap();
            // every prefix of a header is refused, never a panic
            for cut in 0..hlen {
                assert!(PageHeader::parse(&chunk[pos..pos + cut]).is_err(), "{cut}");
            }
            pos += hlen + h.compressed;
            let want = match &page {
                Page::DictionaryPage { .. } => PageData::Other,
                Page::DataPage {
                    num_values,
                    def_level_encoding,
                    rep_level_encoding,
                    ..
                } => PageData::V1 {
                    num_values: *num_values as usize,
                    rle: *def_level_encoding == Encoding::RLE
                        && *rep_level_encoding == Encoding::RLE,
                },
                Page::DataPageV2 {
                    num_values,
                    def_levels_byte_len,
                    rep_levels_byte_len,
                    ..
                } => PageData::V2 {
                    num_values: *num_values as usize,
                    rep_len: *rep_levels_byte_len as usize,
                    def_len: *def_levels_byte_len as usize,
                },
            };
            assert_eq!(h.data, want);
            assert_eq!(h.uncompressed, page.buffer().len());
            n += 1;
        }
        assert_eq!(pos, chunk.len());
        assert!(n >= 2);
    }

    /// A column chunk cut short or with a damaged page is an error naming the place, never a
    /// panic or wrong lengths.
    #[test]
    fn damaged_chunks_are_refused() {
        use arrow::array::{ArrayRef, Int32Array, ListArray, RecordBatch};
        use arrow::buffer::OffsetBuffer;
        use arrow::datatypes::{DataType, Field, Schema};
        use parquet::arrow::ArrowWriter;
        use std::os::unix::fs::FileExt;

        let lens: Vec<usize> = (0..200).map(|i| 1 + i % 9).collect();
        let total: usize = lens.iter().sum();
        let ids: ArrayRef = Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Int32, false)),
            OffsetBuffer::from_lengths(lens.iter().copied()),
            Arc::new(Int32Array::from_iter_values(
                (0..total as i32).map(|k| k * 7919),
            )),
            None,
        ));
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ids",
            ids.data_type().clone(),
            false,
        )]));
        let batch = RecordBatch::try_new(schema.clone(), vec![ids]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let props = crate::table::io::writer_properties(crate::table::io::Encoding::Table, None)
            .unwrap()
            .into_builder()
            .set_dictionary_enabled(false)
            .set_data_page_row_count_limit(64)
            .set_write_batch_size(16)
            .build();
        let mut w =
            ArrowWriter::try_new(File::create(&path).unwrap(), schema, Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let parts = super::super::splice::open_parts(&path).unwrap();
        let good = row_group_lengths(&parts[0], 0, "ids").unwrap();
        let want: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
        assert_eq!(good.len, want);
        let meta = parts[0].meta.metadata().row_group(0).column(0);
        let (start, len) = meta.byte_range();
        let mut bytes = std::fs::read(&path).unwrap();
        // flip bytes across the chunk, one at a time (page headers, level blocks, values): the
        // result is the right lengths or an error, never a panic
        let mut errors = 0;
        for at in (start..start + len).step_by(7) {
            let old = bytes[at as usize];
            bytes[at as usize] = old ^ 0x5a;
            let f = File::options().write(true).open(&path).unwrap();
            f.write_all_at(&bytes, 0).unwrap();
            match row_group_lengths(&parts[0], 0, "ids") {
                // a flip in the values (never read), or one the levels survive with the row
                // count the metadata gives (the format has no checksum to notice it)
                Ok(l) => assert_eq!(l.len.len(), want.len()),
                Err(e) => {
                    let msg = format!("{e:#}");
                    assert!(
                        msg.contains("row group 0") && msg.contains("`ids`"),
                        "{msg}"
                    );
                    errors += 1;
                }
            }
            bytes[at as usize] = old;
        }
        assert!(errors > 0);
        // cut short: an error
        let f = File::options().write(true).open(&path).unwrap();
        f.set_len(start + len / 2).unwrap();
        let e = format!("{:#}", row_group_lengths(&parts[0], 0, "ids").unwrap_err());
        assert!(e.contains("corrupt or truncated"), "{e}");
    }
}
