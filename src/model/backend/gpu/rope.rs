//! HF's rotate-half RoPE as one `#[cube]` kernel: one cube per (batch, head, slot) row of the
//! head dimension. In place of [`super::rope`]'s four launches. The composite's formula,
//! `x·[c, c] + swap(x)·[−s, s]` over the whole head (`swap` exchanges the halves), in f32 (a
//! compiler may fuse the products and the sum into one rounding). On autodiff tensors
//! (training) with a backward kernel of its own, one launch where burn derives about eight for
//! the composite: `swap` is its own inverse, so with `C = [c, c]`, `S = [−s, s]` and the
//! upstream gradient `g`, `∂L/∂x_j = g_j·C_j + g_swap(j)·S_swap(j)`.
//!
//! Through a KV cache, [`rope_cache_write`] does a layer's whole share of the step between the
//! q/k/v product and attention in one launch: the bias, the rotation of q and k at positions read
//! on the device (cos/sin from a table, the values [`crate::model::ops::Rope`] computes), the keys
//! and values written into the cache in place, the slots' validity flags, and q in the layout
//! attention reads. In place of the bias add, the rotation, the queries' copy and burn's three
//! launches of the cache write.
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::cubecl;
use burn::tensor::{DType, Tensor as BurnTensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::Cube;
use cubecl::prelude::*;

use super::block::{
    cube_row, in_place, offset3, output, plain, row_grid, row_units, tensor, unravel,
};
use crate::model::backend::record;

/// RoPE on `x: [B, n, T, d]` (any strides) with `cos = [c, c]` and `sin = [−s, s]`
/// (`[B, 1, T, d]`), in one launch; on autodiff tensors differentiable in `x` (one launch
/// backward; the tables are constants). `None` on the CPU, for another dtype or other shapes.
pub fn rope(x: &BurnTensor<4>, cos: &BurnTensor<4>, sin: &BurnTensor<4>) -> Option<BurnTensor<4>> {
    rope_heads(x, cos, sin, x.dims()[1])
}

/// [`rope`] on the first `rotated` heads of `x`, the others copied (the values after the
/// queries and keys of one product): the same launches, `[B, n, T, d]` contiguous.
pub fn rope_heads(
    x: &BurnTensor<4>,
    cos: &BurnTensor<4>,
    sin: &BurnTensor<4>,
    rotated: usize,
) -> Option<BurnTensor<4>> {
    let [b, n, t, d] = x.dims();
    if d % 2 != 0 || b * n * t * d == 0 || cos.dims() != [b, 1, t, d] || sin.dims() != [b, 1, t, d]
    {
        return None;
    }
    if rotated > n {
        return None;
    }
    if [x.dtype(), cos.dtype(), sin.dtype()] != [DType::F32; 3] {
        return None;
    }
    if let Ok(xa) = x.clone().try_into_primitive::<Autodiff<Cube>>() {
        let table = |t: &BurnTensor<4>| -> Option<CubeTensor> {
            let p = t.clone().try_into_primitive::<Autodiff<Cube>>().ok()?;
            Some(burn_cubecl::kernel::untile(p.into_parts().0))
        };
        let (cp, sp) = (table(cos)?, table(sin)?);
        let (xp, node) = xa.into_parts();
        let xp = burn_cubecl::kernel::untile(xp);
        let y = rotate(&xp, &cp, &sp, rotated, false, false);
        // `x` a `[B, T, n, d]` tensor seen as `[B, n, T, d]` (the q/k/v product): its gradient
        // laid out the same way, so that the product's backward needs no copy.
        let s = xp.meta.strides();
        let swapped = s[..] == [t * n * d, d, n * d, 1];
        let y = record(RopeBackward, [node], y, || (cp, sp, rotated, swapped));
        return Some(BurnTensor::<4>::from_primitive::<Autodiff<Cube>>(y));
    }
    let (xp, cp, sp) = (plain(x)?, plain(cos)?, plain(sin)?);
    Some(tensor(rotate(&xp, &cp, &sp, rotated, false, false)))
}

/// `x·C + swap(x)·S` (`backward` false), or the gradient `g·C + swap(g·S)` of a rotation for
/// `x = g` (`backward` true), on the first `rotated` heads, the others copied: `[B, n, T, d]`,
/// contiguous, or (`swapped`) a contiguous `[B, T, n, d]` seen as `[B, n, T, d]`.
fn rotate(
    x: &CubeTensor,
    cos: &CubeTensor,
    sin: &CubeTensor,
    rotated: usize,
    backward: bool,
    swapped: bool,
) -> CubeTensor {
    let shape = x.meta.shape();
    let (b, n, t, d) = (shape[0], shape[1], shape[2], shape[3]);
    let client = x.client.clone();
    let out = match swapped {
        true => {
            let mut out = output(x, &[b, t, n, d]);
            out.meta.swap(1, 2);
            out
        }
        false => output(x, &[b, n, t, d]),
    };
    rope_kernel::launch(
        &client,
        row_grid(&client, b * n * t),
        CubeDim::new_1d(row_units(&client, d)),
        x.clone().into_tensor_arg(),
        cos.clone().into_tensor_arg(),
        sin.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rotated,
        backward,
    );
    out
}

#[derive(Debug)]
struct RopeBackward;

impl Backward<Cube, 1> for RopeBackward {
    /// The tables `cos`, `sin`, the rotated heads and whether the gradient is laid out as
    /// `[B, T, n, d]` (the input's layout).
    type State = (CubeTensor, CubeTensor, usize, bool);

    fn backward(
        self,
        ops: Ops<(CubeTensor, CubeTensor, usize, bool), 1>,
        grads: &mut Gradients,
        _: &mut Checkpointer,
    ) {
        let g = burn_cubecl::kernel::untile(grads.consume::<Cube>(&ops.node));
        let [parent] = ops.parents;
        let Some(node) = parent else { return };
        let (cos, sin, rotated, swapped) = ops.state;
        let dx = rotate(&g, &cos, &sin, rotated, true, swapped);
        grads.register::<Cube>(node.id, dx);
    }
}

/// One row of [`rotate`]: `out_i = x_i·C_i + x_swap(i)·S_i`, or with `backward`
/// `out_i = x_i·C_i + x_swap(i)·S_swap(i)`; `out_i = x_i` in heads from `rotated` on.
#[cube(launch)]
fn rope_kernel(
    x: &Tensor<f32>,
    cos: &Tensor<f32>,
    sin: &Tensor<f32>,
    out: &mut Tensor<f32>,
    rotated: usize,
    #[comptime] backward: bool,
) {
    let (heads, slots, d) = (out.shape(1), out.shape(2), out.shape(3));
    let row = cube_row(out.shape(0) * heads * slots);
    let (batch, head, slot) = unravel(row, heads, slots);
    let half = d / 2;
    let xb = offset3(x, batch, head, slot);
    let cb = offset3(cos, batch, 0, slot);
    let sb = offset3(sin, batch, 0, slot);
    let ob = offset3(&*out, batch, head, slot);
    let (x3, c3, s3, o3) = (x.stride(3), cos.stride(3), sin.stride(3), out.stride(3));
    let mut i = UNIT_POS_X as usize;
    if head >= rotated {
        while i < d {
            out[ob + i * o3] = x[xb + i * x3];
            i += CUBE_DIM_X as usize;
        }
        terminate!();
    }
    while i < d {
        let swapped = (i + half) % d;
        let si = if backward { swapped } else { i };
        out[ob + i * o3] =
            x[xb + i * x3] * cos[cb + i * c3] + x[xb + swapped * x3] * sin[sb + si * s3];
        i += CUBE_DIM_X as usize;
    }
}

/// RoPE and the KV-cache write of one layer for a call of `T` tokens a row through a cache, in
/// one launch: `qkv: [B, T, H + 2K, d]` (any strides; `bias`, `[(H + 2K)·d]`, added to each
/// element first when given, the same f32 addition as a separate one) holds the `heads` query
/// heads, then the keys, then the values. Each token's position is `step[1 + b·T + t]` (−1:
/// padding, rotated at position 0 as the host's tables do) and its slot `step[0] + t`; cos and
/// sin come from `table` (`[n, d]`, `n ≥ capacity`, cos then sin per position). The rotated keys and the
/// values go into the cache buffers `kc`, `vc` (`[B, K, capacity, d]`) in place, each slot's
/// flag into `flags` (`[B, capacity]`: 1 real, 0 padding), and the rotated queries are returned
/// as `[B, K, g·T, d]` (contiguous `[B, H, T, d]`, the layout attention reads). Positions and
/// the slot are read on the device, so the launch is the same every step (see
/// [`crate::model::cache::SlotStep`] for what a replayed graph needs besides). `None` (nothing
/// written) on the CPU, for autodiff tensors, another dtype or inconsistent shapes.
#[allow(clippy::too_many_arguments)]
pub fn rope_cache_write(
    qkv: &BurnTensor<4>,
    bias: Option<&BurnTensor<1>>,
    heads: usize,
    table: &BurnTensor<2>,
    step: &BurnTensor<1>,
    kc: &mut BurnTensor<4>,
    vc: &mut BurnTensor<4>,
    flags: &mut BurnTensor<2>,
) -> Option<BurnTensor<4>> {
    let [b, t, n, d] = qkv.dims();
    let [_, kv, cap, _] = kc.dims();
    if d % 2 != 0
        || b * t * d == 0
        || kv == 0
        || n != heads + 2 * kv
        || !heads.is_multiple_of(kv)
        || kc.dims() != [b, kv, cap, d]
        || vc.dims() != kc.dims()
        || flags.dims() != [b, cap]
        || table.dims()[0] < cap
        || table.dims()[1] != d
        || step.dims() != [1 + b * t]
        || bias.is_some_and(|w| w.dims() != [n * d])
    {
        return None;
    }
    let (xp, tp, sp) = (plain(qkv)?, plain(table)?, plain(step)?);
    // Without a bias the kernel reads none: any f32 tensor stands in for the argument.
    let bp = match bias {
        Some(w) => plain(w)?,
        None => tp.clone(),
    };
    let client = xp.client.clone();
    let q = output(&xp, &[b, heads, t, d]);
    in_place(kc, |kp| {
        in_place(vc, |vp| {
            in_place(flags, |fp| {
                rope_cache_kernel::launch(
                    &client,
                    row_grid(&client, b * t * n),
                    CubeDim::new_1d(row_units(&client, d)),
                    xp.into_tensor_arg(),
                    bp.into_tensor_arg(),
                    tp.into_tensor_arg(),
                    sp.into_tensor_arg(),
                    q.clone().into_tensor_arg(),
                    kp.clone().into_tensor_arg(),
                    vp.clone().into_tensor_arg(),
                    fp.clone().into_tensor_arg(),
                    bias.is_some(),
                );
                Some(())
            })
        })
    })?;
    Some(tensor::<4>(q).reshape([b, kv, heads / kv * t, d]))
}

/// `qkv[row]` element `i` (the bias added when there is one).
#[cube]
fn qkv_at(
    qkv: &Tensor<f32>,
    bias: &Tensor<f32>,
    base: usize,
    head: usize,
    i: usize,
    #[comptime] has_bias: bool,
) -> f32 {
    let mut x = qkv[base + i * qkv.stride(3)];
    if has_bias {
        x += bias[(head * qkv.shape(3) + i) * bias.stride(0)];
    }
    x
}

/// One cube per (batch row, token, head of q, k or v), its units striding over the head.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn rope_cache_kernel(
    qkv: &Tensor<f32>,
    bias: &Tensor<f32>,
    table: &Tensor<f32>,
    step: &Tensor<f32>,
    q: &mut Tensor<f32>,
    kc: &mut Tensor<f32>,
    vc: &mut Tensor<f32>,
    flags: &mut Tensor<f32>,
    #[comptime] has_bias: bool,
) {
    let (slots, n, d) = (qkv.shape(1), qkv.shape(2), qkv.shape(3));
    let row = cube_row(qkv.shape(0) * slots * n);
    let (batch, t, head) = unravel(row, slots, n);
    let (heads, kv) = (q.shape(1), kc.shape(1));
    let pos = step[(1 + batch * slots + t) * step.stride(0)];
    let slot = u32::cast_from(step[0]) as usize + t;
    // Padding rotates at position 0, as on the host.
    let p = u32::cast_from(pos.max(f32::new(0.0))) as usize;
    let half = d / 2;
    let xb = offset3(qkv, batch, t, head);
    let (tb, t1) = (p * table.stride(0), table.stride(1));
    let mut i = UNIT_POS_X as usize;
    if head < heads + kv {
        while i < d {
            let f = i % half;
            let x = qkv_at(qkv, bias, xb, head, i, has_bias);
            let swapped = qkv_at(qkv, bias, xb, head, (i + half) % d, has_bias);
            let s = table[tb + (half + f) * t1];
            let y = x * table[tb + f * t1] + swapped * select(i < half, -s, s);
            if head < heads {
                let at = offset3(&*q, batch, head, t) + i * q.stride(3);
                q[at] = y;
            } else {
                let at = offset3(&*kc, batch, head - heads, slot) + i * kc.stride(3);
                kc[at] = y;
            }
            i += CUBE_DIM_X as usize;
        }
    } else {
        let at = offset3(&*vc, batch, head - heads - kv, slot);
        let v3 = vc.stride(3);
        while i < d {
            vc[at + i * v3] = qkv_at(qkv, bias, xb, head, i, has_bias);
            i += CUBE_DIM_X as usize;
        }
    }
    if head == 0 && UNIT_POS_X == 0 {
        let at = batch * flags.stride(0) + slot * flags.stride(1);
        flags[at] = select(pos >= f32::new(0.0), f32::new(1.0), f32::new(0.0));
    }
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    //! The kernels on the wgpu device (lavapipe in CI; `RLCR_WGPU_DEVICE` picks the adapter)
    //! against the CPU's RoPE (through [`crate::model::ops::Rope`], as the model calls it) and
    //! an f64 evaluation, and the cache write within the model against the cache-free forward.
    use burn::tensor::{Device, Tensor, TensorData};

    use crate::model::cache::tests::{decode_and_grow, select_chunk_truncate};
    use crate::model::transfer::{thread_counts, thread_launches};
    use crate::model::transformer::tests::{ids, load, max_diff};
    use crate::model::{read_f32, KvCache, TokenBatch};

    use super::super::assert_close;

    /// RoPE and the cache write on a strided `qkv` with a bias, two rows of three tokens at slots
    /// 4..7 of an 8-slot cache, one of them padding: the queries and the written keys within
    /// 1e-5 of f64's rotation of the same f32 angles (padding at position 0), the values equal
    /// to `qkv + bias` in f32, the flags 1/0 at the written slots, every other slot of the cache
    /// and its flags as they were, and a clone of the cache taken before untouched.
    #[test]
    fn rope_cache_write_matches_f64() {
        let dev = super::super::test_device();
        let (b, t, heads, kv, d, cap, start) = (2usize, 3usize, 4, 2, 8usize, 8usize, 4usize);
        let n = heads + 2 * kv;
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 10000f32.powf(-(2.0 * i as f32) / d as f32))
            .collect();
        let positions: [f32; 6] = [5.0, -1.0, 6.0, 0.0, 1.0, 2.0];
        let val = |k: usize, s: f32| (k as f32 * 0.731 + s).sin() * 2.0;
        let wide: Vec<f32> = (0..b * t * (n + 1) * d).map(|k| val(k, 0.3)).collect();
        let bias: Vec<f32> = (0..n * d).map(|k| val(k, 1.9)).collect();
        let before: Vec<f32> = (0..b * kv * cap * d).map(|k| 100.0 + k as f32).collect();
        let flags0: Vec<f32> = (0..b * cap).map(|k| (k % 3 == 0) as u8 as f32).collect();
        fn f32s<const D: usize>(v: &[f32], shape: [usize; D], dev: &Device) -> Tensor<D> {
            Tensor::from_data(TensorData::new(v.to_vec(), shape), dev)
        }
        let qkv = f32s(&wide, [b, t, n + 1, d], &dev).slice([0..b, 0..t, 1..n + 1, 0..d]);
        let bias_t = f32s(&bias, [n * d], &dev);
        let mut info = vec![start as f32];
        info.extend_from_slice(&positions);
        let step = f32s(&info, [1 + b * t], &dev);
        let table = crate::model::ops::rope_table(&inv_freq, cap, &dev);
        let mut kc = f32s(&before, [b, kv, cap, d], &dev);
        let mut vc = f32s(&before, [b, kv, cap, d], &dev);
        let mut flags = f32s(&flags0, [b, cap], &dev);
        let kept = kc.clone();
        let q = super::rope_cache_write(
            &qkv,
            Some(&bias_t),
            heads,
            &table,
            &step,
            &mut kc,
            &mut vc,
            &mut flags,
        )
        .expect("the kernel runs on wgpu");
        assert_eq!(q.dims(), [b, kv, heads / kv * t, d]);
        let (q, k, v) = (
            read_f32(q).unwrap(),
            read_f32(kc).unwrap(),
            read_f32(vc).unwrap(),
        );
        let (fl, kept) = (read_f32(flags).unwrap(), read_f32(kept).unwrap());
        assert_eq!(kept, before, "the clone was written through");
        let x = |bi: usize, ti: usize, h: usize, i: usize| {
            wide[((bi * t + ti) * (n + 1) + 1 + h) * d + i] as f64 + bias[h * d + i] as f64
        };
        let half = d / 2;
        let mut written = vec![false; b * kv * cap * d];
        for bi in 0..b {
            for ti in 0..t {
                let pos = positions[bi * t + ti].max(0.0);
                let slot = start + ti;
                assert_eq!(
                    fl[bi * cap + slot],
                    (positions[bi * t + ti] >= 0.0) as u8 as f32
                );
                for h in 0..heads + kv {
                    for i in 0..d {
                        let angle = (pos * inv_freq[i % half]) as f64;
                        let (c, sn) = (angle.cos(), angle.sin());
                        let exact = if i < half {
                            x(bi, ti, h, i) * c - x(bi, ti, h, i + half) * sn
                        } else {
                            x(bi, ti, h, i) * c + x(bi, ti, h, i - half) * sn
                        };
                        let got = if h < heads {
                            q[((bi * heads + h) * t + ti) * d + i]
                        } else {
                            let at = ((bi * kv + h - heads) * cap + slot) * d + i;
                            written[at] = true;
                            k[at]
                        };
                        assert!(
                            (got as f64 - exact).abs() < 1e-5,
                            "{bi} {ti} {h} {i}: {got}"
                        );
                    }
                }
                for h in 0..kv {
                    for i in 0..d {
                        let at = ((bi * kv + h) * cap + slot) * d + i;
                        let src = ((bi * t + ti) * (n + 1) + 1 + heads + kv + h) * d + i;
                        assert_eq!(v[at], wide[src] + bias[(heads + kv + h) * d + i]);
                    }
                }
            }
        }
        for (at, &w) in written.iter().enumerate() {
            if !w {
                assert_eq!(k[at], before[at], "key slot {at} untouched");
            }
            let slot = (at / d) % cap;
            if !(start..start + t).contains(&slot) {
                assert_eq!(v[at], before[at], "value slot {at} untouched");
            }
        }
        for (at, (&got, &was)) in fl.iter().zip(&flags0).enumerate() {
            if !(start..start + t).contains(&(at % cap)) {
                assert_eq!(got, was, "flag {at} untouched");
            }
        }
    }

    /// The cache's tests on the wgpu device, where RoPE, the cache write and attention run as
    /// the slot kernels: decoding across a growth of the buffers (also with Qwen3's per-head
    /// norms between the product and the rotation), row selection, a multi-token
    /// chunk with its own left padding and a truncation, each against the cache-free forward on
    /// the same device (other kernels: RoPE from host tables, attention from a host mask) within
    /// the CPU tests' 1e-5. The cache keeps describing its slots on the device throughout, so
    /// no step fell back to the host's description.
    #[test]
    fn slot_kernels_keep_the_cache_semantics() {
        let dev = super::super::test_device();
        for name in ["tiny-qwen2", "tiny-llama", "tiny-qwen3"] {
            let worst = decode_and_grow(&dev, name);
            eprintln!("{name}: cached vs full on wgpu: {worst:.2e}");
            assert!(worst < 1e-5, "{name}: cached vs full differ by {worst}");
        }
        let [rows, chunk, truncated] = select_chunk_truncate(&dev);
        eprintln!("rows {rows:.2e}, chunk {chunk:.2e}, truncated {truncated:.2e}");
        assert!(rows < 1e-5, "selected rows: {rows}");
        assert!(chunk < 1e-5, "chunk rows: {chunk}");
        assert!(truncated < 1e-5, "after truncation: {truncated}");
    }

    /// A decode step through a cache on wgpu uploads the ids and the slot description only (no
    /// RoPE tables, no mask), writes the cache in place (a clone of the cache taken before the
    /// step keeps its contents: the kernel copies a shared buffer first), and gives the logits
    /// the CPU gives, and those of the same step with the slots described on the host (the path
    /// a cache takes after a kernel did not apply: RoPE from host tables, burn's `slice_assign`,
    /// attention from a host mask).
    #[test]
    fn a_cached_step_uploads_the_slots_and_writes_in_place() {
        let dev = super::super::test_device();
        let cpu = Device::flex();
        let (gpu_model, cpu_model) = (load("tiny-llama", &dev), load("tiny-llama", &cpu));
        let prompts = [ids(5, 7, 360), ids(6, 3, 360)];
        let run = |m: &crate::model::Transformer| {
            let mut cache = KvCache::new(m, 2, 16);
            m.step(&mut cache, &TokenBatch::left_padded(&prompts))
                .unwrap();
            cache
        };
        let (mut cache, mut cpu_cache) = (run(&gpu_model), run(&cpu_model));
        assert!(cache.slots_on_device() && !cpu_cache.slots_on_device());
        let kept = cache.clone();
        let before = (thread_counts(), thread_launches());
        let next = TokenBatch::step(&[3, 4]);
        let got = read_f32(gpu_model.step(&mut cache, &next).unwrap()).unwrap();
        let ups = thread_counts().uploads - before.0.uploads;
        assert_eq!(ups, 2, "uploads of a cached step: the ids and the slots");
        assert!(thread_launches() > before.1);
        let want = read_f32(cpu_model.step(&mut cpu_cache, &next).unwrap()).unwrap();
        let worst = max_diff(&got, &want);
        assert!(worst < 1e-4, "wgpu vs CPU logits: {worst}");
        // The clone still continues from the prompts alone.
        let mut host = kept.clone();
        let mut again = kept;
        let replay = read_f32(gpu_model.step(&mut again, &next).unwrap()).unwrap();
        assert_eq!(replay, got, "a clone of the cache was written through");
        host.describe_slots_on_host();
        // Uploaded once per process, by whichever test needs it first.
        super::super::rope_swap_index(gpu_model.dims.head_dim, &dev);
        let before = thread_counts().uploads;
        let on_host = read_f32(gpu_model.step(&mut host, &next).unwrap()).unwrap();
        assert_eq!(
            thread_counts().uploads - before,
            4,
            "ids, cos, sin and the mask"
        );
        let worst = max_diff(&got, &on_host);
        assert!(worst < 1e-5, "slots on the device vs on the host: {worst}");
        assert!(!host.slots_on_device());
    }

    /// Training's RoPE (autodiff tensors, a strided input of 3 of 5 heads) against float64 and
    /// burn's derived backward of the composite ([`super::super::rope`]): `y` and `∂L/∂x` of
    /// `L = Σ y·c` within 1e-5; one launch forward and one backward (the composite: four and
    /// more); the same bits twice.
    #[test]
    fn training_rope_matches_float64_and_the_composite() {
        let _pool = crate::model::memory::pool_test_lock();
        let ad = super::super::test_device().autodiff();
        let (b, n, wide, t, d) = (2usize, 3usize, 5usize, 4usize, 8usize);
        let half = d / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 10000f32.powf(-(2.0 * i as f32) / d as f32))
            .collect();
        let positions: Vec<usize> = (0..b * t).map(|k| k * 997 % 4001).collect();
        let angle = |bi: usize, ti: usize, i: usize| {
            (positions[bi * t + ti] as f32 * inv_freq[i % half]) as f64
        };
        let (mut cs, mut ss) = (vec![0f32; b * t * d], vec![0f32; b * t * d]);
        for bi in 0..b {
            for ti in 0..t {
                for i in 0..d {
                    let a = angle(bi, ti, i);
                    cs[(bi * t + ti) * d + i] = a.cos() as f32;
                    ss[(bi * t + ti) * d + i] = if i < half { -a.sin() } else { a.sin() } as f32;
                }
            }
        }
        let vals: Vec<f32> = (0..b * wide * t * d)
            .map(|k| (k as f32 * 0.37).sin())
            .collect();
        let gs: Vec<f32> = (0..b * n * t * d)
            .map(|k| (k as f32 * 0.23).cos())
            .collect();
        let run = |fused: bool| {
            let whole = Tensor::<4>::from_data(TensorData::new(vals.clone(), [b, wide, t, d]), &ad)
                .require_grad();
            let x = whole.clone().slice([0..b, 1..1 + n, 0..t, 0..d]);
            let cos = Tensor::<4>::from_data(TensorData::new(cs.clone(), [b, 1, t, d]), &ad);
            let sin = Tensor::<4>::from_data(TensorData::new(ss.clone(), [b, 1, t, d]), &ad);
            let swap = super::super::rope_swap_index(d, &ad);
            let c = Tensor::<4>::from_data(TensorData::new(gs.clone(), [b, n, t, d]), &ad);
            let rotate = || match fused {
                true => {
                    super::rope(&x, &cos, &sin).expect("the kernel runs on autodiff wgpu tensors")
                }
                false => super::super::rope(x.clone(), &cos, &sin, &swap),
            };
            let (y, grads, fwd, bwd) = super::super::loss_backward(rotate, c);
            let dwhole = crate::model::read_f32(whole.grad(&grads).unwrap()).unwrap();
            let dx: Vec<f32> = (0..b)
                .flat_map(|bi| {
                    let per = t * d;
                    dwhole[(bi * wide + 1) * per..(bi * wide + 1 + n) * per].to_vec()
                })
                .collect();
            (crate::model::read_f32(y).unwrap(), dx, fwd, bwd)
        };
        let (y, dx, fwd, bwd) = run(true);
        let (cy, cdx, cfwd, cbwd) = run(false);
        for bi in 0..b {
            for h in 0..n {
                for ti in 0..t {
                    let row = |v: &[f32], k0: usize| -> Vec<f64> {
                        (0..d).map(|j| v[k0 + j] as f64).collect()
                    };
                    let xr = row(&vals, ((bi * wide + 1 + h) * t + ti) * d);
                    let gr = row(&gs, ((bi * n + h) * t + ti) * d);
                    let cr = row(&cs, (bi * t + ti) * d);
                    let sr = row(&ss, (bi * t + ti) * d);
                    for i in 0..d {
                        let sw = (i + half) % d;
                        let ey = xr[i] * cr[i] + xr[sw] * sr[i];
                        let edx = gr[i] * cr[i] + gr[sw] * sr[sw];
                        let k = ((bi * n + h) * t + ti) * d + i;
                        assert!((y[k] as f64 - ey).abs() < 1e-5, "{k}: y {} vs {ey}", y[k]);
                        assert!(
                            (dx[k] as f64 - edx).abs() < 1e-5,
                            "{k}: dx {} vs {edx}",
                            dx[k]
                        );
                        assert!((y[k] - cy[k]).abs() < 1e-5, "{k}: y vs composite");
                        assert!((dx[k] - cdx[k]).abs() < 1e-5, "{k}: dx vs composite");
                    }
                }
            }
        }
        eprintln!(
            "launches forward / backward (with the loss's): kernel {fwd} / {bwd}, \
             composite {cfwd} / {cbwd}"
        );
        assert_eq!(fwd, 1, "one launch forward");
        assert!(bwd + 3 <= cbwd, "backward {bwd} vs the composite's {cbwd}");
        let (y2, dx2, _, _) = run(true);
        assert_eq!((y2, dx2), (y, dx), "the same bits again");
    }

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
                        assert_close(got[k], exact, want[k], format_args!("{k}"));
                    }
                }
            }
        }
    }
}
