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

use anyhow::{bail, Context, Result};
use arrow::array::{Array, RecordBatch, UInt32Array};

use super::prompts::{answer_turn, confidence_messages, confidence_query};
use super::sampler::SampleId;
use super::spans::{confidence_span, context_opens_confidence};
use super::stage::{self, ModelJob, Sampler, SamplingPlan, Summary};
use crate::model::Message;
use crate::table::{self, cols, SampleType, Writer, TRAJECTORY};

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

/// One answer ready for its confidences.
struct Prepared {
    row: usize,
    prompt_id: String,
    answer_idx: u32,
    messages: Vec<Message>,
    context_ids: Vec<u32>,
    opened: bool,
}

/// Sample the confidences of `plan` into its output; the sampler's totals.
pub fn run(plan: &Plan) -> Result<Summary> {
    let shard = plan.job.shard;
    let query = &plan.confidence_prompt;
    let device = plan.job.device.open()?;
    let (reader, name) = stage::open_input(
        &plan.job,
        &TRAJECTORY,
        &[
            "prompt_id",
            "sample_type",
            "answer_idx",
            "messages",
            "response_ids",
            "response_text",
            "finish_reason",
        ],
    )?;
    for c in LATER_COLUMNS {
        if reader.has_column(c) {
            bail!(
                "{name}: has the column `{c}` of a later stage; generate-confidence reads the \
                 answers table written by generate-answers"
            );
        }
    }
    let total_answers = reader.num_rows();
    if total_answers == 0 {
        bail!("{name}: the table has no rows; nothing was written");
    }
    let s = &plan.sampling;
    let (policy, cfg, mut config) = s.load(&plan.job, &device, "generate-confidence")?;
    config["num_confidences"] = plan.num_confidences.into();
    config["confidence_prompt"] = query.clone().into();
    config["system_prompt"] = match &plan.system_prompt {
        Some(s) => s.clone().into(),
        None => "as recorded in the answers' messages".into(),
    };
    let meta = stage::output_meta(&plan.job, s, "generate-confidence", config)?;

    let stop_ids = policy.model.tokenizer.stop_ids.clone();
    let mut sampler = Sampler::new(
        &policy,
        &cfg,
        "generate-confidence",
        total_answers * plan.num_confidences,
    );
    let mut writer: Option<Writer> = None;
    let mut spliced = 0usize;
    let mut seen = std::collections::HashSet::new();
    let mut base_row = 0usize;
    let vocab = policy.model.config.vocab_size;
    let mut validator = table::Validator::new(&name, &TRAJECTORY);
    for batch in reader {
        let batch = batch?;
        validator.check_batch(&batch)?;
        // rlcr's types and nullability for the documented columns, whatever wrote the table (the
        // confidence rows built below carry rlcr's; the answer rows are copied beside them).
        let batch = cols::conform(&batch, &TRAJECTORY, &name)?;
        let pid = cols::str_col(&batch, &name, "prompt_id")?;
        let st = cols::str_col(&batch, &name, "sample_type")?;
        let aidx = cols::i32_col(&batch, &name, "answer_idx")?;
        let msg = cols::messages(&batch, &name)?;
        let text = cols::str_col(&batch, &name, "response_text")?;
        let rids = cols::list_i32(&batch, &name, "response_ids")?;
        let mut prepared = Vec::new();
        for i in 0..batch.num_rows() {
            let loc = || format!("{name}, row {}", base_row + i);
            stage::require_values(
                &loc,
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
            if !seen.insert((id.clone(), answer_idx)) {
                bail!("{}: duplicate answer ({id:?}, answer_idx {k})", loc());
            }
            if shard.is_some_and(|s| !s.contains(&id)) {
                continue;
            }
            let conv = stage::messages_cell(msg.value(i), &loc)?;
            let (before, answer_prefix) = answer_turn(conv, plan.system_prompt.as_deref());
            let mut answer_ids = stage::token_ids(&rids, i, &loc, "response_ids", vocab)?;
            // The end-of-turn is the template's: a final EOS token is not part of the answer.
            if answer_ids.last().is_some_and(|t| stop_ids.contains(t)) {
                answer_ids.pop();
            }
            let after = confidence_query(query, s.response_prefix.as_deref());
            let answer_text = text.value(i);
            let (ctx_text, context_ids, ok) = policy
                .encode_with_answer(&before, &answer_prefix, answer_text, &answer_ids, &after)
                .with_context(|| format!("{}: building the confidence context", loc()))?;
            spliced += ok as usize;
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
            prepared.push(Prepared {
                row: i,
                prompt_id: id,
                answer_idx,
                messages,
                context_ids,
                opened: context_opens_confidence(&ctx_text),
            });
        }
        let g_c = plan.num_confidences;
        sampler.write_chunks(
            &prepared,
            g_c,
            &mut writer,
            &plan.job.out,
            &meta,
            |sm, chunk| sample_chunk(sm, &batch, chunk, g_c),
        )?;
        base_row += batch.num_rows();
    }
    sampler.progress.finish();
    let summary = sampler.summary;
    validator.finish()?;
    stage::finish_output(
        writer,
        &name,
        "answers to sample confidences for",
        shard.is_some(),
    )?;
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

/// Sample `g_c` confidences for each answer of `chunk`; rows: each answer followed by its
/// confidences.
fn sample_chunk(
    sm: &mut Sampler,
    batch: &RecordBatch,
    chunk: &[Prepared],
    g_c: usize,
) -> Result<RecordBatch> {
    let results = sm.sample(
        chunk,
        g_c,
        |p| p.context_ids.clone(),
        |p, h| SampleId {
            prompt_id: p.prompt_id.clone(),
            answer_idx: p.answer_idx,
            confidence_idx: Some(h),
        },
    )?;
    let mut take = Vec::with_capacity(chunk.len() * g_c);
    let mut c = stage::SampledColumns::default();
    for (p, res) in chunk.iter().zip(&results) {
        for (h, gen) in res.iter().enumerate() {
            let span = confidence_span(&gen.text, &gen.ends, p.opened);
            sm.summary.add(gen, span);
            take.push(p.row as u32);
            c.push(
                SampleType::Confidence.as_str(),
                stage::to_i32(p.answer_idx as usize, "answer_idx")?,
                Some(stage::to_i32(h, "confidence_idx")?),
                format!("{}/a{}/c{h}", p.prompt_id, p.answer_idx),
                &p.messages,
                &p.context_ids,
                gen,
                None,
                span,
            )?;
        }
    }
    let n_conf = take.len();
    let conf_base = arrow::compute::take_record_batch(batch, &UInt32Array::from(take))?;
    let conf = cols::set_columns(&conf_base, &TRAJECTORY, c.into_arrays())?;
    // The answers themselves, unchanged but for the two confidence columns (added null if absent).
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
