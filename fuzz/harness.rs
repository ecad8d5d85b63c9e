//! The checks behind the fuzz targets, shared with the test suite: each fuzz target calls one of
//! these on libFuzzer's input, and `tests/integration/fuzz_regressions.rs` includes this file
//! (`#[path]`) to run every saved input (`fixtures/fuzz/<target>/`, `fuzz/corpus/<target>/seed-*`)
//! through the same function. Errors are fine; a panic (or a failed assertion) is a bug.
#![allow(dead_code)]

use rlcr::model::gguf::{self, GgufFile};
use rlcr::reward::countdown::{self, Task};
use rlcr::reward::rlcr::{self as r, FormatPattern};
use rlcr::reward::rows::{self, GroundTruth, Settings};
use rlcr::reward::{math, pyexpr, qa, text, VerifierKind};
use rlcr::table::{self, Reader, Validator, PROBE, PROMPTS, TRAJECTORY};

/// The countdown verifier on arbitrary text: the first line is the ground truth (JSON; a fixed
/// task when it does not parse), the rest the model's response. Both evaluators (the default
/// exact-rational one and TinyZero's Python-compatible one) and the bare Python-expression
/// evaluator must return a verdict: scores are 0, 0.1 or 1.
pub fn countdown(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (gt, response) = text.split_once('\n').unwrap_or(("", text));
    let task = match Task::from_json(gt) {
        Ok(t) => t,
        Err(_) => Task::from_json(r#"{"target": 24, "numbers": [3, 8, 4, 2]}"#)
            .expect("the fixed task parses"),
    };
    let levels = |s: f32| s == 0.0 || s == 0.1 || s == 1.0;
    let s = countdown::score_response(response, &task).score();
    assert!(levels(s), "score {s}");
    let s = countdown::tinyzero_compute_score(response, &task).score();
    assert!(levels(s), "tinyzero score {s}");
    let _ = countdown::judge_equation(response, &task);
    let _ = countdown::tinyzero_extract(response);
    let _ = pyexpr::eval(response);
}

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

/// The answer and confidence parsers and every built-in verifier on arbitrary text. The first
/// byte picks the verifier (and the correctness fed to the RLCR terms), the next line is the
/// ground truth, the rest the response. Parsed confidences are finite numbers in [0, 1], F1 is in
/// [0, 1], rewards are finite.
pub fn parsers(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Ok(s) = std::str::from_utf8(rest) else {
        return;
    };
    for c in [
        r::parse_confidence_strict(s),
        r::parse_confidence_lenient(s),
    ]
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
        let total = terms.total([1.0; 5]);
        assert!(total.is_finite(), "RLCR terms {total}");
    }
    let _ = text::last_answer(s);
    let _ = text::last_boxed(s);
    let (gt, response) = s.split_once('\n').unwrap_or(("", s));
    let _ = math::extract_answer(response);
    let _ = math::normalize(response);
    let _ = math::math_equal(response, gt);
    let _ = qa::normalize_answer(response);
    let f1 = qa::f1_score(response, gt);
    assert!((0.0..=1.0).contains(&f1), "f1 {f1}");
    let _ = qa::choice_letter(response);
    let kind = KINDS[(sel >> 1) as usize % KINDS.len()];
    let Ok(truth) = GroundTruth::parse(kind, gt) else {
        return;
    };
    let settings = Settings {
        verifier: Some(kind),
        ..Settings::default()
    };
    let (_, correct, cd) = rows::verify_builtin(kind, &settings, response, None, &truth);
    assert!(correct.is_finite(), "correct {correct}");
    if let Some(c) = cd {
        assert!(c == 0.0 || c == 0.1 || c == 1.0, "countdown {c}");
    }
}

/// The GGUF reader on arbitrary bytes: parse, dequantize every tensor, plan the import
/// (hyper-parameters, tokenizer, tensor names and shapes) and materialize the planned tensors.
pub fn gguf(data: &[u8]) {
    let Ok(g) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for t in g.tensors() {
        if let Ok(bytes) = g.tensor_bytes(t) {
            // bounded by the input: the reader checked that the data lies inside the file
            let _ = gguf::dequantize(t.ggml_type, bytes, t.n_elements);
        }
    }
    let Ok(plan) = gguf::import::Plan::new(&g) else {
        return;
    };
    for t in &plan.tensors {
        let _ = gguf::import::materialize(&g, t);
    }
    let _ = plan.tokenizer.write_tokenizer_json(std::io::sink());
}

/// Parquet validation on arbitrary bytes: write them to a file, open it with `table::Reader`,
/// check the schema and every row with `table::Validator` (trajectory, prompts and probe specs).
pub fn parquet(data: &[u8]) {
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    let path = dir.path().join("t.parquet");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    for spec in [&TRAJECTORY, &PROMPTS, &PROBE] {
        let Ok(reader) = Reader::open(&path) else {
            return;
        };
        let _ = table::check_schema("t.parquet", &reader.schema(), spec, &[]);
        let mut v = Validator::new("t.parquet", spec);
        let mut ok = true;
        for b in reader {
            match b {
                Ok(b) if v.check_batch(&b).is_ok() => {}
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            let _ = v.finish();
        }
    }
}
