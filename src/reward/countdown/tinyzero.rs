//! TinyZero compatibility (`--countdown-compat tinyzero`): TinyZero's `extract_solution`,
//! `validate_equation` and `compute_score` as they behave on prompt + response, every quirk
//! included (see the parent module's doc); Python's `eval` is [`super::super::pyexpr`].
use super::super::bigint::Int;
use super::super::pyexpr::{self, PyNum};
use super::super::text::{last_tag, py_strip};
use super::{same_multiset, Number, Outcome, Task, Verdict};

/// TinyZero's `extract_solution`: after the first `Assistant:` (else the first
/// `<|im_start|>assistant`, else nothing), on the last line, the last `<answer>(.*?)</answer>`,
/// stripped.
pub fn tinyzero_extract(solution_str: &str) -> Option<&str> {
    let s = if let Some(i) = solution_str.find("Assistant:") {
        &solution_str[i + "Assistant:".len()..]
    } else if let Some(i) = solution_str.find("<|im_start|>assistant") {
        &solution_str[i + "<|im_start|>assistant".len()..]
    } else {
        return None;
    };
    let line = match s.rfind('\n') {
        Some(i) => &s[i + 1..],
        None => s,
    };
    last_tag(line, "<answer>", "</answer>").map(py_strip)
}

/// TinyZero's `validate_equation`: the `\d+` runs, as integers, equal the numbers as multisets.
/// (Runs of non-ASCII digits only matter for equations `eval` rejects anyway: the caller scores
/// any non-ASCII equation 0.1 whatever this returns.)
fn tinyzero_validate(eq: &str, numbers: &[Number]) -> bool {
    let b = eq.as_bytes();
    let mut lits: Vec<Option<i128>> = Vec::with_capacity(numbers.len());
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let s = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if lits.len() == numbers.len() {
                return false;
            }
            let run = eq[s..i].trim_start_matches('0');
            lits.push(if run.is_empty() {
                Some(0)
            } else if run.len() > 38 {
                None
            } else {
                run.parse().ok()
            });
        } else {
            i += 1;
        }
    }
    same_multiset(&mut lits, numbers)
}

/// TinyZero's `compute_score(solution_str, ground_truth)` with `format_score=0.1, score=1.0`, and
/// the extracted equation.
pub fn tinyzero_compute_score<'a>(solution_str: &'a str, task: &Task) -> Outcome<'a> {
    let Some(eq) = tinyzero_extract(solution_str) else {
        return Outcome {
            answer: None,
            verdict: Verdict::NoAnswer,
        };
    };
    let verdict = if !tinyzero_validate(eq, &task.numbers) {
        Verdict::Numbers
    } else if !eq.is_ascii() {
        // non-ASCII digits or spaces pass TinyZero's character regex but not Python's tokenizer
        Verdict::Invalid
    } else {
        match pyexpr::eval(eq) {
            Err(_) => Verdict::Undefined,
            Ok(v) => {
                let target = match task.target {
                    Number::Int(t) => PyNum::Int(Int::Small(t)),
                    Number::Float(f) => PyNum::Float(f),
                };
                if pyexpr::close_to(&v, &target) {
                    Verdict::Correct
                } else {
                    Verdict::Wrong
                }
            }
        }
    };
    Outcome {
        answer: Some(eq),
        verdict,
    }
}
