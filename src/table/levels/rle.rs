//! Decoding of the RLE / bit-packed hybrid encoding Parquet uses for repetition and definition
//! levels: row starts from the repetition levels, and the level values themselves.
use super::*;

/// The positions of the zeros among the first `n` repetition levels (width 1) of `buf` (the
/// RLE / bit-packed hybrid encoding): where the rows start.
pub(super) fn row_starts(buf: &[u8], n: usize, starts: &mut Vec<u32>) -> Result<()> {
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
pub(super) fn run_header(buf: &[u8], pos: &mut usize, at: usize, n: usize) -> Result<u64> {
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
pub(super) fn bit_width(max: i16) -> u8 {
    (16 - (max as u16).leading_zeros()) as u8
}

/// A v1 page's level block: a 4-byte little-endian length, then that many bytes.
pub(super) fn prefixed(buf: &[u8]) -> Result<(&[u8], &[u8])> {
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
pub(super) fn decode_rle(
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
