//! `rlcr report` end to end: scored tables with hand-checkable figures (the vector of docs/math.md §4
//! as confidence rows), several iterations, a probe table, determinism, and the error paths.
use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Float32Array, Int32Array, Int64Array, ListArray, RecordBatch,
    StringArray,
};
use arrow::datatypes::{Field, Int32Type, Schema};
use rlcr::table::{Meta, Reader, PROBE, TRAJECTORY};
use serde_json::{json, Value};

use crate::Workdir;

/// One row: (sample_type, prompt, answer_idx, format_ok, acc, confidence, conf_reward, reward,
/// response_len, response_text).
pub(crate) type Row = (
    &'static str,
    String,
    i32,
    bool,
    f32,
    Option<f32>,
    Option<f32>,
    f32,
    usize,
    String,
);

/// The worked vector of docs/math.md §4 as 8 answers (one per prompt) with one confidence row each.
#[allow(clippy::needless_range_loop)] // y and c are parallel anchor vectors
/// y = [1,0,1,1,0,1,0,1], c = [0.9,0.8,0.3,0.75,0.1,1.0,0.3,0.0].
pub(crate) fn anchor_rows() -> Vec<Row> {
    let y = [1., 0., 1., 1., 0., 1., 0., 1.];
    let c = [0.9, 0.8, 0.3, 0.75, 0.1, 1.0, 0.3, 0.0];
    let mut rows = Vec::new();
    for j in 0..8 {
        let p = format!("p{j}");
        rows.push((
            "answer",
            p.clone(),
            0,
            true,
            y[j],
            None,
            None,
            y[j],
            10 + j,
            format!("<think>t</think><answer>{j}</answer>"),
        ));
    }
    for j in 0..8 {
        let b = 1.0 - (y[j] - c[j]) * (y[j] - c[j]);
        rows.push((
            "confidence",
            format!("p{j}"),
            0,
            true,
            y[j],
            Some(c[j]),
            Some(b),
            b,
            4,
            format!("<confidence>{}</confidence>", c[j]),
        ));
    }
    rows
}

/// Write rows with the trajectory schema's own column types (the subset report reads).
pub(crate) fn write_scored(path: &Path, rows: &[Row]) {
    let names = [
        "prompt_id",
        "sample_type",
        "answer_idx",
        "sample_id",
        "data_source",
        "ground_truth",
        "response_ids",
        "response_text",
        "answer",
        "format_ok",
        "acc_reward",
        "confidence",
        "conf_reward",
        "reward",
    ];
    let full = TRAJECTORY.arrow_schema();
    let fields: Vec<Field> = names
        .iter()
        .map(|n| full.field_with_name(n).expect("trajectory column").clone())
        .collect();
    let sid: Vec<String> = rows
        .iter()
        .map(|r| match r.0 {
            "answer" => format!("{}/a{}", r.1, r.2),
            _ => format!("{}/a{}/c0", r.1, r.2),
        })
        .collect();
    let ids = ListArray::from_iter_primitive::<Int32Type, _, _>(
        rows.iter()
            .map(|r| Some((0..r.8 as i32).map(Some).collect::<Vec<_>>())),
    );
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.1.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.2))),
        Arc::new(StringArray::from_iter_values(sid)),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|_| "countdown"),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|_| "{\"target\": 4}"),
        )),
        Arc::new(ids),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.9.as_str()),
        )),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| {
            (r.0 == "answer").then(|| {
                r.9.replace("<think>t</think><answer>", "")
                    .replace("</answer>", "")
            })
        }))),
        Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.3)))),
        Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r.4))),
        Arc::new(Float32Array::from_iter(rows.iter().map(|r| r.5))),
        Arc::new(Float32Array::from_iter(rows.iter().map(|r| r.6))),
        Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r.7))),
    ];
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), cols).expect("batch");
    let meta = Meta::new(&TRAJECTORY, "test", json!({}), &[]);
    rlcr::table::write_table(path, schema, &[batch], &meta).expect("write scored table");
}

/// (sample_id, cut_index, cut_fraction, N, correct, verbal, acc)
type ProbeRow<'a> = (&'a str, i32, f32, i32, i32, Option<f32>, f32);

fn write_probe(path: &Path, rows: &[ProbeRow]) {
    let full = PROBE.arrow_schema();
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.0.split('/').next().unwrap_or("")),
        )),
        Arc::new(Int32Array::from_iter_values(rows.iter().map(|_| 0))),
        Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r.2))),
        Arc::new(Int32Array::from_iter_values(
            rows.iter().map(|r| (r.2 * 10.0) as i32),
        )),
        Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.3))),
        Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.4))),
        Arc::new(Float32Array::from_iter_values(
            rows.iter().map(|r| r.4 as f32 / r.3 as f32),
        )),
        Arc::new(Float32Array::from_iter(rows.iter().map(|r| r.5))),
        Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r.6))),
    ];
    assert_eq!(
        cols.len(),
        full.fields().len(),
        "probe schema changed: update this test"
    );
    let batch = RecordBatch::try_new(full.clone(), cols).expect("probe batch");
    let meta = Meta::new(&PROBE, "test", json!({}), &[]);
    rlcr::table::write_table(path, full, &[batch], &meta).expect("write probe table");
}

fn metrics(wd: &Workdir, dir: &str) -> Value {
    let text =
        std::fs::read_to_string(wd.path(&format!("{dir}/metrics.json"))).expect("metrics.json");
    serde_json::from_str(&text).expect("metrics.json parses")
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn report_reproduces_anchor_figures_end_to_end() {
    let wd = Workdir::new();
    write_scored(&wd.path("scored.parquet"), &anchor_rows());
    wd.run(&[
        "report",
        "--input",
        "scored.parquet",
        "--ece-rule",
        "rlcr",
        "-o",
        "out",
    ]);
    for f in [
        "metrics.json",
        "calibration.parquet",
        "reliability.svg",
        "reliability.png",
        "histograms.svg",
        "histograms.png",
        "report.md",
    ] {
        assert!(wd.path(&format!("out/{f}")).is_file(), "{f} missing");
    }
    assert!(
        !wd.path("out/iterations.svg").exists(),
        "one input: no iteration chart"
    );
    let png = std::fs::read(wd.path("out/reliability.png")).expect("png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");

    let m = metrics(&wd, "out");
    let o = &m["reports"][0]["overall"];
    // docs/math.md §4: ECE 0.331250 (RLCR bins), Brier 0.287813, AUROC 0.633333.
    assert!((num(&o["ece"]) - 0.331250).abs() < 5e-7, "{o}");
    assert!((num(&o["ece_rlcr"]) - 0.331250).abs() < 5e-7);
    assert!((num(&o["brier"]) - 0.287813).abs() < 5e-7);
    assert!((num(&o["auroc"]) - 0.633333).abs() < 5e-7);
    // By hand: accuracy 5/8, mean confidence 4.15/8, ECE floor rule = 0.33125 (both 0.3s move
    // together to bin 3).
    assert!((num(&o["accuracy"]) - 0.625).abs() < 1e-12);
    assert!((num(&o["mean_confidence"]) - 4.15 / 8.0).abs() < 1e-12);
    assert!((num(&o["ece_floor"]) - 0.33125).abs() < 1e-12);
    assert_eq!(num(&o["parse_rate_strict"]), 1.0);
    assert_eq!(num(&o["format_rate_answers"]), 1.0);
    // per-turn statistics: 8 prompts with one answer each → no G_a group has signal; same for G_c.
    assert_eq!(o["answer_turn"]["groups"].as_u64(), Some(8));
    assert_eq!(o["answer_turn"]["groups_with_signal"].as_u64(), Some(0));
    assert!((num(&o["answer_turn"]["length_mean"]) - 13.5).abs() < 1e-12);
    assert_eq!(num(&o["confidence_turn"]["length_mean"]), 4.0);
    assert_eq!(m["reports"][0]["options"]["ece_rule"], "rlcr");

    // calibration.parquet: one row per bin, counts [1,1,2,0,0,0,0,1,1,2] under the RLCR rule.
    let batches = Reader::open(&wd.path("out/calibration.parquet"))
        .expect("open calibration")
        .read_all()
        .expect("read calibration");
    let b = &batches[0];
    assert_eq!(b.num_rows(), 10);
    let counts = b
        .column_by_name("count")
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .expect("count column");
    assert_eq!(counts.values().to_vec(), vec![1, 1, 2, 0, 0, 0, 0, 1, 1, 2]);
    let md = Reader::open(&wd.path("out/calibration.parquet")).expect("open");
    assert_eq!(
        md.metadata().get("rlcr.stage").map(String::as_str),
        Some("report")
    );

    let page = std::fs::read_to_string(wd.path("out/report.md")).expect("report.md");
    assert!(page.contains("![Reliability diagram](reliability.png)"));
    assert!(page.contains("### Most confident and wrong"));
    // The most confident wrong answer is p1 (c = 0.8, y = 0), shown with its answer.
    assert!(
        page.contains("`p1/a0/c0` (confidence) · confidence 0.800"),
        "{page}"
    );
    let svg = std::fs::read_to_string(wd.path("out/reliability.svg")).expect("svg");
    assert!(svg.contains("ECE = 0.331"), "ECE in the title");
}

#[test]
fn report_is_deterministic() {
    let wd = Workdir::new();
    write_scored(&wd.path("scored.parquet"), &anchor_rows());
    wd.run(&["report", "--input", "scored.parquet", "-o", "a"]);
    wd.run(&["report", "--input", "scored.parquet", "-o", "b"]);
    for f in [
        "metrics.json",
        "reliability.svg",
        "histograms.svg",
        "report.md",
        "reliability.png",
    ] {
        let x = std::fs::read(wd.path(&format!("a/{f}"))).expect("a");
        let y = std::fs::read(wd.path(&format!("b/{f}"))).expect("b");
        assert!(x == y, "{f} differs between two runs");
    }
}

#[test]
fn report_iterations_and_probe() {
    let wd = Workdir::new();
    write_scored(&wd.path("it0.parquet"), &anchor_rows());
    // Iteration 1: every confidence becomes 1.0 → ECE = Brier = 1 − accuracy = 0.375, AUROC 0.5.
    let it1: Vec<Row> = anchor_rows()
        .into_iter()
        .map(|mut r| {
            if r.0 == "confidence" {
                r.5 = Some(1.0);
            }
            r
        })
        .collect();
    write_scored(&wd.path("it1.parquet"), &it1);
    write_probe(
        &wd.path("probe.parquet"),
        &[
            ("p0/a0", 0, 0.0, 50, 25, Some(0.9), 1.0),
            ("p0/a0", 1, 0.5, 50, 37, Some(0.9), 1.0),
            ("p0/a0", 2, 1.0, 50, 50, Some(0.9), 1.0),
            ("p1/a0", 0, 0.0, 50, 0, Some(0.8), 0.0),
            ("p1/a0", 1, 0.5, 50, 0, Some(0.8), 0.0),
            ("p1/a0", 2, 1.0, 50, 25, Some(0.8), 0.0),
        ],
    );
    wd.run(&[
        "report",
        "--input",
        "it0.parquet",
        "--input",
        "it1.parquet",
        "--probe",
        "probe.parquet",
        "-o",
        "rep",
    ]);
    for f in [
        "iterations.svg",
        "iterations.png",
        "probe_curve.svg",
        "probe_curve.png",
        "probe_vs_verbal.png",
    ] {
        assert!(wd.path(&format!("rep/{f}")).is_file(), "{f} missing");
    }
    let m = metrics(&wd, "rep");
    let reports = m["reports"].as_array().expect("reports");
    assert_eq!(reports.len(), 2);
    let o1 = &reports[1]["overall"];
    assert!((num(&o1["ece"]) - 0.375).abs() < 1e-12);
    assert!((num(&o1["brier"]) - 0.375).abs() < 1e-12);
    assert_eq!(num(&o1["auroc"]), 0.5);
    let p = &m["probe"];
    assert_eq!(p["rollouts"].as_u64(), Some(2));
    let cut1 = &p["cuts"][1];
    assert_eq!(
        (cut1["correct"].as_u64(), cut1["samples"].as_u64()),
        (Some(37), Some(100))
    );
    assert!((num(&cut1["mean_probe"]) - 0.37).abs() < 1e-12);
    // Binomial s.e. (docs/math.md §4.5): 37/50 → 0.0620, 0/50 → 0; their mean 0.0310.
    assert!((num(&cut1["mean_binomial_se"]) - 0.031).abs() < 5e-5);
    let cal = Reader::open(&wd.path("rep/calibration.parquet"))
        .expect("open")
        .read_all()
        .expect("read");
    assert_eq!(
        cal.iter().map(|b| b.num_rows()).sum::<usize>(),
        20,
        "10 bins × 2 inputs"
    );
    // Without --iterations the inputs are iterations 1, 2, …
    let its: Vec<i32> = cal
        .iter()
        .flat_map(|b| {
            let c = b.column_by_name("iteration").expect("iteration");
            let c = c
                .as_any()
                .downcast_ref::<arrow::array::Int32Array>()
                .expect("int32");
            c.values().to_vec()
        })
        .collect();
    assert_eq!(its, [[1; 10], [2; 10]].concat());
    assert_eq!(m["reports"][1]["iteration"], 2);
    let page = std::fs::read_to_string(wd.path("rep/report.md")).expect("md");
    assert!(page.contains("## Across iterations") && page.contains("## Faithfulness probe"));
}

#[test]
fn report_errors() {
    let wd = Workdir::new();
    // Missing input: usage error, nothing written.
    wd.refuse(
        &["report", "--input", "nope.parquet", "-o", "out"],
        2,
        "nope.parquet",
        "out",
    );
    // A bad sample_type: exit 1, message names the file, row and column.
    let mut rows = anchor_rows();
    rows[3].0 = "turn3";
    write_scored(&wd.path("bad.parquet"), &rows);
    let err = wd.fail(&["report", "--input", "bad.parquet", "-o", "out"], 1);
    assert!(
        err.contains("bad.parquet") && err.contains("row 3") && err.contains("sample_type"),
        "{err}"
    );
    // An inconsistent probe table: exit 1, names the row.
    write_scored(&wd.path("ok.parquet"), &anchor_rows());
    write_probe(
        &wd.path("probe.parquet"),
        &[("p0/a0", 0, 0.0, 50, 51, None, 1.0)],
    );
    let err = wd.fail(
        &[
            "report",
            "--input",
            "ok.parquet",
            "--probe",
            "probe.parquet",
            "-o",
            "out",
        ],
        1,
    );
    assert!(
        err.contains("probe row 0") && err.contains("num_correct"),
        "{err}"
    );
    // The output folder may not be an input folder.
    std::fs::create_dir_all(wd.path("parts")).expect("mkdir");
    std::fs::copy(wd.path("ok.parquet"), wd.path("parts/part-0.parquet")).expect("copy");
    let err = wd.fail(&["report", "--input", "parts", "-o", "parts"], 2);
    assert!(err.contains("input folder"), "{err}");
    // --iterations: one per input, increasing, not for arms (usage errors, nothing written).
    for (its, inputs, needle) in [
        (
            "0,5,10",
            ["ok.parquet", "ok.parquet"],
            "3 numbers for 2 inputs",
        ),
        ("5,5", ["ok.parquet", "ok.parquet"], "must increase"),
        ("0,5", ["a=ok.parquet", "b=ok.parquet"], "arms"),
    ] {
        let err = wd.fail(
            &[
                "report",
                "--input",
                inputs[0],
                "--input",
                inputs[1],
                "--iterations",
                its,
                "-o",
                "out",
            ],
            2,
        );
        assert!(
            err.contains("--iterations") && err.contains(needle),
            "{err}"
        );
        assert!(!wd.path("out").exists());
    }
    // Zero bins is a usage error.
    wd.fail(
        &[
            "report",
            "--input",
            "ok.parquet",
            "--bins",
            "0",
            "-o",
            "out",
        ],
        2,
    );
}

/// The real pipeline's tables: prepare → generate-answers → generate-confidence → score → report
/// on the tiny fixture model. The model writes noise, so the figures are mostly "format failed";
/// the point is that report reads exactly what score writes and counts it right.
#[test]
fn report_reads_the_pipeline_tables() {
    let wd = Workdir::new();
    let model = crate::fixtures().join("tiny-qwen2");
    let model = model.to_str().expect("utf-8 path");
    wd.run(&[
        "--seed",
        "3",
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        "3",
        "-o",
        "prompts.parquet",
    ]);
    let mut answers = vec!["--seed".to_string(), "3".to_string()];
    answers.extend(crate::support::pipeline::answers_args(
        model,
        "prompts.parquet",
        "answers.parquet",
        2,
        12,
        &[],
    ));
    crate::support::pipeline::run(&wd, &answers);
    wd.run(&[
        "--seed",
        "3",
        "generate-confidence",
        "--model",
        model,
        "--input",
        "answers.parquet",
        "-o",
        "traj.parquet",
        "--num-confidences",
        "2",
        "--max-new-tokens",
        "8",
    ]);
    wd.run(&["score", "--input", "traj.parquet", "-o", "scored.parquet"]);
    wd.run(&["report", "--input", "scored.parquet", "-o", "rep"]);
    let m = metrics(&wd, "rep");
    let o = &m["reports"][0]["overall"];
    assert_eq!(
        (o["answers"].as_u64(), o["confidences"].as_u64()),
        (Some(6), Some(12))
    );
    assert_eq!(
        o["answer_turn"]["groups"].as_u64(),
        Some(3),
        "G_a groups = prompts"
    );
    assert_eq!(
        o["confidence_turn"]["groups"].as_u64(),
        Some(6),
        "G_c groups = answers"
    );
    assert_eq!(o["calibration_rows"].as_u64(), Some(12));
    // Independent count from the scored table: strict parse rate = non-null confidences / 12.
    let scored = Reader::open(&wd.path("scored.parquet"))
        .expect("open")
        .read_all()
        .expect("read");
    let (mut parsed, mut lens) = (0usize, 0usize);
    for b in &scored {
        let conf = b.column_by_name("confidence").expect("confidence column");
        let st = b.column_by_name("sample_type").expect("sample_type");
        let st = st.as_any().downcast_ref::<StringArray>().expect("utf8");
        let ids = b.column_by_name("response_ids").expect("ids");
        let ids = ids.as_any().downcast_ref::<ListArray>().expect("list");
        for i in 0..b.num_rows() {
            if st.value(i) == "confidence" {
                parsed += conf.is_valid(i) as usize;
            } else {
                lens += ids.value_length(i) as usize;
            }
        }
    }
    assert!((num(&o["parse_rate_strict"]) - parsed as f64 / 12.0).abs() < 1e-12);
    assert!((num(&o["answer_turn"]["length_mean"]) - lens as f64 / 6.0).abs() < 1e-12);
    assert!(
        o["diagnostics"].is_null(),
        "diagnostics live beside overall"
    );
    assert_eq!(
        m["reports"][0]["diagnostics"]["label_mismatches"].as_u64(),
        Some(0)
    );
    assert_eq!(
        m["reports"][0]["diagnostics"]["confidences_without_answer"].as_u64(),
        Some(0)
    );
    assert!(wd.path("rep/reliability.png").is_file());
}

/// Labelled inputs compare arms: one row per arm with every figure ± its standard error (the worked
/// vector of docs/math.md §4, RLCR rule: ECE 0.331250 ± 0.125623 by the delta method over its bins, Brier 0.287813 ±
/// 0.133578, AUROC 0.633333 ± 0.210004 by Hanley–McNeil, accuracy 5/8 ± sqrt(0.625·0.375/8) =
/// 0.171), the diagrams side by side; half-labelled or repeated labels are usage errors.
#[test]
fn report_compares_labelled_inputs() {
    let wd = Workdir::new();
    write_scored(&wd.path("scored.parquet"), &anchor_rows());
    wd.run(&[
        "report",
        "--input",
        "rlvr=scored.parquet",
        "--input",
        "rlcr=scored.parquet",
        "--ece-rule",
        "rlcr",
        "-o",
        "cmp",
    ]);
    let md = std::fs::read_to_string(wd.path("cmp/comparison.md")).unwrap();
    for arm in ["rlvr", "rlcr"] {
        let row = format!(
            "| all | {arm} | 8 | 0.625 ± 0.171 | 0.331 ± 0.126 | 0.288 ± 0.134 | 0.633 ± 0.210 |"
        );
        assert!(md.contains(&row), "{row} not in\n{md}");
    }
    for f in [
        "comparison.png",
        "comparison.svg",
        "report.md",
        "metrics.json",
    ] {
        assert!(wd.path(&format!("cmp/{f}")).is_file(), "{f}");
    }
    let page = std::fs::read_to_string(wd.path("cmp/report.md")).unwrap();
    assert!(page.contains("## Comparison"), "{page}");
    let err = wd.fail(
        &[
            "report",
            "--input",
            "a=scored.parquet",
            "--input",
            "scored.parquet",
            "-o",
            "x",
        ],
        2,
    );
    assert!(err.contains("label every input"), "{err}");
    wd.refuse(
        &[
            "report",
            "--input",
            "a=scored.parquet",
            "--input",
            "b=scored.parquet",
            "--input",
            "a=scored.parquet",
            "-o",
            "x",
        ],
        2,
        "labels given: \"a\" × 2, \"b\" × 1",
        "x",
    );
}

/// An arm given once per run (e.g. per seed): the per-input table names each run (`rlcr #2`),
/// and a table across the runs gives each figure's mean over the runs ± the standard error of
/// that mean and each arm's difference to the first run by run. Two identical runs of the
/// worked vector above: the anchor's figures, a spread of 0 and differences of 0; metrics.json
/// holds the same per (bucket, arm).
#[test]
fn report_gives_an_arms_figures_across_its_runs() {
    let wd = Workdir::new();
    write_scored(&wd.path("scored.parquet"), &anchor_rows());
    let mut args = vec!["report".to_string()];
    for _ in 0..2 {
        for arm in ["rlvr", "rlcr"] {
            args.push("--input".into());
            args.push(format!("{arm}=scored.parquet"));
        }
    }
    args.extend(["--ece-rule", "rlcr", "-o", "cmp"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    wd.run(&args);
    let md = std::fs::read_to_string(wd.path("cmp/comparison.md")).unwrap();
    assert!(md.contains("Arms: `rlvr`, `rlcr`."), "{md}");
    assert!(md.contains("| all | rlcr #2 | 8 | 0.625 ± 0.171 |"), "{md}");
    assert!(md.contains("### Across runs"), "{md}");
    assert!(
        md.contains(
            "| all | rlvr | 2 | 0.625 ± 0.000 | 0.331 ± 0.000 | 0.288 ± 0.000 | 0.633 ± 0.000 |"
        ),
        "{md}"
    );
    assert!(
        md.contains("| +0.000 ± 0.000 | +0.000 ± 0.000 | +0.000 ± 0.000 | +0.000 ± 0.000 |"),
        "{md}"
    );
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(wd.path("cmp/metrics.json")).unwrap())
            .unwrap();
    assert_eq!(m["reports"].as_array().map(Vec::len), Some(4));
    let runs = m["across_runs"].as_array().expect("across_runs");
    assert_eq!(runs.len(), 2, "one bucket, two arms");
    assert_eq!(runs[1]["arm"], "rlcr");
    assert_eq!(runs[1]["runs"], 2);
    assert!((runs[1]["ece"]["mean"].as_f64().unwrap() - 0.33125).abs() < 1e-9);
    assert_eq!(runs[1]["minus_first"]["first"], "rlvr");
    assert_eq!(
        runs[1]["minus_first"]["accuracy"]["mean"].as_f64(),
        Some(0.0)
    );
}
