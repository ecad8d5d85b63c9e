//! A CPU fast path for decode-shaped products `x · W`: a few rows of activations against a large
//! row-major weight matrix, on the Flex backend.
//!
//! Why: while sampling, every projection is `[B, in] × [in, out]` with `B` ≈ 8, and the step is
//! bound by streaming the weights from memory. gemm (Flex's matmul) runs these shapes with its
//! 16×6 microkernel, which for 8 rows walks the weights twice (a 6-column and a 2-column pass) and
//! reached about a sixth of the machine's streaming bandwidth (measured: 68 ms CPU for the
//! SmolLM2 LM head, 113 MB, against 11 ms to stream 113 MB). This kernel reads every weight once,
//! in 16-row bands streamed left to right: for 8 output columns at a time it keeps up to 8 rows
//! of accumulators in AVX registers (one 8-wide weight load, then a broadcast and an FMA per
//! activation row), and splits the columns over rayon's threads.
//!
//! **Packed weights** ([`PackedMatrix`]): the row-major kernel still walks 16 weight rows at a
//! stride of a whole row, which caches and prefetchers handle poorly for wide matrices. A copy of
//! a weight in 16-column panels (`[N/16][K][16]`, each panel one contiguous stream, the last one
//! zero-padded) is read once per step by a kernel that keeps a 6-row × 16-column tile of
//! accumulators in 12 AVX registers (2 weight loads and 6 broadcasts per 12 FMAs), panel outer
//! and row groups inner (the panel stays in cache for the other row groups), columns split over
//! rayon. It beats gemm up to 64 rows. The transformer builds such copies lazily, on its first
//! cached decode step (sampling processes only; training and log-prob scoring never decode), at
//! the cost of a second copy of the weights in memory. A packed copy keeps its source buffer
//! alive and is used only while the parameter still points at that buffer, so a model whose
//! weights changed falls back to the unpacked path instead of computing with stale values.
//!
//! **bf16 panels** ([`PackPrecision`]): a matrix whose values are all bf16 numbers is packed as
//! bf16 and widened to f32 in registers (a shift), giving the same results bit for bit with half
//! the bytes streamed; rounding other weights to bf16 is opt-in (`RLCR_DECODE_BF16=1`) because it
//! changes the numbers.
//!
//! **Decode attention** ([`decode_attention`]): one query token per row against the KV cache, on
//! the host, split over rayon by (row, KV head), instead of burn's per-head small gemm calls.
//!
//! Row-count invariance: every product output is summed from zero in the order of K with one
//! fused multiply-add per term, whatever the number of rows and their grouping (both kernels
//! agree bit for bit), and attention rows are independent, so a row's result never depends on
//! the batch it is in (the sampler relies on this: it never pads batches).
//!
//! **Instruction sets** ([`Isa`], chosen at run time): on a CPU with AVX-512F the packed kernel
//! keeps a 12-row × 32-column tile (two panels) in 24 zmm registers, one weight load per panel
//! and one broadcast per row for every step of K; with AVX2 + FMA, the 6 × 16 tile above. Both
//! sum every output from zero in the order of K with one FMA per term, so they give the same
//! numbers bit for bit (tested by forcing the AVX2 kernel on an AVX-512 machine).
//! `RLCR_CPU_ISA=avx2|avx512|scalar` forces a lower level for the whole process (read once; see
//! [`isa`]); `scalar` turns rlcr's kernels off, as on a CPU without AVX2.
//!
//! Scope and fallbacks: only f32 tensors on a plain (non-autodiff) Flex device, at most
//! [`MAX_ROWS`] rows ([`MAX_PACKED_ROWS`] packed), a contiguous weight, and an x86-64 CPU with
//! AVX2 and FMA; anything else returns `None` and the caller uses burn's `matmul`, so model code
//! stays device-agnostic and training never sees this path. The row-major kernel (used only
//! before weights are packed, or with `RLCR_DECODE_PACK=0`) stays AVX2. The sum over K runs in order with
//! fused multiply-adds, so results differ from gemm's in the last bits only (the parity tests
//! cover both paths).
use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::{DType, Tensor, TensorData};

/// Largest number of activation rows sent to the row-major kernel (beyond it gemm's blocking
/// wins).
pub const MAX_ROWS: usize = 16;

/// Largest number of activation rows sent to the packed kernel.
pub const MAX_PACKED_ROWS: usize = 64;

/// `x · w` for `x: [M, K]`, `w: [K, N]` when the fast path applies, else `None`.
pub fn small_matmul(x: &Tensor<2>, w: &Tensor<2>) -> Option<Tensor<2>> {
    let [m, k] = x.dims();
    let [k2, n] = w.dims();
    if m == 0 || m > MAX_ROWS || k != k2 || k == 0 || n < 8 || !supported() {
        return None;
    }
    let xf: FlexTensor = x.clone().try_into_primitive::<Flex>().ok()?;
    let wf: FlexTensor = w.clone().try_into_primitive::<Flex>().ok()?;
    if xf.dtype() != DType::F32 || wf.dtype() != DType::F32 || !wf.is_contiguous() {
        return None;
    }
    let w_off = wf.layout().start_offset();
    let w_data: &[f32] = &wf.storage::<f32>()[w_off..w_off + k * n];
    let xc = if xf.is_contiguous() {
        xf
    } else {
        xf.to_contiguous()
    };
    let x_off = xc.layout().start_offset();
    let x_data: &[f32] = &xc.storage::<f32>()[x_off..x_off + m * k];
    let out = matmul_rows(x_data, m, k, w_data, n);
    let t = FlexTensor::from_data(TensorData::new(out, [m, n]));
    Some(Tensor::<2>::from_primitive::<Flex>(t))
}

/// Storage precision of the packed decode weights.
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

impl PackPrecision {
    /// From the environment: `RLCR_DECODE_BF16=1` (or `round`) → [`Self::Bf16Rounded`], `0` →
    /// [`Self::F32`], unset / anything else → [`Self::Bf16IfExact`].
    pub fn from_env() -> Self {
        match std::env::var("RLCR_DECODE_BF16").as_deref() {
            Ok("1") | Ok("round") => PackPrecision::Bf16Rounded,
            Ok("0") => PackPrecision::F32,
            _ => PackPrecision::Bf16IfExact,
        }
    }
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
pub struct PackedMatrix {
    k: usize,
    n: usize,
    panels: Panels,
    /// The packed tensor: holds its buffer alive, so pointer equality means same values.
    source: FlexTensor,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = match self.panels {
            Panels::F32(_) => "f32",
            Panels::Bf16(_) => "bf16",
        };
        write!(f, "PackedMatrix[{}, {}, {p}]", self.k, self.n)
    }
}

/// Address of the first element of a Flex f32 tensor (identity of its buffer).
fn first_ptr(t: &FlexTensor) -> *const f32 {
    let off = t.layout().start_offset();
    t.storage::<f32>()[off..].as_ptr()
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
    use rayon::prelude::*;
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

impl PackedMatrix {
    /// Pack `w: [K, N]` when the fast path applies to it (contiguous f32 on a plain Flex device,
    /// a CPU with AVX2/FMA); `None` otherwise.
    pub fn pack(w: &Tensor<2>, precision: PackPrecision) -> Option<Self> {
        let [k, n] = w.dims();
        if k == 0 || n < 8 || !supported() {
            return None;
        }
        let wf: FlexTensor = w.clone().try_into_primitive::<Flex>().ok()?;
        if wf.dtype() != DType::F32 || !wf.is_contiguous() {
            return None;
        }
        let off = wf.layout().start_offset();
        let data: &[f32] = &wf.storage::<f32>()[off..off + k * n];
        let bf16 = match precision {
            PackPrecision::F32 => false,
            PackPrecision::Bf16Rounded => true,
            PackPrecision::Bf16IfExact => data.iter().all(|x| x.to_bits() & 0xffff == 0),
        };
        let panels = if bf16 {
            Panels::Bf16(pack_panels(data, k, n, bf16_round))
        } else {
            Panels::F32(pack_panels(data, k, n, |x| x))
        };
        Some(PackedMatrix {
            k,
            n,
            panels,
            source: wf,
        })
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

    /// Whether `w` is still the tensor this copy was made from.
    fn packs(&self, w: &FlexTensor) -> bool {
        let shape = w.layout().shape();
        shape.num_dims() == 2
            && shape[0] == self.k
            && shape[1] == self.n
            && std::ptr::eq(first_ptr(w), first_ptr(&self.source))
    }
}

/// Rows per register tile of the packed AVX2 kernel (× 16 columns = 12 accumulators).
const TILE_ROWS: usize = 6;

/// Rows per register tile of the packed AVX-512 kernel (× 32 columns = 24 of the 32 registers).
const TILE_ROWS_512: usize = 12;

/// `x · w` through the packed copy `p` of `w`, when `x` has at most [`MAX_PACKED_ROWS`] rows, lives on
/// a plain Flex device and `w` is still the tensor `p` was made from; else `None`.
///
/// Every output element is `Σ_k x[r, k] · w[k, c]` accumulated from zero in the order of `k`
/// with one fused multiply-add per term, whatever the number of rows or their grouping, so a
/// row's result does not depend on the batch it is in.
pub fn packed_matmul(x: &Tensor<2>, w: &Tensor<2>, p: &PackedMatrix) -> Option<Tensor<2>> {
    packed_matmul_isa(x, w, p, isa())
}

/// [`packed_matmul`] on the kernels of `isa` (lowered to what the CPU has): `None` for
/// [`Isa::Scalar`]. Every level gives the same numbers bit for bit (tested), so this exists to
/// test and measure the fallbacks on a machine that has the faster path.
pub fn packed_matmul_isa(
    x: &Tensor<2>,
    w: &Tensor<2>,
    p: &PackedMatrix,
    isa: Isa,
) -> Option<Tensor<2>> {
    use rayon::prelude::*;
    let isa = isa.clamp();
    let [m, k] = x.dims();
    if m == 0 || m > MAX_PACKED_ROWS || k != p.k || isa < Isa::Avx2 {
        return None;
    }
    let wf: FlexTensor = w.clone().try_into_primitive::<Flex>().ok()?;
    if !p.packs(&wf) {
        return None;
    }
    let xf: FlexTensor = x.clone().try_into_primitive::<Flex>().ok()?;
    if xf.dtype() != DType::F32 {
        return None;
    }
    let xc = if xf.is_contiguous() {
        xf
    } else {
        xf.to_contiguous()
    };
    let x_off = xc.layout().start_offset();
    let x_data: &[f32] = &xc.storage::<f32>()[x_off..x_off + m * k];
    let n = p.n;
    let avx512 = isa == Isa::Avx512;
    // Row groups of near-equal size, at most TILE_ROWS (AVX2) or TILE_ROWS_512 each.
    let tile_rows = if avx512 { TILE_ROWS_512 } else { TILE_ROWS };
    let n_groups = m.div_ceil(tile_rows);
    let row_groups = transpose_row_groups(x_data, m, k, m.div_ceil(n_groups));
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
                // avx2+fma were checked when packing.
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
    let t = FlexTensor::from_data(TensorData::new(out, [m, n]));
    Some(Tensor::<2>::from_primitive::<Flex>(t))
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

/// A Flex f32 tensor's values as a contiguous slice (copying only when it is a strided view).
fn f32_view<const D: usize>(t: &Tensor<D>) -> Option<FlexTensor> {
    let f: FlexTensor = t.clone().try_into_primitive::<Flex>().ok()?;
    if f.dtype() != DType::F32 {
        return None;
    }
    Some(if f.is_contiguous() {
        f
    } else {
        f.to_contiguous()
    })
}

fn f32_slice(f: &FlexTensor, len: usize) -> &[f32] {
    let off = f.layout().start_offset();
    &f.storage::<f32>()[off..off + len]
}

/// Attention of one new token per row against a KV cache, on the host (decode steps).
///
/// `q: [B, K, g, d]` (the `g` query heads sharing each key/value head), `k`, `v`: `[B, K, cap,
/// d]` cache buffers of which slots `0..len` are used; `keys_ok: [B · len]` says which slots each
/// row may attend to. For every row, head and query: scores `s_j = scale · q·k_j` over the
/// allowed slots, `p = softmax(s)` (max subtracted, f32), output `Σ_j p_j v_j`: `[B, K, g, d]`.
/// Rows are independent (a row's result does not depend on the batch), work is split over
/// rayon by (row, key/value head). Same function as burn's `attention` with the boolean mask,
/// up to rounding (the sums run in another order: ~1e-7 relative).
///
/// `None` (use burn's attention) unless every tensor is f32 on a plain Flex device.
pub fn decode_attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    len: usize,
    keys_ok: &[bool],
    scale: f32,
) -> Option<Tensor<4>> {
    use rayon::prelude::*;
    let [b, kh, g, d] = q.dims();
    let [b2, kh2, cap, d2] = k.dims();
    if b2 != b || kh2 != kh || d2 != d || v.dims() != k.dims() || len > cap || len == 0 {
        return None;
    }
    if keys_ok.len() != b * len {
        return None;
    }
    let (qf, kf, vf) = (f32_view(q)?, f32_view(k)?, f32_view(v)?);
    let qs = f32_slice(&qf, b * kh * g * d);
    let ks = f32_slice(&kf, b * kh * cap * d);
    let vs = f32_slice(&vf, b * kh * cap * d);
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
    let t = FlexTensor::from_data(TensorData::new(out, [b, kh, g, d]));
    Some(Tensor::<4>::from_primitive::<Flex>(t))
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// None of rlcr's SIMD kernels: every product goes through burn's `matmul` (gemm, which
    /// dispatches on the CPU by itself). What a CPU without AVX2/FMA, or another architecture,
    /// runs.
    Scalar,
    /// 256-bit kernels (AVX2 + FMA): 6 rows × 16 columns per register tile.
    Avx2,
    /// 512-bit kernels (AVX-512F): up to 12 rows × 32 columns per register tile.
    Avx512,
}

impl Isa {
    /// The best level this CPU runs.
    pub fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma");
            if avx2 && std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// `scalar`, `avx2`, `avx512` (as `RLCR_CPU_ISA` spells them).
    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" | "none" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" | "avx-512" => Some(Isa::Avx512),
            _ => None,
        }
    }

    /// The level's name, as [`Isa::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// `self`, lowered to what the CPU has (a request above it cannot run).
    fn clamp(self) -> Isa {
        self.min(Isa::detected())
    }
}

/// The kernels in use: [`Isa::detected`], or lower when the environment variable
/// `RLCR_CPU_ISA` (`avx512`, `avx2`, `scalar`; `auto` or unset: the best the CPU has) asks for
/// it. Read once per process. A level above the CPU's is lowered to the CPU's; an unknown value
/// is reported on stderr once and ignored.
///
/// The AVX-512 and AVX2 kernels give the same results bit for bit (one fused multiply-add per
/// term, summed from zero in the order of K, in both), so forcing `avx2` on an AVX-512 machine
/// changes the speed only; `scalar` sends every product through burn's matmul (gemm), whose
/// sums run in another order (differences in the last bits, as between gemm and these kernels).
/// gemm itself picks its own AVX-512 / AVX2 path from the CPU, whatever this says.
pub fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| match std::env::var("RLCR_CPU_ISA") {
        Err(_) => Isa::detected(),
        Ok(v) if v.is_empty() || v.eq_ignore_ascii_case("auto") => Isa::detected(),
        Ok(v) => match Isa::parse(&v) {
            Some(want) => want.clamp(),
            None => {
                eprintln!(
                    "warning: RLCR_CPU_ISA={v:?} is not one of auto, avx512, avx2, scalar; using {}",
                    Isa::detected().name()
                );
                Isa::detected()
            }
        },
    })
}

fn supported() -> bool {
    isa() >= Isa::Avx2
}

/// Output pointer shared by the column-block jobs (each writes disjoint columns).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: jobs write disjoint column ranges of the output; the buffer outlives the parallel loop.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `[m, k] × [k, n]` row-major on the host; the caller checked [`supported`].
fn matmul_rows(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
    use rayon::prelude::*;
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
    out
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
    use burn::tensor::Device;

    fn naive(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f64> {
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k)
                    .map(|t| x[i * k + t] as f64 * w[t * n + j] as f64)
                    .sum();
            }
        }
        out
    }

    #[test]
    fn matches_a_plain_product_for_every_shape() {
        if !supported() {
            return;
        }
        let dev = Device::flex();
        for &(m, k, n) in &[
            (1, 1, 16),
            (8, 64, 384),
            (7, 33, 50),
            (16, 576, 1000),
            (13, 5, 31),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let w: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 40.0)
                .collect();
            let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, k]), &dev);
            let wt = Tensor::<2>::from_data(TensorData::new(w.clone(), [k, n]), &dev);
            let got = small_matmul(&xt, &wt).expect("fast path applies");
            let got = crate::model::read_f32(got).unwrap();
            let want = naive(&x, m, k, &w, n);
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()),
                    "{m}x{k}x{n}: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn packed_copy_matches_and_refuses_other_tensors() {
        if !supported() {
            return;
        }
        let dev = Device::flex();
        for &(m, k, n) in &[
            (1, 3, 8),
            (8, 64, 389),
            (16, 576, 96),
            (9, 7, 13),
            (40, 33, 24),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 29 % 89) as f32 - 44.0) / 30.0)
                .collect();
            let w: Vec<f32> = (0..k * n)
                .map(|i| ((i * 31 % 83) as f32 - 41.0) / 25.0)
                .collect();
            let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, k]), &dev);
            let wt = Tensor::<2>::from_data(TensorData::new(w.clone(), [k, n]), &dev);
            let p = PackedMatrix::pack(&wt, PackPrecision::F32).expect("packable");
            let got = crate::model::read_f32(packed_matmul(&xt, &wt, &p).unwrap()).unwrap();
            let want = naive(&x, m, k, &w, n);
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()),
                    "{m}x{k}x{n}: {g} vs {w}"
                );
            }
            // A different tensor with the same values and shape is not the packed one.
            let other = Tensor::<2>::from_data(TensorData::new(w.clone(), [k, n]), &dev);
            assert!(packed_matmul(&xt, &other, &p).is_none());
            // A clone shares the buffer: still valid.
            assert!(packed_matmul(&xt, &wt.clone(), &p).is_some());
        }
    }

    /// Weights that are bf16 numbers: the bf16 panels give bit-identical results to the f32
    /// panels; rounded bf16 panels equal an f32 product with the rounded weights.
    #[test]
    fn bf16_panels_are_exact_for_bf16_weights_and_round_otherwise() {
        if !supported() {
            return;
        }
        let dev = Device::flex();
        for &(m, k, n) in &[(1, 3, 8), (8, 64, 389), (13, 576, 40), (64, 17, 16)] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 29 % 89) as f32 - 44.0) / 30.0)
                .collect();
            let w: Vec<f32> = (0..k * n)
                .map(|i| ((i * 31 % 83) as f32 - 41.0) / 25.0 + 1e-3 * (i % 7) as f32)
                .collect();
            let wb: Vec<f32> = w
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_f32())
                .collect();
            assert!(
                wb.iter().zip(&w).any(|(a, b)| a != b),
                "test needs inexact weights"
            );
            let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, k]), &dev);
            let wt = Tensor::<2>::from_data(TensorData::new(w.clone(), [k, n]), &dev);
            let wbt = Tensor::<2>::from_data(TensorData::new(wb.clone(), [k, n]), &dev);
            let run = |w: &Tensor<2>, p: &PackedMatrix| {
                crate::model::read_f32(packed_matmul(&xt, w, p).unwrap()).unwrap()
            };
            // Exact bf16 weights: auto mode packs bf16, results equal the f32 panels bit for bit.
            let auto = PackedMatrix::pack(&wbt, PackPrecision::Bf16IfExact).unwrap();
            let f32p = PackedMatrix::pack(&wbt, PackPrecision::F32).unwrap();
            assert!(auto.is_bf16() && !f32p.is_bf16());
            assert_eq!(auto.bytes() * 2, f32p.bytes());
            assert_eq!(run(&wbt, &auto), run(&wbt, &f32p));
            // Inexact weights: auto mode keeps f32.
            let keep = PackedMatrix::pack(&wt, PackPrecision::Bf16IfExact).unwrap();
            assert!(!keep.is_bf16());
            let want = naive(&x, m, k, &w, n);
            for (g, w) in run(&wt, &keep).iter().zip(&want) {
                assert!((*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()));
            }
            // Opt-in rounding: the product with the rounded weights, bit for bit.
            let rounded = PackedMatrix::pack(&wt, PackPrecision::Bf16Rounded).unwrap();
            assert!(rounded.is_bf16());
            assert_eq!(run(&wt, &rounded), run(&wbt, &f32p));
        }
    }

    /// The AVX-512 and AVX2 kernels (forced on this machine) give the same numbers bit for bit,
    /// for every row count up to [`MAX_PACKED_ROWS`] (row groups of every size, both tile
    /// widths), odd panel counts and a partial last panel, f32 and bf16 panels; `scalar` leaves
    /// the product to burn. On a CPU without AVX-512 both requests run the AVX2 kernel.
    #[test]
    fn every_isa_gives_the_same_bits() {
        if !supported() {
            return;
        }
        let dev = Device::flex();
        for &(k, n) in &[(37, 13), (64, 48), (29, 85), (576, 200)] {
            let w: Vec<f32> = (0..k * n)
                .map(|i| ((i * 43 % 107) as f32 - 53.0) / 31.0 + 1e-3 * (i % 5) as f32)
                .collect();
            let x: Vec<f32> = (0..MAX_PACKED_ROWS * k)
                .map(|i| ((i * 41 % 113) as f32 - 56.0) / 37.0)
                .collect();
            let wt = Tensor::<2>::from_data(TensorData::new(w.clone(), [k, n]), &dev);
            for precision in [PackPrecision::F32, PackPrecision::Bf16Rounded] {
                let p = PackedMatrix::pack(&wt, precision).unwrap();
                for m in (1..=MAX_PACKED_ROWS).filter(|m| m % 7 < 3 || *m == MAX_PACKED_ROWS) {
                    let xt =
                        Tensor::<2>::from_data(TensorData::new(x[..m * k].to_vec(), [m, k]), &dev);
                    let run = |isa| {
                        crate::model::read_f32(packed_matmul_isa(&xt, &wt, &p, isa).unwrap())
                            .unwrap()
                    };
                    let (a512, a2) = (run(Isa::Avx512), run(Isa::Avx2));
                    assert_eq!(a512, a2, "{m}x{k}x{n} {precision:?}");
                    assert!(packed_matmul_isa(&xt, &wt, &p, Isa::Scalar).is_none());
                    if precision == PackPrecision::F32 {
                        let want = naive(&x[..m * k], m, k, &w, n);
                        for (g, w) in a512.iter().zip(&want) {
                            assert!((*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn isa_names_parse_and_clamp() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse(" AVX512 "), Some(Isa::Avx512));
        assert_eq!(Isa::parse("sse2"), None);
        assert!(Isa::Scalar < Isa::Avx2 && Isa::Avx2 < Isa::Avx512);
        // A request is never above what the CPU has, and the process-wide choice neither.
        assert!(Isa::Avx512.clamp() <= Isa::detected());
        assert!(isa() <= Isa::detected());
        assert_eq!(Isa::Scalar.clamp(), Isa::Scalar);
    }

    /// A row's result does not depend on how many rows are multiplied with it.
    #[test]
    fn packed_rows_do_not_depend_on_the_row_count() {
        if !supported() {
            return;
        }
        let dev = Device::flex();
        let (k, n) = (97, 45);
        let x: Vec<f32> = (0..MAX_PACKED_ROWS * k)
            .map(|i| ((i * 41 % 113) as f32 - 56.0) / 37.0)
            .collect();
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 43 % 107) as f32 - 53.0) / 31.0)
            .collect();
        let wt = Tensor::<2>::from_data(TensorData::new(w, [k, n]), &dev);
        let p = PackedMatrix::pack(&wt, PackPrecision::F32).unwrap();
        let first_rows = |m: usize, isa: Isa| {
            let xt = Tensor::<2>::from_data(TensorData::new(x[..m * k].to_vec(), [m, k]), &dev);
            crate::model::read_f32(packed_matmul_isa(&xt, &wt, &p, isa).unwrap()).unwrap()
        };
        let all = first_rows(MAX_PACKED_ROWS, Isa::Avx512);
        for isa in [Isa::Avx512, Isa::Avx2] {
            for m in 1..MAX_PACKED_ROWS {
                assert_eq!(first_rows(m, isa), all[..m * n], "{m} rows, {isa:?}");
            }
        }
        // And the row-major kernel rounds the same way.
        for m in [1, 5, MAX_ROWS] {
            let xt = Tensor::<2>::from_data(TensorData::new(x[..m * k].to_vec(), [m, k]), &dev);
            let got = crate::model::read_f32(small_matmul(&xt, &wt).unwrap()).unwrap();
            assert_eq!(got, all[..m * n], "row-major kernel, {m} rows");
        }
    }

    /// The host decode attention is burn's masked attention (every row, with masked slots and
    /// a capacity larger than the used length).
    #[test]
    fn decode_attention_matches_burn_attention() {
        use burn::tensor::module::attention;
        use burn::tensor::ops::AttentionModuleOptions;
        use burn::tensor::Bool;
        let dev = Device::flex();
        let (b, kh, g, d, cap, len) = (3, 2, 3, 8, 16, 11);
        let val = |n: usize, m: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * m % 97) as f32 - 48.0) / 23.0)
                .collect()
        };
        let q = Tensor::<4>::from_data(
            TensorData::new(val(b * kh * g * d, 13), [b, kh, g, d]),
            &dev,
        );
        let k = Tensor::<4>::from_data(
            TensorData::new(val(b * kh * cap * d, 17), [b, kh, cap, d]),
            &dev,
        );
        let v = Tensor::<4>::from_data(
            TensorData::new(val(b * kh * cap * d, 19), [b, kh, cap, d]),
            &dev,
        );
        // Row 0 sees everything, row 1 has two padding slots, row 2 only its last slot.
        let mut ok = vec![true; b * len];
        ok[len + 2] = false;
        ok[len + 5] = false;
        for s in 0..len - 1 {
            ok[2 * len + s] = false;
        }
        let scale = 1.0 / (d as f32).sqrt();
        let got = decode_attention(&q, &k, &v, len, &ok, scale).unwrap();
        let mut mask = vec![true; b * g * cap];
        for r in 0..b {
            for qi in 0..g {
                for s in 0..len {
                    mask[(r * g + qi) * cap + s] = !ok[r * len + s];
                }
            }
        }
        let mask = Tensor::<4, Bool>::from_data(TensorData::new(mask, [b, 1, g, cap]), &dev);
        let options = AttentionModuleOptions {
            scale: Some(scale as f64),
            softcap: None,
            is_causal: false,
        };
        let want = attention(q, k, v, Some(mask), None, options);
        let (got, want) = (
            crate::model::read_f32(got).unwrap(),
            crate::model::read_f32(want).unwrap(),
        );
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        // Row 2 attends only to its last slot: its output is that slot's value.
        let vlast = &val(b * kh * cap * d, 19)[((2 * kh) * cap + len - 1) * d..][..d];
        assert_eq!(&got[(2 * kh * g) * d..(2 * kh * g + 1) * d], vlast);
    }

    #[test]
    fn strided_activations_and_fallbacks() {
        if !supported() {
            return;
        }
        let dev = Device::flex();
        // x as a transposed view (non-contiguous).
        let xs = Tensor::<2>::from_data(
            TensorData::new((0..40).map(|i| i as f32).collect::<Vec<_>>(), [5, 8]),
            &dev,
        )
        .transpose();
        let w = Tensor::<2>::from_data(TensorData::new(vec![0.5f32; 5 * 32], [5, 32]), &dev);
        let fast = crate::model::read_f32(small_matmul(&xs, &w).unwrap()).unwrap();
        let slow = crate::model::read_f32(xs.clone().matmul(w.clone())).unwrap();
        assert_eq!(fast, slow);
        // Too many rows, or an autodiff device: not taken.
        let big = Tensor::<2>::zeros([MAX_ROWS + 1, 5], &dev);
        assert!(small_matmul(&big, &w).is_none());
        let ad = dev.autodiff();
        let xa = Tensor::<2>::zeros([2, 5], &ad);
        let wa = Tensor::<2>::zeros([5, 32], &ad);
        assert!(small_matmul(&xa, &wa).is_none());
    }
}
