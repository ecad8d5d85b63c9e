//! The model's `config.json`, read with Hugging Face's own key names.
//!
//! One struct covers the Llama, Qwen2, Qwen3 and Mistral families: every field is the HF key, optional keys
//! carry `serde(default)`, and the few places where transformers 4 and 5 spell things differently
//! (`rope_theta` vs `rope_parameters.rope_theta`, `rope_scaling` vs `rope_parameters`, `torch_dtype`
//! vs `dtype`) are resolved once in [`ModelConfig::from_json`] into plain fields, so the transformer
//! never looks at raw JSON. Design decisions:
//! - Biases follow the families: Qwen2 has q/k/v biases and no o_proj bias (its config has no key for
//!   it); Llama/Mistral/Qwen3 use `attention_bias` for q, k, v and o, and `mlp_bias` for the MLP.
//! - Qwen3 adds an RMSNorm over each query and key head (`q_norm`/`k_norm`, weights of size
//!   `head_dim`, before RoPE) and sets `head_dim` independently of `hidden_size / heads`
//!   (Qwen3-0.6B: hidden 1024, 16 heads of 128); [`ModelConfig::qk_norm`] records it.
//! - RoPE: `default`, `linear` and `llama3` scaling are supported (the three in use by the checkpoints
//!   we target); any other `rope_type` (yarn, dynamic, longrope, ...) is a clear error rather than a
//!   silently different function.
//! - Unsupported architectures (MoE such as `qwen3_moe`, sliding windows shorter than the context)
//!   are refused by name: `model_type` must be `llama`, `qwen2`, `qwen3` or `mistral`.
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// RoPE frequency scaling, resolved from `rope_scaling` (transformers 4) or `rope_parameters`
/// (transformers 5).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/d)`.
    Default,
    /// Position interpolation: `inv_freq / factor`.
    Linear { factor: f64 },
    /// Llama 3.1's piecewise scaling (transformers' `_compute_llama3_parameters`).
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// A decoder-only model configuration (HF `config.json`), with version differences resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `model_type`: `llama`, `qwen2`, `qwen3` or `mistral`.
    pub model_type: String,
    /// `architectures[0]`, e.g. `Qwen2ForCausalLM` (kept to write it back unchanged).
    pub architecture: String,
    /// Rows of the embedding and LM head; may exceed the tokenizer's vocabulary (padded rows).
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Defaults to `num_attention_heads` (plain multi-head attention).
    pub num_key_value_heads: usize,
    /// Defaults to `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    /// RoPE base, from `rope_theta` or `rope_parameters.rope_theta` (default 10000).
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    /// LM head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections have biases.
    pub qkv_bias: bool,
    /// o_proj has a bias.
    pub o_bias: bool,
    /// gate/up/down projections have biases.
    pub mlp_bias: bool,
    /// RMSNorm over every query and key head before RoPE (Qwen3's `q_norm` / `k_norm`).
    pub qk_norm: bool,
    /// `torch_dtype` / `dtype` as written (informational; tensors keep their own file dtype).
    pub dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    /// All ids listed in `eos_token_id` (an int or a list in HF configs).
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
}

/// The raw JSON with every key this crate reads, both spellings where they differ.
#[derive(Debug, Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(default)]
    head_dim: Option<usize>,
    #[serde(default)]
    rms_norm_eps: Option<f64>,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    max_position_embeddings: Option<usize>,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    attention_bias: Option<bool>,
    #[serde(default)]
    mlp_bias: Option<bool>,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    torch_dtype: Option<String>,
    #[serde(default)]
    dtype: Option<String>,
    #[serde(default)]
    bos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pad_token_id: Option<serde_json::Value>,
    #[serde(default)]
    sliding_window: Option<serde_json::Value>,
    #[serde(default)]
    use_sliding_window: Option<bool>,
}

/// Token ids in HF configs: an int, a list of ints, or null.
pub(crate) fn token_ids(v: &Option<serde_json::Value>, key: &str) -> Result<Vec<u32>> {
    let to_id = |x: &serde_json::Value| -> Result<u32> {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .with_context(|| format!("`{key}`: expected a token id, got {x}"))
    };
    match v {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(xs)) => xs.iter().map(to_id).collect(),
        Some(x) => Ok(vec![to_id(x)?]),
    }
}

fn get_f64(obj: &serde_json::Value, key: &str, ctx: &str) -> Result<f64> {
    obj.get(key)
        .and_then(|v| v.as_f64())
        .with_context(|| format!("{ctx}: missing number `{key}`"))
}

/// Parse a `rope_scaling` / `rope_parameters` object into a [`RopeScaling`].
fn parse_rope(obj: &serde_json::Value, ctx: &str) -> Result<RopeScaling> {
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    Ok(match kind {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: get_f64(obj, "factor", ctx)?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: get_f64(obj, "factor", ctx)?,
            low_freq_factor: get_f64(obj, "low_freq_factor", ctx)?,
            high_freq_factor: get_f64(obj, "high_freq_factor", ctx)?,
            original_max_position_embeddings: get_f64(
                obj,
                "original_max_position_embeddings",
                ctx,
            )?,
        },
        other => {
            bail!("{ctx}: unsupported rope_type `{other}` (supported: default, linear, llama3)")
        }
    })
}

impl ModelConfig {
    /// Read and resolve `DIR/config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        Self::from_json(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parse and resolve the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text).context("parsing config.json")?;
        let model_type = raw.model_type.clone().unwrap_or_default();
        if !matches!(model_type.as_str(), "llama" | "qwen2" | "qwen3" | "mistral") {
            bail!(
                "unsupported model_type `{model_type}` (architectures {:?}); rlcr supports the \
                 llama, qwen2, qwen3 (dense) and mistral families",
                raw.architectures
            );
        }
        if let Some(act) = &raw.hidden_act {
            if act != "silu" {
                bail!("unsupported hidden_act `{act}` (only silu / SwiGLU is supported)");
            }
        }
        if raw.num_attention_heads == 0 || raw.hidden_size == 0 || raw.num_hidden_layers == 0 {
            bail!("hidden_size, num_attention_heads and num_hidden_layers must be positive");
        }
        let kv = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        if kv == 0 || !raw.num_attention_heads.is_multiple_of(kv) {
            bail!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({kv})",
                raw.num_attention_heads
            );
        }
        let head_dim = raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            bail!("head_dim must be a positive even number, got {head_dim}");
        }
        let max_pos = raw.max_position_embeddings.unwrap_or(2048);
        // Sliding windows: only refuse when the window is actually active and shorter than the
        // context (Qwen2 configs carry a window with use_sliding_window = false).
        if let Some(w) = raw.sliding_window.as_ref().and_then(|v| v.as_u64()) {
            let active = raw.use_sliding_window.unwrap_or(model_type == "mistral");
            if active && (w as usize) < max_pos {
                bail!("sliding-window attention (window {w}) is not supported");
            }
        }

        // RoPE: transformers 5 puts theta and the scaling into `rope_parameters`; 4.x has
        // `rope_theta` at top level and `rope_scaling` (null when unscaled).
        let mut rope_theta = raw.rope_theta;
        let mut rope_scaling = RopeScaling::Default;
        if let Some(p) = raw.rope_parameters.as_ref().filter(|v| !v.is_null()) {
            if let Some(t) = p.get("rope_theta").and_then(|v| v.as_f64()) {
                rope_theta = Some(t);
            }
            rope_scaling = parse_rope(p, "rope_parameters")?;
        }
        if let Some(s) = raw.rope_scaling.as_ref().filter(|v| !v.is_null()) {
            rope_scaling = parse_rope(s, "rope_scaling")?;
        }

        let qwen = model_type == "qwen2";
        let qk_norm = model_type == "qwen3";
        let attention_bias = raw.attention_bias.unwrap_or(false);
        let bos = token_ids(&raw.bos_token_id, "bos_token_id")?;
        let pad = token_ids(&raw.pad_token_id, "pad_token_id")?;
        Ok(ModelConfig {
            architecture: raw
                .architectures
                .first()
                .cloned()
                .unwrap_or_else(|| "LlamaForCausalLM".into()),
            model_type,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads: kv,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: rope_theta.unwrap_or(10000.0),
            rope_scaling,
            max_position_embeddings: max_pos,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias: if qwen { true } else { attention_bias },
            o_bias: if qwen { false } else { attention_bias },
            mlp_bias: raw.mlp_bias.unwrap_or(false),
            qk_norm,
            dtype: raw.dtype.or(raw.torch_dtype),
            bos_token_id: bos.first().copied(),
            eos_token_ids: token_ids(&raw.eos_token_id, "eos_token_id")?,
            pad_token_id: pad.first().copied(),
        })
    }

    /// Query heads per key/value head (`num_attention_heads / num_key_value_heads`).
    pub fn group_size(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// The RoPE inverse frequencies `inv_freq[i]`, i < head_dim/2, exactly as transformers computes
    /// them: `1 / theta^(2i/d)` in float32, then the scaling rule.
    ///
    /// transformers evaluates `base ** (arange(0, d, 2).float() / d)` in float32; we evaluate the
    /// power in f64 and round once to f32 (the correctly rounded value, which torch's pow matches
    /// to the last bit or within one ulp). The llama3 rule is evaluated in f64 on the f32 values
    /// and rounded back, as torch does it in f32 with the same inputs.
    pub fn inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim;
        let base: Vec<f32> = (0..d / 2)
            .map(|i| {
                let exponent = ((2 * i) as f32 / d as f32) as f64;
                let p = (self.rope_theta as f32 as f64).powf(exponent) as f32;
                1.0f32 / p
            })
            .collect();
        match &self.rope_scaling {
            RopeScaling::Default => base,
            RopeScaling::Linear { factor } => base.iter().map(|&f| f / *factor as f32).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => base
                .iter()
                .map(|&f| {
                    let f64v = f as f64;
                    let low_wavelen = old / low_freq_factor;
                    let high_wavelen = old / high_freq_factor;
                    let wavelen = 2.0 * std::f64::consts::PI / f64v;
                    let scaled = if wavelen > low_wavelen {
                        f64v / factor
                    } else {
                        f64v
                    };
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    let out = if medium {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    };
                    out as f32
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN: &str = r#"{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","vocab_size":384,
        "hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
        "num_key_value_heads":2,"rms_norm_eps":1e-6,"rope_parameters":{"rope_theta":1000000.0,
        "rope_type":"default"},"tie_word_embeddings":true,"dtype":"float32","eos_token_id":2,
        "bos_token_id":0,"pad_token_id":null,"sliding_window":null,"use_sliding_window":false}"#;

    #[test]
    fn qwen2_transformers5_spelling() {
        let c = ModelConfig::from_json(QWEN).unwrap();
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!(c.head_dim, 16);
        assert!(c.qkv_bias && !c.o_bias && c.tie_word_embeddings);
        assert_eq!(c.dtype.as_deref(), Some("float32"));
        assert_eq!(c.eos_token_ids, vec![2]);
        assert_eq!(c.pad_token_id, None);
        assert_eq!(c.group_size(), 2);
    }

    #[test]
    fn llama_transformers4_spelling_and_llama3_scaling() {
        let text = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":10,
            "hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
            "rope_theta":500000.0,"torch_dtype":"bfloat16","eos_token_id":[1,2],
            "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}}"#;
        let c = ModelConfig::from_json(text).unwrap();
        assert_eq!(c.rope_theta, 5e5);
        assert_eq!(c.num_key_value_heads, 2);
        assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
        assert_eq!(c.eos_token_ids, vec![1, 2]);
        assert!(!c.qkv_bias && !c.o_bias && !c.tie_word_embeddings);
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { .. }));
        // head_dim 4: inv_freq = [1, 500000^-0.5]; wavelengths 2π (high freq, kept) and
        // 2π·707.1 = 4442.9 (between 8192/4 = 2048 and 8192: medium, smoothed).
        let f = c.inv_freq();
        assert_eq!(f[0], 1.0);
        let base = 1.0 / 500000f64.sqrt();
        let wavelen = 2.0 * std::f64::consts::PI / base;
        let smooth = (8192.0 / wavelen - 1.0) / 3.0;
        let want = (1.0 - smooth) * base / 8.0 + smooth * base;
        assert!((f[1] as f64 - want).abs() < 1e-9, "{} vs {want}", f[1]);
    }

    #[test]
    fn qwen3_decouples_head_dim_and_norms_queries_and_keys() {
        // Qwen3-0.6B's shape: 16 heads of 128 on a hidden size of 1024, 8 KV heads.
        let text = r#"{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3","vocab_size":151936,
            "hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":28,
            "num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"attention_bias":false,
            "rms_norm_eps":1e-6,"rope_theta":1000000,"rope_scaling":null,"max_position_embeddings":40960,
            "sliding_window":null,"use_sliding_window":false,"max_window_layers":28,
            "tie_word_embeddings":true,"torch_dtype":"bfloat16","hidden_act":"silu"}"#;
        let c = ModelConfig::from_json(text).unwrap();
        assert_eq!(
            (c.head_dim, c.num_attention_heads, c.hidden_size),
            (128, 16, 1024)
        );
        assert!(c.qk_norm && !c.qkv_bias && !c.o_bias && c.tie_word_embeddings);
        assert_eq!(c.group_size(), 2);
        let q2 = ModelConfig::from_json(QWEN).unwrap();
        assert!(!q2.qk_norm);
    }

    #[test]
    fn refuses_unknown_families_and_rope_types() {
        let e = ModelConfig::from_json(&QWEN.replace("\"qwen2\"", "\"qwen3_moe\"")).unwrap_err();
        assert!(format!("{e:#}").contains("qwen3_moe"));
        let e = ModelConfig::from_json(&QWEN.replace("\"default\"", "\"yarn\"")).unwrap_err();
        assert!(format!("{e:#}").contains("yarn"));
    }

    #[test]
    fn default_inv_freq_matches_formula() {
        let c = ModelConfig::from_json(QWEN).unwrap();
        let f = c.inv_freq();
        assert_eq!(f.len(), 8);
        for (i, v) in f.iter().enumerate() {
            let want = 1.0 / 1e6f64.powf(2.0 * i as f64 / 16.0);
            assert!(((*v as f64) - want).abs() <= want * 1e-6);
        }
    }
}
