//! RMSNorm, alone or after the residual add, as one `#[cube]` kernel: one cube per row, its
//! units striding over the hidden size and summing their squares through a tree in shared
//! memory ([`super::block::block_sum`]). In place of [`super::rms_norm`]'s six launches (and the
//! residual add's one), on plain GPU tensors (sampling, log-probs); training's autodiff tensors
//! keep the composite, whose backward burn derives.
//!
//! The same formula as the composite, `x / sqrt(mean(x²) + eps) · w`, in f32; the sum of squares
//! is each unit's strided share, then the tree over the units (burn's `mean_dim` sums in its own
//! order: the two differ in the last bits). The residual sum `x + a` is the same single f32
//! addition as burn's.
use burn::cubecl;
use burn::tensor::Tensor as BurnTensor;
use cubecl::prelude::*;

use super::block::{block_sum, cube_row, output, plain, row_grid, row_units, tensor};

/// `x` (`[N, h]`) normalised with gains `w` (`[h]`), in one launch; `None` on the CPU, for
/// autodiff tensors or another dtype.
pub fn rms_norm(x: &BurnTensor<2>, w: &BurnTensor<1>, eps: f64) -> Option<BurnTensor<2>> {
    let (xp, wp) = (plain(x)?, plain(w)?);
    let [n, h] = x.dims();
    if n == 0 || w.dims() != [h] {
        return None;
    }
    let client = xp.client.clone();
    let out = output(&xp, &[n, h]);
    let units = row_units(&client, h);
    rms_norm_kernel::launch(
        &client,
        row_grid(&client, n),
        CubeDim::new_1d(units),
        xp.into_tensor_arg(),
        wp.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        eps as f32,
        units,
    );
    Some(tensor(out))
}

/// `(s, rms_norm(s))` for `s = x + a` (`[N, h]`: the residual stream and a block's output) with
/// gains `w`, in one launch; `None` as for [`rms_norm`].
pub fn add_rms_norm(
    x: &BurnTensor<2>,
    a: &BurnTensor<2>,
    w: &BurnTensor<1>,
    eps: f64,
) -> Option<(BurnTensor<2>, BurnTensor<2>)> {
    let [n, h] = x.dims();
    if a.dims() != [n, h] || w.dims() != [h] || n == 0 {
        return None;
    }
    let (xp, ap, wp) = (plain(x)?, plain(a)?, plain(w)?);
    let client = xp.client.clone();
    let sum = output(&xp, &[n, h]);
    let out = output(&xp, &[n, h]);
    let units = row_units(&client, h);
    add_rms_norm_kernel::launch(
        &client,
        row_grid(&client, n),
        CubeDim::new_1d(units),
        xp.into_tensor_arg(),
        ap.into_tensor_arg(),
        wp.into_tensor_arg(),
        sum.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        eps as f32,
        units,
    );
    Some((tensor(sum), tensor(out)))
}

/// Row `row` of `src` (`[N, h]`) normalised with gains `w` into `out`: the units' strided
/// shares of the sum of squares, the tree over them, then each unit its share of the row (the
/// elements it read, so a unit reading back what it wrote itself needs no barrier).
#[cube]
fn normalise_row(
    src: &Tensor<f32>,
    row: usize,
    w: &Tensor<f32>,
    out: &mut Tensor<f32>,
    eps: f32,
    #[comptime] units: u32,
) {
    let h = src.shape(1);
    let (r0, r1) = (row * src.stride(0), src.stride(1));
    let mut red = Shared::<[f32]>::new_slice(units as usize);
    let mut acc = f32::new(0.0);
    let mut i = UNIT_POS_X as usize;
    while i < h {
        let v = src[r0 + i * r1];
        acc += v * v;
        i += CUBE_DIM_X as usize;
    }
    let squares = block_sum(&mut red, acc);
    let rms = (squares / f32::cast_from(h as u32) + eps).sqrt();
    let (o0, o1) = (out.stride(0), out.stride(1));
    i = UNIT_POS_X as usize;
    while i < h {
        out[row * o0 + i * o1] = src[r0 + i * r1] / rms * w[i * w.stride(0)];
        i += CUBE_DIM_X as usize;
    }
}

#[cube(launch)]
fn rms_norm_kernel(
    x: &Tensor<f32>,
    w: &Tensor<f32>,
    out: &mut Tensor<f32>,
    eps: f32,
    #[comptime] units: u32,
) {
    let row = cube_row();
    if row >= x.shape(0) {
        terminate!();
    }
    normalise_row(x, row, w, out, eps, units);
}

/// The residual sum into `sum`, then [`normalise_row`] of it.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn add_rms_norm_kernel(
    x: &Tensor<f32>,
    a: &Tensor<f32>,
    w: &Tensor<f32>,
    sum: &mut Tensor<f32>,
    out: &mut Tensor<f32>,
    eps: f32,
    #[comptime] units: u32,
) {
    let row = cube_row();
    if row >= x.shape(0) {
        terminate!();
    }
    let (s0, s1) = (sum.stride(0), sum.stride(1));
    let mut i = UNIT_POS_X as usize;
    while i < x.shape(1) {
        let v = x[row * x.stride(0) + i * x.stride(1)] + a[row * a.stride(0) + i * a.stride(1)];
        sum[row * s0 + i * s1] = v;
        i += CUBE_DIM_X as usize;
    }
    normalise_row(&*sum, row, w, out, eps, units);
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    //! The kernels on the wgpu device (lavapipe in CI; `RLCR_WGPU_DEVICE` picks the adapter)
    //! against the CPU's fused RMSNorm on the same values and an f64 evaluation.
    use super::*;
    use burn::tensor::{Device, TensorData};

    use super::super::test_device as wgpu;

    fn read(t: BurnTensor<2>) -> Vec<f32> {
        crate::model::read_f32(t).unwrap()
    }

    /// A strided input (the second half of each row of a wider tensor), rows wider than the
    /// cube (300 > 256) and narrower (40), the residual add's sum bit for bit, the normalised
    /// rows within 1e-5 relative of the CPU's and of f64; autodiff tensors left to the composite.
    #[test]
    fn norm_kernels_match_the_cpu() {
        let dev = wgpu();
        let cpu = Device::flex();
        for (n, h) in [(5usize, 300usize), (3, 40)] {
            let eps = 1e-6;
            let val = |i: usize, s: f32| (i as f32 * 0.37 + s).sin() * (1.0 + (i % 7) as f32);
            let xs: Vec<f32> = (0..n * 2 * h).map(|i| val(i, 0.1)).collect();
            let adds: Vec<f32> = (0..n * h).map(|i| val(i, 2.0)).collect();
            let ws: Vec<f32> = (0..h).map(|i| 0.5 + val(i, 1.0) / 10.0).collect();
            let on = |d: &Device| {
                let wide = BurnTensor::<2>::from_data(TensorData::new(xs.clone(), [n, 2 * h]), d);
                let x = wide.slice([0..n, h..2 * h]);
                let a = BurnTensor::<2>::from_data(TensorData::new(adds.clone(), [n, h]), d);
                let w = BurnTensor::<1>::from_data(TensorData::new(ws.clone(), [h]), d);
                (x, a, w)
            };
            let (x, a, w) = on(&dev);
            let got = read(rms_norm(&x, &w, eps).expect("the kernel runs on wgpu"));
            let (s, y) = add_rms_norm(&x, &a, &w, eps).expect("the kernel runs on wgpu");
            let (s, y) = (read(s), read(y));
            let (xc, ac, wc) = on(&cpu);
            let cpu_norm = read(crate::model::ops::rms_norm(xc.clone(), wc.clone(), eps));
            let (cs, cy) = crate::model::ops::add_rms_norm(xc, ac, wc, eps);
            let (cs, cy) = (read(cs), read(cy));
            let exact = |row: &[f64]| -> Vec<f64> {
                let ms = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
                let r = (ms + eps).sqrt();
                row.iter()
                    .zip(&ws)
                    .map(|(v, &g)| v / r * g as f64)
                    .collect()
            };
            let close = |a: f32, b: f64| (a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs());
            for r in 0..n {
                let row: Vec<f64> = (0..h).map(|i| xs[r * 2 * h + h + i] as f64).collect();
                let sum: Vec<f32> = (0..h)
                    .map(|i| xs[r * 2 * h + h + i] + adds[r * h + i])
                    .collect();
                let sum64: Vec<f64> = sum.iter().map(|&v| v as f64).collect();
                let (e, es) = (exact(&row), exact(&sum64));
                for i in 0..h {
                    let k = r * h + i;
                    assert_eq!(s[k], sum[i], "[{n}, {h}] {r},{i}: x + a");
                    assert_eq!(s[k], cs[k], "[{n}, {h}] {r},{i}: x + a against the CPU");
                    assert!(
                        close(got[k], e[i]),
                        "[{n}, {h}] {r},{i}: {} vs {}",
                        got[k],
                        e[i]
                    );
                    assert!(close(got[k], cpu_norm[k] as f64), "[{n}, {h}] {r},{i}: cpu");
                    assert!(
                        close(y[k], es[i]),
                        "[{n}, {h}] {r},{i}: {} vs {}",
                        y[k],
                        es[i]
                    );
                    assert!(close(y[k], cy[k] as f64), "[{n}, {h}] {r},{i}: cpu");
                }
            }
        }
        // More rows than wgpu's 65,535 cubes along an axis (a long prefill): the grid's second
        // axis takes the rest.
        let (n, h) = (70_000usize, 3usize);
        let xs: Vec<f32> = (0..n * h).map(|i| (i % 11) as f32 - 5.0).collect();
        let x = BurnTensor::<2>::from_data(TensorData::new(xs.clone(), [n, h]), &dev);
        let w = BurnTensor::<1>::from_data(TensorData::new(vec![2.0f32; h], [h]), &dev);
        let got = read(rms_norm(&x, &w, 1e-6).expect("the kernel runs on wgpu"));
        for r in [0, 65_534, 65_535, 65_536, n - 1] {
            let row = &xs[r * h..(r + 1) * h];
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / h as f64;
            for i in 0..h {
                let e = row[i] as f64 / (ms + 1e-6).sqrt() * 2.0;
                let g = got[r * h + i] as f64;
                assert!(
                    (g - e).abs() <= 1e-5 * (1.0 + e.abs()),
                    "row {r}: {g} vs {e}"
                );
            }
        }
        // Autodiff tensors (training) are left to the composite, and so is the CPU.
        let ad = dev.clone().autodiff();
        let x = BurnTensor::<2>::from_data(TensorData::new(vec![1.0f32; 8], [2, 4]), &ad);
        let w = BurnTensor::<1>::from_data(TensorData::new(vec![1.0f32; 4], [4]), &ad);
        assert!(rms_norm(&x, &w, 1e-6).is_none());
        let x = BurnTensor::<2>::from_data(TensorData::new(vec![1.0f32; 8], [2, 4]), &cpu);
        let w = BurnTensor::<1>::from_data(TensorData::new(vec![1.0f32; 4], [4]), &cpu);
        assert!(rms_norm(&x, &w, 1e-6).is_none());
    }
}
