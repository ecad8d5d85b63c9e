//! rlcr's CPU kernels, on plain `f32` slices (no tensor library): the blocked GEMM of training
//! and prefill ([`sgemm`]), the decode-shaped products and decode attention of sampling
//! ([`decode`]), the loss rows of the fused LM head ([`head`]), RMSNorm and the SwiGLU gate
//! forward and backward ([`norm`]), and the rotary embedding ([`rope`]). rlcr's `model` module holds
//! the glue to burn (tensor conversions, the autodiff `Backward` ops).
//!
//! **Instruction sets** ([`Isa`], chosen at run time): AVX-512F kernels where the CPU has them,
//! AVX2 + FMA kernels otherwise, and no kernel (the caller's generic path) below that or on other
//! architectures. Every product sums each output from zero in the order of K with one fused
//! multiply-add per term, so results are the same bits on every ISA, for every batch size and
//! thread count (tested by forcing the AVX2 kernels on an AVX-512 machine).
//!
//! Why a crate of its own: Cargo sets optimisation per package, and rlcr's `cargo test` build
//! (and the loop's default build) compiles rlcr at opt-level 0–1, where these kernels ran up to
//! 7× slower than burn's matmul; the workspace optimises this crate at opt-level 3 in every
//! profile (see the root `Cargo.toml`).
pub mod attention;
pub mod bf16;
pub mod decode;
pub mod head;
mod isa;
pub mod norm;
pub mod rope;
pub mod sgemm;
#[doc(hidden)]
pub mod testing;

pub use isa::Isa;
