//! The backends' own code, entered only through [`super::ops`]:
//!
//! - [`cpu`]: rlcr's kernels (crate `rlcr-kernels`) on Flex tensors, plain and autodiff: the
//!   decode products and attention ([`cpu::decode`]), the blocked GEMM ([`cpu::sgemm`]), masked
//!   attention ([`cpu::attention`]), the fused LM head ([`cpu::head`]), RMSNorm, SwiGLU and RoPE
//!   ([`cpu::fused`]).
//! - [`gpu`]: what wgpu and CUDA run, one source for both: burn composites chosen for fewer
//!   kernel launches, and `#[cube]` kernels launched on burn's tensors (RMSNorm with the
//!   residual add, SwiGLU, RoPE with the KV-cache write, attention, the sampler's draw).
//! - [`cuda`]: opening a CUDA device (driver, NVRTC and headers checked first); opening a wgpu
//!   adapter is [`open_wgpu`].
//!
//! The composites in this file are burn ops that any device runs: the fallbacks of the CPU paths
//! (a switch off, a CPU without the kernels) and the GPU's products.
use anyhow::{bail, Result};
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::ops::{Backward, NodeGuard, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::Autodiff;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Device, Tensor};

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod draw;
pub mod gpu;

/// `out` on the autodiff graph as the output of `op` (a compute-bound step, never
/// checkpointed) from the inputs whose `parents` are given; `state`, what `op`'s backward pass
/// keeps, is made only when a parent is tracked.
pub(crate) fn record<B, O, const N: usize>(
    op: O,
    parents: [NodeGuard; N],
    out: FloatTensor<B>,
    state: impl FnOnce() -> O::State,
) -> FloatTensor<Autodiff<B>>
where
    B: burn::backend::Backend,
    O: Backward<B, N>,
{
    match op
        .prepare::<NoCheckpointing>(parents)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state(), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

/// The inputs of an LM head's per-token log-probs, checked alike on every backend: one target
/// id per row of `n`, each inside the vocabulary of `v` ids, and a finite temperature above 0.
pub(crate) fn check_head_inputs(
    n: usize,
    v: usize,
    targets: &[u32],
    temperature: f64,
) -> Result<()> {
    anyhow::ensure!(
        targets.len() == n,
        "{} target ids for {n} rows of logits",
        targets.len()
    );
    anyhow::ensure!(
        temperature > 0.0 && temperature.is_finite(),
        "temperature must be > 0, got {temperature}"
    );
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= v) {
        bail!("target id {bad} is outside the vocabulary of {v} ids");
    }
    Ok(())
}

/// Open a wgpu adapter: wgpu's own pick, or the `index`-th it enumerates. The adapter is looked
/// up now, so that a machine without one (no Vulkan/Metal/GL driver) gets an error here instead
/// of a panic at the first tensor.
#[cfg(feature = "wgpu")]
pub(crate) fn open_wgpu(index: Option<usize>) -> Result<Device> {
    use burn::tensor::{DeviceKind, DeviceType};
    let all = Device::enumerate(DeviceType::Wgpu).into_vec();
    let name = |d: &Device| {
        d.identity()
            .map(|i| i.name)
            .unwrap_or_else(|| "unnamed adapter".into())
    };
    if all.is_empty() {
        bail!(
            "--device {}: wgpu found no adapter (no Vulkan, Metal, DX12 or GL driver?); on \
             Debian/Ubuntu `apt-get install mesa-vulkan-drivers` provides a software Vulkan \
             device (lavapipe)",
            crate::model::DeviceSpec::Wgpu(index)
        );
    }
    let device = match index {
        None => Device::wgpu(DeviceKind::DefaultDevice),
        Some(i) => match all.get(i) {
            Some(d) => d.clone(),
            None => {
                let list: Vec<String> = all
                    .iter()
                    .enumerate()
                    .map(|(k, d)| format!("wgpu:{k} = {}", name(d)))
                    .collect();
                bail!(
                    "--device wgpu:{i}: this machine has {} wgpu adapter(s): {}",
                    all.len(),
                    list.join(", ")
                );
            }
        },
    };
    crate::model::transfer::count_launches();
    crate::info!(
        "device: {} ({})",
        crate::model::DeviceSpec::Wgpu(index),
        name(&device)
    );
    Ok(device)
}

#[cfg(not(feature = "wgpu"))]
pub(crate) fn open_wgpu(_index: Option<usize>) -> Result<Device> {
    // Unreachable through `parse`, which refuses wgpu in such a build.
    bail!("--device wgpu: this rlcr was built without wgpu support")
}

/// The driver, NVRTC and the CUDA headers are checked first, and the runtime's panics (cudarc's,
/// in burn's device thread) become errors: see [`cuda::open`].
#[cfg(feature = "cuda")]
pub(crate) fn open_cuda(index: usize) -> Result<Device> {
    cuda::open(index)
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn open_cuda(_index: usize) -> Result<Device> {
    // Unreachable through `parse`, which refuses cuda in such a build.
    bail!("--device cuda: this rlcr was built without CUDA support")
}

/// Whether this process opened a CUDA device ([`cuda::open`]): its f32 matmul is TF32.
static CUDA_OPENED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Records that a CUDA device was opened (a process opens one device).
#[cfg(feature = "cuda")]
pub(crate) fn mark_cuda_opened() {
    CUDA_OPENED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether this process opened a CUDA device.
pub(crate) fn cuda_opened() -> bool {
    CUDA_OPENED.load(std::sync::atomic::Ordering::Relaxed)
}

/// burn's `x · w` for f32 activations `x` and an f32 or bf16 weight `w`, in the precision of
/// [`cpu::sgemm::precision`]: f32 (a bf16 weight is widened for this product only, exact; split
/// into exact bf16 parts when `split`, see [`split_matmul`]), or both operands cast to bf16 and
/// the product cast back to f32, as torch's autocast runs a `Linear` (differentiable: the casts'
/// backward casts the gradient back, so an f32 weight gets an f32 gradient). The device must
/// support bf16 for the latter ([`super::ops::check_precision`]).
pub(crate) fn burn_matmul(x: Tensor<2>, w: Tensor<2>, split: bool) -> Tensor<2> {
    use burn::tensor::DType;
    use cpu::sgemm::Precision;
    match (cpu::sgemm::precision(), w.dtype()) {
        (Precision::F32, dtype) if split => {
            let w = if dtype == DType::F32 {
                w
            } else {
                w.cast(DType::F32)
            };
            split_matmul(x, w)
        }
        (Precision::F32, DType::F32) => x.matmul(w),
        (Precision::F32, _) => x.matmul(w.cast(DType::F32)),
        (Precision::Bf16, _) => x
            .cast(DType::BF16)
            .matmul(w.cast(DType::BF16))
            .cast(DType::F32),
    }
}

/// `a · b` for f32 tensors, f32-accurate where the backend's f32 matmul rounds its operands to
/// TF32 (burn's CUDA backend on NVIDIA tensor cores since Ampere: 10 of f32's 23 mantissa bits,
/// about 5e-4 relative error per product, like torch with `allow_tf32`). Each operand is split
/// into a head that bf16 (and so TF32) holds exactly and the remainder, `a = aₕ + aₗ` (exact in
/// f32, `|aₗ| ≤ 2⁻⁸|a|`), and `a·b = aₕ·bₕ + ((aₕ·bₗ + aₗ·bₕ) + aₗ·bₗ)`, small terms summed
/// first: the head product loses nothing to TF32 and the remainders lose at most 2⁻¹¹ of
/// themselves, about 2⁻¹⁹ of the product. (Dropping `aₗ·bₗ` would leave up to 2⁻¹⁶: measured
/// 1.9e-5 on the tiny model's log-probs.) Differentiable: the casts pass the gradient through, so
/// the gradient of `a` is `g·(bₕ + bₗ)ᵀ`. Used where [`super::ops::split_f32`] says so.
pub(crate) fn split_matmul<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    use burn::tensor::DType;
    let head = |t: Tensor<D>| t.cast(DType::BF16).cast(DType::F32);
    let (ah, bh) = (head(a.clone()), head(b.clone()));
    let (al, bl) = (a - ah.clone(), b - bh.clone());
    let cross = ah.clone().matmul(bl.clone()) + al.clone().matmul(bh.clone());
    ah.matmul(bh) + (cross + al.matmul(bl))
}

/// Masked attention as burn ops (`mask`: true = hidden): scaled scores, −∞ at hidden keys,
/// softmax over the keys, the weighted values, in nine kernels. burn's attention takes thirteen
/// (its softmax clamps the row maximum and the sum so that a row with every key hidden gives
/// zeros, not NaN; rlcr's masks always leave a query its own key). With `split` both products
/// are [`split_matmul`]s, which burn's attention would run in TF32 on CUDA. `options` only
/// supplies the scale.
pub(crate) fn composite_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: &Tensor<4, Bool>,
    options: AttentionModuleOptions,
    split: bool,
) -> Tensor<4> {
    let product = |a: Tensor<4>, b: Tensor<4>| {
        if split {
            split_matmul(a, b)
        } else {
            a.matmul(b)
        }
    };
    let [b, heads, rows, d] = q.dims();
    let keys = k.dims()[2];
    let scale = options.scale.unwrap_or(1.0 / (d as f64).sqrt());
    let scores = product(q, k.swap_dims(2, 3)).mul_scalar(scale);
    let hidden = mask.clone().expand([b, heads, rows, keys]);
    let weights = burn::tensor::activation::softmax(scores.mask_fill(hidden, f32::NEG_INFINITY), 3);
    product(weights, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    /// The split product of [`split_matmul`] against float64 on values spanning several
    /// binades, on a plain and a 4-D batched product: each output within (K + 3)·2⁻²⁴ of the sum
    /// of |terms| (f32 rounding over K = 96 terms and the three additions; the four pieces are
    /// exact f32 products on the CPU), 80 times tighter than TF32's 2⁻¹¹ per operand. This checks
    /// the algebra; scripts/gpu_check.sh measures it on CUDA against float64.
    #[test]
    fn split_matmul_is_f32_accurate() {
        let (m, k, n) = (5, 96, 7);
        let val = |i: usize, s: f64| {
            ((i as f64 * 0.7391 + s).sin() * 10f64.powf((i % 5) as f64 - 2.0)) as f32
        };
        let a: Vec<f32> = (0..m * k).map(|i| val(i, 0.3)).collect();
        let b: Vec<f32> = (0..k * n).map(|i| val(i, 1.1)).collect();
        let dev = Device::flex();
        let at = Tensor::<2>::from_data(TensorData::new(a.clone(), [m, k]), &dev);
        let bt = Tensor::<2>::from_data(TensorData::new(b.clone(), [k, n]), &dev);
        let got = crate::model::read_f32(split_matmul(at.clone(), bt.clone())).unwrap();
        let got4 = crate::model::read_f32(split_matmul(
            at.reshape([1, 1, m, k]).repeat_dim(1, 2),
            bt.reshape([1, 1, k, n]).repeat_dim(1, 2),
        ))
        .unwrap();
        for i in 0..m {
            for j in 0..n {
                let terms = (0..k).map(|t| a[i * k + t] as f64 * b[t * n + j] as f64);
                let (exact, size) = terms.fold((0.0, 0.0), |(s, z), x| (s + x, z + x.abs()));
                for g in [got[i * n + j], got4[i * n + j], got4[m * n + i * n + j]] {
                    let err = (g as f64 - exact).abs() / size;
                    let bound = (k + 3) as f64 * 2f64.powi(-24);
                    assert!(
                        err < bound,
                        "({i}, {j}): {g} vs {exact}: {err:.2e} of Σ|terms|"
                    );
                }
            }
        }
    }
}
