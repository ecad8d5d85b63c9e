//! Masked attention on rlcr's kernels ([`rlcr_kernels::attention`]) for burn tensors on Flex:
//! plain (prefill, log-prob scoring) or autodiff (training, a custom `Backward` op over the
//! three inputs), in place of burn's attention, whose autodiff version is a composite of
//! batched gemm-crate products and element-wise softmax ops that runs serially in places. The
//! default on Flex while the GEMM is on (`RLCR_GEMM` not `burn`); `RLCR_ATTENTION=burn`
//! ([`enabled`]) keeps burn's attention. The two round differently, so the choice changes the
//! learning loop's trajectories (`docs/results.md` gives the learning figures of both).
//! Every other device keeps burn's attention.
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};
use rlcr_kernels::attention::{self as kernel, Shape};

use super::decode::{self as cpu, Isa};
use super::{contiguous, flex_f32, slice};
use crate::model::backend::record;

/// `softmax(scale · q·kᵀ, hidden keys excluded) · v` for `q: [B, K, R, d]`, `k`, `v`: `[B, K, S,
/// d]` and the host mask `hidden: [B, R, S]` (true = hidden; shared by the K heads of a row), as
/// burn's `attention` with the mask `[B, 1, R, S]`; `None` (use burn's) when a switch is off
/// ([`enabled`], the GEMM's), the CPU has no kernel, or the tensors are not f32 on Flex. Differentiable on
/// `Autodiff<Flex>`.
pub fn attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    hidden: &[bool],
    scale: f32,
) -> Option<Tensor<4>> {
    if !enabled() || !super::sgemm::enabled() {
        return None;
    }
    attention_isa(q, k, v, hidden, scale, cpu::isa())
}

/// Whether [`attention`] runs (read once per process): the default, and `RLCR_ATTENTION=rlcr`;
/// `RLCR_ATTENTION=burn` keeps burn's attention (see [`crate::switches`]).
pub fn enabled() -> bool {
    crate::switches::get().attention == crate::switches::Path::Rlcr
}

/// [`attention`] on the kernels of `isa`, whatever the switches (tests, benchmarks).
pub fn attention_isa(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    hidden: &[bool],
    scale: f32,
    isa: Isa,
) -> Option<Tensor<4>> {
    if !kernel::has_kernel(isa) {
        return None;
    }
    let [b, kh, rows, dim] = q.dims();
    let [b2, kh2, keys, d2] = k.dims();
    if b2 != b || kh2 != kh || d2 != dim || v.dims() != k.dims() || hidden.len() != b * rows * keys
    {
        return None;
    }
    let shape = Shape {
        batch: b,
        kv_heads: kh,
        rows,
        keys,
        dim,
    };
    // The kernel on contiguous q, k, v: the output `[b, kh, rows, dim]` and the weights.
    let forward = |qc: &FlexTensor, kc: &FlexTensor, vc: &FlexTensor| {
        let (out, probs) =
            kernel::forward(slice(qc), slice(kc), slice(vc), hidden, shape, scale, isa)?;
        Some((
            FlexTensor::from_data(TensorData::new(out, [b, kh, rows, dim])),
            probs,
        ))
    };
    if let Ok(qa) = q.clone().try_into_primitive::<Autodiff<Flex>>() {
        let ka = k.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
        let va = v.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
        let (qp, qg) = qa.into_parts();
        let (kp, kg) = ka.into_parts();
        let (vp, vg) = va.into_parts();
        let (qc, kc, vc) = (contiguous(qp)?, contiguous(kp)?, contiguous(vp)?);
        let (out, probs) = forward(&qc, &kc, &vc)?;
        let out = record(AttentionBackward, [qg, kg, vg], out, || AttentionState {
            q: qc,
            k: kc,
            v: vc,
            probs: std::sync::Arc::new(probs),
            shape,
            scale,
            isa,
        });
        return Some(Tensor::<4>::from_primitive::<Autodiff<Flex>>(out));
    }
    let (out, _) = forward(&flex_f32(q)?, &flex_f32(k)?, &flex_f32(v)?)?;
    Some(Tensor::<4>::from_primitive::<Flex>(out))
}

#[derive(Debug)]
struct AttentionBackward;

/// What backward keeps: the three inputs and the probabilities.
#[derive(Debug, Clone)]
struct AttentionState {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    probs: std::sync::Arc<Vec<f32>>,
    shape: Shape,
    scale: f32,
    isa: Isa,
}

impl Backward<Flex, 3> for AttentionBackward {
    type State = AttentionState;

    fn backward(self, ops: Ops<AttentionState, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let s = ops.state;
        let d_out = contiguous(grads.consume::<Flex>(&ops.node))
            .unwrap_or_else(|| unreachable!("f32 attention gradient"));
        let (dq, dk, dv) = kernel::backward(
            slice(&s.q),
            slice(&s.k),
            slice(&s.v),
            &s.probs,
            slice(&d_out),
            s.shape,
            s.scale,
            s.isa,
        )
        .unwrap_or_else(|| unreachable!("kernel checked in forward"));
        let Shape {
            batch,
            kv_heads,
            rows,
            keys,
            dim,
        } = s.shape;
        let [pq, pk, pv] = ops.parents;
        for (parent, grad, len) in [(pq, dq, rows), (pk, dk, keys), (pv, dv, keys)] {
            if let Some(node) = parent {
                let t = FlexTensor::from_data(TensorData::new(grad, [batch, kv_heads, len, dim]));
                grads.register::<Flex>(node.id, t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::module::attention as burn_attention;
    use burn::tensor::ops::AttentionModuleOptions;
    use burn::tensor::{Bool, Device};

    use crate::model::transformer::tests::max_diff;

    fn vals(len: usize, m: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * m % 97) as f32 - 48.0) / 41.0)
            .collect()
    }

    /// Values and the three gradients against burn's attention (its autodiff composite) on
    /// `Autodiff<Flex>`, with a causal mask over grouped query heads and a left-padded row; and
    /// the plain-Flex forward gives the autodiff forward's bits.
    #[test]
    fn matches_burn_attention_with_gradients() {
        let isa = cpu::isa();
        if !kernel::has_kernel(isa) {
            return;
        }
        let dev = Device::flex().autodiff();
        let (b, kh, g, t, d) = (2, 2, 3, 9, 8);
        let rows = g * t;
        let mut hidden = vec![false; b * rows * t];
        for r in 0..b {
            for i in 0..rows {
                for j in 0..t {
                    let pos = i % t;
                    hidden[(r * rows + i) * t + j] = j > pos || (r == 1 && j < 3 && j != pos);
                }
            }
        }
        let (qd, kd, vd) = (
            vals(b * kh * rows * d, 13),
            vals(b * kh * t * d, 17),
            vals(b * kh * t * d, 19),
        );
        let gd = vals(b * kh * rows * d, 23);
        let scale = 1.0 / (d as f32).sqrt();
        let mut res = Vec::new();
        for ours in [true, false] {
            let q = Tensor::<4>::from_data(TensorData::new(qd.clone(), [b, kh, rows, d]), &dev)
                .require_grad();
            let k = Tensor::<4>::from_data(TensorData::new(kd.clone(), [b, kh, t, d]), &dev)
                .require_grad();
            let v = Tensor::<4>::from_data(TensorData::new(vd.clone(), [b, kh, t, d]), &dev)
                .require_grad();
            let out = if ours {
                attention_isa(&q, &k, &v, &hidden, scale, isa).expect("Flex autodiff path")
            } else {
                let mask = Tensor::<4, Bool>::from_data(
                    TensorData::new(hidden.clone(), [b, 1, rows, t]),
                    &dev,
                );
                let options = AttentionModuleOptions {
                    scale: Some(scale as f64),
                    softcap: None,
                    is_causal: false,
                };
                burn_attention(q.clone(), k.clone(), v.clone(), Some(mask), None, options)
            };
            let gt = Tensor::<4>::from_data(TensorData::new(gd.clone(), [b, kh, rows, d]), &dev);
            let grads = (out.clone() * gt).sum().backward();
            let read = |t: Tensor<4>| t.into_data().try_into_vec::<f32>().unwrap();
            res.push([
                read(out),
                read(q.grad(&grads).unwrap()),
                read(k.grad(&grads).unwrap()),
                read(v.grad(&grads).unwrap()),
            ]);
        }
        for (i, what) in ["out", "dq", "dk", "dv"].iter().enumerate() {
            let worst = max_diff(&res[0][i], &res[1][i]);
            assert!(worst < 2e-6, "{what}: off by {worst}");
            assert!(res[0][i].iter().any(|&x| x != 0.0), "{what} is all zeros");
        }
        let p = Device::flex();
        let q = Tensor::<4>::from_data(TensorData::new(qd, [b, kh, rows, d]), &p);
        let k = Tensor::<4>::from_data(TensorData::new(kd, [b, kh, t, d]), &p);
        let v = Tensor::<4>::from_data(TensorData::new(vd, [b, kh, t, d]), &p);
        let plain = attention_isa(&q, &k, &v, &hidden, scale, isa).unwrap();
        assert_eq!(plain.into_data().try_into_vec::<f32>().unwrap(), res[0][0]);
    }
}
