//! The sampler's draw on the model's device: logits stay where the model computed them, and a
//! decode step reads back only the sampled ids with their behaviour log-probs (`[rows, 2]`, one
//! read).
//!
//! [`draw`] implements [`super::logits`]' pipeline (temperature → top-k → top-p → min-p, an
//! inverse-CDF draw in ascending id order from the host's ChaCha20 uniform, the log-prob at
//! temperature 1 over the full vocabulary) on the device, without sorting. The top-k and top-p
//! cut-offs are value thresholds (nothing is read to decide when to stop); the draw is the first
//! id whose cumulative weight in id order exceeds `u · total`. On a GPU it is one kernel per
//! step, one cube per sample row, whose cut-offs are exact values of the row found by a radix
//! select ([`crate::model::backend::gpu::draw`]); elsewhere the same function as burn ops, whose
//! cut-offs come from a fixed number of halvings ([`crate::model::backend::draw`]);
//! [`crate::model::ops::draw`] picks.
//!
//! What it keeps of the host sampler ([`super::logits::Processor`]), and what not (the test
//! `device_draw_agrees_with_the_host` pins it):
//! - the same token whenever the draw `u` is farther than [`cdf_tolerance`] (relative to the kept
//!   mass) from a boundary of the kept tokens' cumulative distribution, the kept sets being
//!   equal: the device sums in f32 in the backend's order, the host in f64 in id order;
//! - the same kept sets except at ties: top-k and top-p keep every token whose value equals the
//!   cut-off's (the host breaks ties towards the lower id) or, with the halvings, lies within
//!   [`BISECT_WIDTH`] below it, and top-p's mass test is in f32 (a boundary token whose mass
//!   before it is within [`cdf_tolerance`] of `p` can go either way);
//! - greedy decoding exactly (the maximum, the lowest id on ties);
//! - the behaviour log-prob within f32 rounding of the host's f64 log-sum-exp (about 1e-6).
//!
//! So on a GPU the sampled tokens are a function of the logits and the draws, as on the CPU, but
//! not bit for bit the CPU's sampler: `--device cpu` keeps the host sampler (the tables of the
//! CPU build are unchanged), the GPU backends use this one.
use anyhow::{ensure, Result};
use burn::tensor::{Tensor, TensorData};

use super::logits::SamplingParams;
use crate::model::backend::draw::{BISECT_STEPS, SEARCH_RANGE};
use crate::model::{ops, transfer};

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

/// The sampler's settings as the device draw's ([`ops::draw`]).
pub(crate) fn draw_params(params: &SamplingParams) -> ops::DrawParams {
    ops::DrawParams {
        temperature: params.temperature,
        top_k: params.top_k,
        top_p: params.top_p,
        min_p: params.min_p,
    }
}

/// Draw one token per sample row from `logits` (`[n, V]`, on any device): row `r` reads logits
/// row `src[r]` and the uniform `u[r]` (in [0, 1)); only ids below `allowed` are drawn. Returns
/// `(token, behaviour log-prob)` per row. One upload (the draws and the row map) and one read;
/// on a GPU one kernel ([`ops::draw`]).
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
    let rows: Tensor<2> = transfer::upload(TensorData::new(host, [2, r]), &device);
    let identity = r == n && src.iter().enumerate().all(|(i, &k)| i == k);
    let out = ops::draw(logits, &rows, identity, &draw_params(params), a)?;
    let out = transfer::read(out)?
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
        let mut d = vec![crate::model::DeviceSpec::Cpu];
        if cfg!(feature = "wgpu") {
            let spec = std::env::var("RLCR_WGPU_DEVICE").unwrap_or_else(|_| "wgpu".into());
            d.push(spec.parse().unwrap());
        }
        d.into_iter().map(|s| s.open().unwrap()).collect()
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
