//! Answer and confidence spans: from tag positions in the response text to token indices.
//!
//! A span is `{start, end}` over the response's tokens, 0-based, end exclusive
//! (`docs/schemas.md`, "Spans and masks"). It is found on the **text** and mapped to tokens through the per-token end offsets of
//! the incremental decoder ([`super::stop::Detokenizer`]), so it is right for any tokenizer and
//! also when a tag is split over several tokens (`<ans` + `wer>`), or shares a token with
//! neighbouring text.
//!
//! Rules (the two-turn design):
//! - **answer span**: from the start of the first `<think>` to the end of the last `</answer>`
//!   after it. When the context already ends with `<think>` (the chat template or a prefill
//!   opened the think block), the span starts at token 0. `null` when either end is missing.
//! - **confidence span**: from the start of the first `<analysis>` (if one occurs before the
//!   closing tag) else of the first `<confidence>`, to the end of the last `</confidence>`.
//!   `null` when there is no `</confidence>` or no opening tag before it. When the context opened
//!   `<analysis>` or `<confidence>` (a response prefix), the span starts at token 0.
//! - Mapping: the start token is the one whose text contains the first byte of the opening tag;
//!   the end is one past the token containing the last byte of the closing tag. Tokens that add
//!   no text of their own (bytes held back until a later token completes a character) belong to
//!   the token that completes it; tags are ASCII, so this never moves a tag boundary.
use serde::{Deserialize, Serialize};

/// A half-open token range `[start, end)` over the response ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

pub const THINK_OPEN: &str = "<think>";
pub const ANSWER_CLOSE: &str = "</answer>";
pub const ANALYSIS_OPEN: &str = "<analysis>";
pub const CONFIDENCE_OPEN: &str = "<confidence>";
pub const CONFIDENCE_CLOSE: &str = "</confidence>";

/// Token index containing byte `pos` of the text: the first `i` with `ends[i] > pos`.
fn token_at(ends: &[usize], pos: usize) -> Option<usize> {
    let i = ends.partition_point(|&e| e <= pos);
    (i < ends.len()).then_some(i)
}

/// Map the byte range `[start, end)` of the text (non-empty) to the tokens that cover it.
pub fn byte_range_to_tokens(ends: &[usize], start: usize, end: usize) -> Option<Span> {
    if end <= start {
        return None;
    }
    let s = token_at(ends, start)?;
    let e = token_at(ends, end - 1)? + 1;
    Some(Span { start: s, end: e })
}

/// The answer span of a response (`text` with per-token `ends`); `think_prefilled` when the
/// context ends inside an opened `<think>` block.
pub fn answer_span(text: &str, ends: &[usize], think_prefilled: bool) -> Option<Span> {
    tagged_span(text, ends, ANSWER_CLOSE, think_prefilled, |head| {
        head.find(THINK_OPEN)
    })
}

/// The confidence span of a response; `opened` when the context already opened `<analysis>` or
/// `<confidence>` (the span then starts at token 0).
pub fn confidence_span(text: &str, ends: &[usize], opened: bool) -> Option<Span> {
    tagged_span(text, ends, CONFIDENCE_CLOSE, opened, |head| {
        head.find(ANALYSIS_OPEN)
            .or_else(|| head.find(CONFIDENCE_OPEN))
    })
}

/// The span from an opening tag to the end of the last `close` tag of `text`: from token 0 when
/// the context `opened` it, else from the byte `open` finds in the text before `close`.
fn tagged_span(
    text: &str,
    ends: &[usize],
    close: &str,
    opened: bool,
    open: impl Fn(&str) -> Option<usize>,
) -> Option<Span> {
    let at = text.rfind(close)?;
    let close_end = at + close.len();
    if opened {
        // Token 0 even if it adds no text of its own.
        let end = token_at(ends, close_end - 1)? + 1;
        return Some(Span { start: 0, end });
    }
    let start = open(&text[..at])?;
    byte_range_to_tokens(ends, start, close_end)
}

/// Does the rendered context leave the model inside an opened `open` tag: its last `open`
/// comes after the last occurrence of every tag in `closers`? (A template or a response prefix
/// that ends with `<think>`; tags merely mentioned in the instructions are closed again.)
pub fn context_opens(context_text: &str, open: &str, closers: &[&str]) -> bool {
    match context_text.rfind(open) {
        Some(i) => closers
            .iter()
            .all(|c| context_text.rfind(c).is_none_or(|j| j < i)),
        None => false,
    }
}

/// The context opened `<analysis>` or `<confidence>` (a confidence prefix): the confidence span
/// then starts at token 0.
pub fn context_opens_confidence(context_text: &str) -> bool {
    context_opens(context_text, ANALYSIS_OPEN, &["</analysis>"])
        || context_opens(context_text, CONFIDENCE_OPEN, &[CONFIDENCE_CLOSE])
}

#[cfg(test)]
mod tests {
    use super::super::stop::offsets_of;
    use super::super::stop::tests::{toy_decode, toy_encode_bytes};
    use super::*;

    fn spans_of(ids: &[u32]) -> (String, Vec<usize>) {
        offsets_of(ids, None, &toy_decode).unwrap()
    }

    /// `text` encoded a token per byte, then decoded: the ids, the text and each token's end.
    fn byte_tokens(text: &str) -> (Vec<u32>, String, Vec<usize>) {
        let ids = toy_encode_bytes(text);
        let (text, ends) = spans_of(&ids);
        (ids, text, ends)
    }

    fn decode_span(ids: &[u32], s: Span) -> String {
        toy_decode(&ids[s.start..s.end]).unwrap()
    }

    #[test]
    fn answer_span_with_single_token_tags() {
        // ids: "ok " <think> "hm" </think> <answer> "4" </answer> "\n"
        let mut ids = toy_encode_bytes("ok ");
        ids.push(256);
        ids.extend(toy_encode_bytes("hm"));
        ids.push(257);
        ids.push(258);
        ids.extend(toy_encode_bytes("4"));
        ids.push(259);
        ids.extend(toy_encode_bytes("\n"));
        let (text, ends) = spans_of(&ids);
        let s = answer_span(&text, &ends, false).unwrap();
        // tokens: o k ␠ <think>(3) h m </think> <answer> 4 </answer>(9) \n
        assert_eq!(s, Span { start: 3, end: 10 });
        assert_eq!(decode_span(&ids, s), "<think>hm</think><answer>4</answer>");
        // prefilled <think>: starts at token 0
        let s = answer_span(&text, &ends, true).unwrap();
        assert_eq!(s, Span { start: 0, end: 10 });
    }

    #[test]
    fn tags_split_over_tokens_and_sharing_tokens() {
        // "<think>" spelled byte by byte; "</answer>" as "</ans" + "wer>"; the last token also
        // carries trailing text: "wer>" then "!!".
        let mut ids = toy_encode_bytes("xx<think>a");
        ids.push(258); // <answer>
        ids.extend(toy_encode_bytes("1"));
        ids.push(262); // </ans
        ids.push(263); // wer>
        ids.extend(toy_encode_bytes("!!"));
        let (text, ends) = spans_of(&ids);
        assert_eq!(text, "xx<think>a<answer>1</answer>!!");
        let s = answer_span(&text, &ends, false).unwrap();
        // "<" of <think> is token 2; "wer>" is token 13 → end 14
        assert_eq!(s, Span { start: 2, end: 14 });
        let d = decode_span(&ids, s);
        assert!(d.starts_with("<think>") && d.ends_with("</answer>"), "{d}");
    }

    #[test]
    fn tag_inside_a_larger_token_widens_to_whole_tokens() {
        // Toy piece 260 = "<an": "<an" + "swer>" makes "<answer>"; here we test a closing tag
        // whose last byte shares a token with following text: "</answer>" ends inside "r>\n".
        let mut ids = toy_encode_bytes("<think>");
        ids.extend(toy_encode_bytes("</answe"));
        let tail = ids.len();
        ids.push(0x72); // r
        ids.push(0x3E); // >
        let (text, ends) = spans_of(&ids);
        let s = answer_span(&text, &ends, false).unwrap();
        assert_eq!(
            s,
            Span {
                start: 0,
                end: tail + 2
            }
        );
    }

    #[test]
    fn missing_tags_give_null() {
        let (_, text, ends) = byte_tokens("<think>no answer here");
        assert_eq!(answer_span(&text, &ends, false), None);
        let (_, text, ends) = byte_tokens("</answer> before <think>");
        assert_eq!(answer_span(&text, &ends, false), None);
        assert_eq!(confidence_span("", &[], false), None);
        assert_eq!(confidence_span("", &[], true), None);
        assert_eq!(answer_span("", &[], true), None);
    }

    #[test]
    fn last_closing_tag_wins() {
        let (_, text, ends) = byte_tokens("<think>a</think><answer>1</answer><answer>2</answer> x");
        let s = answer_span(&text, &ends, false).unwrap();
        // byte-per-token: span = bytes 0 .. index of end of the second </answer>
        let end = text.rfind("</answer>").unwrap() + 9;
        assert_eq!(s, Span { start: 0, end });
    }

    #[test]
    fn confidence_span_rules() {
        let (_, text, ends) =
            byte_tokens("Sure. <analysis>maybe</analysis> <confidence>0.7</confidence>\n");
        let s = confidence_span(&text, &ends, false).unwrap();
        assert_eq!(
            &text[s.start..s.end],
            "<analysis>maybe</analysis> <confidence>0.7</confidence>"
        );
        // no analysis → from <confidence>
        let (_, text, ends) = byte_tokens("ok <confidence>0.7</confidence>");
        let s = confidence_span(&text, &ends, false).unwrap();
        assert_eq!(&text[s.start..s.end], "<confidence>0.7</confidence>");
        // an <analysis> after the confidence does not count
        let (_, text, ends) = byte_tokens("<confidence>1</confidence><analysis>");
        let s = confidence_span(&text, &ends, false).unwrap();
        assert_eq!(&text[s.start..s.end], "<confidence>1</confidence>");
        // no closing tag → null
        let (_, text, ends) = byte_tokens("<analysis>x</analysis><confidence>0.2");
        assert_eq!(confidence_span(&text, &ends, false), None);
    }

    #[test]
    fn confidence_span_when_the_context_opened_the_tag() {
        // context ended with "<confidence>": the response is "0.8</confidence>\n"
        let (ids, text, ends) = byte_tokens("0.8</confidence>\n");
        let s = confidence_span(&text, &ends, true).unwrap();
        assert_eq!(
            s,
            Span {
                start: 0,
                end: ids.len() - 1
            }
        );
        // without the flag the opening tag is missing → null
        assert_eq!(confidence_span(&text, &ends, false), None);
    }

    #[test]
    fn span_with_multibyte_text_before() {
        // "é" spans two byte-tokens; the first adds no text. Tag starts at token 2.
        let (ids, text, ends) = byte_tokens("é<confidence>1</confidence>");
        let s = confidence_span(&text, &ends, false).unwrap();
        assert_eq!(s.start, 2);
        assert_eq!(s.end, ids.len());
    }

    #[test]
    fn think_prefill_detection() {
        let t = |s: &str| context_opens(s, THINK_OPEN, &["</think>"]);
        assert!(t("<|im_start|>assistant\n<think>\n"));
        assert!(t("Let me solve this step by step.\n<think>"));
        assert!(t(
            "use <think> </think> tags.<|im_start|>assistant\n<think>\nOkay"
        ));
        assert!(!t("<|im_start|>assistant\n"));
        assert!(!t("<think>\n\n</think>\n\n"));
        assert!(!t(
            "Show your work in <think> </think> tags.<|im_start|>assistant\n"
        ));
        assert!(context_opens_confidence(
            "in <analysis> </analysis> tags\nassistant\n<analysis>"
        ));
        assert!(context_opens_confidence("assistant\n<confidence>"));
        assert!(!context_opens_confidence(
            "<analysis> </analysis> <confidence> </confidence> assistant\n"
        ));
    }
}
