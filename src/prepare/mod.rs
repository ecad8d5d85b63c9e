//! The `prepare` stage's engine: build a prompts table (`rlcr.prompts`) from a dataset or from
//! synthetic countdown tasks.
//!
//! Every source becomes the same table: `prompt_id`, `messages` (list of {role, content}),
//! `data_source`, `ground_truth` (JSON text), `extra_info` (a struct of the source's other keys). Ids are stable: synthetic
//! tasks are numbered in generation order (so `--count 10` is a prefix of `--count 100` with the
//! same seed and split); dataset rows keep their own id when they have one (`id`, verl's
//! `extra_info.index`) and their row number otherwise.
//!
//! - [`synth`]: seeded synthetic countdown tasks with graded difficulty, the held-out split (by a
//!   hash of the canonical problem) and the out-of-domain bucket, and supervised warm-start
//!   examples.
//! - [`arith`]: seeded synthetic arithmetic (`A op B`, difficulty = digits per operand) with the
//!   same split rules and warm-start examples.
//! - [`dataset`]: dataset files as Hugging Face `datasets` keeps them (Parquet, JSON lines, JSON;
//!   files, folders, globs), the column mapping onto prompt rows, and the seeded per-epoch draws
//!   of the loop over a dataset.
//! - [`sources`]: the reader of TinyZero's countdown files.
//! - [`pass_rate`]: keeping the prompts whose pass rate in a scored table lies between two bounds
//!   (those a group-relative advantage learns from).
//!
//! [`Plan`] is the stage's validated, clap-free input; [`run`] does the work and writes the table.
pub mod arith;
pub mod dataset;
pub mod pass_rate;
pub mod sources;
pub mod split;
pub mod synth;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Result};
use arrow::array::{ArrayRef, RecordBatch, StringArray};
use serde_json::Value;

use crate::sample::prompts;
use crate::table::{self, Meta, PROMPTS};
use crate::usage::usage;

pub use arith::{arithmetic_synth, parse_ops, ArithShape};
pub use synth::{
    canonical_key, countdown_prompt, countdown_prompt_short, countdown_synth, heldout_bucket,
    sft_examples, SftConfidence, Split, SynthShape,
};

/// One prompt row.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptRow {
    pub prompt_id: String,
    pub messages: Value,
    pub data_source: String,
    pub ground_truth: Value,
    pub extra_info: Option<Value>,
}

/// Prompt sources: the synthetic tasks, TinyZero's countdown files, or a dataset file format
/// forced (the format is otherwise found from the extension).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    CountdownSynth,
    ArithmeticSynth,
    Countdown,
    Verl,
    Jsonl,
    Json,
    Parquet,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::CountdownSynth => "countdown-synth",
            Source::ArithmeticSynth => "arithmetic-synth",
            Source::Countdown => "countdown",
            Source::Verl => "verl",
            Source::Jsonl => "jsonl",
            Source::Json => "json",
            Source::Parquet => "parquet",
        }
    }

    /// The file format a dataset source forces (None: the synthetic and countdown sources).
    pub fn format(self) -> Option<dataset::Format> {
        match self {
            Source::Verl | Source::Parquet => Some(dataset::Format::Parquet),
            Source::Jsonl => Some(dataset::Format::Jsonl),
            Source::Json => Some(dataset::Format::Json),
            Source::CountdownSynth | Source::ArithmeticSynth | Source::Countdown => None,
        }
    }
}

/// The rows of the loop's iteration: draw `index` (0-based) of `--count` rows from the dataset's
/// per-epoch orders ([`dataset::draw`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Draw {
    pub index: u64,
}

/// Supervised warm-start examples instead of prompts (synthetic sources only).
#[derive(Clone, Debug)]
pub struct SftPlan {
    /// Fraction of the examples' answers that are correct, in 0..=1.
    pub correct_fraction: f64,
    /// System prompt of the examples ("" = none).
    pub system: String,
    /// The confidence query of the examples.
    pub query: String,
    /// Confidence ranges per difficulty (None: uniform on 0.1–0.9 for every task).
    pub confidence: Option<SftConfidence>,
}

impl SftPlan {
    /// The warm-start plan of a synthetic source whose difficulties run over `levels` (`unit`:
    /// what a level counts, for the error); `system` and `query` default to the sampling
    /// stages' prompts, `confidence` is a `DIFFICULTY=LOW-HIGH,…` spec that must cover every
    /// level. Bad values are usage errors.
    pub fn new(
        correct_fraction: f64,
        system: Option<String>,
        query: Option<String>,
        confidence: Option<&str>,
        levels: std::ops::RangeInclusive<u32>,
        unit: &str,
    ) -> Result<SftPlan> {
        if !(0.0..=1.0).contains(&correct_fraction) {
            return Err(usage("--sft-correct-fraction must be between 0 and 1"));
        }
        let confidence = match confidence {
            None => None,
            Some(spec) => {
                let c = SftConfidence::parse(spec)
                    .map_err(|e| usage(format!("--sft-confidence: {e}")))?;
                if let Some(k) = levels.clone().find(|&k| c.range(k).is_none()) {
                    return Err(usage(format!(
                        "--sft-confidence has no range for tasks of {k} {unit} ({}..={})",
                        levels.start(),
                        levels.end()
                    )));
                }
                Some(c)
            }
        };
        Ok(SftPlan {
            correct_fraction,
            system: system.unwrap_or_else(|| prompts::DEFAULT_SYSTEM_PROMPT.to_string()),
            query: query.unwrap_or_else(|| prompts::DEFAULT_CONFIDENCE_PROMPT.to_string()),
            confidence,
        })
    }
}

/// A synthetic source and the shape of its tasks.
#[derive(Clone, Debug)]
pub enum SynthTask {
    /// Countdown: reach a target with the given numbers ([`countdown_synth`]).
    Countdown(SynthShape),
    /// Arithmetic: the value of `A op B` ([`arithmetic_synth`]).
    Arithmetic(ArithShape),
}

/// What to build: a validated plan (the CLI checks the flags and builds it).
#[derive(Clone, Debug)]
pub enum Build {
    /// `count` synthetic tasks of `task` in `split`, drawn from `seed`; with `sft`, warm-start
    /// examples of those tasks.
    Synth {
        seed: u64,
        count: usize,
        task: SynthTask,
        split: Split,
        sft: Option<SftPlan>,
    },
    /// Rows of dataset files (`inputs`: files, folders or globs) mapped by `mapping`; `source`
    /// forces a reader (countdown) or a format. Then: with `draw`, the draw's `count` rows of the
    /// epoch orders (shuffled with `shuffle_seed`, else in file order); else the rows (shuffled
    /// with `shuffle_seed`), the first `count` when given.
    File {
        source: Option<Source>,
        inputs: Vec<String>,
        mapping: dataset::Mapping,
        count: Option<usize>,
        shuffle_seed: Option<u64>,
        draw: Option<Draw>,
    },
}

/// The stage's plan.
#[derive(Clone, Debug)]
pub struct Plan {
    pub build: Build,
    /// Keep only the rows whose pass rate in a scored table lies between two bounds (applied to
    /// the rows the build selects, after `--count` and `--draw`).
    pub pass_rates: Option<pass_rate::PassRateFilter>,
    /// Output prompts table.
    pub out: PathBuf,
    /// Resolved configuration recorded in the output's metadata.
    pub config: Value,
}

/// What [`run`] wrote.
#[derive(Clone, Debug)]
pub struct Summary {
    pub rows: usize,
    /// The files read.
    pub inputs: Vec<PathBuf>,
    /// How the first file's columns were mapped (dataset files).
    pub mapped: Option<dataset::Resolved>,
    /// The draw's epoch and index within it (with `--draw`).
    pub epoch: Option<(u64, u64)>,
    /// What the pass-rate filter kept and dropped (with `--pass-rates`).
    pub filtered: Option<pass_rate::Filtered>,
}

impl Summary {
    /// The summary line of a run that wrote `out`.
    pub fn line(&self, out: &Path) -> String {
        let mut how = String::new();
        if let Some(m) = &self.mapped {
            let label = m
                .label
                .as_ref()
                .map_or("none: ground_truth null".to_string(), |l| format!("`{l}`"));
            how = format!(" ({}, label {label})", m.prompt);
        }
        if let Some((e, b)) = self.epoch {
            how.push_str(&format!(", epoch {e} draw {b}"));
        }
        if let Some(f) = self.filtered {
            how.push_str(&format!(
                "; kept {} of {} by pass rate ({} too hard, {} too easy",
                f.kept, f.rows, f.too_hard, f.too_easy
            ));
            if f.decided_kept > 0 {
                how.push_str(&format!("; {} of those kept all the same", f.decided_kept));
            }
            how.push(')');
        }
        let from = match self.inputs.len() {
            0 => String::new(),
            1 => format!(" from {}", self.inputs[0].display()),
            n => format!(" from {n} files"),
        };
        format!(
            "prepare: wrote {} prompts{from}{how} to {}",
            self.rows,
            out.display()
        )
    }
}

/// Rows built from a plan, before writing.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub rows: Vec<PromptRow>,
    pub inputs: Vec<PathBuf>,
    pub mapped: Option<dataset::Resolved>,
    pub epoch: Option<(u64, u64)>,
}

/// The tasks themselves, or their warm-start examples under `sft`.
fn with_sft(seed: u64, tasks: Vec<PromptRow>, sft: Option<&SftPlan>) -> Result<Vec<PromptRow>> {
    match sft {
        Some(s) => sft_examples(
            seed,
            &tasks,
            s.correct_fraction,
            s.confidence.as_ref(),
            &s.system,
            &s.query,
        ),
        None => Ok(tasks),
    }
}

/// The rows of a plan, checked (non-empty, unique ids), without writing them.
pub fn rows(build: &Build) -> Result<Vec<PromptRow>> {
    Ok(load(build)?.rows)
}

/// The rows of the dataset files of a [`Build::File`], all of them, checked.
fn file_rows(
    source: Option<Source>,
    inputs: &[String],
    mapping: &dataset::Mapping,
) -> Result<(Vec<PromptRow>, Vec<PathBuf>, Option<dataset::Resolved>)> {
    let files = dataset::expand_inputs(inputs)?;
    let several = files.len() > 1;
    let mut rows = Vec::new();
    let mut mapped = None;
    for f in &files {
        if source == Some(Source::Countdown) {
            rows.extend(sources::read_countdown(f)?);
            continue;
        }
        let format = match source.and_then(Source::format) {
            Some(x) => x,
            None => dataset::Format::of(f)?,
        };
        let default_source = match source {
            Some(s @ (Source::Verl | Source::Jsonl)) => s.name(),
            _ => format.name(),
        };
        let rec = dataset::read_records(f, format)?;
        let (r, how) = dataset::map_records(&rec, mapping, default_source, several)?;
        rows.extend(r);
        if mapped.is_none() {
            mapped = Some(how);
        }
    }
    Ok((rows, files, mapped))
}

/// The rows of a plan with the files they came from, checked (non-empty, unique ids).
pub fn load(build: &Build) -> Result<Loaded> {
    let mut inputs = vec![];
    let mut mapped = None;
    let mut epoch = None;
    let rows = match build {
        Build::Synth {
            seed,
            count,
            task,
            split,
            sft,
        } => {
            let tasks = match task {
                SynthTask::Countdown(shape) => countdown_synth(*seed, *count, *shape, *split)?,
                SynthTask::Arithmetic(shape) => arithmetic_synth(*seed, *count, shape, *split)?,
            };
            with_sft(*seed, tasks, sft.as_ref())?
        }
        Build::File {
            source,
            inputs: patterns,
            mapping,
            ..
        } => {
            let (rows, files, how) = file_rows(*source, patterns, mapping)?;
            inputs = files;
            mapped = how;
            rows
        }
    };
    let shown = match inputs.as_slice() {
        [one] => one.display().to_string(),
        _ => "the inputs".to_string(),
    };
    if rows.is_empty() {
        match build {
            Build::File { .. } => bail!("{shown}: the input has no rows; nothing was written"),
            Build::Synth { .. } => bail!("no prompts to write; nothing was written"),
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (i, r) in rows.iter().enumerate() {
        if !seen.insert(r.prompt_id.as_str()) {
            bail!(
                "{}, row {i}: duplicate prompt id {:?}",
                if inputs.is_empty() {
                    Path::new("-").display().to_string()
                } else {
                    shown.clone()
                },
                r.prompt_id
            );
        }
    }
    let rows = match build {
        Build::File {
            count,
            shuffle_seed,
            draw,
            ..
        } => match (draw, count) {
            (Some(d), Some(per)) => {
                let (pick, e, b) = dataset::draw(rows.len(), *per, *shuffle_seed, d.index);
                epoch = Some((e, b));
                pick.into_iter().map(|i| rows[i].clone()).collect()
            }
            (Some(_), None) => bail!("internal: a draw needs a count"),
            (None, _) => {
                let order = dataset::epoch_order(rows.len(), *shuffle_seed, 0);
                let keep = count.unwrap_or(rows.len()).min(rows.len());
                order[..keep].iter().map(|&i| rows[i].clone()).collect()
            }
        },
        Build::Synth { .. } => rows,
    };
    Ok(Loaded {
        rows,
        inputs,
        mapped,
        epoch,
    })
}

/// Build the rows of `plan` and write them atomically to `plan.out`.
pub fn run(plan: &Plan) -> Result<Summary> {
    let mut loaded = load(&plan.build)?;
    let mut filtered = None;
    let mut read = loaded.inputs.clone();
    if let Some(f) = &plan.pass_rates {
        let (rows, n) = pass_rate::filter(std::mem::take(&mut loaded.rows), f)?;
        loaded.rows = rows;
        filtered = Some(n);
        read.push(f.scored.clone());
    }
    let batch = to_batch(&loaded.rows)?;
    let inputs: Vec<&Path> = read.iter().map(PathBuf::as_path).collect();
    let mut config = plan.config.clone();
    if let Some((e, b)) = loaded.epoch {
        config["epoch"] = e.into();
        config["draw_in_epoch"] = b.into();
    }
    let meta = Meta::new(&PROMPTS, "prepare", config, &inputs);
    let n = table::write_table(&plan.out, batch.schema(), &[batch], &meta)?;
    Ok(Summary {
        rows: n,
        inputs: loaded.inputs,
        mapped: loaded.mapped,
        epoch: loaded.epoch,
        filtered,
    })
}

/// The prompts table of `rows`: `messages` and `extra_info` as nested columns where their values
/// allow ([`table::nested`]), JSON text otherwise.
pub fn to_batch(rows: &[PromptRow]) -> Result<RecordBatch> {
    let s = |f: &dyn Fn(&PromptRow) -> String| -> ArrayRef {
        Arc::new(StringArray::from(rows.iter().map(f).collect::<Vec<_>>()))
    };
    let messages =
        table::nested::messages_column(&rows.iter().map(|r| Some(&r.messages)).collect::<Vec<_>>());
    let extra = table::nested::extra_info_column(
        &rows
            .iter()
            .map(|r| r.extra_info.as_ref())
            .collect::<Vec<_>>(),
    );
    let columns = vec![
        s(&|r| r.prompt_id.clone()),
        messages,
        s(&|r| r.data_source.clone()),
        s(&|r| r.ground_truth.to_string()),
        extra,
    ];
    let fields: Vec<arrow::datatypes::Field> = PROMPTS
        .columns
        .iter()
        .zip(&columns)
        .map(|(c, a)| arrow::datatypes::Field::new(c.name, a.data_type().clone(), c.nullable))
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(arrow::datatypes::Schema::new(fields)),
        columns,
    )?)
}
