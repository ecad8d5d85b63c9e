//! The decoder: one implementation of the Llama / Qwen2 / Qwen3 / Mistral forward pass, the same
//! function as Hugging Face transformers' `LlamaForCausalLM` / `Qwen2ForCausalLM` /
//! `Qwen3ForCausalLM`.
//!
//! Reads top to bottom: dimensions → rotary embedding → RMSNorm and linear helpers → MLP →
//! attention → layer → model → LM head, then the host-built inputs of a call (RoPE tables, the
//! mask). Token batches are [`super::batch`], the KV cache [`super::cache`].
//!
//! Design decisions:
//! - **Weights stored `[in, out]`** (transposed from Hugging Face's `[out, in]` at load, back at
//!   save; exact), so every projection is `x · W` with `W` row-major. Measured on Flex (gemm):
//!   2–3× less CPU per decode-step matmul than multiplying by a transposed view of the HF
//!   layout, because gemm then streams the weights without repacking them. The embedding is
//!   stored `[h, V]` for the same reason: it doubles as the tied LM head (`x · E`), and the
//!   lookup is a column gather. q/k/v are fused into one `[h, (H+2K)·d]` matrix and gate/up into
//!   one `[h, 2I]` matrix (one matmul instead of three/two); saving splits the columns again.
//! - **Activations stay 2-D** (`[B·T, h]`) around every matmul, so a decode step is one
//!   `[B, h] × [h, out]` product rather than `B` matrix-vector products.
//! - **RoPE is HF's rotate-half** (`x·cos + rotate_half(x)·sin`), with `inv_freq` and the angles
//!   computed in f32 exactly as transformers does (see [`ModelConfig::inv_freq`]); cos/sin are
//!   evaluated on the host (in f64, rounded once) for the explicit positions of every row.
//! - **Grouped-query attention without copying K/V**: the `g = H/K` query heads that share a
//!   key/value head are stacked along the query axis (`[B, K, g·T, d]`, a free reshape), so the
//!   attention is plain multi-head attention over the K key/value heads on every backend, fused
//!   (burn's `attention`) or not (its autodiff fallback). Rows of the mask repeat `g` times.
//! - **Explicit positions and mask**: every forward takes a [`TokenBatch`] (ids + a validity flag
//!   per slot). Padding slots get no attention from anyone; a padding query attends only to
//!   itself (so no softmax row is empty and no NaN can appear); real tokens are numbered from 0
//!   in every row. A batch of ragged left-padded rows therefore computes, row by row, the same
//!   function as each row alone.
//! - **The KV cache lives outside the module** ([`KvCache`], passed as `&mut`, in
//!   [`super::cache`]): `[B, K, capacity, d]` buffers written in place; attention reads the whole
//!   buffer and the mask hides unwritten slots. On a GPU one kernel a layer rotates q and k and
//!   writes the cache at positions and a slot held on the device, and attention derives its mask
//!   from per-slot flags kept there ([`super::cache::SlotStep`]); elsewhere RoPE tables and the
//!   mask are built on the host per call.
//! - **Decode steps use CPU kernels** when they apply ([`super::cpu`]: packed weight panels
//!   built on the first cached step, ≤ 64 rows, and a host attention over the cache for one
//!   token per row); prefill, training and every other device use their backend's products and
//!   attention. Both paths are covered by the parity tests (they agree to ~1e-6).
//! - **Device-agnostic**: nothing here names a backend; the same code runs on Flex, wgpu, CUDA
//!   and on an autodiff device for training. Every operation goes through [`super::ops`], the
//!   one place that picks a backend's code (rlcr's CPU kernels, or burn ops and `#[cube]`
//!   kernels on a GPU); [`ops::host_decode`] says whether the host's decode paths apply. Per call,
//!   the host sends the token ids and either RoPE cos/sin (`B·T·d` floats) and the boolean mask,
//!   or, through a cache on a GPU, the first slot and the tokens' positions (`1 + B·T` floats);
//!   nothing is read back inside the forward pass (see BENCHMARKS.md, "GPU: what crosses the
//!   bus").
use anyhow::{ensure, Result};
use burn::module::{Module, Param};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use super::batch::{ResponseBatch, TokenBatch};
use super::cache::{KvCache, SlotStep};
use super::config::ModelConfig;
use super::cpu;
use super::lora::{Dropout, LayerLora, Target};
/// The products of the LoRA adapters go through the same dispatch.
pub(crate) use super::ops::matmul;
use super::ops::{self, PackedMatrix, Rope};
use super::transfer::upload;
use std::cell::OnceCell;
use std::sync::{Arc, OnceLock};

mod checkpointed;
pub use checkpointed::LayerCheckpoints;

// ---------------------------------------------------------------------------------------------
// Dimensions
// ---------------------------------------------------------------------------------------------

/// The numbers the forward pass needs, taken from [`ModelConfig`] (kept inside the module).
#[derive(Debug, Clone, PartialEq)]
pub struct Dims {
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f64,
    /// RoPE inverse frequencies (`head_dim / 2` values, f32 as in transformers).
    pub inv_freq: Vec<f32>,
    pub tied: bool,
}

impl Dims {
    pub fn from_config(c: &ModelConfig) -> Self {
        Dims {
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            layers: c.num_hidden_layers,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            eps: c.rms_norm_eps,
            inv_freq: c.inv_freq(),
            tied: c.tie_word_embeddings,
        }
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers: RMSNorm and linear
// ---------------------------------------------------------------------------------------------

/// HF's RMSNorm: `w · x / sqrt(mean(x²) + eps)` over the last axis of `[N, h]`
/// ([`ops::rms_norm`]).
fn rms_norm(x: Tensor<2>, w: &Param<Tensor<1>>, eps: f64) -> Tensor<2> {
    ops::rms_norm(x, w.val(), eps)
}

/// `x · W (+ b)` with `W` stored `[in, out]` and `x` as `[N, in]`.
fn linear(
    x: Tensor<2>,
    w: &Param<Tensor<2>>,
    b: &Option<Param<Tensor<1>>>,
    packed: Option<&PackedMatrix>,
) -> Tensor<2> {
    let y = matmul(x, w.val(), packed);
    match b {
        Some(b) => y + b.val().unsqueeze_dim(0),
        None => y,
    }
}

// ---------------------------------------------------------------------------------------------
// MLP
// ---------------------------------------------------------------------------------------------

/// SwiGLU MLP: `down(silu(gate(x)) · up(x))`, gate and up fused into one matrix.
#[derive(Module, Debug)]
pub struct Mlp {
    /// `[h, 2I]`: columns `0..I` are `gate_proj`, columns `I..2I` are `up_proj`.
    pub gate_up: Param<Tensor<2>>,
    pub gate_up_bias: Option<Param<Tensor<1>>>,
    /// `[I, h]`.
    pub down: Param<Tensor<2>>,
    pub down_bias: Option<Param<Tensor<1>>>,
}

impl Mlp {
    fn forward(
        &self,
        x: Tensor<2>,
        packed: Option<&LayerPacked>,
        lora: Option<&LayerLora>,
        drop: Option<&Dropout>,
    ) -> Tensor<2> {
        let gu = linear(
            x.clone(),
            &self.gate_up,
            &self.gate_up_bias,
            packed.and_then(|p| p.gate_up.as_ref()),
        );
        let gu = match lora {
            Some(l) => {
                let i = self.down.val().dims()[0];
                l.add_fused(gu, &x, &[(Target::Gate, i), (Target::Up, i)], drop)
            }
            None => gu,
        };
        // silu(gate) · up with silu(g) = g · sigmoid(g), as torch's silu (one fused op on Flex).
        let h = ops::swiglu(gu);
        let y = linear(
            h.clone(),
            &self.down,
            &self.down_bias,
            packed.and_then(|p| p.down.as_ref()),
        );
        match lora {
            Some(l) => l.add(y, &h, Target::Down, drop),
            None => y,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

/// Grouped-query self-attention with HF rotate-half RoPE, optional q/k/v and o biases and
/// optional per-head query/key RMSNorm (Qwen3).
#[derive(Module, Debug)]
pub struct Attention {
    /// `[h, (H + 2K)·d]`: columns are `q_proj`, then `k_proj`, then `v_proj`.
    pub qkv: Param<Tensor<2>>,
    pub qkv_bias: Option<Param<Tensor<1>>>,
    /// `[d]` RMSNorm gains applied to every query head before RoPE (Qwen3's `q_norm`).
    pub q_norm: Option<Param<Tensor<1>>>,
    /// `[d]` RMSNorm gains applied to every key head before RoPE (Qwen3's `k_norm`).
    pub k_norm: Option<Param<Tensor<1>>>,
    /// `[H·d, h]`.
    pub o: Param<Tensor<2>>,
    pub o_bias: Option<Param<Tensor<1>>>,
}

/// Where the keys and values of an attention call come from.
enum KvSource<'a> {
    /// Cache-free: the keys/values of this call's own tokens.
    Fresh,
    /// Write this call's keys/values into the cache at `start..start+T`, then attend to the
    /// whole cache buffer.
    Cache {
        k: &'a mut Tensor<4>,
        v: &'a mut Tensor<4>,
        start: usize,
    },
}

/// The host-built inputs of a forward call that the layers may need: RoPE tables and the
/// attention mask (`[B, 1, g·T, S]`, true = hidden, with the same on the host, `[B, g·T, S]`,
/// for rlcr's attention kernels). A call through a cache whose slots the device describes
/// builds them only if a kernel does not apply.
trait HostInputs {
    fn rope(&self) -> &Rope;
    fn mask(&self) -> (&Tensor<4, Bool>, &[bool]);
}

/// What every layer of one forward call shares: dimensions, batch shape, the host-built inputs
/// and, through a cache on a GPU, the device's description of its slots.
struct Step<'a> {
    dims: &'a Dims,
    /// `(B, T)`.
    shape: (usize, usize),
    inputs: &'a dyn HostInputs,
    /// Calls through a cache on a GPU: the device's description of the cache's slots, which the
    /// RoPE/cache-write and attention kernels read instead of `inputs`.
    slots: Option<&'a SlotStep>,
    /// Decode steps (one token per row, through the cache): which of the cache's first `start
    /// + 1` slots each row may attend to (`[B · (start + 1)]`), for the host attention kernel.
    decode_keys: Option<&'a [bool]>,
    /// Adapter dropout keys (training steps with LoRA dropout only).
    lora_drop: Option<&'a Dropout>,
}

impl Attention {
    /// `x`: `[B·T, h]` (normalised). Returns `[B·T, h]`.
    fn forward(
        &self,
        x: Tensor<2>,
        s: &Step<'_>,
        kv: KvSource<'_>,
        packed: Option<&LayerPacked>,
        lora: Option<&LayerLora>,
    ) -> Tensor<2> {
        let (b, t) = s.shape;
        let (h, k, d) = (s.dims.heads, s.dims.kv_heads, s.dims.head_dim);
        let options = AttentionModuleOptions {
            scale: Some(1.0 / (d as f64).sqrt()),
            softcap: None,
            is_causal: false,
        };
        // Through a cache whose slots the device describes, one kernel rotates q and k and
        // writes the cache, adding the q/k/v bias as it reads (the same f32 addition), unless
        // an adapter or a per-head norm comes between the bias and the rotation.
        let slots = match kv {
            KvSource::Cache { .. } => s.slots,
            KvSource::Fresh => None,
        };
        let late_bias = slots.is_some() && lora.is_none() && self.q_norm.is_none();
        let qkv = self.qkv(x.clone(), s, packed, lora, !late_bias);
        let bias = || {
            let w = self.qkv_bias.as_ref().filter(|_| late_bias)?;
            Some(w.val())
        };
        let out = match kv {
            KvSource::Fresh => {
                let (mask, host) = s.inputs.mask();
                match ops::qkv_attention(&qkv, s.inputs.rope(), h, mask, &options) {
                    Some(out) => out,
                    None => {
                        let (q, k_new, v) = rotate(qkv, s);
                        heads_to_rows(ops::attention(q, k_new, v, mask, host, options), t)
                    }
                }
            }
            KvSource::Cache {
                k: kc,
                v: vc,
                start,
            } => {
                let fused = slots.and_then(|sl| {
                    let q = ops::rope_cache_write(&qkv, bias(), h, kc, vc, sl);
                    sl.fell_back.set(sl.fell_back.get() || q.is_none());
                    Some((q?, sl))
                });
                match fused {
                    Some((q, sl)) => {
                        let mask = || s.inputs.mask().0.clone();
                        ops::slot_attention(q, kc, vc, sl, t, mask, options)
                    }
                    None => {
                        let qkv = match bias() {
                            Some(w) => qkv + w.reshape([1, 1, h + 2 * k, d]),
                            None => qkv,
                        };
                        let (q, k_new, v) = rotate(qkv, s);
                        let ranges = [0..b, 0..k, start..start + t, 0..d];
                        kc.inplace(|c| c.slice_assign(ranges.clone(), k_new));
                        vc.inplace(|c| c.slice_assign(ranges, v));
                        let (mask, host) = s.inputs.mask();
                        let out = ops::cached_attention(
                            q,
                            kc,
                            vc,
                            start,
                            t,
                            s.decode_keys,
                            mask,
                            host,
                            options,
                        );
                        heads_to_rows(out, t)
                    }
                }
            }
        };
        let y = linear(
            out.clone(),
            &self.o,
            &self.o_bias,
            packed.and_then(|p| p.o.as_ref()),
        );
        match lora {
            Some(l) => l.add(y, &out, Target::O, s.lora_drop),
            None => y,
        }
    }

    /// The fused q/k/v product of `x` as `[B, T, H + 2K, d]`: with the adapter's share, the
    /// bias when `with_bias`, and Qwen3's per-head norms of q and k.
    fn qkv(
        &self,
        x: Tensor<2>,
        s: &Step<'_>,
        packed: Option<&LayerPacked>,
        lora: Option<&LayerLora>,
        with_bias: bool,
    ) -> Tensor<4> {
        let (b, t) = s.shape;
        let (h, k, d) = (s.dims.heads, s.dims.kv_heads, s.dims.head_dim);
        let bias = if with_bias { &self.qkv_bias } else { &None };
        let qkv = linear(
            x.clone(),
            &self.qkv,
            bias,
            packed.and_then(|p| p.qkv.as_ref()),
        );
        let qkv = match lora {
            Some(l) => {
                let parts = [(Target::Q, h * d), (Target::K, k * d), (Target::V, k * d)];
                l.add_fused(qkv, &x, &parts, s.lora_drop)
            }
            None => qkv,
        };
        // [B·T, (H+2K)·d] → [B, T, H+2K, d] (free).
        let qkv = qkv.reshape([b, t, h + 2 * k, d]);
        match (&self.q_norm, &self.k_norm) {
            // Qwen3: RMSNorm over each head's d values (queries with q_norm, keys with k_norm),
            // then RoPE, as transformers' `q_norm(q_proj(x).view(..., d))`.
            (Some(qn), Some(kn)) => {
                let eps = s.dims.eps;
                let head_norm = |x: Tensor<4>, n: usize, w: &Param<Tensor<1>>| {
                    rms_norm(x.reshape([b * t * n, d]), w, eps).reshape([b, t, n, d])
                };
                let q = head_norm(qkv.clone().slice([0..b, 0..t, 0..h, 0..d]), h, qn);
                let kk = head_norm(qkv.clone().slice([0..b, 0..t, h..h + k, 0..d]), k, kn);
                let v = qkv.slice([0..b, 0..t, h + k..h + 2 * k, 0..d]);
                Tensor::cat(vec![q, kk, v], 2)
            }
            _ => qkv,
        }
    }
}

/// RoPE from the call's host tables on q and k of `qkv: [B, T, H + 2K, d]`: the queries with
/// the heads sharing a key/value head stacked along the query axis (`[B, K, g·T, d]`), the
/// rotated keys and the values (`[B, K, T, d]`).
fn rotate(qkv: Tensor<4>, s: &Step<'_>) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let [b, t, _, d] = qkv.dims();
    let (h, k) = (s.dims.heads, s.dims.kv_heads);
    // [B, T, H+2K, d] → [B, H+2K, T, d] (view).
    let qkv = qkv.swap_dims(1, 2);
    let qk = s
        .inputs
        .rope()
        .apply(qkv.clone().slice([0..b, 0..h + k, 0..t, 0..d]));
    let v = qkv.slice([0..b, h + k..h + 2 * k, 0..t, 0..d]);
    let q = qk
        .clone()
        .slice([0..b, 0..h, 0..t, 0..d])
        .reshape([b, k, h / k * t, d]);
    let k_new = qk.slice([0..b, h..h + k, 0..t, 0..d]);
    (q, k_new, v)
}

/// Attention's output `[B, K, g·T, d]` = `[B, H, T, d]` as the output projection's input,
/// `[B·T, H·d]` (`t` = T).
fn heads_to_rows(out: Tensor<4>, t: usize) -> Tensor<2> {
    let [b, k, rows, d] = out.dims();
    let h = k * rows / t;
    out.reshape([b, h, t, d])
        .swap_dims(1, 2)
        .reshape([b * t, h * d])
}

// ---------------------------------------------------------------------------------------------
// Layer
// ---------------------------------------------------------------------------------------------

/// One pre-norm decoder layer: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Module, Debug)]
pub struct Layer {
    pub input_norm: Param<Tensor<1>>,
    pub attn: Attention,
    pub post_norm: Param<Tensor<1>>,
    pub mlp: Mlp,
    /// A LoRA adapter on the layer's projections (training; sampling merges it at load).
    pub lora: Option<LayerLora>,
}

impl Layer {
    fn forward(
        &self,
        x: Tensor<2>,
        s: &Step<'_>,
        kv: KvSource<'_>,
        packed: Option<&LayerPacked>,
    ) -> Tensor<2> {
        let normed = rms_norm(x.clone(), &self.input_norm, s.dims.eps);
        let (x, m) = self.branches(x, normed, s, kv, packed);
        x + m
    }

    /// The layer on the residual stream `x`, given `normed = input_norm(x)`, up to its last
    /// residual add: `(x + attn(normed), m)` with `m` the MLP's output. The layer's output is
    /// their sum, which [`layer_stack`] adds in one op with the next RMSNorm
    /// ([`ops::add_rms_norm`]: one kernel on a GPU).
    fn branches(
        &self,
        x: Tensor<2>,
        normed: Tensor<2>,
        s: &Step<'_>,
        kv: KvSource<'_>,
        packed: Option<&LayerPacked>,
    ) -> (Tensor<2>, Tensor<2>) {
        let eps = s.dims.eps;
        let lora = self.lora.as_ref();
        let a = self.attn.forward(normed, s, kv, packed, lora);
        let (x, normed) = ops::add_rms_norm(x, a, self.post_norm.val(), eps);
        let m = self.mlp.forward(normed, packed, lora, s.lora_drop);
        (x, m)
    }
}

/// The final-normed output of `layers` on the embedded tokens `x` (`[N, h]`), the final
/// RMSNorm's gains `norm`: each layer's last residual add runs with the next layer's input
/// RMSNorm, the last one's with the final norm ([`ops::add_rms_norm`]). The same operations as
/// [`Layer::forward`] layer after layer, then the final norm. `kv` gives the layers their keys
/// and values in order, `packed` each layer's packed decode weights (by index).
fn layer_stack<'c, 'p>(
    layers: &[Layer],
    norm: &Param<Tensor<1>>,
    x: Tensor<2>,
    s: &Step<'_>,
    kv: impl Iterator<Item = KvSource<'c>>,
    packed: impl Fn(usize) -> Option<&'p LayerPacked>,
) -> Tensor<2> {
    let eps = s.dims.eps;
    let Some(first) = layers.first() else {
        return rms_norm(x, norm, eps);
    };
    let mut normed = rms_norm(x.clone(), &first.input_norm, eps);
    let mut x = x;
    for (k, (layer, kv)) in layers.iter().zip(kv).enumerate() {
        let (mid, m) = layer.branches(x, normed, s, kv, packed(k));
        let next = layers.get(k + 1).map_or(norm, |l| &l.input_norm);
        (x, normed) = ops::add_rms_norm(mid, m, next.val(), eps);
    }
    normed
}

// ---------------------------------------------------------------------------------------------
// Model and LM head
// ---------------------------------------------------------------------------------------------

/// The decoder-only transformer with its LM head (a burn [`Module`]: trainable with any burn
/// optimizer on an autodiff device).
#[derive(Module, Debug)]
pub struct Transformer {
    /// `[h, V]` token embedding, stored transposed (also the LM head when tied).
    pub embed: Param<Tensor<2>>,
    pub layers: Vec<Layer>,
    pub norm: Param<Tensor<1>>,
    /// `[h, V]`; `None` when the embeddings are tied.
    pub lm_head: Option<Param<Tensor<2>>>,
    #[module(skip)]
    pub dims: Dims,
    /// Packed copies of the weights for the CPU decode kernel, built on the first cached decode
    /// step (see [`super::cpu`]); empty until then.
    #[module(skip)]
    pub decode: DecodePack,
}

/// Packed weight copies of one layer (`None` where packing does not apply).
#[derive(Debug)]
pub struct LayerPacked {
    qkv: Option<PackedMatrix>,
    o: Option<PackedMatrix>,
    gate_up: Option<PackedMatrix>,
    down: Option<PackedMatrix>,
}

/// Packed copies of every matrix used in a decode step.
#[derive(Debug)]
pub struct DecodeWeights {
    layers: Vec<LayerPacked>,
    lm_head: Option<PackedMatrix>,
}

/// Lazily built [`DecodeWeights`] (shared by clones of the model). Set `RLCR_DECODE_PACK=0` to
/// never build them (saves a second copy of the weights in memory; decoding is slower).
/// Matrices whose values are all bf16 numbers are packed as bf16 (same results, half the
/// bytes); `RLCR_DECODE_BF16=1` rounds every matrix to bf16 (faster, changes the numbers),
/// `RLCR_DECODE_BF16=0` keeps f32 panels (see [`cpu::PackPrecision`]).
#[derive(Debug, Clone, Default)]
pub struct DecodePack(OnceLock<Option<Arc<DecodeWeights>>>);

/// Build the attention mask `[B, 1, g·T, S]` (true = masked). Query `t` of row `b` sits at key
/// index `start + t`; a real query sees real keys at or before it, a padding query sees itself.
#[allow(clippy::too_many_arguments)] // the mask's dimensions, spelled out at both call sites
fn build_mask(
    batch: usize,
    len: usize,
    group: usize,
    keys: usize,
    start: usize,
    key_valid: impl Fn(usize, usize) -> bool,
    query_valid: impl Fn(usize, usize) -> bool,
    device: &Device,
) -> (Tensor<4, Bool>, Vec<bool>) {
    let mut m = vec![true; batch * group * len * keys];
    let mut row = vec![true; keys];
    for b in 0..batch {
        for t in 0..len {
            let q = start + t;
            row.fill(true);
            if query_valid(b, t) {
                for (kk, slot) in row.iter_mut().enumerate().take(q + 1) {
                    *slot = !key_valid(b, kk);
                }
            } else {
                row[q] = false;
            }
            for j in 0..group {
                let off = ((b * group + j) * len + t) * keys;
                m[off..off + keys].copy_from_slice(&row);
            }
        }
    }
    let t = upload(
        TensorData::new(m.clone(), [batch, 1, group * len, keys]),
        device,
    );
    (t, m)
}

impl Transformer {
    /// The device the weights live on.
    pub fn device(&self) -> Device {
        self.embed.val().device()
    }

    /// Embedding lookup: `[B·T, h]`.
    fn embed_tokens(&self, input: &TokenBatch, device: &Device) -> Tensor<2> {
        let ids: Tensor<1, Int> =
            upload(TensorData::new(embed_ids(input), [ids_len(input)]), device);
        self.embed_ids(ids)
    }

    /// Embedding lookup of ids on the device: `[N, h]`.
    fn embed_ids(&self, ids: Tensor<1, Int>) -> Tensor<2> {
        // A bf16 embedding gives f32 activations (exact).
        self.embed
            .val()
            .select(1, ids)
            .transpose()
            .cast(burn::tensor::DType::F32)
    }

    /// The LM head on `[N, h]` final-normed hidden states: `[N, V]` logits.
    pub fn lm_head(&self, hidden: Tensor<2>) -> Tensor<2> {
        self.lm_head_packed(hidden, None)
    }

    fn lm_head_packed(&self, hidden: Tensor<2>, packed: Option<&DecodeWeights>) -> Tensor<2> {
        matmul(
            hidden,
            self.head_weight(),
            packed.and_then(|p| p.lm_head.as_ref()),
        )
    }

    /// The LM head's weight `[h, V]`: its own, or the embedding when tied.
    fn head_weight(&self) -> Tensor<2> {
        match &self.lm_head {
            Some(w) => w.val(),
            None => self.embed.val(),
        }
    }

    /// Log-probs of `targets` and (when `entropy`) entropies of the next-token distributions
    /// of `hidden` (`[N, h]`, final-normed) at `temperature`, through the LM head, without
    /// returning the logits (on a GPU they are formed a chunk of tokens at a time, see
    /// [`ops::head_logprob_entropy`]). Differentiable on an autodiff device.
    pub fn head_logprobs(
        &self,
        hidden: Tensor<2>,
        targets: &[u32],
        temperature: f64,
        entropy: bool,
    ) -> Result<(Tensor<1>, Option<Tensor<1>>)> {
        ops::head_logprob_entropy(hidden, self.head_weight(), targets, temperature, entropy)
    }

    /// The packed decode weights, built on first use (plain Flex devices only; `None` elsewhere
    /// or with `RLCR_DECODE_PACK=0`).
    fn decode_weights(&self) -> Option<&DecodeWeights> {
        if !ops::host_decode(&self.device()) {
            return None;
        }
        self.decode
            .0
            .get_or_init(|| {
                let switches = crate::switches::get();
                if !switches.decode_pack {
                    return None;
                }
                let precision = switches.decode_bf16;
                let pack = |p: &Param<Tensor<2>>| PackedMatrix::pack(&p.val(), precision);
                let head = match &self.lm_head {
                    Some(w) => pack(w),
                    None => pack(&self.embed),
                };
                head.as_ref()?;
                let layers = self
                    .layers
                    .iter()
                    .map(|l| LayerPacked {
                        qkv: pack(&l.attn.qkv),
                        o: pack(&l.attn.o),
                        gate_up: pack(&l.mlp.gate_up),
                        down: pack(&l.mlp.down),
                    })
                    .collect();
                Some(Arc::new(DecodeWeights {
                    layers,
                    lm_head: head,
                }))
            })
            .as_deref()
    }

    /// Final RMSNorm on `[N, h]`.
    pub fn final_norm(&self, x: Tensor<2>) -> Tensor<2> {
        rms_norm(x, &self.norm, self.dims.eps)
    }

    /// Cache-free forward: final-normed hidden states `[B, T, h]`.
    ///
    /// This is the training / log-prob path: no cache is read or written, and on an autodiff
    /// device the result carries the graph.
    pub fn hidden(&self, input: &TokenBatch) -> Result<Tensor<3>> {
        let device = self.device();
        let fresh = FreshBatch::new(self, input, &device)?;
        let (b, t) = fresh.shape;
        let step = fresh.step(&self.dims);
        let x = self.embed_tokens(input, &device);
        let h = layer_stack(
            &self.layers,
            &self.norm,
            x,
            &step,
            std::iter::repeat_with(|| KvSource::Fresh),
            |_| None,
        );
        Ok(h.reshape([b, t, self.dims.hidden]))
    }

    /// Cache-free forward: logits `[B, T, V]` at every slot.
    pub fn forward(&self, input: &TokenBatch) -> Result<Tensor<3>> {
        let h = self.hidden(input)?;
        let [b, t, hd] = h.dims();
        Ok(self
            .lm_head(h.reshape([b * t, hd]))
            .reshape([b, t, self.dims.vocab]))
    }

    /// Run `input` through the cache: its keys/values are appended to `cache` (all rows advance
    /// by `input.len` slots) and the final-normed hidden states `[B, T, h]` are returned.
    pub fn hidden_cached(&self, cache: &mut KvCache, input: &TokenBatch) -> Result<Tensor<3>> {
        self.check_cached(cache, input)?;
        let device = self.device();
        let (start, positions) = cache.advance(input);
        let slots = cache.slot_step(input, start, &positions);
        let x = self.embed_tokens(input, &device);
        Ok(self.cached_layers(cache, input, start, &positions, slots, x))
    }

    /// Whether `input` can run through `cache`.
    pub(super) fn check_cached(&self, cache: &KvCache, input: &TokenBatch) -> Result<()> {
        input.check_vocab(self.dims.vocab)?;
        let (b, t) = (input.batch, input.len);
        ensure!(
            b == cache.batch(),
            "batch of {b} rows against a cache of {} rows",
            cache.batch()
        );
        ensure!(t > 0, "empty input");
        ensure!(
            cache.layers.len() == self.layers.len(),
            "cache built for another model ({} layers, model has {})",
            cache.layers.len(),
            self.layers.len()
        );
        Ok(())
    }

    /// A decode step (one token a row) through `cache` from inputs already on the device: the
    /// ids `ids` (`[B]`, 0 for padding) and the slot description `info` (`[1 + B]`, as
    /// [`super::cache::slot_info`] gives it for the call `input` that [`KvCache::advance`] appended at
    /// `start` with `positions`). Returns the logits `[B, V]`. Nothing is uploaded or read: the
    /// same launches on the same buffers every step, as a replayed graph needs
    /// ([`super::graph`]). `input` and `positions` serve only a layer whose kernel does not
    /// apply (the host then describes the slots, and the cache stops describing them on the
    /// device).
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    pub(super) fn step_on_device(
        &self,
        cache: &mut KvCache,
        input: &TokenBatch,
        start: usize,
        positions: &[usize],
        ids: &Tensor<1, Int>,
        info: &Tensor<1>,
    ) -> Tensor<2> {
        let slots = cache.slot_step_with(input, info.clone());
        let x = self.embed_ids(ids.clone());
        let h = self.cached_layers(cache, input, start, positions, slots, x);
        let [b, _, hd] = h.dims();
        self.lm_head(h.reshape([b, hd]))
    }

    /// The layers of a call through `cache` that [`KvCache::advance`] appended at `start` with
    /// `positions`, on the embedded tokens `x` (`[B·T, h]`), the device's description of the
    /// slots `slots` handed back to the cache at the end: final-normed hidden states `[B, T, h]`.
    fn cached_layers(
        &self,
        cache: &mut KvCache,
        input: &TokenBatch,
        start: usize,
        positions: &[usize],
        slots: Option<SlotStep>,
        x: Tensor<2>,
    ) -> Tensor<3> {
        let (b, t) = (input.batch, input.len);
        let device = self.device();
        let inputs = CachedInputs {
            dims: &self.dims,
            input,
            positions,
            valid: &cache.valid,
            start,
            keys: cache.capacity(),
            device: &device,
            rope: OnceCell::new(),
            mask: OnceCell::new(),
        };
        let packed = if b * t <= cpu::MAX_PACKED_ROWS {
            self.decode_weights()
        } else {
            None
        };
        // Decode steps on Flex: the mask on the host, one flag per (row, used slot), for the
        // host attention kernel; a padding query attends only to itself, as in `build_mask`.
        let host = ops::host_decode(&device);
        let decode_keys: Option<Vec<bool>> = (t == 1 && host).then(|| {
            let len = start + 1;
            let mut ok = Vec::with_capacity(b * len);
            for r in 0..b {
                if input.valid[r] {
                    ok.extend((0..len).map(|s| inputs.key_valid(r, s)));
                } else {
                    ok.extend((0..len).map(|s| s == start));
                }
            }
            ok
        });
        let step = Step {
            dims: &self.dims,
            shape: (b, t),
            inputs: &inputs,
            slots: slots.as_ref(),
            decode_keys: decode_keys.as_deref(),
            lora_drop: None,
        };
        let kv = cache.layers.iter_mut().map(|lc| KvSource::Cache {
            k: &mut lc.0,
            v: &mut lc.1,
            start,
        });
        let h = layer_stack(&self.layers, &self.norm, x, &step, kv, |k| {
            packed.and_then(|p| p.layers.get(k))
        });
        cache.end_step(slots);
        h.reshape([b, t, self.dims.hidden])
    }

    /// Run `input` through the cache and return the logits `[B, V]` of each row's last slot (the
    /// next-token distribution for sampling; with left padding the last slot is always real).
    pub fn step(&self, cache: &mut KvCache, input: &TokenBatch) -> Result<Tensor<2>> {
        let h = self.hidden_cached(cache, input)?;
        let [b, t, hd] = h.dims();
        let last = h.slice([0..b, t - 1..t, 0..hd]).reshape([b, hd]);
        let packed = if b <= cpu::MAX_PACKED_ROWS {
            self.decode_weights()
        } else {
            None
        };
        Ok(self.lm_head_packed(last, packed))
    }

    /// Per-token log-probs (and optionally entropies) of the responses of a [`ResponseBatch`],
    /// cache-free, differentiable on an autodiff device.
    ///
    /// Output `[B, R]` (R = longest response), **left-aligned**: column `i` of row `b` is
    /// `log p(response_b[i] | context_b, response_b[..i])` for `i < len_b`; columns past `len_b`
    /// hold the log-prob of an arbitrary token and must be masked by the caller
    /// ([`ResponseBatch::mask`]). Entropy `H = −Σ p log p` of the same distributions.
    /// The LM head runs on `chunk_rows` positions at a time (only the response positions), which
    /// bounds the logits memory of inference; on an autodiff device the graph keeps all chunks.
    pub fn response_logprobs(
        &self,
        batch: &ResponseBatch,
        entropy: bool,
        chunk_rows: usize,
    ) -> Result<(Tensor<2>, Option<Tensor<2>>)> {
        let h = self.hidden(&batch.tokens)?;
        let [b, t, hd] = h.dims();
        let r = batch.max_resp;
        let device = self.device();
        ensure!(r > 0, "no response tokens in the batch");
        ensure!(t > r, "every row needs at least one context token");
        // Slot s predicts slot s+1: the R response slots (right-aligned) are predicted by the
        // hidden states at t-r-1 .. t-1.
        let hs = h
            .slice([0..b, t - r - 1..t - 1, 0..hd])
            .reshape([b * r, hd]);
        let n = b * r;
        let chunk = chunk_rows.max(1);
        let mut lps = Vec::new();
        let mut ents = Vec::new();
        let mut s = 0;
        while s < n {
            let e = (s + chunk).min(n);
            let rows = hs.clone().slice([s..e, 0..hd]);
            let (lp, ent) = self.head_logprobs(rows, &batch.targets_right[s..e], 1.0, entropy)?;
            lps.push(lp);
            ents.extend(ent);
            s = e;
        }
        let left: Tensor<2, Int> =
            upload(TensorData::new(batch.left_align_index(), [b, r]), &device);
        let lp = Tensor::cat(lps, 0).reshape([b, r]).gather(1, left.clone());
        let ent = if entropy {
            Some(Tensor::cat(ents, 0).reshape([b, r]).gather(1, left))
        } else {
            None
        };
        Ok((lp, ent))
    }
}

/// The host inputs of a call through a cache, built on first use (a GPU whose kernels read the
/// cache's slots on the device needs neither).
struct CachedInputs<'a> {
    dims: &'a Dims,
    input: &'a TokenBatch,
    /// `[B·T]` RoPE positions of the call's tokens.
    positions: &'a [usize],
    /// The cache's validity flags per row, this call's slots included.
    valid: &'a [Vec<bool>],
    /// The call's first slot.
    start: usize,
    /// The cache's capacity (the mask's key axis).
    keys: usize,
    device: &'a Device,
    rope: OnceCell<Rope>,
    mask: OnceCell<(Tensor<4, Bool>, Vec<bool>)>,
}

impl CachedInputs<'_> {
    /// Whether slot `s` of row `r` holds a real token.
    fn key_valid(&self, r: usize, s: usize) -> bool {
        self.valid[r].get(s).copied().unwrap_or(false)
    }
}

impl HostInputs for CachedInputs<'_> {
    fn rope(&self) -> &Rope {
        let (b, t) = (self.input.batch, self.input.len);
        self.rope
            .get_or_init(|| Rope::new(&self.dims.inv_freq, self.positions, b, t, self.device))
    }

    fn mask(&self) -> (&Tensor<4, Bool>, &[bool]) {
        let (b, t) = (self.input.batch, self.input.len);
        let (mask, host) = self.mask.get_or_init(|| {
            build_mask(
                b,
                t,
                self.dims.group(),
                self.keys,
                self.start,
                |r, s| self.key_valid(r, s),
                |r, s| self.input.valid[r * t + s],
                self.device,
            )
        });
        (mask, host)
    }
}

/// Positions, RoPE tables and the attention mask of a cache-free forward call.
struct FreshBatch {
    /// `(B, T)`.
    shape: (usize, usize),
    rope: Rope,
    mask: Tensor<4, Bool>,
    mask_host: Vec<bool>,
    /// Adapter dropout keys (training steps with LoRA dropout only).
    drop: Option<Dropout>,
}

impl HostInputs for FreshBatch {
    fn rope(&self) -> &Rope {
        &self.rope
    }

    fn mask(&self) -> (&Tensor<4, Bool>, &[bool]) {
        (&self.mask, &self.mask_host)
    }
}

impl FreshBatch {
    fn new(model: &Transformer, input: &TokenBatch, device: &Device) -> Result<Self> {
        input.check_vocab(model.dims.vocab)?;
        let (b, t) = (input.batch, input.len);
        ensure!(b > 0 && t > 0, "empty batch ({b}×{t})");
        let mut positions = vec![0usize; b * t];
        for r in 0..b {
            let mut p = 0;
            for s in 0..t {
                if input.valid[r * t + s] {
                    positions[r * t + s] = p;
                    p += 1;
                }
            }
        }
        let rope = Rope::new(&model.dims.inv_freq, &positions, b, t, device);
        let valid = |r: usize, s: usize| input.valid[r * t + s];
        let (mask, mask_host) = build_mask(b, t, model.dims.group(), t, 0, valid, valid, device);
        let drop = Dropout::for_batch(model, b, t, &input.ids, &input.valid);
        Ok(FreshBatch {
            shape: (b, t),
            rope,
            mask,
            mask_host,
            drop,
        })
    }

    fn step<'a>(&'a self, dims: &'a Dims) -> Step<'a> {
        Step {
            dims,
            shape: self.shape,
            inputs: self,
            slots: None,
            decode_keys: None,
            lora_drop: self.drop.as_ref(),
        }
    }
}

/// The ids the embedding looks up for `input`: its ids, 0 for padding.
pub(super) fn embed_ids(input: &TokenBatch) -> Vec<i32> {
    input
        .ids
        .iter()
        .zip(&input.valid)
        .map(|(&id, &ok)| if ok { id as i32 } else { 0 })
        .collect()
}

fn ids_len(input: &TokenBatch) -> usize {
    input.batch * input.len
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{read_f32, weights, ModelConfig};

    pub(crate) fn load(name: &str, device: &Device) -> Transformer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(name);
        let c = ModelConfig::load(&dir).unwrap();
        weights::load(&c, &dir, device).unwrap().0
    }

    pub(crate) fn cpu() -> Device {
        Device::flex()
    }

    /// Deterministic pseudo-random ids in 0..vocab.
    pub(crate) fn ids(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) % vocab as u64) as u32
            })
            .collect()
    }

    pub(crate) fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// Logits of one row alone: `[T·V]`.
    pub(crate) fn alone(m: &Transformer, row: &[u32]) -> Vec<f32> {
        read_f32(m.forward(&TokenBatch::left_padded(&[row])).unwrap()).unwrap()
    }

    #[test]
    fn ragged_left_padded_batch_equals_rows_alone() {
        for name in ["tiny-qwen2", "tiny-llama"] {
            let m = load(name, &cpu());
            let v = m.dims.vocab;
            let rows: Vec<Vec<u32>> = [3usize, 17, 9, 1]
                .iter()
                .enumerate()
                .map(|(k, &n)| ids(k as u64, n, 360))
                .collect();
            let batch = TokenBatch::left_padded(&rows);
            let all = read_f32(m.forward(&batch).unwrap()).unwrap();
            let t = batch.len;
            let mut worst = 0f32;
            for (b, row) in rows.iter().enumerate() {
                let want = alone(&m, row);
                let pad = t - row.len();
                let got = &all[(b * t + pad) * v..(b + 1) * t * v];
                worst = worst.max(max_diff(got, &want));
            }
            assert!(worst < 1e-5, "{name}: batched vs alone differ by {worst}");
        }
    }

    #[test]
    fn gradients_match_finite_differences() {
        let dev = cpu().autodiff();
        let m = load("tiny-llama", &dev);
        let rows = vec![
            (ids(4, 6, 360), ids(5, 5, 360)),
            (ids(6, 3, 360), ids(9, 7, 360)),
        ];
        let batch = ResponseBatch::new(&rows).unwrap();
        let mask: Vec<f32> = batch
            .mask()
            .iter()
            .map(|&b| f32::from(u8::from(b)))
            .collect();
        let mask = Tensor::<2>::from_data(TensorData::new(mask, [2, 7]), &dev);
        let loss_of = |m: &Transformer| {
            let (lp, ent) = m.response_logprobs(&batch, true, 4).unwrap();
            ((lp + ent.unwrap() * 0.5) * mask.clone()).sum()
        };
        let loss = loss_of(&m);
        let grads = loss.backward();
        let g = read_f32(m.norm.val().grad(&grads).unwrap()).unwrap();
        let g_embed = m.embed.val().grad(&grads).unwrap();
        assert_eq!(g_embed.dims(), [64, 384]);
        // Central difference on three coordinates of the final norm gain (f64 accumulation of an
        // f32 loss: h = 1e-2 keeps rounding noise well below the tolerance).
        let base = read_f32(m.norm.val().inner()).unwrap();
        for &i in &[0usize, 17, 63] {
            let h = 1e-2f32;
            let eval = |delta: f32| {
                let mut w = base.clone();
                w[i] += delta;
                let mut m2 = m.clone();
                m2.norm = Param::from_tensor(Tensor::from_data(TensorData::new(w, [64]), &dev));
                read_f32(loss_of(&m2)).unwrap()[0] as f64
            };
            let fd = (eval(h) - eval(-h)) / (2.0 * h as f64);
            let an = g[i] as f64;
            assert!(
                (fd - an).abs() < 2e-3 * (1.0 + an.abs()),
                "coordinate {i}: finite difference {fd} vs autodiff {an}"
            );
        }
    }
}
