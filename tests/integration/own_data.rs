//! A user's own data and reward code: `prepare --input` on dataset files in TRL's and verl's
//! formats (fixtures/data, written by scripts/gen_dataset_fixtures.py with the rows rlcr must
//! write computed there), and the reward adapters scripts/rewards/{verl,trl}_reward.py, whose
//! rewards through `score --verifier-cmd` must equal the functions called directly in Python.
use std::path::Path;

use arrow::array::{Array, StringArray};

use crate::support::pipeline::answers_responding;
use crate::support::python::{Needs, Py};
use crate::support::table::{read, write};
use crate::{fixtures, Workdir};

fn data(name: &str) -> String {
    fixtures().join("data").join(name).display().to_string()
}

/// The rows of a prompts table as JSON (the JSON text columns parsed).
fn prompt_rows(p: &Path) -> Vec<serde_json::Value> {
    let b = read(p);
    let col = |n: &str| {
        b.column_by_name(n)
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .clone()
    };
    // `messages` and `extra_info` are nested columns: read through rlcr's readers of either form.
    let m = rlcr::table::cols::messages(&b, "prompts").unwrap();
    let ei = b.column_by_name("extra_info").unwrap().clone();
    let (id, ds, gt) = (col("prompt_id"), col("data_source"), col("ground_truth"));
    let j = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
    (0..b.num_rows())
        .map(|i| {
            serde_json::json!({
                "prompt_id": id.value(i),
                "messages": j(m.value(i)),
                "data_source": ds.value(i),
                "ground_truth": j(gt.value(i)),
                "extra_info": rlcr::table::nested::extra_info_value(ei.as_ref(), i).unwrap(),
            })
        })
        .collect()
}

const TEMPLATE: &str = r"{question}\n\nPut the final answer in <answer></answer>.";

/// TRL's standard and conversational formats and verl's read with `--input` alone; a sharded
/// dataset (a glob), a JSON array and a JSON object of columns read with a column mapping. Every
/// row equals the one the generator computed from the same records.
#[test]
fn prepare_maps_trl_verl_and_plain_columns_like_the_python_reference() {
    let expected: serde_json::Value =
        crate::support::json::read(fixtures().join("data/expected.json"));
    let glob = format!("{}/train-*.parquet", data("gsm"));
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "trl-standard",
            vec!["--input".into(), data("trl-standard.parquet")],
        ),
        (
            "trl-conversational",
            vec!["--input".into(), data("trl-conversational.jsonl")],
        ),
        ("verl", vec!["--input".into(), data("verl.parquet")]),
        (
            "gsm-train",
            vec![
                "--input".into(),
                glob,
                "--input-template".into(),
                TEMPLATE.into(),
                "--label-key".into(),
                "answer".into(),
                "--data-source".into(),
                "gsm".into(),
            ],
        ),
        (
            "gsm-test",
            vec![
                "--input".into(),
                data("gsm/test.json"),
                "--input-template".into(),
                TEMPLATE.into(),
                "--label-key".into(),
                "answer".into(),
                "--data-source".into(),
                "gsm".into(),
            ],
        ),
        (
            "columns",
            vec![
                "--input".into(),
                data("columns.json"),
                "--prompt-key".into(),
                "question".into(),
                "--label-key".into(),
                "label".into(),
            ],
        ),
    ];
    let wd = Workdir::new();
    for (name, flags) in cases {
        let out = format!("{name}.parquet");
        let mut args: Vec<&str> = vec!["prepare"];
        args.extend(flags.iter().map(String::as_str));
        args.extend(["-o", &out]);
        wd.run(&args);
        let got = prompt_rows(&wd.path(&out));
        let want = expected[name].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g, w, "{name}");
        }
        // the prompts table reads back as it is (the loop prepares once, then draws)
        let again = format!("{name}-again.parquet");
        wd.run(&["prepare", "--input", &out, "-o", &again]);
        assert_eq!(prompt_rows(&wd.path(&again)), got, "{name} read back");
        // ... and so does the same table rewritten without rlcr's file metadata (what pandas,
        // polars or pyarrow write after a filter), with pandas' index column or without
        for index in [false, true] {
            let bare = format!("{name}-bare-{index}.parquet");
            rewrite_without_metadata(&wd.path(&out), &wd.path(&bare), index);
            let back = format!("{name}-bare-{index}-again.parquet");
            wd.run(&["prepare", "--input", &bare, "-o", &back]);
            assert_eq!(
                prompt_rows(&wd.path(&back)),
                got,
                "{name} rewritten, read back"
            );
        }
    }
}

/// `from` written again to `to` with its columns and values but none of rlcr's file metadata,
/// plus pandas' `__index_level_0__` column when `index`.
fn rewrite_without_metadata(from: &std::path::Path, to: &std::path::Path, index: bool) {
    use std::sync::Arc;
    let f = std::fs::File::open(from).unwrap();
    let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<arrow::array::RecordBatch> = r.map(|b| b.unwrap()).collect();
    let b = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
    let mut fields: Vec<arrow::datatypes::FieldRef> = b.schema().fields().iter().cloned().collect();
    let mut columns = b.columns().to_vec();
    if index {
        fields.push(Arc::new(arrow::datatypes::Field::new(
            "__index_level_0__",
            arrow::datatypes::DataType::Int64,
            false,
        )));
        columns.push(Arc::new(arrow::array::Int64Array::from_iter_values(
            (0..b.num_rows() as i64).map(|i| 3 * i + 1),
        )));
    }
    let schema = Arc::new(arrow::datatypes::Schema::new(fields));
    let b = arrow::array::RecordBatch::try_new(schema.clone(), columns).unwrap();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(to).unwrap(), schema, None)
            .unwrap();
    w.write(&b).unwrap();
    w.close().unwrap();
}

/// A mapped column that does not exist, a value of the wrong type, an empty prompt, a null
/// template field, a glob that matches nothing: exit 1, the file, row and column named, nothing
/// written.
#[test]
fn mapping_errors_name_file_row_and_column() {
    let wd = Workdir::new();
    wd.write(
        "q.jsonl",
        "{\"question\": \"2+2?\", \"answer\": \"4\"}\n{\"question\": \"\", \"answer\": \"5\"}\n{\"question\": 7, \"answer\": null}\n",
    );
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--input", "q.jsonl"],
            vec![
                "q.jsonl",
                "`prompt`",
                "missing",
                "--prompt-key",
                "answer, question",
            ],
        ),
        (
            vec![
                "--input",
                "q.jsonl",
                "--prompt-key",
                "question",
                "--label-key",
                "solution",
            ],
            vec!["q.jsonl", "`solution`", "--label-key", "missing"],
        ),
        (
            vec!["--input", "q.jsonl", "--prompt-key", "question"],
            vec!["q.jsonl, line 2, field `question`", "empty prompt"],
        ),
        (
            vec![
                "--input",
                "q.jsonl",
                "--input-template",
                "Q: {question}",
                "--label-key",
                "answer",
            ],
            vec!["q.jsonl, line 3, field `answer`", "null"],
        ),
        (
            vec!["--input", "q.jsonl", "--input-template", "{nope}"],
            vec!["q.jsonl", "`nope`", "--input-template", "missing"],
        ),
        (
            vec!["--input", "missing-*.parquet"],
            vec!["missing-*.parquet", "no file matches"],
        ),
    ];
    for (flags, needles) in cases {
        let mut args = vec!["prepare"];
        args.extend(&flags);
        args.extend(["-o", "out.parquet"]);
        let e = wd.fail(&args, 1);
        for n in needles {
            assert!(e.contains(n), "{flags:?}: {n:?} not in {e}");
        }
        assert!(!wd.path("out.parquet").exists(), "{flags:?} wrote");
    }
    wd.write("w.jsonl", "{\"prompt\": 5, \"ground_truth\": \"1\"}\n");
    let e = wd.fail(&["prepare", "--input", "w.jsonl", "-o", "out.parquet"], 1);
    assert!(
        e.contains("w.jsonl, line 1, field `prompt`") && e.contains("a number"),
        "{e}"
    );
    // usage errors: exit 2
    wd.fail(
        &[
            "prepare",
            "--input",
            "q.jsonl",
            "--input-template",
            "{open",
            "-o",
            "o.parquet",
        ],
        2,
    );
    wd.fail(
        &[
            "prepare",
            "--from",
            "countdown-synth",
            "--count",
            "2",
            "--label-key",
            "x",
            "-o",
            "o.parquet",
        ],
        2,
    );
}

/// `--draw K` of `--count N` with `--shuffle-seed S`: every row exactly once per epoch (the last
/// draw of an epoch is short), a new order per epoch, the same rows for the same (S, N, K).
#[test]
fn draws_cover_every_row_once_per_epoch() {
    let wd = Workdir::new();
    let mut lines = String::new();
    for i in 0..7 {
        lines.push_str(&format!(
            "{{\"prompt\": \"q{i}\", \"ground_truth\": \"{i}\"}}\n"
        ));
    }
    wd.write("d.jsonl", lines);
    wd.run(&["prepare", "--input", "d.jsonl", "-o", "all.parquet"]);
    let ids = |f: &str| -> Vec<String> {
        prompt_rows(&wd.path(f))
            .iter()
            .map(|r| r["prompt_id"].as_str().unwrap().to_string())
            .collect()
    };
    let mut epochs: Vec<Vec<String>> = vec![vec![], vec![]];
    for k in 0..6 {
        let out = format!("d{k}.parquet");
        wd.run(&[
            "prepare",
            "--input",
            "all.parquet",
            "--shuffle-seed",
            "3",
            "--count",
            "3",
            "--draw",
            &k.to_string(),
            "-o",
            &out,
        ]);
        let got = ids(&out);
        assert_eq!(got.len(), if k % 3 == 2 { 1 } else { 3 }, "draw {k}");
        epochs[k / 3].extend(got);
    }
    let mut all = ids("all.parquet");
    all.sort();
    for e in &epochs {
        let mut s = e.clone();
        s.sort();
        assert_eq!(s, all);
    }
    assert_ne!(
        epochs[0], epochs[1],
        "the second epoch kept the first one's order"
    );
    wd.run(&[
        "prepare",
        "--input",
        "all.parquet",
        "--shuffle-seed",
        "3",
        "--count",
        "3",
        "--draw",
        "4",
        "-o",
        "again.parquet",
    ]);
    assert_eq!(ids("again.parquet"), ids("d4.parquet"));
}

/// Run fixtures/rewards/check_adapter.py with `args` (cwd `dir`; PYTHONPATH = fixtures/rewards,
/// then `dir`); `None` when pyarrow is missing and not required (RLCR_REQUIRE_PYTHON).
pub(crate) fn check_adapter(dir: &Path, args: &[&str]) -> Option<String> {
    let path = std::env::join_paths([fixtures().join("rewards"), dir.to_path_buf()]).unwrap();
    let out = Py::script(fixtures().join("rewards/check_adapter.py"), Needs::Tables)
        .args(args)
        .cwd(dir)
        .env("PYTHONPATH", path)
        .stdout()?;
    Some(String::from_utf8_lossy(&out).to_string())
}

/// An answers table of the tiny model on `prompts` (2 answers each) whose responses are then
/// replaced: even rows answer the label (from extra_info's `label_field`), odd rows a wrong number,
/// every third row gives no answer; `special` = (row, response) overrides.
fn answers_with_responses(
    wd: &Workdir,
    prompts: &str,
    label: &dyn Fn(&serde_json::Value) -> String,
    special: &[(usize, &str)],
    out: &str,
) {
    let b = answers_responding(wd, prompts, 2, |i, gt| {
        let g: serde_json::Value = serde_json::from_str(gt).unwrap();
        match special.iter().find(|(r, _)| *r == i) {
            Some((_, t)) => t.to_string(),
            None if i % 3 == 2 => "no idea".to_string(),
            None if i % 2 == 0 => format!("<think>ok</think><answer>{}</answer>", label(&g)),
            None => "<think>hm</think><answer>-1</answer>".to_string(),
        }
    });
    write(&b, &wd.path(out), "rlcr.trajectory");
}

pub(crate) fn adapter(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/rewards")
        .join(name)
        .display()
        .to_string()
}

fn score_with(wd: &Workdir, input: &str, cmd: &str, out: &str) -> std::process::Output {
    let mut c = wd.cmd(&[
        "score",
        "--input",
        input,
        "-o",
        out,
        "--format-gate",
        "off",
        "--verifier-cmd",
        cmd,
    ]);
    c.env("PYTHONPATH", fixtures().join("rewards"));
    c.output().expect("rlcr runs")
}

fn as_text(g: &serde_json::Value) -> String {
    g.as_str().map_or_else(|| g.to_string(), str::to_string)
}

/// verl's compute_score (a dict with "score" and more entries; a float using extra_info) through
/// verl_reward.py equals the function called on the same rows; a function that raises is an error
/// that names the row, and nothing is written.
#[test]
fn verl_adapter_rewards_equal_compute_score() {
    let wd = Workdir::new();
    wd.run(&[
        "prepare",
        "--input",
        &data("verl.parquet"),
        "-o",
        "p.parquet",
    ]);
    answers_with_responses(
        &wd,
        "p.parquet",
        &as_text,
        &[(5, "<answer>13</answer>")],
        "a.parquet",
    );
    for f in ["compute_score", "compute_score_float"] {
        let cmd = format!("python3 {} user_rewards:{f}", adapter("verl_reward.py"));
        let out = format!("{f}.parquet");
        let o = score_with(&wd, "a.parquet", &cmd, &out);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        if let Some(r) = check_adapter(wd.root(), &[&out, "verl", &format!("user_rewards:{f}")]) {
            assert!(r.contains("0 mismatches"), "{r}");
            assert!(!r.contains(" 1 distinct"), "all rewards equal: {r}");
        }
    }
    let cmd = format!(
        "python3 {} user_rewards:compute_score_raises",
        adapter("verl_reward.py")
    );
    let o = score_with(&wd, "a.parquet", &cmd, "bad.parquet");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("raised on row 5"), "{err}");
    assert!(err.contains("cannot parse this one"), "{err}");
    assert!(!wd.path("bad.parquet").exists());
}

/// TRL reward functions through trl_reward.py: the standard format (completions as text, the
/// dataset's `solution` column as a keyword list) and the conversational one (two functions,
/// weighted, each kept as a component) equal the functions called on the same rows; a function
/// that raises names the row.
#[test]
fn trl_adapter_rewards_equal_the_reward_functions() {
    let wd = Workdir::new();
    let solution = |g: &serde_json::Value| as_text(g);
    wd.run(&[
        "prepare",
        "--input",
        &data("trl-standard.parquet"),
        "-o",
        "s.parquet",
    ]);
    answers_with_responses(
        &wd,
        "s.parquet",
        &solution,
        &[(3, "<answer>13</answer>")],
        "sa.parquet",
    );
    let cmd = format!(
        "python3 {} user_rewards:accuracy_reward",
        adapter("trl_reward.py")
    );
    let o = score_with(&wd, "sa.parquet", &cmd, "s1.parquet");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    if let Some(r) = check_adapter(
        wd.root(),
        &["s1.parquet", "trl", "user_rewards:accuracy_reward"],
    ) {
        assert!(
            r.contains("0 mismatches") && !r.contains(" 1 distinct"),
            "{r}"
        );
    }

    wd.run(&[
        "prepare",
        "--input",
        &data("trl-conversational.jsonl"),
        "-o",
        "c.parquet",
    ]);
    answers_with_responses(&wd, "c.parquet", &solution, &[], "ca.parquet");
    let specs = "user_rewards:conversational_reward user_rewards:length_penalty";
    let cmd = format!(
        "python3 {} {specs} --conversational --weights 1,0.5",
        adapter("trl_reward.py")
    );
    let o = score_with(&wd, "ca.parquet", &cmd, "c1.parquet");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    if let Some(r) = check_adapter(
        wd.root(),
        &[
            "c1.parquet",
            "trl",
            "--conversational",
            "--weights",
            "1,0.5",
            "user_rewards:conversational_reward",
            "user_rewards:length_penalty",
        ],
    ) {
        assert!(
            r.contains("0 mismatches") && !r.contains(" 1 distinct"),
            "{r}"
        );
    }

    let cmd = format!(
        "python3 {} user_rewards:trl_raises",
        adapter("trl_reward.py")
    );
    let o = score_with(&wd, "sa.parquet", &cmd, "bad.parquet");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("raised on row 3"), "{err}");
    assert!(!wd.path("bad.parquet").exists());
}

/// `v` with every float that has a whole value as an integer.
fn whole_floats_as_ints(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 => Value::from(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(whole_floats_as_ints).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, x)| (k, whole_floats_as_ints(x)))
                .collect(),
        ),
        other => other,
    }
}

/// A verl reward function that records the `extra_info` it is given (JSON lines in $REC_OUT).
const RECORDER: &str = r#"import json, os

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open(os.environ["REC_OUT"], "a") as f:
        f.write(json.dumps(extra_info) + "\n")
    return 0.0
"#;

/// Each row's `extra_info` reaches reward code as the source row held it: explicit nulls, floats
/// beside integers, empty lists, nested objects (a whole float as an integer, `1.0` as `1`); and
/// keys that only some rows have are missing there, not null (that table keeps the column as JSON
/// text, the other one is a struct).
#[test]
fn extra_info_reaches_reward_code_exactly() {
    use arrow::datatypes::DataType;
    let wd = Workdir::new();
    wd.write("recorder.py", RECORDER);
    let same = [
        r#"{"prompt": "a", "ground_truth": "1", "w": 1.0, "tag": null, "meta": {"k": [1, 2]}}"#,
        r#"{"prompt": "b", "ground_truth": "2", "w": 2.5, "tag": "x", "meta": {"k": []}}"#,
        r#"{"prompt": "c", "ground_truth": "3", "w": 3, "tag": "y", "meta": null}"#,
    ];
    let ragged = [
        r#"{"prompt": "d", "ground_truth": "4", "hint": "h", "n": 1}"#,
        r#"{"prompt": "e", "ground_truth": "5", "n": 2}"#,
        r#"{"prompt": "f", "ground_truth": "6", "n": 3, "hint": null}"#,
    ];
    for (name, lines, native) in [("same", same, true), ("ragged", ragged, false)] {
        wd.write(&format!("{name}.jsonl"), lines.join("\n") + "\n");
        let p = format!("{name}.parquet");
        wd.run(&["prepare", "--input", &format!("{name}.jsonl"), "-o", &p]);
        let b = read(&wd.path(&p));
        let t = b.column_by_name("extra_info").unwrap().data_type().clone();
        assert_eq!(matches!(t, DataType::Struct(_)), native, "{name}: {t}");
        let a = format!("{name}-a.parquet");
        wd.run(&[
            "generate-answers",
            "--model",
            &crate::support::pipeline::tiny_qwen2(),
            "--input",
            &p,
            "-o",
            &a,
            "--num-answers",
            "1",
            "--max-new-tokens",
            "2",
        ]);
        let rec = wd.path(&format!("{name}-rec.jsonl"));
        let cmd = format!(
            "python3 {} recorder:compute_score",
            adapter("verl_reward.py")
        );
        let mut c = wd.cmd(&[
            "score",
            "--input",
            &a,
            "-o",
            &format!("{name}-s.parquet"),
            "--verifier-cmd",
            &cmd,
        ]);
        c.env("PYTHONPATH", wd.root()).env("REC_OUT", &rec);
        let o = c.output().expect("rlcr runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // What the function saw, against the source rows less the prompt, whole floats as
        // integers (compared as text, so that `1.0` and `1` differ).
        let mut got: Vec<String> = std::fs::read_to_string(&rec)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .unwrap()
                    .to_string()
            })
            .collect();
        let mut want: Vec<String> = lines
            .iter()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                v.as_object_mut().unwrap().remove("prompt");
                whole_floats_as_ints(v).to_string()
            })
            .collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{name}");
    }
}

/// `prepare --pass-rates`: a pool's prompts kept by the pass rate of their scored answers (the
/// mean `acc_reward` of the answer rows; confidence rows ignored), strictly between the bounds;
/// the summary counts the dropped ones; bad bounds are usage errors and a prompt without answers
/// an error naming its row, nothing written either way.
#[test]
fn pass_rate_filter_keeps_the_learnable_prompts() {
    use std::sync::Arc;
    let wd = Workdir::new();
    wd.run(&[
        "--seed",
        "3",
        "prepare",
        "--from",
        "arithmetic-synth",
        "--count",
        "4",
        "-o",
        "pool.parquet",
    ]);
    let ids: Vec<String> = prompt_rows(&wd.path("pool.parquet"))
        .iter()
        .map(|r| r["prompt_id"].as_str().unwrap().to_string())
        .collect();
    // Pass rates: ids[0] 1, ids[1] 0.5, ids[2] 0, ids[3] 0.25.
    let answers: [&[f32]; 4] = [&[1.0, 1.0], &[0.0, 1.0], &[0.0, 0.0], &[1.0, 0.0, 0.0, 0.0]];
    let (mut pid, mut kind, mut acc) = (vec![], vec![], vec![]);
    for (id, rs) in ids.iter().zip(answers) {
        for &r in rs {
            pid.push(id.clone());
            kind.push("answer");
            acc.push(r);
        }
        // a confidence row rewarded 1 does not count
        pid.push(id.clone());
        kind.push("confidence");
        acc.push(1.0);
    }
    let b = arrow::array::RecordBatch::try_from_iter([
        (
            "prompt_id",
            Arc::new(StringArray::from(pid)) as arrow::array::ArrayRef,
        ),
        ("sample_type", Arc::new(StringArray::from(kind))),
        (
            "acc_reward",
            Arc::new(arrow::array::Float32Array::from(acc)),
        ),
    ])
    .unwrap();
    write(&b, &wd.path("scored.parquet"), "rlcr.trajectory");
    let o = wd.output(&[
        "prepare",
        "--input",
        "pool.parquet",
        "--pass-rates",
        "scored.parquet",
        "-o",
        "learnable.parquet",
    ]);
    let log = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{log}");
    assert!(
        log.contains("kept 2 of 4 by pass rate (1 too hard, 1 too easy)"),
        "{log}"
    );
    let kept: Vec<String> = prompt_rows(&wd.path("learnable.parquet"))
        .iter()
        .map(|r| r["prompt_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kept, [ids[1].clone(), ids[3].clone()]);
    wd.run(&[
        "prepare",
        "--input",
        "pool.parquet",
        "--pass-rates",
        "scored.parquet",
        "--min-pass-rate",
        "0.25",
        "-o",
        "half.parquet",
    ]);
    let kept: Vec<serde_json::Value> = prompt_rows(&wd.path("half.parquet"));
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0]["prompt_id"], ids[1].as_str());
    // --keep-decided 1: the always- and never-right prompts are kept too, in input order.
    let o = wd.output(&[
        "prepare",
        "--input",
        "pool.parquet",
        "--pass-rates",
        "scored.parquet",
        "--keep-decided",
        "1",
        "-o",
        "mixed.parquet",
    ]);
    let log = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{log}");
    assert!(
        log.contains(
            "kept 4 of 4 by pass rate (1 too hard, 1 too easy; 2 of those kept all the same)"
        ),
        "{log}"
    );
    let mixed: Vec<String> = prompt_rows(&wd.path("mixed.parquet"))
        .iter()
        .map(|r| r["prompt_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(mixed, ids);
    wd.refuse(
        &[
            "prepare",
            "--input",
            "pool.parquet",
            "--pass-rates",
            "scored.parquet",
            "--keep-decided",
            "1.5",
            "-o",
            "x.parquet",
        ],
        2,
        "--keep-decided 1.5",
        "x.parquet",
    );
    wd.refuse(
        &[
            "prepare",
            "--input",
            "pool.parquet",
            "--pass-rates",
            "scored.parquet",
            "--min-pass-rate",
            "0.6",
            "--max-pass-rate",
            "0.4",
            "-o",
            "x.parquet",
        ],
        2,
        "--min-pass-rate 0.6 and --max-pass-rate 0.4",
        "x.parquet",
    );
    wd.run(&[
        "--seed",
        "4",
        "prepare",
        "--from",
        "arithmetic-synth",
        "--count",
        "2",
        "--split",
        "heldout",
        "-o",
        "other.parquet",
    ]);
    wd.refuse(
        &[
            "prepare",
            "--input",
            "other.parquet",
            "--pass-rates",
            "scored.parquet",
            "-o",
            "y.parquet",
        ],
        1,
        "has no answer in",
        "y.parquet",
    );
}
