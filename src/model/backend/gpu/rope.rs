//! HF's rotate-half RoPE as one `#[cube]` kernel: one cube per (batch, head, slot) row of the
//! head dimension. In place of [`super::rope`]'s four launches, on plain GPU tensors (sampling,
//! log-probs); training's autodiff tensors keep the composite, whose backward burn derives. The
//! composite's formula, `x·[c, c] + swap(x)·[−s, s]` over the whole head (`swap` exchanges the
//! halves), in f32 (a compiler may fuse the products and the sum into one rounding).
use burn::cubecl;
use burn::tensor::Tensor as BurnTensor;
use cubecl::prelude::*;

use super::block::{cube_row, output, plain, row_grid, row_units, tensor};

/// RoPE on `x: [B, n, T, d]` (any strides) with `cos = [c, c]` and `sin = [−s, s]`
/// (`[B, 1, T, d]`), in one launch; `None` on the CPU, for autodiff tensors, another dtype or
/// other shapes.
pub fn rope(x: &BurnTensor<4>, cos: &BurnTensor<4>, sin: &BurnTensor<4>) -> Option<BurnTensor<4>> {
    let [b, n, t, d] = x.dims();
    if d % 2 != 0 || b * n * t * d == 0 || cos.dims() != [b, 1, t, d] || sin.dims() != [b, 1, t, d]
    {
        return None;
    }
    let (xp, cp, sp) = (plain(x)?, plain(cos)?, plain(sin)?);
    let client = xp.client.clone();
    let out = output(&xp, &[b, n, t, d]);
    rope_kernel::launch(
        &client,
        row_grid(&client, b * n * t),
        CubeDim::new_1d(row_units(&client, d)),
        xp.into_tensor_arg(),
        cp.into_tensor_arg(),
        sp.into_tensor_arg(),
        out.clone().into_tensor_arg(),
    );
    Some(tensor(out))
}

#[cube(launch)]
fn rope_kernel(x: &Tensor<f32>, cos: &Tensor<f32>, sin: &Tensor<f32>, out: &mut Tensor<f32>) {
    let row = cube_row();
    let (heads, slots, d) = (out.shape(1), out.shape(2), out.shape(3));
    if row >= out.shape(0) * heads * slots {
        terminate!();
    }
    let slot = row % slots;
    let head = (row / slots) % heads;
    let batch = row / (slots * heads);
    let half = d / 2;
    let xb = batch * x.stride(0) + head * x.stride(1) + slot * x.stride(2);
    let cb = batch * cos.stride(0) + slot * cos.stride(2);
    let sb = batch * sin.stride(0) + slot * sin.stride(2);
    let ob = batch * out.stride(0) + head * out.stride(1) + slot * out.stride(2);
    let (x3, c3, s3, o3) = (x.stride(3), cos.stride(3), sin.stride(3), out.stride(3));
    let mut i = UNIT_POS_X as usize;
    while i < d {
        let swapped = (i + half) % d;
        out[ob + i * o3] =
            x[xb + i * x3] * cos[cb + i * c3] + x[xb + swapped * x3] * sin[sb + i * s3];
        i += CUBE_DIM_X as usize;
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    //! The kernel on the wgpu device (lavapipe in CI; `RLCR_WGPU_DEVICE` picks the adapter)
    //! against the CPU's RoPE (through [`crate::model::ops::Rope`], as the model calls it) and
    //! an f64 evaluation.
    use burn::tensor::{Device, Tensor, TensorData};

    /// A strided input (a head slice of a wider tensor, as q and k are cut from the fused QKV
    /// product), positions up to 4,000; within 1e-5 (absolute, values of order 1) of the CPU's
    /// and of f64's rotation of the same f32 angles.
    #[test]
    fn rope_kernel_matches_the_cpu() {
        let dev = super::super::test_device();
        let cpu = Device::flex();
        let (b, n, wide, t, d) = (2usize, 3usize, 5usize, 4usize, 8usize);
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 10000f32.powf(-(2.0 * i as f32) / d as f32))
            .collect();
        let positions: Vec<usize> = (0..b * t).map(|k| k * 997 % 4001).collect();
        let vals: Vec<f32> = (0..b * wide * t * d)
            .map(|k| (k as f32 * 0.37).sin())
            .collect();
        let run = |dev: &Device| {
            let rope = crate::model::ops::Rope::new(&inv_freq, &positions, b, t, dev);
            let x = Tensor::<4>::from_data(TensorData::new(vals.clone(), [b, wide, t, d]), dev)
                .slice([0..b, 1..1 + n, 0..t, 0..d]);
            crate::model::read_f32(rope.apply(x)).unwrap()
        };
        let (got, want) = (run(&dev), run(&cpu));
        let half = d / 2;
        for bi in 0..b {
            for h in 0..n {
                for ti in 0..t {
                    let p = positions[bi * t + ti];
                    for i in 0..d {
                        let at = |j: usize| vals[((bi * wide + 1 + h) * t + ti) * d + j] as f64;
                        let f = i % half;
                        let angle = (p as f32 * inv_freq[f]) as f64;
                        let (c, s) = (angle.cos(), angle.sin());
                        let exact = if i < half {
                            at(i) * c - at(i + half) * s
                        } else {
                            at(i) * c + at(i - half) * s
                        };
                        let k = ((bi * n + h) * t + ti) * d + i;
                        assert!(
                            (got[k] as f64 - exact).abs() < 1e-5,
                            "{k}: {} vs {exact}",
                            got[k]
                        );
                        assert!(
                            (got[k] - want[k]).abs() < 1e-5,
                            "{k}: {} vs cpu {}",
                            got[k],
                            want[k]
                        );
                    }
                }
            }
        }
    }
}
