//! SwiGLU's gate as one `#[cube]` kernel: one cube per row, its units striding over the
//! intermediate size. In place of [`super::swiglu`]'s five launches, on plain GPU tensors
//! (sampling, log-probs); training's autodiff tensors keep the composite, whose backward burn
//! derives. The composite's formula op for op, `gate / (exp(−gate) + 1) · up`, in f32.
use burn::cubecl;
use burn::tensor::Tensor as BurnTensor;
use cubecl::prelude::*;

use super::block::{cube_row, output, plain, row_grid, row_units, tensor};

/// `silu(gate) · up` for `gu = [gate | up]` (`[N, 2I]`), `[N, I]`, in one launch; `None` on the
/// CPU, for autodiff tensors or another dtype.
pub fn swiglu(gu: &BurnTensor<2>) -> Option<BurnTensor<2>> {
    let [n, two_i] = gu.dims();
    if n == 0 || two_i == 0 || two_i % 2 != 0 {
        return None;
    }
    let gp = plain(gu)?;
    let i = two_i / 2;
    let client = gp.client.clone();
    let out = output(&gp, &[n, i]);
    swiglu_kernel::launch(
        &client,
        row_grid(&client, n),
        CubeDim::new_1d(row_units(&client, i)),
        gp.into_tensor_arg(),
        out.clone().into_tensor_arg(),
    );
    Some(tensor(out))
}

#[cube(launch)]
fn swiglu_kernel(gu: &Tensor<f32>, out: &mut Tensor<f32>) {
    let row = cube_row();
    if row >= out.shape(0) {
        terminate!();
    }
    let width = out.shape(1);
    let (o0, o1) = (out.stride(0), out.stride(1));
    let (g0, g1) = (gu.stride(0), gu.stride(1));
    let mut i = UNIT_POS_X as usize;
    while i < width {
        let gate = gu[row * g0 + i * g1];
        let up = gu[row * g0 + (i + width) * g1];
        out[row * o0 + i * o1] = gate / ((-gate).exp() + f32::new(1.0)) * up;
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
        let ad = dev.autodiff();
        let x = BurnTensor::<2>::from_data(TensorData::new(vec![1.0f32; 8], [2, 4]), &ad);
        assert!(swiglu(&x).is_none(), "autodiff tensors keep the composite");
    }
}
