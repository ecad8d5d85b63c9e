//! The loss side of the LM head in one pass: the log-prob of each target token and the entropy of
//! each predicted distribution, from logits `[n, V]` at a sampling temperature, differentiable.
//!
//! For one row of logits `z` (V entries), scale `s = 1/T` and target `t`:
//!
//! ```text
//! u_j = s·z_j − s·max(z)        S = Σ_j exp(u_j)
//! log p_t = u_t − ln S           H = −Σ_j p_j log p_j = ln S − (Σ_j exp(u_j)·u_j) / S
//! ∂L/∂z_j = s·( g·[j = t] − p_j·(g + h·(log p_j + H)) )   with g = ∂L/∂log p_t, h = ∂L/∂H
//! ```
//!
//! (the last line from `∂H/∂u_j = −p_j (log p_j + H)`). burn's composite (`log_softmax`,
//! `gather`, `exp`, `mul`, `sum`) materialises several `[n, V]` tensors (log-probs,
//! probabilities, their product; autodiff keeps most of them for backward): at SmolLM2's 49,152
//! columns and 2,048 rows each one is 400 MB. On Flex this module instead reads the logits twice
//! forward (max, then both sums) and once backward (writing the gradient), and keeps only the
//! logits and three numbers per row. It is the default on Flex (`RLCR_FUSED_HEAD=0` opts out;
//! every other device runs the composite). The fused sums round differently from the composite
//! (within 2e-5), and that rounding changes the learning loop's trajectories, so it was opt-in
//! until a configuration learnt on it: at f1735aa it sent one seed into a format collapse, and
//! at e39ca95 (uniform warm-start confidences) two seeds' confidences collapsed and the learning
//! test failed (mean AUROC 0.607 < 0.67). On the defaults since c5c6071 (inert rows skipped) the
//! learning test passes on it with more room than on the composite (360d504 + `RLCR_FUSED_HEAD=1`:
//! mean AUROC of the last policies 0.715 against 0.691, Brier gain 0.065 against 0.056,
//! accuracy +0.197 against +0.176), and it keeps the SmolLM2-135M 8 × 512 step's peak memory
//! 18 % lower (5267 against 6410–6426 MiB; the step's speed is the same within the runs' spread,
//! the main job's CPU time 7 % lower: BENCHMARKS.md), so it became the default. Both are the same
//! function up to rounding (tested against each other and, through the parity tests, against
//! transformers).
//!
//! The row loops (a vectorised Cephes `expf`, fixed summation order: the same bits on every ISA,
//! batch and thread count) are [`rlcr_kernels::head`]; this module is the burn glue (tensor
//! conversions, the autodiff `Backward` op) and the composite.
use std::sync::Arc;

use anyhow::Result;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

use rlcr_kernels::head::{self as kernel, HeadRows};

use super::decode::{self as cpu, Isa};
use super::{contiguous, flex_f32, slice};
use crate::model::backend::record;

/// Log-probs of `targets` and (when `entropy`) entropies of the rows of `logits: [n, V]` divided
/// by `temperature`: `([n], Some([n]))`. Differentiable on an autodiff device.
///
/// Errors if `targets` does not have one id per row, an id is outside the vocabulary, or the
/// temperature is not a positive number.
pub fn logprob_entropy(
    logits: Tensor<2>,
    targets: &[u32],
    temperature: f64,
    entropy: bool,
) -> Result<(Tensor<1>, Option<Tensor<1>>)> {
    let [n, v] = logits.dims();
    super::super::check_head_inputs(n, v, targets, temperature)?;
    if fused_enabled() {
        if let Some(out) = fused(&logits, targets, (1.0 / temperature) as f32, cpu::isa()) {
            return Ok(split(out, n, entropy));
        }
    }
    Ok(composite(logits, targets, temperature, entropy))
}

/// Whether the fused head runs on Flex: `RLCR_FUSED_HEAD` unset or `1`; `0` keeps burn's
/// composite (see the module documentation and [`crate::switches`]).
fn fused_enabled() -> bool {
    crate::switches::get().fused_head
}

fn split(out: Tensor<2>, n: usize, entropy: bool) -> (Tensor<1>, Option<Tensor<1>>) {
    let logp = out.clone().slice([0..n, 0..1]).reshape([n]);
    let ent = entropy.then(|| out.slice([0..n, 1..2]).reshape([n]));
    (logp, ent)
}

/// burn's composite, on any device: `log_softmax`, `gather`, `−Σ exp(lp)·lp`.
fn composite(
    logits: Tensor<2>,
    targets: &[u32],
    temperature: f64,
    entropy: bool,
) -> (Tensor<1>, Option<Tensor<1>>) {
    let [n, _] = logits.dims();
    let device = logits.device();
    let z = if temperature != 1.0 {
        logits.div_scalar(temperature)
    } else {
        logits
    };
    let lp = log_softmax(z, 1);
    let ids: Vec<i32> = targets.iter().map(|&t| t as i32).collect();
    let tg: Tensor<2, Int> = crate::model::transfer::upload(TensorData::new(ids, [n, 1]), &device);
    let ent = entropy.then(|| {
        (lp.clone().exp() * lp.clone())
            .sum_dim(1)
            .neg()
            .reshape([n])
    });
    (lp.gather(1, tg).reshape([n]), ent)
}

/// The fused path on Flex (plain or autodiff), `[n, 2]` = (log-prob, entropy) per row; `None`
/// on other devices or dtypes.
fn fused(logits: &Tensor<2>, targets: &[u32], scale: f32, isa: Isa) -> Option<Tensor<2>> {
    let [n, v] = logits.dims();
    if let Ok(ad) = logits.clone().try_into_primitive::<Autodiff<Flex>>() {
        let (prim, guard) = ad.into_parts();
        let z = contiguous(prim)?;
        let (out, rows) = kernel::forward(slice(&z), n, v, targets, scale, isa);
        let out = FlexTensor::from_data(TensorData::new(out, [n, 2]));
        let out = record(HeadBackward, [guard], out, || HeadState {
            logits: z,
            rows: Arc::new(rows),
        });
        return Some(Tensor::<2>::from_primitive::<Autodiff<Flex>>(out));
    }
    let z = flex_f32(logits)?;
    let (out, _) = kernel::forward(slice(&z), n, v, targets, scale, isa);
    let out = FlexTensor::from_data(TensorData::new(out, [n, 2]));
    Some(Tensor::<2>::from_primitive::<Flex>(out))
}

#[derive(Debug)]
struct HeadBackward;

#[derive(Debug, Clone)]
struct HeadState {
    logits: FlexTensor,
    rows: Arc<HeadRows>,
}

impl Backward<Flex, 1> for HeadBackward {
    type State = HeadState;

    fn backward(self, ops: Ops<HeadState, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let HeadState { logits, rows } = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
            let [n, v] = [rows.len(), logits.layout().shape()[1]];
            // An f32 gradient, as the forward's output was f32.
            let g = contiguous(grad).unwrap_or_else(|| unreachable!("f32 head gradient"));
            let dz = kernel::backward(slice(&logits), slice(&g), v, &rows);
            FlexTensor::from_data(TensorData::new(dz, [n, v]))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    use rlcr_kernels::testing::{head_reference as reference, logits, targets};

    use crate::model::transformer::tests::max_diff;

    fn values(t: Tensor<1>) -> Vec<f32> {
        t.into_data().try_into_vec::<f32>().unwrap()
    }

    /// Values and gradients of the fused op against burn's composite, on an autodiff Flex
    /// device, with a loss that weights log-probs and entropies differently per row.
    #[test]
    fn fused_matches_the_composite_with_gradients() {
        let dev = Device::flex().autodiff();
        let (n, v) = (7, 2051);
        let z = logits(n, v, 5);
        let t = targets(n, v);
        let wl: Vec<f32> = (0..n).map(|i| 1.0 - 0.3 * i as f32).collect();
        let wh: Vec<f32> = (0..n).map(|i| 0.2 * i as f32 - 0.5).collect();
        let mut res = Vec::new();
        for fused_path in [true, false] {
            for temp in [1.0, 0.6] {
                let x =
                    Tensor::<2>::from_data(TensorData::new(z.clone(), [n, v]), &dev).require_grad();
                let (lp, h) = if fused_path {
                    let out = fused(&x, &t, (1.0 / temp) as f32, cpu::isa()).unwrap();
                    split(out, n, true)
                } else {
                    composite(x.clone(), &t, temp, true)
                };
                let h = h.unwrap();
                let wl_t = Tensor::<1>::from_data(TensorData::new(wl.clone(), [n]), &dev);
                let wh_t = Tensor::<1>::from_data(TensorData::new(wh.clone(), [n]), &dev);
                let loss = (lp.clone() * wl_t).sum() + (h.clone() * wh_t).sum();
                let grads = loss.backward();
                let gx = x
                    .grad(&grads)
                    .unwrap()
                    .into_data()
                    .try_into_vec::<f32>()
                    .unwrap();
                res.push((values(lp), values(h), gx));
            }
        }
        for k in 0..2 {
            let (f, c) = (&res[k], &res[k + 2]);
            for i in 0..n {
                assert!(
                    (f.0[i] - c.0[i]).abs() < 2e-5,
                    "logp {i}: {} vs {}",
                    f.0[i],
                    c.0[i]
                );
                assert!(
                    (f.1[i] - c.1[i]).abs() < 2e-5,
                    "H {i}: {} vs {}",
                    f.1[i],
                    c.1[i]
                );
            }
            let worst = max_diff(&f.2, &c.2);
            assert!(worst < 2e-6, "gradient differs by {worst}");
        }
        // The gradient is not trivially zero: the target column carries ≈ s·wl.
        assert!(res[0].2[t[0] as usize].abs() > 0.1);
    }

    #[test]
    fn plain_flex_and_bad_input() {
        let dev = Device::flex();
        let (n, v) = (3, 40);
        let z = logits(n, v, 9);
        let t = targets(n, v);
        let x = Tensor::<2>::from_data(TensorData::new(z.clone(), [n, v]), &dev);
        let (lp, h) = logprob_entropy(x.clone(), &t, 1.0, false).unwrap();
        assert!(h.is_none());
        let lp = values(lp);
        for i in 0..n {
            let (want, _) = reference(&z[i * v..(i + 1) * v], t[i] as usize, 1.0);
            assert!((lp[i] as f64 - want).abs() < 1e-5);
        }
        assert!(logprob_entropy(x.clone(), &t[..2], 1.0, true).is_err());
        assert!(logprob_entropy(x.clone(), &[0, 1, 40], 1.0, true).is_err());
        assert!(logprob_entropy(x, &t, 0.0, true).is_err());
    }
}
