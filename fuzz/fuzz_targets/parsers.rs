//! The answer and confidence parsers and every built-in verifier on arbitrary text. The first
//! byte picks the verifier, the next line is the ground truth, the rest the response. Parsed
//! confidences must be finite numbers in [0, 1] and rewards finite.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rlcr::reward::rlcr::{self as r, FormatPattern};
use rlcr::reward::rows::{self, GroundTruth, Settings};
use rlcr::reward::{math, qa, text, VerifierKind};

const KINDS: [VerifierKind; 5] = [
    VerifierKind::Countdown,
    VerifierKind::Math,
    VerifierKind::Exact,
    VerifierKind::F1,
    VerifierKind::Choice,
];
const PATTERNS: [FormatPattern; 4] = [
    FormatPattern::Ta,
    FormatPattern::Tac,
    FormatPattern::Tabc,
    FormatPattern::Tbac,
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Ok(s) = std::str::from_utf8(rest) else {
        return;
    };
    // confidence parsing
    for c in [r::parse_confidence_strict(s), r::parse_confidence_lenient(s)]
        .into_iter()
        .flatten()
    {
        assert!(c.is_finite() && (0.0..=1.0).contains(&c), "confidence {c}");
    }
    let _ = r::py_float(s);
    for analysis in [false, true] {
        let _ = r::confidence_format_ok(s, analysis);
        let _ = r::confidence_structure_ok(s, analysis);
    }
    for p in PATTERNS {
        let _ = r::format_ok(s, p);
        let terms = r::RlcrTerms::compute(s, p, sel & 1 == 1);
        assert!(terms.total([1.0; 5]).is_finite());
    }
    let _ = text::last_answer(s);
    let _ = text::last_boxed(s);
    // verifiers
    let (gt, response) = s.split_once('\n').unwrap_or(("", s));
    let _ = math::extract_answer(response);
    let _ = math::normalize(response);
    let _ = math::math_equal(response, gt);
    let _ = qa::normalize_answer(response);
    let f1 = qa::f1_score(response, gt);
    assert!((0.0..=1.0).contains(&f1), "f1 {f1}");
    let _ = qa::choice_letter(response);
    let kind = KINDS[sel as usize % KINDS.len()];
    let Ok(truth) = GroundTruth::parse(kind, gt) else {
        return;
    };
    let settings = Settings {
        verifier: Some(kind),
        ..Settings::default()
    };
    let (_, correct, countdown) = rows::verify_builtin(kind, &settings, response, None, &truth);
    assert!(correct.is_finite(), "correct {correct}");
    if let Some(c) = countdown {
        assert!(c == 0.0 || c == 0.1 || c == 1.0, "countdown {c}");
    }
});
