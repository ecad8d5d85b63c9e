//! Response log-probs for training: the policy's (differentiable), the reference model's and the
//! recomputed behaviour log-probs, all through one function.
//!
//! [`response_logprobs`] runs the cache-free forward of [`Transformer::hidden`] on a
//! [`ResponseBatch`] (`context ++ response` left-padded, so every response ends at the last slot),
//! applies the LM head to the R positions that predict response tokens only, divides the logits
//! by the sampling temperature (verl and TRL do the same, so that the ratio compares like with
//! like), and returns log-probs `[B, R]` **right-aligned**: row b's response token i sits in
//! column `R − len_b + i`. Training keeps that layout for every per-token input (advantages,
//! masks, weights), so no gather is needed to realign; padded columns carry weight 0.
//!
//! At temperature 1 the numbers are those of `rlcr logprobs` ([`crate::model::logprobs`]); a test
//! checks it.
use anyhow::{ensure, Result};
use burn::tensor::Tensor;

use crate::model::{head, LayerCheckpoints, ResponseBatch, Transformer};

/// Log-probs and (optionally) entropies of a batch of responses, right-aligned `[B, R]`.
pub struct ResponseLogprobs {
    /// Log-prob of each response token (padding columns hold the log-prob of token 0).
    pub logp: Tensor<2>,
    /// Entropy of each predicted distribution, when asked for.
    pub entropy: Option<Tensor<2>>,
    /// Entropy of each predicted distribution restricted to a token subset (renormalised over
    /// it; [`super::tensor::subset_entropy`]), when a subset was given; differentiable.
    pub subset_entropy: Option<Tensor<2>>,
    /// The layout: response lengths and R.
    pub resp_lens: Vec<usize>,
    /// Longest response.
    pub max_resp: usize,
    /// With activation checkpointing: what finishes the backward pass below the last layer
    /// ([`LayerCheckpoints::backward`]).
    pub checkpoints: Option<LayerCheckpoints>,
}

/// How the entropy is wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntropyMode {
    /// Not computed.
    Off,
    /// Computed outside the autodiff graph (a metric only).
    Detached,
    /// Computed on the graph (the entropy bonus needs its gradient).
    Differentiable,
}

/// Log-probs of `rows` (`(context, response)` pairs; every response non-empty, every context
/// non-empty) under `model` at `temperature`.
pub fn response_logprobs<C: AsRef<[u32]>, R: AsRef<[u32]>>(
    model: &Transformer,
    rows: &[(C, R)],
    temperature: f64,
    entropy: EntropyMode,
) -> Result<ResponseLogprobs> {
    response_logprobs_subset(model, rows, temperature, entropy, None, false)
}

/// [`response_logprobs`], plus (when `subset` is given) the entropy of every position's
/// distribution restricted to the token ids of `subset` (on the autodiff graph). `checkpoint`
/// runs the layers with activation checkpointing ([`Transformer::hidden_checkpointed`]): the
/// caller then finishes the backward pass with [`ResponseLogprobs::checkpoints`].
pub fn response_logprobs_subset<C: AsRef<[u32]>, R: AsRef<[u32]>>(
    model: &Transformer,
    rows: &[(C, R)],
    temperature: f64,
    entropy: EntropyMode,
    subset: Option<&[u32]>,
    checkpoint: bool,
) -> Result<ResponseLogprobs> {
    ensure!(
        temperature > 0.0 && temperature.is_finite(),
        "temperature must be > 0, got {temperature}"
    );
    let batch = ResponseBatch::new(rows)?;
    let r = batch.max_resp;
    ensure!(r > 0, "no response tokens in the batch");
    let (h, checkpoints) = if checkpoint {
        let (h, c) = model.hidden_checkpointed(&batch.tokens)?;
        (h, Some(c))
    } else {
        (model.hidden(&batch.tokens)?, None)
    };
    let [b, t, hd] = h.dims();
    ensure!(t > r, "every row needs at least one context token");
    // Slot s predicts slot s+1: the R right-aligned response slots are predicted by t-r-1..t-1.
    let hs = h
        .slice([0..b, t - r - 1..t - 1, 0..hd])
        .reshape([b * r, hd]);
    // Right-aligned targets `[B·R]` (padding columns ask for token 0; their weight is 0).
    let mut targets = vec![0u32; b * r];
    for (i, (_, resp)) in rows.iter().enumerate() {
        let resp = resp.as_ref();
        let off = i * r + (r - resp.len());
        targets[off..off + resp.len()].copy_from_slice(resp);
    }
    let want_entropy = entropy != EntropyMode::Off;
    let (subset_entropy, (logp, ent)) = match subset {
        // The subset's entropy reads the logits: the head forms them for the whole batch.
        Some(ids) => {
            let logits = model.lm_head(hs);
            let sub = super::tensor::subset_entropy(logits.clone(), ids, temperature)?;
            let head = head::logprob_entropy(logits, &targets, temperature, want_entropy)?;
            (Some(sub.reshape([b, r])), head)
        }
        // Log-softmax, gather and entropy without returning the logits (on a GPU never all
        // at once: `Transformer::head_logprobs`).
        None => (
            None,
            model.head_logprobs(hs, &targets, temperature, want_entropy)?,
        ),
    };
    let logp = logp.reshape([b, r]);
    let ent = ent.map(|h| {
        let h = h.reshape([b, r]);
        if entropy == EntropyMode::Detached {
            h.detach()
        } else {
            h
        }
    });
    Ok(ResponseLogprobs {
        logp,
        entropy: ent,
        subset_entropy,
        resp_lens: batch.resp_lens,
        max_resp: r,
        checkpoints,
    })
}

/// Lay out per-token host values right-aligned `[B·R]` (padding `fill`), to match
/// [`ResponseLogprobs`].
pub fn right_align<T: Copy>(rows: &[&[T]], r: usize, fill: T) -> Vec<T> {
    let mut out = vec![fill; rows.len() * r];
    for (i, v) in rows.iter().enumerate() {
        let off = i * r + (r - v.len());
        out[off..off + v.len()].copy_from_slice(v);
    }
    out
}

/// Undo [`right_align`]: one vector per row of the given lengths.
pub fn split_right_aligned(flat: &[f32], lens: &[usize], r: usize) -> Vec<Vec<f32>> {
    lens.iter()
        .enumerate()
        .map(|(i, &len)| flat[i * r + r - len..(i + 1) * r].to_vec())
        .collect()
}

/// Log-probs per row on the host (no graph), in batches of `batch_size` rows, at `temperature`;
/// rows with an empty response give an empty vector. Used for the reference model and for
/// recomputing behaviour log-probs.
pub fn host_logprobs(
    model: &Transformer,
    rows: &[(&[u32], &[u32])],
    batch_size: usize,
    temperature: f64,
    mut progress: Option<&mut crate::progress::Progress>,
) -> Result<Vec<Vec<f32>>> {
    let mut out = vec![Vec::new(); rows.len()];
    let mut order: Vec<usize> = (0..rows.len()).filter(|&i| !rows[i].1.is_empty()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(rows[i].0.len() + rows[i].1.len()));
    for chunk in order.chunks(batch_size.max(1)) {
        let sub: Vec<(&[u32], &[u32])> = chunk.iter().map(|&i| rows[i]).collect();
        let lp = response_logprobs(model, &sub, temperature, EntropyMode::Off)?;
        let flat = crate::model::read_f32(lp.logp.detach())?;
        for (k, v) in split_right_aligned(&flat, &lp.resp_lens, lp.max_resp)
            .into_iter()
            .enumerate()
        {
            out[chunk[k]] = v;
        }
        if let Some(p) = progress.as_deref_mut() {
            p.inc(chunk.len() as u64);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn right_align_round_trip() {
        let a = [1.0f32, 2.0];
        let b = [3.0f32, 4.0, 5.0];
        let flat = right_align(&[&a[..], &b[..]], 3, 0.0);
        assert_eq!(flat, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(
            split_right_aligned(&flat, &[2, 3], 3),
            vec![a.to_vec(), b.to_vec()]
        );
    }
}
