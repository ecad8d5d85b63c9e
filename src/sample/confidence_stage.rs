//! The `rlcr generate-confidence` engine, turn 2 of the RLCR rollout, behind a clap-free [`Plan`]
//! and [`run`].
//!
//! Answers table in; out: every answer row unchanged (plus null `confidence_idx` /
//! `confidence_span` if it lacked them), each followed by its G_c confidence rows. A confidence
//! row is its answer row taken again (so prompt columns and any extra column pass through) with
//! the sampled columns set and `answer_span` null (it refers to another response). Its context is
//! the answer's conversation + `assistant(answer)` + `user(confidence query)`, with the answer's
//! **sampled ids** spliced in (see [`crate::sample::policy`]); the G_c samples of one answer share
//! that context, prefilled once.

use std::collections::HashSet;

use anyhow::{bail, Context, Result};
use arrow::array::{Array, RecordBatch, UInt32Array};

use super::policy::Policy;
use super::prompts::{answer_turn, confidence_messages, confidence_query};
use super::spans::context_opens_confidence;
use super::stage::{
    self, InputBatch, Item, ItemKind, ModelJob, Sampled, SamplingPlan, Summary, TableStage,
};
use crate::table::{self, cols, Reader, SampleType, TableSpec, TRAJECTORY};

/// What to sample: the validated form of `rlcr generate-confidence`'s flags.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Model, device, the answers table in and the trajectory table out, shard, seed, command line.
    pub job: ModelJob,
    /// Confidences per answer (G_c ≥ 1).
    pub num_confidences: usize,
    /// The turn-2 user message (not blank).
    pub confidence_prompt: String,
    /// A system prompt replacing the recorded one (`""` for none).
    pub system_prompt: Option<String>,
    pub sampling: SamplingPlan,
}

impl Plan {
    /// The plan of `num_confidences` (≥ 1) confidences per answer, asked for with
    /// `confidence_prompt` (default: RLCR's request; not blank).
    pub fn new(
        job: ModelJob,
        num_confidences: usize,
        confidence_prompt: Option<String>,
        system_prompt: Option<String>,
        sampling: SamplingPlan,
    ) -> Result<Plan> {
        if num_confidences == 0 {
            bail!("--num-confidences must be at least 1");
        }
        let query = confidence_prompt
            .unwrap_or_else(|| super::prompts::DEFAULT_CONFIDENCE_PROMPT.to_string());
        if query.trim().is_empty() {
            bail!("--confidence-prompt is empty");
        }
        Ok(Plan {
            job,
            num_confidences,
            confidence_prompt: query,
            system_prompt,
            sampling,
        })
    }
}

/// Columns of later stages: an input that has them is not an answers table.
const LATER_COLUMNS: &[&str] = &[
    "acc_reward",
    "reward",
    "advantage",
    "token_advantages",
    "loss_mask",
];

/// What one run has seen: the answers so far (each must be new), how many of their contexts
/// reuse the sampled ids, and the input's rows checked against the schema's rules.
pub(crate) struct Run {
    name: String,
    seen: HashSet<(String, u32)>,
    spliced: usize,
    validator: table::Validator,
}

impl TableStage for Plan {
    type Run = Run;
    type Report = usize;
    const NAME: &'static str = "generate-confidence";
    const INPUT: &'static TableSpec = &TRAJECTORY;
    const REQUIRED: &'static [&'static str] = &[
        "prompt_id",
        "sample_type",
        "answer_idx",
        "messages",
        "response_ids",
        "response_text",
        "finish_reason",
    ];
    const NOTHING: &'static str = "answers to sample confidences for";

    fn check_input(&self, reader: &Reader, name: &str) -> Result<()> {
        for c in LATER_COLUMNS {
            if reader.has_column(c) {
                bail!(
                    "{name}: has the column `{c}` of a later stage; generate-confidence reads the \
                     answers table written by generate-answers"
                );
            }
        }
        Ok(())
    }

    fn config(&self, config: &mut serde_json::Value) {
        config["num_confidences"] = self.num_confidences.into();
        config["confidence_prompt"] = self.confidence_prompt.clone().into();
        config["system_prompt"] = match &self.system_prompt {
            Some(s) => s.clone().into(),
            None => "as recorded in the answers' messages".into(),
        };
    }

    fn start(&self, name: &str) -> Run {
        Run {
            name: name.to_string(),
            seen: HashSet::new(),
            spliced: 0,
            validator: table::Validator::new(name, &TRAJECTORY),
        }
    }

    /// The batch checked against the schema's rules, with rlcr's types and nullability for the
    /// documented columns whatever wrote the table (the confidence rows built from it carry
    /// rlcr's; the answer rows are copied beside them).
    fn conform(&self, run: &mut Run, batch: RecordBatch) -> Result<RecordBatch> {
        run.validator.check_batch(&batch)?;
        cols::conform(&batch, &TRAJECTORY, &run.name)
    }

    /// Every answer of the shard (the input must hold answer rows only), its confidence context
    /// built and checked against the model's positions.
    fn items(&self, run: &mut Run, policy: &Policy, batch: &InputBatch) -> Result<Vec<Item>> {
        let (b, name) = (batch.rows, batch.name);
        let pid = cols::str_col(b, name, "prompt_id")?;
        let st = cols::str_col(b, name, "sample_type")?;
        let aidx = cols::i32_col(b, name, "answer_idx")?;
        let msg = cols::messages(b, name)?;
        let text = cols::str_col(b, name, "response_text")?;
        let rids = cols::list_i32(b, name, "response_ids")?;
        let stop_ids = &policy.model.tokenizer.stop_ids;
        let vocab = policy.model.config.vocab_size;
        let query = &self.confidence_prompt;
        let prefix = self.sampling.response_prefix.as_deref();
        batch.items(|i, loc| {
            stage::require_values(
                loc,
                "null",
                &[
                    ("prompt_id", pid.is_null(i)),
                    ("sample_type", st.is_null(i)),
                    ("answer_idx", aidx.is_null(i)),
                    ("messages", msg.is_null(i)),
                    ("response_text", text.is_null(i)),
                    ("response_ids", rids.is_null(i)),
                ],
            )?;
            if st.sample_type(i) != Some(SampleType::Answer) {
                bail!(
                    "{}: sample_type is {:?}; the input must hold answer rows only (generate-answers' output)",
                    loc(),
                    st.value(i)
                );
            }
            let id = pid.value(i).to_string();
            let k = aidx.value(i);
            let answer_idx = u32::try_from(k)
                .with_context(|| format!("{}, column `answer_idx`: negative ({k})", loc()))?;
            if !run.seen.insert((id.clone(), answer_idx)) {
                bail!("{}: duplicate answer ({id:?}, answer_idx {k})", loc());
            }
            if self.job.shard.is_some_and(|s| !s.contains(&id)) {
                return Ok(None);
            }
            let conv = stage::messages_cell(msg.value(i), loc)?;
            let (before, answer_prefix) = answer_turn(conv, self.system_prompt.as_deref());
            let mut answer_ids = stage::token_ids(&rids, i, loc, "response_ids", vocab)?;
            // The end-of-turn is the template's: a final EOS token is not part of the answer.
            if answer_ids.last().is_some_and(|t| stop_ids.contains(t)) {
                answer_ids.pop();
            }
            let after = confidence_query(query, prefix);
            let answer_text = text.value(i);
            let (ctx_text, context_ids, ok) = policy
                .encode_with_answer(&before, &answer_prefix, answer_text, &answer_ids, &after)
                .with_context(|| format!("{}: building the confidence context", loc()))?;
            run.spliced += ok as usize;
            let max_pos = policy.model.config.max_position_embeddings;
            if context_ids.len() >= max_pos {
                bail!(
                    "{}: the confidence context of answer {id:?}/a{k} is {} tokens, but the model \
                     accepts at most {max_pos} positions (context + response); use shorter answers \
                     (--max-new-tokens in generate-answers)",
                    loc(),
                    context_ids.len()
                );
            }
            let messages =
                confidence_messages(&before, &format!("{answer_prefix}{answer_text}"), &after);
            Ok(Some(Item {
                row: i,
                prompt_id: id,
                kind: ItemKind::Answer(answer_idx),
                messages,
                context_ids,
                opened: context_opens_confidence(&ctx_text),
            }))
        })
    }

    /// Each answer of the chunk, unchanged but for the two confidence columns (added null if
    /// absent), followed by its confidence rows: the answer row taken again with the sampled
    /// columns set.
    fn rows(&self, batch: &RecordBatch, chunk: &[Item], sampled: Sampled) -> Result<RecordBatch> {
        let g_c = self.num_confidences;
        let take = UInt32Array::from(sampled.input_rows);
        let n_conf = take.len();
        let conf_base = arrow::compute::take_record_batch(batch, &take)?;
        let conf = cols::set_columns(&conf_base, &TRAJECTORY, sampled.columns.into_arrays())?;
        let rows: Vec<u32> = chunk.iter().map(|p| p.row as u32).collect();
        let ans_base = arrow::compute::take_record_batch(batch, &UInt32Array::from(rows))?;
        let n_ans = ans_base.num_rows();
        let mut add = Vec::new();
        if ans_base.column_by_name("confidence_idx").is_none() {
            add.push((
                "confidence_idx",
                std::sync::Arc::new(arrow::array::Int32Array::from(vec![None::<i32>; n_ans]))
                    as arrow::array::ArrayRef,
            ));
        }
        if ans_base.column_by_name("confidence_span").is_none() {
            add.push(("confidence_span", cols::build_spans(&vec![None; n_ans])));
        }
        let answers = cols::set_columns(&ans_base, &TRAJECTORY, add)?;
        let answers = RecordBatch::try_new(conf.schema(), answers.columns().to_vec())
            .context("internal: answer and confidence rows have different columns")?;
        let both = arrow::compute::concat_batches(&conf.schema(), &[answers, conf])?;
        // Interleave: answer j, then its g_c confidences.
        let mut order = Vec::with_capacity(n_ans + n_conf);
        for j in 0..n_ans {
            order.push(j as u32);
            for h in 0..g_c {
                order.push((n_ans + j * g_c + h) as u32);
            }
        }
        Ok(arrow::compute::take_record_batch(
            &both,
            &UInt32Array::from(order),
        )?)
    }

    /// The input's rows checked to the end; how many contexts reuse the answers' sampled ids.
    fn end(&self, run: Run) -> Result<usize> {
        run.validator.finish()?;
        Ok(run.spliced)
    }
}

/// Sample the confidences of `plan` into its output; the sampler's totals.
pub fn run(plan: &Plan) -> Result<Summary> {
    let (summary, spliced) =
        stage::run_table(plan, &plan.job, &plan.sampling, plan.num_confidences)?;
    let answers = summary.rows / plan.num_confidences;
    if spliced < answers {
        crate::info!(
            "warning: for {} of {answers} answers the chat template rewrites the assistant message, \
             so the confidence context re-tokenizes the answer text instead of reusing its sampled ids",
            answers - spliced
        );
    }
    Ok(summary)
}
