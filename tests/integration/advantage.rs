//! `rlcr advantage` end to end: tables built here, the real binary, values checked against
//! the worked numbers of docs/math.md §2.3 (confidence tree) and §2.6 (GAE) and against hand
//! calculations.
#![allow(clippy::needless_range_loop)] // index loops read better against the worked tables
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float32Array, Int32Array, ListArray, RecordBatch,
    StringArray, StructArray,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Fields, Float32Type, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use rlcr::table::cols::{build_list_f32 as f32_list, build_list_i32 as i32_list};

/// One input row.
#[derive(Clone)]
struct Row {
    prompt: &'static str,
    kind: &'static str,
    answer_idx: i32,
    len: usize,
    span: Option<(i32, i32)>,
    reward: f32,
    values: Option<Vec<f32>>,
    info: Option<Vec<bool>>,
}

fn row(
    prompt: &'static str,
    kind: &'static str,
    answer_idx: i32,
    len: usize,
    span: Option<(i32, i32)>,
    reward: f32,
) -> Row {
    Row {
        prompt,
        kind,
        answer_idx,
        len,
        span,
        reward,
        values: None,
        info: None,
    }
}

fn span_col(spans: Vec<Option<(i32, i32)>>) -> ArrayRef {
    let fields = Fields::from(vec![
        Field::new("start", DataType::Int32, false),
        Field::new("end", DataType::Int32, false),
    ]);
    let nulls = NullBuffer::from(spans.iter().map(|s| s.is_some()).collect::<Vec<_>>());
    let start = Int32Array::from(
        spans
            .iter()
            .map(|s| s.map_or(0, |x| x.0))
            .collect::<Vec<_>>(),
    );
    let end = Int32Array::from(
        spans
            .iter()
            .map(|s| s.map_or(0, |x| x.1))
            .collect::<Vec<_>>(),
    );
    Arc::new(StructArray::new(
        fields,
        vec![Arc::new(start), Arc::new(end)],
        Some(nulls),
    ))
}

fn write_table(path: &Path, rows: &[Row]) {
    write_table_with(path, rows, vec![]);
}

/// Like [`write_table`], with extra columns appended.
fn write_table_with(path: &Path, rows: &[Row], extra: Vec<(Field, ArrayRef)>) {
    write_part(path, rows, extra, 0);
}

/// Like [`write_table_with`], for a part of a table whose first row is row `first` (sample ids
/// are unique across the parts).
fn write_part(path: &Path, rows: &[Row], extra: Vec<(Field, ArrayRef)>, first: usize) {
    let mut fields = vec![
        Field::new("prompt_id", DataType::Utf8, false),
        Field::new("sample_type", DataType::Utf8, false),
        Field::new("answer_idx", DataType::Int32, false),
        Field::new("sample_id", DataType::Utf8, false),
        Field::new(
            "response_ids",
            DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
            false,
        ),
    ];
    let span_t = DataType::Struct(Fields::from(vec![
        Field::new("start", DataType::Int32, false),
        Field::new("end", DataType::Int32, false),
    ]));
    fields.push(Field::new("answer_span", span_t.clone(), true));
    fields.push(Field::new("confidence_span", span_t, true));
    fields.push(Field::new("reward", DataType::Float32, false));
    let ids: Vec<i32> = rows
        .iter()
        .flat_map(|r| (0..r.len as i32).collect::<Vec<_>>())
        .collect();
    let mut cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.prompt).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.kind).collect::<Vec<_>>(),
        )),
        Arc::new(Int32Array::from(
            rows.iter().map(|r| r.answer_idx).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            (0..rows.len())
                .map(|i| format!("s{}", first + i))
                .collect::<Vec<_>>(),
        )),
        Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Int32, true)),
            OffsetBuffer::from_lengths(rows.iter().map(|r| r.len)),
            Arc::new(Int32Array::from(ids)),
            None,
        )),
        span_col(
            rows.iter()
                .map(|r| if r.kind == "answer" { r.span } else { None })
                .collect(),
        ),
        span_col(
            rows.iter()
                .map(|r| if r.kind == "confidence" { r.span } else { None })
                .collect(),
        ),
        Arc::new(Float32Array::from(
            rows.iter().map(|r| r.reward).collect::<Vec<_>>(),
        )),
    ];
    if rows.iter().any(|r| r.values.is_some()) {
        fields.push(Field::new(
            "values",
            DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
            false,
        ));
        cols.push(f32_list(
            rows.iter()
                .map(|r| r.values.clone().unwrap_or_default())
                .collect::<Vec<_>>(),
        ));
    }
    if rows.iter().any(|r| r.info.is_some()) {
        fields.push(Field::new(
            "info_mask",
            DataType::List(Arc::new(Field::new("item", DataType::Boolean, true))),
            false,
        ));
        let infos: Vec<bool> = rows
            .iter()
            .flat_map(|r| r.info.clone().unwrap_or(vec![true; r.len]))
            .collect();
        cols.push(Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Boolean, true)),
            OffsetBuffer::from_lengths(rows.iter().map(|r| r.len)),
            Arc::new(BooleanArray::from(infos)),
            None,
        )));
    }
    for (f, c) in extra {
        fields.push(f);
        cols.push(c);
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), cols).expect("test table");
    let f = std::fs::File::create(path).expect("create test table");
    // Small row groups, so that every test also covers the row-group-by-row-group splicing.
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(5))
        .build();
    let mut w = ArrowWriter::try_new(f, schema, Some(props)).expect("writer");
    w.write(&batch).expect("write");
    w.close().expect("close");
}

struct Out {
    advantage: Vec<f32>,
    token_advantages: Vec<Vec<f32>>,
    loss_mask: Vec<Vec<bool>>,
    returns: Option<Vec<Vec<f32>>>,
    trajectory_score: Option<Vec<f32>>,
    config: serde_json::Value,
    /// `rlcr.statistics`.
    stats: serde_json::Value,
    columns: Vec<String>,
}

fn read_out(path: &Path) -> Out {
    let f = std::fs::File::open(path).expect("open output");
    let b = ParquetRecordBatchReaderBuilder::try_new(f).expect("parquet");
    let kv = b
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap_or_default();
    let json = |key: &str| -> serde_json::Value {
        kv.iter()
            .find(|k| k.key == key)
            .and_then(|k| k.value.clone())
            .map(|v| serde_json::from_str(&v).expect("metadata json"))
            .unwrap_or(serde_json::Value::Null)
    };
    let config = json("rlcr.config");
    let stats = json("rlcr.statistics");
    assert_eq!(
        kv.iter()
            .find(|k| k.key == "rlcr.stage")
            .and_then(|k| k.value.clone())
            .as_deref(),
        Some("advantage")
    );
    let columns = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let mut out = Out {
        advantage: vec![],
        token_advantages: vec![],
        loss_mask: vec![],
        returns: None,
        trajectory_score: None,
        config,
        stats,
        columns,
    };
    for batch in b.build().expect("reader") {
        let batch = batch.expect("batch");
        let f32s = |c: &str| -> Vec<f32> {
            batch
                .column_by_name(c)
                .expect(c)
                .as_primitive::<Float32Type>()
                .values()
                .to_vec()
        };
        let lists = |c: &str| -> Vec<Vec<f32>> {
            let l = batch.column_by_name(c).expect(c).as_list::<i32>().clone();
            (0..l.len())
                .map(|i| l.value(i).as_primitive::<Float32Type>().values().to_vec())
                .collect()
        };
        out.advantage.extend(f32s("advantage"));
        out.token_advantages.extend(lists("token_advantages"));
        let lm = batch
            .column_by_name("loss_mask")
            .expect("loss_mask")
            .as_list::<i32>()
            .clone();
        out.loss_mask.extend((0..lm.len()).map(|i| {
            lm.value(i)
                .as_boolean()
                .iter()
                .map(|b| b == Some(true))
                .collect::<Vec<_>>()
        }));
        if batch.column_by_name("returns").is_some() {
            out.returns
                .get_or_insert_with(Vec::new)
                .extend(lists("returns"));
            out.trajectory_score
                .get_or_insert_with(Vec::new)
                .extend(f32s("trajectory_score"));
        }
    }
    out
}

/// Every input column comes out unchanged (same type, same values), in the same order.
fn assert_passthrough(input: &Path, output: &Path) {
    let read = |p: &Path| -> RecordBatch {
        let b = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(p).unwrap()).unwrap();
        let schema = b.schema().clone();
        let batches: Vec<RecordBatch> = b.build().unwrap().map(|r| r.unwrap()).collect();
        arrow::compute::concat_batches(&schema, &batches).unwrap()
    };
    let (i, o) = (read(input), read(output));
    assert_eq!(i.num_rows(), o.num_rows());
    for (k, f) in i.schema().fields().iter().enumerate() {
        assert_eq!(o.schema().field(k), f.as_ref(), "column {k}");
        assert_eq!(
            o.column(k).as_ref(),
            i.column(k).as_ref(),
            "column `{}`",
            f.name()
        );
    }
}

use crate::{rlcr, rlcr_ok as ok};

fn dir() -> (crate::Workdir, PathBuf, PathBuf) {
    let w = crate::Workdir::new();
    let i = w.path("scored.parquet");
    let o = w.path("train.parquet");
    (w, i, o)
}

fn close(a: f32, b: f64, tol: f64) -> bool {
    (a as f64 - b).abs() <= tol
}

/// The worked tree of docs/math.md §2.3 as a table: one prompt, answers [correct, wrong], three confidences each, plus a
/// second prompt whose answers are all correct (a zero-std group) with a malformed (null-span)
/// confidence.
fn tree_rows() -> Vec<Row> {
    let mut rows = vec![
        row("p0", "answer", 0, 6, Some((1, 5)), 1.0),
        row("p0", "answer", 1, 4, Some((0, 4)), 0.0),
    ];
    for (k, r) in [
        (0, 0.99f32),
        (0, 0.84),
        (0, 0.51),
        (1, 0.96),
        (1, 0.75),
        (1, 0.36),
    ] {
        rows.push(row("p0", "confidence", k, 3, Some((1, 3)), r));
    }
    rows.push(row("p1", "answer", 0, 2, Some((0, 2)), 1.0));
    rows.push(row("p1", "answer", 1, 2, Some((0, 2)), 1.0));
    rows.push(row("p1", "confidence", 0, 3, None, 0.0));
    rows.push(row("p1", "confidence", 0, 3, Some((0, 3)), 0.5));
    rows
}

#[test]
fn advantage_rlcr_tree_matches_worked_tree() {
    let (_d, i, o) = dir();
    write_table(&i, &tree_rows());
    let r = ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--lambda-conf",
        "0.5",
    ]);
    let out = read_out(&o);
    let want = [0.855183, 0.244338, -1.099521, 0.886793, 0.197065, -1.083859];
    for (k, w) in want.iter().enumerate() {
        assert!(
            close(out.advantage[2 + k], 0.5 * w, 1e-6),
            "row {}: {} vs {}",
            2 + k,
            out.advantage[2 + k],
            0.5 * w
        );
    }
    let h = 0.5 / (0.5f64.sqrt() + 1e-6);
    assert!(close(out.advantage[0], h, 1e-6) && close(out.advantage[1], -h, 1e-6));
    // Zero-std answer group of p1 → 0.
    assert_eq!(&out.advantage[8..10], &[0.0, 0.0]);
    // Masks and token advantages: answer row 0 span [1, 5) of 6 tokens.
    assert_eq!(out.loss_mask[0], vec![false, true, true, true, true, false]);
    let a0 = out.advantage[0];
    assert_eq!(out.token_advantages[0], vec![0.0, a0, a0, a0, a0, 0.0]);
    // Confidence span [1, 3) of 3 tokens.
    assert_eq!(out.loss_mask[2], vec![false, true, true]);
    // Null span → whole response by default.
    assert_eq!(out.loss_mask[10], vec![true, true, true]);
    // Statistics in the metadata and on stderr.
    let st = &out.stats;
    assert_eq!(out.config["estimator"], "rlcr");
    assert_eq!(st["answer"]["rows"], 4);
    assert_eq!(st["confidence"]["rows"], 8);
    assert_eq!(st["groups"]["answer"]["zero_std"], 1);
    assert_eq!(st["groups"]["answer"]["groups"], 2);
    assert_eq!(st["groups"]["confidence"]["groups"], 3);
    assert_eq!(st["confidence"]["null_span"], 1);
    // masked tokens: answers 4 + 4 + 2 + 2; confidences 6×2 + 3 + 3.
    assert_eq!(st["answer"]["masked_tokens"], 12);
    assert_eq!(st["confidence"]["masked_tokens"], 18);
    assert!((st["answer"]["reward_mean"].as_f64().unwrap() - 0.75).abs() < 1e-9);
    assert!(r.stderr.contains("zero-std fraction"), "{}", r.stderr);
    assert!(out.columns.contains(&"sample_id".to_string()));
    assert_passthrough(&i, &o);
}

#[test]
fn advantage_options_skip_drop_and_variant_c() {
    let (_d, i, o) = dir();
    write_table(&i, &tree_rows());
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--on-missing-span",
        "skip",
        "--drop-zero-std",
        "--conf-norm",
        "answer+prompt",
    ]);
    let out = read_out(&o);
    let want = [0.848871, 0.242535, -1.091406, 1.091406, 0.242535, -1.333941];
    for (k, w) in want.iter().enumerate() {
        assert!(close(out.advantage[2 + k], *w, 1e-6), "row {}", 2 + k);
    }
    assert_eq!(out.loss_mask[10], vec![false; 3], "null span skipped");
    assert_eq!(out.loss_mask[8], vec![false; 2], "zero-std group dropped");
    assert_eq!(out.stats["answer"]["dropped_zero_std"], 2);

    // --preset rlcr: mean-only centring (RLCR's scale_rewards=false).
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--preset",
        "rlcr",
    ]);
    let out = read_out(&o);
    for (k, w) in [0.21, 0.06, -0.27, 0.27, 0.06, -0.33].iter().enumerate() {
        assert!(close(out.advantage[2 + k], *w, 1e-6), "row {}", 2 + k);
    }
    assert!(close(out.advantage[0], 0.5, 1e-7));

    // grpo pools the prompt's six confidences (docs/math.md §2.3 variant (b)).
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--estimator",
        "grpo",
    ]);
    let out = read_out(&o);
    for (k, w) in [1.010898, 0.416252, -0.891969, 0.891969, 0.059465, -1.486615]
        .iter()
        .enumerate()
    {
        assert!(close(out.advantage[2 + k], *w, 1e-6), "row {}", 2 + k);
    }
}

#[test]
fn advantage_gae_matches_worked_example() {
    let (_d, i, o) = dir();
    let mut r = row("p0", "answer", 0, 5, Some((0, 5)), 1.0);
    r.values = Some(vec![0.1, 0.2, 0.3, 0.4, 0.5]);
    write_table(&i, &[r.clone()]);
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--estimator",
        "gae",
        "--lam",
        "0.95",
    ]);
    let out = read_out(&o);
    let w = [1.232251, 0.647709, 0.032402, -0.615290, -1.297072];
    for t in 0..5 {
        assert!(close(out.token_advantages[0][t], w[t], 1e-5), "token {t}");
    }
    let ret = [0.878241, 0.913937, 0.946250, 0.975000, 1.000000];
    let rets = out.returns.as_ref().unwrap();
    for t in 0..5 {
        assert!(close(rets[0][t], ret[t], 1e-6), "return {t}");
    }
    assert!(close(
        out.trajectory_score.as_ref().unwrap()[0],
        ret.iter().sum(),
        1e-5
    ));
    assert!(close(out.advantage[0], w[0], 1e-5));

    // Observation tokens 2, 3 (info_mask 0): docs/math.md §2.6 masked row, returns [0.93625, 0.975, ., ., 1.0].
    r.info = Some(vec![true, true, false, false, true]);
    write_table(&i, &[r]);
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--estimator",
        "gae",
        "--lam",
        "0.95",
    ]);
    let out = read_out(&o);
    assert_eq!(out.loss_mask[0], vec![true, true, false, false, true]);
    let rets = &out.returns.as_ref().unwrap()[0];
    for (t, w) in [(0, 0.93625), (1, 0.975), (2, 0.8), (3, 0.9), (4, 1.0)] {
        assert!(close(rets[t], w, 1e-6), "return {t}: {}", rets[t]);
    }
    assert!(close(
        out.trajectory_score.as_ref().unwrap()[0],
        0.93625 + 0.975 + 1.0,
        1e-5
    ));
    assert_eq!(out.token_advantages[0][2], 0.0);
}

#[test]
fn advantage_bad_input_exits_1_and_writes_nothing() {
    let (_d, i, o) = dir();
    // A span past the end of its response.
    let rows = vec![
        row("p0", "answer", 0, 3, Some((0, 9)), 1.0),
        row("p0", "answer", 1, 3, None, 0.0),
    ];
    write_table(&i, &rows);
    let r = rlcr(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    assert!(
        r.stderr.contains("row 0") && r.stderr.contains("answer_span"),
        "{}",
        r.stderr
    );
    assert!(!o.exists());
    // gae without a values column.
    write_table(&i, &[row("p0", "answer", 0, 3, None, 1.0)]);
    let r = rlcr(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--estimator",
        "gae",
    ]);
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("values"), "{}", r.stderr);
    assert!(!o.exists());
    // The output may not be the input (also through a link).
    let r = rlcr(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        i.to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("never modifies an input"), "{}", r.stderr);
    // A usage error: exit 2.
    let r = rlcr(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--eps",
        "-1",
    ]);
    assert_eq!(r.status.code(), Some(2), "{}", r.stderr);
    assert_eq!(_d.listing(), vec!["scored.parquet"]);
}

#[test]
fn advantage_is_independent_of_batch_size() {
    let (d, i, o) = dir();
    write_table(&i, &tree_rows());
    let o2 = d.path("b.parquet");
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--batch-size",
        "1",
    ]);
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o2.to_str().unwrap(),
        "--batch-size",
        "5",
    ]);
    let (a, b) = (read_out(&o), read_out(&o2));
    assert_eq!(a.advantage.len(), 12);
    assert_eq!(a.advantage, b.advantage);
    assert_eq!(a.token_advantages, b.token_advantages);
    assert_eq!(a.stats, b.stats);
}

fn list_field(name: &str, item: DataType) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new("item", item, true))),
        false,
    )
}

/// `reward_components` rows of (name, turn or None for global, value, weight).
/// One reward component: (name, turn or None for global, value, weight).
type Comp<'a> = (&'a str, Option<i32>, f32, f32);

fn components(rows: &[Vec<Comp<'_>>]) -> (Field, ArrayRef) {
    let fields = Fields::from(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("turn", DataType::Int32, true),
        Field::new("value", DataType::Float32, false),
        Field::new("weight", DataType::Float32, false),
    ]);
    let all: Vec<_> = rows.iter().flatten().collect();
    let st = StructArray::new(
        fields.clone(),
        vec![
            Arc::new(StringArray::from(
                all.iter().map(|c| c.0).collect::<Vec<_>>(),
            )),
            Arc::new(Int32Array::from(
                all.iter().map(|c| c.1).collect::<Vec<_>>(),
            )),
            Arc::new(Float32Array::from(
                all.iter().map(|c| c.2).collect::<Vec<_>>(),
            )),
            Arc::new(Float32Array::from(
                all.iter().map(|c| c.3).collect::<Vec<_>>(),
            )),
        ],
        None,
    );
    let item = Arc::new(Field::new("item", DataType::Struct(fields), true));
    (
        Field::new("reward_components", DataType::List(item.clone()), false),
        Arc::new(ListArray::new(
            item,
            OffsetBuffer::from_lengths(rows.iter().map(|r| r.len())),
            Arc::new(st),
            None,
        )),
    )
}

/// KG-R1's multi-turn GRPO, by hand (same numbers as the unit test `hand_example`, with
/// the default weights 1.0 / 1.0): turn group {0.25, 0.15, 0.05}, global group {0.7, 0.3}.
#[test]
fn advantage_grpo_multiturn_by_hand() {
    let (_d, i, o) = dir();
    let rows = vec![
        row("p0", "answer", 0, 6, None, 0.9),
        row("p0", "answer", 1, 3, None, 0.35),
    ];
    let comps = components(&[
        vec![
            ("kg_query_validity", Some(1), 1.0, 0.1),
            ("format_score", Some(1), 1.0, 0.15),
            ("format_score", Some(2), 1.0, 0.15),
            ("exact_match", None, 1.0, 0.3),
            ("retrieval_quality", None, 1.0, 0.4),
            ("_raw_exact_match", None, 1.0, 1.0),
        ],
        vec![
            ("is_answer_score", Some(1), 0.5, 0.1),
            ("exact_match", None, 1.0, 0.3),
        ],
    ]);
    let turns = (
        list_field("token_turn_ids", DataType::Int32),
        i32_list(&[vec![-1, 1, 1, -1, 2, 2], vec![1, 1, 1]]),
    );
    write_table_with(&i, &rows, vec![comps, turns]);
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--estimator",
        "grpo-multiturn",
    ]);
    let out = read_out(&o);
    let a1 = 0.1 / (0.1 + 1e-6);
    let g = 0.2 / (0.08f64.sqrt() + 1e-6);
    let t0 = &out.token_advantages[0];
    let want0 = [0.0, a1 + g, a1 + g, 0.0, g, g];
    for t in 0..6 {
        assert!(
            close(t0[t], want0[t], 1e-5),
            "row 0 token {t}: {} vs {}",
            t0[t],
            want0[t]
        );
    }
    assert_eq!(out.loss_mask[0], vec![false, true, true, false, true, true]);
    for t in 0..3 {
        assert!(
            close(out.token_advantages[1][t], -a1 - g, 1e-5),
            "row 1 token {t}"
        );
    }
    assert!(close(out.advantage[0], a1 / 2.0 + g, 1e-5));
    assert!(close(out.advantage[1], -a1 - g, 1e-5));
    assert_eq!(out.stats["groups"]["turn"]["groups"], 1);
    assert_passthrough(&i, &o);

    // KG-R1 preset: 0.5 · A_turn + A_global.
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--estimator",
        "grpo-multiturn",
        "--preset",
        "kg-r1",
    ]);
    let out = read_out(&o);
    assert!(close(out.token_advantages[0][1], 0.5 * a1 + g, 1e-5));
}

/// KL in the reward with GRPO (`--norm mean` so the numbers are plain differences), then the
/// adaptive controller and its resumption from the output's metadata.
#[test]
fn advantage_kl_in_reward_and_adaptive_state() {
    let (d, i, o) = dir();
    let rows = vec![
        row("p0", "answer", 0, 2, Some((0, 2)), 1.0),
        row("p0", "answer", 1, 2, Some((0, 1)), 0.0),
    ];
    // Row 0: k1 = [0.5, -1] (sum -0.5); row 1: k1 = [0.1, (outside the mask) 7].
    let lp = (
        list_field("response_logprobs", DataType::Float32),
        f32_list(&[vec![-1.0, -2.0], vec![-0.5, 0.0]]),
    );
    let rf = (
        list_field("ref_logprobs", DataType::Float32),
        f32_list(&[vec![-1.5, -1.0], vec![-0.6, -7.0]]),
    );
    write_table_with(&i, &rows, vec![lp, rf]);
    let base = [
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--estimator",
        "grpo",
        "--norm",
        "mean",
    ];
    ok(&[&base[..], &["--kl-coef", "0.1"]].concat());
    let out = read_out(&o);
    // scores 1 + 0.05 = 1.05 and 0 − 0.01 = −0.01; mean 0.52.
    assert!(
        close(out.advantage[0], 0.53, 1e-6) && close(out.advantage[1], -0.53, 1e-6),
        "{:?}",
        out.advantage
    );
    let kl = &out.stats["kl"];
    assert!(
        (kl["current_kl"].as_f64().unwrap() - (-0.075)).abs() < 1e-6,
        "{kl}"
    );
    assert_eq!(kl["next_coef"].as_f64(), Some(0.1));

    // Adaptive: err = clip(−0.075/0.1 − 1, ±0.2) = −0.2; β' = 0.1·(1 − 0.2·2/100) = 0.0996.
    ok(&[
        &base[..],
        &[
            "--kl-coef",
            "0.1",
            "--kl-ctrl",
            "adaptive",
            "--kl-target",
            "0.1",
            "--kl-horizon",
            "100",
        ],
    ]
    .concat());
    let next = read_out(&o).stats["kl"]["next_coef"].as_f64().unwrap();
    assert!((next - 0.0996).abs() < 1e-12, "{next}");
    let o2 = d.path("next.parquet");
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o2.to_str().unwrap(),
        "--estimator",
        "grpo",
        "--norm",
        "mean",
        "--kl-ctrl",
        "adaptive",
        "--kl-target",
        "0.1",
        "--kl-horizon",
        "100",
        "--kl-state",
        o.to_str().unwrap(),
    ]);
    let out = read_out(&o2);
    assert_eq!(out.stats["kl"]["coef"].as_f64(), Some(0.0996));
    let half = (1.0 + 0.0996 * 0.5 + 0.00996) / 2.0;
    assert!(close(out.advantage[0], half, 1e-6), "{:?}", out.advantage);

    // KL without a ref_logprobs column: exit 1 naming it.
    write_table(&i, &rows);
    let r = rlcr(&[&base[..], &["--kl-coef", "0.1"]].concat());
    assert_eq!(r.status.code(), Some(1));
    assert!(r.stderr.contains("ref_logprobs"), "{}", r.stderr);
}

/// Tables written by polars/pyarrow use LargeUtf8, LargeList and 64-bit numbers: read them, copy
/// them through unchanged.
#[test]
fn advantage_reads_large_types() {
    use arrow::array::{LargeListArray, LargeStringArray};
    let (_d, i, o) = dir();
    let item = Arc::new(Field::new("item", DataType::Int32, true));
    let fields = vec![
        Field::new("prompt_id", DataType::LargeUtf8, false),
        Field::new("sample_type", DataType::LargeUtf8, false),
        Field::new("answer_idx", DataType::Int32, false),
        Field::new("response_ids", DataType::LargeList(item.clone()), false),
        Field::new("reward", DataType::Float32, false),
    ];
    let cols: Vec<ArrayRef> = vec![
        Arc::new(LargeStringArray::from(vec!["p", "p", "p"])),
        Arc::new(LargeStringArray::from(vec!["answer"; 3])),
        Arc::new(Int32Array::from(vec![0, 1, 2])),
        Arc::new(LargeListArray::new(
            item,
            OffsetBuffer::from_lengths([2, 1, 3]),
            Arc::new(Int32Array::from(vec![5, 6, 7, 8, 9, 10])),
            None,
        )),
        Arc::new(Float32Array::from(vec![0.2, 0.9, 0.5])),
    ];
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), cols).unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&i).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
    ]);
    let out = read_out(&o);
    // docs/math.md §2.1 [0.2, 0.9, 0.5], verl column (unbiased, eps 1e-6).
    for (k, w) in [-0.949155, 1.044071, -0.094916].iter().enumerate() {
        assert!(close(out.advantage[k], *w, 1e-6));
    }
    assert_eq!(out.loss_mask[2], vec![true; 3]);
    let f = std::fs::File::open(&o).unwrap();
    let b = ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
    assert_eq!(
        b.schema()
            .field_with_name("response_ids")
            .unwrap()
            .data_type(),
        &DataType::LargeList(Arc::new(Field::new("item", DataType::Int32, true)))
    );
    let got = b.build().unwrap().next().unwrap().unwrap();
    assert_eq!(
        got.column_by_name("response_ids")
            .unwrap()
            .as_list::<i64>()
            .values()
            .as_primitive::<arrow::datatypes::Int32Type>()
            .values()
            .to_vec(),
        vec![5, 6, 7, 8, 9, 10]
    );
}

/// An input folder of part files gives the same rows as the single file (one output file).
#[test]
fn advantage_reads_a_folder_of_parts() {
    let (d, i, o) = dir();
    let rows = tree_rows();
    write_table(&i, &rows);
    ok(&[
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
    ]);
    let parts = d.path("parts");
    std::fs::create_dir_all(&parts).unwrap();
    write_table(&parts.join("part-0.parquet"), &rows[..7]);
    write_part(&parts.join("part-1.parquet"), &rows[7..], vec![], 7);
    let o2 = d.path("from-parts.parquet");
    ok(&[
        "advantage",
        "--input",
        parts.to_str().unwrap(),
        "-o",
        o2.to_str().unwrap(),
    ]);
    let (a, b) = (read_out(&o), read_out(&o2));
    assert_eq!(a.advantage, b.advantage);
    assert_eq!(a.token_advantages, b.token_advantages);
    assert_eq!(a.loss_mask, b.loss_mask);
    assert_eq!(a.stats, b.stats);
}

/// GAE with the KL penalty in the token rewards, both reward distributions, by hand
/// (γ = λ = 1, values 0, so returns are reverse cumulative sums of the token rewards).
#[test]
fn advantage_gae_with_kl_by_hand() {
    let (_d, i, o) = dir();
    let mut r = row("p0", "answer", 0, 3, Some((0, 3)), 1.0);
    r.values = Some(vec![0.0; 3]);
    // k1 = logp − ref = [0.5, −1, 0.1]; β = 0.1.
    let lp = (
        list_field("response_logprobs", DataType::Float32),
        f32_list(&[vec![-1.0, -2.0, -0.5]]),
    );
    let rf = (
        list_field("ref_logprobs", DataType::Float32),
        f32_list(&[vec![-1.5, -1.0, -0.6]]),
    );
    write_table_with(&i, &[r], vec![lp, rf]);
    let args = [
        "advantage",
        "--input",
        i.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
        "--estimator",
        "gae",
        "--kl-coef",
        "0.1",
    ];
    ok(&args);
    let out = read_out(&o);
    // final_token_only: token rewards [−0.05, 0.1, 1 − 0.01].
    let rets = &out.returns.as_ref().unwrap()[0];
    for (t, w) in [1.04, 1.09, 0.99].iter().enumerate() {
        assert!(close(rets[t], *w, 1e-6), "token {t}: {}", rets[t]);
    }
    assert!(close(out.trajectory_score.as_ref().unwrap()[0], 3.12, 1e-5));
    // turn_proportional: the reward spread evenly, 1/3 per token.
    ok(&[&args[..], &["--reward-distribution", "turn_proportional"]].concat());
    let out = read_out(&o);
    let rets = &out.returns.as_ref().unwrap()[0];
    let third = 1.0 / 3.0;
    // returns: t2 = 1/3 − 0.01, t1 = t2 + 1/3 + 0.1, t0 = t1 + 1/3 − 0.05 = 1.04.
    for (t, w) in [1.04, 2.0 * third + 0.09, third - 0.01].iter().enumerate() {
        assert!(close(rets[t], *w, 1e-6), "token {t}: {}", rets[t]);
    }
}
