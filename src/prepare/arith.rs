//! Synthetic arithmetic tasks (`prepare --from arithmetic-synth`): `What is A op B?` with both
//! operands of the same number of digits, the difficulty, shown in the prompt (the numbers
//! themselves) and recorded in `extra_info.difficulty` with the split in `extra_info.split`.
//!
//! **The split.** A task's canonical problem is `A op B` without spaces, the operands of the
//! commutative `+` and `*` sorted ascending (`34 + 12` → `12+34`; `-` keeps its order, A ≥ B)
//! ([`arith_key`]). A problem is held out when [`key_bucket`] of its key (the same fixed hash as
//! countdown's) falls in the first `heldout_percent` of 100 buckets. `Split::Train` rejects
//! held-out problems and `Split::Heldout` keeps only them, so no held-out problem, in either
//! operand order and under any seed, can appear in a training draw. `Split::Hard` draws operands
//! of `max_digits + 1` digits: a difficulty training never sees (out of domain).
//!
//! Rows: `data_source` `arithmetic` (train / all), `arithmetic-heldout`, `arithmetic-hard` (the
//! math verifier scores them; `--verifier auto` picks math for them); `ground_truth` the exact
//! result as a JSON string of decimal digits (`"46"`), which the math verifier compares by value.
//! Operands have at most 10 digits (hard of `--max-digits 9`), so results fit `i128` exactly.
use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::split::{draw_rows, key_bucket, task_id, Split};
use super::PromptRow;

/// The shape of synthetic arithmetic tasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArithShape {
    /// Fewest digits per operand (1..=9).
    pub min_digits: u32,
    /// Most digits per operand (min_digits..=9).
    pub max_digits: u32,
    /// The operations drawn from (a non-empty subset of `+`, `-`, `*`, each once).
    pub ops: Vec<char>,
    /// The short user message (`What is 12 + 34?`) instead of the one that also asks for the
    /// `<answer>` tags.
    pub short_prompt: bool,
    /// Percent of canonical problems held out (0..=100).
    pub heldout_percent: u32,
}

impl Default for ArithShape {
    /// 1–3 digits, `+` and `*` (SmolLM2-135M-Instruct, greedy, no warm start: + 0.71 / 0.25 /
    /// 0.08 and × 0.67 / 0.08 / 0.00 right on 1 / 2 / 3 digits; − falls faster), 20 % held out.
    fn default() -> Self {
        ArithShape {
            min_digits: 1,
            max_digits: 3,
            ops: vec!['+', '*'],
            short_prompt: false,
            heldout_percent: 20,
        }
    }
}

impl ArithShape {
    /// Check the shape; the error names the flag (the CLI reports it as a usage error).
    pub fn check(&self) -> std::result::Result<(), String> {
        if !(1..=9).contains(&self.min_digits) || !(1..=9).contains(&self.max_digits) {
            return Err(format!(
                "--min-digits {} / --max-digits {}: operands have 1 to 9 digits",
                self.min_digits, self.max_digits
            ));
        }
        if self.min_digits > self.max_digits {
            return Err(format!(
                "--min-digits {} is larger than --max-digits {}",
                self.min_digits, self.max_digits
            ));
        }
        if self.heldout_percent > 100 {
            return Err("--heldout-percent must be 0 to 100".into());
        }
        parse_ops(&self.ops.iter().collect::<String>()).map(|_| ())
    }
}

/// Parse `--ops`: a non-empty string of distinct characters from `+-*`.
pub fn parse_ops(spec: &str) -> std::result::Result<Vec<char>, String> {
    let mut ops = Vec::new();
    for c in spec.chars() {
        if !matches!(c, '+' | '-' | '*') {
            return Err(format!(
                "--ops {spec:?}: `{c}` is not one of + - * (e.g. --ops +*)"
            ));
        }
        if ops.contains(&c) {
            return Err(format!("--ops {spec:?}: `{c}` appears twice"));
        }
        ops.push(c);
    }
    if ops.is_empty() {
        return Err("--ops is empty: give some of + - * (e.g. --ops +*)".into());
    }
    Ok(ops)
}

/// The canonical problem of `a op b`: `+` and `*` with the operands sorted ascending, `-` as is
/// (`34`, `+`, `12` → `12+34`; `34`, `-`, `12` → `34-12`).
pub fn arith_key(a: i128, op: char, b: i128) -> String {
    let (x, y) = if op != '-' && a > b { (b, a) } else { (a, b) };
    format!("{x}{op}{y}")
}

/// The exact result of `a op b`.
pub fn arith_value(a: i128, op: char, b: i128) -> i128 {
    match op {
        '+' => a + b,
        '-' => a - b,
        _ => a * b,
    }
}

/// The user message of a task.
pub fn arith_prompt(a: i128, op: char, b: i128, short: bool) -> String {
    if short {
        format!("What is {a} {op} {b}?")
    } else {
        format!("What is {a} {op} {b}? Put the final answer in <answer> </answer> tags.")
    }
}

/// `count` synthetic arithmetic tasks from `seed`: per task a digit count d uniform in
/// `min_digits..=max_digits` (`max_digits + 1` for `Split::Hard`), an operation uniform in `ops`,
/// and two operands uniform among the d-digit numbers (1..=9 for d = 1, else 10^(d−1)..10^d − 1),
/// swapped for `-` so that the result is not negative. The expression and its result go to
/// `extra_info.expression` / `extra_info.result` (for the warm start's examples).
pub fn arithmetic_synth(
    seed: u64,
    count: usize,
    shape: &ArithShape,
    split: Split,
) -> Result<Vec<PromptRow>> {
    if let Err(e) = shape.check() {
        bail!("arithmetic-synth: {e}");
    }
    let (lo_d, hi_d) = match split {
        Split::Hard => (shape.max_digits + 1, shape.max_digits + 1),
        _ => (shape.min_digits, shape.max_digits),
    };
    let (prefix, data_source) = match split {
        Split::All => ("arithmetic-synth", "arithmetic"),
        Split::Train => ("arithmetic-train", "arithmetic"),
        Split::Heldout => ("arithmetic-heldout", "arithmetic-heldout"),
        Split::Hard => ("arithmetic-hard", "arithmetic-hard"),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6172_6974_686d_6574);
    let give_up = || {
        format!(
            "arithmetic-synth: cannot make {} {} tasks with {}..={} digits and ops {} (held out: {} %)",
            count,
            split.name(),
            lo_d,
            hi_d,
            shape.ops.iter().collect::<String>(),
            shape.heldout_percent
        )
    };
    draw_rows(count, give_up, |n| {
        let d = rng.random_range(lo_d..=hi_d);
        let op = shape.ops[rng.random_range(0..shape.ops.len())];
        let lo = if d == 1 { 1 } else { 10i128.pow(d - 1) };
        let hi = 10i128.pow(d) - 1;
        let mut a = rng.random_range(lo..=hi);
        let mut b = rng.random_range(lo..=hi);
        if op == '-' && a < b {
            std::mem::swap(&mut a, &mut b);
        }
        let key = arith_key(a, op, b);
        let held = key_bucket(&key) < shape.heldout_percent;
        let keep = match split {
            Split::All | Split::Hard => true,
            Split::Train => !held,
            Split::Heldout => held,
        };
        if !keep {
            return None;
        }
        let c = arith_value(a, op, b);
        Some(PromptRow {
            prompt_id: task_id(prefix, n, count),
            messages: json!([{"role": "user", "content": arith_prompt(a, op, b, shape.short_prompt)}]),
            data_source: data_source.into(),
            ground_truth: json!(c.to_string()),
            extra_info: Some(json!({
                "expression": format!("{a} {op} {b}"),
                "result": c.to_string(),
                "key": key,
                "difficulty": d,
                "split": split.name(),
            })),
        })
    })
}

/// A plausibly wrong result: `c` with one digit changed (never a leading zero), so that it keeps
/// the right number of digits, as a slip in column arithmetic would.
pub fn wrong_result(c: &str, rng: &mut ChaCha8Rng) -> String {
    let digits: Vec<u8> = c.bytes().collect();
    let at = rng.random_range(0..digits.len());
    let lowest = if at == 0 && digits.len() > 1 { 1 } else { 0 };
    let old = digits[at] - b'0';
    // a digit in lowest..=9 other than `old`
    let mut new = rng.random_range(lowest..9u8); // old >= lowest always
    if new >= old {
        new += 1;
    }
    let mut out = digits;
    out[at] = b'0' + new;
    String::from_utf8(out).unwrap_or_else(|_| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> ArithShape {
        ArithShape::default()
    }

    /// (operand a, op, operand b) of a row's prompt, read back from the text.
    fn parse(r: &PromptRow) -> (i128, char, i128) {
        let text = r.messages[0]["content"].as_str().unwrap();
        let body = text
            .strip_prefix("What is ")
            .unwrap()
            .split('?')
            .next()
            .unwrap();
        let parts: Vec<&str> = body.split(' ').collect();
        (
            parts[0].parse().unwrap(),
            parts[1].chars().next().unwrap(),
            parts[2].parse().unwrap(),
        )
    }

    #[test]
    fn keys_sort_commutative_operands_and_values_are_exact() {
        assert_eq!(arith_key(34, '+', 12), "12+34");
        assert_eq!(arith_key(12, '*', 34), "12*34");
        assert_eq!(arith_key(34, '-', 12), "34-12");
        assert_eq!(arith_value(34, '-', 12), 22);
        assert_eq!(arith_value(999, '*', 999), 998_001);
        // ten-digit operands (hard bucket of --max-digits 9) stay exact
        assert_eq!(
            arith_value(9_999_999_999, '*', 9_999_999_999),
            99_999_999_980_000_000_001
        );
        assert_eq!(parse_ops("+*"), Ok(vec!['+', '*']));
        assert!(parse_ops("+/").unwrap_err().contains("`/` is not one of"));
        assert!(parse_ops("++").unwrap_err().contains("appears twice"));
        assert!(parse_ops("").unwrap_err().contains("empty"));
    }

    #[test]
    fn seed_one_first_rows_are_pinned() {
        // by hand: 4 × 1 = 4; 7 + 8 = 15; 272 × 841 = 217,600 + 11,152 = 228,752;
        // 739 + 543 = 1,282 (key with sorted operands)
        let rows = arithmetic_synth(1, 4, &shape(), Split::Train).unwrap();
        let got: Vec<(String, String, String, u64)> = rows
            .iter()
            .map(|r| {
                let e = r.extra_info.as_ref().unwrap();
                (
                    r.messages[0]["content"].as_str().unwrap().to_string(),
                    r.ground_truth.as_str().unwrap().to_string(),
                    e["key"].as_str().unwrap().to_string(),
                    e["difficulty"].as_u64().unwrap(),
                )
            })
            .collect();
        let tail = " Put the final answer in <answer> </answer> tags.";
        let want = [
            ("What is 4 * 1?", "4", "1*4", 1),
            ("What is 7 + 8?", "15", "7+8", 1),
            ("What is 272 * 841?", "228752", "272*841", 3),
            ("What is 739 + 543?", "1282", "543+739", 3),
        ];
        for (g, w) in got.iter().zip(want) {
            assert_eq!(
                (g.0.as_str(), g.1.as_str(), g.2.as_str(), g.3),
                (format!("{}{tail}", w.0).as_str(), w.1, w.2, w.3)
            );
        }
        assert_eq!(rows[0].prompt_id, "arithmetic-train-000000");
    }

    #[test]
    fn every_row_is_consistent_and_seeded() {
        let rows = arithmetic_synth(5, 300, &shape(), Split::All).unwrap();
        for r in &rows {
            let (a, op, b) = parse(r);
            let e = r.extra_info.as_ref().unwrap();
            let d = e["difficulty"].as_u64().unwrap() as u32;
            assert!((1..=3).contains(&d));
            for x in [a, b] {
                assert_eq!(x.to_string().len() as u32, d, "{r:?}");
                assert!(x >= 1);
            }
            assert!(op == '+' || op == '*');
            // independent: the product / sum computed in u128 here
            let want = if op == '+' {
                a as u128 + b as u128
            } else {
                a as u128 * b as u128
            };
            assert_eq!(r.ground_truth, json!(want.to_string()));
            assert_eq!(r.data_source, "arithmetic");
        }
        let ds: Vec<u64> = rows
            .iter()
            .map(|r| {
                r.extra_info.as_ref().unwrap()["difficulty"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        for d in 1..=3 {
            let n = ds.iter().filter(|&&x| x == d).count();
            assert!((70..=130).contains(&n), "{d} digits: {n} of 300");
        }
        assert_eq!(
            arithmetic_synth(5, 50, &shape(), Split::All).unwrap(),
            rows[..50].to_vec()
        );
        assert_ne!(
            arithmetic_synth(6, 50, &shape(), Split::All).unwrap(),
            rows[..50].to_vec()
        );
        // subtraction never goes negative
        let sub = ArithShape {
            ops: vec!['-'],
            ..shape()
        };
        for r in arithmetic_synth(1, 200, &sub, Split::All).unwrap() {
            let (a, op, b) = parse(&r);
            assert_eq!(op, '-');
            assert!(a >= b);
            assert_eq!(r.ground_truth, json!((a - b).to_string()));
        }
    }

    #[test]
    fn splits_are_disjoint_and_hard_is_one_digit_more() {
        let mut held = std::collections::HashSet::new();
        for seed in 0..4 {
            for r in arithmetic_synth(seed, 300, &shape(), Split::Heldout).unwrap() {
                let e = r.extra_info.as_ref().unwrap();
                let (a, op, b) = parse(&r);
                let key = arith_key(a, op, b);
                assert_eq!(e["key"], json!(key));
                assert!(key_bucket(&key) < 20);
                assert_eq!(r.data_source, "arithmetic-heldout");
                assert_eq!(e["split"], "heldout");
                held.insert(key);
            }
        }
        assert!(held.len() > 200, "{}", held.len());
        let mut train = 0;
        for seed in 0..8 {
            for r in arithmetic_synth(seed, 500, &shape(), Split::Train).unwrap() {
                let (a, op, b) = parse(&r);
                // either operand order of a held-out problem is held out
                assert!(!held.contains(&arith_key(a, op, b)));
                assert!(!held.contains(&arith_key(b, op, a)) || op == '-');
                assert!(key_bucket(&arith_key(a, op, b)) >= 20);
                assert_eq!(r.data_source, "arithmetic");
                train += 1;
            }
        }
        assert_eq!(train, 4000);
        for r in arithmetic_synth(2, 100, &shape(), Split::Hard).unwrap() {
            let (a, _, b) = parse(&r);
            assert_eq!(a.to_string().len(), 4);
            assert_eq!(b.to_string().len(), 4);
            assert_eq!(r.data_source, "arithmetic-hard");
            assert_eq!(r.extra_info.as_ref().unwrap()["difficulty"], 4);
        }
        // nothing can be held out at 0 %: a clear error, not a hang
        let none = ArithShape {
            heldout_percent: 0,
            ..shape()
        };
        let e = arithmetic_synth(0, 3, &none, Split::Heldout).unwrap_err();
        assert!(e.to_string().contains("cannot make 3 heldout tasks"), "{e}");
    }

    #[test]
    fn wrong_results_differ_in_one_digit() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for c in ["0", "9", "10", "46", "998001", "5"] {
            for _ in 0..50 {
                let w = wrong_result(c, &mut rng);
                assert_ne!(w, c);
                assert_eq!(w.len(), c.len());
                assert_eq!(
                    w.bytes().zip(c.bytes()).filter(|(x, y)| x != y).count(),
                    1,
                    "{c} -> {w}"
                );
                assert!(w.len() == 1 || !w.starts_with('0'), "{c} -> {w}");
            }
        }
    }
}
