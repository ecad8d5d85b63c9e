//! `rlcr import-gguf`: convert a llama.cpp GGUF file into a Hugging Face folder.
use std::path::PathBuf;

use anyhow::Result;

use super::common::Global;
use crate::model::gguf;

pub const ABOUT: &str =
    "Convert a llama.cpp GGUF model (F32/F16/BF16/Q8_0/Q4_0/Q4_1) into a Hugging Face folder";
pub const LONG_ABOUT: &str = "\
Read a GGUF file (v2/v3), dequantize its tensors to float32 exactly as ggml does, undo llama.cpp's
q/k row permutation, build tokenizer.json and tokenizer_config.json (with the chat template) from
its metadata, and write an ordinary Hugging Face folder (config.json, generation_config.json,
model.safetensors, tokenizer files) that every rlcr stage, and transformers, load.

Supported: the llama (Llama 1-3, Mistral, SmolLM2) and qwen2 architectures; tensors in F32, F16,
BF16, Q8_0, Q4_0, Q4_1 (K-quants and i-quants are refused with the tensor's name); GPT-2-style
byte-level BPE tokenizers with the pre-tokenizer presets default, gpt-2, smollm, starcoder,
llama-bpe and qwen2.

Cost: the output is float32, about 4 bytes per parameter (540 MB for SmolLM2-135M); memory use is
one tensor at a time. The output folder is written atomically (a temporary folder beside it, then a
rename); an existing non-empty folder is refused unless --force.

Example:
  scripts/fetch_smollm2.sh   # prints the path of SmolLM2-135M-Instruct.Q4_1.gguf
  rlcr import-gguf --input SmolLM2-135M-Instruct.Q4_1.gguf -o models/smollm2";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF file.
    #[arg(long)]
    pub input: PathBuf,
    /// Output model folder.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Replace the output folder if it exists and is not empty.
    #[arg(long)]
    pub force: bool,
}

pub fn run(_g: &Global, a: Args) -> Result<()> {
    let opts = gguf::ImportOptions { force: a.force };
    let s = gguf::import(&a.input, &a.out, &opts)?;
    let hp = &s.hparams;
    let types: Vec<String> = s.types.iter().map(|(t, n)| format!("{n} {t}")).collect();
    crate::info!(
        "imported {} model from {}: {} layers, hidden {}, {} heads ({} KV), vocab {}, {}, {:.1}M parameters from {} tensors ({}) -> {}",
        match hp.arch {
            gguf::Arch::Llama => "llama",
            gguf::Arch::Qwen2 => "qwen2",
        },
        a.input.display(),
        hp.n_layer,
        hp.hidden,
        hp.n_head,
        hp.n_head_kv,
        hp.vocab,
        if hp.tied { "tied embeddings" } else { "separate lm_head" },
        s.n_params as f64 / 1e6,
        s.n_tensors,
        types.join(", "),
        s.out.display()
    );
    Ok(())
}
