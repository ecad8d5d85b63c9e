//! Masked attention for training and prefill, forward and backward, on f32 slices: the two
//! products of each head (`Q·Kᵀ`, `P·V`, and the four of backward) on [`crate::sgemm`]'s kernels,
//! the masked softmax in between, heads in parallel.
//!
//! For one problem (a batch row and a key/value head, its `g` query heads stacked along the
//! query axis: `rows = g·T` queries against `keys` keys of dimension `d`), with `s` the scale and
//! `M` the mask (true = hidden):
//!
//! ```text
//! forward:   P = softmax_rows(s·Q·Kᵀ, hidden entries excluded)     O = P·V
//! backward:  dV = Pᵀ·dO     dP = dO·Vᵀ     dS = s·P∘(dP − rowsum(P∘dP))
//!            dQ = dS·K      dK = dSᵀ·Q
//! ```
//!
//! (`∂P_ij/∂u_il = P_ij([j = l] − P_il)` for the softmax of `u = s·Q·Kᵀ`). Every product is one
//! FMA chain per output (the bits of [`crate::sgemm::sgemm`] on the same operands); the softmax
//! of a row runs in a fixed order, so results do not depend on the batch, the thread count or
//! the ISA. A row whose every key is hidden gets all-zero probabilities (burn's composite gives
//! NaN there; rlcr's masks never hide a query's own position).
//!
//! Why: burn's attention on `Autodiff<Flex>` is a composite (batched matmul through the gemm
//! crate, mask fill, a softmax of five element-wise ops, each kept for backward); the products
//! ran at about a fifth of a core.
use rayon::prelude::*;

use crate::head::exp_poly;
use crate::sgemm::{sgemm_serial, View};
use crate::Isa;

/// Shape of an attention call: `batch · kv_heads` independent problems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Rows of the batch (each has its own mask).
    pub batch: usize,
    /// Key/value heads per row (they share the row's mask).
    pub kv_heads: usize,
    /// Query rows per problem (`g · T`: the query heads of one key/value head, stacked).
    pub rows: usize,
    /// Keys per problem.
    pub keys: usize,
    /// Head dimension.
    pub dim: usize,
}

impl Shape {
    fn problems(&self) -> usize {
        self.batch * self.kv_heads
    }

    fn check(&self, q: &[f32], k: &[f32], v: &[f32], mask: &[bool]) {
        let p = self.problems();
        assert_eq!(
            q.len(),
            p * self.rows * self.dim,
            "q of {} for {self:?}",
            q.len()
        );
        assert_eq!(
            k.len(),
            p * self.keys * self.dim,
            "k of {} for {self:?}",
            k.len()
        );
        assert_eq!(v.len(), k.len(), "v of {} for {self:?}", v.len());
        assert_eq!(
            mask.len(),
            self.batch * self.rows * self.keys,
            "mask for {self:?}"
        );
    }
}

/// Whether attention runs on rlcr's kernels for `isa` on this CPU.
pub fn has_kernel(isa: Isa) -> bool {
    crate::sgemm::has_kernel(isa)
}

/// Forward: `q: [batch, kv_heads, rows, dim]`, `k`, `v`: `[batch, kv_heads, keys, dim]`,
/// `mask: [batch, rows, keys]` (true = hidden), all row-major. Returns `(O, P)`: the output
/// `[batch, kv_heads, rows, dim]` and the probabilities `[batch, kv_heads, rows, keys]` (what
/// [`backward`] needs); `None` when `isa` has no kernel.
///
/// # Panics
/// If a slice's length does not match `shape` (a caller bug).
pub fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &[bool],
    shape: Shape,
    scale: f32,
    isa: Isa,
) -> Option<(Vec<f32>, Vec<f32>)> {
    if !has_kernel(isa) {
        return None;
    }
    shape.check(q, k, v, mask);
    let Shape {
        kv_heads,
        rows,
        keys,
        dim,
        ..
    } = shape;
    let mut out = vec![0f32; shape.problems() * rows * dim];
    let mut probs = vec![0f32; shape.problems() * rows * keys];
    if rows == 0 || dim == 0 || keys == 0 {
        return Some((out, probs));
    }
    out.par_chunks_mut(rows * dim)
        .zip(probs.par_chunks_mut(rows * keys))
        .enumerate()
        .for_each(|(p, (o, pr))| {
            let qp = View::rows(&q[p * rows * dim..][..rows * dim], dim);
            let kp = View::rows(&k[p * keys * dim..][..keys * dim], dim);
            let vp = View::rows(&v[p * keys * dim..][..keys * dim], dim);
            let m = &mask[(p / kv_heads) * rows * keys..][..rows * keys];
            // Scores Q·Kᵀ, then the masked softmax in place.
            sgemm_serial(rows, keys, dim, qp, kp.t(), pr, isa);
            for (srow, mrow) in pr.chunks_exact_mut(keys).zip(m.chunks_exact(keys)) {
                softmax_row(srow, mrow, scale, isa);
            }
            sgemm_serial(rows, dim, keys, View::rows(pr, keys), vp, o, isa);
        });
    Some((out, probs))
}

/// Gradients of [`forward`]: `(dQ, dK, dV)` from the inputs, the probabilities `probs` returned
/// by the forward, and `d_out` (`∂L/∂O`, shaped as `O`); each shaped as its input. `None` when
/// `isa` has no kernel.
///
/// # Panics
/// If a slice's length does not match `shape` (a caller bug).
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    probs: &[f32],
    d_out: &[f32],
    shape: Shape,
    scale: f32,
    isa: Isa,
) -> Option<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    if !has_kernel(isa) {
        return None;
    }
    let Shape {
        rows, keys, dim, ..
    } = shape;
    let n = shape.problems();
    assert!(
        q.len() == n * rows * dim
            && k.len() == n * keys * dim
            && v.len() == k.len()
            && probs.len() == n * rows * keys
            && d_out.len() == q.len(),
        "operands do not match {shape:?}"
    );
    let mut dq = vec![0f32; q.len()];
    let mut dk = vec![0f32; k.len()];
    let mut dv = vec![0f32; v.len()];
    if rows == 0 || dim == 0 || keys == 0 {
        return Some((dq, dk, dv));
    }
    dq.par_chunks_mut(rows * dim)
        .zip(dk.par_chunks_mut(keys * dim))
        .zip(dv.par_chunks_mut(keys * dim))
        .enumerate()
        .for_each_init(
            || vec![0f32; rows * keys],
            |ds, (p, ((dqp, dkp), dvp))| {
                let qp = View::rows(&q[p * rows * dim..][..rows * dim], dim);
                let kp = View::rows(&k[p * keys * dim..][..keys * dim], dim);
                let vp = View::rows(&v[p * keys * dim..][..keys * dim], dim);
                let pp = &probs[p * rows * keys..][..rows * keys];
                let dop = View::rows(&d_out[p * rows * dim..][..rows * dim], dim);
                // dV = Pᵀ·dO.
                sgemm_serial(keys, dim, rows, View::rows(pp, keys).t(), dop, dvp, isa);
                // dP = dO·Vᵀ, then dS = s·P∘(dP − rowsum(P∘dP)) in place.
                sgemm_serial(rows, keys, dim, dop, vp.t(), ds, isa);
                for (drow, prow) in ds.chunks_exact_mut(keys).zip(pp.chunks_exact(keys)) {
                    softmax_grad_row(drow, prow, scale);
                }
                let dsv = View::rows(ds, keys);
                // dQ = dS·K, dK = dSᵀ·Q.
                sgemm_serial(rows, dim, keys, dsv, kp, dqp, isa);
                sgemm_serial(keys, dim, rows, dsv.t(), qp, dkp, isa);
            },
        );
    Some((dq, dk, dv))
}

/// `row ← softmax(scale · row)` over the entries whose `hidden` flag is false (hidden entries
/// get 0; a row with every entry hidden gets all zeros). Max subtracted; the sum in f32, in
/// order, over the visible entries (a hidden entry's 0 would change no bit of it).
///
/// The exponentials run as their own loop so that it vectorises (compiled for AVX-512F and for
/// AVX2 below: [`exp_poly`] is plain multiplies and adds, the same bits in every lane); only the
/// sum stays a serial chain. The bits are those of the one-loop form (`softmax_row_reference`
/// in the tests; measured: this row was 3.6 % of a SmolLM2-135M training step in that form).
#[inline(always)]
fn softmax_row_body(row: &mut [f32], hidden: &[bool], scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for (x, &h) in row.iter_mut().zip(hidden) {
        *x *= scale;
        if !h && *x > max {
            max = *x;
        }
    }
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    for (x, &h) in row.iter_mut().zip(hidden) {
        let e = exp_poly(*x - max);
        *x = if h { 0.0 } else { e };
    }
    let mut sum = 0f32;
    for (&x, &h) in row.iter().zip(hidden) {
        if !h {
            sum += x;
        }
    }
    let inv = 1.0 / sum;
    for x in row.iter_mut() {
        *x *= inv;
    }
}

/// [`softmax_row_body`] on the widest vectors of `isa` (lowered to what the CPU has).
fn softmax_row(row: &mut [f32], hidden: &[bool], scale: f32, isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the ISA is lowered to what the CPU has first.
        match isa.min(Isa::detected()) {
            Isa::Avx512 => return unsafe { x86::softmax_row_avx512(row, hidden, scale) },
            Isa::Avx2 => return unsafe { x86::softmax_row_avx2(row, hidden, scale) },
            Isa::Scalar => {}
        }
    }
    let _ = isa;
    softmax_row_body(row, hidden, scale)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::softmax_row_body;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn softmax_row_avx512(row: &mut [f32], hidden: &[bool], scale: f32) {
        softmax_row_body(row, hidden, scale)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn softmax_row_avx2(row: &mut [f32], hidden: &[bool], scale: f32) {
        softmax_row_body(row, hidden, scale)
    }
}

/// `d ← scale · p ∘ (d − Σ_j p_j d_j)`: the gradient through a softmax row (and the scale).
fn softmax_grad_row(d: &mut [f32], p: &[f32], scale: f32) {
    let dot: f32 = d.iter().zip(p).map(|(a, b)| a * b).sum();
    for (x, &pj) in d.iter_mut().zip(p) {
        *x = scale * pj * (*x - dot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// The definition in f64: `(O, dQ, dK, dV)` for a loss `Σ O∘G`.
    #[allow(clippy::type_complexity)]
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        mask: &[bool],
        g: &[f32],
        sh: Shape,
        scale: f64,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let Shape {
            kv_heads,
            rows,
            keys,
            dim,
            ..
        } = sh;
        let n = sh.problems();
        let (mut o, mut dq) = (vec![0f64; n * rows * dim], vec![0f64; n * rows * dim]);
        let (mut dk, mut dv) = (vec![0f64; n * keys * dim], vec![0f64; n * keys * dim]);
        for p in 0..n {
            let b = p / kv_heads;
            for i in 0..rows {
                let qi = |c: usize| q[(p * rows + i) * dim + c] as f64;
                let kj = |j: usize, c: usize| k[(p * keys + j) * dim + c] as f64;
                let vj = |j: usize, c: usize| v[(p * keys + j) * dim + c] as f64;
                let hid = |j: usize| mask[(b * rows + i) * keys + j];
                let u: Vec<f64> = (0..keys)
                    .map(|j| scale * (0..dim).map(|c| qi(c) * kj(j, c)).sum::<f64>())
                    .collect();
                let max = (0..keys)
                    .filter(|&j| !hid(j))
                    .map(|j| u[j])
                    .fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = (0..keys)
                    .map(|j| if hid(j) { 0.0 } else { (u[j] - max).exp() })
                    .collect();
                let z: f64 = e.iter().sum();
                let pr: Vec<f64> = e.iter().map(|x| x / z).collect();
                let gi = |c: usize| g[(p * rows + i) * dim + c] as f64;
                for c in 0..dim {
                    o[(p * rows + i) * dim + c] = (0..keys).map(|j| pr[j] * vj(j, c)).sum();
                }
                let dp: Vec<f64> = (0..keys)
                    .map(|j| (0..dim).map(|c| gi(c) * vj(j, c)).sum())
                    .collect();
                let dot: f64 = (0..keys).map(|j| pr[j] * dp[j]).sum();
                for j in 0..keys {
                    let ds = scale * pr[j] * (dp[j] - dot);
                    for c in 0..dim {
                        dv[(p * keys + j) * dim + c] += pr[j] * gi(c);
                        dq[(p * rows + i) * dim + c] += ds * kj(j, c);
                        dk[(p * keys + j) * dim + c] += ds * qi(c);
                    }
                }
            }
        }
        (o, dq, dk, dv)
    }

    fn close(got: &[f32], want: &[f64], what: &str) {
        let scale = want.iter().fold(0f64, |s, v| s.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (*a as f64 - b).abs() <= 1e-5 * (1.0 + scale),
                "{what}[{i}]: {a} vs {b}"
            );
        }
    }

    /// The one-loop softmax row that [`softmax_row`] replaced (exponential and sum in one loop,
    /// every entry added): the bits the vectorised form must keep.
    fn softmax_row_reference(row: &mut [f32], hidden: &[bool], scale: f32) {
        let mut max = f32::NEG_INFINITY;
        for (x, &h) in row.iter_mut().zip(hidden) {
            *x *= scale;
            if !h && *x > max {
                max = *x;
            }
        }
        if max == f32::NEG_INFINITY {
            row.fill(0.0);
            return;
        }
        let mut sum = 0f32;
        for (x, &h) in row.iter_mut().zip(hidden) {
            *x = if h { 0.0 } else { exp_poly(*x - max) };
            sum += *x;
        }
        let inv = 1.0 / sum;
        for x in row.iter_mut() {
            *x *= inv;
        }
    }

    /// The vectorised softmax row gives the one-loop form's bits on every ISA: causal rows,
    /// scattered masks, a fully hidden row, lengths around the vector widths, large scores.
    #[test]
    fn softmax_row_keeps_the_one_loop_bits() {
        let mut isas = isas();
        isas.push(Isa::Scalar);
        for len in [1, 7, 15, 16, 17, 31, 33, 100, 512, 515] {
            for case in 0..4 {
                let row = vals(len, 10 + len as u64 * 4 + case);
                let hidden: Vec<bool> = (0..len)
                    .map(|j| match case {
                        0 => false,
                        1 => j > len / 2,
                        2 => (j * 7 + 3) % 5 == 0,
                        _ => true,
                    })
                    .collect();
                for scale in [0.125f32, 30.0] {
                    let mut want = row.clone();
                    softmax_row_reference(&mut want, &hidden, scale);
                    for &isa in &isas {
                        let mut got = row.clone();
                        softmax_row(&mut got, &hidden, scale, isa);
                        let (g, w): (Vec<u32>, Vec<u32>) = (
                            got.iter().map(|x| x.to_bits()).collect(),
                            want.iter().map(|x| x.to_bits()).collect(),
                        );
                        assert_eq!(g, w, "len {len} case {case} scale {scale} {isa:?}");
                    }
                    if case == 3 {
                        assert!(want.iter().all(|&x| x == 0.0));
                    } else {
                        let sum: f32 = want.iter().sum();
                        assert!((sum - 1.0).abs() < 1e-5, "sums to {sum}");
                    }
                }
            }
        }
    }

    fn isas() -> Vec<Isa> {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .filter(|&i| has_kernel(i))
            .collect()
    }

    /// Values and gradients against the f64 definition (a causal mask with a padded row and
    /// partial tiles), the same bits on both ISAs and for a batch of one.
    #[test]
    fn forward_and_backward_match_the_definition() {
        if isas().is_empty() {
            return;
        }
        let sh = Shape {
            batch: 3,
            kv_heads: 2,
            rows: 2 * 13,
            keys: 13,
            dim: 20,
        };
        let n = sh.problems();
        let (q, k, v) = (
            vals(n * sh.rows * sh.dim, 1),
            vals(n * sh.keys * sh.dim, 2),
            vals(n * sh.keys * sh.dim, 3),
        );
        let g = vals(n * sh.rows * sh.dim, 4);
        // Causal per query head (rows i and i + 13 are the same position); row 1 of the batch
        // has its first 4 keys hidden (left padding), except for a query's own position.
        let mut mask = vec![false; sh.batch * sh.rows * sh.keys];
        for b in 0..sh.batch {
            for i in 0..sh.rows {
                for j in 0..sh.keys {
                    let t = i % 13;
                    mask[(b * sh.rows + i) * sh.keys + j] = j > t || (b == 1 && j < 4 && j != t);
                }
            }
        }
        let scale = 1.0 / (sh.dim as f32).sqrt();
        let (o, dq, dk, dv) = reference(&q, &k, &v, &mask, &g, sh, scale as f64);
        let mut first = None;
        for isa in isas() {
            let (out, probs) = forward(&q, &k, &v, &mask, sh, scale, isa).unwrap();
            let grads = backward(&q, &k, &v, &probs, &g, sh, scale, isa).unwrap();
            close(&out, &o, "O");
            close(&grads.0, &dq, "dQ");
            close(&grads.1, &dk, "dK");
            close(&grads.2, &dv, "dV");
            let bits = (out, grads);
            match &first {
                None => first = Some(bits),
                Some(f) => assert!(*f == bits, "{isa:?} differs"),
            }
        }
        // Batch row 2 alone gives its rows of the whole batch, bit for bit.
        let isa = isas()[0];
        let one = Shape { batch: 1, ..sh };
        let (qs, ks) = (
            sh.kv_heads * sh.rows * sh.dim,
            sh.kv_heads * sh.keys * sh.dim,
        );
        let ms = sh.rows * sh.keys;
        let (out1, _) = forward(
            &q[2 * qs..],
            &k[2 * ks..],
            &v[2 * ks..],
            &mask[2 * ms..],
            one,
            scale,
            isa,
        )
        .unwrap();
        let (all, _) = forward(&q, &k, &v, &mask, sh, scale, isa).unwrap();
        assert_eq!(out1, all[2 * qs..]);
    }
}
