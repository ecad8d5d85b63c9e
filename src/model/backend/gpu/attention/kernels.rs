//! The attention kernels of [`super`]: the forward pass over separate q, k, v or one
//! head-major tensor, the two halves of the backward pass, and attention over a cache's slots.
use burn::cubecl;
use cubecl::ir::ElemType;
use cubecl::prelude::*;

use super::super::block::{block_max, block_sum, cube_row, offset3, unravel};
use super::LOWEST;

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

/// Where the query row of the cube numbered `row` lies: `(batch, key/value head h, its row r,
/// query head, token)`. Separate inputs (`q: [B, K, R, d]`): row `r` of head `h`, the query
/// head and token unused (`h`, `r`). `combined` (`q` the `[B, H + 2K, T, d]` tensor, `heads` =
/// H): row `r = j·T + t` of key/value head `h` is query head `h·g + j` of token `t`.
#[cube]
fn query_row(
    q: &Tensor<f32>,
    heads: usize,
    row: usize,
    #[comptime] combined: bool,
) -> (usize, usize, usize, usize, usize) {
    if combined {
        let (slots, kv) = (q.shape(2), (q.shape(1) - heads) / 2);
        let group = heads / kv;
        let (batch, h, r) = unravel(row, kv, group * slots);
        (batch, h, r, h * group + r / slots, r % slots)
    } else {
        let (batch, h, r) = unravel(row, q.shape(1), q.shape(2));
        (batch, h, r, h, r)
    }
}

/// The query rows of the grid: `B·K·R` (separate inputs) or `B·H·T` (`combined`).
#[cube]
fn query_rows(q: &Tensor<f32>, heads: usize, #[comptime] combined: bool) -> usize {
    if combined {
        q.shape(0) * heads * q.shape(2)
    } else {
        q.shape(0) * q.shape(1) * q.shape(2)
    }
}

/// The offset of a query row (`at` from [`query_row`]) in a tensor laid out as the queries
/// (`query`: q, ∂q) or as the output (not `query`: the output, its gradient; `[B, T, H, d]`
/// when `combined`).
#[cube]
fn row_at(
    t: &Tensor<f32>,
    at: (usize, usize, usize, usize, usize),
    #[comptime] query: bool,
    #[comptime] combined: bool,
) -> usize {
    let (batch, h, r, qh, tok) = at;
    if combined {
        if query {
            offset3(t, batch, qh, tok)
        } else {
            offset3(t, batch, tok, qh)
        }
    } else {
        offset3(t, batch, h, r)
    }
}

/// The offset of key `j` of key/value head `h` in the keys (`part` 0) or the values (`part` 1):
/// separate tensors, or heads `H + h` and `H + K + h` of the `combined` tensor.
#[cube]
fn key_at(
    t: &Tensor<f32>,
    batch: usize,
    h: usize,
    j: usize,
    heads: usize,
    #[comptime] part: u32,
    #[comptime] combined: bool,
) -> usize {
    if combined {
        let kv = (t.shape(1) - heads) / 2;
        offset3(t, batch, heads + kv * (part as usize) + h, j)
    } else {
        offset3(t, batch, h, j)
    }
}

/// The cube's query row and where its inputs lie: `(batch, key/value head h, its row r, query
/// head, token` ([`query_row`])`, q's offset, the keys', the values', the mask row's)`.
#[cube]
fn row_inputs<M: Int>(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    mask: &Tensor<M>,
    heads: usize,
    row: usize,
    #[comptime] combined: bool,
) -> (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
) {
    let at = query_row(q, heads, row, combined);
    let (batch, h, r, qh, t) = at;
    let qb = row_at(q, at, true, combined);
    let kb = key_at(k, batch, h, 0, heads, 0u32, combined);
    let vb = key_at(v, batch, h, 0, heads, 1u32, combined);
    let mb = offset3(mask, batch, 0, r);
    (batch, h, r, qh, t, qb, kb, vb, mb)
}

/// One cube per query row: its scores, their softmax and the weighted values. `q`, `k`, `v` are
/// three tensors, or (`combined`) the same `[B, H + 2K, T, d]` tensor three times, the output
/// then `[B, T, H, d]`.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub(super) fn attention_kernel<M: Int>(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    mask: &Tensor<M>,
    out: &mut Tensor<f32>,
    heads: usize,
    scale: f32,
    #[comptime] capacity: usize,
    #[comptime] units: u32,
    #[comptime] combined: bool,
    #[define(M)] _mask_store: ElemType,
) {
    let row = cube_row(query_rows(q, heads, combined));
    let (batch, h, r, qh, t, qb, kb, vb, mb) = row_inputs(q, k, v, mask, heads, row, combined);
    let at = (batch, h, r, qh, t);
    let mut scores = Shared::<[f32]>::new_slice(capacity);
    let mut red = Shared::<[f32]>::new_slice(units as usize);
    let keys = k.shape(2);
    let mx = row_scores(&mut scores, q, qb, k, kb, keys, mask, mb, scale);
    let ob = row_at(&*out, at, false, combined);
    weigh_values(&mut scores, &mut red, mx, keys, v, vb, out, ob);
}

/// The backward pass's first half, one cube per query row: the row's weights `P` and `dS`
/// (written to `p` and `ds`, `[B, K, R, S]`) and `∂L/∂q` (module documentation), the tensors
/// as in [`attention_kernel`] (`combined`: `dq` the gradient of the whole `[B, H + 2K, T, d]`
/// tensor, of which this kernel writes the query heads).
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub(super) fn attention_rows_backward_kernel<M: Int>(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    mask: &Tensor<M>,
    g: &Tensor<f32>,
    p: &mut Tensor<f32>,
    ds: &mut Tensor<f32>,
    dq: &mut Tensor<f32>,
    heads: usize,
    scale: f32,
    #[comptime] capacity: usize,
    #[comptime] units: u32,
    #[comptime] combined: bool,
    #[define(M)] _mask_store: ElemType,
) {
    let row = cube_row(query_rows(q, heads, combined));
    let (batch, h, r, qh, t, qb, kb, vb, mb) = row_inputs(q, k, v, mask, heads, row, combined);
    let at = (batch, h, r, qh, t);
    let tid = UNIT_POS_X as usize;
    let nt = CUBE_DIM_X as usize;
    let keys = k.shape(2);
    let gb = row_at(g, at, false, combined);
    let (pb, db) = (offset3(&*p, batch, h, r), offset3(&*ds, batch, h, r));
    let qo = row_at(&*dq, at, true, combined);
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

/// The backward pass's second half, one cube per key `j`: `∂L/∂k_j` and `∂L/∂v_j` summed over
/// the query rows in order, each unit a share of the head dimension. The query rows of key/value
/// head `h` are `j'·T + t` (`j' < g`, `t < T`; separate inputs: `g` = 1, `T` = R). `combined`:
/// `dk` and `dv` are the same gradient of the `[B, H + 2K, T, d]` tensor, of which this kernel
/// writes the key and value heads.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub(super) fn attention_keys_backward_kernel(
    q: &Tensor<f32>,
    g: &Tensor<f32>,
    p: &Tensor<f32>,
    ds: &Tensor<f32>,
    dk: &mut Tensor<f32>,
    dv: &mut Tensor<f32>,
    heads: usize,
    scale: f32,
    #[comptime] combined: bool,
) {
    let (kv, keys) = (p.shape(1), p.shape(3));
    let row = cube_row(p.shape(0) * kv * keys);
    let (batch, h, j) = unravel(row, kv, keys);
    // (first row's offset, step to the next query head, step to the next token) of q and g.
    let mut group = 1usize;
    let mut slots = q.shape(2);
    let mut qs = (offset3(q, batch, h, 0), 0usize, q.stride(2));
    let mut gs = (offset3(g, batch, h, 0), 0usize, g.stride(2));
    if combined {
        group = heads / kv;
        slots = keys;
        qs = (offset3(q, batch, h * group, 0), q.stride(1), q.stride(2));
        gs = (offset3(g, batch, 0, h * group), g.stride(2), g.stride(1));
    }
    let (qb, qh, qr) = qs;
    let (gb, gh, gr) = gs;
    let (pb, p2) = (offset3(p, batch, h, 0) + j * p.stride(3), p.stride(2));
    let (db, d2) = (offset3(ds, batch, h, 0) + j * ds.stride(3), ds.stride(2));
    let kb = key_at(&*dk, batch, h, j, heads, 0u32, combined);
    let vb = key_at(&*dv, batch, h, j, heads, 1u32, combined);
    let (q3, g3, k3, v3) = (q.stride(3), g.stride(3), dk.stride(3), dv.stride(3));
    let mut i = UNIT_POS_X as usize;
    while i < q.shape(3) {
        let mut a = f32::new(0.0);
        let mut c = f32::new(0.0);
        for jh in 0..group {
            for t in 0..slots {
                let r = jh * slots + t;
                a += ds[db + r * d2] * q[qb + jh * qh + t * qr + i * q3];
                c += p[pb + r * p2] * g[gb + jh * gh + t * gr + i * g3];
            }
        }
        dk[kb + i * k3] = a * scale;
        dv[vb + i * v3] = c;
        i += CUBE_DIM_X as usize;
    }
}

#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub(super) fn slot_attention_kernel(
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
    let (kv, rows) = (q.shape(1), q.shape(2));
    let row = cube_row(q.shape(0) * kv * rows);
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
