//! GGUF import: read a llama.cpp GGUF file and turn it into an ordinary Hugging Face folder
//! (`config.json`, `generation_config.json`, `model.safetensors` in float32, `tokenizer.json`,
//! `tokenizer_config.json` with the chat template) that the rest of rlcr, and transformers, load.
//!
//! Layers, each its own file:
//! - [`reader`]: the container (header, tensor infos, alignment, data), memory-mapped,
//!   bounds-checked, never panicking on a malformed file; [`metadata`] its key/value section (every
//!   value type), [`ggml_type`] the tensor storage types.
//! - [`dequant`]: F32, F16, BF16, Q8_0, Q4_0, Q4_1 → f32, bit for bit as ggml/gguf-py.
//! - [`tensors`]: llama.cpp → HF tensor names, and the inverse of llama.cpp's q/k row permutation
//!   (what transformers' GGUF loader does).
//! - [`tokenizer`]: `tokenizer.ggml.*` → `tokenizer.json` (byte-level BPE with the pre-tokenizer of
//!   the original HF tokenizer) and `tokenizer_config.json`.
//! - [`import`](mod@import): the validated plan and the atomic folder write.
//! - [`writer`]: a minimal GGUF writer for tests and fixtures.
//!
//! The design goal is that importing a GGUF file gives the same weights transformers' GGUF loader
//! gives (the SmolLM2 reference log-probs were computed on exactly those), so dequantization does
//! what gguf-py does, in the same float order.
pub mod dequant;
pub mod ggml_type;
pub mod import;
pub mod metadata;
pub mod reader;
pub mod tensors;
pub mod tokenizer;
pub mod writer;

pub use dequant::{dequantize, dequantize_reference, SUPPORTED};
pub use import::{
    import, materialize, write_folder, Arch, Hparams, ImportOptions, ImportSummary, Plan,
    PlannedTensor,
};
pub use reader::{Array, GgmlType, GgufFile, TensorInfo, Value};
pub use tensors::{hf_name, permute_rows, unpermute_rows};
pub use tokenizer::HfTokenizer;
