//! The start of the loop most tests share: easy countdown prompts (`prepare`), then answers from
//! the tiny Qwen2 fixture (`generate-answers`), each one command line built in one place.
use arrow::array::RecordBatch;

use super::table::{read, set_str, strs};
use crate::{fixtures, Workdir};

/// A fixture model folder (`fixtures/NAME`), as an argument.
pub fn model(name: &str) -> String {
    fixtures().join(name).display().to_string()
}

/// The tiny Qwen2 fixture's folder, as an argument.
pub fn tiny_qwen2() -> String {
    model("tiny-qwen2")
}

/// `prepare --from countdown-synth` for `count` easy tasks (two numbers in 1..9, the short
/// prompt style) into `out`; add `--sft` or `--seed` around it as needed.
pub fn easy_countdown_args(count: usize, out: &str) -> Vec<String> {
    [
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        &count.to_string(),
        "--min-numbers",
        "2",
        "--max-numbers",
        "2",
        "--max-number",
        "9",
        "--prompt-style",
        "short",
        "-o",
        out,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Run [`easy_countdown_args`] in `wd` (with `--seed SEED` first when given).
pub fn easy_countdown(wd: &Workdir, seed: Option<&str>, count: usize, out: &str) {
    let mut args: Vec<String> = seed
        .map(|s| vec!["--seed".to_string(), s.to_string()])
        .unwrap_or_default();
    args.extend(easy_countdown_args(count, out));
    run(wd, &args);
}

/// `generate-answers` with `model` on `input` into `out`: `num_answers` answers of at most
/// `max_new_tokens` tokens each, then `extra` flags.
pub fn answers_args(
    model: &str,
    input: &str,
    out: &str,
    num_answers: usize,
    max_new_tokens: usize,
    extra: &[&str],
) -> Vec<String> {
    let mut v: Vec<String> = [
        "generate-answers",
        "--model",
        model,
        "--input",
        input,
        "-o",
        out,
        "--num-answers",
        &num_answers.to_string(),
        "--max-new-tokens",
        &max_new_tokens.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Answers of the tiny Qwen2 fixture to the prompts table `prompts` (`num_answers` each, two
/// tokens long, written to `raw.parquet`), each row's `response_text` then replaced by
/// `response(row, ground_truth)` (the row's label as stored: JSON text): the tables of the tests
/// whose responses are chosen, not sampled. The caller writes the batch.
pub fn answers_responding(
    wd: &Workdir,
    prompts: &str,
    num_answers: usize,
    mut response: impl FnMut(usize, &str) -> String,
) -> RecordBatch {
    run(
        wd,
        &answers_args(&tiny_qwen2(), prompts, "raw.parquet", num_answers, 2, &[]),
    );
    let mut b = read(&wd.path("raw.parquet"));
    for (i, gt) in strs(&b, "ground_truth").iter().enumerate() {
        b = set_str(&b, "response_text", i, &response(i, gt));
    }
    b
}

/// Run owned arguments (from the builders above) in `wd`; stdout.
pub fn run(wd: &Workdir, args: &[String]) -> String {
    wd.run(&args.iter().map(String::as_str).collect::<Vec<_>>())
}
