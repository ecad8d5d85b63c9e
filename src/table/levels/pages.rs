//! Data pages of a column chunk read from the file's bytes, for their level blocks only: the page
//! headers parsed with a minimal Thrift compact-protocol reader, dictionary and index pages
//! skipped, and a zstd v1 page decompressed only up to the end of its definition levels.
use super::*;

/// What [`raw_pages`] calls for each data page: `(num_values, repetition level block,
/// definition level block)`.
pub(super) type PageLevels<'a> = dyn FnMut(usize, &[u8], &[u8]) -> Result<()> + 'a;

/// Call `page(num_values, repetition levels, definition levels)` for every data page of a column
/// chunk compressed with zstd or not at all, read from the file's bytes: the page headers are
/// parsed here ([`PageHeader`]), dictionary and index pages skipped, and a v1 page decompressed
/// only up to the end of its definition levels.
pub(super) fn raw_pages(
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
pub(super) struct Unzstd {
    dec: zstd::stream::raw::Decoder<'static>,
    out: Vec<u8>,
}

impl Unzstd {
    pub(super) fn new() -> Result<Self> {
        Ok(Unzstd {
            dec: zstd::stream::raw::Decoder::new()?,
            out: Vec::new(),
        })
    }

    /// How many leading bytes of the page `body` (`full` bytes decompressed) hold its two level
    /// blocks, decompressed into `self.out`. `body` may be the front of the page only
    /// (`complete` false): `None` when the levels reach past what it decompresses to.
    pub(super) fn v1_levels(
        &mut self,
        body: &[u8],
        full: usize,
        complete: bool,
    ) -> Result<Option<usize>> {
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
pub(super) struct PageHeader {
    pub(super) uncompressed: usize,
    pub(super) compressed: usize,
    pub(super) data: PageData,
}

#[derive(Debug, PartialEq)]
pub(super) enum PageData {
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
    pub(super) fn parse(buf: &[u8]) -> Result<(PageHeader, usize)> {
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
pub(super) struct Thrift<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Thrift<'_> {
    pub(super) fn byte(&mut self) -> Result<u8> {
        let Some(&b) = self.buf.get(self.pos) else {
            bail!("page header truncated");
        };
        self.pos += 1;
        Ok(b)
    }
    pub(super) fn varint(&mut self) -> Result<u64> {
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
    pub(super) fn i64(&mut self) -> Result<i64> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }
    pub(super) fn i32(&mut self) -> Result<i32> {
        Ok(i32::try_from(self.i64()?)?)
    }
    /// A non-negative i32, as a size.
    pub(super) fn len(&mut self) -> Result<usize> {
        Ok(usize::try_from(self.i32()?)?)
    }
    /// The next field's id and type; `None` at the struct's end. `last` is the previous field's
    /// id (field ids are deltas).
    pub(super) fn field(&mut self, last: &mut i16) -> Result<Option<(i16, u8)>> {
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
    pub(super) fn i32_fields<const K: usize>(&mut self) -> Result<[Option<i32>; K]> {
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
    pub(super) fn skip(&mut self, ty: u8, depth: u32) -> Result<()> {
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
    pub(super) fn element(&mut self, ty: u8, depth: u32) -> Result<()> {
        match ty {
            1 | 2 => self.byte().map(|_| ()),
            t => self.skip(t, depth + 1),
        }
    }
    pub(super) fn bytes(&mut self, n: usize) -> Result<()> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.buf.len() => {
                self.pos = end;
                Ok(())
            }
            _ => bail!("page header truncated"),
        }
    }
}
