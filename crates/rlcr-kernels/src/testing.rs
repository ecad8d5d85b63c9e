//! Test inputs and references shared by this crate's tests and rlcr's tests of the burn glue
//! (`rlcr::model::{sgemm, head}`), so both sides check against the same data. Not part of the
//! kernels' interface.

use crate::Isa;

/// The kernel ISAs this CPU can run, fastest first (AVX-512 and the forced AVX2 fallback on an
/// AVX-512 machine; none below AVX2).
pub fn isas() -> Vec<Isa> {
    [Isa::Avx512, Isa::Avx2]
        .into_iter()
        .filter(|&i| i <= Isa::detected())
        .collect()
}

/// The bit patterns of `v`, to compare results exactly.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Deterministic values in [-1, 1) with a few exact zeros and wide magnitudes (GEMM operands).
pub fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if i % 37 == 5 {
                0.0
            } else if i % 11 == 3 {
                u * 1e3
            } else {
                u
            }
        })
        .collect()
}

/// `n` rows of `v` logits with a wide range (a peaked row, a flat row, large negatives).
pub fn logits(n: usize, v: usize, seed: u64) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n * v)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            match i / v % 3 {
                0 => 8.0 * u,
                1 => 0.01 * u,
                _ => 30.0 * u - 20.0,
            }
        })
        .collect()
}

/// One target token per row, spread over the vocabulary.
pub fn targets(n: usize, v: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 3) % v) as u32).collect()
}

/// Log-prob of token `t` and entropy of one logit row at temperature `temp`, in f64 straight from
/// the definitions: `u = z / T`, `lse = log Σ exp u`, `log p_t = u_t − lse`,
/// `H = −Σ exp(u − lse) (u − lse)`.
pub fn head_reference(z: &[f32], t: usize, temp: f64) -> (f64, f64) {
    let u: Vec<f64> = z.iter().map(|&x| x as f64 / temp).collect();
    let m = u.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + u.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
    let h = -u.iter().map(|x| (x - lse).exp() * (x - lse)).sum::<f64>();
    (u[t] - lse, h)
}
