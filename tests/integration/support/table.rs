//! Tables for tests: read a whole table, write one with rlcr's metadata, and the surgery the
//! bad-input cases make (every column rebuilt nullable, as other tools write them): replace, drop,
//! null, set one value, edit one row's list, keep rows.
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, Float32Array, RecordBatch, StringArray};
use arrow::datatypes::{Field, Schema};
use rlcr::table::{cols, Meta, Reader};

/// All rows of a table in one batch.
pub fn read(p: &Path) -> RecordBatch {
    let r = Reader::open(p).unwrap();
    let schema = r.schema();
    let batches: Vec<RecordBatch> = r.map(|b| b.unwrap()).collect();
    arrow::compute::concat_batches(&schema, &batches).unwrap()
}

/// Write `b` as one table with rlcr's metadata naming `schema_name` (stage `test`).
pub fn write(b: &RecordBatch, p: &Path, schema_name: &str) {
    let meta = Meta {
        schema_name: schema_name.to_string(),
        schema_version: 1,
        stage: "test".into(),
        config: serde_json::json!({}),
        inputs: vec![],
        extra: Default::default(),
    };
    rlcr::table::write_table(p, b.schema(), std::slice::from_ref(b), &meta).unwrap();
}

fn rebuild(cols: Vec<(String, ArrayRef)>) -> RecordBatch {
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, a)| Field::new(n, a.data_type().clone(), true))
        .collect();
    let arrays: Vec<ArrayRef> = cols.into_iter().map(|(_, a)| a).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

fn columns(b: &RecordBatch) -> Vec<(String, ArrayRef)> {
    b.schema()
        .fields()
        .iter()
        .zip(b.columns())
        .map(|(f, c)| (f.name().clone(), c.clone()))
        .collect()
}

/// `b` with column `name` replaced by `a` (any type).
pub fn replace(b: &RecordBatch, name: &str, a: ArrayRef) -> RecordBatch {
    assert!(b.column_by_name(name).is_some(), "no column {name}");
    rebuild(
        columns(b)
            .into_iter()
            .map(|(n, c)| if n == name { (n, a.clone()) } else { (n, c) })
            .collect(),
    )
}

pub fn drop_col(b: &RecordBatch, name: &str) -> RecordBatch {
    assert!(b.column_by_name(name).is_some(), "no column {name}");
    rebuild(columns(b).into_iter().filter(|(n, _)| n != name).collect())
}

pub fn null_at(b: &RecordBatch, name: &str, row: usize) -> RecordBatch {
    let c = b.column_by_name(name).unwrap();
    let mask = BooleanArray::from((0..b.num_rows()).map(|i| i == row).collect::<Vec<_>>());
    replace(b, name, arrow::compute::nullif(c.as_ref(), &mask).unwrap())
}

pub fn set_str(b: &RecordBatch, name: &str, row: usize, v: &str) -> RecordBatch {
    // A text column, or a native `messages` column as its JSON text (schema version 1's form).
    let c = rlcr::table::nested::messages_text(b.column_by_name(name).unwrap().as_ref()).unwrap();
    let vals: Vec<Option<String>> = (0..c.len())
        .map(|i| {
            if i == row {
                Some(v.to_string())
            } else {
                c.is_valid(i).then(|| c.value(i).to_string())
            }
        })
        .collect();
    replace(b, name, Arc::new(StringArray::from(vals)))
}

pub fn set_f32(b: &RecordBatch, name: &str, row: usize, v: f32) -> RecordBatch {
    let c = cols::f32_col(b, "t", name).unwrap();
    let vals: Vec<Option<f32>> = (0..c.len())
        .map(|i| {
            if i == row {
                Some(v)
            } else {
                c.is_valid(i).then(|| c.value(i))
            }
        })
        .collect();
    replace(b, name, Arc::new(Float32Array::from(vals)))
}

/// A text column (or `messages`, as its JSON text), null rows as `None`.
pub fn texts(b: &RecordBatch, name: &str) -> Vec<Option<String>> {
    let a = rlcr::table::nested::messages_text(b.column_by_name(name).unwrap().as_ref()).unwrap();
    (0..a.len())
        .map(|i| a.is_valid(i).then(|| a.value(i).to_string()))
        .collect()
}

/// A text column, null rows as `""`.
pub fn strs(b: &RecordBatch, name: &str) -> Vec<String> {
    texts(b, name)
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect()
}

fn scalars<T: arrow::datatypes::ArrowPrimitiveType>(
    b: &RecordBatch,
    name: &str,
) -> Vec<Option<T::Native>> {
    let a = b
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_any()
        .downcast_ref::<arrow::array::PrimitiveArray<T>>()
        .unwrap_or_else(|| panic!("column {name} is not {:?}", T::DATA_TYPE));
    (0..a.len())
        .map(|i| a.is_valid(i).then(|| a.value(i)))
        .collect()
}

/// A float32 column, null rows as `None`.
pub fn f32s(b: &RecordBatch, name: &str) -> Vec<Option<f32>> {
    scalars::<arrow::datatypes::Float32Type>(b, name)
}

/// An int32 column, null rows as `None`.
pub fn opt_i32s(b: &RecordBatch, name: &str) -> Vec<Option<i32>> {
    scalars::<arrow::datatypes::Int32Type>(b, name)
}

/// An int32 column without nulls.
pub fn i32s(b: &RecordBatch, name: &str) -> Vec<i32> {
    opt_i32s(b, name)
        .into_iter()
        .map(|v| v.unwrap_or_else(|| panic!("null in {name}")))
        .collect()
}

/// A span column (`struct<start, end>`), null rows as `None`.
pub fn spans(b: &RecordBatch, name: &str) -> Vec<Option<(usize, usize)>> {
    cols::spans(b, "t", name)
        .unwrap()
        .into_iter()
        .map(|s| s.map(|(a, e)| (a as usize, e as usize)))
        .collect()
}

/// A token-id column (`list<int32>`) as ids.
pub fn id_lists(b: &RecordBatch, name: &str) -> Vec<Vec<u32>> {
    lists_i32(b, name)
        .into_iter()
        .map(|v| v.into_iter().map(|x| x as u32).collect())
        .collect()
}

pub fn lists_i32(b: &RecordBatch, name: &str) -> Vec<Vec<i32>> {
    let v = cols::list_i32(b, "t", name).unwrap();
    (0..b.num_rows())
        .map(|i| v.values.values()[v.range(i)].to_vec())
        .collect()
}

pub fn lists_f32(b: &RecordBatch, name: &str) -> Vec<Vec<f32>> {
    let v = cols::list_f32(b, "t", name).unwrap();
    (0..b.num_rows())
        .map(|i| v.values.values()[v.range(i)].to_vec())
        .collect()
}

pub fn lists_bool(b: &RecordBatch, name: &str) -> Vec<Vec<bool>> {
    let v = cols::list_bool(b, "t", name).unwrap();
    (0..b.num_rows())
        .map(|i| v.range(i).map(|k| v.values.value(k)).collect())
        .collect()
}

/// The `list<float32>` column `name` of the table at `p`, a row per entry.
pub fn column_f32(p: &Path, name: &str) -> Vec<Vec<f32>> {
    lists_f32(&read(p), name)
}

/// The `list<bool>` column `name` of the table at `p`, a row per entry.
pub fn column_bool(p: &Path, name: &str) -> Vec<Vec<bool>> {
    lists_bool(&read(p), name)
}

/// Edit row `row` of a `list<int32>` column.
pub fn edit_ids(b: &RecordBatch, name: &str, row: usize, f: impl Fn(&mut Vec<i32>)) -> RecordBatch {
    let mut l = lists_i32(b, name);
    f(&mut l[row]);
    replace(b, name, cols::build_list_i32(l))
}

/// Edit row `row` of a `list<float32>` column.
pub fn edit_f32s(
    b: &RecordBatch,
    name: &str,
    row: usize,
    f: impl Fn(&mut Vec<f32>),
) -> RecordBatch {
    let mut l = lists_f32(b, name);
    f(&mut l[row]);
    replace(b, name, cols::build_list_f32(l))
}

pub fn set_span(b: &RecordBatch, name: &str, row: usize, span: (i32, i32)) -> RecordBatch {
    let mut sp = cols::spans(b, "t", name).unwrap();
    sp[row] = Some(span);
    replace(b, name, cols::build_spans(&sp))
}

pub fn keep_rows(b: &RecordBatch, keep: &[usize]) -> RecordBatch {
    let idx = arrow::array::UInt32Array::from(keep.iter().map(|&i| i as u32).collect::<Vec<_>>());
    arrow::compute::take_record_batch(b, &idx).unwrap()
}
