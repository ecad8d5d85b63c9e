//! NVPTX target: the one module of it that cubecl-cuda uses.

pub mod ptx_version;
