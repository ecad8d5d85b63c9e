//! The `generate-multiturn` stage engine: a prompts table and an environment command in, a
//! trajectory table of multi-turn rollouts out (see [`super::multiturn`] for the rollout and
//! [`super::env`] for the protocol). Clap-free: the CLI builds a [`Plan`] and calls [`run`].
//!
//! Rows are answer rows of the trajectory schema (`sample_type` = `answer`, `sample_id`
//! `{prompt_id}/a{k}`), with, beyond the single-turn columns:
//! - `info_mask` (false on observation tokens) and `token_turn_ids` (model turn, -1 on
//!   observation tokens);
//! - `turn_rewards`: list<float32>, the environment's `turn_reward` of each model turn (null
//!   where it gave none), so that `score --rewards` gives turn `i` the `i`-th value
//!   (`[[turn]] column = "turn_rewards"`) and `advantage --estimator grpo-multiturn` normalises
//!   them per turn;
//! - `num_turns` (int32) and `env_extra` (JSON text: the list of each turn's `extra`, null where
//!   none).
//!
//! The table is written once every rollout is done, through a temporary file: an environment
//! that fails stops the stage with nothing written.
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use arrow::array::{
    Array, ArrayRef, Float32Array, Int32Array, ListArray, StringArray, UInt32Array,
};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field};

use super::env::ExternalEnv;
use super::multiturn::{rollout, Episode, Limits, Rollout};
use super::prompts::{assemble, without_system};
use super::sampler::SampleId;
use super::spans::{answer_span, context_opens};
use super::stage::{self, ModelJob, SamplingPlan, Summary};
use crate::model::Message;
use crate::table::{self, cols, Meta, Writer, PROMPTS, TRAJECTORY};

/// Everything the stage needs (validated by [`run`]).
#[derive(Debug, Clone)]
pub struct Plan {
    /// Model, device, the prompts table in and the rollouts table out, seed, command line (no
    /// shard).
    pub job: ModelJob,
    pub num_answers: usize,
    /// `sh -c` command of the environment.
    pub env_cmd: String,
    pub env_timeout: Duration,
    pub limits: Limits,
    /// Per model turn: `max_new_tokens`; `stop`: strings that end a model turn (besides EOS).
    pub sampling: SamplingPlan,
    /// `Some("")`: none; `None`: the prompt's own messages as they are.
    pub system_prompt: Option<String>,
}

impl Plan {
    /// The environment's reply timeout, checked: a positive number of seconds.
    pub fn env_timeout(seconds: f64) -> Result<Duration> {
        if !(seconds.is_finite() && seconds > 0.0) {
            anyhow::bail!("--env-timeout must be a positive number of seconds");
        }
        Ok(Duration::from_secs_f64(seconds))
    }
}

/// The conversation of a rollout: the prompt's messages, the system prompt replaced when one is
/// given, a response prefix as a final partial assistant message.
pub fn conversation(
    prompt: &[Message],
    system: Option<&str>,
    prefix: Option<&str>,
) -> Vec<Message> {
    match system {
        Some(s) => assemble(Some(s), without_system(prompt), prefix),
        None => assemble(None, prompt, prefix),
    }
}

struct Prompt {
    row: usize,
    batch: usize,
    think_prefilled: bool,
    episode: Episode,
}

/// Run the stage; returns the summary line.
pub fn run(plan: &Plan) -> Result<String> {
    if plan.num_answers == 0 {
        bail!("--num-answers must be at least 1");
    }
    if plan.env_cmd.trim().is_empty() {
        bail!("--env-cmd is empty");
    }
    let device = plan.job.device.open()?;
    let (reader, name) = stage::open_input(
        &plan.job,
        &PROMPTS,
        &["prompt_id", "messages", "data_source", "ground_truth"],
    )?;
    let batches = reader.read_all()?;
    if batches.iter().all(|b| b.num_rows() == 0) {
        bail!("{name}: the table has no rows; nothing was written");
    }
    let (policy, cfg, mut config) = plan
        .sampling
        .load(&plan.job, &device, "generate-multiturn")?;

    // Prompts.
    let mut prompts: Vec<Prompt> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut base_row = 0usize;
    for (bi, b) in batches.iter().enumerate() {
        let pid = cols::str_col(b, &name, "prompt_id")?;
        let msg = cols::messages(b, &name)?;
        let src = cols::str_col(b, &name, "data_source")?;
        let gt = cols::str_col(b, &name, "ground_truth")?;
        for i in 0..b.num_rows() {
            let loc = || format!("{name}, row {}", base_row + i);
            stage::require_values(
                &loc,
                "null where a value is required",
                &[
                    ("prompt_id", pid.is_null(i)),
                    ("messages", msg.is_null(i)),
                    ("data_source", src.is_null(i)),
                    ("ground_truth", gt.is_null(i)),
                ],
            )?;
            let id = pid.value(i).to_string();
            if !seen.insert(id.clone()) {
                bail!("{}, column `prompt_id`: duplicate prompt_id {id:?}", loc());
            }
            let prompt = stage::messages_cell(msg.value(i), &loc)?;
            let messages = conversation(
                &prompt,
                plan.system_prompt.as_deref(),
                plan.sampling.response_prefix.as_deref(),
            );
            let (text, context) = policy
                .encode_context(&messages)
                .with_context(|| format!("{}: building the context", loc()))?;
            let ground_truth = serde_json::from_str(gt.value(i))
                .unwrap_or_else(|_| serde_json::Value::String(gt.value(i).to_string()));
            prompts.push(Prompt {
                row: i,
                batch: bi,
                think_prefilled: context_opens(&text, "<think>", &["</think>"]),
                episode: Episode {
                    context,
                    messages,
                    data_source: src.value(i).to_string(),
                    ground_truth,
                    samples: (0..plan.num_answers as u32)
                        .map(|k| SampleId {
                            prompt_id: id.clone(),
                            answer_idx: k,
                            confidence_idx: None,
                        })
                        .collect(),
                },
            });
        }
        base_row += b.num_rows();
    }

    // Rollouts.
    config["num_answers"] = plan.num_answers.into();
    config["env_cmd"] = plan.env_cmd.clone().into();
    config["env_timeout_s"] = plan.env_timeout.as_secs_f64().into();
    config["max_turns"] = plan.limits.max_turns.into();
    config["max_response_tokens"] = plan.limits.max_response_tokens.into();
    config["system_prompt"] = plan.system_prompt.clone().into();
    config["response_prefix"] = plan.sampling.response_prefix.clone().into();
    config["argv"] = plan.job.argv.clone().into();
    let mut meta = Meta::new(
        &TRAJECTORY,
        "generate-multiturn",
        config,
        &[plan.job.input.as_path(), plan.job.model.as_path()],
    );
    let mut env = ExternalEnv::spawn(&plan.env_cmd, plan.env_timeout)?;
    let total = (prompts.len() * plan.num_answers) as u64;
    let mut progress = crate::progress::Progress::new("generate-multiturn", total, "rows");
    let episodes: Vec<Episode> = prompts.iter().map(|p| p.episode.clone()).collect();
    let decode = |ids: &[u32]| policy.decode(ids);
    let encode = |text: &str| policy.model.tokenizer.encode(text, false);
    let mut tokens = 0usize;
    let mut requests = 0usize;
    let mut meter = stage::Meter::start(|| {
        crate::model::memory::PoolWatch::new(&policy.model.transformer.device())
    });
    let results = rollout(
        &policy,
        &decode,
        &encode,
        &episodes,
        &cfg,
        &plan.limits,
        &mut env,
        &mut |r| {
            tokens += r.tokens;
            requests += r.env_requests;
            meter.step();
            progress.inc(r.finished as u64);
        },
    )?;
    env.finish()?;
    progress.finish();
    let seconds = meter.seconds();
    // Host transfers and kernel launches per step, as generate-answers reports them.
    let mut moves = Summary::default();
    meter.add_to(&mut moves);
    moves.log_costs("generate-multiturn");

    // Statistics (summary line and the `rlcr.multiturn_summary` metadata).
    let all: Vec<&Rollout> = results.iter().flatten().collect();
    let n_rows = all.len().max(1) as f64;
    let turn_rewards: Vec<f64> = all
        .iter()
        .flat_map(|r| r.turns.iter().filter_map(|t| t.reward))
        .collect();
    let turns_total: usize = all.iter().map(|r| r.turns.len()).sum();
    let done_rows = all
        .iter()
        .filter(|r| r.turns.last().is_some_and(|t| t.done))
        .count();
    let info_tokens: usize = all
        .iter()
        .map(|r| r.info_mask.iter().filter(|&&m| !m).count())
        .sum();
    let mean_turn_reward = (!turn_rewards.is_empty())
        .then(|| turn_rewards.iter().sum::<f64>() / turn_rewards.len() as f64);
    let stats = serde_json::json!({
        "rollouts": all.len(),
        "turns_per_rollout": turns_total as f64 / n_rows,
        "ended_by_environment": done_rows,
        "environment_requests": requests,
        "mean_turn_reward": mean_turn_reward,
        "model_tokens": tokens,
        "observation_tokens": info_tokens,
        "seconds": seconds,
    });
    meta.extra
        .insert("multiturn_summary".into(), stats.to_string());

    // Rows, per input batch, in prompt order.
    let mut summary = Summary::default();
    let mut writer: Option<Writer> = None;
    for (bi, b) in batches.iter().enumerate() {
        let mut take = Vec::new();
        let mut c = stage::SampledColumns::default();
        let mut info = Vec::new();
        let mut turn_ids = Vec::new();
        let mut rewards: Vec<Vec<Option<f32>>> = Vec::new();
        let mut num_turns = Vec::new();
        let mut extra = Vec::new();
        for (p, res) in prompts.iter().zip(&results).filter(|(p, _)| p.batch == bi) {
            for (k, r) in res.iter().enumerate() {
                let g = r.generated();
                let span = answer_span(&g.text, &g.ends, p.think_prefilled);
                summary.add(&g, span);
                take.push(p.row as u32);
                c.push(
                    "answer",
                    stage::to_i32(k, "answer_idx")?,
                    None,
                    format!("{}/a{k}", p.episode.samples[k].prompt_id),
                    &p.episode.messages,
                    &p.episode.context,
                    &g,
                    span,
                    None,
                )?;
                info.push(r.info_mask.clone());
                turn_ids.push(r.turn_ids.clone());
                rewards.push(r.turns.iter().map(|t| t.reward.map(|x| x as f32)).collect());
                num_turns.push(stage::to_i32(r.turns.len(), "num_turns")?);
                extra.push(extras_json(r));
            }
        }
        if take.is_empty() {
            continue;
        }
        let base = arrow::compute::take_record_batch(b, &UInt32Array::from(take))?;
        let mut arrays: Vec<(&str, ArrayRef)> = c
            .into_arrays()
            .into_iter()
            .filter(|(n, _)| *n != "confidence_span")
            .collect();
        arrays.push(("info_mask", cols::build_list_bool(&info)));
        arrays.push(("token_turn_ids", cols::build_list_i32(&turn_ids)));
        arrays.push(("turn_rewards", list_f32_nullable_items(&rewards)));
        arrays.push(("num_turns", Arc::new(Int32Array::from(num_turns))));
        arrays.push(("env_extra", Arc::new(StringArray::from(extra))));
        let out = cols::set_columns(&base, &TRAJECTORY, arrays)?;
        table::io::write_lazily(&mut writer, &plan.job.out, &meta, &out)?;
    }
    let Some(w) = writer else {
        bail!("{name}: no prompts to sample from; nothing was written");
    };
    w.finish()?;
    summary.tokens = tokens;
    summary.seconds = seconds;
    Ok(format!(
        "{}; {} environment requests, {:.2} turns per rollout, {} of {} ended by the environment, {} observation tokens, mean turn reward {}",
        summary.line("generate-multiturn", "answer_span"),
        requests,
        turns_total as f64 / n_rows,
        done_rows,
        summary.rows,
        info_tokens,
        mean_turn_reward.map_or("-".to_string(), |x| format!("{x:.4}"))
    ))
}

/// `env_extra`: the JSON list of each turn's `extra` (null where none).
fn extras_json(r: &Rollout) -> String {
    let v: Vec<serde_json::Value> = r
        .turns
        .iter()
        .map(|t| t.extra.clone().unwrap_or(serde_json::Value::Null))
        .collect();
    serde_json::Value::Array(v).to_string()
}

/// A `list<float32>` whose items may be null (rows are never null).
fn list_f32_nullable_items(rows: &[Vec<Option<f32>>]) -> ArrayRef {
    let mut offsets: Vec<i32> = vec![0];
    let mut values: Vec<Option<f32>> = Vec::new();
    for r in rows {
        values.extend_from_slice(r);
        offsets.push(values.len() as i32);
    }
    let field = Arc::new(Field::new("item", DataType::Float32, true));
    Arc::new(ListArray::new(
        field,
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        Arc::new(Float32Array::from(values)),
        None,
    ))
}
