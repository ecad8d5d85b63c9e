//! RLCR's format checks, confidence parsing and Brier reward (`docs/math.md` §1.2).
//!
//! - [`FormatPattern`]: RLCR's `format_reward` patterns (`ta`, `tac`, `tabc`, `tbac`), each a full
//!   match of `.*?</think>\s*<answer>.*?</answer>…\s*\Z` with DOTALL, anchored at the start (no
//!   opening `<think>`: the prompt supplies it) and allowing only whitespace after the last tag.
//!   Patterns with a confidence also need the last `<confidence>` to parse (strictly, see below);
//!   RLCR's own check lets `nan` through, ours does not.
//! - [`confidence_format_ok`]: the two-turn design's turn-2 format, `[<analysis>…</analysis>]
//!   <confidence>…</confidence>` with optional surrounding whitespace and nothing else, plus a
//!   strict parse.
//! - [`parse_confidence_strict`] (training): the last `<confidence>…</confidence>`, stripped,
//!   read with Python's `float()` syntax (ASCII), and accepted only when finite and in [0,1];
//!   `nan`, `inf`, `80%`, `1.2`, an empty tag or no tag are parse failures.
//!   [`parse_confidence_lenient`] is RLCR's evaluation-time extractor (a value in (1,100] is read
//!   as a percentage; when `float()` fails, the first `-?\d+(\.\d+)?` in the tag is used the same
//!   way) for reporting only.
//! - [`brier_reward`]: `1 − (acc − c)²`, 0 when the format or the parse fails; in [0,1] for acc
//!   and c in [0,1].
//!
//! The pattern matcher is a scan, not a regex: the pattern is a sequence of chunks (`</think>`,
//! whitespace, `<answer>`) separated by `.*?`; taking each chunk's earliest occurrence after the
//! previous one is optimal because no chunk can overlap itself, and the last tag must end the
//! string up to whitespace. A regex reference implementation checks the scan in the tests.
use super::text::{find_at, last_tag, py_isspace, py_rstrip, py_strip};

/// RLCR's `format_pattern` values.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum FormatPattern {
    /// `</think> <answer>…</answer>`.
    Ta,
    /// `</think> <answer>…</answer> <confidence>…</confidence>`.
    Tac,
    /// `</think> <answer>…</answer> <analysis>…</analysis> <confidence>…</confidence>` (RLCR).
    Tabc,
    /// `</think> <analysis>…</analysis> <answer>…</answer> <confidence>…</confidence>`.
    Tbac,
}

impl FormatPattern {
    pub fn name(self) -> &'static str {
        match self {
            FormatPattern::Ta => "ta",
            FormatPattern::Tac => "tac",
            FormatPattern::Tabc => "tabc",
            FormatPattern::Tbac => "tbac",
        }
    }

    pub fn parse(s: &str) -> Option<FormatPattern> {
        Some(match s {
            "ta" => FormatPattern::Ta,
            "tac" => FormatPattern::Tac,
            "tabc" => FormatPattern::Tabc,
            "tbac" => FormatPattern::Tbac,
            _ => return None,
        })
    }

    /// Whether the pattern ends with a confidence that must parse.
    pub fn has_confidence(self) -> bool {
        self != FormatPattern::Ta
    }

    /// The chunks between `.*?`s; the last one is a single tag that must end the text.
    fn chunks(self) -> &'static [&'static [&'static str]] {
        match self {
            FormatPattern::Ta => &[&["</think>", "<answer>"], &["</answer>"]],
            FormatPattern::Tac => &[
                &["</think>", "<answer>"],
                &["</answer>", "<confidence>"],
                &["</confidence>"],
            ],
            FormatPattern::Tabc => &[
                &["</think>", "<answer>"],
                &["</answer>", "<analysis>"],
                &["</analysis>", "<confidence>"],
                &["</confidence>"],
            ],
            FormatPattern::Tbac => &[
                &["</think>", "<analysis>"],
                &["</analysis>", "<answer>"],
                &["</answer>", "<confidence>"],
                &["</confidence>"],
            ],
        }
    }

    /// The regular expression RLCR uses (reference for tests and documentation).
    pub fn regex(self) -> &'static str {
        match self {
            FormatPattern::Ta => r".*?</think>\s*<answer>.*?</answer>\s*\Z",
            FormatPattern::Tac => {
                r".*?</think>\s*<answer>.*?</answer>\s*<confidence>.*?</confidence>\s*\Z"
            }
            FormatPattern::Tabc => {
                r".*?</think>\s*<answer>.*?</answer>\s*<analysis>.*?</analysis>\s*<confidence>.*?</confidence>\s*\Z"
            }
            FormatPattern::Tbac => {
                r".*?</think>\s*<analysis>.*?</analysis>\s*<answer>.*?</answer>\s*<confidence>.*?</confidence>\s*\Z"
            }
        }
    }
}

/// End of the earliest occurrence, at or after `from`, of `lits` separated by optional
/// whitespace.
fn find_chunk(s: &str, from: usize, lits: &[&str]) -> Option<usize> {
    let mut start = from;
    'outer: while let Some(i) = find_at(s, start, lits[0]) {
        let mut pos = i + lits[0].len();
        for lit in &lits[1..] {
            let rest = &s[pos..];
            let ws = rest.len() - rest.trim_start_matches(py_isspace).len();
            pos += ws;
            if !s[pos..].starts_with(lit) {
                start = i + 1;
                continue 'outer;
            }
            pos += lit.len();
        }
        return Some(pos);
    }
    None
}

/// Does `s` match the pattern's regular expression (structure only, no confidence parse)?
pub fn structure_ok(s: &str, pattern: FormatPattern) -> bool {
    let chunks = pattern.chunks();
    let t = py_rstrip(s);
    let (last, middle) = match chunks.split_last() {
        Some((l, m)) => (l[0], m),
        None => return true,
    };
    let Some(limit) = t.strip_suffix(last).map(str::len) else {
        return false;
    };
    let mut pos = 0;
    for lits in middle {
        match find_chunk(t, pos, lits) {
            Some(end) if end <= limit => pos = end,
            _ => return false,
        }
    }
    true
}

/// RLCR's `format_reward` with a strict confidence parse: 1 iff the structure matches and, for
/// patterns with a confidence, [`parse_confidence_strict`] succeeds.
pub fn format_ok(s: &str, pattern: FormatPattern) -> bool {
    structure_ok(s, pattern) && (!pattern.has_confidence() || parse_confidence_strict(s).is_some())
}

/// Turn-2 structure: `\s*(<analysis>.*?</analysis>\s*)?<confidence>.*?</confidence>\s*\Z`
/// (DOTALL); with `require_analysis` the analysis is mandatory.
pub fn confidence_structure_ok(s: &str, require_analysis: bool) -> bool {
    let t = py_strip(s);
    let Some(body) = t.strip_suffix("</confidence>") else {
        return false;
    };
    if let Some(after) = body.strip_prefix("<analysis>") {
        // the earliest `</analysis>\s*<confidence>` must end inside the body
        find_chunk(after, 0, &["</analysis>", "<confidence>"]).is_some()
    } else {
        !require_analysis && body.starts_with("<confidence>")
    }
}

/// Turn-2 format: the structure and a strict confidence parse.
pub fn confidence_format_ok(s: &str, require_analysis: bool) -> bool {
    confidence_structure_ok(s, require_analysis) && parse_confidence_strict(s).is_some()
}

/// Python's `float(s)` for ASCII text: surrounding whitespace, sign, digits with single
/// underscores between digits, optional fraction and exponent, or `inf`/`infinity`/`nan`.
pub fn py_float(s: &str) -> Option<f64> {
    let t = py_strip(s);
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    let lower = body.to_ascii_lowercase();
    if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
        return t.parse::<f64>().ok();
    }
    // validate Python's numeric syntax, dropping underscores that sit between two digits
    let b = body.as_bytes();
    let mut clean = String::with_capacity(t.len());
    if t.starts_with('-') {
        clean.push('-');
    }
    let mut digits = 0usize;
    let mut i = 0;
    let mut seen_dot = false;
    let mut seen_exp = false;
    let mut exp_digits = 0usize;
    while i < b.len() {
        let c = b[i];
        match c {
            b'0'..=b'9' => {
                if seen_exp {
                    exp_digits += 1;
                } else {
                    digits += 1;
                }
                clean.push(c as char);
            }
            b'_' => {
                let prev_digit = i > 0 && b[i - 1].is_ascii_digit();
                let next_digit = b.get(i + 1).is_some_and(u8::is_ascii_digit);
                if !(prev_digit && next_digit) {
                    return None;
                }
            }
            b'.' if !seen_dot && !seen_exp => {
                seen_dot = true;
                clean.push('.');
            }
            b'e' | b'E' if !seen_exp && digits > 0 => {
                seen_exp = true;
                clean.push('e');
                if let Some(&sgn @ (b'+' | b'-')) = b.get(i + 1) {
                    clean.push(sgn as char);
                    i += 1;
                }
            }
            _ => return None,
        }
        i += 1;
    }
    if digits == 0 || (seen_exp && exp_digits == 0) {
        return None;
    }
    clean.parse::<f64>().ok()
}

/// Strict confidence (training): the last `<confidence>…</confidence>`, stripped, a finite float
/// in [0,1]; `None` otherwise (NaN, ±inf, percentages, out of range, missing or empty tag).
pub fn parse_confidence_strict(s: &str) -> Option<f64> {
    let raw = last_tag(s, "<confidence>", "</confidence>")?;
    let c = py_float(raw)?;
    (c.is_finite() && (0.0..=1.0).contains(&c)).then_some(c)
}

/// RLCR's evaluation-time `confidence_extractor`: `None` is its `(0, 0.0)` (format 0).
pub fn parse_confidence_lenient(s: &str) -> Option<f64> {
    let raw = last_tag(s, "<confidence>", "</confidence>")?;
    if raw.is_empty() {
        return None;
    }
    let scale = |c: f64| {
        if c > 1.0 && c <= 100.0 {
            Some(c / 100.0)
        } else if (0.0..=1.0).contains(&c) {
            Some(c)
        } else {
            None
        }
    };
    match py_float(raw) {
        Some(c) => scale(c),
        None => scale(first_number(raw)?),
    }
}

/// The first match of `-?\d+(?:\.\d+)?` (ASCII digits), as a float.
fn first_number(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let start = b.iter().position(u8::is_ascii_digit)?;
    let neg = start > 0 && b[start - 1] == b'-';
    let mut end = start;
    while end < b.len() && b[end].is_ascii_digit() {
        end += 1;
    }
    if end + 1 < b.len() && b[end] == b'.' && b[end + 1].is_ascii_digit() {
        end += 1;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
    }
    let from = if neg { start - 1 } else { start };
    s[from..end].parse().ok()
}

/// Brier reward `1 − (acc − c)²` (`docs/math.md` §1.2; the paper's bounded proper scoring rule).
/// `c = None` (format or parse failure) gives 0. In [0,1] whenever `acc` and `c` are in [0,1].
pub fn brier_reward(acc: f64, c: Option<f64>) -> f64 {
    match c {
        Some(c) => 1.0 - (acc - c) * (acc - c),
        None => 0.0,
    }
}

/// RLCR's five training reward functions for one completion, as in its configs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RlcrTerms {
    /// `format_reward` (strict parse).
    pub format: f64,
    /// `accuracy_reward`, gated by format.
    pub accuracy: f64,
    /// `brier_reward`, 0 when format is 0.
    pub brier: f64,
    /// `mean_confidence_reward`: the confidence clipped to [0,1], 0 when missing or unparsable.
    pub mean_confidence: f64,
    /// `confidence_one_or_zero`: 1 if the clipped confidence is within 0.01 of 0 or 1.
    pub confidence_one_or_zero: f64,
}

impl RlcrTerms {
    /// The five terms for a single-completion RLCR sample; `correct` is the verifier's verdict on
    /// the last `<answer>`.
    pub fn compute(completion: &str, pattern: FormatPattern, correct: bool) -> RlcrTerms {
        let format = if format_ok(completion, pattern) {
            1.0
        } else {
            0.0
        };
        let accuracy = if format == 1.0 && correct { 1.0 } else { 0.0 };
        let conf = parse_confidence_strict(completion);
        let brier = if format == 1.0 {
            brier_reward(accuracy, conf)
        } else {
            0.0
        };
        // RLCR clips whatever float() reads; NaN clips to... max(0, min(nan, 1)) = 0 in Python
        let clipped = last_tag(completion, "<confidence>", "</confidence>")
            .and_then(py_float)
            .map(|c| if c.is_nan() { 0.0 } else { c.clamp(0.0, 1.0) })
            .unwrap_or(0.0);
        let one_or_zero = if (clipped - 1.0).abs() < 0.01 || clipped.abs() < 0.01 {
            1.0
        } else {
            0.0
        };
        RlcrTerms {
            format,
            accuracy,
            brier,
            mean_confidence: clipped,
            confidence_one_or_zero: one_or_zero,
        }
    }

    /// Weighted sum (TRL `sum_then_normalize`), weights in RLCR's order
    /// `[format, accuracy, brier, mean_confidence, confidence_one_or_zero]`.
    pub fn total(&self, w: [f64; 5]) -> f64 {
        w[0] * self.format
            + w[1] * self.accuracy
            + w[2] * self.brier
            + w[3] * self.mean_confidence
            + w[4] * self.confidence_one_or_zero
    }
}

/// RLCR's HotpotQA weights `[0.5, 0.5, 0.5, 1e-6, 1e-6]`.
pub const RLCR_HOTPOT_WEIGHTS: [f64; 5] = [0.5, 0.5, 0.5, 1e-6, 1e-6];
/// RLCR's math weights `[0.5, 0.5, 0.5, 1e-5, 1e-5]`.
pub const RLCR_MATH_WEIGHTS: [f64; 5] = [0.5, 0.5, 0.5, 1e-5, 1e-5];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::qa::exact_match;
    use proptest::prelude::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// `docs/math.md` §1.2: format, acc, brier and 0.5·(f + a + b) with hotpot EM against "Paris".
    #[test]
    fn rlcr_reward_table() {
        let mk = |ans: &str, conf: &str| {
            format!("<think>t</think><answer>{ans}</answer> <analysis>a</analysis> <confidence>{conf}</confidence>")
        };
        let cases: Vec<(String, f64, f64, f64, f64)> = vec![
            (mk("Paris", "0.8"), 1.0, 1.0, 0.96, 1.48),
            (mk("Lyon", "0.8"), 1.0, 0.0, 0.36, 0.68),
            (mk("Lyon", "0"), 1.0, 0.0, 1.0, 1.0),
            (mk("The Paris.", "1"), 1.0, 1.0, 1.0, 1.5),
            (mk("Paris", " 0.75 "), 1.0, 1.0, 0.9375, 1.46875),
            (mk("Paris", "80%"), 0.0, 0.0, 0.0, 0.0),
            (mk("Paris", "1.2"), 0.0, 0.0, 0.0, 0.0),
            // D10: RLCR gives format 1 and Brier NaN here; we reject NaN (parse failure)
            (mk("Paris", "nan"), 0.0, 0.0, 0.0, 0.0),
            (
                "<think>t</think><answer>Paris</answer> <confidence>0.8</confidence>".into(),
                0.0, 0.0, 0.0, 0.0,
            ),
            (format!("{} trailing", mk("Paris", "0.8")), 0.0, 0.0, 0.0, 0.0),
            (
                "t<answer>Paris</answer> <analysis>a</analysis> <confidence>0.8</confidence>".into(),
                0.0, 0.0, 0.0, 0.0,
            ),
            (
                "<think>t</think><answer>Paris</answer> <answer>Lyon</answer> <analysis>a</analysis> <confidence>0.9</confidence>".into(),
                1.0, 0.0, 0.19, 0.595,
            ),
        ];
        for (s, f, a, b, total) in cases {
            let correct =
                last_tag(&s, "<answer>", "</answer>").is_some_and(|x| exact_match(x, "Paris"));
            let t = RlcrTerms::compute(&s, FormatPattern::Tabc, correct);
            assert_eq!((t.format, t.accuracy), (f, a), "{s}");
            assert!(close(t.brier, b), "{s}: brier {} != {b}", t.brier);
            assert!(close(0.5 * (t.format + t.accuracy + t.brier), total), "{s}");
        }
    }

    /// The NaN case as RLCR computes it: `float("nan")` passes its `< 0 or > 1` check, so format
    /// is 1 and the Brier reward NaN; our strict parse turns it into a parse failure.
    #[test]
    fn nan_confidence_is_a_parse_failure() {
        let s = "<think>t</think><answer>Paris</answer> <analysis>a</analysis> <confidence>nan</confidence>";
        assert!(structure_ok(s, FormatPattern::Tabc));
        assert_eq!(parse_confidence_strict(s), None);
        assert!(!format_ok(s, FormatPattern::Tabc));
        assert_eq!(brier_reward(1.0, parse_confidence_strict(s)), 0.0);
        // what RLCR computes, for the record: 1 - (1 - nan)^2 is NaN
        let c = py_float("nan").unwrap();
        assert!((1.0 - (1.0 - c) * (1.0 - c)).is_nan());
        for bad in ["inf", "-inf", "Infinity", "NaN", "+nan"] {
            let s = format!("<confidence>{bad}</confidence>");
            assert_eq!(parse_confidence_strict(&s), None, "{bad}");
        }
    }

    /// `docs/math.md` §1.2: RLCR total reward with hotpot weights.
    #[test]
    fn rlcr_weighted_totals() {
        let mk = |ans: &str, conf: &str| {
            format!("<think>t</think><answer>{ans}</answer> <analysis>a</analysis> <confidence>{conf}</confidence>")
        };
        let t = RlcrTerms::compute(&mk("Paris", "0.8"), FormatPattern::Tabc, true);
        assert!((t.total(RLCR_HOTPOT_WEIGHTS) - 1.4800008).abs() < 1e-12);
        let t = RlcrTerms::compute(&mk("Lyon", "0.8"), FormatPattern::Tabc, false);
        assert!((t.total(RLCR_HOTPOT_WEIGHTS) - 0.6800008).abs() < 1e-12);
        let t = RlcrTerms::compute(&mk("Lyon", "0.0"), FormatPattern::Tabc, false);
        assert!((t.total(RLCR_HOTPOT_WEIGHTS) - 1.0000010).abs() < 1e-12);
    }

    #[test]
    fn python_float_syntax() {
        assert_eq!(py_float(" 0.75 "), Some(0.75));
        assert_eq!(py_float("0.7_5"), Some(0.75));
        assert_eq!(py_float("1e-1"), Some(0.1));
        assert_eq!(py_float(".5"), Some(0.5));
        assert_eq!(py_float("5."), Some(5.0));
        assert_eq!(py_float("+1"), Some(1.0));
        assert_eq!(py_float("-0"), Some(-0.0));
        for bad in [
            "", ".", "1__0", "_1", "1_", "80%", "0,5", "1e", "e5", "0x1", "1 2", "½",
        ] {
            assert_eq!(py_float(bad), None, "{bad:?}");
        }
        assert!(py_float("nan").is_some_and(f64::is_nan));
        assert_eq!(py_float("-Infinity"), Some(f64::NEG_INFINITY));
    }

    #[test]
    fn lenient_like_rlcr_eval() {
        let c = |x: &str| parse_confidence_lenient(&format!("<confidence>{x}</confidence>"));
        for (x, want) in [
            ("0.8", Some(0.8)),
            ("80", Some(0.8)),
            (" 85 ", Some(0.85)),
            ("80%", Some(0.8)),
            ("about 70%", Some(0.7)),
            ("about 0.3 maybe", Some(0.3)),
            ("1", Some(1.0)),
            ("150", None),
            ("-0.5", None),
            ("high", None),
            ("nan", None),
            ("", None),
        ] {
            assert_eq!(c(x), want, "{x:?}");
        }
        assert_eq!(parse_confidence_lenient("no tag"), None);
        assert_eq!(parse_confidence_lenient("no tag 0.5"), None);
        // the last tag counts; numbers outside it do not
        assert_eq!(
            parse_confidence_lenient("<analysis>x 0.1</analysis><confidence> 85 </confidence>"),
            Some(0.85)
        );
        assert_eq!(
            parse_confidence_lenient("<confidence>0.2</confidence> <confidence>0.9</confidence>"),
            Some(0.9)
        );
        // strict refuses what lenient accepts
        assert_eq!(
            parse_confidence_strict("<confidence>80%</confidence>"),
            None
        );
        assert_eq!(parse_confidence_strict("<confidence>80</confidence>"), None);
    }

    #[test]
    fn turn_two_format() {
        assert!(confidence_format_ok(
            "<analysis>a</analysis><confidence>0.3</confidence>",
            false
        ));
        assert!(confidence_format_ok(
            " <analysis>a</analysis>\n<confidence> 0.3 </confidence>\n",
            true
        ));
        assert!(confidence_format_ok("<confidence>0.3</confidence>", false));
        assert!(!confidence_format_ok("<confidence>0.3</confidence>", true));
        assert!(!confidence_format_ok(
            "I think <confidence>0.3</confidence>",
            false
        ));
        assert!(!confidence_format_ok(
            "<confidence>0.3</confidence> ok",
            false
        ));
        assert!(!confidence_format_ok(
            "<analysis>a<confidence>0.3</confidence>",
            false
        ));
        assert!(!confidence_format_ok(
            "<analysis>a</analysis><confidence>1.3</confidence>",
            false
        ));
        assert!(!confidence_format_ok("<analysis>a</analysis>", false));
    }

    #[test]
    fn ta_pattern() {
        assert!(format_ok(
            "r</think>\n<answer>x</answer>\n",
            FormatPattern::Ta
        ));
        assert!(format_ok("</think><answer></answer>", FormatPattern::Ta));
        assert!(!format_ok("<answer>x</answer>", FormatPattern::Ta));
        assert!(!format_ok(
            "r</think> text <answer>x</answer>",
            FormatPattern::Ta
        ));
        assert!(format_ok(
            "r</think> <answer>a</answer> b </think><answer>x</answer>",
            FormatPattern::Ta
        ));
    }

    fn reference(s: &str, p: FormatPattern) -> bool {
        // Python's \s is Unicode whitespace plus U+001C..U+001F
        let re = p
            .regex()
            .replace(r"\s", r"[\s\x1c-\x1f]")
            .replace(r"\Z", r"\z");
        regex::Regex::new(&format!("(?s)^(?:{re})"))
            .unwrap()
            .is_match(s)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        // The scan equals RLCR's regular expressions.
        #[test]
        fn scan_equals_regex(parts in proptest::collection::vec(
            prop_oneof![
                Just("</think>"), Just("<answer>"), Just("</answer>"), Just("<analysis>"),
                Just("</analysis>"), Just("<confidence>"), Just("</confidence>"), Just(" "),
                Just("\n"), Just("x"), Just("\u{1c}"), Just("<"), Just("0.5"),
            ], 0..14)) {
            let s: String = parts.concat();
            for p in [FormatPattern::Ta, FormatPattern::Tac, FormatPattern::Tabc, FormatPattern::Tbac] {
                prop_assert_eq!(structure_ok(&s, p), reference(&s, p), "{:?} {:?}", p, s);
            }
            let turn2 = regex::Regex::new(
                r"(?s)^[\s\x1c-\x1f]*(?:<analysis>.*?</analysis>[\s\x1c-\x1f]*)?<confidence>.*?</confidence>[\s\x1c-\x1f]*\z",
            ).unwrap();
            prop_assert_eq!(confidence_structure_ok(&s, false), turn2.is_match(&s), "{:?}", s);
        }

        #[test]
        fn brier_in_unit_interval(acc in 0.0f64..=1.0, c in 0.0f64..=1.0) {
            let b = brier_reward(acc, Some(c));
            prop_assert!((0.0..=1.0).contains(&b));
        }

        #[test]
        fn brier_of_any_parsed_confidence_in_unit_interval(acc in prop_oneof![Just(0.0), Just(1.0)], x in ".{0,12}") {
            let s = format!("<confidence>{x}</confidence>");
            let b = brier_reward(acc, parse_confidence_strict(&s));
            prop_assert!((0.0..=1.0).contains(&b));
        }

        #[test]
        fn parsers_never_panic(s in ".{0,40}") {
            let _ = py_float(&s);
            let _ = parse_confidence_lenient(&format!("<confidence>{s}</confidence>"));
            let _ = confidence_format_ok(&s, true);
            let _ = format_ok(&s, FormatPattern::Tbac);
        }
    }
}
