//! RMSNorm, alone or after the residual add, as one `#[cube]` kernel: one cube per row, its
//! units striding over the hidden size and summing the squares through shared memory. In place
//! of [`super::rms_norm`]'s six launches (and the residual add's one), on plain GPU tensors
//! (sampling, log-probs); training's autodiff tensors keep the composite, whose backward burn
//! derives. The same formula as the composite, `x / sqrt(mean(x²) + eps) · w`; the sum of
//! squares is each unit's strided share, then a tree over the units (burn's `mean_dim` sums in
//! its own order: the two differ in the last bits).
use burn::cubecl;
use burn::tensor::{DType, Tensor as BurnTensor};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::Cube;
use cubecl::prelude::*;

use super::draw::{block_sum, units};

/// `x` (`[N, h]`) normalised with gains `w` (`[h]`): one launch; `None` on other devices, on
/// autodiff tensors or other dtypes.
pub fn rms_norm(x: &BurnTensor<2>, w: &BurnTensor<1>, eps: f64) -> Option<BurnTensor<2>> {
    let (xp, wp) = (plain(x)?, plain(w)?);
    let [n, h] = x.dims();
    let client = xp.client.clone();
    let out = output(&xp, n, h);
    let units = units(&client);
    rms_norm_kernel::launch(
        &client,
        CubeCount::Static(n as u32, 1, 1),
        CubeDim::new_1d(units),
        xp.into_tensor_arg(),
        wp.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        eps as f32,
        units as usize,
    );
    Some(BurnTensor::<2>::from_primitive::<Cube>(out))
}

/// `(s, norm(s))` for `s = x + a` (`[N, h]`, the residual stream and the block's output) with
/// gains `w`: one launch; `None` as for [`rms_norm`].
pub fn add_rms_norm(
    x: &BurnTensor<2>,
    a: &BurnTensor<2>,
    w: &BurnTensor<1>,
    eps: f64,
) -> Option<(BurnTensor<2>, BurnTensor<2>)> {
    if x.dims() != a.dims() {
        return None;
    }
    let (xp, ap, wp) = (plain(x)?, plain(a)?, plain(w)?);
    let [n, h] = x.dims();
    let client = xp.client.clone();
    let sum = output(&xp, n, h);
    let out = output(&xp, n, h);
    let units = units(&client);
    add_rms_norm_kernel::launch(
        &client,
        CubeCount::Static(n as u32, 1, 1),
        CubeDim::new_1d(units),
        xp.into_tensor_arg(),
        ap.into_tensor_arg(),
        wp.into_tensor_arg(),
        sum.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        eps as f32,
        units as usize,
    );
    Some((
        BurnTensor::<2>::from_primitive::<Cube>(sum),
        BurnTensor::<2>::from_primitive::<Cube>(out),
    ))
}

/// The CubeCL primitive of a plain (non-autodiff) f32 tensor on a GPU, readable as rows.
fn plain<const D: usize>(t: &BurnTensor<D>) -> Option<CubeTensor> {
    if t.dtype() != DType::F32 {
        return None;
    }
    let p = t.clone().try_into_primitive::<Cube>().ok()?;
    Some(burn_cubecl::kernel::untile(p))
}

/// A new contiguous f32 `[n, h]` tensor on `like`'s device.
fn output(like: &CubeTensor, n: usize, h: usize) -> CubeTensor {
    empty_device_dtype(
        like.client.clone(),
        like.device.clone(),
        burn::tensor::Shape::new([n, h]),
        DType::F32,
    )
}

/// Writes row `row` of `out` (contiguous `[N, h]`): `v / sqrt(Σv²/h + eps) · w`, reading `v`
/// from `src` (strided), given the row's sum of squares.
#[cube]
fn write_row(
    src: &Tensor<f32>,
    w: &Tensor<f32>,
    out: &mut Tensor<f32>,
    row: usize,
    squares: f32,
    eps: f32,
) {
    let h = src.shape(1);
    let rms = (squares / f32::cast_from(h as u32) + eps).sqrt();
    let mut i = UNIT_POS_X as usize;
    while i < h {
        let v = src[row * src.stride(0) + i * src.stride(1)];
        out[row * out.stride(0) + i * out.stride(1)] = v / rms * w[i * w.stride(0)];
        i += CUBE_DIM_X as usize;
    }
}

#[cube(launch)]
fn rms_norm_kernel(
    x: &Tensor<f32>,
    w: &Tensor<f32>,
    out: &mut Tensor<f32>,
    eps: f32,
    #[comptime] units: usize,
) {
    let row = CUBE_POS_X as usize;
    let h = x.shape(1);
    let mut red = Shared::<[f32]>::new_slice(units);
    let mut acc = f32::new(0.0);
    let mut i = UNIT_POS_X as usize;
    while i < h {
        let v = x[row * x.stride(0) + i * x.stride(1)];
        acc += v * v;
        i += CUBE_DIM_X as usize;
    }
    let squares = block_sum(&mut red, acc);
    write_row(x, w, out, row, squares, eps);
}

#[cube(launch)]
fn add_rms_norm_kernel(
    x: &Tensor<f32>,
    a: &Tensor<f32>,
    w: &Tensor<f32>,
    sum: &mut Tensor<f32>,
    out: &mut Tensor<f32>,
    eps: f32,
    #[comptime] units: usize,
) {
    let row = CUBE_POS_X as usize;
    let h = x.shape(1);
    let mut red = Shared::<[f32]>::new_slice(units);
    let mut acc = f32::new(0.0);
    let mut i = UNIT_POS_X as usize;
    while i < h {
        let v = x[row * x.stride(0) + i * x.stride(1)] + a[row * a.stride(0) + i * a.stride(1)];
        sum[row * sum.stride(0) + i * sum.stride(1)] = v;
        acc += v * v;
        i += CUBE_DIM_X as usize;
    }
    let squares = block_sum(&mut red, acc);
    // Each unit reads back only the elements it wrote.
    write_row(sum, w, out, row, squares, eps);
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    /// The kernels against the composite ([`super::super::rms_norm`]) and an f64 evaluation, on
    /// the wgpu device (`RLCR_WGPU_DEVICE` picks the adapter): a plain and a strided input, rows
    /// wider than a cube, and the residual add.
    #[test]
    fn norm_kernels_match_the_composite_on_devices() {
        let spec = std::env::var("RLCR_WGPU_DEVICE").unwrap_or_else(|_| "wgpu".into());
        let dev = spec
            .parse::<crate::model::DeviceSpec>()
            .unwrap()
            .open()
            .unwrap();
        let (n, h, eps) = (5, 300, 1e-6);
        let val = |i: usize, s: f32| (i as f32 * 0.37 + s).sin() * (1.0 + (i % 7) as f32);
        let xs: Vec<f32> = (0..n * 2 * h).map(|i| val(i, 0.1)).collect();
        let as_: Vec<f32> = (0..n * h).map(|i| val(i, 2.0)).collect();
        let ws: Vec<f32> = (0..h).map(|i| 0.5 + val(i, 1.0) / 10.0).collect();
        let wide = BurnTensor::<2>::from_data(TensorData::new(xs.clone(), [n, 2 * h]), &dev);
        // A strided view: the second half of each row.
        let x = wide.slice([0..n, h..2 * h]);
        let a = BurnTensor::<2>::from_data(TensorData::new(as_.clone(), [n, h]), &dev);
        let w = BurnTensor::<1>::from_data(TensorData::new(ws.clone(), [h]), &dev);
        let read = |t: BurnTensor<2>| crate::model::read_f32(t).unwrap();
        let exact = |row: &[f64]| -> Vec<f64> {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
            let r = (ms + eps).sqrt();
            row.iter()
                .zip(&ws)
                .map(|(v, &g)| v / r * g as f64)
                .collect()
        };
        let got = read(rms_norm(&x, &w, eps).unwrap());
        let comp = read(super::super::rms_norm(x.clone(), w.clone(), eps));
        let (s, y) = add_rms_norm(&x, &a, &w, eps).unwrap();
        let (s, y) = (read(s), read(y));
        for r in 0..n {
            let row: Vec<f64> = (0..h).map(|i| xs[r * 2 * h + h + i] as f64).collect();
            let sum: Vec<f64> = (0..h)
                .map(|i| (xs[r * 2 * h + h + i] + as_[r * h + i]) as f64)
                .collect();
            for (i, (e, es)) in exact(&row).iter().zip(exact(&sum)).enumerate() {
                let k = r * h + i;
                assert!(
                    (got[k] as f64 - e).abs() < 1e-5 * (1.0 + e.abs()),
                    "{r},{i}"
                );
                assert!(
                    (got[k] - comp[k]).abs() < 1e-5 * (1.0 + comp[k].abs()),
                    "{r},{i}"
                );
                assert_eq!(
                    s[k],
                    xs[r * 2 * h + h + i] + as_[r * h + i],
                    "{r},{i}: x + a"
                );
                assert!(
                    (y[k] as f64 - es).abs() < 1e-5 * (1.0 + es.abs()),
                    "{r},{i}"
                );
            }
        }
        // Autodiff tensors are left to the composite.
        let wa = BurnTensor::<1>::from_data(TensorData::new(ws, [h]), &dev.autodiff());
        let xad = BurnTensor::<2>::from_data(
            TensorData::new(xs[..n * h].to_vec(), [n, h]),
            &dev.autodiff(),
        );
        assert!(rms_norm(&xad, &wa, eps).is_none());
    }
}
