//! GGUF → Hugging Face folder: the plan (hyper-parameters, tensor map, tokenizer) and the atomic
//! write.
//!
//! Two stages, as every rlcr command: [`Plan::new`] reads the metadata, checks every tensor
//! against the shapes the hyper-parameters imply (unknown, missing, mis-shaped and unsupported
//! tensors are each reported all at once), and builds the JSON files; only then does
//! [`write_folder`] dequantize. Tensors are dequantized one at a time, lazily, while
//! `model.safetensors` is written, so peak memory is one `f32` tensor, not the model.
//!
//! Output is atomic: everything goes into a hidden temporary folder beside the destination, which
//! is renamed into place at the end; a failure removes it. An existing non-empty destination is
//! refused unless `force` is set.
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use rayon::prelude::*;
use serde_json::{json, Value as Json};

use super::dequant::{dequantize, is_supported, unsupported};
use super::reader::{GgufFile, TensorInfo};
use super::tensors::{hf_name, permutation_heads, unpermute_rows};
use super::tokenizer::HfTokenizer;
use crate::progress::Progress;

/// Model families we import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `general.architecture = "llama"` (Llama 1–3, Mistral, SmolLM2, ...): q/k rows permuted.
    Llama,
    /// `general.architecture = "qwen2"`: q/k/v biases, no permutation.
    Qwen2,
}

impl Arch {
    fn prefix(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// Hyper-parameters read from the `{arch}.*` metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    pub arch: Arch,
    pub n_layer: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub context_length: u64,
    /// Rows of the embedding matrix (`vocab_size` of the config).
    pub vocab: usize,
    /// No `output.weight`: the LM head is the embedding.
    pub tied: bool,
    /// Llama only: q/k/v/o carry biases.
    pub attention_bias: bool,
}

/// A tensor to write: where it comes from and what it becomes.
#[derive(Debug, Clone)]
pub struct PlannedTensor {
    pub info: TensorInfo,
    pub hf_name: String,
    /// Row-major shape of the output.
    pub shape: Vec<usize>,
    /// Undo llama.cpp's row permutation with this many heads.
    pub unpermute_heads: Option<usize>,
}

/// Everything needed to write the folder, validated.
#[derive(Debug, Clone)]
pub struct Plan {
    pub hparams: Hparams,
    pub config: Json,
    pub generation_config: Json,
    pub tokenizer: HfTokenizer,
    pub tensors: Vec<PlannedTensor>,
}

/// Options of [`import`].
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Replace an existing non-empty output folder.
    pub force: bool,
}

/// What [`import`] did.
#[derive(Debug, Clone)]
pub struct ImportSummary {
    pub hparams: Hparams,
    /// Tensors written.
    pub n_tensors: usize,
    /// Parameters written.
    pub n_params: u64,
    /// Source tensor count per ggml type.
    pub types: BTreeMap<String, usize>,
    pub out: PathBuf,
}

/// Largest accepted size (layers, widths, heads): 2^24, so products of two never overflow.
const MAX_DIM: u64 = 1 << 24;

fn usize_of(v: u64, key: &str) -> Result<usize> {
    if v == 0 || v > MAX_DIM {
        bail!("metadata `{key}` = {v} is out of range (1 to {MAX_DIM})");
    }
    Ok(v as usize)
}

impl Hparams {
    /// Read and cross-check the hyper-parameters; `g` must hold the tensors they describe.
    pub fn from_gguf(g: &GgufFile) -> Result<Hparams> {
        let arch_name = g
            .get_str("general.architecture")?
            .ok_or_else(|| anyhow!("missing `general.architecture`"))?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => bail!("unsupported architecture `{other}` (supported: llama, qwen2)"),
        };
        let p = arch.prefix();
        let key = |k: &str| format!("{p}.{k}");
        let req = |k: &str| -> Result<usize> {
            let k = key(k);
            let v = g
                .get_u64(&k)
                .with_context(|| "reading the hyper-parameters".to_string())?
                .ok_or_else(|| anyhow!("missing metadata `{k}`"))?;
            usize_of(v, &k)
        };
        let opt = |k: &str| -> Result<Option<usize>> {
            let k = key(k);
            g.get_u64(&k)?.map(|v| usize_of(v, &k)).transpose()
        };
        if let Some(e) = opt("expert_count")? {
            bail!("mixture-of-experts models are not supported ({p}.expert_count = {e})");
        }
        let n_layer = req("block_count")?;
        // Every layer has at least 9 tensors; refuse a layer count the file cannot hold before
        // building the expected-tensor table.
        if n_layer.saturating_mul(9) > g.tensors().len() {
            bail!(
                "{p}.block_count = {n_layer} but the file has only {} tensors",
                g.tensors().len()
            );
        }
        let hidden = req("embedding_length")?;
        let ffn = match g.get(&key("feed_forward_length")) {
            Some(v) if v.as_array().is_some() => bail!(
                "per-layer feed-forward sizes (`{}` is an array) are not supported",
                key("feed_forward_length")
            ),
            _ => req("feed_forward_length")?,
        };
        let n_head = req("attention.head_count")?;
        let n_head_kv = opt("attention.head_count_kv")?.unwrap_or(n_head);
        if !n_head.is_multiple_of(n_head_kv) {
            bail!("{n_head} attention heads are not a multiple of {n_head_kv} KV heads");
        }
        let head_dim = match (opt("attention.key_length")?, opt("attention.value_length")?) {
            (Some(k), Some(v)) if k != v => {
                bail!("key length {k} differs from value length {v}; not supported")
            }
            (Some(k), _) | (None, Some(k)) => k,
            (None, None) => {
                if !hidden.is_multiple_of(n_head) {
                    bail!("hidden size {hidden} is not a multiple of {n_head} heads");
                }
                hidden / n_head
            }
        };
        if !head_dim.is_multiple_of(2) {
            bail!("head size {head_dim} is odd; RoPE needs an even head size");
        }
        if let Some(r) = opt("rope.dimension_count")? {
            if r != head_dim {
                bail!("partial rotary embeddings ({p}.rope.dimension_count = {r}, head size {head_dim}) are not supported");
            }
        }
        if let Some(s) = g.get_str(&key("rope.scaling.type"))? {
            if s != "none" {
                bail!("RoPE scaling `{s}` ({p}.rope.scaling.type) is not supported");
            }
        }
        if g.tensor("rope_freqs.weight").is_some() {
            bail!("the file has a `rope_freqs` tensor (Llama 3.1-style RoPE scaling), whose parameters GGUF does not keep; not supported");
        }
        let rope_theta = g.get_f64(&key("rope.freq_base"))?.unwrap_or(10000.0);
        let rms_norm_eps = g
            .get_f64(&key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| {
                anyhow!(
                    "missing metadata `{}`",
                    key("attention.layer_norm_rms_epsilon")
                )
            })?;
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            bail!("{p}.rope.freq_base = {rope_theta} is not a positive number");
        }
        if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0) {
            bail!("{p}.attention.layer_norm_rms_epsilon = {rms_norm_eps} is not a positive number");
        }
        let context_length = g
            .get_u64(&key("context_length"))?
            .filter(|&n| n > 0)
            .ok_or_else(|| anyhow!("missing or zero metadata `{}`", key("context_length")))?;
        let embd = g
            .tensor("token_embd.weight")
            .ok_or_else(|| anyhow!("missing tensor `token_embd.weight`"))?;
        if embd.dims.len() != 2 {
            bail!("token_embd.weight has dims {:?}, expected 2", embd.dims);
        }
        let vocab = embd.dims[1] as usize;
        if let Some(v) = opt("vocab_size")? {
            if v != vocab {
                bail!("{p}.vocab_size = {v} but token_embd.weight has {vocab} rows");
            }
        }
        let tied = g.tensor("output.weight").is_none();
        let attention_bias = arch == Arch::Llama && g.tensor("blk.0.attn_q.bias").is_some();
        Ok(Hparams {
            arch,
            n_layer,
            hidden,
            ffn,
            n_head,
            n_head_kv,
            head_dim,
            rope_theta,
            rms_norm_eps,
            context_length,
            vocab,
            tied,
            attention_bias,
        })
    }

    /// Every tensor the model needs, llama.cpp name → row-major shape (`output.weight` only when
    /// the embeddings are not tied).
    pub fn expected_tensors(&self) -> BTreeMap<String, Vec<usize>> {
        let (h, q, kv) = (
            self.hidden,
            self.n_head * self.head_dim,
            self.n_head_kv * self.head_dim,
        );
        let mut m = BTreeMap::new();
        m.insert("token_embd.weight".to_string(), vec![self.vocab, h]);
        m.insert("output_norm.weight".to_string(), vec![h]);
        if !self.tied {
            m.insert("output.weight".to_string(), vec![self.vocab, h]);
        }
        let qkv_bias = self.arch == Arch::Qwen2 || self.attention_bias;
        for l in 0..self.n_layer {
            let mut t = |n: &str, s: Vec<usize>| {
                m.insert(format!("blk.{l}.{n}"), s);
            };
            t("attn_norm.weight", vec![h]);
            t("ffn_norm.weight", vec![h]);
            t("attn_q.weight", vec![q, h]);
            t("attn_k.weight", vec![kv, h]);
            t("attn_v.weight", vec![kv, h]);
            t("attn_output.weight", vec![h, q]);
            t("ffn_gate.weight", vec![self.ffn, h]);
            t("ffn_up.weight", vec![self.ffn, h]);
            t("ffn_down.weight", vec![h, self.ffn]);
            if qkv_bias {
                t("attn_q.bias", vec![q]);
                t("attn_k.bias", vec![kv]);
                t("attn_v.bias", vec![kv]);
            }
            if self.attention_bias {
                t("attn_output.bias", vec![h]);
            }
        }
        m
    }

    /// `config.json` (transformers 4 and 5 spellings both present).
    pub fn config_json(&self, tok: &HfTokenizer) -> Json {
        let mut c = serde_json::Map::new();
        let (arch, model_type) = match self.arch {
            Arch::Llama => ("LlamaForCausalLM", "llama"),
            Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        };
        c.insert("architectures".into(), json!([arch]));
        c.insert("model_type".into(), json!(model_type));
        c.insert("vocab_size".into(), json!(self.vocab));
        c.insert("hidden_size".into(), json!(self.hidden));
        c.insert("intermediate_size".into(), json!(self.ffn));
        c.insert("num_hidden_layers".into(), json!(self.n_layer));
        c.insert("num_attention_heads".into(), json!(self.n_head));
        c.insert("num_key_value_heads".into(), json!(self.n_head_kv));
        c.insert("head_dim".into(), json!(self.head_dim));
        c.insert("hidden_act".into(), json!("silu"));
        c.insert("max_position_embeddings".into(), json!(self.context_length));
        c.insert("rms_norm_eps".into(), json!(self.rms_norm_eps));
        c.insert("rope_theta".into(), json!(self.rope_theta));
        c.insert("rope_scaling".into(), Json::Null);
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": self.rope_theta}),
        );
        c.insert("tie_word_embeddings".into(), json!(self.tied));
        if self.arch == Arch::Llama {
            c.insert("attention_bias".into(), json!(self.attention_bias));
            c.insert("mlp_bias".into(), json!(false));
            c.insert("pretraining_tp".into(), json!(1));
        } else {
            c.insert("use_sliding_window".into(), json!(false));
            c.insert("sliding_window".into(), Json::Null);
            c.insert("max_window_layers".into(), json!(self.n_layer));
        }
        c.insert("attention_dropout".into(), json!(0.0));
        c.insert("initializer_range".into(), json!(0.02));
        c.insert("use_cache".into(), json!(true));
        c.insert("bos_token_id".into(), json!(tok.bos_token_id));
        c.insert("eos_token_id".into(), json!(tok.eos_token_id));
        if let Some(p) = tok.pad_token_id {
            c.insert("pad_token_id".into(), json!(p));
        }
        c.insert("torch_dtype".into(), json!("float32"));
        c.insert("dtype".into(), json!("float32"));
        Json::Object(c)
    }
}

/// `generation_config.json`: BOS, EOS (plus the end-of-turn token when it differs), PAD.
pub fn generation_config_json(tok: &HfTokenizer) -> Json {
    let mut c = serde_json::Map::new();
    if let Some(b) = tok.bos_token_id {
        c.insert("bos_token_id".into(), json!(b));
    }
    match (tok.eos_token_id, tok.eot_token_id) {
        (Some(e), Some(t)) => c.insert("eos_token_id".into(), json!([e, t])),
        (Some(e), None) | (None, Some(e)) => c.insert("eos_token_id".into(), json!(e)),
        (None, None) => None,
    };
    if let Some(p) = tok.pad_token_id {
        c.insert("pad_token_id".into(), json!(p));
    }
    Json::Object(c)
}

impl Plan {
    /// Read and validate everything; nothing is dequantized yet.
    pub fn new(g: &GgufFile) -> Result<Plan> {
        let hp = Hparams::from_gguf(g)?;
        let tokenizer = HfTokenizer::from_gguf(g, Some(hp.context_length))
            .context("building the tokenizer from `tokenizer.ggml.*`")?;
        if tokenizer.tokens.len() > hp.vocab {
            bail!(
                "the tokenizer has {} tokens but the embedding only {} rows",
                tokenizer.tokens.len(),
                hp.vocab
            );
        }

        let expected = hp.expected_tensors();
        let mut unknown = Vec::new();
        let mut bad_shape = Vec::new();
        let mut unsupported_types = Vec::new();
        let mut tensors = Vec::new();
        let mut seen = BTreeSet::new();
        for info in g.tensors() {
            let shape = info.shape();
            match (expected.get(&info.name), hf_name(&info.name)) {
                (Some(want), Some(hf)) => {
                    seen.insert(info.name.clone());
                    if *want != shape {
                        bad_shape.push(format!("{} {:?} (expected {:?})", info.name, shape, want));
                        continue;
                    }
                    if !is_supported(info.ggml_type) {
                        unsupported_types.push(unsupported(info.ggml_type, &info.name));
                        continue;
                    }
                    let unpermute_heads = match hp.arch {
                        Arch::Llama => permutation_heads(&info.name, hp.n_head, hp.n_head_kv),
                        Arch::Qwen2 => None,
                    };
                    tensors.push(PlannedTensor {
                        info: info.clone(),
                        hf_name: hf,
                        shape,
                        unpermute_heads,
                    });
                }
                _ => unknown.push(info.name.clone()),
            }
        }
        let missing: Vec<&String> = expected.keys().filter(|k| !seen.contains(*k)).collect();
        let mut problems = Vec::new();
        if !unknown.is_empty() {
            problems.push(format!(
                "{} unexpected tensor(s): {}",
                unknown.len(),
                list(&unknown)
            ));
        }
        if !missing.is_empty() {
            problems.push(format!(
                "{} missing tensor(s): {}",
                missing.len(),
                list(&missing)
            ));
        }
        if !bad_shape.is_empty() {
            problems.push(format!(
                "{} tensor(s) with a wrong shape: {}",
                bad_shape.len(),
                list(&bad_shape)
            ));
        }
        if let Some(first) = unsupported_types.first() {
            problems.push(format!(
                "{first}{}",
                if unsupported_types.len() > 1 {
                    format!(" (and {} more tensors)", unsupported_types.len() - 1)
                } else {
                    String::new()
                }
            ));
        }
        if !problems.is_empty() {
            bail!(
                "the tensors do not match a {} model with these hyper-parameters: {}",
                hp.arch.prefix(),
                problems.join("; ")
            );
        }
        Ok(Plan {
            config: hp.config_json(&tokenizer),
            generation_config: generation_config_json(&tokenizer),
            hparams: hp,
            tokenizer,
            tensors,
        })
    }
}

/// At most ten items, then a count.
fn list<T: std::fmt::Display>(items: &[T]) -> String {
    let mut s: Vec<String> = items.iter().take(10).map(|x| x.to_string()).collect();
    if items.len() > 10 {
        s.push(format!("... ({} more)", items.len() - 10));
    }
    s.join(", ")
}

/// Dequantize (and un-permute) one planned tensor to `f32`.
pub fn materialize(g: &GgufFile, t: &PlannedTensor) -> Result<Vec<f32>> {
    let bytes = g.tensor_bytes(&t.info)?;
    let v = dequantize(t.info.ggml_type, bytes, t.info.n_elements)
        .with_context(|| format!("dequantizing `{}`", t.info.name))?;
    match t.unpermute_heads {
        None => Ok(v),
        Some(heads) => {
            let rows = t.shape[0];
            let cols = t.shape.get(1).copied().unwrap_or(1);
            unpermute_rows(&v, rows, cols, heads)
                .with_context(|| format!("undoing the q/k permutation of `{}`", t.info.name))
        }
    }
}

/// Little-endian bytes of `v`, converted in parallel chunks.
fn le_bytes(v: &[f32]) -> Vec<u8> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0u8; v.len() * 4];
    out.par_chunks_mut(4 * CHUNK)
        .zip(v.par_chunks(CHUNK))
        .for_each(|(o, x)| {
            for (c, f) in o.chunks_exact_mut(4).zip(x) {
                c.copy_from_slice(&f.to_le_bytes());
            }
        });
    out
}

/// Shared state of the lazy tensors while safetensors writes them.
struct WriteState {
    error: Option<anyhow::Error>,
    progress: Progress,
}

/// A tensor whose bytes are computed when the safetensors writer asks for them.
struct LazyTensor<'a> {
    g: &'a GgufFile,
    t: &'a PlannedTensor,
    state: &'a RefCell<WriteState>,
}

impl safetensors::View for LazyTensor<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        safetensors::Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.t.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let mut st = self.state.borrow_mut();
        st.progress.inc(1);
        match materialize(self.g, self.t) {
            Ok(v) => Cow::Owned(le_bytes(&v)),
            Err(e) => {
                // The writer cannot take an error; keep the first and fail after it returns.
                st.error.get_or_insert(e);
                Cow::Owned(vec![0u8; self.data_len()])
            }
        }
    }
    fn data_len(&self) -> usize {
        self.t.info.n_elements * 4
    }
}

fn write_json(path: &Path, v: &Json) -> Result<()> {
    let mut f = BufWriter::new(
        fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    serde_json::to_writer_pretty(&mut f, v)?;
    f.write_all(b"\n")?;
    f.into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()
        .with_context(|| format!("writing {}", path.display()))
}

/// Write every file of the Hugging Face folder into `dir` (which must exist).
pub fn write_folder(g: &GgufFile, plan: &Plan, dir: &Path) -> Result<()> {
    write_json(&dir.join("config.json"), &plan.config)?;
    write_json(&dir.join("generation_config.json"), &plan.generation_config)?;
    let tok = &plan.tokenizer;
    let tok_path = dir.join("tokenizer.json");
    {
        let mut f = BufWriter::new(
            fs::File::create(&tok_path)
                .with_context(|| format!("creating {}", tok_path.display()))?,
        );
        tok.write_tokenizer_json(&mut f)?;
        f.write_all(b"\n")?;
        f.into_inner()
            .map_err(|e| e.into_error())?
            .sync_all()
            .with_context(|| format!("writing {}", tok_path.display()))?;
    }
    // Prove the tokenizer loads before spending time on the weights.
    tokenizers::Tokenizer::from_file(&tok_path).map_err(|e| {
        anyhow!("the generated tokenizer.json does not load with the tokenizers library: {e}")
    })?;
    write_json(&dir.join("tokenizer_config.json"), &tok.tokenizer_config())?;
    write_json(
        &dir.join("special_tokens_map.json"),
        &tok.special_tokens_map(),
    )?;
    if let Some(t) = &tok.chat_template {
        let p = dir.join("chat_template.jinja");
        fs::write(&p, t).with_context(|| format!("writing {}", p.display()))?;
    }

    let state = RefCell::new(WriteState {
        error: None,
        progress: Progress::new("import-gguf", plan.tensors.len() as u64, "tensors"),
    });
    let views: Vec<(String, LazyTensor)> = plan
        .tensors
        .iter()
        .map(|t| {
            (
                t.hf_name.clone(),
                LazyTensor {
                    g,
                    t,
                    state: &state,
                },
            )
        })
        .collect();
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let st_path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, Some(meta), &st_path)
        .map_err(|e| anyhow!("writing {}: {e}", st_path.display()))?;
    let WriteState { error, progress } = state.into_inner();
    progress.finish();
    if let Some(e) = error {
        return Err(e);
    }
    fs::File::open(&st_path)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", st_path.display()))?;
    Ok(())
}

/// Is `out` usable as a destination: absent, an empty folder, or (with `force`) anything that is
/// a folder.
pub fn check_destination(out: &Path, force: bool) -> Result<()> {
    match fs::metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("checking {}", out.display())),
        Ok(m) if !m.is_dir() => bail!(
            "output {} exists and is not a folder; choose another path",
            out.display()
        ),
        Ok(_) => {
            let non_empty = fs::read_dir(out)
                .with_context(|| format!("reading {}", out.display()))?
                .next()
                .is_some();
            if non_empty && !force {
                bail!(
                    "output folder {} exists and is not empty; pass --force to replace it",
                    out.display()
                );
            }
            Ok(())
        }
    }
}

/// Convert the GGUF file `input` into a Hugging Face folder `out`, atomically.
pub fn import(input: &Path, out: &Path, opts: &ImportOptions) -> Result<ImportSummary> {
    check_destination(out, opts.force)?;
    let g = GgufFile::open(input)?;
    let plan = Plan::new(&g).with_context(|| format!("importing {}", input.display()))?;
    let dups = &plan.tokenizer.duplicate_ids;
    if !dups.is_empty() {
        crate::info!(
            "{} token(s) repeat an earlier token string (ids {}); tokenizer.json maps each string \
             to its first id",
            dups.len(),
            list(dups)
        );
    }

    // The same atomic folder write as checkpoints: filled beside `out`, every file fsynced,
    // renamed into place; what a killed import left behind is cleaned up by the next one.
    crate::fs::write_folder(out, |tmp| {
        write_folder(&g, &plan, tmp)?;
        // Re-check: the destination may have appeared while we worked.
        check_destination(out, opts.force)
    })
    .with_context(|| format!("writing {}", out.display()))?;

    let mut types = BTreeMap::new();
    for t in g.tensors() {
        *types.entry(t.ggml_type.name().to_string()).or_insert(0) += 1;
    }
    Ok(ImportSummary {
        n_tensors: plan.tensors.len(),
        n_params: plan.tensors.iter().map(|t| t.info.n_elements as u64).sum(),
        hparams: plan.hparams,
        types,
        out: out.to_path_buf(),
    })
}
