//! Synthetic countdown tasks with graded, visible difficulty, a held-out split that is disjoint
//! from training by construction, an out-of-domain bucket, and supervised warm-start examples.
//!
//! Difficulty is the number of numbers in the task (shown in the prompt); it is recorded in
//! `extra_info.difficulty` with the split in `extra_info.split`.
//!
//! **The split.** A task's *canonical problem* is its numbers sorted ascending plus its target
//! ([`canonical_key`], e.g. `1,2,3=9`). A problem is held out when the hash of its key falls in the
//! first `heldout_percent` of 100 buckets ([`heldout_bucket`]). `Split::Train` rejects held-out
//! problems and `Split::Heldout` keeps only them, so no held-out problem (under any order of its
//! numbers, under any seed) can appear in training. `Split::Hard` draws tasks with one number
//! more than the largest training shape (`max_numbers + 1`): a difficulty training never sees
//! (out of domain, like the RLCR paper's MATH-500 column). Held-out rows carry
//! `data_source = "countdown-heldout"`, hard ones `"countdown-hard"`, so that reports break them
//! out (the countdown verifier still scores them; `--verifier auto` picks it by substring).
use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

pub use super::split::Split;
use super::split::{draw_rows, key_bucket, task_id};
use super::PromptRow;
use crate::reward::countdown::{judge_equation, Task, Verdict};

/// The shape of synthetic countdown tasks.
#[derive(Clone, Copy, Debug)]
pub struct SynthShape {
    pub min_numbers: u32,
    pub max_numbers: u32,
    pub max_number: i64,
    pub max_target: i64,
    /// Use the short user message instead of TinyZero's.
    pub short_prompt: bool,
    /// Percent of canonical problems held out (0..=100), for `Split::Train` / `Split::Heldout`.
    pub heldout_percent: u32,
}

impl Default for SynthShape {
    /// TinyZero's Countdown-Tasks-3to4 shape: 3–4 numbers in 1..=99, targets in 1..=100; 20 % of
    /// problems held out.
    fn default() -> Self {
        SynthShape {
            min_numbers: 3,
            max_numbers: 4,
            max_number: 99,
            max_target: 100,
            short_prompt: false,
            heldout_percent: 20,
        }
    }
}

/// The canonical problem of a task: its numbers sorted ascending, comma-separated, then `=` and
/// the target (`[3, 1, 2]`, 9 → `1,2,3=9`). Two tasks that differ only in the order of their
/// numbers share it.
pub fn canonical_key(nums: &[i64], target: i64) -> String {
    let mut sorted = nums.to_vec();
    sorted.sort_unstable();
    let list = joined(&sorted, ",");
    format!("{list}={target}")
}

/// True when the canonical problem of (`nums`, `target`) is held out at `percent`.
pub fn heldout_bucket(nums: &[i64], target: i64, percent: u32) -> bool {
    key_bucket(&canonical_key(nums, target)) < percent
}

/// The numbers as text, separated by `sep`.
fn joined(nums: &[i64], sep: &str) -> String {
    nums.iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(sep)
}

/// TinyZero's countdown user prompt (`examples/data_preprocess/countdown.py`, without the
/// template's "Assistant:" prefix, which the chat template supplies).
pub fn countdown_prompt(nums: &[i64], target: i64) -> String {
    let list = joined(nums, ", ");
    format!(
        "Using the numbers [{list}], create an equation that equals {target}. You can use basic \
arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in \
<think> </think> tags. And return the final answer in <answer> </answer> tags, for example \
<answer> (1 + 2) / 3 </answer>."
    )
}

/// The short countdown prompt for tiny models: `Numbers: [3, 5]. Target: 8.`
pub fn countdown_prompt_short(nums: &[i64], target: i64) -> String {
    let list = joined(nums, ", ");
    format!("Numbers: [{list}]. Target: {target}.")
}

pub(crate) fn countdown_row(
    id: String,
    nums: Vec<i64>,
    target: i64,
    extra: Option<Value>,
) -> PromptRow {
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
pub fn countdown_synth(
    seed: u64,
    count: usize,
    shape: SynthShape,
    split: Split,
) -> Result<Vec<PromptRow>> {
    let (min_numbers, max_numbers) = match split {
        Split::Hard => (shape.max_numbers + 1, shape.max_numbers + 1),
        _ => (shape.min_numbers, shape.max_numbers),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x636f_756e_7464_6f77);
    let give_up = || {
        format!(
            "countdown-synth: cannot make {} tasks with {}..={} numbers in 1..={} and targets in 1..={} (held out: {} %)",
            split.name(),
            min_numbers,
            max_numbers,
            shape.max_number,
            shape.max_target,
            shape.heldout_percent
        )
    };
    draw_rows(count, give_up, |kept| {
        let n = rng.random_range(min_numbers..=max_numbers);
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
            return None;
        }
        let (target, expr, _) = items.remove(0);
        if !(1..=shape.max_target).contains(&target) {
            return None;
        }
        let held = heldout_bucket(&nums, target, shape.heldout_percent);
        let (keep, prefix) = match split {
            Split::All => (true, "countdown-synth"),
            Split::Train => (!held, "countdown-train"),
            Split::Heldout => (held, "countdown-heldout"),
            Split::Hard => (true, "countdown-hard"),
        };
        if !keep {
            return None;
        }
        let id = task_id(prefix, kept, count);
        let difficulty = nums.len();
        let mut row = countdown_row_styled(
            id,
            nums,
            target,
            Some(json!({"solution": expr, "difficulty": difficulty, "split": split.name()})),
            shape.short_prompt,
        );
        match split {
            Split::Heldout => row.data_source = "countdown-heldout".into(),
            Split::Hard => row.data_source = "countdown-hard".into(),
            Split::All | Split::Train => {}
        }
        Some(row)
    })
}

/// Supervised warm-start conversations for synthetic countdown tasks (for `rlcr sft`): per task an
/// answer example `[system, user, assistant: <think>E</think><answer>E</answer>]` (arithmetic
/// tasks: `<think>A op B = C</think><answer>C</answer>`, a wrong one with one digit of C changed,
/// [`super::arith::wrong_result`]) and a
/// confidence example `[…, assistant: answer, user: query, assistant: <analysis>E</analysis>
/// <confidence>p</confidence>]`. A fraction `1 − correct_fraction` of the answers swap one operation
/// for another that changes the value (a wrong but well-formed answer); confidences are drawn
/// uniformly from {0.1, …, 0.9} regardless of correctness, so the warm start teaches the format and
/// leaves calibration to the RL loop. With `confidence`, an example's confidence is drawn
/// uniformly from the tenths of its difficulty's range instead (still regardless of whether the
/// example's answer is correct): a warm start whose stated confidence already depends on the
/// difficulty shown in the prompt (see [`SftConfidence`]).
pub fn sft_examples(
    seed: u64,
    tasks: &[PromptRow],
    correct_fraction: f64,
    confidence: Option<&SftConfidence>,
    system: &str,
    query: &str,
) -> Result<Vec<PromptRow>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7366_745f_6578_616d);
    let mut out = Vec::with_capacity(tasks.len() * 2);
    for t in tasks {
        let user = t
            .messages
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m.get("content"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let correct = rng.random_bool(correct_fraction);
        let extra = |k: &str| {
            t.extra_info
                .as_ref()
                .and_then(|e| e.get(k))
                .and_then(Value::as_str)
        };
        // (the worked step, the answer)
        let (eq, ans) = if let Some(expr) = extra("expression") {
            // arithmetic-synth: `A op B = C`, C (a wrong one has one digit of C changed)
            let c =
                extra("result").with_context(|| format!("task {} has no result", t.prompt_id))?;
            let c = if correct {
                c.to_string()
            } else {
                super::arith::wrong_result(c, &mut rng)
            };
            (format!("{expr} = {c}"), c)
        } else {
            let sol = extra("solution")
                .with_context(|| format!("task {} has no solution", t.prompt_id))?;
            let task = Task::from_value(&t.ground_truth)
                .with_context(|| format!("task {}: ground_truth", t.prompt_id))?;
            let eq = if correct {
                sol.to_string()
            } else {
                wrong_equation(sol, &task, &mut rng).unwrap_or_else(|| sol.to_string())
            };
            (eq.clone(), eq)
        };
        let answer = format!("<think>{eq}</think><answer>{ans}</answer>");
        let (lo, hi) = match confidence {
            None => (1, 9),
            Some(sc) => {
                let k = t
                    .extra_info
                    .as_ref()
                    .and_then(|e| e.get("difficulty"))
                    .and_then(Value::as_u64)
                    .with_context(|| format!("task {} has no difficulty", t.prompt_id))?;
                sc.range(k as u32).with_context(|| {
                    format!(
                        "task {}: no warm-start confidence range for difficulty {k}",
                        t.prompt_id
                    )
                })?
            }
        };
        let c = rng.random_range(lo..=hi) as f64 / 10.0;
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

/// Warm-start confidences per difficulty (`prepare --sft-confidence 2=0.3-0.7,3=0.0-0.3`): for
/// each difficulty (countdown: the number count; arithmetic: the digits per operand, `1=0.6-0.9`),
/// the inclusive range of tenths an example's confidence is drawn from (uniformly; a single value
/// `K=P` is the range P–P). Parsed from `K=LO-HI` entries separated by commas; K in 1..=9, LO ≤ HI in 0..=1 and multiples of 0.1, every K at most once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SftConfidence {
    /// (number count, lowest tenth, highest tenth), sorted by count.
    ranges: Vec<(u32, u32, u32)>,
}

impl SftConfidence {
    /// Parse `K=LO-HI[,K=LO-HI…]`; the error says which entry is wrong and why.
    pub fn parse(spec: &str) -> std::result::Result<SftConfidence, String> {
        fn tenths(x: &str, entry: &str) -> std::result::Result<u32, String> {
            let v: f64 = x
                .trim()
                .parse()
                .map_err(|_| format!("`{entry}`: `{x}` is not a number"))?;
            let t = (v * 10.0).round();
            if !(0.0..=1.0).contains(&v) || (v * 10.0 - t).abs() > 1e-9 {
                return Err(format!(
                    "`{entry}`: {x} is not one of 0.0, 0.1, …, 1.0 (confidences are tenths)"
                ));
            }
            Ok(t as u32)
        }
        let mut ranges: Vec<(u32, u32, u32)> = Vec::new();
        for entry in spec.split(',') {
            let entry = entry.trim();
            let (k, r) = entry
                .split_once('=')
                .ok_or_else(|| format!("`{entry}` is not NUMBERS=LOW-HIGH (e.g. 2=0.3-0.7)"))?;
            let k: u32 = k
                .trim()
                .parse()
                .ok()
                .filter(|k| (1..=9).contains(k))
                .ok_or_else(|| {
                    format!("`{entry}`: the difficulty (number count or digits) must be 1 to 9")
                })?;
            let (lo, hi) = match r.split_once('-') {
                Some((lo, hi)) => (tenths(lo, entry)?, tenths(hi, entry)?),
                None => {
                    let v = tenths(r, entry)?;
                    (v, v)
                }
            };
            if lo > hi {
                return Err(format!("`{entry}`: the low end is above the high end"));
            }
            if ranges.iter().any(|&(j, _, _)| j == k) {
                return Err(format!("{k} numbers appear twice"));
            }
            ranges.push((k, lo, hi));
        }
        ranges.sort_unstable();
        Ok(SftConfidence { ranges })
    }

    /// The inclusive range of tenths for tasks of `numbers` numbers, if given.
    pub fn range(&self, numbers: u32) -> Option<(u32, u32)> {
        self.ranges
            .iter()
            .find(|&&(k, _, _)| k == numbers)
            .map(|&(_, lo, hi)| (lo, hi))
    }
}

/// Replace one operator of `eq` so that the countdown verifier no longer judges it correct for
/// `task` (None if 16 tries fail).
fn wrong_equation(eq: &str, task: &Task, rng: &mut ChaCha8Rng) -> Option<String> {
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
        if judge_equation(&s, task) != Verdict::Correct {
            return Some(s);
        }
    }
    None
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
        let a = countdown_synth(7, 200, SynthShape::default(), Split::All).unwrap();
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
        let b = countdown_synth(7, 50, SynthShape::default(), Split::All).unwrap();
        assert_eq!(&a[..50], &b[..]);
        let c = countdown_synth(8, 50, SynthShape::default(), Split::All).unwrap();
        assert_ne!(a[..50], c[..]);
        let small = SynthShape {
            min_numbers: 2,
            max_numbers: 2,
            max_number: 9,
            max_target: 81,
            short_prompt: true,
            ..SynthShape::default()
        };
        for r in countdown_synth(1, 100, small, Split::All).unwrap() {
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
        let tasks = countdown_synth(5, 200, SynthShape::default(), Split::All).unwrap();
        let ex = sft_examples(5, &tasks, 0.5, None, "sys", "how sure?").unwrap();
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
                let task = Task::from_value(&pair[0].ground_truth).unwrap();
                assert_ne!(judge_equation(eq, &task), Verdict::Correct, "{eq}");
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
    }

    #[test]
    fn sft_confidence_parses_ranges_of_tenths() {
        let c = SftConfidence::parse("3=0.0-0.3, 2=0.3-0.7,4=1").unwrap();
        // 0.3 → tenth 3, 0.7 → 7; a single value is a one-tenth range; sorted by count.
        assert_eq!(c.ranges, vec![(2, 3, 7), (3, 0, 3), (4, 10, 10)]);
        assert_eq!(c.range(2), Some((3, 7)));
        assert_eq!(c.range(5), None);
        for (spec, needle) in [
            ("2", "is not NUMBERS=LOW-HIGH"),
            ("0=0.1-0.2", "must be 1 to 9"),
            ("10=0.1-0.2", "must be 1 to 9"),
            ("x=0.1", "must be 1 to 9"),
            ("2=0.15-0.3", "0.15 is not one of 0.0, 0.1"),
            ("2=0.1-1.1", "1.1 is not one of"),
            ("2=-0.1", "is not a number"),
            ("2=a-0.3", "`a` is not a number"),
            ("2=0.7-0.3", "low end is above the high end"),
            ("2=0.1,2=0.2", "2 numbers appear twice"),
            ("", "is not NUMBERS=LOW-HIGH"),
        ] {
            let e = SftConfidence::parse(spec).unwrap_err();
            assert!(e.contains(needle), "{spec}: {e}");
        }
    }

    /// The confidence of an example's text, its number count, and whether its answer is right.
    fn confidences(ex: &[PromptRow]) -> Vec<(usize, u32, bool)> {
        ex.chunks(2)
            .map(|pair| {
                let c = pair[1].messages.as_array().unwrap().last().unwrap()["content"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let v = c.split("<confidence>").nth(1).unwrap();
                let v: f64 = v.trim_end_matches("</confidence>").parse().unwrap();
                let k = pair[0].ground_truth["numbers"].as_array().unwrap().len();
                let ok = pair[0].extra_info.as_ref().unwrap()["correct"]
                    .as_bool()
                    .unwrap();
                (k, (v * 10.0).round() as u32, ok)
            })
            .collect()
    }

    /// Two or three numbers up to 3, targets up to 9, a fifth held out: few enough tasks that
    /// every split and difficulty is drawn often.
    fn mixed_shape() -> SynthShape {
        SynthShape {
            min_numbers: 2,
            max_numbers: 3,
            max_number: 3,
            max_target: 9,
            short_prompt: true,
            heldout_percent: 20,
        }
    }

    #[test]
    fn sft_confidence_follows_the_difficulty() {
        let shape = mixed_shape();
        let tasks = countdown_synth(11, 600, shape, Split::Train).unwrap();
        // Without ranges: every tenth 1..=9 for every count (the default, unchanged).
        let plain = confidences(&sft_examples(11, &tasks, 0.5, None, "", "?").unwrap());
        assert!(plain.iter().all(|&(_, t, _)| (1..=9).contains(&t)));
        let sc = SftConfidence::parse("2=0.3-0.7,3=0.0-0.3").unwrap();
        let ex = sft_examples(11, &tasks, 0.5, Some(&sc), "", "?").unwrap();
        let got = confidences(&ex);
        // The answers (and so the examples' correctness) are the same draws as without ranges:
        // the confidence takes one draw either way.
        assert_eq!(
            got.iter().map(|g| g.2).collect::<Vec<_>>(),
            plain.iter().map(|g| g.2).collect::<Vec<_>>()
        );
        for k in [2usize, 3] {
            let (lo, hi) = if k == 2 { (3, 7) } else { (0, 3) };
            let of_k: Vec<u32> = got.iter().filter(|g| g.0 == k).map(|g| g.1).collect();
            assert!(of_k.len() > 150, "{k}: {}", of_k.len());
            // Every tenth of the range, and nothing outside it.
            for t in lo..=hi {
                assert!(of_k.contains(&t), "{k} numbers never got {t}/10");
            }
            assert!(of_k.iter().all(|t| (lo..=hi).contains(t)), "{k}: {of_k:?}");
            // Uniform: mean (lo + hi) / 2 tenths, i.e. 0.5 and 0.15, within 4 standard errors
            // (SD of a discrete uniform over n values: sqrt((n² − 1) / 12) tenths).
            let n = (hi - lo + 1) as f64;
            let mean = of_k.iter().map(|&t| t as f64).sum::<f64>() / of_k.len() as f64;
            let se = ((n * n - 1.0) / 12.0).sqrt() / (of_k.len() as f64).sqrt();
            let want = (lo + hi) as f64 / 2.0;
            assert!(
                (mean - want).abs() < 4.0 * se,
                "{k}: mean {mean} want {want}"
            );
            // Regardless of correctness: right and wrong examples of a count share the range.
            for ok in [true, false] {
                assert!(got.iter().any(|g| g.0 == k && g.2 == ok));
            }
        }
        // A count without a range is an error naming the task.
        let only2 = SftConfidence::parse("2=0.5").unwrap();
        let e = sft_examples(11, &tasks, 0.5, Some(&only2), "", "?").unwrap_err();
        assert!(
            format!("{e:#}").contains("no warm-start confidence range for difficulty 3"),
            "{e:#}"
        );
    }

    #[test]
    fn tinyzero_prompt_text() {
        assert_eq!(
            countdown_prompt(&[44, 19, 35], 98),
            "Using the numbers [44, 19, 35], create an equation that equals 98. You can use basic arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
        );
    }

    fn nums_of(r: &PromptRow) -> Vec<i64> {
        r.ground_truth["numbers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect()
    }

    /// The hash is fixed by its formula: these buckets were computed independently in Python
    /// (FNV-1a 64 then SplitMix64's finalizer, modulo 100).
    #[test]
    fn canonical_key_and_bucket_are_pinned() {
        assert_eq!(canonical_key(&[3, 1, 2], 9), "1,2,3=9");
        assert_eq!(canonical_key(&[44, 19, 35], 98), "19,35,44=98");
        assert_eq!(key_bucket("1,2,3=9"), 59);
        assert_eq!(key_bucket("1,2=3"), 15);
        assert_eq!(key_bucket("3,3=9"), 29);
        assert_eq!(key_bucket("44,19,35=98"), 13);
        assert_eq!(key_bucket("=0"), 24);
        assert!(heldout_bucket(&[2, 1], 3, 20) && !heldout_bucket(&[2, 1], 3, 15));
        assert!(!heldout_bucket(&[3, 2, 1], 9, 59) && heldout_bucket(&[1, 3, 2], 9, 60));
    }

    /// Train and held-out tables never share a canonical problem (whatever the seeds, whatever
    /// the order of the numbers), the hard bucket has a number count training never has, and the
    /// difficulty and split are recorded in extra_info.
    #[test]
    fn splits_are_disjoint_and_record_difficulty() {
        use std::collections::{BTreeMap, HashSet};
        let mixed = mixed_shape();
        let mut train = HashSet::new();
        let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
        for seed in 0..8 {
            for r in countdown_synth(seed, 200, mixed, Split::Train).unwrap() {
                let nums = nums_of(&r);
                let target = r.ground_truth["target"].as_i64().unwrap();
                let e = r.extra_info.as_ref().unwrap();
                assert_eq!(e["difficulty"].as_u64().unwrap() as usize, nums.len());
                assert_eq!(e["split"], "train");
                assert_eq!(r.data_source, "countdown");
                assert!(r.prompt_id.starts_with("countdown-train-"));
                assert!(!heldout_bucket(&nums, target, 20));
                *counts.entry(nums.len()).or_default() += 1;
                train.insert(canonical_key(&nums, target));
            }
        }
        // Both difficulties are drawn (uniform number count: 800 draws each way ± noise).
        assert_eq!(counts.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
        assert!(counts.values().all(|&c| c > 600), "{counts:?}");
        let mut held = HashSet::new();
        for seed in 100..104 {
            for r in countdown_synth(seed, 100, mixed, Split::Heldout).unwrap() {
                let nums = nums_of(&r);
                let target = r.ground_truth["target"].as_i64().unwrap();
                assert_eq!(r.extra_info.as_ref().unwrap()["split"], "heldout");
                assert_eq!(r.data_source, "countdown-heldout");
                let key = canonical_key(&nums, target);
                assert!(heldout_bucket(&nums, target, 20));
                assert!(!train.contains(&key), "{key} is in both splits");
                held.insert(key);
            }
        }
        // The held-out split is not empty of variety: several distinct problems.
        assert!(held.len() >= 5, "{held:?}");
        // `all` draws from both sides and records its split.
        let (mut in_held, mut in_train) = (0, 0);
        for r in countdown_synth(3, 400, mixed, Split::All).unwrap() {
            let nums = nums_of(&r);
            let target = r.ground_truth["target"].as_i64().unwrap();
            if heldout_bucket(&nums, target, 20) {
                in_held += 1;
            } else {
                in_train += 1;
            }
            let e = r.extra_info.as_ref().unwrap();
            assert_eq!(
                (e["split"].as_str(), e["difficulty"].as_u64()),
                (Some("all"), Some(nums.len() as u64))
            );
        }
        assert!(in_held > 0 && in_train > 0, "{in_held} {in_train}");
        for r in countdown_synth(9, 100, mixed, Split::Hard).unwrap() {
            let nums = nums_of(&r);
            assert_eq!(nums.len(), 4);
            assert_eq!(r.data_source, "countdown-hard");
            let e = r.extra_info.as_ref().unwrap();
            assert_eq!(
                (e["difficulty"].as_u64(), e["split"].as_str()),
                (Some(4), Some("hard"))
            );
            let sol = e["solution"].as_str().unwrap();
            assert_eq!(
                eval(sol),
                r.ground_truth["target"].as_i64().unwrap(),
                "{sol}"
            );
        }
        // A split that cannot be filled fails with the shape in the message.
        let none = SynthShape {
            heldout_percent: 0,
            ..mixed
        };
        let e = countdown_synth(0, 5, none, Split::Heldout).unwrap_err();
        assert!(format!("{e}").contains("heldout tasks"), "{e}");
    }
}
