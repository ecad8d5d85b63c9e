//! Rows for the supervised warm start (`rlcr sft`).
//!
//! Two kinds of input table:
//! - **messages**: a `messages` column (JSON list of `{role, content}`) whose last turn is the
//!   assistant target. The context is the chat template rendered over the earlier turns with the
//!   generation prompt (exactly what `generate-answers` feeds the model); the response is the
//!   rest of the fully rendered conversation (the target, the end-of-turn token and whatever the
//!   template puts after it), tokenized on its own so that the context ids are the ones sampling
//!   would see. A template whose full rendering does not start with the prompt rendering (some
//!   strip earlier reasoning) is an error naming the row.
//! - **trajectory**: `context_ids` + `response_ids` (a trajectory or scored table). With
//!   `only_correct`, answer rows are kept when `acc_reward == 1` and confidence rows when
//!   `conf_reward ≥ min_conf_reward` (dropped when that is not given).
//!
//! Every response token is learnable; the advantage is 1 (unused by the NLL) and the behaviour
//! log-probs 0 (unused).
use std::path::Path;

use anyhow::{bail, Context, Result};
use arrow::array::Array;

use crate::model::{Message, Model};
use crate::table::{cols, Reader, SampleType};

use super::data::TrainRow;

/// Which rows of a trajectory table to keep.
#[derive(Debug, Clone, Copy, Default)]
pub struct SftFilter {
    /// Keep only correct answers (and good confidences, see `min_conf_reward`).
    pub only_correct: bool,
    /// With `only_correct`: keep confidence rows whose `conf_reward` is at least this.
    pub min_conf_reward: Option<f64>,
}

/// The kind of SFT table found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SftSource {
    /// `messages` with a final assistant turn.
    Messages,
    /// `context_ids` / `response_ids`.
    Trajectory,
}

/// A row of the SFT table: the target response of one conversation.
fn make_row(context: Vec<u32>, response: Vec<u32>, is_confidence: bool) -> TrainRow {
    let n = response.len();
    TrainRow {
        context,
        response,
        old_logp: vec![0.0; n],
        adv: vec![1.0; n],
        mask: vec![true; n],
        ref_logp: None,
        is_confidence,
    }
}

/// Context and response ids of a conversation whose last turn is the assistant target.
pub fn encode_target(model: &Model, messages: &[Message]) -> Result<(Vec<u32>, Vec<u32>)> {
    let Some((last, prompt)) = messages.split_last() else {
        bail!("empty conversation");
    };
    if last.role != "assistant" {
        bail!(
            "the last turn has role {:?}, expected \"assistant\"",
            last.role
        );
    }
    if prompt.is_empty() {
        bail!("no turn before the assistant target");
    }
    let chat = model.chat()?;
    let ctx_text = chat.render(prompt, true)?;
    let full_text = chat.render(messages, false)?;
    let Some(rest) = full_text.strip_prefix(&ctx_text) else {
        bail!(
            "the chat template's rendering of the whole conversation does not start with its \
             rendering of the prompt (with the generation prompt), so the target cannot be cut out"
        );
    };
    let context = model.tokenizer.encode(&ctx_text, false)?;
    let response = model.tokenizer.encode(rest, false)?;
    if context.is_empty() || response.is_empty() {
        bail!("empty context or target after tokenization");
    }
    Ok((context, response))
}

/// Read an SFT table into training rows.
pub fn read_sft_rows(
    path: &Path,
    model: &Model,
    filter: SftFilter,
) -> Result<(SftSource, Vec<TrainRow>)> {
    let probe = Reader::open(path)?;
    let name = path.display().to_string();
    let source = if probe.has_column("response_ids") && probe.has_column("context_ids") {
        SftSource::Trajectory
    } else if probe.has_column("messages") {
        SftSource::Messages
    } else {
        bail!(
            "{name}: an SFT table needs either `messages` (ending with the assistant target) or \
             `context_ids` + `response_ids`"
        );
    };
    drop(probe);
    if filter.only_correct && source == SftSource::Messages {
        bail!("{name}: --only-correct needs a trajectory table (with acc_reward), not messages");
    }
    let mut rows = Vec::new();
    let mut row0 = 0usize;
    match source {
        SftSource::Messages => {
            for b in Reader::open_columns(path, &["messages", "sample_type"])? {
                let b = b?;
                let msgs = cols::messages(&b, &name)?;
                for i in 0..b.num_rows() {
                    let at = row0 + i;
                    if msgs.is_null(i) {
                        bail!("{name}: row {at}, column `messages`: null");
                    }
                    let m: Vec<Message> = serde_json::from_str(msgs.value(i)).with_context(|| {
                        format!("{name}: row {at}, column `messages`: not a JSON list of {{role, content}}")
                    })?;
                    let (c, r) = encode_target(model, &m)
                        .with_context(|| format!("{name}: row {at}, column `messages`"))?;
                    rows.push(make_row(c, r, false));
                }
                row0 += b.num_rows();
            }
        }
        SftSource::Trajectory => {
            let cols_wanted = [
                "context_ids",
                "response_ids",
                "sample_type",
                "acc_reward",
                "conf_reward",
            ];
            for b in Reader::open_columns(path, &cols_wanted)? {
                let b = b?;
                let ctx = cols::list_i32(&b, &name, "context_ids")?;
                let resp = cols::list_i32(&b, &name, "response_ids")?;
                let stype = match b.column_by_name("sample_type") {
                    Some(_) => Some(cols::str_col(&b, &name, "sample_type")?),
                    None => None,
                };
                let acc = if filter.only_correct {
                    Some(cols::f32_col(&b, &name, "acc_reward").with_context(|| {
                        "--only-correct needs the acc_reward column of a scored table"
                    })?)
                } else {
                    None
                };
                let conf = match (filter.only_correct, filter.min_conf_reward) {
                    (true, Some(_)) => Some(cols::f32_col(&b, &name, "conf_reward")?),
                    _ => None,
                };
                for i in 0..b.num_rows() {
                    let at = row0 + i;
                    let is_conf =
                        stype.is_some_and(|s| s.sample_type(i) == Some(SampleType::Confidence));
                    if filter.only_correct {
                        let keep = if is_conf {
                            match (conf, filter.min_conf_reward) {
                                (Some(c), Some(min)) => c.is_valid(i) && c.value(i) as f64 >= min,
                                _ => false,
                            }
                        } else {
                            acc.is_some_and(|a| a.is_valid(i) && a.value(i) == 1.0)
                        };
                        if !keep {
                            continue;
                        }
                    }
                    if ctx.is_null(i) || resp.is_null(i) {
                        bail!("{name}: row {at}: null context_ids or response_ids");
                    }
                    let ids = |v: &cols::ListView<'_, arrow::array::Int32Array>,
                               col: &str|
                     -> Result<Vec<u32>> {
                        v.values.values()[v.range(i)]
                            .iter()
                            .map(|&x| {
                                u32::try_from(x).map_err(|_| {
                                    anyhow::anyhow!(
                                        "{name}: row {at}, column `{col}`: negative token id {x}"
                                    )
                                })
                            })
                            .collect()
                    };
                    let c = ids(&ctx, "context_ids")?;
                    let r = ids(&resp, "response_ids")?;
                    if r.is_empty() {
                        continue;
                    }
                    if c.is_empty() {
                        bail!("{name}: row {at}: empty context_ids");
                    }
                    rows.push(make_row(c, r, is_conf));
                }
                row0 += b.num_rows();
            }
        }
    }
    Ok((source, rows))
}
