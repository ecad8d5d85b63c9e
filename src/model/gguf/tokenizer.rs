//! `tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json` from the
//! `tokenizer.ggml.*` metadata of a GGUF file.
//!
//! Only GPT-2-style byte-level BPE (`tokenizer.ggml.model = "gpt2"`) is supported: the GGUF
//! tokens are already byte-level strings (`Ġ` for a space), so they are the BPE vocabulary as
//! they stand, and the merges are the `"a b"` strings Hugging Face uses. What the GGUF file does
//! not store is the pre-tokenizer; `tokenizer.ggml.pre` names llama.cpp's preset, and
//! [`pre_tokenizer`] maps each supported preset to the layout of the original Hugging Face
//! `tokenizer.json` (SmolLM2's `smollm`: single digits, then GPT-2 byte-level; Llama 3's
//! `llama-bpe`; Qwen2's `qwen2`; plain `gpt-2`). An unknown preset is an error rather than a
//! guess, since a wrong pre-tokenizer silently changes token ids.
//!
//! Token types (llama.cpp's `llama_token_type`): 3 (control) become special added tokens, 4
//! (user-defined) non-special added tokens; the rest are plain vocabulary. Without a token-type
//! array, the BOS/EOS/UNK/PAD tokens become the special tokens. BOS/EOS are added by a
//! `TemplateProcessing` post-processor only when `tokenizer.ggml.add_bos_token` /
//! `add_eos_token` say so, as in Llama 3's `tokenizer.json`.
use std::collections::HashSet;

use anyhow::{anyhow, bail, Context, Result};
use serde::ser::SerializeMap;
use serde::Serialize;
use serde_json::{json, Value as Json};

use super::reader::GgufFile;

/// GPT-2's pre-tokenizer: byte-level with its built-in regex.
fn byte_level(trim_offsets: bool, use_regex: bool) -> Json {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trim_offsets, "use_regex": use_regex})
}

/// Llama 3's split regex (`tokenizer.json` of Meta-Llama-3; numbers in groups of up to three).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split regex (single digits).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The presets of `tokenizer.ggml.pre` we can reproduce.
pub const SUPPORTED_PRE: [&str; 7] = [
    "default",
    "gpt-2",
    "smollm",
    "starcoder",
    "llama-bpe",
    "llama3",
    "qwen2",
];

/// The normalizer, pre-tokenizer, decoder and BPE `ignore_merges` flag of the original Hugging
/// Face tokenizer behind a llama.cpp pre-tokenizer preset (`None`: GPT-2's).
pub fn pre_tokenizer(pre: Option<&str>) -> Result<(Json, Json, Json, bool)> {
    // GPT-2's decoder, as HF's GPT-2-derived tokenizer.json files (SmolLM2, Llama 3) have it.
    let gpt2_decoder = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
    Ok(match pre.unwrap_or("default") {
        // GPT-2 itself: the byte-level pre-tokenizer's built-in regex.
        "default" | "gpt-2" | "gpt2" => (Json::Null, byte_level(true, true), gpt2_decoder, false),
        // SmolLM2, StarCoder: every digit on its own, then GPT-2 (llama.cpp's regexes for these
        // presets are `\p{N}` followed by the GPT-2 regex).
        "smollm" | "starcoder" => (
            Json::Null,
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true, true),
            ]}),
            gpt2_decoder,
            false,
        ),
        // Llama 3: one split regex, byte-level without its own regex; whole words in the vocabulary
        // bypass the merges.
        "llama-bpe" | "llama3" => (
            Json::Null,
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": false},
                byte_level(true, false),
            ]}),
            gpt2_decoder,
            true,
        ),
        // Qwen2/2.5/3: NFC, one split regex with single digits, byte-level without regex.
        "qwen2" => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": false},
                byte_level(false, false),
            ]}),
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}),
            false,
        ),
        other => bail!(
            "unsupported tokenizer.ggml.pre `{other}`: its pre-tokenizer is not known here \
             (supported: {})",
            SUPPORTED_PRE.join(", ")
        ),
    })
}

/// The tokenizer files of a Hugging Face folder, built from GGUF metadata.
#[derive(Debug, Clone)]
pub struct HfTokenizer {
    /// Vocabulary in id order (the GGUF token strings).
    pub tokens: Vec<String>,
    /// BPE merges, `"a b"`.
    pub merges: Vec<String>,
    /// Ids of the added tokens and whether each is special.
    pub added: Vec<(u32, bool)>,
    pub normalizer: Json,
    pub pre_tokenizer: Json,
    pub post_processor: Json,
    pub decoder: Json,
    pub ignore_merges: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub unk_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    /// End-of-turn token (`tokenizer.ggml.eot_token_id`), when it differs from EOS.
    pub eot_token_id: Option<u32>,
    pub add_bos_token: bool,
    pub add_eos_token: bool,
    pub chat_template: Option<String>,
    /// Context length, for `model_max_length`.
    pub model_max_length: Option<u64>,
    /// Ids whose token string repeats an earlier one (kept out of the vocabulary map).
    pub duplicate_ids: Vec<u32>,
}

impl HfTokenizer {
    /// Read the `tokenizer.ggml.*` metadata.
    pub fn from_gguf(g: &GgufFile, model_max_length: Option<u64>) -> Result<HfTokenizer> {
        let model = g
            .get_str("tokenizer.ggml.model")?
            .ok_or_else(|| anyhow!("the file has no tokenizer (no `tokenizer.ggml.model`)"))?;
        if model != "gpt2" {
            bail!(
                "unsupported tokenizer.ggml.model `{model}` (supported: gpt2, i.e. byte-level BPE \
                 as in GPT-2, SmolLM2, Llama 3, Qwen2)"
            );
        }
        let strings = |key: &str, why: &str| -> Result<Vec<String>> {
            let v = g.get_strings(key)?;
            Ok(v.ok_or_else(|| anyhow!("missing `{key}`{why}"))?.to_vec())
        };
        let tokens = strings("tokenizer.ggml.tokens", "")?;
        if tokens.is_empty() || tokens.len() > u32::MAX as usize {
            bail!("`tokenizer.ggml.tokens` has {} entries", tokens.len());
        }
        let merges = strings("tokenizer.ggml.merges", " (a BPE tokenizer needs them)")?;
        let n = tokens.len();
        let id = |key: &str| -> Result<Option<u32>> {
            match g.get_u64(key)? {
                None => Ok(None),
                Some(v) if (v as usize) < n => Ok(Some(v as u32)),
                Some(v) => bail!("`{key}` = {v} is not a token id (vocabulary of {n})"),
            }
        };
        let bos_token_id = id("tokenizer.ggml.bos_token_id")?;
        let eos_token_id = id("tokenizer.ggml.eos_token_id")?;
        let unk_token_id = id("tokenizer.ggml.unknown_token_id")?;
        let pad_token_id = id("tokenizer.ggml.padding_token_id")?;
        let eot_token_id = id("tokenizer.ggml.eot_token_id")?.filter(|&e| Some(e) != eos_token_id);
        let add_bos_token = g.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
        let add_eos_token = g.get_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        if add_bos_token && bos_token_id.is_none() {
            bail!("tokenizer.ggml.add_bos_token is true but there is no bos_token_id");
        }
        if add_eos_token && eos_token_id.is_none() {
            bail!("tokenizer.ggml.add_eos_token is true but there is no eos_token_id");
        }

        let added: Vec<(u32, bool)> = match g.get_array("tokenizer.ggml.token_type")? {
            Some(a) => {
                let types = a.to_i128s().ok_or_else(|| {
                    anyhow!("`tokenizer.ggml.token_type` must be an array of integers")
                })?;
                if types.len() != n {
                    bail!(
                        "`tokenizer.ggml.token_type` has {} entries for {n} tokens",
                        types.len()
                    );
                }
                types
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &t)| match t {
                        3 => Some((i as u32, true)),
                        4 => Some((i as u32, false)),
                        _ => None,
                    })
                    .collect()
            }
            None => {
                let mut ids: Vec<u32> = [bos_token_id, eos_token_id, unk_token_id, pad_token_id]
                    .into_iter()
                    .flatten()
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                ids.into_iter().map(|i| (i, true)).collect()
            }
        };

        let pre = g.get_str("tokenizer.ggml.pre")?;
        let (normalizer, pre_tokenizer, decoder, ignore_merges) =
            pre_tokenizer(pre).context("building the pre-tokenizer")?;

        let mut seen = HashSet::with_capacity(n);
        let duplicate_ids: Vec<u32> = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| !seen.insert(t.as_str()))
            .map(|(i, _)| i as u32)
            .collect();
        for (i, m) in merges.iter().enumerate() {
            let ok = m
                .split_once(' ')
                .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains(' '));
            if !ok {
                bail!("merge {i} (`{m}`) is not two tokens separated by one space");
            }
        }

        let chat_template = g.get_str("tokenizer.chat_template")?.map(str::to_string);
        let mut t = HfTokenizer {
            tokens,
            merges,
            added,
            normalizer,
            pre_tokenizer,
            post_processor: Json::Null,
            decoder,
            ignore_merges,
            bos_token_id,
            eos_token_id,
            unk_token_id,
            pad_token_id,
            eot_token_id,
            add_bos_token,
            add_eos_token,
            chat_template,
            model_max_length,
            duplicate_ids,
        };
        t.post_processor = t.build_post_processor();
        Ok(t)
    }

    /// The token string of an id.
    fn token(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.tokens.get(i as usize))
            .map(String::as_str)
    }

    /// Byte-level offsets handling, plus BOS/EOS insertion when the GGUF asks for it.
    fn build_post_processor(&self) -> Json {
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true});
        let bos = self.token(self.bos_token_id).filter(|_| self.add_bos_token);
        let eos = self.token(self.eos_token_id).filter(|_| self.add_eos_token);
        if bos.is_none() && eos.is_none() {
            return byte_level;
        }
        let special =
            |s: &str, type_id: u32| json!({"SpecialToken": {"id": s, "type_id": type_id}});
        let seq = |s: &str, type_id: u32| json!({"Sequence": {"id": s, "type_id": type_id}});
        let mut single = Vec::new();
        let mut pair = Vec::new();
        let mut specials = serde_json::Map::new();
        if let (Some(b), Some(id)) = (bos, self.bos_token_id) {
            single.push(special(b, 0));
            specials.insert(b.into(), json!({"id": b, "ids": [id], "tokens": [b]}));
        }
        single.push(seq("A", 0));
        pair.extend(single.iter().cloned());
        if let (Some(e), Some(id)) = (eos, self.eos_token_id) {
            single.push(special(e, 0));
            pair.push(special(e, 0));
            specials.insert(e.into(), json!({"id": e, "ids": [id], "tokens": [e]}));
        }
        if let Some(b) = bos {
            pair.push(special(b, 1));
        }
        pair.push(seq("B", 1));
        if let Some(e) = eos {
            pair.push(special(e, 1));
        }
        json!({"type": "Sequence", "processors": [
            byte_level,
            {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials},
        ]})
    }

    fn added_token_json(&self, id: u32, special: bool) -> Json {
        json!({
            "id": id,
            "content": self.tokens[id as usize],
            "single_word": false,
            "lstrip": false,
            "rstrip": false,
            "normalized": false,
            "special": special,
        })
    }

    /// Serialize `tokenizer.json` (the vocabulary in id order, as Hugging Face writes it).
    pub fn write_tokenizer_json<W: std::io::Write>(&self, w: W) -> Result<()> {
        let added: Vec<Json> = self
            .added
            .iter()
            .map(|&(id, special)| self.added_token_json(id, special))
            .collect();
        let doc = TokenizerJson {
            version: "1.0",
            truncation: None,
            padding: None,
            added_tokens: added,
            normalizer: &self.normalizer,
            pre_tokenizer: &self.pre_tokenizer,
            post_processor: &self.post_processor,
            decoder: &self.decoder,
            model: BpeJson {
                ty: "BPE",
                dropout: None,
                unk_token: None,
                continuing_subword_prefix: None,
                end_of_word_suffix: None,
                fuse_unk: false,
                byte_fallback: false,
                ignore_merges: self.ignore_merges,
                vocab: OrderedVocab(&self.tokens),
                merges: &self.merges,
            },
        };
        serde_json::to_writer_pretty(w, &doc).context("writing tokenizer.json")
    }

    /// `tokenizer_config.json`.
    pub fn tokenizer_config(&self) -> Json {
        let mut decoder = serde_json::Map::new();
        for &(id, special) in &self.added {
            let mut t = self.added_token_json(id, special);
            if let Some(o) = t.as_object_mut() {
                o.remove("id");
            }
            decoder.insert(id.to_string(), t);
        }
        let mut c = serde_json::Map::new();
        c.insert("add_bos_token".into(), json!(self.add_bos_token));
        c.insert("add_eos_token".into(), json!(self.add_eos_token));
        c.insert("add_prefix_space".into(), json!(false));
        c.insert("added_tokens_decoder".into(), Json::Object(decoder));
        c.insert("bos_token".into(), json!(self.token(self.bos_token_id)));
        c.insert("eos_token".into(), json!(self.token(self.eos_token_id)));
        c.insert("pad_token".into(), json!(self.token(self.pad_token_id)));
        c.insert("unk_token".into(), json!(self.token(self.unk_token_id)));
        if let Some(t) = &self.chat_template {
            c.insert("chat_template".into(), json!(t));
        }
        c.insert("clean_up_tokenization_spaces".into(), json!(false));
        if let Some(n) = self.model_max_length {
            c.insert("model_max_length".into(), json!(n));
        }
        c.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        Json::Object(c)
    }

    /// `special_tokens_map.json` (read by older transformers versions).
    pub fn special_tokens_map(&self) -> Json {
        let mut m = serde_json::Map::new();
        for (k, id) in [
            ("bos_token", self.bos_token_id),
            ("eos_token", self.eos_token_id),
            ("pad_token", self.pad_token_id),
            ("unk_token", self.unk_token_id),
        ] {
            if let Some(t) = self.token(id) {
                m.insert(k.into(), json!(t));
            }
        }
        Json::Object(m)
    }
}

#[derive(Serialize)]
struct TokenizerJson<'a> {
    version: &'static str,
    truncation: Option<Json>,
    padding: Option<Json>,
    added_tokens: Vec<Json>,
    normalizer: &'a Json,
    pre_tokenizer: &'a Json,
    post_processor: &'a Json,
    decoder: &'a Json,
    model: BpeJson<'a>,
}

#[derive(Serialize)]
struct BpeJson<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    dropout: Option<f32>,
    unk_token: Option<&'a str>,
    continuing_subword_prefix: Option<&'a str>,
    end_of_word_suffix: Option<&'a str>,
    fuse_unk: bool,
    byte_fallback: bool,
    ignore_merges: bool,
    vocab: OrderedVocab<'a>,
    merges: &'a [String],
}

/// The vocabulary as a JSON object in id order; a repeated token string keeps its first id.
struct OrderedVocab<'a>(&'a [String]);

impl Serialize for OrderedVocab<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut seen = HashSet::with_capacity(self.0.len());
        let mut m = s.serialize_map(None)?;
        for (i, t) in self.0.iter().enumerate() {
            if seen.insert(t.as_str()) {
                m.serialize_entry(t, &i)?;
            }
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::super::reader::{Array, Value};
    use super::super::writer::{byte_level_alphabet, s, strs, Writer};
    use super::*;
    use std::str::FromStr;

    /// Ids: 0–2 control tokens, 3 a user-defined `<x>`, 4 + b the byte-level character of byte
    /// b, then 260 `Ġt`, 261 `he`, 262 `Ġthe`, 263 `12` (a digit merge that only GPT-2's
    /// pre-tokenizer can reach).
    fn tiny(pre: Option<&str>) -> Writer {
        let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<x>"]
            .map(String::from)
            .to_vec();
        tokens.extend(byte_level_alphabet().into_iter().map(String::from));
        tokens.extend(["Ġt", "he", "Ġthe", "12"].map(String::from));
        let mut types = vec![3i32, 3, 3, 4];
        types.resize(tokens.len(), 1);
        let mut w = Writer::default();
        w.kv("tokenizer.ggml.model", s("gpt2"))
            .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
            .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
            .kv(
                "tokenizer.ggml.merges",
                strs(&["Ġ t", "h e", "Ġt he", "1 2"]),
            )
            .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
            .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
            .kv("tokenizer.ggml.padding_token_id", Value::U32(2))
            .kv("tokenizer.ggml.unknown_token_id", Value::U32(0))
            .kv("tokenizer.chat_template", s("{{ messages[0]['content'] }}"));
        if let Some(p) = pre {
            w.kv("tokenizer.ggml.pre", s(p));
        }
        w
    }

    fn build(w: &Writer) -> Result<(HfTokenizer, tokenizers::Tokenizer)> {
        let g = GgufFile::from_bytes(w.to_bytes())?;
        let t = HfTokenizer::from_gguf(&g, Some(8192))?;
        let mut buf = Vec::new();
        t.write_tokenizer_json(&mut buf)?;
        let tk = tokenizers::Tokenizer::from_str(std::str::from_utf8(&buf)?)
            .map_err(|e| anyhow!("{e}"))?;
        Ok((t, tk))
    }

    fn ids(tk: &tokenizers::Tokenizer, text: &str, special: bool) -> Vec<u32> {
        tk.encode(text, special).unwrap().get_ids().to_vec()
    }

    #[test]
    fn smollm_splits_digits_gpt2_does_not() {
        let (_, tk) = build(&tiny(Some("smollm"))).unwrap();
        // "ab 12 the" → Digits: "ab ", "1", "2", " the" → a b Ġ | 1 | 2 | Ġthe.
        assert_eq!(
            ids(&tk, "ab 12 the", false),
            vec![101, 102, 36, 53, 54, 262]
        );
        let (_, tk) = build(&tiny(Some("gpt-2"))).unwrap();
        // GPT-2's regex keeps " 12" together, so the `1 2` merge applies.
        assert_eq!(ids(&tk, "ab 12 the", false), vec![101, 102, 36, 263, 262]);
        let (_, tk) = build(&tiny(None)).unwrap();
        assert_eq!(ids(&tk, "ab 12 the", false), vec![101, 102, 36, 263, 262]);
    }

    #[test]
    fn special_and_user_defined_tokens() {
        let (t, tk) = build(&tiny(Some("smollm"))).unwrap();
        assert_eq!(t.added, vec![(0, true), (1, true), (2, true), (3, false)]);
        let got = ids(&tk, "<|im_start|>ab 12 the<x><|im_end|>", false);
        assert_eq!(got, vec![1, 101, 102, 36, 53, 54, 262, 3, 2]);
        // No BOS is added (add_bos_token absent = false).
        assert_eq!(ids(&tk, "the", true), vec![4 + b't' as u32, 261]);
        assert_eq!(tk.decode(&got, true).unwrap(), "ab 12 the<x>");
        let c = t.tokenizer_config();
        assert_eq!(c["bos_token"], "<|im_start|>");
        assert_eq!(c["eos_token"], "<|im_end|>");
        assert_eq!(c["pad_token"], "<|im_end|>");
        assert_eq!(c["unk_token"], "<|endoftext|>");
        assert_eq!(c["chat_template"], "{{ messages[0]['content'] }}");
        assert_eq!(c["model_max_length"], 8192);
        assert_eq!(c["added_tokens_decoder"]["3"]["special"], false);
        assert_eq!(c["added_tokens_decoder"]["2"]["content"], "<|im_end|>");
        assert_eq!(t.special_tokens_map()["eos_token"], "<|im_end|>");
    }

    #[test]
    fn add_bos_and_eos_build_a_template_post_processor() {
        let mut w = tiny(Some("smollm"));
        w.kv("tokenizer.ggml.add_bos_token", Value::Bool(true))
            .kv("tokenizer.ggml.add_eos_token", Value::Bool(true));
        let (t, tk) = build(&w).unwrap();
        assert!(t.add_bos_token && t.add_eos_token);
        assert_eq!(ids(&tk, "the", true), vec![1, 4 + b't' as u32, 261, 2]);
        assert_eq!(ids(&tk, "the", false), vec![4 + b't' as u32, 261]);
    }

    #[test]
    fn llama3_and_qwen2_presets_load() {
        for pre in ["llama-bpe", "qwen2"] {
            let (t, tk) = build(&tiny(Some(pre))).unwrap();
            // Both split numbers away from the space: " 12" → Ġ, then "12" (llama3: up to three
            // digits kept together, so the merge applies; qwen2: single digits).
            let want: Vec<u32> = if pre == "qwen2" {
                vec![101, 102, 36, 53, 54, 262]
            } else {
                vec![101, 102, 36, 263, 262]
            };
            assert_eq!(ids(&tk, "ab 12 the", false), want, "{pre}");
            assert_eq!(t.ignore_merges, pre == "llama-bpe");
        }
    }

    #[test]
    fn without_token_types_the_named_tokens_are_special() {
        let mut w = tiny(Some("smollm"));
        w.kv.retain(|(k, _)| k != "tokenizer.ggml.token_type");
        let (t, tk) = build(&w).unwrap();
        assert_eq!(t.added, vec![(0, true), (1, true), (2, true)]);
        assert_eq!(ids(&tk, "<|im_end|>", false), vec![2]);
    }

    #[test]
    fn repeated_token_strings_keep_their_first_id() {
        let mut w = tiny(Some("smollm"));
        if let Value::Array(Array::String(t)) = &mut w.kv[1].1 {
            t.push("he".into()); // id 264 repeats 261
        }
        if let Value::Array(Array::I32(t)) = &mut w.kv[2].1 {
            t.push(1);
        }
        let (t, tk) = build(&w).unwrap();
        assert_eq!(t.duplicate_ids, vec![264]);
        assert_eq!(tk.token_to_id("he"), Some(261));
        assert_eq!(ids(&tk, "the", false), vec![4 + b't' as u32, 261]);
    }

    #[test]
    fn errors() {
        let e = |w: Writer| format!("{:#}", build(&w).unwrap_err());
        let mut w = tiny(None);
        w.kv[0].1 = s("llama");
        assert!(e(w).contains("unsupported tokenizer.ggml.model `llama`"));
        assert!(e(tiny(Some("falcon"))).contains("unsupported tokenizer.ggml.pre `falcon`"));
        let mut w = tiny(None);
        w.kv[2].1 = Value::Array(Array::I32(vec![1, 2]));
        assert!(e(w).contains("token_type` has 2 entries"));
        let mut w = tiny(None);
        w.kv[3].1 = strs(&["Ġt"]);
        assert!(e(w).contains("merge 0 (`Ġt`)"));
        let mut w = tiny(None);
        w.kv[4].1 = Value::U32(100_000);
        assert!(e(w).contains("bos_token_id` = 100000 is not a token id"));
        let mut w = tiny(None);
        w.kv[1].1 = Value::Array(Array::I32(vec![1]));
        assert!(e(w).contains("must be an array of strings"));
        let mut w = Writer::default();
        w.kv("general.architecture", s("llama"));
        assert!(e(w).contains("no tokenizer"));
    }
}
