//! `rlcr generate-answers`: turn 1 of the RLCR rollout.
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str = "Sample G_a answers per prompt with the policy (turn 1)";
pub const LONG_ABOUT: &str = "\
Sample G_a (--num-answers) responses `<think>...</think><answer>...</answer>` per prompt with the
policy, batched with a KV cache. Records per response token the sampling-time log-probability (the
behaviour policy's old_logprobs), the answer span (start of <think> to end of </answer>, in response
tokens) and the finish reason.

Reads: a prompts table (`rlcr prepare`) and a Hugging Face model folder.
Writes: an answers table, G_a rows per prompt (trajectory schema).
Each sample has its own RNG stream from (--seed, prompt_id, answer_idx): the output does not depend
on --batch-size or thread count.
Example:
  rlcr --seed 0 generate-answers --model fixtures/tiny-qwen2 --input prompts.parquet \\
       -o answers.parquet --num-answers 8 --max-new-tokens 256";

/// Sampling settings shared by the generation stages.
#[derive(clap::Args, Debug, Clone, serde::Serialize)]
pub struct SamplingArgs {
    /// Maximum number of new tokens per response.
    #[arg(long, default_value_t = 512)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens with total probability >= P (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Drop tokens whose probability is below P times the most likely one's (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Extra stop strings (the response ends after the first one).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Hugging Face model folder (config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompts table.
    #[arg(long)]
    pub input: PathBuf,
    /// Output answers table.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Answers per prompt (G_a).
    #[arg(long, default_value_t = 8)]
    pub num_answers: usize,
    /// System prompt text (default: RLCR's think/answer/analysis/confidence instructions).
    #[arg(long)]
    pub system_prompt: Option<String>,
    /// Read the system prompt from a file.
    #[arg(long, conflicts_with = "system_prompt")]
    pub system_prompt_file: Option<PathBuf>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Only the prompts of shard I of N (`--shard 0/4`), split by prompt_id.
    #[arg(long)]
    pub shard: Option<String>,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("generate-answers"))
}
