//! `rlcr import`: rollouts made by verl, TRL and OpenAI-compatible servers (fixtures/import/, in the
//! formats the tools write, made by `scripts/import_fixtures.py`) become trajectory tables that
//! `score` and `report` turn into calibration figures; the figures equal hand calculations over
//! the fixtures' known answers and confidences.
use serde_json::Value;

use super::support::pipeline::tiny_qwen2 as tiny;
use super::support::table::{f32s, lists_f32, lists_i32, read, strs};
use super::{fixtures, Workdir};

fn metrics(w: &Workdir, dir: &str) -> Value {
    crate::support::json::read(w.path(&format!("{dir}/metrics.json")))
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn fixture(name: &str) -> String {
    fixtures().join("import").join(name).display().to_string()
}

/// Brier and AUROC by hand: mean (c − y)², and the share of (correct, wrong) pairs ordered by
/// confidence (ties count one half).
fn brier_auroc(rows: &[(f64, f64)]) -> (f64, f64) {
    let brier = rows.iter().map(|(c, y)| (c - y).powi(2)).sum::<f64>() / rows.len() as f64;
    let (mut pairs, mut won) = (0f64, 0f64);
    for (cp, yp) in rows {
        for (cn, yn) in rows {
            if *yp == 1.0 && *yn == 0.0 {
                pairs += 1.0;
                won += if cp > cn {
                    1.0
                } else if cp == cn {
                    0.5
                } else {
                    0.0
                };
            }
        }
    }
    (brier, won / pairs)
}

/// A verl rollout dump (two steps of `{step}.jsonl`, RLCR's one-completion format) through
/// `import`, `score` and `report`: rlcr's accuracy equals verl's own score, the confidences are
/// read from the answer rows, and Brier and AUROC equal the hand calculation.
#[test]
fn verl_rollout_dump_goes_through_import_score_and_report() {
    let w = Workdir::new();
    w.run(&[
        "import",
        "--format",
        "verl",
        "--input",
        &fixture("verl"),
        "--model",
        &tiny(),
        "--data-source",
        "countdown",
        "-o",
        "imported.parquet",
    ]);
    let b = read(&w.path("imported.parquet"));
    assert_eq!(b.num_rows(), 8);
    assert!(strs(&b, "sample_type").iter().all(|t| t == "answer"));
    // Steps and prompts in order: step 1's two prompts, then step 2's.
    assert_eq!(
        strs(&b, "sample_id"),
        [
            "s1-p000000/a0",
            "s1-p000000/a1",
            "s1-p000001/a0",
            "s1-p000001/a1",
            "s2-p000002/a0",
            "s2-p000002/a1",
            "s2-p000003/a0",
            "s2-p000003/a1"
        ]
    );
    assert!(
        b.column_by_name("response_logprobs").is_none(),
        "verl logs no log-probs"
    );
    // The spans cover what they should: the answer from token 0 (the prompt opened <think>) to
    // </answer>, the confidence from <analysis> to </confidence>; none on the truncated rollout.
    let tok = rlcr::model::Tokenizer::load(&fixtures().join("tiny-qwen2"), None).unwrap();
    let ids = lists_i32(&b, "response_ids");
    let text = strs(&b, "response_text");
    let aspans = rlcr::table::cols::spans(&b, "t", "answer_span").unwrap();
    let cspans = rlcr::table::cols::spans(&b, "t", "confidence_span").unwrap();
    let decode = |row: usize, (s, e): (i32, i32)| -> String {
        let v: Vec<u32> = ids[row][s as usize..e as usize]
            .iter()
            .map(|&x| x as u32)
            .collect();
        tok.decode(&v, false).unwrap()
    };
    let a0 = aspans[0].unwrap();
    assert_eq!(a0.0, 0);
    assert!(
        decode(0, a0).ends_with("<answer>3 + 5</answer>"),
        "{}",
        decode(0, a0)
    );
    let c0 = cspans[0].unwrap();
    assert_eq!(
        decode(0, c0),
        "<analysis>Both numbers used once, the sum is 8.</analysis> <confidence>0.9</confidence>"
    );
    assert_eq!(aspans[7], None);
    assert_eq!(cspans[7], None);
    assert!(text[7].ends_with("3 is used twice"));
    // The context is the logged input's tokens.
    let ctx = lists_i32(&b, "context_ids");
    let input: Value = serde_json::from_str(
        std::fs::read_to_string(fixtures().join("import/verl/1.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let want: Vec<i32> = tok
        .encode(input["input"].as_str().unwrap(), false)
        .unwrap()
        .into_iter()
        .map(|x| x as i32)
        .collect();
    assert_eq!(ctx[0], want);

    w.run(&[
        "score",
        "--input",
        "imported.parquet",
        "-o",
        "scored.parquet",
        "--answer-format",
        "tabc",
    ]);
    let s = read(&w.path("scored.parquet"));
    let acc: Vec<f64> = f32s(&s, "acc_reward")
        .iter()
        .map(|x| x.unwrap() as f64)
        .collect();
    // verl's own countdown score (TinyZero's: 1 correct, 0.1 well-formed but wrong, 0 else).
    let mut verl = Vec::new();
    for step in [1, 2] {
        let text =
            std::fs::read_to_string(fixtures().join(format!("import/verl/{step}.jsonl"))).unwrap();
        for l in text.lines() {
            let v: Value = serde_json::from_str(l).unwrap();
            verl.push(if num(&v["score"]) == 1.0 { 1.0 } else { 0.0 });
        }
    }
    assert_eq!(acc, verl);
    let conf = f32s(&s, "confidence");
    let conf: Vec<f64> = conf.iter().map(|c| c.map_or(0.0, |c| c as f64)).collect();
    let want_conf = [0.9, 0.6, 0.7, 0.8, 0.95, 0.85, 0.6, 0.0];
    for (a, b) in conf.iter().zip(want_conf) {
        assert!((a - b).abs() < 1e-6, "{conf:?}");
    }

    w.run(&["report", "--input", "scored.parquet", "-o", "report"]);
    for f in [
        "metrics.json",
        "reliability.svg",
        "reliability.png",
        "report.md",
    ] {
        assert!(w.path(&format!("report/{f}")).is_file(), "{f}");
    }
    let o = &metrics(&w, "report")["reports"][0]["overall"];
    let rows: Vec<(f64, f64)> = want_conf
        .iter()
        .copied()
        .zip(verl.iter().copied())
        .collect();
    let (brier, auroc) = brier_auroc(&rows);
    // By hand: Brier 1.285 / 8, AUROC 12.5 / 15.
    assert!((brier - 1.285 / 8.0).abs() < 1e-12 && (auroc - 12.5 / 15.0).abs() < 1e-12);
    assert!((num(&o["accuracy"]) - 0.625).abs() < 1e-9, "{o}");
    assert!((num(&o["brier"]) - brier).abs() < 1e-6, "{o}");
    assert!((num(&o["auroc"]) - auroc).abs() < 1e-6, "{o}");
    assert!(o["ece"].is_number(), "{o}");

    // probe reads the imported spans: every answer with a closed </think> (7 of 8) is cut.
    w.run(&[
        "probe",
        "--model",
        &tiny(),
        "--input",
        "scored.parquet",
        "-o",
        "probe.parquet",
        "--cuts",
        "2",
        "--samples",
        "2",
        "--max-new-tokens",
        "8",
    ]);
    let p = read(&w.path("probe.parquet"));
    assert_eq!(p.num_rows(), 7 * 2);
}

/// OpenAI chat completions with log-probs, two turns (answers, then a confidence request per
/// answer), through `import`, `score` and `report`: answer and confidence rows linked, the
/// server's log-probs kept on the tokenizer's tokens, the failed request skipped, and the
/// figures equal the hand calculation.
#[test]
fn openai_chat_file_goes_through_import_score_and_report() {
    let w = Workdir::new();
    let o = w.output(&[
        "import",
        "--format",
        "openai",
        "--input",
        &fixture("openai-chat.jsonl"),
        "--model",
        &tiny(),
        "-o",
        "imported.parquet",
    ]);
    let log = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{log}");
    assert!(log.contains("1 failed requests skipped"), "{log}");
    assert!(log.contains("response_logprobs written"), "{log}");
    let b = read(&w.path("imported.parquet"));
    assert_eq!(
        strs(&b, "sample_id"),
        [
            "p000000/a0",
            "p000000/a0/c0",
            "p000000/a1",
            "p000000/a1/c0",
            "p000001/a0",
            "p000001/a0/c0",
            "p000001/a1",
            "p000001/a1/c0"
        ]
    );
    assert_eq!(strs(&b, "data_source")[0], "arith");
    assert_eq!(strs(&b, "ground_truth")[0], "\"12\"");
    // Log-probs: the server's, one per response token, in order.
    let text = std::fs::read_to_string(fixtures().join("import/openai-chat.jsonl")).unwrap();
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let want: Vec<f32> = first["response"]["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| num(&t["logprob"]) as f32)
        .collect();
    let lps = lists_f32(&b, "response_logprobs");
    assert_eq!(lps[0], want);
    assert_eq!(lps[0].len(), lists_i32(&b, "response_ids")[0].len());
    // The confidence row's context is the rendered two-turn conversation, answer included.
    let ctx = lists_i32(&b, "context_ids");
    let tok = rlcr::model::Tokenizer::load(&fixtures().join("tiny-qwen2"), None).unwrap();
    let c1: Vec<u32> = ctx[1].iter().map(|&x| x as u32).collect();
    let rendered = tok.decode(&c1, false).unwrap();
    assert!(
        rendered.contains("<|im_start|>assistant\n<think>7 plus 5 is 12.</think> <answer>12</answer><|im_end|>\n<|im_start|>user\nHow confident"),
        "{rendered}"
    );
    assert!(rendered.ends_with("<|im_start|>assistant\n"), "{rendered}");

    w.run(&[
        "score",
        "--input",
        "imported.parquet",
        "-o",
        "scored.parquet",
    ]);
    w.run(&["report", "--input", "scored.parquet", "-o", "report"]);
    let o = &metrics(&w, "report")["reports"][0]["overall"];
    // Answers 12 ✓, 13 ✗, 27 ✓, 27 ✓; confidences 0.9, 0.4, 0.8, 0.7.
    let rows = [(0.9, 1.0), (0.4, 0.0), (0.8, 1.0), (0.7, 1.0)];
    let (brier, auroc) = brier_auroc(&rows);
    assert!((brier - 0.075).abs() < 1e-12 && auroc == 1.0);
    assert!((num(&o["accuracy"]) - 0.75).abs() < 1e-9, "{o}");
    assert!((num(&o["brier"]) - brier).abs() < 1e-6, "{o}");
    assert!((num(&o["auroc"]) - auroc).abs() < 1e-6, "{o}");
}

/// TRL's logged table carries no labels: importing it names the file, the row and the flag; the
/// same rows with a label column import, their context the rendered prompt's tokens exactly.
#[test]
fn trl_completions_need_a_label_column() {
    let w = Workdir::new();
    let table = fixture("trl/completions_4_f3b1c9e2a7d05e61.table.json");
    let e = w.fail(
        &[
            "import",
            "--format",
            "trl",
            "--input",
            &table,
            "--model",
            &tiny(),
            "-o",
            "t.parquet",
        ],
        1,
    );
    assert!(
        e.contains("completions_4_f3b1c9e2a7d05e61.table.json, row 0"),
        "{e}"
    );
    assert!(e.contains("--label-key"), "{e}");
    assert!(!w.path("t.parquet").exists());
    w.run(&[
        "import",
        "--format",
        "trl",
        "--input",
        &fixture("trl/completions-with-labels.jsonl"),
        "--model",
        &tiny(),
        "--data-source",
        "countdown",
        "-o",
        "t.parquet",
    ]);
    let b = read(&w.path("t.parquet"));
    assert_eq!(b.num_rows(), 4);
    assert_eq!(strs(&b, "prompt_id")[0], "s4-p000000");
    let tok = rlcr::model::Tokenizer::load(&fixtures().join("tiny-qwen2"), None).unwrap();
    let text = std::fs::read_to_string(fixtures().join("import/trl/completions-with-labels.jsonl"))
        .unwrap();
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let prompt = first["prompt"].as_str().unwrap();
    let want: Vec<i32> = tok
        .encode(prompt, false)
        .unwrap()
        .into_iter()
        .map(|x| x as i32)
        .collect();
    assert_eq!(lists_i32(&b, "context_ids")[0], want);
    assert!(want.len() > 20);
    w.run(&[
        "score",
        "--input",
        "t.parquet",
        "-o",
        "s.parquet",
        "--answer-format",
        "tabc",
    ]);
    let s = read(&w.path("s.parquet"));
    let acc: Vec<f32> = f32s(&s, "acc_reward")
        .into_iter()
        .map(Option::unwrap)
        .collect();
    // TRL's own accuracy_reward column.
    let theirs: Vec<f32> = text
        .lines()
        .map(|l| num(&serde_json::from_str::<Value>(l).unwrap()["accuracy_reward"]) as f32)
        .collect();
    assert_eq!(acc, theirs);
    // The Parquet file TRL writes beside the table (labels joined as a struct column) gives the
    // same table.
    w.run(&[
        "import",
        "--format",
        "trl",
        "--input",
        &fixture("trl/completions_00004.parquet"),
        "--model",
        &tiny(),
        "--data-source",
        "countdown",
        "-o",
        "pq.parquet",
    ]);
    let q = read(&w.path("pq.parquet"));
    for col in ["sample_id", "ground_truth", "response_text"] {
        assert_eq!(strs(&q, col), strs(&b, col), "{col}");
    }
    for col in ["context_ids", "response_ids"] {
        assert_eq!(lists_i32(&q, col), lists_i32(&b, col), "{col}");
    }
    assert_eq!(
        strs(&q, "ground_truth")[0],
        r#"{"numbers":[3,5],"target":8}"#
    );
}

/// A malformed line is an error naming the file and the line; nothing is written.
#[test]
fn malformed_import_lines_name_file_and_line() {
    let w = Workdir::new();
    let good = std::fs::read_to_string(fixtures().join("import/verl/1.jsonl")).unwrap();
    let mut lines: Vec<&str> = good.lines().collect();
    lines.insert(2, "{\"input\": \"q\", \"output\": ");
    w.write("dump/5.jsonl", lines.join("\n"));
    w.refuse(
        &[
            "import",
            "--format",
            "verl",
            "--input",
            "dump",
            "--model",
            &tiny(),
            "-o",
            "x.parquet",
        ],
        1,
        "dump/5.jsonl, line 3: not a JSON object",
        "x.parquet",
    );
    // A chat line whose response lacks `choices`.
    w.write(
        "bad.jsonl",
        "{\"request\": {\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}, \"response\": {\"id\": \"x\"}, \"ground_truth\": \"1\"}\n",
    );
    w.refuse(
        &[
            "import",
            "--format",
            "openai",
            "--input",
            "bad.jsonl",
            "--model",
            &tiny(),
            "-o",
            "x.parquet",
        ],
        1,
        "bad.jsonl, line 1: the response has no `choices` list",
        "x.parquet",
    );
}
