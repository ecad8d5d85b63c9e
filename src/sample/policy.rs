//! The sampling policy: a loaded [`Model`] seen by the sampler, plus the conversation encoding of
//! the two turns.
//!
//! Design decisions:
//! - [`Policy`] implements [`StepModel`] over the model's [`Transformer`] and [`KvCache`]: a step
//!   is one cached forward whose last-position logits `[B, V]` are copied to the host; nothing
//!   else crosses per step.
//! - **Generation prompts**: a conversation ending with a user message is rendered with the
//!   template's generation prompt; one ending with an assistant message is *continued* (HF's
//!   `continue_final_message`: render without the generation prompt and cut right after the last
//!   occurrence of the final message's stripped content). That is how a response prefix (a
//!   pre-filled `<think>`, TinyZero's "Let me solve this step by step.\n<think>") is written down
//!   in the `messages` column.
//! - **Turn 2 keeps turn 1's tokens**: the confidence context is the rendered conversation with the
//!   answer spliced in as the **sampled ids** (`encode(text before) ++ response ids ++
//!   encode(text after)`), not a re-tokenisation of the answer text, which could differ from what
//!   was sampled (byte-level BPE does not round-trip arbitrary sampled sequences). The split
//!   points come from rendering once with a sentinel in place of the answer; if the template
//!   rewrites assistant content (some drop earlier turns' reasoning) the splice is impossible
//!   and the whole text is tokenised instead (counted and reported).
use std::path::Path;

use anyhow::{bail, Context, Result};
use burn::tensor::Device;

use super::sampler::StepModel;
use crate::model::{self, KvCache, Message, Model, TokenBatch};

/// A model ready to sample from.
pub struct Policy {
    pub model: Model,
    /// See [`super::fingerprint`].
    pub fingerprint: String,
}

impl Policy {
    /// Load the model folder `dir` on `device` and fingerprint it.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let model = Model::load(dir, device)
            .with_context(|| format!("loading the model {}", dir.display()))?;
        let fingerprint = super::fingerprint::model_fingerprint(dir)?;
        Ok(Policy { model, fingerprint })
    }

    /// Ids below this can be sampled: the tokenizer's vocabulary (with added tokens), capped by
    /// the LM head's rows.
    pub fn allowed_vocab(&self) -> usize {
        self.model
            .tokenizer
            .vocab_size()
            .min(self.model.transformer.dims.vocab)
    }

    /// Decode ids with special tokens kept (the tags of the fixture tokenizers are special).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.model.tokenizer.decode(ids, false)
    }

    /// Render `messages` for generation (see the module docs): the text the model continues.
    pub fn render_for_generation(&self, messages: &[Message]) -> Result<String> {
        let chat = self.model.chat()?;
        match messages.last() {
            Some(m) if m.role == "assistant" => {
                let full = chat.render(messages, false)?;
                // The exact content first; the stripped one (HF's rule) for templates that trim.
                for content in [m.content.as_str(), m.content.trim()] {
                    if let Some(pos) = full.rfind(content) {
                        return Ok(full[..pos + content.len()].to_string());
                    }
                }
                bail!(
                    "the chat template does not write the final assistant message (the response \
                     prefix {:?}) into the prompt, so it cannot be continued",
                    m.content
                )
            }
            _ => chat.render(messages, true),
        }
    }

    /// Context of a turn-1 sample: (rendered text, ids).
    pub fn encode_context(&self, messages: &[Message]) -> Result<(String, Vec<u32>)> {
        let text = self.render_for_generation(messages)?;
        let ids = self.model.tokenizer.encode(&text, false)?;
        Ok((text, ids))
    }

    /// Context of a turn-2 sample: `before` (ending with the answer's user message or with a
    /// partial assistant message holding the response prefix), then the assistant message
    /// `prefix + answer_text` whose answer part is spliced in as `answer_ids`, then `after` (the
    /// confidence query and possibly a confidence prefix). Returns (rendered text, ids, whether
    /// the ids were spliced).
    pub fn encode_with_answer(
        &self,
        before: &[Message],
        answer_prefix: &str,
        answer_text: &str,
        answer_ids: &[u32],
        after: &[Message],
    ) -> Result<(String, Vec<u32>, bool)> {
        const SENTINEL: &str = "\u{E000}rlcr-answer\u{E001}";
        let build = |content: String| {
            let mut m = before.to_vec();
            m.push(Message {
                role: "assistant".into(),
                content,
            });
            m.extend_from_slice(after);
            m
        };
        let real = self.render_for_generation(&build(format!("{answer_prefix}{answer_text}")))?;
        let marked = self.render_for_generation(&build(format!("{answer_prefix}{SENTINEL}")))?;
        if let Some(pos) = marked.find(SENTINEL) {
            let (pre, post) = (&marked[..pos], &marked[pos + SENTINEL.len()..]);
            if !post.contains(SENTINEL) && real.len() == pre.len() + answer_text.len() + post.len() && real.starts_with(pre) && real.ends_with(post) {
                let tok = &self.model.tokenizer;
                let mut ids = tok.encode(pre, false)?;
                ids.extend_from_slice(answer_ids);
                ids.extend(tok.encode(post, false)?);
                return Ok((real, ids, true));
            }
        }
        let ids = self.model.tokenizer.encode(&real, false)?;
        Ok((real, ids, false))
    }
}

impl StepModel for Policy {
    type Cache = KvCache;

    fn vocab(&self) -> usize {
        self.model.transformer.dims.vocab
    }

    fn max_positions(&self) -> usize {
        self.model.config.max_position_embeddings
    }

    fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        Ok(KvCache::new(&self.model.transformer, batch, capacity))
    }

    fn step(&self, cache: &mut KvCache, batch: usize, len: usize, ids: &[u32], valid: &[bool]) -> Result<Vec<f32>> {
        let input = TokenBatch::new(batch, len, ids.to_vec(), valid.to_vec())?;
        let logits = self.model.transformer.step(cache, &input)?;
        model::read_f32(logits)
    }

    fn select_rows(&self, cache: &mut KvCache, rows: &[usize]) -> Result<()> {
        cache.select_rows(rows)
    }
}
