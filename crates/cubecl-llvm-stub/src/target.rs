//! LLVM compilation targets.

/// The target a [`crate::PlironCompiler`] compiles for (the real crate's variants).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LlvmTarget {
    /// The CPU JIT of `cubecl-cpu`.
    #[default]
    Cpu,
    /// AMD GPUs (`cubecl-hip`'s LLVM backend).
    AmdGpu,
    /// NVIDIA GPUs (`cubecl-cuda`'s LLVM backend).
    Nvptx,
}

impl LlvmTarget {
    /// Whether the target provides a hardware launch grid.
    pub fn is_gpu(self) -> bool {
        !matches!(self, LlvmTarget::Cpu)
    }
}
