//! `rlcr prepare`: the flags, their checks and the summary line; the engine is
//! [`crate::prepare`] (sources, synthetic tasks, splits, warm-start examples).
use std::path::PathBuf;

use anyhow::Result;
use serde_json::json;

use super::common::{Global, UsageError};
use crate::prepare::dataset::{Mapping, Template};
use crate::prepare::pass_rate::PassRateFilter;
use crate::prepare::{
    parse_ops, ArithShape, Build, Draw, Plan, SftPlan, Source, Split, SynthShape, SynthTask,
};

pub const ABOUT: &str =
    "Build a prompts table from dataset files (Parquet, JSON lines, JSON; TRL and verl formats) or synthetic tasks";
pub const LONG_ABOUT: &str = "\
Build a prompts table: one row per prompt with `prompt_id`, `messages` (a list of {role, content}
structs), `data_source`, `ground_truth` (JSON text) and `extra_info` (the source's other fields: a struct,
or JSON text where rows differ in keys or types). This is the input of `generate-answers`.

Dataset files (--input, repeatable: a file, a folder, or a glob such as 'data/train-*.parquet'):
Parquet, JSON lines (.jsonl, .ndjson) and JSON (.json: JSON lines, an array of records or an
object of column lists), the format found from the extension (--from parquet|jsonl|json|verl
forces one). Nested Parquet columns read as JSON values. The column mapping:
  prompt       --prompt-key COLUMN (default `prompt`, else `messages`): text (one user message)
               or a list of {role, content} messages; or --input-template TEXT with {column}
               fields, e.g. \"{question}\\n\\nAnswer in <answer></answer>.\"
  ground_truth --label-key COLUMN (default: the first of `ground_truth`,
               `reward_model.ground_truth`, `solution`, `answer`; none: null); a dotted key reads a
               field of a struct column
  data_source  --data-source NAME (a constant) or --data-source-key COLUMN (default: the column
               `data_source`, else the format's name)
  extra_info   the source's `extra_info` object, plus every other column but the prompt column
               under its own name (the label too): what reward functions receive
  prompt_id    the column `id`, else verl's {data_source}-{split}-{index}, else {data_source}-{row}
TRL's standard and conversational formats (`prompt` as text or as messages) and verl's
(`data_source`, `prompt` messages, `reward_model.ground_truth`, `extra_info`) need no flag beyond
--input. A prompts table written by prepare reads back as it is. A mapped column that does not
exist, a value of the wrong type and an empty prompt are errors naming file, row and column.

Drawing (the loop over a dataset): --shuffle-seed S orders the rows by a seeded shuffle (a new
one per epoch); --count N keeps N rows; --draw K (0-based) takes the K-th batch of N rows of the
epoch orders: ceil(rows / N) draws per epoch, the last of an epoch takes what is left, so every
row is drawn exactly once per epoch, and the same (S, N, K) always gives the same rows.

Other sources (--from):
  countdown-synth  seeded synthetic countdown tasks (3-4 numbers in 1..99, a target in 1..100 reachable
                   with + - * / using each number once; the solution, the difficulty (how many
                   numbers) and the split go to extra_info), with TinyZero's prompt text as the
                   user message; needs --count
  arithmetic-synth seeded synthetic arithmetic `What is A op B?` (both operands of D digits,
                   D in --min-digits..--max-digits, the difficulty; operations from --ops; the
                   exact result as ground truth for the math verifier; expression, difficulty and
                   split in extra_info); needs --count
  countdown        TinyZero's raw dataset (Parquet or JSONL with `target`, `nums`)

Splits of the synthetic sources (--split): `train` and `heldout` never share a problem: a problem
(countdown: its numbers sorted, plus the target; arithmetic: `A op B` with the operands of + and *
sorted, e.g. `12+34`) is held out when a fixed hash of it falls in the first --heldout-percent of
100 buckets. `hard` is out of domain: --max-numbers + 1 numbers (--max-digits + 1 digits) per
task, a size training never sees. Held-out rows have data_source `countdown-heldout` /
`arithmetic-heldout`, hard ones `countdown-hard` / `arithmetic-hard` (reports break them out).
`all` (the default) draws every task.

Pass-rate filter (--pass-rates SCORED): sample answers to a pool of prompts with the starting
policy (`generate-answers --num-answers 8`), judge them (`score`), and keep the prompts whose
pass rate lies strictly between --min-pass-rate and --max-pass-rate (default 0 and 1: neither
always right nor always wrong). A prompt every answer gets right, or none does, gives all its
answers the same reward and a group-relative advantage of 0: it teaches the answers nothing.
Its confidences still differ in reward, and --keep-decided SHARE keeps that share of the
always- and never-right prompts for an RLCR loop's confidence turn (evenly through each class,
no draw). The filter applies to the rows this call selects (after --count and --draw); a prompt
without answers in SCORED is an error.

Reads: --input (not for the synthetic sources), --pass-rates. Writes: -o (atomically; never an
input).
Example:
  rlcr prepare --input gsm8k/train-00000-of-00001.parquet --input-template \
    \"{question}\\n\\nPut the final answer in <answer></answer>.\" --label-key answer -o prompts.parquet
  rlcr prepare --input 'data/train-*.parquet' -o prompts.parquet        # verl or TRL format
  rlcr prepare --input prompts.parquet --shuffle-seed 1 --count 16 --draw 7 -o iter-0008.parquet
  rlcr --seed 1 prepare --from countdown-synth --count 512 -o prompts.parquet
  rlcr --seed 1 prepare --from arithmetic-synth --count 512 --min-digits 1 --max-digits 3 --ops '+*' \
    --split train -o arith.parquet
  rlcr --seed 9 prepare --from countdown-synth --count 256 --split heldout -o heldout.parquet
  rlcr prepare --input pool.parquet --pass-rates pool-scored.parquet -o learnable.parquet";

#[derive(clap::Args, Debug, serde::Serialize)]
pub struct Args {
    /// Where the prompts come from: a synthetic source, TinyZero's countdown files, or a dataset
    /// format forced (default: dataset files, the format from each file's extension).
    #[arg(long, value_enum)]
    pub from: Option<Source>,
    /// Input: a file, a folder or a glob (quote it); repeat for several.
    #[arg(long)]
    pub input: Vec<String>,
    /// The prompt column: text or a list of {role, content} messages (default `prompt`, else
    /// `messages`).
    #[arg(long)]
    pub prompt_key: Option<String>,
    /// The prompt as a template over columns: `{column}` fields, `{{`/`}}` for braces, `\n`
    /// and `\t` escapes (one user message).
    #[arg(long, conflicts_with = "prompt_key")]
    pub input_template: Option<String>,
    /// The label column, kept as ground_truth (default: the first of `ground_truth`,
    /// `reward_model.ground_truth`, `solution`, `answer`).
    #[arg(long)]
    pub label_key: Option<String>,
    /// The column holding each row's data source.
    #[arg(long)]
    pub data_source_key: Option<String>,
    /// One data source for every row.
    #[arg(long, conflicts_with = "data_source_key")]
    pub data_source: Option<String>,
    /// Dataset files: order the rows by a shuffle with this seed (a new order per epoch of
    /// --draw).
    #[arg(long)]
    pub shuffle_seed: Option<u64>,
    /// Dataset files: take the K-th (0-based) batch of --count rows of the epoch orders.
    #[arg(long, requires = "count")]
    pub draw: Option<u64>,
    /// Output prompts table (Parquet).
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Number of prompts (synthetic sources: required; dataset files: keep the first N, or the
    /// rows per --draw).
    #[arg(long)]
    pub count: Option<usize>,
    /// countdown-synth: fewest numbers per task.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=6))]
    pub min_numbers: u32,
    /// countdown-synth: most numbers per task.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=6))]
    pub max_numbers: u32,
    /// countdown-synth: largest number drawn (numbers are in 1..=N).
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(i64).range(2..=9999))]
    pub max_number: i64,
    /// countdown-synth: largest target (targets are in 1..=N).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=100000))]
    pub max_target: i64,
    /// arithmetic-synth: fewest digits per operand (the easiest difficulty).
    #[arg(long, default_value_t = 1)]
    pub min_digits: u32,
    /// arithmetic-synth: most digits per operand (at most 9; --split hard uses one more).
    #[arg(long, default_value_t = 3)]
    pub max_digits: u32,
    /// arithmetic-synth: the operations, some of `+-*` (SmolLM2-135M-Instruct gets + and * right
    /// more often than -, see docs/results.md).
    #[arg(long, default_value = "+*")]
    pub ops: String,
    /// The user message: countdown-synth: TinyZero's text, or a short one (`Numbers: [3, 5].
    /// Target: 8.`) for tiny models; arithmetic-synth: `What is 12 + 34? Put the final answer in
    /// <answer> </answer> tags.`, or without the second sentence.
    #[arg(long, value_enum, default_value = "tinyzero")]
    pub prompt_style: PromptStyle,
    /// Synthetic sources: which tasks: all, train (no held-out problem), heldout, or hard (one
    /// number more than --max-numbers, one digit more than --max-digits: out of domain).
    #[arg(long, value_enum, default_value = "all")]
    pub split: Split,
    /// Synthetic sources: percent of problems held out (for --split train / heldout).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub heldout_percent: u32,
    /// Synthetic sources: write supervised warm-start examples instead of prompts: per task, one
    /// conversation ending in an assistant answer `<think>…</think><answer>…</answer>` and one
    /// ending in an assistant confidence `<analysis>…</analysis><confidence>p</confidence>` (for
    /// `rlcr sft`).
    #[arg(long)]
    pub sft: bool,
    /// With --sft: fraction of answers that are correct (the others use a wrong operation, or an
    /// arithmetic result with one digit changed), so the warm-started policy leaves room to learn.
    #[arg(long, default_value_t = 0.5)]
    pub sft_correct_fraction: f64,
    /// With --sft: the confidence of the examples per difficulty (countdown: number count;
    /// arithmetic: digits per operand), `DIFFICULTY=LOW-HIGH` entries separated by commas (e.g.
    /// `2=0.3-0.7,3=0.0-0.3`): each example's confidence is drawn uniformly from the tenths of its
    /// difficulty's range, whether its answer is right or not. Every difficulty of the task shape
    /// needs a range. Default: 0.1–0.9 for every task.
    #[arg(long)]
    pub sft_confidence: Option<String>,
    /// With --sft: the system prompt of the examples (use the one you will sample with).
    #[arg(long)]
    pub system_prompt: Option<String>,
    /// With --sft: the confidence query of the examples (default: generate-confidence's).
    #[arg(long)]
    pub confidence_prompt: Option<String>,
    /// Keep only the prompts whose pass rate in this scored table (`rlcr score`'s output for
    /// answers sampled from these prompts) lies strictly between --min-pass-rate and
    /// --max-pass-rate: by default the prompts that were neither always right nor always wrong,
    /// the only ones whose answers get a non-zero group-relative advantage. A prompt's pass rate
    /// is the mean acc_reward of its answer rows.
    #[arg(long, value_name = "SCORED")]
    pub pass_rates: Option<PathBuf>,
    /// With --pass-rates: keep rows whose pass rate is above this.
    #[arg(long, default_value_t = 0.0, requires = "pass_rates")]
    pub min_pass_rate: f64,
    /// With --pass-rates: keep rows whose pass rate is below this.
    #[arg(long, default_value_t = 1.0, requires = "pass_rates")]
    pub max_pass_rate: f64,
    /// With --pass-rates: keep this share (0..=1) of the always-right and of the never-right
    /// prompts as well, spread evenly through each in input order. Their answers get no
    /// advantage, but an RLCR loop's confidence turn learns from them what "sure" and "unsure"
    /// should mean; on in-between prompts alone it learns only the pool's mean accuracy.
    #[arg(
        long,
        default_value_t = 0.0,
        requires = "pass_rates",
        value_name = "SHARE"
    )]
    pub keep_decided: f64,
}

/// The user message of countdown tasks.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptStyle {
    Tinyzero,
    Short,
}

impl TryFrom<(&Global, &Args)> for Plan {
    type Error = anyhow::Error;

    /// Check the flags (usage errors: exit 2) and build the engine's plan.
    fn try_from((g, a): (&Global, &Args)) -> Result<Plan> {
        let usage = |m: String| -> anyhow::Error { UsageError(m).into() };
        if a.sft_confidence.is_some() && !a.sft {
            return Err(usage("--sft-confidence works with --sft".into()));
        }
        // The warm-start plan of a synthetic source whose difficulties run over `levels`.
        let sft_plan = |levels, unit| -> Result<Option<SftPlan>> {
            a.sft
                .then(|| {
                    SftPlan::new(
                        a.sft_correct_fraction,
                        a.system_prompt.clone(),
                        a.confidence_prompt.clone(),
                        a.sft_confidence.as_deref(),
                        levels,
                        unit,
                    )
                })
                .transpose()
        };
        let synthetic = matches!(
            a.from,
            Some(Source::CountdownSynth | Source::ArithmeticSynth)
        );
        if synthetic || a.from == Some(Source::Countdown) {
            for (set, flag) in [
                (a.prompt_key.is_some(), "--prompt-key"),
                (a.input_template.is_some(), "--input-template"),
                (a.label_key.is_some(), "--label-key"),
                (a.data_source_key.is_some(), "--data-source-key"),
                (a.data_source.is_some(), "--data-source"),
            ] {
                if set {
                    return Err(usage(format!(
                        "{flag} maps dataset columns; --from {} has none",
                        a.from.map(Source::name).unwrap_or_default()
                    )));
                }
            }
        }
        if synthetic && (a.shuffle_seed.is_some() || a.draw.is_some()) {
            return Err(usage(
                "--shuffle-seed and --draw draw from dataset files; the synthetic sources draw with --seed".into(),
            ));
        }
        if a.count == Some(0) {
            return Err(usage("--count must be at least 1".into()));
        }
        let build = match a.from {
            None if a.input.is_empty() => {
                return Err(usage(
                    "name dataset files with --input FILE|FOLDER|GLOB, or a synthetic source with --from"
                        .into(),
                ))
            }
            Some(Source::CountdownSynth | Source::ArithmeticSynth) if !a.input.is_empty() => {
                return Err(usage(format!(
                    "--from {} takes no --input",
                    a.from.map(Source::name).unwrap_or_default()
                )));
            }
            Some(Source::CountdownSynth | Source::ArithmeticSynth) if a.count.is_none() => {
                return Err(usage(format!(
                    "--from {} needs --count N",
                    a.from.map(Source::name).unwrap_or_default()
                )));
            }
            Some(Source::CountdownSynth) => {
                if a.min_numbers > a.max_numbers {
                    return Err(usage(format!(
                        "--min-numbers {} is larger than --max-numbers {}",
                        a.min_numbers, a.max_numbers
                    )));
                }
                let sft = sft_plan(a.min_numbers..=a.max_numbers, "numbers")?;
                let shape = SynthShape {
                    min_numbers: a.min_numbers,
                    max_numbers: a.max_numbers,
                    max_number: a.max_number,
                    max_target: a.max_target,
                    short_prompt: a.prompt_style == PromptStyle::Short,
                    heldout_percent: a.heldout_percent,
                };
                Build::Synth {
                    seed: g.seed,
                    count: a.count.unwrap_or_default(),
                    task: SynthTask::Countdown(shape),
                    split: a.split,
                    sft,
                }
            }
            Some(Source::ArithmeticSynth) => {
                let shape = ArithShape {
                    min_digits: a.min_digits,
                    max_digits: a.max_digits,
                    ops: parse_ops(&a.ops).map_err(usage)?,
                    short_prompt: a.prompt_style == PromptStyle::Short,
                    heldout_percent: a.heldout_percent,
                };
                shape.check().map_err(usage)?;
                let sft = sft_plan(a.min_digits..=a.max_digits, "digits")?;
                Build::Synth {
                    seed: g.seed,
                    count: a.count.unwrap_or_default(),
                    task: SynthTask::Arithmetic(shape),
                    split: a.split,
                    sft,
                }
            }
            _ if a.sft => {
                return Err(usage(
                    "--sft works with --from countdown-synth or arithmetic-synth".into(),
                ))
            }
            _ if a.split != Split::All => {
                return Err(usage(
                    "--split works with --from countdown-synth or arithmetic-synth".into(),
                ))
            }
            source => {
                if a.input.is_empty() {
                    return Err(usage(format!(
                        "--from {} needs --input FILE",
                        source.map(Source::name).unwrap_or_default()
                    )));
                }
                let template = match &a.input_template {
                    Some(t) => {
                        Some(Template::parse(t).map_err(|e| usage(format!("--input-template: {e}")))?)
                    }
                    None => None,
                };
                if a.data_source.as_deref() == Some("") {
                    return Err(usage("--data-source must not be empty".into()));
                }
                Build::File {
                    source,
                    inputs: a.input.clone(),
                    mapping: Mapping {
                        prompt_key: a.prompt_key.clone(),
                        template,
                        label_key: a.label_key.clone(),
                        data_source_key: a.data_source_key.clone(),
                        data_source: a.data_source.clone(),
                    },
                    count: a.count,
                    shuffle_seed: a.shuffle_seed,
                    draw: a.draw.map(|index| Draw { index }),
                }
            }
        };
        let pass_rates = match &a.pass_rates {
            Some(p) => Some(PassRateFilter::new(
                p.clone(),
                a.min_pass_rate,
                a.max_pass_rate,
                a.keep_decided,
            )?),
            None => None,
        };
        if a.sft && pass_rates.is_some() {
            return Err(usage(
                "--pass-rates filters prompts; --sft writes warm-start examples".into(),
            ));
        }
        let mut config = serde_json::to_value(a)?;
        config["seed"] = json!(g.seed);
        config["argv"] = json!(g.argv);
        Ok(Plan {
            build,
            pass_rates,
            out: a.out.clone(),
            config,
        })
    }
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let plan = Plan::try_from((g, &a))?;
    let s = crate::prepare::run(&plan)?;
    crate::info!("{}", s.line(&a.out));
    Ok(())
}
