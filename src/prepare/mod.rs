//! The `prepare` stage's engine: build a prompts table (`rlcr.prompts`) from a dataset or from
//! synthetic countdown tasks.
//!
//! Every source becomes the same table: `prompt_id`, `messages` (JSON list of {role, content}),
//! `data_source`, `ground_truth` (JSON text), `extra_info` (JSON text). Ids are stable: synthetic
//! tasks are numbered in generation order (so `--count 10` is a prefix of `--count 100` with the
//! same seed and split); dataset rows keep their own id when they have one (`id`, verl's
//! `extra_info.index`) and their row number otherwise.
//!
//! - [`synth`]: seeded synthetic countdown tasks with graded difficulty, the held-out split (by a
//!   hash of the canonical problem) and the out-of-domain bucket, and supervised warm-start
//!   examples.
//! - [`arith`]: seeded synthetic arithmetic (`A op B`, difficulty = digits per operand) with the
//!   same split rules and warm-start examples.
//! - [`sources`]: readers of TinyZero's countdown files, verl Parquet and JSONL.
//!
//! [`Plan`] is the stage's validated, clap-free input; [`run`] does the work and writes the table.
pub mod arith;
pub mod sources;
pub mod synth;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Result};
use arrow::array::{ArrayRef, RecordBatch, StringArray};
use serde_json::Value;

use crate::table::{self, Meta, PROMPTS};

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

/// Prompt sources.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    CountdownSynth,
    ArithmeticSynth,
    Countdown,
    Verl,
    Jsonl,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::CountdownSynth => "countdown-synth",
            Source::ArithmeticSynth => "arithmetic-synth",
            Source::Countdown => "countdown",
            Source::Verl => "verl",
            Source::Jsonl => "jsonl",
        }
    }
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

/// What to build: a validated plan (the CLI checks the flags and builds it).
#[derive(Clone, Debug)]
pub enum Build {
    /// `count` synthetic countdown tasks of `shape` in `split`, drawn from `seed`; with `sft`,
    /// warm-start examples of those tasks.
    Synth {
        seed: u64,
        count: usize,
        shape: SynthShape,
        split: Split,
        sft: Option<SftPlan>,
    },
    /// `count` synthetic arithmetic tasks of `shape` in `split`, drawn from `seed`; with `sft`,
    /// warm-start examples of those tasks.
    Arith {
        seed: u64,
        count: usize,
        shape: ArithShape,
        split: Split,
        sft: Option<SftPlan>,
    },
    /// Rows of a dataset file, the first `count` when given.
    File {
        source: Source,
        input: PathBuf,
        count: Option<usize>,
    },
}

/// The stage's plan.
#[derive(Clone, Debug)]
pub struct Plan {
    pub build: Build,
    /// Output prompts table.
    pub out: PathBuf,
    /// Resolved configuration recorded in the output's metadata.
    pub config: Value,
}

/// What [`run`] wrote.
#[derive(Clone, Debug)]
pub struct Summary {
    pub rows: usize,
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
    let rows = match build {
        Build::Synth {
            seed,
            count,
            shape,
            split,
            sft,
        } => {
            let tasks = countdown_synth(*seed, *count, *shape, *split)?;
            with_sft(*seed, tasks, sft.as_ref())?
        }
        Build::Arith {
            seed,
            count,
            shape,
            split,
            sft,
        } => {
            let tasks = arithmetic_synth(*seed, *count, shape, *split)?;
            with_sft(*seed, tasks, sft.as_ref())?
        }
        Build::File {
            source,
            input,
            count,
        } => {
            let mut rows = match source {
                Source::Countdown => sources::read_countdown(input)?,
                Source::Verl => sources::read_verl(input)?,
                Source::Jsonl => sources::read_jsonl(input)?,
                Source::CountdownSynth | Source::ArithmeticSynth => {
                    bail!("{} reads no file", source.name())
                }
            };
            if let Some(n) = count {
                rows.truncate(*n);
            }
            rows
        }
    };
    let input = match build {
        Build::File { input, .. } => Some(input.as_path()),
        Build::Synth { .. } | Build::Arith { .. } => None,
    };
    if rows.is_empty() {
        match input {
            Some(i) => bail!(
                "{}: the input has no rows; nothing was written",
                i.display()
            ),
            None => bail!("no prompts to write; nothing was written"),
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (i, r) in rows.iter().enumerate() {
        if !seen.insert(r.prompt_id.as_str()) {
            bail!(
                "{}, row {i}: duplicate prompt id {:?}",
                input.unwrap_or(Path::new("-")).display(),
                r.prompt_id
            );
        }
    }
    Ok(rows)
}

/// Build the rows of `plan` and write them atomically to `plan.out`.
pub fn run(plan: &Plan) -> Result<Summary> {
    let rows = rows(&plan.build)?;
    let batch = to_batch(&rows)?;
    let inputs: Vec<&Path> = match &plan.build {
        Build::File { input, .. } => vec![input.as_path()],
        Build::Synth { .. } | Build::Arith { .. } => vec![],
    };
    let meta = Meta::new(&PROMPTS, "prepare", plan.config.clone(), &inputs);
    let n = table::write_table(&plan.out, batch.schema(), &[batch], &meta)?;
    Ok(Summary { rows: n })
}

/// The prompts table of `rows`.
pub fn to_batch(rows: &[PromptRow]) -> Result<RecordBatch> {
    let s = |f: &dyn Fn(&PromptRow) -> String| -> ArrayRef {
        Arc::new(StringArray::from(rows.iter().map(f).collect::<Vec<_>>()))
    };
    let extra: ArrayRef = Arc::new(StringArray::from(
        rows.iter()
            .map(|r| r.extra_info.as_ref().map(|v| v.to_string()))
            .collect::<Vec<_>>(),
    ));
    Ok(RecordBatch::try_new(
        PROMPTS.arrow_schema(),
        vec![
            s(&|r| r.prompt_id.clone()),
            s(&|r| r.messages.to_string()),
            s(&|r| r.data_source.clone()),
            s(&|r| r.ground_truth.to_string()),
            extra,
        ],
    )?)
}
