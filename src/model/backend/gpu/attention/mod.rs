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
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops};
use burn::backend::Autodiff;
use burn::cubecl;
use burn::tensor::{Bool, DType, Tensor as BurnTensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::Cube;
use cubecl::ir::{ElemType, UIntKind};
use cubecl::prelude::*;

use super::block::{output, plain, row_grid, row_units, tensor};

mod kernels;
#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests;

use crate::model::backend::record;
use kernels::*;

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
        return Some(tracked(AttentionBackward, [qn, kn, vn], s));
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
        return Some(tracked(QkvAttentionBackward, [node], s));
    }
    let mp = mask.clone().try_into_primitive::<Cube>().ok()?;
    cube_for(&plain(qkv)?.client, t, d)?;
    let x = plain(&super::rope::rope_heads(&x, cos, sin, heads + kv)?)?;
    let s = AttentionState::new(Inputs::Combined(x, heads), mp, t, d, scale)?;
    Some(tensor(s.forward()))
}

/// `s`'s forward pass on autodiff tensors, the output tracked with `op`'s backward pass when one
/// of the `nodes` needs a gradient.
fn tracked<const N: usize, O>(op: O, nodes: [NodeGuard; N], s: AttentionState) -> BurnTensor<4>
where
    O: Backward<Cube, N, State = AttentionState>,
{
    let out = s.forward();
    let out = record(op, nodes, out, || s);
    BurnTensor::<4>::from_primitive::<Autodiff<Cube>>(out)
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

    /// The tensors the kernels read as `q`, `k` and `v` (the combined tensor three times), the
    /// number of query heads (combined; 0 otherwise) and whether the inputs are combined.
    fn qkv(&self) -> (&CubeTensor, &CubeTensor, &CubeTensor, usize, bool) {
        match &self.inputs {
            Inputs::Separate(q, k, v) => (q, k, v, 0, false),
            Inputs::Combined(x, heads) => (x, x, x, *heads, true),
        }
    }

    /// The attention's output: one launch.
    fn forward(&self) -> CubeTensor {
        let (b, kv, rows, _, d) = self.dims();
        let (q, k, v, heads, combined) = self.qkv();
        let out = match combined {
            true => output(q, &[b, q.meta.shape()[2], heads, d]),
            false => output(q, &[b, kv, rows, d]),
        };
        let client = self.mask.client.clone();
        attention_kernel::launch(
            &client,
            row_grid(&client, b * kv * rows),
            CubeDim::new_1d(self.units),
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            self.mask.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            heads,
            self.scale,
            self.capacity,
            self.units,
            combined,
            ElemType::UInt(self.store),
        );
        out
    }

    /// The gradients of the inputs for the upstream gradient `g`, in the order of
    /// [`Inputs`]'s tensors: two launches (the module documentation's formulas). The combined
    /// tensor's one gradient is written by both: the query heads by the first, the key and
    /// value heads by the second.
    fn backward(&self, g: &CubeTensor) -> Vec<CubeTensor> {
        let (b, kv, rows, keys, d) = self.dims();
        let (q, k, v, heads, combined) = self.qkv();
        let client = g.client.clone();
        let p = output(g, &[b, kv, rows, keys]);
        let ds = output(g, &[b, kv, rows, keys]);
        let (dq, dk, dv) = match combined {
            true => {
                let dx = output(g, q.meta.shape());
                (dx.clone(), dx.clone(), dx)
            }
            false => (
                output(g, &[b, kv, rows, d]),
                output(g, &[b, kv, keys, d]),
                output(g, &[b, kv, keys, d]),
            ),
        };
        attention_rows_backward_kernel::launch(
            &client,
            row_grid(&client, b * kv * rows),
            CubeDim::new_1d(self.units),
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            self.mask.clone().into_tensor_arg(),
            g.clone().into_tensor_arg(),
            p.clone().into_tensor_arg(),
            ds.clone().into_tensor_arg(),
            dq.clone().into_tensor_arg(),
            heads,
            self.scale,
            self.capacity,
            self.units,
            combined,
            ElemType::UInt(self.store),
        );
        attention_keys_backward_kernel::launch(
            &client,
            row_grid(&client, b * kv * keys),
            CubeDim::new_1d(row_units(&client, d)),
            q.clone().into_tensor_arg(),
            g.clone().into_tensor_arg(),
            p.into_tensor_arg(),
            ds.into_tensor_arg(),
            dk.clone().into_tensor_arg(),
            dv.clone().into_tensor_arg(),
            heads,
            self.scale,
            combined,
        );
        match combined {
            true => vec![dq],
            false => vec![dq, dk, dv],
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
