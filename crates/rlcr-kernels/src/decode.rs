//! Decode-shaped products `x · W` (a few rows of activations against a large row-major or
//! packed weight matrix) and decode attention, on f32 slices.
//!
//! Why: while sampling, every projection is `[B, in] × [in, out]` with `B` ≈ 8, and the step is
//! bound by streaming the weights from memory. gemm (burn Flex's matmul) runs these shapes with its
//! 16×6 microkernel, which for 8 rows walks the weights twice (a 6-column and a 2-column pass) and
//! reached about a sixth of the machine's streaming bandwidth (measured: 68 ms CPU for the
//! SmolLM2 LM head, 113 MB, against 11 ms to stream 113 MB). [`matmul_rows`] reads every weight
//! once, in 16-row bands streamed left to right: for 8 output columns at a time it keeps up to 8
//! rows of accumulators in AVX registers (one 8-wide weight load, then a broadcast and an FMA per
//! activation row), and splits the columns over rayon's threads.
//!
//! **Packed weights** ([`PackedPanels`]): the row-major kernel still walks 16 weight rows at a
//! stride of a whole row, which caches and prefetchers handle poorly for wide matrices. A copy of
//! a weight in 16-column panels (`[N/16][K][16]`, each panel one contiguous stream, the last one
//! zero-padded) is read once per step by [`packed_matmul`], which keeps a 6-row × 16-column tile
//! of accumulators in 12 AVX registers (2 weight loads and 6 broadcasts per 12 FMAs), or on
//! AVX-512F a 12-row × 32-column tile (two panels) in 24 zmm registers, panel outer and row
//! groups inner (the panel stays in cache for the other row groups), columns split over rayon.
//!
//! **bf16 panels** ([`PackPrecision`]): a matrix whose values are all bf16 numbers is packed as
//! bf16 and widened to f32 in registers (a shift), giving the same results bit for bit with half
//! the bytes streamed; rounding other weights to bf16 ([`PackPrecision::Bf16Rounded`]) is opt-in because it
//! changes the numbers.
//!
//! **Decode attention** ([`decode_attention`]): one query token per row against the KV cache,
//! split over rayon by (row, KV head).
//!
//! Row-count invariance: every product output is summed from zero in the order of K with one
//! fused multiply-add per term, whatever the number of rows and their grouping, on every ISA
//! (all kernels here and [`crate::sgemm`] agree bit for bit), and attention rows are
//! independent, so a row's result never depends on the batch it is in (the sampler relies on
//! this: it never pads batches).
use rayon::prelude::*;

use crate::Isa;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackPrecision {
    /// f32 panels: the same numbers as the unpacked weight.
    F32,
    /// bf16 panels when every value of the weight is exactly a bf16 number (a checkpoint stored
    /// in bf16, the common case), else f32: always the same results as [`PackPrecision::F32`],
    /// with half the bytes streamed when it applies. The default.
    Bf16IfExact,
    /// bf16 panels, rounding f32 weights to the nearest bf16 (ties to even): changes the numbers
    /// (about 3 significant digits per weight); opt-in only.
    Bf16Rounded,
}

/// Columns per packed panel (two AVX registers).
const PANEL: usize = 16;

/// Packed panels: `ceil(N / 16)` panels of `K × 16` values, row-major within a panel, the last
/// panel padded with zero columns.
enum Panels {
    F32(Vec<f32>),
    /// bf16 bit patterns (the high half of the f32).
    Bf16(Vec<u16>),
}

/// A weight `[K, N]` repacked into 16-column panels for [`packed_matmul`].
pub struct PackedPanels {
    k: usize,
    n: usize,
    panels: Panels,
}

impl std::fmt::Debug for PackedPanels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = match self.panels {
            Panels::F32(_) => "f32",
            Panels::Bf16(_) => "bf16",
        };
        write!(f, "PackedPanels[{}, {}, {p}]", self.k, self.n)
    }
}

/// f32 → bf16 bits, rounding to nearest, ties to even (NaN stays NaN).
fn bf16_round(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// `[K, N]` row-major → 16-column panels of `T` (zero-padded), panels in parallel.
fn pack_panels<T: Copy + Default + Send + Sync>(
    data: &[f32],
    k: usize,
    n: usize,
    conv: impl Fn(f32) -> T + Sync,
) -> Vec<T> {
    let groups = n.div_ceil(PANEL);
    let mut panels = vec![T::default(); groups * k * PANEL];
    panels
        .par_chunks_mut(k * PANEL)
        .enumerate()
        .for_each(|(g, panel)| {
            let c0 = g * PANEL;
            let cols = (n - c0).min(PANEL);
            for kk in 0..k {
                let src = &data[kk * n + c0..kk * n + c0 + cols];
                for (d, &s) in panel[kk * PANEL..kk * PANEL + cols].iter_mut().zip(src) {
                    *d = conv(s);
                }
            }
        });
    panels
}

impl PackedPanels {
    /// Pack the row-major `w: [K, N]` (`w.len() == k · n`) in `precision`.
    ///
    /// # Panics
    /// If `w` does not hold `k · n` values (a caller bug).
    pub fn pack(w: &[f32], k: usize, n: usize, precision: PackPrecision) -> Self {
        assert_eq!(w.len(), k * n, "weight of {} values for {k}×{n}", w.len());
        let bf16 = match precision {
            PackPrecision::F32 => false,
            PackPrecision::Bf16Rounded => true,
            PackPrecision::Bf16IfExact => w.iter().all(|x| x.to_bits() & 0xffff == 0),
        };
        let panels = if bf16 {
            Panels::Bf16(pack_panels(w, k, n, bf16_round))
        } else {
            Panels::F32(pack_panels(w, k, n, |x| x))
        };
        PackedPanels { k, n, panels }
    }

    /// `K` (rows of the packed weight).
    pub fn k(&self) -> usize {
        self.k
    }

    /// `N` (columns of the packed weight).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Whether the panels hold bf16 values.
    pub fn is_bf16(&self) -> bool {
        matches!(self.panels, Panels::Bf16(_))
    }

    /// Bytes of packed weights.
    pub fn bytes(&self) -> usize {
        match &self.panels {
            Panels::F32(v) => v.len() * 4,
            Panels::Bf16(v) => v.len() * 2,
        }
    }
}

/// Rows per register tile of the packed AVX2 kernel (× 16 columns = 12 accumulators).
const TILE_ROWS: usize = 6;

/// Rows per register tile of the packed AVX-512 kernel (× 32 columns = 24 of the 32 registers).
const TILE_ROWS_512: usize = 12;

/// `x · w` for the row-major `x: [m, k]` (`x.len() == m · k`, `k` = `p.k()`) through the packed
/// copy `p` of `w`, on the kernels of `isa` (lowered to what the CPU has): `[m, N]` row-major, or
/// `None` for [`Isa::Scalar`] (a CPU without AVX2 + FMA), `m == 0` or a `k` that is not `p`'s.
///
/// Every output element is `Σ_k x[r, k] · w[k, c]` accumulated from zero in the order of `k`
/// with one fused multiply-add per term, whatever the number of rows, their grouping or the ISA,
/// so a row's result does not depend on the batch it is in.
pub fn packed_matmul(x: &[f32], m: usize, p: &PackedPanels, isa: Isa) -> Option<Vec<f32>> {
    let isa = isa.clamp();
    let k = p.k;
    if m == 0 || x.len() != m * k || isa < Isa::Avx2 {
        return None;
    }
    let n = p.n;
    let avx512 = isa == Isa::Avx512;
    // Row groups of near-equal size, at most TILE_ROWS (AVX2) or TILE_ROWS_512 each.
    let tile_rows = if avx512 { TILE_ROWS_512 } else { TILE_ROWS };
    let n_groups = m.div_ceil(tile_rows);
    let row_groups = transpose_row_groups(x, m, k, m.div_ceil(n_groups));
    let mut out = vec![0f32; m * n];
    let ptr = OutPtr(out.as_mut_ptr());
    let panels = n.div_ceil(PANEL);
    let jobs = (rayon::current_num_threads() * 2).clamp(1, panels);
    // The AVX-512 tile takes two panels at a time: jobs start on even panels.
    let per = if avx512 {
        panels.div_ceil(jobs).next_multiple_of(2)
    } else {
        panels.div_ceil(jobs)
    };
    let panel_bytes = k
        * PANEL
        * if matches!(p.panels, Panels::Bf16(_)) {
            2
        } else {
            4
        };
    let (wptr, bf16) = match &p.panels {
        Panels::F32(v) => (v.as_ptr() as *const u8, false),
        Panels::Bf16(v) => (v.as_ptr() as *const u8, true),
    };
    let weights = WPtr(wptr);
    (0..jobs).into_par_iter().for_each(|j| {
        // Whole-struct captures (the wrappers are Send + Sync, their raw pointers are not).
        let out = ptr;
        let wptr = weights;
        let (g0, g1) = ((j * per).min(panels), ((j + 1) * per).min(panels));
        if avx512 {
            // Two panels (32 columns) outer, row groups inner.
            for g in (g0..g1).step_by(2) {
                let pair = if g + 1 < g1 { 2 } else { 1 };
                let c0 = g * PANEL;
                let cols = (n - c0).min(pair * PANEL) - (pair - 1) * PANEL;
                for (r0, r, xt) in &row_groups {
                    // SAFETY: panels g..g+pair exist; columns c0..c0+(pair-1)*16+cols of rows
                    // r0..r0+r are inside `out` and written only by this job; avx512f was
                    // detected (`isa` is clamped to the CPU).
                    unsafe {
                        tile512_dispatch(
                            *r,
                            pair,
                            bf16,
                            xt,
                            k,
                            wptr.0.add(g * panel_bytes),
                            panel_bytes,
                            out.0.add(r0 * n + c0),
                            n,
                            cols,
                        );
                    }
                }
            }
            return;
        }
        // Panel outer, row groups inner: a panel is read from memory once and stays in cache for
        // the remaining row groups.
        for g in g0..g1 {
            let c0 = g * PANEL;
            let cols = (n - c0).min(PANEL);
            for (r0, r, xt) in &row_groups {
                // SAFETY: panel g exists (k × 16 values of the packed type); columns
                // c0..c0+cols of rows r0..r0+r are inside `out` and written only by this job;
                // `isa` (clamped to the CPU) is at least AVX2 + FMA.
                unsafe {
                    let off = g * panel_bytes;
                    tile_dispatch(
                        *r,
                        bf16,
                        xt,
                        k,
                        wptr.0.add(off),
                        out.0.add(r0 * n + c0),
                        n,
                        cols,
                    );
                }
            }
        }
    });
    Some(out)
}

/// Packed-weight pointer shared by the jobs (read only).
#[derive(Clone, Copy)]
struct WPtr(*const u8);
// SAFETY: the panels are only read while `packed_matmul` borrows the packed matrix.
unsafe impl Send for WPtr {}
unsafe impl Sync for WPtr {}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_dispatch(
    r: usize,
    bf16: bool,
    xt: &[f32],
    k: usize,
    panel: *const u8,
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    macro_rules! go {
        ($r:literal) => {
            if bf16 {
                avx::tile16::<$r, true>(xt, k, panel, out, ldo, cols)
            } else {
                avx::tile16::<$r, false>(xt, k, panel, out, ldo, cols)
            }
        };
    }
    // SAFETY: forwarded contract of `packed_matmul`.
    unsafe {
        match r {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            4 => go!(4),
            5 => go!(5),
            _ => go!(6),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile512_dispatch(
    r: usize,
    pair: usize,
    bf16: bool,
    xt: &[f32],
    k: usize,
    panels: *const u8,
    panel_bytes: usize,
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    macro_rules! go {
        ($r:literal) => {
            match (pair, bf16) {
                (2, true) => {
                    avx512::tile::<$r, 2, true>(xt, k, panels, panel_bytes, out, ldo, cols)
                }
                (2, false) => {
                    avx512::tile::<$r, 2, false>(xt, k, panels, panel_bytes, out, ldo, cols)
                }
                (_, true) => {
                    avx512::tile::<$r, 1, true>(xt, k, panels, panel_bytes, out, ldo, cols)
                }
                (_, false) => {
                    avx512::tile::<$r, 1, false>(xt, k, panels, panel_bytes, out, ldo, cols)
                }
            }
        };
    }
    // SAFETY: forwarded contract of `packed_matmul_isa`.
    unsafe {
        match r {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            4 => go!(4),
            5 => go!(5),
            6 => go!(6),
            7 => go!(7),
            8 => go!(8),
            9 => go!(9),
            10 => go!(10),
            11 => go!(11),
            _ => go!(12),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn tile512_dispatch(
    _r: usize,
    _pair: usize,
    _bf16: bool,
    _xt: &[f32],
    _k: usize,
    _panels: *const u8,
    _panel_bytes: usize,
    _out: *mut f32,
    _ldo: usize,
    _cols: usize,
) {
    unreachable!("the CPU fast path is only enabled on x86-64")
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_dispatch(
    _r: usize,
    _bf16: bool,
    _xt: &[f32],
    _k: usize,
    _panel: *const u8,
    _out: *mut f32,
    _ldo: usize,
    _cols: usize,
) {
    unreachable!("the CPU fast path is only enabled on x86-64")
}

/// Shape of a [`decode_attention`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Rows (sequences) of the batch.
    pub batch: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Query heads per key/value head.
    pub group: usize,
    /// Head dimension.
    pub dim: usize,
    /// Slots of the cache buffers.
    pub cap: usize,
    /// Slots in use (`1..=cap`).
    pub len: usize,
}

/// Attention of one new token per row against a KV cache (decode steps).
///
/// `q: [B, K, g, d]` (the `g` query heads sharing each key/value head), `k`, `v`: `[B, K, cap,
/// d]` cache buffers of which slots `0..len` are used, all row-major; `keys_ok: [B · len]` says
/// which slots each row may attend to. For every row, head and query: scores `s_j = scale ·
/// q·k_j` over the allowed slots, `p = softmax(s)` (max subtracted, f32), output `Σ_j p_j v_j`:
/// `[B, K, g, d]`. Rows are independent (a row's result does not depend on the batch), work is
/// split over rayon by (row, key/value head).
///
/// # Panics
/// If a slice is shorter than its shape says, or `len` is 0 or above `cap` (caller bugs).
pub fn decode_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttentionShape,
    keys_ok: &[bool],
    scale: f32,
) -> Vec<f32> {
    let AttentionShape {
        batch: b,
        kv_heads: kh,
        group: g,
        dim: d,
        cap,
        len,
    } = shape;
    assert!(len >= 1 && len <= cap && keys_ok.len() == b * len);
    let qs = &q[..b * kh * g * d];
    let ks = &k[..b * kh * cap * d];
    let vs = &v[..b * kh * cap * d];
    let mut out = vec![0f32; b * kh * g * d];
    out.par_chunks_mut(g * d).enumerate().for_each_init(
        || vec![0f32; len],
        |scores, (bh, o)| {
            let row = bh / kh;
            let ok = &keys_ok[row * len..(row + 1) * len];
            let kb = &ks[bh * cap * d..bh * cap * d + len * d];
            let vb = &vs[bh * cap * d..bh * cap * d + len * d];
            for (qi, oq) in o.chunks_exact_mut(d).enumerate() {
                let qv = &qs[(bh * g + qi) * d..(bh * g + qi + 1) * d];
                let mut max = f32::NEG_INFINITY;
                for (j, s) in scores.iter_mut().enumerate() {
                    if ok[j] {
                        let kj = &kb[j * d..(j + 1) * d];
                        let dot: f32 = qv.iter().zip(kj).map(|(a, b)| a * b).sum();
                        *s = dot * scale;
                        max = max.max(*s);
                    }
                }
                let mut sum = 0f32;
                for (j, s) in scores.iter_mut().enumerate() {
                    *s = if ok[j] { (*s - max).exp() } else { 0.0 };
                    sum += *s;
                }
                oq.fill(0.0);
                if sum > 0.0 {
                    let inv = 1.0 / sum;
                    for (j, &p) in scores.iter().enumerate() {
                        if p != 0.0 {
                            let w = p * inv;
                            for (x, &y) in oq.iter_mut().zip(&vb[j * d..(j + 1) * d]) {
                                *x += w * y;
                            }
                        }
                    }
                }
            }
        },
    );
    out
}

/// Rows of `x: [m, k]` in groups of up to `size`, each transposed to `[k, r]` so the kernels'
/// broadcasts read consecutive floats: `(first row, rows, data)`.
fn transpose_row_groups(
    x: &[f32],
    m: usize,
    k: usize,
    size: usize,
) -> Vec<(usize, usize, Vec<f32>)> {
    (0..m)
        .step_by(size)
        .map(|r0| {
            let r = (m - r0).min(size);
            let mut xt = vec![0f32; k * r];
            for kk in 0..k {
                for i in 0..r {
                    xt[kk * r + i] = x[(r0 + i) * k + kk];
                }
            }
            (r0, r, xt)
        })
        .collect()
}

/// Which of rlcr's own CPU kernels run (ordered: each level includes the one below).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: jobs write disjoint column ranges of the output; the buffer outlives the parallel loop.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `x · w` for the row-major `x: [m, k]` and `w: [k, n]` on the row-major kernel (best up to
/// about 16 rows and before weights are packed): `[m, n]` row-major, or `None` when `isa` (lowered
/// to the CPU's) is below AVX2, or a dimension is 0. Every output is one FMA chain over K from
/// zero: the bits of [`packed_matmul`] and [`crate::sgemm::sgemm`].
///
/// # Panics
/// If `x` or `w` is shorter than its shape (a caller bug).
pub fn matmul_rows(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    isa: Isa,
) -> Option<Vec<f32>> {
    if isa.clamp() < Isa::Avx2 || m == 0 || k == 0 || n == 0 {
        return None;
    }
    assert!(
        x.len() >= m * k && w.len() >= k * n,
        "operands shorter than {m}×{k}×{n}"
    );
    let mut out = vec![0f32; m * n];
    let ptr = OutPtr(out.as_mut_ptr());
    // Columns in blocks of 8, spread over 2 jobs per thread (the last job takes the tail).
    let groups = n / 8;
    let jobs = (rayon::current_num_threads() * 2).clamp(1, groups.max(1));
    let per = groups.div_ceil(jobs);
    let row_groups = transpose_row_groups(x, m, k, 8);
    (0..jobs).into_par_iter().for_each(|j| {
        let g0 = j * per;
        let g1 = ((j + 1) * per).min(groups);
        if g0 >= g1 {
            return;
        }
        let out = ptr;
        for (r0, r, xt) in &row_groups {
            // SAFETY: columns g0*8..g1*8 of rows r0..r0+r are inside `out` and written only by
            // this job; `w` holds k*n floats; avx2+fma were detected by the caller.
            unsafe {
                kernel_dispatch(
                    *r,
                    xt,
                    k,
                    w.as_ptr().add(g0 * 8),
                    n,
                    out.0.add(r0 * n + g0 * 8),
                    n,
                    g1 - g0,
                );
            }
        }
        if g1 == groups {
            // Tail columns (n % 8) in scalar code.
            for (r0, r, xt) in &row_groups {
                for c in groups * 8..n {
                    for i in 0..*r {
                        let mut s = 0f32;
                        for kk in 0..k {
                            s = xt[kk * r + i].mul_add(w[kk * n + c], s);
                        }
                        // SAFETY: as above, a column owned by this job.
                        unsafe { *out.0.add((r0 + i) * n + c) = s };
                    }
                }
            }
        }
    });
    Some(out)
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_dispatch(
    r: usize,
    xt: &[f32],
    k: usize,
    w: *const f32,
    ldw: usize,
    out: *mut f32,
    ldo: usize,
    groups: usize,
) {
    // SAFETY: forwarded contract of `matmul_rows`.
    unsafe {
        match r {
            1 => avx::rows_cols8::<1>(xt, k, w, ldw, out, ldo, groups),
            2 => avx::rows_cols8::<2>(xt, k, w, ldw, out, ldo, groups),
            3 => avx::rows_cols8::<3>(xt, k, w, ldw, out, ldo, groups),
            4 => avx::rows_cols8::<4>(xt, k, w, ldw, out, ldo, groups),
            5 => avx::rows_cols8::<5>(xt, k, w, ldw, out, ldo, groups),
            6 => avx::rows_cols8::<6>(xt, k, w, ldw, out, ldo, groups),
            7 => avx::rows_cols8::<7>(xt, k, w, ldw, out, ldo, groups),
            _ => avx::rows_cols8::<8>(xt, k, w, ldw, out, ldo, groups),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_dispatch(
    _r: usize,
    _xt: &[f32],
    _k: usize,
    _w: *const f32,
    _ldw: usize,
    _out: *mut f32,
    _ldo: usize,
    _groups: usize,
) {
    unreachable!("the CPU fast path is only enabled on x86-64")
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    /// Weight rows per pass: each pass streams `KB` rows of the job's columns in parallel, few
    /// enough sequential streams for the hardware prefetchers, while the accumulators of a column
    /// group stay in registers for `KB` steps.
    const KB: usize = 16;

    /// For `R ≤ 6` rows and one 16-column panel (`k × 16` values, f32 or, with `BF16`, bf16
    /// bit patterns): `out[r, c] = Σ_k xt[k·R + r] · panel[k, c]` for `c < cols`, summed from
    /// zero in the order of `k` with fused multiply-adds (12 accumulators in registers).
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `panel` readable for `k · 16` values, `out` writable for
    /// `R` rows of stride `ldo` and `cols ≤ 16` columns, `xt.len() >= k·R`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile16<const R: usize, const BF16: bool>(
        xt: &[f32],
        k: usize,
        panel: *const u8,
        out: *mut f32,
        ldo: usize,
        cols: usize,
    ) {
        debug_assert!(xt.len() >= k * R);
        let xp = xt.as_ptr();
        // SAFETY: pointer arithmetic stays inside the regions promised by the caller.
        unsafe {
            let mut lo = [_mm256_setzero_ps(); R];
            let mut hi = [_mm256_setzero_ps(); R];
            for kk in 0..k {
                let (w0, w1) = if BF16 {
                    let p = (panel as *const u16).add(kk * 16);
                    let a = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                    let b = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(8) as *const __m128i));
                    (
                        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(a)),
                        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(b)),
                    )
                } else {
                    let p = (panel as *const f32).add(kk * 16);
                    (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
                };
                let xr = xp.add(kk * R);
                for r in 0..R {
                    let x = _mm256_broadcast_ss(&*xr.add(r));
                    lo[r] = _mm256_fmadd_ps(x, w0, lo[r]);
                    hi[r] = _mm256_fmadd_ps(x, w1, hi[r]);
                }
            }
            if cols == 16 {
                for r in 0..R {
                    _mm256_storeu_ps(out.add(r * ldo), lo[r]);
                    _mm256_storeu_ps(out.add(r * ldo + 8), hi[r]);
                }
            } else {
                let mut tmp = [0f32; 16];
                for r in 0..R {
                    _mm256_storeu_ps(tmp.as_mut_ptr(), lo[r]);
                    _mm256_storeu_ps(tmp.as_mut_ptr().add(8), hi[r]);
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), out.add(r * ldo), cols);
                }
            }
        }
    }

    /// For `R ≤ 8` rows and `groups` blocks of 8 columns:
    /// `out[r, c] = Σ_k xt[k·R + r] · w[k, c]`.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `w` must be readable for `k` rows of stride `ldw` and
    /// `8·groups` columns, `out` writable for `R` rows of stride `ldo` and `8·groups` columns,
    /// and `xt.len() >= k·R`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rows_cols8<const R: usize>(
        xt: &[f32],
        k: usize,
        w: *const f32,
        ldw: usize,
        out: *mut f32,
        ldo: usize,
        groups: usize,
    ) {
        debug_assert!(xt.len() >= k * R);
        let xp = xt.as_ptr();
        let mut k0 = 0;
        while k0 < k {
            let k1 = (k0 + KB).min(k);
            for g in 0..groups {
                // SAFETY: pointer arithmetic stays inside the regions promised by the caller.
                unsafe {
                    let mut acc = [_mm256_setzero_ps(); R];
                    if k0 > 0 {
                        for (r, a) in acc.iter_mut().enumerate() {
                            *a = _mm256_loadu_ps(out.add(r * ldo + g * 8));
                        }
                    }
                    let wp = w.add(g * 8);
                    for kk in k0..k1 {
                        let wv = _mm256_loadu_ps(wp.add(kk * ldw));
                        let xr = xp.add(kk * R);
                        for (r, a) in acc.iter_mut().enumerate() {
                            let x = _mm256_broadcast_ss(&*xr.add(r));
                            *a = _mm256_fmadd_ps(x, wv, *a);
                        }
                    }
                    for (r, a) in acc.iter().enumerate() {
                        _mm256_storeu_ps(out.add(r * ldo + g * 8), *a);
                    }
                }
            }
            k0 = k1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// For `R ≤ 12` rows and `P` (1 or 2) consecutive 16-column panels (each `k × 16` values,
    /// f32 or, with `BF16`, bf16 bit patterns; panel `p` starts `p · panel_bytes` after
    /// `panels`): `out[r, 16·p + c] = Σ_k xt[k·R + r] · panel_p[k, c]`, for every column of the
    /// first `P − 1` panels and the first `cols` columns of the last one. Summed from zero in the
    /// order of `k` with one fused multiply-add per term: the same numbers, bit for bit, as the
    /// AVX2 kernel (`R·P` accumulators in zmm registers, one weight load per panel and one
    /// broadcast per row for every `k`).
    ///
    /// # Safety
    /// AVX-512F must be available; `panels` readable for `P` panels, `out` writable for `R` rows
    /// of stride `ldo` and the columns above, `xt.len() >= k·R`, `1 ≤ cols ≤ 16`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile<const R: usize, const P: usize, const BF16: bool>(
        xt: &[f32],
        k: usize,
        panels: *const u8,
        panel_bytes: usize,
        out: *mut f32,
        ldo: usize,
        cols: usize,
    ) {
        debug_assert!(xt.len() >= k * R && (1..=16).contains(&cols));
        let xp = xt.as_ptr();
        // SAFETY: pointer arithmetic stays inside the regions promised by the caller.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); P]; R];
            for kk in 0..k {
                let mut w = [_mm512_setzero_ps(); P];
                for (p, wp) in w.iter_mut().enumerate() {
                    let base = panels.add(p * panel_bytes);
                    *wp = if BF16 {
                        let q = (base as *const u16).add(kk * 16);
                        let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(q as *const __m256i));
                        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
                    } else {
                        _mm512_loadu_ps((base as *const f32).add(kk * 16))
                    };
                }
                let xr = xp.add(kk * R);
                for (r, row) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(*xr.add(r));
                    for (a, wp) in row.iter_mut().zip(&w) {
                        *a = _mm512_fmadd_ps(x, *wp, *a);
                    }
                }
            }
            let tail: __mmask16 = if cols >= 16 {
                0xffff
            } else {
                ((1u32 << cols) - 1) as __mmask16
            };
            for (r, row) in acc.iter().enumerate() {
                for (p, a) in row.iter().enumerate() {
                    let o = out.add(r * ldo + p * 16);
                    if p + 1 == P {
                        _mm512_mask_storeu_ps(o, tail, *a);
                    } else {
                        _mm512_storeu_ps(o, *a);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sgemm::{reference, View};

    fn vals(len: usize, mul: usize, modu: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * mul % modu) as f32 - (modu / 2) as f32) / 31.0 + 1e-3 * (i % 5) as f32)
            .collect()
    }

    use crate::testing::isas;

    /// The packed kernels (AVX-512 and the AVX2 fallback forced on this machine, f32 and bf16
    /// panels, every row count up to 64, odd panel counts, a partial last panel) and the
    /// row-major kernel give the bits of the scalar FMA chain, row by row whatever the row count;
    /// `Scalar` has no kernel.
    #[test]
    fn every_kernel_and_row_count_gives_the_chain_bits() {
        if isas().is_empty() {
            return;
        }
        for &(k, n) in &[(37, 13), (64, 48), (29, 85), (576, 200)] {
            let w = vals(k * n, 43, 107);
            let x = vals(64 * k, 41, 113);
            for precision in [PackPrecision::F32, PackPrecision::Bf16Rounded] {
                let p = PackedPanels::pack(&w, k, n, precision);
                let wq: Vec<f32> = if p.is_bf16() {
                    w.iter()
                        .map(|&v| half::bf16::from_f32(v).to_f32())
                        .collect()
                } else {
                    w.clone()
                };
                let all = reference(64, n, k, View::rows(&x, k), View::rows(&wq, n));
                for m in (1..=64).filter(|m| m % 7 < 3 || *m == 64) {
                    for isa in isas() {
                        let got = packed_matmul(&x[..m * k], m, &p, isa).unwrap();
                        assert_eq!(got, all[..m * n], "{m}x{k}x{n} {precision:?} {isa:?}");
                    }
                    assert!(packed_matmul(&x[..m * k], m, &p, Isa::Scalar).is_none());
                    if m <= 16 && !p.is_bf16() {
                        let rows = matmul_rows(&x[..m * k], m, k, &w, n, Isa::Avx2).unwrap();
                        assert_eq!(rows, all[..m * n], "row-major {m}x{k}x{n}");
                    }
                }
            }
        }
    }

    /// Exact bf16 weights pack as bf16 by default (half the bytes) with the f32 panels' bits.
    #[test]
    fn bf16_panels_are_exact_for_bf16_weights() {
        if isas().is_empty() {
            return;
        }
        let (m, k, n) = (8, 64, 389);
        let w: Vec<f32> = vals(k * n, 31, 83)
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect();
        let x = vals(m * k, 29, 89);
        let auto = PackedPanels::pack(&w, k, n, PackPrecision::Bf16IfExact);
        let f32p = PackedPanels::pack(&w, k, n, PackPrecision::F32);
        assert!(auto.is_bf16() && !f32p.is_bf16());
        assert_eq!(auto.bytes() * 2, f32p.bytes());
        let isa = isas()[0];
        assert_eq!(
            packed_matmul(&x, m, &auto, isa),
            packed_matmul(&x, m, &f32p, isa)
        );
        // Inexact weights stay f32.
        let inexact = vals(k * n, 31, 83);
        assert!(!PackedPanels::pack(&inexact, k, n, PackPrecision::Bf16IfExact).is_bf16());
    }
}
