//! rlcr's blocked f32 GEMM ([`rlcr_kernels::sgemm`]) on burn tensors: `x · w` on Flex, plain
//! (prefill) or autodiff (training, a custom `Backward` op), the default product of both.
//!
//! The kernel itself (packing, AVX-512 / AVX2 micro-kernels, the determinism rule: every output
//! one chain of fused multiply-adds over K from zero, so its bits depend neither on the batch,
//! the thread count nor the ISA, and equal the decode kernels') lives in the `rlcr-kernels`
//! crate, which every build compiles optimised; this module converts tensors and wires autodiff.
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{binary, Backward, Ops};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, Tensor, TensorData};

pub use rlcr_kernels::sgemm::{sgemm, View, KC, MC, NC};

use std::cell::Cell;

/// The precision of [`matmul`]'s products: f32 (the default), or bf16 operands with f32
/// accumulation ([`rlcr_kernels::bf16`]), as torch's CPU autocast runs a `Linear`.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 operands: every product one FMA chain over K (the bits of decode and prefill).
    #[default]
    F32,
    /// Operands rounded to bfloat16 (nearest, ties to even), products summed in f32; outputs,
    /// gradients, master weights and optimizer state stay f32.
    Bf16,
}

impl Precision {
    /// `f32` / `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

/// Whether `device` can run `precision`: bf16 products need a backend with bf16 arithmetic
/// ([`burn::tensor::Device::supports_dtype`]): the CPU (rlcr's kernels), CUDA, Metal. wgpu on
/// Vulkan, DX12 or GL has none (WGSL has no bf16 type; Vulkan's bf16 extension allows
/// conversions and dot products only), so `--precision bf16` there is an error naming the device.
pub fn check_device(precision: Precision, device: &burn::tensor::Device) -> anyhow::Result<()> {
    if precision == Precision::Bf16
        && !crate::model::ops::on_host(device)
        && !device.supports_dtype(DType::BF16)
    {
        anyhow::bail!(
            "--precision bf16: the device {device:?} has no bf16 arithmetic (wgpu's Vulkan, DX12 and \
             GL backends store and convert bf16 at most); use --precision f32 there, or a CUDA \
             device or the CPU for bf16"
        );
    }
    Ok(())
}

thread_local! {
    static PRECISION: Cell<Precision> = const { Cell::new(Precision::F32) };
}

/// The precision [`matmul`] uses on this thread ([`autocast`] sets it; f32 otherwise).
pub fn precision() -> Precision {
    PRECISION.with(|p| p.get())
}

/// Runs the products of [`matmul`] on this thread in `precision` until the returned guard is
/// dropped (then the previous precision is back), like `torch.autocast`: a thread-local scope,
/// so tests and threads do not see each other's. Backward runs in the precision its forward had.
#[must_use = "the precision holds only while the guard lives"]
pub fn autocast(precision: Precision) -> Autocast {
    Autocast(PRECISION.with(|p| p.replace(precision)))
}

/// The scope of [`autocast`]; dropping it restores the previous precision.
#[derive(Debug)]
pub struct Autocast(Precision);

impl Drop for Autocast {
    fn drop(&mut self) {
        PRECISION.with(|p| p.set(self.0));
    }
}

use super::decode::{self as cpu, Isa};
use crate::model::backend::record;

/// Whether [`matmul`] runs (read once per process): the default, and `RLCR_GEMM=rlcr`;
/// `RLCR_GEMM=burn` sends every product to burn's matmul (the gemm crate) instead, e.g. to
/// compare. The learning test's figures are measured on this path (its module documentation);
/// the two paths round differently (each output here is one FMA chain over K; gemm splits K), so
/// a loop's numbers move with the choice. See [`crate::switches`].
pub fn enabled() -> bool {
    crate::switches::get().gemm == crate::switches::Path::Rlcr
}

/// `x · w` for `x: [m, k]`, `w: [k, n]` through [`sgemm`] when both are f32 tensors on a Flex
/// device, plain or autodiff, or `x` is f32 and `w` a bf16 weight on a plain Flex device (read in
/// place: the f32 product's bits in [`Precision::F32`], the bf16 product in [`Precision::Bf16`]) (then differentiable: backward computes `dx = dy · wᵀ` and
/// `dw = xᵀ · dy`, each one [`sgemm`] call on transposed views, no copies); `None` on every other
/// device, when [`enabled`] is off (`RLCR_GEMM=burn`), or when the CPU has no kernel ([`cpu::isa`]
/// below AVX2): the caller then uses burn's matmul.
pub fn matmul(x: &Tensor<2>, w: &Tensor<2>) -> Option<Tensor<2>> {
    if !enabled() {
        return None;
    }
    matmul_isa(x, w, cpu::isa())
}

/// [`matmul`] on the kernels of `isa` (ignores [`enabled`]; for tests and benchmarks).
pub fn matmul_isa(x: &Tensor<2>, w: &Tensor<2>, isa: Isa) -> Option<Tensor<2>> {
    if !rlcr_kernels::sgemm::has_kernel(isa) {
        return None;
    }
    let [m, k] = x.dims();
    let [k2, n] = w.dims();
    if k != k2 {
        return None; // burn's matmul reports the shape error
    }
    if let Ok(xa) = x.clone().try_into_primitive::<Autodiff<Flex>>() {
        let wa = w.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
        let (x_tracked, w_tracked) = (xa.is_tracked(), wa.is_tracked());
        let (xp, xg) = xa.into_parts();
        let (wp, wg) = wa.into_parts();
        let xv = f32_tensor(xp)?;
        if wp.dtype() == DType::BF16 {
            // A frozen weight held in bf16 (a LoRA base): read in place forward and backward.
            // A trainable weight is f32 (the master weights), so a tracked bf16 one is left to
            // burn.
            if w_tracked {
                return None;
            }
            let wv = positive_strides(wp);
            let bf16 = precision() == Precision::Bf16;
            let y = held_product(m, n, k, &xv, bf16_view(&wv), bf16, isa)?;
            let out = record(MatmulBackward, [xg, wg], y, || MatmulState {
                x: None,
                w: Some(Saved::Held { w: wv, bf16 }),
                isa,
            });
            return Some(Tensor::<2>::from_primitive::<Autodiff<Flex>>(out));
        }
        let wv = f32_tensor(wp)?;
        let (y, xs, ws) = match precision() {
            Precision::F32 => {
                let y = product(m, n, k, (&xv, false), (&wv, false), isa)?;
                (y, Saved::F32(xv), Saved::F32(wv))
            }
            Precision::Bf16 => {
                let (xb, wb) = (Bf16Matrix::of(&xv), Bf16Matrix::of(&wv));
                let y = bf16_product(m, n, k, xb.view(false), wb.view(false), isa)?;
                (y, Saved::Bf16(xb), Saved::Bf16(wb))
            }
        };
        let out = record(MatmulBackward, [xg, wg], y, || MatmulState {
            x: w_tracked.then_some(xs),
            w: x_tracked.then_some(ws),
            isa,
        });
        return Some(Tensor::<2>::from_primitive::<Autodiff<Flex>>(out));
    }
    let xp = f32_tensor(x.clone().try_into_primitive::<Flex>().ok()?)?;
    let wp = w.clone().try_into_primitive::<Flex>().ok()?;
    if wp.dtype() == DType::BF16 {
        // A weight held in bf16: read in place, never widened as a whole.
        let wp = positive_strides(wp);
        let bf16 = precision() == Precision::Bf16;
        let y = held_product(m, n, k, &xp, bf16_view(&wp), bf16, isa)?;
        return Some(Tensor::<2>::from_primitive::<Flex>(y));
    }
    let wp = f32_tensor(wp)?;
    let y = match precision() {
        Precision::F32 => product(m, n, k, (&xp, false), (&wp, false), isa)?,
        Precision::Bf16 => {
            let (xb, wb) = (Bf16Matrix::of(&xp), Bf16Matrix::of(&wp));
            bf16_product(m, n, k, xb.view(false), wb.view(false), isa)?
        }
    };
    Some(Tensor::<2>::from_primitive::<Flex>(y))
}

/// `a · b` for an f32 `a` (`[m, k]`) and a bf16 `b` (`[k, n]`, bit patterns read in place): with
/// f32 products (`bf16` false) the bits of the f32 product of the widened `b`, else `a` rounded to
/// bf16 and the bf16 product.
fn held_product(
    m: usize,
    n: usize,
    k: usize,
    a: &FlexTensor,
    b: View<'_, u16>,
    bf16: bool,
    isa: Isa,
) -> Option<FlexTensor> {
    if bf16 {
        let ab = Bf16Matrix::of(a);
        return bf16_product(m, n, k, ab.view(false), b, isa);
    }
    let mut out = vec![0f32; m * n];
    if !rlcr_kernels::sgemm::sgemm_bf16_b(m, n, k, view(a, false), b, &mut out, isa) {
        return None;
    }
    Some(FlexTensor::from_data(TensorData::new(out, [m, n])))
}

/// A 2-D tensor's values rounded to bf16 ([`rlcr_kernels::bf16::round`]), row-major.
#[derive(Debug, Clone)]
struct Bf16Matrix {
    data: Vec<u16>,
    cols: usize,
}

impl Bf16Matrix {
    fn of(t: &FlexTensor) -> Bf16Matrix {
        let (rows, cols) = (t.layout().shape()[0], t.layout().shape()[1]);
        let v = view(t, false);
        let mut data = vec![0u16; rows * cols];
        if v.cs == 1 && (v.rs == cols || rows <= 1) {
            rlcr_kernels::bf16::round_slice(&v.data[v.off..v.off + rows * cols], &mut data);
        } else {
            // A strided layout (a transposed view): gather row by row, then round.
            let mut row = vec![0f32; cols];
            for (i, out) in data.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
                for (j, r) in row.iter_mut().enumerate() {
                    *r = v.data[v.off + i * v.rs + j * v.cs];
                }
                rlcr_kernels::bf16::round_slice(&row, out);
            }
        }
        Bf16Matrix { data, cols }
    }

    /// The matrix (transposed when `t`) as a kernel view.
    fn view(&self, t: bool) -> View<'_, u16> {
        let v = View::rows(&self.data, self.cols);
        if t {
            v.t()
        } else {
            v
        }
    }
}

/// `A · B` of bf16 views as a new `[m, n]` f32 tensor ([`rlcr_kernels::bf16::gemm`]).
fn bf16_product(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_, u16>,
    b: View<'_, u16>,
    isa: Isa,
) -> Option<FlexTensor> {
    let mut out = vec![0f32; m * n];
    if !rlcr_kernels::bf16::gemm(m, n, k, a, b, &mut out, isa) {
        return None;
    }
    Some(FlexTensor::from_data(TensorData::new(out, [m, n])))
}

/// An operand kept for backward, in the precision of its forward.
#[derive(Debug, Clone)]
enum Saved {
    F32(FlexTensor),
    Bf16(Bf16Matrix),
    /// A frozen weight held in bf16 (the tensor itself, no copy), and whether the products ran
    /// in bf16.
    Held {
        w: FlexTensor,
        bf16: bool,
    },
}

/// An f32 tensor whose strides are non-negative (any other layout is made contiguous).
fn f32_tensor(t: FlexTensor) -> Option<FlexTensor> {
    if t.dtype() != DType::F32 {
        return None;
    }
    Some(positive_strides(t))
}

/// `t` itself when its strides are non-negative, else a contiguous copy.
fn positive_strides(t: FlexTensor) -> FlexTensor {
    if t.layout().has_positive_strides() {
        t
    } else {
        t.to_contiguous()
    }
}

/// The strided view of a 2-D bf16 tensor as bit patterns (no copy).
fn bf16_view(x: &FlexTensor) -> View<'_, u16> {
    use half::slice::HalfFloatSliceExt;
    let l = x.layout();
    let st = l.strides();
    View {
        data: x.storage::<half::bf16>().reinterpret_cast(),
        off: l.start_offset(),
        rs: st[0].unsigned_abs(),
        cs: st[1].unsigned_abs(),
    }
}

/// The strided view of a 2-D f32 tensor (transposed when `t`).
fn view(x: &FlexTensor, t: bool) -> View<'_> {
    let l = x.layout();
    let st = l.strides();
    let v = View {
        data: x.storage::<f32>(),
        off: l.start_offset(),
        rs: st[0].unsigned_abs(),
        cs: st[1].unsigned_abs(),
    };
    if t {
        v.t()
    } else {
        v
    }
}

/// `op(a) · op(b)` as a new `[m, n]` tensor.
fn product(
    m: usize,
    n: usize,
    k: usize,
    a: (&FlexTensor, bool),
    b: (&FlexTensor, bool),
    isa: Isa,
) -> Option<FlexTensor> {
    let mut out = vec![0f32; m * n];
    if !sgemm(m, n, k, view(a.0, a.1), view(b.0, b.1), &mut out, isa) {
        return None;
    }
    Some(FlexTensor::from_data(TensorData::new(out, [m, n])))
}

#[derive(Debug)]
struct MatmulBackward;

/// What backward keeps: `x` when `w` needs a gradient, `w` when `x` does.
#[derive(Debug, Clone)]
struct MatmulState {
    x: Option<Saved>,
    w: Option<Saved>,
    isa: Isa,
}

impl Backward<Flex, 2> for MatmulBackward {
    type State = MatmulState;

    fn backward(self, ops: Ops<MatmulState, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let MatmulState { x, w, isa } = ops.state;
        // bf16: the upstream gradient is rounded once for both products.
        let dy_bf16: std::cell::OnceCell<Bf16Matrix> = std::cell::OnceCell::new();
        binary::<Flex, _, _>(
            ops.parents,
            ops.node,
            grads,
            |dy| {
                // dx = dy · wᵀ: [m, n] · [n, k].
                let w = w.unwrap_or_else(|| unreachable!("w kept when x is tracked"));
                let dy = f32_tensor(dy).unwrap_or_else(|| unreachable!("f32 gradient"));
                let (m, n) = (dy.layout().shape()[0], dy.layout().shape()[1]);
                match w {
                    Saved::F32(w) => {
                        let k = w.layout().shape()[0];
                        product(m, k, n, (&dy, false), (&w, true), isa)
                    }
                    Saved::Bf16(w) => {
                        let k = w.data.len() / w.cols.max(1);
                        let dyb = dy_bf16.get_or_init(|| Bf16Matrix::of(&dy));
                        bf16_product(m, k, n, dyb.view(false), w.view(true), isa)
                    }
                    Saved::Held { w, bf16 } => {
                        let k = w.layout().shape()[0];
                        held_product(m, k, n, &dy, bf16_view(&w).t(), bf16, isa)
                    }
                }
                .unwrap_or_else(|| unreachable!("kernel checked in forward"))
            },
            |dy| {
                // dw = xᵀ · dy: [k, m] · [m, n].
                let x = x.unwrap_or_else(|| unreachable!("x kept when w is tracked"));
                let dy = f32_tensor(dy).unwrap_or_else(|| unreachable!("f32 gradient"));
                let (m, n) = (dy.layout().shape()[0], dy.layout().shape()[1]);
                match x {
                    Saved::F32(x) => {
                        let k = x.layout().shape()[1];
                        product(k, n, m, (&x, true), (&dy, false), isa)
                    }
                    Saved::Bf16(x) => {
                        let dyb = dy_bf16.get_or_init(|| Bf16Matrix::of(&dy));
                        bf16_product(x.cols, n, m, x.view(true), dyb.view(false), isa)
                    }
                    Saved::Held { .. } => unreachable!("a held weight is never tracked"),
                }
                .unwrap_or_else(|| unreachable!("kernel checked in forward"))
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    use rlcr_kernels::testing::{bits, data, isas};

    use crate::model::transformer::tests::max_diff;

    /// The custom autodiff op against burn's matmul on `Autodiff<Flex>`: forward values and
    /// both gradients (through a loss that weights every output differently), and the
    /// gradients' bits against the FMA chain of `dy · wᵀ` and `xᵀ · dy`.
    #[test]
    fn autodiff_matmul_matches_burn_with_gradients() {
        let Some(&isa) = isas().first() else {
            return;
        };
        let dev = Device::flex().autodiff();
        let (m, k, n) = (37, 300, 70);
        let (xd, wd, gd) = (data(m * k, 5), data(k * n, 6), data(m * n, 7));
        let mut res = Vec::new();
        for ours in [true, false] {
            let x =
                Tensor::<2>::from_data(TensorData::new(xd.clone(), [m, k]), &dev).require_grad();
            // w as a transposed view of a [n, k] parameter: strided input to forward.
            let wt =
                Tensor::<2>::from_data(TensorData::new(wd.clone(), [n, k]), &dev).require_grad();
            let w = wt.clone().transpose();
            let y = if ours {
                matmul_isa(&x, &w, isa).expect("Flex autodiff path")
            } else {
                x.clone().matmul(w)
            };
            let g = Tensor::<2>::from_data(TensorData::new(gd.clone(), [m, n]), &dev);
            let grads = (y.clone() * g).sum().backward();
            let read = |t: Tensor<2>| t.into_data().try_into_vec::<f32>().unwrap();
            res.push((
                read(y),
                read(x.grad(&grads).unwrap()),
                read(wt.grad(&grads).unwrap()),
            ));
        }
        let close = |a: &[f32], b: &[f32], what: &str| {
            let scale = b.iter().fold(0f32, |s, v| s.max(v.abs()));
            let worst = max_diff(a, b);
            assert!(
                worst <= 1e-5 * scale,
                "{what}: off by {worst} (scale {scale})"
            );
        };
        close(&res[0].0, &res[1].0, "y");
        close(&res[0].1, &res[1].1, "dx");
        close(&res[0].2, &res[1].2, "dw");
        // dx = g · wᵀ ([m, n] · [n, k]); dwᵀ = (xᵀ · g)ᵀ, read back as [n, k].
        let dx = rlcr_kernels::sgemm::reference(m, k, n, View::rows(&gd, n), View::rows(&wd, k));
        assert_eq!(bits(&res[0].1), bits(&dx), "dx bits");
        let dw =
            rlcr_kernels::sgemm::reference(k, n, m, View::rows(&xd, k).t(), View::rows(&gd, n));
        let dw_t: Vec<f32> = (0..n * k).map(|i| dw[(i % k) * n + i / k]).collect();
        assert_eq!(bits(&res[0].2), bits(&dw_t), "dw bits");
        // The forward through a plain Flex device gives the autodiff forward's bits.
        let p = Device::flex();
        let xp = Tensor::<2>::from_data(TensorData::new(xd.clone(), [m, k]), &p);
        let wp = Tensor::<2>::from_data(TensorData::new(wd.clone(), [n, k]), &p).transpose();
        let yp = matmul_isa(&xp, &wp, isa)
            .unwrap()
            .into_data()
            .try_into_vec::<f32>()
            .unwrap();
        assert_eq!(bits(&yp), bits(&res[0].0));
    }

    /// The bf16 mode through the autodiff op: forward and both gradients are exactly
    /// [`rlcr_kernels::bf16::gemm`] of the rounded operands (the upstream gradient rounded too),
    /// on a strided weight; the scope ends with its guard and nests.
    #[test]
    fn bf16_autocast_products_and_gradients_are_the_kernels() {
        use rlcr_kernels::bf16::{gemm, round};
        let Some(&isa) = isas().first() else {
            return;
        };
        assert_eq!(precision(), Precision::F32);
        let dev = Device::flex().autodiff();
        let (m, k, n) = (29, 260, 45);
        let (xd, wd, gd) = (data(m * k, 15), data(k * n, 16), data(m * n, 17));
        let r = |v: &[f32]| v.iter().map(|&x| round(x)).collect::<Vec<u16>>();
        let (xb, wtb, gb) = (r(&xd), r(&wd), r(&gd));
        let x = Tensor::<2>::from_data(TensorData::new(xd.clone(), [m, k]), &dev).require_grad();
        let wt = Tensor::<2>::from_data(TensorData::new(wd.clone(), [n, k]), &dev).require_grad();
        let y = {
            let _outer = autocast(Precision::Bf16);
            {
                let _inner = autocast(Precision::F32);
                assert_eq!(precision(), Precision::F32);
            }
            assert_eq!(precision(), Precision::Bf16);
            matmul_isa(&x, &wt.clone().transpose(), isa).expect("Flex autodiff path")
        };
        assert_eq!(precision(), Precision::F32);
        let g = Tensor::<2>::from_data(TensorData::new(gd.clone(), [m, n]), &dev);
        let grads = (y.clone() * g).sum().backward();
        let read = |t: Tensor<2>| t.into_data().try_into_vec::<f32>().unwrap();
        let run = |mm, nn, kk, a: View<'_, u16>, b: View<'_, u16>| {
            let mut c = vec![0f32; mm * nn];
            assert!(gemm(mm, nn, kk, a, b, &mut c, isa));
            c
        };
        // y = x · w with w = wtᵀ; dx = g · wᵀ = g · wt; dwt = (xᵀ · g)ᵀ = gᵀ · x.
        let want_y = run(m, n, k, View::rows(&xb, k), View::rows(&wtb, k).t());
        assert_eq!(bits(&read(y)), bits(&want_y), "y");
        let want_dx = run(m, k, n, View::rows(&gb, n), View::rows(&wtb, k));
        assert_eq!(bits(&read(x.grad(&grads).unwrap())), bits(&want_dx), "dx");
        let dw = run(k, n, m, View::rows(&xb, k).t(), View::rows(&gb, n));
        let dw_t: Vec<f32> = (0..n * k).map(|i| dw[(i % k) * n + i / k]).collect();
        assert_eq!(bits(&read(wt.grad(&grads).unwrap())), bits(&dw_t), "dw");
        // And it is not the f32 product.
        let f32_y =
            rlcr_kernels::sgemm::reference(m, n, k, View::rows(&xd, k), View::rows(&wd, k).t());
        assert_ne!(bits(&f32_y), bits(&want_y));
    }
}
