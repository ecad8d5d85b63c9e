//! Models: a Llama / Qwen2 decoder in burn that computes the same function as Hugging Face
//! transformers, with its weights, tokenizer and chat template.
//!
//! - [`config`]: `config.json` with HF key names (transformers 4 and 5 spellings).
//! - [`transformer`]: the decoder (a burn `Module`), the KV cache, token batches.
//! - [`weights`]: safetensors in (f32/bf16/f16, sharded or not) and out (atomic, same layout and
//!   dtypes).
//! - [`tokenizer`]: `tokenizer.json`, special tokens, token ↔ text offsets for spans.
//! - [`chat`]: chat templates rendered like transformers.
//! - [`cpu`]: a CPU fast path for decode-shaped matrix products (Flex only, optional).
//! - [`gguf`]: llama.cpp GGUF import.
//!
//! [`Model`] bundles them for the stages; [`logprobs`] is the batched per-token log-prob routine
//! shared by `rlcr logprobs` and (on an autodiff device, through
//! [`Transformer::response_logprobs`]) by `update`. [`device_from_str`] maps `--device` to a burn
//! device; nothing else in this module names a backend.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use burn::tensor::Device;

pub mod chat;
pub mod config;
pub mod cpu;
pub mod gguf;
pub mod tokenizer;
pub mod transformer;
pub mod value;
pub mod weights;

pub use chat::{ChatTemplate, Message};
pub use config::ModelConfig;
pub use tokenizer::{DecodedText, Tokenizer};
pub use transformer::{KvCache, ResponseBatch, TokenBatch, Transformer};
pub use weights::WeightDtypes;

use crate::progress::Progress;

/// Parse `--device`: `cpu` (the Flex backend) or `cuda` / `cuda:N` (builds with `--features
/// cuda` only).
pub fn device_from_str(s: &str) -> Result<Device> {
    let s = s.trim();
    if s == "cpu" {
        return Ok(Device::flex());
    }
    if let Some(rest) = s.strip_prefix("cuda") {
        let index: usize = match rest {
            "" => 0,
            r => r
                .strip_prefix(':')
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("--device {s}: expected cuda or cuda:N"))?,
        };
        return cuda_device(index, s);
    }
    bail!("--device {s}: expected cpu, cuda or cuda:N")
}

#[cfg(feature = "cuda")]
fn cuda_device(index: usize, _s: &str) -> Result<Device> {
    Ok(Device::cuda(index))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(_index: usize, s: &str) -> Result<Device> {
    bail!(
        "--device {s}: this rlcr was built without CUDA support; rebuild with \
         `cargo build --release --features cuda` on a machine with the CUDA toolkit"
    )
}

/// A model folder loaded for use: config, weights, tokenizer and chat template.
#[derive(Debug)]
pub struct Model {
    /// The folder it was loaded from (its tokenizer/config files are copied on save).
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub transformer: Transformer,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// On-disk dtype of every weight, to save in the same dtypes.
    pub dtypes: WeightDtypes,
}

impl Model {
    /// Load a Hugging Face model folder onto `device` (use `device.autodiff()` to train).
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let config = ModelConfig::load(dir)?;
        let (transformer, dtypes) = weights::load(&config, dir, device)?;
        let tokenizer = Tokenizer::load(dir, Some(&config))?;
        let chat_template = ChatTemplate::load(dir)?;
        Ok(Model {
            dir: dir.to_path_buf(),
            config,
            transformer,
            tokenizer,
            chat_template,
            dtypes,
        })
    }

    /// Save the current weights as a complete checkpoint folder at `out` (atomic; HF layout,
    /// names and dtypes as loaded; config, tokenizer and template files copied).
    pub fn save(&self, out: &Path) -> Result<()> {
        if let (Ok(a), Ok(b)) = (self.dir.canonicalize(), out.canonicalize()) {
            if a == b {
                bail!(
                    "{}: refusing to overwrite the model folder it was loaded from",
                    out.display()
                );
            }
        }
        weights::save(
            &self.transformer,
            &self.config,
            &self.dtypes,
            &self.dir,
            out,
        )
    }

    /// The chat template, or an error naming the folder.
    pub fn chat(&self) -> Result<&ChatTemplate> {
        self.chat_template.as_ref().with_context(|| {
            format!(
                "{}: no chat template (neither chat_template.jinja nor a chat_template key in \
                 tokenizer_config.json)",
                self.dir.display()
            )
        })
    }

    /// Render a conversation with the chat template and encode it as transformers'
    /// `apply_chat_template(..., tokenize=True)` does (no added special tokens).
    pub fn encode_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<(String, Vec<u32>)> {
        let text = self.chat()?.render(messages, add_generation_prompt)?;
        let ids = self.tokenizer.encode(&text, false)?;
        Ok((text, ids))
    }
}

/// Per-token log-probs (and optionally entropies) of response tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprobs {
    /// One vector per row, aligned with its response ids.
    pub logprobs: Vec<Vec<f32>>,
    /// Entropy of each predicted distribution, when asked for.
    pub entropy: Option<Vec<Vec<f32>>>,
}

/// Positions of the LM head evaluated at once by [`logprobs`] (bounds the logits memory).
pub const LOGIT_CHUNK_ROWS: usize = 256;

/// For every `(context, response)` row, `log p(response[i] | context, response[..i])` for each
/// response token, in batches of `batch_size` rows (left-padded; rows are grouped by length to
/// limit padding and returned in input order). Rows with an empty response give an empty
/// vector; a row with an empty context and a non-empty response is an error.
///
/// Padding does not change the numbers: each row computes the same function as alone (equal to
/// about 1e-6; matmul blocking may differ in the last bits).
pub fn logprobs(
    model: &Transformer,
    rows: &[(&[u32], &[u32])],
    batch_size: usize,
    entropy: bool,
    mut progress: Option<&mut Progress>,
) -> Result<Logprobs> {
    let mut out_lp: Vec<Vec<f32>> = vec![Vec::new(); rows.len()];
    let mut out_ent: Vec<Vec<f32>> = vec![Vec::new(); rows.len()];
    let vocab = model.dims.vocab;
    for (i, (c, r)) in rows.iter().enumerate() {
        if !r.is_empty() && c.is_empty() {
            bail!("row {i}: context_ids is empty; the first response token has no context");
        }
        if let Some(&bad) = c.iter().chain(r.iter()).find(|&&t| t as usize >= vocab) {
            bail!("row {i}: token id {bad} is outside the model's vocabulary of {vocab}");
        }
    }
    let mut order: Vec<usize> = (0..rows.len()).filter(|&i| !rows[i].1.is_empty()).collect();
    // Longest first, so batches hold similar lengths; ties keep input order.
    order.sort_by_key(|&i| std::cmp::Reverse(rows[i].0.len() + rows[i].1.len()));
    let skipped = rows.len() - order.len();
    if let Some(p) = progress.as_deref_mut() {
        p.inc(skipped as u64);
    }
    for chunk in order.chunks(batch_size.max(1)) {
        let batch_rows: Vec<(&[u32], &[u32])> = chunk.iter().map(|&i| rows[i]).collect();
        let batch = ResponseBatch::new(&batch_rows)?;
        let (lp, ent) = model.response_logprobs(&batch, entropy, LOGIT_CHUNK_ROWS)?;
        let lp = read_f32(lp)?;
        for (k, v) in batch.split_rows(&lp).into_iter().enumerate() {
            out_lp[chunk[k]] = v;
        }
        if let Some(ent) = ent {
            let ent = read_f32(ent)?;
            for (k, v) in batch.split_rows(&ent).into_iter().enumerate() {
                out_ent[chunk[k]] = v;
            }
        }
        if let Some(p) = progress.as_deref_mut() {
            p.inc(chunk.len() as u64);
        }
    }
    Ok(Logprobs {
        logprobs: out_lp,
        entropy: entropy.then_some(out_ent),
    })
}

/// Copy a float tensor to the host as f32.
pub fn read_f32<const D: usize>(t: burn::tensor::Tensor<D>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("reading a tensor back: {e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_strings() {
        assert!(device_from_str("cpu").is_ok());
        let e = device_from_str("tpu").unwrap_err();
        assert!(format!("{e}").contains("expected cpu"));
        assert!(device_from_str("cuda:x").is_err());
        #[cfg(not(feature = "cuda"))]
        {
            let e = device_from_str("cuda:1").unwrap_err();
            assert!(format!("{e}").contains("--features cuda"));
        }
    }
}
