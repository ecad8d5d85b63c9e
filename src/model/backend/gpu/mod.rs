//! What the GPU backends (wgpu, CUDA) run, one source for both: `#[cube]` kernels launched on
//! burn's tensors (RMSNorm with the residual add, [`norm`]; SwiGLU, [`swiglu`]; RoPE, and RoPE
//! with the KV-cache write at positions held on the device, [`rope`]; attention from a mask or
//! from the cache's slot flags, [`attention`]; the sampler's draw, [`draw`]; fixed input buffers
//! and a decode step captured once and replayed, [`graph`]; the LM head's log-probs and entropies
//! in chunks of tokens, with their backward, [`head`]; RMSNorm, SwiGLU, RoPE and attention have
//! backward kernels too), and burn composites written for fewer kernel launches (every burn op
//! is a launch there, about 27 µs of host time each on an H200) where no kernel applies
//! (another dtype, rows past the attention kernel's key limit).
use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::model::transfer::upload;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod attention;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod block;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod draw;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod graph;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod head;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod norm;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod rope;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod swiglu;

/// The wgpu device the kernels' tests run on: `RLCR_WGPU_DEVICE` (default `wgpu`: lavapipe in CI).
#[cfg(test)]
#[cfg(feature = "wgpu")]
pub(crate) fn test_device() -> burn::tensor::Device {
    let spec = std::env::var("RLCR_WGPU_DEVICE").unwrap_or_else(|_| "wgpu".into());
    spec.parse::<crate::model::DeviceSpec>()
        .unwrap()
        .open()
        .unwrap()
}

/// `y = f()` and the backward pass of `L = Σ y·c` on an autodiff device: `(y, the gradients,
/// launches of `f`, launches of the backward pass)` (the loss's own product and sum are in the
/// second count). For the training kernels' tests.
#[cfg(test)]
#[cfg(feature = "wgpu")]
pub(crate) fn loss_backward<const D: usize>(
    f: impl FnOnce() -> Tensor<D>,
    c: Tensor<D>,
) -> (Tensor<D>, burn::tensor::Gradients, u64, u64) {
    use crate::model::transfer::thread_launches;
    let l0 = thread_launches();
    let y = f();
    let l1 = thread_launches();
    let loss = (y.clone() * c).sum();
    let l2 = thread_launches();
    let grads = loss.backward();
    let l3 = thread_launches();
    (y, grads, l1 - l0, l3 - l2)
}

/// Every value of `got` within `1e-5·max|want|` of its value in `want` (`what` names them in a
/// failure). For the training kernels' tests.
#[cfg(test)]
#[cfg(feature = "wgpu")]
pub(crate) fn assert_near(got: &[f32], want: &[f64], what: &str) {
    let size = want.iter().fold(0f64, |a, b| a.max(b.abs()));
    for (k, (&a, &b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a as f64 - b).abs() <= 1e-5 * size,
            "{what}[{k}]: {a} vs {b} (largest {size})"
        );
    }
}

/// `v` in f64 (to compare with [`assert_near`]).
#[cfg(test)]
#[cfg(feature = "wgpu")]
pub(crate) fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&a| a as f64).collect()
}

/// A kernel's value `got` within 1e-5 of the `exact` one and of the CPU's `cpu` (`what` names
/// it in a failure).
#[cfg(test)]
#[cfg(feature = "wgpu")]
pub(crate) fn assert_close(got: f32, exact: f64, cpu: f32, what: std::fmt::Arguments) {
    assert!(
        (got as f64 - exact).abs() < 1e-5,
        "{what}: {got} vs {exact}"
    );
    assert!((got - cpu).abs() < 1e-5, "{what}: {got} vs cpu {cpu}");
}

/// RMSNorm in six kernels (square, mean, `+ eps`, sqrt, divide, `· w`; where [`norm`]'s kernels
/// do not apply: another dtype) instead of burn's composite's seven: `x / sqrt(mean(x²) + eps)` divides where the composite multiplies by a
/// reciprocal (the two differ by a rounding; transformers' `rsqrt` is a third way, within the
/// same parity bound).
pub fn rms_norm(x: Tensor<2>, w: Tensor<1>, eps: f64) -> Tensor<2> {
    let rms = x.clone().square().mean_dim(1).add_scalar(eps).sqrt();
    x / rms * w.unsqueeze_dim(0)
}

/// SwiGLU's gate in five kernels (where [`swiglu`]'s kernels do not apply: another dtype),
/// `gate / (1 + exp(−gate)) · up`, where burn's
/// `gate · sigmoid(gate) · up` takes eight (its sigmoid is `exp(−log(1 + exp(−x)))`, six). Large
/// negative gates give `exp(−gate) = ∞` and a quotient of −0, never a NaN.
pub fn swiglu(gu: Tensor<2>) -> Tensor<2> {
    let [n, two_i] = gu.dims();
    let i = two_i / 2;
    let gate = gu.clone().slice([0..n, 0..i]);
    let up = gu.slice([0..n, i..two_i]);
    gate.clone() / gate.neg().exp().add_scalar(1.0) * up
}

/// HF's rotate-half RoPE as `x·[c, c] + swap(x)·[−s, s]` ([`rope`]'s one kernel on plain
/// tensors, this on autodiff ones) (`cos`, `sin` spanning the head
/// dimension), where `swap` exchanges the halves with one gather: four kernels where the
/// composite's slices, products and concatenation take ten (the same bits: `x₂·(−s) = −(x₂·s)`
/// exactly).
pub fn rope(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>, swap: &Tensor<1, Int>) -> Tensor<4> {
    x.clone() * cos.clone() + x.select(3, swap.clone()) * sin.clone()
}

/// The index `[d/2, …, d−1, 0, …, d/2−1]` that swaps the halves of a head (`select` along the last
/// axis), uploaded once per device and head dimension for the process.
pub fn rope_swap_index(d: usize, device: &Device) -> Tensor<1, Int> {
    type Cache = Vec<(Device, usize, Tensor<1, Int>)>;
    static CACHE: std::sync::Mutex<Cache> = std::sync::Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, t)) = cache.iter().find(|(dev, n, _)| dev == device && *n == d) {
        return t.clone();
    }
    let half = d / 2;
    let idx: Vec<i32> = (0..d).map(|i| ((i + half) % d) as i32).collect();
    let t: Tensor<1, Int> = upload(TensorData::new(idx, [d]), device);
    cache.push((device.clone(), d, t.clone()));
    t
}
