//! RMSNorm, the SwiGLU gate and RoPE as single ops on Flex (plain, and `Autodiff<Flex>` as custom
//! `Backward` ops), in place of burn's composites: the row loops are
//! [`rlcr_kernels::norm`] (one pass forward, one backward, rows in parallel).
//!
//! What burn's composites cost, per layer of a training step: RMSNorm is seven element-wise
//! kernels forward (`square`, `mean_dim`, `add_scalar`, `sqrt`, `recip`, two broadcast `mul`s)
//! and about a dozen backward, with `x·r` and `x²` kept for backward; the SwiGLU gate is three
//! forward (`sigmoid`, two `mul`s) with `g·s` and the two slices kept, and backward recomputes
//! `sigmoid`, runs six more kernels and writes two zero-padded `[rows, 2I]` buffers (one per
//! slice) that are then added. The fused ops keep only their inputs (and one number per row for
//! RMSNorm), and write each output once.
//!
//! - [`swiglu`] gives **the same bits** as burn's composite, forward and backward (the same
//!   operations in the same order, libm's `expf`; tested bit for bit below), so it is on by
//!   default; `RLCR_SWIGLU=burn` keeps the composite.
//! - [`rms_norm`] sums each row in a fixed order of its own (burn's `mean_dim` sums in
//!   macerator's order, which depends on the SIMD width it picks), so its results differ from the
//!   composite in the last bits (within 2e-6 of the largest value here, tested; and against an
//!   f64 evaluation in the kernels crate). Opt-in (`RLCR_NORM=rlcr`): see [`norm_enabled`].
//!
//! - [`rope`] (HF's rotate-half rotary embedding) gives the composite's bits too, reads the
//!   attention's strided `q`/`k` view in place and keeps only the cos / sin tables for backward;
//!   on by default, `RLCR_ROPE=burn` keeps the composite.
//!
//! [`crate::model::ops`] enters these only on the CPU; the GPUs have their own
//! ([`super::super::gpu`]).
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::activation::sigmoid;
use burn::tensor::{DType, Tensor, TensorData};

use super::{contiguous, flex_f32, slice};
use rlcr_kernels::norm as kernel;
use rlcr_kernels::rope as rope_kernel;

use super::decode::{self as cpu, Isa};
use crate::model::backend::record;

/// Whether [`rms_norm`] runs rlcr's fused op on Flex (read once per process): `RLCR_NORM=rlcr`;
/// unset, empty or `burn` keeps burn's composite. Opt-in, like the fused LM head: its rounding
/// (the row sums' order) alone changes the learning loop's trajectories, and with uniform
/// warm-start confidences the learning test failed on it (dc1ee77, 2026-11-24: mean AUROC of the last
/// policies 0.622 < 0.67, seed 0's confidences 0.287 well formed), while it passes on the
/// composite. Bit-identity with the composite would need burn's reduction order (macerator's
/// 8-accumulator sum at the SIMD width it picks at run time) in the two row sums.
pub fn norm_enabled() -> bool {
    crate::switches::get().norm == crate::switches::Path::Rlcr
}

/// Whether [`swiglu`] runs rlcr's fused op on Flex (read once per process): `RLCR_SWIGLU=rlcr`
/// (the default: the same bits as the composite) or `burn`.
pub fn swiglu_enabled() -> bool {
    crate::switches::get().swiglu == crate::switches::Path::Rlcr
}

/// Whether [`rope`] runs rlcr's fused op on Flex (read once per process): `RLCR_ROPE=rlcr` (the
/// default: the same bits as the composite) or `burn`.
pub fn rope_enabled() -> bool {
    crate::switches::get().rope == crate::switches::Path::Rlcr
}

/// HF's rotate-half RoPE, `x·cos + rotate_half(x)·sin`, on `x: [B, n, T, d]` with `cos`, `sin`:
/// `[B, 1, T, d/2]` (constants): first half `x₁·c − x₂·s`, second half `x₂·c + x₁·s`. The fused
/// op on Flex when [`rope_enabled`], burn's composite otherwise (the same bits on Flex).
pub fn rope(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
    if rope_enabled() {
        if let Some(y) = rope_fused(&x, cos, sin) {
            return y;
        }
    }
    rope_composite(x, cos, sin)
}

/// burn's composite RoPE, on any device.
pub fn rope_composite(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
    let [b, n, t, d] = x.dims();
    let half = d / 2;
    let x1 = x.clone().slice([0..b, 0..n, 0..t, 0..half]);
    let x2 = x.slice([0..b, 0..n, 0..t, half..d]);
    let o1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
    let o2 = x2 * cos.clone() + x1 * sin.clone();
    Tensor::cat(vec![o1, o2], 3)
}

/// The fused RoPE on Flex (plain or autodiff; `x` may be a strided view whose last axis is
/// contiguous, read in place); `None` on other devices, dtypes or shapes.
pub fn rope_fused(x: &Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Option<Tensor<4>> {
    let [b, n, t, d] = x.dims();
    if d % 2 != 0 || cos.dims() != [b, 1, t, d / 2] || sin.dims() != cos.dims() {
        return None;
    }
    let table = |c: &Tensor<4>| -> Option<FlexTensor> {
        let p = match c.clone().try_into_primitive::<Autodiff<Flex>>() {
            Ok(a) => a.into_parts().0,
            Err(_) => c.clone().try_into_primitive::<Flex>().ok()?,
        };
        contiguous(p)
    };
    let (ct, st) = (table(cos)?, table(sin)?);
    let forward = |p: FlexTensor| -> Option<FlexTensor> {
        let p = if p.dtype() != DType::F32 {
            return None;
        } else if rope_rows(&p).is_some() {
            p
        } else {
            p.to_contiguous()
        };
        let rows = rope_rows(&p)?;
        let y = rope_kernel::forward(p.storage::<f32>(), rows, slice(&ct), slice(&st));
        Some(FlexTensor::from_data(TensorData::new(y, [b, n, t, d])))
    };
    if let Ok(xa) = x.clone().try_into_primitive::<Autodiff<Flex>>() {
        let (xp, xg) = xa.into_parts();
        let y = forward(xp)?;
        let y = record(RopeBackward, [xg], y, || RopeState { cos: ct, sin: st });
        return Some(Tensor::<4>::from_primitive::<Autodiff<Flex>>(y));
    }
    let y = forward(x.clone().try_into_primitive::<Flex>().ok()?)?;
    Some(Tensor::<4>::from_primitive::<Flex>(y))
}

/// The row layout of a 4-D f32 tensor whose last axis is contiguous and other strides are
/// non-negative; `None` otherwise.
fn rope_rows(p: &FlexTensor) -> Option<rope_kernel::Rows> {
    let l = p.layout();
    let sh = l.shape();
    let st = l.strides();
    if sh.num_dims() != 4 || (st[3] != 1 && sh[3] > 1) || st[..3].iter().any(|&s| s < 0) {
        return None;
    }
    Some(rope_kernel::Rows {
        shape: [sh[0], sh[1], sh[2], sh[3]],
        strides: [st[0] as usize, st[1] as usize, st[2] as usize],
        offset: l.start_offset(),
    })
}

/// HF's RMSNorm, `w · x / sqrt(mean(x²) + eps)` over the last axis of `x: [N, h]`, `w: [h]`:
/// the fused op on Flex when [`norm_enabled`], burn's composite otherwise.
pub fn rms_norm(x: Tensor<2>, w: Tensor<1>, eps: f64) -> Tensor<2> {
    if norm_enabled() {
        if let Some(y) = rms_norm_fused(&x, &w, eps, cpu::isa()) {
            return y;
        }
    }
    rms_norm_composite(x, w, eps)
}

/// burn's composite RMSNorm, on any device.
pub fn rms_norm_composite(x: Tensor<2>, w: Tensor<1>, eps: f64) -> Tensor<2> {
    let ms = x.clone().square().mean_dim(1);
    x * ms.add_scalar(eps).sqrt().recip() * w.unsqueeze_dim(0)
}

/// `silu(gate) · up` for `gu = [gate | up]: [N, 2I]`, `silu(g) = g · sigmoid(g)` as torch's:
/// `[N, I]`. The fused op on Flex when [`swiglu_enabled`], burn's composite otherwise (the same
/// bits on Flex).
pub fn swiglu(gu: Tensor<2>) -> Tensor<2> {
    if swiglu_enabled() {
        if let Some(y) = swiglu_fused(&gu) {
            return y;
        }
    }
    swiglu_composite(gu)
}

/// burn's composite SwiGLU gate, on any device.
pub fn swiglu_composite(gu: Tensor<2>) -> Tensor<2> {
    let [n, two_i] = gu.dims();
    let i = two_i / 2;
    let gate = gu.clone().slice([0..n, 0..i]);
    let up = gu.slice([0..n, i..two_i]);
    gate.clone() * sigmoid(gate) * up
}

/// The fused RMSNorm on Flex (plain or autodiff) with the kernels of `isa`; `None` on other
/// devices, other dtypes or mismatched shapes.
pub fn rms_norm_fused(x: &Tensor<2>, w: &Tensor<1>, eps: f64, isa: Isa) -> Option<Tensor<2>> {
    let [n, h] = x.dims();
    if w.dims() != [h] || h == 0 {
        return None;
    }
    let eps = eps as f32;
    if let Ok(xa) = x.clone().try_into_primitive::<Autodiff<Flex>>() {
        let wa = w.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
        let (xp, xg) = xa.into_parts();
        let (wp, wg) = wa.into_parts();
        let (xc, wc) = (contiguous(xp)?, contiguous(wp)?);
        let (y, r) = kernel::rms_norm_forward(slice(&xc), slice(&wc), eps, isa);
        let y = FlexTensor::from_data(TensorData::new(y, [n, h]));
        let y = record(NormBackward, [xg, wg], y, || NormState {
            x: xc,
            w: wc,
            r: Arc::new(r),
            isa,
        });
        return Some(Tensor::<2>::from_primitive::<Autodiff<Flex>>(y));
    }
    let (xc, wc) = (flex_f32(x)?, flex_f32(w)?);
    let (y, _) = kernel::rms_norm_forward(slice(&xc), slice(&wc), eps, isa);
    let y = FlexTensor::from_data(TensorData::new(y, [n, h]));
    Some(Tensor::<2>::from_primitive::<Flex>(y))
}

/// The fused SwiGLU gate on Flex (plain or autodiff); `None` on other devices, other dtypes or
/// an odd width.
pub fn swiglu_fused(gu: &Tensor<2>) -> Option<Tensor<2>> {
    let [n, two_i] = gu.dims();
    if two_i == 0 || two_i % 2 != 0 {
        return None;
    }
    let i = two_i / 2;
    if let Ok(ga) = gu.clone().try_into_primitive::<Autodiff<Flex>>() {
        let (gp, gg) = ga.into_parts();
        let gc = contiguous(gp)?;
        let y = kernel::swiglu_forward(slice(&gc), i);
        let y = FlexTensor::from_data(TensorData::new(y, [n, i]));
        let y = record(SwigluBackward, [gg], y, || SwigluState { gu: gc });
        return Some(Tensor::<2>::from_primitive::<Autodiff<Flex>>(y));
    }
    let gc = flex_f32(gu)?;
    let y = kernel::swiglu_forward(slice(&gc), i);
    let y = FlexTensor::from_data(TensorData::new(y, [n, i]));
    Some(Tensor::<2>::from_primitive::<Flex>(y))
}

#[derive(Debug)]
struct NormBackward;

/// What RMSNorm's backward keeps: its inputs and `r` per row.
#[derive(Debug, Clone)]
struct NormState {
    x: FlexTensor,
    w: FlexTensor,
    r: Arc<Vec<f32>>,
    isa: Isa,
}

impl Backward<Flex, 2> for NormBackward {
    type State = NormState;

    fn backward(self, ops: Ops<NormState, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let s = ops.state;
        let dy = contiguous(grads.consume::<Flex>(&ops.node))
            .unwrap_or_else(|| unreachable!("f32 RMSNorm gradient"));
        let (n, h) = (s.r.len(), s.w.layout().shape().num_elements());
        let (dx, dw) = kernel::rms_norm_backward(slice(&s.x), slice(&s.w), &s.r, slice(&dy), s.isa);
        let [px, pw] = ops.parents;
        if let Some(node) = px {
            grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(dx, [n, h])));
        }
        if let Some(node) = pw {
            grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(dw, [h])));
        }
    }
}

#[derive(Debug)]
struct SwigluBackward;

/// What the SwiGLU gate's backward keeps: its input.
#[derive(Debug, Clone)]
struct SwigluState {
    gu: FlexTensor,
}

impl Backward<Flex, 1> for SwigluBackward {
    type State = SwigluState;

    fn backward(self, ops: Ops<SwigluState, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let SwigluState { gu } = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
            let shape = gu.layout().shape();
            let (n, two_i) = (shape[0], shape[1]);
            let dy = contiguous(grad).unwrap_or_else(|| unreachable!("f32 SwiGLU gradient"));
            let dgu = kernel::swiglu_backward(slice(&gu), slice(&dy), two_i / 2);
            FlexTensor::from_data(TensorData::new(dgu, [n, two_i]))
        });
    }
}

#[derive(Debug)]
struct RopeBackward;

/// What RoPE's backward keeps: the cos / sin tables (the gradient does not need `x`).
#[derive(Debug, Clone)]
struct RopeState {
    cos: FlexTensor,
    sin: FlexTensor,
}

impl Backward<Flex, 1> for RopeBackward {
    type State = RopeState;

    fn backward(self, ops: Ops<RopeState, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let RopeState { cos, sin } = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
            let g = contiguous(grad).unwrap_or_else(|| unreachable!("f32 RoPE gradient"));
            let sh = g.layout().shape();
            let shape = [sh[0], sh[1], sh[2], sh[3]];
            let dx = rope_kernel::backward(slice(&g), shape, slice(&cos), slice(&sin));
            FlexTensor::from_data(TensorData::new(dx, shape))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;
    use rlcr_kernels::testing::{bits, data};

    use crate::model::transformer::tests::max_diff;

    fn read<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_into_vec::<f32>().unwrap()
    }

    /// `a` and `b` are the same bits (the first difference reported, not the whole arrays).
    fn same_bits(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let (ba, bb) = (bits(a), bits(b));
        if let Some(k) = (0..a.len()).find(|&k| ba[k] != bb[k]) {
            panic!(
                "{what}[{k}]: {} ({:#x}) vs {} ({:#x})",
                a[k], ba[k], b[k], bb[k]
            );
        }
    }

    /// Values and gradient of `Σ swiglu(gu) ∘ c` on `Autodiff<Flex>`, fused or composite.
    fn swiglu_run(fused: bool, gu: &[f32], c: &[f32], n: usize, i: usize) -> [Vec<f32>; 2] {
        let dev = Device::flex().autodiff();
        let x =
            Tensor::<2>::from_data(TensorData::new(gu.to_vec(), [n, 2 * i]), &dev).require_grad();
        let y = if fused {
            swiglu_fused(&x).expect("Flex autodiff path")
        } else {
            swiglu_composite(x.clone())
        };
        let ct = Tensor::<2>::from_data(TensorData::new(c.to_vec(), [n, i]), &dev);
        let grads = (y.clone() * ct).sum().backward();
        [read(y), read(x.grad(&grads).unwrap())]
    }

    /// The fused SwiGLU gate gives burn's composite's bits, forward and backward, on
    /// `Autodiff<Flex>`; and the plain-Flex forward the autodiff forward's bits.
    #[test]
    fn swiglu_gives_the_composites_bits() {
        let (n, i) = (37, 150);
        // Gates over ±40 (both branches of sigmoid, saturation), a few exact zeros and −0s.
        let mut gu: Vec<f32> = data(n * 2 * i, 21).iter().map(|v| v * 0.04).collect();
        gu[3] = -0.0;
        gu[i + 3] = 2.0;
        gu[5] = 0.0;
        gu[6] = -88.0;
        let c: Vec<f32> = data(n * i, 22);
        let ours = swiglu_run(true, &gu, &c, n, i);
        let theirs = swiglu_run(false, &gu, &c, n, i);
        same_bits(&ours[0], &theirs[0], "values");
        same_bits(&ours[1], &theirs[1], "gradient");
        assert!(ours[1].iter().filter(|&&v| v != 0.0).count() > n * i);
        let plain = Tensor::<2>::from_data(TensorData::new(gu, [n, 2 * i]), &Device::flex());
        same_bits(&read(swiglu_fused(&plain).unwrap()), &ours[0], "plain");
    }

    /// RoPE fused against the composite on `Autodiff<Flex>`, on the strided view the attention
    /// takes (heads `0..n` of a `[B·T, (n + 1)·d]` projection, reshaped and swapped): values and
    /// the gradient of the whole projection, bit for bit; plain Flex gives the autodiff bits.
    #[test]
    fn rope_gives_the_composites_bits() {
        let (b, n, t, d) = (2, 3, 7, 16);
        let half = d / 2;
        let proj = data(b * t * (n + 1) * d, 31);
        let angle: Vec<f64> = (0..b * t * half).map(|i| 0.61 * i as f64).collect();
        let cos: Vec<f32> = angle.iter().map(|a| a.cos() as f32).collect();
        let sin: Vec<f32> = angle.iter().map(|a| a.sin() as f32).collect();
        let c = data(b * n * t * d, 32);
        let run = |fused: bool, dev: &Device| {
            let p =
                Tensor::<2>::from_data(TensorData::new(proj.clone(), [b * t, (n + 1) * d]), dev)
                    .require_grad();
            let x =
                p.clone()
                    .reshape([b, t, n + 1, d])
                    .swap_dims(1, 2)
                    .slice([0..b, 0..n, 0..t, 0..d]);
            let ct = Tensor::<4>::from_data(TensorData::new(cos.clone(), [b, 1, t, half]), dev);
            let st = Tensor::<4>::from_data(TensorData::new(sin.clone(), [b, 1, t, half]), dev);
            let y = if fused {
                rope_fused(&x, &ct, &st).expect("Flex path")
            } else {
                rope_composite(x, &ct, &st)
            };
            let w = Tensor::<4>::from_data(TensorData::new(c.clone(), [b, n, t, d]), dev);
            let grads = (y.clone() * w).sum().backward();
            [read(y), read(p.grad(&grads).unwrap())]
        };
        let dev = Device::flex().autodiff();
        let ours = run(true, &dev);
        let theirs = run(false, &dev);
        same_bits(&ours[0], &theirs[0], "values");
        same_bits(&ours[1], &theirs[1], "gradient");
        // The last head of the projection (not an input of RoPE) gets zeros, the others not.
        assert!(ours[1].iter().filter(|&&v| v != 0.0).count() > b * t * n * d / 2);
        let x = Tensor::<2>::from_data(
            TensorData::new(proj.clone(), [b * t, (n + 1) * d]),
            &Device::flex(),
        )
        .reshape([b, t, n + 1, d])
        .swap_dims(1, 2)
        .slice([0..b, 0..n, 0..t, 0..d]);
        let ct = Tensor::<4>::from_data(
            TensorData::new(cos.clone(), [b, 1, t, half]),
            &Device::flex(),
        );
        let st = Tensor::<4>::from_data(
            TensorData::new(sin.clone(), [b, 1, t, half]),
            &Device::flex(),
        );
        same_bits(&read(rope_fused(&x, &ct, &st).unwrap()), &ours[0], "plain");
    }

    /// Values and gradients (x and w) of `Σ rms_norm(x, w) ∘ c` on `Autodiff<Flex>`.
    fn norm_run(fused: bool, x: &[f32], w: &[f32], c: &[f32], h: usize) -> [Vec<f32>; 3] {
        let dev = Device::flex().autodiff();
        let n = x.len() / h;
        let xt = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [n, h]), &dev).require_grad();
        let wt = Tensor::<1>::from_data(TensorData::new(w.to_vec(), [h]), &dev).require_grad();
        let y = if fused {
            rms_norm_fused(&xt, &wt, 1e-5, cpu::isa()).expect("Flex autodiff path")
        } else {
            rms_norm_composite(xt.clone(), wt.clone(), 1e-5)
        };
        let ct = Tensor::<2>::from_data(TensorData::new(c.to_vec(), [n, h]), &dev);
        let grads = (y.clone() * ct).sum().backward();
        [
            read(y),
            read(xt.grad(&grads).unwrap()),
            read(wt.grad(&grads).unwrap()),
        ]
    }

    /// The fused RMSNorm against burn's composite on `Autodiff<Flex>` (values and both
    /// gradients), at SmolLM2's width and at an odd one; plain Flex gives the autodiff bits.
    #[test]
    fn rms_norm_matches_the_composite_with_gradients() {
        for (n, h) in [(48usize, 576usize), (5, 67)] {
            let x: Vec<f32> = data(n * h, h as u64).iter().map(|v| v * 0.3).collect();
            let w: Vec<f32> = data(h, 5).iter().map(|v| 1.0 + 1e-3 * v).collect();
            let c = data(n * h, 6);
            let ours = norm_run(true, &x, &w, &c, h);
            let theirs = norm_run(false, &x, &w, &c, h);
            for (k, what) in ["y", "dx", "dw"].iter().enumerate() {
                let scale = theirs[k].iter().fold(0f32, |a, b| a.max(b.abs()));
                let worst = max_diff(&ours[k], &theirs[k]);
                assert!(
                    worst <= 2e-6 * scale,
                    "{what}: off by {worst} (scale {scale})"
                );
                assert!(ours[k].iter().any(|&v| v != 0.0), "{what} is all zeros");
            }
            let plain = Tensor::<2>::from_data(TensorData::new(x, [n, h]), &Device::flex());
            let wp = Tensor::<1>::from_data(TensorData::new(w, [h]), &Device::flex());
            let y = rms_norm_fused(&plain, &wp, 1e-5, cpu::isa()).unwrap();
            same_bits(&read(y), &ours[0], "plain");
        }
    }

    /// A hand calculation: x = [3, 4] (mean square 12.5), w = [2, 1/2], eps 0:
    /// y = [3·2, 4·0.5] / sqrt(12.5) = [1.697056…, 0.565685…].
    #[test]
    fn rms_norm_by_hand() {
        let dev = Device::flex();
        let x = Tensor::<2>::from_data(TensorData::new(vec![3f32, 4.0], [1, 2]), &dev);
        let w = Tensor::<1>::from_data(TensorData::new(vec![2f32, 0.5], [2]), &dev);
        let y = read(rms_norm_fused(&x, &w, 0.0, cpu::isa()).unwrap());
        let r = 1.0 / 12.5f64.sqrt();
        assert!((y[0] as f64 - 6.0 * r).abs() < 1e-6 && (y[1] as f64 - 2.0 * r).abs() < 1e-6);
    }
}
