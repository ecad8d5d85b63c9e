//! The countdown verifier on arbitrary text: the first line is the ground truth (JSON; a fixed
//! task when it does not parse), the rest the model's response. Both evaluators (the default exact
//! rational one and TinyZero's Python-compatible one) and the bare Python-expression evaluator
//! must return a verdict, never panic, overflow or hang.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rlcr::reward::countdown::{self, Task};
use rlcr::reward::pyexpr;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (gt, response) = text.split_once('\n').unwrap_or(("", text));
    let task = Task::from_json(gt)
        .unwrap_or_else(|_| Task::from_json(r#"{"target": 24, "numbers": [3, 8, 4, 2]}"#).unwrap());
    let out = countdown::score_response(response, &task);
    let s = out.score();
    assert!(s == 0.0 || s == 0.1 || s == 1.0, "score {s}");
    let tz = countdown::tinyzero_compute_score(response, &task);
    let s = tz.score();
    assert!(s == 0.0 || s == 0.1 || s == 1.0, "tinyzero score {s}");
    let _ = countdown::judge_equation(response, &task);
    let _ = countdown::tinyzero_extract(response);
    let _ = pyexpr::eval(response);
});
