//! `rlcr import-gguf`: convert a llama.cpp GGUF file into a Hugging Face folder.
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str =
    "Convert a llama.cpp GGUF model (F32/F16/Q8_0/Q4_0/Q4_1) into a Hugging Face folder";
pub const LONG_ABOUT: &str = "\
Read a GGUF v3 file, dequantize its tensors to float32, undo llama.cpp's q/k row permutation, build
tokenizer.json and tokenizer_config.json (with the chat template) from its metadata, and write an
ordinary Hugging Face folder that every rlcr stage (and transformers) loads.

Example:
  rlcr import-gguf --input SmolLM2-135M-Instruct.Q4_1.gguf -o models/smollm2";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF file.
    #[arg(long)]
    pub input: PathBuf,
    /// Output model folder.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("import-gguf"))
}
