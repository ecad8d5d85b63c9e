//! `rlcr generate-answers`: the command line of turn 1 of the RLCR rollout (help, flags, plan,
//! summary line). The engine is [`crate::sample::answer_stage`].
use std::path::PathBuf;

use anyhow::Result;

use super::common::Global;
use super::flags::{ModelTable, SampledShard};
use crate::sample::answer_stage::{self, Plan};

pub const ABOUT: &str = "Sample G_a answers per prompt with the policy (turn 1)";
pub const LONG_ABOUT: &str = "\
Sample G_a (--num-answers) responses `<think>...</think><answer>...</answer>` per prompt with the
policy, batched with a KV cache (each prompt is prefilled once for its G_a samples). Writes, per
answer: the conversation (`messages`: system prompt + the prompt's messages), `context_ids`,
`response_ids` (a final EOS token included), `response_text`, `response_logprobs`, `finish_reason`
(`stop`: EOS or a --stop string; `length`: --max-new-tokens) and `answer_span` (start of <think>,
or token 0 when the context already opened <think>, to the end of the last </answer>; null if not
found). Extra prompt columns pass through.

System prompt: RLCR's think/answer/analysis/confidence instructions unless the prompt brings its
own system message; --system-prompt replaces either (\"\" for none). --response-prefix TEXT starts
the assistant turn with TEXT (e.g. `<think>`), recorded as a final partial assistant message.

response_logprobs are the behaviour log-probs: log-softmax of the model's logits at temperature 1
over the whole vocabulary, whatever --temperature/--top-p/--top-k/--min-p drew the token (those are
recorded in the metadata with the model path and fingerprint). Order: temperature, top-k, top-p,
min-p (as transformers); temperature 0 is greedy.

Reads: a prompts table (`rlcr prepare`) and a Hugging Face model folder.
Writes: an answers table, G_a rows per prompt, in prompt order (trajectory schema).
Each sample draws from its own ChaCha20 stream keyed by (--seed, prompt_id, answer_idx), so the
table does not depend on --batch-size, scheduling or thread count (bit for bit on the CPU backend
while context + response fit in 512 cache slots; beyond, log-probs may differ in the last bits).
A prompt longer than the model's context is an error naming it.
Example:
  rlcr --seed 0 generate-answers --model fixtures/tiny-qwen2 --input prompts.parquet \\
       -o answers.parquet --num-answers 8 --max-new-tokens 256";

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub stage: ModelTable,
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
    pub sampled: SampledShard,
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let (job, sampling) = a.sampled.job(g, &a.stage)?;
    let prompt_file = a.system_prompt_file.as_deref();
    let plan = Plan::new(job, a.num_answers, a.system_prompt, prompt_file, sampling)?;
    answer_stage::run(&plan)?.log("generate-answers", "answer_span");
    Ok(())
}
