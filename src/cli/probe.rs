//! `rlcr probe`: the faithfulness probe of seed 002 (ANCHORS §1.7).
//!
//! For each answer row of a scored table with a closed `<think>`, the thinking is cut at each
//! fraction (see [`crate::probe`] for the token rules), `</think><answer>` is forced, and N
//! continuations are sampled from the prefix `context_ids + response_ids[..cut] + forced`. The N
//! samples of a cut form one sampler group (the prefix is prefilled once and its KV cache
//! shared). Each continuation is verified as `"<answer>" + text` by the verifier `score` uses for
//! that row (flag or `data_source`), correct iff the verifier's full score (countdown: 1.0).
//!
//! Determinism: sample k of cut c of answer `sample_id` draws from the stream keyed by
//! (--seed, `probe:{c}:{sample_id}`, k), so the table does not depend on --batch-size or threads;
//! the batch size is left out of the metadata so that the file is byte-identical too.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::{Array, ArrayRef, Float32Array, Int32Array, RecordBatch, StringArray};

use super::common::{Global, UsageError};
use super::score::VerifierChoice;
use crate::probe;
use crate::reward::rows::{self, GroundTruth, Settings};
use crate::reward::{auto_verifier, VerifierKind};
use crate::sample::logits::SamplingParams;
use crate::sample::policy::Policy;
use crate::sample::sampler::{Group, SampleId};
use crate::sample::stage::{self, Summary};
use crate::sample::stop::offsets_of;
use crate::table::{self, cols, Meta, Reader, Shard, Writer, PROBE, TRAJECTORY};

pub const ABOUT: &str =
    "Faithfulness probe: cut the thinking, force an answer, Monte-Carlo its accuracy";
pub const LONG_ABOUT: &str = "\
For each answer row with a closed </think>, cut its thinking at several points (token
boundaries; cut f keeps round(f * L) of its L thinking tokens), force `</think><answer>`, sample N
continuations (default 50) up to </answer>, verify each (`<answer>` + continuation) with the
verifier score uses (--verifier, or by data_source; correct iff the full score, countdown 1.0)
and write probe_confidence = correct / N, one row per (answer, cut point), with the answer's
verbal confidence (mean parsed confidence of its confidence rows; null without any) and its
acc_reward. The N samples of a cut share its prefix (prefilled once). Answers without a closed
</think> are skipped and counted. The context is the answer's recorded context_ids.
--shard I/N probes only the answers whose prompt_id falls in shard I of N (as generate-answers).

Reads: a scored table and the model folder. Writes: a probe table (schema rlcr.probe).
Example:
  rlcr probe --model ckpt/iter-3 --input scored.parquet -o probe.parquet --cuts 5 --samples 50";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model folder.
    #[arg(long)]
    pub model: PathBuf,
    /// Scored table.
    #[arg(long)]
    pub input: PathBuf,
    /// Output probe table.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Number of cut points, evenly spaced fractions i/(K-1) of the thinking (0 and 1 included).
    #[arg(long, default_value_t = 5)]
    pub cuts: usize,
    /// Explicit cut fractions (comma-separated, increasing, in [0, 1]); replaces --cuts.
    #[arg(long, value_delimiter = ',', conflicts_with = "cuts")]
    pub cut_fractions: Option<Vec<f64>>,
    /// Continuations per cut (N).
    #[arg(long, default_value_t = 50)]
    pub samples: usize,
    /// Maximum new tokens per continuation.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Nucleus sampling (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Drop tokens below P times the most likely one's probability (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Sequences decoded together (does not change the results).
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Verifier; auto picks by data_source (as score does).
    #[arg(long, value_enum, default_value = "auto")]
    pub verifier: VerifierChoice,
    /// Only the answers of shard I of N (`--shard 0/4`), split by prompt_id.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// One (answer, cut) to sample.
struct Cut {
    answer: usize,
    cut_index: usize,
    cut_token: usize,
    prefix: Vec<u32>,
}

/// One answer row to probe.
struct Answer {
    sample_id: String,
    prompt_id: String,
    answer_idx: i32,
    acc_reward: f32,
    verbal: Option<f32>,
    kind: VerifierKind,
    gt: GroundTruth,
}

fn verifier_kind(v: VerifierChoice) -> Option<VerifierKind> {
    match v {
        VerifierChoice::Auto => None,
        VerifierChoice::Countdown => Some(VerifierKind::Countdown),
        VerifierChoice::Math => Some(VerifierKind::Math),
        VerifierChoice::Exact => Some(VerifierKind::Exact),
        VerifierChoice::F1 => Some(VerifierKind::F1),
        VerifierChoice::Choice => Some(VerifierKind::Choice),
    }
}

/// Is a continuation correct: the verifier's full score on `"<answer>" + text`?
fn is_correct(a: &Answer, settings: &Settings, text: &str) -> bool {
    let response = format!("{}{text}", probe::ANSWER_OPEN);
    let (_, correct, countdown) = rows::verify_builtin(a.kind, settings, &response, None, &a.gt);
    match countdown {
        Some(s) => s == 1.0,
        None => correct >= 1.0,
    }
}

fn to_u32s(v: &[i32], loc: &dyn Fn() -> String, col: &str) -> Result<Vec<u32>> {
    v.iter()
        .map(|&t| {
            u32::try_from(t).with_context(|| format!("{}, column `{col}`: negative id {t}", loc()))
        })
        .collect()
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let fractions = match &a.cut_fractions {
        Some(f) => {
            probe::check_fractions(f).map_err(|e| UsageError(format!("{e:#}")))?;
            f.clone()
        }
        None => probe::even_fractions(a.cuts).map_err(|e| UsageError(format!("{e:#}")))?,
    };
    if a.samples == 0 {
        return Err(UsageError("--samples must be at least 1".into()).into());
    }
    let n = a.samples;
    table::check_distinct(&[a.input.as_path()], &a.out)?;
    let device = crate::model::device_from_str(&g.device)?;
    let reader = Reader::open(&a.input)?;
    let name = a.input.display().to_string();
    table::check_schema(
        &name,
        &reader.schema(),
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
    let batches = reader.read_all()?;

    // Pass 1: the verbal confidences of the answers (mean over their parsed confidence rows).
    let mut verbal: HashMap<(String, i32), (f64, usize)> = HashMap::new();
    if has_conf {
        for b in &batches {
            let st = cols::str_col(b, &name, "sample_type")?;
            let pid = cols::str_col(b, &name, "prompt_id")?;
            let aidx = cols::i32_col(b, &name, "answer_idx")?;
            let conf = cols::f32_col(b, &name, "confidence")?;
            for i in 0..b.num_rows() {
                if st.is_valid(i)
                    && st.value(i) == "confidence"
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

    let policy = Policy::load(&a.model, &device)?;
    let params = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
    };
    let cfg = stage::gen_config(
        &policy,
        params,
        a.max_new_tokens,
        vec![probe::ANSWER_CLOSE.to_string()],
        g.seed,
        a.batch_size,
    )
    .map_err(|e| UsageError(format!("{e:#}")))?;
    let tok = &policy.model.tokenizer;
    let forced = probe::forced_ids(tok)?;
    let decode = |ids: &[u32]| policy.decode(ids);
    let max_pos = policy.model.config.max_position_embeddings;
    let fixed_verifier = verifier_kind(a.verifier);
    let settings = Settings::default();

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
        for i in 0..b.num_rows() {
            let row = base_row + i;
            let loc = || format!("{name}, row {row}");
            if st.is_null(i) {
                bail!("{}, column `sample_type`: null", loc());
            }
            if st.value(i) != "answer" {
                continue;
            }
            if let Some(s) = &a.shard {
                if pid.is_null(i) {
                    bail!("{}, column `prompt_id`: null on an answer row", loc());
                }
                if !s.contains(pid.value(i)) {
                    continue;
                }
            }
            for (c, null) in [
                ("sample_id", sid.is_null(i)),
                ("prompt_id", pid.is_null(i)),
                ("answer_idx", aidx.is_null(i)),
                ("data_source", ds.is_null(i)),
                ("ground_truth", gt.is_null(i)),
                ("acc_reward", acc.is_null(i)),
                ("context_ids", ctx.is_null(i)),
                ("response_ids", rids.is_null(i)),
            ] {
                if null {
                    bail!("{}, column `{c}`: null on an answer row", loc());
                }
            }
            total_answers += 1;
            let context = to_u32s(&ctx.values.values()[ctx.range(i)], &loc, "context_ids")?;
            let response = to_u32s(&rids.values.values()[rids.range(i)], &loc, "response_ids")?;
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
            let truth = GroundTruth::parse(kind, gt.value(i))
                .with_context(|| format!("{}, column `ground_truth`", loc()))?;
            let key = (pid.value(i).to_string(), aidx.value(i));
            let v = verbal
                .get(&key)
                .filter(|(_, c)| *c > 0)
                .map(|(s, c)| (*s / *c as f64) as f32);
            let ai = answers.len();
            for (c, &f) in fractions.iter().enumerate() {
                let cut = probe::cut_token(start, end, f);
                let prefix = probe::build_prefix(&context, &response, cut, &forced);
                if prefix.len() + a.max_new_tokens > max_pos {
                    bail!(
                        "{}: the probe prefix of cut {c} is {} tokens; with --max-new-tokens {} it \
                         exceeds the model's {max_pos} positions (lower --max-new-tokens)",
                        loc(),
                        prefix.len(),
                        a.max_new_tokens
                    );
                }
                cuts.push(Cut {
                    answer: ai,
                    cut_index: c,
                    cut_token: cut,
                    prefix,
                });
            }
            answers.push(Answer {
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
        let in_shard = if a.shard.is_some() {
            " in this shard"
        } else {
            ""
        };
        bail!(
            "{name}: none of its {total_answers} answer rows{in_shard} has a closed </think> to \
             cut ({skipped} skipped); nothing was written"
        );
    }

    let mut config = stage::sampling_meta(&cfg, &policy, &a.model);
    if let Some(o) = config.as_object_mut() {
        // Results do not depend on the batch size: keep the file independent of it too.
        o.remove("batch_size");
    }
    config["stage"] = "probe".into();
    config["shard"] = serde_json::to_value(a.shard)?;
    config["samples"] = n.into();
    config["cut_fractions"] = fractions.clone().into();
    config["forced"] = probe::FORCED.into();
    config["verifier"] = match fixed_verifier {
        Some(k) => k.name().into(),
        None => "auto".into(),
    };
    config["rng"] =
        "chacha20 per sample from (seed, \"probe:{cut_index}:{sample_id}\", k, none), v1".into();
    let meta = Meta::new(
        &PROBE,
        "probe",
        config,
        &[a.input.as_path(), a.model.as_path()],
    );

    let mut progress = crate::progress::Progress::new("probe", (cuts.len() * n) as u64, "samples");
    let mut summary = Summary::default();
    let mut writer: Option<Writer> = None;
    let per_chunk = (stage::chunk_samples(a.batch_size) / n).max(1);
    for chunk in cuts.chunks(per_chunk) {
        let groups: Vec<Group> = chunk
            .iter()
            .map(|c| Group {
                context: c.prefix.clone(),
                samples: (0..n as u32)
                    .map(|k| SampleId {
                        prompt_id: format!("probe:{}:{}", c.cut_index, answers[c.answer].sample_id),
                        answer_idx: k,
                        confidence_idx: None,
                    })
                    .collect(),
            })
            .collect();
        let results = stage::run_groups(&policy, &groups, &cfg, &mut progress, &mut summary)?;
        let mut out = Columns::default();
        for (c, res) in chunk.iter().zip(&results) {
            let ans = &answers[c.answer];
            let correct = res
                .iter()
                .filter(|gen| {
                    summary.add(gen, None);
                    is_correct(ans, &settings, &gen.text)
                })
                .count();
            out.push(ans, c, fractions[c.cut_index], n, correct)?;
        }
        let batch = out.into_batch()?;
        let w = match &mut writer {
            Some(w) => w,
            None => writer.insert(Writer::create(&a.out, batch.schema(), &meta)?),
        };
        w.write(&batch)?;
    }
    progress.finish();
    let w = writer.context("internal: no probe rows")?;
    let rows = w.finish()?;
    crate::info!("{}", summary.line("probe", "span"));
    crate::info!(
        "probe: {rows} rows from {} of {total_answers} answers ({skipped} skipped: no closed </think>), \
         {} cuts x {n} samples",
        answers.len(),
        fractions.len()
    );
    Ok(())
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

    fn answer(kind: VerifierKind, gt: &str) -> Answer {
        Answer {
            sample_id: "p/a0".into(),
            prompt_id: "p".into(),
            answer_idx: 0,
            acc_reward: 0.0,
            verbal: None,
            kind,
            gt: GroundTruth::parse(kind, gt).unwrap(),
        }
    }

    #[test]
    fn correct_is_the_full_score() {
        let s = Settings::default();
        let a = answer(
            VerifierKind::Countdown,
            r#"{"target": 7, "numbers": [3, 4]}"#,
        );
        // a continuation after the forced `<answer>`: score 1.0
        assert!(is_correct(&a, &s, "3 + 4</answer>"));
        // well-formed but wrong: the 0.1 format score is not correct
        assert!(!is_correct(&a, &s, "3 * 4</answer>"));
        // no equation at all
        assert!(!is_correct(&a, &s, "seven"));
        let m = answer(VerifierKind::Math, "19");
        assert!(is_correct(&m, &s, "19</answer>"));
        assert!(!is_correct(&m, &s, "18</answer>"));
    }
}
