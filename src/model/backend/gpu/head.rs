//! The LM head and its loss side on a GPU, chunked over tokens: the log-prob of each target
//! token and the entropy of each predicted distribution, from the final hidden states `x: [n, h]`
//! and the head's weight `W: [h, V]` at a sampling temperature, without the `[n, V]` logits of
//! the whole batch ever existing at once. Differentiable on autodiff tensors (a custom
//! `Backward` on burn's CubeCL backend, one source for wgpu and CUDA).
//!
//! The formulas are those of the CPU's fused head ([`crate::model::backend::cpu::head`]): for
//! one row of logits `z = x·W`, scale `s = 1/T` and target `t`,
//!
//! ```text
//! u_j = s·z_j − s·max(z)        S = Σ_j exp(u_j)
//! log p_t = u_t − ln S           H = ln S − (Σ_j exp(u_j)·u_j) / S
//! ∂L/∂z_j = s·( g·[j = t] − p_j·(g + h·(log p_j + H)) )   with g = ∂L/∂log p_t, h = ∂L/∂H
//! ```
//!
//! **Forward**, per chunk of `c` rows: the chunk's logits (one product), then one kernel
//! ([`forward_kernel`]: one cube per row, its units striding over the vocabulary; the maximum,
//! then both sums, through trees in shared memory) writes the row's log-prob and entropy, and
//! `s·max(z)` and `ln S` for backward. The chunk's logits are dropped before the next chunk.
//! What autodiff keeps is `x`, `W` (alive anyway) and four numbers per row, where burn's
//! composite (`log_softmax`, `gather`, `exp`, `mul`, `sum_dim`) keeps several `[n, V]` tensors.
//!
//! **Backward**, per chunk: the logits again (one product), one element-wise kernel
//! ([`backward_kernel`]) that turns them into `∂L/∂z` in place, then `∂L/∂x = ∂L/∂z · Wᵀ` and
//! `∂L/∂W += xᵀ · ∂L/∂z` (two products and an add). The chunks' `∂L/∂W` parts are added in chunk
//! order and the chunks' `∂L/∂x` rows concatenated: no atomics anywhere, so the same inputs give
//! the same bits. The products are [`crate::model::backend::burn_matmul`]s in the precision the
//! rest of the model runs (split f32 where the device's f32 matmul is TF32, or autocast bf16).
//!
//! Launches: 2 per chunk forward, 5 per chunk backward (one fewer for the first chunk's
//! `∂L/∂W`, one more to concatenate `∂L/∂x` when there are several chunks), plus the target
//! upload; the composite takes about 12 forward and 20 backward over full `[n, V]` tensors.
//!
//! Ids travel as f32 (exact below 2²⁴).
use anyhow::{ensure, Result};
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::cubecl;
use burn::tensor::{DType, Tensor as BurnTensor, TensorData};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::Cube;
use cubecl::prelude::*;

use super::block::{
    block_max, block_sum, cube_row, in_place, output, plain, row_grid, row_units, tensor,
};
use crate::model::backend::{burn_matmul, record};
use crate::model::transfer::upload;

/// The most bytes of logits one chunk holds: 128 MiB (SmolLM2's 49,152 columns: 682 rows a
/// chunk; 8,192 tokens in 13 chunks, 91 launches forward and backward together, where the whole
/// batch's logits would be 1.6 GB a copy).
pub const CHUNK_BYTES: usize = 128 << 20;

/// A stand-in for −∞ as the maximum's starting value (WGSL rejects infinite literals).
const LOWEST: f32 = -3.0e38;

/// Rows per chunk for `v` columns within `bytes` of f32 logits: at least one, at most `n`.
pub fn chunk_rows(n: usize, v: usize, bytes: usize) -> usize {
    (bytes / (v.max(1) * 4)).clamp(1, n.max(1))
}

/// Log-probs of `targets` and (when `entropy`) entropies of the rows of `x · w` (`x: [n, h]`,
/// `w: [h, V]`) at `temperature`, in chunks of at most `chunk_bytes` of logits; `split`: the
/// products' precision ([`burn_matmul`]). `Ok(None)` where the kernels do not apply (the CPU,
/// another dtype), nothing computed. Differentiable in `x` and `w` on an autodiff device.
///
/// Errors if `targets` does not have one id per row, an id is outside the vocabulary, or the
/// temperature is not a positive number.
pub fn logprob_entropy(
    x: &BurnTensor<2>,
    w: &BurnTensor<2>,
    targets: &[u32],
    temperature: f64,
    entropy: bool,
    split: bool,
    chunk_bytes: usize,
) -> Result<Option<(BurnTensor<1>, Option<BurnTensor<1>>)>> {
    let [n, h] = x.dims();
    let [hw, v] = w.dims();
    ensure!(
        hw == h,
        "internal: hidden states [{n}, {h}] against a head [{hw}, {v}]"
    );
    super::super::check_head_inputs(n, v, targets, temperature)?;
    if n == 0 || v == 0 || v >= 1 << 24 || x.dtype() != DType::F32 || w.dtype() != DType::F32 {
        return Ok(None);
    }
    let Some(out) = head(
        x,
        w,
        targets,
        (1.0 / temperature) as f32,
        split,
        chunk_bytes,
    ) else {
        return Ok(None);
    };
    let logp = out.clone().slice([0..n, 0..1]).reshape([n]);
    let ent = entropy.then(|| out.slice([0..n, 1..2]).reshape([n]));
    Ok(Some((logp, ent)))
}

/// `[n, 2]` = (log-prob, entropy) per row, on the autodiff graph when `x` and `w` are on it;
/// `None` off the GPU.
fn head(
    x: &BurnTensor<2>,
    w: &BurnTensor<2>,
    targets: &[u32],
    scale: f32,
    split: bool,
    chunk_bytes: usize,
) -> Option<BurnTensor<2>> {
    let ids: Vec<f32> = targets.iter().map(|&t| t as f32).collect();
    let n = ids.len();
    if let (Ok(xa), Ok(wa)) = (
        x.clone().try_into_primitive::<Autodiff<Cube>>(),
        w.clone().try_into_primitive::<Autodiff<Cube>>(),
    ) {
        let (xp, xg) = xa.into_parts();
        let (wp, wg) = wa.into_parts();
        let (xt, wt) = (tensor::<2>(xp.clone()), tensor::<2>(wp.clone()));
        let ids = plain(&upload::<1, _>(TensorData::new(ids, [n]), &xt.device()))?;
        let chunk = chunk_rows(n, wt.dims()[1], chunk_bytes);
        let (out, stats) = forward(&xt, &wt, &ids, scale, split, chunk)?;
        let out_p = record(HeadBackward, [xg, wg], out.clone(), || HeadState {
            x: xp,
            w: wp,
            ids,
            out,
            stats,
            scale,
            split,
            chunk,
        });
        return Some(BurnTensor::<2>::from_primitive::<Autodiff<Cube>>(out_p));
    }
    // Plain tensors on a GPU (log-probs without a graph).
    plain(x)?;
    plain(w)?;
    let ids = plain(&upload::<1, _>(TensorData::new(ids, [n]), &x.device()))?;
    let chunk = chunk_rows(n, w.dims()[1], chunk_bytes);
    let (out, _) = forward(x, w, &ids, scale, split, chunk)?;
    Some(tensor(out))
}

/// The forward pass over chunks of `chunk` rows: `([n, 2]` log-prob and entropy, `[n, 2]`
/// `s·max(z)` and `ln S`).
fn forward(
    x: &BurnTensor<2>,
    w: &BurnTensor<2>,
    ids: &CubeTensor,
    scale: f32,
    split: bool,
    chunk: usize,
) -> Option<(CubeTensor, CubeTensor)> {
    let [n, h] = x.dims();
    let v = w.dims()[1];
    let out = output(ids, &[n, 2]);
    let stats = output(ids, &[n, 2]);
    let client = ids.client.clone();
    let units = row_units(&client, v);
    let mut s = 0;
    while s < n {
        let e = (s + chunk).min(n);
        let z = plain(&burn_matmul(
            x.clone().slice([s..e, 0..h]),
            w.clone(),
            split,
        ))?;
        forward_kernel::launch(
            &client,
            row_grid(&client, e - s),
            CubeDim::new_1d(units),
            z.into_tensor_arg(),
            ids.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            s as u32,
            scale,
            units,
        );
        s = e;
    }
    Some((out, stats))
}

#[derive(Debug)]
struct HeadBackward;

/// What the head's backward keeps: its inputs (the hidden states and the weight, which the
/// graph and the model hold anyway), the ids, and four numbers per row.
#[derive(Debug, Clone)]
struct HeadState {
    x: CubeTensor,
    w: CubeTensor,
    ids: CubeTensor,
    /// `[n, 2]`: log-prob and entropy (the entropy enters the gradient).
    out: CubeTensor,
    /// `[n, 2]`: `s·max(z)` and `ln S`.
    stats: CubeTensor,
    scale: f32,
    split: bool,
    chunk: usize,
}

impl Backward<Cube, 2> for HeadBackward {
    type State = HeadState;

    fn backward(self, ops: Ops<HeadState, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Cube>(&ops.node);
        let [px, pw] = ops.parents;
        let (dx, dw) = backward(&ops.state, grad, px.is_some(), pw.is_some());
        let prim = |t: BurnTensor<2>| {
            // ok: every tensor here is a plain tensor on the state's CubeCL device.
            t.try_into_primitive::<Cube>()
                .unwrap_or_else(|_| unreachable!("a plain GPU tensor"))
        };
        if let (Some(node), Some(dx)) = (px, dx) {
            grads.register::<Cube>(node.id, prim(dx));
        }
        if let (Some(node), Some(dw)) = (pw, dw) {
            grads.register::<Cube>(node.id, prim(dw));
        }
    }
}

/// `(∂L/∂x, ∂L/∂w)` (each when wanted) from the upstream gradient `grad: [n, 2]` of (log-prob,
/// entropy), recomputing each chunk's logits.
fn backward(
    s: &HeadState,
    grad: CubeTensor,
    want_x: bool,
    want_w: bool,
) -> (Option<BurnTensor<2>>, Option<BurnTensor<2>>) {
    let x = tensor::<2>(s.x.clone());
    let w = tensor::<2>(s.w.clone());
    let [n, h] = x.dims();
    let v = w.dims()[1];
    let client = s.ids.client.clone();
    let units = row_units(&client, v);
    let mut dxs = Vec::new();
    let mut dw: Option<BurnTensor<2>> = None;
    let mut start = 0;
    while start < n {
        let e = (start + s.chunk).min(n);
        let xc = x.clone().slice([start..e, 0..h]);
        let mut dz = burn_matmul(xc.clone(), w.clone(), s.split);
        let done = in_place(&mut dz, |z| {
            backward_kernel::launch(
                &client,
                row_grid(&client, e - start),
                CubeDim::new_1d(units),
                z.clone().into_tensor_arg(),
                s.ids.clone().into_tensor_arg(),
                s.out.clone().into_tensor_arg(),
                s.stats.clone().into_tensor_arg(),
                grad.clone().into_tensor_arg(),
                start as u32,
                s.scale,
            );
            Some(())
        });
        // ok: the product of two plain f32 GPU tensors is one too.
        done.unwrap_or_else(|| unreachable!("the logits of a chunk are a plain GPU tensor"));
        if want_x {
            dxs.push(burn_matmul(dz.clone(), w.clone().transpose(), s.split));
        }
        if want_w {
            let part = burn_matmul(xc.transpose(), dz, s.split);
            dw = Some(match dw {
                Some(acc) => acc + part,
                None => part,
            });
        }
        start = e;
    }
    let dx = match dxs.len() {
        0 => None,
        1 => dxs.pop(),
        _ => Some(BurnTensor::cat(dxs, 0)),
    };
    (dx, dw)
}

/// One cube per row of a chunk's logits `z` (`[c, V]`, rows `base..base + c` of the batch):
/// the maximum, then `S` and `Σ exp(u)·u` through trees in shared memory; unit 0 writes the
/// row's log-prob and entropy into `out` and `s·max(z)`, `ln S` into `stats`.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn forward_kernel(
    z: &Tensor<f32>,
    ids: &Tensor<f32>,
    out: &mut Tensor<f32>,
    stats: &mut Tensor<f32>,
    base: u32,
    scale: f32,
    #[comptime] units: u32,
) {
    let row = cube_row(z.shape(0));
    let v = z.shape(1);
    let (off, step) = (row * z.stride(0), z.stride(1));
    let mut red = Shared::<[f32]>::new_slice(units as usize);
    let mut mx = f32::new(LOWEST);
    let mut j = UNIT_POS_X as usize;
    while j < v {
        mx = mx.max(z[off + j * step]);
        j += CUBE_DIM_X as usize;
    }
    let sm = scale * block_max(&mut red, mx);
    let mut acc = f32::new(0.0);
    let mut acc_u = f32::new(0.0);
    j = UNIT_POS_X as usize;
    while j < v {
        let u = scale * z[off + j * step] - sm;
        let e = u.exp();
        acc += e;
        acc_u += e * u;
        j += CUBE_DIM_X as usize;
    }
    let total = block_sum(&mut red, acc);
    let weighted = block_sum(&mut red, acc_u);
    if UNIT_POS_X == 0 {
        let r = row + base as usize;
        let ln_s = total.ln();
        let t = u32::cast_from(ids[r * ids.stride(0)]) as usize;
        let ut = scale * z[off + t * step] - sm;
        let (o0, o1) = (out.stride(0), out.stride(1));
        out[r * o0] = ut - ln_s;
        out[r * o0 + o1] = ln_s - weighted / total;
        let (s0, s1) = (stats.stride(0), stats.stride(1));
        stats[r * s0] = sm;
        stats[r * s0 + s1] = ln_s;
    }
}

/// One cube per row of a chunk's logits `z` (rows `base..` of the batch), overwritten with
/// `∂L/∂z` from the upstream gradient `grad` (`[n, 2]`: of the log-prob and of the entropy).
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn backward_kernel(
    z: &mut Tensor<f32>,
    ids: &Tensor<f32>,
    out: &Tensor<f32>,
    stats: &Tensor<f32>,
    grad: &Tensor<f32>,
    base: u32,
    scale: f32,
) {
    let row = cube_row(z.shape(0));
    let r = row + base as usize;
    let v = z.shape(1);
    let (off, step) = (row * z.stride(0), z.stride(1));
    let g = grad[r * grad.stride(0)];
    let gh = grad[r * grad.stride(0) + grad.stride(1)];
    let ent = out[r * out.stride(0) + out.stride(1)];
    let sm = stats[r * stats.stride(0)];
    let ln_s = stats[r * stats.stride(0) + stats.stride(1)];
    let t = u32::cast_from(ids[r * ids.stride(0)]) as usize;
    let mut j = UNIT_POS_X as usize;
    while j < v {
        let idx = off + j * step;
        let lp = scale * z[idx] - sm - ln_s;
        let d = select(j == t, g, f32::new(0.0)) - lp.exp() * (g + gh * (lp + ent));
        z[idx] = scale * d;
        j += CUBE_DIM_X as usize;
    }
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    //! The chunked head on the wgpu device (lavapipe in CI; `RLCR_WGPU_DEVICE` picks the
    //! adapter) against the CPU's product and fused head and against float64, values and
    //! gradients; a training micro-batch's launches; the pool's bytes in use.
    use super::*;
    use crate::model::backend::cpu::head as cpu_head;
    use crate::model::memory::PoolWatch;
    use crate::model::transfer::thread_launches;
    use crate::model::transformer::tests::max_diff;
    use crate::model::{read_f32, ResponseBatch, Transformer};
    use burn::tensor::Device;

    /// Deterministic values in ±`amp`.
    fn values(len: usize, seed: f64, amp: f64) -> Vec<f32> {
        (0..len)
            .map(|k| {
                ((k as f64 * 0.7391 + seed).sin() * (k as f64 * 0.1307 + 2.0 * seed).cos() * amp)
                    as f32
            })
            .collect()
    }

    /// A loss that weights each row's log-prob and entropy differently: `(wl, wh)`.
    fn weights(n: usize) -> (Vec<f32>, Vec<f32>) {
        let wl = (0..n).map(|i| 1.0 - 0.13 * i as f32).collect();
        let wh = (0..n).map(|i| 0.07 * i as f32 - 0.4).collect();
        (wl, wh)
    }

    /// Log-probs, entropies, `∂L/∂x`, `∂L/∂w` of `L = Σ wl·log p + Σ wh·H` on `dev` (autodiff):
    /// the chunked GPU head with `chunk` rows a chunk, or (`chunk` = 0) the op's dispatch
    /// ([`crate::model::ops::head_logprob_entropy`]: the CPU's product and fused head there).
    #[allow(clippy::too_many_arguments)]
    fn run(
        dev: &Device,
        x: &[f32],
        w: &[f32],
        [n, h, v]: [usize; 3],
        t: &[u32],
        temp: f64,
        chunk: usize,
    ) -> [Vec<f32>; 4] {
        let xt =
            BurnTensor::<2>::from_data(TensorData::new(x.to_vec(), [n, h]), dev).require_grad();
        let wt =
            BurnTensor::<2>::from_data(TensorData::new(w.to_vec(), [h, v]), dev).require_grad();
        let (lp, ent) = if chunk == 0 {
            crate::model::ops::head_logprob_entropy(xt.clone(), wt.clone(), t, temp, true).unwrap()
        } else {
            logprob_entropy(&xt, &wt, t, temp, true, false, chunk * v * 4)
                .unwrap()
                .expect("the chunked head runs on wgpu")
        };
        let ent = ent.unwrap();
        let (wl, wh) = weights(n);
        let wl = BurnTensor::<1>::from_data(TensorData::new(wl, [n]), dev);
        let wh = BurnTensor::<1>::from_data(TensorData::new(wh, [n]), dev);
        let grads = ((lp.clone() * wl).sum() + (ent.clone() * wh).sum()).backward();
        [
            read_f32(lp).unwrap(),
            read_f32(ent).unwrap(),
            read_f32(xt.grad(&grads).unwrap()).unwrap(),
            read_f32(wt.grad(&grads).unwrap()).unwrap(),
        ]
    }

    /// The same four in float64 from the definitions (module documentation).
    fn reference(
        x: &[f32],
        w: &[f32],
        [n, h, v]: [usize; 3],
        t: &[u32],
        temp: f64,
    ) -> [Vec<f64>; 4] {
        let (wl, wh) = weights(n);
        let s = 1.0 / temp;
        let (mut lp, mut ent) = (vec![0.0; n], vec![0.0; n]);
        let (mut dx, mut dw) = (vec![0.0; n * h], vec![0.0; h * v]);
        for i in 0..n {
            let z: Vec<f64> = (0..v)
                .map(|j| {
                    (0..h)
                        .map(|k| x[i * h + k] as f64 * w[k * v + j] as f64)
                        .sum()
                })
                .collect();
            let zf: Vec<f32> = z.iter().map(|&a| a as f32).collect();
            let u: Vec<f64> = z.iter().map(|a| a * s).collect();
            let m = u.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + u.iter().map(|a| (a - m).exp()).sum::<f64>().ln();
            lp[i] = u[t[i] as usize] - lse;
            ent[i] = -u.iter().map(|a| (a - lse).exp() * (a - lse)).sum::<f64>();
            // The reference of the CPU head's tests agrees on the values.
            let (l2, _) = rlcr_kernels::testing::head_reference(&zf, t[i] as usize, temp);
            assert!((l2 - lp[i]).abs() < 1e-3, "row {i}: {l2} vs {}", lp[i]);
            let (g, gh) = (wl[i] as f64, wh[i] as f64);
            for j in 0..v {
                let lpj = u[j] - lse;
                let on = if j == t[i] as usize { g } else { 0.0 };
                let dz = s * (on - lpj.exp() * (g + gh * (lpj + ent[i])));
                for k in 0..h {
                    dx[i * h + k] += dz * w[k * v + j] as f64;
                    dw[k * v + j] += x[i * h + k] as f64 * dz;
                }
            }
        }
        [lp, ent, dx, dw]
    }

    /// Largest `|a − b|` over the largest `|b|` (at least 1 for the values, whose errors are
    /// absolute).
    fn rel_err(a: &[f32], b: &[f64], floor: f64) -> f64 {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(floor, |m, x| m.max(x.abs()));
        a.iter()
            .zip(b)
            .map(|(x, y)| (*x as f64 - y).abs())
            .fold(0.0, f64::max)
            / scale
    }

    /// Within [`F64_BOUND`] of float64, and of the CPU's product and fused head, for log-probs,
    /// entropies and both gradients: tiny-qwen2's and tiny-llama's head shape (h = 64,
    /// V = 384) in chunks of 5 rows of 23, and a vocabulary of 1,000 (not a multiple of the
    /// cube's 256 units) in chunks of 7 rows of 30 (the last chunk short), at temperatures 1
    /// and 0.7; two runs give the same bits, and plain tensors the autodiff forward's bits.
    #[test]
    fn head_matches_the_cpu_and_float64_with_gradients() {
        let _pool = crate::model::memory::pool_test_lock();
        let gpu = super::super::test_device();
        let cpu = Device::flex();
        for (n, h, v, chunk) in [(23usize, 64usize, 384usize, 5usize), (30, 48, 1000, 7)] {
            let x = values(n * h, 0.3, 1.5);
            let w = values(h * v, 1.1, 0.4);
            let t: Vec<u32> = (0..n).map(|i| ((i * 7919 + 3) % v) as u32).collect();
            for temp in [1.0, 0.7] {
                let dims = [n, h, v];
                let got = run(&gpu.clone().autodiff(), &x, &w, dims, &t, temp, chunk);
                let again = run(&gpu.clone().autodiff(), &x, &w, dims, &t, temp, chunk);
                let host = run(&cpu.clone().autodiff(), &x, &w, dims, &t, temp, 0);
                let want = reference(&x, &w, dims, &t, temp);
                for (k, what) in ["log-prob", "entropy", "dx", "dw"].iter().enumerate() {
                    let floor = if k < 2 { 1.0 } else { 0.0 };
                    let e_gpu = rel_err(&got[k], &want[k], floor);
                    let e_cpu = rel_err(&host[k], &want[k], floor);
                    let host64: Vec<f64> = host[k].iter().map(|&a| a as f64).collect();
                    let e_pair = rel_err(&got[k], &host64, floor);
                    eprintln!(
                        "[{n}, {h}] × [{h}, {v}], T {temp}, {what}: wgpu {e_gpu:.1e} and cpu \
                         {e_cpu:.1e} from f64, wgpu − cpu {e_pair:.1e}"
                    );
                    assert!(e_gpu <= F64_BOUND, "{what}: wgpu {e_gpu:.2e} from f64");
                    assert!(
                        e_pair <= F64_BOUND,
                        "{what}: wgpu {e_pair:.2e} from the cpu"
                    );
                    assert!(
                        got[k].iter().filter(|&&a| a != 0.0).count() * 2 > got[k].len(),
                        "{what} is mostly zeros"
                    );
                    assert_eq!(
                        rlcr_kernels::testing::bits(&got[k]),
                        rlcr_kernels::testing::bits(&again[k]),
                        "{what}: two runs differ"
                    );
                }
                // Plain tensors: the forward alone, the same bits.
                let xt = BurnTensor::<2>::from_data(TensorData::new(x.clone(), [n, h]), &gpu);
                let wt = BurnTensor::<2>::from_data(TensorData::new(w.clone(), [h, v]), &gpu);
                let (lp, ent) = logprob_entropy(&xt, &wt, &t, temp, true, false, chunk * v * 4)
                    .unwrap()
                    .unwrap();
                assert_eq!(read_f32(lp).unwrap(), got[0]);
                assert_eq!(read_f32(ent.unwrap()).unwrap(), got[1]);
            }
        }
        let x = BurnTensor::<2>::from_data(TensorData::new(vec![0f32; 4], [2, 2]), &gpu);
        let w = BurnTensor::<2>::from_data(TensorData::new(vec![0f32; 6], [2, 3]), &gpu);
        assert!(logprob_entropy(&x, &w, &[0], 1.0, false, false, 1 << 20).is_err());
        assert!(logprob_entropy(&x, &w, &[0, 3], 1.0, false, false, 1 << 20).is_err());
        assert!(logprob_entropy(&x, &w, &[0, 2], 0.0, false, false, 1 << 20).is_err());
        let cpu_x = BurnTensor::<2>::from_data(TensorData::new(vec![0f32; 4], [2, 2]), &cpu);
        let cpu_w = BurnTensor::<2>::from_data(TensorData::new(vec![0f32; 6], [2, 3]), &cpu);
        let off = logprob_entropy(&cpu_x, &cpu_w, &[0, 2], 1.0, false, false, 1 << 20);
        assert!(off.unwrap().is_none(), "the CPU has its own head");
    }

    /// Largest error of log-probs and entropies (absolute, values of order 1–10) and of the
    /// gradients (relative to the largest entry) from float64 and between wgpu and the CPU.
    const F64_BOUND: f64 = 5e-6;

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(name)
    }

    /// Kernel launches of one training micro-batch on `m` (autodiff), by stage: the layers'
    /// forward, the head with its loss, the backward pass; through the chunked head (`chunked`)
    /// or through the LM head's product and burn's composite. Also the gradient of the head's
    /// weight.
    fn micro_batch(m: &Transformer, chunked: bool) -> ([u64; 3], Vec<f32>) {
        let rows: Vec<(Vec<u32>, Vec<u32>)> = (0..4u32)
            .map(|r| {
                let ctx = (0..9 + r).map(|k| (k * 31 + r * 7 + 1) % 384).collect();
                let resp = (0..12 - 2 * r)
                    .map(|k| (k * 17 + r * 5 + 2) % 384)
                    .collect();
                (ctx, resp)
            })
            .collect();
        let batch = ResponseBatch::new(&rows).unwrap();
        let device = m.device();
        let (b, r) = (rows.len(), batch.max_resp);
        let (wl, wh) = weights(b * r);
        let wl = BurnTensor::<1>::from_data(TensorData::new(wl, [b * r]), &device);
        let wh = BurnTensor::<1>::from_data(TensorData::new(wh, [b * r]), &device);
        let l0 = thread_launches();
        let hid = m.hidden(&batch.tokens).unwrap();
        let [_, t, hd] = hid.dims();
        let hs = hid
            .slice([0..b, t - r - 1..t - 1, 0..hd])
            .reshape([b * r, hd]);
        let l1 = thread_launches();
        let targets = &batch.targets_right;
        let (lp, ent) = if chunked {
            m.head_logprobs(hs, targets, 1.0, true).unwrap()
        } else {
            cpu_head::logprob_entropy(m.lm_head(hs), targets, 1.0, true).unwrap()
        };
        let loss = (lp * wl).sum() + (ent.unwrap() * wh).sum();
        let l2 = thread_launches();
        let grads = loss.backward();
        let l3 = thread_launches();
        let w = match &m.lm_head {
            Some(w) => w.val(),
            None => m.embed.val(),
        };
        let dw = read_f32(w.grad(&grads).unwrap()).unwrap();
        ([l1 - l0, l2 - l1, l3 - l2], dw)
    }

    /// Launches of one forward and backward training micro-batch (4 rows, 12 response
    /// tokens at most) through the chunked head, on tiny-qwen2 (tied head) and tiny-llama:
    /// at most [`MICRO_BATCH_LAUNCHES`], and the head's share (its forward with the loss, and
    /// the backward pass) fewer than through the product and burn's composite; both give the
    /// head weight the same gradient (embedding and head tied on tiny-qwen2, the gradient
    /// summed with the embedding lookup's).
    #[test]
    fn training_micro_batch_launches() {
        let _pool = crate::model::memory::pool_test_lock();
        let dev = super::super::test_device().autodiff();
        for name in ["tiny-qwen2", "tiny-llama"] {
            let m = crate::model::Model::load(&fixture(name), &dev).unwrap();
            let (after, dw) = micro_batch(&m.transformer, true);
            let (before, dw_composite) = micro_batch(&m.transformer, false);
            let total = |c: [u64; 3]| c.iter().sum::<u64>();
            eprintln!(
                "{name}: launches per micro-batch (layers forward, head + loss, backward): \
                 composite head {before:?} = {}, chunked head {after:?} = {}",
                total(before),
                total(after)
            );
            assert_eq!(before[0], after[0], "the layers are the same");
            assert!(
                after[1] < before[1] && after[2] < before[2],
                "{after:?} vs {before:?}"
            );
            assert!(
                total(after) <= MICRO_BATCH_LAUNCHES,
                "{name}: {} launches, more than {MICRO_BATCH_LAUNCHES}",
                total(after)
            );
            let scale = dw_composite.iter().fold(0f32, |a, b| a.max(b.abs()));
            let worst = max_diff(&dw, &dw_composite);
            eprintln!(
                "{name}: head weight gradient, chunked − composite {worst:.1e} of {scale:.1e}"
            );
            assert!(scale > 0.0 && worst <= 1e-5 * scale, "{worst} of {scale}");
        }
    }

    /// The most launches a training micro-batch of tiny-qwen2 or tiny-llama (2 layers) may
    /// take on wgpu through the chunked head. Measured on lavapipe (layers forward, head with
    /// the loss, backward): tiny-qwen2 23 + 11 + 61 = 95 (118 through the composite head),
    /// tiny-llama 21 + 11 + 58 = 90 (113). Before the kernels: 367 and 362 with burn's
    /// composites for RMSNorm, SwiGLU, RoPE and attention; 185 and 180 with attention's
    /// composite alone; 127 and 122 with attention's kernel after the split of q, k and v; 101
    /// and 96 with the residual adds apart from the norms. The rest is the products (three
    /// launches each with the backward pass) and the gradient sums where a tensor feeds two ops.
    const MICRO_BATCH_LAUNCHES: u64 = 95;

    /// The pool's bytes in use on a head with a large vocabulary against the hidden size (512
    /// tokens, h = 64, V = 32,768: 64 MiB of logits): after the forward pass (what autodiff
    /// keeps for backward) and after the backward pass, above what was in use before. The
    /// chunked head (8 MiB chunks) stays under an eighth of the logits' size after forward and
    /// a quarter after backward (the gradients);
    /// burn's composite keeps more than the logits. The pool is read at those two points only
    /// (it has no high-water mark of its own): transient chunk buffers are not seen, but the
    /// reserved bytes, which grow to the largest allocation, are printed too.
    #[test]
    fn head_memory_stays_below_the_logits() {
        let _pool = crate::model::memory::pool_test_lock();
        let dev = super::super::test_device();
        let ad = dev.clone().autodiff();
        let (n, h, v) = (512usize, 64usize, 32768usize);
        let logits_bytes = (n * v * 4) as u64;
        let x = values(n * h, 0.3, 1.5);
        let w = values(h * v, 1.1, 0.4);
        let t: Vec<u32> = (0..n).map(|i| ((i * 7919 + 3) % v) as u32).collect();
        let mut seen = Vec::new();
        for chunked in [true, false] {
            let xt =
                BurnTensor::<2>::from_data(TensorData::new(x.clone(), [n, h]), &ad).require_grad();
            let wt =
                BurnTensor::<2>::from_data(TensorData::new(w.clone(), [h, v]), &ad).require_grad();
            let wl = BurnTensor::<1>::from_data(TensorData::new(weights(n).0, [n]), &ad);
            let _ = read_f32(wl.clone().slice(0..1)).unwrap();
            let mut watch = PoolWatch::new(&dev).expect("wgpu reports its pool");
            let base = dev.memory_pool_usage().unwrap().bytes_in_use;
            let (lp, ent) = if chunked {
                logprob_entropy(&xt, &wt, &t, 1.0, true, false, 8 << 20)
                    .unwrap()
                    .unwrap()
            } else {
                cpu_head::logprob_entropy(xt.clone().matmul(wt.clone()), &t, 1.0, true).unwrap()
            };
            let loss = (lp * wl).sum() + ent.unwrap().sum();
            let _ = read_f32(loss.clone().reshape([1])).unwrap();
            let fwd = dev.memory_pool_usage().unwrap().bytes_in_use;
            watch.sample();
            let grads = loss.backward();
            let dw = wt.grad(&grads).unwrap();
            let _ = read_f32(dw.slice([0..1, 0..1])).unwrap();
            let bwd = dev.memory_pool_usage().unwrap().bytes_in_use;
            watch.sample();
            let peak = watch.peak();
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            eprintln!(
                "{}: in use above the start: {:.1} MiB after forward, {:.1} MiB after backward; \
                 pool peak {:.1} MiB in use, {:.1} MiB reserved (logits {:.1} MiB)",
                if chunked { "chunked head" } else { "composite" },
                mib(fwd.saturating_sub(base)),
                mib(bwd.saturating_sub(base)),
                mib(peak.in_use),
                mib(peak.reserved),
                mib(logits_bytes)
            );
            seen.push((fwd.saturating_sub(base), bwd.saturating_sub(base)));
        }
        let (chunked, composite) = (seen[0], seen[1]);
        // After backward the gradients are live: `∂L/∂w` alone is 8 MiB here (an eighth of the
        // logits, as h/n = 1/8), `∂L/∂x` 128 KiB.
        assert!(
            chunked.0 < logits_bytes / 8 && chunked.1 < logits_bytes / 4,
            "chunked head: {chunked:?} bytes in use against {logits_bytes} of logits"
        );
        assert!(
            composite.0 > logits_bytes,
            "the composite keeps the logits: {composite:?}"
        );
    }
}
