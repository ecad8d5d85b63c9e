//! `rlcr prepare`: build a prompts table from a dataset or from synthetic countdown tasks.
//!
//! Every source becomes the same prompts table (`rlcr.prompts`): `prompt_id`, `messages` (JSON list
//! of {role, content}), `data_source`, `ground_truth` (JSON text), `extra_info` (JSON text). Ids are
//! stable: synthetic tasks are numbered in generation order (so `--count 10` is a prefix of
//! `--count 100` with the same seed); dataset rows keep their own id when they have one
//! (`id`, verl's `extra_info.index`) and their row number otherwise.
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::{ArrayRef, RecordBatch, StringArray};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use super::common::{Global, UsageError};
use crate::table::{self, Meta, Reader, PROMPTS};

pub const ABOUT: &str =
    "Build a prompts table (countdown-synth, TinyZero countdown, verl Parquet, JSONL)";
pub const LONG_ABOUT: &str = "\
Build a prompts table: one row per prompt with `prompt_id`, `messages` (JSON list of {role, content}),
`data_source`, `ground_truth` (JSON text) and `extra_info`. This is the input of `generate-answers`.

Sources:
  countdown-synth  seeded synthetic countdown tasks (3-4 numbers in 1..99, a target in 1..100 reachable
                   with + - * / using each number once; the solution goes to extra_info), with
                   TinyZero's prompt text as the user message; needs --count
  countdown        TinyZero's raw dataset (Parquet or JSONL with `target`, `nums`)
  verl             a verl dataset Parquet (`prompt`, `data_source`, `reward_model.ground_truth`,
                   `extra_info`)
  jsonl            one JSON object per line with `prompt` (text or message list) or `messages`,
                   `ground_truth`, optional `data_source` (default \"jsonl\") and `id`

Reads: --input (not for countdown-synth). Writes: -o (atomically; never an input).
Example:
  rlcr --seed 1 prepare --from countdown-synth --count 512 -o prompts.parquet";

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
    /// countdown-synth: the user message: TinyZero's text, or a short one (`Numbers: [3, 5].
    /// Target: 8.`) for tiny models.
    #[arg(long, value_enum, default_value = "tinyzero")]
    pub prompt_style: PromptStyle,
    /// countdown-synth: write supervised warm-start examples instead of prompts: per task, one
    /// conversation ending in an assistant answer `<think>…</think><answer>…</answer>` and one
    /// ending in an assistant confidence `<analysis>…</analysis><confidence>p</confidence>` (for
    /// `rlcr sft`).
    #[arg(long)]
    pub sft: bool,
    /// With --sft: fraction of answers that are correct (the others use a wrong operation), so the
    /// warm-started policy leaves room to learn.
    #[arg(long, default_value_t = 0.5)]
    pub sft_correct_fraction: f64,
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

/// The shape of synthetic countdown tasks.
#[derive(Clone, Copy, Debug)]
pub struct SynthShape {
    pub min_numbers: u32,
    pub max_numbers: u32,
    pub max_number: i64,
    pub max_target: i64,
    /// Use the short user message instead of TinyZero's.
    pub short_prompt: bool,
}

impl Default for SynthShape {
    /// TinyZero's Countdown-Tasks-3to4 shape: 3–4 numbers in 1..=99, targets in 1..=100.
    fn default() -> Self {
        SynthShape {
            min_numbers: 3,
            max_numbers: 4,
            max_number: 99,
            max_target: 100,
            short_prompt: false,
        }
    }
}

/// Prompt sources.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    CountdownSynth,
    Countdown,
    Verl,
    Jsonl,
}

/// One prompt row.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptRow {
    pub prompt_id: String,
    pub messages: Value,
    pub data_source: String,
    pub ground_truth: Value,
    pub extra_info: Option<Value>,
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let rows = match a.from {
        Source::CountdownSynth => {
            if a.input.is_some() {
                return Err(UsageError("--from countdown-synth takes no --input".into()).into());
            }
            let n = a
                .count
                .ok_or_else(|| UsageError("--from countdown-synth needs --count N".into()))?;
            if a.min_numbers > a.max_numbers {
                return Err(UsageError(format!(
                    "--min-numbers {} is larger than --max-numbers {}",
                    a.min_numbers, a.max_numbers
                ))
                .into());
            }
            let shape = SynthShape {
                min_numbers: a.min_numbers,
                max_numbers: a.max_numbers,
                max_number: a.max_number,
                max_target: a.max_target,
                short_prompt: a.prompt_style == PromptStyle::Short,
            };
            let rows = countdown_synth(g.seed, n, shape)?;
            if a.sft {
                if !(0.0..=1.0).contains(&a.sft_correct_fraction) {
                    return Err(UsageError(
                        "--sft-correct-fraction must be between 0 and 1".into(),
                    )
                    .into());
                }
                let system = a
                    .system_prompt
                    .clone()
                    .unwrap_or_else(|| crate::sample::prompts::DEFAULT_SYSTEM_PROMPT.to_string());
                let query = a.confidence_prompt.clone().unwrap_or_else(|| {
                    crate::sample::prompts::DEFAULT_CONFIDENCE_PROMPT.to_string()
                });
                sft_examples(g.seed, &rows, a.sft_correct_fraction, &system, &query)?
            } else {
                rows
            }
        }
        _ if a.sft => {
            return Err(UsageError("--sft works with --from countdown-synth".into()).into());
        }
        src => {
            let input = a.input.as_deref().ok_or_else(|| {
                UsageError(format!("--from {} needs --input FILE", source_name(src)))
            })?;
            let mut rows = match src {
                Source::Countdown => read_countdown(input)?,
                Source::Verl => read_verl(input)?,
                _ => read_jsonl(input)?,
            };
            if let Some(n) = a.count {
                rows.truncate(n);
            }
            rows
        }
    };
    if rows.is_empty() {
        match &a.input {
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
                a.input.as_deref().unwrap_or(Path::new("-")).display(),
                r.prompt_id
            );
        }
    }
    let batch = to_batch(&rows)?;
    let mut config = serde_json::to_value(&a)?;
    config["seed"] = json!(g.seed);
    let inputs: Vec<&Path> = a.input.iter().map(|p| p.as_path()).collect();
    let meta = Meta::new(&PROMPTS, "prepare", config, &inputs);
    let n = table::write_table(&a.out, batch.schema(), &[batch], &meta)?;
    crate::info!("prepare: wrote {n} prompts to {}", a.out.display());
    Ok(())
}

fn source_name(s: Source) -> &'static str {
    match s {
        Source::CountdownSynth => "countdown-synth",
        Source::Countdown => "countdown",
        Source::Verl => "verl",
        Source::Jsonl => "jsonl",
    }
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

/// TinyZero's countdown user prompt (`examples/data_preprocess/countdown.py`, without the
/// template's "Assistant:" prefix, which the chat template supplies).
pub fn countdown_prompt(nums: &[i64], target: i64) -> String {
    let list = nums
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "Using the numbers [{list}], create an equation that equals {target}. You can use basic \
arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in \
<think> </think> tags. And return the final answer in <answer> </answer> tags, for example \
<answer> (1 + 2) / 3 </answer>."
    )
}

/// The short countdown prompt for tiny models: `Numbers: [3, 5]. Target: 8.`
pub fn countdown_prompt_short(nums: &[i64], target: i64) -> String {
    let list = nums
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    format!("Numbers: [{list}]. Target: {target}.")
}

fn countdown_row(id: String, nums: Vec<i64>, target: i64, extra: Option<Value>) -> PromptRow {
    countdown_row_styled(id, nums, target, extra, false)
}

fn countdown_row_styled(
    id: String,
    nums: Vec<i64>,
    target: i64,
    extra: Option<Value>,
    short: bool,
) -> PromptRow {
    let text = if short {
        countdown_prompt_short(&nums, target)
    } else {
        countdown_prompt(&nums, target)
    };
    PromptRow {
        prompt_id: id,
        messages: json!([{"role": "user", "content": text}]),
        data_source: "countdown".into(),
        ground_truth: json!({"target": target, "numbers": nums}),
        extra_info: extra,
    }
}

/// `count` synthetic countdown tasks from `seed`: by default 3–4 numbers in 1..=99 (see
/// [`SynthShape`]), combined in a random order with random operations (− only when the result stays
/// positive, ÷ only when exact, products capped at 10 000) into a target in 1..=100. Every task is
/// solvable by construction; the construction is recorded in `extra_info.solution`. A small shape
/// (`--max-numbers 2 --max-number 9`) gives a task a tiny model can learn.
pub fn countdown_synth(seed: u64, count: usize, shape: SynthShape) -> Result<Vec<PromptRow>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x636f_756e_7464_6f77);
    let mut rows = Vec::with_capacity(count);
    let width = count.max(1).to_string().len().max(6);
    let mut attempts = 0u64;
    while rows.len() < count {
        attempts += 1;
        if attempts > 10_000 + 10_000 * count as u64 {
            bail!(
                "countdown-synth: cannot make tasks with {}..={} numbers in 1..={} and targets in 1..={}",
                shape.min_numbers,
                shape.max_numbers,
                shape.max_number,
                shape.max_target
            );
        }
        let n = rng.random_range(shape.min_numbers..=shape.max_numbers);
        let nums: Vec<i64> = (0..n)
            .map(|_| rng.random_range(1..=shape.max_number))
            .collect();
        let mut items: Vec<(i64, String, bool)> =
            nums.iter().map(|&v| (v, v.to_string(), true)).collect();
        let mut ok = true;
        while items.len() > 1 {
            let i = rng.random_range(0..items.len());
            let (va, ea, aa) = items.swap_remove(i);
            let j = rng.random_range(0..items.len());
            let (vb, eb, ab) = items.swap_remove(j);
            let wrap = |e: &str, atom: bool| {
                if atom {
                    e.to_string()
                } else {
                    format!("({e})")
                }
            };
            let op = rng.random_range(0..4);
            let (v, e) = match op {
                0 => (va + vb, format!("{ea} + {eb}")),
                1 if va > vb => (va - vb, format!("{ea} - {}", wrap(&eb, ab))),
                1 if vb > va => (vb - va, format!("{eb} - {}", wrap(&ea, aa))),
                2 if va * vb <= 10_000 => {
                    (va * vb, format!("{} * {}", wrap(&ea, aa), wrap(&eb, ab)))
                }
                3 if vb != 0 && va % vb == 0 => {
                    (va / vb, format!("{} / {}", wrap(&ea, aa), wrap(&eb, ab)))
                }
                3 if va != 0 && vb % va == 0 => {
                    (vb / va, format!("{} / {}", wrap(&eb, ab), wrap(&ea, aa)))
                }
                _ => {
                    ok = false;
                    break;
                }
            };
            items.push((v, e, false));
        }
        if !ok || items.len() != 1 {
            continue;
        }
        let (target, expr, _) = items.remove(0);
        if !(1..=shape.max_target).contains(&target) {
            continue;
        }
        let id = format!("countdown-synth-{:0width$}", rows.len());
        rows.push(countdown_row_styled(
            id,
            nums,
            target,
            Some(json!({"solution": expr})),
            shape.short_prompt,
        ));
    }
    Ok(rows)
}

/// Supervised warm-start conversations for synthetic countdown tasks (for `rlcr sft`): per task an
/// answer example `[system, user, assistant: <think>E</think><answer>E</answer>]` and a
/// confidence example `[…, assistant: answer, user: query, assistant: <analysis>E</analysis>
/// <confidence>p</confidence>]`. A fraction `1 − correct_fraction` of the answers swap one operation
/// for another that changes the value (a wrong but well-formed answer); confidences are drawn
/// uniformly from {0.1, …, 0.9} regardless of correctness, so the warm start teaches the format and
/// leaves calibration to the RL loop.
pub fn sft_examples(
    seed: u64,
    tasks: &[PromptRow],
    correct_fraction: f64,
    system: &str,
    query: &str,
) -> Result<Vec<PromptRow>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7366_745f_6578_616d);
    let mut out = Vec::with_capacity(tasks.len() * 2);
    for t in tasks {
        let sol = t
            .extra_info
            .as_ref()
            .and_then(|e| e.get("solution"))
            .and_then(Value::as_str)
            .with_context(|| format!("task {} has no solution", t.prompt_id))?;
        let target = t.ground_truth["target"].as_i64().unwrap_or(0);
        let user = t
            .messages
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m.get("content"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let correct = rng.random_bool(correct_fraction);
        let eq = if correct {
            sol.to_string()
        } else {
            wrong_equation(sol, target, &mut rng).unwrap_or_else(|| sol.to_string())
        };
        let answer = format!("<think>{eq}</think><answer>{eq}</answer>");
        let c = rng.random_range(1..=9) as f64 / 10.0;
        let conf = format!("<analysis>{eq}</analysis><confidence>{c:.1}</confidence>");
        let mut base = vec![];
        if !system.is_empty() {
            base.push(json!({"role": "system", "content": system}));
        }
        base.push(json!({"role": "user", "content": user}));
        let mut a = base.clone();
        a.push(json!({"role": "assistant", "content": answer}));
        let mut cm = a.clone();
        cm.push(json!({"role": "user", "content": query}));
        cm.push(json!({"role": "assistant", "content": conf}));
        for (suffix, messages) in [("sft-a", a), ("sft-c", cm)] {
            out.push(PromptRow {
                prompt_id: format!("{}/{suffix}", t.prompt_id),
                messages: Value::Array(messages),
                data_source: t.data_source.clone(),
                ground_truth: t.ground_truth.clone(),
                extra_info: Some(json!({"correct": correct})),
            });
        }
    }
    Ok(out)
}

/// Replace one operator of `eq` so that its value differs from `target` (None if impossible).
fn wrong_equation(eq: &str, target: i64, rng: &mut ChaCha8Rng) -> Option<String> {
    let ops: Vec<usize> = eq
        .char_indices()
        .filter(|(_, c)| matches!(c, '+' | '-' | '*' | '/'))
        .map(|(i, _)| i)
        .collect();
    for _ in 0..16 {
        let &at = ops.get(rng.random_range(0..ops.len().max(1)))?;
        let new = ['+', '-', '*', '/'][rng.random_range(0..4)];
        let mut s = eq.to_string();
        s.replace_range(at..at + 1, &new.to_string());
        if eval_int(&s) != Some(target) {
            return Some(s);
        }
    }
    None
}

/// Exact evaluation of `+ - * / ( )` over integers; None on a non-exact division or overflow.
fn eval_int(s: &str) -> Option<i64> {
    fn expr(t: &[u8], i: &mut usize) -> Option<i64> {
        let mut v = term(t, i)?;
        while *i < t.len() && (t[*i] == b'+' || t[*i] == b'-') {
            let op = t[*i];
            *i += 1;
            let r = term(t, i)?;
            v = if op == b'+' {
                v.checked_add(r)?
            } else {
                v.checked_sub(r)?
            };
        }
        Some(v)
    }
    fn term(t: &[u8], i: &mut usize) -> Option<i64> {
        let mut v = atom(t, i)?;
        while *i < t.len() && (t[*i] == b'*' || t[*i] == b'/') {
            let op = t[*i];
            *i += 1;
            let r = atom(t, i)?;
            v = if op == b'*' {
                v.checked_mul(r)?
            } else if r != 0 && v % r == 0 {
                v / r
            } else {
                return None;
            };
        }
        Some(v)
    }
    fn atom(t: &[u8], i: &mut usize) -> Option<i64> {
        if *i < t.len() && t[*i] == b'(' {
            *i += 1;
            let v = expr(t, i)?;
            (*i < t.len() && t[*i] == b')').then(|| *i += 1)?;
            Some(v)
        } else {
            let start = *i;
            let mut v: i64 = 0;
            while *i < t.len() && t[*i].is_ascii_digit() {
                v = v.checked_mul(10)?.checked_add((t[*i] - b'0') as i64)?;
                *i += 1;
            }
            (*i > start).then_some(v)
        }
    }
    let t: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut i = 0;
    let v = expr(&t, &mut i)?;
    (i == t.len()).then_some(v)
}

fn read_jsonl_values(path: &Path) -> Result<Vec<(usize, Value)>> {
    let f =
        std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut out = vec![];
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line =
            line.with_context(|| format!("{}, line {}: cannot read", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line)
            .with_context(|| format!("{}, line {}: not valid JSON", path.display(), i + 1))?;
        if !v.is_object() {
            bail!("{}, line {}: expected a JSON object", path.display(), i + 1);
        }
        out.push((i + 1, v));
    }
    Ok(out)
}

fn is_parquet(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == b"PAR1"
}

/// Rows of a Parquet file as JSON objects (row number, object).
fn parquet_rows(path: &Path) -> Result<Vec<(usize, Value)>> {
    let r = Reader::open(path)?;
    let mut out = vec![];
    let mut row = 0usize;
    for b in r {
        let b = b?;
        for i in 0..b.num_rows() {
            let mut m = serde_json::Map::new();
            for (f, c) in b.schema().fields().iter().zip(b.columns()) {
                let v = table::json::value(c.as_ref(), i).with_context(|| {
                    format!("{}, row {row}, column `{}`", path.display(), f.name())
                })?;
                m.insert(f.name().clone(), v);
            }
            out.push((row, Value::Object(m)));
            row += 1;
        }
    }
    Ok(out)
}

fn read_countdown(path: &Path) -> Result<Vec<PromptRow>> {
    let parquet = is_parquet(path);
    let rows = if parquet {
        parquet_rows(path)?
    } else {
        read_jsonl_values(path)?
    };
    let what = if parquet { "row" } else { "line" };
    let mut out = vec![];
    for (n, v) in rows {
        let loc = || format!("{}, {what} {n}", path.display());
        let target = v
            .get("target")
            .and_then(Value::as_i64)
            .with_context(|| format!("{}, column `target`: missing or not an integer", loc()))?;
        let nums: Vec<i64> = v
            .get("nums")
            .and_then(Value::as_array)
            .with_context(|| format!("{}, column `nums`: missing or not a list", loc()))?
            .iter()
            .map(|x| x.as_i64())
            .collect::<Option<Vec<_>>>()
            .with_context(|| format!("{}, column `nums`: not a list of integers", loc()))?;
        if nums.is_empty() {
            bail!("{}, column `nums`: empty list", loc());
        }
        let id = match v.get("id") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(x)) => format!("countdown-{x}"),
            _ => format!("countdown-{n:06}"),
        };
        out.push(countdown_row(id, nums, target, None));
    }
    Ok(out)
}

fn messages_from(v: &Value, loc: &dyn Fn() -> String, key: &str) -> Result<Value> {
    match v {
        Value::String(s) => Ok(json!([{"role": "user", "content": s}])),
        Value::Array(items) => {
            for (k, m) in items.iter().enumerate() {
                let ok = m.get("role").is_some_and(Value::is_string)
                    && m.get("content").is_some_and(Value::is_string);
                if !ok {
                    bail!(
                        "{}, column `{key}`: message {k} needs string `role` and `content`",
                        loc()
                    );
                }
            }
            if items.is_empty() {
                bail!("{}, column `{key}`: empty message list", loc());
            }
            Ok(Value::Array(
                items
                    .iter()
                    .map(|m| json!({"role": m["role"], "content": m["content"]}))
                    .collect(),
            ))
        }
        _ => bail!(
            "{}, column `{key}`: expected text or a list of messages",
            loc()
        ),
    }
}

fn read_verl(path: &Path) -> Result<Vec<PromptRow>> {
    if !is_parquet(path) {
        // Reader::open gives the precise message (empty, not Parquet, ...).
        Reader::open(path)?;
    }
    let mut out = vec![];
    for (n, v) in parquet_rows(path)? {
        let loc = || format!("{}, row {n}", path.display());
        let prompt = v
            .get("prompt")
            .with_context(|| format!("{}: column `prompt` is missing", path.display()))?;
        let messages = messages_from(prompt, &loc, "prompt")?;
        let data_source = v
            .get("data_source")
            .and_then(Value::as_str)
            .unwrap_or("verl")
            .to_string();
        let gt = v
            .get("reward_model")
            .and_then(|r| r.get("ground_truth"))
            .cloned()
            .with_context(|| format!("{}, column `reward_model.ground_truth`: missing", loc()))?;
        let extra = v.get("extra_info").cloned().filter(|x| !x.is_null());
        let id = match extra.as_ref().and_then(|e| e.get("index")) {
            Some(idx) if !idx.is_null() => {
                let split = extra
                    .as_ref()
                    .and_then(|e| e.get("split"))
                    .and_then(Value::as_str)
                    .map(|s| format!("{s}-"))
                    .unwrap_or_default();
                let idx = idx
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| idx.to_string());
                format!("{data_source}-{split}{idx}")
            }
            _ => format!("{data_source}-{n:06}"),
        };
        out.push(PromptRow {
            prompt_id: id,
            messages,
            data_source,
            ground_truth: gt,
            extra_info: extra,
        });
    }
    Ok(out)
}

fn read_jsonl(path: &Path) -> Result<Vec<PromptRow>> {
    let mut out = vec![];
    for (n, v) in read_jsonl_values(path)? {
        let loc = || format!("{}, line {n}", path.display());
        let messages = if let Some(m) = v.get("messages") {
            messages_from(m, &loc, "messages")?
        } else if let Some(p) = v.get("prompt") {
            messages_from(p, &loc, "prompt")?
        } else {
            bail!("{}: needs `prompt` or `messages`", loc());
        };
        let gt = v
            .get("ground_truth")
            .cloned()
            .with_context(|| format!("{}, field `ground_truth`: missing", loc()))?;
        let data_source = match v.get("data_source") {
            None | Some(Value::Null) => "jsonl".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => bail!("{}, field `data_source`: expected text", loc()),
        };
        let id = match v.get("id") {
            None | Some(Value::Null) => format!("{data_source}-{n:06}"),
            Some(Value::String(s)) => s.clone(),
            Some(x) => x.to_string(),
        };
        let mut extra = v.clone();
        if let Some(m) = extra.as_object_mut() {
            for k in ["messages", "prompt", "ground_truth", "data_source", "id"] {
                m.remove(k);
            }
        }
        let extra = extra
            .as_object()
            .filter(|m| !m.is_empty())
            .map(|_| extra.clone());
        out.push(PromptRow {
            prompt_id: id,
            messages,
            data_source,
            ground_truth: gt,
            extra_info: extra,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evaluate a construction string with exact integer arithmetic (the generator only emits
    /// exact divisions), independently of the generator's bookkeeping.
    fn eval(s: &str) -> i64 {
        fn expr(t: &[char], i: &mut usize) -> i64 {
            let mut v = term(t, i);
            while *i < t.len() && (t[*i] == '+' || t[*i] == '-') {
                let op = t[*i];
                *i += 1;
                let r = term(t, i);
                v = if op == '+' { v + r } else { v - r };
            }
            v
        }
        fn term(t: &[char], i: &mut usize) -> i64 {
            let mut v = atom(t, i);
            while *i < t.len() && (t[*i] == '*' || t[*i] == '/') {
                let op = t[*i];
                *i += 1;
                let r = atom(t, i);
                v = if op == '*' {
                    v * r
                } else {
                    assert_eq!(v % r, 0);
                    v / r
                };
            }
            v
        }
        fn atom(t: &[char], i: &mut usize) -> i64 {
            if t[*i] == '(' {
                *i += 1;
                let v = expr(t, i);
                *i += 1;
                v
            } else {
                let mut v = 0;
                while *i < t.len() && t[*i].is_ascii_digit() {
                    v = v * 10 + t[*i].to_digit(10).unwrap() as i64;
                    *i += 1;
                }
                v
            }
        }
        let t: Vec<char> = s.chars().filter(|c| !c.is_whitespace()).collect();
        let mut i = 0;
        expr(&t, &mut i)
    }

    #[test]
    fn synthetic_tasks_are_solvable_and_seeded() {
        let a = countdown_synth(7, 200, SynthShape::default()).unwrap();
        assert_eq!(a.len(), 200);
        for r in &a {
            let target = r.ground_truth["target"].as_i64().unwrap();
            let mut nums: Vec<i64> = r.ground_truth["numbers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect();
            assert!((3..=4).contains(&nums.len()));
            assert!(nums.iter().all(|n| (1..=99).contains(n)));
            assert!((1..=100).contains(&target));
            let sol = r.extra_info.as_ref().unwrap()["solution"].as_str().unwrap();
            assert_eq!(eval(sol), target, "{sol}");
            let mut used: Vec<i64> = sol
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            used.sort();
            nums.sort();
            assert_eq!(used, nums, "{sol}");
        }
        let b = countdown_synth(7, 50, SynthShape::default()).unwrap();
        assert_eq!(&a[..50], &b[..]);
        let c = countdown_synth(8, 50, SynthShape::default()).unwrap();
        assert_ne!(a[..50], c[..]);
        let small = SynthShape {
            min_numbers: 2,
            max_numbers: 2,
            max_number: 9,
            max_target: 81,
            short_prompt: true,
        };
        for r in countdown_synth(1, 100, small).unwrap() {
            let nums = r.ground_truth["numbers"].as_array().unwrap().clone();
            assert_eq!(nums.len(), 2);
            assert!(nums.iter().all(|n| (1..=9).contains(&n.as_i64().unwrap())));
            let sol = r.extra_info.as_ref().unwrap()["solution"]
                .as_str()
                .unwrap()
                .to_string();
            assert_eq!(eval(&sol), r.ground_truth["target"].as_i64().unwrap());
        }
    }

    #[test]
    fn sft_examples_have_the_format_and_the_fraction() {
        let tasks = countdown_synth(5, 200, SynthShape::default()).unwrap();
        let ex = sft_examples(5, &tasks, 0.5, "sys", "how sure?").unwrap();
        assert_eq!(ex.len(), 400);
        let mut correct = 0;
        for pair in ex.chunks(2) {
            let a = pair[0].messages.as_array().unwrap();
            assert_eq!(a.len(), 3);
            let ans = a[2]["content"].as_str().unwrap();
            assert!(
                ans.starts_with("<think>") && ans.ends_with("</answer>"),
                "{ans}"
            );
            let eq = ans
                .split("<answer>")
                .nth(1)
                .unwrap()
                .trim_end_matches("</answer>");
            let target = pair[0].ground_truth["target"].as_i64().unwrap();
            let is_correct = pair[0].extra_info.as_ref().unwrap()["correct"]
                .as_bool()
                .unwrap();
            if is_correct {
                assert_eq!(eval(eq), target, "{eq}");
                correct += 1;
            } else {
                assert_ne!(eval_int(eq), Some(target), "{eq}");
            }
            let c = pair[1].messages.as_array().unwrap();
            assert_eq!(c.len(), 5);
            assert_eq!(c[3]["content"], "how sure?");
            let conf = c[4]["content"].as_str().unwrap();
            assert!(
                conf.starts_with("<analysis>") && conf.ends_with("</confidence>"),
                "{conf}"
            );
        }
        // 200 draws at p = 0.5: within 4 standard deviations (±28).
        assert!((72..=128).contains(&correct), "{correct}");
        assert_eq!(eval_int("(8 / 3) * 3"), None);
        assert_eq!(eval_int("2 * (3 + 4)"), Some(14));
    }

    #[test]
    fn tinyzero_prompt_text() {
        assert_eq!(
            countdown_prompt(&[44, 19, 35], 98),
            "Using the numbers [44, 19, 35], create an equation that equals 98. You can use basic arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
        );
    }
}
