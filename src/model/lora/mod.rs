//! LoRA adapters in PEFT's format: trained beside frozen base weights, saved as
//! `adapter_config.json` + `adapter_model.safetensors`, merged into the base for sampling.
//!
//! A projection `y = x·W` with an adapter computes `y = x·W + s · drop(x)·A·B`, where `A` is
//! `[in, r]`, `B` is `[r, out]` and `s = lora_alpha / r` (`lora_alpha / √r` with rsLoRA): PEFT's
//! `lora_B(lora_A(dropout(x))) * scaling`. The module stores `A` and `B` transposed from PEFT's
//! `lora_A.weight` `[r, in]` and `lora_B.weight` `[out, r]`, as the base weights are stored
//! transposed from Hugging Face's `[out, in]` (see the transformer's design notes).
//!
//! Design decisions:
//! - **The adapter lives inside the [`Transformer`]** (an optional [`LayerLora`] per layer), so
//!   the training loop, gradient accumulation, clipping and the optimizer work unchanged: the
//!   base parameters are marked as not requiring gradients (burn's `no_grad`), so the autodiff
//!   graph keeps no base-weight gradient and the product kernels keep only what the adapter's
//!   gradient needs, and the optimizer, which steps only parameters that have a gradient, holds
//!   moments for the adapter alone.
//! - **Fused projections stay fused**: q/k/v and gate/up are one matrix each in the base; their
//!   adapters run per projection and are concatenated (zeros for a projection without one) and
//!   added to the fused output.
//! - **Sampling merges at load** (`W + s·B·A` on the host, before the module is built): decoding
//!   then runs the plain model through every fast path, at no cost per token.
//! - **Dropout** (`lora_dropout > 0`, training only) masks the adapter's input, PEFT's inverted
//!   dropout (kept values scaled by `1/(1−p)`), one independent mask per projection. The mask of a
//!   token is a hash of the seed, the optimizer step, the layer, the projection, the token's row
//!   (its ids) and its position in that row, so it does not depend on the batch or micro-batch
//!   the row lands in, nor on threads.
//! - **Initialisation** is PEFT's default: `A` kaiming-uniform with `a = √5` (uniform in
//!   ±1/√in), `B` zero, so a fresh adapter computes the base model exactly; seeded by `--seed`,
//!   the layer and the projection.
//! - Reading is strict: an adapter whose config asks for something this implementation does not
//!   compute (DoRA, biases, per-module ranks, layer subsets, extra saved modules) is refused by
//!   name, as are missing, unknown or mis-shaped tensors.
//!
//! Layout: this file holds the targets, the configuration, the module and its dropout;
//! [`peft`] reads and writes adapter folders (PEFT's two files, the recorded base);
//! [`merge`] folds an adapter into its base's tensors (`merge-lora`'s engine).
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use anyhow::{ensure, Context, Result};
use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor, TensorData};
use safetensors::Dtype;

use super::config::ModelConfig;
use super::transformer::Transformer;
use super::weights::{self, HostTensor};

/// The adapter's configuration file.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's weights file.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

pub mod merge;
pub mod peft;

pub use merge::{merge_into, merged_checkpoint, MergePlan};
pub use peft::{
    check_tensors, is_adapter_dir, normalize, read_adapter, read_checked, read_config,
    recorded_base, resolve, resolve_base, save_adapter, write_adapter_files,
};

// ---------------------------------------------------------------------------------------------
// Targets and configuration
// ---------------------------------------------------------------------------------------------

/// A projection an adapter can target, by its Hugging Face module name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    /// Every target, in layer order.
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// PEFT's (and the checkpoint's) module name: `q_proj`, …, `down_proj`.
    pub fn name(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// The submodule of a decoder layer it sits in.
    fn parent(self) -> &'static str {
        match self {
            Target::Q | Target::K | Target::V | Target::O => "self_attn",
            Target::Gate | Target::Up | Target::Down => "mlp",
        }
    }

    /// `(in, out)` features of the projection.
    pub fn shape(self, c: &ModelConfig) -> (usize, usize) {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let qd = c.num_attention_heads * c.head_dim;
        let kd = c.num_key_value_heads * c.head_dim;
        match self {
            Target::Q => (h, qd),
            Target::K | Target::V => (h, kd),
            Target::O => (qd, h),
            Target::Gate | Target::Up => (h, i),
            Target::Down => (i, h),
        }
    }

    /// The base weight's Hugging Face name in layer `l`.
    pub fn weight_name(self, l: usize) -> String {
        format!("model.layers.{l}.{}.{}.weight", self.parent(), self.name())
    }

    /// PEFT's names of `lora_A` and `lora_B` in layer `l`.
    pub fn peft_names(self, l: usize) -> (String, String) {
        let p = format!(
            "base_model.model.model.layers.{l}.{}.{}",
            self.parent(),
            self.name()
        );
        (format!("{p}.lora_A.weight"), format!("{p}.lora_B.weight"))
    }

    fn index(self) -> u64 {
        self as u64
    }
}

impl std::str::FromStr for Target {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        Target::ALL
            .into_iter()
            .find(|t| t.name() == s.trim())
            .with_context(|| {
                format!(
                    "unknown LoRA target `{s}` (expected some of q_proj, k_proj, v_proj, o_proj, \
                     gate_proj, up_proj, down_proj, or all-linear)"
                )
            })
    }
}

/// Parse a `--lora-target` list: comma-separated module names, or `all-linear` (all seven).
pub fn parse_targets(s: &str) -> Result<Vec<Target>> {
    if s.trim() == "all-linear" {
        return Ok(Target::ALL.to_vec());
    }
    let mut set = BTreeSet::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        set.insert(part.parse::<Target>()?);
    }
    ensure!(!set.is_empty(), "--lora-target names no module");
    Ok(set.into_iter().collect())
}

/// An adapter's configuration (the part of PEFT's `LoraConfig` this implementation computes).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    /// Rank r.
    pub r: usize,
    /// `lora_alpha`.
    pub alpha: f64,
    /// `lora_dropout` (training only).
    pub dropout: f64,
    /// Adapted projections (sorted, distinct).
    pub targets: Vec<Target>,
    /// rsLoRA scaling `alpha / √r` instead of `alpha / r`.
    pub rslora: bool,
    /// `base_model_name_or_path` as written: an absolute folder path in the adapters rlcr saves
    /// ([`recorded_base`]); possibly relative in others ([`resolve_base`] says how it is found).
    pub base: Option<String>,
}

impl LoraSpec {
    /// Check the ranges: r ≥ 1, alpha finite, dropout in [0, 1).
    pub fn validate(&self) -> Result<()> {
        ensure!(self.r >= 1, "--lora-rank must be at least 1");
        ensure!(
            self.alpha.is_finite(),
            "--lora-alpha must be finite, got {}",
            self.alpha
        );
        ensure!(
            (0.0..1.0).contains(&self.dropout),
            "--lora-dropout must be in [0, 1), got {}",
            self.dropout
        );
        ensure!(!self.targets.is_empty(), "--lora-target names no module");
        Ok(())
    }

    /// The factor `s` of the adapter's output.
    pub fn scaling(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }

    /// Every tensor of the adapter for model `c`: PEFT name and PEFT shape (`[r, in]`,
    /// `[out, r]`), layer by layer.
    pub fn expected_tensors(&self, c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        for l in 0..c.num_hidden_layers {
            for &t in &self.targets {
                let (i, o) = t.shape(c);
                let (a, b) = t.peft_names(l);
                out.push((a, vec![self.r, i]));
                out.push((b, vec![o, self.r]));
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// The module
// ---------------------------------------------------------------------------------------------

/// One adapted projection: `A` `[in, r]` and `B` `[r, out]` (PEFT's weights transposed).
#[derive(Module, Debug)]
pub struct LoraPair {
    pub a: Param<Tensor<2>>,
    pub b: Param<Tensor<2>>,
}

/// The adapters of one decoder layer (one optional pair per projection).
#[derive(Module, Debug)]
pub struct LayerLora {
    pub q_proj: Option<LoraPair>,
    pub k_proj: Option<LoraPair>,
    pub v_proj: Option<LoraPair>,
    pub o_proj: Option<LoraPair>,
    pub gate_proj: Option<LoraPair>,
    pub up_proj: Option<LoraPair>,
    pub down_proj: Option<LoraPair>,
    /// `s` of [`LoraSpec::scaling`].
    #[module(skip)]
    pub scaling: f64,
    /// Dropout probability on the adapter's input (training only).
    #[module(skip)]
    pub dropout: f64,
    /// The layer's index (keys the dropout masks).
    #[module(skip)]
    pub layer: usize,
}

impl LayerLora {
    fn get(&self, t: Target) -> Option<&LoraPair> {
        match t {
            Target::Q => self.q_proj.as_ref(),
            Target::K => self.k_proj.as_ref(),
            Target::V => self.v_proj.as_ref(),
            Target::O => self.o_proj.as_ref(),
            Target::Gate => self.gate_proj.as_ref(),
            Target::Up => self.up_proj.as_ref(),
            Target::Down => self.down_proj.as_ref(),
        }
    }

    fn slot(&mut self, t: Target) -> &mut Option<LoraPair> {
        match t {
            Target::Q => &mut self.q_proj,
            Target::K => &mut self.k_proj,
            Target::V => &mut self.v_proj,
            Target::O => &mut self.o_proj,
            Target::Gate => &mut self.gate_proj,
            Target::Up => &mut self.up_proj,
            Target::Down => &mut self.down_proj,
        }
    }

    /// `s · drop(x)·A·B` of projection `t`, or `None` when it has no adapter.
    fn delta(&self, t: Target, x: &Tensor<2>, drop: Option<&Dropout>) -> Option<Tensor<2>> {
        let p = self.get(t)?;
        let x = match drop {
            Some(d) if self.dropout > 0.0 => d.apply(x.clone(), self.layer, t, self.dropout),
            _ => x.clone(),
        };
        let xa = super::transformer::matmul(x, p.a.val(), None);
        let y = super::transformer::matmul(xa, p.b.val(), None);
        Some(y.mul_scalar(self.scaling))
    }

    /// `y + s·drop(x)·A·B` for projection `t` (`y` unchanged without an adapter).
    pub fn add(&self, y: Tensor<2>, x: &Tensor<2>, t: Target, drop: Option<&Dropout>) -> Tensor<2> {
        match self.delta(t, x, drop) {
            Some(d) => y + d,
            None => y,
        }
    }

    /// The adapters of a fused projection added to its output `y` `[N, Σ width]`: `parts` lists
    /// the projections and their output widths in column order.
    pub fn add_fused(
        &self,
        y: Tensor<2>,
        x: &Tensor<2>,
        parts: &[(Target, usize)],
        drop: Option<&Dropout>,
    ) -> Tensor<2> {
        if parts.iter().all(|(t, _)| self.get(*t).is_none()) {
            return y;
        }
        let n = x.dims()[0];
        let device = x.device();
        let cols: Vec<Tensor<2>> = parts
            .iter()
            .map(|&(t, w)| {
                self.delta(t, x, drop)
                    .unwrap_or_else(|| Tensor::zeros([n, w], &device))
            })
            .collect();
        y + Tensor::cat(cols, 1)
    }
}

/// Whether any layer of `model` carries an adapter.
pub fn has_adapter(model: &Transformer) -> bool {
    model.layers.iter().any(|l| l.lora.is_some())
}

/// Where the adapter's values come from when it is attached.
pub enum Init<'a> {
    /// PEFT's default: `A` kaiming-uniform (a = √5), `B` zero; seeded.
    Fresh { seed: u64 },
    /// Tensors read from an adapter folder (PEFT names, checked).
    From(&'a BTreeMap<String, HostTensor>),
}

/// Freeze every base parameter of `model` and attach a trainable adapter: afterwards only the
/// adapter's parameters require gradients.
pub fn attach(
    model: Transformer,
    c: &ModelConfig,
    spec: &LoraSpec,
    init: Init<'_>,
) -> Result<Transformer> {
    use rand::{Rng, SeedableRng};
    spec.validate()?;
    ensure!(
        !has_adapter(&model),
        "internal: the model already carries an adapter"
    );
    let device = model.device();
    let mut model = model.no_grad();
    let scaling = spec.scaling();
    for (l, layer) in model.layers.iter_mut().enumerate() {
        let mut lora = LayerLora {
            q_proj: None,
            k_proj: None,
            v_proj: None,
            o_proj: None,
            gate_proj: None,
            up_proj: None,
            down_proj: None,
            scaling,
            dropout: spec.dropout,
            layer: l,
        };
        for &t in &spec.targets {
            let (i, o) = t.shape(c);
            let r = spec.r;
            // Stored [in, r] and [r, out]: PEFT's [r, in] and [out, r] transposed.
            let (a, b) = match &init {
                Init::Fresh { seed } => {
                    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix(&[
                        *seed,
                        0x4c6f_5241,
                        l as u64,
                        t.index(),
                    ]));
                    let bound = 1.0 / (i as f32).sqrt();
                    let a: Vec<f32> = (0..r * i)
                        .map(|_| rng.random_range(-bound..bound))
                        .collect();
                    (weights::transpose(&a, r, i), vec![0f32; o * r])
                }
                Init::From(tensors) => {
                    let (an, bn) = t.peft_names(l);
                    let a = tensors.get(&an).with_context(|| format!("missing {an}"))?;
                    let b = tensors.get(&bn).with_context(|| format!("missing {bn}"))?;
                    (
                        weights::transpose(&a.data, r, i),
                        weights::transpose(&b.data, o, r),
                    )
                }
            };
            *lora.slot(t) = Some(LoraPair {
                a: param(a, [i, r], &device),
                b: param(b, [r, o], &device),
            });
        }
        layer.lora = Some(lora);
    }
    Ok(model)
}

fn param(data: Vec<f32>, shape: [usize; 2], device: &Device) -> Param<Tensor<2>> {
    Param::from_tensor(Tensor::from_data(TensorData::new(data, shape), device))
}

/// The adapter of `model` under PEFT's names and layouts (f32), layer by layer.
pub fn export(model: &Transformer) -> Result<Vec<(String, HostTensor)>> {
    let mut out = Vec::new();
    for (l, layer) in model.layers.iter().enumerate() {
        let Some(lora) = &layer.lora else { continue };
        for t in Target::ALL {
            let Some(p) = lora.get(t) else { continue };
            let [i, r] = p.a.val().dims();
            let [_, o] = p.b.val().dims();
            let a = super::read_f32(p.a.val().inner())?;
            let b = super::read_f32(p.b.val().inner())?;
            let (an, bn) = t.peft_names(l);
            let host = |data: Vec<f32>, shape: Vec<usize>| HostTensor {
                dtype: Dtype::F32,
                shape,
                data,
            };
            out.push((an, host(weights::transpose(&a, i, r), vec![r, i])));
            out.push((bn, host(weights::transpose(&b, r, o), vec![o, r])));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Dropout
// ---------------------------------------------------------------------------------------------

thread_local! {
    /// `(seed, optimizer step)` while a training step runs with adapter dropout.
    static DROPOUT: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// Turns adapter dropout on for the forward passes of this thread until dropped (restores the
/// previous setting).
pub struct DropoutScope(Option<(u64, u64)>);

/// Adapter dropout on for one training step: masks keyed by `seed` and `step`.
pub fn dropout_scope(seed: u64, step: u64) -> DropoutScope {
    DropoutScope(DROPOUT.with(|d| d.replace(Some((seed, step)))))
}

impl Drop for DropoutScope {
    fn drop(&mut self) {
        DROPOUT.with(|d| d.set(self.0));
    }
}

/// The dropout keys of one forward call: one key per slot (its row's ids and its position).
#[derive(Debug, Clone)]
pub struct Dropout {
    seed: u64,
    step: u64,
    slots: Vec<u64>,
}

impl Dropout {
    /// Keys for a batch of `batch × len` slots (`ids`, `valid` row-major), when a training step
    /// has dropout on and `model` has an adapter with dropout; else `None`.
    pub fn for_batch(
        model: &Transformer,
        batch: usize,
        len: usize,
        ids: &[u32],
        valid: &[bool],
    ) -> Option<Self> {
        let (seed, step) = DROPOUT.with(Cell::get)?;
        let any = model
            .layers
            .iter()
            .any(|l| l.lora.as_ref().is_some_and(|x| x.dropout > 0.0));
        if !any {
            return None;
        }
        let mut slots = vec![0u64; batch * len];
        for r in 0..batch {
            let row = r * len..(r + 1) * len;
            let mut fnv = crate::hash::Fnv64::default();
            for (&id, &ok) in ids[row.clone()].iter().zip(&valid[row.clone()]) {
                if ok {
                    fnv.update_word(u64::from(id));
                }
            }
            let h = fnv.finish();
            let mut pos = 0u64;
            for s in row {
                if valid[s] {
                    slots[s] = mix(&[h, pos]);
                    pos += 1;
                }
            }
        }
        Some(Dropout { seed, step, slots })
    }

    /// `x` `[N, in]` with each value zeroed with probability `p`, the rest scaled by `1/(1−p)`.
    fn apply(&self, x: Tensor<2>, layer: usize, t: Target, p: f64) -> Tensor<2> {
        let [n, f] = x.dims();
        if n != self.slots.len() {
            return x; // not this call's batch (cannot happen through `hidden`)
        }
        let salt = mix(&[self.seed, self.step, layer as u64, t.index()]);
        let keep = (1.0 / (1.0 - p)) as f32;
        let mut m = Vec::with_capacity(n * f);
        for &k in &self.slots {
            let base = mix(&[salt, k]);
            m.extend((0..f as u64).map(|j| {
                let u = (splitmix(base.wrapping_add(j)) >> 11) as f64 / (1u64 << 53) as f64;
                if u < p {
                    0.0
                } else {
                    keep
                }
            }));
        }
        let mask: Tensor<2> = super::transfer::upload(TensorData::new(m, [n, f]), &x.device());
        x * mask
    }
}

use crate::hash::splitmix64 as splitmix;

fn mix(parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(0x6a09_e667_f3bc_c908, |h, &p| splitmix(h ^ p))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::Value;

    use super::*;

    /// Adapters PEFT wrote (random non-zero B; all seven targets on the Llama fixture, three
    /// with rsLoRA on the Qwen2 one) give PEFT's float64 log-probs within 1e-4, merged at load
    /// (sampling) and kept separate on an autodiff device (training).
    #[test]
    fn peft_written_adapters_give_peft_figures() {
        use crate::model::{AdapterUse, Model};
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        for name in ["tiny-llama-peft", "tiny-qwen2-peft"] {
            let dir = root.join("lora").join(name);
            let refs: Value = serde_json::from_str(
                &std::fs::read_to_string(root.join("lora").join(format!("{name}.f64.json")))
                    .unwrap(),
            )
            .unwrap();
            let mut seqs: Vec<Vec<u32>> = Vec::new();
            let mut want: Vec<Vec<f64>> = Vec::new();
            for s in refs["sequences"].as_array().unwrap() {
                seqs.push(serde_json::from_value(s["input_ids"].clone()).unwrap());
                want.push(serde_json::from_value(s["logprobs"].clone()).unwrap());
            }
            let rows: Vec<(&[u32], &[u32])> = seqs.iter().map(|s| (&s[..1], &s[1..])).collect();
            let base = Model::load(&root.join(&name[..name.len() - 5]), &Device::flex()).unwrap();
            let merged = Model::load(&dir, &Device::flex()).unwrap();
            assert!(merged.adapter.as_ref().unwrap().merged);
            let train =
                Model::open(&dir, None, &Device::flex().autodiff(), AdapterUse::Train).unwrap();
            assert!(has_adapter(&train.transformer));
            let inner = train.transformer.valid();
            let lp = |m: &Transformer| super::super::logprobs(m, &rows, 2, false, None).unwrap();
            let (b, m, t) = (lp(&base.transformer), lp(&merged.transformer), lp(&inner));
            let (mut gap_m, mut gap_t, mut moved) = (0f64, 0f64, 0f64);
            for (j, w) in want.iter().enumerate() {
                for (k, &w) in w.iter().enumerate() {
                    gap_m = gap_m.max((m.logprobs[j][k] as f64 - w).abs());
                    gap_t = gap_t.max((t.logprobs[j][k] as f64 - w).abs());
                    moved = moved.max((b.logprobs[j][k] as f64 - w).abs());
                }
            }
            eprintln!(
                "{name}: merged {gap_m:.2e}, separate {gap_t:.2e}, adapter moves {moved:.2e}"
            );
            assert!(gap_m < 1e-4 && gap_t < 1e-4, "{name}: {gap_m} / {gap_t}");
            assert!(
                moved > 1e-2,
                "{name}: the adapter changes nothing ({moved})"
            );
            // Exported back under PEFT's names, the tensors are the file's bit for bit.
            let (_, file) = read_adapter(&dir).unwrap();
            let back = export(&train.transformer).unwrap();
            assert_eq!(back.len(), file.len());
            for (n, t) in back {
                assert_eq!(file[&n].data, t.data, "{n}");
            }
        }
    }

    /// The adapter's gradient equals torch + PEFT's (float64, committed by `scripts/peft_lora.py
    /// grad-fixture`): L = −Σ log p over the fixture's sequences, with respect to lora_A and
    /// lora_B of three projections of the PEFT-written Llama adapter.
    #[test]
    fn adapter_gradient_matches_torch_and_peft() {
        use crate::model::{AdapterUse, Model, ResponseBatch};
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lora");
        let want: Value = serde_json::from_str(
            &std::fs::read_to_string(root.join("tiny-llama-peft.grad.f64.json")).unwrap(),
        )
        .unwrap();
        let refs: Value = serde_json::from_str(
            &std::fs::read_to_string(root.join("tiny-llama-peft.f64.json")).unwrap(),
        )
        .unwrap();
        let seqs: Vec<Vec<u32>> = refs["sequences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| serde_json::from_value(s["input_ids"].clone()).unwrap())
            .collect();
        let dev = Device::flex().autodiff();
        let m = Model::open(&root.join("tiny-llama-peft"), None, &dev, AdapterUse::Train)
            .unwrap()
            .transformer;
        let rows: Vec<(&[u32], &[u32])> = seqs.iter().map(|s| (&s[..1], &s[1..])).collect();
        let batch = ResponseBatch::new(&rows).unwrap();
        let (lp, _) = m.response_logprobs(&batch, false, 256).unwrap();
        let mask: Vec<f32> = batch
            .mask()
            .iter()
            .map(|&b| f32::from(u8::from(b)))
            .collect();
        let [b, r] = lp.dims();
        let mask = Tensor::<2>::from_data(TensorData::new(mask, [b, r]), &dev);
        let loss = (lp * mask).sum().neg();
        let got_loss = super::super::read_f32(loss.clone()).unwrap()[0] as f64;
        let grads = loss.backward();
        let w_loss = want["loss"].as_f64().unwrap();
        assert!(
            (got_loss - w_loss).abs() < 1e-4 * w_loss.abs(),
            "{got_loss} vs {w_loss}"
        );
        let mut checked = 0;
        for (l, t) in [(0, Target::Q), (1, Target::Gate), (1, Target::Down)] {
            let p = m.layers[l].lora.as_ref().unwrap().get(t).unwrap();
            let (an, bn) = t.peft_names(l);
            for (name, param) in [(an, &p.a), (bn, &p.b)] {
                let g = param.val().grad(&grads).unwrap();
                let [rows_, cols] = g.dims();
                let g = super::super::read_f32(g).unwrap();
                // Stored transposed from PEFT's layout.
                let g = weights::transpose(&g, rows_, cols);
                let w: Vec<f64> =
                    serde_json::from_value(want["grads"][&name]["values"].clone()).unwrap();
                assert_eq!(g.len(), w.len(), "{name}");
                let scale = w.iter().fold(0f64, |a, x| a.max(x.abs()));
                let err = g
                    .iter()
                    .zip(&w)
                    .fold(0f64, |a, (x, y)| a.max((*x as f64 - y).abs()));
                eprintln!("{name}: max |Δ| {err:.2e} of max |g| {scale:.2e}");
                assert!(scale > 1e-3, "{name}: vanishing gradient");
                assert!(err <= 1e-4 * scale, "{name}: {err} of {scale}");
                checked += 1;
            }
        }
        assert_eq!(checked, 6);
    }

    /// Training an adapter: gradients exist for the adapter's tensors only; they do not depend
    /// on the micro-batch size (also with dropout, whose masks are keyed by row content) nor on
    /// activation checkpointing; dropout changes them and is deterministic; an AdamW step keeps
    /// state for the adapter alone and leaves the base weights bit-identical.
    #[test]
    fn adapter_gradients_ignore_micro_batches_and_checkpointing() {
        use crate::model::{AdapterUse, Model};
        use crate::train::loss::LossAgg;
        use crate::train::optim::{AdamW, AdamWConfig};
        use crate::train::trainer::tests::{config, max_abs_diff as diff, rows};
        use crate::train::trainer::{batch_gradients, grads_to_host};
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lora/tiny-qwen2-peft");
        let mut m = Model::open(&dir, None, &Device::flex().autodiff(), AdapterUse::Train)
            .unwrap()
            .transformer;
        let data = rows(&m, 6, 3, 0.2);
        let refs: Vec<_> = data.iter().collect();
        let grads = |m: &Transformer, micro: usize, ckpt: bool| {
            let mut cfg = config(LossAgg::TokenMean, micro);
            cfg.checkpoint_activations = ckpt;
            let (g, _) = batch_gradients(m, &refs, &cfg).unwrap();
            grads_to_host(m, &g)
        };
        for p in [0.0, 0.3] {
            for l in m.layers.iter_mut() {
                l.lora.as_mut().unwrap().dropout = p;
            }
            let _scope = dropout_scope(5, 1);
            let full = grads(&m, 6, false);
            let names: Vec<&str> = full.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(full.len(), 2 * 3 * 2, "{names:?}");
            assert!(names.iter().all(|n| n.contains(".lora.")), "{names:?}");
            let (d, s) = diff(&full, &grads(&m, 1, false));
            assert!(
                s > 1e-4 && d <= 1e-5 * s.max(1.0),
                "p {p}: micro-batches {d} of {s}"
            );
            let (d, _) = diff(&full, &grads(&m, 2, true));
            assert!(d <= 1e-5 * s.max(1.0), "p {p}: checkpointing {d} of {s}");
            let (d, _) = diff(&full, &grads(&m, 6, false));
            assert_eq!(d, 0.0, "p {p}: not deterministic");
            drop(_scope);
            let (d, _) = diff(&full, &grads(&m, 6, false));
            if p > 0.0 {
                assert!(d > 1e-3 * s, "dropout changed nothing ({d} of {s})");
            } else {
                assert_eq!(d, 0.0);
            }
        }
        // One AdamW step: moments for the adapter only, base weights unchanged.
        let cfg = config(LossAgg::TokenMean, 6);
        let (g, _) = batch_gradients(&m, &refs, &cfg).unwrap();
        let base_before = super::super::read_f32(m.layers[0].attn.qkv.val().inner()).unwrap();
        let q_b = |m: &Transformer| {
            let lora = m.layers[0].lora.as_ref().unwrap();
            super::super::read_f32(lora.q_proj.as_ref().unwrap().b.val().inner()).unwrap()
        };
        let b_before = q_b(&m);
        let mut opt = AdamW::new(AdamWConfig::default());
        let m2 = opt.step(m, g, 1e-2, 1.0);
        assert_eq!(opt.len(), 2 * 3 * 2);
        let base_after = super::super::read_f32(m2.layers[0].attn.qkv.val().inner()).unwrap();
        assert!(base_before == base_after, "a frozen weight moved");
        let b_after = q_b(&m2);
        assert!(b_before != b_after, "the adapter did not move");
    }

    #[test]
    fn dropout_masks_are_keyed_by_row_content_and_position() {
        // The same row alone or second in a batch (with left padding) gets the same keys.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-llama");
        let c = ModelConfig::load(&dir).unwrap();
        let (t, _) = weights::load(&c, &dir, &Device::flex()).unwrap();
        let spec = LoraSpec {
            r: 2,
            alpha: 8.0,
            dropout: 0.1,
            targets: vec![Target::Q],
            rslora: false,
            base: None,
        };
        let m = attach(t, &c, &spec, Init::Fresh { seed: 0 }).unwrap();
        let _s = dropout_scope(7, 3);
        let a = Dropout::for_batch(&m, 1, 3, &[5, 6, 7], &[true; 3]).unwrap();
        let b = Dropout::for_batch(
            &m,
            2,
            4,
            &[1, 2, 3, 4, 0, 5, 6, 7],
            &[true, true, true, true, false, true, true, true],
        )
        .unwrap();
        assert_eq!(a.slots[..], b.slots[5..]);
        assert_ne!(a.slots[0], a.slots[1]);
        drop(_s);
        assert!(Dropout::for_batch(&m, 1, 3, &[5, 6, 7], &[true; 3]).is_none());
    }

    /// An adapter trained beside a frozen base held in bf16 (a bf16 checkpoint) gets the bits of
    /// the gradients beside the same base held in f32, in f32 and bf16 products, with and without
    /// activation checkpointing: the products read the bf16 weights in place (forward and the
    /// backward's `dy · Wᵀ`) and widen them exactly.
    #[test]
    fn frozen_bf16_base_gives_the_f32_base_gradients() {
        use crate::model::sgemm::Precision;
        use crate::model::weights::Storage;
        use crate::train::loss::LossAgg;
        use crate::train::trainer::tests::{config, rows};
        use crate::train::trainer::{batch_gradients, grads_to_host};
        use burn::tensor::DType;
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let base = root.join("tiny-qwen2-bf16");
        let (spec, at) = read_adapter(&root.join("lora/tiny-qwen2-peft")).unwrap();
        let mc = ModelConfig::load(&base).unwrap();
        let dev = Device::flex().autodiff();
        let build = |storage| {
            let (t, _) = weights::load_with(&mc, &base, &dev, storage).unwrap();
            attach(t, &mc, &spec, Init::From(&at)).unwrap()
        };
        let (held, wide) = (build(Storage::AsStored), build(Storage::F32));
        assert_eq!(held.layers[0].attn.qkv.val().dtype(), DType::BF16);
        assert_eq!(held.embed.val().dtype(), DType::BF16);
        assert_eq!(wide.layers[0].attn.qkv.val().dtype(), DType::F32);
        let data = rows(&wide, 6, 3, 0.2);
        let refs: Vec<_> = data.iter().collect();
        for precision in [Precision::F32, Precision::Bf16] {
            for ckpt in [false, true] {
                let mut cfg = config(LossAgg::TokenMean, 3);
                cfg.precision = precision;
                cfg.checkpoint_activations = ckpt;
                let g =
                    |m: &Transformer| grads_to_host(m, &batch_gradients(m, &refs, &cfg).unwrap().0);
                let (a, b) = (g(&held), g(&wide));
                assert_eq!(a.len(), 2 * 3 * 2);
                let mut largest = 0f32;
                for ((na, va), (nb, vb)) in a.iter().zip(&b) {
                    assert_eq!(na, nb);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(va), bits(vb), "{na}: {precision:?} ckpt {ckpt}");
                    largest = va.iter().fold(largest, |m, x| m.max(x.abs()));
                }
                assert!(largest > 1e-4, "vanishing gradients ({largest})");
            }
        }
    }
}
