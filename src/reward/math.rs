//! Math verifier for numeric answers (RLCR's math runs use `math_verify`; this is the numeric
//! subset, without a CAS).
//!
//! An answer is read from the response as: the last `<answer>…</answer>` (and inside it the last
//! `\boxed{…}` if there is one), else the last `\boxed{…}` anywhere. Then it is normalised: math
//! delimiters (`$`, `\(`, `\[`), `\left`/`\right`, LaTeX spacing (`\,` `\;` `\!` `~`),
//! `\text{…}`/`\mathrm{…}`/`\mbox{…}` wrappers, `^\circ`, `\%`/`%`, `\$`, a trailing full stop and
//! a left-hand side (`x = 5` → `5`) are dropped, `\dfrac`/`\tfrac` read as `\frac`, trailing unit
//! words after a number are dropped (`5 cm` → `5`).
//!
//! Numbers: integers, decimals, scientific notation (`1e3`, `1.5\times10^{3}`), thousands
//! separators (`1,234,567`, `1{,}234`, only with valid groups of three), fractions `a/b`,
//! `\frac{a}{b}`, `\frac12`, signs. Values are exact rationals (`0.5 == 1/2 == \frac{2}{4}`);
//! when an `i128` would overflow, doubles compared with a relative tolerance of 1e-9.
//! Non-numeric answers (`\sqrt{2}`, `x+1`) are compared as normalised strings without spaces.
use super::rational::Rational;
use super::text::{closing_brace, last_answer, last_boxed, py_strip};

/// Equal by value: exactly for two exact values, else within a relative 1e-9.
pub fn values_equal(a: Rational, b: Rational) -> bool {
    match (a, b) {
        (Rational::Exact(..), Rational::Exact(..)) => a == b,
        _ => {
            let (x, y) = (a.to_f64(), b.to_f64());
            x.is_finite() && y.is_finite() && (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
        }
    }
}

/// Remove `\cmd{X}` wrappers, keeping X (for `\text`, `\mathrm`, `\mbox`, `\textbf`, …).
fn unwrap_commands(s: &str, cmds: &[&str]) -> String {
    let mut out = s.to_string();
    for cmd in cmds {
        let pat = format!("\\{cmd}{{");
        while let Some(i) = out.find(&pat) {
            let inner_start = i + pat.len();
            let mut depth = 1;
            let mut end = None;
            for (k, c) in out[inner_start..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(inner_start + k);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let Some(end) = end else { break };
            out = format!("{}{}{}", &out[..i], &out[inner_start..end], &out[end + 1..]);
        }
    }
    out
}

/// The normalised answer text (see the module docs).
pub fn normalize(s: &str) -> String {
    let mut t = py_strip(s).to_string();
    if let Some(b) = last_boxed(&t) {
        t = b.to_string();
    }
    t = unwrap_commands(
        &t,
        &["text", "textbf", "mathrm", "mathbf", "mbox", "operatorname"],
    );
    for (from, to) in [
        ("\\left", ""),
        ("\\right", ""),
        ("\\displaystyle", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\:", ""),
        ("\\ ", ""),
        ("~", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\circ", ""),
        ("\\%", ""),
        ("%", ""),
        ("\\$", ""),
        ("\\(", ""),
        ("\\)", ""),
        ("\\[", ""),
        ("\\]", ""),
        ("$", ""),
        ("{,}", ","),
    ] {
        if t.contains(from) {
            t = t.replace(from, to);
        }
    }
    if let Some(i) = t.rfind('=') {
        t = t[i + 1..].to_string();
    }
    let mut t = py_strip(&t).trim_end_matches('.').to_string();
    // trailing unit words after a number: "5 cm", "12 apples"
    if let Some(i) = t.rfind(|c: char| c.is_ascii_digit() || c == '}') {
        let tail = &t[i + 1..];
        if tail.starts_with(' ') && tail.trim().chars().all(|c| c.is_alphabetic() || c == ' ') {
            t.truncate(i + 1);
        }
    }
    t.chars().filter(|c| !c.is_whitespace()).collect()
}

/// A plain decimal number: sign, digits with optional valid thousands groups, fraction,
/// exponent (`e`, or `\times10^{k}` / `\cdot10^{k}`).
fn parse_decimal(s: &str) -> Option<Rational> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    // split off a LaTeX power of ten
    let (mant, exp10): (&str, i32) = {
        let mut found = None;
        for sep in ["\\times10^", "\\cdot10^", "×10^", "*10^"] {
            if let Some(i) = body.find(sep) {
                let e = body[i + sep.len()..].trim_matches(|c| c == '{' || c == '}');
                found = Some((&body[..i], e.parse::<i32>().ok()?));
                break;
            }
        }
        match found {
            Some(f) => f,
            None => match body.find(['e', 'E']) {
                Some(i) => (&body[..i], body[i + 1..].parse::<i32>().ok()?),
                None => (body, 0),
            },
        }
    };
    let (int_part, frac_part) = match mant.split_once('.') {
        Some((a, b)) => (a, b),
        None => (mant, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let int_digits: String = if int_part.contains(',') {
        let groups: Vec<&str> = int_part.split(',').collect();
        let ok = !groups[0].is_empty()
            && groups[0].len() <= 3
            && groups[1..].iter().all(|g| g.len() == 3)
            && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_digit()));
        if !ok {
            return None;
        }
        groups.concat()
    } else {
        int_part.to_string()
    };
    if !int_digits.bytes().all(|b| b.is_ascii_digit())
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{int_digits}{frac_part}");
    let scale = exp10 - frac_part.len() as i32;
    let trimmed = digits.trim_start_matches('0');
    let exact = (|| {
        let n: i128 = if trimmed.is_empty() {
            0
        } else {
            trimmed.parse().ok()?
        };
        if scale >= 0 {
            let p = 10i128.checked_pow(scale as u32)?;
            Rational::new(n.checked_mul(p)?, 1)
        } else {
            let p = 10i128.checked_pow((-scale) as u32)?;
            Rational::new(n, p)
        }
    })();
    let v = match exact {
        Some(v) => v,
        None => {
            let f: f64 = format!(
                "{}e{}",
                if digits.is_empty() { "0" } else { &digits },
                scale
            )
            .parse()
            .ok()?;
            Rational::Approx(f)
        }
    };
    Some(if neg { -v } else { v })
}

/// `{X}` or a single character at the start of `s`: (content, rest).
fn brace_arg(s: &str) -> Option<(&str, &str)> {
    if let Some(inner) = s.strip_prefix('{') {
        let k = closing_brace(inner)?;
        Some((&inner[..k], &inner[k + 1..]))
    } else {
        let c = s.chars().next()?;
        Some((&s[..c.len_utf8()], &s[c.len_utf8()..]))
    }
}

/// The value of a normalised answer, if it is a number.
pub fn parse_value(t: &str) -> Option<Rational> {
    if t.is_empty() {
        return None;
    }
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) if b.starts_with("\\frac") || b.starts_with('(') => (true, b),
        _ => (false, t),
    };
    let v = if let Some(rest) = body.strip_prefix("\\frac") {
        let (a, rest) = brace_arg(rest)?;
        let (b, rest) = brace_arg(rest)?;
        if !rest.is_empty() {
            return None;
        }
        parse_value(a)?.checked_div(parse_value(b)?)?
    } else if let Some(inner) = body.strip_prefix('(').and_then(|x| x.strip_suffix(')')) {
        parse_value(inner)?
    } else if let Some((a, b)) = body.split_once('/') {
        parse_decimal(a)?.checked_div(parse_decimal(b)?)?
    } else {
        parse_decimal(body)?
    };
    Some(if neg { -v } else { v })
}

/// The answer a math response gives: last `<answer>` (its last `\boxed{}` if any), else the last
/// `\boxed{}` in the response.
pub fn extract_answer(response: &str) -> Option<&str> {
    match last_answer(response) {
        Some(a) => Some(last_boxed(a).map(py_strip).unwrap_or(a)),
        None => last_boxed(response).map(py_strip),
    }
}

/// Is `pred` (an extracted answer) equal to `gold`: by value when both are numbers, else as
/// normalised strings.
pub fn math_equal(pred: &str, gold: &str) -> bool {
    let (p, g) = (normalize(pred), normalize(gold));
    if p.is_empty() {
        return false;
    }
    match (parse_value(&p), parse_value(&g)) {
        (Some(a), Some(b)) => values_equal(a, b),
        (None, None) => p == g,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_by_value() {
        for (p, g) in [
            ("42", "42"),
            ("42.0", "42"),
            ("0.5", "\\frac{1}{2}"),
            ("\\dfrac{2}{4}", "0.5"),
            ("\\frac12", "1/2"),
            ("-\\frac{3}{4}", "-0.75"),
            ("1,234,567", "1234567"),
            ("1{,}234", "1234"),
            ("$x = 5$", "5"),
            ("\\boxed{17}", "17"),
            ("5 cm", "5"),
            ("\\text{5 apples}", "5"),
            ("45^\\circ", "45"),
            ("50\\%", "50"),
            ("\\$12.50", "12.5"),
            ("1e3", "1000"),
            ("1.5\\times10^{3}", "1500"),
            ("\\left(3\\right)", "3"),
            ("7.", "7"),
            ("\\sqrt{2}", "\\sqrt{ 2 }"),
            ("-3", "-3.000"),
        ] {
            assert!(math_equal(p, g), "{p:?} should equal {g:?}");
        }
        for (p, g) in [
            ("0.33", "\\frac{1}{3}"),
            ("1,23", "123"),
            ("41", "42"),
            ("", "0"),
            ("\\sqrt{2}", "1.4142135623730951"),
            ("2", "-2"),
            ("2x", "2"),
            ("1/0", "1"),
        ] {
            assert!(!math_equal(p, g), "{p:?} should differ from {g:?}");
        }
    }

    #[test]
    fn extraction() {
        assert_eq!(
            extract_answer("<think>..</think><answer>The answer is \\boxed{12}</answer>"),
            Some("12")
        );
        assert_eq!(extract_answer("so \\boxed{3} and \\boxed{4}"), Some("4"));
        assert_eq!(extract_answer("<answer> 7 </answer>"), Some("7"));
        assert_eq!(extract_answer("nothing"), None);
    }

    #[test]
    fn big_values_fall_back_to_doubles() {
        assert!(math_equal(
            "1e40",
            "10000000000000000000000000000000000000000"
        ));
        assert!(!math_equal("1e40", "1.0000001e40"));
    }
}
