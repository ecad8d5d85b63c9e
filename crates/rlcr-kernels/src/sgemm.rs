//! A packed f32 GEMM for training and prefill on x86-64: `C = A · B` with `A`, `B` given by
//! strides (so `Xᵀ` and `Wᵀ` are views, never copies), `C` row-major.
//!
//! Why a kernel of our own and not a crate: measured on the Intel Xeon of BENCHMARKS.md (one
//! thread, the training step's products, GFLOP per CPU-second against a 197.5 FMA peak), the
//! `gemm` crate (burn Flex's matmul) runs at ≈ 39 (20 %), OpenBLAS 0.3.21's SkylakeX kernels at
//! ≈ 150 and torch's MKL at ≈ 150. OpenBLAS would have to be loaded at run time (CI's clean
//! machine builds pure Rust), does not recognise this CPU (it falls back to its Prescott
//! kernels, 33, unless `OPENBLAS_CORETYPE` is set before it loads), and its results depend on
//! the batch (a small-matrix path below 10⁶ multiply-adds and thread-dependent K splits round
//! differently). This module reaches OpenBLAS's rate with the 12 × 32 register tile that
//! [`crate::decode`] already uses for decode, plus the cache blocking the decode kernel lacks, and
//! keeps the repository's determinism rule.
//!
//! **Blocking** (Goto / BLIS loop order): the output is cut along its longer side into about two
//! blocks per rayon thread (whole tiles), one job each. Inside a job, for every [`NC`]-column
//! block and every [`KC`]-step block of K, the job packs `B[k-block, n-block]` into 32-column
//! micro-panels (`KC × NC`, 1 MiB, kept in L2), then for every [`MC`]-row block packs `A` into
//! 12-row micro-panels and runs each micro-panel (`KC × 12`, 12 KiB, in L1) against every panel
//! of the packed `B`. The micro-kernel keeps the 12 × 32 tile in 24 zmm registers: per step of K
//! two loads of `B`, twelve broadcasts of `A`, 24 fused multiply-adds. Packing buffers are per job
//! (1.1 MiB), never a copy of a whole operand. Measured parameters (one thread, the step's
//! products, GFLOP per CPU-second at load ≈ 8): KC 256 / NC 512 / `B` panel in L1 and `A` from L2:
//! ≈ 98–119; the order above: 120–126; KC 128: 107; KC 384–512: no better.
//!
//! **Determinism**: every output is one chain of fused multiply-adds over `k = 0, 1, …, K−1`
//! starting from zero: the first K block starts its accumulators at zero, every later block
//! reloads them from `C`. So the bits depend neither on the blocking, nor on how the rows and
//! columns are split into jobs (thread count), nor on the number of rows (batch size); and they
//! are the bits of the decode kernels in [`crate::decode`] (same chain), so prefill and decode agree
//! exactly. The AVX2 kernel (6 × 16 tile) runs the same chain, so both ISAs give the same bits
//! (tested by forcing AVX2 on an AVX-512 machine). Without AVX2 + FMA there is no kernel: the
//! callers use burn's matmul (the gemm crate).
use rayon::prelude::*;

use crate::Isa;

/// Steps of K per block: a `KC × 32` panel slice (32 KiB) plus a `KC × 12` micro-panel (12 KiB)
/// fit in a 48 KiB L1.
pub const KC: usize = 256;
/// Rows per packed block of `A` (a multiple of both tile heights).
pub const MC: usize = 96;
/// Columns per packed block of `B` (a multiple of both tile widths): `KC × NC` (1 MiB) stays in
/// L2 (2 MiB per core on the Xeon measured).
pub const NC: usize = 1024;

/// A read-only strided matrix: element `(i, j)` is `data[off + i·rs + j·cs]` (f32 for
/// [`sgemm`], bf16 bit patterns (`u16`) for the bf16 module's `gemm`).
#[derive(Debug)]
pub struct View<'a, T = f32> {
    pub data: &'a [T],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<T> Clone for View<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for View<'_, T> {}

impl<'a, T> View<'a, T> {
    /// A row-major `[rows, cols]` matrix.
    pub fn rows(data: &'a [T], cols: usize) -> Self {
        View {
            data,
            off: 0,
            rs: cols,
            cs: 1,
        }
    }

    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        View {
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// The last element index touched by an `[m, n]` view (for bounds checks).
    pub(crate) fn end(&self, m: usize, n: usize) -> usize {
        if m == 0 || n == 0 {
            return self.off;
        }
        self.off + (m - 1) * self.rs + (n - 1) * self.cs + 1
    }
}

/// Tile sizes of an ISA: `(rows, columns)`.
fn tile(isa: Isa) -> Option<(usize, usize)> {
    match isa {
        Isa::Avx512 => Some((12, 32)),
        Isa::Avx2 => Some((6, 16)),
        Isa::Scalar => None,
    }
}

/// Whether [`sgemm`] has a kernel for `isa` on this CPU (AVX2 + FMA at least).
pub fn has_kernel(isa: Isa) -> bool {
    tile(isa.clamp()).is_some()
}

/// `C[m, n] = A[m, k] · B[k, n]` (C row-major, overwritten) on the kernels of `isa` (lowered to
/// what the CPU has). Returns `false`, leaving `c` untouched, when `isa` has no kernel
/// ([`Isa::Scalar`] or a CPU without AVX2 + FMA); the caller then uses another product.
///
/// Every output is `Σ_k A[i, k] · B[k, j]` summed from zero in the order of `k`, one fused
/// multiply-add per term, whatever `m`, `n`, the ISA or the number of threads.
///
/// # Panics
/// If a view or `c` is too short for its shape (a caller bug, not user input).
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    c: &mut [f32],
    isa: Isa,
) -> bool {
    run(m, n, k, a, b, c, isa, true)
}

/// [`sgemm`] with `B` given as bf16 bit patterns (`u16`), widened to f32 while its panels are
/// packed (exact): the bits of [`sgemm`] on the widened `B`, without a widened copy of `B` (the
/// packing buffer is the only f32 copy, one `KC × NC` block per job). For weights held in bf16
/// multiplied by f32 activations.
///
/// # Panics
/// If a view or `c` is too short for its shape (a caller bug, not user input).
pub fn sgemm_bf16_b(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_, u16>,
    c: &mut [f32],
    isa: Isa,
) -> bool {
    run(m, n, k, a, b, c, isa, true)
}

/// An element of `B` as [`pack_b`] reads it: f32, or a bf16 bit pattern widened exactly.
pub trait PackElem: Copy + Send + Sync {
    /// `dst[i] = src[i]` as f32.
    fn copy_strip(dst: &mut [f32], src: &[Self]);
    /// The value as f32.
    fn to_f32(self) -> f32;
}

impl PackElem for f32 {
    #[inline(always)]
    fn copy_strip(dst: &mut [f32], src: &[f32]) {
        copy_strip(dst, src)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl PackElem for u16 {
    #[inline(always)]
    fn copy_strip(dst: &mut [f32], src: &[u16]) {
        for (d, &h) in dst.iter_mut().zip(src) {
            *d = h.to_f32();
        }
    }
    /// The f32 whose top half is the bf16 pattern (exact; the same as the bf16 module's `widen`,
    /// written here so that the f32 GEMM does not depend on the bf16 one, which is built on it).
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self as u32) << 16)
    }
}

/// [`sgemm`] on the calling thread only (for callers that run many small products in parallel
/// themselves, e.g. attention over heads): the same bits.
pub fn sgemm_serial(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    c: &mut [f32],
    isa: Isa,
) -> bool {
    run(m, n, k, a, b, c, isa, false)
}

#[allow(clippy::too_many_arguments)]
fn run<TB: PackElem>(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_, TB>,
    c: &mut [f32],
    isa: Isa,
    parallel: bool,
) -> bool {
    let isa = isa.min(Isa::detected());
    let Some((mr, nr)) = tile(isa) else {
        return false;
    };
    assert!(c.len() >= m * n, "output of {} for {m}×{n}", c.len());
    assert!(
        a.data.len() >= a.end(m, k) && b.data.len() >= b.end(k, n),
        "view out of bounds"
    );
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        c[..m * n].fill(0.0);
        return true;
    }
    let jobs = Jobs::new(m, n, mr, nr, parallel);
    let ptr = OutPtr(c.as_mut_ptr());
    let job = |job: usize| {
        let out = ptr; // the whole struct (Send), not its raw-pointer field
        let (i0, i1, j0, j1) = jobs.block(job, m, n);
        // A row-major A is read in place by the micro-kernel (no packing: for the thin
        // products of attention, packing A cost about as much as the product); other layouts
        // are packed.
        let direct = a.cs == 1;
        // Packing buffers sized to this job's blocks (small products stay small).
        let mut bbuf = vec![0f32; KC.min(k) * NC.min(j1 - j0).next_multiple_of(nr)];
        let mut abuf = vec![0f32; KC.min(k) * MC.min(i1 - i0).next_multiple_of(mr)];
        for jc in (j0..j1).step_by(NC) {
            let nc = NC.min(j1 - jc);
            let mut k0 = 0;
            while k0 < k {
                let kc = KC.min(k - k0);
                pack_b(&b, k0, kc, jc, nc, nr, &mut bbuf);
                for ic in (i0..i1).step_by(MC) {
                    let mc = MC.min(i1 - ic);
                    if !direct {
                        pack_a(&a, ic, mc, k0, kc, mr, &mut abuf);
                    }
                    // One micro-panel of A (kc × 12, in L1) against every panel of the
                    // packed B block (kc × NC, in L2).
                    for ir in (0..mc).step_by(mr) {
                        let rows = (mc - ir).min(mr);
                        // The micro-panel: read in place (12 rows of kc consecutive values)
                        // for a whole tile of a row-major A, else packed.
                        let (ap, ars, acs) = if direct && rows == mr {
                            let start = a.off + (ic + ir) * a.rs + k0;
                            (a.data[start..].as_ptr(), a.rs, 1)
                        } else if direct {
                            pack_a(&a, ic + ir, rows, k0, kc, mr, &mut abuf);
                            (abuf.as_ptr(), 1, mr)
                        } else {
                            (abuf[(ir / mr) * kc * mr..][..kc * mr].as_ptr(), 1, mr)
                        };
                        for jr in (0..nc).step_by(nr) {
                            let cols = (nc - jr).min(nr);
                            let bp = &bbuf[(jr / nr) * kc * nr..][..kc * nr];
                            // SAFETY: rows ic+ir.. (rows of them) and columns jc+jr.. (cols)
                            // are inside the m × n output (row-major, stride n) and belong to
                            // this job only; the panels hold kc steps (an in-place A panel:
                            // rows ic+ir..+12 < m and steps k0..k0+kc ≤ k of the checked view);
                            // the ISA was clamped to the CPU's.
                            unsafe {
                                let cp = out.0.add((ic + ir) * n + jc + jr);
                                let first = k0 == 0;
                                let ap = APanel {
                                    ptr: ap,
                                    rs: ars,
                                    cs: acs,
                                };
                                match isa {
                                    #[cfg(target_arch = "x86_64")]
                                    Isa::Avx512 => {
                                        avx512::tile(kc, ap, bp, cp, n, rows, cols, first)
                                    }
                                    #[cfg(target_arch = "x86_64")]
                                    Isa::Avx2 => avx2::tile(kc, ap, bp, cp, n, rows, cols, first),
                                    _ => unreachable!("no kernel for {isa:?}"),
                                }
                            }
                        }
                    }
                }
                k0 += kc;
            }
        }
    };
    jobs.run(job);
    true
}

/// How a driver cuts an `m × n` output into jobs: along its longer side into about two blocks
/// per rayon thread (whole `mr × nr` tiles), each computed by one job with the blocked loops.
pub(crate) struct Jobs {
    pub rows_per: usize,
    pub cols_per: usize,
    pub row_jobs: usize,
    pub col_jobs: usize,
}

impl Jobs {
    pub(crate) fn new(m: usize, n: usize, mr: usize, nr: usize, parallel: bool) -> Jobs {
        let want = if parallel {
            (rayon::current_num_threads() * 2).max(1)
        } else {
            1
        };
        let (row_jobs, col_jobs) = if m >= n {
            (want.min(m.div_ceil(mr)), 1)
        } else {
            (1, want.min(n.div_ceil(nr)))
        };
        let rows_per = m.div_ceil(row_jobs).next_multiple_of(mr);
        let cols_per = n.div_ceil(col_jobs).next_multiple_of(nr);
        Jobs {
            rows_per,
            cols_per,
            row_jobs: m.div_ceil(rows_per),
            col_jobs: n.div_ceil(cols_per),
        }
    }

    /// The output block of job `job`: rows `i0..i1`, columns `j0..j1` of the `m × n` output.
    pub(crate) fn block(&self, job: usize, m: usize, n: usize) -> (usize, usize, usize, usize) {
        let (i0, j0) = (
            (job / self.col_jobs) * self.rows_per,
            (job % self.col_jobs) * self.cols_per,
        );
        (
            i0,
            (i0 + self.rows_per).min(m),
            j0,
            (j0 + self.cols_per).min(n),
        )
    }

    /// Runs `job` for every job: in parallel when there are several, else on this thread.
    pub(crate) fn run(&self, job: impl Fn(usize) + Send + Sync) {
        match self.row_jobs * self.col_jobs {
            1 => job(0),
            all => (0..all).into_par_iter().for_each(job),
        }
    }
}

/// The scalar reference every kernel reproduces bit for bit: `C[i, j] = Σ_k A[i, k] · B[k, j]`
/// as `acc = 0; acc = fma(A[i, k], B[k, j], acc)` over `k` in order, element by element (slow:
/// for tests, and for callers that need the exact bits without a kernel).
pub fn reference(m: usize, n: usize, k: usize, a: View<'_>, b: View<'_>) -> Vec<f32> {
    let at = |v: &View<'_>, i: usize, j: usize| v.data[v.off + i * v.rs + j * v.cs];
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f32;
            for kk in 0..k {
                acc = at(&a, i, kk).mul_add(at(&b, kk, j), acc);
            }
            c[i * n + j] = acc;
        }
    }
    c
}

/// Packs `B[k0..k0+kc, j0..j0+nc]` into `nr`-column micro-panels (`[nc/nr][kc][nr]`, the last
/// one zero-padded).
fn pack_b<TB: PackElem>(
    b: &View<'_, TB>,
    k0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    nr: usize,
    buf: &mut [f32],
) {
    for (p, panel) in buf
        .chunks_exact_mut(kc * nr)
        .take(nc.div_ceil(nr))
        .enumerate()
    {
        let jp = j0 + p * nr;
        let w = (j0 + nc - jp).min(nr);
        for (kk, dst) in panel.chunks_exact_mut(nr).enumerate() {
            let base = b.off + (k0 + kk) * b.rs + jp * b.cs;
            if b.cs == 1 {
                TB::copy_strip(&mut dst[..w], &b.data[base..base + w]);
            } else {
                for (j, v) in dst[..w].iter_mut().enumerate() {
                    *v = b.data[base + j * b.cs].to_f32();
                }
            }
            dst[w..].fill(0.0);
        }
    }
}

/// `dst ← src` for one strip of a packed panel: the full widths of the tiles (32, 16, 12, 6)
/// as fixed-size copies, which compile to a few vector moves instead of a `memmove` call per
/// strip (measured: `memmove` from packing was ≈ 3.6 % of a training step, most of it call
/// overhead on 24–128-byte copies).
#[inline(always)]
fn copy_strip(dst: &mut [f32], src: &[f32]) {
    fn fixed<const N: usize>(dst: &mut [f32], src: &[f32]) {
        let d: &mut [f32; N] = dst.try_into().expect("strip width");
        let s: &[f32; N] = src.try_into().expect("strip width");
        *d = *s;
    }
    match dst.len() {
        32 => fixed::<32>(dst, src),
        16 => fixed::<16>(dst, src),
        12 => fixed::<12>(dst, src),
        6 => fixed::<6>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

/// Packs `A[i0..i0+mc, k0..k0+kc]` into `mr`-row micro-panels (`[mc/mr][kc][mr]`, the last one
/// zero-padded).
fn pack_a(a: &View<'_>, i0: usize, mc: usize, k0: usize, kc: usize, mr: usize, buf: &mut [f32]) {
    for (p, panel) in buf
        .chunks_exact_mut(kc * mr)
        .take(mc.div_ceil(mr))
        .enumerate()
    {
        let ip = i0 + p * mr;
        let h = (i0 + mc - ip).min(mr);
        if a.rs == 1 {
            // Columns of A are contiguous (a transposed view): one copy per step of K.
            for (kk, dst) in panel.chunks_exact_mut(mr).enumerate() {
                let base = a.off + ip + (k0 + kk) * a.cs;
                copy_strip(&mut dst[..h], &a.data[base..base + h]);
                dst[h..].fill(0.0);
            }
        } else {
            for r in 0..mr {
                if r < h {
                    let row = &a.data[a.off + (ip + r) * a.rs + k0 * a.cs..];
                    for kk in 0..kc {
                        panel[kk * mr + r] = row[kk * a.cs];
                    }
                } else {
                    for kk in 0..kc {
                        panel[kk * mr + r] = 0.0;
                    }
                }
            }
        }
    }
}

/// A 16-lane mask of the first `n` lanes (all of them from 16 up).
pub(crate) fn mask16(n: usize) -> u16 {
    if n >= 16 {
        0xffff
    } else {
        ((1u32 << n) - 1) as u16
    }
}

/// The masks of the two 16-lane halves of a 32-column tile row with `cols` live columns.
pub(crate) fn lane_masks(cols: usize) -> (u16, u16) {
    (mask16(cols), mask16(cols.saturating_sub(16)))
}

/// Output pointer shared by the jobs (each writes its own block).
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: jobs write disjoint blocks of the output, which outlives the parallel loop.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// A micro-panel of A for the kernels: element `(r, kk)` at `ptr + r·rs + kk·cs` (packed:
/// `rs = 1`, `cs` = the tile height; in place in a row-major A: `rs` = its row stride, `cs = 1`).
#[derive(Clone, Copy)]
struct APanel {
    ptr: *const f32,
    rs: usize,
    cs: usize,
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::APanel;
    use std::arch::x86_64::*;

    /// `C[r, c] (+)= Σ_k a(r, k) · b[k·32 + c]` for `r < rows ≤ 12`, `c < cols ≤ 32`:
    /// accumulators start at zero when `first`, else at the current `C`; one FMA per step of K.
    ///
    /// # Safety
    /// AVX-512F must be available; `a` (12 rows) and `b` hold `kc` steps; `c` is writable for `rows` rows
    /// of stride `ldc` and `cols` columns.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn tile(
        kc: usize,
        a: APanel,
        b: &[f32],
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        first: bool,
    ) {
        debug_assert!(b.len() >= kc * 32);
        let (m0, m1) = super::lane_masks(cols);
        // SAFETY: pointer arithmetic stays inside the regions promised by the caller; masked
        // loads and stores touch only the first `cols` columns.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; 12];
            if !first {
                for (r, row) in acc.iter_mut().enumerate().take(rows) {
                    row[0] = _mm512_maskz_loadu_ps(m0, c.add(r * ldc));
                    row[1] = _mm512_maskz_loadu_ps(m1, c.add(r * ldc + 16));
                }
            }
            let (ap, bp) = (a.ptr, b.as_ptr());
            // Full-mask loads: `_mm512_loadu_ps` goes through `ptr::read_unaligned`, whose
            // debug-build precondition checks (and a copy through the stack) land in this loop
            // in the opt-level-3 dev builds that tests and `scripts/bench.sh` use.
            // Two copies of the loop (packed A: 12 consecutive values per step; A in place: one
            // value per row), the same FMAs in the same order.
            if a.rs == 1 {
                for kk in 0..kc {
                    let b0 = _mm512_maskz_loadu_ps(0xffff, bp.add(kk * 32));
                    let b1 = _mm512_maskz_loadu_ps(0xffff, bp.add(kk * 32 + 16));
                    let ar = ap.add(kk * a.cs);
                    for (r, row) in acc.iter_mut().enumerate() {
                        let x = _mm512_set1_ps(*ar.add(r));
                        row[0] = _mm512_fmadd_ps(x, b0, row[0]);
                        row[1] = _mm512_fmadd_ps(x, b1, row[1]);
                    }
                }
            } else {
                for kk in 0..kc {
                    let b0 = _mm512_maskz_loadu_ps(0xffff, bp.add(kk * 32));
                    let b1 = _mm512_maskz_loadu_ps(0xffff, bp.add(kk * 32 + 16));
                    let ar = ap.add(kk);
                    for (r, row) in acc.iter_mut().enumerate() {
                        let x = _mm512_set1_ps(*ar.add(r * a.rs));
                        row[0] = _mm512_fmadd_ps(x, b0, row[0]);
                        row[1] = _mm512_fmadd_ps(x, b1, row[1]);
                    }
                }
            }
            for (r, row) in acc.iter().enumerate().take(rows) {
                _mm512_mask_storeu_ps(c.add(r * ldc), m0, row[0]);
                _mm512_mask_storeu_ps(c.add(r * ldc + 16), m1, row[1]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::APanel;
    use std::arch::x86_64::*;

    /// The AVX2 + FMA tile: 6 rows × 16 columns, otherwise as `avx512::tile` (same sums).
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `a` (6 rows) and `b` hold `kc` steps; `c` is writable for `rows`
    /// rows of stride `ldc` and `cols` columns.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn tile(
        kc: usize,
        a: APanel,
        b: &[f32],
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        first: bool,
    ) {
        debug_assert!(b.len() >= kc * 16);
        // SAFETY: as above; partial tiles go through a local buffer.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; 6];
            let mut tmp = [0f32; 16];
            if !first {
                for (r, row) in acc.iter_mut().enumerate().take(rows) {
                    if cols == 16 {
                        row[0] = _mm256_loadu_ps(c.add(r * ldc));
                        row[1] = _mm256_loadu_ps(c.add(r * ldc + 8));
                    } else {
                        tmp = [0f32; 16];
                        std::ptr::copy_nonoverlapping(c.add(r * ldc), tmp.as_mut_ptr(), cols);
                        row[0] = _mm256_loadu_ps(tmp.as_ptr());
                        row[1] = _mm256_loadu_ps(tmp.as_ptr().add(8));
                    }
                }
            }
            let (ap, bp) = (a.ptr, b.as_ptr());
            if a.rs == 1 {
                for kk in 0..kc {
                    let b0 = _mm256_loadu_ps(bp.add(kk * 16));
                    let b1 = _mm256_loadu_ps(bp.add(kk * 16 + 8));
                    let ar = ap.add(kk * a.cs);
                    for (r, row) in acc.iter_mut().enumerate() {
                        let x = _mm256_broadcast_ss(&*ar.add(r));
                        row[0] = _mm256_fmadd_ps(x, b0, row[0]);
                        row[1] = _mm256_fmadd_ps(x, b1, row[1]);
                    }
                }
            } else {
                for kk in 0..kc {
                    let b0 = _mm256_loadu_ps(bp.add(kk * 16));
                    let b1 = _mm256_loadu_ps(bp.add(kk * 16 + 8));
                    let ar = ap.add(kk);
                    for (r, row) in acc.iter_mut().enumerate() {
                        let x = _mm256_broadcast_ss(&*ar.add(r * a.rs));
                        row[0] = _mm256_fmadd_ps(x, b0, row[0]);
                        row[1] = _mm256_fmadd_ps(x, b1, row[1]);
                    }
                }
            }
            for (r, row) in acc.iter().enumerate().take(rows) {
                if cols == 16 {
                    _mm256_storeu_ps(c.add(r * ldc), row[0]);
                    _mm256_storeu_ps(c.add(r * ldc + 8), row[1]);
                } else {
                    _mm256_storeu_ps(tmp.as_mut_ptr(), row[0]);
                    _mm256_storeu_ps(tmp.as_mut_ptr().add(8), row[1]);
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), c.add(r * ldc), cols);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::{bits, data, isas};

    /// Every shape (partial tiles, K across several blocks, K = 0 and 1), plain and transposed
    /// views, both ISAs: the same bits as the scalar FMA chain, and within f64 rounding of the
    /// exact product.
    #[test]
    fn every_shape_and_isa_gives_the_fma_chain_bits() {
        if isas().is_empty() {
            eprintln!("no AVX2: sgemm has no kernel on this CPU (callers use burn's matmul)");
            return;
        }
        let shapes = [
            (1, 1, 1),
            (1, 40, 0),
            (5, 7, 3),
            (12, 32, 256),
            (13, 33, 257),
            (25, 70, 600),
            (100, 45, 513),
            (97, 1100, 40),
            (2, 300, 1030),
        ];
        for &(m, n, k) in &shapes {
            let (ad, bd) = (data(m * k, 1 + m as u64), data(k * n, 2 + n as u64));
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let a = if ta {
                    View::rows(&ad, m).t()
                } else {
                    View::rows(&ad, k)
                };
                let b = if tb {
                    View::rows(&bd, k).t()
                } else {
                    View::rows(&bd, n)
                };
                let want = reference(m, n, k, a, b);
                for isa in isas() {
                    let mut got = vec![f32::NAN; m * n];
                    assert!(sgemm(m, n, k, a, b, &mut got, isa));
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{m}×{n}×{k} ta={ta} tb={tb} {isa:?}"
                    );
                    let mut serial = vec![f32::NAN; m * n];
                    assert!(sgemm_serial(m, n, k, a, b, &mut serial, isa));
                    assert_eq!(bits(&serial), bits(&want), "serial {m}×{n}×{k} {isa:?}");
                }
                // And the chain is the product (a sanity check of the reference itself).
                for i in (0..m).step_by(7) {
                    for j in (0..n).step_by(5) {
                        let exact: f64 = (0..k)
                            .map(|kk| {
                                a.data[a.off + i * a.rs + kk * a.cs] as f64
                                    * b.data[b.off + kk * b.rs + j * b.cs] as f64
                            })
                            .sum();
                        let mag: f64 = (0..k)
                            .map(|kk| {
                                (a.data[a.off + i * a.rs + kk * a.cs] as f64
                                    * b.data[b.off + kk * b.rs + j * b.cs] as f64)
                                    .abs()
                            })
                            .sum();
                        let g = want[i * n + j] as f64;
                        assert!(
                            (g - exact).abs() <= 1e-6 * (1.0 + mag),
                            "{m}×{n}×{k} ({i},{j}): {g} vs {exact}"
                        );
                    }
                }
            }
        }
    }

    /// Thread count and batch split: the rows of a product computed in pools of 1, 2 and 3
    /// threads, and in slices of the rows (batches of 1, 7 and 50 rows), give the same bits.
    #[test]
    fn bits_do_not_depend_on_threads_or_batch() {
        let Some(&isa) = isas().first() else {
            return;
        };
        let (m, n, k) = (150, 200, 700);
        let (ad, bd) = (data(m * k, 3), data(k * n, 4));
        let (a, b) = (View::rows(&ad, k), View::rows(&bd, n));
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut c = vec![0f32; m * n];
            pool.install(|| assert!(sgemm(m, n, k, a, b, &mut c, isa)));
            c
        };
        let one = run(1);
        for t in [2, 3] {
            assert_eq!(bits(&run(t)), bits(&one), "{t} threads");
        }
        for rows in [1, 7, 50] {
            for r0 in (0..m).step_by(rows) {
                let h = rows.min(m - r0);
                let sub = View { off: r0 * k, ..a };
                let mut c = vec![0f32; h * n];
                assert!(sgemm(h, n, k, sub, b, &mut c, isa));
                assert_eq!(
                    bits(&c),
                    bits(&one[r0 * n..(r0 + h) * n]),
                    "rows {r0}..{} in batches of {rows}",
                    r0 + h
                );
            }
        }
    }
}
