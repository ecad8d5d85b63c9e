//! Mixed-precision GEMM for the opt-in bf16 training mode: `C = A · B` with `A` and `B` given as
//! bfloat16 numbers (bit patterns, `u16`) and every product and sum in f32 — what torch's CPU
//! autocast does with oneDNN (bf16 operands, f32 accumulation), except that `C` stays f32 here
//! (torch rounds a bf16 matmul's output to bf16).
//!
//! **Kernels.** Where the CPU has AVX-512 and `avx512_bf16`, a 12 × 32 register tile on
//! `VDPBF16PS`: each instruction multiplies sixteen pairs of bf16 numbers and adds both products
//! to sixteen f32 accumulators, twice the multiply-adds of an f32 FMA per instruction at half the
//! operand bytes. The blocking is [`crate::sgemm`]'s (Goto order, jobs cut the output, packing
//! per job), with pairs of K steps interleaved in the packed panels (`[K/2][tile][2]`, the layout
//! the instruction reads). Elsewhere (AVX2, or AVX-512 without `avx512_bf16`, or a forced
//! `RLCR_CPU_ISA=avx2`) the operands are widened to f32 (exactly: every bf16 number is an f32
//! number) and multiplied by [`crate::sgemm::sgemm`]: the same products of the same rounded
//! inputs, slower than the f32 path by the widening.
//!
//! **What the numbers are.** Products of two bf16 numbers are exact in f32 (8 + 8 significant
//! bits), so both kernels compute `Σ_k a_k b_k` of the rounded operands with one f32 rounding per
//! addition, from zero, over K in order — the f32 path chains `k = 0, 1, 2, 3, …`, while
//! `VDPBF16PS` adds each pair's odd term before its even one and flushes subnormal inputs and
//! results to zero (Intel SDM), so the two paths differ in the last bits; the tests bound both
//! against an f64 sum. Within one path the bits depend neither on the batch (rows), nor on the
//! thread count, nor on the blocking (K blocks are whole pairs; the first starts at zero, later
//! ones continue from `C`).
//!
//! **Rounding f32 → bf16** ([`round`]): to nearest, ties to even, subnormal inputs to signed
//! zero, NaN to a quiet NaN — `VCVTNEPS2BF16`'s rule, which [`round_slice`] runs where the CPU has
//! it and reproduces bit for bit in scalar code elsewhere.
use rayon::prelude::*;

use crate::sgemm::{Jobs, OutPtr, View, NC};
use crate::Isa;

/// Pairs of K steps per packed block: a `KP × 32` panel slice (32 KiB) plus a `KP × 12`
/// micro-panel (12 KiB) fit in L1, as [`crate::sgemm::KC`]'s f32 steps do.
pub const KP: usize = 256;

/// Whether this CPU runs the `VDPBF16PS` kernel (AVX-512F/BW/VL and `avx512_bf16`).
pub fn has_native() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `x` rounded to bf16 (bit pattern): nearest, ties to even; subnormals (input) to signed zero;
/// NaN to a quiet NaN with the sign and top payload bits kept; overflow to ±∞.
pub fn round(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    if b & 0x7f80_0000 == 0 {
        return ((b >> 16) & 0x8000) as u16; // zero or subnormal: signed zero
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of a bf16 bit pattern (exact).
pub fn widen(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `dst[i] = round(src[i])` ([`round`]) for every element, on `VCVTNEPS2BF16` where the CPU has
/// it (the same bits).
///
/// # Panics
/// If the lengths differ (a caller bug).
pub fn round_slice(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "round_slice lengths");
    // Large operands in parallel chunks (each element is rounded alone: the same bits).
    const CHUNK: usize = 1 << 15;
    let native = has_native();
    if src.len() > 2 * CHUNK {
        dst.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(d, s)| round_slice_with(s, d, native));
    } else {
        round_slice_with(src, dst, native);
    }
}

/// [`round_slice`] on the instruction (`native`, where the CPU has it) or in scalar code (tests).
pub fn round_slice_with(src: &[f32], dst: &mut [u16], native: bool) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if native && has_native() {
        // SAFETY: the CPU has AVX-512F + BF16 (checked); whole chunks of 16 only.
        done = unsafe { avx512::round_chunks(src, dst) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = native;
    for (d, &s) in dst[done..].iter_mut().zip(&src[done..]) {
        *d = round(s);
    }
}

/// `C[m, n] = A[m, k] · B[k, n]` (C row-major f32, overwritten; `A`, `B` bf16 bit patterns) on
/// the `VDPBF16PS` kernel when `isa` is AVX-512 and the CPU has `avx512_bf16`, else widened to
/// f32 through [`crate::sgemm::sgemm`] on `isa`. Returns `false`, leaving `c` untouched, when
/// there is no kernel ([`Isa::Scalar`], or a CPU without AVX2 + FMA).
///
/// # Panics
/// If a view or `c` is too short for its shape (a caller bug, not user input).
pub fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_, u16>,
    b: View<'_, u16>,
    c: &mut [f32],
    isa: Isa,
) -> bool {
    let isa = isa.clamp();
    let native = isa == Isa::Avx512 && has_native();
    gemm_with(m, n, k, a, b, c, isa, native)
}

/// [`gemm`] with the kernel chosen by the caller: `native` runs `VDPBF16PS` (ignored where the
/// CPU lacks it), otherwise the widened operands go through [`crate::sgemm::sgemm`] on `isa`
/// (for tests and benchmarks).
#[allow(clippy::too_many_arguments)]
pub fn gemm_with(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_, u16>,
    b: View<'_, u16>,
    c: &mut [f32],
    isa: Isa,
    native: bool,
) -> bool {
    assert!(c.len() >= m * n, "output of {} for {m}×{n}", c.len());
    assert!(
        a.data.len() >= a.end(m, k) && b.data.len() >= b.end(k, n),
        "view out of bounds"
    );
    #[cfg(target_arch = "x86_64")]
    if native && has_native() {
        native_gemm(m, n, k, a, b, c);
        return true;
    }
    if !crate::sgemm::has_kernel(isa) {
        return false;
    }
    // Widen the region each view reaches (exact), keeping its strides.
    let widen_view = |v: &View<'_, u16>, r: usize, s: usize| -> Vec<f32> {
        v.data[..v.end(r, s)].iter().map(|&h| widen(h)).collect()
    };
    let (aw, bw) = (widen_view(&a, m, k), widen_view(&b, k, n));
    let av = View {
        data: &aw,
        off: a.off,
        rs: a.rs,
        cs: a.cs,
    };
    let bv = View {
        data: &bw,
        off: b.off,
        rs: b.rs,
        cs: b.cs,
    };
    crate::sgemm::sgemm(m, n, k, av, bv, c, isa)
}

/// The reference both kernels are bounded against: `Σ_k a_k b_k` of the bf16 operands in f64,
/// and `Σ_k |a_k b_k|` (the scale of the rounding error), per output.
pub fn reference(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_, u16>,
    b: View<'_, u16>,
) -> (Vec<f64>, Vec<f64>) {
    let at = |v: &View<'_, u16>, i: usize, j: usize| widen(v.data[v.off + i * v.rs + j * v.cs]);
    let mut sum = vec![0f64; m * n];
    let mut abs = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            for kk in 0..k {
                let p = at(&a, i, kk) as f64 * at(&b, kk, j) as f64;
                sum[i * n + j] += p;
                abs[i * n + j] += p.abs();
            }
        }
    }
    (sum, abs)
}

/// The blocked driver of the `VDPBF16PS` kernel (see [`crate::sgemm`] for the loop order).
#[cfg(target_arch = "x86_64")]
fn native_gemm(m: usize, n: usize, k: usize, a: View<'_, u16>, b: View<'_, u16>, c: &mut [f32]) {
    const MR: usize = 12;
    const NR: usize = 32;
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c[..m * n].fill(0.0);
        return;
    }
    let pairs = k.div_ceil(2);
    let jobs = Jobs::new(m, n, MR, NR, true);
    let ptr = OutPtr(c.as_mut_ptr());
    let job = |job: usize| {
        let out = ptr;
        let (i0, i1, j0, j1) = jobs.block(job, m, n);
        // Loop order: K blocks outermost, so that each block of A (all of this job's rows) is
        // packed once and serves every column block (packing A per column block, as the f32
        // driver's order would, cost 8 % of a training step at the LM head's 32 column blocks).
        let mut bbuf = vec![0u32; KP.min(pairs) * NC.min(j1 - j0).next_multiple_of(NR)];
        let mut abuf = vec![0u32; KP.min(pairs) * (i1 - i0).next_multiple_of(MR)];
        let mut p0 = 0;
        while p0 < pairs {
            let kp = KP.min(pairs - p0);
            pack(&a.t(), k, 2 * p0, kp, i0, i1 - i0, MR, &mut abuf);
            for jc in (j0..j1).step_by(NC) {
                let nc = NC.min(j1 - jc);
                pack(&b, k, 2 * p0, kp, jc, nc, NR, &mut bbuf);
                for ir in (0..i1 - i0).step_by(MR) {
                    let rows = (i1 - i0 - ir).min(MR);
                    let ap = &abuf[(ir / MR) * kp * MR..][..kp * MR];
                    for jr in (0..nc).step_by(NR) {
                        let cols = (nc - jr).min(NR);
                        let bp = &bbuf[(jr / NR) * kp * NR..][..kp * NR];
                        // SAFETY: rows i0+ir.. and columns jc+jr.. are inside the output
                        // (row-major, stride n) and belong to this job only; the panels hold
                        // kp pairs; the CPU has AVX-512F + BF16 (checked by the caller).
                        unsafe {
                            let cp = out.0.add((i0 + ir) * n + jc + jr);
                            avx512::tile(kp, ap, bp, cp, n, rows, cols, p0 == 0);
                        }
                    }
                }
            }
            p0 += kp;
        }
    };
    jobs.run(job);
}

/// `lo | hi << 16`: one pair of K steps as `VDPBF16PS` reads it (even step in the low half).
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// Whether a view takes the vectorised packing (AVX-512 gathers with 32-bit offsets): the CPU has
/// the native kernel and every element offset fits in an `i32`.
#[cfg(target_arch = "x86_64")]
fn fast(v: &View<'_, u16>) -> bool {
    v.data.len() < i32::MAX as usize && has_native()
}

/// Packs `B[k0..k0+2kp, j0..j0+nc]` into `nr`-column micro-panels of pairs
/// (`[nc/nr][kp][nr]` of `u32`; steps at or past `k` and columns past `nc` are zero). `A`'s
/// `mr`-row panels are the same thing for `Aᵀ` (`[mc/mr][kp][mr]`, pairs of two K steps of one
/// row): `pack(&a.t(), …)`.
#[allow(clippy::too_many_arguments)]
fn pack(
    b: &View<'_, u16>,
    k: usize,
    k0: usize,
    kp: usize,
    j0: usize,
    nc: usize,
    nr: usize,
    buf: &mut [u32],
) {
    for (p, panel) in buf
        .chunks_exact_mut(kp * nr)
        .take(nc.div_ceil(nr))
        .enumerate()
    {
        let jp = j0 + p * nr;
        let w = (j0 + nc - jp).min(nr);
        for (q, dst) in panel.chunks_exact_mut(nr).enumerate() {
            let (klo, khi) = (k0 + 2 * q, k0 + 2 * q + 1);
            let lo = b.off + klo * b.rs + jp * b.cs;
            #[cfg(target_arch = "x86_64")]
            if nr <= 32 && fast(b) {
                // SAFETY: the native kernel runs only where the CPU has AVX-512F/BW/VL (checked
                // by `gemm_with`); rows klo (and khi when < k) hold columns jp..jp+w; every
                // gathered pair (klo, klo + 1 = khi < k) is inside the view; offsets fit in i32.
                unsafe {
                    let base = b.data.as_ptr().add(lo);
                    if b.cs == 1 {
                        let hi = (khi < k).then(|| base.add(b.rs));
                        avx512::interleave(base, hi, dst.as_mut_ptr(), w);
                        dst[w..].fill(0);
                        continue;
                    }
                    if b.rs == 1 && khi < k {
                        avx512::gather_pairs(base, b.cs, w, dst.as_mut_ptr(), nr);
                        continue;
                    }
                }
            }
            if b.cs == 1 {
                // Rows of B contiguous (W in the forward, dY in dW = Xᵀ·dY, Xᵀ's columns):
                // interleave two rows.
                let rlo = &b.data[lo..lo + w];
                if khi < k {
                    let hi = lo + b.rs;
                    let rhi = &b.data[hi..hi + w];
                    for ((d, &x), &y) in dst[..w].iter_mut().zip(rlo).zip(rhi) {
                        *d = pair(x, y);
                    }
                } else {
                    for (d, &x) in dst[..w].iter_mut().zip(rlo) {
                        *d = x as u32;
                    }
                }
            } else {
                for (j, d) in dst[..w].iter_mut().enumerate() {
                    let x = b.data[lo + j * b.cs];
                    let y = if khi < k {
                        b.data[lo + b.rs + j * b.cs]
                    } else {
                        0
                    };
                    *d = pair(x, y);
                }
            }
            dst[w..].fill(0);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `dst[i] = round(src[i])` for the whole chunks of 16; returns how many were done.
    ///
    /// # Safety
    /// AVX-512F and AVX512_BF16 must be available; `dst` is at least as long as `src`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn round_chunks(src: &[f32], dst: &mut [u16]) -> usize {
        let n = src.len() / 16 * 16;
        // SAFETY: 16 elements from i < n in both slices.
        unsafe {
            for i in (0..n).step_by(16) {
                let x = _mm512_maskz_loadu_ps(0xffff, src.as_ptr().add(i));
                let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(x));
                _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(i) as *mut i16, 0xffff, h);
            }
        }
        n
    }

    /// `dst[j] = lo[j] | hi[j] << 16` for `j < w` (`hi` absent: 0), 16 at a time; nothing is
    /// read or written at or past `w`.
    ///
    /// # Safety
    /// AVX-512F/BW/VL must be available; `lo` (and `hi`) readable and `dst` writable for `w`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn interleave(lo: *const u16, hi: Option<*const u16>, dst: *mut u32, w: usize) {
        let mut j = 0;
        // SAFETY: masked loads and stores touch indices j..j+n ≤ w only.
        unsafe {
            while j < w {
                let n = (w - j).min(16);
                let m = crate::sgemm::mask16(n);
                let l = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo.add(j) as *const i16));
                let v = match hi {
                    Some(h) => {
                        let hv = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                            m,
                            h.add(j) as *const i16,
                        ));
                        _mm512_or_si512(l, _mm512_slli_epi32::<16>(hv))
                    }
                    None => l,
                };
                _mm512_mask_storeu_epi32(dst.add(j) as *mut i32, m, v);
                j += 16;
            }
        }
    }

    /// `dst[j] = base[j·stride] | base[j·stride + 1] << 16` for `j < w`, zero for `w ≤ j <
    /// width` (`width` 12 or 32): each pair one 32-bit gather lane.
    ///
    /// # Safety
    /// AVX-512F must be available; both elements of every pair `j < w` readable; offsets
    /// `j·stride` below 2³¹; `dst` writable for `width`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn gather_pairs(
        base: *const u16,
        stride: usize,
        w: usize,
        dst: *mut u32,
        width: usize,
    ) {
        let s = stride as i32;
        let step = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(s),
        );
        let mut j = 0;
        // SAFETY: masked gathers read only lanes j < w (pairs inside the view); masked stores
        // write lanes below `width`.
        unsafe {
            while j < width {
                let store = crate::sgemm::mask16(width - j);
                let read = crate::sgemm::mask16(w.saturating_sub(j));
                let idx = _mm512_add_epi32(step, _mm512_set1_epi32(j as i32 * s));
                let v = _mm512_mask_i32gather_epi32::<2>(
                    _mm512_setzero_si512(),
                    read,
                    idx,
                    base as *const i32,
                );
                _mm512_mask_storeu_epi32(dst.add(j) as *mut i32, store, v);
                j += 16;
            }
        }
    }

    /// `C[r, c] (+)= Σ_q a(r, q) · b(q, c)` over `kp` pairs for `r < rows ≤ 12`, `c < cols ≤ 32`
    /// (`a`: `[kp][12]`, `b`: `[kp][32]` pairs): accumulators start at zero when `first`, else at
    /// the current `C`; one `VDPBF16PS` per pair and 16 columns.
    ///
    /// # Safety
    /// AVX-512F and AVX512_BF16 must be available; `a` and `b` hold `kp` pairs; `c` is writable
    /// for `rows` rows of stride `ldc` and `cols` columns.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn tile(
        kp: usize,
        a: &[u32],
        b: &[u32],
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        first: bool,
    ) {
        debug_assert!(a.len() >= kp * 12 && b.len() >= kp * 32);
        let (m0, m1) = crate::sgemm::lane_masks(cols);
        // SAFETY: reads stay inside the panels (kp pairs); masked stores touch `cols` columns of
        // `rows` rows.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; 12];
            if !first {
                for (r, row) in acc.iter_mut().enumerate().take(rows) {
                    row[0] = _mm512_maskz_loadu_ps(m0, c.add(r * ldc));
                    row[1] = _mm512_maskz_loadu_ps(m1, c.add(r * ldc + 16));
                }
            }
            let (ap, bp) = (a.as_ptr(), b.as_ptr());
            for q in 0..kp {
                let b0: __m512bh =
                    std::mem::transmute(_mm512_maskz_loadu_epi32(0xffff, bp.add(q * 32) as _));
                let b1: __m512bh =
                    std::mem::transmute(_mm512_maskz_loadu_epi32(0xffff, bp.add(q * 32 + 16) as _));
                let ar = ap.add(q * 12);
                for (r, row) in acc.iter_mut().enumerate() {
                    let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ar.add(r) as i32));
                    row[0] = _mm512_dpbf16_ps(row[0], x, b0);
                    row[1] = _mm512_dpbf16_ps(row[1], x, b1);
                }
            }
            for (r, row) in acc.iter().enumerate().take(rows) {
                _mm512_mask_storeu_ps(c.add(r * ldc), m0, row[0]);
                _mm512_mask_storeu_ps(c.add(r * ldc + 16), m1, row[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::data;

    /// `B` as bf16 bit patterns ([`crate::sgemm::sgemm_bf16_b`]), plain and transposed, every ISA: the bits of
    /// the scalar FMA chain on the widened `B`.
    #[test]
    fn bf16_b_is_the_chain_of_the_widened_b() {
        use crate::sgemm::{reference, sgemm_bf16_b};
        use crate::testing::{bits, isas};
        for &(m, n, k) in &[(1, 1, 1), (13, 33, 257), (25, 1100, 300), (97, 45, 40)] {
            let ad = data(m * k, 31 + m as u64);
            let bh: Vec<u16> = data(k * n, 32 + n as u64)
                .iter()
                .map(|&x| round(x))
                .collect();
            let bw: Vec<f32> = bh.iter().map(|&h| widen(h)).collect();
            for tb in [false, true] {
                let (b, bwv) = if tb {
                    (View::rows(&bh, k).t(), View::rows(&bw, k).t())
                } else {
                    (View::rows(&bh, n), View::rows(&bw, n))
                };
                let a = View::rows(&ad, k);
                let want = reference(m, n, k, a, bwv);
                for isa in isas() {
                    let mut got = vec![f32::NAN; m * n];
                    assert!(sgemm_bf16_b(m, n, k, a, b, &mut got, isa));
                    assert_eq!(bits(&got), bits(&want), "{m}×{n}×{k} tb={tb} {isa:?}");
                }
            }
        }
    }

    /// Hand-checked roundings: 1 + 2⁻⁸ is a tie between 1 and 1 + 2⁻⁷ and goes to the even 1;
    /// 1 + 3·2⁻⁸ ties to 1 + 2⁻⁶ (even); above half rounds up; subnormals flush to signed zero;
    /// the largest f32 overflows to ∞; NaN stays NaN (quiet).
    #[test]
    fn rounding_rule_by_hand_and_on_the_instruction() {
        assert_eq!(round(1.0), 0x3f80);
        assert_eq!(round(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(round(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(round(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 0x3f81);
        assert_eq!(round(-2.5), 0xc020);
        assert_eq!(round(f32::from_bits(1)), 0);
        assert_eq!(round(-f32::from_bits(0x007f_ffff)), 0x8000);
        assert_eq!(round(f32::MAX), 0x7f80);
        assert_eq!(round(f32::INFINITY), 0x7f80);
        assert_eq!(round(f32::NEG_INFINITY), 0xff80);
        assert!(widen(round(f32::NAN)).is_nan());
        assert_eq!(round(f32::from_bits(0x7f80_0001)), 0x7fc0); // signalling NaN: quieted
        assert_eq!(widen(0x4049), 3.140625);
        // The instruction (where the CPU has it) and the scalar rule agree on every kind of value.
        let mut v: Vec<f32> = data(4099, 3);
        v.extend([
            f32::from_bits(1),
            -f32::from_bits(0x0040_0000),
            f32::MIN_POSITIVE,
            f32::MAX,
            -f32::MAX,
            f32::INFINITY,
            f32::NAN,
            f32::from_bits(0xffc1_2345),
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            -0.0,
        ]);
        for i in 0..4096u32 {
            v.push(f32::from_bits(0x3f80_0000 | (i << 4) | 0x8)); // ties and near-ties
        }
        let mut scalar = vec![0u16; v.len()];
        let mut fast = vec![0u16; v.len()];
        round_slice_with(&v, &mut scalar, false);
        round_slice(&v, &mut fast);
        assert_eq!(scalar, fast);
        assert_eq!(scalar, v.iter().map(|&x| round(x)).collect::<Vec<_>>());
    }

    fn bf(len: usize, seed: u64) -> Vec<u16> {
        data(len, seed).iter().map(|&x| round(x)).collect()
    }

    /// Both kernels, every layout the training step uses (`X·W`, `dY·Wᵀ`, `Xᵀ·dY`), odd K (a
    /// half pair), partial tiles and several K blocks: each output within the error bound of an
    /// f32 sum of exact products, `(K + 1) · 2⁻²⁴ · Σ|a·b|`, of the f64 sum; and exactly zero
    /// for K = 0.
    #[test]
    fn both_kernels_within_the_f32_summation_bound_on_every_layout() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (13, 33, 7),
            (25, 70, 515),
            (40, 31, 1030),
            (3, 5, 0),
        ] {
            let a = bf(m * k, 1);
            let b = bf(k * n, 2);
            let at = bf(m * k, 1); // the same values stored transposed below
            let mut a_t = vec![0u16; m * k];
            let mut b_t = vec![0u16; k * n];
            for i in 0..m {
                for kk in 0..k {
                    a_t[kk * m + i] = at[i * k + kk];
                }
            }
            for kk in 0..k {
                for j in 0..n {
                    b_t[j * k + kk] = b[kk * n + j];
                }
            }
            let views = [
                (View::rows(&a, k), View::rows(&b, n)),
                (View::rows(&a, k), View::rows(&b_t, k).t()),
                (View::rows(&a_t, m).t(), View::rows(&b, n)),
            ];
            for (av, bv) in views {
                let (want, scale) = reference(m, n, k, av, bv);
                for native in [true, false] {
                    let mut c = vec![f32::NAN; m * n];
                    assert!(gemm_with(m, n, k, av, bv, &mut c, Isa::detected(), native));
                    for ((&got, &w), &s) in c.iter().zip(&want).zip(&scale) {
                        let bound = (k as f64 + 1.0) * 2f64.powi(-24) * s;
                        assert!(
                            (got as f64 - w).abs() <= bound,
                            "{m}×{n}×{k} native {native}: {got} vs {w} (bound {bound})"
                        );
                    }
                }
            }
        }
    }

    /// Against the f32 product of the unrounded operands: within the bf16 rounding of both
    /// inputs, `(2·2⁻⁹ + 2⁻¹⁶ + (K + 1)·2⁻²⁴) · Σ|a·b|` — what switching the mode on costs.
    #[test]
    fn bf16_product_is_within_the_input_rounding_of_the_f32_product() {
        let (m, n, k) = (17, 45, 300);
        let (a, b) = (data(m * k, 5), data(k * n, 6));
        let mut ab = vec![0u16; a.len()];
        let mut bb = vec![0u16; b.len()];
        round_slice(&a, &mut ab);
        round_slice(&b, &mut bb);
        let mut c = vec![0f32; m * n];
        assert!(gemm(
            m,
            n,
            k,
            View::rows(&ab, k),
            View::rows(&bb, n),
            &mut c,
            Isa::detected()
        ));
        let mut moved = 0usize;
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut scale) = (0f64, 0f64);
                for kk in 0..k {
                    let p = a[i * k + kk] as f64 * b[kk * n + j] as f64;
                    exact += p;
                    scale += p.abs();
                }
                let bound =
                    (2.0 * 2f64.powi(-9) + 2f64.powi(-16) + (k as f64 + 1.0) * 2f64.powi(-24))
                        * scale;
                let err = (c[i * n + j] as f64 - exact).abs();
                assert!(err <= bound, "({i}, {j}): {} vs {exact}", c[i * n + j]);
                moved += (err > 1e-6 * scale) as usize;
            }
        }
        // The rounding is real: most outputs move (a kernel that ignored the mode would not).
        assert!(moved > m * n / 2, "{moved} of {} moved", m * n);
    }

    /// The bits of a row depend neither on the other rows (batch), nor on the thread count, nor
    /// on the K blocking (K across several blocks vs the same sums computed row by row).
    #[test]
    fn bits_do_not_depend_on_threads_or_batch() {
        let (m, n, k) = (50, 70, 700);
        let (a, b) = (bf(m * k, 7), bf(k * n, 8));
        for native in [true, false] {
            let mut all = vec![0f32; m * n];
            assert!(gemm_with(
                m,
                n,
                k,
                View::rows(&a, k),
                View::rows(&b, n),
                &mut all,
                Isa::detected(),
                native
            ));
            let one = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            let mut serial = vec![0f32; m * n];
            one.install(|| {
                assert!(gemm_with(
                    m,
                    n,
                    k,
                    View::rows(&a, k),
                    View::rows(&b, n),
                    &mut serial,
                    Isa::detected(),
                    native
                ))
            });
            assert_eq!(crate::testing::bits(&all), crate::testing::bits(&serial));
            for i in [0, 13, 49] {
                let mut row = vec![0f32; n];
                let av = View {
                    data: &a,
                    off: i * k,
                    rs: k,
                    cs: 1,
                };
                assert!(gemm_with(
                    1,
                    n,
                    k,
                    av,
                    View::rows(&b, n),
                    &mut row,
                    Isa::detected(),
                    native
                ));
                assert_eq!(
                    crate::testing::bits(&row),
                    crate::testing::bits(&all[i * n..][..n])
                );
            }
        }
    }
}
