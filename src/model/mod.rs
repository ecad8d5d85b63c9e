//! model (to be built).
pub mod gguf;
