//! Typed access to columns of a record batch, and builders for rlcr's column types.
//!
//! Getters return the concrete Arrow array or an error naming the table and column; list getters
//! give the flat values plus offsets so hot loops slice without allocating. Builders turn plain Rust
//! vectors into the exact Arrow types of [`super::schema`].
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{
    Array, ArrayRef, BooleanArray, BooleanBuilder, Float32Array, Int32Array, ListArray,
    RecordBatch, StringArray, StructArray,
};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Schema};

use super::schema::{span_fields, TableSpec};

/// Find a column by name.
pub fn column<'a>(b: &'a RecordBatch, table: &str, name: &str) -> Result<&'a ArrayRef> {
    b.column_by_name(name)
        .ok_or_else(|| anyhow!("{table}: column `{name}` is missing"))
}

macro_rules! getter {
    ($fn:ident, $ty:ty, $tname:literal) => {
        /// Typed column getter; errors name the table and column.
        pub fn $fn<'a>(b: &'a RecordBatch, table: &str, name: &str) -> Result<&'a $ty> {
            let c = column(b, table, name)?;
            c.as_any().downcast_ref::<$ty>().ok_or_else(|| {
                anyhow!(
                    "{table}: column `{name}` has type {}, expected {}",
                    c.data_type(),
                    $tname
                )
            })
        }
    };
}

getter!(str_col, StringArray, "utf8");
getter!(i32_col, Int32Array, "int32");
getter!(f32_col, Float32Array, "float32");
getter!(bool_col, BooleanArray, "bool");
getter!(list_col, ListArray, "a list");
getter!(struct_col, StructArray, "a struct");

/// The `messages` column as JSON text per row, whether the table holds it natively
/// (`list<struct<role, content>>`) or as text ([`super::nested::messages_text`]).
pub fn messages(b: &RecordBatch, table: &str) -> Result<StringArray> {
    let c = column(b, table, "messages")?;
    super::nested::messages_text(c.as_ref()).with_context(|| format!("{table}: column `messages`"))
}

/// Column `name` converted to `to` when its type is one of `from` (a table written by another
/// tool: `LargeUtf8`, `Utf8View`, other integer widths), as an owned array.
fn converted<T: Array + Clone + 'static>(
    b: &RecordBatch,
    table: &str,
    name: &str,
    to: DataType,
    from: &[DataType],
) -> Result<T> {
    let c = column(b, table, name)?;
    let c = if *c.data_type() == to {
        c.clone()
    } else if from.contains(c.data_type()) {
        arrow::compute::cast(c, &to)?
    } else {
        bail!(
            "{table}: column `{name}` has type {}, expected {to}",
            c.data_type()
        );
    };
    c.as_any()
        .downcast_ref::<T>()
        .cloned()
        .ok_or_else(|| anyhow!("internal: column `{name}` converted to {to}"))
}

/// A utf8 column (`Utf8`, or `LargeUtf8` / `Utf8View` converted).
pub fn utf8(b: &RecordBatch, table: &str, name: &str) -> Result<StringArray> {
    converted(
        b,
        table,
        name,
        DataType::Utf8,
        &[DataType::LargeUtf8, DataType::Utf8View],
    )
}

/// An int32 column (other integer widths converted; a value out of range becomes null).
pub fn int32(b: &RecordBatch, table: &str, name: &str) -> Result<Int32Array> {
    use DataType::*;
    converted(
        b,
        table,
        name,
        Int32,
        &[Int64, Int16, Int8, UInt32, UInt16, UInt8],
    )
}

/// A list column viewed as flat values + offsets.
pub struct ListView<'a, T: ?Sized> {
    pub list: &'a ListArray,
    pub values: &'a T,
}

impl<'a, T: ?Sized> ListView<'a, T> {
    /// The value range of row `i`.
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        let o = self.list.value_offsets();
        o[i] as usize..o[i + 1] as usize
    }
    /// Number of items in row `i`.
    pub fn len_of(&self, i: usize) -> usize {
        let o = self.list.value_offsets();
        (o[i + 1] - o[i]) as usize
    }
    /// Whether row `i` is null.
    pub fn is_null(&self, i: usize) -> bool {
        self.list.is_null(i)
    }
}

fn list_values<'a, T: 'static>(
    b: &'a RecordBatch,
    table: &str,
    name: &str,
    tname: &str,
) -> Result<ListView<'a, T>> {
    let list = list_col(b, table, name)?;
    let values = list.values().as_any().downcast_ref::<T>().ok_or_else(|| {
        anyhow!(
            "{table}: column `{name}` has type {}, expected list<{tname}>",
            list.data_type()
        )
    })?;
    Ok(ListView { list, values })
}

/// `list<int32>` column.
pub fn list_i32<'a>(
    b: &'a RecordBatch,
    table: &str,
    name: &str,
) -> Result<ListView<'a, Int32Array>> {
    list_values(b, table, name, "int32")
}

/// `list<float32>` column.
pub fn list_f32<'a>(
    b: &'a RecordBatch,
    table: &str,
    name: &str,
) -> Result<ListView<'a, Float32Array>> {
    list_values(b, table, name, "float32")
}

/// `list<bool>` column.
pub fn list_bool<'a>(
    b: &'a RecordBatch,
    table: &str,
    name: &str,
) -> Result<ListView<'a, BooleanArray>> {
    list_values(b, table, name, "bool")
}

/// A span column: per row `Some((start, end))` or `None`.
pub fn spans(b: &RecordBatch, table: &str, name: &str) -> Result<Vec<Option<(i32, i32)>>> {
    let (s, start, end) = span_parts(b, table, name)?;
    Ok((0..s.len())
        .map(|i| {
            if s.is_null(i) || start.is_null(i) || end.is_null(i) {
                None
            } else {
                Some((start.value(i), end.value(i)))
            }
        })
        .collect())
}

/// A span column and its `start` and `end` fields (what [`spans`] reads, without collecting).
pub fn span_parts<'a>(
    b: &'a RecordBatch,
    table: &str,
    name: &str,
) -> Result<(&'a StructArray, &'a Int32Array, &'a Int32Array)> {
    let s = struct_col(b, table, name)?;
    let start = s
        .column_by_name("start")
        .and_then(|c| c.as_any().downcast_ref::<Int32Array>())
        .ok_or_else(|| anyhow!("{table}: column `{name}` has no int32 field `start`"))?;
    let end = s
        .column_by_name("end")
        .and_then(|c| c.as_any().downcast_ref::<Int32Array>())
        .ok_or_else(|| anyhow!("{table}: column `{name}` has no int32 field `end`"))?;
    Ok((s, start, end))
}

/// Build a `list<int32>` array.
pub fn build_list_i32<I, R>(rows: I) -> ArrayRef
where
    I: IntoIterator<Item = R>,
    R: AsRef<[i32]>,
{
    let mut offsets: Vec<i32> = vec![0];
    let mut values: Vec<i32> = Vec::new();
    for r in rows {
        values.extend_from_slice(r.as_ref());
        offsets.push(values.len() as i32);
    }
    list_array(DataType::Int32, Arc::new(Int32Array::from(values)), offsets)
}

/// Build a `list<float32>` array.
pub fn build_list_f32<I, R>(rows: I) -> ArrayRef
where
    I: IntoIterator<Item = R>,
    R: AsRef<[f32]>,
{
    let mut offsets: Vec<i32> = vec![0];
    let mut values: Vec<f32> = Vec::new();
    for r in rows {
        values.extend_from_slice(r.as_ref());
        offsets.push(values.len() as i32);
    }
    list_array(
        DataType::Float32,
        Arc::new(Float32Array::from(values)),
        offsets,
    )
}

/// Build a `list<bool>` array.
pub fn build_list_bool<I, R>(rows: I) -> ArrayRef
where
    I: IntoIterator<Item = R>,
    R: AsRef<[bool]>,
{
    let mut offsets: Vec<i32> = vec![0];
    let mut values = BooleanBuilder::new();
    let mut n = 0i32;
    for r in rows {
        values.append_slice(r.as_ref());
        n += r.as_ref().len() as i32;
        offsets.push(n);
    }
    list_array(DataType::Boolean, Arc::new(values.finish()), offsets)
}

fn list_array(item: DataType, values: ArrayRef, offsets: Vec<i32>) -> ArrayRef {
    let field = Arc::new(Field::new("item", item, true));
    Arc::new(ListArray::new(
        field,
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        values,
        None,
    ))
}

/// Build a span column from `Option<(start, end)>` per row.
pub fn build_spans(rows: &[Option<(i32, i32)>]) -> ArrayRef {
    let start = Int32Array::from(
        rows.iter()
            .map(|r| r.map_or(0, |x| x.0))
            .collect::<Vec<_>>(),
    );
    let end = Int32Array::from(
        rows.iter()
            .map(|r| r.map_or(0, |x| x.1))
            .collect::<Vec<_>>(),
    );
    let valid: Vec<bool> = rows.iter().map(|r| r.is_some()).collect();
    Arc::new(StructArray::new(
        span_fields(),
        vec![Arc::new(start), Arc::new(end)],
        Some(valid.into()),
    ))
}

/// Replace or add columns of a batch. Existing columns keep their place; new columns are inserted
/// before the first known column that follows them in `spec`'s canonical order (at the end when
/// none does); unknown extra columns keep their place.
/// Fields of known columns take the spec's type and nullability.
pub fn set_columns(
    b: &RecordBatch,
    spec: &TableSpec,
    new: Vec<(&str, ArrayRef)>,
) -> Result<RecordBatch> {
    let mut cols: Vec<(Field, ArrayRef)> = b
        .schema()
        .fields()
        .iter()
        .zip(b.columns())
        .map(|(f, c)| (f.as_ref().clone(), c.clone()))
        .collect();
    for (name, arr) in new {
        if arr.len() != b.num_rows() {
            bail!(
                "internal error: column `{name}` has {} rows, batch has {}",
                arr.len(),
                b.num_rows()
            );
        }
        let field = match spec.column(name) {
            Some(c) => {
                let mut f = c.field();
                if !c.nullable && arr.null_count() > 0 {
                    bail!("internal error: nulls written to non-nullable column `{name}`");
                }
                if f.data_type() != arr.data_type() {
                    // Keep what the array is (e.g. a nested field's nullability differs) but
                    // require the same logical type.
                    if !c.ty.accepts(arr.data_type()) {
                        bail!(
                            "internal error: column `{name}` built as {}, schema says {}",
                            arr.data_type(),
                            c.ty.name()
                        );
                    }
                    f = Field::new(name, arr.data_type().clone(), c.nullable);
                }
                f
            }
            None => Field::new(name, arr.data_type().clone(), arr.null_count() > 0),
        };
        if let Some(pos) = cols.iter().position(|(f, _)| f.name() == name) {
            cols[pos] = (field, arr);
        } else {
            let order = spec.order(name);
            let pos = cols
                .iter()
                .position(|(f, _)| {
                    let o = spec.order(f.name());
                    o != usize::MAX && o > order
                })
                .unwrap_or(cols.len());
            cols.insert(pos, (field, arr));
        }
    }
    let schema = Arc::new(Schema::new(
        cols.iter().map(|(f, _)| f.clone()).collect::<Vec<_>>(),
    ));
    Ok(RecordBatch::try_new(
        schema,
        cols.into_iter().map(|(_, a)| a).collect(),
    )?)
}

/// `b` with every column `spec` documents given the spec's field: its type (arrays cast when
/// another writer chose a different but accepted layout, e.g. polars marks a struct's fields
/// nullable) and its nullability. Unknown columns are kept as they are. For a batch the
/// validator has checked (no nulls where the spec forbids them); `table` names it in errors.
pub fn conform(b: &RecordBatch, spec: &TableSpec, table: &str) -> Result<RecordBatch> {
    let schema = b.schema();
    let mut fields = Vec::with_capacity(b.num_columns());
    let mut columns = Vec::with_capacity(b.num_columns());
    let mut changed = false;
    for (f, c) in schema.fields().iter().zip(b.columns()) {
        let Some(spec_col) = spec.column(f.name()) else {
            fields.push(f.as_ref().clone());
            columns.push(c.clone());
            continue;
        };
        let mut want = spec_col.field();
        let mut c = c.clone();
        if spec_col.ty.keeps_own_type() && spec_col.ty.accepts(c.data_type()) {
            // Native messages written by other tools (nullable fields): the canonical type, so
            // that rows built here and rows read concatenate.
            if super::nested::is_native_messages(c.data_type()) {
                c = super::nested::canonical_messages(c.as_ref())
                    .with_context(|| format!("{table}: column `{}`", f.name()))?;
            }
            want = Field::new(f.name(), c.data_type().clone(), want.is_nullable());
        } else if c.data_type() != want.data_type() {
            c = arrow::compute::cast(c.as_ref(), want.data_type()).with_context(|| {
                format!(
                    "{table}: column `{}`: cannot convert {} to {}",
                    f.name(),
                    c.data_type(),
                    want.data_type()
                )
            })?;
        }
        if !want.is_nullable() && c.null_count() > 0 {
            bail!(
                "{table}: column `{}` holds nulls, which it may not",
                f.name()
            );
        }
        changed |= want != *f.as_ref();
        fields.push(want);
        columns.push(c);
    }
    if !changed {
        return Ok(b.clone());
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// Drop columns by name (missing names are ignored).
pub fn drop_columns(b: &RecordBatch, names: &[&str]) -> Result<RecordBatch> {
    let keep: Vec<usize> = b
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| !names.contains(&f.name().as_str()))
        .map(|(i, _)| i)
        .collect();
    Ok(b.project(&keep)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::schema::TRAJECTORY;

    /// A batch as polars writes it (every field nullable, a span struct's fields too, an extra
    /// column) takes rlcr's fields for the documented columns and keeps the extra one; a null in a
    /// non-nullable column is an error naming the table and the column.
    #[test]
    fn conform_gives_the_spec_fields() {
        use arrow::array::{Int32Array, StructArray};
        let loose = arrow::datatypes::Fields::from(vec![
            Field::new("start", DataType::Int32, true),
            Field::new("end", DataType::Int32, true),
        ]);
        let span = StructArray::new(
            loose.clone(),
            vec![
                Arc::new(Int32Array::from(vec![1, 0])),
                Arc::new(Int32Array::from(vec![3, 0])),
            ],
            Some(vec![true, false].into()),
        );
        let batch = |pid: StringArray| {
            RecordBatch::try_new(
                Arc::new(Schema::new(vec![
                    Field::new("prompt_id", DataType::Utf8, true),
                    Field::new("answer_span", DataType::Struct(loose.clone()), true),
                    Field::new("mine", DataType::Int32, true),
                ])),
                vec![
                    Arc::new(pid),
                    Arc::new(span.clone()),
                    Arc::new(Int32Array::from(vec![Some(5), None])),
                ],
            )
            .unwrap()
        };
        let got = conform(
            &batch(StringArray::from(vec!["a", "b"])),
            &TRAJECTORY,
            "t.parquet",
        )
        .unwrap();
        let s = got.schema();
        assert_eq!(s.field(0), &TRAJECTORY.column("prompt_id").unwrap().field());
        assert_eq!(
            s.field(1),
            &TRAJECTORY.column("answer_span").unwrap().field()
        );
        assert_eq!(s.field(2), &Field::new("mine", DataType::Int32, true));
        assert_eq!(
            spans(&got, "t", "answer_span").unwrap(),
            vec![Some((1, 3)), None]
        );
        let err = conform(
            &batch(StringArray::from(vec![Some("a"), None])),
            &TRAJECTORY,
            "t.parquet",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("t.parquet") && err.contains("`prompt_id`"),
            "{err}"
        );
    }

    #[test]
    fn builders_have_schema_types() {
        assert_eq!(
            build_list_i32([vec![1, 2], vec![]]).data_type(),
            &crate::table::schema::ColType::ListInt32.arrow()
        );
        assert_eq!(
            build_spans(&[Some((1, 2)), None]).data_type(),
            &crate::table::schema::ColType::Span.arrow()
        );
        assert_eq!(
            build_list_bool([vec![true], vec![false, true]]).data_type(),
            &crate::table::schema::ColType::ListBool.arrow()
        );
    }

    #[test]
    fn set_columns_orders_canonically() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("prompt_id", DataType::Utf8, false),
            Field::new("zzz_extra", DataType::Int32, false),
            Field::new("reward", DataType::Float32, false),
        ]));
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec!["p"])),
                Arc::new(Int32Array::from(vec![7])),
                Arc::new(Float32Array::from(vec![1.0])),
            ],
        )
        .unwrap();
        let out = set_columns(
            &b,
            &TRAJECTORY,
            vec![
                (
                    "acc_reward",
                    Arc::new(Float32Array::from(vec![0.5])) as ArrayRef,
                ),
                (
                    "reward",
                    Arc::new(Float32Array::from(vec![2.0])) as ArrayRef,
                ),
            ],
        )
        .unwrap();
        let names: Vec<_> = out
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["prompt_id", "zzz_extra", "acc_reward", "reward"]);
        assert_eq!(f32_col(&out, "t", "reward").unwrap().value(0), 2.0);
        let sp = build_spans(&[Some((3, 9))]);
        let out = set_columns(&out, &TRAJECTORY, vec![("answer_span", sp)]).unwrap();
        assert_eq!(spans(&out, "t", "answer_span").unwrap(), vec![Some((3, 9))]);
        let e = f32_col(&out, "t.parquet", "prompt_id").unwrap_err();
        assert!(e
            .to_string()
            .contains("t.parquet: column `prompt_id` has type Utf8"));
    }
}
