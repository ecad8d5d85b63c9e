//! The `rlcr generate-answers` engine, turn 1 of the RLCR rollout, behind a clap-free [`Plan`]
//! and [`run`].
//!
//! Prompts table in, G_a sampled answers per prompt out. Each answer row is the prompt row taken
//! G_a times (so any extra prompt column passes through) with the sampled columns set:
//! `messages` becomes the conversation the answer responds to (system prompt + the prompt's
//! messages + the response prefix as a partial assistant message, if any). The prompts are
//! processed in order, in chunks, and written as they complete, so memory stays bounded.

use anyhow::{bail, Context, Result};
use arrow::array::{Array, RecordBatch, UInt32Array};

use super::prompts::{answer_messages, DEFAULT_SYSTEM_PROMPT};
use super::sampler::SampleId;
use super::spans::{answer_span, context_opens};
use super::stage::{self, ModelJob, Sampler, SamplingPlan, Summary};
use crate::model::Message;
use crate::table::{cols, Writer, PROMPTS, TRAJECTORY};

/// What to sample: the validated form of `rlcr generate-answers`' flags.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Model, device, the prompts table in and the answers table out, shard, seed, command line.
    pub job: ModelJob,
    /// Answers per prompt (G_a ≥ 1).
    pub num_answers: usize,
    /// A system prompt replacing the prompts' own (`""` for none); `None`: the prompt's, else
    /// RLCR's default ([`answer_messages`]).
    pub system_prompt: Option<String>,
    pub sampling: SamplingPlan,
}

impl Plan {
    /// The plan of `num_answers` (≥ 1) answers per prompt; the system prompt given as text, or
    /// read from `system_prompt_file`.
    pub fn new(
        job: ModelJob,
        num_answers: usize,
        system_prompt: Option<String>,
        system_prompt_file: Option<&std::path::Path>,
        sampling: SamplingPlan,
    ) -> Result<Plan> {
        if num_answers == 0 {
            bail!("--num-answers must be at least 1");
        }
        let system_prompt = match system_prompt_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .with_context(|| format!("reading --system-prompt-file {}", p.display()))?,
            ),
            None => system_prompt,
        };
        Ok(Plan {
            job,
            num_answers,
            system_prompt,
            sampling,
        })
    }
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

/// Sample the answers of `plan` into its output; the sampler's totals.
pub fn run(plan: &Plan) -> Result<Summary> {
    let shard = plan.job.shard;
    let system = &plan.system_prompt;
    let device = plan.job.device.open()?;
    let (reader, name) = stage::open_input(&plan.job, &PROMPTS, &["prompt_id", "messages"])?;
    let total_prompts = reader.num_rows();
    if total_prompts == 0 {
        bail!("{name}: the table has no rows; nothing was written");
    }
    let s = &plan.sampling;
    let (policy, cfg, mut config) = s.load(&plan.job, &device, "generate-answers")?;
    config["num_answers"] = plan.num_answers.into();
    config["system_prompt"] = match &system {
        Some(s) => s.clone().into(),
        None => serde_json::json!({"default": DEFAULT_SYSTEM_PROMPT}),
    };
    let meta = stage::output_meta(&plan.job, s, "generate-answers", config)?;

    let mut sampler = Sampler::new(
        &policy,
        &cfg,
        "generate-answers",
        total_prompts * plan.num_answers,
    );
    let mut writer: Option<Writer> = None;
    let mut seen = std::collections::HashSet::new();
    let mut base_row = 0usize;
    for batch in reader {
        let batch = batch?;
        let pid = cols::str_col(&batch, &name, "prompt_id")?;
        let msg = cols::messages(&batch, &name)?;
        let mut prepared = Vec::new();
        for i in 0..batch.num_rows() {
            let loc = || format!("{name}, row {}", base_row + i);
            stage::require_values(
                &loc,
                "null where a value is required",
                &[("prompt_id", pid.is_null(i)), ("messages", msg.is_null(i))],
            )?;
            let id = pid.value(i).to_string();
            if !seen.insert(id.clone()) {
                bail!("{}, column `prompt_id`: duplicate prompt_id {id:?}", loc());
            }
            if shard.is_some_and(|s| !s.contains(&id)) {
                continue;
            }
            let prompt = stage::messages_cell(msg.value(i), &loc)?;
            let messages =
                answer_messages(&prompt, system.as_deref(), s.response_prefix.as_deref());
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
        let g_a = plan.num_answers;
        sampler.write_chunks(
            &prepared,
            g_a,
            &mut writer,
            &plan.job.out,
            &meta,
            |sm, chunk| sample_chunk(sm, &batch, chunk, g_a),
        )?;
        base_row += batch.num_rows();
    }
    sampler.progress.finish();
    stage::finish_output(writer, &name, "prompts to sample from", shard.is_some())?;
    Ok(sampler.summary)
}

/// Sample `g_a` answers for each prompt of `chunk` and build their rows.
fn sample_chunk(
    sm: &mut Sampler,
    batch: &RecordBatch,
    chunk: &[Prepared],
    g_a: usize,
) -> Result<RecordBatch> {
    let results = sm.sample(
        chunk,
        g_a,
        |p| p.context_ids.clone(),
        |p, k| SampleId {
            prompt_id: p.prompt_id.clone(),
            answer_idx: k,
            confidence_idx: None,
        },
    )?;
    let mut take = Vec::with_capacity(chunk.len() * g_a);
    let mut c = stage::SampledColumns::default();
    for (p, res) in chunk.iter().zip(&results) {
        for (k, gen) in res.iter().enumerate() {
            let span = answer_span(&gen.text, &gen.ends, p.think_prefilled);
            sm.summary.add(gen, span);
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
