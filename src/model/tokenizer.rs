//! The tokenizer: `tokenizer.json` through the `tokenizers` crate, plus the special tokens of
//! `tokenizer_config.json` and `generation_config.json`, plus token ↔ text offsets for spans.
//!
//! Design decisions:
//! - Encoding and decoding are exactly the `tokenizers` crate's (the library transformers' fast
//!   tokenizers wrap), so ids equal transformers' ids. Its errors are boxed `dyn Error`; they are
//!   mapped into `anyhow` with the file or text they concern.
//! - Chat prompts are encoded **without** added special tokens (`add_special_tokens = false`), as
//!   transformers' `apply_chat_template` does: the template itself writes every special token.
//! - Stop ids are the union of `generation_config.json`'s `eos_token_id` (int or list), the
//!   config's and the tokenizer's eos token.
//! - Offsets for span finding ([`DecodedText`]) come from a streaming decode (the crate's
//!   `DecodeStream`, which handles byte-level pieces that end inside a UTF-8 character and
//!   decoders that strip a leading space): each token is credited with the bytes of text that
//!   appear when it is decoded. A tag split over several tokens, or a tag that is one special
//!   token, maps to exactly the tokens that produce its characters.
use std::ops::Range;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

use super::config::{token_ids, ModelConfig};

/// A loaded tokenizer with its special tokens.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `bos_token` of tokenizer_config.json (text and id), if any.
    pub bos: Option<(String, u32)>,
    /// `eos_token` of tokenizer_config.json (text and id), if any.
    pub eos: Option<(String, u32)>,
    /// `pad_token` of tokenizer_config.json, else generation_config's / config's pad id.
    pub pad: Option<(String, u32)>,
    /// `unk_token` text, if any (a chat-template variable).
    pub unk: Option<String>,
    /// Ids that end a generation.
    pub stop_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("pad", &self.pad)
            .field("stop_ids", &self.stop_ids)
            .finish()
    }
}

/// A special-token entry of tokenizer_config.json: a string, an AddedToken object or null.
fn special_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?,
    ))
}

impl Tokenizer {
    /// Load `DIR/tokenizer.json` and the special tokens of `tokenizer_config.json`,
    /// `generation_config.json` and the model config.
    pub fn load(dir: &Path, config: Option<&ModelConfig>) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("loading {}", path.display()))?;
        if let Some(c) = config {
            // A tokenizer from another model: an id beyond the embedding would fail mid-run.
            if let Some((t, id)) = inner
                .get_vocab(true)
                .into_iter()
                .filter(|(_, id)| *id as usize >= c.vocab_size)
                .min_by_key(|(_, id)| *id)
            {
                bail!(
                    "{}: token {t:?} has id {id}, but the model's vocabulary (config.json \
                     vocab_size) has {} entries: the tokenizer does not belong to this model",
                    path.display(),
                    c.vocab_size
                );
            }
        }
        let tc = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or_default();
        let gc = read_json(&dir.join("generation_config.json"))?.unwrap_or_default();
        let mut tok = Tokenizer {
            inner,
            bos: None,
            eos: None,
            pad: None,
            unk: special_text(tc.get("unk_token")),
            stop_ids: Vec::new(),
        };
        let lookup = |name: &str, text: Option<String>| -> Result<Option<(String, u32)>> {
            match text {
                None => Ok(None),
                Some(t) => {
                    let id = tok.inner.token_to_id(&t).with_context(|| {
                        format!(
                            "{}: {name} `{t}` is not in tokenizer.json",
                            dir.join("tokenizer_config.json").display()
                        )
                    })?;
                    Ok(Some((t, id)))
                }
            }
        };
        let bos = lookup("bos_token", special_text(tc.get("bos_token")))?;
        let eos = lookup("eos_token", special_text(tc.get("eos_token")))?;
        let pad = lookup("pad_token", special_text(tc.get("pad_token")))?;
        tok.bos = bos;
        tok.eos = eos;
        tok.pad = pad;
        let gen_eos = token_ids(
            &gc.get("eos_token_id").cloned(),
            "generation_config eos_token_id",
        )?;
        let mut stop = gen_eos;
        if let Some(c) = config {
            stop.extend(c.eos_token_ids.iter().copied());
        }
        if let Some((_, id)) = &tok.eos {
            stop.push(*id);
        }
        let mut seen = std::collections::BTreeSet::new();
        stop.retain(|id| seen.insert(*id));
        tok.stop_ids = stop;
        if tok.pad.is_none() {
            let pad_id = token_ids(
                &gc.get("pad_token_id").cloned(),
                "generation_config pad_token_id",
            )?
            .first()
            .copied()
            .or(config.and_then(|c| c.pad_token_id));
            if let Some(id) = pad_id {
                let text = tok.inner.id_to_token(id).unwrap_or_default();
                tok.pad = Some((text, id));
            }
        }
        Ok(tok)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Vocabulary size including added tokens (may be smaller than the model's `vocab_size`).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encode text; `add_special_tokens` runs the post-processor (e.g. Llama 3's BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| anyhow!("{e}"))
            .context("tokenizing text")?
            .get_ids()
            .to_vec())
    }

    /// Decode ids to text (`skip_special_tokens` drops special tokens as transformers does).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| anyhow!("{e}"))
            .context("decoding token ids")
    }

    /// The id of a token string (vocabulary or added token).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of an id.
    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Decode ids (special tokens kept) with the byte range each token contributes to the text.
    pub fn decode_with_offsets(&self, ids: &[u32]) -> Result<DecodedText> {
        let mut stream = self.inner.decode_stream(false);
        let mut text = String::new();
        let mut offsets = Vec::with_capacity(ids.len());
        let mut pending = 0usize;
        for (i, &id) in ids.iter().enumerate() {
            let chunk = stream
                .step(id)
                .map_err(|e| anyhow!("{e}"))
                .with_context(|| format!("decoding token {i} (id {id})"))?;
            if let Some(chunk) = chunk {
                let start = text.len();
                text.push_str(&chunk);
                for _ in pending..=i {
                    offsets.push(start..text.len());
                }
                pending = i + 1;
            }
        }
        // Tokens still pending (an incomplete UTF-8 sequence at the end): credit them with the
        // rest of the full decode, which renders the incomplete bytes as U+FFFD.
        if pending < ids.len() {
            let full = self.decode(ids, false)?;
            let start = text.len();
            if full.starts_with(&text) {
                text = full;
            }
            for _ in pending..ids.len() {
                offsets.push(start..text.len());
            }
        }
        Ok(DecodedText { text, offsets })
    }
}

/// Decoded text with, for every token, the byte range of the text it produced.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedText {
    pub text: String,
    /// One byte range per token; tokens that together produce one piece of text (a character
    /// split over several byte-level tokens) share its range; ranges never decrease.
    pub offsets: Vec<Range<usize>>,
}

impl DecodedText {
    /// The token index range whose text covers the byte range `bytes` of [`Self::text`]: from the
    /// first token producing any byte of it to the last one (end exclusive). `None` when no token
    /// overlaps (e.g. an empty range).
    pub fn tokens_covering(&self, bytes: Range<usize>) -> Option<Range<usize>> {
        if bytes.start >= bytes.end {
            return None;
        }
        let overlaps = |r: &Range<usize>| r.start < bytes.end && r.end > bytes.start;
        let first = self.offsets.iter().position(overlaps)?;
        let last = self.offsets.iter().rposition(overlaps)?;
        Some(first..last + 1)
    }

    /// Byte offset of the first occurrence of `needle` at or after byte `from`.
    pub fn find(&self, needle: &str, from: usize) -> Option<usize> {
        self.text.get(from..)?.find(needle).map(|p| p + from)
    }

    /// Token range from the start of the first `open` tag to the end of the first `close` tag
    /// after it (end exclusive), e.g. `("<think>", "</answer>")`. `None` when either is missing.
    pub fn span(&self, open: &str, close: &str) -> Option<Range<usize>> {
        let a = self.find(open, 0)?;
        let b = self.find(close, a + open.len())? + close.len();
        self.tokens_covering(a..b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(name)
    }

    #[test]
    fn special_tokens_from_config_files() {
        let t = Tokenizer::load(&fixture("tiny-llama"), None).unwrap();
        assert_eq!(t.bos, Some(("<|begin_of_text|>".to_string(), 11)));
        assert_eq!(t.eos, Some(("<|im_end|>".to_string(), 2)));
        assert_eq!(t.pad, Some(("<|endoftext|>".to_string(), 0)));
        // generation_config eos [2, 0] ∪ tokenizer eos 2.
        assert_eq!(t.stop_ids, vec![2, 0]);
        assert_eq!(t.vocab_size(), 360);
        // Llama-3-style post-processor adds BOS only with special tokens on.
        let with = t.encode("hi", true).unwrap();
        let without = t.encode("hi", false).unwrap();
        assert_eq!(with[0], 11);
        assert_eq!(&with[1..], &without[..]);
    }

    #[test]
    fn offsets_cover_split_and_special_tags() {
        let t = Tokenizer::load(&fixture("tiny-qwen2"), None).unwrap();
        // `<think>` is a special token; `</answer` text written out of plain characters is split
        // over several byte-level tokens when not matched as a special token.
        let text = "<think>12 + 7 = 19</think><answer>19</answer> done é";
        let ids = t.encode(text, false).unwrap();
        let d = t.decode_with_offsets(&ids).unwrap();
        assert_eq!(d.text, t.decode(&ids, false).unwrap());
        assert_eq!(d.text, text);
        assert_eq!(d.offsets.len(), ids.len());
        let span = d.span("<think>", "</answer>").unwrap();
        assert_eq!(span.start, 0);
        assert_eq!(ids[span.start], t.token_id("<think>").unwrap());
        assert_eq!(ids[span.end - 1], t.token_id("</answer>").unwrap());
        // The same tags as plain text in a tokenizer-agnostic sense: find "19" (split digits).
        let at = d.find("19", 0).unwrap();
        let r = d.tokens_covering(at..at + 2).unwrap();
        assert_eq!(t.decode(&ids[r.clone()], false).unwrap(), "19");
        assert_eq!(r.len(), 2, "digits are split one per token");
    }

    #[test]
    fn offsets_when_a_multibyte_char_is_cut() {
        let t = Tokenizer::load(&fixture("tiny-qwen2"), None).unwrap();
        let ids = t.encode("aé€", false).unwrap();
        // Drop the last token: the decode may end inside a character.
        let cut = &ids[..ids.len() - 1];
        let d = t.decode_with_offsets(cut).unwrap();
        assert_eq!(d.offsets.len(), cut.len());
        assert!(d.offsets.windows(2).all(|w| w[0].start <= w[1].start));
        assert_eq!(d.offsets.last().map(|r| r.end), Some(d.text.len()));
    }
}
