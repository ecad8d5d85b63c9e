//! Masked attention as one `#[cube]` kernel: one cube per (batch, head, query row), its units
//! computing the row's scores over the keys (each unit whole dot products, into shared memory),
//! the softmax through tree reductions ([`super::block`]), then the weighted values (each unit a
//! share of the head dimension). In place of [`crate::model::backend::composite_attention`]'s
//! nine launches (and the split products' more on CUDA), on plain GPU tensors (sampling,
//! log-probs) and on autodiff tensors (training), where a `Backward` of its own takes two
//! launches in place of the dozen or more burn derives for the composite.
//!
//! The composite's formula in f32: scores `q·k · scale`, hidden keys excluded, `exp(s − max)`,
//! the weighted values summed in key order and divided by the weights' sum once (the composite
//! divides each weight first: the two differ by a rounding). The dot products are f32
//! multiply-adds in the order of the head dimension, never TF32. Rows of up to
//! [`MAX_KEYS`] keys, as far as the device's shared memory holds their scores (a power of two
//! of them); longer ones keep the composite.
//!
//! **Backward** with the upstream gradient `G = ∂L/∂O` and `P` the softmax weights (recomputed
//! from `q` and `k`; nothing but the inputs is kept from the forward pass):
//!
//! ```text
//! dP_ij = G_i · v_j        D_i = Σ_j P_ij · dP_ij        dS_ij = P_ij · (dP_ij − D_i)
//! ∂L/∂q_i = scale · Σ_j dS_ij · k_j                       (one cube per query row)
//! ∂L/∂k_j = scale · Σ_i dS_ij · q_i    ∂L/∂v_j = Σ_i P_ij · G_i   (one cube per key)
//! ```
//!
//! The first kernel writes `P` and `dS` (`[B, H, R, S]`, as large as the composite's scores);
//! hidden keys have `P = dS = 0`. Every sum runs in a fixed order, no atomics: the same inputs
//! give the same bits.
//!
//! Through a KV cache whose slots the device describes, [`slot_attention`] takes no mask: each
//! query's visible keys follow from the slots' validity flags and its own slot (read on the
//! device), the keys after its own are not read, and the output is written in the layout of the
//! output projection.
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::cubecl;
use burn::tensor::{Bool, DType, Tensor as BurnTensor};
use burn_cubecl::tensor::CubeTensor;
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
/// `[B, H, S, d]` and `mask: [B, 1, R, S]` (true = hidden), in one launch; on autodiff tensors
/// differentiable in `q`, `k` and `v` (two launches backward). `None` on the CPU, for other
/// dtypes or shapes, or more than [`MAX_KEYS`] keys (or than the device's shared memory holds).
pub fn attention(
    q: &BurnTensor<4>,
    k: &BurnTensor<4>,
    v: &BurnTensor<4>,
    mask: &BurnTensor<4, Bool>,
    scale: f32,
) -> Option<BurnTensor<4>> {
    let [b, _, rows, d] = q.dims();
    let keys = keys_of(q, k, v)?;
    if mask.dims() != [b, 1, rows, keys] || [q.dtype(), k.dtype(), v.dtype()] != [DType::F32; 3] {
        return None;
    }
    if let Ok(qa) = q.clone().try_into_primitive::<Autodiff<Cube>>() {
        let parts = |t: &BurnTensor<4>| t.clone().try_into_primitive::<Autodiff<Cube>>().ok();
        let (ka, va) = (parts(k)?, parts(v)?);
        let mp = mask.clone().try_into_primitive::<Autodiff<Cube>>().ok()?;
        let (qp, qn) = qa.into_parts();
        let (kp, kn) = ka.into_parts();
        let (vp, vn) = va.into_parts();
        let untile = burn_cubecl::kernel::untile;
        let inputs = Inputs::Separate(untile(qp), untile(kp), untile(vp));
        let s = AttentionState::new(inputs, mp, keys, d, scale)?;
        let out = s.forward();
        let out = match AttentionBackward
            .prepare::<NoCheckpointing>([qn, kn, vn])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(s, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        return Some(BurnTensor::<4>::from_primitive::<Autodiff<Cube>>(out));
    }
    let mp = mask.clone().try_into_primitive::<Cube>().ok()?;
    let inputs = Inputs::Separate(plain(q)?, plain(k)?, plain(v)?);
    Some(tensor(
        AttentionState::new(inputs, mp, keys, d, scale)?.forward(),
    ))
}

/// Attention over a call's own keys straight from its q/k/v product, `qkv: [B, T, H + 2K, d]`
/// (any strides: the `heads` query heads, then the K key heads, then the K value heads), with
/// RoPE (`cos = [c, c]`, `sin = [−s, s]`, `[B, 1, T, d]`) on the queries and keys and
/// `mask: [B, 1, g·T, T]` (row `j·T + t`: query head `h·g + j` of key/value head `h`, token
/// `t`): `[B, T, H, d]`, the layout of the output projection (`[B·T, H·d]` by a free reshape).
/// Two launches (RoPE with the values copied into one head-major tensor, then attention
/// reading q, k and v out of it), where RoPE, the split of q, k and v and [`attention`] take
/// four with the layout copies; on autodiff tensors three backward (attention's two, writing
/// the gradients of q, k and v into one tensor, and RoPE's), where the split takes about ten
/// more (each slice's backward a fill and a `slice_assign`, then the sums). `None` as for
/// [`attention`].
pub fn qkv_attention(
    qkv: &BurnTensor<4>,
    cos: &BurnTensor<4>,
    sin: &BurnTensor<4>,
    heads: usize,
    mask: &BurnTensor<4, Bool>,
    scale: f32,
) -> Option<BurnTensor<4>> {
    let [b, t, n, d] = qkv.dims();
    let kv = n.checked_sub(heads)? / 2;
    if kv == 0 || n != heads + 2 * kv || !heads.is_multiple_of(kv) || t == 0 || t > MAX_KEYS {
        return None;
    }
    if mask.dims() != [b, 1, heads / kv * t, t] || qkv.dtype() != DType::F32 {
        return None;
    }
    let x = qkv.clone().swap_dims(1, 2);
    if let Ok(xa) = qkv.clone().try_into_primitive::<Autodiff<Cube>>() {
        let mp = mask.clone().try_into_primitive::<Autodiff<Cube>>().ok()?;
        let client = xa.into_parts().0.client;
        cube_for(&client, t, d)?;
        let x = super::rope::rope_heads(&x, cos, sin, heads + kv)?;
        let (xp, node) = x.try_into_primitive::<Autodiff<Cube>>().ok()?.into_parts();
        let inputs = Inputs::Combined(burn_cubecl::kernel::untile(xp), heads);
        let s = AttentionState::new(inputs, mp, t, d, scale)?;
        let out = s.forward();
        let out = match QkvAttentionBackward
            .prepare::<NoCheckpointing>([node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(s, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        return Some(BurnTensor::<4>::from_primitive::<Autodiff<Cube>>(out));
    }
    let mp = mask.clone().try_into_primitive::<Cube>().ok()?;
    cube_for(&plain(qkv)?.client, t, d)?;
    let x = plain(&super::rope::rope_heads(&x, cos, sin, heads + kv)?)?;
    let s = AttentionState::new(Inputs::Combined(x, heads), mp, t, d, scale)?;
    Some(tensor(s.forward()))
}

/// The mask's primitive laid out in rows and how it stores a bool: burn's GPU backends store
/// bools as u8 or u32 (the lowest bit is the value).
fn mask_store(mp: CubeTensor) -> Option<(CubeTensor, UIntKind)> {
    let mp = burn_cubecl::kernel::untile(mp);
    let store = match mp.dtype {
        DType::Bool(burn::tensor::BoolStore::U8) => UIntKind::U8,
        DType::Bool(burn::tensor::BoolStore::U32) => UIntKind::U32,
        _ => return None,
    };
    Some((mp, store))
}

/// Where an attention call's queries, keys and values lie (primitives, rows in any strides).
// One per attention call, moved into the backward pass's state: the size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Inputs {
    /// `q: [B, K, g·T, d]`, `k`, `v`: `[B, K, S, d]`; the output is `[B, K, g·T, d]`.
    Separate(CubeTensor, CubeTensor, CubeTensor),
    /// One `[B, H + 2K, T, d]` tensor, its first `H` heads the queries (query head `h·g + j`
    /// of key/value head `h`), then the keys, then the values; the output is `[B, T, H, d]`.
    Combined(CubeTensor, usize),
}

/// An attention call's inputs, mask and launch shape; what the backward pass keeps (the inputs
/// are alive in the graph anyway).
#[derive(Debug, Clone)]
struct AttentionState {
    inputs: Inputs,
    mask: CubeTensor,
    store: UIntKind,
    scale: f32,
    units: u32,
    capacity: usize,
}

impl AttentionState {
    /// `None` when the mask is not a bool tensor of the GPU backends or a row of `keys` scores
    /// does not fit a cube ([`cube_for`]).
    fn new(inputs: Inputs, mask: CubeTensor, keys: usize, d: usize, scale: f32) -> Option<Self> {
        let (mask, store) = mask_store(mask)?;
        let (units, capacity) = cube_for(&mask.client, keys, d)?;
        Some(AttentionState {
            inputs,
            mask,
            store,
            scale,
            units,
            capacity,
        })
    }

    /// `(B, K, g·T or R, S, d)`: batch, key/value heads, query rows per key/value head, keys
    /// and the head dimension.
    fn dims(&self) -> (usize, usize, usize, usize, usize) {
        match &self.inputs {
            Inputs::Separate(q, k, _) => {
                let (qs, ks) = (q.meta.shape(), k.meta.shape());
                (qs[0], qs[1], qs[2], ks[2], qs[3])
            }
            Inputs::Combined(x, heads) => {
                let s = x.meta.shape();
                let kv = (s[1] - heads) / 2;
                (s[0], kv, heads / kv * s[2], s[2], s[3])
            }
        }
    }

    /// The attention's output: one launch.
    fn forward(&self) -> CubeTensor {
        let (b, kv, rows, _, d) = self.dims();
        let client = self.mask.client.clone();
        let (grid, cube) = (
            row_grid(&client, b * kv * rows),
            CubeDim::new_1d(self.units),
        );
        let (mask, store) = (
            self.mask.clone().into_tensor_arg(),
            ElemType::UInt(self.store),
        );
        let (scale, capacity, units) = (self.scale, self.capacity, self.units);
        match &self.inputs {
            Inputs::Separate(q, k, v) => {
                let out = output(q, &[b, kv, rows, d]);
                attention_kernel::launch(
                    &client,
                    grid,
                    cube,
                    q.clone().into_tensor_arg(),
                    k.clone().into_tensor_arg(),
                    v.clone().into_tensor_arg(),
                    mask,
                    out.clone().into_tensor_arg(),
                    scale,
                    capacity,
                    units,
                    store,
                );
                out
            }
            Inputs::Combined(x, heads) => {
                let out = output(x, &[b, x.meta.shape()[2], *heads, d]);
                qkv_attention_kernel::launch(
                    &client,
                    grid,
                    cube,
                    x.clone().into_tensor_arg(),
                    mask,
                    out.clone().into_tensor_arg(),
                    *heads,
                    scale,
                    capacity,
                    units,
                    store,
                );
                out
            }
        }
    }

    /// The gradients of the inputs for the upstream gradient `g`, in the order of
    /// [`Inputs`]'s tensors: two launches (the module documentation's formulas).
    fn backward(&self, g: &CubeTensor) -> Vec<CubeTensor> {
        let (b, kv, rows, keys, d) = self.dims();
        let client = g.client.clone();
        let p = output(g, &[b, kv, rows, keys]);
        let ds = output(g, &[b, kv, rows, keys]);
        let (row_cubes, cube) = (
            row_grid(&client, b * kv * rows),
            CubeDim::new_1d(self.units),
        );
        let (key_cubes, key_cube) = (
            row_grid(&client, b * kv * keys),
            CubeDim::new_1d(row_units(&client, d)),
        );
        let (mask, store) = (
            self.mask.clone().into_tensor_arg(),
            ElemType::UInt(self.store),
        );
        let (scale, capacity, units) = (self.scale, self.capacity, self.units);
        match &self.inputs {
            Inputs::Separate(q, k, v) => {
                let dq = output(g, &[b, kv, rows, d]);
                attention_rows_backward_kernel::launch(
                    &client,
                    row_cubes,
                    cube,
                    q.clone().into_tensor_arg(),
                    k.clone().into_tensor_arg(),
                    v.clone().into_tensor_arg(),
                    mask,
                    g.clone().into_tensor_arg(),
                    p.clone().into_tensor_arg(),
                    ds.clone().into_tensor_arg(),
                    dq.clone().into_tensor_arg(),
                    scale,
                    capacity,
                    units,
                    store,
                );
                let dk = output(g, &[b, kv, keys, d]);
                let dv = output(g, &[b, kv, keys, d]);
                attention_keys_backward_kernel::launch(
                    &client,
                    key_cubes,
                    key_cube,
                    q.clone().into_tensor_arg(),
                    g.clone().into_tensor_arg(),
                    p.into_tensor_arg(),
                    ds.into_tensor_arg(),
                    dk.clone().into_tensor_arg(),
                    dv.clone().into_tensor_arg(),
                    scale,
                );
                vec![dq, dk, dv]
            }
            Inputs::Combined(x, heads) => {
                let dx = output(g, &x.meta.shape().to_vec());
                qkv_attention_rows_backward_kernel::launch(
                    &client,
                    row_cubes,
                    cube,
                    x.clone().into_tensor_arg(),
                    mask,
                    g.clone().into_tensor_arg(),
                    p.clone().into_tensor_arg(),
                    ds.clone().into_tensor_arg(),
                    dx.clone().into_tensor_arg(),
                    *heads,
                    scale,
                    capacity,
                    units,
                    store,
                );
                qkv_attention_keys_backward_kernel::launch(
                    &client,
                    key_cubes,
                    key_cube,
                    x.clone().into_tensor_arg(),
                    g.clone().into_tensor_arg(),
                    p.into_tensor_arg(),
                    ds.into_tensor_arg(),
                    dx.clone().into_tensor_arg(),
                    *heads,
                    scale,
                );
                vec![dx]
            }
        }
    }
}

#[derive(Debug)]
struct AttentionBackward;

impl Backward<Cube, 3> for AttentionBackward {
    type State = AttentionState;

    fn backward(self, ops: Ops<AttentionState, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = burn_cubecl::kernel::untile(grads.consume::<Cube>(&ops.node));
        let dx = ops.state.backward(&g);
        for (node, grad) in ops.parents.into_iter().zip(dx) {
            if let Some(node) = node {
                grads.register::<Cube>(node.id, grad);
            }
        }
    }
}

#[derive(Debug)]
struct QkvAttentionBackward;

impl Backward<Cube, 1> for QkvAttentionBackward {
    type State = AttentionState;

    fn backward(self, ops: Ops<AttentionState, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = burn_cubecl::kernel::untile(grads.consume::<Cube>(&ops.node));
        let [parent] = ops.parents;
        if let (Some(node), Some(dx)) = (parent, ops.state.backward(&g).pop()) {
            grads.register::<Cube>(node.id, dx);
        }
    }
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
    let m = block_max(red, mx);
    let total = softmax_weights(scores, red, m, keys);
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

/// The weights `exp(s − m)` (0 for hidden keys) in place of `scores[0..keys]`, each unit its
/// own keys; returns their sum to every unit (whose barriers also publish every unit's
/// weights).
#[cube]
fn softmax_weights(
    scores: &mut Shared<[f32]>,
    red: &mut Shared<[f32]>,
    m: f32,
    keys: usize,
) -> f32 {
    let lowest = f32::new(LOWEST);
    let mut acc = f32::new(0.0);
    let mut s = UNIT_POS_X as usize;
    while s < keys {
        let score = scores[s];
        let w = select(score <= lowest, f32::new(0.0), (score - m).exp());
        scores[s] = w;
        acc += w;
        s += CUBE_DIM_X as usize;
    }
    block_sum(red, acc)
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

/// The scores of the query at `q[qb..]` over the `keys` keys at `k[kb + s·k2..]` into `scores`,
/// the ones the mask row at `mask[mb..]` hides [`LOWEST`] (each unit whole dot products for its
/// keys); returns this unit's largest.
#[allow(clippy::too_many_arguments)]
#[cube]
fn row_scores<M: Int>(
    scores: &mut Shared<[f32]>,
    q: &Tensor<f32>,
    qb: usize,
    k: &Tensor<f32>,
    kb: usize,
    keys: usize,
    mask: &Tensor<M>,
    mb: usize,
    scale: f32,
) -> f32 {
    let lowest = f32::new(LOWEST);
    let m3 = mask.stride(3);
    let mut mx = lowest;
    let mut s = UNIT_POS_X as usize;
    while s < keys {
        let hidden = (u32::cast_from(mask[mb + s * m3]) & 1u32) == 1u32;
        let score = select(hidden, lowest, dot(q, qb, k, kb, s) * scale);
        scores[s] = score;
        mx = mx.max(score);
        s += CUBE_DIM_X as usize;
    }
    mx
}

/// Where one query row of a [`Inputs::Combined`] tensor `x` (`[B, H + 2K, T, d]`, `heads` = H)
/// and its key/value heads lie, for the cube of row `row` of the `[B, K, g·T]` grid:
/// `(batch, key/value head, row r = j·T + t, query head h·g + j, token t, q's offset, k's, v's)`.
#[cube]
fn combined_row(
    x: &Tensor<f32>,
    heads: usize,
    row: usize,
) -> (usize, usize, usize, usize, usize, usize, usize, usize) {
    let (slots, kv) = (x.shape(2), (x.shape(1) - heads) / 2);
    let group = heads / kv;
    let (batch, h, r) = unravel(row, kv, group * slots);
    let (qh, t) = (h * group + r / slots, r % slots);
    let qb = offset3(x, batch, qh, t);
    let kb = offset3(x, batch, heads + h, 0);
    let vb = offset3(x, batch, heads + kv + h, 0);
    (batch, h, r, qh, t, qb, kb, vb)
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
    let mut scores = Shared::<[f32]>::new_slice(capacity);
    let mut red = Shared::<[f32]>::new_slice(units as usize);
    let (qb, kb, vb) = (
        offset3(q, batch, head, r),
        offset3(k, batch, head, 0),
        offset3(v, batch, head, 0),
    );
    let mb = offset3(mask, batch, 0, r);
    let keys = k.shape(2);
    let mx = row_scores(&mut scores, q, qb, k, kb, keys, mask, mb, scale);
    let ob = offset3(&*out, batch, head, r);
    weigh_values(&mut scores, &mut red, mx, keys, v, vb, out, ob);
}

/// [`attention_kernel`] on a [`Inputs::Combined`] tensor, the output `[B, T, H, d]`.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn qkv_attention_kernel<M: Int>(
    x: &Tensor<f32>,
    mask: &Tensor<M>,
    out: &mut Tensor<f32>,
    heads: usize,
    scale: f32,
    #[comptime] capacity: usize,
    #[comptime] units: u32,
    #[define(M)] _mask_store: ElemType,
) {
    let row = cube_row();
    let slots = x.shape(2);
    if row >= x.shape(0) * heads * slots {
        terminate!();
    }
    let (batch, _h, r, qh, t, qb, kb, vb) = combined_row(x, heads, row);
    let mut scores = Shared::<[f32]>::new_slice(capacity);
    let mut red = Shared::<[f32]>::new_slice(units as usize);
    let mb = offset3(mask, batch, 0, r);
    let mx = row_scores(&mut scores, x, qb, x, kb, slots, mask, mb, scale);
    let ob = offset3(&*out, batch, t, qh);
    weigh_values(&mut scores, &mut red, mx, slots, x, vb, out, ob);
}

/// The backward pass's first half for the query at `q[qb..]` (keys at `k[kb..]`, values at
/// `v[vb..]`, its mask row at `mask[mb..]`, its upstream gradient at `g[gb..]`): the row's
/// weights `P` and `dS` written at `p[pb..]` and `ds[db..]` (along their last axis) and
/// `∂L/∂q` at `dq[qo..]` (module documentation). Called by every unit of the cube together.
#[allow(clippy::too_many_arguments)]
#[cube]
fn row_backward<M: Int>(
    q: &Tensor<f32>,
    qb: usize,
    k: &Tensor<f32>,
    kb: usize,
    v: &Tensor<f32>,
    vb: usize,
    keys: usize,
    mask: &Tensor<M>,
    mb: usize,
    g: &Tensor<f32>,
    gb: usize,
    p: &mut Tensor<f32>,
    pb: usize,
    ds: &mut Tensor<f32>,
    db: usize,
    dq: &mut Tensor<f32>,
    qo: usize,
    scale: f32,
    #[comptime] capacity: usize,
    #[comptime] units: u32,
) {
    let tid = UNIT_POS_X as usize;
    let nt = CUBE_DIM_X as usize;
    let mut scores = Shared::<[f32]>::new_slice(capacity);
    let mut red = Shared::<[f32]>::new_slice(units as usize);
    let mx = row_scores(&mut scores, q, qb, k, kb, keys, mask, mb, scale);
    let m = block_max(&mut red, mx);
    let total = softmax_weights(&mut scores, &mut red, m, keys);

    // P and dP = G·v per key (each unit its own keys: it reads back only what it wrote), and
    // D = Σ P·dP over the row.
    let (p3, d3) = (p.stride(3), ds.stride(3));
    let mut dacc = f32::new(0.0);
    let mut s = tid;
    while s < keys {
        let pj = scores[s] / total;
        let dp = dot(g, gb, v, vb, s);
        p[pb + s * p3] = pj;
        ds[db + s * d3] = dp;
        scores[s] = pj;
        dacc += pj * dp;
        s += nt;
    }
    let delta = block_sum(&mut red, dacc);
    s = tid;
    while s < keys {
        let dsj = scores[s] * (ds[db + s * d3] - delta);
        ds[db + s * d3] = dsj;
        scores[s] = dsj;
        s += nt;
    }
    sync_cube();

    // ∂L/∂q: each unit a share of the head dimension, keys in order.
    let (k2, k3, q3) = (k.stride(2), k.stride(3), dq.stride(3));
    let mut i = tid;
    while i < q.shape(3) {
        let mut y = f32::new(0.0);
        for j in 0..keys {
            y += scores[j] * k[kb + j * k2 + i * k3];
        }
        dq[qo + i * q3] = y * scale;
        i += nt;
    }
}

/// The backward pass's first half, one cube per query row ([`row_backward`]).
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn attention_rows_backward_kernel<M: Int>(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    mask: &Tensor<M>,
    g: &Tensor<f32>,
    p: &mut Tensor<f32>,
    ds: &mut Tensor<f32>,
    dq: &mut Tensor<f32>,
    scale: f32,
    #[comptime] capacity: usize,
    #[comptime] units: u32,
    #[define(M)] _mask_store: ElemType,
) {
    let row = cube_row();
    let (heads, rows) = (q.shape(1), q.shape(2));
    if row >= q.shape(0) * heads * rows {
        terminate!();
    }
    let (batch, head, r) = unravel(row, heads, rows);
    let (qb, kb, vb) = (
        offset3(q, batch, head, r),
        offset3(k, batch, head, 0),
        offset3(v, batch, head, 0),
    );
    let (mb, gb) = (offset3(mask, batch, 0, r), offset3(g, batch, head, r));
    let (pb, db) = (offset3(&*p, batch, head, r), offset3(&*ds, batch, head, r));
    let qo = offset3(&*dq, batch, head, r);
    let keys = k.shape(2);
    row_backward(
        q, qb, k, kb, v, vb, keys, mask, mb, g, gb, p, pb, ds, db, dq, qo, scale, capacity, units,
    );
}

/// [`attention_rows_backward_kernel`] on a [`Inputs::Combined`] tensor: `∂L/∂q` into the query
/// heads of `dx` (`[B, H + 2K, T, d]`), the upstream gradient `[B, T, H, d]`.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn qkv_attention_rows_backward_kernel<M: Int>(
    x: &Tensor<f32>,
    mask: &Tensor<M>,
    g: &Tensor<f32>,
    p: &mut Tensor<f32>,
    ds: &mut Tensor<f32>,
    dx: &mut Tensor<f32>,
    heads: usize,
    scale: f32,
    #[comptime] capacity: usize,
    #[comptime] units: u32,
    #[define(M)] _mask_store: ElemType,
) {
    let row = cube_row();
    let slots = x.shape(2);
    if row >= x.shape(0) * heads * slots {
        terminate!();
    }
    let (batch, h, r, qh, t, qb, kb, vb) = combined_row(x, heads, row);
    let (mb, gb) = (offset3(mask, batch, 0, r), offset3(g, batch, t, qh));
    let (pb, db) = (offset3(&*p, batch, h, r), offset3(&*ds, batch, h, r));
    let qo = offset3(&*dx, batch, qh, t);
    row_backward(
        x, qb, x, kb, x, vb, slots, mask, mb, g, gb, p, pb, ds, db, dx, qo, scale, capacity, units,
    );
}

/// `(∂L/∂k_j, ∂L/∂v_j)` at element `i` of the head dimension: the query rows `j'·T + t`
/// (`j' < group`, `t < slots`) of `q` at `qb + j'·qh + t·qr` and of the upstream gradient at
/// `gb + j'·gh + t·gr` summed in row order, with the key's column of `P` and `dS` at
/// `p[pb + r·p2]`, `ds[db + r·d2]`.
#[allow(clippy::too_many_arguments)]
#[cube]
fn key_grads(
    q: &Tensor<f32>,
    qs: (usize, usize, usize),
    g: &Tensor<f32>,
    gs: (usize, usize, usize),
    rows: (usize, usize),
    p: &Tensor<f32>,
    ps: (usize, usize),
    ds: &Tensor<f32>,
    dss: (usize, usize),
    i: usize,
    scale: f32,
) -> (f32, f32) {
    let (qb, qh, qr) = qs;
    let (gb, gh, gr) = gs;
    let (group, slots) = rows;
    let (pb, p2) = ps;
    let (db, d2) = dss;
    let (q3, g3) = (q.stride(3), g.stride(3));
    let mut a = f32::new(0.0);
    let mut c = f32::new(0.0);
    for j in 0..group {
        for t in 0..slots {
            let r = j * slots + t;
            a += ds[db + r * d2] * q[qb + j * qh + t * qr + i * q3];
            c += p[pb + r * p2] * g[gb + j * gh + t * gr + i * g3];
        }
    }
    (a * scale, c)
}

/// The backward pass's second half, one cube per key `j`: `∂L/∂k_j` and `∂L/∂v_j` summed over
/// the query rows in order ([`key_grads`]), each unit a share of the head dimension.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn attention_keys_backward_kernel(
    q: &Tensor<f32>,
    g: &Tensor<f32>,
    p: &Tensor<f32>,
    ds: &Tensor<f32>,
    dk: &mut Tensor<f32>,
    dv: &mut Tensor<f32>,
    scale: f32,
) {
    let row = cube_row();
    let (heads, keys) = (dk.shape(1), dk.shape(2));
    if row >= dk.shape(0) * heads * keys {
        terminate!();
    }
    let (batch, head, j) = unravel(row, heads, keys);
    let qs = (offset3(q, batch, head, 0), 0usize, q.stride(2));
    let gs = (offset3(g, batch, head, 0), 0usize, g.stride(2));
    let ps = (offset3(p, batch, head, 0) + j * p.stride(3), p.stride(2));
    let dss = (offset3(ds, batch, head, 0) + j * ds.stride(3), ds.stride(2));
    let (kb, k3) = (offset3(&*dk, batch, head, j), dk.stride(3));
    let (vb, v3) = (offset3(&*dv, batch, head, j), dv.stride(3));
    let mut i = UNIT_POS_X as usize;
    while i < q.shape(3) {
        let (a, c) = key_grads(q, qs, g, gs, (1usize, q.shape(2)), p, ps, ds, dss, i, scale);
        dk[kb + i * k3] = a;
        dv[vb + i * v3] = c;
        i += CUBE_DIM_X as usize;
    }
}

/// [`attention_keys_backward_kernel`] on a [`Inputs::Combined`] tensor: `∂L/∂k` and `∂L/∂v`
/// into the key and value heads of `dx`, the upstream gradient `[B, T, H, d]`.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn qkv_attention_keys_backward_kernel(
    x: &Tensor<f32>,
    g: &Tensor<f32>,
    p: &Tensor<f32>,
    ds: &Tensor<f32>,
    dx: &mut Tensor<f32>,
    heads: usize,
    scale: f32,
) {
    let row = cube_row();
    let (slots, kv) = (x.shape(2), (x.shape(1) - heads) / 2);
    if row >= x.shape(0) * kv * slots {
        terminate!();
    }
    let group = heads / kv;
    let (batch, h, j) = unravel(row, kv, slots);
    let qs = (offset3(x, batch, h * group, 0), x.stride(1), x.stride(2));
    let gs = (offset3(g, batch, 0, h * group), g.stride(2), g.stride(1));
    let ps = (offset3(p, batch, h, 0) + j * p.stride(3), p.stride(2));
    let dss = (offset3(ds, batch, h, 0) + j * ds.stride(3), ds.stride(2));
    let kb = offset3(&*dx, batch, heads + h, j);
    let vb = offset3(&*dx, batch, heads + kv + h, j);
    let x3 = dx.stride(3);
    let mut i = UNIT_POS_X as usize;
    while i < x.shape(3) {
        let (a, c) = key_grads(x, qs, g, gs, (group, slots), p, ps, ds, dss, i, scale);
        dx[kb + i * x3] = a;
        dx[vb + i * x3] = c;
        i += CUBE_DIM_X as usize;
    }
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
    }

    /// `(y, ∂L/∂q, ∂L/∂k, ∂L/∂v, launches forward, launches backward)` of `L = Σ y·c` on the
    /// autodiff wgpu device, `q` a head slice of a wider tensor; `fused`: [`attention`], else
    /// the composite ([`crate::model::backend::composite_attention`]).
    #[allow(clippy::type_complexity)]
    fn train(
        (qs, ks, vs, ms, cs): (&[f32], &[f32], &[f32], &[bool], &[f32]),
        [b, heads, rows, keys, d]: [usize; 5],
        fused: bool,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, u64, u64) {
        let ad = super::super::test_device().autodiff();
        let wide =
            BurnTensor::<4>::from_data(TensorData::new(qs.to_vec(), [b, heads + 1, rows, d]), &ad)
                .require_grad();
        let k = BurnTensor::<4>::from_data(TensorData::new(ks.to_vec(), [b, heads, keys, d]), &ad)
            .require_grad();
        let v = BurnTensor::<4>::from_data(TensorData::new(vs.to_vec(), [b, heads, keys, d]), &ad)
            .require_grad();
        let m =
            BurnTensor::<4, Bool>::from_data(TensorData::new(ms.to_vec(), [b, 1, rows, keys]), &ad);
        let c = BurnTensor::<4>::from_data(TensorData::new(cs.to_vec(), [b, heads, rows, d]), &ad);
        let q = wide.clone().slice([0..b, 1..heads + 1, 0..rows, 0..d]);
        let scale = 1.0 / (d as f64).sqrt();
        let run = || match fused {
            true => attention(&q, &k, &v, &m, scale as f32).expect("runs on autodiff wgpu"),
            false => {
                let options = burn::tensor::ops::AttentionModuleOptions {
                    scale: Some(scale),
                    softcap: None,
                    is_causal: false,
                };
                crate::model::backend::composite_attention(
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    &m,
                    options,
                    false,
                )
            }
        };
        let (y, grads, fwd, bwd) = super::super::loss_backward(run, c);
        let read = |t: BurnTensor<4>| crate::model::read_f32(t).unwrap();
        let dwide = read(wide.grad(&grads).unwrap());
        let dq = (0..b * heads)
            .flat_map(|bh| {
                let at = ((bh / heads) * (heads + 1) + bh % heads + 1) * rows * d;
                dwide[at..at + rows * d].to_vec()
            })
            .collect();
        let (dk, dv) = (read(k.grad(&grads).unwrap()), read(v.grad(&grads).unwrap()));
        (read(y), dq, dk, dv, fwd, bwd)
    }

    /// Training's attention (autodiff tensors, a strided `q`, more keys than a cube's units and
    /// fewer, masks hiding some keys, a row that sees only itself) against float64 (`y`, `∂L/∂q`,
    /// `∂L/∂k`, `∂L/∂v` within 1e-5 of each one's largest value, from the module
    /// documentation's formulas) and against burn's derived backward of the composite (the
    /// same bound); one launch forward, two backward where the composite takes nine and more.
    /// Twice the same inputs: the same bits (no atomics).
    #[test]
    fn training_attention_matches_float64_and_the_composite() {
        let _pool = crate::model::memory::pool_test_lock();
        for dims in [[2usize, 2, 3, 300, 16], [1, 3, 5, 7, 8]] {
            let [b, heads, rows, keys, d] = dims;
            let scale = 1.0 / (d as f64).sqrt();
            let val = |k: usize, s: f32| (k as f32 * 0.731 + s).sin() * 2.0;
            let qs: Vec<f32> = (0..b * (heads + 1) * rows * d)
                .map(|k| val(k, 0.3))
                .collect();
            let ks: Vec<f32> = (0..b * heads * keys * d).map(|k| val(k, 1.1)).collect();
            let vs: Vec<f32> = (0..b * heads * keys * d).map(|k| val(k, 2.7)).collect();
            let cs: Vec<f32> = (0..b * heads * rows * d).map(|k| val(k, 0.9)).collect();
            // Row r of batch bi hides keys s with (s + r + bi) % 3 == 0 except its own slot;
            // the last row of the last batch sees only its own slot.
            let ms: Vec<bool> = (0..b * rows * keys)
                .map(|k| {
                    let (bi, r, s) = (k / (rows * keys), (k / keys) % rows, k % keys);
                    let alone = bi == b - 1 && r == rows - 1;
                    s != r && (alone || (s + r + bi) % 3 == 0)
                })
                .collect();
            let inputs = (&qs[..], &ks[..], &vs[..], &ms[..], &cs[..]);
            let (y, dq, dk, dv, fwd, bwd) = train(inputs, dims, true);
            let (cy, cdq, cdk, cdv, cfwd, cbwd) = train(inputs, dims, false);
            // float64
            let (mut ey, mut edq) = (vec![0f64; y.len()], vec![0f64; y.len()]);
            let (mut edk, mut edv) = (vec![0f64; dk.len()], vec![0f64; dv.len()]);
            for bi in 0..b {
                for h in 0..heads {
                    let kv = |t: &[f32], s: usize, i: usize| {
                        t[((bi * heads + h) * keys + s) * d + i] as f64
                    };
                    for r in 0..rows {
                        let qrow: Vec<f64> = (0..d)
                            .map(|i| qs[((bi * (heads + 1) + h + 1) * rows + r) * d + i] as f64)
                            .collect();
                        let o = ((bi * heads + h) * rows + r) * d;
                        let grow: Vec<f64> = (0..d).map(|i| cs[o + i] as f64).collect();
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
                        let p: Vec<f64> = w.iter().map(|x| x / total).collect();
                        let dp: Vec<f64> = visible
                            .iter()
                            .map(|&s| (0..d).map(|i| grow[i] * kv(&vs, s, i)).sum::<f64>())
                            .collect();
                        let delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                        for (n, &s) in visible.iter().enumerate() {
                            let ds = p[n] * (dp[n] - delta);
                            let kb = ((bi * heads + h) * keys + s) * d;
                            for i in 0..d {
                                ey[o + i] += p[n] * kv(&vs, s, i);
                                edq[o + i] += scale * ds * kv(&ks, s, i);
                                edk[kb + i] += scale * ds * qrow[i];
                                edv[kb + i] += p[n] * grow[i];
                            }
                        }
                    }
                }
            }
            let near = |got: &[f32], want: &[f64], what: &str| {
                let size = want.iter().fold(0f64, |a, b| a.max(b.abs()));
                for (k, (&a, &b)) in got.iter().zip(want).enumerate() {
                    assert!(
                        (a as f64 - b).abs() <= 1e-5 * size,
                        "{dims:?} {what}[{k}]: {a} vs {b} (largest {size})"
                    );
                }
            };
            let wide = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
            for (got, exact, composite, what) in [
                (&y, &ey, &cy, "y"),
                (&dq, &edq, &cdq, "dq"),
                (&dk, &edk, &cdk, "dk"),
                (&dv, &edv, &cdv, "dv"),
            ] {
                near(got, exact, what);
                near(got, &wide(composite), what);
            }
            eprintln!(
                "{dims:?} launches forward / backward (with the loss's): \
                 kernel {fwd} / {bwd}, composite {cfwd} / {cbwd}"
            );
            assert_eq!(fwd, 1, "one launch forward");
            // The loss's own backward (the product with c and the sum) is in both counts.
            assert!(bwd + 8 <= cbwd, "backward {bwd} vs the composite's {cbwd}");
            let again = train(inputs, dims, true);
            assert_eq!(
                (again.0, again.1, again.2, again.3),
                (y, dq, dk, dv),
                "the same bits again"
            );
        }
    }

    /// Attention from the q/k/v product ([`qkv_attention`]: RoPE on q and k, then attention
    /// over the head-major tensor) against the path it replaces, burn's composites for RoPE
    /// and attention after the split, on the same values: a strided `[B, T, H + 2K, d]`
    /// product (query heads grouped three to a key/value head), a causal mask with a padding
    /// token (which sees only itself); the output (`[B, T, H, d]`) and, on autodiff tensors,
    /// `∂L/∂qkv` within 1e-5 of each one's largest value. Two launches forward, three backward
    /// with the loss's own; the same bits twice.
    #[test]
    fn qkv_attention_matches_the_split_path() {
        let _pool = crate::model::memory::pool_test_lock();
        let (b, t, heads, kv, d) = (2usize, 5usize, 6usize, 2usize, 8usize);
        let (n, g) = (heads + 2 * kv, heads / kv);
        let val = |k: usize, s: f32| (k as f32 * 0.731 + s).sin() * 2.0;
        let xs: Vec<f32> = (0..b * t * (n + 1) * d).map(|k| val(k, 0.3)).collect();
        let cs: Vec<f32> = (0..b * t * heads * d).map(|k| val(k, 0.9)).collect();
        // Tables in the GPU layout: cos = [c, c], sin = [−s, s] per position.
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for _ in 0..b {
            for p in 0..t {
                let ang: Vec<f64> = (0..d / 2)
                    .map(|i| p as f64 / 10000f64.powf(2.0 * i as f64 / d as f64))
                    .collect();
                let c: Vec<f32> = ang.iter().map(|a| a.cos() as f32).collect();
                let s: Vec<f32> = ang.iter().map(|a| a.sin() as f32).collect();
                cos.extend(c.iter().chain(&c));
                sin.extend(s.iter().map(|v| -v).chain(s.iter().copied()));
            }
        }
        // Causal; token 3 of row 1 is padding (it sees itself, and nobody sees it).
        let pad = |bi: usize, k: usize| bi == 1 && k == 3;
        let ms: Vec<bool> = (0..b * g * t * t)
            .map(|k| {
                let (bi, r, s) = (k / (g * t * t), (k / t) % (g * t), k % t);
                let q = r % t;
                if pad(bi, q) {
                    s != q
                } else {
                    s > q || pad(bi, s)
                }
            })
            .collect();
        let run = |ad: bool, fused: bool| {
            let base = super::super::test_device();
            let dev = if ad { base.autodiff() } else { base };
            let mut wide =
                BurnTensor::<4>::from_data(TensorData::new(xs.clone(), [b, t, n + 1, d]), &dev);
            if ad {
                wide = wide.require_grad();
            }
            let qkv = wide.clone().slice([0..b, 0..t, 1..n + 1, 0..d]);
            let table = |v: &[f32]| {
                BurnTensor::<4>::from_data(TensorData::new(v.to_vec(), [b, 1, t, d]), &dev)
            };
            let (ct, st) = (table(&cos), table(&sin));
            let m = BurnTensor::<4, Bool>::from_data(
                TensorData::new(ms.clone(), [b, 1, g * t, t]),
                &dev,
            );
            let scale = 1.0 / (d as f64).sqrt();
            let f = || match fused {
                true => {
                    qkv_attention(&qkv, &ct, &st, heads, &m, scale as f32).expect("runs on wgpu")
                }
                false => {
                    let x = qkv.clone().swap_dims(1, 2);
                    let swap = super::super::rope_swap_index(d, &dev);
                    let qk =
                        super::super::rope(x.clone().slice([0..b, 0..heads + kv]), &ct, &st, &swap);
                    let q = qk
                        .clone()
                        .slice([0..b, 0..heads])
                        .reshape([b, kv, g * t, d]);
                    let k = qk.slice([0..b, heads..heads + kv]);
                    let v = x.slice([0..b, heads + kv..n]);
                    let options = burn::tensor::ops::AttentionModuleOptions {
                        scale: Some(scale),
                        softcap: None,
                        is_causal: false,
                    };
                    crate::model::backend::composite_attention(q, k, v, &m, options, false)
                        .reshape([b, heads, t, d])
                        .swap_dims(1, 2)
                }
            };
            let c = BurnTensor::<4>::from_data(TensorData::new(cs.clone(), [b, t, heads, d]), &dev);
            let read = |x: BurnTensor<4>| crate::model::read_f32(x).unwrap();
            if !ad {
                let l0 = crate::model::transfer::thread_launches();
                let y = f();
                return (
                    read(y),
                    None,
                    crate::model::transfer::thread_launches() - l0,
                    0,
                );
            }
            let (y, grads, fwd, bwd) = super::super::loss_backward(f, c);
            let dx = read(wide.grad(&grads).unwrap());
            (read(y), Some(dx), fwd, bwd)
        };
        let near = |got: &[f32], want: &[f32], what: &str| {
            let size = want.iter().fold(0f32, |a, b| a.max(b.abs()));
            for (k, (a, b)) in got.iter().zip(want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * size,
                    "{what}[{k}]: {a} vs {b} (largest {size})"
                );
            }
        };
        let (y, dx, fwd, bwd) = run(true, true);
        let (cy, cdx, cfwd, cbwd) = run(true, false);
        assert_eq!(y.len(), b * t * heads * d);
        near(&y, &cy, "y");
        let (dx, cdx) = (dx.unwrap(), cdx.unwrap());
        // The first head of each token is not part of the product: no gradient.
        near(&dx, &cdx, "dqkv");
        assert!(dx.iter().step_by(d * (n + 1)).all(|&v| v == 0.0));
        eprintln!(
            "launches forward / backward (with the loss's): fused {fwd} / {bwd}, \
             split path {cfwd} / {cbwd}"
        );
        assert_eq!(fwd, 2, "RoPE and attention");
        assert!(
            bwd + 10 <= cbwd,
            "backward {bwd} vs the split path's {cbwd}"
        );
        let again = run(true, true);
        assert_eq!(
            (again.0, again.1.unwrap()),
            (y.clone(), dx),
            "the same bits again"
        );
        // Plain tensors (log-probs): the same output as the autodiff path.
        let (py, _, pfwd, _) = run(false, true);
        assert_eq!(py, y, "plain and autodiff tensors: the same kernels");
        assert_eq!(pfwd, 2);
    }
}
