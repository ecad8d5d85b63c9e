//! The CPU fast paths of sampling on burn tensors: decode-shaped products `x · W` (a few rows of
//! activations against a large weight, row-major or packed into panels) and decode attention,
//! on the Flex backend. The kernels, and why they exist, are [`rlcr_kernels::decode`]; this
//! module converts tensors, decides when a path applies, and keeps a packed copy tied to the
//! weight it was made from.
//!
//! **Packed weights** ([`PackedMatrix`]): the transformer builds such copies lazily, on its first
//! cached decode step (sampling processes only; training and log-prob scoring never decode), at
//! the cost of a second copy of the weights in memory. A packed copy keeps its source buffer
//! alive and is used only while the parameter still points at that buffer, so a model whose
//! weights changed falls back to the unpacked path instead of computing with stale values.
//!
//! Row-count invariance: every product output is summed from zero in the order of K with one
//! fused multiply-add per term, whatever the number of rows and their grouping (every kernel
//! agrees bit for bit, and with [`super::sgemm`]'s), and attention rows are independent, so a
//! row's result never depends on the batch it is in (the sampler relies on this: it never pads
//! batches).
//!
//! **Instruction sets** ([`Isa`], chosen at run time): AVX-512F kernels where the CPU has them,
//! AVX2 + FMA otherwise, the same numbers bit for bit (tested by forcing the AVX2 kernel on an
//! AVX-512 machine). `RLCR_CPU_ISA=avx2|avx512|scalar` forces a lower level for the whole
//! process (read once; see [`isa`] and [`crate::switches`]); `scalar` turns rlcr's kernels off, as on a CPU without AVX2.
//!
//! Scope and fallbacks: only f32 tensors on a plain (non-autodiff) Flex device, at most
//! [`MAX_ROWS`] rows ([`MAX_PACKED_ROWS`] packed), a contiguous weight, and an x86-64 CPU with
//! AVX2 and FMA; anything else returns `None` and the caller uses burn's `matmul`, so model code
//! stays device-agnostic and training never sees this path. The row-major kernel is used only
//! before weights are packed, or with `RLCR_DECODE_PACK=0`. The sum over K runs in order with
//! fused multiply-adds, so results differ from gemm's in the last bits only (the parity tests
//! cover both paths).
use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::{DType, Tensor, TensorData};
use rlcr_kernels::decode::{self, AttentionShape, PackedPanels};

use super::{contiguous, flex_f32, slice};

pub use rlcr_kernels::decode::PackPrecision;
pub use rlcr_kernels::Isa;

/// The kernel level in use for the process (`RLCR_CPU_ISA`, see [`crate::switches`]).
pub fn isa() -> Isa {
    crate::switches::get().isa
}

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
    if wf.dtype() != DType::F32 || !wf.is_contiguous() {
        return None;
    }
    let xc = contiguous(xf)?;
    let out = decode::matmul_rows(slice(&xc), m, k, slice(&wf), n, isa())?;
    let t = FlexTensor::from_data(TensorData::new(out, [m, n]));
    Some(Tensor::<2>::from_primitive::<Flex>(t))
}

/// A weight `[K, N]` repacked into 16-column panels for [`packed_matmul`].
pub struct PackedMatrix {
    panels: PackedPanels,
    /// The packed tensor: holds its buffer alive, so pointer equality means same values.
    source: FlexTensor,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedMatrix({:?})", self.panels)
    }
}

/// Address of the first element of a Flex f32 or bf16 tensor (identity of its buffer; null for
/// another dtype).
fn first_ptr(t: &FlexTensor) -> *const u8 {
    let off = t.layout().start_offset();
    match t.dtype() {
        DType::F32 => t.storage::<f32>()[off..].as_ptr().cast(),
        DType::BF16 => t.storage::<half::bf16>()[off..].as_ptr().cast(),
        _ => std::ptr::null(),
    }
}

impl PackedMatrix {
    /// Pack `w: [K, N]` when the fast path applies to it (contiguous f32 or bf16 on a plain Flex
    /// device, a CPU with AVX2/FMA); `None` otherwise. A bf16 weight is widened (exact) one
    /// matrix at a time for packing; its values are bf16 numbers, so [`PackPrecision::Bf16IfExact`]
    /// packs it as bf16 again.
    pub fn pack(w: &Tensor<2>, precision: PackPrecision) -> Option<Self> {
        let [k, n] = w.dims();
        if k == 0 || n < 8 || !supported() {
            return None;
        }
        let wf: FlexTensor = w.clone().try_into_primitive::<Flex>().ok()?;
        if !wf.is_contiguous() {
            return None;
        }
        let panels = match wf.dtype() {
            DType::F32 => PackedPanels::pack(slice(&wf), k, n, precision),
            DType::BF16 => {
                let off = wf.layout().start_offset();
                let wide: Vec<f32> = wf.storage::<half::bf16>()[off..off + k * n]
                    .iter()
                    .map(|h| h.to_f32())
                    .collect();
                PackedPanels::pack(&wide, k, n, precision)
            }
            _ => return None,
        };
        Some(PackedMatrix { panels, source: wf })
    }

    /// Whether the panels hold bf16 values.
    pub fn is_bf16(&self) -> bool {
        self.panels.is_bf16()
    }

    /// Bytes of packed weights.
    pub fn bytes(&self) -> usize {
        self.panels.bytes()
    }

    /// Whether `w` is still the tensor this copy was made from.
    fn packs(&self, w: &FlexTensor) -> bool {
        let shape = w.layout().shape();
        shape.num_dims() == 2
            && shape[0] == self.panels.k()
            && shape[1] == self.panels.n()
            && std::ptr::eq(first_ptr(w), first_ptr(&self.source))
    }
}

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
    let [m, k] = x.dims();
    if m == 0 || m > MAX_PACKED_ROWS || k != p.panels.k() || isa.clamp() < Isa::Avx2 {
        return None;
    }
    let wf: FlexTensor = w.clone().try_into_primitive::<Flex>().ok()?;
    if !p.packs(&wf) {
        return None;
    }
    let xc = flex_f32(x)?;
    let out = decode::packed_matmul(slice(&xc), m, &p.panels, isa)?;
    let t = FlexTensor::from_data(TensorData::new(out, [m, p.panels.n()]));
    Some(Tensor::<2>::from_primitive::<Flex>(t))
}

/// Attention of one new token per row against a KV cache, on the host (decode steps):
/// [`rlcr_kernels::decode::decode_attention`] on burn tensors.
///
/// `q: [B, K, g, d]` (the `g` query heads sharing each key/value head), `k`, `v`: `[B, K, cap,
/// d]` cache buffers of which slots `0..len` are used; `keys_ok: [B · len]` says which slots each
/// row may attend to. Same function as burn's `attention` with the boolean mask, up to rounding
/// (the sums run in another order: ~1e-7 relative). Rows are independent.
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
    let [b, kh, g, d] = q.dims();
    let [b2, kh2, cap, d2] = k.dims();
    if b2 != b || kh2 != kh || d2 != d || v.dims() != k.dims() || len > cap || len == 0 {
        return None;
    }
    if keys_ok.len() != b * len {
        return None;
    }
    let (qf, kf, vf) = (flex_f32(q)?, flex_f32(k)?, flex_f32(v)?);
    let shape = AttentionShape {
        batch: b,
        kv_heads: kh,
        group: g,
        dim: d,
        cap,
        len,
    };
    let out = decode::decode_attention(slice(&qf), slice(&kf), slice(&vf), shape, keys_ok, scale);
    let t = FlexTensor::from_data(TensorData::new(out, [b, kh, g, d]));
    Some(Tensor::<4>::from_primitive::<Flex>(t))
}

fn supported() -> bool {
    isa() >= Isa::Avx2
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

    /// `len` test values `((i·mul mod modulus) − centre) / scale`.
    fn pattern(len: usize, mul: usize, modulus: usize, centre: f32, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * mul % modulus) as f32 - centre) / scale)
            .collect()
    }

    /// `values` plus `1e-3·(i mod period)` (most of them off the bf16 grid).
    fn off_grid(values: Vec<f32>, period: usize) -> Vec<f32> {
        let wobble = |(i, v): (usize, f32)| v + 1e-3 * (i % period) as f32;
        values.into_iter().enumerate().map(wobble).collect()
    }

    /// The `[rows, cols]` Flex tensor of `values`.
    fn matrix(values: &[f32], rows: usize, cols: usize, dev: &Device) -> Tensor<2> {
        Tensor::<2>::from_data(TensorData::new(values.to_vec(), [rows, cols]), dev)
    }

    /// `got` is `x · w` (`[m, k]·[k, n]`) within 1e-4 relative of the f64 product.
    fn assert_product(got: &[f32], x: &[f32], m: usize, k: usize, w: &[f32], n: usize) {
        for (g, w) in got.iter().zip(&naive(x, m, k, w, n)) {
            assert!(
                (*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()),
                "{m}x{k}x{n}: {g} vs {w}"
            );
        }
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
            let x = pattern(m * k, 37, 101, 50.0, 50.0);
            let w = pattern(k * n, 53, 97, 48.0, 40.0);
            let (xt, wt) = (matrix(&x, m, k, &dev), matrix(&w, k, n, &dev));
            let got = small_matmul(&xt, &wt).expect("fast path applies");
            let got = crate::model::read_f32(got).unwrap();
            assert_product(&got, &x, m, k, &w, n);
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
            let x = pattern(m * k, 29, 89, 44.0, 30.0);
            let w = pattern(k * n, 31, 83, 41.0, 25.0);
            let (xt, wt) = (matrix(&x, m, k, &dev), matrix(&w, k, n, &dev));
            let p = PackedMatrix::pack(&wt, PackPrecision::F32).expect("packable");
            let got = crate::model::read_f32(packed_matmul(&xt, &wt, &p).unwrap()).unwrap();
            assert_product(&got, &x, m, k, &w, n);
            // A different tensor with the same values and shape is not the packed one.
            let other = matrix(&w, k, n, &dev);
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
            let x = pattern(m * k, 29, 89, 44.0, 30.0);
            let w = off_grid(pattern(k * n, 31, 83, 41.0, 25.0), 7);
            let wb: Vec<f32> = w
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_f32())
                .collect();
            assert!(
                wb.iter().zip(&w).any(|(a, b)| a != b),
                "test needs inexact weights"
            );
            let (xt, wt) = (matrix(&x, m, k, &dev), matrix(&w, k, n, &dev));
            let wbt = matrix(&wb, k, n, &dev);
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
            assert_product(&run(&wt, &keep), &x, m, k, &w, n);
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
            let w = off_grid(pattern(k * n, 43, 107, 53.0, 31.0), 5);
            let x = pattern(MAX_PACKED_ROWS * k, 41, 113, 56.0, 37.0);
            let wt = matrix(&w, k, n, &dev);
            for precision in [PackPrecision::F32, PackPrecision::Bf16Rounded] {
                let p = PackedMatrix::pack(&wt, precision).unwrap();
                for m in (1..=MAX_PACKED_ROWS).filter(|m| m % 7 < 3 || *m == MAX_PACKED_ROWS) {
                    let xt = matrix(&x[..m * k], m, k, &dev);
                    let run = |isa| {
                        crate::model::read_f32(packed_matmul_isa(&xt, &wt, &p, isa).unwrap())
                            .unwrap()
                    };
                    let (a512, a2) = (run(Isa::Avx512), run(Isa::Avx2));
                    assert_eq!(a512, a2, "{m}x{k}x{n} {precision:?}");
                    assert!(packed_matmul_isa(&xt, &wt, &p, Isa::Scalar).is_none());
                    if precision == PackPrecision::F32 {
                        assert_product(&a512, &x[..m * k], m, k, &w, n);
                    }
                }
            }
        }
    }

    /// A row's result does not depend on how many rows are multiplied with it.
    #[test]
    fn packed_rows_do_not_depend_on_the_row_count() {
        if !supported() {
            return;
        }
        let dev = Device::flex();
        let (k, n) = (97, 45);
        let x = pattern(MAX_PACKED_ROWS * k, 41, 113, 56.0, 37.0);
        let wt = matrix(&pattern(k * n, 43, 107, 53.0, 31.0), k, n, &dev);
        let p = PackedMatrix::pack(&wt, PackPrecision::F32).unwrap();
        let first_rows = |m: usize, isa: Isa| {
            let xt = matrix(&x[..m * k], m, k, &dev);
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
            let xt = matrix(&x[..m * k], m, k, &dev);
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
        let val = |n: usize, m: usize| pattern(n, m, 97, 48.0, 23.0);
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
