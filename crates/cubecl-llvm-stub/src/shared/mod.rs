//! The compiler's interface as cubecl-cuda sees it, and the device-feature narrowing.

pub mod lowered_features;

use crate::nvptx::ptx_version::PtxVersion;
use crate::target::LlvmTarget;
use cubecl_core::environment::backtrace::BackTrace;
use cubecl_core::ir::amd::GfxArch;
use cubecl_core::ir::attributes::BufferIOAttr;
use cubecl_core::ir::nvidia::SmArch;
use cubecl_core::prelude::KernelDefinition;
use cubecl_core::{CompilationError, Compiler};

/// Why this build cannot compile a kernel through LLVM; the error every compile returns.
pub const NO_LLVM: &str = "this build has no LLVM kernel compiler: cubecl-llvm is replaced by a \
stand-in that only provides what the CUDA C++ (NVRTC) backend needs; select \
`CudaBackend::Cpp` (cubecl-cuda's `cpp` feature)";

/// The pliron → LLVM compiler; in this stand-in every compile fails with [`NO_LLVM`].
#[derive(Clone, Debug, Default)]
pub struct PlironCompiler {
    /// What the compiler would generate code for.
    pub target: LlvmTarget,
}

/// Options of a compile (the real crate's fields; the CPU-only `f16_evaluation` is left out).
#[derive(Clone, Debug, Default)]
pub struct PlironOptions {
    /// Minimum CPU buffer alignment, including view offsets. Must be a power of two.
    pub cpu_buffer_alignment: Option<u32>,
    /// AMDGPU architecture, or `None` for other targets.
    pub arch: Option<GfxArch>,
    /// NVPTX architecture, or `None` for other targets.
    pub sm_arch: Option<SmArch>,
    /// PTX version to emit, or `None` for the oldest the architecture accepts.
    pub ptx_version: Option<PtxVersion>,
    /// Pass scalars and static metadata in the kernel parameter block.
    pub grid_constants: bool,
}

/// Compiled NVPTX module (never produced here).
#[derive(Clone, Debug)]
pub struct NvptxModule {
    /// NUL-terminated PTX assembly.
    pub ptx: Vec<core::ffi::c_char>,
    /// Kernel entry point symbol.
    pub entrypoint: String,
    /// IR for logging and cache keys.
    pub ir: String,
    /// Shared memory required per launch, in bytes.
    pub shared_memory_size: usize,
    /// Buffer access modes in binding order.
    pub io: Vec<BufferIOAttr>,
}

/// The CPU JIT engine of the real crate: uninhabited here (there is no JIT without LLVM).
#[derive(Clone, Debug)]
pub enum PlironEngine {}

/// Compiled kernel artifact.
#[derive(Clone, Debug)]
pub enum PlironArtifact {
    /// A CPU JIT engine.
    Jit(PlironEngine),
    /// A PTX module.
    NvptxCode(NvptxModule),
}

impl core::fmt::Display for PlironArtifact {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PlironArtifact::Jit(engine) => match *engine {},
            PlironArtifact::NvptxCode(module) => f.write_str(&module.ir),
        }
    }
}

impl Compiler for PlironCompiler {
    type Representation = PlironArtifact;
    type CompilationOptions = PlironOptions;

    fn buffer_io(repr: &Self::Representation) -> Option<Vec<BufferIOAttr>> {
        match repr {
            PlironArtifact::Jit(engine) => match *engine {},
            PlironArtifact::NvptxCode(module) => Some(module.io.clone()),
        }
    }

    fn compile(
        &mut self,
        _kernel: KernelDefinition,
        _options: &Self::CompilationOptions,
    ) -> Result<Self::Representation, CompilationError> {
        Err(CompilationError::Generic {
            reason: NO_LLVM.to_string(),
            backtrace: BackTrace::capture(),
        })
    }

    fn extension(&self) -> &'static str {
        match self.target {
            LlvmTarget::Cpu => "plir",
            LlvmTarget::AmdGpu | LlvmTarget::Nvptx => "ll",
        }
    }

    fn lang_tag(&self) -> &'static str {
        match self.target {
            LlvmTarget::Cpu => "mlir",
            LlvmTarget::AmdGpu | LlvmTarget::Nvptx => "llvm",
        }
    }
}
