//! Models: a Llama / Qwen2 decoder in burn that computes the same function as Hugging Face
//! transformers, with its weights, tokenizer and chat template.
//!
//! - [`config`]: `config.json` with HF key names (transformers 4 and 5 spellings).
//! - [`transformer`]: the decoder (a burn `Module`); [`batch`]: its inputs (token batches,
//!   response batches).
//! - [`cache`]: the KV cache, and on a GPU its slots described on the device.
//! - [`weights`]: safetensors in (f32/bf16/f16, sharded or not) and out (atomic, same layout and
//!   dtypes).
//! - [`tokenizer`]: `tokenizer.json`, special tokens, token ↔ text offsets for spans.
//! - [`chat`]: chat templates rendered like transformers.
//! - [`ops`]: the operations the transformer and the sampler's draw run through, and the one
//!   place that asks which backend a tensor lives on; [`backend`]: each backend's code (rlcr's
//!   CPU kernels on Flex tensors, re-exported here as [`cpu`], [`sgemm`], [`attention`], [`head`]
//!   and [`fused`]; the GPUs' composites and `#[cube]` kernels; opening a CUDA device).
//! - [`gguf`]: llama.cpp GGUF import.
//! - [`lora`]: LoRA adapters in PEFT's format (trained beside frozen weights, merged for sampling).
//! - [`transfer`]: the host ↔ device boundary (uploads and reads), counted.
//!
//! [`Model`] bundles them for the stages; [`logprobs`] is the batched per-token log-prob routine
//! shared by `rlcr logprobs` and (on an autodiff device, through
//! [`Transformer::response_logprobs`]) by `update`. [`DeviceSpec`] is a parsed `--device`, carried
//! typed from the command line to [`DeviceSpec::open`].
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use burn::tensor::Device;

pub mod backend;
pub mod batch;
pub mod cache;
pub mod chat;
pub mod config;
pub mod gguf;
pub mod graph;
pub mod lora;
pub mod memory;
pub mod ops;
pub mod tokenizer;
pub mod transfer;
pub mod transformer;
pub mod value;
pub mod weights;

pub use backend::cpu::decode as cpu;
pub use backend::cpu::{attention, fused, head, sgemm};
pub use batch::{ResponseBatch, TokenBatch};
pub use cache::KvCache;
pub use chat::{ChatOptions, ChatTemplate, Message};
pub use config::ModelConfig;
pub use tokenizer::{DecodedText, Tokenizer};
pub use transformer::{LayerCheckpoints, Transformer};
pub use weights::WeightDtypes;

use crate::progress::Progress;

/// A `--device` value: which backend and which device of it.
///
/// - `cpu`: burn's Flex backend (always built).
/// - `wgpu` / `wgpu:N` (builds with `--features wgpu`): a GPU through wgpu (Vulkan, Metal, DX12
///   or GL). `wgpu` is wgpu's own choice (a high-performance GPU first; `CUBECL_WGPU_DEFAULT_DEVICE`
///   overrides it, e.g. `IntegratedGpu(0)` or `Cpu`), `wgpu:N` the N-th adapter in wgpu's
///   enumeration order (0-based; the error for a bad N lists them).
/// - `cuda` / `cuda:N` (builds with `--features cuda`): NVIDIA GPU N (default 0).
///
/// Parsing ([`str::parse`]) checks the syntax and that this build has the backend (a usage
/// error otherwise); [`DeviceSpec::open`] finds the device on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Wgpu(Option<usize>),
    Cuda(usize),
}

/// The backends this build has, for messages: `cpu`, then `wgpu[:N]` / `cuda[:N]` when built.
pub fn built_devices() -> &'static str {
    match (cfg!(feature = "wgpu"), cfg!(feature = "cuda")) {
        (false, false) => "cpu",
        (true, false) => "cpu, wgpu or wgpu:N",
        (false, true) => "cpu, cuda or cuda:N",
        (true, true) => "cpu, wgpu, wgpu:N, cuda or cuda:N",
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        // `name` or `name:N`.
        let (name, index) = match s.split_once(':') {
            None => (s, None),
            Some((n, i)) => match i.parse::<usize>() {
                Ok(i) => (n, Some(i)),
                Err(_) => bail!("--device {s}: `{i}` is not a device index (expected {n}:N)"),
            },
        };
        let spec = match (name, index) {
            ("cpu", None) => DeviceSpec::Cpu,
            ("wgpu", i) => DeviceSpec::Wgpu(i),
            ("cuda", i) => DeviceSpec::Cuda(i.unwrap_or(0)),
            _ => bail!(
                "--device {s}: expected cpu, wgpu, wgpu:N, cuda or cuda:N (this build has {})",
                built_devices()
            ),
        };
        match spec {
            DeviceSpec::Wgpu(_) if !cfg!(feature = "wgpu") => bail!(
                "--device {s}: this rlcr was built without wgpu support; rebuild with \
                 `cargo build --release --features wgpu` (it has {})",
                built_devices()
            ),
            DeviceSpec::Cuda(_) if !cfg!(feature = "cuda") => bail!(
                "--device {s}: this rlcr was built without CUDA support; rebuild with \
                 `cargo build --release --features cuda` on a machine with the CUDA toolkit \
                 (it has {})",
                built_devices()
            ),
            spec => Ok(spec),
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Wgpu(None) => f.write_str("wgpu"),
            DeviceSpec::Wgpu(Some(i)) => write!(f, "wgpu:{i}"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// Recorded as written by [`std::fmt::Display`] (`cpu`, `wgpu`, `wgpu:N`, `cuda:N`).
impl serde::Serialize for DeviceSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl DeviceSpec {
    /// The burn device. For wgpu, the adapter is looked up now, so that a machine without one
    /// (no Vulkan/Metal/GL driver) gets an error here instead of a panic at the first tensor.
    pub fn open(self) -> Result<Device> {
        match self {
            DeviceSpec::Cpu => Ok(Device::flex()),
            DeviceSpec::Wgpu(index) => backend::open_wgpu(index),
            DeviceSpec::Cuda(index) => backend::open_cuda(index),
        }
    }
}

/// Parse and open a `--device` value (see [`DeviceSpec`]); for tests and examples; the stages
/// carry the parsed [`DeviceSpec`].
pub fn device_from_str(s: &str) -> Result<Device> {
    s.parse::<DeviceSpec>()?.open()
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
    /// The LoRA adapter the model was loaded or set up with, if any.
    pub adapter: Option<Adapter>,
}

/// How an adapter folder given as the model is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterUse {
    /// Merged into the weights at load (sampling, log-probs: the plain model's speed).
    Merge,
    /// Kept beside the frozen base weights and trainable (`update`, `sft`).
    Train,
}

/// A model's LoRA adapter.
#[derive(Debug, Clone)]
pub struct Adapter {
    /// The adapter folder it was read from (`None`: a fresh adapter).
    pub dir: Option<PathBuf>,
    pub spec: lora::LoraSpec,
    /// Merged into the weights ([`AdapterUse::Merge`]).
    pub merged: bool,
}

impl Model {
    /// Load a Hugging Face model folder onto `device` (use `device.autodiff()` to train). A LoRA
    /// adapter folder loads its base model with the adapter merged in (see [`Model::open`]).
    /// On an autodiff device every weight is f32 (the master weights training updates); on a
    /// plain one the matrices a checkpoint stores in bf16 stay bf16
    /// ([`weights::Storage::AsStored`]), as under an adapter trained beside a frozen base.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        Self::open(dir, None, device, AdapterUse::Merge)
    }

    /// Load `model` with a LoRA adapter: `adapter` on the base folder `model`, or `model` itself
    /// when it is an adapter folder (its `base_model_name_or_path` resolved by
    /// [`lora::resolve_base`]), used as `how` says. Config, tokenizer and chat template are the
    /// base's; [`Model::dir`] is the base folder.
    ///
    /// Storage: training every weight holds f32 master weights; sampling, log-probs and a frozen
    /// base under a trained adapter keep the matrices a checkpoint stores in bf16 in bf16
    /// ([`weights::Storage`]; see [`Model::open_with`]).
    pub fn open(
        model: &Path,
        adapter: Option<&Path>,
        device: &Device,
        how: AdapterUse,
    ) -> Result<Self> {
        let (_, adapter_dir) = lora::resolve(model, adapter)?;
        let frozen_base = how == AdapterUse::Train && adapter_dir.is_some();
        let storage = if device.is_autodiff() && !frozen_base {
            weights::Storage::F32
        } else {
            weights::Storage::AsStored
        };
        Self::open_with(model, adapter, device, how, storage)
    }

    /// [`Model::open`] with the base weights held as `storage` says (e.g.
    /// [`weights::Storage::AsStored`] for a base that a fresh adapter will train beside, frozen).
    pub fn open_with(
        model: &Path,
        adapter: Option<&Path>,
        device: &Device,
        how: AdapterUse,
        storage: weights::Storage,
    ) -> Result<Self> {
        let (dir, adapter_dir) = lora::resolve(model, adapter)?;
        let dir = dir.as_path();
        let config = ModelConfig::load(dir)?;
        let (transformer, dtypes, adapter) = match adapter_dir {
            None => {
                let (t, d) = weights::load_with(&config, dir, device, storage)?;
                (t, d, None)
            }
            Some(a) => {
                let (spec, at) = lora::read_checked(&a, &config)?;
                let (t, d) = match how {
                    AdapterUse::Merge => {
                        let tensors = lora::merged_checkpoint(dir, &config, &spec, &at)?;
                        weights::build_with(&config, tensors, device, storage)?
                    }
                    AdapterUse::Train => {
                        let (t, d) = weights::load_with(&config, dir, device, storage)?;
                        (lora::attach(t, &config, &spec, lora::Init::From(&at))?, d)
                    }
                };
                crate::info!(
                    "{}: LoRA adapter (r = {}, {} modules) on {}{}",
                    a.display(),
                    spec.r,
                    spec.targets.len(),
                    dir.display(),
                    if how == AdapterUse::Merge {
                        ", merged"
                    } else {
                        ""
                    }
                );
                let info = Adapter {
                    dir: Some(a),
                    spec,
                    merged: how == AdapterUse::Merge,
                };
                (t, d, Some(info))
            }
        };
        let tokenizer = Tokenizer::load(dir, Some(&config))?;
        let chat_template = ChatTemplate::load(dir)?;
        Ok(Model {
            dir: dir.to_path_buf(),
            config,
            transformer,
            tokenizer,
            chat_template,
            dtypes,
            adapter,
        })
    }

    /// Freeze the weights and attach a fresh adapter (PEFT's initialisation, seeded): training
    /// then updates the adapter only, and [`Model::save`] writes an adapter folder.
    pub fn add_adapter(mut self, spec: lora::LoraSpec, seed: u64) -> Result<Self> {
        if self.adapter.is_some() {
            bail!("{}: the model already has an adapter", self.dir.display());
        }
        self.transformer = lora::attach(
            self.transformer,
            &self.config,
            &spec,
            lora::Init::Fresh { seed },
        )?;
        self.adapter = Some(Adapter {
            dir: None,
            spec,
            merged: false,
        });
        Ok(self)
    }

    /// The folder whose trainer state and metrics a training run continues: the adapter folder
    /// when the model was loaded from one, else the model folder.
    pub fn state_dir(&self) -> &Path {
        match &self.adapter {
            Some(Adapter { dir: Some(d), .. }) => d,
            _ => &self.dir,
        }
    }

    /// Save at `out` (atomic): with a trainable adapter, an adapter folder in PEFT's layout
    /// (`adapter_config.json`, `adapter_model.safetensors`, the tokenizer and template files);
    /// else a complete checkpoint folder (HF layout, names and dtypes as loaded; config,
    /// tokenizer and template files copied).
    pub fn save(&self, out: &Path) -> Result<()> {
        for d in [self.dir.as_path(), self.state_dir()] {
            if let (Ok(a), Ok(b)) = (d.canonicalize(), out.canonicalize()) {
                if a == b {
                    bail!(
                        "{}: refusing to overwrite the model folder it was loaded from",
                        out.display()
                    );
                }
            }
        }
        if lora::has_adapter(&self.transformer) {
            let spec = match &self.adapter {
                Some(a) => a.spec.clone(),
                None => bail!("internal: an adapter without its configuration"),
            };
            // save_adapter records the base folder as its absolute path (lora::recorded_base), so
            // the new folder resolves from any working directory, in rlcr and in PEFT.
            return lora::save_adapter(&self.transformer, &spec, &self.dir, out);
        }
        weights::save(
            &self.transformer,
            &self.config,
            &self.dtypes,
            &self.dir,
            out,
        )
    }

    /// Render prompts as `opts` says: its template file instead of the folder's, its extra
    /// variables (`enable_thinking`, …).
    pub fn set_chat_options(&mut self, opts: &ChatOptions) -> Result<()> {
        self.chat_template = opts.template_for(&self.dir)?;
        Ok(())
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

/// Copy a float tensor to the host as f32 (one counted read, see [`transfer`]).
pub fn read_f32<const D: usize>(t: burn::tensor::Tensor<D>) -> Result<Vec<f32>> {
    transfer::read(t)?
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("reading a tensor back: {e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_strings() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert!(device_from_str("cpu").is_ok());
        let e = device_from_str("tpu").unwrap_err();
        assert!(format!("{e}").contains("expected cpu, wgpu"), "{e}");
        for bad in ["cuda:x", "wgpu:", "wgpu:-1", "cpu:0", "gpu", ""] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
        #[cfg(not(feature = "cuda"))]
        {
            let e = device_from_str("cuda:1").unwrap_err();
            assert!(format!("{e}").contains("--features cuda"));
        }
        #[cfg(not(feature = "wgpu"))]
        for s in ["wgpu", "wgpu:0"] {
            let e = device_from_str(s).unwrap_err();
            assert!(format!("{e}").contains("--features wgpu"), "{e}");
        }
        #[cfg(feature = "wgpu")]
        {
            assert_eq!(
                "wgpu".parse::<DeviceSpec>().unwrap(),
                DeviceSpec::Wgpu(None)
            );
            assert_eq!(
                " wgpu:3 ".parse::<DeviceSpec>().unwrap(),
                DeviceSpec::Wgpu(Some(3))
            );
        }
        assert_eq!(DeviceSpec::Wgpu(Some(2)).to_string(), "wgpu:2");
        assert!(ops::on_host(&Device::flex()));
    }
}
