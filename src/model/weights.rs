//! Checkpoint weights: Hugging Face safetensors in, Hugging Face safetensors out.
//!
//! Loading reads `model.safetensors` or the shards listed in `model.safetensors.index.json`
//! (memory-mapped), converts f32 / bf16 / f16 to f32, checks every tensor against the names and
//! shapes the config implies, and builds the [`Transformer`]. Names are the HF ones
//! (`model.layers.{i}.self_attn.q_proj.weight`, …); the table of rules is [`expected_tensors`].
//!
//! Design decisions:
//! - **Strict**: a missing tensor, an unknown tensor or a wrong shape is an error that lists every
//!   offender by name (a half-loaded model would silently compute another function). Tolerated by
//!   name: `*.rotary_emb.inv_freq` buffers of old checkpoints, and `lm_head.weight` when the
//!   config ties embeddings (transformers ties it to the embedding anyway).
//! - **Saving writes what was read**: exact HF names and `[out, in]` layout, each tensor in the
//!   dtype it was loaded from ([`WeightDtypes`]); f32 → bf16/f16 rounds to nearest-even, so a
//!   bf16 checkpoint round-trips bit for bit (its values are exactly representable in f32).
//!   `config.json`, `generation_config.json`, tokenizer files and the chat template are copied.
//! - **Atomic**: everything is written into a temporary folder beside the output and renamed
//!   into place, so a crash never leaves a half-written checkpoint under the final name.
//! - Matrices are transposed between HF's `[out, in]` and the module's `[in, out]` storage on the
//!   host (an exact permutation; see the transformer's design notes for why).
//! - Reading uses the `safetensors` crate directly and builds burn tensors from `TensorData`.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use burn::module::Param;
use burn::tensor::{Device, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors, View};

use super::config::ModelConfig;
use super::transformer::{Attention, Dims, Layer, Mlp, Transformer};

/// On-disk dtype of each tensor, by HF name (recorded at load, used at save).
pub type WeightDtypes = BTreeMap<String, Dtype>;

/// A tensor on the host: f32 values plus the dtype it is (to be) stored in.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Files copied unchanged from the source folder when a checkpoint is saved.
pub const COPIED_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
];

/// Largest shard written by [`save`] (bytes); bigger checkpoints are split with an index file.
pub const MAX_SHARD_BYTES: usize = 4 << 30;

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------

/// Decode little-endian f32 / bf16 / f16 bytes to f32.
pub fn decode_to_f32(dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        other => bail!("unsupported dtype {other:?} (expected F32, BF16 or F16)"),
    })
}

/// Encode f32 values as little-endian bytes of `dtype` (round to nearest even for bf16/f16).
pub fn encode_from_f32(dtype: Dtype, data: &[f32]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len() * dtype.bitsize() / 8);
    match dtype {
        Dtype::F32 => data
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Dtype::BF16 => data
            .iter()
            .for_each(|&v| out.extend_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes())),
        Dtype::F16 => data
            .iter()
            .for_each(|&v| out.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes())),
        other => bail!("cannot write dtype {other:?}"),
    }
    Ok(out)
}

/// The safetensors files of a checkpoint folder: the shards of `model.safetensors.index.json`,
/// else `model.safetensors`.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text =
            fs::read_to_string(&index).with_context(|| format!("reading {}", index.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", index.display()))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .with_context(|| format!("{}: no `weight_map` object", index.display()))?;
        let files: BTreeSet<String> = map
            .values()
            .map(|f| {
                f.as_str()
                    .map(str::to_string)
                    .with_context(|| format!("{}: non-string file name {f}", index.display()))
            })
            .collect::<Result<_>>()?;
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    ensure!(
        single.exists(),
        "{}: no model.safetensors or model.safetensors.index.json (PyTorch .bin checkpoints are \
         not supported; convert them with transformers' save_pretrained)",
        dir.display()
    );
    Ok(vec![single])
}

/// Read every tensor of a checkpoint folder into f32 host memory.
pub fn read_checkpoint(dir: &Path) -> Result<BTreeMap<String, HostTensor>> {
    let mut out = BTreeMap::new();
    for path in weight_files(dir)? {
        for (name, t) in read_safetensors_file(&path)? {
            let prev = out.insert(name.clone(), t);
            ensure!(prev.is_none(), "tensor `{name}` appears in two shards");
        }
    }
    Ok(out)
}

/// Read every tensor of one safetensors file into f32 host memory.
pub fn read_safetensors_file(path: &Path) -> Result<BTreeMap<String, HostTensor>> {
    let mut out = BTreeMap::new();
    let file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: the file is only read; a concurrent writer could change what we read, which is
    // the same risk as reading it with read(2).
    let mmap = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("mapping {}", path.display()))?;
    let st = SafeTensors::deserialize(&mmap)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("reading safetensors header of {}", path.display()))?;
    for (name, view) in st.iter() {
        let data = decode_to_f32(view.dtype(), view.data())
            .with_context(|| format!("{}: tensor `{name}`", path.display()))?;
        out.insert(
            name.to_string(),
            HostTensor {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Names and shapes
// ---------------------------------------------------------------------------------------------

/// Every tensor the config implies, with its HF name and shape, in file order.
///
/// Rules (one per line of HF's modeling code):
/// - `model.embed_tokens.weight` `[V, h]`, `model.norm.weight` `[h]`, `lm_head.weight` `[V, h]`
///   unless tied;
/// - per layer `model.layers.{i}.`: `input_layernorm.weight`, `post_attention_layernorm.weight`
///   `[h]`; `self_attn.{q,k,v}_proj.weight` `[H·d | K·d, h]` (+ `.bias` when `qkv_bias`);
///   `self_attn.o_proj.weight` `[h, H·d]` (+ bias when `o_bias`); `self_attn.{q,k}_norm.weight`
///   `[d]` when `qk_norm` (Qwen3); `mlp.{gate,up}_proj.weight`
///   `[I, h]`, `mlp.down_proj.weight` `[h, I]` (+ biases when `mlp_bias`).
pub fn expected_tensors(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (v, h, i) = (c.vocab_size, c.hidden_size, c.intermediate_size);
    let qd = c.num_attention_heads * c.head_dim;
    let kd = c.num_key_value_heads * c.head_dim;
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
    // (projection, output rows, input columns); a bias has the output rows.
    let qkv = [("q", qd, h), ("k", kd, h), ("v", kd, h)];
    let mlp = [("gate", i, h), ("up", i, h), ("down", h, i)];
    for l in 0..c.num_hidden_layers {
        let p = format!("model.layers.{l}.");
        let projections = |part: &str, set: &[(&str, usize, usize)], bias: bool| {
            let weights = set
                .iter()
                .map(|&(n, rows, cols)| (format!("{p}{part}.{n}_proj.weight"), vec![rows, cols]));
            let biased: &[(&str, usize, usize)] = if bias { set } else { &[] };
            let biases = biased
                .iter()
                .map(|&(n, rows, _)| (format!("{p}{part}.{n}_proj.bias"), vec![rows]));
            weights.chain(biases).collect::<Vec<_>>()
        };
        out.push((format!("{p}input_layernorm.weight"), vec![h]));
        out.extend(projections("self_attn", &qkv, c.qkv_bias));
        out.extend(projections("self_attn", &[("o", h, qd)], c.o_bias));
        if c.qk_norm {
            out.push((format!("{p}self_attn.q_norm.weight"), vec![c.head_dim]));
            out.push((format!("{p}self_attn.k_norm.weight"), vec![c.head_dim]));
        }
        out.push((format!("{p}post_attention_layernorm.weight"), vec![h]));
        out.extend(projections("mlp", &mlp, c.mlp_bias));
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    out
}

/// Names in a checkpoint that are accepted and ignored.
fn ignorable(name: &str, c: &ModelConfig) -> bool {
    name.ends_with("rotary_emb.inv_freq") || (c.tie_word_embeddings && name == "lm_head.weight")
}

/// Check names and shapes; the error lists every missing, unknown and mis-shaped tensor.
pub fn check_tensors(c: &ModelConfig, tensors: &BTreeMap<String, HostTensor>) -> Result<()> {
    match mismatch(&expected_tensors(c), tensors, |n| ignorable(n, c)) {
        None => Ok(()),
        Some(m) => bail!("checkpoint does not match its config.json{m}"),
    }
}

/// What keeps `tensors` from being `expected` (names and shapes, in `expected`'s order): a line
/// each, `\n  `-prefixed, for the missing, the unknown (those `ignore` does not excuse) and the
/// mis-shaped tensors; `None` when they match.
pub fn mismatch(
    expected: &[(String, Vec<usize>)],
    tensors: &BTreeMap<String, HostTensor>,
    ignore: impl Fn(&str) -> bool,
) -> Option<String> {
    let names: BTreeSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let missing: Vec<&str> = expected
        .iter()
        .filter(|(n, _)| !tensors.contains_key(n))
        .map(|(n, _)| n.as_str())
        .collect();
    let unknown: Vec<&str> = tensors
        .keys()
        .map(String::as_str)
        .filter(|n| !names.contains(n) && !ignore(n))
        .collect();
    let wrong: Vec<String> = expected
        .iter()
        .filter_map(|(n, shape)| {
            let t = tensors.get(n)?;
            (t.shape != *shape).then(|| format!("{n}: shape {:?}, expected {:?}", t.shape, shape))
        })
        .collect();
    if missing.is_empty() && unknown.is_empty() && wrong.is_empty() {
        return None;
    }
    let mut msg = String::new();
    if !missing.is_empty() {
        msg += &format!("\n  missing tensors: {}", missing.join(", "));
    }
    if !unknown.is_empty() {
        msg += &format!("\n  unknown tensors: {}", unknown.join(", "));
    }
    if !wrong.is_empty() {
        msg += &format!("\n  wrong shapes: {}", wrong.join("; "));
    }
    Some(msg)
}

// ---------------------------------------------------------------------------------------------
// Building the module
// ---------------------------------------------------------------------------------------------

/// Transpose a row-major `[rows, cols]` buffer (cache-blocked).
pub fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const B: usize = 32;
    let mut out = vec![0f32; data.len()];
    for r0 in (0..rows).step_by(B) {
        for c0 in (0..cols).step_by(B) {
            for r in r0..(r0 + B).min(rows) {
                for c in c0..(c0 + B).min(cols) {
                    out[c * rows + r] = data[r * cols + c];
                }
            }
        }
    }
    out
}

/// How a model's weight matrices are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Storage {
    /// Every tensor in f32 (training: the f32 master weights the optimizer updates).
    #[default]
    F32,
    /// A matrix the checkpoint stores in bf16 stays bf16 (half the memory; every product widens
    /// it exactly, so the numbers are the f32 model's), on a device with bf16 arithmetic
    /// ([`Device::supports_dtype`]: the CPU, CUDA, Metal; f32 elsewhere) unless
    /// `RLCR_WEIGHTS_BF16=0` asks for f32. Norm gains, biases,
    /// f32/f16 matrices and matrices whose values are not all bf16 numbers (a merged adapter)
    /// stay f32.
    AsStored,
}

/// A matrix's values, in HF layout `[out, in]` (row-major), and whether it is to be held in bf16.
struct Matrix {
    data: Vec<f32>,
    bf16: bool,
}

/// A weight given in HF layout `[out, in]` (row-major), stored as an `[in, out]` parameter: bf16
/// when `m.bf16` and every value is a bf16 number (so the conversion is exact), else f32.
fn param2(m: Matrix, hf_shape: [usize; 2], device: &Device) -> Param<Tensor<2>> {
    let [o, i] = hf_shape;
    let t = transpose(&m.data, o, i);
    drop(m.data);
    if m.bf16 && t.iter().all(|v| v.to_bits() & 0xffff == 0) {
        let h: Vec<half::bf16> = t.iter().map(|&v| half::bf16::from_f32(v)).collect();
        drop(t);
        let data = TensorData::new(h, [i, o]);
        return Param::from_tensor(Tensor::from_data(data, (device, burn::tensor::DType::BF16)));
    }
    Param::from_tensor(Tensor::from_data(TensorData::new(t, [i, o]), device))
}

fn param1(data: Vec<f32>, device: &Device) -> Param<Tensor<1>> {
    let n = data.len();
    Param::from_tensor(Tensor::from_data(TensorData::new(data, [n]), device))
}

/// A matrix of one or more checkpoint tensors, their rows stacked in the order given; to be held
/// in bf16 when `keep_bf16` and all of them are bf16 in the file.
fn matrix(
    take: &mut impl FnMut(&str) -> Result<HostTensor>,
    names: &[String],
    keep_bf16: bool,
) -> Result<Matrix> {
    let mut data: Vec<f32> = Vec::new();
    let mut bf16 = keep_bf16;
    for n in names {
        let t = take(n)?;
        bf16 &= t.dtype == Dtype::BF16;
        if data.is_empty() {
            data = t.data;
        } else {
            data.extend(t.data);
        }
    }
    Ok(Matrix { data, bf16 })
}

/// Build the transformer from checked host tensors (consumed) and return it with the dtype of
/// every tensor as read. Matrices are transposed to the module's `[in, out]` storage; q/k/v
/// (and gate/up) are stacked in HF row order first, so the fused matrix has their columns in
/// that order.
pub fn build(
    c: &ModelConfig,
    tensors: BTreeMap<String, HostTensor>,
    device: &Device,
) -> Result<(Transformer, WeightDtypes)> {
    build_with(c, tensors, device, Storage::F32)
}

/// [`build`] with the matrices held as `storage` says.
pub fn build_with(
    c: &ModelConfig,
    tensors: BTreeMap<String, HostTensor>,
    device: &Device,
    storage: Storage,
) -> Result<(Transformer, WeightDtypes)> {
    check_tensors(c, &tensors)?;
    let dtypes: WeightDtypes = tensors.iter().map(|(n, t)| (n.clone(), t.dtype)).collect();
    let keep_bf16 = storage == Storage::AsStored
        && crate::switches::get().weights_bf16
        && device.supports_dtype(burn::tensor::DType::BF16);
    let mut tensors_left = tensors;
    let mut take_t = |name: &str| -> Result<HostTensor> {
        tensors_left
            .remove(name)
            .with_context(|| format!("missing tensor `{name}`"))
    };
    let (v, h, i) = (c.vocab_size, c.hidden_size, c.intermediate_size);
    let qkv_rows = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim;
    let qd = c.num_attention_heads * c.head_dim;
    let embed = param2(
        matrix(
            &mut take_t,
            &["model.embed_tokens.weight".into()],
            keep_bf16,
        )?,
        [v, h],
        device,
    );
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let p = format!("model.layers.{l}.");
        // The vector of the layer's tensors `names` (after `p`), concatenated in that order.
        let mut vector = |names: &[&str]| -> Result<Param<Tensor<1>>> {
            let mut data = Vec::new();
            for n in names {
                data.extend(take_t(&format!("{p}{n}"))?.data);
            }
            Ok(param1(data, device))
        };
        let qkv_bias = c
            .qkv_bias
            .then(|| {
                vector(&[
                    "self_attn.q_proj.bias",
                    "self_attn.k_proj.bias",
                    "self_attn.v_proj.bias",
                ])
            })
            .transpose()?;
        let o_bias = c
            .o_bias
            .then(|| vector(&["self_attn.o_proj.bias"]))
            .transpose()?;
        let (q_norm, k_norm) = if c.qk_norm {
            (
                Some(vector(&["self_attn.q_norm.weight"])?),
                Some(vector(&["self_attn.k_norm.weight"])?),
            )
        } else {
            (None, None)
        };
        let (gate_up_bias, down_bias) = if c.mlp_bias {
            (
                Some(vector(&["mlp.gate_proj.bias", "mlp.up_proj.bias"])?),
                Some(vector(&["mlp.down_proj.bias"])?),
            )
        } else {
            (None, None)
        };
        let input_norm = vector(&["input_layernorm.weight"])?;
        let post_norm = vector(&["post_attention_layernorm.weight"])?;
        // The matrix of the layer's projections `names` (after `p`), stacked in that order.
        let mut projections = |names: &[&str]| {
            let names: Vec<String> = names.iter().map(|n| format!("{p}{n}.weight")).collect();
            matrix(&mut take_t, &names, keep_bf16)
        };
        let qkv = projections(&["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"])?;
        let o = projections(&["self_attn.o_proj"])?;
        let gate_up = projections(&["mlp.gate_proj", "mlp.up_proj"])?;
        let down = projections(&["mlp.down_proj"])?;
        layers.push(Layer {
            input_norm,
            attn: Attention {
                qkv: param2(qkv, [qkv_rows, h], device),
                qkv_bias,
                q_norm,
                k_norm,
                o: param2(o, [h, qd], device),
                o_bias,
            },
            post_norm,
            mlp: Mlp {
                gate_up: param2(gate_up, [2 * i, h], device),
                gate_up_bias,
                down: param2(down, [h, i], device),
                down_bias,
            },
            lora: None,
        });
    }
    let norm = param1(take_t("model.norm.weight")?.data, device);
    let lm_head = if c.tie_word_embeddings {
        None
    } else {
        Some(param2(
            matrix(&mut take_t, &["lm_head.weight".into()], keep_bf16)?,
            [v, h],
            device,
        ))
    };
    Ok((
        Transformer {
            embed,
            layers,
            norm,
            lm_head,
            dims: Dims::from_config(c),
            decode: Default::default(),
        },
        dtypes,
    ))
}

/// Random weights for `c` (uniform in ±0.05, norm gains 1, f32): for benchmarks and tests that
/// need a model of a given shape, not a trained one. Same seed, same weights.
pub fn random_tensors(c: &ModelConfig, seed: u64) -> BTreeMap<String, HostTensor> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    expected_tensors(c)
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let data = if name.ends_with("norm.weight") {
                vec![1.0; n]
            } else {
                (0..n).map(|_| rng.random_range(-0.05f32..0.05)).collect()
            };
            (
                name,
                HostTensor {
                    dtype: Dtype::F32,
                    shape,
                    data,
                },
            )
        })
        .collect()
}

/// Load config-checked weights of `dir` onto `device` (every tensor f32).
pub fn load(c: &ModelConfig, dir: &Path, device: &Device) -> Result<(Transformer, WeightDtypes)> {
    load_with(c, dir, device, Storage::F32)
}

/// [`load`] with the matrices held as `storage` says.
pub fn load_with(
    c: &ModelConfig,
    dir: &Path,
    device: &Device,
    storage: Storage,
) -> Result<(Transformer, WeightDtypes)> {
    let tensors = read_checkpoint(dir)?;
    build_with(c, tensors, device, storage)
        .with_context(|| format!("loading weights from {}", dir.display()))
}

// ---------------------------------------------------------------------------------------------
// Exporting and saving
// ---------------------------------------------------------------------------------------------

fn to_host<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("reading a tensor back: {e:?}"))
}

/// A stored `[in, out]` matrix back in HF layout `[out, in]`.
fn to_host_hf(t: Tensor<2>) -> Result<Vec<f32>> {
    let [i, o] = t.dims();
    Ok(transpose(&to_host(t)?, i, o))
}

/// Split the rows of a row-major `[rows, cols]` buffer at the given row counts.
fn split_rows(data: Vec<f32>, cols: usize, counts: &[usize]) -> Vec<Vec<f32>> {
    let mut out = Vec::with_capacity(counts.len());
    let mut off = 0;
    for &n in counts {
        out.push(data[off * cols..(off + n) * cols].to_vec());
        off += n;
    }
    out
}

/// Every tensor of `model` under its HF name, in HF layout, tagged with the dtype to write
/// (`dtypes`, falling back to `default` for names not recorded).
pub fn export(
    model: &Transformer,
    c: &ModelConfig,
    dtypes: &WeightDtypes,
    default: Dtype,
) -> Result<Vec<(String, HostTensor)>> {
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let qd = c.num_attention_heads * c.head_dim;
    let kd = c.num_key_value_heads * c.head_dim;
    let mut out: Vec<(String, Vec<f32>)> = Vec::new();
    out.push((
        "model.embed_tokens.weight".into(),
        to_host_hf(model.embed.val())?,
    ));
    for (l, layer) in model.layers.iter().enumerate() {
        let p = format!("model.layers.{l}.");
        out.push((
            format!("{p}input_layernorm.weight"),
            to_host(layer.input_norm.val())?,
        ));
        let qkv = split_rows(to_host_hf(layer.attn.qkv.val())?, h, &[qd, kd, kd]);
        for (n, d) in ["q", "k", "v"].iter().zip(qkv) {
            out.push((format!("{p}self_attn.{n}_proj.weight"), d));
        }
        if let Some(b) = &layer.attn.qkv_bias {
            let parts = split_rows(to_host(b.val())?, 1, &[qd, kd, kd]);
            for (n, d) in ["q", "k", "v"].iter().zip(parts) {
                out.push((format!("{p}self_attn.{n}_proj.bias"), d));
            }
        }
        out.push((
            format!("{p}self_attn.o_proj.weight"),
            to_host_hf(layer.attn.o.val())?,
        ));
        if let Some(b) = &layer.attn.o_bias {
            out.push((format!("{p}self_attn.o_proj.bias"), to_host(b.val())?));
        }
        if let (Some(q), Some(k)) = (&layer.attn.q_norm, &layer.attn.k_norm) {
            out.push((format!("{p}self_attn.q_norm.weight"), to_host(q.val())?));
            out.push((format!("{p}self_attn.k_norm.weight"), to_host(k.val())?));
        }
        out.push((
            format!("{p}post_attention_layernorm.weight"),
            to_host(layer.post_norm.val())?,
        ));
        let gu = split_rows(to_host_hf(layer.mlp.gate_up.val())?, h, &[i, i]);
        for (n, d) in ["gate", "up"].iter().zip(gu) {
            out.push((format!("{p}mlp.{n}_proj.weight"), d));
        }
        out.push((
            format!("{p}mlp.down_proj.weight"),
            to_host_hf(layer.mlp.down.val())?,
        ));
        if let Some(b) = &layer.mlp.gate_up_bias {
            let parts = split_rows(to_host(b.val())?, 1, &[i, i]);
            for (n, d) in ["gate", "up"].iter().zip(parts) {
                out.push((format!("{p}mlp.{n}_proj.bias"), d));
            }
        }
        if let Some(b) = &layer.mlp.down_bias {
            out.push((format!("{p}mlp.down_proj.bias"), to_host(b.val())?));
        }
    }
    out.push(("model.norm.weight".into(), to_host(model.norm.val())?));
    if let Some(w) = &model.lm_head {
        out.push(("lm_head.weight".into(), to_host_hf(w.val())?));
    }
    let shapes: HashMap<String, Vec<usize>> = expected_tensors(c).into_iter().collect();
    out.into_iter()
        .map(|(name, data)| {
            let shape = shapes
                .get(&name)
                .cloned()
                .with_context(|| format!("internal: no shape for `{name}`"))?;
            ensure!(
                shape.iter().product::<usize>() == data.len(),
                "internal: `{name}` has {} values for shape {shape:?}",
                data.len()
            );
            let dtype = dtypes.get(&name).copied().unwrap_or(default);
            Ok((name, HostTensor { dtype, shape, data }))
        })
        .collect()
}

/// A tensor ready to be written (implements safetensors' `View`).
struct Encoded {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Encoded {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Every tensor encoded in its own dtype, named, in order (what both writers below serialize).
fn encode_all(tensors: &[(String, HostTensor)]) -> Result<Vec<(String, Encoded)>> {
    tensors
        .iter()
        .map(|(n, t)| {
            Ok((
                n.clone(),
                Encoded {
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    bytes: encode_from_f32(t.dtype, &t.data)
                        .with_context(|| format!("tensor `{n}`"))?,
                },
            ))
        })
        .collect()
}

/// Write host tensors as one safetensors file at `path` (each in its dtype; metadata
/// `format: pt`, as transformers and PEFT write).
pub fn write_safetensors_file(path: &Path, tensors: &[(String, HostTensor)]) -> Result<()> {
    let encoded = encode_all(tensors)?;
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let views = encoded.iter().map(|(n, e)| (n.as_str(), e));
    safetensors::serialize_to_file(views, Some(meta), path)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("writing {}", path.display()))
}

/// Write host tensors as `model.safetensors`, or as shards of at most `max_shard` bytes plus
/// `model.safetensors.index.json`, into `dir` (which must exist).
pub fn write_safetensors(
    dir: &Path,
    tensors: &[(String, HostTensor)],
    max_shard: usize,
) -> Result<()> {
    let encoded = encode_all(tensors)?;
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let mut shards: Vec<Vec<&(String, Encoded)>> = vec![Vec::new()];
    let mut size = 0usize;
    for t in &encoded {
        let n = t.1.bytes.len();
        if size > 0 && size + n > max_shard {
            shards.push(Vec::new());
            size = 0;
        }
        size += n;
        if let Some(last) = shards.last_mut() {
            last.push(t);
        }
    }
    let write = |path: &Path, items: &[&(String, Encoded)]| -> Result<()> {
        let views = items.iter().map(|(n, e)| (n.as_str(), e));
        safetensors::serialize_to_file(views, Some(meta.clone()), path)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("writing {}", path.display()))
    };
    if shards.len() == 1 {
        return write(&dir.join("model.safetensors"), &shards[0]);
    }
    let total: usize = encoded.iter().map(|(_, e)| e.bytes.len()).sum();
    let count = shards.len();
    let mut weight_map = serde_json::Map::new();
    for (k, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", k + 1, count);
        write(&dir.join(&file), shard)?;
        for (n, _) in shard.iter().map(|x| (&x.0, &x.1)) {
            weight_map.insert(n.clone(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({
        "metadata": {"total_size": total},
        "weight_map": weight_map,
    });
    let path = dir.join("model.safetensors.index.json");
    fs::write(&path, serde_json::to_string_pretty(&index)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// Write a complete checkpoint folder at `out` atomically: the weights of `model` (HF names and
/// layout, each tensor in its recorded dtype) and the config/tokenizer files of `src_dir`.
///
/// The folder is assembled as `.NAME.tmp-PID` beside `out` and renamed into place; an existing
/// `out` is replaced (it must not be `src_dir`).
pub fn save(
    model: &Transformer,
    c: &ModelConfig,
    dtypes: &WeightDtypes,
    src_dir: &Path,
    out: &Path,
) -> Result<()> {
    let default = match c.dtype.as_deref() {
        Some("bfloat16") => Dtype::BF16,
        Some("float16") => Dtype::F16,
        _ => Dtype::F32,
    };
    let tensors = export(model, c, dtypes, default)?;
    crate::fs::write_folder(out, |tmp| {
        write_safetensors(tmp, &tensors, MAX_SHARD_BYTES)?;
        copy_side_files(src_dir, tmp)
    })
    .with_context(|| format!("saving checkpoint to {}", out.display()))
}

/// Copy the config, generation config, tokenizer and chat-template files of `src` into `dst`.
pub fn copy_side_files(src: &Path, dst: &Path) -> Result<()> {
    for name in COPIED_FILES {
        let from = src.join(name);
        if from.is_file() {
            fs::copy(&from, dst.join(name))
                .with_context(|| format!("copying {}", from.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_and_f16_round_trip_exactly() {
        let vals: Vec<f32> = vec![0.0, -0.0, 1.0, -2.5, 3.140625, 1e-3, 65504.0, -1.5e-5];
        for dt in [Dtype::BF16, Dtype::F16, Dtype::F32] {
            let once = decode_to_f32(dt, &encode_from_f32(dt, &vals).unwrap()).unwrap();
            let twice = decode_to_f32(dt, &encode_from_f32(dt, &once).unwrap()).unwrap();
            assert_eq!(
                once.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                twice.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
        // Hand check: 1.0 in bf16 is 0x3F80, in f16 0x3C00.
        assert_eq!(
            encode_from_f32(Dtype::BF16, &[1.0]).unwrap(),
            vec![0x80, 0x3F]
        );
        assert_eq!(
            encode_from_f32(Dtype::F16, &[1.0]).unwrap(),
            vec![0x00, 0x3C]
        );
    }

    #[test]
    fn transpose_matches_definition() {
        for (r, c) in [(1, 1), (3, 70), (65, 33)] {
            let d: Vec<f32> = (0..r * c).map(|x| x as f32).collect();
            let t = transpose(&d, r, c);
            for i in 0..r {
                for j in 0..c {
                    assert_eq!(t[j * r + i], d[i * c + j]);
                }
            }
            assert_eq!(transpose(&t, c, r), d);
        }
    }

    #[test]
    fn sharded_write_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let tensors: Vec<(String, HostTensor)> = (0..5)
            .map(|k| {
                (
                    format!("t{k}"),
                    HostTensor {
                        dtype: Dtype::F32,
                        shape: vec![2, 3],
                        data: (0..6).map(|x| (x + 10 * k) as f32).collect(),
                    },
                )
            })
            .collect();
        write_safetensors(dir.path(), &tensors, 50).unwrap();
        assert!(dir.path().join("model.safetensors.index.json").exists());
        let back = read_checkpoint(dir.path()).unwrap();
        assert_eq!(back.len(), 5);
        for (n, t) in &tensors {
            assert_eq!(&back[n], t);
        }
    }
}
