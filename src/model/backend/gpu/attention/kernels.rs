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
pub(super) fn attention_kernel<M: Int>(
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
pub(super) fn qkv_attention_kernel<M: Int>(
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
pub(super) fn attention_rows_backward_kernel<M: Int>(
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
pub(super) fn qkv_attention_rows_backward_kernel<M: Int>(
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
pub(super) fn attention_keys_backward_kernel(
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
pub(super) fn qkv_attention_keys_backward_kernel(
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
