//! RMSNorm and the SwiGLU gate of a decoder layer, forward and backward, each in one pass over
//! its rows (rows in parallel), on f32 slices. rlcr's `model::fused` wraps them as autodiff ops,
//! in place of burn's composites, which run one element-wise kernel per operation and keep
//! several `[rows, width]` intermediates for backward.
//!
//! **RMSNorm** of one row `x` (`h` entries) with weight `w`:
//!
//! ```text
//! r = 1 / sqrt(Σ_j x_j² / h + eps)        y_j = (x_j · r) · w_j
//! c = Σ_j (∂L/∂y_j · w_j) · x_j
//! ∂L/∂x_j = (∂L/∂y_j · w_j) · r + x_j · (−c · r³ / h)       ∂L/∂w_j = Σ_rows (x_j · r) · ∂L/∂y_j
//! ```
//!
//! The two row sums run in a fixed order (16 lanes by column, the lanes added pairwise at the
//! end; a multiply and an add per term, never fused), so a row's results are the same bits on
//! every ISA, batch and thread count. burn's composite sums in macerator's order (which depends
//! on the SIMD width it picks), so the two differ in the last bits of `r` and `c`: tested
//! against each other within a tolerance and against an f64 evaluation of the formulas. `∂L/∂w`
//! sums the rows in row order, as burn's broadcast backward does; columns are split among the
//! threads, so it does not depend on the thread count.
//!
//! **SwiGLU** of one row of `gu = [gate | up]` (`2I` entries), as rlcr's MLP computes it
//! (`silu(g)·u` with torch's `silu(g) = g·sigmoid(g)`):
//!
//! ```text
//! s = sigmoid(g)    a = g·s    y = a·u
//! ∂L/∂u = ∂L/∂y · a            ∂L/∂g = (∂L/∂y · u)·s + ((∂L/∂y · u)·g·s)·(1 − s)
//! ```
//!
//! evaluated operation by operation in the order and with the `sigmoid` of burn's Flex backend
//! (`1/(1 + exp(−x))` for `x ≥ 0`, `e/(1 + e)` with `e = exp(x)` below, libm's `expf`) and of
//! burn's autodiff (`sigmoid` recomputed from its input in backward), so forward and backward
//! give **the same bits as burn's composite** on `Autodiff<Flex>` (tested bit for bit by rlcr's
//! `model::fused`). `expf` stays libm's (scalar): a vectorised `exp` would round differently.
use rayon::prelude::*;

use crate::Isa;

/// Lanes of the row sums (one zmm of f32).
const LANES: usize = 16;

/// About this many elements per parallel task.
const TASK: usize = 16 * 1024;

fn rows_per_task(width: usize) -> usize {
    (TASK / width.max(1)).max(1)
}

/// `Σ a_j·b_j` over one row in the fixed order of this module (16 lanes, then pairwise).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        acc[l] += x * y;
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

/// One block of rows forward: `y` and `r` of each row.
#[inline(always)]
fn norm_rows_forward(x: &[f32], w: &[f32], eps: f32, y: &mut [f32], r: &mut [f32]) {
    let h = w.len();
    for ((xr, yr), rr) in x
        .chunks_exact(h)
        .zip(y.chunks_exact_mut(h))
        .zip(r.iter_mut())
    {
        let ms = dot(xr, xr) / h as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        *rr = inv;
        for ((o, &xv), &wv) in yr.iter_mut().zip(xr).zip(w) {
            *o = (xv * inv) * wv;
        }
    }
}

/// One block of rows backward: `∂L/∂x` of each row.
#[inline(always)]
fn norm_rows_backward(x: &[f32], w: &[f32], r: &[f32], dy: &[f32], dx: &mut [f32]) {
    let h = w.len();
    let rows = x.chunks_exact(h).zip(dy.chunks_exact(h));
    for (((xr, dyr), dxr), &inv) in rows.zip(dx.chunks_exact_mut(h)).zip(r) {
        // ∂L/∂y·w, kept in dx for the second loop.
        for ((o, &g), &wv) in dxr.iter_mut().zip(dyr).zip(w) {
            *o = g * wv;
        }
        let c = dot(dxr, xr);
        let m = -c * (inv * inv * inv) / h as f32;
        for (o, &xv) in dxr.iter_mut().zip(xr) {
            *o = *o * inv + xv * m;
        }
    }
}

/// `∂L/∂w` for the columns `col..col + out.len()`: rows summed in row order.
#[inline(always)]
fn norm_weight_grad(x: &[f32], r: &[f32], dy: &[f32], h: usize, col: usize, out: &mut [f32]) {
    let k = out.len();
    for (i, &inv) in r.iter().enumerate() {
        let xr = &x[i * h + col..i * h + col + k];
        let dyr = &dy[i * h + col..i * h + col + k];
        for ((o, &xv), &g) in out.iter_mut().zip(xr).zip(dyr) {
            *o += (xv * inv) * g;
        }
    }
}

/// RMSNorm forward over the rows of `x: [n, h]` (`h = w.len()`): `(y [n·h], r [n])`, `r` the
/// per-row `1/sqrt(mean(x²) + eps)` that [`rms_norm_backward`] needs. `isa` above the CPU's is
/// lowered to it; every ISA gives the same bits.
///
/// # Panics
/// If `x.len()` is not a multiple of `w.len()` (a caller bug).
pub fn rms_norm_forward(x: &[f32], w: &[f32], eps: f32, isa: Isa) -> (Vec<f32>, Vec<f32>) {
    let h = w.len();
    assert!(
        h > 0 && x.len().is_multiple_of(h),
        "{} values for rows of {h}",
        x.len()
    );
    let n = x.len() / h;
    let isa = isa.clamp();
    let (mut y, mut r) = (vec![0f32; n * h], vec![0f32; n]);
    let rows = rows_per_task(h);
    y.par_chunks_mut(rows * h)
        .zip(r.par_chunks_mut(rows))
        .zip(x.par_chunks(rows * h))
        .for_each(|((yb, rb), xb)| dispatch::forward(xb, w, eps, yb, rb, isa));
    (y, r)
}

/// RMSNorm backward: `(∂L/∂x [n·h], ∂L/∂w [h])` from the forward's `x`, `w`, `r` and `∂L/∂y`.
///
/// # Panics
/// If the lengths disagree (a caller bug).
pub fn rms_norm_backward(
    x: &[f32],
    w: &[f32],
    r: &[f32],
    dy: &[f32],
    isa: Isa,
) -> (Vec<f32>, Vec<f32>) {
    let h = w.len();
    let n = r.len();
    assert!(
        x.len() == n * h && dy.len() == n * h,
        "rms_norm_backward: {} values, {} gradients for {n} rows of {h}",
        x.len(),
        dy.len()
    );
    let isa = isa.clamp();
    let mut dx = vec![0f32; n * h];
    let rows = rows_per_task(h);
    dx.par_chunks_mut(rows * h)
        .zip(x.par_chunks(rows * h))
        .zip(dy.par_chunks(rows * h))
        .zip(r.par_chunks(rows))
        .for_each(|(((dxb, xb), dyb), rb)| dispatch::backward(xb, w, rb, dyb, dxb, isa));
    // Columns in blocks of 64 among the threads, each summing every row in order.
    const COLS: usize = 64;
    let mut dw = vec![0f32; h];
    dw.par_chunks_mut(COLS)
        .enumerate()
        .for_each(|(b, out)| dispatch::weight_grad(x, r, dy, h, b * COLS, out, isa));
    (dx, dw)
}

/// burn Flex's `sigmoid` for f32 (libm's `expf`).
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// SwiGLU forward over the rows of `gu: [n, 2·i]` (gate columns first): `y [n·i]`.
///
/// # Panics
/// If `gu.len()` is not a multiple of `2·i` (a caller bug).
pub fn swiglu_forward(gu: &[f32], i: usize) -> Vec<f32> {
    assert!(
        i > 0 && gu.len().is_multiple_of(2 * i),
        "{} values for rows of 2×{i}",
        gu.len()
    );
    let n = gu.len() / (2 * i);
    let mut y = vec![0f32; n * i];
    let rows = rows_per_task(2 * i);
    y.par_chunks_mut(rows * i)
        .zip(gu.par_chunks(rows * 2 * i))
        .for_each(|(yb, gb)| {
            for (yr, gr) in yb.chunks_exact_mut(i).zip(gb.chunks_exact(2 * i)) {
                let (g, u) = gr.split_at(i);
                for (o, &gv) in yr.iter_mut().zip(g) {
                    *o = sigmoid(gv);
                }
                for ((o, &gv), &uv) in yr.iter_mut().zip(g).zip(u) {
                    *o = (gv * *o) * uv;
                }
            }
        });
    y
}

/// SwiGLU backward: `∂L/∂gu [n·2i]` from the forward's `gu` and `∂L/∂y [n·i]`. Each entry gets
/// `+ 0.0` last, as burn's slice backward adds the two slices' zero-padded gradients (a `−0`
/// becomes `+0`).
///
/// # Panics
/// If the lengths disagree (a caller bug).
pub fn swiglu_backward(gu: &[f32], dy: &[f32], i: usize) -> Vec<f32> {
    assert!(
        i > 0 && gu.len().is_multiple_of(2 * i) && dy.len() * 2 == gu.len(),
        "swiglu_backward: {} values, {} gradients for rows of 2×{i}",
        gu.len(),
        dy.len()
    );
    let mut dgu = vec![0f32; gu.len()];
    let rows = rows_per_task(2 * i);
    dgu.par_chunks_mut(rows * 2 * i)
        .zip(gu.par_chunks(rows * 2 * i))
        .zip(dy.par_chunks(rows * i))
        .for_each(|((db, gb), dyb)| {
            let rows = db.chunks_exact_mut(2 * i).zip(gb.chunks_exact(2 * i));
            for ((dr, gr), dyr) in rows.zip(dyb.chunks_exact(i)) {
                let (g, u) = gr.split_at(i);
                let (dg, du) = dr.split_at_mut(i);
                for (o, &gv) in dg.iter_mut().zip(g) {
                    *o = sigmoid(gv);
                }
                let cols = dg.iter_mut().zip(du.iter_mut()).zip(g.iter().zip(u));
                for (((og, ou), (&gv, &uv)), &d) in cols.zip(dyr) {
                    let s = *og;
                    let a = gv * s;
                    let da = d * uv;
                    let ds = da * gv;
                    let g2 = (ds * s) * (1.0 - s);
                    *og = (da * s + g2) + 0.0;
                    *ou = d * a + 0.0;
                }
            }
        });
    dgu
}

/// The RMSNorm row loops compiled for AVX-512F and AVX2 (LLVM vectorises them; no fused
/// multiply-adds, so the bits are those of the baseline build).
mod dispatch {
    use super::*;

    pub(super) fn forward(x: &[f32], w: &[f32], eps: f32, y: &mut [f32], r: &mut [f32], isa: Isa) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: callers clamp `isa` to what the CPU has.
        match isa {
            Isa::Avx512 => return unsafe { x86::forward_avx512(x, w, eps, y, r) },
            Isa::Avx2 => return unsafe { x86::forward_avx2(x, w, eps, y, r) },
            Isa::Scalar => {}
        }
        let _ = isa;
        norm_rows_forward(x, w, eps, y, r)
    }

    pub(super) fn backward(x: &[f32], w: &[f32], r: &[f32], dy: &[f32], dx: &mut [f32], isa: Isa) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `forward`.
        match isa {
            Isa::Avx512 => return unsafe { x86::backward_avx512(x, w, r, dy, dx) },
            Isa::Avx2 => return unsafe { x86::backward_avx2(x, w, r, dy, dx) },
            Isa::Scalar => {}
        }
        let _ = isa;
        norm_rows_backward(x, w, r, dy, dx)
    }

    pub(super) fn weight_grad(
        x: &[f32],
        r: &[f32],
        dy: &[f32],
        h: usize,
        col: usize,
        out: &mut [f32],
        isa: Isa,
    ) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `forward`.
        match isa {
            Isa::Avx512 => return unsafe { x86::weight_grad_avx512(x, r, dy, h, col, out) },
            Isa::Avx2 => return unsafe { x86::weight_grad_avx2(x, r, dy, h, col, out) },
            Isa::Scalar => {}
        }
        let _ = isa;
        norm_weight_grad(x, r, dy, h, col, out)
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use super::super::{norm_rows_backward, norm_rows_forward, norm_weight_grad};

        #[target_feature(enable = "avx512f")]
        pub(in super::super) unsafe fn forward_avx512(
            x: &[f32],
            w: &[f32],
            eps: f32,
            y: &mut [f32],
            r: &mut [f32],
        ) {
            norm_rows_forward(x, w, eps, y, r)
        }

        #[target_feature(enable = "avx2,fma")]
        pub(in super::super) unsafe fn forward_avx2(
            x: &[f32],
            w: &[f32],
            eps: f32,
            y: &mut [f32],
            r: &mut [f32],
        ) {
            norm_rows_forward(x, w, eps, y, r)
        }

        #[target_feature(enable = "avx512f")]
        pub(in super::super) unsafe fn backward_avx512(
            x: &[f32],
            w: &[f32],
            r: &[f32],
            dy: &[f32],
            dx: &mut [f32],
        ) {
            norm_rows_backward(x, w, r, dy, dx)
        }

        #[target_feature(enable = "avx2,fma")]
        pub(in super::super) unsafe fn backward_avx2(
            x: &[f32],
            w: &[f32],
            r: &[f32],
            dy: &[f32],
            dx: &mut [f32],
        ) {
            norm_rows_backward(x, w, r, dy, dx)
        }

        #[target_feature(enable = "avx512f")]
        pub(in super::super) unsafe fn weight_grad_avx512(
            x: &[f32],
            r: &[f32],
            dy: &[f32],
            h: usize,
            col: usize,
            out: &mut [f32],
        ) {
            norm_weight_grad(x, r, dy, h, col, out)
        }

        #[target_feature(enable = "avx2,fma")]
        pub(in super::super) unsafe fn weight_grad_avx2(
            x: &[f32],
            r: &[f32],
            dy: &[f32],
            h: usize,
            col: usize,
            out: &mut [f32],
        ) {
            norm_weight_grad(x, r, dy, h, col, out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{bits, data};

    /// RMSNorm by its definition in f64.
    fn norm_f64(x: &[f32], w: &[f32], eps: f64, dy: &[f32]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let h = w.len();
        let n = x.len() / h;
        let (mut y, mut dx, mut dw) = (vec![0f64; n * h], vec![0f64; n * h], vec![0f64; h]);
        for i in 0..n {
            let xr: Vec<f64> = x[i * h..(i + 1) * h].iter().map(|&v| v as f64).collect();
            let ms = xr.iter().map(|v| v * v).sum::<f64>() / h as f64;
            let r = 1.0 / (ms + eps).sqrt();
            let gw: Vec<f64> = (0..h).map(|j| dy[i * h + j] as f64 * w[j] as f64).collect();
            let c: f64 = (0..h).map(|j| gw[j] * xr[j]).sum();
            for j in 0..h {
                y[i * h + j] = xr[j] * r * w[j] as f64;
                dx[i * h + j] = gw[j] * r - xr[j] * c * r * r * r / h as f64;
                dw[j] += xr[j] * r * dy[i * h + j] as f64;
            }
        }
        (y, dx, dw)
    }

    fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(0f64, |a, b| a.max(b.abs()));
        for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g as f64 - w).abs() <= tol * (scale + w.abs()),
                "{what}[{k}]: {g} vs {w}"
            );
        }
    }

    #[test]
    fn rms_norm_matches_the_definition_in_f64() {
        // Widths with and without a remainder of 16, rows enough for several tasks.
        for (n, h) in [(3usize, 5usize), (40, 576), (7, 1000 + 3)] {
            let x: Vec<f32> = data(n * h, h as u64).iter().map(|v| v * 0.01).collect();
            let w: Vec<f32> = data(h, 7).iter().map(|v| 1.0 + v * 1e-3).collect();
            let dy = data(n * h, 99);
            let (y, r) = rms_norm_forward(&x, &w, 1e-5, crate::Isa::detected());
            let (dx, dw) = rms_norm_backward(&x, &w, &r, &dy, crate::Isa::detected());
            let (wy, wdx, wdw) = norm_f64(&x, &w, 1e-5, &dy);
            close(&y, &wy, 1e-6, "y");
            close(&dx, &wdx, 1e-5, "dx");
            close(&dw, &wdw, 1e-5, "dw");
            assert!(dx.iter().any(|&v| v != 0.0) && dw.iter().any(|&v| v != 0.0));
        }
    }

    #[test]
    fn rms_norm_bits_do_not_depend_on_isa_batch_or_threads() {
        let (n, h) = (33, 576 + 7);
        let x = data(n * h, 5);
        let w = data(h, 6);
        let dy = data(n * h, 8);
        let (y0, r0) = rms_norm_forward(&x, &w, 1e-6, Isa::Scalar);
        let (dx0, dw0) = rms_norm_backward(&x, &w, &r0, &dy, Isa::Scalar);
        for isa in crate::testing::isas() {
            let (y, r) = rms_norm_forward(&x, &w, 1e-6, isa);
            assert_eq!(bits(&y), bits(&y0), "{isa:?}");
            let (dx, dw) = rms_norm_backward(&x, &w, &r, &dy, isa);
            assert_eq!(bits(&dx), bits(&dx0), "{isa:?}");
            assert_eq!(bits(&dw), bits(&dw0), "{isa:?}");
        }
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (y1, r1) = one.install(|| rms_norm_forward(&x, &w, 1e-6, crate::Isa::detected()));
        let (dx1, dw1) =
            one.install(|| rms_norm_backward(&x, &w, &r1, &dy, crate::Isa::detected()));
        assert_eq!(bits(&y1), bits(&y0));
        assert_eq!((bits(&dx1), bits(&dw1)), (bits(&dx0), bits(&dw0)));
        // A row alone gives the bits it has in the batch.
        let i = 17;
        let (yi, ri) = rms_norm_forward(&x[i * h..(i + 1) * h], &w, 1e-6, crate::Isa::detected());
        assert_eq!(bits(&yi), bits(&y0[i * h..(i + 1) * h]));
        let (dxi, _) = rms_norm_backward(
            &x[i * h..(i + 1) * h],
            &w,
            &ri,
            &dy[i * h..(i + 1) * h],
            crate::Isa::detected(),
        );
        assert_eq!(bits(&dxi), bits(&dx0[i * h..(i + 1) * h]));
    }

    #[test]
    fn swiglu_matches_the_definition_in_f64() {
        let (n, i) = (9, 37);
        let gu: Vec<f32> = data(n * 2 * i, 3)
            .iter()
            .map(|v| v.clamp(-1.0, 1.0) * 9.0)
            .collect();
        let dy: Vec<f32> = data(n * i, 4).iter().map(|v| v.clamp(-1.0, 1.0)).collect();
        let y = swiglu_forward(&gu, i);
        let dgu = swiglu_backward(&gu, &dy, i);
        for r in 0..n {
            for j in 0..i {
                let g = gu[r * 2 * i + j] as f64;
                let u = gu[r * 2 * i + i + j] as f64;
                let d = dy[r * i + j] as f64;
                let s = 1.0 / (1.0 + (-g).exp());
                let want_y = g * s * u;
                let want_dg = d * u * (s + g * s * (1.0 - s));
                let want_du = d * g * s;
                let tol = |w: f64| 1e-6 * (1.0 + w.abs());
                assert!((y[r * i + j] as f64 - want_y).abs() <= tol(want_y));
                let dg = dgu[r * 2 * i + j] as f64;
                let du = dgu[r * 2 * i + i + j] as f64;
                // The two terms of ∂L/∂g cancel near g ≈ −1.28: tolerance on their sizes.
                let size = (d * u).abs() * (s + (g * s * (1.0 - s)).abs());
                assert!(
                    (dg - want_dg).abs() <= 1e-6 * (1.0 + size),
                    "{dg} vs {want_dg}"
                );
                assert!((du - want_du).abs() <= tol(want_du), "{du} vs {want_du}");
            }
        }
        // No −0 in the gradient (burn's slice backward adds +0).
        assert!(dgu.iter().all(|v| v.to_bits() != (-0f32).to_bits()));
    }
}
