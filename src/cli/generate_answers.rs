//! `rlcr generate-answers`: turn 1 of the RLCR rollout.
//!
//! Prompts table in, G_a sampled answers per prompt out. Each answer row is the prompt row taken
//! G_a times (so any extra prompt column passes through) with the sampled columns set:
//! `messages` becomes the conversation the answer responds to (system prompt + the prompt's
//! messages + the response prefix as a partial assistant message, if any). The prompts are
//! processed in order, in chunks, and written as they complete, so memory stays bounded.
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use arrow::array::{Array, RecordBatch, UInt32Array};

use super::common::Global;
use crate::model::Message;
use crate::sample::logits::SamplingParams;
use crate::sample::policy::Policy;
use crate::sample::prompts::DEFAULT_SYSTEM_PROMPT;
use crate::sample::sampler::{Group, SampleId};
use crate::sample::spans::{answer_span, context_opens};
use crate::sample::stage::{self, Summary};
use crate::table::{self, cols, Meta, Reader, Shard, Writer, PROMPTS, TRAJECTORY};

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
    /// Text the assistant turn starts with (e.g. `<think>`): written after the generation prompt
    /// and recorded as a partial assistant message in `messages`; the response continues it.
    #[arg(long)]
    pub response_prefix: Option<String>,
}

impl SamplingArgs {
    /// The logits settings.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
        }
    }

    /// Load the policy and resolve the generation settings of both sampling stages: the model,
    /// the [`stage::gen_config`] and the metadata object [`stage::sampling_meta`] starts with
    /// `"stage"` set to `stage_name`.
    pub fn load(
        &self,
        model: &std::path::Path,
        device: &burn::tensor::Device,
        seed: u64,
        stage_name: &str,
    ) -> Result<(Policy, crate::sample::GenConfig, serde_json::Value)> {
        let policy = Policy::load(model, device)?;
        let cfg = stage::gen_config(
            &policy,
            self.params(),
            self.max_new_tokens,
            self.stop.clone(),
            seed,
            self.batch_size,
        )?;
        let mut config = stage::sampling_meta(&cfg, &policy, model);
        config["stage"] = stage_name.into();
        Ok((policy, cfg, config))
    }
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
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// The system prompt from the flags: `Some("")` means none.
fn system_prompt(a: &Args) -> Result<Option<String>> {
    if let Some(p) = &a.system_prompt_file {
        let s = std::fs::read_to_string(p)
            .with_context(|| format!("reading --system-prompt-file {}", p.display()))?;
        return Ok(Some(s));
    }
    Ok(a.system_prompt.clone())
}

/// The conversation of an answer: `explicit` (a `--system-prompt`) replaces the prompt's own
/// system message; otherwise the prompt's system message is kept, and RLCR's default is added
/// when it has none. A response prefix becomes a final partial assistant message.
pub fn answer_conversation(
    prompt: &[Message],
    explicit: Option<&str>,
    prefix: Option<&str>,
) -> Vec<Message> {
    let has_system = prompt.first().is_some_and(|m| m.role == "system");
    let rest = if has_system { &prompt[1..] } else { prompt };
    let system = match explicit {
        Some(s) => Some(s.to_string()),
        None if has_system => Some(prompt[0].content.clone()),
        None => Some(DEFAULT_SYSTEM_PROMPT.to_string()),
    };
    let mut m = Vec::with_capacity(prompt.len() + 2);
    if let Some(s) = system.filter(|s| !s.is_empty()) {
        m.push(Message::new("system", &s));
    }
    m.extend_from_slice(rest);
    if let Some(p) = prefix.filter(|p| !p.is_empty()) {
        m.push(Message::new("assistant", p));
    }
    m
}

/// One prompt ready to sample from.
struct Prepared {
    /// Row in its input batch.
    row: usize,
    prompt_id: String,
    messages: Vec<Message>,
    context_ids: Vec<u32>,
    think_prefilled: bool,
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    if a.num_answers == 0 {
        bail!("--num-answers must be at least 1");
    }
    let shard = a.shard;
    let system = system_prompt(&a)?;
    let device = crate::model::device_from_str(&g.device)?;
    let reader = Reader::open(&a.input)?;
    let name = a.input.display().to_string();
    table::check_schema(
        &name,
        &reader.schema(),
        &PROMPTS,
        &["prompt_id", "messages"],
    )?;
    let total_prompts = reader.num_rows();
    if total_prompts == 0 {
        bail!("{name}: the table has no rows; nothing was written");
    }
    let s = &a.sampling;
    let (policy, cfg, mut config) = s.load(&a.model, &device, g.seed, "generate-answers")?;
    config["num_answers"] = a.num_answers.into();
    config["system_prompt"] = match &system {
        Some(s) => s.clone().into(),
        None => serde_json::json!({"default": DEFAULT_SYSTEM_PROMPT}),
    };
    config["response_prefix"] = s.response_prefix.clone().into();
    config["shard"] = serde_json::to_value(shard)?;
    config["argv"] = g.argv.clone().into();
    let meta = Meta::new(
        &TRAJECTORY,
        "generate-answers",
        config,
        &[a.input.as_path(), a.model.as_path()],
    );

    let mut progress = crate::progress::Progress::new(
        "generate-answers",
        (total_prompts * a.num_answers) as u64,
        "rows",
    );
    let mut summary = Summary::default();
    let mut writer: Option<Writer> = None;
    let mut seen = std::collections::HashSet::new();
    let mut base_row = 0usize;
    for batch in reader {
        let batch = batch?;
        let pid = cols::str_col(&batch, &name, "prompt_id")?;
        let msg = cols::str_col(&batch, &name, "messages")?;
        let mut prepared = Vec::new();
        for i in 0..batch.num_rows() {
            let loc = || format!("{name}, row {}", base_row + i);
            for (c, null) in [("prompt_id", pid.is_null(i)), ("messages", msg.is_null(i))] {
                if null {
                    bail!("{}, column `{c}`: null where a value is required", loc());
                }
            }
            let id = pid.value(i).to_string();
            if !seen.insert(id.clone()) {
                bail!("{}, column `prompt_id`: duplicate prompt_id {id:?}", loc());
            }
            if shard.is_some_and(|s| !s.contains(&id)) {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(msg.value(i))
                .with_context(|| format!("{}, column `messages`: not valid JSON", loc()))?;
            let prompt = stage::parse_messages(&v, &loc)?;
            let messages =
                answer_conversation(&prompt, system.as_deref(), s.response_prefix.as_deref());
            let (text, context_ids) = policy
                .encode_context(&messages)
                .with_context(|| format!("{}: building the context", loc()))?;
            let max_pos = policy.model.config.max_position_embeddings;
            if context_ids.len() >= max_pos {
                bail!(
                    "{}: prompt {id:?} is {} tokens with the chat template, but the model accepts at \
                     most {max_pos} positions (context + response); shorten the prompt",
                    loc(),
                    context_ids.len()
                );
            }
            prepared.push(Prepared {
                row: i,
                prompt_id: id,
                messages,
                context_ids,
                think_prefilled: context_opens(&text, "<think>", &["</think>"]),
            });
        }
        let per_chunk = (stage::chunk_samples(s.batch_size) / a.num_answers).max(1);
        for chunk in prepared.chunks(per_chunk) {
            let out = sample_chunk(
                &policy,
                &batch,
                chunk,
                a.num_answers,
                &cfg,
                &mut progress,
                &mut summary,
            )?;
            table::io::write_lazily(&mut writer, &a.out, &meta, &out)?;
        }
        base_row += batch.num_rows();
    }
    progress.finish();
    let Some(w) = writer else {
        bail!(
            "{name}: no prompts to sample from{}; nothing was written",
            if shard.is_some() {
                " in this shard"
            } else {
                ""
            }
        );
    };
    w.finish()?;
    crate::info!("{}", summary.line("generate-answers", "answer_span"));
    Ok(())
}

/// Sample `g_a` answers for each prompt of `chunk` and build their rows.
fn sample_chunk(
    policy: &Policy,
    batch: &RecordBatch,
    chunk: &[Prepared],
    g_a: usize,
    cfg: &crate::sample::GenConfig,
    progress: &mut crate::progress::Progress,
    summary: &mut Summary,
) -> Result<RecordBatch> {
    let groups: Vec<Group> = chunk
        .iter()
        .map(|p| Group {
            context: p.context_ids.clone(),
            samples: (0..g_a as u32)
                .map(|k| SampleId {
                    prompt_id: p.prompt_id.clone(),
                    answer_idx: k,
                    confidence_idx: None,
                })
                .collect(),
        })
        .collect();
    let results = stage::run_groups(policy, &groups, cfg, progress, summary)?;
    let mut take = Vec::with_capacity(chunk.len() * g_a);
    let mut c = stage::SampledColumns::default();
    for (p, res) in chunk.iter().zip(&results) {
        for (k, gen) in res.iter().enumerate() {
            let span = answer_span(&gen.text, &gen.ends, p.think_prefilled);
            summary.add(gen, span);
            take.push(p.row as u32);
            c.push(
                "answer",
                stage::to_i32(k, "answer_idx")?,
                None,
                format!("{}/a{k}", p.prompt_id),
                &p.messages,
                &p.context_ids,
                gen,
                span,
                None,
            )?;
        }
    }
    let idx = UInt32Array::from(take);
    let base = arrow::compute::take_record_batch(batch, &idx)?;
    let arrays = c.into_arrays();
    // Answers carry no confidence_span (generate-confidence adds it).
    let arrays: Vec<_> = arrays
        .into_iter()
        .filter(|(n, _)| *n != "confidence_span")
        .collect();
    cols::set_columns(&base, &TRAJECTORY, arrays)
}
