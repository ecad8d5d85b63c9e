//! SwiGLU's gate as one `#[cube]` kernel: one cube per row, its units striding over the
//! intermediate size. In place of [`super::swiglu`]'s five launches. The composite's formula op
//! for op, `gate / (exp(−gate) + 1) · up`, in f32. On autodiff tensors (training) differentiable
//! with a `Backward` of its own: one launch forward and one backward, keeping only its input,
//! where burn derives about ten backward launches for the composite and keeps the slices and
//! products. With `s = 1/(1 + exp(−g))`:
//!
//! ```text
//! ∂L/∂g = d·u·(s + g·s·(1 − s))        ∂L/∂u = d·g·s
//! ```
//!
//! written into one `[N, 2I]` gradient (large negative gates: `s = 0`, both 0, never a NaN).
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::cubecl;
use burn::tensor::{DType, Tensor as BurnTensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::Cube;
use cubecl::prelude::*;

use super::block::{cube_row, output, plain, row_grid, row_units, tensor};
use crate::model::backend::record;

/// `silu(gate) · up` for `gu = [gate | up]` (`[N, 2I]`), `[N, I]`, in one launch; on autodiff
/// tensors differentiable (one launch backward). `None` on the CPU or for another dtype.
pub fn swiglu(gu: &BurnTensor<2>) -> Option<BurnTensor<2>> {
    let [n, two_i] = gu.dims();
    if n == 0 || two_i == 0 || two_i % 2 != 0 || gu.dtype() != DType::F32 {
        return None;
    }
    if let Ok(ga) = gu.clone().try_into_primitive::<Autodiff<Cube>>() {
        let (gp, node) = ga.into_parts();
        let gp = burn_cubecl::kernel::untile(gp);
        let y = forward(&gp);
        let y = record(SwigluBackward, [node], y, || gp);
        return Some(BurnTensor::<2>::from_primitive::<Autodiff<Cube>>(y));
    }
    Some(tensor(forward(&plain(gu)?)))
}

/// The gate of `gu` (`[N, 2I]`, rows in any strides): `[N, I]`.
fn forward(gp: &CubeTensor) -> CubeTensor {
    let (n, i) = (gp.meta.shape()[0], gp.meta.shape()[1] / 2);
    let client = gp.client.clone();
    let out = output(gp, &[n, i]);
    swiglu_kernel::launch(
        &client,
        row_grid(&client, n),
        CubeDim::new_1d(row_units(&client, i)),
        gp.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
    );
    out
}

#[derive(Debug)]
struct SwigluBackward;

impl Backward<Cube, 1> for SwigluBackward {
    /// The input `gu`.
    type State = CubeTensor;

    fn backward(self, ops: Ops<CubeTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d = burn_cubecl::kernel::untile(grads.consume::<Cube>(&ops.node));
        let gu = ops.state;
        let [parent] = ops.parents;
        let Some(node) = parent else { return };
        let (n, i) = (d.meta.shape()[0], d.meta.shape()[1]);
        let client = d.client.clone();
        let dgu = output(&d, &[n, 2 * i]);
        swiglu_backward_kernel::launch(
            &client,
            row_grid(&client, n),
            CubeDim::new_1d(row_units(&client, i)),
            gu.into_tensor_arg(),
            d.into_tensor_arg(),
            dgu.clone().into_tensor_arg(),
        );
        grads.register::<Cube>(node.id, dgu);
    }
}

/// The gate and the up value of column `i < width` of row `row` of `gu` (`[N, 2·width]`: the
/// gates, then the up values).
#[cube]
fn gate_up(gu: &Tensor<f32>, row: usize, i: usize, width: usize) -> (f32, f32) {
    let (g0, g1) = (gu.stride(0), gu.stride(1));
    (gu[row * g0 + i * g1], gu[row * g0 + (i + width) * g1])
}

#[cube(launch)]
fn swiglu_kernel(gu: &Tensor<f32>, out: &mut Tensor<f32>) {
    let row = cube_row(out.shape(0));
    let width = out.shape(1);
    let (o0, o1) = (out.stride(0), out.stride(1));
    let mut i = UNIT_POS_X as usize;
    while i < width {
        let (gate, up) = gate_up(gu, row, i, width);
        out[row * o0 + i * o1] = gate / ((-gate).exp() + f32::new(1.0)) * up;
        i += CUBE_DIM_X as usize;
    }
}

/// `∂L/∂[gate | up]` of row `row` from the upstream gradient `d` (`[N, I]`).
#[cube(launch)]
fn swiglu_backward_kernel(gu: &Tensor<f32>, d: &Tensor<f32>, dgu: &mut Tensor<f32>) {
    let row = cube_row(d.shape(0));
    let width = d.shape(1);
    let (d0, d1) = (d.stride(0), d.stride(1));
    let (o0, o1) = (dgu.stride(0), dgu.stride(1));
    let mut i = UNIT_POS_X as usize;
    while i < width {
        let (gate, up) = gate_up(gu, row, i, width);
        let dy = d[row * d0 + i * d1];
        let s = f32::new(1.0) / ((-gate).exp() + f32::new(1.0));
        let gs = gate * s;
        dgu[row * o0 + i * o1] = dy * up * (s + gs * (f32::new(1.0) - s));
        dgu[row * o0 + (i + width) * o1] = dy * gs;
        i += CUBE_DIM_X as usize;
    }
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    //! The kernel on the wgpu device (lavapipe in CI; `RLCR_WGPU_DEVICE` picks the adapter)
    //! against the CPU's fused SwiGLU on the same values and an f64 evaluation.
    use super::*;
    use burn::tensor::{Device, TensorData};

    /// A strided input (a column slice of a wider tensor), rows wider than the cube (300 > 256)
    /// and narrower; gates from −40 to 40 (`exp(−gate)` from 0 to 2e17); within 1e-6 relative of
    /// the CPU and of f64.
    #[test]
    fn swiglu_kernel_matches_the_cpu() {
        let dev = super::super::test_device();
        let cpu = Device::flex();
        for (n, i) in [(4usize, 300usize), (3, 24)] {
            let width = 2 * i + 5;
            let vals: Vec<f32> = (0..n * width)
                .map(|k| (k as f32 * 0.61).sin() * 40.0 + (k % 3) as f32 * 0.25)
                .collect();
            let on = |d: &Device| {
                BurnTensor::<2>::from_data(TensorData::new(vals.clone(), [n, width]), d)
                    .slice([0..n, 5..width])
            };
            let got = crate::model::read_f32(swiglu(&on(&dev)).expect("the kernel runs on wgpu"))
                .unwrap();
            let want = crate::model::read_f32(crate::model::ops::swiglu(on(&cpu))).unwrap();
            for r in 0..n {
                for c in 0..i {
                    let g = vals[r * width + 5 + c] as f64;
                    let u = vals[r * width + 5 + i + c] as f64;
                    let exact = g / (1.0 + (-g).exp()) * u;
                    let k = r * i + c;
                    let tol = 1e-6 * (1.0 + exact.abs());
                    assert!(
                        (got[k] as f64 - exact).abs() <= tol,
                        "{r},{c}: {} vs {exact}",
                        got[k]
                    );
                    assert!(
                        (got[k] - want[k]).abs() as f64 <= tol,
                        "{r},{c}: {} vs cpu {}",
                        got[k],
                        want[k]
                    );
                }
            }
        }
    }

    /// `(y, ∂L/∂gu, launches forward, launches backward)` of `L = Σ y·c` on the autodiff wgpu
    /// device, `gu` a column slice of a wider tensor; `fused`: [`swiglu`], else the composite
    /// ([`super::super::swiglu`]).
    fn train(
        vals: &[f32],
        cs: &[f32],
        [n, i]: [usize; 2],
        fused: bool,
    ) -> (Vec<f32>, Vec<f32>, u64, u64) {
        let ad = super::super::test_device().autodiff();
        let width = 2 * i + 5;
        let wide = BurnTensor::<2>::from_data(TensorData::new(vals.to_vec(), [n, width]), &ad)
            .require_grad();
        let c = BurnTensor::<2>::from_data(TensorData::new(cs.to_vec(), [n, i]), &ad);
        let gu = wide.clone().slice([0..n, 5..width]);
        let gate = || match fused {
            true => swiglu(&gu).expect("the kernel runs on autodiff wgpu tensors"),
            false => super::super::swiglu(gu.clone()),
        };
        let (y, grads, fwd, bwd) = super::super::loss_backward(gate, c);
        let dwide = crate::model::read_f32(wide.grad(&grads).unwrap()).unwrap();
        let dgu = (0..n)
            .flat_map(|r| dwide[r * width + 5..(r + 1) * width].to_vec())
            .collect();
        (crate::model::read_f32(y).unwrap(), dgu, fwd, bwd)
    }

    /// Training's SwiGLU (autodiff tensors, a strided input, gates from −40 to 40) against
    /// float64 (`y` and `∂L/∂[gate | up]` within 1e-6 relative) and burn's derived backward of
    /// the composite (the same bound); one launch forward and one backward (the composite: five
    /// and more); the same bits twice.
    #[test]
    fn training_swiglu_matches_float64_and_the_composite() {
        let _pool = crate::model::memory::pool_test_lock();
        for (n, i) in [(4usize, 300usize), (3, 24)] {
            let width = 2 * i + 5;
            let vals: Vec<f32> = (0..n * width)
                .map(|k| (k as f32 * 0.61).sin() * 40.0 + (k % 3) as f32 * 0.25)
                .collect();
            let cs: Vec<f32> = (0..n * i).map(|k| (k as f32 * 0.29).cos()).collect();
            let (y, dgu, fwd, bwd) = train(&vals, &cs, [n, i], true);
            let (cy, cdgu, cfwd, cbwd) = train(&vals, &cs, [n, i], false);
            let close = |a: f32, b: f64| (a as f64 - b).abs() <= 1e-6 * (1.0 + b.abs());
            for r in 0..n {
                for c in 0..i {
                    let g = vals[r * width + 5 + c] as f64;
                    let u = vals[r * width + 5 + i + c] as f64;
                    let d = cs[r * i + c] as f64;
                    let s = 1.0 / (1.0 + (-g).exp());
                    let (ey, edg, edu) = (g * s * u, d * u * (s + g * s * (1.0 - s)), d * g * s);
                    let k = r * i + c;
                    let (kg, ku) = (r * 2 * i + c, r * 2 * i + i + c);
                    assert!(close(y[k], ey), "{r},{c}: y {} vs {ey}", y[k]);
                    assert!(close(dgu[kg], edg), "{r},{c}: dgate {} vs {edg}", dgu[kg]);
                    assert!(close(dgu[ku], edu), "{r},{c}: dup {} vs {edu}", dgu[ku]);
                    assert!(close(y[k], cy[k] as f64), "{r},{c}: y vs composite");
                    assert!(
                        close(dgu[kg], cdgu[kg] as f64),
                        "{r},{c}: dgate vs composite"
                    );
                    assert!(close(dgu[ku], cdgu[ku] as f64), "{r},{c}: dup vs composite");
                }
            }
            eprintln!(
                "[{n}, {i}] launches forward / backward (with the loss's): \
                 kernel {fwd} / {bwd}, composite {cfwd} / {cbwd}"
            );
            assert_eq!(fwd, 1, "one launch forward");
            assert!(bwd + 4 <= cbwd, "backward {bwd} vs the composite's {cbwd}");
            let (y2, dgu2, _, _) = train(&vals, &cs, [n, i], true);
            assert_eq!((y2, dgu2), (y, dgu), "the same bits again");
        }
    }
}
