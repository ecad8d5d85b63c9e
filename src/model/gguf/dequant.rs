//! Dequantization of ggml tensor data to `f32`, exactly as ggml (`ggml-quants.c`,
//! `dequantize_row_*`) and gguf-py (`gguf/quants.py`, which transformers' GGUF loader uses) do it.
//!
//! Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1. Anything else is a clear error naming the type.
//! Block formats (little-endian, `d`/`m` are IEEE half floats, 32 elements per block):
//! - Q8_0, 34 bytes: `d`, then 32 `i8` `q`; `y[j] = d · q[j]`.
//! - Q4_0, 18 bytes: `d`, then 16 bytes `qs`; `y[j] = d · ((qs[j] & 0xF) − 8)`,
//!   `y[j+16] = d · ((qs[j] >> 4) − 8)` for `j < 16` (low nibbles are the first half).
//! - Q4_1, 20 bytes: `d`, `m`, then 16 bytes `qs`; `y[j] = d · (qs[j] & 0xF) + m`,
//!   `y[j+16] = d · (qs[j] >> 4) + m`.
//!
//! Exactness: every product `d · q` is exact in `f32` (an 11-bit half mantissa times an integer
//! of at most 8 bits), so Q8_0 and Q4_0 are exact and Q4_1 rounds once, in the `+ m`; whether a
//! compiler fuses that into an FMA cannot change the result. Rust never fuses on its own, so we
//! produce bit for bit what gguf-py's numpy `d * qs + m` produces.
//!
//! Speed: blocks are independent, so the fast path ([`dequantize_into`]) splits the tensor into
//! chunks of whole blocks and converts them in parallel with rayon; the result does not depend on
//! the thread count. [`dequantize_reference`] is the slow element-by-element definition it is
//! tested against.
use anyhow::{bail, Result};
use half::{bf16, f16};
use rayon::prelude::*;

use super::reader::GgmlType;

/// The types [`dequantize`] accepts.
pub const SUPPORTED: [GgmlType; 6] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
];

/// Elements converted per parallel task (a multiple of every block size).
const CHUNK: usize = 64 * 1024;

/// True when [`dequantize`] accepts the type.
pub fn is_supported(t: GgmlType) -> bool {
    SUPPORTED.contains(&t)
}

/// The error for a type we cannot dequantize.
pub fn unsupported(t: GgmlType, tensor: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "unsupported quantization {t} in tensor `{tensor}` (supported: {}); re-quantize the model \
         to one of these with llama.cpp's llama-quantize, or start from the original weights",
        SUPPORTED.map(|t| t.name()).join(", ")
    )
}

/// Dequantize `n` elements of type `t` from `data` (exactly `n / block · bytes_per_block` bytes).
pub fn dequantize(t: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; n];
    dequantize_into(t, data, &mut out)?;
    Ok(out)
}

/// Dequantize into `out` (its length is the element count), in parallel over whole blocks.
pub fn dequantize_into(t: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    if !is_supported(t) {
        bail!(
            "unsupported quantization {t} (supported: {})",
            SUPPORTED.map(|t| t.name()).join(", ")
        );
    }
    let (block, bytes) = t.block_layout();
    let (block, bytes) = (block as usize, bytes as usize);
    if !out.len().is_multiple_of(block) {
        bail!(
            "{} elements are not a whole number of {t} blocks of {block}",
            out.len()
        );
    }
    let want = out.len() / block * bytes;
    if data.len() != want {
        bail!(
            "{t}: {} elements need {want} bytes, got {}",
            out.len(),
            data.len()
        );
    }
    let chunk_bytes = CHUNK / block * bytes;
    out.par_chunks_mut(CHUNK)
        .zip(data.par_chunks(chunk_bytes))
        .for_each(|(o, d)| convert(t, d, o));
    Ok(())
}

/// Convert whole blocks (`d` and `o` already sized consistently).
fn convert(t: GgmlType, d: &[u8], o: &mut [f32]) {
    match t {
        GgmlType::F32 => {
            for (y, c) in o.iter_mut().zip(d.chunks_exact(4)) {
                *y = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (y, c) in o.iter_mut().zip(d.chunks_exact(2)) {
                *y = half_at(c, 0);
            }
        }
        GgmlType::BF16 => {
            for (y, c) in o.iter_mut().zip(d.chunks_exact(2)) {
                *y = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        GgmlType::Q8_0 => {
            for (y, b) in o.chunks_exact_mut(32).zip(d.chunks_exact(34)) {
                block_q8_0(b, y);
            }
        }
        GgmlType::Q4_0 => {
            for (y, b) in o.chunks_exact_mut(32).zip(d.chunks_exact(18)) {
                block_q4_0(b, y);
            }
        }
        GgmlType::Q4_1 => {
            for (y, b) in o.chunks_exact_mut(32).zip(d.chunks_exact(20)) {
                block_q4_1(b, y);
            }
        }
        // Excluded by `is_supported` in the only caller.
        _ => {}
    }
}

/// The half float stored little-endian at `c[i..i+2]`, as `f32` (exact).
#[inline]
fn half_at(c: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([c[i], c[i + 1]])).to_f32()
}

/// One Q8_0 block (34 bytes) → 32 values: `y[j] = d · q[j]`.
#[inline]
fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = (q as i8) as f32 * d;
    }
}

/// One Q4_0 block (18 bytes) → 32 values: low nibbles first, each minus 8, times `d`.
#[inline]
fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let (lo, hi) = y.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&b[2..18]) {
        *l = ((q & 0x0F) as i32 - 8) as f32 * d;
        *h = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// One Q4_1 block (20 bytes) → 32 values: low nibbles first, `d · q + m`.
#[inline]
fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let m = half_at(b, 2);
    let (lo, hi) = y.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&b[4..20]) {
        *l = (q & 0x0F) as f32 * d + m;
        *h = (q >> 4) as f32 * d + m;
    }
}

/// The slow, obvious definition: element `i` computed on its own from its block, with the
/// formulas of the module documentation. Used to check [`dequantize`].
pub fn dequantize_reference(t: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>> {
    if !is_supported(t) {
        bail!("unsupported quantization {t}");
    }
    let (block, bytes) = t.block_layout();
    let (block, bytes) = (block as usize, bytes as usize);
    if !n.is_multiple_of(block) || data.len() != n / block * bytes {
        bail!("{t}: {n} elements do not match {} bytes", data.len());
    }
    let half = |off: usize| f16::from_bits(data[off] as u16 | (data[off + 1] as u16) << 8).to_f32();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (b, j) = (i / block * bytes, i % block);
        let y = match t {
            GgmlType::F32 => f32::from_bits(
                (0..4).fold(0u32, |acc, k| acc | (data[4 * i + k] as u32) << (8 * k)),
            ),
            GgmlType::F16 => half(2 * i),
            // bf16 is the top half of an f32.
            GgmlType::BF16 => {
                f32::from_bits(((data[2 * i] as u32) | (data[2 * i + 1] as u32) << 8) << 16)
            }
            GgmlType::Q8_0 => half(b) * f32::from(data[b + 2 + j] as i8),
            GgmlType::Q4_0 => {
                let byte = data[b + 2 + j % 16];
                let q = if j < 16 { byte & 0xF } else { byte >> 4 };
                half(b) * (q as f32 - 8.0)
            }
            GgmlType::Q4_1 => {
                let byte = data[b + 4 + j % 16];
                let q = if j < 16 { byte & 0xF } else { byte >> 4 };
                half(b) * q as f32 + half(b + 2)
            }
            _ => bail!("unsupported quantization {t}"),
        };
        out.push(y);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    /// Bitwise equality, NaN equal to NaN.
    fn same(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    }

    #[test]
    fn q8_0_hand_block() {
        // d = 0.5; q = -128, -1, 0, 1, 127, then 3 repeated.
        let mut b = h(0.5).to_vec();
        let mut q = vec![-128i8, -1, 0, 1, 127];
        q.resize(32, 3);
        b.extend(q.iter().map(|&v| v as u8));
        let y = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
        assert_eq!(&y[..5], &[-64.0, -0.5, 0.0, 0.5, 63.5]);
        assert!(y[5..].iter().all(|&v| v == 1.5));
    }

    #[test]
    fn q4_0_hand_block() {
        // d = 2; byte 0 = 0x1F: low nibble 15 → (15−8)·2 = 14 at y[0], high nibble 1 → (1−8)·2 =
        // −14 at y[16]; byte 1 = 0x80: low 0 → −16 at y[1], high 8 → 0 at y[17]; the rest 0x88 → 0.
        let mut b = h(2.0).to_vec();
        let mut qs = vec![0x1Fu8, 0x80];
        qs.resize(16, 0x88);
        b.extend(qs);
        let y = dequantize(GgmlType::Q4_0, &b, 32).unwrap();
        assert_eq!((y[0], y[16], y[1], y[17]), (14.0, -14.0, -16.0, 0.0));
        for (i, &v) in y.iter().enumerate() {
            if ![0, 1, 16, 17].contains(&i) {
                assert_eq!(v, 0.0, "element {i}");
            }
        }
    }

    #[test]
    fn q4_1_hand_block() {
        // d = 0.25, m = −1; byte j = 0xA3: y[j] = 3·0.25 − 1 = −0.25, y[j+16] = 10·0.25 − 1 = 1.5;
        // byte 15 = 0xF0: y[15] = −1, y[31] = 15·0.25 − 1 = 2.75.
        let mut b = h(0.25).to_vec();
        b.extend(h(-1.0));
        let mut qs = vec![0xA3u8; 15];
        qs.push(0xF0);
        b.extend(qs);
        let y = dequantize(GgmlType::Q4_1, &b, 32).unwrap();
        assert!(y[..15].iter().all(|&v| v == -0.25));
        assert!(y[16..31].iter().all(|&v| v == 1.5));
        assert_eq!((y[15], y[31]), (-1.0, 2.75));
    }

    #[test]
    fn q4_1_rounds_once_in_the_add() {
        // d = 0.333251953125 (f16 0x3555), q = 15, m = 4096: d·q = 4.998779296875 = 20475/4096 is
        // exact in f32; 4096 + 20475/4096 lies on f32's 2^-11 grid at that magnitude only to the
        // half step (8398845.5 / 2048), so it rounds to even: 8398846 / 2048 = 4100.9990234375.
        let d = f16::from_bits(0x3555);
        assert_eq!(d.to_f64(), 0.333_251_953_125);
        let mut b = d.to_bits().to_le_bytes().to_vec();
        b.extend(h(4096.0));
        b.extend([0x0Fu8; 16]);
        let y = dequantize(GgmlType::Q4_1, &b, 32).unwrap();
        assert_eq!(f64::from(y[0]), 4_100.999_023_437_5);
        assert_eq!(y[16], 4096.0);
    }

    #[test]
    fn f16_and_bf16_bit_patterns() {
        // f16: 1.0, −2.0, 65504 (max), 2^-24 (smallest subnormal).
        let b: Vec<u8> = [0x3C00u16, 0xC000, 0x7BFF, 0x0001]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let y = dequantize(GgmlType::F16, &b, 4).unwrap();
        assert_eq!(y, vec![1.0, -2.0, 65504.0, 5.960_464_5e-8]);
        // bf16: 1.0, 3.140625, −0.0.
        let b: Vec<u8> = [0x3F80u16, 0x4049, 0x8000]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let y = dequantize(GgmlType::BF16, &b, 3).unwrap();
        assert_eq!(y[..2], [1.0, 3.140625]);
        assert!(y[2] == 0.0 && y[2].is_sign_negative());
        let b: Vec<u8> = [1.5f32, -3.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(dequantize(GgmlType::F32, &b, 2).unwrap(), vec![1.5, -3.25]);
    }

    #[test]
    fn wrong_lengths_and_types_are_errors() {
        assert!(dequantize(GgmlType::Q8_0, &[0; 33], 32).is_err());
        assert!(dequantize(GgmlType::Q8_0, &[0; 34], 31).is_err());
        assert!(dequantize(GgmlType::F32, &[0; 7], 2).is_err());
        let e = dequantize(GgmlType::Q4_K, &[0; 144], 256).unwrap_err();
        assert!(
            format!("{e}").contains("unsupported quantization Q4_K"),
            "{e}"
        );
        let e = unsupported(GgmlType::Q6_K, "blk.0.ffn_down.weight");
        assert!(format!("{e}").contains("Q6_K in tensor `blk.0.ffn_down.weight`"));
    }

    proptest! {
        #[test]
        fn fast_equals_reference(
            ty in prop::sample::select(SUPPORTED.to_vec()),
            blocks in 1usize..5000,
            seed in any::<u64>(),
        ) {
            let (block, bytes) = ty.block_layout();
            let n = blocks * block as usize;
            // Cheap deterministic bytes (a xorshift), spanning every bit pattern incl. NaN scales.
            let mut s = seed | 1;
            let data: Vec<u8> = (0..blocks * bytes as usize)
                .map(|_| { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s as u8 })
                .collect();
            let fast = dequantize(ty, &data, n).unwrap();
            let slow = dequantize_reference(ty, &data, n).unwrap();
            prop_assert!(same(&fast, &slow));
        }
    }
}
