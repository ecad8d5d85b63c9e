//! The sampler's draw on the model's device: logits stay where the model computed them, and a
//! decode step reads back only the sampled ids with their behaviour log-probs (`[rows, 2]`, one
//! read).
//!
//! [`draw`] implements [`super::logits`]' pipeline (temperature → top-k → top-p → min-p, an
//! inverse-CDF draw in ascending id order from the host's ChaCha20 uniform, the log-prob at
//! temperature 1 over the full vocabulary) with burn tensor ops, without sorting: burn's sort
//! reads tensors back to the host on the GPU backends. The top-k and top-p cut-offs are value
//! thresholds found by bisection on the device (a fixed number of halvings, so nothing is read
//! to decide when to stop); the draw is a cumulative sum in id order (in two levels, blocks of
//! 256 ids and the block sums: burn's cumulative sum on these backends is quadratic in the
//! length) and a count of the entries at or below `u · total`.
//!
//! What it keeps of the host sampler ([`super::logits::Processor`]), and what not (the test
//! `device_draw_agrees_with_the_host` pins it):
//! - the same token whenever the draw `u` is farther than [`cdf_tolerance`] (relative to the kept
//!   mass) from a boundary of the kept tokens' cumulative distribution, the kept sets being
//!   equal: the device sums in f32 in the backend's order, the host in f64 in id order;
//! - the same kept sets except at ties: top-k and top-p keep every token whose value equals the
//!   cut-off's (the host breaks ties towards the lower id) or lies within
//!   [`BISECT_WIDTH`] below it, and top-p's mass test is in f32 (a boundary token whose mass
//!   before it is within [`cdf_tolerance`] of `p` can go either way);
//! - greedy decoding exactly (the maximum, the lowest id on ties);
//! - the behaviour log-prob within f32 rounding of the host's f64 log-sum-exp (about 1e-6).
//!
//! So on a GPU the sampled tokens are a function of the logits and the draws, as on the CPU, but
//! not bit for bit the CPU's sampler: `--device cpu` keeps the host sampler (the tables of the
//! CPU build are unchanged), the GPU backends use this one.
use anyhow::{ensure, Result};
use burn::tensor::{Bool, Int, Tensor, TensorData};

use super::logits::SamplingParams;
use crate::model::transfer;

/// Halvings of the top-k / top-p threshold search (from a range of [`SEARCH_RANGE`] + 1 in
/// logits/temperature units).
const BISECT_STEPS: usize = 40;

/// The search covers `[max − SEARCH_RANGE, max + 1]`: a token more than 200 below the maximum has
/// weight `exp(−200) = 0` in f32 and can never be drawn, wherever the cut-off is.
const SEARCH_RANGE: f32 = 200.0;

/// Width of the threshold search's last interval: tokens this close below a cut-off may be kept
/// with it.
pub const BISECT_WIDTH: f64 = (SEARCH_RANGE as f64 + 1.0) / (1u64 << BISECT_STEPS) as f64;

/// How far (relative to the kept mass) the draw can be from a boundary of the cumulative
/// distribution and still land on the other side of it on the device: the f32 sums' rounding,
/// `n · 2⁻²⁴` for `n` allowed ids (a sequential sum's worst case; parallel scans do better), the
/// draw's own rounding to f32 included.
pub fn cdf_tolerance(n: usize) -> f64 {
    (n as f64 + 2.0) * f64::from(f32::EPSILON) / 2.0
}

/// Draw one token per sample row from `logits` (`[n, V]`, on any device): row `r` reads logits
/// row `src[r]` and the uniform `u[r]` (in [0, 1)); only ids below `allowed` are drawn. Returns
/// `(token, behaviour log-prob)` per row. One upload (the draws and the row map) and one read.
pub fn draw(
    logits: &Tensor<2>,
    src: &[usize],
    u: &[f64],
    params: &SamplingParams,
    allowed: usize,
) -> Result<Vec<(u32, f32)>> {
    let [n, v] = logits.dims();
    let r = src.len();
    ensure!(
        u.len() == r,
        "internal: {} draws for {r} sample rows",
        u.len()
    );
    if r == 0 {
        return Ok(Vec::new());
    }
    ensure!(
        src.iter().all(|&k| k < n),
        "internal: a sample row reads beyond the {n} logits rows"
    );
    let a = allowed.min(v).max(1);
    let device = logits.device();
    // [2, r]: the draws (f32) and the logits row of each sample row (exact in f32 below 2^24).
    let mut host = Vec::with_capacity(2 * r);
    host.extend(u.iter().map(|&x| x as f32));
    host.extend(src.iter().map(|&k| k as f32));
    let up: Tensor<2> = transfer::upload(TensorData::new(host, [2, r]), &device);
    let uniform = up.clone().slice([0..1, 0..r]).reshape([r, 1]);
    let identity = r == n && src.iter().enumerate().all(|(i, &k)| i == k);
    // The draw is computed in f32 whatever the logits' dtype.
    let logits = if logits.dtype() == burn::tensor::DType::F32 {
        logits.clone()
    } else {
        logits.clone().cast(burn::tensor::DType::F32)
    };
    let lg = if identity {
        logits
    } else {
        let idx: Tensor<1, Int> = up.slice([1..2, 0..r]).reshape([r]).int();
        logits.select(0, idx)
    };
    // NaN counts as −∞ (as on the host).
    let lg = lg.clone().mask_fill(lg.is_nan(), f32::NEG_INFINITY);
    // The behaviour log-prob's normaliser: temperature 1, the full vocabulary.
    let m1 = lg.clone().max_dim(1);
    let lse = m1.clone() + (lg.clone() - m1).exp().sum_dim(1).log();
    let z = if a < v {
        lg.clone().slice([0..r, 0..a])
    } else {
        lg.clone()
    };
    let iota = ids(a, &device);
    let tok = if params.is_greedy() {
        argmax_lowest(z, &iota, a)
    } else {
        sample(z, uniform, &iota, params, a)
    };
    let lp = lg.gather(1, tok.clone().int()) - lse;
    let out = transfer::read(Tensor::cat(vec![tok, lp], 1))?
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("reading the sampled tokens: {e:?}"))?;
    ensure!(
        out.len() == 2 * r,
        "internal: {} values for {r} sampled tokens",
        out.len()
    );
    Ok(out.chunks_exact(2).map(|c| (c[0] as u32, c[1])).collect())
}

/// Width of the blocks of the two-level cumulative sum: burn's cumulative sum on the GPU backends
/// reads every earlier element for each output (quadratic in the length), so it only ever runs
/// over a block (256) or over the block sums (vocabulary / 256).
const BLOCK: usize = 256;

/// Blocks covering `a` ids.
fn blocks(a: usize) -> usize {
    a.div_ceil(BLOCK)
}

/// Ids `0..a` as f32 `[1, a]`, made on the device (burn's `arange` uploads from the host):
/// `BLOCK · block + offset`, each from a short cumulative sum of ones.
fn ids(a: usize, device: &burn::tensor::Device) -> Tensor<2> {
    let nb = blocks(a);
    let block = Tensor::<2>::ones([nb, 1], device).cumsum(0) - 1.0;
    let offset = Tensor::<2>::ones([1, BLOCK], device).cumsum(1) - 1.0;
    (block.mul_scalar(BLOCK as f32) + offset)
        .reshape([1, nb * BLOCK])
        .slice([0..1, 0..a])
}

/// The first id whose cumulative weight (in id order) exceeds `target` (`[r, 1]`), as f32
/// `[r, 1]`: block sums, their cumulative sum picks the block, the block's own cumulative sum
/// (plus the mass before it) picks the id. Past the end of a block (rounding between the two
/// sums), the block's last id with weight.
fn first_above(wk: Tensor<2>, target: Tensor<2>) -> Tensor<2> {
    let [r, a] = wk.dims();
    let nb = blocks(a);
    let device = wk.device();
    let padded = if nb * BLOCK > a {
        Tensor::cat(vec![wk, Tensor::zeros([r, nb * BLOCK - a], &device)], 1)
    } else {
        wk
    };
    let w3 = padded.reshape([r, nb, BLOCK]);
    let sums = w3.clone().sum_dim(2).reshape([r, nb]);
    let cum = sums.clone().cumsum(1);
    let block = (cum.clone() - target.clone())
        .lower_equal_elem(0.0)
        .float()
        .sum_dim(1)
        .clamp_max((nb - 1) as f32);
    let bi: Tensor<2, Int> = block.clone().int();
    let before = (cum - sums).gather(1, bi.clone());
    let idx: Tensor<3, Int> = bi.reshape([r, 1, 1]).expand([r, 1, BLOCK]);
    let inner = w3.gather(1, idx).reshape([r, BLOCK]);
    let offset = Tensor::<2>::ones([1, BLOCK], &device).cumsum(1) - 1.0;
    let k = (inner.clone().cumsum(1) + before - target)
        .lower_equal_elem(0.0)
        .float()
        .sum_dim(1);
    let last = (offset + 1.0)
        .mul(inner.greater_elem(0.0).float())
        .max_dim(1)
        .sub_scalar(1.0)
        .clamp_min(0.0);
    block.mul_scalar(BLOCK as f32) + k.min_pair(last)
}

/// The lowest id of each row's maximum, as f32 `[r, 1]`.
fn argmax_lowest(z: Tensor<2>, iota: &Tensor<2>, a: usize) -> Tensor<2> {
    let [r, _] = z.dims();
    let m = z.clone().max_dim(1);
    let below: Tensor<2, Bool> = (z - m).lower_elem(0.0);
    iota.clone()
        .expand([r, a])
        .mask_fill(below, a as f32)
        .min_dim(1)
        .clamp_max((a - 1) as f32)
}

/// The inverse-CDF draw among the tokens that top-k, top-p and min-p keep, as f32 `[r, 1]`.
fn sample(
    lg: Tensor<2>,
    uniform: Tensor<2>,
    iota: &Tensor<2>,
    params: &SamplingParams,
    a: usize,
) -> Tensor<2> {
    let [r, _] = lg.dims();
    let z = if params.temperature == 1.0 {
        lg
    } else {
        lg.div_scalar(params.temperature)
    };
    let m = z.clone().max_dim(1);
    // Every logit −∞: the host falls back to id 0 (its argmax); so does this.
    let dead: Tensor<2, Bool> = m.clone().is_inf().bool_and(m.clone().lower_elem(0.0));
    let w = (z.clone() - m.clone()).exp();
    let mut keep: Tensor<2> = Tensor::ones([r, a], &z.device());
    let k = params.top_k;
    if k > 0 && k < a {
        // The largest t with #{z ≥ t} ≥ k: lo keeps ≥ k tokens, hi fewer.
        let mut lo = m.clone().sub_scalar(SEARCH_RANGE);
        let mut hi = m.clone() + m.clone().abs().mul_scalar(1e-6) + 1.0;
        for _ in 0..BISECT_STEPS {
            let mid = (lo.clone() + hi.clone()).mul_scalar(0.5);
            let count = (z.clone() - mid.clone())
                .greater_equal_elem(0.0)
                .float()
                .sum_dim(1);
            let enough = count.greater_equal_elem(k as f32);
            lo = lo.mask_where(enough.clone(), mid.clone());
            hi = mid.mask_where(enough, hi);
        }
        keep = keep * (z.clone() - lo).greater_equal_elem(0.0).float();
    }
    if params.top_p < 1.0 {
        // The smallest t with mass(z > t) < p · mass (among the tokens top-k keeps): the tokens
        // at or above it are those with less than p of the mass ranked before them.
        let wk = w.clone() * keep.clone();
        let target = wk.clone().sum_dim(1).mul_scalar(params.top_p);
        let mut lo = m.clone().sub_scalar(SEARCH_RANGE);
        let mut hi = m.clone();
        for _ in 0..BISECT_STEPS {
            let mid = (lo.clone() + hi.clone()).mul_scalar(0.5);
            let above =
                (wk.clone() * (z.clone() - mid.clone()).greater_elem(0.0).float()).sum_dim(1);
            let less = (above - target.clone()).lower_elem(0.0);
            hi = hi.mask_where(less.clone(), mid.clone());
            lo = mid.mask_where(less, lo);
        }
        keep = keep * (z.clone() - hi).greater_equal_elem(0.0).float();
    }
    if params.min_p > 0.0 {
        keep = keep * w.clone().greater_equal_elem(params.min_p).float();
    }
    let wk = w * keep.clone();
    let target = uniform * wk.clone().sum_dim(1);
    let first = first_above(wk, target);
    // Rounding that leaves no winner: the last kept id (as the host does).
    let last_kept = (iota.clone().expand([r, a]) + 1.0)
        .mul(keep)
        .max_dim(1)
        .sub_scalar(1.0);
    first.min_pair(last_kept).mask_fill(dead, 0.0)
}

#[cfg(test)]
mod tests {
    //! The device draw against the host's [`Processor`] on the same logits and draws.
    use super::*;
    use crate::sample::logits::Processor;
    use rand::{Rng, SeedableRng};

    /// How close a draw came to a decision boundary, relative to the mass involved (f64, the
    /// host's rules): the smallest distance between `u` and a boundary of the kept tokens'
    /// cumulative distribution between ids `t1` and `t2`, and between `p` and the share of mass
    /// ranked before a token (top-p's test).
    fn boundary_gap(
        row: &[f32],
        params: &SamplingParams,
        u: f64,
        a: usize,
        t1: u32,
        t2: u32,
    ) -> f64 {
        let n = a.min(row.len());
        let inv_t = 1.0 / params.temperature;
        let z: Vec<f32> = row[..n].iter().map(|&x| x * inv_t).collect();
        let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f64> = z.iter().map(|&x| f64::from((x - m).exp())).collect();
        let mut rank: Vec<usize> = (0..n).collect();
        rank.sort_by(|&i, &j| z[j].total_cmp(&z[i]).then(i.cmp(&j)));
        let mut keep = vec![true; n];
        if params.top_k > 0 && params.top_k < n {
            for &i in &rank[params.top_k..] {
                keep[i] = false;
            }
        }
        let mut gap = f64::INFINITY;
        if params.top_p < 1.0 {
            let total: f64 = (0..n).filter(|&i| keep[i]).map(|i| w[i]).sum();
            let mut before = 0.0;
            let ranked: Vec<usize> = rank.iter().copied().filter(|&i| keep[i]).collect();
            for i in ranked {
                gap = gap.min((before / total - f64::from(params.top_p)).abs());
                if before >= f64::from(params.top_p) * total {
                    keep[i] = false;
                }
                before += w[i];
            }
        }
        for i in 0..n {
            keep[i] &= w[i] >= f64::from(params.min_p);
        }
        let total: f64 = (0..n).filter(|&i| keep[i]).map(|i| w[i]).sum();
        let (lo, hi) = (t1.min(t2) as usize, t1.max(t2) as usize);
        let mut acc = 0.0;
        for i in 0..n {
            if keep[i] {
                acc += w[i];
                if i >= lo && i < hi {
                    gap = gap.min((acc / total - u).abs());
                }
            }
        }
        gap
    }

    fn random_logits(
        rng: &mut rand_chacha::ChaCha8Rng,
        rows: usize,
        v: usize,
        scale: f32,
    ) -> Vec<f32> {
        (0..rows * v)
            .map(|_| (rng.random::<f32>() - 0.5) * 2.0 * scale)
            .collect()
    }

    /// The CPU's tensors, and a wgpu device in builds with `--features wgpu` (`RLCR_WGPU_DEVICE`
    /// picks the adapter, default `wgpu`).
    fn devices() -> Vec<burn::tensor::Device> {
        let mut d = vec!["cpu".to_string()];
        if cfg!(feature = "wgpu") {
            d.push(std::env::var("RLCR_WGPU_DEVICE").unwrap_or_else(|_| "wgpu".into()));
        }
        d.iter()
            .map(|s| crate::model::device_from_str(s).unwrap())
            .collect()
    }

    #[test]
    fn device_draw_agrees_with_the_host() {
        for dev in devices() {
            agrees_with_the_host(&dev);
        }
    }

    fn agrees_with_the_host(dev: &burn::tensor::Device) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let (rows, v) = (48, 1000);
        let settings = [
            SamplingParams::default(),
            SamplingParams::greedy(),
            SamplingParams {
                temperature: 0.7,
                top_k: 50,
                top_p: 1.0,
                min_p: 0.0,
            },
            SamplingParams {
                temperature: 1.3,
                top_k: 0,
                top_p: 0.9,
                min_p: 0.0,
            },
            SamplingParams {
                temperature: 0.6,
                top_k: 200,
                top_p: 0.8,
                min_p: 0.02,
            },
        ];
        let mut disagree = 0;
        let mut total = 0;
        for params in settings {
            for (scale, allowed) in [(4.0, v), (12.0, 900)] {
                let logits = random_logits(&mut rng, rows, v, scale);
                let u: Vec<f64> = (0..rows).map(|_| rng.random::<f64>()).collect();
                // Rows read in a shuffled, repeating order (as after prefill's expansion).
                let src: Vec<usize> = (0..rows).map(|i| (i * 7 + 3) % rows).collect();
                let t: Tensor<2> =
                    Tensor::from_data(TensorData::new(logits.clone(), [rows, v]), dev);
                let got = draw(&t, &src, &u, &params, allowed).unwrap();
                let mut p = Processor::new();
                for (i, (&k, &(tok, lp))) in src.iter().zip(&got).enumerate() {
                    let row = &logits[k * v..(k + 1) * v];
                    let (ht, hl) = p.choose_with_logprob(row, allowed, &params, u[i]);
                    total += 1;
                    assert!(
                        (tok as usize) < allowed,
                        "{params:?}: token {tok} not below {allowed}"
                    );
                    assert!(
                        (lp - crate::sample::logits::logprob_of(row, tok as usize)).abs() < 1e-5,
                        "{params:?}: log-prob {lp} of {tok}"
                    );
                    if tok != ht {
                        disagree += 1;
                        assert!(!params.is_greedy(), "greedy: {tok} vs {ht}");
                        let gap = boundary_gap(row, &params, u[i], allowed, tok, ht);
                        assert!(
                            gap <= cdf_tolerance(allowed),
                            "{params:?} row {i}: device {tok}, host {ht}, u = {} is {gap:e} from \
                             the nearest decision boundary (tolerance {:e})",
                            u[i],
                            cdf_tolerance(allowed)
                        );
                    } else {
                        assert!((lp - hl).abs() < 1e-5, "{params:?}: {lp} vs {hl}");
                    }
                }
            }
        }
        assert!(total == 5 * 2 * rows);
        // Disagreements need a draw within ~1e-4 of a boundary: essentially never here.
        assert!(disagree <= 1, "{disagree} of {total} tokens differ");
    }

    #[test]
    fn device_draw_on_a_boundary_and_at_ties() {
        for dev in devices() {
            boundary_and_ties(&dev);
        }
    }

    fn boundary_and_ties(dev: &burn::tensor::Device) {
        // Four equal logits: the CDF boundaries are exactly 0.25, 0.5, 0.75.
        let logits = vec![0f32, 0.0, 0.0, 0.0];
        let t: Tensor<2> = Tensor::from_data(TensorData::new(logits.clone(), [1, 4]), dev);
        let mut p = Processor::new();
        for u in [0.0, 0.1, 0.26, 0.49, 0.51, 0.9, 0.999_999] {
            let got = draw(&t, &[0], &[u], &SamplingParams::default(), 4).unwrap()[0];
            let host = p.choose_with_logprob(&logits, 4, &SamplingParams::default(), u);
            assert_eq!(got.0, host.0, "u = {u}");
        }
        // Greedy ties go to the lowest id; top-k at a tie keeps every tied token on the device.
        let got = draw(&t, &[0], &[0.9], &SamplingParams::greedy(), 4).unwrap()[0];
        assert_eq!(got.0, 0);
        let k1 = SamplingParams {
            top_k: 1,
            ..SamplingParams::default()
        };
        assert_eq!(p.choose(&logits, 4, &k1, 0.9), 0, "host: exactly k tokens");
        let got = draw(&t, &[0], &[0.9], &k1, 4).unwrap()[0];
        assert_eq!(got.0, 3, "device: every token tied with the k-th");
        // All −∞: id 0, as the host.
        let dead: Tensor<2> =
            Tensor::from_data(TensorData::new(vec![f32::NEG_INFINITY; 4], [1, 4]), dev);
        let got = draw(&dead, &[0], &[0.5], &SamplingParams::default(), 4).unwrap()[0];
        assert_eq!(got.0, 0);
    }
}
