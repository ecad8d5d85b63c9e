//! The faithfulness probe (`docs/math.md` §4.5), pure half: where the thinking of an answer
//! lies, where it is cut, the forced prefix each cut is continued from, and the binomial standard
//! error of a probe confidence. The `rlcr probe` engine ([`stage`]) runs the model over these.
//!
//! Design decisions:
//! - Everything is in **token** space over the answer's sampled `response_ids` (never a
//!   re-tokenisation of its text): the thinking is located on the incremental detokenisation of
//!   those ids (per-token end offsets), and a cut is a token boundary.
//! - The thinking is the tokens strictly between the token completing `<think>` (or the response
//!   start, when the context already opened `<think>`) and the token holding the first byte of
//!   the first `</think>` after it. A response without a closed `</think>` has no thinking to cut.
//! - Cut `f` keeps `round(f · L)` thinking tokens (L = thinking length, `f64::round`, half away
//!   from zero), so 0 keeps none and 1 keeps all of them.
//! - The forced text is [`FORCED`] = `</think><answer>` encoded on its own (no special tokens
//!   added), appended after the kept ids: the same tags the answer format uses.
pub mod stage;

use anyhow::{bail, Context, Result};

use crate::model::Tokenizer;
use crate::sample::spans::context_opens;

/// The text forced after a cut: close the thinking and open the answer.
pub const FORCED: &str = "</think><answer>";
/// What a verifier sees before a continuation (the opened answer tag).
pub const ANSWER_OPEN: &str = "<answer>";
/// The tag a continuation stops at.
pub const ANSWER_CLOSE: &str = "</answer>";
const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// Token index containing byte `pos` of the text: the first `i` with `ends[i] > pos`.
fn token_at(ends: &[usize], pos: usize) -> Option<usize> {
    let i = ends.partition_point(|&e| e <= pos);
    (i < ends.len()).then_some(i)
}

/// Does the rendered context leave the model inside an opened `<think>`?
pub fn context_opens_think(context_text: &str) -> bool {
    context_opens(context_text, THINK_OPEN, &[THINK_CLOSE])
}

/// The thinking of a response as the token range `[start, end)` over its ids, from the response
/// text and the per-token end offsets `ends`; `opened` when the context ends inside `<think>`.
/// `None` when there is no `</think>` (after the opening `<think>`, if the response opens it).
pub fn think_range(text: &str, ends: &[usize], opened: bool) -> Option<(usize, usize)> {
    let (start, search_from) = if opened {
        (0, 0)
    } else {
        let open = text.find(THINK_OPEN)?;
        let open_end = open + THINK_OPEN.len();
        // The token completing `<think>`; thinking starts after it.
        (token_at(ends, open_end - 1)? + 1, open_end)
    };
    let close = search_from + text[search_from..].find(THINK_CLOSE)?;
    let end = token_at(ends, close)?;
    Some((start, end.max(start)))
}

/// Evenly spaced cut fractions for `--cuts k`: `i / (k − 1)` for `i = 0..k` (0 and 1 included);
/// `k = 1` is the whole thinking (`[1.0]`).
pub fn even_fractions(k: usize) -> Result<Vec<f64>> {
    match k {
        0 => bail!("--cuts must be at least 1"),
        1 => Ok(vec![1.0]),
        _ => Ok((0..k).map(|i| i as f64 / (k - 1) as f64).collect()),
    }
}

/// Check `--cut-fractions`: each finite, in [0, 1], strictly increasing.
pub fn check_fractions(f: &[f64]) -> Result<()> {
    if f.is_empty() {
        bail!("--cut-fractions is empty");
    }
    for (i, &x) in f.iter().enumerate() {
        if !(x.is_finite() && (0.0..=1.0).contains(&x)) {
            bail!("--cut-fractions: {x} is not a number in [0, 1]");
        }
        if i > 0 && x <= f[i - 1] {
            bail!(
                "--cut-fractions must be strictly increasing ({} then {x})",
                f[i - 1]
            );
        }
    }
    Ok(())
}

/// The response token offset of cut `fraction` of the thinking `[start, end)`:
/// `start + round(fraction · (end − start))`.
pub fn cut_token(start: usize, end: usize, fraction: f64) -> usize {
    let len = end.saturating_sub(start);
    let keep = (fraction.clamp(0.0, 1.0) * len as f64).round() as usize;
    start + keep.min(len)
}

/// The ids of [`FORCED`] under `tok` (no special tokens added).
pub fn forced_ids(tok: &Tokenizer) -> Result<Vec<u32>> {
    let ids = tok
        .encode(FORCED, false)
        .with_context(|| format!("encoding the forced text {FORCED:?}"))?;
    if ids.is_empty() {
        bail!("the tokenizer encodes the forced text {FORCED:?} to no tokens");
    }
    Ok(ids)
}

/// The prefix a cut is continued from: `context + response[..cut] + forced`.
pub fn build_prefix(context: &[u32], response: &[u32], cut: usize, forced: &[u32]) -> Vec<u32> {
    let cut = cut.min(response.len());
    let mut p = Vec::with_capacity(context.len() + cut + forced.len());
    p.extend_from_slice(context);
    p.extend_from_slice(&response[..cut]);
    p.extend_from_slice(forced);
    p
}

/// Binomial standard error of a probe confidence, `sqrt(p(1 − p)/N)` with `p = correct/N`
/// (`docs/math.md` §4.5: 37/50 → 0.0620, 25/50 → 0.0707, 0/50 and 50/50 → 0). `N = 0` gives NaN.
pub fn standard_error(correct: usize, n: usize) -> f64 {
    if n == 0 {
        return f64::NAN;
    }
    let p = correct as f64 / n as f64;
    (p * (1.0 - p) / n as f64).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tiny_tokenizer() -> Tokenizer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-qwen2");
        Tokenizer::load(&dir, None).unwrap()
    }

    #[test]
    fn standard_errors_match_worked_example() {
        // docs/math.md §4.5, hand values: sqrt(0.74·0.26/50) = 0.062032…, sqrt(0.25/50) = 0.070711…
        assert!((standard_error(37, 50) - 0.0620).abs() < 5e-5);
        assert!((standard_error(25, 50) - 0.0707).abs() < 5e-5);
        assert_eq!(standard_error(0, 50), 0.0);
        assert_eq!(standard_error(50, 50), 0.0);
        assert!(standard_error(0, 0).is_nan());
    }

    #[test]
    fn fractions() {
        assert_eq!(even_fractions(5).unwrap(), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        assert_eq!(even_fractions(1).unwrap(), vec![1.0]);
        assert!(even_fractions(0).is_err());
        assert!(check_fractions(&[0.0, 0.5, 1.0]).is_ok());
        assert!(check_fractions(&[0.5, 0.5]).is_err());
        assert!(check_fractions(&[1.5]).is_err());
        assert!(check_fractions(&[f64::NAN]).is_err());
        assert!(check_fractions(&[]).is_err());
    }

    #[test]
    fn cut_tokens_round() {
        // thinking = tokens [2, 12): L = 10
        assert_eq!(cut_token(2, 12, 0.0), 2);
        assert_eq!(cut_token(2, 12, 0.25), 5); // 2.5 rounds away from zero → 3
        assert_eq!(cut_token(2, 12, 0.5), 7);
        assert_eq!(cut_token(2, 12, 1.0), 12);
        assert_eq!(cut_token(3, 3, 0.7), 3);
    }

    #[test]
    fn think_ranges() {
        // tokens: "a", "<think>", "x", "y", "</think>", "<answer>"
        let text = "a<think>xy</think><answer>";
        let ends = [1, 8, 9, 10, 18, 26];
        assert_eq!(think_range(text, &ends, false), Some((2, 4)));
        // context opened <think>: thinking starts at token 0
        let text2 = "xy</think>";
        assert_eq!(think_range(text2, &[1, 2, 10], true), Some((0, 2)));
        // no close, or a close before the open
        assert_eq!(think_range("a<think>xy", &[1, 8, 9, 10], false), None);
        assert_eq!(think_range("</think><think>x", &[8, 15, 16], false), None);
        // a token straddling the close tag: the thinking ends before it
        assert_eq!(
            think_range("<think>ab</think>", &[7, 8, 12, 17], false),
            Some((1, 2))
        );
        assert!(context_opens_think("<|im_start|>assistant\n<think>"));
        assert!(!context_opens_think(
            "use <think> </think> tags<|im_start|>assistant\n"
        ));
    }

    /// The forced prefix, token by token, against the tokenizer's own encoding of the forced text.
    #[test]
    fn forced_prefix_token_by_token() {
        let tok = tiny_tokenizer();
        let forced = forced_ids(&tok).unwrap();
        let want = tok.encode("</think><answer>", false).unwrap();
        assert_eq!(forced, want);
        // both tags are single special tokens in the fixture tokenizer
        assert_eq!(
            forced,
            vec![
                tok.token_id("</think>").unwrap(),
                tok.token_id("<answer>").unwrap()
            ]
        );
        let context = [11u32, 12, 13];
        let response = [21u32, 22, 23, 24, 25];
        let p = build_prefix(&context, &response, 2, &forced);
        assert_eq!(p.len(), 3 + 2 + forced.len());
        assert_eq!(&p[..3], &context);
        assert_eq!(&p[3..5], &response[..2]);
        assert_eq!(&p[5..], forced.as_slice());
        assert_eq!(tok.decode(&p[5..], false).unwrap(), FORCED);
        // a cut past the end keeps the whole response
        assert_eq!(build_prefix(&[], &response, 9, &[]), response.to_vec());
    }
}
