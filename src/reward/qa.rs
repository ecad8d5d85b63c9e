//! Question-answering verifiers: SQuAD exact match (RLCR's HotpotQA check), SQuAD token F1, and
//! multiple-choice letters.
//!
//! - [`normalize_answer`]: SQuAD's normalisation, in its order: lower-case, drop ASCII punctuation
//!   (Python's `string.punctuation`), replace the whole words `a`/`an`/`the` by a space, collapse
//!   whitespace. A "word" is a maximal run of alphanumeric characters or `_` (Python's `\w`; Rust's
//!   Unicode alphanumerics differ from Python's only on a few combining marks).
//! - [`exact_match`], [`f1_score`]: against one gold string; [`best_exact`], [`best_f1`] take the
//!   best over several golds, as SQuAD does.
//! - [`choice_letter`]: the option letter (A–J) an answer names: `B`, `(B)`, `B)`, `B.`, `B: text`,
//!   `\boxed{B}`, `Answer: B`, `The answer is (B)`; a lower-case letter only when it is all there
//!   is (`b`, `(b)`), so that the article "a" is not read as option A.
//!
//! Gold answers come from the ground-truth JSON through [`gold_strings`]: a string, a number, a
//! list of them (any may match), or an object with `answers`/`answer`/`ground_truth`/`target`/
//! `label`; text that is not JSON is taken as one literal answer.
use super::text::{last_boxed, py_isspace, py_strip};

/// ASCII punctuation, Python's `string.punctuation`.
fn is_py_punct(c: char) -> bool {
    c.is_ascii_punctuation()
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// SQuAD `normalize_answer`.
pub fn normalize_answer(s: &str) -> String {
    let lowered: String = s
        .to_lowercase()
        .chars()
        .filter(|&c| !is_py_punct(c))
        .collect();
    // remove the articles as whole words
    let mut out = String::with_capacity(lowered.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if matches!(word.as_str(), "a" | "an" | "the") {
            out.push(' ');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in lowered.chars() {
        if is_word(c) {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out.split(py_isspace)
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// SQuAD exact match after normalisation.
pub fn exact_match(prediction: &str, gold: &str) -> bool {
    normalize_answer(prediction) == normalize_answer(gold)
}

/// SQuAD token F1 after normalisation (0 when no token is shared or either side is empty).
pub fn f1_score(prediction: &str, gold: &str) -> f64 {
    let p = normalize_answer(prediction);
    let g = normalize_answer(gold);
    let pt: Vec<&str> = p.split(' ').filter(|t| !t.is_empty()).collect();
    let gt: Vec<&str> = g.split(' ').filter(|t| !t.is_empty()).collect();
    if pt.is_empty() || gt.is_empty() {
        return 0.0;
    }
    let mut counts: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for t in &gt {
        *counts.entry(t).or_default() += 1;
    }
    let mut same = 0i64;
    for t in &pt {
        if let Some(c) = counts.get_mut(t) {
            if *c > 0 {
                *c -= 1;
                same += 1;
            }
        }
    }
    if same == 0 {
        return 0.0;
    }
    let precision = same as f64 / pt.len() as f64;
    let recall = same as f64 / gt.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// Exact match against any gold.
pub fn best_exact(prediction: &str, golds: &[String]) -> bool {
    golds.iter().any(|g| exact_match(prediction, g))
}

/// Best F1 over the golds (0 without golds).
pub fn best_f1(prediction: &str, golds: &[String]) -> f64 {
    golds
        .iter()
        .map(|g| f1_score(prediction, g))
        .fold(0.0, f64::max)
}

/// Gold answers from a parsed ground-truth JSON value.
pub fn gold_strings_from_value(v: &serde_json::Value) -> Vec<String> {
    use serde_json::Value;
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Number(n) => vec![n.to_string()],
        Value::Bool(b) => vec![b.to_string()],
        Value::Array(items) => items.iter().flat_map(gold_strings_from_value).collect(),
        Value::Object(map) => {
            for key in ["answers", "answer", "ground_truth", "target", "label"] {
                if let Some(x) = map.get(key) {
                    return gold_strings_from_value(x);
                }
            }
            Vec::new()
        }
        Value::Null => Vec::new(),
    }
}

/// Gold answers from the ground-truth column's text (JSON, or a literal answer).
pub fn gold_strings(text: &str) -> Vec<String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) => gold_strings_from_value(&v),
        Err(_) => vec![text.to_string()],
    }
}

/// Strip a leading phrase, case-insensitively.
fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// The option letter an answer names (see the module docs), upper-case.
pub fn choice_letter(answer: &str) -> Option<char> {
    let mut t = py_strip(answer);
    if let Some(b) = last_boxed(t) {
        t = py_strip(b);
    }
    t = py_strip(t.trim_matches('$'));
    if let Some(inner) = t.strip_prefix("\\text{").and_then(|x| x.strip_suffix('}')) {
        t = py_strip(inner);
    }
    for p in [
        "the answer is",
        "the correct answer is",
        "answer:",
        "answer is",
        "answer",
        "option",
        "choice",
    ] {
        if let Some(rest) = strip_prefix_ci(t, p) {
            t = py_strip(rest.trim_start_matches(':'));
            break;
        }
    }
    let mut chars = t.chars();
    let mut first = chars.next()?;
    let bracketed = first == '(' || first == '[';
    if bracketed {
        first = chars.next()?;
    }
    let rest: &str = chars.as_str();
    let rest = if bracketed {
        rest.strip_prefix([')', ']'])?
    } else {
        rest
    };
    let next = rest.chars().next();
    if ('A'..='J').contains(&first) {
        return match next {
            None => Some(first),
            Some(c) if !is_word(c) => Some(first),
            _ => None,
        };
    }
    if ('a'..='j').contains(&first) {
        let tail = rest.trim_start_matches([')', '.', ':']);
        if py_strip(tail).is_empty() {
            return Some(first.to_ascii_uppercase());
        }
    }
    None
}

/// Multiple choice: the answer's letter equals a gold letter (golds that are not letters are
/// compared by exact match instead).
pub fn choice_correct(answer: &str, golds: &[String]) -> bool {
    let letter = choice_letter(answer);
    golds.iter().any(|g| match choice_letter(g) {
        Some(gl) => letter == Some(gl),
        None => exact_match(answer, g),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figures from SQuAD v1.1's evaluation script semantics (hand-checked).
    #[test]
    fn squad_normalisation() {
        assert_eq!(normalize_answer("The Paris."), "paris");
        assert_eq!(normalize_answer("  An  apple, a day!  "), "apple day");
        assert_eq!(normalize_answer("theatre"), "theatre");
        assert_eq!(normalize_answer("Thé End"), "thé end");
        assert_eq!(normalize_answer("a-b"), "ab"); // punctuation goes before articles are found
        assert!(exact_match("the Eiffel Tower", "Eiffel tower."));
        assert!(!exact_match("Lyon", "Paris"));
    }

    #[test]
    fn token_f1() {
        // prediction "the cat sat" vs gold "cat sat down": tokens [cat, sat] vs [cat, sat, down]
        // p = 2/2, r = 2/3, f1 = 2 * 1 * 2/3 / (5/3) = 0.8
        assert!((f1_score("the cat sat", "cat sat down") - 0.8).abs() < 1e-12);
        assert_eq!(f1_score("dog", "cat"), 0.0);
        assert_eq!(f1_score("", "cat"), 0.0);
        // repeated tokens count once per occurrence: "a b b" vs "b c": common = {b:1}
        // p = 1/2 ("a" dropped as an article), r = 1/2, f1 = 0.5
        assert!((f1_score("a b b", "b c") - 0.5).abs() < 1e-12);
        let golds = vec!["cat".to_string(), "the cat sat".to_string()];
        assert_eq!(best_f1("cat sat", &golds), 1.0);
    }

    #[test]
    fn golds() {
        assert_eq!(gold_strings("\"Paris\""), vec!["Paris"]);
        assert_eq!(gold_strings("[\"Paris\", \"Paris, France\"]").len(), 2);
        assert_eq!(gold_strings("{\"answer\": 42}"), vec!["42"]);
        assert_eq!(gold_strings("Paris"), vec!["Paris"]);
    }

    #[test]
    fn choice_letters() {
        for (s, want) in [
            ("B", Some('B')),
            ("(B)", Some('B')),
            ("B)", Some('B')),
            ("B. Paris", Some('B')),
            ("B: Paris", Some('B')),
            ("\\boxed{C}", Some('C')),
            ("$\\boxed{\\text{D}}$", Some('D')),
            ("Answer: A", Some('A')),
            ("The answer is (D)", Some('D')),
            ("b", Some('B')),
            ("(c)", Some('C')),
            ("a dog", None),
            ("Berlin", None),
            ("K", None),
            ("", None),
        ] {
            assert_eq!(choice_letter(s), want, "{s:?}");
        }
        assert!(choice_correct("(B)", &["B".to_string()]));
        assert!(!choice_correct("A", &["B".to_string()]));
    }
}
