//! Masked attention as one `#[cube]` kernel: one cube per (batch, head, query row), its units
//! computing the row's scores over the keys (each unit whole dot products, into shared memory),
//! the softmax through tree reductions ([`super::block`]), then the weighted values (each unit a
//! share of the head dimension). In place of [`crate::model::backend::composite_attention`]'s
//! nine launches (and the split products' more on CUDA), on plain GPU tensors (sampling,
//! log-probs); training's autodiff tensors keep the composite, whose backward burn derives.
//!
//! The composite's formula in f32: scores `q·k · scale`, hidden keys excluded, `exp(s − max)`,
//! the weighted values summed in key order and divided by the weights' sum once (the composite
//! divides each weight first: the two differ by a rounding). The dot products are f32
//! multiply-adds in the order of the head dimension, never TF32. Rows of up to
//! [`MAX_KEYS`] keys, as far as the device's shared memory holds their scores (a power of two
//! of them); longer ones keep the composite.
//!
//! Through a KV cache whose slots the device describes, [`slot_attention`] takes no mask: each
//! query's visible keys follow from the slots' validity flags and its own slot (read on the
//! device), the keys after its own are not read, and the output is written in the layout of the
//! output projection.
use burn::cubecl;
use burn::tensor::{Bool, DType, Tensor as BurnTensor};
use burn_cubecl::Cube;
use cubecl::ir::{ElemType, UIntKind};
use cubecl::prelude::*;

use super::block::{
    block_max, block_sum, cube_row, offset3, output, plain, row_grid, row_units, tensor, unravel,
};

/// The most keys a row may have: its scores, 4 bytes each, fill 32 KiB of shared memory.
pub const MAX_KEYS: usize = 8192;

/// A stand-in for −∞ (WGSL has no infinite literal): the score of a hidden key.
const LOWEST: f32 = -3.0e38;

/// `softmax(q·kᵀ · scale, hidden keys excluded) · v` for `q: [B, H, R, d]`, `k`, `v`:
/// `[B, H, S, d]` and `mask: [B, 1, R, S]` (true = hidden), in one launch; `None` on the CPU,
/// for autodiff tensors, other dtypes or shapes, or more than [`MAX_KEYS`] keys (or than the
/// device's shared memory holds).
pub fn attention(
    q: &BurnTensor<4>,
    k: &BurnTensor<4>,
    v: &BurnTensor<4>,
    mask: &BurnTensor<4, Bool>,
    scale: f32,
) -> Option<BurnTensor<4>> {
    let [b, heads, rows, d] = q.dims();
    let keys = keys_of(q, k, v)?;
    if mask.dims() != [b, 1, rows, keys] {
        return None;
    }
    let (qp, kp, vp) = (plain(q)?, plain(k)?, plain(v)?);
    let mp = mask.clone().try_into_primitive::<Cube>().ok()?;
    let mp = burn_cubecl::kernel::untile(mp);
    // burn's GPU backends store bools as u8 or u32 (the lowest bit is the value).
    let store = match mp.dtype {
        DType::Bool(burn::tensor::BoolStore::U8) => UIntKind::U8,
        DType::Bool(burn::tensor::BoolStore::U32) => UIntKind::U32,
        _ => return None,
    };
    let client = qp.client.clone();
    let (units, capacity) = cube_for(&client, keys, d)?;
    let out = output(&qp, &[b, heads, rows, d]);
    attention_kernel::launch(
        &client,
        row_grid(&client, b * heads * rows),
        CubeDim::new_1d(units),
        qp.into_tensor_arg(),
        kp.into_tensor_arg(),
        vp.into_tensor_arg(),
        mp.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        scale,
        capacity,
        units,
        ElemType::UInt(store),
    );
    Some(tensor(out))
}

/// The number of keys of `k` (and `v`) when `q: [B, n, R, d]`, `k`, `v`: `[B, n, S, d]` are
/// non-empty and `S` is at most [`MAX_KEYS`].
fn keys_of(q: &BurnTensor<4>, k: &BurnTensor<4>, v: &BurnTensor<4>) -> Option<usize> {
    let [b, n, rows, d] = q.dims();
    let keys = k.dims()[2];
    let fits = k.dims() == [b, n, keys, d] && v.dims() == k.dims();
    (fits && keys > 0 && keys <= MAX_KEYS && b * n * rows * d > 0).then_some(keys)
}

/// The units of a cube for rows of `keys` scores over heads of `d` values, and the scores'
/// shared capacity (a power of two); `None` when the scores and the reduction's scratch do not
/// fit the shared memory the device gives a cube.
fn cube_for(client: &Client, keys: usize, d: usize) -> Option<(u32, usize)> {
    let units = row_units(client, keys.max(d));
    let capacity = keys.next_power_of_two();
    let shared = (capacity + units as usize) * std::mem::size_of::<f32>();
    (shared <= client.properties().hardware.max_shared_memory_size).then_some((units, capacity))
}

/// The scale-free softmax of `scores[0..keys]` (hidden keys hold [`LOWEST`]; `mx` this unit's
/// largest score) applied to the values, `v[vb + j·v2 + i·v3]` for key `j`, written to
/// `out[ob + i·o3]` for `i < d`: the weights `exp(s − max)` (0 for hidden keys) replace the
/// scores, the weighted values are summed in key order and divided by the weights' sum once.
/// Called by every unit of the cube together.
#[allow(clippy::too_many_arguments)]
#[cube]
fn weigh_values(
    scores: &mut Shared<[f32]>,
    red: &mut Shared<[f32]>,
    mx: f32,
    keys: usize,
    v: &Tensor<f32>,
    vb: usize,
    out: &mut Tensor<f32>,
    ob: usize,
) {
    let tid = UNIT_POS_X as usize;
    let nt = CUBE_DIM_X as usize;
    let lowest = f32::new(LOWEST);
    let m = block_max(red, mx);
    let mut acc = f32::new(0.0);
    let mut s = tid;
    while s < keys {
        let score = scores[s];
        let w = select(score <= lowest, f32::new(0.0), (score - m).exp());
        scores[s] = w;
        acc += w;
        s += nt;
    }
    // The sum's barriers also publish every unit's weights.
    let total = block_sum(red, acc);
    let (d, v2, v3) = (v.shape(3), v.stride(2), v.stride(3));
    let o3 = out.stride(3);
    let mut i = tid;
    while i < d {
        let mut y = f32::new(0.0);
        for j in 0..keys {
            y += scores[j] * v[vb + j * v2 + i * v3];
        }
        out[ob + i * o3] = y / total;
        i += nt;
    }
}

/// `q[qb + i·q3] · k[kb + s·k2 + i·k3]` over `i < d`, in the order of the head dimension.
#[cube]
fn dot(q: &Tensor<f32>, qb: usize, k: &Tensor<f32>, kb: usize, s: usize) -> f32 {
    let (q3, k2, k3) = (q.stride(3), k.stride(2), k.stride(3));
    let mut acc = f32::new(0.0);
    for i in 0..q.shape(3) {
        acc += q[qb + i * q3] * k[kb + s * k2 + i * k3];
    }
    acc
}

#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn attention_kernel<M: Int>(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    mask: &Tensor<M>,
    out: &mut Tensor<f32>,
    scale: f32,
    #[comptime] capacity: usize,
    #[comptime] units: u32,
    #[define(M)] _mask_store: ElemType,
) {
    let row = cube_row();
    let (heads, rows) = (out.shape(1), out.shape(2));
    if row >= out.shape(0) * heads * rows {
        terminate!();
    }
    let (batch, head, r) = unravel(row, heads, rows);
    let keys = k.shape(2);
    let mut scores = Shared::<[f32]>::new_slice(capacity);
    let mut red = Shared::<[f32]>::new_slice(units as usize);
    let lowest = f32::new(LOWEST);
    let (qb, kb) = (offset3(q, batch, head, r), offset3(k, batch, head, 0));
    let mb = offset3(mask, batch, 0, r);
    let m3 = mask.stride(3);

    // Scores, each unit whole dot products for its keys.
    let mut mx = lowest;
    let mut s = UNIT_POS_X as usize;
    while s < keys {
        let hidden = (u32::cast_from(mask[mb + s * m3]) & 1u32) == 1u32;
        let score = select(hidden, lowest, dot(q, qb, k, kb, s) * scale);
        scores[s] = score;
        mx = mx.max(score);
        s += CUBE_DIM_X as usize;
    }
    let (vb, ob) = (offset3(v, batch, head, 0), offset3(&*out, batch, head, r));
    weigh_values(&mut scores, &mut red, mx, keys, v, vb, out, ob);
}

/// Attention over a KV cache whose slots the device describes, for the queries of a call of `T`
/// tokens a row: `q: [B, K, g·T, d]` (row `j·T + t` of key/value head `h` is query head
/// `h·g + j` of token `t`), `k`, `v`: `[B, K, capacity, d]`, `flags: [B, capacity]` (1 where a
/// slot holds a real token) and `step` (`[1 + B·T]`, the call's first slot first). Token `t` sits
/// at slot `step[0] + t`; a real one sees the real slots up to its own, a padding one only its
/// own, the keys after it are not read. Returns `[B, T, H, d]` (`[B·T, H·d]` by a free
/// reshape, the layout of the output projection), in one launch; `None` as for [`attention`].
pub fn slot_attention(
    q: &BurnTensor<4>,
    k: &BurnTensor<4>,
    v: &BurnTensor<4>,
    flags: &BurnTensor<2>,
    step: &BurnTensor<1>,
    t: usize,
    scale: f32,
) -> Option<BurnTensor<4>> {
    let [b, kv, rows, d] = q.dims();
    let keys = keys_of(q, k, v)?;
    if t == 0 || !rows.is_multiple_of(t) || flags.dims() != [b, keys] || step.dims() != [1 + b * t]
    {
        return None;
    }
    let (qp, kp, vp) = (plain(q)?, plain(k)?, plain(v)?);
    let (fp, sp) = (plain(flags)?, plain(step)?);
    let client = qp.client.clone();
    let (units, capacity) = cube_for(&client, keys, d)?;
    let heads = kv * (rows / t);
    let out = output(&qp, &[b, t, heads, d]);
    slot_attention_kernel::launch(
        &client,
        row_grid(&client, b * kv * rows),
        CubeDim::new_1d(units),
        qp.into_tensor_arg(),
        kp.into_tensor_arg(),
        vp.into_tensor_arg(),
        fp.into_tensor_arg(),
        sp.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        scale,
        capacity,
        units,
    );
    Some(tensor(out))
}

#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn slot_attention_kernel(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    flags: &Tensor<f32>,
    step: &Tensor<f32>,
    out: &mut Tensor<f32>,
    scale: f32,
    #[comptime] capacity: usize,
    #[comptime] units: u32,
) {
    let row = cube_row();
    let (kv, rows) = (q.shape(1), q.shape(2));
    if row >= q.shape(0) * kv * rows {
        terminate!();
    }
    let (batch, h, r) = unravel(row, kv, rows);
    let slots = out.shape(1);
    let t = r % slots;
    let head = h * (rows / slots) + r / slots;
    let own = u32::cast_from(step[0]) as usize + t;
    let (f0, f1) = (batch * flags.stride(0), flags.stride(1));
    let real = flags[f0 + own * f1] > f32::new(0.5);
    let mut scores = Shared::<[f32]>::new_slice(capacity);
    let mut red = Shared::<[f32]>::new_slice(units as usize);
    let lowest = f32::new(LOWEST);
    let (qb, kb) = (offset3(q, batch, h, r), offset3(k, batch, h, 0));

    // Scores of the keys up to the query's own slot, each unit whole dot products.
    let keys = own + 1;
    let mut mx = lowest;
    let mut s = UNIT_POS_X as usize;
    while s < keys {
        let visible = select(real, flags[f0 + s * f1] > f32::new(0.5), s == own);
        let mut score = lowest;
        if visible {
            score = dot(q, qb, k, kb, s) * scale;
        }
        scores[s] = score;
        mx = mx.max(score);
        s += CUBE_DIM_X as usize;
    }
    let (vb, ob) = (offset3(v, batch, h, 0), offset3(&*out, batch, t, head));
    weigh_values(&mut scores, &mut red, mx, keys, v, vb, out, ob);
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    //! The kernels on the wgpu device (lavapipe in CI; `RLCR_WGPU_DEVICE` picks the adapter)
    //! against an f64 evaluation and the CPU's composite on the same values.
    use super::*;
    use burn::tensor::{Device, TensorData};

    /// Attention over a cache described by slot flags: two rows of three tokens at slots 5..8 of
    /// a 300-slot cache (more keys than a cube's units), query heads grouped two to a key/value
    /// head, flags with holes (padding slots) before and inside the call, one padding query;
    /// each output within 1e-5 of f64's softmax over the slots the rule makes visible (a real
    /// query: real slots up to its own; a padding one: its own), the slots after the query's
    /// own ignored whatever they hold.
    #[test]
    fn slot_attention_matches_f64() {
        let dev = super::super::test_device();
        let (b, kv, g, t, d, cap, start) = (2usize, 2usize, 2usize, 3usize, 8usize, 300usize, 5);
        let rows = g * t;
        let val = |k: usize, s: f32| (k as f32 * 0.731 + s).sin() * 2.0;
        let qs: Vec<f32> = (0..b * kv * rows * d).map(|k| val(k, 0.3)).collect();
        let ks: Vec<f32> = (0..b * kv * cap * d).map(|k| val(k, 1.1)).collect();
        let vs: Vec<f32> = (0..b * kv * cap * d).map(|k| val(k, 2.7)).collect();
        // Row 0: slot 2 is padding, the call's second token (slot 6) too; row 1: slot 0.
        let real = |bi: usize, s: usize| !matches!((bi, s), (0, 2) | (0, 6) | (1, 0));
        let flags: Vec<f32> = (0..b * cap)
            .map(|k| (k % cap < start + t && real(k / cap, k % cap)) as u8 as f32)
            .collect();
        let mut info = vec![start as f32];
        info.extend((0..b * t).map(|k| k as f32));
        let f32s = |v: &[f32], shape: [usize; 4]| {
            BurnTensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), &dev).reshape(shape)
        };
        let q = f32s(&qs, [b, kv, rows, d]);
        let (k, v) = (f32s(&ks, [b, kv, cap, d]), f32s(&vs, [b, kv, cap, d]));
        let fl = BurnTensor::<2>::from_data(TensorData::new(flags, [b, cap]), &dev);
        let step = BurnTensor::<1>::from_data(TensorData::new(info, [1 + b * t]), &dev);
        let scale = 1.0 / (d as f64).sqrt();
        let out = slot_attention(&q, &k, &v, &fl, &step, t, scale as f32).expect("runs on wgpu");
        assert_eq!(out.dims(), [b, t, kv * g, d]);
        let got = crate::model::read_f32(out).unwrap();
        for bi in 0..b {
            for h in 0..kv {
                for r in 0..rows {
                    let (j, ti) = (r / t, r % t);
                    let own = start + ti;
                    let visible: Vec<usize> = (0..=own)
                        .filter(|&s| if real(bi, own) { real(bi, s) } else { s == own })
                        .collect();
                    let at = |x: &[f32], s: usize, i: usize| x[((bi * kv + h) * cap + s) * d + i];
                    let qrow = |i: usize| qs[((bi * kv + h) * rows + r) * d + i] as f64;
                    let sc: Vec<f64> = visible
                        .iter()
                        .map(|&s| (0..d).map(|i| qrow(i) * at(&ks, s, i) as f64).sum::<f64>())
                        .map(|x| x * scale)
                        .collect();
                    let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                    let total: f64 = w.iter().sum();
                    for i in 0..d {
                        let exact: f64 = visible
                            .iter()
                            .zip(&w)
                            .map(|(&s, wi)| wi * at(&vs, s, i) as f64)
                            .sum::<f64>()
                            / total;
                        let o = ((bi * t + ti) * kv * g + h * g + j) * d + i;
                        let diff = (got[o] as f64 - exact).abs();
                        assert!(diff < 1e-5, "{bi} {h} {r} {i}: {} vs {exact}", got[o]);
                    }
                }
            }
        }
    }

    /// Strided queries (a head slice), more keys than a cube's units (300 > 256) and fewer,
    /// masks hiding some keys per row (never all); within 1e-5 of f64 and of the CPU.
    #[test]
    fn attention_kernel_matches_the_cpu() {
        let dev = super::super::test_device();
        let cpu = Device::flex();
        for (b, heads, rows, keys, d) in
            [(2usize, 2usize, 3usize, 300usize, 16usize), (1, 3, 5, 7, 8)]
        {
            let scale = 1.0 / (d as f64).sqrt();
            let val = |k: usize, s: f32| (k as f32 * 0.731 + s).sin() * 2.0;
            let qs: Vec<f32> = (0..b * (heads + 1) * rows * d)
                .map(|k| val(k, 0.3))
                .collect();
            let ks: Vec<f32> = (0..b * heads * keys * d).map(|k| val(k, 1.1)).collect();
            let vs: Vec<f32> = (0..b * heads * keys * d).map(|k| val(k, 2.7)).collect();
            // Row r of batch bi hides keys s with (s + r + bi) % 3 == 0, except its own slot.
            let ms: Vec<bool> = (0..b * rows * keys)
                .map(|k| {
                    let (bi, r, s) = (k / (rows * keys), (k / keys) % rows, k % keys);
                    (s + r + bi) % 3 == 0 && s != r
                })
                .collect();
            let on = |dv: &Device| {
                let q = BurnTensor::<4>::from_data(
                    TensorData::new(qs.clone(), [b, heads + 1, rows, d]),
                    dv,
                )
                .slice([0..b, 1..heads + 1, 0..rows, 0..d]);
                let k = BurnTensor::<4>::from_data(
                    TensorData::new(ks.clone(), [b, heads, keys, d]),
                    dv,
                );
                let v = BurnTensor::<4>::from_data(
                    TensorData::new(vs.clone(), [b, heads, keys, d]),
                    dv,
                );
                let m = BurnTensor::<4, Bool>::from_data(
                    TensorData::new(ms.clone(), [b, 1, rows, keys]),
                    dv,
                );
                (q, k, v, m)
            };
            let (q, k, v, m) = on(&dev);
            let got = crate::model::read_f32(
                attention(&q, &k, &v, &m, scale as f32).expect("the kernel runs on wgpu"),
            )
            .unwrap();
            let (q, k, v, m) = on(&cpu);
            let options = burn::tensor::ops::AttentionModuleOptions {
                scale: Some(scale),
                softcap: None,
                is_causal: false,
            };
            let want = crate::model::read_f32(crate::model::backend::composite_attention(
                q, k, v, &m, options, false,
            ))
            .unwrap();
            for bi in 0..b {
                for h in 0..heads {
                    for r in 0..rows {
                        let qrow: Vec<f64> = (0..d)
                            .map(|i| qs[((bi * (heads + 1) + h + 1) * rows + r) * d + i] as f64)
                            .collect();
                        let kv = |t: &[f32], s: usize, i: usize| {
                            t[((bi * heads + h) * keys + s) * d + i] as f64
                        };
                        let visible: Vec<usize> = (0..keys)
                            .filter(|&s| !ms[(bi * rows + r) * keys + s])
                            .collect();
                        let sc: Vec<f64> = visible
                            .iter()
                            .map(|&s| (0..d).map(|i| qrow[i] * kv(&ks, s, i)).sum::<f64>() * scale)
                            .collect();
                        let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        let w: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                        let total: f64 = w.iter().sum();
                        for i in 0..d {
                            let exact: f64 = visible
                                .iter()
                                .zip(&w)
                                .map(|(&s, wi)| wi * kv(&vs, s, i))
                                .sum::<f64>()
                                / total;
                            let at = ((bi * heads + h) * rows + r) * d + i;
                            assert!(
                                (got[at] as f64 - exact).abs() < 1e-5,
                                "[{b},{heads},{rows},{keys},{d}] {at}: {} vs {exact}",
                                got[at]
                            );
                            assert!(
                                (got[at] - want[at]).abs() < 1e-5,
                                "{at}: {} vs cpu {}",
                                got[at],
                                want[at]
                            );
                        }
                    }
                }
            }
        }
        // More keys than the kernel holds keep the composite.
        let big = MAX_KEYS + 1;
        let q = BurnTensor::<4>::from_data(TensorData::new(vec![0.5f32; 4], [1, 1, 1, 4]), &dev);
        let kv = BurnTensor::<4>::from_data(
            TensorData::new(vec![0.5f32; big * 4], [1, 1, big, 4]),
            &dev,
        );
        let m = BurnTensor::<4, Bool>::from_data(
            TensorData::new(vec![false; big], [1, 1, 1, big]),
            &dev,
        );
        assert!(attention(&q, &kv, &kv, &m, 0.5).is_none());
        // Autodiff tensors (training) keep the composite.
        let ad = dev.autodiff();
        let t = BurnTensor::<4>::from_data(TensorData::new(vec![1.0f32; 4], [1, 1, 1, 4]), &ad);
        let m = BurnTensor::<4, Bool>::from_data(TensorData::new(vec![false], [1, 1, 1, 1]), &ad);
        assert!(attention(&t, &t, &t, &m, 0.5).is_none());
    }
}
