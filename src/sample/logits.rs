//! Logits processing: from one row of next-token logits to one token id, as plain functions
//! over `f32` slices.
//!
//! The pipeline is Hugging Face transformers' sampling order (`_get_logits_processor` with
//! `do_sample=True`): **temperature → top-k → top-p → min-p**, then a draw from the renormalised
//! distribution over the tokens that survive. Temperature 0 means greedy decoding (argmax).
//!
//! Design decisions and edge-case policy:
//! - **Only ids below `allowed` can be drawn.** The stages pass the LM head's full width, as
//!   transformers and vLLM do (so temperature 0 is exactly HF's greedy decoding, padded rows
//!   included: real checkpoints pad the head beyond the tokenizer, e.g. Qwen2.5's 151936 rows
//!   against ~151665 tokens; trained models give those rows negligible mass, and an id without
//!   text decodes to nothing). The bound exists for callers that want to exclude such rows.
//! - **Ties** are broken towards the lower token id everywhere (argmax, top-k, top-p ordering), so
//!   the result is a function of the logits alone, never of a sort's internal order.
//! - **The draw** is an inverse CDF: given `u` in [0, 1), walk the kept tokens in ascending id
//!   order and return the first whose cumulative (unnormalised) probability exceeds `u · total`.
//!   One uniform per token, so a sample's random stream advances identically whatever the
//!   filters keep. Rounding that leaves the walk without a winner returns the last kept token.
//! - **top-p** keeps the smallest set of most likely tokens whose probability reaches `p` (HF's
//!   `TopPLogitsWarper`: a token is kept while the mass strictly before it is `< p`); at least one
//!   token is always kept. `p >= 1` is off.
//! - **top-k** keeps the `k` largest logits; `k = 0` or `k >= allowed` is off.
//! - **min-p** keeps tokens with `p_i >= min_p · p_max` (HF's `MinPLogitsWarper`); the ratio does
//!   not depend on the renormalisation after top-k/top-p, so it is computed on the kept set.
//!   `min_p = 0` is off.
//! - **The behaviour log-prob** recorded for each sampled token is `log_softmax(logits)[token]` at
//!   **temperature 1** over the full vocabulary: the log-probability under the model itself, which
//!   is what `rlcr logprobs` and the trainer recompute. PPO's ratio `π_θ/π_old` then compares the
//!   same function at two parameter values; the temperature and filters actually used are recorded
//!   in the table's metadata (`rlcr.config`). This is verl's and TRL's convention as well when
//!   they recompute `old_log_prob` with the actor (both divide by the rollout temperature there;
//!   we keep the unscaled model distribution so `update` need not know it).
//!
//! [`Processor`] is the fast path (buffers reused across calls, no sort: top-k is a selection,
//! top-p a weighted quickselect, both turned into rank bounds checked during one inverse-CDF pass
//! in id order); [`reference_choose`] beside it is the slow, obvious version (full sorts), checked
//! equal on random inputs.
use anyhow::{ensure, Result};
use serde::{Deserialize, Serialize};

/// The sampling distribution's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Divides the logits; 0 = greedy.
    pub temperature: f32,
    /// Keep the `top_k` largest logits (0 = off).
    pub top_k: usize,
    /// Nucleus: the smallest set of most likely tokens with mass >= `top_p` (1 = off).
    pub top_p: f32,
    /// Drop tokens below `min_p` times the most likely one's probability (0 = off).
    pub min_p: f32,
}

impl Default for SamplingParams {
    /// Plain sampling from the model: temperature 1, no filters.
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
        }
    }
}

impl SamplingParams {
    /// Greedy settings (temperature 0).
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Check ranges: temperature finite and >= 0, top-p in (0, 1], min-p in [0, 1].
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "--temperature must be a finite number >= 0 (0 = greedy), got {}",
            self.temperature
        );
        ensure!(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "--top-p must be in (0, 1], got {}",
            self.top_p
        );
        ensure!(
            (0.0..=1.0).contains(&self.min_p),
            "--min-p must be in [0, 1], got {}",
            self.min_p
        );
        Ok(())
    }

    /// Temperature 0: argmax, no random draw.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// `log p(token)` under `softmax(logits)` (temperature 1, every row of the vocabulary), computed
/// as `logits[token] − logsumexp(logits)`.
///
/// Non-finite logits: `-inf` rows contribute nothing; the result is `-inf` for such a token.
pub fn logprob_of(logits: &[f32], token: usize) -> f32 {
    (logits[token] as f64 - logsumexp(logits)) as f32
}

/// `log Σ exp(x_i)` with the maximum subtracted first: terms `exp(x_i − max)` in f32 (each within
/// an ulp), accumulated in f64. Empty or all `-inf` input gives `-inf`; NaN entries are skipped.
pub fn logsumexp(x: &[f32]) -> f64 {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let s: f64 = x
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| (v - m).exp() as f64)
        .sum();
    m as f64 + s.ln()
}

/// Index of the largest value among `x[..allowed]`, the lowest index on ties (torch's argmax).
pub fn argmax(x: &[f32], allowed: usize) -> usize {
    let n = allowed.min(x.len());
    let mut best = 0;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in x[..n].iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best
}

/// `true` when `a` ranks before `b`: higher value, then lower id.
#[inline]
fn ranks_before(a: (f32, u32), b: (f32, u32)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

fn rank_cmp(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    if ranks_before(*a, *b) {
        std::cmp::Ordering::Less
    } else if ranks_before(*b, *a) {
        std::cmp::Ordering::Greater
    } else {
        std::cmp::Ordering::Equal
    }
}

/// A top-p candidate: scaled logit, weight, id (ranked by logit, then id).
type Cand = (f32, f32, u32);

fn rank3(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    rank_cmp(&(a.0, a.2), &(b.0, b.2))
}

/// The lowest-ranked token top-p keeps among `c`: scanning in rank order, a token is kept while
/// the mass before it is `< target` (at least one is kept). A weighted quickselect: expected
/// O(n), no full sort.
fn top_p_boundary(c: &mut [Cand], target: f64) -> (f32, u32) {
    let (mut lo, mut hi) = (0usize, c.len());
    let mut base = 0.0f64;
    let mut last: Option<(f32, u32)> = None;
    while hi - lo > 32 {
        let mid = (hi - lo) / 2;
        let slice = &mut c[lo..hi];
        slice.select_nth_unstable_by(mid, rank3);
        let top: f64 = slice[..mid].iter().map(|x| x.1 as f64).sum();
        if base + top < target {
            // Every token of the top half and the pivot have less than `target` before them.
            let pivot = slice[mid];
            base += top + pivot.1 as f64;
            last = Some((pivot.0, pivot.2));
            lo += mid + 1;
        } else {
            hi = lo + mid;
        }
    }
    let slice = &mut c[lo..hi];
    slice.sort_unstable_by(rank3);
    for x in slice.iter() {
        if base >= target && last.is_some() {
            break;
        }
        last = Some((x.0, x.2));
        base += x.1 as f64;
    }
    // ok: the scan keeps at least one token (`c` is never empty here).
    last.unwrap_or((f32::NEG_INFINITY, u32::MAX))
}

/// Reusable buffers for [`Processor::choose`]. One per row or thread; cheap to create.
#[derive(Debug, Default)]
pub struct Processor {
    /// Scaled logits `z`, then (in `w`) their weights `exp(z − max z)`.
    z: Vec<f32>,
    w: Vec<f32>,
    pairs: Vec<(f32, u32)>,
    cands: Vec<Cand>,
}

impl Processor {
    pub fn new() -> Self {
        Self::default()
    }

    /// Choose the next token from `logits` (ids `>= allowed` are never chosen) with settings
    /// `params` and the uniform draw `u` in [0, 1) (ignored when greedy).
    pub fn choose(
        &mut self,
        logits: &[f32],
        allowed: usize,
        params: &SamplingParams,
        u: f64,
    ) -> u32 {
        self.choose_with_logprob(logits, allowed, params, u).0
    }

    /// [`Self::choose`], also returning the token's behaviour log-prob (temperature 1, full
    /// vocabulary; see the module docs).
    ///
    /// Steps: `z = logits / T`; weights `w = exp(z − max z)` (the softmax up to its normaliser);
    /// top-k, top-p and min-p each define a bound on the rank or the weight; one pass over the
    /// ids in ascending order draws by inverse CDF among the tokens within every bound. At
    /// temperature 1 over the full vocabulary the weights' sum also gives the log-prob's
    /// normaliser, so one `exp` per logit serves both. NaN logits count as `-inf`.
    pub fn choose_with_logprob(
        &mut self,
        logits: &[f32],
        allowed: usize,
        params: &SamplingParams,
        u: f64,
    ) -> (u32, f32) {
        let n = allowed.min(logits.len()).max(1);
        if params.is_greedy() {
            let t = argmax(logits, n);
            return (t as u32, (logits[t] as f64 - logsumexp(logits)) as f32);
        }
        let inv_t = 1.0 / params.temperature;
        let plain = params.top_k == 0 && params.top_p >= 1.0 && params.min_p <= 0.0;
        if plain && n == logits.len() && !logits.iter().any(|v| v.is_nan()) {
            return self.plain(logits, params.temperature, u);
        }
        let z = &mut self.z;
        z.clear();
        z.extend(logits[..n].iter().map(|&v| {
            if v.is_nan() {
                f32::NEG_INFINITY
            } else {
                v * inv_t
            }
        }));
        let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if m == f32::NEG_INFINITY {
            let t = argmax(logits, n);
            return (t as u32, (logits[t] as f64 - logsumexp(logits)) as f32);
        }
        let w = &mut self.w;
        w.clear();
        w.extend(z.iter().map(|&x| (x - m).exp()));
        // Normaliser of the behaviour log-prob: free when the weights are the T=1 softmax.
        let lse =
            if params.temperature == 1.0 && n == logits.len() && !logits.iter().any(|v| v.is_nan())
            {
                m as f64 + w.iter().map(|&x| x as f64).sum::<f64>().ln()
            } else {
                logsumexp(logits)
            };
        // top-k: rank bound (the k-th best (z, id)).
        let k = params.top_k;
        let mut kbound: Option<(f32, u32)> = None;
        if k > 0 && k < n {
            let pairs = &mut self.pairs;
            pairs.clear();
            pairs.extend(z.iter().enumerate().map(|(i, &x)| (x, i as u32)));
            pairs.select_nth_unstable_by(k - 1, rank_cmp);
            kbound = Some(pairs[k - 1]);
        }
        let within = |b: Option<(f32, u32)>, x: f32, i: usize| match b {
            None => true,
            Some(b) => !ranks_before(b, (x, i as u32)),
        };
        // top-p over the top-k set, renormalised: rank bound.
        let mut pbound: Option<(f32, u32)> = None;
        if params.top_p < 1.0 {
            let c = &mut self.cands;
            c.clear();
            c.extend(
                z.iter()
                    .zip(w.iter())
                    .enumerate()
                    .filter(|&(i, (&x, _))| within(kbound, x, i))
                    .map(|(i, (&x, &wt))| (x, wt, i as u32)),
            );
            let total: f64 = c.iter().map(|x| x.1 as f64).sum();
            pbound = Some(top_p_boundary(c, params.top_p as f64 * total));
        }
        // min-p: weight bound relative to the most likely token (weight exp(0) = 1).
        let thr = if params.min_p > 0.0 {
            params.min_p
        } else {
            0.0
        };
        let keep = |i: usize| {
            let x = z[i];
            w[i] >= thr && within(kbound, x, i) && within(pbound, x, i)
        };
        let total: f64 = (0..n).filter(|&i| keep(i)).map(|i| w[i] as f64).sum();
        let target = u * total;
        let mut acc = 0.0f64;
        let mut last = None;
        for (i, &wi) in w.iter().enumerate() {
            if keep(i) {
                acc += wi as f64;
                last = Some(i);
                if acc > target {
                    break;
                }
            }
        }
        let t = last.unwrap_or_else(|| argmax(logits, n));
        (t as u32, (logits[t] as f64 - lse) as f32)
    }
}

impl Processor {
    /// The common case — no filter, every id allowed, no NaN: three passes (max; weights and
    /// their sum; inverse CDF), the same numbers as the general path.
    fn plain(&mut self, logits: &[f32], temperature: f32, u: f64) -> (u32, f32) {
        let inv_t = 1.0 / temperature;
        let m = logits
            .iter()
            .map(|&v| v * inv_t)
            .fold(f32::NEG_INFINITY, f32::max);
        if m == f32::NEG_INFINITY {
            let t = argmax(logits, logits.len());
            return (t as u32, (logits[t] as f64 - logsumexp(logits)) as f32);
        }
        let w = &mut self.w;
        w.clear();
        let mut total = 0.0f64;
        w.extend(logits.iter().map(|&v| {
            let x = (v * inv_t - m).exp();
            total += x as f64;
            x
        }));
        let lse = if temperature == 1.0 {
            m as f64 + total.ln()
        } else {
            logsumexp(logits)
        };
        let target = u * total;
        let mut acc = 0.0f64;
        let mut t = w.len() - 1;
        for (i, &x) in w.iter().enumerate() {
            acc += x as f64;
            if acc > target {
                t = i;
                break;
            }
        }
        (t as u32, (logits[t] as f64 - lse) as f32)
    }
}

/// Inverse CDF over `(weight, id)` pairs in the given order.
fn draw(cand: &[(f32, u32)], u: f64) -> u32 {
    let total: f64 = cand.iter().map(|c| c.0 as f64).sum();
    let target = u * total;
    let mut acc = 0.0f64;
    for c in cand {
        acc += c.0 as f64;
        if acc > target {
            return c.1;
        }
    }
    cand.last().map(|c| c.1).unwrap_or(0)
}

/// The slow, obvious version of [`Processor::choose`]: full sorts, explicit probabilities.
pub fn reference_choose(logits: &[f32], allowed: usize, params: &SamplingParams, u: f64) -> u32 {
    let n = allowed.min(logits.len()).max(1);
    if params.is_greedy() {
        return argmax(logits, n) as u32;
    }
    let mut c: Vec<(f32, u32)> = logits[..n]
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let z = if v.is_nan() {
                f32::NEG_INFINITY
            } else {
                v * (1.0 / params.temperature)
            };
            (z, i as u32)
        })
        .collect();
    c.sort_by(rank_cmp);
    if params.top_k > 0 && params.top_k < c.len() {
        c.truncate(params.top_k);
    }
    let m = c[0].0;
    if m == f32::NEG_INFINITY {
        return argmax(logits, n) as u32;
    }
    for x in c.iter_mut() {
        x.0 = (x.0 - m).exp();
    }
    if params.top_p < 1.0 {
        let total: f64 = c.iter().map(|x| x.0 as f64).sum();
        let mut mass = 0.0;
        let mut keep = c.len();
        for (i, x) in c.iter().enumerate() {
            if mass >= params.top_p as f64 * total {
                keep = i;
                break;
            }
            mass += x.0 as f64;
        }
        c.truncate(keep.max(1));
    }
    if params.min_p > 0.0 {
        let thr = params.min_p * c[0].0;
        c.retain(|x| x.0 >= thr);
    }
    c.sort_by_key(|x| x.1);
    draw(&c, u)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Logits whose softmax is exactly `p` (up to rounding): `ln p`.
    fn from_probs(p: &[f64]) -> Vec<f32> {
        p.iter().map(|&x| x.ln() as f32).collect()
    }

    /// The default parameters with `set` applied.
    fn params(set: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        set(&mut p);
        p
    }

    /// All ids drawable for some u, found by scanning u over a fine grid.
    fn support(logits: &[f32], params: &SamplingParams) -> Vec<u32> {
        let mut pr = Processor::new();
        let mut s: Vec<u32> = (0..10_000)
            .map(|i| pr.choose(logits, logits.len(), params, (i as f64 + 0.5) / 10_000.0))
            .collect();
        s.sort();
        s.dedup();
        s
    }

    #[test]
    fn logprob_matches_hand_computation() {
        // logits [1, 2, 3]: logsumexp = 3 + ln(1 + e^-1 + e^-2) = 3.40760596444438
        let l = [1.0f32, 2.0, 3.0];
        assert!((logsumexp(&l) - 3.407_605_964_444_38).abs() < 1e-7);
        assert!((logprob_of(&l, 0) as f64 - (1.0 - 3.407_605_964_444_38)).abs() < 1e-6);
        assert!((logprob_of(&l, 2) as f64 - (3.0 - 3.407_605_964_444_38)).abs() < 1e-6);
        assert_eq!(logsumexp(&[f32::NEG_INFINITY]), f64::NEG_INFINITY);
    }

    #[test]
    fn greedy_is_argmax_with_lowest_id_on_ties() {
        let mut pr = Processor::new();
        let l = [0.5f32, 2.0, 2.0, -1.0];
        assert_eq!(pr.choose(&l, 4, &SamplingParams::greedy(), 0.99), 1);
        // ids >= allowed are never chosen
        let l = [0.5f32, 0.0, 1.0, 9.0];
        assert_eq!(pr.choose(&l, 3, &SamplingParams::greedy(), 0.0), 2);
        assert_eq!(pr.choose(&l, 3, &SamplingParams::default(), 0.999_999), 2);
    }

    #[test]
    fn inverse_cdf_on_a_known_distribution() {
        // p = [0.1, 0.2, 0.3, 0.4]: cumulative 0.1, 0.3, 0.6, 1.0 in id order.
        let l = from_probs(&[0.1, 0.2, 0.3, 0.4]);
        let mut pr = Processor::new();
        let p = SamplingParams::default();
        let pick = |pr: &mut Processor, u| pr.choose(&l, 4, &p, u);
        assert_eq!(pick(&mut pr, 0.0), 0);
        assert_eq!(pick(&mut pr, 0.099), 0);
        assert_eq!(pick(&mut pr, 0.101), 1);
        assert_eq!(pick(&mut pr, 0.299), 1);
        assert_eq!(pick(&mut pr, 0.301), 2);
        assert_eq!(pick(&mut pr, 0.599), 2);
        assert_eq!(pick(&mut pr, 0.601), 3);
        assert_eq!(pick(&mut pr, 0.999_999), 3);
    }

    #[test]
    fn temperature_reshapes_by_hand() {
        // p = [0.2, 0.8] at T = 1; at T = 2 weights sqrt(p): [0.4472, 0.8944] → p0 = 1/3.
        let l = from_probs(&[0.2, 0.8]);
        let mut pr = Processor::new();
        let p = params(|p| p.temperature = 2.0);
        assert_eq!(pr.choose(&l, 2, &p, 0.333), 0);
        assert_eq!(pr.choose(&l, 2, &p, 0.334), 1);
        // T = 0.5: weights p²: [0.04, 0.64] → p0 = 0.04/0.68 = 0.0588235
        let p = params(|p| p.temperature = 0.5);
        assert_eq!(pr.choose(&l, 2, &p, 0.0588), 0);
        assert_eq!(pr.choose(&l, 2, &p, 0.0589), 1);
    }

    #[test]
    fn top_p_on_a_known_distribution() {
        // p = [0.05, 0.5, 0.15, 0.3] → descending 0.5 (id1), 0.3 (id3), 0.15 (id2), 0.05 (id0).
        let l = from_probs(&[0.05, 0.5, 0.15, 0.3]);
        let with_p = |top_p: f32| params(|p| p.top_p = top_p);
        // p = 0.5: {id1} alone has mass 0.5 >= 0.5.
        assert_eq!(support(&l, &with_p(0.5)), vec![1]);
        // p = 0.6: mass before id3 is 0.5 < 0.6 → keep {1, 3} (0.8).
        assert_eq!(support(&l, &with_p(0.6)), vec![1, 3]);
        // p = 0.9: {1, 3, 2} = 0.95.
        assert_eq!(support(&l, &with_p(0.9)), vec![1, 2, 3]);
        // Renormalised over {1, 3}: id1 has 0.5/0.8 = 0.625 of the mass; ascending id order is
        // [1, 3], so u < 0.625 → 1.
        let mut pr = Processor::new();
        assert_eq!(pr.choose(&l, 4, &with_p(0.6), 0.624), 1);
        assert_eq!(pr.choose(&l, 4, &with_p(0.6), 0.626), 3);
        // a tiny p keeps the top token
        assert_eq!(support(&l, &with_p(1e-6)), vec![1]);
    }

    #[test]
    fn top_k_and_ties() {
        let l = from_probs(&[0.05, 0.5, 0.15, 0.3]);
        let k = |k| params(|p| p.top_k = k);
        assert_eq!(support(&l, &k(1)), vec![1]);
        assert_eq!(support(&l, &k(2)), vec![1, 3]);
        assert_eq!(support(&l, &k(3)), vec![1, 2, 3]);
        assert_eq!(support(&l, &k(0)), vec![0, 1, 2, 3]);
        // ties at the boundary go to the lower id
        let t = [1.0f32, 3.0, 1.0, 1.0];
        assert_eq!(support(&t, &k(2)), vec![0, 1]);
    }

    #[test]
    fn min_p_on_a_known_distribution() {
        // p = [0.05, 0.5, 0.15, 0.3]; min_p 0.3 → threshold 0.15: keep {1, 3, 2} (0.15 >= 0.15).
        let l = from_probs(&[0.05, 0.5, 0.15, 0.3]);
        let m = |m| params(|p| p.min_p = m);
        assert_eq!(support(&l, &m(0.29)), vec![1, 2, 3]);
        // 0.31 → threshold 0.155: drop id2.
        assert_eq!(support(&l, &m(0.31)), vec![1, 3]);
        assert_eq!(support(&l, &m(0.61)), vec![1]);
        // kept {1, 3}: cumulative 0.5/0.8 = 0.625 in id order.
        let mut pr = Processor::new();
        assert_eq!(pr.choose(&l, 4, &m(0.5), 0.624), 1);
        assert_eq!(pr.choose(&l, 4, &m(0.5), 0.626), 3);
    }

    #[test]
    fn filters_compose_in_hf_order() {
        // T = 1, top_k = 3 → {1, 3, 2} renormalised (0.5, 0.3, 0.15)/0.95; top_p 0.8 → mass
        // before id2 is 0.8/0.95 = 0.842 >= 0.8 → {1, 3}.
        let l = from_probs(&[0.05, 0.5, 0.15, 0.3]);
        let p = SamplingParams {
            top_k: 3,
            top_p: 0.8,
            ..Default::default()
        };
        assert_eq!(support(&l, &p), vec![1, 3]);
        // without top-k the same top-p keeps {1, 3} too (0.8 >= 0.8 stops before id2)
        let p = params(|p| p.top_p = 0.85);
        assert_eq!(support(&l, &p), vec![1, 2, 3]);
    }

    #[test]
    fn validate_rejects_bad_ranges() {
        assert!(SamplingParams::default().validate().is_ok());
        for bad in [
            params(|p| p.temperature = -1.0),
            params(|p| p.temperature = f32::NAN),
            params(|p| p.top_p = 0.0),
            params(|p| p.top_p = 1.5),
            params(|p| p.min_p = -0.1),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn large_vocab_top_p_grows_the_sorted_head() {
        // 1000 ids with equal logits: top_p 0.5 needs 500 tokens (> the 64 first sorted).
        let l = vec![0.0f32; 1000];
        let p = params(|p| p.top_p = 0.5);
        let mut pr = Processor::new();
        // kept ids 0..500 (ties → lower ids first); u just below 1 picks id 499.
        assert_eq!(pr.choose(&l, 1000, &p, 0.999_999), 499);
        assert_eq!(pr.choose(&l, 1000, &p, 0.0), 0);
    }

    proptest! {
        #[test]
        fn fast_equals_reference(
            logits in proptest::collection::vec(-8.0f32..8.0, 1..300),
            t in prop_oneof![Just(0.0f32), 0.2f32..2.0],
            k in prop_oneof![Just(0usize), 1usize..50],
            p in prop_oneof![Just(1.0f32), 0.05f32..1.0],
            m in prop_oneof![Just(0.0f32), 0.0f32..0.5],
            u in 0.0f64..1.0,
            cut in 0usize..20,
        ) {
            let allowed = logits.len().saturating_sub(cut).max(1);
            let params = SamplingParams { temperature: t, top_k: k, top_p: p, min_p: m };
            let mut pr = Processor::new();
            let (fast, lp) = pr.choose_with_logprob(&logits, allowed, &params, u);
            let slow = reference_choose(&logits, allowed, &params, u);
            prop_assert_eq!(fast, slow);
            prop_assert!((fast as usize) < allowed);
            prop_assert!((lp - logprob_of(&logits, fast as usize)).abs() < 1e-5);
        }

        #[test]
        fn fast_equals_reference_with_ties(
            logits in proptest::collection::vec((-3i32..3).prop_map(|x| x as f32), 1..200),
            t in prop_oneof![Just(1.0f32), 0.5f32..1.5],
            k in prop_oneof![Just(0usize), 1usize..40],
            p in prop_oneof![Just(1.0f32), 0.05f32..1.0],
            m in prop_oneof![Just(0.0f32), 0.0f32..0.5],
            u in 0.0f64..1.0,
        ) {
            let params = SamplingParams { temperature: t, top_k: k, top_p: p, min_p: m };
            let mut pr = Processor::new();
            let fast = pr.choose(&logits, logits.len(), &params, u);
            prop_assert_eq!(fast, reference_choose(&logits, logits.len(), &params, u));
        }
    }

    #[test]
    fn behaviour_logprob_is_the_temperature_one_log_softmax() {
        // p = [0.1, 0.2, 0.3, 0.4]; whatever the sampling settings, the recorded log-prob of the
        // chosen id is ln p at temperature 1 over every row (including ids >= allowed).
        let l = from_probs(&[0.1, 0.2, 0.3, 0.4]);
        let mut pr = Processor::new();
        for params in [
            SamplingParams::default(),
            SamplingParams::greedy(),
            SamplingParams {
                temperature: 0.5,
                top_k: 2,
                top_p: 0.9,
                min_p: 0.1,
            },
        ] {
            let (t, lp) = pr.choose_with_logprob(&l, 4, &params, 0.5);
            let want = [0.1f64, 0.2, 0.3, 0.4][t as usize].ln();
            assert!(
                (lp as f64 - want).abs() < 1e-6,
                "{params:?}: {lp} vs {want}"
            );
        }
        // allowed = 3: id 3 cannot be drawn, but it still counts in the normaliser.
        let (t, lp) = pr.choose_with_logprob(&l, 3, &SamplingParams::default(), 0.99);
        assert_eq!(t, 2);
        assert!((lp as f64 - 0.3f64.ln()).abs() < 1e-6);
    }
}
