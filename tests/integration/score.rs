//! `rlcr score` end to end: tables of a few hundred rows built here, the real binary, every score
//! column checked against values computed in the test from the rules (not from the library).
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Float32Array, Int32Array, ListArray, RecordBatch, StringArray,
    StructArray,
};
use arrow::datatypes::{DataType, Field, Fields, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use rlcr::table::cols::{build_list_f32 as list_f32, build_list_i32 as list_i32};

use crate::{rlcr, rlcr_ok as ok};

/// One row of a test trajectory table.
#[derive(Clone, Debug)]
struct Row {
    prompt_id: String,
    sample_type: &'static str,
    answer_idx: i32,
    confidence_idx: Option<i32>,
    data_source: String,
    ground_truth: String,
    messages: String,
    response: String,
    tokens: Vec<i32>,
}

impl Row {
    fn sample_id(&self) -> String {
        match self.confidence_idx {
            None => format!("{}/a{}", self.prompt_id, self.answer_idx),
            Some(h) => format!("{}/a{}/c{}", self.prompt_id, self.answer_idx, h),
        }
    }
}

/// `answer_span`: the whole response on answers, null on confidences.
fn spans(rows: &[Row]) -> ArrayRef {
    let fields = Fields::from(vec![
        Field::new("start", DataType::Int32, false),
        Field::new("end", DataType::Int32, false),
    ]);
    let n = rows.len();
    Arc::new(StructArray::new(
        fields,
        vec![
            Arc::new(Int32Array::from(vec![0; n])),
            Arc::new(Int32Array::from(
                rows.iter()
                    .map(|r| r.tokens.len() as i32)
                    .collect::<Vec<_>>(),
            )),
        ],
        Some(
            rows.iter()
                .map(|r| r.sample_type == "answer")
                .collect::<Vec<_>>()
                .into(),
        ),
    ))
}

/// Write `rows` as a trajectory table with row groups of `rg` rows, plus optional extra columns.
fn write_table(path: &Path, rows: &[Row], rg: usize, extra: Vec<(&str, ArrayRef)>) {
    write_table_with(path, rows, rg, extra, true)
}

/// [`write_table`], choosing whether the Parquet writer may use dictionary encoding.
fn write_table_with(
    path: &Path,
    rows: &[Row],
    rg: usize,
    extra: Vec<(&str, ArrayRef)>,
    dictionary: bool,
) {
    let s = |f: &dyn Fn(&Row) -> String| -> ArrayRef {
        Arc::new(StringArray::from(rows.iter().map(f).collect::<Vec<_>>()))
    };
    let mut cols: Vec<(&str, ArrayRef)> = vec![
        ("prompt_id", s(&|r| r.prompt_id.clone())),
        ("sample_type", s(&|r| r.sample_type.to_string())),
        (
            "answer_idx",
            Arc::new(Int32Array::from(
                rows.iter().map(|r| r.answer_idx).collect::<Vec<_>>(),
            )),
        ),
        (
            "confidence_idx",
            Arc::new(Int32Array::from(
                rows.iter().map(|r| r.confidence_idx).collect::<Vec<_>>(),
            )),
        ),
        ("sample_id", s(&|r| r.sample_id())),
        ("data_source", s(&|r| r.data_source.clone())),
        ("ground_truth", s(&|r| r.ground_truth.clone())),
        ("messages", s(&|r| r.messages.clone())),
        (
            "context_ids",
            list_i32(
                rows.iter()
                    .map(|r| vec![1, 2, r.answer_idx])
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "response_ids",
            list_i32(rows.iter().map(|r| r.tokens.clone()).collect::<Vec<_>>()),
        ),
        ("response_text", s(&|r| r.response.clone())),
        (
            "response_logprobs",
            list_f32(
                rows.iter()
                    .map(|r| {
                        r.tokens
                            .iter()
                            .map(|&t| -(t as f32) / 100.0)
                            .collect::<Vec<f32>>()
                    })
                    .collect::<Vec<_>>(),
            ),
        ),
        ("finish_reason", s(&|_| "stop".to_string())),
        ("answer_span", spans(rows)),
    ];
    cols.extend(extra);
    let schema = Arc::new(Schema::new(
        cols.iter()
            .map(|(name, a)| {
                Field::new(
                    *name,
                    a.data_type().clone(),
                    a.null_count() > 0 || *name == "confidence_idx",
                )
            })
            .collect::<Vec<_>>(),
    ));
    let batch =
        RecordBatch::try_new(schema.clone(), cols.into_iter().map(|(_, a)| a).collect()).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(rg))
        .set_dictionary_enabled(dictionary)
        .build();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn read_all(path: &Path) -> RecordBatch {
    let r = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<RecordBatch> = r.map(|b| b.unwrap()).collect();
    arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
}

fn kv(path: &Path) -> HashMap<String, String> {
    let r = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
    r.metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kvs| {
            kvs.iter()
                .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

fn col<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> &'a T {
    b.column_by_name(name)
        .unwrap_or_else(|| panic!("column {name} missing"))
        .as_any()
        .downcast_ref::<T>()
        .unwrap()
}

/// Countdown prompts × 4 answers × 2 confidences, in generate-confidence order. The expected
/// values are decided here by construction.
struct Expect {
    format_ok: bool,
    acc: f32,
    confidence: Option<f32>,
    conf_reward: Option<f32>,
    reward: f32,
    answer: Option<String>,
}

fn countdown_table(prompts: usize) -> (Vec<Row>, Vec<Expect>) {
    let mut rows = Vec::new();
    let mut exp = Vec::new();
    for j in 0..prompts {
        // numbers a, b, c with target a*b+c
        let (a, b, c) = (2 + j as i64 % 7, 3 + j as i64 % 5, 1 + j as i64 % 11);
        let target = a * b + c;
        let gt = format!(r#"{{"target": {target}, "numbers": [{a}, {b}, {c}]}}"#);
        let pid = format!("cd{j:03}");
        let msgs = format!(
            r#"[{{"role":"user","content":"Using the numbers [{a}, {b}, {c}], create an equation that equals {target}."}}]"#
        );
        let mut accs = Vec::new();
        for k in 0..4 {
            // k = 0: correct; 1: wrong value; 2: correct but no </think> (format fails, gated);
            // 3: no answer at all
            let (response, fmt, acc, answer) = match k {
                0 => (
                    format!("I try.</think>\n<answer>{a} × {b} + {c}</answer>"),
                    true,
                    1.0,
                    Some(format!("{a} × {b} + {c}")),
                ),
                1 => (
                    format!("hmm</think> <answer>{a}*{b}-{c}</answer>"),
                    true,
                    if a * b - c == target { 1.0 } else { 0.0 },
                    Some(format!("{a}*{b}-{c}")),
                ),
                2 => (
                    format!("<answer>({a}*{b})+{c}</answer>"),
                    false,
                    0.0,
                    Some(format!("({a}*{b})+{c}")),
                ),
                _ => ("I give up</think>".to_string(), false, 0.0, None),
            };
            accs.push(acc);
            rows.push(Row {
                prompt_id: pid.clone(),
                sample_type: "answer",
                answer_idx: k,
                confidence_idx: None,
                data_source: "countdown".into(),
                ground_truth: gt.clone(),
                messages: msgs.clone(),
                response,
                tokens: vec![10 + k, 11, 12],
            });
            exp.push(Expect {
                format_ok: fmt,
                acc,
                confidence: None,
                conf_reward: None,
                reward: acc,
                answer,
            });
        }
        for k in 0..4 {
            for h in 0..2 {
                // h = 0: a good confidence; h = 1: alternately NaN, 80%, text after the tag, fine
                let c_val = [0.9f32, 0.25, 0.6, 0.0][k as usize];
                let (response, conf, fmt) = match (h, (j + k as usize) % 4) {
                    (0, _) => (
                        format!("<analysis>checked</analysis>\n<confidence>{c_val}</confidence>"),
                        Some(c_val),
                        true,
                    ),
                    (_, 0) => (
                        "<analysis>x</analysis><confidence>nan</confidence>".to_string(),
                        None,
                        false,
                    ),
                    (_, 1) => ("<confidence>80%</confidence>".to_string(), None, false),
                    (_, 2) => (
                        "<confidence>0.5</confidence> done".to_string(),
                        Some(0.5),
                        false,
                    ),
                    _ => ("<confidence> 1 </confidence>".to_string(), Some(1.0), true),
                };
                let acc = accs[k as usize];
                let conf_reward = if fmt {
                    1.0 - (acc - conf.unwrap()) * (acc - conf.unwrap())
                } else {
                    0.0
                };
                rows.push(Row {
                    prompt_id: pid.clone(),
                    sample_type: "confidence",
                    answer_idx: k,
                    confidence_idx: Some(h),
                    data_source: "countdown".into(),
                    ground_truth: gt.clone(),
                    messages: msgs.clone(),
                    response,
                    tokens: vec![20 + h, 21],
                });
                exp.push(Expect {
                    format_ok: fmt,
                    acc,
                    confidence: conf,
                    conf_reward: Some(conf_reward),
                    reward: conf_reward,
                    answer: None,
                });
            }
        }
    }
    (rows, exp)
}

fn check(out: &RecordBatch, rows: &[Row], exp: &[Expect]) {
    assert_eq!(out.num_rows(), rows.len());
    let sid = col::<StringArray>(out, "sample_id");
    let fmt = col::<BooleanArray>(out, "format_ok");
    let acc = col::<Float32Array>(out, "acc_reward");
    let conf = col::<Float32Array>(out, "confidence");
    let cr = col::<Float32Array>(out, "conf_reward");
    let rw = col::<Float32Array>(out, "reward");
    let ans = col::<StringArray>(out, "answer");
    let comps = col::<ListArray>(out, "reward_components");
    let toks = col::<ListArray>(out, "response_ids");
    for (i, (r, e)) in rows.iter().zip(exp).enumerate() {
        assert_eq!(sid.value(i), r.sample_id(), "row order");
        let ctx = format!("row {i} {} {:?}", r.sample_id(), r.response);
        assert_eq!(fmt.value(i), e.format_ok, "format_ok {ctx}");
        assert_eq!(acc.value(i), e.acc, "acc {ctx}");
        assert_eq!(
            conf.is_null(i),
            e.confidence.is_none(),
            "confidence null {ctx}"
        );
        if let Some(c) = e.confidence {
            assert_eq!(conf.value(i), c, "confidence {ctx}");
        }
        assert_eq!(
            cr.is_null(i),
            e.conf_reward.is_none(),
            "conf_reward null {ctx}"
        );
        if let Some(c) = e.conf_reward {
            assert!(
                (cr.value(i) - c).abs() < 1e-6,
                "conf_reward {ctx}: {} vs {c}",
                cr.value(i)
            );
        }
        assert!(
            (rw.value(i) - e.reward).abs() < 1e-6,
            "reward {ctx}: {} vs {}",
            rw.value(i),
            e.reward
        );
        assert_eq!(ans.is_null(i), e.answer.is_none(), "answer null {ctx}");
        if let Some(a) = &e.answer {
            assert_eq!(ans.value(i), a, "answer {ctx}");
        }
        assert!(!comps.value(i).is_empty(), "components {ctx}");
        // passthrough columns are unchanged
        let t = toks.value(i);
        let t = t.as_any().downcast_ref::<Int32Array>().unwrap();
        assert_eq!(t.values().to_vec(), r.tokens, "response_ids {ctx}");
    }
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn p(d: &tempfile::TempDir, name: &str) -> PathBuf {
    d.path().join(name)
}

#[test]
fn scores_countdown_two_turn_table() {
    let d = tmp();
    let (rows, exp) = countdown_table(40); // 40 × (4 + 8) = 480 rows
    let input = p(&d, "traj.parquet");
    write_table(&input, &rows, 100, vec![]);
    let out = p(&d, "scored.parquet");
    ok(&[
        "score",
        "--input",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let b = read_all(&out);
    check(&b, &rows, &exp);
    // countdown component kept with weight 0 on answers; 480 rows in 5 row groups
    let md = kv(&out);
    assert_eq!(md.get("rlcr.stage").map(String::as_str), Some("score"));
    let cfg: serde_json::Value = serde_json::from_str(&md["rlcr.config"]).unwrap();
    assert_eq!(cfg["settings"]["gate"], true);
    assert_eq!(cfg["settings"]["preset"], "rlcr");
    let summary: serde_json::Value = serde_json::from_str(&md["rlcr.score_summary"]).unwrap();
    assert_eq!(summary["rows"], 480);
    assert_eq!(summary["answers"], 160);
    assert_eq!(summary["verifiers"]["countdown"], "countdown");
    // the table layer's validator and the polars / DuckDB checker accept the output
    let batches: Vec<RecordBatch> = rlcr::table::Reader::open(&out)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    rlcr::table::validate::validate_batches(
        out.to_str().unwrap(),
        &rlcr::table::TRAJECTORY,
        &["reward", "reward_components", "acc_reward", "format_ok"],
        &batches,
        &batches[0].schema(),
    )
    .unwrap();
    crate::ecosystem::check_tables(&[&out]);
    // logprobs survive the column-chunk copy bit for bit
    let lp_in = read_all(&input);
    let a = col::<ListArray>(&lp_in, "response_logprobs");
    let bb = col::<ListArray>(&b, "response_logprobs");
    assert_eq!(a.values().to_data(), bb.values().to_data());
}

#[test]
fn rescoring_replaces_scores_and_drops_advantages() {
    let d = tmp();
    let (rows, _) = countdown_table(10);
    let input = p(&d, "traj.parquet");
    let n = rows.len();
    write_table(
        &input,
        &rows,
        1000,
        vec![(
            "advantage",
            Arc::new(Float32Array::from(vec![9.0f32; n])) as ArrayRef,
        )],
    );
    let s1 = p(&d, "s1.parquet");
    ok(&[
        "score",
        "--input",
        input.to_str().unwrap(),
        "-o",
        s1.to_str().unwrap(),
    ]);
    let s2 = p(&d, "s2.parquet");
    let out = ok(&[
        "score",
        "--input",
        s1.to_str().unwrap(),
        "-o",
        s2.to_str().unwrap(),
        "--reward-preset",
        "tinyzero",
    ]);
    let _ = out;
    let b = read_all(&s2);
    let names: Vec<String> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    for c in [
        "answer",
        "format_ok",
        "acc_reward",
        "confidence",
        "conf_reward",
        "reward",
        "reward_components",
    ] {
        assert_eq!(
            names.iter().filter(|n| *n == c).count(),
            1,
            "{c} once in {names:?}"
        );
    }
    assert!(
        !names.contains(&"advantage".to_string()),
        "stale advantage kept: {names:?}"
    );
    // tinyzero preset: answers get 0 / 0.1 / 1 without gating
    let rw = col::<Float32Array>(&b, "reward");
    let st = col::<StringArray>(&b, "sample_type");
    let ai = col::<Int32Array>(&b, "answer_idx");
    for i in 0..b.num_rows() {
        if st.value(i) == "answer" {
            let want = match ai.value(i) {
                0 | 2 => 1.0,
                1 => 0.1,
                _ => 0.0,
            };
            // answer 1 is a*b-c, correct only when c == 0 (never: c >= 1)
            assert!(
                (rw.value(i) - want).abs() < 1e-6,
                "row {i}: {} vs {want}",
                rw.value(i)
            );
        }
    }
    let md = kv(&s2);
    let cfg: serde_json::Value = serde_json::from_str(&md["rlcr.config"]).unwrap();
    assert_eq!(cfg["settings"]["preset"], "tinyzero");
    assert_eq!(cfg["settings"]["gate"], false);
}

#[test]
fn confidences_before_their_answers_still_get_their_acc() {
    let d = tmp();
    let (rows, exp) = countdown_table(12);
    // put every confidence row first, answers last, in small row groups
    let mut order: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].sample_type == "confidence")
        .collect();
    order.extend((0..rows.len()).filter(|&i| rows[i].sample_type == "answer"));
    let rows2: Vec<Row> = order.iter().map(|&i| rows[i].clone()).collect();
    let exp2: Vec<Expect> = order
        .iter()
        .map(|&i| Expect {
            format_ok: exp[i].format_ok,
            acc: exp[i].acc,
            confidence: exp[i].confidence,
            conf_reward: exp[i].conf_reward,
            reward: exp[i].reward,
            answer: exp[i].answer.clone(),
        })
        .collect();
    let input = p(&d, "traj.parquet");
    write_table(&input, &rows2, 16, vec![]);
    let out = p(&d, "scored.parquet");
    ok(&[
        "score",
        "--input",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    check(&read_all(&out), &rows2, &exp2);
}

#[test]
fn hotpot_exact_match_with_external_verifier_and_structured_rewards() {
    let d = tmp();
    let mut rows = Vec::new();
    for j in 0..60 {
        let gold = ["Paris", "Rome", "Berlin"][j % 3];
        for k in 0..3 {
            let said = if k == 0 {
                format!("The {gold}.")
            } else {
                "Lyon".to_string()
            };
            rows.push(Row {
                prompt_id: format!("h{j}"),
                sample_type: "answer",
                answer_idx: k,
                confidence_idx: None,
                data_source: "hotpot".into(),
                ground_truth: format!("\"{gold}\""),
                messages: r#"[{"role":"user","content":"Which city?"}]"#.into(),
                response: format!("t</think><answer>{said}</answer>"),
                tokens: vec![k],
            });
        }
    }
    let input = p(&d, "qa.parquet");
    let n = rows.len();
    let quality: ArrayRef = Arc::new(Float32Array::from(
        (0..n).map(|i| (i % 4) as f32 / 4.0).collect::<Vec<_>>(),
    ));
    write_table(&input, &rows, 64, vec![("retrieval_quality", quality)]);

    // built-in exact match
    let out = p(&d, "s.parquet");
    ok(&[
        "score",
        "--input",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let b = read_all(&out);
    let acc = col::<Float32Array>(&b, "acc_reward");
    for i in 0..n {
        assert_eq!(acc.value(i), if i % 3 == 0 { 1.0 } else { 0.0 }, "row {i}");
    }

    // external verifier (a shell script): correct iff the extracted answer mentions the gold
    // answer; it also reports a `len` extra and writes to stderr
    let script = p(&d, "verify.sh");
    std::fs::write(
        &script,
        r#"#!/bin/sh
echo "verifier started" >&2
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -E 's/^\{"id":([0-9]+).*/\1/')
  case "$line" in
    *'"answer":"The '*) c=true ;;
    *) c=false ;;
  esac
  printf '{"id":%s,"correct":%s,"extra":{"len":2}}\n' "$id" "$c"
done
"#,
    )
    .unwrap();
    let rewards = p(&d, "rewards.toml");
    std::fs::write(
        &rewards,
        r#"
[[turn]]
name = "format_score"
weight = 0.15
source = "format_ok"
[[turn]]
name = "is_answer_score"
weight = 0.1
source = "answer_present"
[[global]]
name = "exact_match"
weight = 0.3
source = "correct"
[[global]]
name = "retrieval_quality"
weight = 0.4
column = "retrieval_quality"
[[global]]
name = "_raw_len"
weight = 1.0
source = "extra.len"
"#,
    )
    .unwrap();
    let out2 = p(&d, "s2.parquet");
    let cmd = format!("sh {}", script.display());
    let o = ok(&[
        "score",
        "--input",
        input.to_str().unwrap(),
        "-o",
        out2.to_str().unwrap(),
        "--verifier-cmd",
        &cmd,
        "--rewards",
        rewards.to_str().unwrap(),
    ]);
    assert!(
        o.stderr.as_str().contains("verifier started"),
        "child stderr passes through"
    );
    let b = read_all(&out2);
    let acc = col::<Float32Array>(&b, "acc_reward");
    let rw = col::<Float32Array>(&b, "reward");
    let comps = col::<ListArray>(&b, "reward_components");
    for i in 0..n {
        let correct = if i % 3 == 0 { 1.0 } else { 0.0 };
        assert_eq!(acc.value(i), correct, "row {i}");
        // turn 0: 0.15 * format (1) + 0.1 * answer present (1); globals: 0.3 * correct +
        // 0.4 * quality; `_raw_len` is listed but not summed
        let q = (i % 4) as f32 / 4.0;
        let want = 0.25 + 0.3 * correct + 0.4 * q;
        assert!(
            (rw.value(i) - want).abs() < 1e-6,
            "row {i}: {} vs {want}",
            rw.value(i)
        );
        assert_eq!(comps.value(i).len(), 5, "row {i}");
    }
    let md = kv(&out2);
    let summary: serde_json::Value = serde_json::from_str(&md["rlcr.score_summary"]).unwrap();
    assert_eq!(summary["verifiers"]["hotpot"], "external");
}

#[test]
fn errors_name_the_row() {
    let d = tmp();
    let (mut rows, _) = countdown_table(3);
    // an orphan confidence row
    rows.push(Row {
        answer_idx: 7,
        confidence_idx: Some(0),
        sample_type: "confidence",
        ..rows[0].clone()
    });
    let input = p(&d, "bad.parquet");
    write_table(&input, &rows, 100, vec![]);
    let o = rlcr(&[
        "score",
        "--input",
        input.to_str().unwrap(),
        "-o",
        p(&d, "x.parquet").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = o.stderr.as_str();
    assert!(e.contains("row 36") && e.contains("answer_idx 7"), "{e}");
    assert!(!p(&d, "x.parquet").exists());

    let (mut rows, _) = countdown_table(2);
    rows[3].ground_truth = "{\"target\": 5}".into();
    let input = p(&d, "bad2.parquet");
    write_table(&input, &rows, 100, vec![]);
    let o = rlcr(&[
        "score",
        "--input",
        input.to_str().unwrap(),
        "-o",
        p(&d, "y.parquet").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = o.stderr.as_str();
    assert!(
        e.contains("row 3") && e.contains("ground_truth") && e.contains("numbers"),
        "{e}"
    );

    // usage errors exit 2
    let o = rlcr(&[
        "score",
        "--input",
        "a",
        "-o",
        "b",
        "--reward-preset",
        "tinyzero",
        "--verifier",
        "math",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

const SCORE: [&str; 7] = [
    "answer",
    "format_ok",
    "acc_reward",
    "confidence",
    "conf_reward",
    "reward",
    "reward_components",
];

fn rlcr_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlcr"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running rlcr");
    assert!(
        out.status.success(),
        "rlcr {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn output_does_not_depend_on_thread_count() {
    let d = tmp();
    let (rows, _) = countdown_table(30);
    let input = p(&d, "traj.parquet");
    write_table(&input, &rows, 50, vec![]);
    let mut tables = Vec::new();
    for threads in ["1", "3"] {
        let out = p(&d, &format!("s{threads}.parquet"));
        rlcr_env(
            &[
                "score",
                "--input",
                input.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ],
            &[("RAYON_NUM_THREADS", threads)],
        );
        tables.push(read_all(&out));
    }
    // the same table without dictionary pages (read through the plain string path)
    let plain = p(&d, "plain.parquet");
    write_table_with(&plain, &rows, 50, vec![], false);
    let out = p(&d, "splain.parquet");
    ok(&[
        "score",
        "--input",
        plain.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    tables.push(read_all(&out));
    for t in &tables[1..] {
        assert_eq!(tables[0].schema(), t.schema());
        for (name, (a, b)) in SCORE.iter().map(|n| {
            (
                n,
                (
                    tables[0].column_by_name(n).unwrap(),
                    t.column_by_name(n).unwrap(),
                ),
            )
        }) {
            assert_eq!(a.to_data(), b.to_data(), "{name}");
        }
        for (a, b) in tables[0].columns().iter().zip(t.columns()) {
            assert_eq!(a.len(), b.len());
        }
    }
}

#[test]
fn tinyzero_compat_reads_prompt_and_response() {
    let d = tmp();
    let (mut rows, _) = countdown_table(4);
    rows.retain(|r| r.sample_type == "answer");
    // the same equation, correct, on the response's last line but the response has no
    // `</think>`: TinyZero scores it 1.0 (it never checks the format) ...
    for r in rows.iter_mut() {
        r.response = format!("thinking\n{}", r.response.rsplit('\n').next().unwrap());
    }
    let input = p(&d, "traj.parquet");
    write_table(&input, &rows, 100, vec![]);
    let out = p(&d, "tz.parquet");
    ok(&[
        "score",
        "--input",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--countdown-compat",
        "tinyzero",
        "--reward-preset",
        "tinyzero",
    ]);
    let b = read_all(&out);
    let rw = col::<Float32Array>(&b, "reward");
    let ai = col::<Int32Array>(&b, "answer_idx");
    for i in 0..b.num_rows() {
        // k = 0 "a × b + c": × is not Python, 0.1; k = 1 wrong value, 0.1; k = 2 "(a*b)+c",
        // correct, 1.0; k = 3 no answer tag, 0
        let want = [0.1, 0.1, 1.0, 0.0][ai.value(i) as usize];
        assert!(
            (rw.value(i) - want).abs() < 1e-6,
            "row {i} (answer {}): {} vs {want}",
            ai.value(i),
            rw.value(i)
        );
    }
}

#[test]
fn same_input_same_bytes() {
    let d = tmp();
    let (rows, _) = countdown_table(6);
    let input = p(&d, "traj.parquet");
    write_table(&input, &rows, 30, vec![]);
    let a = p(&d, "a.parquet");
    ok(&[
        "score",
        "--input",
        input.to_str().unwrap(),
        "-o",
        a.to_str().unwrap(),
    ]);
    let first = std::fs::read(&a).unwrap();
    ok(&[
        "score",
        "--input",
        input.to_str().unwrap(),
        "-o",
        a.to_str().unwrap(),
    ]);
    let second = std::fs::read(&a).unwrap();
    // (the configuration in the metadata names the output, so the same output path is used)
    assert!(
        first == second,
        "two runs wrote different files ({} and {} bytes)",
        first.len(),
        second.len()
    );
}

/// `prepare --from arithmetic-synth` end to end through `score` (its default `--verifier auto`
/// picks math for the `arithmetic*` data sources): the first rows of seed 1 are pinned, the right
/// result (also written `1,234`-style or with a `\boxed{}`) scores 1, a result off by one 0.
#[test]
fn arithmetic_synth_rows_score_with_the_math_verifier() {
    let d = tmp();
    let mut rows = Vec::new();
    for (split, name) in [("train", "arith.parquet"), ("hard", "hard.parquet")] {
        let out = p(&d, name);
        ok(&[
            "--seed",
            "1",
            "prepare",
            "--from",
            "arithmetic-synth",
            "--count",
            "40",
            "--split",
            split,
            "-o",
            out.to_str().unwrap(),
        ]);
        let b = read_all(&out);
        let ids = col::<StringArray>(&b, "prompt_id");
        let msgs =
            rlcr::table::nested::messages_text(b.column_by_name("messages").unwrap().as_ref())
                .unwrap();
        let ds = col::<StringArray>(&b, "data_source");
        let gts = col::<StringArray>(&b, "ground_truth");
        for i in 0..b.num_rows() {
            let m: serde_json::Value = serde_json::from_str(msgs.value(i)).unwrap();
            let text = m[0]["content"].as_str().unwrap().to_string();
            // the result computed here from the prompt's text
            let body: Vec<&str> = text["What is ".len()..text.find('?').unwrap()]
                .split(' ')
                .collect();
            let (a, b_): (u128, u128) = (body[0].parse().unwrap(), body[2].parse().unwrap());
            let c = match body[1] {
                "+" => a + b_,
                "*" => a * b_,
                op => panic!("op {op}"),
            };
            assert_eq!(gts.value(i), format!("\"{c}\""));
            rows.push((
                ids.value(i).to_string(),
                ds.value(i).to_string(),
                gts.value(i).to_string(),
                msgs.value(i).to_string(),
                text,
                c,
            ));
        }
    }
    // seed 1's first training rows, by hand: the prompt text and its result
    let first: Vec<(&str, &str)> = rows[..3]
        .iter()
        .map(|r| (r.4.as_str(), r.2.as_str()))
        .collect();
    assert_eq!(first, PINNED_ARITH.to_vec(), "{first:?}");

    let mut table = Vec::new();
    let mut want = Vec::new();
    for (id, ds, gt, msgs, _, c) in &rows {
        let with_commas = {
            let s = c.to_string();
            let mut out = String::new();
            for (k, ch) in s.chars().enumerate() {
                if k > 0 && (s.len() - k) % 3 == 0 {
                    out.push(',');
                }
                out.push(ch);
            }
            out
        };
        for (k, (said, right)) in [
            (c.to_string(), 1.0),
            (format!("\\boxed{{{with_commas}}}"), 1.0),
            ((c + 1).to_string(), 0.0),
            ("".to_string(), 0.0),
        ]
        .into_iter()
        .enumerate()
        {
            table.push(Row {
                prompt_id: id.clone(),
                sample_type: "answer",
                answer_idx: k as i32,
                confidence_idx: None,
                data_source: ds.clone(),
                ground_truth: gt.clone(),
                messages: msgs.clone(),
                response: format!("<think>w</think><answer>{said}</answer>"),
                tokens: vec![k as i32],
            });
            want.push(right);
        }
    }
    let input = p(&d, "answers.parquet");
    write_table(&input, &table, 64, vec![]);
    let out = p(&d, "scored.parquet");
    ok(&[
        "score",
        "--input",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let b = read_all(&out);
    let acc = col::<Float32Array>(&b, "acc_reward");
    for (i, w) in want.iter().enumerate() {
        assert_eq!(acc.value(i), *w as f32, "row {i}: {:?}", table[i].response);
    }
    let summary: serde_json::Value = serde_json::from_str(&kv(&out)["rlcr.score_summary"]).unwrap();
    assert_eq!(summary["verifiers"]["arithmetic"], "math");
    assert_eq!(summary["verifiers"]["arithmetic-hard"], "math");
}

/// `rlcr --seed 1 prepare --from arithmetic-synth --split train`'s first three rows (checked by
/// hand: 4 × 1 = 4; 7 + 8 = 15; 272 × 841 = 217,600 + 11,152 = 228,752).
const PINNED_ARITH: [(&str, &str); 3] = [
    (
        "What is 4 * 1? Put the final answer in <answer> </answer> tags.",
        "\"4\"",
    ),
    (
        "What is 7 + 8? Put the final answer in <answer> </answer> tags.",
        "\"15\"",
    ),
    (
        "What is 272 * 841? Put the final answer in <answer> </answer> tags.",
        "\"228752\"",
    ),
];
