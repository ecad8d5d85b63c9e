//! Activation checkpointing for training: the layers' forward pass without a graph, keeping each
//! layer's input, and the backward pass that recomputes one layer at a time
//! ([`Transformer::hidden_checkpointed`], [`LayerCheckpoints::backward`]).
use anyhow::{Context, Result};
use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Gradients, Tensor};

use super::{FreshBatch, KvSource, Transformer};
use crate::model::{ops, TokenBatch};

impl Transformer {
    /// [`Self::hidden`] with activation checkpointing, for training on an autodiff device: the
    /// layers run without recording a graph, keeping only each layer's input `[B·T, h]`; the
    /// result's graph starts at the last layer's output (a leaf). After `backward()` on a loss
    /// of the result, [`LayerCheckpoints::backward`] recomputes one layer at a time, with its
    /// graph, from its saved input and carries the gradient down to the embedding.
    ///
    /// Memory: the saved inputs (`layers · B·T·h` floats) plus one layer's graph at a time,
    /// instead of every layer's graph. Time: one more forward pass of the layers. The gradients
    /// are those of [`Self::hidden`]: each layer is recomputed by the same operations on the
    /// same input, and its upstream gradient enters as `∂(Σ y·g)/∂y = g` exactly. (On a GPU the
    /// pass without a graph runs RMSNorm, SwiGLU, RoPE and attention as `#[cube]` kernels and
    /// the recomputation as burn's composites, which sum in other orders: there the two agree to
    /// f32 rounding.)
    pub fn hidden_checkpointed(&self, input: &TokenBatch) -> Result<(Tensor<3>, LayerCheckpoints)> {
        let device = self.device();
        let fresh = FreshBatch::new(self, input, &device)?;
        let (b, t) = fresh.shape;
        let embedded = self.embed_tokens(input, &device);
        // Plain tensors and weights: nothing of this pass is kept for backward.
        let plain = FreshBatch {
            shape: fresh.shape,
            rope: fresh.rope.inner(),
            mask: fresh.mask.clone().inner(),
            mask_host: fresh.mask_host.clone(),
            drop: fresh.drop.clone(),
        };
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut x = embedded.clone().inner();
        {
            let step = plain.step(&self.dims);
            for layer in &self.layers {
                inputs.push(x.clone());
                x = layer.valid().forward(x, &step, KvSource::Fresh, None);
            }
        }
        let top = Tensor::from_inner(x).require_grad();
        let h = self
            .final_norm(top.clone())
            .reshape([b, t, self.dims.hidden]);
        Ok((
            h,
            LayerCheckpoints {
                inputs,
                top,
                embedded,
                fresh,
            },
        ))
    }
}

/// What the backward pass of [`Transformer::hidden_checkpointed`] needs: every layer's input
/// (plain tensors, no graph), the leaf standing for the last layer's output, and the embedding
/// lookup (on the graph, so that its gradient reaches the embedding matrix).
pub struct LayerCheckpoints {
    inputs: Vec<Tensor<2>>,
    top: Tensor<2>,
    embedded: Tensor<2>,
    fresh: FreshBatch,
}

impl LayerCheckpoints {
    /// Finish the backward pass of a checkpointed forward: `grads` is the result of
    /// `loss.backward()`, whose graph ends at the last layer's output. Layer by layer from the
    /// top, the layer is recomputed with its graph from its saved input, and `Σ y·g` (`g` the
    /// gradient arriving at its output, a constant) is differentiated, which gives its
    /// parameters' gradients and the gradient at its input. Returns the gradients of every
    /// parameter of `model`, as `GradientsParams::from_grads` would for the whole graph.
    pub fn backward(self, model: &Transformer, grads: Gradients) -> Result<GradientsParams> {
        let mut acc = GradientsAccumulator::<Transformer>::new();
        let mut g = self
            .top
            .grad(&grads)
            .context("checkpointed backward: the loss does not depend on the hidden states")?;
        acc.accumulate(model, GradientsParams::from_grads(grads, model));
        let step = self.fresh.step(&model.dims);
        for (layer, x) in model.layers.iter().zip(self.inputs).rev() {
            let x = Tensor::from_inner(x).require_grad();
            let y = layer.forward(x.clone(), &step, KvSource::Fresh, None);
            let part = ops::sum(y * Tensor::from_inner(g)).backward();
            g = x
                .grad(&part)
                .context("checkpointed backward: no gradient at a layer's input")?;
            acc.accumulate(model, GradientsParams::from_grads(part, layer));
        }
        // A frozen embedding (a LoRA adapter trains alone) has no graph to carry `g` into.
        if self.embedded.is_tracked() {
            let part = ops::sum(self.embedded * Tensor::from_inner(g)).backward();
            acc.accumulate(model, GradientsParams::from_grads(part, model));
        }
        Ok(acc.grads())
    }
}
