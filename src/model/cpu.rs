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
//! a weight in 8-column panels (`[N/8][K][8]`, each panel one contiguous stream) runs the same
//! arithmetic about twice as fast (measured on the SmolLM2 LM head: 17 ms CPU against 35 ms), and
//! beats gemm up to 64 rows (`[64, 576] × [576, 3072]`: 5.0 ms CPU against 7.7 ms). The
//! transformer builds such copies lazily, on its first cached decode step (sampling processes
//! only; training and log-prob scoring never decode), at the cost of a second copy of the
//! weights in memory. A packed copy keeps its source buffer alive and is used only while the
//! parameter still points at that buffer, so a model whose weights changed falls back to the
//! unpacked path instead of computing with stale values.
//!
//! On SmolLM2-135M (batch 8) the two kernels took a decode step from 338 ms to 121 ms of CPU.
//!
//! Scope and fallbacks: only f32 tensors on a plain (non-autodiff) Flex device, at most
//! [`MAX_ROWS`] rows ([`MAX_PACKED_ROWS`] packed), a contiguous weight, and an x86-64 CPU with
//! AVX2 and FMA; anything else returns `None` and the caller uses burn's `matmul`, so model code
//! stays device-agnostic and training never sees this path. The sum over K runs in order with
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

/// A weight `[K, N]` repacked into 8-column panels for [`packed_matmul`].
pub struct PackedMatrix {
    k: usize,
    n: usize,
    /// `(N / 8)` panels of `K × 8` floats, row-major within a panel.
    panels: Vec<f32>,
    /// The last `N % 8` columns, `[K, N % 8]` row-major.
    tail: Vec<f32>,
    /// The packed tensor: holds its buffer alive, so pointer equality means same values.
    source: FlexTensor,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedMatrix[{}, {}]", self.k, self.n)
    }
}

/// Address of the first element of a Flex f32 tensor (identity of its buffer).
fn first_ptr(t: &FlexTensor) -> *const f32 {
    let off = t.layout().start_offset();
    t.storage::<f32>()[off..].as_ptr()
}

impl PackedMatrix {
    /// Pack `w: [K, N]` when the fast path applies to it (contiguous f32 on a plain Flex device,
    /// a CPU with AVX2/FMA); `None` otherwise.
    pub fn pack(w: &Tensor<2>) -> Option<Self> {
        use rayon::prelude::*;
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
        let groups = n / 8;
        let mut panels = vec![0f32; groups * k * 8];
        panels
            .par_chunks_mut(k * 8)
            .enumerate()
            .for_each(|(g, panel)| {
                for kk in 0..k {
                    panel[kk * 8..kk * 8 + 8]
                        .copy_from_slice(&data[kk * n + g * 8..kk * n + g * 8 + 8]);
                }
            });
        let rem = n - groups * 8;
        let mut tail = Vec::with_capacity(k * rem);
        for kk in 0..k {
            tail.extend_from_slice(&data[kk * n + groups * 8..(kk + 1) * n]);
        }
        Some(PackedMatrix {
            k,
            n,
            panels,
            tail,
            source: wf,
        })
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

/// `x · w` through the packed copy `p` of `w`, when `x` has at most [`MAX_PACKED_ROWS`] rows, lives on
/// a plain Flex device and `w` is still the tensor `p` was made from; else `None`.
pub fn packed_matmul(x: &Tensor<2>, w: &Tensor<2>, p: &PackedMatrix) -> Option<Tensor<2>> {
    use rayon::prelude::*;
    let [m, k] = x.dims();
    if m == 0 || m > MAX_PACKED_ROWS || k != p.k {
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
    let row_groups = transpose_row_groups(x_data, m, k);
    let mut out = vec![0f32; m * n];
    let ptr = OutPtr(out.as_mut_ptr());
    let groups = n / 8;
    let jobs = (rayon::current_num_threads() * 2).clamp(1, groups.max(1));
    let per = groups.div_ceil(jobs);
    (0..jobs).into_par_iter().for_each(|j| {
        let g0 = j * per;
        let g1 = ((j + 1) * per).min(groups);
        let out = ptr;
        // Panel outer, row groups inner: a panel (k × 8 floats) is read from memory once and
        // stays in L1 for the remaining row groups.
        for g in g0..g1 {
            for (r0, r, xt) in &row_groups {
                // SAFETY: panel g < groups exists (k×8 floats); columns 8g..8g+8 of rows
                // r0..r0+r are inside `out` and written only by this job; avx2+fma were checked
                // when packing.
                unsafe {
                    packed_dispatch(
                        *r,
                        xt,
                        k,
                        p.panels.as_ptr().add(g * k * 8),
                        out.0.add(r0 * n + g * 8),
                        n,
                        1,
                    );
                }
            }
        }
        if j + 1 == jobs {
            let rem = n - groups * 8;
            for (r0, r, xt) in &row_groups {
                for c in 0..rem {
                    for i in 0..*r {
                        let mut s = 0f32;
                        for kk in 0..k {
                            s = xt[kk * r + i].mul_add(p.tail[kk * rem + c], s);
                        }
                        // SAFETY: a tail column, written only by the last job.
                        unsafe { *out.0.add((r0 + i) * n + groups * 8 + c) = s };
                    }
                }
            }
        }
    });
    let t = FlexTensor::from_data(TensorData::new(out, [m, n]));
    Some(Tensor::<2>::from_primitive::<Flex>(t))
}

/// Rows of `x: [m, k]` in groups of up to 8, each transposed to `[k, r]` so the kernels'
/// broadcasts read consecutive floats: `(first row, rows, data)`.
fn transpose_row_groups(x: &[f32], m: usize, k: usize) -> Vec<(usize, usize, Vec<f32>)> {
    (0..m)
        .step_by(8)
        .map(|r0| {
            let r = (m - r0).min(8);
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

#[cfg(target_arch = "x86_64")]
unsafe fn packed_dispatch(
    r: usize,
    xt: &[f32],
    k: usize,
    panels: *const f32,
    out: *mut f32,
    ldo: usize,
    groups: usize,
) {
    // SAFETY: forwarded contract of `packed_matmul`.
    unsafe {
        match r {
            1 => avx::panels8::<1>(xt, k, panels, out, ldo, groups),
            2 => avx::panels8::<2>(xt, k, panels, out, ldo, groups),
            3 => avx::panels8::<3>(xt, k, panels, out, ldo, groups),
            4 => avx::panels8::<4>(xt, k, panels, out, ldo, groups),
            5 => avx::panels8::<5>(xt, k, panels, out, ldo, groups),
            6 => avx::panels8::<6>(xt, k, panels, out, ldo, groups),
            7 => avx::panels8::<7>(xt, k, panels, out, ldo, groups),
            _ => avx::panels8::<8>(xt, k, panels, out, ldo, groups),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn packed_dispatch(
    _r: usize,
    _xt: &[f32],
    _k: usize,
    _panels: *const f32,
    _out: *mut f32,
    _ldo: usize,
    _groups: usize,
) {
    unreachable!("the CPU fast path is only enabled on x86-64")
}

#[cfg(target_arch = "x86_64")]
fn supported() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn supported() -> bool {
    false
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
    let row_groups = transpose_row_groups(x, m, k);
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

    /// For `R ≤ 8` rows and `groups` consecutive 8-column panels (each `k × 8` floats):
    /// `out[r, 8g + c] = Σ_k xt[k·R + r] · panel_g[k, c]`.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `panels` readable for `groups · k · 8` floats, `out`
    /// writable for `R` rows of stride `ldo` and `8·groups` columns, `xt.len() >= k·R`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn panels8<const R: usize>(
        xt: &[f32],
        k: usize,
        panels: *const f32,
        out: *mut f32,
        ldo: usize,
        groups: usize,
    ) {
        debug_assert!(xt.len() >= k * R);
        let xp = xt.as_ptr();
        for g in 0..groups {
            // SAFETY: pointer arithmetic stays inside the regions promised by the caller.
            unsafe {
                let mut acc = [_mm256_setzero_ps(); R];
                let panel = panels.add(g * k * 8);
                for kk in 0..k {
                    let wv = _mm256_loadu_ps(panel.add(kk * 8));
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
            let p = PackedMatrix::pack(&wt).expect("packable");
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
