//! RMSNorm, alone or after the residual add, as one `#[cube]` kernel: one cube per row, its
//! units striding over the hidden size and summing their squares through a tree in shared
//! memory ([`super::block::block_sum`]). In place of [`super::rms_norm`]'s six launches (and the
//! residual add's one) on plain GPU tensors (sampling, log-probs); on autodiff tensors
//! (training) [`rms_norm`] is one launch forward and two backward, with a `Backward` of its own,
//! where the composite takes six forward and about a dozen backward.
//!
//! The same formula as the composite, `x / sqrt(mean(x²) + eps) · w`, in f32; the sum of squares
//! is each unit's strided share, then the tree over the units (burn's `mean_dim` sums in its own
//! order: the two differ in the last bits). The residual sum `x + a` is the same single f32
//! addition as burn's.
//!
//! **Backward** with `r = 1/sqrt(mean(x²) + eps)` per row (kept from the forward pass) and the
//! upstream gradient `g`:
//!
//! ```text
//! ∂L/∂x_j = r·w_j·g_j − x_j · r³/h · Σ_k w_k·g_k·x_k        (one cube per row)
//! ∂L/∂w_j = Σ_rows g_j·x_j·r                               (one unit per column, rows in order)
//! ```
//!
//! No atomics: every sum has a fixed order, so the same inputs give the same bits.
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::cubecl;
use burn::tensor::{DType, Tensor as BurnTensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::Cube;
use cubecl::prelude::*;

use super::block::{block_sum, cube_row, output, plain, row_grid, row_units, tensor};
use crate::model::backend::record;

/// `x` (`[N, h]`) normalised with gains `w` (`[h]`), in one launch; on autodiff tensors
/// differentiable in both (two launches backward). `None` on the CPU or for another dtype.
pub fn rms_norm(x: &BurnTensor<2>, w: &BurnTensor<1>, eps: f64) -> Option<BurnTensor<2>> {
    let [n, h] = x.dims();
    if n == 0 || w.dims() != [h] || x.dtype() != DType::F32 || w.dtype() != DType::F32 {
        return None;
    }
    if let (Ok(xa), Ok(wa)) = (
        x.clone().try_into_primitive::<Autodiff<Cube>>(),
        w.clone().try_into_primitive::<Autodiff<Cube>>(),
    ) {
        let (xp, xg) = xa.into_parts();
        let (wp, wg) = wa.into_parts();
        let (xp, wp) = (
            burn_cubecl::kernel::untile(xp),
            burn_cubecl::kernel::untile(wp),
        );
        let eps = eps as f32;
        let (y, r) = forward(&xp, &wp, eps);
        let y = record(NormBackward, [xg, wg], y, || NormState { x: xp, w: wp, r });
        return Some(BurnTensor::<2>::from_primitive::<Autodiff<Cube>>(y));
    }
    // Without autodiff the training kernel serves as it is: `r` is N floats more written, in
    // the same launch, and one kernel fewer to compile.
    let (out, _) = forward(&plain(x)?, &plain(w)?, eps as f32);
    Some(tensor(out))
}

/// `(s, rms_norm(s))` for `s = x + a` (`[N, h]`: the residual stream and a block's output) with
/// gains `w`, in one launch; on autodiff tensors differentiable in `x`, `a` and `w`: `s` is a
/// node of its own whose backward hands its gradient to both terms (no launch), `rms_norm(s)`
/// has [`rms_norm`]'s backward (where an add and the norm took two launches forward). `None`
/// as for [`rms_norm`].
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
    if [x.dtype(), a.dtype(), w.dtype()] != [DType::F32; 3] {
        return None;
    }
    if let (Ok(xa), Ok(aa), Ok(wa)) = (
        x.clone().try_into_primitive::<Autodiff<Cube>>(),
        a.clone().try_into_primitive::<Autodiff<Cube>>(),
        w.clone().try_into_primitive::<Autodiff<Cube>>(),
    ) {
        let untile = burn_cubecl::kernel::untile;
        let (xp, xg) = xa.into_parts();
        let (ap, ag) = aa.into_parts();
        let (wp, wg) = wa.into_parts();
        let wp = untile(wp);
        let (sum, y, r) = add_forward(&untile(xp), &untile(ap), &wp, eps as f32);
        let s = SumBackward
            .prepare::<NoCheckpointing>([xg, ag])
            .compute_bound()
            .stateless(sum.clone());
        let sg = s.clone().into_parts().1;
        let y = record(NormBackward, [sg, wg], y, || NormState { x: sum, w: wp, r });
        let ad = |t| BurnTensor::<2>::from_primitive::<Autodiff<Cube>>(t);
        return Some((ad(s), ad(y)));
    }
    // As in [`rms_norm`]: the training kernel, its `r` unused.
    let (sum, out, _) = add_forward(&plain(x)?, &plain(a)?, &plain(w)?, eps as f32);
    Some((tensor(sum), tensor(out)))
}

/// The forward pass of the residual add and RMSNorm (training keeps `r`, sampling drops it):
/// `(s, y, r)`, `s = x + a`, `y` its normalised rows, `r` (`[N]`) their
/// `1/sqrt(mean(s²) + eps)`; one launch.
fn add_forward(
    x: &CubeTensor,
    a: &CubeTensor,
    w: &CubeTensor,
    eps: f32,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let (n, h) = (x.meta.shape()[0], x.meta.shape()[1]);
    let client = x.client.clone();
    let (sum, out, r) = (output(x, &[n, h]), output(x, &[n, h]), output(x, &[n]));
    let units = row_units(&client, h);
    add_rms_norm_kernel::launch(
        &client,
        row_grid(&client, n),
        CubeDim::new_1d(units),
        x.clone().into_tensor_arg(),
        a.clone().into_tensor_arg(),
        w.clone().into_tensor_arg(),
        sum.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        r.clone().into_tensor_arg(),
        eps,
        units,
    );
    (sum, out, r)
}

/// The residual sum's node: its gradient goes to both terms as it is.
#[derive(Debug)]
struct SumBackward;

impl Backward<Cube, 2> for SumBackward {
    type State = ();

    fn backward(self, ops: Ops<(), 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<Cube>(&ops.node);
        let [px, pa] = ops.parents;
        // Both hold the same buffer: burn adds a later gradient into a new one (a shared
        // buffer is never written in place).
        if let Some(node) = px {
            grads.register::<Cube>(node.id, g.clone());
        }
        if let Some(node) = pa {
            grads.register::<Cube>(node.id, g);
        }
    }
}

/// The forward pass (training keeps `r`, sampling drops it): `(y, r)`, `r` (`[N]`) the rows'
/// `1/sqrt(mean(x²) + eps)`.
fn forward(x: &CubeTensor, w: &CubeTensor, eps: f32) -> (CubeTensor, CubeTensor) {
    let (n, h) = (x.meta.shape()[0], x.meta.shape()[1]);
    let client = x.client.clone();
    let out = output(x, &[n, h]);
    let r = output(x, &[n]);
    let units = row_units(&client, h);
    rms_norm_kernel::launch(
        &client,
        row_grid(&client, n),
        CubeDim::new_1d(units),
        x.clone().into_tensor_arg(),
        w.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        r.clone().into_tensor_arg(),
        eps,
        units,
    );
    (out, r)
}

#[derive(Debug)]
struct NormBackward;

/// What RMSNorm's backward keeps: its inputs (alive in the graph anyway) and `r` per row.
#[derive(Debug, Clone)]
struct NormState {
    x: CubeTensor,
    w: CubeTensor,
    r: CubeTensor,
}

impl Backward<Cube, 2> for NormBackward {
    type State = NormState;

    fn backward(self, ops: Ops<NormState, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = burn_cubecl::kernel::untile(grads.consume::<Cube>(&ops.node));
        let s = ops.state;
        let [px, pw] = ops.parents;
        let (n, h) = (s.x.meta.shape()[0], s.x.meta.shape()[1]);
        let client = g.client.clone();
        if let Some(node) = px {
            let dx = output(&g, &[n, h]);
            let units = row_units(&client, h);
            rms_norm_backward_kernel::launch(
                &client,
                row_grid(&client, n),
                CubeDim::new_1d(units),
                s.x.clone().into_tensor_arg(),
                s.w.clone().into_tensor_arg(),
                s.r.clone().into_tensor_arg(),
                g.clone().into_tensor_arg(),
                dx.clone().into_tensor_arg(),
                units,
            );
            grads.register::<Cube>(node.id, dx);
        }
        if let Some(node) = pw {
            let dw = output(&g, &[h]);
            let units = row_units(&client, h);
            weight_grad_kernel::launch(
                &client,
                CubeCount::Static(h.div_ceil(units as usize) as u32, 1, 1),
                CubeDim::new_1d(units),
                s.x.into_tensor_arg(),
                s.r.into_tensor_arg(),
                g.into_tensor_arg(),
                dw.clone().into_tensor_arg(),
            );
            grads.register::<Cube>(node.id, dw);
        }
    }
}

/// Row `row` of `src` (`[N, h]`) normalised with gains `w` into `out`: the units' strided
/// shares of the sum of squares, the tree over them, then each unit its share of the row (the
/// elements it read, so a unit reading back what it wrote itself needs no barrier). Returns the
/// row's `sqrt(mean(x²) + eps)`.
#[cube]
fn normalise_row(
    src: &Tensor<f32>,
    row: usize,
    w: &Tensor<f32>,
    out: &mut Tensor<f32>,
    eps: f32,
    #[comptime] units: u32,
) -> f32 {
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
    rms
}

/// Row `row`'s RMSNorm ([`normalise_row`]), and its `1/sqrt(mean(x²) + eps)` into `r`.
#[cube(launch)]
fn rms_norm_kernel(
    x: &Tensor<f32>,
    w: &Tensor<f32>,
    out: &mut Tensor<f32>,
    r: &mut Tensor<f32>,
    eps: f32,
    #[comptime] units: u32,
) {
    let row = cube_row(x.shape(0));
    let rms = normalise_row(x, row, w, out, eps, units);
    if UNIT_POS_X == 0 {
        let at = row * r.stride(0);
        r[at] = f32::new(1.0) / rms;
    }
}

/// `∂L/∂x` of row `row`: the tree sum of `w·g·x` over the row, then each unit its share.
#[cube(launch)]
fn rms_norm_backward_kernel(
    x: &Tensor<f32>,
    w: &Tensor<f32>,
    r: &Tensor<f32>,
    g: &Tensor<f32>,
    dx: &mut Tensor<f32>,
    #[comptime] units: u32,
) {
    let row = cube_row(x.shape(0));
    let h = x.shape(1);
    let (x0, x1) = (row * x.stride(0), x.stride(1));
    let (g0, g1) = (row * g.stride(0), g.stride(1));
    let w1 = w.stride(0);
    let mut red = Shared::<[f32]>::new_slice(units as usize);
    let mut acc = f32::new(0.0);
    let mut i = UNIT_POS_X as usize;
    while i < h {
        acc += w[i * w1] * g[g0 + i * g1] * x[x0 + i * x1];
        i += CUBE_DIM_X as usize;
    }
    let dot = block_sum(&mut red, acc);
    let inv = r[row * r.stride(0)];
    let m = dot * (inv * inv * inv) / f32::cast_from(h as u32);
    let (d0, d1) = (row * dx.stride(0), dx.stride(1));
    i = UNIT_POS_X as usize;
    while i < h {
        dx[d0 + i * d1] = w[i * w1] * g[g0 + i * g1] * inv - x[x0 + i * x1] * m;
        i += CUBE_DIM_X as usize;
    }
}

/// `∂L/∂w`: one unit per column, summing `g·x·r` over the rows in row order.
#[cube(launch)]
fn weight_grad_kernel(x: &Tensor<f32>, r: &Tensor<f32>, g: &Tensor<f32>, dw: &mut Tensor<f32>) {
    let col = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    if col >= x.shape(1) {
        terminate!();
    }
    let mut acc = f32::new(0.0);
    let mut row = 0usize;
    while row < x.shape(0) {
        let xv = x[row * x.stride(0) + col * x.stride(1)];
        acc += g[row * g.stride(0) + col * g.stride(1)] * (xv * r[row * r.stride(0)]);
        row += 1;
    }
    let at = col * dw.stride(0);
    dw[at] = acc;
}

/// The residual sum into `sum`, then [`normalise_row`] of it, and the row's
/// `1/sqrt(mean(s²) + eps)` into `r`.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn add_rms_norm_kernel(
    x: &Tensor<f32>,
    a: &Tensor<f32>,
    w: &Tensor<f32>,
    sum: &mut Tensor<f32>,
    out: &mut Tensor<f32>,
    r: &mut Tensor<f32>,
    eps: f32,
    #[comptime] units: u32,
) {
    let row = cube_row(x.shape(0));
    let rms = add_normalise_row(x, a, w, sum, out, row, eps, units);
    if UNIT_POS_X == 0 {
        let at = row * r.stride(0);
        r[at] = f32::new(1.0) / rms;
    }
}

/// The residual sum of row `row` into `sum`, then [`normalise_row`] of it; returns the row's
/// `sqrt(mean(s²) + eps)`.
#[allow(clippy::too_many_arguments)]
#[cube]
fn add_normalise_row(
    x: &Tensor<f32>,
    a: &Tensor<f32>,
    w: &Tensor<f32>,
    sum: &mut Tensor<f32>,
    out: &mut Tensor<f32>,
    row: usize,
    eps: f32,
    #[comptime] units: u32,
) -> f32 {
    let (s0, s1) = (sum.stride(0), sum.stride(1));
    let mut i = UNIT_POS_X as usize;
    while i < x.shape(1) {
        let v = x[row * x.stride(0) + i * x.stride(1)] + a[row * a.stride(0) + i * a.stride(1)];
        sum[row * s0 + i * s1] = v;
        i += CUBE_DIM_X as usize;
    }
    normalise_row(&*sum, row, w, out, eps, units)
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    //! The kernels on the wgpu device (lavapipe in CI; `RLCR_WGPU_DEVICE` picks the adapter)
    //! against the CPU's fused RMSNorm on the same values and an f64 evaluation.
    use super::*;
    use burn::tensor::{Device, TensorData};

    use super::super::test_device as wgpu;
    use super::super::{assert_near, wide};

    fn read(t: BurnTensor<2>) -> Vec<f32> {
        crate::model::read_f32(t).unwrap()
    }

    /// A strided input (the second half of each row of a wider tensor), rows wider than the
    /// cube (300 > 256) and narrower (40), the residual add's sum bit for bit, the normalised
    /// rows within 1e-5 relative of the CPU's and of f64.
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
        // The CPU has kernels of its own.
        let x = BurnTensor::<2>::from_data(TensorData::new(vec![1.0f32; 8], [2, 4]), &cpu);
        let w = BurnTensor::<1>::from_data(TensorData::new(vec![1.0f32; 4], [4]), &cpu);
        assert!(rms_norm(&x, &w, 1e-6).is_none());
    }

    /// `(y, ∂L/∂x, ∂L/∂w, launches forward, launches backward)` of `L = Σ y·c` on the autodiff
    /// wgpu device, `x` the second half of each row of a wider tensor; `fused`: [`rms_norm`],
    /// else the composite ([`super::super::rms_norm`]). `w_grad`: whether `w` is trained (a
    /// LoRA run freezes it).
    fn train(
        xs: &[f32],
        ws: &[f32],
        cs: &[f32],
        [n, h]: [usize; 2],
        fused: bool,
        w_grad: bool,
    ) -> (Vec<f32>, Vec<f32>, Option<Vec<f32>>, u64, u64) {
        let ad = wgpu().autodiff();
        let wide = BurnTensor::<2>::from_data(TensorData::new(xs.to_vec(), [n, 2 * h]), &ad)
            .require_grad();
        let mut w = BurnTensor::<1>::from_data(TensorData::new(ws.to_vec(), [h]), &ad);
        if w_grad {
            w = w.require_grad();
        }
        let c = BurnTensor::<2>::from_data(TensorData::new(cs.to_vec(), [n, h]), &ad);
        let x = wide.clone().slice([0..n, h..2 * h]);
        let norm = || match fused {
            true => rms_norm(&x, &w, 1e-6).expect("the kernel runs on autodiff wgpu tensors"),
            false => super::super::rms_norm(x.clone(), w.clone(), 1e-6),
        };
        let (y, grads, fwd, bwd) = super::super::loss_backward(norm, c);
        let dwide = crate::model::read_f32(wide.grad(&grads).unwrap()).unwrap();
        let dx = (0..n)
            .flat_map(|r| dwide[r * 2 * h + h..(r + 1) * 2 * h].to_vec())
            .collect();
        let dw = w.grad(&grads).map(|g| crate::model::read_f32(g).unwrap());
        (read(y), dx, dw, fwd, bwd)
    }

    /// Training's RMSNorm (autodiff tensors, a strided input, rows wider and narrower than the
    /// cube) against float64 (`y`, `∂L/∂x`, `∂L/∂w` within 1e-5 of the largest value) and against
    /// burn's derived backward of the composite (the same bound); one launch forward, two
    /// backward (the composite: six and more); with the gains frozen, `∂L/∂x` alone, the same
    /// bits. Twice the same inputs: the same bits (no atomics).
    #[test]
    fn training_norm_matches_float64_and_the_composite() {
        let _pool = crate::model::memory::pool_test_lock();
        for (n, h) in [(5usize, 300usize), (3, 40)] {
            let val = |i: usize, s: f32| (i as f32 * 0.37 + s).sin() * (1.0 + (i % 7) as f32);
            let xs: Vec<f32> = (0..n * 2 * h).map(|i| val(i, 0.1)).collect();
            let ws: Vec<f32> = (0..h).map(|i| 0.5 + val(i, 1.0) / 10.0).collect();
            let cs: Vec<f32> = (0..n * h).map(|i| val(i, 2.0) / 3.0).collect();
            let (y, dx, dw, fwd, bwd) = train(&xs, &ws, &cs, [n, h], true, true);
            let dw = dw.expect("w is trained");
            let (cy, cdx, cdw, cfwd, cbwd) = train(&xs, &ws, &cs, [n, h], false, true);
            let cdw = cdw.expect("w is trained");
            // float64: y, dx, dw from the module documentation's formulas.
            let (mut ey, mut edx, mut edw) = (vec![0f64; n * h], vec![0f64; n * h], vec![0f64; h]);
            for r in 0..n {
                let x: Vec<f64> = (0..h).map(|i| xs[r * 2 * h + h + i] as f64).collect();
                let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / h as f64 + 1e-6).sqrt();
                let g = |i: usize| cs[r * h + i] as f64;
                let dot: f64 = (0..h).map(|i| ws[i] as f64 * g(i) * x[i]).sum();
                for i in 0..h {
                    ey[r * h + i] = x[i] * inv * ws[i] as f64;
                    edx[r * h + i] =
                        inv * ws[i] as f64 * g(i) - x[i] * inv.powi(3) / h as f64 * dot;
                    edw[i] += g(i) * x[i] * inv;
                }
            }
            let near = |got: &[f32], want: &[f64], what: &str| {
                assert_near(got, want, &format!("[{n}, {h}] {what}"));
            };
            near(&y, &ey, "y");
            near(&dx, &edx, "dx");
            near(&dw, &edw, "dw");
            near(&y, &wide(&cy), "y vs composite");
            near(&dx, &wide(&cdx), "dx vs composite");
            near(&dw, &wide(&cdw), "dw vs composite");
            eprintln!(
                "[{n}, {h}] launches forward / backward (with the loss's): \
                 kernel {fwd} / {bwd}, composite {cfwd} / {cbwd}"
            );
            assert_eq!(fwd, 1, "one launch forward");
            // The loss's own backward (the product with c and the sum) is in both counts.
            assert!(bwd + 4 <= cbwd, "backward {bwd} vs the composite's {cbwd}");
            let (y2, dx2, dw2, _, _) = train(&xs, &ws, &cs, [n, h], true, true);
            assert_eq!((y2, dx2), (y.clone(), dx.clone()), "the same bits again");
            assert_eq!(dw2.unwrap(), dw, "the same bits again");
            let (fy, fdx, fdw, _, fbwd) = train(&xs, &ws, &cs, [n, h], true, false);
            assert!(fdw.is_none());
            assert_eq!((fy, fdx), (y, dx), "frozen gains: the same y and dx");
            assert_eq!(fbwd + 1, bwd, "frozen gains: no weight-gradient launch");
        }
    }

    /// Training's residual add and RMSNorm ([`add_rms_norm`] on autodiff tensors, a loss on both
    /// the sum and the normalised rows, as a layer's residual stream uses them) against the add
    /// and [`rms_norm`] apart: the same `s`, `y`, `∂L/∂x`, `∂L/∂a` and `∂L/∂w`, bit for bit (the
    /// same f32 sums; the sum's two gradients are added in either order, which f32 addition does
    /// not see); one launch forward where the two took two, the same backward launches.
    #[test]
    fn training_add_norm_matches_the_add_and_the_norm() {
        let _pool = crate::model::memory::pool_test_lock();
        let (n, h) = (5usize, 300usize);
        let val = |i: usize, s: f32| (i as f32 * 0.37 + s).sin() * (1.0 + (i % 7) as f32);
        let run = |fused: bool| {
            let ad = wgpu().autodiff();
            let t = |s: f32, k: usize, shape: [usize; 2]| {
                let v: Vec<f32> = (0..k).map(|i| val(i, s)).collect();
                BurnTensor::<2>::from_data(TensorData::new(v, shape), &ad)
            };
            let x = t(0.1, n * h, [n, h]).require_grad();
            let a = t(2.0, n * h, [n, h]).require_grad();
            let wv: Vec<f32> = (0..h).map(|i| 0.5 + val(i, 1.0) / 10.0).collect();
            let w = BurnTensor::<1>::from_data(TensorData::new(wv, [h]), &ad).require_grad();
            let (c1, c2) = (t(0.7, n * h, [n, h]), t(1.3, n * h, [n, h]));
            let l0 = crate::model::transfer::thread_launches();
            let (s, y) = match fused {
                true => add_rms_norm(&x, &a, &w, 1e-6).expect("runs on autodiff wgpu"),
                false => {
                    let s = x.clone() + a.clone();
                    let y = rms_norm(&s, &w, 1e-6).expect("runs on autodiff wgpu");
                    (s, y)
                }
            };
            let fwd = crate::model::transfer::thread_launches() - l0;
            let loss = (s.clone() * c1).sum() + (y.clone() * c2).sum();
            let l1 = crate::model::transfer::thread_launches();
            let grads = loss.backward();
            let bwd = crate::model::transfer::thread_launches() - l1;
            let g2 = |t: &BurnTensor<2>| read(t.grad(&grads).unwrap());
            let dw = crate::model::read_f32(w.grad(&grads).unwrap()).unwrap();
            ([read(s), read(y), g2(&x), g2(&a), dw], fwd, bwd)
        };
        let (got, fwd, bwd) = run(true);
        let (want, ufwd, ubwd) = run(false);
        for (k, what) in ["s", "y", "dx", "da", "dw"].iter().enumerate() {
            assert_eq!(got[k], want[k], "{what}");
        }
        assert!(got[2].iter().any(|&v| v != 0.0));
        eprintln!("launches forward / backward: fused {fwd} / {bwd}, apart {ufwd} / {ubwd}");
        assert_eq!((fwd, ufwd), (1, 2));
        assert!(bwd <= ubwd, "{bwd} vs {ubwd}");
    }
}
