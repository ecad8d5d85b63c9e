//! `rlcr generate-confidence`: the command line of turn 2 of the RLCR rollout (help, flags,
//! plan, summary line). The engine is [`crate::sample::confidence_stage`].

use anyhow::Result;

use super::common::Global;
use super::flags::{ModelTable, SampledShard};
use crate::sample::confidence_stage::{self, Plan};

pub const ABOUT: &str =
    "Sample G_c confidences per answer, each for exactly one fixed answer (turn 2)";
pub const LONG_ABOUT: &str = "\
For every answer row (j,k), build the conversation system + user prompt + assistant(answer k) +
user(confidence query) and sample G_c (--num-confidences) responses
`[<analysis>...</analysis>]<confidence>...</confidence>`. The answer enters the context as its
sampled token ids (not a re-tokenization of its text), and the G_c samples of one answer share
that context, prefilled once. Each answer row is written unchanged, followed by its confidence
rows; a confidence row repeats its answer's prompt columns (extra columns pass through), points at
it through prompt_id/answer_idx and sample_id `{prompt_id}/a{k}/c{h}`, holds the whole
conversation in `messages`, and has `confidence_span` (start of <analysis> if present, else of
<confidence>, or token 0 when --response-prefix opened one, to the end of the last
</confidence>; null if not found) and a null `answer_span`.

Sampling flags, behaviour log-probs, metadata and determinism as in generate-answers (streams
keyed by (--seed, prompt_id, answer_idx, confidence_idx)).

Reads: an answers table (answer rows only) and the model folder.
Writes: the trajectory table (answers + confidences).
Example:
  rlcr generate-confidence --model fixtures/tiny-qwen2 --input answers.parquet \\
       -o trajectory.parquet --num-confidences 4";

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub stage: ModelTable,
    /// Confidences per answer (G_c).
    #[arg(long, default_value_t = 4)]
    pub num_confidences: usize,
    /// The user message that asks for a confidence (default: RLCR-style request for a probability
    /// between 0 and 1 in <confidence> tags, optionally after <analysis>).
    #[arg(long)]
    pub confidence_prompt: Option<String>,
    /// System prompt text (default: the one recorded in the answers, else RLCR's).
    #[arg(long)]
    pub system_prompt: Option<String>,
    #[command(flatten)]
    pub sampled: SampledShard,
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let (job, sampling) = a.sampled.job(g, &a.stage)?;
    let query = a.confidence_prompt;
    let plan = Plan::new(job, a.num_confidences, query, a.system_prompt, sampling)?;
    confidence_stage::run(&plan)?.log("generate-confidence", "confidence_span");
    Ok(())
}
