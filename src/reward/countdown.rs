//! Countdown verifier (TinyZero's task): combine the given numbers, each exactly once,
//! with `+ − × ÷` and parentheses to reach the target. Score 0 (no parsable answer), 0.1 (an
//! answer, but wrong or invalid) or 1.0 (correct); the sample is correct iff the score is 1.0.
//!
//! Two modes (`docs/math.md` §1.1):
//! - [`score_response`] (default): the response text alone, the last `<answer>…</answer>` anywhere
//!   (across lines), stripped. The equation may use ASCII digits, `+ - * / ( )`, the Unicode
//!   signs `×` (U+00D7), `÷` (U+00F7) and `−` (U+2212, minus), unary signs and any Unicode
//!   whitespace. Not allowed (score 0.1): decimals, `**`, `//`, `=`, implicit multiplication,
//!   anything else. Integer literals are compared by value with the given numbers as multisets
//!   (`07` counts as 7). Arithmetic is exact on rationals in `i128` (so `(8/3)*3+1` is exactly 9);
//!   if an intermediate overflows `i128` the rest is computed in `f64`. Division by zero gives
//!   0.1. Correct iff `|value − target| < 1e-5`. Bounds: 10,000 bytes and 100 nested parentheses
//!   (beyond: 0.1).
//! - [`tinyzero_compute_score`] (`--countdown-compat tinyzero`): TinyZero's `compute_score` as it
//!   behaves on prompt + response, every quirk included: the text after the FIRST `Assistant:`
//!   (else after the first `<|im_start|>assistant`, else score 0), its last line only, the last
//!   non-greedy `<answer>(.*?)</answer>` on it; number validation through the ASCII/Unicode `\d+`
//!   runs (so `2.0` reads as 2 and 0); Python's `eval` reproduced by [`super::pyexpr`] (`**`,
//!   `//`, float literals, complex results, Python's exceptions → 0.1). Its 1-in-64 debug printing
//!   is left out.
//!
//! Ground truth: JSON `{"target": 23, "numbers": [2, 3, 7]}` (`nums` is accepted for `numbers`).
use anyhow::{bail, Context, Result};

use super::rational::Rational;
use super::text::last_answer;

/// A countdown task from the ground truth.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The target; integral JSON numbers are Python ints, others floats.
    pub target: Number,
    /// The numbers to use, each exactly once.
    pub numbers: Vec<Number>,
}

/// A JSON number as Python would hold it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    Int(i128),
    Float(f64),
}

impl Number {
    fn from_json(v: &serde_json::Value) -> Option<Number> {
        if let Some(i) = v.as_i64() {
            return Some(Number::Int(i as i128));
        }
        if let Some(u) = v.as_u64() {
            return Some(Number::Int(u as i128));
        }
        v.as_f64().map(Number::Float)
    }

    /// The integer this number equals, if it equals one (Python `2 == 2.0`).
    fn as_integer(&self) -> Option<i128> {
        match *self {
            Number::Int(i) => Some(i),
            Number::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e38 => {
                Some(f as i128)
            }
            Number::Float(_) => None,
        }
    }

    fn to_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }
}

impl Task {
    /// Parse the ground-truth JSON text.
    ///
    /// The canonical form (`{"target": N, "numbers": [N, ...]}` with plain integers, as
    /// `prepare` and TinyZero's data write it) is read by a typed scanner, [`Task::scan`], without
    /// building a JSON value (once per prompt: most of this function's cost on a scored table);
    /// anything else — floats, other keys, `"nums"`, escapes, errors — goes the general way,
    /// [`Task::from_json_value`], so both accept, refuse and read exactly the same.
    pub fn from_json(text: &str) -> Result<Task> {
        match Task::scan(text) {
            Some(t) => Ok(t),
            None => Task::from_json_value(text),
        }
    }

    /// The canonical ground truth: JSON whitespace, one object with exactly the keys `"target"`
    /// (an integer) and `"numbers"` (a list of integers), each once, in either order. Integers are
    /// `0` or an optional `-` and 1–18 digits without a leading zero (no `-0`): what serde_json
    /// reads as that same `i64`. `None` for anything else (the general parser decides).
    fn scan(text: &str) -> Option<Task> {
        let s = text.as_bytes();
        let mut p = Scan { s, at: 0 };
        p.ws();
        p.eat(b'{')?;
        let (mut target, mut numbers) = (None, None);
        loop {
            p.ws();
            if p.eat_str(b"\"target\"") {
                p.ws();
                p.eat(b':')?;
                p.ws();
                if target.replace(Number::Int(p.int()? as i128)).is_some() {
                    return None;
                }
            } else if p.eat_str(b"\"numbers\"") {
                p.ws();
                p.eat(b':')?;
                p.ws();
                p.eat(b'[')?;
                p.ws();
                let mut v = Vec::with_capacity(8);
                if !p.eat_str(b"]") {
                    loop {
                        p.ws();
                        v.push(Number::Int(p.int()? as i128));
                        p.ws();
                        if p.eat_str(b"]") {
                            break;
                        }
                        p.eat(b',')?;
                    }
                }
                if numbers.replace(v).is_some() {
                    return None;
                }
            } else {
                return None;
            }
            p.ws();
            if p.eat_str(b"}") {
                break;
            }
            p.eat(b',')?;
        }
        p.ws();
        if p.at != s.len() {
            return None;
        }
        Some(Task {
            target: target?,
            numbers: numbers?,
        })
    }

    /// The general way: a JSON value, then [`Task::from_value`].
    fn from_json_value(text: &str) -> Result<Task> {
        let v: serde_json::Value = serde_json::from_str(text)
            .with_context(|| format!("countdown ground truth is not JSON: {}", preview(text)))?;
        let mut t = Task::from_value(&v)
            .with_context(|| format!("countdown ground truth {}", preview(text)))?;
        if let Number::Float(_) = t.target {
            // serde_json (without `float_roundtrip`) may be one ulp off on long decimals; read the
            // literal again with Rust's correctly rounded parser
            if let Some(f) = precise_target(text) {
                t.target = Number::Float(f);
            }
        }
        Ok(t)
    }

    pub fn from_value(v: &serde_json::Value) -> Result<Task> {
        let Some(obj) = v.as_object() else {
            bail!("expected an object {{\"target\": N, \"numbers\": [...]}}");
        };
        let Some(target) = obj.get("target") else {
            bail!("missing \"target\"");
        };
        let Some(target) = Number::from_json(target) else {
            bail!("\"target\" is not a number");
        };
        let Some(nums) = obj.get("numbers").or_else(|| obj.get("nums")) else {
            bail!("missing \"numbers\"");
        };
        let Some(nums) = nums.as_array() else {
            bail!("\"numbers\" is not a list");
        };
        let numbers = nums
            .iter()
            .map(|n| Number::from_json(n).context("\"numbers\" holds a non-number"))
            .collect::<Result<Vec<_>>>()?;
        Ok(Task { target, numbers })
    }
}

/// A cursor over a ground-truth text for [`Task::scan`].
struct Scan<'a> {
    s: &'a [u8],
    at: usize,
}

impl Scan<'_> {
    /// Skip JSON whitespace.
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.at) {
            self.at += 1;
        }
    }
    fn eat(&mut self, b: u8) -> Option<()> {
        (self.s.get(self.at) == Some(&b)).then(|| self.at += 1)
    }
    fn eat_str(&mut self, t: &[u8]) -> bool {
        let hit = self.s[self.at..].starts_with(t);
        if hit {
            self.at += t.len();
        }
        hit
    }
    /// `0`, or `-`? and 1–18 digits, the first not `0`; followed by neither a digit nor `.`,
    /// `e`, `E` (those are left to the general parser).
    fn int(&mut self) -> Option<i64> {
        let neg = self.eat(b'-').is_some();
        let start = self.at;
        while self.s.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
        let digits = &self.s[start..self.at];
        let plain = match digits {
            [] => false,
            [b'0'] => !neg,
            [b'0', ..] => false,
            d => d.len() <= 18,
        };
        if !plain || matches!(self.s.get(self.at), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        let v = digits.iter().fold(0i64, |v, &d| v * 10 + (d - b'0') as i64);
        Some(if neg { -v } else { v })
    }
}

/// The `"target"` number literal of a ground-truth text, correctly rounded (only when the key
/// occurs once).
fn precise_target(text: &str) -> Option<f64> {
    static RE: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    let re = RE
        .get_or_init(|| {
            regex::Regex::new(r#""target"\s*:\s*(-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"#).ok()
        })
        .as_ref()?;
    let mut it = re.captures_iter(text);
    let m = it.next()?;
    if it.next().is_some() {
        return None;
    }
    m.get(1)?.as_str().parse().ok()
}

fn preview(s: &str) -> String {
    let mut p: String = s.chars().take(80).collect();
    if p.len() < s.len() {
        p.push('…');
    }
    format!("{p:?}")
}

/// Why a countdown answer scored what it scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No answer could be extracted: score 0.
    NoAnswer,
    /// The equation does not parse (characters, syntax, bounds): 0.1.
    Invalid,
    /// The numbers used are not the given ones, each once: 0.1.
    Numbers,
    /// Evaluation failed (division by zero, Python exception): 0.1.
    Undefined,
    /// Evaluates, but not to the target: 0.1.
    Wrong,
    /// Correct: 1.0.
    Correct,
}

impl Verdict {
    /// TinyZero's score levels: 0, 0.1 (format score) and 1.0.
    pub fn score(self) -> f32 {
        match self {
            Verdict::NoAnswer => 0.0,
            Verdict::Correct => 1.0,
            _ => 0.1,
        }
    }
}

/// Outcome of scoring one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome<'a> {
    /// The extracted equation (stripped), if any.
    pub answer: Option<&'a str>,
    pub verdict: Verdict,
}

impl Outcome<'_> {
    pub fn score(&self) -> f32 {
        self.verdict.score()
    }
    pub fn correct(&self) -> bool {
        self.verdict == Verdict::Correct
    }
}

// ---------------------------------------------------------------------------------------------
// default mode: exact rationals

/// Longest equation the default mode parses.
pub const MAX_EQUATION_BYTES: usize = 10_000;
/// Deepest parenthesis nesting the default mode parses.
pub const MAX_PARENS: usize = 100;

/// `|q − target| < 1e-5`, decided exactly when both are exact.
fn close_to(q: Rational, target: Number) -> bool {
    if let (Rational::Exact(n, d), Number::Int(t)) = (q, target) {
        if let Some(diff) = t.checked_mul(d).and_then(|td| n.checked_sub(td)) {
            // |diff / d| < 1e-5  <=>  |diff| * 100000 < d
            return match diff.checked_abs().and_then(|a| a.checked_mul(100_000)) {
                Some(a) => a < d,
                None => false,
            };
        }
    }
    (q.to_f64() - target.to_f64()).abs() < 1e-5
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tk {
    Num(i128),
    /// An integer literal too long to be any given number.
    Huge,
    Plus,
    Minus,
    Times,
    Div,
    LPar,
    RPar,
    /// A character outside the language.
    Bad,
    End,
}

/// Tokens of the default mode, read on the fly (no token vector).
struct Lexer<'a> {
    s: &'a str,
    pos: usize,
}

impl Lexer<'_> {
    fn next_token(&mut self) -> Tk {
        let b = self.s.as_bytes();
        loop {
            let Some(&c) = b.get(self.pos) else {
                return Tk::End;
            };
            match c {
                b'0'..=b'9' => {
                    let start = self.pos;
                    while self.pos < b.len() && b[self.pos].is_ascii_digit() {
                        self.pos += 1;
                    }
                    let digits = &b[start..self.pos];
                    let zeros = digits.iter().take_while(|&&d| d == b'0').count();
                    let lit = &digits[zeros..];
                    return if lit.len() > 38 {
                        Tk::Huge
                    } else if lit.is_empty() {
                        Tk::Num(0)
                    } else if lit.len() <= 19 {
                        // at most 19 digits fit a u64 (the common case, in 64-bit arithmetic)
                        (lit.iter().fold(0u64, |v, &d| v * 10 + (d - b'0') as u64) as i128)
                            .into_tk()
                    } else {
                        // at most 38 ASCII digits always fit an i128
                        lit.iter()
                            .fold(0i128, |v, &d| v * 10 + (d - b'0') as i128)
                            .into_tk()
                    };
                }
                b'+' => {
                    self.pos += 1;
                    return Tk::Plus;
                }
                b'-' => {
                    self.pos += 1;
                    return Tk::Minus;
                }
                b'*' => {
                    self.pos += 1;
                    return Tk::Times;
                }
                b'/' => {
                    self.pos += 1;
                    return Tk::Div;
                }
                b'(' => {
                    self.pos += 1;
                    return Tk::LPar;
                }
                b')' => {
                    self.pos += 1;
                    return Tk::RPar;
                }
                b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => self.pos += 1,
                c if c < 0x80 => return Tk::Bad,
                _ => {
                    // ok: `pos` is always on a char boundary (ASCII steps, or whole chars below)
                    let ch = self.s[self.pos..].chars().next().unwrap_or('\u{0}');
                    self.pos += ch.len_utf8();
                    match ch {
                        '\u{2212}' => return Tk::Minus,
                        '\u{d7}' => return Tk::Times,
                        '\u{f7}' => return Tk::Div,
                        c if c.is_whitespace() => {}
                        _ => return Tk::Bad,
                    }
                }
            }
        }
    }
}

trait IntoTk {
    fn into_tk(self) -> Tk;
}

impl IntoTk for i128 {
    fn into_tk(self) -> Tk {
        Tk::Num(self)
    }
}

/// Integer literals met while parsing: a few inline, the count of the rest.
struct Literals {
    vals: [i128; 8],
    len: usize,
    /// A literal no number can equal, or more than fit inline.
    unmatched: bool,
}

impl Literals {
    fn push(&mut self, v: Option<i128>) {
        match v {
            Some(v) if self.len < self.vals.len() => {
                self.vals[self.len] = v;
                self.len += 1;
            }
            _ => {
                self.len += 1;
                self.unmatched = true;
            }
        }
    }
}

/// Parser for the default mode; a `None` value is "undefined" (division by zero), kept separate
/// from syntax errors (`Err`).
struct DefaultParser<'a> {
    lex: Lexer<'a>,
    tok: Tk,
    literals: Literals,
}

type Val = Option<Rational>;

impl DefaultParser<'_> {
    fn peek(&self) -> Tk {
        self.tok
    }

    fn bump(&mut self) {
        self.tok = self.lex.next_token();
    }

    fn expr(&mut self, depth: usize) -> Result<Val, ()> {
        let mut v = self.term(depth)?;
        while let t @ (Tk::Plus | Tk::Minus) = self.peek() {
            self.bump();
            let r = self.term(depth)?;
            v = match (v, r) {
                (Some(a), Some(b)) if t == Tk::Plus => Some(a + b),
                (Some(a), Some(b)) => Some(a - b),
                _ => None,
            };
        }
        Ok(v)
    }

    fn term(&mut self, depth: usize) -> Result<Val, ()> {
        let mut v = self.unary(depth)?;
        while let t @ (Tk::Times | Tk::Div) = self.peek() {
            self.bump();
            let r = self.unary(depth)?;
            v = match (v, r) {
                (Some(a), Some(b)) => {
                    if t == Tk::Times {
                        Some(a * b)
                    } else {
                        a.checked_div(b)
                    }
                }
                _ => None,
            };
        }
        Ok(v)
    }

    fn unary(&mut self, depth: usize) -> Result<Val, ()> {
        let mut negate = false;
        while let t @ (Tk::Plus | Tk::Minus) = self.peek() {
            self.bump();
            negate ^= t == Tk::Minus;
        }
        let v = self.primary(depth)?;
        Ok(if negate { v.map(|q| -q) } else { v })
    }

    fn primary(&mut self, depth: usize) -> Result<Val, ()> {
        let v = match self.peek() {
            Tk::Num(n) => {
                self.bump();
                self.literals.push(Some(n));
                Some(Rational::int(n))
            }
            Tk::Huge => {
                self.bump();
                self.literals.push(None);
                Some(Rational::Approx(f64::INFINITY))
            }
            Tk::LPar => {
                if depth >= MAX_PARENS {
                    return Err(());
                }
                self.bump();
                let v = self.expr(depth + 1)?;
                if self.peek() != Tk::RPar {
                    return Err(());
                }
                self.bump();
                v
            }
            _ => return Err(()),
        };
        Ok(v)
    }
}

/// Score one equation (the text inside `<answer>`, already stripped) in the default mode.
pub fn judge_equation(eq: &str, task: &Task) -> Verdict {
    let Some((value, mut lits)) = parse_default(eq) else {
        return Verdict::Invalid;
    };
    if lits.unmatched || !same_multiset_ints(&mut lits.vals[..lits.len], &task.numbers) {
        return Verdict::Numbers;
    }
    match value {
        None => Verdict::Undefined,
        Some(q) if close_to(q, task.target) => Verdict::Correct,
        Some(_) => Verdict::Wrong,
    }
}

/// The value of a countdown equation as the default mode reads it: integer literals, `+ - * /`,
/// unary signs, parentheses and whitespace, evaluated in exact rationals ([`Rational`]; a
/// literal of more than 38 digits reads as `+∞`). `Ok(None)` when it divides by zero,
/// [`NotAnEquation`] when it is not such an equation (or is longer than [`MAX_EQUATION_BYTES`] or
/// nested deeper than [`MAX_PARENS`]). This is the one arithmetic evaluator for countdown
/// equations; [`reaches_target`] is the verifier's "equals the target" on top of it.
pub fn evaluate(eq: &str) -> Result<Option<Rational>, NotAnEquation> {
    parse_default(eq).map(|(v, _)| v).ok_or(NotAnEquation)
}

/// [`evaluate`]'s input is not an equation of the default mode's language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAnEquation;

impl std::fmt::Display for NotAnEquation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not a countdown equation (integers, + - * /, parentheses)")
    }
}

impl std::error::Error for NotAnEquation {}

/// Would the default mode count `eq`'s value as the target (`|value − target| < 1e-5`, exact
/// for integer targets)? False when `eq` does not evaluate. The numbers used are not checked.
pub fn reaches_target(eq: &str, target: Number) -> bool {
    matches!(evaluate(eq), Ok(Some(q)) if close_to(q, target))
}

/// Parse and evaluate `eq` in the default mode: its value (`None` on division by zero) and the
/// literals it uses; `None` when it is not an equation of the language.
fn parse_default(eq: &str) -> Option<(Val, Literals)> {
    if eq.len() > MAX_EQUATION_BYTES {
        return None;
    }
    let mut p = DefaultParser {
        lex: Lexer { s: eq, pos: 0 },
        tok: Tk::End,
        literals: Literals {
            vals: [0; 8],
            len: 0,
            unmatched: false,
        },
    };
    p.bump();
    match p.expr(0) {
        Ok(v) if p.tok == Tk::End => Some((v, p.literals)),
        _ => None,
    }
}

/// Multiset equality of integer literals and the given numbers (sorting both in place / on the
/// stack).
fn same_multiset_ints(lits: &mut [i128], numbers: &[Number]) -> bool {
    if lits.len() != numbers.len() {
        return false;
    }
    let mut nums = [0i128; 8];
    if numbers.len() > nums.len() {
        let mut owned: Vec<Option<i128>> = lits.iter().map(|&v| Some(v)).collect();
        return same_multiset(&mut owned, numbers);
    }
    for (slot, n) in nums.iter_mut().zip(numbers) {
        match n.as_integer() {
            Some(v) => *slot = v,
            None => return false,
        }
    }
    let nums = &mut nums[..numbers.len()];
    lits.sort_unstable();
    nums.sort_unstable();
    lits == nums
}

/// Multiset equality of integer literals (`None`: a literal no number can equal) and numbers.
fn same_multiset(lits: &mut [Option<i128>], numbers: &[Number]) -> bool {
    if lits.len() != numbers.len() {
        return false;
    }
    let mut nums: Vec<Option<i128>> = numbers.iter().map(Number::as_integer).collect();
    if lits.iter().any(Option::is_none) || nums.iter().any(Option::is_none) {
        return false;
    }
    lits.sort_unstable();
    nums.sort_unstable();
    lits == nums.as_slice()
}

/// Default mode on a response: the last `<answer>…</answer>` anywhere (DOTALL), stripped.
pub fn score_response<'a>(response: &'a str, task: &Task) -> Outcome<'a> {
    match last_answer(response) {
        None => Outcome {
            answer: None,
            verdict: Verdict::NoAnswer,
        },
        Some(eq) => Outcome {
            answer: Some(eq),
            verdict: judge_equation(eq, task),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// TinyZero compatibility

mod tinyzero;
pub use tinyzero::{tinyzero_compute_score, tinyzero_extract};

#[cfg(test)]
mod tests {
    use super::*;

    // The public evaluator other stages call (prepare's SFT examples): exact rationals.
    #[test]
    fn evaluate_is_the_default_modes_value() {
        assert_eq!(evaluate("(8 / 3) * 3"), Ok(Some(Rational::int(8))));
        assert_eq!(evaluate(" 2 * (3 + 4) "), Ok(Some(Rational::int(14))));
        assert_eq!(
            evaluate("1 / 3 - 1 / 3 * 2"),
            Ok(Rational::new(-1, 3).map(Some).unwrap())
        );
        assert_eq!(evaluate("-(4 - 6)"), Ok(Some(Rational::int(2))));
        assert_eq!(evaluate("5 / (2 - 2)"), Ok(None));
        assert_eq!(evaluate("2 ** 3"), Err(NotAnEquation));
        assert_eq!(evaluate("8 +"), Err(NotAnEquation));
        assert!(reaches_target("(8 / 3) * 3", Number::Int(8)));
        assert!(!reaches_target("8 / 3", Number::Int(3)));
        assert!(!reaches_target("8 +", Number::Int(8)));
        assert!(reaches_target("1 / 4", Number::Float(0.25)));
    }
    use proptest::prelude::*;

    fn task(nums: &[i128], target: i128) -> Task {
        Task {
            target: Number::Int(target),
            numbers: nums.iter().map(|&n| Number::Int(n)).collect(),
        }
    }

    const H: &str =
        "User: ... Assistant: Let me solve this step by step.\n<think>reasoning</think>\n";
    const QWEN: &str =
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\
        Using the numbers [2, 3, 7], create an equation that equals 23.<|im_end|>\n\
        <|im_start|>assistant\nLet me solve this step by step.\n<think>reasoning</think>\n";

    /// `docs/math.md` §1.1: TinyZero's own `countdown.py` on H + string (figures in fixtures/score).
    #[test]
    fn tinyzero_countdown_vectors() {
        let cases: &[(&str, &str, &[i128], i128, f32)] = &[
            ("correct", "<answer>3*7+2</answer>", &[2, 3, 7], 23, 1.0),
            (
                "qwen marker",
                "<answer> (3*7)+2 </answer><|im_end|>",
                &[2, 3, 7],
                23,
                1.0,
            ),
            (
                "no marker",
                "<think>r</think>\n<answer>3*7+2</answer>",
                &[2, 3, 7],
                23,
                0.0,
            ),
            ("missing tags", "3*7+2", &[2, 3, 7], 23, 0.0),
            (
                "reused number",
                "<answer>3*7+2+2</answer>",
                &[2, 3, 7],
                23,
                0.1,
            ),
            ("unused number", "<answer>3*7</answer>", &[2, 3, 7], 21, 0.1),
            ("wrong value", "<answer>3*7-2</answer>", &[2, 3, 7], 23, 0.1),
            (
                "division by zero",
                "<answer>7/(3-3)</answer>",
                &[3, 3, 7],
                7,
                0.1,
            ),
            (
                "two answers, last correct",
                "<answer>3*7-2</answer> <answer>3*7+2</answer>",
                &[2, 3, 7],
                23,
                1.0,
            ),
            (
                "two answers, last wrong",
                "<answer>3*7+2</answer> <answer>3*7-2</answer>",
                &[2, 3, 7],
                23,
                0.1,
            ),
            (
                "not on last line",
                "<answer>3*7+2</answer>\nDone.",
                &[2, 3, 7],
                23,
                0.0,
            ),
            (
                "spans lines",
                "<answer>\n3*7+2\n</answer>",
                &[2, 3, 7],
                23,
                0.0,
            ),
            ("= 23", "<answer>3*7+2 = 23</answer>", &[2, 3, 7], 23, 0.1),
            (
                "unicode times",
                "<answer>3×7+2</answer>",
                &[2, 3, 7],
                23,
                0.1,
            ),
            ("power", "<answer>2**3+5</answer>", &[2, 3, 5], 13, 1.0),
            (
                "float literal",
                "<answer>3*7+2.0</answer>",
                &[2, 3, 7],
                23,
                0.1,
            ),
            ("empty answer", "<answer></answer>", &[2, 3, 7], 23, 0.1),
            (
                "non-integer intermediate",
                "<answer>(8/3)*3+1</answer>",
                &[1, 3, 3, 8],
                9,
                1.0,
            ),
            (
                "floor division",
                "<answer>7//2+3</answer>",
                &[2, 3, 7],
                6,
                1.0,
            ),
        ];
        for &(name, s, nums, target, want) in cases {
            let full = match name {
                "qwen marker" => format!("{QWEN}{s}"),
                "no marker" => s.to_string(),
                _ => format!("{H}{s}"),
            };
            let got = tinyzero_compute_score(&full, &task(nums, target)).score();
            assert_eq!(got, want, "case {name:?}: {full:?}");
        }
    }

    /// The same situations in the default mode (response only, across lines, no Python quirks).
    #[test]
    fn default_mode_vectors() {
        let cases: &[(&str, &[i128], i128, Verdict)] = &[
            ("<answer>3*7+2</answer>", &[2, 3, 7], 23, Verdict::Correct),
            (
                "<think>r</think>\n<answer>3*7+2</answer>",
                &[2, 3, 7],
                23,
                Verdict::Correct,
            ),
            ("3*7+2", &[2, 3, 7], 23, Verdict::NoAnswer),
            ("<answer>3*7+2+2</answer>", &[2, 3, 7], 23, Verdict::Numbers),
            ("<answer>3*7</answer>", &[2, 3, 7], 21, Verdict::Numbers),
            ("<answer>3*7-2</answer>", &[2, 3, 7], 23, Verdict::Wrong),
            (
                "<answer>7/(3-3)</answer>",
                &[3, 3, 7],
                7,
                Verdict::Undefined,
            ),
            (
                "<answer>3*7-2</answer> <answer>3*7+2</answer>",
                &[2, 3, 7],
                23,
                Verdict::Correct,
            ),
            (
                "<answer>3*7+2</answer>\nDone.",
                &[2, 3, 7],
                23,
                Verdict::Correct,
            ),
            (
                "<answer>\n3*7+2\n</answer>",
                &[2, 3, 7],
                23,
                Verdict::Correct,
            ),
            (
                "<answer>3*7+2 = 23</answer>",
                &[2, 3, 7],
                23,
                Verdict::Invalid,
            ),
            ("<answer>3×7+2</answer>", &[2, 3, 7], 23, Verdict::Correct),
            (
                "<answer>(7−3)÷2+2</answer>",
                &[2, 2, 3, 7],
                4,
                Verdict::Correct,
            ),
            ("<answer>2**3+5</answer>", &[2, 3, 5], 13, Verdict::Invalid),
            ("<answer>3*7+2.0</answer>", &[2, 3, 7], 23, Verdict::Invalid),
            ("<answer></answer>", &[2, 3, 7], 23, Verdict::Invalid),
            (
                "<answer>(8/3)*3+1</answer>",
                &[1, 3, 3, 8],
                9,
                Verdict::Correct,
            ),
            ("<answer>7//2+3</answer>", &[2, 3, 7], 6, Verdict::Invalid),
            (
                "<answer>-3+7*2+12</answer>",
                &[2, 3, 7, 12],
                23,
                Verdict::Correct,
            ),
            ("<answer>2(3+7)</answer>", &[2, 3, 7], 20, Verdict::Invalid),
            ("<answer>07*3+2</answer>", &[2, 3, 7], 23, Verdict::Correct),
            // 1/3 + 1/3 + 1/3 is exactly 1 (f64 would give 0.9999999999999999, also within 1e-5)
            (
                "<answer>1/3+1/3+1/3</answer>",
                &[1, 1, 1, 3, 3, 3],
                1,
                Verdict::Correct,
            ),
            // within the 1e-5 tolerance but not equal: 100000/99999 = 1.00001000010...
            (
                "<answer>100000/99999</answer>",
                &[100000, 99999],
                1,
                Verdict::Wrong,
            ),
            (
                "<answer>1000000/999999</answer>",
                &[1000000, 999999],
                1,
                Verdict::Correct,
            ),
        ];
        for &(s, nums, target, want) in cases {
            let got = score_response(s, &task(nums, target));
            assert_eq!(got.verdict, want, "{s:?}");
        }
    }

    #[test]
    fn overflow_falls_back_to_floats() {
        let big = 10i128.pow(30);
        let t = Task {
            target: Number::Int(1),
            numbers: vec![
                Number::Int(big),
                Number::Int(big),
                Number::Int(big),
                Number::Int(big),
            ],
        };
        let eq = format!("({big}*{big})/({big}*{big})");
        assert_eq!(judge_equation(&eq, &t), Verdict::Correct);
    }

    #[test]
    fn ground_truth_parsing() {
        let t = Task::from_json(r#"{"target": 23, "numbers": [2, 3, 7]}"#).unwrap();
        assert_eq!(t, task(&[2, 3, 7], 23));
        let t = Task::from_json(r#"{"target": 23.0, "nums": [2.0, 3, 7]}"#).unwrap();
        assert_eq!(t.numbers[0], Number::Float(2.0));
        assert_eq!(
            score_response("<answer>3*7+2</answer>", &t).verdict,
            Verdict::Correct
        );
        assert!(Task::from_json("[1,2]").is_err());
        assert!(Task::from_json(r#"{"target": "x", "numbers": [1]}"#).is_err());
        assert!(Task::from_json("not json").is_err());
        // a long decimal read exactly (serde_json alone gives -4383261019652501.0)
        let t = Task::from_json(r#"{"target": -4383261019652500.5, "numbers": [1]}"#).unwrap();
        assert_eq!(t.target, Number::Float(-4383261019652500.5));
    }

    #[test]
    fn tinyzero_more_quirks() {
        let t = task(&[2, 3, 7], 23);
        // an `Assistant:` inside the response wins over the chat marker of the prompt
        let s = format!("{QWEN}Assistant: <answer>3*7+2</answer>\n<answer>1</answer>");
        assert_eq!(tinyzero_compute_score(&s, &t).score(), 0.1);
        // Unicode digits: validated as digits by Python's regex, rejected by its tokenizer
        let s = format!("{H}<answer>3*7+\u{662}</answer>");
        assert_eq!(tinyzero_compute_score(&s, &t).score(), 0.1);
        // stripping removes Python whitespace (U+001C) but not a zero-width space
        let s = format!("{H}<answer>\u{1c}3*7+2\u{1c}</answer>");
        assert_eq!(tinyzero_compute_score(&s, &t).score(), 1.0);
        // complex intermediate that comes back real enough: ((2-3)**(1/2))**2 * -23 = 23 + ~3e-15j
        let s = format!("{H}<answer>((2-3)**(1/2))**2*-23</answer>");
        assert_eq!(
            tinyzero_compute_score(&s, &task(&[2, 3, 1, 2, 2, 23], 23)).score(),
            1.0
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn never_panics(s in ".{0,80}", nums in proptest::collection::vec(0i128..100, 0..5), target in -5i128..200) {
            let t = task(&nums, target);
            let wrapped = format!("Assistant: <answer>{s}</answer>");
            let a = tinyzero_compute_score(&wrapped, &t);
            let b = score_response(&wrapped, &t);
            prop_assert!([0.0f32, 0.1, 1.0].contains(&a.score()));
            prop_assert!([0.0f32, 0.1, 1.0].contains(&b.score()));
        }

        #[test]
        fn never_panics_arithmetic(s in "[0-9+*/()\\- ×÷.]{0,40}", target in -5i128..200) {
            let t = task(&[1, 2, 3, 4], target);
            let _ = judge_equation(&s, &t);
            let _ = tinyzero_compute_score(&format!("Assistant:<answer>{s}</answer>"), &t);
        }

        // Default and TinyZero modes agree on the integer + - * / language they share, whenever
        // the value is not within float rounding of the target.
        #[test]
        fn modes_agree_on_the_common_language(
            ops in proptest::collection::vec(0usize..4, 3),
            nums in proptest::collection::vec(1i128..60, 4),
            target in 1i128..100,
        ) {
            let sym = ["+", "-", "*", "/"];
            let eq = format!("({}{}{}){}({}{}{})", nums[0], sym[ops[0]], nums[1], sym[ops[1]], nums[2], sym[ops[2]], nums[3]);
            let t = task(&nums, target);
            let d = judge_equation(&eq, &t);
            let z = tinyzero_compute_score(&format!("Assistant:<answer>{eq}</answer>"), &t).verdict;
            prop_assert_eq!(d == Verdict::Correct, z == Verdict::Correct, "{}", eq);
        }
    }
}

/// The typed ground-truth scanner against the general JSON path: wherever [`Task::scan`] reads a
/// text, the general parser reads the same task; where it declines, `from_json` is the general
/// parser (so acceptance, refusal and error messages cannot differ).
#[cfg(test)]
mod ground_truth_scan {
    use super::*;

    fn same(text: &str) -> bool {
        let general = Task::from_json_value(text).map_err(|e| format!("{e:#}"));
        let both = Task::from_json(text).map_err(|e| format!("{e:#}"));
        assert_eq!(both, general, "{text:?}");
        match Task::scan(text) {
            Some(t) => {
                assert_eq!(Ok(t), general, "{text:?}");
                true
            }
            None => false,
        }
    }

    #[test]
    fn canonical_texts_are_scanned_and_read_alike() {
        for t in [
            r#"{"target": 23, "numbers": [2, 3, 7]}"#,
            r#"{"numbers":[2,3,7],"target":-23}"#,
            " \t\r\n{ \"target\" : 0 , \"numbers\" : [ ] } \n",
            r#"{"target": 999999999999999999, "numbers": [-999999999999999999, 0, 10]}"#,
            r#"{"target": 5332, "numbers": [98, 54, 6, 34]}"#,
        ] {
            assert!(same(t), "not scanned: {t:?}");
        }
        // the CPython fixture's tasks, written the way `prepare` writes them
        let text = include_str!("../../fixtures/score/tinyzero_cases.jsonl");
        let mut scanned = 0;
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let gt = serde_json::json!({"target": v["target"], "numbers": v["numbers"]});
            scanned += same(&gt.to_string()) as usize;
            scanned += same(&serde_json::to_string_pretty(&gt).unwrap()) as usize;
        }
        assert!(scanned > 1000, "{scanned}");
    }

    #[test]
    fn everything_else_goes_the_general_way() {
        for t in [
            "",
            "{}",
            "[]",
            "null",
            r#"{"target": 23}"#,
            r#"{"numbers": [1]}"#,
            r#"{"target": 23, "nums": [2, 3, 7]}"#,
            r#"{"target": 23, "numbers": [2, 3, 7], "nums": [1]}"#,
            r#"{"target": 23, "numbers": [2, 3, 7], "x": {"y": [1, "}"]}}"#,
            r#"{"target": 1, "target": 2, "numbers": []}"#,
            r#"{"target": 1, "numbers": [1], "numbers": [2, 3]}"#,
            r#"{"target": 1.5, "numbers": [1]}"#,
            r#"{"target": -35.10714285714286, "numbers": [15, 50]}"#,
            r#"{"target": 1e3, "numbers": [1]}"#,
            r#"{"target": 1E3, "numbers": [1]}"#,
            r#"{"target": 10, "numbers": [1.0, 2]}"#,
            r#"{"target": -0, "numbers": [1]}"#,
            r#"{"target": 0, "numbers": [-0]}"#,
            r#"{"target": 01, "numbers": [1]}"#,
            r#"{"target": 1, "numbers": [007]}"#,
            r#"{"target": -, "numbers": [1]}"#,
            r#"{"target": +1, "numbers": [1]}"#,
            r#"{"target": 1000000000000000000, "numbers": [1]}"#,
            r#"{"target": 9223372036854775807, "numbers": [1]}"#,
            r#"{"target": -9223372036854775808, "numbers": [1]}"#,
            r#"{"target": 18446744073709551615, "numbers": [1]}"#,
            r#"{"target": 99999999999999999999, "numbers": [1]}"#,
            r#"{"target": "23", "numbers": [1]}"#,
            r#"{"target": 23, "numbers": "1, 2"}"#,
            r#"{"target": 23, "numbers": [1, null]}"#,
            r#"{"target": 23, "numbers": [1,]}"#,
            r#"{"target": 23, "numbers": [,1]}"#,
            r#"{"target": 23, "numbers": [1 2]}"#,
            r#"{"target": 23, "numbers": [1]],"#,
            r#"{"target": 23, "numbers": [1],}"#,
            r#"{"target": 23 "numbers": [1]}"#,
            r#"{"target": 23, "numbers": [1]} x"#,
            r#"{"target": 23, "numbers": [1]}}"#,
            r#"{"t\u0061rget": 23, "numbers": [1]}"#,
            "{\"target\": 23, \"numbers\": [1]\u{a0}}",
            "\u{feff}{\"target\": 23, \"numbers\": [1]}",
            r#"{'target': 23, 'numbers': [1]}"#,
        ] {
            assert!(!same(t), "scanned: {t:?}");
        }
    }

    proptest::proptest! {
        // texts spliced from JSON-ish pieces: the two readers agree on every one
        #[test]
        fn spliced_texts_agree(pieces in proptest::collection::vec(0usize..30, 0..24)) {
            const P: [&str; 30] = [
                "{", "}", "[", "]", ":", ",", " ", "\n", "\"target\"", "\"numbers\"",
                "\"nums\"", "\"x\"", "0", "-0", "7", "-7", "12", "01", "1.5", "2e3", "-", "null",
                "true", "\"7\"", "999999999999999999", "9999999999999999999", "\t", "\"", "x",
                "{\"target\": 3, \"numbers\": [1, 2]}",
            ];
            let text: String = pieces.iter().map(|&i| P[i]).collect();
            same(&text);
            same(&format!("{{\"target\": {text}, \"numbers\": [1]}}"));
            same(&format!("{{\"target\": 4, \"numbers\": [{text}]}}"));
        }
    }
}

/// Differential test against a CPython run of TinyZero's `compute_score` semantics
/// (`fixtures/score/tinyzero_cases.jsonl`, scripts/gen_countdown_fixtures.py).
#[cfg(test)]
mod cpython_fixture {
    use super::*;
    use crate::reward::pyexpr::cpython_fixture::assert_matches_fixture;

    #[test]
    fn matches_cpython_compute_score() {
        let text = include_str!("../../fixtures/score/tinyzero_cases.jsonl");
        assert_matches_fixture(text, 500, |v| {
            let task = Task::from_value(v).unwrap();
            let s = v["s"].as_str().unwrap();
            let want = v["score"].as_f64().unwrap() as f32;
            let got = tinyzero_compute_score(s, &task).score();
            (got != want).then(|| {
                format!(
                    "{s:?} target {} numbers {}: python {want} ours {got}",
                    v["target"], v["numbers"]
                )
            })
        });
    }
}
