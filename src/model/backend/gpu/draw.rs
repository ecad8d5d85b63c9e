//! The sampler's draw as one `#[cube]` kernel: one cube per sample row, its units striding over
//! the row's logits and combining through shared memory. One source for wgpu and CUDA (burn's
//! CubeCL backend is one type for every runtime), launched on burn's tensors.
//!
//! It computes the function of [`super::super::draw`] (the same burn-op composite that the CPU
//! device runs), step for step: the temperature-1 log-sum-exp over the whole row; the maximum of
//! `z = logits / T` over the allowed ids; the top-k cut-off as the largest `t` with
//! `#{z ≥ t} ≥ k`, and the top-p cut-off as the smallest `t` with `mass(z > t) < p · mass`, each
//! found by the same 40 halvings from the same starting interval; min-p; then the first id whose
//! cumulative weight (in id order) exceeds `u · total`, falling back to the last kept id with
//! weight when rounding leaves none. The halvings are the composite's too (the same `mid`
//! values, exact counts), so the cut-offs differ from it only where its f32 mass sums do: the
//! kernel sums each unit's strided share, then a tree over the units; the cumulative sum is one
//! contiguous chunk per unit, the chunks' sums scanned in order. The error bounds of
//! [`crate::sample::draw`] (`cdf_tolerance`, ties and `BISECT_WIDTH` at the cut-offs) hold for
//! either order.
//!
//! Launches per draw: this kernel (plus a cast when the logits are not f32). The composite took
//! about 10 kernels without cut-offs and 380 to 820 more with top-k and top-p.
//!
//! Every `sync_cube` sits in control flow that is uniform across the cube (loops bounded by the
//! cube size or by a constant, branches on comptime flags), as WGSL requires, and no literal is
//! infinite (WGSL rejects them): [`LOWEST`] stands for −∞ where a starting value is needed.
use anyhow::{ensure, Result};
use burn::cubecl;
use burn::tensor::{DType, Tensor as BurnTensor};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::Cube;
use cubecl::prelude::*;

use crate::model::ops::DrawParams;

/// Halvings of the top-k / top-p cut-off searches (the composite's count).
const BISECT_STEPS: u32 = 40;

/// A stand-in for −∞ (NaN logits read as it): below every finite logit a model produces, and
/// `exp(LOWEST − m) = 0` for any real maximum `m`.
const LOWEST: f32 = -3.0e38;

/// Units per cube: 256, or the device's largest power of two below that.
pub(super) fn units(client: &Client) -> u32 {
    let max = client
        .properties()
        .hardware
        .max_units_per_cube
        .clamp(1, 256);
    if max.is_power_of_two() {
        max
    } else {
        max.next_power_of_two() >> 1
    }
}

/// One token and its behaviour log-prob per sample row, as `[r, 2]` f32 on the device: row `i`
/// reads logits row `rows[1, i]` and the uniform `rows[0, i]` (`rows`: `[2, r]`, f32). `None`
/// when the tensors are not on a CubeCL device.
pub fn draw(
    logits: &BurnTensor<2>,
    rows: &BurnTensor<2>,
    params: &DrawParams,
    allowed: usize,
) -> Result<Option<BurnTensor<2>>> {
    let [_, v] = logits.dims();
    let [two, r] = rows.dims();
    ensure!(two == 2, "internal: draw rows of shape [{two}, {r}]");
    ensure!(
        allowed >= 1 && allowed <= v,
        "internal: {allowed} allowed ids of {v}"
    );
    let logits = if logits.dtype() == DType::F32 {
        logits.clone()
    } else {
        logits.clone().cast(DType::F32)
    };
    let (Ok(lg), Ok(rw)) = (
        logits.try_into_primitive::<Cube>(),
        rows.clone().try_into_primitive::<Cube>(),
    ) else {
        return Ok(None);
    };
    // A matmul's storage-tiled output is read as rows only once un-tiled (a no-op otherwise).
    let lg = burn_cubecl::kernel::untile(lg);
    let client = lg.client.clone();
    let out = empty_device_dtype(
        client.clone(),
        lg.device.clone(),
        burn::tensor::Shape::new([r, 2]),
        DType::F32,
    );
    let units = units(&client);
    let greedy = params.temperature == 0.0;
    let cut_k = params.top_k > 0 && params.top_k < allowed;
    let cut_p = params.top_p < 1.0;
    let cut_min_p = params.min_p > 0.0;
    draw_kernel::launch(
        &client,
        CubeCount::Static(r as u32, 1, 1),
        CubeDim::new_1d(units),
        lg.into_tensor_arg(),
        rw.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        allowed as u32,
        if greedy { 1.0 } else { params.temperature },
        params.top_k.min(allowed) as f32,
        params.top_p,
        params.min_p,
        units as usize,
        greedy,
        cut_k,
        cut_p,
        cut_min_p,
    );
    Ok(Some(BurnTensor::<2>::from_primitive::<Cube>(out)))
}

/// Element `idx` of `t`, NaN read as [`LOWEST`] (the host reads NaN as −∞).
#[cube]
fn load(t: &Tensor<f32>, idx: usize) -> f32 {
    let x = t[idx];
    select(x.is_nan(), f32::new(LOWEST), x)
}

/// The sum of every unit's `x`, returned to every unit (a tree over `red`, which is free again
/// on return). `CUBE_DIM_X` is a power of two.
#[cube]
pub(super) fn block_sum(red: &mut Shared<[f32]>, x: f32) -> f32 {
    let tid = UNIT_POS_X as usize;
    red[tid] = x;
    sync_cube();
    let mut half = (CUBE_DIM_X / 2) as usize;
    while half > 0 {
        if tid < half {
            red[tid] = red[tid] + red[tid + half];
        }
        sync_cube();
        half /= 2;
    }
    let total = red[0];
    sync_cube();
    total
}

/// The maximum of every unit's `x`, returned to every unit (see [`block_sum`]).
#[cube]
fn block_max(red: &mut Shared<[f32]>, x: f32) -> f32 {
    let tid = UNIT_POS_X as usize;
    red[tid] = x;
    sync_cube();
    let mut half = (CUBE_DIM_X / 2) as usize;
    while half > 0 {
        if tid < half {
            red[tid] = red[tid].max(red[tid + half]);
        }
        sync_cube();
        half /= 2;
    }
    let total = red[0];
    sync_cube();
    total
}

/// The minimum of every unit's `x`, returned to every unit (see [`block_sum`]).
#[cube]
fn block_min(red: &mut Shared<[f32]>, x: f32) -> f32 {
    let tid = UNIT_POS_X as usize;
    red[tid] = x;
    sync_cube();
    let mut half = (CUBE_DIM_X / 2) as usize;
    while half > 0 {
        if tid < half {
            red[tid] = red[tid].min(red[tid + half]);
        }
        sync_cube();
        half /= 2;
    }
    let total = red[0];
    sync_cube();
    total
}

/// Whether id `i`, with `z = logit / T`, is kept: at or above the cut-off `thr` and, with min-p,
/// of weight `w = exp(z − m)` at least `min_p`.
#[cube]
fn kept(z: f32, w: f32, thr: f32, min_p: f32, #[comptime] cut_min_p: bool) -> bool {
    let mut keep = z >= thr;
    if cut_min_p {
        keep = keep && w >= min_p;
    }
    keep
}

/// One cube per sample row; writes `out[row] = (token, log-prob)`. `top_k` is a count (exact in
/// f32); ids are handled as f32 (exact below 2²⁴).
#[allow(clippy::too_many_arguments)]
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
    #[comptime] units: usize,
    #[comptime] greedy: bool,
    #[comptime] cut_k: bool,
    #[comptime] cut_p: bool,
    #[comptime] cut_min_p: bool,
) {
    let row = CUBE_POS_X as usize;
    let tid = UNIT_POS_X as usize;
    let nt = CUBE_DIM_X as usize;
    let mut red = Shared::<[f32]>::new_slice(units);
    let mut scan = Shared::<[f32]>::new_slice(units);
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
        token = select(f < af, f, f32::new(0.0));
    } else {
        let m = m_raw / temperature;
        let mut thr = lowest;
        if cut_k {
            // The largest t with #{z ≥ t} ≥ k: lo keeps ≥ k tokens, hi fewer.
            let mut lo = m - f32::new(200.0);
            let mut hi = m + m.abs() * f32::new(1e-6) + f32::new(1.0);
            for _step in 0..BISECT_STEPS {
                let mid = (lo + hi) * f32::new(0.5);
                let mut c = f32::new(0.0);
                i = tid;
                while i < a {
                    if load(logits, base + i * step) / temperature >= mid {
                        c += f32::new(1.0);
                    }
                    i += nt;
                }
                let count = block_sum(&mut red, c);
                if count >= top_k {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            thr = lo;
        }
        if cut_p {
            // The smallest t with mass(z > t) < p · mass, among the tokens top-k keeps.
            let mut s = f32::new(0.0);
            i = tid;
            while i < a {
                let z = load(logits, base + i * step) / temperature;
                if z >= thr {
                    s += (z - m).exp();
                }
                i += nt;
            }
            let target = block_sum(&mut red, s) * top_p;
            let mut lo = m - f32::new(200.0);
            let mut hi = m;
            for _step in 0..BISECT_STEPS {
                let mid = (lo + hi) * f32::new(0.5);
                let mut above = f32::new(0.0);
                i = tid;
                while i < a {
                    let z = load(logits, base + i * step) / temperature;
                    if z >= thr && z > mid {
                        above += (z - m).exp();
                    }
                    i += nt;
                }
                let mass = block_sum(&mut red, above);
                if mass < target {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            thr = thr.max(hi);
        }
        // The inverse-CDF draw: each unit's contiguous chunk of ids, the chunks' sums scanned in
        // order by unit 0 (which also leaves the total in red[0]).
        let chunk = (a + nt - 1) / nt;
        let start = select(tid * chunk < a, tid * chunk, a);
        let end = select(start + chunk < a, start + chunk, a);
        let mut s = f32::new(0.0);
        for j in start..end {
            let z = load(logits, base + j * step) / temperature;
            let w = (z - m).exp();
            if kept(z, w, thr, min_p, cut_min_p) {
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
            if kept(z, w, thr, min_p, cut_min_p) && w > f32::new(0.0) {
                run += w;
                if run > target && first == af {
                    first = f32::cast_from(j as u32);
                }
                last = f32::cast_from(j as u32);
            }
        }
        let f = block_min(&mut red, first);
        let l = block_max(&mut red, last);
        // Rounding that leaves no winner: the last kept id (as the host does); every logit −∞
        // or NaN: id 0 (the host's argmax).
        token = select(f < af, f, select(l >= f32::new(0.0), l, f32::new(0.0)));
        token = select(m_raw <= lowest, f32::new(0.0), token);
    }
    if tid == 0 {
        let t = u32::cast_from(token) as usize;
        let o = row * out.stride(0);
        out[o] = token;
        out[o + out.stride(1)] = load(logits, base + t * step) - lse;
    }
}
