//! Tables built in Python the obvious way (`pa.Table.from_pylist`, polars, pandas) read as
//! written: Python's `int` is int64, its `float` double, its `str` often a large string, its
//! lists `list<int64>`, its dicts structs of int64. Every stage reads such a table in rlcr's types
//! where the values fit (the outputs equal those of the same rows written in rlcr's types), names
//! the file, row and column of a value that does not fit, and lists every column whose type it
//! cannot read at once.
use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float32Array, Float64Array, Int32Array, Int64Array,
    LargeListArray, LargeStringArray, ListArray, RecordBatch, StringArray, StructArray,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Fields, Schema};
use parquet::arrow::ArrowWriter;
use serde_json::{json, Value};

use super::support::python::{Needs, Py};
use super::Workdir;

/// A scored table of two prompts, two answers each and one confidence row per answer, as the
/// list of dicts a Python user builds (what `pa.Table.from_pylist` takes).
fn rows() -> Vec<Value> {
    let mut out = Vec::new();
    // (prompt, answer_idx, correct, stated confidence); spans over 4 response tokens
    let answers = [
        ("p0", 0, true, 0.75),
        ("p0", 1, false, 0.5),
        ("p1", 0, true, 1.0),
        ("p1", 1, true, 0.25),
    ];
    for (p, k, correct, c) in answers {
        let acc = if correct { 1.0 } else { 0.0 };
        out.push(json!({
            "prompt_id": p,
            "sample_type": "answer",
            "answer_idx": k,
            "confidence_idx": null,
            "sample_id": format!("{p}/a{k}"),
            "data_source": "countdown",
            "response_ids": [11, 12, 13, 14 + k],
            "response_logprobs": [-0.5, -0.25, -1.0, -0.125],
            "response_text": format!("<answer>{k}</answer>"),
            "answer_span": {"start": 0, "end": 3},
            "confidence_span": null,
            "format_ok": true,
            "acc_reward": acc,
            "confidence": null,
            "conf_reward": null,
            "reward": acc,
        }));
        let brier = 1.0 - (acc - c) * (acc - c);
        out.push(json!({
            "prompt_id": p,
            "sample_type": "confidence",
            "answer_idx": k,
            "confidence_idx": 0,
            "sample_id": format!("{p}/a{k}/c0"),
            "data_source": "countdown",
            "response_ids": [21, 22, 23],
            "response_logprobs": [-0.5, -0.5, -0.5],
            "response_text": format!("<confidence>{c}</confidence>"),
            "answer_span": null,
            "confidence_span": {"start": 0, "end": 3},
            "format_ok": true,
            "acc_reward": acc,
            "confidence": c,
            "conf_reward": brier,
            "reward": brier,
        }));
    }
    out
}

/// How a column is stored: rlcr's own types, or what Python writes by default.
#[derive(Clone, Copy, PartialEq)]
enum Types {
    Rlcr,
    Python,
}

fn strings(rows: &[Value], key: &str, t: Types) -> ArrayRef {
    let v: Vec<Option<&str>> = rows.iter().map(|r| r[key].as_str()).collect();
    match t {
        Types::Rlcr => Arc::new(StringArray::from(v)),
        Types::Python => Arc::new(LargeStringArray::from(v)),
    }
}

fn ints(rows: &[Value], key: &str, t: Types) -> ArrayRef {
    let v: Vec<Option<i64>> = rows.iter().map(|r| r[key].as_i64()).collect();
    match t {
        Types::Rlcr => Arc::new(Int32Array::from(
            v.iter().map(|x| x.map(|x| x as i32)).collect::<Vec<_>>(),
        )),
        Types::Python => Arc::new(Int64Array::from(v)),
    }
}

fn floats(rows: &[Value], key: &str, t: Types) -> ArrayRef {
    let v: Vec<Option<f64>> = rows.iter().map(|r| r[key].as_f64()).collect();
    match t {
        Types::Rlcr => Arc::new(Float32Array::from(
            v.iter().map(|x| x.map(|x| x as f32)).collect::<Vec<_>>(),
        )),
        Types::Python => Arc::new(Float64Array::from(v)),
    }
}

fn lists(rows: &[Value], key: &str, t: Types, int: bool) -> ArrayRef {
    let items: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| crate::support::json::f64s(&r[key]))
        .collect();
    let offsets = OffsetBuffer::<i32>::from_lengths(items.iter().map(Vec::len));
    let flat = items.iter().flatten().copied();
    let values: ArrayRef = match (t, int) {
        (Types::Rlcr, true) => Arc::new(Int32Array::from_iter_values(flat.map(|x| x as i32))),
        (Types::Rlcr, false) => Arc::new(Float32Array::from_iter_values(flat.map(|x| x as f32))),
        (Types::Python, true) => Arc::new(Int64Array::from_iter_values(flat.map(|x| x as i64))),
        (Types::Python, false) => Arc::new(Float64Array::from_iter_values(flat)),
    };
    let item = Arc::new(Field::new("item", values.data_type().clone(), true));
    match t {
        Types::Rlcr => Arc::new(ListArray::new(item, offsets, values, None)),
        Types::Python => Arc::new(LargeListArray::new(
            item,
            OffsetBuffer::<i64>::from_lengths(items.iter().map(Vec::len)),
            values,
            None,
        )),
    }
}

fn spans(rows: &[Value], key: &str, t: Types) -> ArrayRef {
    let dt = match t {
        Types::Rlcr => DataType::Int32,
        Types::Python => DataType::Int64,
    };
    let fields = Fields::from(vec![
        Field::new("start", dt.clone(), t == Types::Python),
        Field::new("end", dt, t == Types::Python),
    ]);
    let get = |f: &str| -> Vec<i64> {
        rows.iter()
            .map(|r| r[key][f].as_i64().unwrap_or(0))
            .collect()
    };
    let col = |v: Vec<i64>| -> ArrayRef {
        match t {
            Types::Rlcr => Arc::new(Int32Array::from_iter_values(v.iter().map(|&x| x as i32))),
            Types::Python => Arc::new(Int64Array::from(v)),
        }
    };
    let valid = NullBuffer::from(rows.iter().map(|r| !r[key].is_null()).collect::<Vec<_>>());
    Arc::new(StructArray::new(
        fields,
        vec![col(get("start")), col(get("end"))],
        Some(valid),
    ))
}

/// The rows as one batch in the given types.
fn batch(rows: &[Value], t: Types) -> RecordBatch {
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("prompt_id", strings(rows, "prompt_id", t)),
        ("sample_type", strings(rows, "sample_type", t)),
        ("answer_idx", ints(rows, "answer_idx", t)),
        ("confidence_idx", ints(rows, "confidence_idx", t)),
        ("sample_id", strings(rows, "sample_id", t)),
        ("data_source", strings(rows, "data_source", t)),
        ("response_ids", lists(rows, "response_ids", t, true)),
        (
            "response_logprobs",
            lists(rows, "response_logprobs", t, false),
        ),
        ("response_text", strings(rows, "response_text", t)),
        ("answer_span", spans(rows, "answer_span", t)),
        ("confidence_span", spans(rows, "confidence_span", t)),
        (
            "format_ok",
            Arc::new(BooleanArray::from(
                rows.iter()
                    .map(|r| r["format_ok"].as_bool())
                    .collect::<Vec<_>>(),
            )),
        ),
        ("acc_reward", floats(rows, "acc_reward", t)),
        ("confidence", floats(rows, "confidence", t)),
        ("conf_reward", floats(rows, "conf_reward", t)),
        ("reward", floats(rows, "reward", t)),
    ];
    // every field nullable, as pyarrow infers them
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        cols.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap()
}

/// Write `b` with arrow's plain Parquet writer (no rlcr metadata: a table from elsewhere).
fn write(b: &RecordBatch, p: &Path) {
    let mut w = ArrowWriter::try_new(std::fs::File::create(p).unwrap(), b.schema(), None).unwrap();
    w.write(b).unwrap();
    w.close().unwrap();
}

/// What `advantage` and `report` make of a table: the advantage columns and report's overall
/// figures.
#[derive(Debug, PartialEq)]
struct Outputs {
    advantage: Vec<f32>,
    token_advantages: Vec<Vec<f32>>,
    loss_mask: Vec<Vec<bool>>,
    overall: Value,
}

fn outputs(wd: &Workdir, input: &str) -> Outputs {
    let out = format!("{input}.adv.parquet");
    wd.run(&["advantage", "--input", input, "-o", &out]);
    let b = super::support::table::read(&wd.path(&out));
    let adv = b
        .column_by_name("advantage")
        .unwrap()
        .as_primitive::<arrow::datatypes::Float32Type>()
        .values()
        .to_vec();
    let tok = super::support::table::lists_f32(&b, "token_advantages");
    let mask = b.column_by_name("loss_mask").unwrap().as_list::<i32>();
    let mask: Vec<Vec<bool>> = (0..mask.len())
        .map(|i| {
            mask.value(i)
                .as_boolean()
                .iter()
                .map(|x| x.unwrap())
                .collect()
        })
        .collect();
    let dir = format!("{input}.report");
    wd.run(&["report", "--input", input, "-o", &dir, "--examples", "0"]);
    let m: Value = crate::support::json::read(wd.path(&format!("{dir}/metrics.json")));
    Outputs {
        advantage: adv,
        token_advantages: tok,
        loss_mask: mask,
        overall: m["overall"].clone(),
    }
}

/// A table as `pa.Table.from_pylist` types it (int64 indices, double rewards, large strings,
/// `list<int64>` token ids, `list<double>` log-probs, spans of int64), built here with arrow:
/// `advantage` and `report` read it and give what they give for the same rows in rlcr's types.
#[test]
fn from_pylist_types_read_as_rlcr_types() {
    let wd = Workdir::new();
    let rows = rows();
    write(&batch(&rows, Types::Rlcr), &wd.path("rlcr.parquet"));
    let py = batch(&rows, Types::Python);
    assert_eq!(py.schema().field(2).data_type(), &DataType::Int64);
    write(&py, &wd.path("python.parquet"));
    let want = outputs(&wd, "rlcr.parquet");
    assert!(
        want.advantage.iter().any(|&a| a != 0.0),
        "{:?}",
        want.advantage
    );
    assert_eq!(outputs(&wd, "python.parquet"), want);
}

/// The same rows written by pyarrow (`pa.Table.from_pylist`), polars and pandas themselves, each
/// with its own defaults: every one reads as the rlcr-typed table does. Skipped for a library
/// that is not installed (unless `RLCR_REQUIRE_PYTHON=1`).
#[test]
fn tables_written_by_pyarrow_polars_pandas_feed_advantage_and_report() {
    let wd = Workdir::new();
    let rows = rows();
    write(&batch(&rows, Types::Rlcr), &wd.path("rlcr.parquet"));
    let want = outputs(&wd, "rlcr.parquet");
    let json = wd.write("rows.json", serde_json::to_vec(&rows).unwrap());
    let writers = [
        (
            "pyarrow",
            "import json, sys, pyarrow as pa, pyarrow.parquet as pq\n\
             pq.write_table(pa.Table.from_pylist(json.load(open(sys.argv[1]))), sys.argv[2])",
        ),
        (
            "polars",
            "import json, sys, polars as pl\n\
             pl.DataFrame(json.load(open(sys.argv[1]))).write_parquet(sys.argv[2])",
        ),
        (
            "pandas",
            "import json, sys, pandas as pd\n\
             pd.DataFrame(json.load(open(sys.argv[1]))).to_parquet(sys.argv[2])",
        ),
    ];
    let mut ran = 0;
    for (lib, script) in writers {
        let out = wd.path(&format!("{lib}.parquet"));
        let run = Py::code(lib, script, Needs::Tables).arg(&json).arg(&out);
        if run.stdout().is_none() {
            continue;
        }
        ran += 1;
        let got = outputs(&wd, &format!("{lib}.parquet"));
        assert!(got == want, "{lib}: {:?}\nwant {:?}", got, want);
    }
    eprintln!("{ran} of 3 Python writers ran");
}

/// An int64 that does not fit int32 is an error naming the file, the row and the column (and the
/// value), from every stage that reads the column; nothing is written.
#[test]
fn a_value_that_does_not_fit_names_row_and_column() {
    let wd = Workdir::new();
    let mut rows = rows();
    rows[5]["answer_idx"] = json!(1i64 << 31);
    write(&batch(&rows, Types::Python), &wd.path("big.parquet"));
    let want = "big.parquet, row 5, column `answer_idx`: value 2147483648 does not fit int32";
    let e = wd.fail(
        &["advantage", "--input", "big.parquet", "-o", "a.parquet"],
        1,
    );
    assert!(e.contains(want), "{e}");
    let e = wd.fail(&["report", "--input", "big.parquet", "-o", "rep"], 1);
    assert!(e.contains(want), "{e}");
    // a token id beyond int32, in a list
    let mut rows = self::rows();
    rows[2]["response_ids"] = json!([1, 2, 1i64 << 40, 4]);
    write(&batch(&rows, Types::Python), &wd.path("ids.parquet"));
    let e = wd.fail(
        &["advantage", "--input", "ids.parquet", "-o", "a.parquet"],
        1,
    );
    assert!(
        e.contains(
            "ids.parquet, row 2, column `response_ids`: value 1099511627776 (item 2 of the \
             row's list) does not fit int32"
        ),
        "{e}"
    );
    assert!(!wd.path("a.parquet").exists());
}

/// Every column whose type cannot be read is named in one error, not one per run.
#[test]
fn every_mismatch_of_a_table_is_reported_at_once() {
    let wd = Workdir::new();
    let rows = rows();
    let b = batch(&rows, Types::Python);
    let text = |key: &str| -> ArrayRef {
        Arc::new(StringArray::from(
            rows.iter().map(|r| r[key].to_string()).collect::<Vec<_>>(),
        ))
    };
    let mut b = super::support::table::replace(&b, "answer_idx", text("answer_idx"));
    b = super::support::table::replace(&b, "reward", text("reward"));
    b = super::support::table::replace(&b, "format_ok", text("format_ok"));
    write(&b, &wd.path("bad.parquet"));
    let e = wd.fail(
        &["advantage", "--input", "bad.parquet", "-o", "a.parquet"],
        1,
    );
    assert!(
        e.contains("bad.parquet: 3 columns do not match the rlcr.trajectory schema:"),
        "{e}"
    );
    for want in [
        "column `answer_idx` has type Utf8, expected int32",
        "column `format_ok` has type Utf8, expected bool",
        "column `reward` has type Utf8, expected float32",
    ] {
        assert!(e.contains(want), "{want}\n{e}");
    }
}
