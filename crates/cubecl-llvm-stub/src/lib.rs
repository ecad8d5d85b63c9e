//! Stand-in for `cubecl-llvm` 0.11.3 without LLVM.
//!
//! Why: burn's CUDA backend (burn-cuda 0.22.1 → cubecl-cuda 0.11.3) always compiles two kernel
//! compilers, CUDA C++ handed to NVRTC (`CudaBackend::Cpp`) and pliron → LLVM → PTX
//! (`CudaBackend::Llvm`). Only the second needs LLVM, and the real `cubecl-llvm` gets it from
//! `tracel-llvm-bundler`, whose build script downloads an LLVM build from GitHub: a CUDA build
//! cannot be made offline, in CI or on a cluster's login node. rlcr turns on cubecl-cuda's `cpp`
//! feature, which makes the NVRTC compiler the default one, so the LLVM compiler is never
//! selected, and replaces this crate (root `Cargo.toml`, `[patch.crates-io]`) with the items
//! cubecl-cuda names:
//!
//! - [`nvptx::ptx_version::PtxVersion`] and [`shared::lowered_features::restrict_features`]
//!   (its NVPTX part): the real code, copied, because cubecl-cuda calls them for every device;
//! - [`PlironCompiler`], [`PlironOptions`], [`PlironArtifact`], [`NvptxModule`] and
//!   [`LlvmTarget`], with the fields cubecl-cuda reads and writes; [`PlironCompiler`]'s compile
//!   returns an error saying that this build has no LLVM compiler, should anything select it.
//!
//! Copied parts: `src/nvptx/ptx_version.rs` and `src/shared/lowered_features.rs` come from
//! cubecl-llvm 0.11.3 (tracel-ai/cubecl, MIT OR Apache-2.0), unchanged except for the AMDGPU half.

#![warn(missing_docs)]

pub mod nvptx;
pub mod shared;
pub mod target;

pub use shared::{NvptxModule, PlironArtifact, PlironCompiler, PlironEngine, PlironOptions};
pub use target::LlvmTarget;
