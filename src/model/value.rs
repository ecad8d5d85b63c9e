//! The critic of PPO-GAE: the policy's architecture with a scalar value head (Hugging Face's
//! `*ForTokenClassification` with `num_labels = 1`, which is what verl's and OpenRLHF's critics
//! load).
//!
//! - **Values** are read where verl reads them (`values[:, -response_length-1:-1]`): the value of
//!   response token `i` is the head applied to the final-normed hidden state of the slot *before*
//!   it (the state in which the token is chosen), so `values[i] = w·h_{i-1} + b`.
//! - **Initialisation** from any folder [`Model::load`](super::Model::load) reads: a policy folder
//!   gets a zero head (`w = 0`, `b = 0`: every value starts at 0, deterministic; the head learns
//!   first, the body follows once `w` moves); a critic folder (one with `score.weight`) keeps its
//!   head. A folder written by transformers without `lm_head.weight` loads too (the LM head, unused
//!   by the critic, is then zero).
//! - **Saving** writes the body under its HF names, `lm_head.weight` (so the folder is also a causal
//!   LM rlcr can load), `score.weight` `[1, h]` and `score.bias` `[1]` in f32, and a config.json
//!   with `architectures = ["<Family>ForTokenClassification"]` and `num_labels = 1`. transformers
//!   loads it with `AutoModelForTokenClassification.from_pretrained(dir)`; the values are
//!   `logits[..., 0]` (it reports `lm_head.weight` as unused).
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use burn::module::{Module, Param};
use burn::tensor::{Device, Int, Tensor, TensorData};

use safetensors::Dtype;

use super::weights::{self, HostTensor, WeightDtypes};
use super::{ModelConfig, ResponseBatch, Transformer};

/// Body plus value head (a burn [`Module`]: trainable on an autodiff device).
#[derive(Module, Debug)]
pub struct ValueModel {
    pub body: Transformer,
    /// `[h, 1]` (HF `score.weight` `[1, h]`, transposed).
    pub head: Param<Tensor<2>>,
    /// `[1]`.
    pub bias: Param<Tensor<1>>,
}

impl ValueModel {
    /// Values of the response tokens of `batch`, `[B, R]` left-aligned like
    /// [`Transformer::response_logprobs`] (columns past a row's length hold arbitrary numbers).
    pub fn values(&self, batch: &ResponseBatch) -> Result<Tensor<2>> {
        let h = self.body.hidden(&batch.tokens)?;
        let [b, t, hd] = h.dims();
        let r = batch.max_resp;
        ensure!(r > 0, "no response tokens in the batch");
        ensure!(t > r, "every row needs at least one context token");
        let hs = h
            .slice([0..b, t - r - 1..t - 1, 0..hd])
            .reshape([b * r, hd]);
        let v = hs.matmul(self.head.val()) + self.bias.val().reshape([1, 1]);
        let device = self.body.device();
        let left: Tensor<2, Int> = super::transfer::upload(
            TensorData::new(left_align_index(&batch.resp_lens, r), [b, r]),
            &device,
        );
        Ok(v.reshape([b, r]).gather(1, left))
    }
}

/// `[B·R]` gather index turning right-aligned columns into left-aligned ones.
fn left_align_index(lens: &[usize], r: usize) -> Vec<i32> {
    let mut idx = Vec::with_capacity(lens.len() * r);
    for &len in lens {
        let shift = r - len;
        idx.extend((0..r).map(|i| ((i + shift).min(r - 1)) as i32));
    }
    idx
}

/// Where the head came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HeadInit {
    /// `score.weight` / `score.bias` of a critic folder.
    Loaded,
    /// A policy folder: zero head.
    Zeros,
}

/// A critic loaded from a folder.
pub struct Critic {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub model: ValueModel,
    pub dtypes: WeightDtypes,
    pub head_init: HeadInit,
}

impl Critic {
    /// Load a critic (or a policy, with a zero head) from `dir`. A LoRA adapter folder starts a
    /// critic from its base with the adapter merged in (a critic trains every weight); the
    /// critic is then saved as a full folder with the base's config and tokenizer files.
    pub fn load(dir: &Path, device: &Device) -> Result<Critic> {
        let (base, adapter) = super::lora::resolve(dir, None)?;
        let config = ModelConfig::load(&base)?;
        let mut tensors = match &adapter {
            None => weights::read_checkpoint(&base)?,
            Some(a) => {
                let (spec, at) = super::lora::read_checked(a, &config)?;
                let merged = super::lora::merged_checkpoint(&base, &config, &spec, &at)?;
                crate::info!(
                    "{}: critic from the LoRA adapter merged into {}",
                    a.display(),
                    base.display()
                );
                merged
            }
        };
        let dir = base.as_path();
        let h = config.hidden_size;
        let w = tensors.remove("score.weight");
        let b = tensors.remove("score.bias");
        if !config.tie_word_embeddings && !tensors.contains_key("lm_head.weight") {
            tensors.insert(
                "lm_head.weight".into(),
                HostTensor {
                    dtype: Dtype::F32,
                    shape: vec![config.vocab_size, h],
                    data: vec![0.0; config.vocab_size * h],
                },
            );
        }
        let (body, dtypes) = weights::build(&config, tensors, device)
            .with_context(|| format!("loading the critic {}", dir.display()))?;
        let (head, bias, head_init) = match (w, b) {
            (Some(w), b) => {
                if w.shape != [1, h] {
                    bail!(
                        "{}: score.weight has shape {:?}; a value head is [1, {h}] (num_labels = 1)",
                        dir.display(),
                        w.shape
                    );
                }
                let bias = match b {
                    Some(b) if b.shape == [1] => b.data,
                    Some(b) => bail!(
                        "{}: score.bias has shape {:?}, expected [1]",
                        dir.display(),
                        b.shape
                    ),
                    None => vec![0.0],
                };
                (w.data, bias, HeadInit::Loaded)
            }
            (None, Some(_)) => bail!("{}: score.bias without score.weight", dir.display()),
            (None, None) => (vec![0.0; h], vec![0.0], HeadInit::Zeros),
        };
        let model = ValueModel {
            body,
            head: Param::from_tensor(Tensor::from_data(TensorData::new(head, [h, 1]), device)),
            bias: Param::from_tensor(Tensor::from_data(TensorData::new(bias, [1]), device)),
        };
        Ok(Critic {
            dir: dir.to_path_buf(),
            config,
            model,
            dtypes,
            head_init,
        })
    }

    /// Values of `(context, response)` rows, `batch_size` rows per forward pass (inference).
    pub fn predict(&self, rows: &[(&[u32], &[u32])], batch_size: usize) -> Result<Vec<Vec<f32>>> {
        predict(&self.model, rows, batch_size)
    }

    /// Save as a Hugging Face token-classification folder (atomic; see the module docs).
    pub fn save(&self, model: &ValueModel, out: &Path) -> Result<()> {
        save(model, &self.config, &self.dtypes, &self.dir, out)
    }
}

/// Values of `(context, response)` rows with `model` (rows with an empty response get none).
pub fn predict(
    model: &ValueModel,
    rows: &[(&[u32], &[u32])],
    batch_size: usize,
) -> Result<Vec<Vec<f32>>> {
    let mut out: Vec<Vec<f32>> = vec![Vec::new(); rows.len()];
    let mut order: Vec<usize> = (0..rows.len()).filter(|&i| !rows[i].1.is_empty()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(rows[i].0.len() + rows[i].1.len()));
    for chunk in order.chunks(batch_size.max(1)) {
        let part: Vec<(&[u32], &[u32])> = chunk.iter().map(|&i| rows[i]).collect();
        let batch = ResponseBatch::new(&part)?;
        let v = super::read_f32(model.values(&batch)?)?;
        for (k, v) in batch.split_rows(&v).into_iter().enumerate() {
            out[chunk[k]] = v;
        }
    }
    Ok(out)
}

/// The `architectures` entry of a critic of `causal` (`Qwen2ForCausalLM` →
/// `Qwen2ForTokenClassification`).
pub fn token_classification_arch(config: &ModelConfig) -> String {
    let base = match config.model_type.as_str() {
        "qwen2" => "Qwen2",
        "qwen3" => "Qwen3",
        "mistral" => "Mistral",
        _ => "Llama",
    };
    format!("{base}ForTokenClassification")
}

/// Write `model` as a critic folder at `out` (weights, side files of `src_dir`, config.json with
/// the token-classification architecture and one label).
pub fn save(
    model: &ValueModel,
    config: &ModelConfig,
    dtypes: &WeightDtypes,
    src_dir: &Path,
    out: &Path,
) -> Result<()> {
    if let (Ok(a), Ok(b)) = (src_dir.canonicalize(), out.canonicalize()) {
        if a == b {
            bail!(
                "{}: refusing to overwrite the folder the critic was loaded from",
                out.display()
            );
        }
    }
    let default = match config.dtype.as_deref() {
        Some("bfloat16") => Dtype::BF16,
        Some("float16") => Dtype::F16,
        _ => Dtype::F32,
    };
    let mut tensors = weights::export(&model.body, config, dtypes, default)?;
    let host = |t: Tensor<2>| -> Result<Vec<f32>> { super::read_f32(t) };
    tensors.push((
        "score.weight".into(),
        HostTensor {
            dtype: Dtype::F32,
            shape: vec![1, config.hidden_size],
            data: host(model.head.val())?,
        },
    ));
    tensors.push((
        "score.bias".into(),
        HostTensor {
            dtype: Dtype::F32,
            shape: vec![1],
            data: super::read_f32(model.bias.val())?,
        },
    ));
    let arch = token_classification_arch(config);
    crate::fs::write_folder(out, |tmp| {
        weights::write_safetensors(tmp, &tensors, weights::MAX_SHARD_BYTES)?;
        weights::copy_side_files(src_dir, tmp)?;
        let path = tmp.join("config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let obj = v
            .as_object_mut()
            .with_context(|| format!("{}: not a JSON object", path.display()))?;
        obj.insert("architectures".into(), serde_json::json!([arch]));
        obj.insert("id2label".into(), serde_json::json!({"0": "LABEL_0"}));
        obj.insert("label2id".into(), serde_json::json!({"LABEL_0": 0}));
        std::fs::write(&path, serde_json::to_string_pretty(&v)? + "\n")
            .with_context(|| format!("writing {}", path.display()))
    })
    .with_context(|| format!("saving the critic to {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::transformer::tests::max_diff;
    use crate::model::{Model, TokenBatch};

    /// A critic started from a LoRA adapter folder has the body of base + adapter (the bits of
    /// the policy loaded from that folder, merged), not the base's, and a zero head.
    #[test]
    fn a_critic_from_an_adapter_folder_has_the_merged_body() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let adapter = root.join("lora/tiny-qwen2-peft");
        let dev = Device::flex();
        let critic = Critic::load(&adapter, &dev).unwrap();
        assert_eq!(critic.head_init, HeadInit::Zeros);
        assert_eq!(
            critic.dir.canonicalize().unwrap(),
            root.join("tiny-qwen2").canonicalize().unwrap()
        );
        let ids = TokenBatch::left_padded(&[vec![5u32, 17, 99, 3, 250, 41, 7]]);
        let hidden = |t: &Transformer| super::super::read_f32(t.hidden(&ids).unwrap()).unwrap();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let merged = Model::load(&adapter, &dev).unwrap();
        let base = Model::load(&root.join("tiny-qwen2"), &dev).unwrap();
        let got = hidden(&critic.model.body);
        assert_eq!(bits(got.clone()), bits(hidden(&merged.transformer)));
        let apart = max_diff(&got, &hidden(&base.transformer));
        assert!(apart > 1e-3, "the adapter changed nothing ({apart})");
    }
}
