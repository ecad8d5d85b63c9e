//! Tables written by rlcr open in polars and DuckDB with the documented types and metadata
//! (`scripts/check_tables.py`). `.ci/run` installs both and sets `RLCR_REQUIRE_PYTHON=1`, which turns
//! a missing module into a failure; elsewhere the test says it was skipped.
use std::path::Path;

use crate::support::python::{self, Needs, Py};
use crate::Workdir;

/// Run the checker on tables; panics on a failed check.
pub fn check_tables(files: &[&Path]) {
    Py::script(python::script("check_tables.py"), Needs::Tables)
        .args(files)
        .stdout();
}

#[test]
fn prompts_table_opens_in_polars_and_duckdb() {
    let wd = Workdir::new();
    wd.run(&[
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        "20",
        "-o",
        "p.parquet",
    ]);
    check_tables(&[&wd.path("p.parquet")]);
}

/// Run `scripts/inspect_table.py --json` on a table; `None` when polars/duckdb are missing and not
/// required.
fn inspect_json(table: &Path) -> Option<serde_json::Value> {
    Py::script(python::script("inspect_table.py"), Needs::Tables)
        .arg(table)
        .arg("--json")
        .json()
}

/// Every table of one loop iteration (prompts, answers, trajectory, scored, advantage, probe,
/// calibration) opens in polars and DuckDB with the documented types; the documented recipes
/// (`scripts/inspect.sql`, `scripts/inspect_table.py`) slice the same span tokens in both and compute
/// the same Brier, accuracy and mean confidence as `rlcr report` (to 1e-6).
#[test]
fn loop_tables_open_in_polars_and_duckdb_and_recipes_match_report() {
    let wd = Workdir::new();
    let m = crate::fixtures().join("tiny-qwen2").display().to_string();
    let prepare = crate::support::pipeline::easy_countdown_args(4, "prompts.parquet");
    let answers = crate::support::pipeline::answers_args(
        &m,
        "prompts.parquet",
        "answers.parquet",
        2,
        12,
        &["--response-prefix", "<think>"],
    );
    let (prepare, answers): (Vec<&str>, Vec<&str>) = (
        prepare.iter().map(String::as_str).collect(),
        answers.iter().map(String::as_str).collect(),
    );
    let steps: [&[&str]; 6] = [
        &prepare,
        &answers,
        &[
            "generate-confidence",
            "--model",
            &m,
            "--input",
            "answers.parquet",
            "-o",
            "traj.parquet",
            "--num-confidences",
            "2",
            "--max-new-tokens",
            "6",
            "--response-prefix",
            "<confidence>0.",
        ],
        &["score", "--input", "traj.parquet", "-o", "scored.parquet"],
        &[
            "advantage",
            "--input",
            "scored.parquet",
            "-o",
            "adv.parquet",
        ],
        &["report", "--input", "scored.parquet", "-o", "report0"],
    ];
    for s in steps {
        wd.run(s);
    }
    let tables = [
        "prompts.parquet",
        "answers.parquet",
        "traj.parquet",
        "scored.parquet",
        "adv.parquet",
        "report0/calibration.parquet",
    ];
    let paths: Vec<std::path::PathBuf> = tables.iter().map(|t| wd.path(t)).collect();
    let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
    check_tables(&refs);
    // The untrained model neither solves nor states confidences: give the scored rows known,
    // varied values (answers alternate right/wrong; confidences 0.05·k, every fifth unparsed) so
    // the comparison with `report` is not 0 = 0.
    let b = {
        let r = rlcr::table::Reader::open(&wd.path("scored.parquet")).unwrap();
        let batches = r.read_all().unwrap();
        rlcr::table::io::concat(&batches[0].schema(), &batches).unwrap()
    };
    let st = rlcr::table::cols::str_col(&b, "scored", "sample_type").unwrap();
    let (mut acc, mut conf) = (Vec::new(), Vec::new());
    let mut answer = -1i32;
    for i in 0..b.num_rows() {
        if st.value(i) == "answer" {
            answer += 1;
            conf.push(None);
        } else {
            conf.push((i % 5 != 0).then_some(0.05 * (i % 20) as f32));
        }
        acc.push((answer % 2) as f32);
    }
    let b = rlcr::table::cols::set_columns(
        &b,
        &rlcr::table::TRAJECTORY,
        vec![
            (
                "acc_reward",
                std::sync::Arc::new(arrow::array::Float32Array::from(acc)) as _,
            ),
            (
                "confidence",
                std::sync::Arc::new(arrow::array::Float32Array::from(conf)) as _,
            ),
        ],
    )
    .unwrap();
    let meta = rlcr::table::Meta::new(
        &rlcr::table::TRAJECTORY,
        "score",
        serde_json::json!({}),
        &[],
    );
    rlcr::table::write_table(&wd.path("known.parquet"), b.schema(), &[b], &meta).unwrap();
    wd.run(&["report", "--input", "known.parquet", "-o", "report"]);
    let Some(v) = inspect_json(&wd.path("known.parquet")) else {
        return;
    };
    let metrics: serde_json::Value = crate::support::json::read(wd.path("report/metrics.json"));
    let overall = &metrics["reports"][0]["overall"];
    for side in ["polars", "duckdb"] {
        let rows = v[side].as_array().unwrap();
        assert_eq!(rows.len(), 1, "{side}: one data_source: {rows:?}");
        for (ours, theirs) in [
            ("brier", "brier"),
            ("mean_confidence", "mean_confidence"),
            ("accuracy", "accuracy"),
        ] {
            let a = rows[0][ours].as_f64().unwrap();
            let b = overall[theirs].as_f64().unwrap();
            assert!((a - b).abs() < 1e-6, "{side} {ours} {a} vs report {b}");
            assert!(b > 0.05, "{ours} {b}: the known values are not trivial");
        }
        assert_eq!(rows[0]["confidences"], 16, "{side}");
    }
    assert_eq!(v["span_tokens"], v["span_tokens_polars"]);
    assert!(!v["span_tokens"].as_array().unwrap().is_empty());
}

/// Rewrite `src` to `dst` with pyarrow's or polars' default Parquet writer (lists as Parquet's
/// compliant `element` items, pyarrow's own string and metadata choices) and return the file's
/// list types as the writer stored them; `None` when the module is missing and not required.
fn rewrite_with(lib: &str, src: &Path, dst: &Path) -> Option<String> {
    let code = match lib {
        "pyarrow" => "import sys, pyarrow.parquet as pq\npq.write_table(pq.read_table(sys.argv[1]), sys.argv[2])",
        _ => "import sys, polars as pl\npl.read_parquet(sys.argv[1]).write_parquet(sys.argv[2])",
    };
    let show = "import sys, pyarrow.parquet as pq\nprint(pq.read_schema(sys.argv[1]))";
    Py::code(&format!("{lib} rewrite"), code, Needs::Tables)
        .arg(src)
        .arg(dst)
        .stdout()?;
    let schema = Py::code("read_schema", show, Needs::Tables)
        .arg(dst)
        .stdout()?;
    Some(String::from_utf8_lossy(&schema).to_string())
}

/// Every column of a table as rlcr's reader gives it (types normalised, batches concatenated).
fn read_normalised(p: &Path) -> arrow::record_batch::RecordBatch {
    let batches = rlcr::table::Reader::open(p).unwrap().read_all().unwrap();
    let b = rlcr::table::io::concat(&batches[0].schema(), &batches).unwrap();
    let fields = b.schema().fields().clone();
    b.with_schema(std::sync::Arc::new(arrow::datatypes::Schema::new(fields)))
        .unwrap()
}

/// Tables that pyarrow or polars rewrote (lists with Parquet's compliant `element` items) feed
/// every later stage and give the same rows as rlcr's own tables: `generate-confidence` used to
/// fail after sampling every row ("List(Int32) vs List(Int32, field: 'element')") when it joined
/// the answers it read with the confidence rows it built.
#[test]
fn tables_rewritten_by_pyarrow_and_polars_feed_the_next_stage() {
    let wd = Workdir::new();
    let m = crate::fixtures().join("tiny-qwen2").display().to_string();
    let prepare = crate::support::pipeline::easy_countdown_args(3, "prompts.parquet");
    let answers = crate::support::pipeline::answers_args(
        &m,
        "prompts.parquet",
        "answers.parquet",
        2,
        8,
        &["--response-prefix", "<think>"],
    );
    crate::support::pipeline::run(&wd, &prepare);
    crate::support::pipeline::run(&wd, &answers);
    // Each stage on rlcr's table and on the rewritten one, the outputs compared row for row.
    let args = |stage: &str, input: &str, out: &str| -> Vec<String> {
        let v: Vec<&str> = match stage {
            "traj" => vec![
                "generate-confidence",
                "--model",
                &m,
                "--input",
                input,
                "-o",
                out,
                "--num-confidences",
                "2",
                "--max-new-tokens",
                "4",
                "--response-prefix",
                "<confidence>0.",
            ],
            "scored" => vec!["score", "--input", input, "-o", out],
            _ => vec!["advantage", "--input", input, "-o", out],
        };
        v.into_iter().map(String::from).collect()
    };
    let stages = [("answers", "traj"), ("traj", "scored"), ("scored", "adv")];
    for lib in ["pyarrow", "polars"] {
        for (input, output) in stages {
            let ours = wd.path(&format!("{input}.parquet"));
            let theirs = wd.path(&format!("{input}-{lib}.parquet"));
            let Some(schema) = rewrite_with(lib, &ours, &theirs) else {
                return;
            };
            assert!(
                schema.contains("list<element:"),
                "{lib} kept arrow's item name, the test would prove nothing:\n{schema}"
            );
            let a = format!("{output}.parquet");
            let b = format!("{output}-from-{lib}.parquet");
            crate::support::pipeline::run(&wd, &args(output, &format!("{input}.parquet"), &a));
            crate::support::pipeline::run(
                &wd,
                &args(output, &format!("{input}-{lib}.parquet"), &b),
            );
            // Same columns and values; the row-preserving stages (`score`, `advantage`) copy the
            // input's column chunks as they are, so a field's nullability flag may be polars'.
            let (x, y) = (read_normalised(&wd.path(&a)), read_normalised(&wd.path(&b)));
            assert_eq!(x.num_rows(), y.num_rows());
            let names = |b: &arrow::record_batch::RecordBatch| -> Vec<String> {
                b.schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect()
            };
            assert_eq!(
                names(&x),
                names(&y),
                "{output} from {lib}'s {input}: columns"
            );
            for (i, f) in x.schema().fields().iter().enumerate() {
                let theirs = arrow::compute::cast(y.column(i), f.data_type()).unwrap();
                assert_eq!(
                    x.column(i).as_ref(),
                    theirs.as_ref(),
                    "{output} from {lib}'s {input} differs from {output} from rlcr's in `{}`",
                    f.name()
                );
            }
        }
        // And the update takes the rewritten advantage table.
        let adv = wd.path("adv.parquet");
        let theirs = wd.path(&format!("adv-{lib}.parquet"));
        rewrite_with(lib, &adv, &theirs).unwrap();
        wd.run(&[
            "update",
            "--model",
            &m,
            "--input",
            theirs.to_str().unwrap(),
            "-o",
            &format!("model-{lib}"),
        ]);
        assert!(wd.path(&format!("model-{lib}/config.json")).exists());
    }
}

/// `prepare` writes `messages` as `list<struct<role, content>>` and `extra_info` as a struct
/// (schema version 2), which polars and DuckDB read as such (`check_tables.py` compares their
/// values and the `messages[1].content` / `extra_info.<key>` recipes); a version 1 table (both as
/// JSON text) still samples, with the same responses, and its output has native messages.
#[test]
fn nested_columns_are_native_and_version_1_text_is_still_read() {
    use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use rlcr::table::{nested, write_table, Meta, Reader, PROMPTS};
    use std::sync::Arc;

    let wd = Workdir::new();
    wd.run(&[
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        "6",
        "-o",
        "p.parquet",
    ]);
    let read = |f: &str| {
        let r = Reader::open(&wd.path(f)).unwrap();
        let md = r.metadata().clone();
        (r.read_all().unwrap(), md)
    };
    let (b, md) = read("p.parquet");
    assert_eq!(md["rlcr.schema_version"], "2");
    let b = &b[0];
    let msgs = b.column_by_name("messages").unwrap();
    assert_eq!(msgs.data_type(), &nested::messages_type());
    let extra = b.column_by_name("extra_info").unwrap();
    let DataType::Struct(fields) = extra.data_type() else {
        panic!("extra_info is {}", extra.data_type());
    };
    assert!(fields.find("split").is_some(), "{fields:?}");
    // The same rows as a version 1 table: both columns as JSON text.
    let text = nested::messages_text(msgs.as_ref()).unwrap();
    let extra_text: Vec<Option<String>> = (0..b.num_rows())
        .map(|i| {
            let v = nested::extra_info_value(extra.as_ref(), i).unwrap();
            (!v.is_null()).then(|| v.to_string())
        })
        .collect();
    let cols: Vec<ArrayRef> = vec![
        b.column_by_name("prompt_id").unwrap().clone(),
        Arc::new(text),
        b.column_by_name("data_source").unwrap().clone(),
        b.column_by_name("ground_truth").unwrap().clone(),
        Arc::new(StringArray::from(extra_text)),
    ];
    let fields: Vec<Field> = ["prompt_id", "messages", "data_source", "ground_truth"]
        .iter()
        .map(|n| Field::new(*n, DataType::Utf8, false))
        .chain([Field::new("extra_info", DataType::Utf8, true)])
        .collect();
    let v1 = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
    let mut meta = Meta::new(&PROMPTS, "prepare", serde_json::json!({}), &[]);
    meta.schema_version = 1;
    write_table(&wd.path("v1.parquet"), v1.schema(), &[v1], &meta).unwrap();
    let m = crate::fixtures().join("tiny-qwen2").display().to_string();
    for (input, out) in [("p.parquet", "a2.parquet"), ("v1.parquet", "a1.parquet")] {
        let args = crate::support::pipeline::answers_args(&m, input, out, 2, 6, &[]);
        wd.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let (a2, _) = read("a2.parquet");
    let (a1, _) = read("a1.parquet");
    for name in ["messages", "response_ids", "prompt_id"] {
        let x = a2[0].column_by_name(name).unwrap();
        let y = a1[0].column_by_name(name).unwrap();
        assert_eq!(x.to_data(), y.to_data(), "{name}");
    }
    assert_eq!(
        a2[0].column_by_name("messages").unwrap().data_type(),
        &nested::messages_type()
    );
    check_tables(&[&wd.path("p.parquet"), &wd.path("a2.parquet")]);
}
