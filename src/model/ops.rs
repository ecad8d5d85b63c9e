//! The model's operations, and the one place that asks which backend a tensor lives on.
//!
//! The transformer reads top to bottom through these functions (products, RMSNorm, SwiGLU, RoPE,
//! attention over fresh keys or the cache, the LM head's log-probs) and the sampler draws
//! through [`draw`]; none of them names a device. Each one here picks the backend's code:
//!
//! | op | CPU (Flex, plain or autodiff) | GPU (wgpu, CUDA) |
//! |---|---|---|
//! | [`matmul`] | packed / small decode kernels, then rlcr's GEMM ([`cpu::sgemm`]) | burn's matmul, split into exact bf16 parts where f32 would run in TF32 ([`split_f32`]) |
//! | [`rms_norm`], [`add_rms_norm`] | fused row kernels ([`cpu::fused`]) | one `#[cube]` kernel ([`gpu::norm`]; when training, with a backward of two kernels, the residual sum's gradient handed to both terms) |
//! | [`swiglu`] | fused row kernel ([`cpu::fused`]) | one `#[cube]` kernel ([`gpu::swiglu`]; when training, with a backward of one kernel) |
//! | [`Rope`] | the fused rotate-half op | one `#[cube]` kernel ([`gpu::rope`]; when training, with a backward of one kernel) |
//! | [`rope_cache_write`], [`slot_attention`] (calls through a cache) | [`Rope`], burn's `slice_assign`, [`cached_attention`] | one `#[cube]` kernel each, at positions and slot flags held on the device ([`gpu::rope`], [`gpu::attention`]) |
//! | [`qkv_attention`] (a call's own keys, from the q/k/v product) | `None`: RoPE, the split and [`attention`] | RoPE into one head-major tensor, then one `#[cube]` kernel reading q, k and v out of it ([`gpu::attention`]; when training, backward kernels writing one gradient) |
//! | [`attention`], [`cached_attention`] | rlcr's attention and decode attention kernels | one `#[cube]` kernel ([`gpu::attention`]; when training, with a backward of two kernels; past its key limit the nine-kernel composite, [`backend::composite_attention`]) |
//! | [`head_logprob_entropy`] (the LM head with [`logprob_entropy`]) | the product, then the fused LM head ([`cpu::head`]) | chunks of tokens, a product and one `#[cube]` kernel each, with a `Backward` that recomputes the chunk ([`gpu::head`]) |
//! | [`draw`] | burn ops ([`backend::draw`]) | one `#[cube]` kernel per step ([`gpu::draw`]) |
//!
//! Each CPU kernel returns `None` where it does not apply (a switch off, another dtype, a CPU
//! without AVX2), and burn's composite runs instead; on the GPUs no CPU kernel is tried.
use anyhow::Result;
use burn::tensor::module::attention as burn_attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use super::backend::{self, cpu, gpu};
use super::cache::SlotStep;
use super::transfer::upload;

pub use super::backend::cpu::decode::PackedMatrix;

/// Whether `device` is the CPU (burn's Flex backend, plain or autodiff), where rlcr's CPU
/// kernels apply.
pub fn on_host(device: &Device) -> bool {
    device.clone().inner() == Device::flex()
}

/// Whether `device` is the plain (non-autodiff) CPU device.
fn plain_host(device: &Device) -> bool {
    *device == Device::flex()
}

/// Whether decode steps on `device` use the host's decode paths: weights packed into panels on
/// the first cached step ([`PackedMatrix`]) and attention over the cache from a per-row list of
/// visible slots ([`cached_attention`]'s `decode_keys`). The plain CPU device only.
pub fn host_decode(device: &Device) -> bool {
    plain_host(device)
}

/// Whether the sampler draws on `device` ([`draw`]) rather than reading the logits to the host:
/// every device but the plain CPU, where the host sampler is the reference and reading the
/// logits costs nothing.
pub fn draws_on_device(device: &Device) -> bool {
    !plain_host(device)
}

/// The longest run of elements one thread adds in [`sum`] on a GPU.
const SUM_ROW: usize = 4096;

/// `Σ t`, one element, added in the same order every run on every backend.
///
/// On the CPU it is burn's sum. On a GPU burn's `Tensor::sum` adds its cubes' partial sums with
/// atomics wherever the device has float atomic adds (CUDA, and lavapipe), so its last bits
/// depend on which cube finishes first, and a loss or gradient norm would differ between two
/// runs of the same step. Here the elements are added as rows of at most [`SUM_ROW`] (the
/// largest divisor of the count up to it; one thread a row, in order), then the rows' sums in
/// order: two reductions, the same bits every run.
pub fn sum<const D: usize>(t: Tensor<D>) -> Tensor<1> {
    if on_host(&t.device()) {
        return t.sum();
    }
    let n = t.shape().num_elements();
    if n == 0 {
        return Tensor::zeros([1], &t.device());
    }
    let cols = (1..=n.min(SUM_ROW))
        .rev()
        .find(|&c| n.is_multiple_of(c))
        .unwrap_or(1);
    let rows = n / cols;
    t.reshape([rows, cols])
        .sum_dim(1)
        .reshape([1, rows])
        .sum_dim(1)
        .reshape([1])
}

/// Whether the sampler records its decode step on `device` once per batch width and replays it
/// ([`super::graph`]; `RLCR_CUDA_GRAPH`): `auto` on a CUDA device (a process opens one device,
/// so "a CUDA device was opened and `device` is not the CPU" identifies it), `on` on any GPU
/// device (wgpu's software graph), never on the CPU (no launches to save).
pub fn replays_decode(device: &Device) -> bool {
    use crate::switches::CudaGraph;
    if plain_host(device) {
        return false;
    }
    match crate::switches::get().cuda_graph {
        CudaGraph::Off => false,
        CudaGraph::Auto => backend::cuda_opened(),
        CudaGraph::On => true,
    }
}

/// Whether burn's f32 products on `device` (plain or autodiff) are split products
/// ([`backend::split_matmul`]): with `RLCR_GPU_F32=auto` (the default) on a CUDA device, whose
/// f32 matmul runs in TF32 (a process opens one device, so "a CUDA device was opened and `device`
/// is not the CPU" identifies it); with `split` on any device with a bf16 type (CUDA; the CPU,
/// where rlcr's own kernels take the products unless `RLCR_GEMM=burn`). wgpu has no bf16 type to
/// split through, and no TF32 to correct.
pub(crate) fn split_f32(device: &Device) -> bool {
    use crate::switches::GpuF32;
    match crate::switches::get().gpu_f32 {
        GpuF32::Fast => false,
        GpuF32::Auto => backend::cuda_opened() && !on_host(device),
        GpuF32::Split => {
            on_host(device)
                || device
                    .clone()
                    .inner()
                    .supports_dtype(burn::tensor::DType::BF16)
        }
    }
}

/// `x · W`. On the plain CPU: the packed copy `packed` of `W` if given, else the row-major decode
/// kernel, for decode-shaped products ([`cpu::decode`]); then rlcr's blocked GEMM
/// ([`cpu::sgemm`]: prefill, and training on `Autodiff<Flex>` as a custom autodiff op); then
/// burn's matmul. On a GPU: burn's matmul ([`backend::burn_matmul`]), with no host round trip.
/// All of rlcr's kernels sum each output in the order of K from zero, so decode, prefill and
/// training give the same bits for a row whatever the batch.
pub(crate) fn matmul(x: Tensor<2>, w: Tensor<2>, packed: Option<&PackedMatrix>) -> Tensor<2> {
    let device = x.device();
    if !on_host(&device) {
        return backend::burn_matmul(x, w, split_f32(&device));
    }
    if plain_host(&device) {
        if let Some(y) = packed.and_then(|p| cpu::decode::packed_matmul(&x, &w, p)) {
            return y;
        }
        if let Some(y) = cpu::decode::small_matmul(&x, &w) {
            return y;
        }
    }
    cpu::sgemm::matmul(&x, &w).unwrap_or_else(|| backend::burn_matmul(x, w, split_f32(&device)))
}

/// HF's RMSNorm, `w · x / sqrt(mean(x²) + eps)` over the last axis of `x: [N, h]`: rlcr's fused
/// row kernel on the CPU; on a GPU one `#[cube]` kernel ([`gpu::norm`]; on autodiff tensors
/// with a backward of two kernels).
pub(crate) fn rms_norm(x: Tensor<2>, w: Tensor<1>, eps: f64) -> Tensor<2> {
    if on_host(&x.device()) {
        return cpu::fused::rms_norm(x, w, eps);
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(y) = gpu::norm::rms_norm(&x, &w, eps) {
        return y;
    }
    gpu::rms_norm(x, w, eps)
}

/// The residual add and the next RMSNorm: `(s, rms_norm(s))` for `s = x + a` (one kernel on a GPU,
/// [`gpu::norm::add_rms_norm`], the norm's backward kernels on autodiff tensors).
pub(crate) fn add_rms_norm(
    x: Tensor<2>,
    a: Tensor<2>,
    w: Tensor<1>,
    eps: f64,
) -> (Tensor<2>, Tensor<2>) {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if !on_host(&x.device()) {
        if let Some(pair) = gpu::norm::add_rms_norm(&x, &a, &w, eps) {
            return pair;
        }
    }
    let s = x + a;
    let y = rms_norm(s.clone(), w, eps);
    (s, y)
}

/// `silu(gate) · up` for `gu = [gate | up]: [N, 2I]`, `silu(g) = g · sigmoid(g)` as torch's:
/// `[N, I]`. On a GPU one `#[cube]` kernel ([`gpu::swiglu`]), with a backward kernel of its own
/// on autodiff tensors.
pub(crate) fn swiglu(gu: Tensor<2>) -> Tensor<2> {
    if on_host(&gu.device()) {
        return cpu::fused::swiglu(gu);
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(y) = gpu::swiglu::swiglu(&gu) {
        return y;
    }
    gpu::swiglu(gu)
}

/// cos and sin of the RoPE angles for every slot of a batch, in the layout the device's RoPE
/// reads.
pub(crate) struct Rope {
    cos: Tensor<4>,
    sin: Tensor<4>,
    /// On a GPU: the index that swaps the two halves of the last axis
    /// ([`gpu::rope_swap_index`]); `cos` is then `[c, c]` and `sin` `[−s, s]` over the whole head
    /// dimension.
    swap: Option<Tensor<1, Int>>,
}

impl Rope {
    /// `positions` is `[B·T]` row-major. Angles are `f32(position) · inv_freq` rounded to f32, as
    /// transformers' f32 outer product; cos/sin are evaluated in f64 and rounded once. On the CPU
    /// the tables are `[B, 1, T, d/2]` (the fused op and the composite read them so); on a GPU
    /// they span the head dimension, `[c, c]` and `[−s, s]`, for [`gpu::rope`]'s kernel (and the
    /// composite's four where it does not apply).
    pub(crate) fn new(
        inv_freq: &[f32],
        positions: &[usize],
        batch: usize,
        len: usize,
        device: &Device,
    ) -> Self {
        let half = inv_freq.len();
        let gpu = !on_host(device);
        let width = if gpu { 2 * half } else { half };
        let mut cos = Vec::with_capacity(positions.len() * width);
        let mut sin = Vec::with_capacity(positions.len() * width);
        for &p in positions {
            let start = cos.len();
            for (c, s) in rope_angles(inv_freq, p) {
                cos.push(c);
                sin.push(s);
            }
            if gpu {
                cos.extend_from_within(start..start + half);
                sin.extend_from_within(start..start + half);
                sin[start..start + half].iter_mut().for_each(|v| *v = -*v);
            }
        }
        let shape = [batch, 1, len, width];
        Rope {
            cos: upload(TensorData::new(cos, shape), device),
            sin: upload(TensorData::new(sin, shape), device),
            swap: gpu.then(|| gpu::rope_swap_index(2 * half, device)),
        }
    }

    /// The same tables off the autodiff graph (the plain device's tensors).
    pub(crate) fn inner(&self) -> Rope {
        let device = self.cos.device().inner();
        Rope {
            cos: self.cos.clone().inner(),
            sin: self.sin.clone().inner(),
            swap: self.swap.as_ref().map(|t| {
                let [d] = t.dims();
                gpu::rope_swap_index(d, &device)
            }),
        }
    }

    /// HF's `x·cos + rotate_half(x)·sin` on `[B, n, T, d]`, where `rotate_half(x) = cat(-x₂, x₁)`:
    /// first half `x₁·c − x₂·s`, second half `x₂·c + x₁·s`: two products and a sum on every
    /// device (bitwise the same roundings, except where a GPU compiler fuses a product into the
    /// sum in the kernel).
    pub(crate) fn apply(&self, x: Tensor<4>) -> Tensor<4> {
        match &self.swap {
            Some(swap) => {
                #[cfg(any(feature = "wgpu", feature = "cuda"))]
                if let Some(y) = gpu::rope::rope(&x, &self.cos, &self.sin) {
                    return y;
                }
                gpu::rope(x, &self.cos, &self.sin, swap)
            }
            None => cpu::fused::rope(x, &self.cos, &self.sin),
        }
    }
}

/// cos and sin of the RoPE angles of position `p`: `f32(p) · inv_freq` rounded to f32, as
/// transformers' f32 outer product, then evaluated in f64 and rounded once.
fn rope_angles(inv_freq: &[f32], p: usize) -> impl Iterator<Item = (f32, f32)> + '_ {
    inv_freq.iter().map(move |&f| {
        let angle = (p as f32 * f) as f64;
        (angle.cos() as f32, angle.sin() as f32)
    })
}

/// Whether caches on `device` describe their slots on the device for the GPU kernels
/// ([`super::cache::SlotStep`]): plain (non-autodiff) tensors on a GPU, heads of even size.
pub(crate) fn slot_kernels(device: &Device, head_dim: usize) -> bool {
    cfg!(any(feature = "wgpu", feature = "cuda"))
        && !on_host(device)
        && device.clone().inner() == *device
        && head_dim.is_multiple_of(2)
}

/// A RoPE table on `device` covering positions `0..len` at least, `[n, d]` with `n ≥ len`: each
/// row the cos of the position's `d/2` angles, then their sin (as [`Rope::new`] computes them);
/// the GPU's cache-write kernel looks positions up in it. One table per device and frequencies
/// for the process, read-only, shared by every cache: it is uploaded when a longer one is first
/// needed (at least 4,096 positions, then powers of two), so neither a step nor a new cache
/// uploads it again.
pub(crate) fn rope_table(inv_freq: &[f32], len: usize, device: &Device) -> Tensor<2> {
    type Cache = Vec<(Device, Vec<f32>, Tensor<2>)>;
    static CACHE: std::sync::Mutex<Cache> = std::sync::Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let known = cache
        .iter()
        .position(|(dev, f, _)| dev == device && f == inv_freq);
    if let Some(t) = known.map(|i| &cache[i].2).filter(|t| t.dims()[0] >= len) {
        return t.clone();
    }
    let n = len.max(4096).next_power_of_two();
    let half = inv_freq.len();
    let mut t = vec![0f32; n * 2 * half];
    for (p, row) in t.chunks_exact_mut(2 * half).enumerate() {
        for (f, (c, s)) in rope_angles(inv_freq, p).enumerate() {
            row[f] = c;
            row[half + f] = s;
        }
    }
    let table: Tensor<2> = upload(TensorData::new(t, [n, 2 * half]), device);
    match known {
        Some(i) => cache[i].2 = table.clone(),
        None => cache.push((device.clone(), inv_freq.to_vec(), table.clone())),
    }
    table
}

/// RoPE and the cache write of a call through a cache whose slots the device describes
/// (`slots`), in one kernel on a GPU ([`gpu::rope::rope_cache_write`]): `qkv: [B, T, H + 2K, d]`
/// (the fused product; `bias`, `[(H + 2K)·d]`, added first when given) is rotated at the
/// positions of `slots.info`, its keys and values written into `kc`, `vc` in place at the call's
/// slots, their flags set, and the `heads` rotated queries returned in attention's grouped
/// layout, `[B, K, g·T, d]`. `None` where the kernel does not apply (nothing written).
pub(crate) fn rope_cache_write(
    qkv: &Tensor<4>,
    bias: Option<Tensor<1>>,
    heads: usize,
    kc: &mut Tensor<4>,
    vc: &mut Tensor<4>,
    slots: &SlotStep,
) -> Option<Tensor<4>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if !on_host(&qkv.device()) {
        let mut flags = slots.flags.borrow_mut();
        return gpu::rope::rope_cache_write(
            qkv,
            bias.as_ref(),
            heads,
            &slots.table,
            &slots.info,
            kc,
            vc,
            &mut flags,
        );
    }
    let _ = (qkv, bias, heads, kc, vc, slots);
    None
}

/// Attention of the queries `q: [B, K, g·T, d]` that [`rope_cache_write`] wrote over the cache
/// `kc`, `vc`, each query seeing the slots the device flags mark real up to its own (a padding
/// query only itself): one kernel on a GPU ([`gpu::attention::slot_attention`]), else
/// [`device_attention`] with `mask()`. `t` tokens a row; returns `[B·T, H·d]`, rows in token
/// order.
pub(crate) fn slot_attention(
    q: Tensor<4>,
    kc: &Tensor<4>,
    vc: &Tensor<4>,
    slots: &SlotStep,
    t: usize,
    mask: impl FnOnce() -> Tensor<4, Bool>,
    options: AttentionModuleOptions,
) -> Tensor<2> {
    let [b, k, rows, d] = q.dims();
    let heads = k * rows / t;
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if !on_host(&q.device()) {
        let flags = slots.flags.borrow();
        let scale = scale(&q, &options);
        if let Some(out) = gpu::attention::slot_attention(&q, kc, vc, &flags, &slots.info, t, scale)
        {
            return out.reshape([b * t, heads * d]);
        }
    }
    let _ = slots;
    device_attention(q, kc.clone(), vc.clone(), &mask(), options)
        .reshape([b, heads, t, d])
        .swap_dims(1, 2)
        .reshape([b * t, heads * d])
}

/// Masked attention over this call's own keys (`mask`: true = hidden, `[B, 1, R, S]`;
/// `mask_host` the same on the host, `[B, R, S]`).
pub(crate) fn attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: &Tensor<4, Bool>,
    mask_host: &[bool],
    options: AttentionModuleOptions,
) -> Tensor<4> {
    if on_host(&q.device()) {
        if let Some(out) = cpu::attention::attention(&q, &k, &v, mask_host, scale(&q, &options)) {
            return out;
        }
    }
    device_attention(q, k, v, mask, options)
}

/// Attention over this call's own keys straight from the q/k/v product (`qkv: [B, T, H + 2K,
/// d]`, the `heads` query heads first) with RoPE on the queries and keys: `[B·T, H·d]`, the
/// output projection's input. On a GPU two kernels ([`gpu::attention::qkv_attention`]: RoPE
/// into one head-major tensor, attention reading q, k and v out of it), in place of RoPE, the
/// split and [`attention`] with the layout copies between them (and on autodiff tensors the
/// split's backward). `None` where it does not apply (the CPU, other dtypes, rows past the
/// kernel's key limit): the caller rotates, splits and calls [`attention`].
pub(crate) fn qkv_attention(
    qkv: &Tensor<4>,
    rope: &Rope,
    heads: usize,
    mask: &Tensor<4, Bool>,
    options: &AttentionModuleOptions,
) -> Option<Tensor<2>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if !on_host(&qkv.device()) && rope.swap.is_some() {
        let [b, t, _, d] = qkv.dims();
        let scale = options.scale.unwrap_or(1.0 / (d as f64).sqrt()) as f32;
        let out = gpu::attention::qkv_attention(qkv, &rope.cos, &rope.sin, heads, mask, scale)?;
        return Some(out.reshape([b * t, heads * d]));
    }
    let _ = (qkv, rope, heads, mask, options);
    None
}

/// Masked attention over the cache buffers `kc`, `vc` (`[B, K, capacity, d]`) for a call of `t`
/// tokens per row written at `start`. `decode_keys` (decode steps on the host,
/// [`host_decode`]): which of the first `start + 1` slots each row may attend to.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cached_attention(
    q: Tensor<4>,
    kc: &Tensor<4>,
    vc: &Tensor<4>,
    start: usize,
    t: usize,
    decode_keys: Option<&[bool]>,
    mask: &Tensor<4, Bool>,
    mask_host: &[bool],
    options: AttentionModuleOptions,
) -> Tensor<4> {
    if on_host(&q.device()) {
        let scale = scale(&q, &options);
        let fast = match decode_keys {
            Some(ok) if t == 1 => cpu::decode::decode_attention(&q, kc, vc, start + 1, ok, scale),
            _ => cpu::attention::attention(&q, kc, vc, mask_host, scale),
        };
        if let Some(out) = fast {
            return out;
        }
    }
    device_attention(q, kc.clone(), vc.clone(), mask, options)
}

/// The attention scale: `options.scale`, or `1/√d`.
fn scale(q: &Tensor<4>, options: &AttentionModuleOptions) -> f32 {
    let d = q.dims()[3];
    options.scale.unwrap_or(1.0 / (d as f64).sqrt()) as f32
}

/// Attention off the CPU kernels: on a GPU one kernel ([`gpu::attention`], with a backward of
/// its own on autodiff tensors); on the CPU (reached only with `RLCR_ATTENTION=burn` or
/// `RLCR_GEMM=burn`) burn's attention, as named; with split f32 products ([`split_f32`], f32
/// precision) or on a GPU past the kernel's key limit, the composite
/// ([`backend::composite_attention`]).
fn device_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: &Tensor<4, Bool>,
    options: AttentionModuleOptions,
) -> Tensor<4> {
    let device = q.device();
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if !on_host(&device) {
        if let Some(out) = gpu::attention::attention(&q, &k, &v, mask, scale(&q, &options)) {
            return out;
        }
    }
    let split = cpu::sgemm::precision() == cpu::sgemm::Precision::F32 && split_f32(&device);
    if !split && on_host(&device) {
        return burn_attention(q, k, v, Some(mask.clone()), None, options);
    }
    backend::composite_attention(q, k, v, mask, options, split)
}

/// Log-probs of `targets` and (when `entropy`) entropies of the rows of the logits `x · w`
/// (`x: [n, h]` final-normed hidden states, `w: [h, V]` the LM head) at `temperature`. On a GPU
/// the head in chunks of tokens ([`gpu::head`]: the logits of the whole batch never exist at
/// once, forward or backward); on the CPU the product ([`matmul`]) and the fused head
/// ([`logprob_entropy`]).
pub(crate) fn head_logprob_entropy(
    x: Tensor<2>,
    w: Tensor<2>,
    targets: &[u32],
    temperature: f64,
    entropy: bool,
) -> Result<(Tensor<1>, Option<Tensor<1>>)> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if !on_host(&x.device()) {
        let split = split_f32(&x.device());
        let chunk = gpu::head::CHUNK_BYTES;
        if let Some(out) =
            gpu::head::logprob_entropy(&x, &w, targets, temperature, entropy, split, chunk)?
        {
            return Ok(out);
        }
    }
    logprob_entropy(matmul(x, w, None), targets, temperature, entropy)
}

/// Log-probs of `targets` and (when `entropy`) entropies of the rows of `logits: [n, V]` at
/// `temperature`: the fused head on the CPU, burn's composite elsewhere
/// ([`cpu::head::logprob_entropy`] falls back to it by itself).
pub(crate) fn logprob_entropy(
    logits: Tensor<2>,
    targets: &[u32],
    temperature: f64,
    entropy: bool,
) -> Result<(Tensor<1>, Option<Tensor<1>>)> {
    cpu::head::logprob_entropy(logits, targets, temperature, entropy)
}

/// Fixed input buffers written in place and a decode step captured once and replayed, for
/// [`super::graph::DecodeGraph`]: the GPU backends' graph API ([`gpu::graph`]; CUDA replays a
/// hardware graph, wgpu a software one).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) use super::backend::gpu::graph::{capture, write_f32, write_ids, StepGraph};

/// The sampling settings of [`draw`] (the sampler's, as plain numbers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawParams {
    /// Divides the logits; 0 = greedy (the lowest id of the maximum).
    pub temperature: f32,
    /// Keep the `top_k` largest (0 = off).
    pub top_k: usize,
    /// Nucleus mass (1 = off).
    pub top_p: f32,
    /// Minimum weight relative to the most likely token (0 = off).
    pub min_p: f32,
}

/// The sampler's draw on the logits' device: `[r, 2]` f32, the token and its behaviour log-prob
/// per sample row; row `i` reads logits row `rows[1, i]` (every row in order when `identity`) and
/// the uniform `rows[0, i]`. On a GPU one kernel ([`gpu::draw`]); on the CPU burn ops
/// ([`backend::draw`]). See [`crate::sample::draw`] for what it keeps of the host sampler.
pub fn draw(
    logits: &Tensor<2>,
    rows: &Tensor<2>,
    identity: bool,
    params: &DrawParams,
    allowed: usize,
) -> Result<Tensor<2>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if !on_host(&logits.device()) {
        if let Some(out) = gpu::draw::draw(logits, rows, params, allowed)? {
            return Ok(out);
        }
    }
    Ok(backend::draw::draw(logits, rows, identity, params, allowed))
}
