//! `rlcr prepare`: the flags, their checks and the summary line; the engine is
//! [`crate::prepare`] (sources, synthetic tasks, splits, warm-start examples).
use std::path::PathBuf;

use anyhow::Result;
use serde_json::json;

use super::common::{Global, UsageError};
use crate::prepare::{
    parse_ops, ArithShape, Build, Plan, SftConfidence, SftPlan, Source, Split, SynthShape,
};

pub const ABOUT: &str =
    "Build a prompts table (countdown-synth, arithmetic-synth, TinyZero countdown, verl Parquet, JSONL)";
pub const LONG_ABOUT: &str = "\
Build a prompts table: one row per prompt with `prompt_id`, `messages` (JSON list of {role, content}),
`data_source`, `ground_truth` (JSON text) and `extra_info`. This is the input of `generate-answers`.

Sources:
  countdown-synth  seeded synthetic countdown tasks (3-4 numbers in 1..99, a target in 1..100 reachable
                   with + - * / using each number once; the solution, the difficulty (how many
                   numbers) and the split go to extra_info), with TinyZero's prompt text as the
                   user message; needs --count
  arithmetic-synth seeded synthetic arithmetic `What is A op B?` (both operands of D digits,
                   D in --min-digits..--max-digits, the difficulty; operations from --ops; the
                   exact result as ground truth for the math verifier; expression, difficulty and
                   split in extra_info); needs --count
  countdown        TinyZero's raw dataset (Parquet or JSONL with `target`, `nums`)
  verl             a verl dataset Parquet (`prompt`, `data_source`, `reward_model.ground_truth`,
                   `extra_info`)
  jsonl            one JSON object per line with `prompt` (text or message list) or `messages`,
                   `ground_truth`, optional `data_source` (default \"jsonl\") and `id`

Splits of the synthetic sources (--split): `train` and `heldout` never share a problem: a problem
(countdown: its numbers sorted, plus the target; arithmetic: `A op B` with the operands of + and *
sorted, e.g. `12+34`) is held out when a fixed hash of it falls in the first --heldout-percent of
100 buckets. `hard` is out of domain: --max-numbers + 1 numbers (--max-digits + 1 digits) per
task, a size training never sees. Held-out rows have data_source `countdown-heldout` /
`arithmetic-heldout`, hard ones `countdown-hard` / `arithmetic-hard` (reports break them out).
`all` (the default) draws every task.

Reads: --input (not for the synthetic sources). Writes: -o (atomically; never an input).
Example:
  rlcr --seed 1 prepare --from countdown-synth --count 512 -o prompts.parquet
  rlcr --seed 1 prepare --from arithmetic-synth --count 512 --min-digits 1 --max-digits 3 --ops '+*' \
    --split train -o arith.parquet
  rlcr --seed 9 prepare --from countdown-synth --count 256 --split heldout -o heldout.parquet";

#[derive(clap::Args, Debug, serde::Serialize)]
pub struct Args {
    /// Where the prompts come from.
    #[arg(long, value_enum)]
    pub from: Source,
    /// Input file (Parquet or JSONL), for every source but countdown-synth.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Output prompts table (Parquet).
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Number of prompts (countdown-synth: required; other sources: keep the first N).
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
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
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
        let sft_plan =
            |levels: std::ops::RangeInclusive<u32>, unit: &str| -> Result<Option<SftPlan>> {
                if !a.sft {
                    return Ok(None);
                }
                if !(0.0..=1.0).contains(&a.sft_correct_fraction) {
                    return Err(usage(
                        "--sft-correct-fraction must be between 0 and 1".into(),
                    ));
                }
                let system = a
                    .system_prompt
                    .clone()
                    .unwrap_or_else(|| crate::sample::prompts::DEFAULT_SYSTEM_PROMPT.to_string());
                let query = a.confidence_prompt.clone().unwrap_or_else(|| {
                    crate::sample::prompts::DEFAULT_CONFIDENCE_PROMPT.to_string()
                });
                let confidence = match &a.sft_confidence {
                    None => None,
                    Some(spec) => {
                        let c = SftConfidence::parse(spec)
                            .map_err(|e| usage(format!("--sft-confidence: {e}")))?;
                        for k in levels.clone() {
                            if c.range(k).is_none() {
                                return Err(usage(format!(
                                "--sft-confidence has no range for tasks of {k} {unit} ({}..={})",
                                levels.start(),
                                levels.end()
                            )));
                            }
                        }
                        Some(c)
                    }
                };
                Ok(Some(SftPlan {
                    correct_fraction: a.sft_correct_fraction,
                    system,
                    query,
                    confidence,
                }))
            };
        let build = match a.from {
            Source::CountdownSynth | Source::ArithmeticSynth if a.input.is_some() => {
                return Err(usage(format!("--from {} takes no --input", a.from.name())));
            }
            Source::CountdownSynth | Source::ArithmeticSynth if a.count.is_none() => {
                return Err(usage(format!("--from {} needs --count N", a.from.name())));
            }
            Source::CountdownSynth => {
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
                    shape,
                    split: a.split,
                    sft,
                }
            }
            Source::ArithmeticSynth => {
                let shape = ArithShape {
                    min_digits: a.min_digits,
                    max_digits: a.max_digits,
                    ops: parse_ops(&a.ops).map_err(usage)?,
                    short_prompt: a.prompt_style == PromptStyle::Short,
                    heldout_percent: a.heldout_percent,
                };
                shape.check().map_err(usage)?;
                let sft = sft_plan(a.min_digits..=a.max_digits, "digits")?;
                Build::Arith {
                    seed: g.seed,
                    count: a.count.unwrap_or_default(),
                    shape,
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
                let input = a
                    .input
                    .clone()
                    .ok_or_else(|| usage(format!("--from {} needs --input FILE", source.name())))?;
                Build::File {
                    source,
                    input,
                    count: a.count,
                }
            }
        };
        let mut config = serde_json::to_value(a)?;
        config["seed"] = json!(g.seed);
        Ok(Plan {
            build,
            out: a.out.clone(),
            config,
        })
    }
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let plan = Plan::try_from((g, &a))?;
    let s = crate::prepare::run(&plan)?;
    crate::info!("prepare: wrote {} prompts to {}", s.rows, a.out.display());
    Ok(())
}
