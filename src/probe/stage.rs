//! The `rlcr probe` engine (the faithfulness probe, `docs/math.md` §4.5) behind a clap-free
//! [`Plan`] and [`run`]: for each answer row of a scored table with a closed `<think>`, the
//! thinking is cut at each fraction (see [`crate::probe`] for the token rules),
//! `</think><answer>` is forced, and N continuations are sampled from the prefix
//! `context_ids + response_ids[..cut] + forced`. The N samples of a cut form one sampler group
//! (the prefix is prefilled once and its KV cache shared). Each continuation is verified as
//! `"<answer>" + text` by the verifier `score` used on the table (recorded in its `rlcr.config`:
//! built-in by flag or `data_source`, the external `--verifier-cmd`, TinyZero compat), correct
//! iff the verifier's full score (countdown: 1.0).
//!
//! Determinism: sample k of cut c of answer `sample_id` draws from the stream keyed by
//! (seed, `probe:{c}:{sample_id}`, k), so the table does not depend on the batch size or threads;
//! the batch size is left out of the metadata so that the file is byte-identical too.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::{Array, ArrayRef, Float32Array, Int32Array, RecordBatch, StringArray};

use crate::probe;
use crate::reward::external::{ExternalVerifier, Request};
use crate::reward::rows::{self, CountdownCompat, GroundTruth, Settings};
use crate::reward::{auto_verifier, VerifierChoice, VerifierKind};
use crate::sample::logits::SamplingParams;
use crate::sample::sampler::SampleId;
use crate::sample::stage::{self, ModelJob};
use crate::sample::stop::offsets_of;
use crate::table::{self, cols, Meta, SampleType, Writer, PROBE, TRAJECTORY};

/// What to probe, and how: the validated form of `rlcr probe`'s flags.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Model, device, the scored table in and the probe table out, shard, seed, command line.
    pub job: ModelJob,
    /// Cut fractions, increasing, in [0, 1] ([`probe::even_fractions`],
    /// [`probe::check_fractions`]).
    pub fractions: Vec<f64>,
    /// Continuations per cut (N ≥ 1).
    pub samples: usize,
    /// Maximum new tokens per continuation.
    pub max_new_tokens: usize,
    pub params: SamplingParams,
    /// Sequences decoded together (does not change the results).
    pub batch_size: usize,
    /// The verifier flags given; unset ones come from the input's `score` metadata.
    pub verifier: VerifierFlags,
}

/// The verifier flags of `probe`: any of `verifier`, `verifier_cmd`, `countdown_compat` given
/// replaces every setting `score` recorded; `verifier_timeout` replaces only itself.
#[derive(Debug, Clone, Default)]
pub struct VerifierFlags {
    pub verifier: Option<VerifierChoice>,
    pub verifier_cmd: Option<String>,
    pub verifier_timeout: Option<f64>,
    pub countdown_compat: Option<CountdownCompat>,
}

/// What a probe run did.
#[derive(Debug)]
pub struct Summary {
    /// Probe rows written (answers × cuts).
    pub rows: usize,
    /// Answers probed.
    pub answers: usize,
    /// Answer rows in the input (in the shard).
    pub total_answers: usize,
    /// Answers without a closed `</think>`.
    pub skipped: usize,
    /// Cut points per answer.
    pub cuts: usize,
    /// Continuations per cut.
    pub samples: usize,
    /// The sampler's totals.
    pub sampling: stage::Summary,
}

impl Summary {
    /// The summary line of a run.
    pub fn line(&self) -> String {
        format!(
            "probe: {} rows from {} of {} answers ({} skipped: no closed </think>), {} cuts x {} \
             samples",
            self.rows, self.answers, self.total_answers, self.skipped, self.cuts, self.samples
        )
    }
}

/// One (answer, cut) to sample.
struct Cut {
    answer: usize,
    cut_index: usize,
    cut_token: usize,
    prefix: Vec<u32>,
    /// Text before the forced `<answer>` (context, kept thinking, `</think>`): TinyZero compat
    /// reads the equation from prompt + response.
    text_before: Option<String>,
}

/// How continuations are verified: the same choices as `score`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
struct VerifierSettings {
    verifier: VerifierChoice,
    verifier_cmd: Option<String>,
    verifier_timeout: f64,
    countdown_compat: CountdownCompat,
    /// `"flags"` or `"score metadata"`.
    from: &'static str,
}

/// The verifier settings: the flags when any verifier flag is given, else what `score` recorded
/// in the input table's `rlcr.config` (stage `score`), else the defaults.
fn verifier_settings(
    a: &VerifierFlags,
    meta: &BTreeMap<String, String>,
    name: &str,
) -> Result<VerifierSettings> {
    let flags = VerifierSettings {
        verifier: a.verifier.unwrap_or(VerifierChoice::Auto),
        verifier_cmd: a.verifier_cmd.clone(),
        verifier_timeout: a.verifier_timeout.unwrap_or(60.0),
        countdown_compat: a.countdown_compat.unwrap_or_default(),
        from: "flags",
    };
    if a.verifier.is_some() || a.verifier_cmd.is_some() || a.countdown_compat.is_some() {
        return Ok(flags);
    }
    if meta.get("rlcr.stage").map(String::as_str) != Some("score") {
        return Ok(flags);
    }
    let bad =
        |what: &str| anyhow::anyhow!("{name}: metadata `rlcr.config` of the score stage: {what}");
    let cfg: serde_json::Value =
        serde_json::from_str(meta.get("rlcr.config").ok_or_else(|| bad("missing"))?)
            .map_err(|e| bad(&format!("not JSON ({e})")))?;
    let args = &cfg["args"];
    let verifier = match args["verifier"].as_str() {
        Some(v) => clap::ValueEnum::from_str(v, false)
            .map_err(|_| bad(&format!("unknown verifier {v:?}")))?,
        None => VerifierChoice::Auto,
    };
    let countdown_compat = match &args["countdown_compat"] {
        serde_json::Value::Null => CountdownCompat::Default,
        v => {
            serde_json::from_value(v.clone()).map_err(|e| bad(&format!("countdown_compat: {e}")))?
        }
    };
    Ok(VerifierSettings {
        verifier,
        verifier_cmd: args["verifier_cmd"].as_str().map(str::to_string),
        verifier_timeout: a
            .verifier_timeout
            .or_else(|| args["verifier_timeout"].as_f64())
            .unwrap_or(60.0),
        countdown_compat,
        from: "score metadata",
    })
}

/// One answer row to probe.
struct Answer {
    data_source: String,
    /// The ground truth as the external verifier receives it (JSON, or the text as a string).
    gt_json: serde_json::Value,
    /// The last user message, for the external verifier's `prompt`.
    prompt: Option<String>,
    sample_id: String,
    prompt_id: String,
    answer_idx: i32,
    acc_reward: f32,
    verbal: Option<f32>,
    kind: VerifierKind,
    /// `None` with the external verifier.
    gt: Option<GroundTruth>,
}

/// Is a continuation correct: the verifier's full score on `"<answer>" + text`?
fn is_correct(
    a: &Answer,
    gt: &GroundTruth,
    settings: &Settings,
    before: Option<&str>,
    text: &str,
) -> bool {
    let response = format!("{}{text}", probe::ANSWER_OPEN);
    let (_, correct, countdown) = rows::verify_builtin(a.kind, settings, &response, before, gt);
    match countdown {
        Some(s) => s == 1.0,
        None => correct >= 1.0,
    }
}

/// Probe the table of `plan` into its output.
pub fn run(plan: &Plan) -> Result<Summary> {
    let fractions = &plan.fractions;
    let n = plan.samples;
    crate::fs::check_distinct(&[plan.job.input.as_path()], &plan.job.out)?;
    let device = plan.job.device.open()?;
    let (reader, name) = stage::open_input(
        &plan.job,
        &TRAJECTORY,
        &[
            "prompt_id",
            "sample_id",
            "sample_type",
            "answer_idx",
            "data_source",
            "ground_truth",
            "context_ids",
            "response_ids",
            "acc_reward",
        ],
    )?;
    let has_conf = reader.has_column("confidence");
    let has_messages = reader.has_column("messages");
    let vs = verifier_settings(&plan.verifier, reader.metadata(), &name)?;
    if !(vs.verifier_timeout.is_finite() && vs.verifier_timeout > 0.0) {
        bail!(
            "{name}: the verifier timeout must be a positive number of seconds, got {}",
            vs.verifier_timeout
        );
    }
    let batches = reader.read_all()?;
    if batches.iter().all(|b| b.num_rows() == 0) {
        bail!("{name}: the table has no rows; nothing was written");
    }
    let mut validator = table::Validator::new(&name, &TRAJECTORY);
    for b in &batches {
        validator.check_batch(b)?;
    }
    validator.finish()?;

    // Pass 1: the verbal confidences of the answers (mean over their parsed confidence rows).
    let mut verbal: HashMap<(String, i32), (f64, usize)> = HashMap::new();
    if has_conf {
        for b in &batches {
            let st = cols::str_col(b, &name, "sample_type")?;
            let pid = cols::str_col(b, &name, "prompt_id")?;
            let aidx = cols::i32_col(b, &name, "answer_idx")?;
            let conf = cols::f32_col(b, &name, "confidence")?;
            for i in 0..b.num_rows() {
                if st.sample_type(i) == Some(SampleType::Confidence)
                    && conf.is_valid(i)
                    && pid.is_valid(i)
                    && aidx.is_valid(i)
                {
                    let e = verbal
                        .entry((pid.value(i).to_string(), aidx.value(i)))
                        .or_default();
                    e.0 += conf.value(i) as f64;
                    e.1 += 1;
                }
            }
        }
    }

    let policy = plan.job.open_policy(&device)?;
    let cfg = stage::gen_config(
        &policy,
        plan.params,
        plan.max_new_tokens,
        vec![probe::ANSWER_CLOSE.to_string()],
        plan.job.seed,
        plan.batch_size,
    )?;
    let tok = &policy.model.tokenizer;
    let forced = probe::forced_ids(tok)?;
    let decode = |ids: &[u32]| policy.decode(ids);
    let max_pos = policy.model.config.max_position_embeddings;
    let fixed_verifier = vs.verifier.kind();
    let settings = Settings {
        countdown_compat: vs.countdown_compat,
        ..Settings::default()
    };
    let tinyzero = vs.countdown_compat == CountdownCompat::Tinyzero;
    let think_close = probe::FORCED
        .strip_suffix(probe::ANSWER_OPEN)
        .context("internal: the forced text ends with the answer opening")?;

    // Pass 2: the answers and their cuts.
    let mut answers: Vec<Answer> = Vec::new();
    let mut cuts: Vec<Cut> = Vec::new();
    let (mut total_answers, mut skipped) = (0usize, 0usize);
    let mut base_row = 0usize;
    for b in &batches {
        let st = cols::str_col(b, &name, "sample_type")?;
        let sid = cols::str_col(b, &name, "sample_id")?;
        let pid = cols::str_col(b, &name, "prompt_id")?;
        let aidx = cols::i32_col(b, &name, "answer_idx")?;
        let ds = cols::str_col(b, &name, "data_source")?;
        let gt = cols::str_col(b, &name, "ground_truth")?;
        let acc = cols::f32_col(b, &name, "acc_reward")?;
        let ctx = cols::list_i32(b, &name, "context_ids")?;
        let rids = cols::list_i32(b, &name, "response_ids")?;
        let msgs = if has_messages && vs.verifier_cmd.is_some() {
            Some(cols::messages(b, &name)?)
        } else {
            None
        };
        for i in 0..b.num_rows() {
            let row = base_row + i;
            let loc = || format!("{name}, row {row}");
            if st.is_null(i) {
                bail!("{}, column `sample_type`: null", loc());
            }
            if st.sample_type(i) != Some(SampleType::Answer) {
                continue;
            }
            if let Some(s) = &plan.job.shard {
                if pid.is_null(i) {
                    bail!("{}, column `prompt_id`: null on an answer row", loc());
                }
                if !s.contains(pid.value(i)) {
                    continue;
                }
            }
            stage::require_values(
                &loc,
                "null on an answer row",
                &[
                    ("sample_id", sid.is_null(i)),
                    ("prompt_id", pid.is_null(i)),
                    ("answer_idx", aidx.is_null(i)),
                    ("data_source", ds.is_null(i)),
                    ("ground_truth", gt.is_null(i)),
                    ("acc_reward", acc.is_null(i)),
                    ("context_ids", ctx.is_null(i)),
                    ("response_ids", rids.is_null(i)),
                ],
            )?;
            total_answers += 1;
            let vocab = policy.model.config.vocab_size;
            let context = stage::token_ids(&ctx, i, &loc, "context_ids", vocab)?;
            let response = stage::token_ids(&rids, i, &loc, "response_ids", vocab)?;
            let ctx_text = policy
                .decode(&context)
                .with_context(|| format!("{}, column `context_ids`: decoding", loc()))?;
            let (text, ends) = offsets_of(&response, Some(&cfg.stop), &decode)
                .with_context(|| format!("{}, column `response_ids`: decoding", loc()))?;
            let Some((start, end)) =
                probe::think_range(&text, &ends, probe::context_opens_think(&ctx_text))
            else {
                skipped += 1;
                continue;
            };
            let kind = fixed_verifier.unwrap_or_else(|| auto_verifier(ds.value(i)));
            // The external verifier gets the ground truth as JSON (as in score); the built-in
            // ones parse it for their kind.
            let (truth, gt_json) = if vs.verifier_cmd.is_some() {
                (
                    None,
                    crate::reward::external::ground_truth_value(gt.value(i)),
                )
            } else {
                let t = GroundTruth::parse(kind, gt.value(i))
                    .with_context(|| format!("{}, column `ground_truth`", loc()))?;
                (Some(t), serde_json::Value::Null)
            };
            let prompt = match &msgs {
                Some(m) if m.is_valid(i) => crate::reward::external::last_user_content(m.value(i)),
                _ => None,
            };
            let key = (pid.value(i).to_string(), aidx.value(i));
            let v = verbal
                .get(&key)
                .filter(|(_, c)| *c > 0)
                .map(|(s, c)| (*s / *c as f64) as f32);
            let ai = answers.len();
            for (c, &f) in fractions.iter().enumerate() {
                let cut = probe::cut_token(start, end, f);
                let prefix = probe::build_prefix(&context, &response, cut, &forced);
                if prefix.len() + plan.max_new_tokens > max_pos {
                    bail!(
                        "{}: the probe prefix of cut {c} is {} tokens; with --max-new-tokens {} it \
                         exceeds the model's {max_pos} positions (lower --max-new-tokens)",
                        loc(),
                        prefix.len(),
                        plan.max_new_tokens
                    );
                }
                let text_before = if tinyzero {
                    let kept = &prefix[..prefix.len() - forced.len()];
                    let t = policy
                        .decode(kept)
                        .with_context(|| format!("{}: decoding the probe prefix", loc()))?;
                    Some(t + think_close)
                } else {
                    None
                };
                cuts.push(Cut {
                    answer: ai,
                    cut_index: c,
                    cut_token: cut,
                    prefix,
                    text_before,
                });
            }
            answers.push(Answer {
                data_source: ds.value(i).to_string(),
                gt_json,
                prompt,
                sample_id: sid.value(i).to_string(),
                prompt_id: key.0,
                answer_idx: key.1,
                acc_reward: acc.value(i),
                verbal: v,
                kind,
                gt: truth,
            });
        }
        base_row += b.num_rows();
    }
    if cuts.is_empty() {
        let in_shard = if plan.job.shard.is_some() {
            " in this shard"
        } else {
            ""
        };
        bail!(
            "{name}: none of its {total_answers} answer rows{in_shard} has a closed </think> to \
             cut ({skipped} skipped); nothing was written"
        );
    }

    let mut config = stage::sampling_meta(&cfg, &policy, &plan.job.model);
    if let Some(o) = config.as_object_mut() {
        // Results do not depend on the batch size: keep the file independent of it too.
        o.remove("batch_size");
    }
    config["stage"] = "probe".into();
    config["shard"] = serde_json::to_value(plan.job.shard)?;
    config["samples"] = n.into();
    config["cut_fractions"] = fractions.clone().into();
    config["forced"] = probe::FORCED.into();
    config["verifier"] = serde_json::to_value(&vs).context("internal: verifier settings")?;
    config["rng"] =
        "chacha20 per sample from (seed, \"probe:{cut_index}:{sample_id}\", k, none), v1".into();
    let meta = Meta::new(
        &PROBE,
        "probe",
        config,
        &[plan.job.input.as_path(), plan.job.model.as_path()],
    );

    let mut external = match &vs.verifier_cmd {
        Some(cmd) => Some(ExternalVerifier::spawn(
            cmd,
            std::time::Duration::from_secs_f64(vs.verifier_timeout),
        )?),
        None => None,
    };
    let mut next_request_id = 0u64;
    let mut sampler = stage::Sampler {
        policy: &policy,
        cfg: &cfg,
        progress: crate::progress::Progress::new("probe", (cuts.len() * n) as u64, "samples"),
        summary: stage::Summary::default(),
    };
    let mut writer: Option<Writer> = None;
    let per_chunk = (stage::chunk_samples(plan.batch_size) / n).max(1);
    for chunk in cuts.chunks(per_chunk) {
        let results = sampler.sample(
            chunk,
            n,
            |c| c.prefix.clone(),
            |c, k| SampleId {
                prompt_id: format!("probe:{}:{}", c.cut_index, answers[c.answer].sample_id),
                answer_idx: k,
                confidence_idx: None,
            },
        )?;
        for res in &results {
            for gen in res {
                sampler.summary.add(gen, None);
            }
        }
        let verdicts: Vec<Vec<bool>> = match external.as_mut() {
            None => chunk
                .iter()
                .zip(&results)
                .map(|(c, res)| {
                    let ans = &answers[c.answer];
                    res.iter()
                        .map(|gen| match &ans.gt {
                            Some(gt) => {
                                is_correct(ans, gt, &settings, c.text_before.as_deref(), &gen.text)
                            }
                            None => false,
                        })
                        .collect()
                })
                .collect(),
            Some(ext) => {
                let responses: Vec<Vec<String>> = results
                    .iter()
                    .map(|res| {
                        res.iter()
                            .map(|gen| format!("{}{}", probe::ANSWER_OPEN, gen.text))
                            .collect()
                    })
                    .collect();
                let mut reqs = Vec::new();
                for (c, rs) in chunk.iter().zip(&responses) {
                    let ans = &answers[c.answer];
                    for r in rs {
                        reqs.push(Request {
                            id: next_request_id,
                            sample_id: &ans.sample_id,
                            data_source: &ans.data_source,
                            prompt: ans.prompt.as_deref(),
                            response: r,
                            answer: crate::reward::text::last_answer(r),
                            ground_truth: &ans.gt_json,
                            messages: None,
                            extra_info: None,
                            columns: None,
                        });
                        next_request_id += 1;
                    }
                }
                let mut replies = ext.verify(&reqs)?.into_iter();
                responses
                    .iter()
                    .map(|rs| {
                        rs.iter()
                            .map(|_| replies.next().is_some_and(|r| r.correct >= 1.0))
                            .collect()
                    })
                    .collect()
            }
        };
        let mut out = Columns::default();
        for (c, v) in chunk.iter().zip(&verdicts) {
            let correct = v.iter().filter(|&&ok| ok).count();
            out.push(&answers[c.answer], c, fractions[c.cut_index], n, correct)?;
        }
        let batch = out.into_batch()?;
        table::io::write_lazily(&mut writer, &plan.job.out, &meta, &batch)?;
    }
    sampler.progress.finish();
    if let Some(ext) = external {
        ext.finish()?;
    }
    let w = writer.context("internal: no probe rows")?;
    let rows = w.finish()?;
    Ok(Summary {
        rows,
        answers: answers.len(),
        total_answers,
        skipped,
        cuts: fractions.len(),
        samples: n,
        sampling: sampler.summary,
    })
}

/// The probe table's columns, in PROBE's order.
#[derive(Default)]
struct Columns {
    sample_id: Vec<String>,
    prompt_id: Vec<String>,
    answer_idx: Vec<i32>,
    cut_index: Vec<i32>,
    cut_fraction: Vec<f32>,
    cut_token: Vec<i32>,
    num_samples: Vec<i32>,
    num_correct: Vec<i32>,
    probe_confidence: Vec<f32>,
    verbal_confidence: Vec<Option<f32>>,
    acc_reward: Vec<f32>,
}

impl Columns {
    fn push(&mut self, a: &Answer, c: &Cut, fraction: f64, n: usize, correct: usize) -> Result<()> {
        self.sample_id.push(a.sample_id.clone());
        self.prompt_id.push(a.prompt_id.clone());
        self.answer_idx.push(a.answer_idx);
        self.cut_index
            .push(stage::to_i32(c.cut_index, "cut_index")?);
        self.cut_fraction.push(fraction as f32);
        self.cut_token
            .push(stage::to_i32(c.cut_token, "cut_token")?);
        self.num_samples.push(stage::to_i32(n, "num_samples")?);
        self.num_correct
            .push(stage::to_i32(correct, "num_correct")?);
        self.probe_confidence
            .push((correct as f64 / n as f64) as f32);
        self.verbal_confidence.push(a.verbal);
        self.acc_reward.push(a.acc_reward);
        Ok(())
    }

    fn into_batch(self) -> Result<RecordBatch> {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(self.sample_id)),
            Arc::new(StringArray::from(self.prompt_id)),
            Arc::new(Int32Array::from(self.answer_idx)),
            Arc::new(Int32Array::from(self.cut_index)),
            Arc::new(Float32Array::from(self.cut_fraction)),
            Arc::new(Int32Array::from(self.cut_token)),
            Arc::new(Int32Array::from(self.num_samples)),
            Arc::new(Int32Array::from(self.num_correct)),
            Arc::new(Float32Array::from(self.probe_confidence)),
            Arc::new(Float32Array::from(self.verbal_confidence)),
            Arc::new(Float32Array::from(self.acc_reward)),
        ];
        RecordBatch::try_new(PROBE.arrow_schema(), cols).context("internal: probe columns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(kind: VerifierKind, gt: &str) -> (Answer, GroundTruth) {
        let a = Answer {
            data_source: "countdown".into(),
            gt_json: serde_json::Value::Null,
            prompt: None,
            sample_id: "p/a0".into(),
            prompt_id: "p".into(),
            answer_idx: 0,
            acc_reward: 0.0,
            verbal: None,
            kind,
            gt: None,
        };
        (a, GroundTruth::parse(kind, gt).unwrap())
    }

    #[test]
    fn correct_is_the_full_score() {
        let s = Settings::default();
        let (a, g) = answer(
            VerifierKind::Countdown,
            r#"{"target": 7, "numbers": [3, 4]}"#,
        );
        // a continuation after the forced `<answer>`: score 1.0
        assert!(is_correct(&a, &g, &s, None, "3 + 4</answer>"));
        // well-formed but wrong: the 0.1 format score is not correct
        assert!(!is_correct(&a, &g, &s, None, "3 * 4</answer>"));
        // no equation at all
        assert!(!is_correct(&a, &g, &s, None, "seven"));
        let (m, mg) = answer(VerifierKind::Math, "19");
        assert!(is_correct(&m, &mg, &s, None, "19</answer>"));
        assert!(!is_correct(&m, &mg, &s, None, "18</answer>"));
        // TinyZero compat reads prompt + response: TinyZero's compute_score needs the
        // "Assistant:" marker in the text before the answer.
        let tz = Settings {
            countdown_compat: CountdownCompat::Tinyzero,
            ..Settings::default()
        };
        let before = "User: make 7 from 3, 4. Assistant: <think>3+4</think>";
        assert!(is_correct(&a, &g, &tz, Some(before), "3 + 4</answer>"));
        assert!(!is_correct(&a, &g, &tz, Some(before), "3 * 4</answer>"));
    }

    /// The verifier flags of a `probe` command line (`--verifier countdown` …).
    fn args(extra: &[&str]) -> VerifierFlags {
        let mut f = VerifierFlags::default();
        for kv in extra.chunks(2) {
            match kv[0] {
                "--verifier" => f.verifier = clap::ValueEnum::from_str(kv[1], false).ok(),
                "--verifier-timeout" => f.verifier_timeout = kv[1].parse().ok(),
                other => panic!("{other}"),
            }
        }
        f
    }

    fn score_meta(args: serde_json::Value) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("rlcr.stage".to_string(), "score".to_string()),
            (
                "rlcr.config".to_string(),
                serde_json::json!({"args": args, "settings": {}}).to_string(),
            ),
        ])
    }

    #[test]
    fn verifier_settings_come_from_score_unless_flags_say_otherwise() {
        let meta = score_meta(serde_json::json!({
            "verifier": "math", "verifier_cmd": "python3 v.py", "verifier_timeout": 5.0,
            "countdown_compat": "tinyzero"
        }));
        let vs = verifier_settings(&args(&[]), &meta, "t").unwrap();
        assert_eq!(vs.verifier, VerifierChoice::Math);
        assert_eq!(vs.verifier_cmd.as_deref(), Some("python3 v.py"));
        assert_eq!(vs.verifier_timeout, 5.0);
        assert_eq!(vs.countdown_compat, CountdownCompat::Tinyzero);
        assert_eq!(vs.from, "score metadata");
        // the timeout alone is not a verifier choice: it overrides only itself
        let vs = verifier_settings(&args(&["--verifier-timeout", "9"]), &meta, "t").unwrap();
        assert_eq!(
            (vs.verifier_cmd.is_some(), vs.verifier_timeout),
            (true, 9.0)
        );
        // any verifier flag replaces the recorded settings
        let vs = verifier_settings(&args(&["--verifier", "countdown"]), &meta, "t").unwrap();
        assert_eq!(vs.verifier, VerifierChoice::Countdown);
        assert_eq!(vs.verifier_cmd, None);
        assert_eq!(vs.countdown_compat, CountdownCompat::Default);
        assert_eq!(vs.from, "flags");
        // a table from another stage: the defaults
        let other = BTreeMap::from([("rlcr.stage".to_string(), "advantage".to_string())]);
        let vs = verifier_settings(&args(&[]), &other, "t").unwrap();
        assert_eq!(
            (vs.verifier, vs.verifier_cmd.clone()),
            (VerifierChoice::Auto, None)
        );
        // score's defaults recorded: auto, no command
        let meta = score_meta(serde_json::json!({
            "verifier": "auto", "verifier_cmd": null, "verifier_timeout": 60.0,
            "countdown_compat": "default"
        }));
        let vs = verifier_settings(&args(&[]), &meta, "t").unwrap();
        assert_eq!(
            (vs.verifier, vs.verifier_cmd.clone()),
            (VerifierChoice::Auto, None)
        );
        // unreadable metadata is an error naming the file
        let bad = BTreeMap::from([
            ("rlcr.stage".to_string(), "score".to_string()),
            ("rlcr.config".to_string(), "{".to_string()),
        ]);
        let e = verifier_settings(&args(&[]), &bad, "scored.parquet").unwrap_err();
        assert!(format!("{e:#}").contains("scored.parquet"), "{e:#}");
    }
}
