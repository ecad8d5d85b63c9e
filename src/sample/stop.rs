//! Stop conditions and incremental detokenisation.
//!
//! A response ends at the first of: an end-of-sequence token (any of the model's EOS ids), a stop
//! string appearing in the decoded text, or `max_new_tokens` tokens. The first two give
//! `finish_reason = "stop"`, the last `"length"`.
//!
//! Design decisions:
//! - **The EOS token is kept in `response_ids`** (with its log-prob) so that training also
//!   reinforces *stopping*; it is not part of `response_text`.
//! - **Stop strings end the response after the token that completes them**; the token is kept
//!   whole, so `response_text` is always the decoding of `response_ids` (possibly running a few
//!   characters past the stop string) and ids, text, log-probs and spans stay aligned.
//! - **Incremental detokenisation** ([`Detokenizer`]) is the windowed scheme of HF TGI / vLLM:
//!   decode a short window ending at the new token and at the previous one, emit the difference,
//!   and hold back text that ends in an incomplete UTF-8 sequence (U+FFFD) until the next token
//!   completes it. Each call decodes a handful of tokens, so a response costs O(n), and the
//!   per-token end offsets it records are the tokenizer offset mapping of generated ids (used to
//!   turn tag positions into token spans; see [`super::spans`]). Special tokens are decoded as
//!   text (the tags of the fixture tokenizers are special tokens and must stay visible).
use anyhow::Result;
use serde::Serialize;

/// Why a response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS token or stop string.
    Stop,
    /// `max_new_tokens` reached.
    Length,
}

impl FinishReason {
    /// The value of the `finish_reason` column.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The stop conditions of a generation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StopCriteria {
    /// End-of-sequence ids (from generation_config.json / tokenizer_config.json).
    pub eos: Vec<u32>,
    /// The response ends once its text contains any of these.
    pub stop_strings: Vec<String>,
    /// Hard cap on response tokens.
    pub max_new_tokens: usize,
}

impl StopCriteria {
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }

    /// Longest stop string in bytes (0 if none).
    fn max_stop_len(&self) -> usize {
        self.stop_strings.iter().map(|s| s.len()).max().unwrap_or(0)
    }

    /// Does `text` contain a stop string that ends at or after byte `new_from` (i.e. one that the
    /// text from `new_from` on completes)? Only that tail is searched.
    pub fn stop_string_in(&self, text: &str, new_from: usize) -> bool {
        let m = self.max_stop_len();
        if m == 0 {
            return false;
        }
        let mut from = new_from.saturating_sub(m - 1).min(text.len());
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        let tail = &text[from..];
        self.stop_strings
            .iter()
            .any(|s| !s.is_empty() && tail.contains(s.as_str()))
    }
}

/// A function decoding ids to text (special tokens kept).
pub type DecodeFn<'a> = dyn Fn(&[u32]) -> Result<String> + Sync + 'a;

/// Incremental decoder for one response: text so far and the end byte offset of every token.
#[derive(Debug, Clone, Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    /// Start of the decode window (tokens before it are final).
    prefix_offset: usize,
    /// Tokens up to here have been emitted.
    read_offset: usize,
    text: String,
    /// `ends[i]` = byte length of `text` once token i was pushed.
    ends: Vec<usize>,
}

/// Window of already-emitted tokens decoded before the new one (context for decoders that
/// depend on neighbours, e.g. SentencePiece's leading-space rule).
const CONTEXT_TOKENS: usize = 5;

impl Detokenizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// The text emitted so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// End byte offsets of the tokens pushed so far (token i covers `ends[i-1]..ends[i]`).
    pub fn ends(&self) -> &[usize] {
        &self.ends
    }

    /// Add a token that is part of the text. Returns the byte offset where newly emitted text
    /// starts (equal to `text().len()` when nothing was emitted).
    pub fn push(&mut self, id: u32, decode: &DecodeFn<'_>) -> Result<usize> {
        let before = self.text.len();
        self.ids.push(id);
        let prefix = decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = decode(&self.ids[self.prefix_offset..])?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            self.replace_tail(&prefix, &full);
            self.read_offset = self.ids.len();
            self.prefix_offset = self.read_offset.saturating_sub(CONTEXT_TOKENS);
        }
        self.ends.push(self.text.len());
        Ok(before.min(self.text.len()))
    }

    /// The window decoded to `prefix` before the new token(s) and to `full` with them: append the
    /// difference. When `full` does not simply extend `prefix` (a decoder whose output depends on
    /// the following token), the differing tail of the text is replaced, and earlier token ends
    /// are clamped so offsets stay monotone.
    fn replace_tail(&mut self, prefix: &str, full: &str) {
        if let Some(new) = full.strip_prefix(prefix) {
            self.text.push_str(new);
            return;
        }
        let common = common_prefix(prefix, full);
        let old_tail = &prefix[common..];
        if self.text.ends_with(old_tail) {
            let cut = self.text.len() - old_tail.len();
            self.text.truncate(cut);
            for e in self.ends.iter_mut() {
                *e = (*e).min(cut);
            }
        }
        self.text.push_str(&full[common..]);
    }

    /// Add a token that is not part of the text (the final EOS): zero width.
    pub fn push_silent(&mut self) {
        self.ends.push(self.text.len());
    }

    /// Flush text still held back (a response ending inside a UTF-8 sequence): appended as the
    /// decoder renders it (with U+FFFD) and attributed to the last text token.
    pub fn finish(&mut self, decode: &DecodeFn<'_>) -> Result<()> {
        if self.read_offset < self.ids.len() {
            let prefix = decode(&self.ids[self.prefix_offset..self.read_offset])?;
            let full = decode(&self.ids[self.prefix_offset..])?;
            self.replace_tail(&prefix, &full);
            self.read_offset = self.ids.len();
            // The held-back characters belong to the last text token.
            let len = self.text.len();
            if let Some(e) = self.ends.last_mut() {
                *e = len;
            }
        }
        Ok(())
    }

    /// Consume into (text, per-token end offsets).
    pub fn into_parts(self) -> (String, Vec<usize>) {
        (self.text, self.ends)
    }
}

/// Length in bytes of the longest common prefix of `a` and `b` on a char boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = 0;
    for (x, y) in a.chars().zip(b.chars()) {
        if x != y {
            break;
        }
        n += x.len_utf8();
    }
    n
}

/// Decode a whole response incrementally: (text, per-token end offsets). Ids in `silent` (EOS)
/// at the very end are zero-width and not part of the text.
pub fn offsets_of(
    ids: &[u32],
    drop_final_eos: Option<&StopCriteria>,
    decode: &DecodeFn<'_>,
) -> Result<(String, Vec<usize>)> {
    let mut d = Detokenizer::new();
    let last_silent = match (drop_final_eos, ids.last()) {
        (Some(s), Some(&l)) => s.is_eos(l),
        _ => false,
    };
    let n_text = if last_silent {
        ids.len() - 1
    } else {
        ids.len()
    };
    for &id in &ids[..n_text] {
        d.push(id, decode)?;
    }
    d.finish(decode)?;
    if last_silent {
        d.push_silent();
    }
    Ok(d.into_parts())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A toy byte-level tokenizer: id < 256 is that byte; 256.. are multi-byte pieces from
    /// `PIECES`. Decoding concatenates bytes and renders invalid UTF-8 as U+FFFD (lossy), as
    /// byte-level BPE decoders do.
    pub(crate) const PIECES: &[&str] = &[
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "<an",
        "swer>",
        "</ans",
        "wer>",
    ];

    pub(crate) fn toy_decode(ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &i in ids {
            if i < 256 {
                bytes.push(i as u8);
            } else {
                bytes.extend_from_slice(PIECES[(i - 256) as usize].as_bytes());
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    pub(crate) fn toy_encode_bytes(s: &str) -> Vec<u32> {
        s.bytes().map(|b| b as u32).collect()
    }

    #[test]
    fn detokenizer_holds_back_incomplete_utf8() {
        // "é" is C3 A9: after the first byte nothing is emitted, after the second "é".
        let ids = toy_encode_bytes("aé!");
        let (text, ends) = offsets_of(&ids, None, &toy_decode).unwrap();
        assert_eq!(text, "aé!");
        // a → 1; C3 → still 1 (held back); A9 → 3; ! → 4
        assert_eq!(ends, vec![1, 1, 3, 4]);
    }

    #[test]
    fn detokenizer_flushes_a_dangling_byte_and_drops_final_eos() {
        let stop = StopCriteria {
            eos: vec![0],
            stop_strings: vec![],
            max_new_tokens: 10,
        };
        let mut ids = toy_encode_bytes("ab");
        ids.push(0xC3);
        let (text, ends) = offsets_of(&ids, Some(&stop), &toy_decode).unwrap();
        assert_eq!(text, "ab\u{FFFD}");
        assert_eq!(ends, vec![1, 2, 5]);
        let mut ids = toy_encode_bytes("ab");
        ids.push(0); // EOS (byte 0 would decode to "\0" if it were text)
        let (text, ends) = offsets_of(&ids, Some(&stop), &toy_decode).unwrap();
        assert_eq!(text, "ab");
        assert_eq!(ends, vec![1, 2, 2]);
    }

    #[test]
    fn detokenizer_text_equals_full_decode() {
        let ids: Vec<u32> = vec![256, 104, 105, 257, 260, 261, 0xE4, 0xB8, 0xAD, 262, 263];
        let (text, ends) = offsets_of(&ids, None, &toy_decode).unwrap();
        assert_eq!(text, toy_decode(&ids).unwrap());
        assert_eq!(*ends.last().unwrap(), text.len());
        assert!(ends.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn stop_strings_found_across_token_boundaries_only_in_the_tail() {
        let s = StopCriteria {
            eos: vec![],
            stop_strings: vec!["</answer>".into()],
            max_new_tokens: 10,
        };
        let text = "x</ans";
        assert!(!s.stop_string_in(text, 2));
        let text = "x</answer>";
        // new text from byte 6 ("wer>") completes the stop string
        assert!(s.stop_string_in(text, 6));
        // a stop string that ended before the new text is not re-reported... but one
        // overlapping the new text is found
        let text = "</answer> and more";
        assert!(!s.stop_string_in(text, 14));
        assert!(s.stop_string_in(text, 8));
        let none = StopCriteria {
            eos: vec![],
            stop_strings: vec![],
            max_new_tokens: 1,
        };
        assert!(!none.stop_string_in("anything", 0));
        // multi-byte text: the search start is moved back to a char boundary
        let s2 = StopCriteria {
            eos: vec![],
            stop_strings: vec!["ab".into()],
            max_new_tokens: 1,
        };
        assert!(s2.stop_string_in("ééab", 5));
        assert!(!s2.stop_string_in("ééa", 4));
    }
}
