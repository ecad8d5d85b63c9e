//! The loss rows of rlcr's fused LM head, on f32 slices: the log-prob of each target token and
//! the entropy of each predicted distribution, from logits `[n, V]` at a scale `s = 1/T`, and the
//! gradient of any loss of those back to the logits. For one row of logits `z`:
//!
//! ```text
//! u_j = s·z_j − s·max(z)        S = Σ_j exp(u_j)
//! log p_t = u_t − ln S           H = −Σ_j p_j log p_j = ln S − (Σ_j exp(u_j)·u_j) / S
//! ∂L/∂z_j = s·( g·[j = t] − p_j·(g + h·(log p_j + H)) )   with g = ∂L/∂log p_t, h = ∂L/∂H
//! ```
//!
//! (the last line from `∂H/∂u_j = −p_j (log p_j + H)`). Forward reads the logits twice (max,
//! then both sums), backward once (writing the gradient); only three numbers per row are kept.
//!
//! Why a kernel and not a crate: the work is one `exp` per logit and two sums, bound by `exp`; no
//! crate on rlcr's dependency tree fuses these, and libm's `expf` is scalar. [`exp_poly`] is
//! Cephes' `expf` (≈ 1 ulp on the range used) written with plain multiplies and adds, so that
//! LLVM vectorises it 16-wide inside the AVX-512 and AVX2 variants; no fused multiply-adds, so
//! every variant (and a CPU without AVX2) gives the same bits. Rows are independent and each
//! row's sums run in a fixed order (16 lanes by column, lane partials added into f64 every 256
//! columns), so results do not depend on the batch, the number of threads or the ISA.
use rayon::prelude::*;

use crate::Isa;

/// Per-row numbers the backward pass needs (from [`forward`]).
#[derive(Debug)]
pub struct HeadRows {
    targets: Vec<u32>,
    /// `s = 1/T`.
    scale: f32,
    /// `s·max(z)`, `ln S`, `H` of every row.
    shift: Vec<f32>,
    ln_s: Vec<f32>,
    ent: Vec<f32>,
    isa: Isa,
}

impl HeadRows {
    /// Rows (`n`).
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }
}

/// Forward over the rows of `z: [n, V]` (row-major, `z.len() == n · v`) with one target id per
/// row (`< v`) and scale `s = 1/T`: `[n·2]` (log-prob, entropy) per row, and the numbers
/// [`backward`] needs. `isa` above the CPU's is lowered to it.
///
/// # Panics
/// If the lengths disagree or a target is `≥ v` (caller bugs; rlcr checks user input first).
pub fn forward(
    z: &[f32],
    n: usize,
    v: usize,
    targets: &[u32],
    scale: f32,
    isa: Isa,
) -> (Vec<f32>, HeadRows) {
    assert!(
        z.len() == n * v && targets.len() == n,
        "{} logits, {} targets for {n}×{v}",
        z.len(),
        targets.len()
    );
    assert!(
        targets.iter().all(|&t| (t as usize) < v),
        "a target id is ≥ {v}"
    );
    let isa = isa.clamp();
    let per_row: Vec<[f32; 4]> = (0..n)
        .into_par_iter()
        .map(|i| row_forward_dispatch(&z[i * v..(i + 1) * v], targets[i] as usize, scale, isa))
        .collect();
    let mut out = Vec::with_capacity(2 * n);
    let (mut shift, mut ln_s, mut ent) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    for (i, r) in per_row.iter().enumerate() {
        out.extend_from_slice(&[r[0], r[1]]);
        ent[i] = r[1];
        shift[i] = r[2];
        ln_s[i] = r[3];
    }
    let rows = HeadRows {
        targets: targets.to_vec(),
        scale,
        shift,
        ln_s,
        ent,
        isa,
    };
    (out, rows)
}

/// Backward over all rows: `∂L/∂z` `[n·V]` from the logits `z` given to [`forward`], its `rows`,
/// and `g: [n·2]` (∂L/∂log p, ∂L/∂H per row).
pub fn backward(z: &[f32], g: &[f32], v: usize, rows: &HeadRows) -> Vec<f32> {
    let mut dz = vec![0f32; z.len()];
    dz.par_chunks_mut(v).enumerate().for_each(|(i, out)| {
        let p = RowGrad {
            scale: rows.scale,
            shift: rows.shift[i],
            ln_s: rows.ln_s[i],
            ent: rows.ent[i],
            g_lp: g[2 * i],
            g_ent: g[2 * i + 1],
            target: rows.targets[i] as usize,
        };
        row_backward_dispatch(&z[i * v..(i + 1) * v], out, &p, rows.isa);
    });
    dz
}
/// SIMD lanes of the row loops (one zmm of f32).
const LANES: usize = 16;
/// Columns summed in f32 lanes before the partials are added into f64.
const BLOCK: usize = 256;

/// `exp(x)` for f32 (Cephes `expf`: `x = n·ln2 + r`, a degree-7 polynomial in `r`, times `2^n`);
/// ≈ 1 ulp; `x` below −87.34 gives `exp(−87.34)` ≈ 1.2e−38 (the callers add it to sums ≥ 1), NaN
/// stays NaN. Plain multiplies and adds only, so it vectorises and gives the same bits on every
/// ISA.
#[inline(always)]
pub(crate) fn exp_poly(x: f32) -> f32 {
    const LO: f32 = -87.336_54;
    const HI: f32 = 88.376_26;
    const MAGIC: f32 = 12_582_912.0; // 1.5·2^23: adding it rounds to an integer
    let x = if x < LO { LO } else { x };
    let x = if x > HI { HI } else { x };
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let k = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let nf = t - MAGIC;
    let r = (x - nf * 0.693_359_4) - nf * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5; // Cephes: 5.0000001201e-1, which is 0.5 in f32
    let y = p * (r * r) + r + 1.0;
    // `wrapping_add`: k is in −126..=128 here, and an overflow-checked add (dev builds check
    // overflow even at opt-level 3) would keep LLVM from vectorising the callers' loops.
    y * f32::from_bits((k.wrapping_add(127) as u32) << 23)
}

/// One row forward: `[log p_t, H, s·max z, ln S]`.
#[inline(always)]
fn row_forward(z: &[f32], target: usize, s: f32) -> [f32; 4] {
    let mut m = [f32::NEG_INFINITY; LANES];
    let mut chunks = z.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            m[l] = if c[l] > m[l] { c[l] } else { m[l] };
        }
    }
    for (l, &x) in chunks.remainder().iter().enumerate() {
        m[l] = if x > m[l] { x } else { m[l] };
    }
    let max = m
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    let shift = s * max;
    let (mut se, mut seu) = ([0f64; LANES], [0f64; LANES]);
    for block in z.chunks(BLOCK) {
        let (mut ae, mut aeu) = ([0f32; LANES], [0f32; LANES]);
        let mut chunks = block.chunks_exact(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                let u = c[l] * s - shift;
                let e = exp_poly(u);
                ae[l] += e;
                aeu[l] += e * u;
            }
        }
        for (l, &x) in chunks.remainder().iter().enumerate() {
            let u = x * s - shift;
            let e = exp_poly(u);
            ae[l] += e;
            aeu[l] += e * u;
        }
        for l in 0..LANES {
            se[l] += ae[l] as f64;
            seu[l] += aeu[l] as f64;
        }
    }
    let (sum_e, sum_eu) = (se.iter().sum::<f64>(), seu.iter().sum::<f64>());
    let ln_s = sum_e.ln();
    let u_t = (z[target] * s - shift) as f64;
    [
        (u_t - ln_s) as f32,
        (ln_s - sum_eu / sum_e) as f32,
        shift,
        ln_s as f32,
    ]
}

/// One row's backward inputs.
struct RowGrad {
    scale: f32,
    shift: f32,
    ln_s: f32,
    ent: f32,
    g_lp: f32,
    g_ent: f32,
    target: usize,
}

/// One row backward: `out_j = s·(g·[j = t] − p_j·(g + h·(u_j − ln S + H)))`.
#[inline(always)]
fn row_backward(z: &[f32], out: &mut [f32], p: &RowGrad) {
    let (s, shift, ln_s) = (p.scale, p.shift, p.ln_s);
    let a = p.g_lp + p.g_ent * (p.ent - ln_s);
    let (neg_s, h) = (-s, p.g_ent);
    for (o, &x) in out.iter_mut().zip(z) {
        let u = x * s - shift;
        let pj = exp_poly(u - ln_s);
        *o = neg_s * pj * (a + h * u);
    }
    out[p.target] += s * p.g_lp;
}

fn row_forward_dispatch(z: &[f32], target: usize, s: f32, isa: Isa) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `isa` never exceeds what the CPU has (`forward` clamps it; backward reuses it).
        match isa {
            Isa::Avx512 => return unsafe { x86::forward_avx512(z, target, s) },
            Isa::Avx2 => return unsafe { x86::forward_avx2(z, target, s) },
            Isa::Scalar => {}
        }
    }
    let _ = isa;
    row_forward(z, target, s)
}

fn row_backward_dispatch(z: &[f32], out: &mut [f32], p: &RowGrad, isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as in `row_forward_dispatch`.
        match isa {
            Isa::Avx512 => return unsafe { x86::backward_avx512(z, out, p) },
            Isa::Avx2 => return unsafe { x86::backward_avx2(z, out, p) },
            Isa::Scalar => {}
        }
    }
    let _ = isa;
    row_backward(z, out, p)
}

/// The same row loops compiled for AVX-512F and for AVX2 (LLVM vectorises them).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{row_backward, row_forward, RowGrad};

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn forward_avx512(z: &[f32], target: usize, s: f32) -> [f32; 4] {
        row_forward(z, target, s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn forward_avx2(z: &[f32], target: usize, s: f32) -> [f32; 4] {
        row_forward(z, target, s)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn backward_avx512(z: &[f32], out: &mut [f32], p: &RowGrad) {
        row_backward(z, out, p)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn backward_avx2(z: &[f32], out: &mut [f32], p: &RowGrad) {
        row_backward(z, out, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::{head_reference as reference, logits, targets};

    #[test]
    fn exp_poly_is_close_to_exp() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 87.0 * i as f32 / 200_000.0;
            let got = exp_poly(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert!(exp_poly(f32::NAN).is_nan());
        assert!(exp_poly(-1e30) < 2e-38);
        assert_eq!(exp_poly(0.0), 1.0);
    }

    #[test]
    fn rows_match_the_definition_in_f64() {
        for (v, temp) in [(1usize, 1.0), (17, 1.0), (300, 0.7), (4099, 1.3)] {
            let n = 6;
            let z = logits(n, v, v as u64);
            let t = targets(n, v);
            let (out, _) = forward(&z, n, v, &t, (1.0 / temp) as f32, Isa::Scalar);
            for i in 0..n {
                let (lp, h) = reference(&z[i * v..(i + 1) * v], t[i] as usize, temp);
                let (glp, gh) = (out[2 * i] as f64, out[2 * i + 1] as f64);
                assert!(
                    (glp - lp).abs() < 2e-6 * (1.0 + lp.abs()),
                    "v {v} row {i}: {glp} vs {lp}"
                );
                assert!(
                    (gh - h).abs() < 2e-6 * (1.0 + h),
                    "v {v} row {i}: {gh} vs {h}"
                );
            }
        }
    }

    #[test]
    fn every_isa_gives_the_same_bits() {
        let (n, v) = (5, 1000 + 7);
        let z = logits(n, v, 3);
        let t = targets(n, v);
        let mut isas = vec![Isa::Scalar, Isa::Avx2, Isa::Avx512];
        isas.retain(|&i| i <= Isa::detected());
        let (base, rows) = forward(&z, n, v, &t, 0.8, Isa::Scalar);
        let g: Vec<f32> = (0..2 * n).map(|i| 0.3 - 0.1 * i as f32).collect();
        let dbase = backward(&z, &g, v, &rows);
        for isa in isas {
            let (out, rows) = forward(&z, n, v, &t, 0.8, isa);
            assert_eq!(out, base, "{isa:?}");
            assert_eq!(backward(&z, &g, v, &rows), dbase, "{isa:?}");
        }
    }

    /// Rows do not depend on the other rows of the batch (or the thread count: rows are the unit
    /// of work).
    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let (n, v) = (9, 513);
        let z = logits(n, v, 11);
        let t = targets(n, v);
        let (all, _) = forward(&z, n, v, &t, 1.0, crate::Isa::detected());
        for i in 0..n {
            let (one, _) = forward(
                &z[i * v..(i + 1) * v],
                1,
                v,
                &t[i..i + 1],
                1.0,
                crate::Isa::detected(),
            );
            assert_eq!(&all[2 * i..2 * i + 2], &one[..]);
        }
    }
}
