//! The sampler's draw as burn ops, on any device: what the CPU device runs when asked to draw on
//! the device (the GPUs run [`super::gpu::draw`]'s kernel, which computes the same function with
//! exact cut-offs, where these halvings may keep ids within [`crate::sample::draw::BISECT_WIDTH`]
//! below one).
//! See [`crate::sample::draw`] for what it keeps of the host sampler.
//!
//! No sort (burn's sort reads tensors back to the host on the GPU backends): the top-k and top-p
//! cut-offs are value thresholds found by [`BISECT_STEPS`] halvings (a fixed number, so nothing
//! is read to decide when to stop); the draw is a cumulative sum in id order, in two levels
//! (blocks of 256 ids and the block sums: burn's cumulative sum on the GPU backends is quadratic
//! in the length), and a count of the entries at or below `u · total`.
use burn::tensor::{Bool, Int, Tensor};

use crate::model::ops::DrawParams;

/// Halvings of the top-k / top-p threshold search (from a range of [`SEARCH_RANGE`] + 1 in
/// logits/temperature units).
pub const BISECT_STEPS: usize = 40;

/// The search covers `[max − SEARCH_RANGE, max + 1]`: a token more than 200 below the maximum has
/// weight `exp(−200) = 0` in f32 and can never be drawn, wherever the cut-off is.
pub const SEARCH_RANGE: f32 = 200.0;

/// `[r, 2]`: the token (as f32) and its behaviour log-prob for each sample row; row `i` reads
/// logits row `rows[1, i]` (all rows in order when `identity`) and the uniform `rows[0, i]`.
pub fn draw(
    logits: &Tensor<2>,
    rows: &Tensor<2>,
    identity: bool,
    params: &DrawParams,
    allowed: usize,
) -> Tensor<2> {
    let [_, v] = logits.dims();
    let r = rows.dims()[1];
    let a = allowed;
    let device = logits.device();
    let uniform = rows.clone().slice([0..1, 0..r]).reshape([r, 1]);
    // The draw is computed in f32 whatever the logits' dtype.
    let logits = if logits.dtype() == burn::tensor::DType::F32 {
        logits.clone()
    } else {
        logits.clone().cast(burn::tensor::DType::F32)
    };
    let lg = if identity {
        logits
    } else {
        let idx: Tensor<1, Int> = rows.clone().slice([1..2, 0..r]).reshape([r]).int();
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
    let tok = if params.temperature == 0.0 {
        argmax_lowest(z, &iota, a)
    } else {
        sample(z, uniform, &iota, params, a)
    };
    let lp = lg.gather(1, tok.clone().int()) - lse;
    Tensor::cat(vec![tok, lp], 1)
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
    params: &DrawParams,
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
