//! The scoring stage's engine (`rlcr score`): verifiers, Brier, format checks and structured
//! rewards over a trajectory table (no model), behind a clap-free [`Plan`] and [`run`].
//!
//! Streaming design. The output has the input's row groups, row for row. Columns the stage does
//! not compute are copied from the input as encoded Parquet column chunks (no decoding, no
//! re-compression: token lists and log-probs never reach memory as Arrow arrays); only the
//! columns the verifiers read are decoded, in batches of [`input::BATCH_ROWS`] (the repetitive
//! `sample_type`, `data_source` and `ground_truth` as dictionaries), and only the seven score
//! columns are encoded. Old score columns are replaced, and the columns the `advantage` stage
//! derives from rewards (`advantage`, `token_advantages`, `loss_mask`, `returns`,
//! `trajectory_score`) are dropped, so a re-scored table never carries stale values.
//!
//! Confidence rows need their own answer's accuracy. A first pass validates the table with the
//! one [`crate::table::Validator`] (reading only the columns its rules need: identities, token
//! lists, spans), which also links each confidence row to its answer row by
//! `(prompt_id, answer_idx)`,
//! rejecting duplicates and orphans. When every answer comes before its confidences (tables
//! written by generate-confidence), the scoring pass handles a batch's answers before its
//! confidences and remembers the accuracies; otherwise a pre-pass verifies all answers first (and
//! the external verifier is asked once per answer either way).
//!
//! Three threads: a reader decodes batches; a scorer verifies and scores each batch with rayon
//! (rows in parallel, collected in row order, so the output does not depend on the thread count)
//! and encodes the score columns of each finished row group; the calling thread splices them and
//! copies the other column chunks into the output (1 MiB reads, 4 MiB writes), which is written
//! atomically with the settings in `rlcr.config` and a summary in `rlcr.score_summary`.
//!
//! Files: this one holds the plan, the verifying and scoring of a batch and the pipeline;
//! [`input`] the reading and validation, [`output`] the score columns' builders and encoding;
//! what an external verifier's requests carry is [`super::external`]'s.
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field};
use parquet::file::metadata::KeyValue;
use rayon::prelude::*;
use serde::Serialize;

use crate::reward::external::{self, ExternalVerifier, Reply, Request, RequestFailed};
use crate::reward::rlcr;
use crate::reward::rows::{
    self, AnswerScore, ConfidenceScore, CountdownCompat, GroundTruth, ParentAnswer, Preset,
    RowScore, Settings,
};
use crate::reward::structured::{ComponentSpec, Value};
use crate::reward::text::last_answer;
use crate::reward::{auto_verifier, VerifierKind};
use crate::table::splice::{self, Part};
use crate::table::validate::Links;
use crate::table::{self, Meta, SampleType, Shard, TRAJECTORY};

mod input;
mod output;

use input::{
    column_names, dictionary_hints, kinds_of, str_at, validate, Input, Needs, RgCols, RowIds, Strs,
};
use output::{encode_row_group, score_fields, RowGroupOut, ScoreBuilders, Scored};

/// The columns the stage writes, in the trajectory schema's order.
pub const SCORE_COLUMNS: [&str; 7] = [
    "answer",
    "format_ok",
    "acc_reward",
    "confidence",
    "conf_reward",
    "reward",
    "reward_components",
];
/// Columns derived from rewards by later stages: dropped, never left stale.
pub const STALE_COLUMNS: [&str; 5] = [
    "advantage",
    "token_advantages",
    "loss_mask",
    "returns",
    "trajectory_score",
];

/// What to score, and how: the validated form of `rlcr score`'s flags.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The trajectory table (a file or a folder of part files).
    pub input: PathBuf,
    /// The scored table.
    pub out: PathBuf,
    /// Verifiers, formats and rewards.
    pub settings: Settings,
    /// An external verifier command (`sh -c`) and how long it may take for each reply.
    pub external: Option<(String, Duration)>,
    /// Only the rows of this shard.
    pub shard: Option<Shard>,
    /// The resolved configuration, stored as `rlcr.config`.
    pub config: serde_json::Value,
}

/// Fewest rows a rayon task scores: smaller tasks cost more in scheduling (and in rayon's idle
/// spinning between them) than they gain in balance.
const MIN_TASK_ROWS: usize = 1024;

/// Score the table of `plan`; the summary is also stored in the output's metadata.
pub fn run(plan: &Plan) -> Result<Summary> {
    score(plan)
}

// ---------------------------------------------------------------------------------------------
// summary

/// What a scoring run saw (printed, and stored as `rlcr.score_summary` in the output).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub rows: u64,
    pub answers: u64,
    pub confidences: u64,
    pub sum_accuracy: f64,
    pub answer_format_ok: u64,
    pub confidence_format_ok: u64,
    pub confidence_parse_strict: u64,
    pub confidence_parse_lenient: u64,
    /// data_source → verifier used.
    pub verifiers: BTreeMap<String, String>,
    /// Countdown score level → count.
    pub countdown_scores: BTreeMap<String, u64>,
    pub dropped_columns: Vec<String>,
    /// Wall time (printed; not stored, so that the same input gives the same file).
    #[serde(skip)]
    pub seconds: f64,
}

impl Summary {
    /// The summary line of a run that wrote `out`.
    pub fn line(&self, out: &Path) -> String {
        format!(
            "scored {} rows ({} answers, {} confidences) in {:.2}s ({:.0} rows/s); mean acc {:.4}, \
             answer format ok {:.4}, confidence parse ok {:.4} (lenient {:.4}) -> {}",
            self.rows,
            self.answers,
            self.confidences,
            self.seconds,
            self.rows as f64 / self.seconds.max(1e-9),
            self.mean_accuracy(),
            self.answer_format_rate(),
            self.strict_parse_rate(),
            self.lenient_parse_rate(),
            out.display()
        )
    }

    pub fn mean_accuracy(&self) -> f64 {
        self.sum_accuracy / (self.answers.max(1) as f64)
    }
    pub fn answer_format_rate(&self) -> f64 {
        self.answer_format_ok as f64 / (self.answers.max(1) as f64)
    }
    pub fn strict_parse_rate(&self) -> f64 {
        self.confidence_parse_strict as f64 / (self.confidences.max(1) as f64)
    }
    pub fn lenient_parse_rate(&self) -> f64 {
        self.confidence_parse_lenient as f64 / (self.confidences.max(1) as f64)
    }
}

// ---------------------------------------------------------------------------------------------
// verifying answer rows

/// A verifier's verdict on one answer row.
#[derive(Debug, Clone)]
struct Verdict<'a> {
    /// The extracted answer, borrowed from the response when it is a slice of it.
    answer: Option<Cow<'a, str>>,
    correct: f64,
    countdown: Option<f32>,
    extra: Vec<(String, f64)>,
}

impl Verdict<'_> {
    fn into_owned(self) -> Verdict<'static> {
        Verdict {
            answer: self.answer.map(|a| Cow::Owned(a.into_owned())),
            correct: self.correct,
            countdown: self.countdown,
            extra: self.extra,
        }
    }
}

/// The prompt text TinyZero's scorer sees before the response, rendered from `messages` as
/// ChatML (Qwen's template): `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
/// `<|im_start|>assistant\n`, or a final assistant message left open as a prefill.
pub fn chatml_prefix(messages_json: &str) -> Result<String> {
    let v: serde_json::Value =
        serde_json::from_str(messages_json).context("`messages` is not JSON")?;
    let msgs = v.as_array().context("`messages` is not a JSON list")?;
    let mut s = String::new();
    for (i, m) in msgs.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(|r| r.as_str())
            .context("a message has no string `role`")?;
        let content = m.get("content").and_then(|c| c.as_str()).unwrap_or("");
        let last = i + 1 == msgs.len();
        if last && role == "assistant" {
            s.push_str(&format!("<|im_start|>assistant\n{content}"));
            return Ok(s);
        }
        s.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
    }
    s.push_str("<|im_start|>assistant\n");
    Ok(s)
}

struct Ctx<'a> {
    settings: &'a Settings,
    path: &'a Path,
}

/// Per-thread caches of [`verify_one`]: the last ground truth parsed, the last prompt rendered,
/// the last data_source resolved (rows of one prompt are adjacent and share them).
#[derive(Default)]
struct VerifyCache {
    /// Dictionary key of the cached ground truth (keys are per batch, as is a cache).
    gt_key: Option<i32>,
    gt_text: String,
    gt: Option<(VerifierKind, GroundTruth)>,
    msg_text: String,
    prefix: String,
    ds: Option<(String, VerifierKind)>,
    /// Dictionary key of the cached data source.
    ds_key: Option<i32>,
}

/// Verify answer row `i` with the built-in verifiers.
fn verify_one<'b>(
    ctx: &Ctx<'_>,
    c: &'b RgCols,
    i: usize,
    cache: &mut VerifyCache,
) -> Result<(Verdict<'b>, VerifierKind)> {
    let row = c.rows.at(i);
    // data source and ground truth: the strings are fetched (and null rows refused) only when
    // the row's dictionary key is not the cached one
    let ds_key = c.data_source.valid_key(i);
    let kind = match (ctx.settings.verifier, cache.ds.as_ref()) {
        (Some(k), _) if ds_key.is_some() => k,
        (None, Some((_, k))) if ds_key.is_some() && ds_key == cache.ds_key => *k,
        (verifier, cached) => {
            let ds = str_at(&c.data_source, i, ctx.path, "data_source", row)?;
            match (verifier, cached) {
                (Some(k), _) => k,
                (None, Some((d, k))) if d == ds => {
                    let k = *k;
                    cache.ds_key = ds_key;
                    k
                }
                (None, _) => {
                    let k = auto_verifier(ds);
                    cache.ds = Some((ds.to_string(), k));
                    cache.ds_key = ds_key;
                    k
                }
            }
        }
    };
    if ctx.settings.preset == Preset::Tinyzero && kind != VerifierKind::Countdown {
        let ds = str_at(&c.data_source, i, ctx.path, "data_source", row)?;
        bail!(
            "{}, row {row}: --reward-preset tinyzero needs the countdown verifier, but data_source {ds:?} uses {}",
            ctx.path.display(),
            kind.name()
        );
    }
    let key = c.ground_truth.valid_key(i);
    let cached_kind = matches!(&cache.gt, Some((k, _)) if *k == kind);
    if !(cached_kind && key.is_some() && key == cache.gt_key) {
        let gts = str_at(&c.ground_truth, i, ctx.path, "ground_truth", row)?;
        if !(cached_kind && cache.gt_text.as_str() == gts) {
            let gt = GroundTruth::parse(kind, gts).with_context(|| {
                format!("{}, row {row}, column `ground_truth`", ctx.path.display())
            })?;
            cache.gt = Some((kind, gt));
            cache.gt_text.clear();
            cache.gt_text.push_str(gts);
        }
        cache.gt_key = key;
    }
    let (_, gt) = cache.gt.as_ref().context("internal: ground-truth cache")?;
    let response = str_at(&c.response, i, ctx.path, "response_text", row)?;
    let pre = if kind == VerifierKind::Countdown
        && ctx.settings.countdown_compat == CountdownCompat::Tinyzero
    {
        let m = c.messages.as_ref().context("internal: messages not read")?;
        let mt = str_at(m, i, ctx.path, "messages", row)?;
        if cache.msg_text.as_str() != mt {
            cache.prefix = chatml_prefix(mt)
                .with_context(|| format!("{}, row {row}, column `messages`", ctx.path.display()))?;
            cache.msg_text.clear();
            cache.msg_text.push_str(mt);
        }
        Some(cache.prefix.as_str())
    } else {
        None
    };
    let (answer, correct, countdown) = rows::verify_builtin(kind, ctx.settings, response, pre, gt);
    Ok((
        Verdict {
            answer,
            correct,
            countdown,
            extra: Vec::new(),
        },
        kind,
    ))
}

/// Verify the answer rows `rows` (indices into the batch) with the built-in verifiers.
fn verify_builtin_rows<'b>(
    ctx: &Ctx<'_>,
    c: &'b RgCols,
    rows: &[usize],
) -> Result<Vec<(Verdict<'b>, VerifierKind)>> {
    let out: Vec<Result<(Verdict<'b>, VerifierKind)>> = rows
        .par_iter()
        .with_min_len(MIN_TASK_ROWS)
        .map_init(VerifyCache::default, |cache, &i| {
            verify_one(ctx, c, i, cache)
        })
        .collect();
    out.into_iter().collect()
}

/// Verify answer rows with the external verifier; `cols` are the columns its requests carry
/// ([`external::row_columns`]). A request the verifier reports an error for is named by its row.
fn verify_external_rows<'b>(
    ext: &mut ExternalVerifier,
    ctx: &Ctx<'_>,
    c: &'b RgCols,
    rows: &[usize],
    cols: &[String],
) -> Result<Vec<Verdict<'b>>> {
    let at = |row: u64| format!("{}, row {row}", ctx.path.display());
    let arrays: Vec<(&str, &dyn Array)> = cols
        .iter()
        .map(|name| {
            c.extra
                .get(name)
                .map(|a| (name.as_str(), a.as_ref()))
                .with_context(|| format!("internal: column `{name}` not read"))
        })
        .collect::<Result<_>>()?;
    let sample_ids = c
        .sample_id
        .as_ref()
        .context("internal: sample_id not read")?;
    // the ground truths and prompts the requests borrow
    let mut owned: Vec<(serde_json::Value, Option<String>)> = Vec::with_capacity(rows.len());
    for &i in rows {
        let row = c.rows.at(i);
        let gt = str_at(&c.ground_truth, i, ctx.path, "ground_truth", row)?;
        let prompt = match &c.messages {
            Some(m) if !m.is_null(i) => external::last_user_content(m.value(i)),
            _ => None,
        };
        owned.push((external::ground_truth_value(gt), prompt));
    }
    let mut reqs: Vec<Request<'_>> = Vec::with_capacity(rows.len());
    for (&i, (gt, prompt)) in rows.iter().zip(&owned) {
        let row = c.rows.at(i);
        let response = str_at(&c.response, i, ctx.path, "response_text", row)?;
        let messages = match &c.messages {
            Some(m) if !m.is_null(i) => serde_json::from_str(m.value(i)).ok(),
            _ => None,
        };
        let (extra_info, columns) =
            external::row_columns(arrays.iter().copied(), i).with_context(|| at(row))?;
        reqs.push(Request {
            id: row,
            sample_id: str_at(sample_ids, i, ctx.path, "sample_id", row)?,
            data_source: str_at(&c.data_source, i, ctx.path, "data_source", row)?,
            prompt: prompt.as_deref(),
            response,
            answer: last_answer(response),
            ground_truth: gt,
            messages: Some(messages.unwrap_or(serde_json::Value::Null)),
            extra_info: Some(extra_info),
            columns: Some(columns),
        });
    }
    let replies: Vec<Reply> = ext.verify(&reqs).map_err(|e| {
        // the verifier's own error for one request: name its row (the request id is the row)
        match e.downcast_ref::<RequestFailed>() {
            Some(f) => {
                let row = c.rows.at(rows[f.index]);
                e.context(at(row))
            }
            None => e,
        }
    })?;
    drop(reqs);
    Ok(rows
        .iter()
        .zip(replies)
        .map(|(&i, rep)| Verdict {
            answer: last_answer(c.response.value(i)).map(Cow::Borrowed),
            correct: rep.correct,
            countdown: None,
            extra: rep.extra,
        })
        .collect())
}

/// Record in `seen` that `verifier` scores the answers of `data_source` (the first one recorded
/// stays).
fn note_verifier(seen: &mut BTreeMap<String, String>, data_source: &str, verifier: &str) {
    if !seen.contains_key(data_source) {
        seen.insert(data_source.to_string(), verifier.to_string());
    }
}

/// Values of a column used by the rewards TOML, at row `i`.
fn column_value(a: &ArrayRef, i: usize) -> Result<Value> {
    use arrow::array::AsArray;
    use arrow::datatypes::{Float32Type, Float64Type, Int32Type, Int64Type};
    if a.is_null(i) {
        return Ok(Value::Missing);
    }
    let scalar = |a: &dyn Array, i: usize| -> Result<Option<f64>> {
        if a.is_null(i) {
            return Ok(None);
        }
        Ok(Some(match a.data_type() {
            DataType::Float32 => a.as_primitive::<Float32Type>().value(i) as f64,
            DataType::Float64 => a.as_primitive::<Float64Type>().value(i),
            DataType::Int32 => a.as_primitive::<Int32Type>().value(i) as f64,
            DataType::Int64 => a.as_primitive::<Int64Type>().value(i) as f64,
            DataType::Boolean => a.as_boolean().value(i) as u8 as f64,
            other => bail!("type {other} is not a number, a boolean or a list of them"),
        }))
    };
    let per_turn = |v: ArrayRef| -> Result<Value> {
        Ok(Value::PerTurn(
            (0..v.len())
                .map(|j| scalar(v.as_ref(), j))
                .collect::<Result<_>>()?,
        ))
    };
    match a.data_type() {
        DataType::List(_) => per_turn(a.as_list::<i32>().value(i)),
        DataType::LargeList(_) => per_turn(a.as_list::<i64>().value(i)),
        _ => Ok(scalar(a.as_ref(), i)?.map_or(Value::Missing, Value::Scalar)),
    }
}

/// The reward components of row `i` (columns the rewards TOML reads come from the batch) and
/// their total.
fn components_and_reward(
    ctx: &Ctx<'_>,
    c: &RgCols,
    i: usize,
    row: &RowScore<'_>,
) -> Result<(rows::Components, f64)> {
    let mut err = None;
    let components = rows::components(ctx.settings, row, |_: &ComponentSpec, name| {
        column_value(&c.extra[name], i).unwrap_or_else(|e| {
            err = Some(anyhow!("column `{name}`: {e}"));
            Value::Missing
        })
    });
    if let Some(e) = err {
        return Err(e);
    }
    let reward = rows::reward(&components);
    Ok((components, reward))
}

fn scored_answer<'a>(
    ctx: &Ctx<'_>,
    c: &RgCols,
    i: usize,
    a: AnswerScore<'a>,
) -> Result<Scored<'a>> {
    let row = RowScore::Answer(&a);
    let (components, reward) = components_and_reward(ctx, c, i, &row)?;
    let conf_reward = a.rlcr_terms.map(|t| t.brier).or_else(|| {
        a.confidence.map(|cf| {
            if a.format_ok {
                rlcr::brier_reward(a.accuracy, Some(cf))
            } else {
                0.0
            }
        })
    });
    Ok(Scored {
        answer: a.answer,
        format_ok: a.format_ok,
        acc: a.accuracy as f32,
        confidence: a.confidence.map(|x| x as f32),
        conf_reward: conf_reward.map(|x| x as f32),
        components,
        reward: reward as f32,
    })
}

fn scored_confidence(
    ctx: &Ctx<'_>,
    c: &RgCols,
    i: usize,
    s: &ConfidenceScore,
    parent: ParentAnswer,
) -> Result<Scored<'static>> {
    let row = RowScore::Confidence(s, parent);
    let (components, reward) = components_and_reward(ctx, c, i, &row)?;
    Ok(Scored {
        answer: None,
        format_ok: s.format_ok,
        acc: parent.accuracy as f32,
        confidence: s.confidence.map(|x| x as f32),
        conf_reward: Some(s.conf_reward as f32),
        components,
        reward: reward as f32,
    })
}

// ---------------------------------------------------------------------------------------------
// the stage

/// The scoring side of the pipeline: state carried from batch to batch.
struct Scorer<'a> {
    settings: &'a Settings,
    links: Links,
    needs: Needs,
    spec_cols: Vec<String>,
    /// Columns sent to the external verifier: `extra_info` and those not in the trajectory
    /// schema.
    request_cols: Vec<String>,
    /// Accuracy of every answer seen (only when the table has confidence rows).
    parents: HashMap<u128, ParentAnswer>,
    /// Verdicts from the pre-pass (only when a confidence precedes its answer).
    pre: HashMap<u64, Verdict<'static>>,
    ext: Option<ExternalVerifier>,
    summary: Summary,
    /// Countdown scores 0, 0.1 and 1 seen.
    countdown_levels: [u64; 3],
}

impl Scorer<'_> {
    fn verify<'b>(
        &mut self,
        path: &Path,
        c: &'b RgCols,
        ans: &[usize],
    ) -> Result<Vec<Verdict<'b>>> {
        let ctx = Ctx {
            settings: self.settings,
            path,
        };
        match self.ext.as_mut() {
            Some(e) => {
                for &i in ans {
                    note_verifier(
                        &mut self.summary.verifiers,
                        c.data_source.value_at(i),
                        "external",
                    );
                }
                verify_external_rows(e, &ctx, c, ans, &self.request_cols)
            }
            None => {
                let vk = verify_builtin_rows(&ctx, c, ans)?;
                for (&i, (_, k)) in ans.iter().zip(&vk) {
                    note_verifier(
                        &mut self.summary.verifiers,
                        c.data_source.value_at(i),
                        k.name(),
                    );
                }
                Ok(vk.into_iter().map(|(v, _)| v).collect())
            }
        }
    }

    /// Pre-pass: verify every answer and remember its accuracy (when a confidence row comes
    /// before its answer).
    fn pre_pass(&mut self, input: &Input) -> Result<()> {
        let spec_cols = self.spec_cols.clone();
        let names = column_names(self.needs, &spec_cols);
        for (pi, p) in input.parts.iter().enumerate() {
            for rg in 0..p.row_groups() {
                for b in input.batches(pi, rg, &names)? {
                    let (b, rows) = b?;
                    let c = RgCols::from_batch(&b, rows, &p.path, self.needs, &spec_cols)?;
                    let ans: Vec<usize> = (0..c.sample_type.len())
                        .filter(|&i| c.sample_type.value_at(i) == "answer")
                        .collect();
                    let verdicts = self.verify(&p.path, &c, &ans)?;
                    for (&i, v) in ans.iter().zip(verdicts) {
                        let a = rows::score_answer(
                            self.settings,
                            c.response.value(i),
                            v.answer.clone(),
                            v.correct,
                            v.countdown,
                            v.extra.clone(),
                        );
                        self.parents.insert(
                            c.key(i)?,
                            ParentAnswer {
                                correct: a.correct,
                                accuracy: a.accuracy,
                            },
                        );
                        self.pre.insert(c.rows.at(i), v.into_owned());
                    }
                }
            }
        }
        Ok(())
    }

    /// Score one batch, appending its rows to `out`.
    fn batch(&mut self, path: &Path, c: &RgCols, out: &mut ScoreBuilders) -> Result<()> {
        let _t = crate::trace::span_with("score: verify batch", || {
            vec![("rows", c.sample_type.len().into())]
        });
        let settings = self.settings;
        let ctx = Ctx { settings, path };
        let n = c.sample_type.len();
        let kinds = kinds_of(&c.sample_type, path, &c.rows)?;
        let ans: Vec<usize> = (0..n).filter(|&i| kinds[i] == SampleType::Answer).collect();
        // answers: verdict, then every score, in one parallel pass (indexed collects, so the
        // results land in place)
        let finish = |i: usize, v, kind| finish_answer(&ctx, c, i, v, kind);
        let answers: Vec<Result<AnswerOut>> = if self.links.forward || self.ext.is_some() {
            let verdicts: Vec<Verdict> = if self.links.forward {
                ans.iter()
                    .map(|&i| {
                        self.pre
                            .remove(&c.rows.at(i))
                            .context("internal: pre-pass verdict missing")
                    })
                    .collect::<Result<_>>()?
            } else {
                self.verify(path, c, &ans)?
            };
            ans.par_iter()
                .zip(verdicts.into_par_iter())
                .with_min_len(MIN_TASK_ROWS)
                .map(|(&i, v)| finish(i, v, None))
                .collect()
        } else {
            ans.par_iter()
                .with_min_len(MIN_TASK_ROWS)
                .map_init(VerifyCache::default, |cache, &i| {
                    let (v, kind) = verify_one(&ctx, c, i, cache)?;
                    finish(i, v, Some(kind))
                })
                .collect()
        };
        let has_conf = ans.len() < n;
        let mut answer_scored: Vec<Scored> =
            Vec::with_capacity(if has_conf { ans.len() } else { 0 });
        let mut last_ds: Option<&str> = None;
        let mut last_ds_key: Option<i32> = None;
        for (&i, r) in ans.iter().zip(answers) {
            let a = r?;
            if let Some(k) = a.kind {
                // (the row's verifier follows from its data source: an equal key, a known entry)
                let key = c.data_source.valid_key(i);
                if key.is_none() || key != last_ds_key {
                    let ds = c.data_source.value_at(i);
                    if last_ds != Some(ds) {
                        if !self.summary.verifiers.contains_key(ds) {
                            self.summary
                                .verifiers
                                .insert(ds.to_string(), k.name().to_string());
                        }
                        last_ds = Some(ds);
                    }
                    last_ds_key = key;
                }
            }
            match a.countdown {
                Some(0.0) => self.countdown_levels[0] += 1,
                Some(1.0) => self.countdown_levels[2] += 1,
                Some(_) => self.countdown_levels[1] += 1,
                None => {}
            }
            if self.links.confidences > 0 && !self.links.forward {
                self.parents.insert(c.key(i)?, a.parent);
            }
            self.summary.rows += 1;
            self.summary.answers += 1;
            self.summary.sum_accuracy += a.scored.acc as f64;
            self.summary.answer_format_ok += a.scored.format_ok as u64;
            if has_conf {
                answer_scored.push(a.scored);
            } else {
                out.push(&a.scored);
            }
        }
        if !has_conf {
            return Ok(());
        }
        // confidences: their answer's accuracy is known by now
        let confs: Vec<usize> = (0..n)
            .filter(|&i| kinds[i] == SampleType::Confidence)
            .collect();
        let parents = &self.parents;
        let conf_scored: Vec<Result<Scored>> = confs
            .par_iter()
            .with_min_len(MIN_TASK_ROWS)
            .map(|&i| -> Result<Scored> {
                let row = c.rows.at(i);
                let resp = str_at(&c.response, i, path, "response_text", row)?;
                let parent = *parents
                    .get(&c.key(i)?)
                    .context("internal: answer of a confidence row not scored")?;
                let s = rows::score_confidence(settings, resp, parent.accuracy);
                scored_confidence(&ctx, c, i, &s, parent)
                    .with_context(|| format!("{}, row {row}", path.display()))
            })
            .collect();
        let mut answer_it = answer_scored.into_iter();
        let mut conf_it = confs.iter().zip(conf_scored);
        for k in &kinds {
            match k {
                SampleType::Answer => {
                    out.push(&answer_it.next().context("internal: answer count")?)
                }
                SampleType::Confidence => {
                    let (&i, r) = conf_it.next().context("internal: confidence count")?;
                    let s = r?;
                    let sm = &mut self.summary;
                    sm.rows += 1;
                    sm.confidences += 1;
                    sm.confidence_format_ok += s.format_ok as u64;
                    sm.confidence_parse_strict += s.confidence.is_some() as u64;
                    sm.confidence_parse_lenient +=
                        rlcr::parse_confidence_lenient(c.response.value(i)).is_some() as u64;
                    out.push(&s);
                }
            }
        }
        Ok(())
    }

    /// Score one row group from the reader thread's batches (ending with `None`); returns its
    /// score columns and, with a row filter, the kept rows' batches (their other columns are
    /// encoded again).
    fn row_group(
        &mut self,
        p: &Part,
        rg: usize,
        fields: &[Field],
        batches: &Receiver<Result<Option<(RecordBatch, RowIds)>>>,
        filtered: bool,
    ) -> Result<(Vec<ArrayRef>, Vec<RecordBatch>)> {
        let spec_cols = self.spec_cols.clone();
        let mut scored = ScoreBuilders::new(p.rg_rows(rg));
        let mut kept = Vec::new();
        let mut read = 0usize;
        loop {
            let (b, rows) = match batches.recv() {
                Ok(Ok(Some(b))) => b,
                Ok(Ok(None)) => break,
                Ok(Err(e)) => return Err(e),
                Err(_) => bail!("internal: the reader thread stopped"),
            };
            read += match &rows {
                RowIds::Run(_) => b.num_rows(),
                RowIds::Picked(_) => 0,
            };
            let c = RgCols::from_batch(&b, rows, &p.path, self.needs, &spec_cols)?;
            self.batch(&p.path, &c, &mut scored)?;
            if filtered {
                kept.push(b);
            }
        }
        if !filtered && read != p.rg_rows(rg) {
            bail!(
                "{}: row group {rg} read {read} rows, its metadata says {}",
                p.path.display(),
                p.rg_rows(rg)
            );
        }
        Ok((scored.finish(fields)?, kept))
    }
}

/// Complete answer row `i` from its verdict: every score, the components and the reward.
fn finish_answer<'b>(
    ctx: &Ctx<'_>,
    c: &'b RgCols,
    i: usize,
    v: Verdict<'b>,
    kind: Option<VerifierKind>,
) -> Result<AnswerOut<'b>> {
    let countdown = v.countdown;
    let a = rows::score_answer(
        ctx.settings,
        c.response.value(i),
        v.answer,
        v.correct,
        v.countdown,
        v.extra,
    );
    let parent = ParentAnswer {
        correct: a.correct,
        accuracy: a.accuracy,
    };
    let scored = scored_answer(ctx, c, i, a)
        .with_context(|| format!("{}, row {}", ctx.path.display(), c.rows.at(i)))?;
    Ok(AnswerOut {
        scored,
        parent,
        countdown,
        kind,
    })
}

/// An answer row scored: its output, what its confidences need, and what the summary counts.
struct AnswerOut<'a> {
    scored: Scored<'a>,
    parent: ParentAnswer,
    countdown: Option<f32>,
    /// The built-in verifier used (None for the external one and pre-pass verdicts).
    kind: Option<VerifierKind>,
}

/// Score the table of `plan` into its output (the rows of its shard, if any; their row numbers
/// in errors count over the whole input); returns the summary.
fn score(plan: &Plan) -> Result<Summary> {
    let (input, out, settings) = (&plan.input, &plan.out, &plan.settings);
    let start = Instant::now();
    crate::fs::check_distinct(&[input.as_path()], out)?;
    let parts = splice::open_parts(input)?;
    let total_rows: u64 = parts.iter().map(Part::rows).sum();
    if total_rows == 0 {
        bail!(
            "{}: the table has no rows; nothing was written",
            input.display()
        );
    }
    let links = validate(input, &parts)?;
    let fields = score_fields()?;
    let drop: Vec<&str> = STALE_COLUMNS.to_vec();
    let placement = splice::Placement::Canonical(&TRAJECTORY);
    let lay = splice::Layout::new(&parts[0], &fields, &drop, placement, false)?;
    let dropped = lay.dropped.clone();
    let mut spec_cols: Vec<String> = settings
        .structured
        .as_ref()
        .map(|s| s.columns().into_iter().map(str::to_string).collect())
        .unwrap_or_default();
    // The external verifier's requests carry `extra_info` and the columns that are not rlcr's.
    let request_cols: Vec<String> = match &plan.external {
        Some(_) => external::request_columns(parts[0].meta.schema().fields()),
        None => vec![],
    };
    for c in &request_cols {
        if !spec_cols.contains(c) {
            spec_cols.push(c.clone());
        }
    }
    let needs = Needs {
        ids: links.confidences > 0,
        sample_id: plan.external.is_some(),
        messages: settings.countdown_compat == CountdownCompat::Tinyzero || plan.external.is_some(),
    };
    let ext = match &plan.external {
        Some((cmd, t)) => Some(ExternalVerifier::spawn(cmd, *t)?),
        None => None,
    };

    // output
    let meta = Meta::new(&TRAJECTORY, "score", plan.config.clone(), &[input]);
    let props =
        table::io::writer_properties(table::io::Encoding::Scalars, Some(meta.key_values()))?;
    let (mut writer, encoders) = splice::create(lay, props, out)?;
    if !dropped.is_empty() {
        crate::info!(
            "dropping stale columns derived from the old rewards: {}",
            dropped.join(", ")
        );
    }
    let mut progress = crate::progress::Progress::new("score", total_rows, "rows");
    let mut scorer = Scorer {
        settings,
        links,
        needs,
        spec_cols,
        request_cols,
        parents: HashMap::new(),
        pre: HashMap::new(),
        ext,
        summary: Summary {
            dropped_columns: dropped,
            ..Summary::default()
        },
        countdown_levels: [0; 3],
    };
    let read_metas = parts.iter().map(|p| dictionary_hints(&p.meta)).collect();
    let input = Input {
        parts: &parts,
        read_metas,
        shard: plan.shard,
    };
    let input = &input;
    let filtered = plan.shard.is_some();
    let fields_ref = &fields;
    let names: Vec<String> = column_names(needs, &scorer.spec_cols)
        .into_iter()
        .map(str::to_string)
        .collect();
    let mut summary = std::thread::scope(|scope| -> Result<Summary> {
        // three stages: decode (reader) -> score and encode (scorer, with rayon) -> write (here)
        let (btx, brx) = std::sync::mpsc::sync_channel::<Result<Option<(RecordBatch, RowIds)>>>(4);
        scope.spawn(move || {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            for (pi, p) in input.parts.iter().enumerate() {
                for rg in 0..p.row_groups() {
                    match input.batches(pi, rg, &names) {
                        Err(e) => {
                            let _ = btx.send(Err(e));
                            return;
                        }
                        Ok(it) => {
                            for b in it {
                                let stop = b.is_err();
                                if btx.send(b.map(Some)).is_err() || stop {
                                    return;
                                }
                            }
                        }
                    }
                    if btx.send(Ok(None)).is_err() {
                        return;
                    }
                }
            }
        });
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<RowGroupOut>>(2);
        let encoders = &encoders;
        let producer = scope.spawn(move || -> Result<Summary> {
            let mut run = || -> Result<()> {
                if scorer.links.forward {
                    scorer.pre_pass(input)?;
                }
                let mut index = 0usize;
                for (pi, p) in input.parts.iter().enumerate() {
                    for rg in 0..p.row_groups() {
                        let (arrays, kept) = scorer.row_group(p, rg, fields_ref, &brx, filtered)?;
                        let msg = if !filtered {
                            let chunks =
                                encode_row_group(encoders, fields_ref, index, &arrays, &[])?;
                            index += 1;
                            RowGroupOut::Spliced(pi, rg, chunks)
                        } else if kept.iter().all(|b| b.num_rows() == 0) {
                            RowGroupOut::Skipped(pi, rg)
                        } else {
                            let chunks =
                                encode_row_group(encoders, fields_ref, index, &arrays, &kept)?;
                            index += 1;
                            RowGroupOut::Encoded(pi, rg, chunks)
                        };
                        if tx.send(Ok(msg)).is_err() {
                            return Ok(()); // the writer stopped; it reports why
                        }
                    }
                }
                Ok(())
            };
            let r = run();
            let r = match (r, scorer.ext.take()) {
                (Ok(()), Some(e)) => e.finish(),
                (r, _) => r,
            };
            for (level, n) in ["0", "0.1", "1"].iter().zip(scorer.countdown_levels) {
                if n > 0 {
                    scorer.summary.countdown_scores.insert(level.to_string(), n);
                }
            }
            match r {
                Ok(()) => Ok(scorer.summary),
                Err(e) => {
                    let msg = format!("{e:#}");
                    let _ = tx.send(Err(e));
                    Err(anyhow!(msg))
                }
            }
        });
        for msg in rx {
            let (pi, rg) = match msg? {
                RowGroupOut::Spliced(pi, rg, chunks) => {
                    writer.write_row_group(&input.parts[pi], rg, chunks)?;
                    (pi, rg)
                }
                RowGroupOut::Encoded(pi, rg, chunks) => {
                    writer.write_encoded_row_group(chunks)?;
                    (pi, rg)
                }
                RowGroupOut::Skipped(pi, rg) => (pi, rg),
            };
            progress.inc(input.parts[pi].rg_rows(rg) as u64);
        }
        producer
            .join()
            .map_err(|_| anyhow!("internal: the scoring thread panicked"))?
    })?;
    if summary.rows == 0 {
        bail!(
            "{}: no rows in this shard; nothing was written",
            plan.input.display()
        );
    }
    summary.seconds = start.elapsed().as_secs_f64();
    writer.finish(vec![KeyValue::new(
        "rlcr.score_summary".to_string(),
        serde_json::to_string(&summary)?,
    )])?;
    progress.finish();
    summary.seconds = start.elapsed().as_secs_f64();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_rendering() {
        let m = r#"[{"role":"system","content":"S"},{"role":"user","content":"U"}]"#;
        assert_eq!(chatml_prefix(m).unwrap(), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
        let m = r#"[{"role":"user","content":"U"},{"role":"assistant","content":"Let me"}]"#;
        assert_eq!(
            chatml_prefix(m).unwrap(),
            "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nLet me"
        );
        assert!(chatml_prefix("{}").is_err());
        assert_eq!(external::last_user_content(m).as_deref(), Some("U"));
    }

    #[test]
    fn answer_keys_differ() {
        use crate::table::validate::answer_key;
        assert_ne!(answer_key("p1", 0), answer_key("p1", 1));
        assert_ne!(answer_key("p1", 0), answer_key("p10", 0));
        assert_eq!(answer_key("p", 3), answer_key("p", 3));
    }
}
