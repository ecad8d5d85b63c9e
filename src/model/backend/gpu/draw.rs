//! The sampler's draw as one `#[cube]` kernel a decode step: one cube per sample row, its units
//! striding over the row's logits and combining through shared memory
//! ([`super::block`]). One source for wgpu and CUDA (burn's CubeCL backend is one type for every
//! runtime), launched on burn's tensors.
//!
//! Per row, in f32: the temperature-1 log-sum-exp over the whole row (the behaviour log-prob's
//! normaliser); the maximum `m` of `z = logit / T` over the allowed ids; then
//! - **top-k** by radix select, one bit a pass: over the order-preserving integer key of each `z`
//!   (the f32 bits, sign-flipped so that integer order is float order), 32 passes each count the
//!   ids at or above a candidate key and fix one more bit of the largest key with at least `k`
//!   ids at or above it, i.e. the k-th largest value itself. Every id whose value equals it is
//!   kept (the host breaks such ties towards the lower id).
//! - **top-p** the same way over the mass: 32 passes fix the largest key whose strictly-greater
//!   mass (among the ids top-k keeps) is still at least `p` of the kept mass; the cut-off is the
//!   next key, the value of the first id ranked past `p`, so the ids kept are those with less
//!   than `p` of the mass ranked before them (the host's rule; the mass test is in f32);
//! - **min-p**: weight `exp(z − m)` at least `min_p`;
//! - **the draw**: the first kept id whose cumulative weight in id order exceeds `u · total`
//!   (each unit sums a contiguous chunk of ids, the chunks' sums are scanned in order), the last
//!   kept id with weight when rounding leaves none; greedy (T = 0) takes the lowest id of the
//!   maximum; a row whose logits are all −∞ or NaN draws id 0 (the host's argmax).
//!
//! The cut-offs are exact values of the row (the burn-op composite,
//! [`crate::model::backend::draw`], finds them by halving an interval of values and may keep ids
//! within [`crate::sample::draw::BISECT_WIDTH`] below them); only f32 sums in the cube's order
//! differ from the host's f64, within [`crate::sample::draw::cdf_tolerance`].
//!
//! Launches per draw: this kernel (plus a cast when the logits are not f32), where the composite
//! takes about 10 kernels without cut-offs and 800 more with top-k and top-p. A pass reads the
//! row from global memory: 2 + 32 per cut-off + 2 for the draw, every one over the vocabulary by
//! the whole cube.
//!
//! No literal is infinite (WGSL rejects them): [`LOWEST`] stands for −∞ where a starting value
//! is needed.
use anyhow::{ensure, Result};
use burn::cubecl;
use burn::tensor::{DType, Tensor as BurnTensor};
use cubecl::prelude::*;

use super::block::{
    block_max, block_min, block_sum, cube_row, output, plain, row_grid, row_units, tensor,
};
use crate::model::ops::DrawParams;

/// A stand-in for −∞ (NaN logits read as it): below every finite logit a model produces, and
/// `exp(LOWEST − m) = 0` for any real maximum `m`.
const LOWEST: f32 = -3.0e38;

/// One token and its behaviour log-prob per sample row, as `[r, 2]` f32 on the device: row `i`
/// reads logits row `rows[1, i]` and the uniform `rows[0, i]` (`rows`: `[2, r]`, f32). `None`
/// when the tensors are not plain tensors on a CubeCL device.
pub fn draw(
    logits: &BurnTensor<2>,
    rows: &BurnTensor<2>,
    params: &DrawParams,
    allowed: usize,
) -> Result<Option<BurnTensor<2>>> {
    let [n, v] = logits.dims();
    let [two, r] = rows.dims();
    ensure!(two == 2, "internal: draw rows of shape [{two}, {r}]");
    ensure!(
        allowed >= 1 && allowed <= v,
        "internal: {allowed} allowed ids of {v}"
    );
    ensure!(
        v < 1 << 24 && n < 1 << 24,
        "internal: {n} × {v} logits: ids are exact in f32 only below 2^24"
    );
    let Some(rw) = plain(rows) else {
        return Ok(None);
    };
    // The draw is computed in f32 whatever the logits' dtype.
    let lg = if logits.dtype() == DType::F32 {
        plain(logits)
    } else {
        plain(&logits.clone().cast(DType::F32))
    };
    let Some(lg) = lg else {
        return Ok(None);
    };
    if r == 0 {
        return Ok(None);
    }
    let client = lg.client.clone();
    let out = output(&lg, &[r, 2]);
    let units = row_units(&client, v);
    let greedy = params.temperature == 0.0;
    draw_kernel::launch(
        &client,
        row_grid(&client, r),
        CubeDim::new_1d(units),
        lg.into_tensor_arg(),
        rw.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        allowed as u32,
        if greedy { 1.0 } else { params.temperature },
        params.top_k.min(allowed) as f32,
        params.top_p,
        params.min_p,
        units,
        greedy,
        params.top_k > 0 && params.top_k < allowed,
        params.top_p < 1.0,
        params.min_p > 0.0,
    );
    Ok(Some(tensor(out)))
}

/// Element `idx` of `t`, NaN read as [`LOWEST`] (the host reads NaN as −∞).
#[cube]
fn load(t: &Tensor<f32>, idx: usize) -> f32 {
    let x = t[idx];
    select(x.is_nan(), f32::new(LOWEST), x)
}

/// The order-preserving key of `z`: `key(a) < key(b)` exactly when `a < b` (−0 and +0 share
/// +0's key; `z` is never NaN here).
#[cube]
fn key(z: f32) -> u32 {
    let bits = u32::reinterpret(select(z == 0.0f32, 0.0f32, z));
    select(
        (bits >> 31u32) == 1u32,
        bits ^ 0xFFFF_FFFFu32,
        bits | 0x8000_0000u32,
    )
}

/// The largest key `c`, decided bit by bit from the top, at which the ids `i < a` of the row at
/// `logits[base..]` (`z` its logit divided by `temperature`) sum to at least `goal` over the
/// cube: each id with `key(z) ≥ c` counts 1, or (`mass`) each id with `key(z) ≥ k_cut` and
/// `key(z) > c` counts its weight `exp(z − m)`. Called by every unit of the cube together.
#[allow(clippy::too_many_arguments)]
#[cube]
fn largest_key(
    red: &mut Shared<[f32]>,
    logits: &Tensor<f32>,
    base: usize,
    a: usize,
    temperature: f32,
    m: f32,
    k_cut: u32,
    goal: f32,
    #[comptime] mass: bool,
) -> u32 {
    let step = logits.stride(1);
    let mut found = 0u32;
    for b in 0..32u32 {
        let cand = found | (0x8000_0000u32 >> b);
        let mut acc = f32::new(0.0);
        let mut i = UNIT_POS_X as usize;
        while i < a {
            let z = load(logits, base + i * step) / temperature;
            if mass {
                let kz = key(z);
                if kz >= k_cut && kz > cand {
                    acc += (z - m).exp();
                }
            } else if key(z) >= cand {
                acc += f32::new(1.0);
            }
            i += CUBE_DIM_X as usize;
        }
        if block_sum(red, acc) >= goal {
            found = cand;
        }
    }
    found
}

/// One cube per sample row; writes `out[row] = (token, log-prob)`. `top_k` is a count (exact in
/// f32); ids are handled as f32 (exact below 2²⁴).
// `div_ceil` is not a cube function: the chunk size is written out.
#[allow(clippy::too_many_arguments, clippy::manual_div_ceil)]
#[cube(launch)]
fn draw_kernel(
    logits: &Tensor<f32>,
    rows: &Tensor<f32>,
    out: &mut Tensor<f32>,
    allowed: u32,
    temperature: f32,
    top_k: f32,
    top_p: f32,
    min_p: f32,
    #[comptime] units: u32,
    #[comptime] greedy: bool,
    #[comptime] cut_k: bool,
    #[comptime] cut_p: bool,
    #[comptime] cut_min_p: bool,
) {
    let row = cube_row(rows.shape(1));
    let tid = UNIT_POS_X as usize;
    let nt = CUBE_DIM_X as usize;
    let mut red = Shared::<[f32]>::new_slice(units as usize);
    let mut scan = Shared::<[f32]>::new_slice(units as usize);
    let lowest = f32::new(LOWEST);
    let u = rows[row * rows.stride(1)];
    let src = u32::cast_from(rows[rows.stride(0) + row * rows.stride(1)]) as usize;
    let base = src * logits.stride(0);
    let step = logits.stride(1);
    let v = logits.shape(1);
    let a = allowed as usize;
    let af = f32::cast_from(allowed);

    // The behaviour log-prob's normaliser: temperature 1, the whole row.
    let mut mx = lowest;
    let mut i = tid;
    while i < v {
        mx = mx.max(load(logits, base + i * step));
        i += nt;
    }
    let m1 = block_max(&mut red, mx);
    let mut acc = f32::new(0.0);
    i = tid;
    while i < v {
        acc += (load(logits, base + i * step) - m1).exp();
        i += nt;
    }
    let lse = m1 + block_sum(&mut red, acc).ln();

    // The maximum over the allowed ids (raw logits; z's is this divided by T).
    let mut ma = lowest;
    i = tid;
    while i < a {
        ma = ma.max(load(logits, base + i * step));
        i += nt;
    }
    let m_raw = block_max(&mut red, ma);
    let mut token = f32::new(0.0);
    if greedy {
        // The lowest id of the maximum.
        let mut first = af;
        i = tid;
        while i < a {
            if load(logits, base + i * step) >= m_raw {
                first = first.min(f32::cast_from(i as u32));
            }
            i += nt;
        }
        let f = block_min(&mut red, first);
        token = select(f < af, f, token);
    } else {
        let m = m_raw / temperature;
        // Ids are kept at or above both keys (0: no cut).
        let mut k_cut = 0u32;
        if cut_k {
            // The largest key with at least k ids at or above it: the k-th largest value.
            k_cut = largest_key(
                &mut red,
                logits,
                base,
                a,
                temperature,
                m,
                0u32,
                top_k,
                false,
            );
        }
        let mut p_cut = 0u32;
        if cut_p {
            // The mass top-k keeps, and p of it.
            let mut s = f32::new(0.0);
            i = tid;
            while i < a {
                let z = load(logits, base + i * step) / temperature;
                if key(z) >= k_cut {
                    s += (z - m).exp();
                }
                i += nt;
            }
            let target = block_sum(&mut red, s) * top_p;
            // The largest key whose strictly-greater kept mass is at least the target (key 0:
            // all the kept mass, which is more than p of it).
            let found = largest_key(
                &mut red,
                logits,
                base,
                a,
                temperature,
                m,
                k_cut,
                target,
                true,
            );
            // The cut-off is the next key (an id's own: the first ranked past p), never above
            // the maximum's (p = 0 keeps the maximum and its ties).
            let top = key(m);
            p_cut = select(found >= top, top, found + 1u32);
        }
        let cut = select(k_cut > p_cut, k_cut, p_cut);
        // The inverse-CDF draw: each unit's contiguous chunk of ids, the chunks' sums scanned in
        // order by unit 0 (which also leaves the total in red[0]).
        let chunk = (a + nt - 1) / nt;
        let start = select(tid * chunk < a, tid * chunk, a);
        let end = select(start + chunk < a, start + chunk, a);
        let mut s = f32::new(0.0);
        for j in start..end {
            let z = load(logits, base + j * step) / temperature;
            let w = (z - m).exp();
            let mut keep = key(z) >= cut;
            if cut_min_p {
                keep = keep && w >= min_p;
            }
            if keep {
                s += w;
            }
        }
        red[tid] = s;
        sync_cube();
        if tid == 0 {
            let mut run = f32::new(0.0);
            for t in 0..nt {
                scan[t] = run;
                run += red[t];
            }
            red[0] = run;
        }
        sync_cube();
        let target = u * red[0];
        sync_cube();
        let mut run = scan[tid];
        let mut first = af;
        let mut last = f32::new(-1.0);
        for j in start..end {
            let z = load(logits, base + j * step) / temperature;
            let w = (z - m).exp();
            let mut keep = key(z) >= cut && w > f32::new(0.0);
            if cut_min_p {
                keep = keep && w >= min_p;
            }
            if keep {
                run += w;
                if run > target && first == af {
                    first = f32::cast_from(j as u32);
                }
                last = f32::cast_from(j as u32);
            }
        }
        let f = block_min(&mut red, first);
        let l = block_max(&mut red, last);
        // Rounding that leaves no winner: the last kept id with weight (as the host does).
        token = select(f < af, f, select(l >= f32::new(0.0), l, token));
    }
    // Every logit −∞ or NaN: id 0 (the host's argmax).
    token = select(m_raw <= lowest, f32::new(0.0), token);
    if tid == 0 {
        let t = u32::cast_from(token) as usize;
        let (o, next) = (row * out.stride(0), out.stride(1));
        out[o] = token;
        out[o + next] = load(logits, base + t * step) - lse;
    }
}
