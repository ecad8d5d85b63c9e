//! The `rlcr generate-answers` engine, turn 1 of the RLCR rollout, behind a clap-free [`Plan`]
//! and [`run`].
//!
//! Prompts table in, G_a sampled answers per prompt out. Each answer row is the prompt row taken
//! G_a times (so any extra prompt column passes through) with the sampled columns set:
//! `messages` becomes the conversation the answer responds to (system prompt + the prompt's
//! messages + the response prefix as a partial assistant message, if any). The prompts are
//! processed in order, in chunks, and written as they complete, so memory stays bounded.

use std::collections::HashSet;

use anyhow::{bail, Context, Result};
use arrow::array::{Array, RecordBatch, UInt32Array};

use super::policy::Policy;
use super::prompts::{answer_messages, DEFAULT_SYSTEM_PROMPT};
use super::spans::context_opens;
use super::stage::{
    self, InputBatch, Item, ItemKind, ModelJob, Sampled, SamplingPlan, Summary, TableStage,
};
use crate::table::{cols, TableSpec, PROMPTS, TRAJECTORY};

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

/// What one run has seen: the prompt ids so far (each must be new).
pub(crate) struct Run {
    seen: HashSet<String>,
}

impl TableStage for Plan {
    type Run = Run;
    type Report = ();
    const NAME: &'static str = "generate-answers";
    const INPUT: &'static TableSpec = &PROMPTS;
    const REQUIRED: &'static [&'static str] = &["prompt_id", "messages"];
    const NOTHING: &'static str = "prompts to sample from";

    fn config(&self, config: &mut serde_json::Value) {
        config["num_answers"] = self.num_answers.into();
        config["system_prompt"] = match &self.system_prompt {
            Some(s) => s.clone().into(),
            None => serde_json::json!({"default": DEFAULT_SYSTEM_PROMPT}),
        };
    }

    fn start(&self, _name: &str) -> Run {
        Run {
            seen: HashSet::new(),
        }
    }

    /// Every prompt of the shard, its context checked against the model's positions.
    fn items(&self, run: &mut Run, policy: &Policy, batch: &InputBatch) -> Result<Vec<Item>> {
        let pid = cols::str_col(batch.rows, batch.name, "prompt_id")?;
        let msg = cols::messages(batch.rows, batch.name)?;
        let prefix = self.sampling.response_prefix.as_deref();
        batch.items(|i, loc| {
            stage::require_values(
                loc,
                "null where a value is required",
                &[("prompt_id", pid.is_null(i)), ("messages", msg.is_null(i))],
            )?;
            let id = pid.value(i).to_string();
            if !run.seen.insert(id.clone()) {
                bail!("{}, column `prompt_id`: duplicate prompt_id {id:?}", loc());
            }
            if self.job.shard.is_some_and(|s| !s.contains(&id)) {
                return Ok(None);
            }
            let prompt = stage::messages_cell(msg.value(i), loc)?;
            let messages = answer_messages(&prompt, self.system_prompt.as_deref(), prefix);
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
            Ok(Some(Item {
                row: i,
                prompt_id: id,
                kind: ItemKind::Prompt,
                messages,
                context_ids,
                opened: context_opens(&text, "<think>", &["</think>"]),
            }))
        })
    }

    /// Each answer row: its prompt row with the sampled columns set.
    fn rows(&self, batch: &RecordBatch, _chunk: &[Item], sampled: Sampled) -> Result<RecordBatch> {
        let take = UInt32Array::from(sampled.input_rows);
        let base = arrow::compute::take_record_batch(batch, &take)?;
        // Answers carry no confidence_span (generate-confidence adds it).
        let arrays: Vec<_> = sampled
            .columns
            .into_arrays()
            .into_iter()
            .filter(|(n, _)| *n != "confidence_span")
            .collect();
        cols::set_columns(&base, &TRAJECTORY, arrays)
    }

    fn end(&self, _run: Run) -> Result<()> {
        Ok(())
    }
}

/// Sample the answers of `plan` into its output; the sampler's totals.
pub fn run(plan: &Plan) -> Result<Summary> {
    let (summary, _) = stage::run_table(plan, &plan.job, &plan.sampling, plan.num_answers)?;
    Ok(summary)
}
