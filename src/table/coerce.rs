//! Tables written by other tools, read in rlcr's types.
//!
//! pandas, polars and pyarrow write a Python `int` as int64 and a `float` as double, so a table
//! built the obvious way (`pa.Table.from_pylist`, a DataFrame) holds `int64` where the schema says
//! `int32`, `list<int64>` token ids, `struct<start:int64, end:int64>` spans and `double` rewards.
//! Where the values fit, such a column is converted on read with arrow's cast kernels: its type in
//! the schema a [`super::Reader`] reports ([`read_schema`], so that [`super::check_schema`] accepts
//! it), its values batch by batch ([`coerce_batch`]), each one checked. A value that does not fit
//! is an error naming the file, the row and the column; every column of a batch that holds one is
//! named in the same error. Large and view layouts and dictionaries are the reader's
//! normalisation ([`super::io::normalized_type`]); this module converts widths.
//!
//! What converts: any integer to `int32` (the value must be in range); any integer or float to
//! `float32` (an integer must be exact in float32, a finite float must stay finite: rounding to
//! the nearest float32 is what storing a double as float32 means); lists of those to
//! `list<int32>` / `list<float32>`; span structs whose `start` and `end` are integers. Anything
//! else is left as written, for [`super::check_schema`] to name. rlcr's own tables already have
//! the schema's types, and their batches pass through untouched (no copy, no cast).
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StructArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Fields, Float64Type, Int64Type, Schema};

use super::schema::{ColType, TableSpec};

/// The type a column of type `ty` stored as `dt` (already normalised by the reader) is read as,
/// when that differs from `dt` and the conversion is one this module makes; `None` when the
/// column is read as it is (already the schema's type, or a mismatch for
/// [`super::check_schema`] to report).
pub fn read_type(ty: ColType, dt: &DataType) -> Option<DataType> {
    if ty.accepts(dt) {
        return None;
    }
    match (ty, dt) {
        (ColType::Int32, dt) if dt.is_integer() => Some(DataType::Int32),
        (ColType::Float32, dt) if dt.is_integer() || dt.is_floating() => Some(DataType::Float32),
        (ColType::ListInt32, DataType::List(f)) => {
            let item = read_type(ColType::Int32, f.data_type())?;
            Some(DataType::List(Arc::new(
                f.as_ref().clone().with_data_type(item),
            )))
        }
        (ColType::ListFloat32, DataType::List(f)) => {
            let item = read_type(ColType::Float32, f.data_type())?;
            Some(DataType::List(Arc::new(
                f.as_ref().clone().with_data_type(item),
            )))
        }
        (ColType::Span, DataType::Struct(fs)) => {
            let ok = fs.len() == 2
                && fs.iter().all(|f| {
                    (f.name() == "start" || f.name() == "end") && f.data_type().is_integer()
                })
                && fs.find("start").is_some()
                && fs.find("end").is_some();
            ok.then(|| {
                DataType::Struct(
                    fs.iter()
                        .map(|f| f.as_ref().clone().with_data_type(DataType::Int32))
                        .collect::<Fields>(),
                )
            })
        }
        _ => None,
    }
}

/// `schema` with the type of each column of `spec` that [`read_type`] converts replaced by the
/// type it is read as.
pub fn read_schema(schema: &Schema, spec: &TableSpec) -> Schema {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let to = spec
                .column(f.name())
                .and_then(|c| read_type(c.ty, f.data_type()));
            match to {
                Some(t) => f.as_ref().clone().with_data_type(t),
                None => f.as_ref().clone(),
            }
        })
        .collect();
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

/// A value that does not fit the type its column is read as.
struct Unfit {
    /// Row within the batch.
    row: usize,
    /// The column (`answer_span.start` for a span's field).
    column: String,
    /// The value as written.
    value: String,
    /// The type it was to be read as.
    to: &'static str,
    /// For a list: the item's position in its row.
    item: Option<usize>,
}

impl Unfit {
    fn message(&self, first_row: usize) -> String {
        let item = match self.item {
            Some(k) => format!(" (item {k} of the row's list)"),
            None => String::new(),
        };
        format!(
            "row {}, column `{}`: value {}{item} does not fit {}",
            first_row + self.row,
            self.column,
            self.value,
            self.to
        )
    }
}

/// `b` with each column of `spec` whose type [`read_type`] converts converted (`b` itself when
/// none is); `b`'s first row is row `first_row` of the table `file`. Every column that holds a
/// value that does not fit is named, with the first such row, in one error.
pub fn coerce_batch(
    b: &RecordBatch,
    spec: &TableSpec,
    file: &str,
    first_row: usize,
) -> Result<RecordBatch> {
    let schema = b.schema();
    let convert: Vec<Option<DataType>> = schema
        .fields()
        .iter()
        .map(|f| {
            spec.column(f.name())
                .and_then(|c| read_type(c.ty, f.data_type()))
        })
        .collect();
    if convert.iter().all(Option::is_none) {
        return Ok(b.clone());
    }
    let mut fields = Vec::with_capacity(b.num_columns());
    let mut columns = Vec::with_capacity(b.num_columns());
    let mut unfit: Vec<Unfit> = Vec::new();
    for ((f, c), to) in schema.fields().iter().zip(b.columns()).zip(convert) {
        let Some(to) = to else {
            fields.push(f.as_ref().clone());
            columns.push(c.clone());
            continue;
        };
        let (array, bad) = convert_column(c, &to, f.name())
            .with_context(|| format!("{file}: column `{}`", f.name()))?;
        unfit.extend(bad);
        fields.push(f.as_ref().clone().with_data_type(to));
        columns.push(array);
    }
    match unfit.as_slice() {
        [] => {}
        [one] => bail!("{file}, {}", one.message(first_row)),
        many => bail!(
            "{file}: {} columns hold values that do not fit their types:\n  {}",
            many.len(),
            many.iter()
                .map(|u| u.message(first_row))
                .collect::<Vec<_>>()
                .join("\n  ")
        ),
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
        columns,
    )?)
}

/// Column `c` (named `name`) converted to `to` (a type [`read_type`] gives), and its values that
/// do not fit (the first per column or span field).
fn convert_column(c: &ArrayRef, to: &DataType, name: &str) -> Result<(ArrayRef, Vec<Unfit>)> {
    match (c.data_type(), to) {
        (DataType::List(_), DataType::List(item)) => {
            let l = c.as_list::<i32>();
            let o = l.value_offsets();
            let (start, end) = (o[0] as usize, o[o.len() - 1] as usize);
            // the values the rows hold (a sliced list may have more around them)
            let values = l.values().slice(start, end - start);
            let cast_values = cast(&values, item.data_type())?;
            let bad = first_unfit(&values, &cast_values, |_| true).map(|k| {
                // the row whose range holds item k
                let row = o.partition_point(|&x| (x as usize - start) <= k) - 1;
                Unfit {
                    row,
                    column: name.to_string(),
                    value: shown(&values, k),
                    to: type_name(item.data_type()),
                    item: Some(k - (o[row] as usize - start)),
                }
            });
            Ok((cast(c, to)?, bad.into_iter().collect()))
        }
        (DataType::Struct(_), DataType::Struct(to_fields)) => {
            let s = c.as_struct();
            let mut children = Vec::with_capacity(to_fields.len());
            let mut bad = Vec::new();
            for f in to_fields.iter() {
                let child = s
                    .column_by_name(f.name())
                    .with_context(|| format!("no field `{}`", f.name()))?;
                let out = cast(child, f.data_type())?;
                // a field under a null span holds whatever the writer left there
                if let Some(row) = first_unfit(child, &out, |i| s.is_valid(i)) {
                    bad.push(Unfit {
                        row,
                        column: format!("{name}.{}", f.name()),
                        value: shown(child, row),
                        to: type_name(f.data_type()),
                        item: None,
                    });
                }
                children.push(out);
            }
            let out = StructArray::try_new(to_fields.clone(), children, s.nulls().cloned())?;
            Ok((Arc::new(out), bad))
        }
        _ => {
            let out = cast(c, to)?;
            let bad = first_unfit(c, &out, |_| true).map(|row| Unfit {
                row,
                column: name.to_string(),
                value: shown(c, row),
                to: type_name(to),
                item: None,
            });
            Ok((out, bad.into_iter().collect()))
        }
    }
}

/// The first index (among those `consider` admits) whose value in `src` did not survive the cast
/// to `dst`: an integer out of `int32`'s range (arrow's cast makes it null), an integer not exact
/// in `float32`, a finite float beyond `float32`'s range.
fn first_unfit(src: &ArrayRef, dst: &ArrayRef, consider: impl Fn(usize) -> bool) -> Option<usize> {
    let n = src.len();
    let live = |i: usize| src.is_valid(i) && consider(i);
    match dst.data_type() {
        DataType::Int32 => (0..n).find(|&i| live(i) && dst.is_null(i)),
        DataType::Float32 => {
            let out = dst.as_primitive::<arrow::datatypes::Float32Type>();
            if src.data_type().is_integer() {
                // as int64 (an unsigned value beyond int64 becomes null: it does not fit either)
                let wide = cast(src, &DataType::Int64).ok()?;
                let wide = wide.as_primitive::<Int64Type>();
                (0..n).find(|&i| {
                    live(i) && (wide.is_null(i) || out.value(i) as f64 as i64 != wide.value(i))
                })
            } else {
                let wide = cast(src, &DataType::Float64).ok()?;
                let wide = wide.as_primitive::<Float64Type>();
                (0..n).find(|&i| live(i) && wide.value(i).is_finite() && !out.value(i).is_finite())
            }
        }
        _ => None,
    }
}

/// Value `i` of `a` as text, for a message.
fn shown(a: &ArrayRef, i: usize) -> String {
    arrow::util::display::array_value_to_string(a, i).unwrap_or_else(|_| "?".into())
}

fn type_name(dt: &DataType) -> &'static str {
    match dt {
        DataType::Int32 => "int32",
        DataType::Float32 => "float32",
        _ => "the schema's type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::schema::TRAJECTORY;
    use arrow::array::{
        Float32Array, Float64Array, Int32Array, Int64Array, ListArray, StringArray, UInt64Array,
    };
    use arrow::datatypes::Int64Type as I64;

    fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(cols).unwrap()
    }

    fn span64(rows: &[Option<(i64, i64)>]) -> ArrayRef {
        let fields = Fields::from(vec![
            Field::new("start", DataType::Int64, true),
            Field::new("end", DataType::Int64, true),
        ]);
        let start = Int64Array::from(rows.iter().map(|r| r.map(|x| x.0)).collect::<Vec<_>>());
        let end = Int64Array::from(rows.iter().map(|r| r.map(|x| x.1)).collect::<Vec<_>>());
        let valid: Vec<bool> = rows.iter().map(Option::is_some).collect();
        Arc::new(StructArray::new(
            fields,
            vec![Arc::new(start), Arc::new(end)],
            Some(valid.into()),
        ))
    }

    /// int64, double, list<int64>, list<double> and int64 spans read as the schema's types, with
    /// their values; unknown columns and columns already right are left alone.
    #[test]
    fn python_widths_read_as_the_schema_types() {
        let ids = ListArray::from_iter_primitive::<I64, _, _>(vec![
            Some(vec![Some(5), Some(6)]),
            Some(vec![Some(7)]),
        ]);
        let lps = ListArray::from_iter_primitive::<Float64Type, _, _>(vec![
            Some(vec![Some(-0.5), Some(-1.25)]),
            Some(vec![Some(-0.1)]),
        ]);
        let b = batch(vec![
            (
                "answer_idx",
                Arc::new(Int64Array::from(vec![0, 3])) as ArrayRef,
            ),
            ("reward", Arc::new(Float64Array::from(vec![1.0, 0.1]))),
            ("acc_reward", Arc::new(Int64Array::from(vec![1, 0]))),
            ("response_ids", Arc::new(ids)),
            ("response_logprobs", Arc::new(lps)),
            ("answer_span", span64(&[Some((0, 2)), None])),
            ("mine", Arc::new(Int64Array::from(vec![1i64 << 40, 2]))),
            ("prompt_id", Arc::new(StringArray::from(vec!["p", "q"]))),
        ]);
        let got = coerce_batch(&b, &TRAJECTORY, "t.parquet", 0).unwrap();
        let s = got.schema();
        for (name, ty) in [
            ("answer_idx", ColType::Int32),
            ("reward", ColType::Float32),
            ("acc_reward", ColType::Float32),
            ("response_ids", ColType::ListInt32),
            ("response_logprobs", ColType::ListFloat32),
            ("answer_span", ColType::Span),
        ] {
            let dt = s.field_with_name(name).unwrap().data_type();
            assert!(ty.accepts(dt), "{name}: {dt}");
        }
        assert_eq!(
            s.field_with_name("mine").unwrap().data_type(),
            &DataType::Int64
        );
        assert_eq!(
            s.field_with_name("prompt_id").unwrap().data_type(),
            &DataType::Utf8
        );
        let col = |n: &str| got.column_by_name(n).unwrap().clone();
        assert_eq!(
            col("answer_idx").as_primitive::<arrow::datatypes::Int32Type>(),
            &Int32Array::from(vec![0, 3])
        );
        assert_eq!(
            col("reward").as_primitive::<arrow::datatypes::Float32Type>(),
            &Float32Array::from(vec![1.0, 0.1])
        );
        assert_eq!(
            crate::table::cols::spans(&got, "t", "answer_span").unwrap(),
            vec![Some((0, 2)), None]
        );
        let v = crate::table::cols::list_i32(&got, "t", "response_ids").unwrap();
        assert_eq!(v.values.values().to_vec(), vec![5, 6, 7]);
        // a batch already in the schema's types is the same batch
        let again = coerce_batch(&got, &TRAJECTORY, "t.parquet", 0).unwrap();
        assert_eq!(again, got);
        for (a, b) in again.columns().iter().zip(got.columns()) {
            assert!(Arc::ptr_eq(a, b));
        }
    }

    /// A value out of range names the file, the row (counted over the whole table) and the
    /// column; one per column, every column at once.
    #[test]
    fn values_that_do_not_fit_name_row_and_column() {
        let big = i32::MAX as i64 + 1;
        let b = batch(vec![(
            "answer_idx",
            Arc::new(Int64Array::from(vec![0, 1, big, big])) as ArrayRef,
        )]);
        let e = coerce_batch(&b, &TRAJECTORY, "t.parquet", 100)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "t.parquet, row 102, column `answer_idx`: value 2147483648 does not fit int32"
        );

        let ids = ListArray::from_iter_primitive::<I64, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            Some(vec![Some(3), Some(-big - 1)]),
        ]);
        let b = batch(vec![
            (
                "answer_idx",
                Arc::new(Int64Array::from(vec![0, 1])) as ArrayRef,
            ),
            ("response_ids", Arc::new(ids)),
            ("answer_span", span64(&[Some((0, big)), Some((0, 1))])),
            ("confidence", Arc::new(Float64Array::from(vec![0.5, 1e300]))),
            (
                "acc_reward",
                Arc::new(Int64Array::from(vec![1, (1 << 24) + 1])),
            ),
            (
                "confidence_idx",
                Arc::new(UInt64Array::from(vec![1u64, u64::MAX])),
            ),
        ]);
        let e = coerce_batch(&b, &TRAJECTORY, "t.parquet", 0)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "t.parquet: 5 columns hold values that do not fit their types:\n  \
             row 1, column `response_ids`: value -2147483649 (item 1 of the row's list) does not fit int32\n  \
             row 0, column `answer_span.end`: value 2147483648 does not fit int32\n  \
             row 1, column `confidence`: value 1e300 does not fit float32\n  \
             row 1, column `acc_reward`: value 16777217 does not fit float32\n  \
             row 1, column `confidence_idx`: value 18446744073709551615 does not fit int32"
        );
    }

    /// A span whose fields are not integers, or a list of text, is left as written (for the
    /// schema check to name).
    #[test]
    fn other_types_are_left_as_written() {
        let text = DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)));
        assert_eq!(read_type(ColType::ListInt32, &text), None);
        assert_eq!(read_type(ColType::Int32, &DataType::Utf8), None);
        assert_eq!(read_type(ColType::Bool, &DataType::Int64), None);
        assert_eq!(read_type(ColType::Int32, &DataType::Int32), None);
        let fs = Fields::from(vec![
            Field::new("start", DataType::Float64, true),
            Field::new("end", DataType::Int64, true),
        ]);
        assert_eq!(read_type(ColType::Span, &DataType::Struct(fs)), None);
        let fs = Fields::from(vec![
            Field::new("start", DataType::Int64, true),
            Field::new("stop", DataType::Int64, true),
        ]);
        assert_eq!(read_type(ColType::Span, &DataType::Struct(fs)), None);
    }
}
