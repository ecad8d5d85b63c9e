//! Typed access to columns of a record batch, and builders for rlcr's column types.
//!
//! Getters return the concrete Arrow array or an error naming the table and column; list getters
//! give the flat values plus offsets so hot loops slice without allocating. Builders turn plain Rust
//! vectors into the exact Arrow types of [`super::schema`].
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{
    Array, ArrayRef, BooleanArray, BooleanBuilder, DictionaryArray, Float32Array, Int32Array,
    LargeStringArray, ListArray, PrimitiveArray, RecordBatch, StringArray, StringViewArray,
    StructArray,
};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Field, Float32Type, Int32Type, Schema};

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

getter!(i32_col, Int32Array, "int32");
getter!(f32_col, Float32Array, "float32");
getter!(bool_col, BooleanArray, "bool");
getter!(list_col, ListArray, "a list");
getter!(struct_col, StructArray, "a struct");

/// A utf8 column as it was read, without copying or casting: plain (`Utf8`, `LargeUtf8`), string
/// views (`Utf8View`: [`super::Reader::with_views`]) or a dictionary of strings with int32 keys
/// ([`super::Reader::with_dictionaries`]). The one way every stage reads text columns: rows by
/// index ([`StrCol::get`], [`StrCol::value`]), and for dictionaries the keys, so that a value is
/// looked at once per distinct key ([`StrCol::per_value`]) or only when the key changes.
#[derive(Clone, Copy)]
pub struct StrCol<'a> {
    repr: StrRepr<'a>,
}

/// The forms, with the offsets and bytes of the plain and dictionary ones taken once (the
/// validator reads every row of every table through [`StrCol::bytes`]).
#[derive(Clone, Copy)]
enum StrRepr<'a> {
    Plain(&'a StringArray, Utf8Bytes<'a>),
    Large(&'a LargeStringArray),
    Views(&'a StringViewArray),
    Dict {
        keys: &'a Int32Array,
        values: &'a StringArray,
        bytes: Utf8Bytes<'a>,
    },
}

/// A `StringArray`'s offsets and value bytes.
#[derive(Clone, Copy)]
struct Utf8Bytes<'a> {
    offsets: &'a [i32],
    data: &'a [u8],
}

impl<'a> Utf8Bytes<'a> {
    fn of(a: &'a StringArray) -> Self {
        Utf8Bytes {
            offsets: a.value_offsets(),
            data: a.value_data(),
        }
    }
    #[inline]
    fn at(&self, j: usize) -> &'a [u8] {
        &self.data[self.offsets[j] as usize..self.offsets[j + 1] as usize]
    }
}

/// Column `name` of `b` as text; errors name the table and the column.
pub fn str_col<'a>(b: &'a RecordBatch, table: &str, name: &str) -> Result<StrCol<'a>> {
    let c = column(b, table, name)?;
    StrCol::of_array(c.as_ref()).ok_or_else(|| {
        anyhow!(
            "{table}: column `{name}` has type {}, expected utf8",
            c.data_type()
        )
    })
}

impl<'a> StrCol<'a> {
    /// Column `name` of `b` when it is there and holds text (no error built when not: the row
    /// rules ask for columns a table may not have, on every batch).
    pub fn try_of(b: &'a RecordBatch, name: &str) -> Option<Self> {
        Self::of_array(b.column_by_name(name)?.as_ref())
    }

    /// An array of text, or `None` for any other type.
    pub fn of_array(a: &'a dyn Array) -> Option<Self> {
        let any = a.as_any();
        let repr = if let Some(a) = any.downcast_ref::<StringArray>() {
            StrRepr::Plain(a, Utf8Bytes::of(a))
        } else if let Some(a) = any.downcast_ref::<LargeStringArray>() {
            StrRepr::Large(a)
        } else if let Some(a) = any.downcast_ref::<StringViewArray>() {
            StrRepr::Views(a)
        } else {
            let d = any.downcast_ref::<DictionaryArray<Int32Type>>()?;
            let values = d.values().as_any().downcast_ref::<StringArray>()?;
            StrRepr::Dict {
                keys: d.keys(),
                values,
                bytes: Utf8Bytes::of(values),
            }
        };
        Some(StrCol { repr })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        match self.repr {
            StrRepr::Plain(a, _) => a.len(),
            StrRepr::Large(a) => a.len(),
            StrRepr::Views(a) => a.len(),
            StrRepr::Dict { keys, .. } => keys.len(),
        }
    }

    /// No rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether row `i` is null (for a dictionary: its key, or the value it points at).
    #[inline]
    pub fn is_null(&self, i: usize) -> bool {
        match self.repr {
            StrRepr::Plain(a, _) => a.is_null(i),
            StrRepr::Large(a) => a.is_null(i),
            StrRepr::Views(a) => a.is_null(i),
            StrRepr::Dict { keys, values, .. } => {
                keys.is_null(i) || values.is_null(keys.values()[i] as usize)
            }
        }
    }

    /// Whether row `i` holds a value.
    #[inline]
    pub fn is_valid(&self, i: usize) -> bool {
        !self.is_null(i)
    }

    /// Row `i`'s sample type, `None` when null or another value (which the validator refuses).
    #[inline]
    pub fn sample_type(&self, i: usize) -> Option<super::schema::SampleType> {
        if self.is_null(i) {
            return None;
        }
        super::schema::SampleType::from_bytes(self.bytes(i))
    }

    /// Row `i`'s text, whatever its validity (ask [`StrCol::is_null`] first, or use
    /// [`StrCol::get`]).
    #[inline]
    pub fn value(&self, i: usize) -> &'a str {
        match self.repr {
            StrRepr::Plain(a, _) => a.value(i),
            StrRepr::Large(a) => a.value(i),
            StrRepr::Views(a) => a.value(i),
            StrRepr::Dict { keys, values, .. } => values.value(keys.values()[i] as usize),
        }
    }

    /// Row `i`'s text, `None` when null.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&'a str> {
        (!self.is_null(i)).then(|| self.value(i))
    }

    /// Row `i`'s bytes without arrow's per-call checks for the plain and dictionary forms (the
    /// row rules look at every row of every table).
    #[inline]
    pub fn bytes(&self, i: usize) -> &'a [u8] {
        match self.repr {
            StrRepr::Plain(_, b) => b.at(i),
            StrRepr::Dict { keys, bytes, .. } => bytes.at(keys.values()[i] as usize),
            StrRepr::Large(a) => a.value(i).as_bytes(),
            StrRepr::Views(a) => a.value(i).as_bytes(),
        }
    }

    /// The string views, when the column was read as views (their inline prefix can be used as
    /// it is: the validator's identity digests).
    pub fn views(&self) -> Option<&'a StringViewArray> {
        match self.repr {
            StrRepr::Views(a) => Some(a),
            _ => None,
        }
    }

    /// The dictionary key of row `i` when the row holds a value (`None` for the other forms and
    /// null rows). Within a batch, equal keys are equal values.
    #[inline]
    pub fn key(&self, i: usize) -> Option<i32> {
        match self.repr {
            StrRepr::Dict { keys, values, .. } => {
                let k = keys.values()[i];
                (keys.is_valid(i) && values.is_valid(k as usize)).then_some(k)
            }
            _ => None,
        }
    }

    /// Whether row `i` (> 0) holds what row `i - 1` holds, when that is cheaper to tell than
    /// comparing the strings (equal dictionary keys); `false` means "compare them".
    #[inline]
    pub fn same_key_as_previous(&self, i: usize) -> bool {
        match self.repr {
            StrRepr::Dict { keys, .. } => keys.values()[i] == keys.values()[i - 1],
            _ => false,
        }
    }

    /// `f` of each dictionary value, indexed by key (`None` for a null value); empty for the
    /// other forms.
    pub fn per_value<T>(&self, f: impl Fn(Option<&'a str>) -> T) -> Vec<T> {
        match self.repr {
            StrRepr::Dict { values, .. } => (0..values.len())
                .map(|v| f(values.is_valid(v).then(|| values.value(v))))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Per row of the first `n`, `f` of its bytes: once per distinct value of a dictionary, once
    /// per row otherwise (a key out of range, only under a null row, gives `f(b"")`).
    pub fn map_values<T: Copy>(&self, n: usize, f: impl Fn(&[u8]) -> T) -> Vec<T> {
        match self.repr {
            StrRepr::Dict { keys, bytes, .. } => {
                let per: Vec<T> = (0..bytes.offsets.len().saturating_sub(1))
                    .map(|j| f(bytes.at(j)))
                    .collect();
                keys.values()[..n]
                    .iter()
                    .map(|&j| per.get(j as usize).copied().unwrap_or_else(|| f(b"")))
                    .collect()
            }
            _ => (0..n).map(|i| f(self.bytes(i))).collect(),
        }
    }
}

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
    /// The value range of row `i`; a null row is the error `{at()}: null` (`at` names the file,
    /// row and column).
    pub fn present(&self, i: usize, at: impl FnOnce() -> String) -> Result<std::ops::Range<usize>> {
        if self.is_null(i) {
            bail!("{}: null", at());
        }
        Ok(self.range(i))
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

macro_rules! list_getter {
    ($fn:ident, $ty:ty, $tname:literal) => {
        #[doc = concat!("`list<", $tname, ">` column; errors name the table and column.")]
        pub fn $fn<'a>(b: &'a RecordBatch, table: &str, name: &str) -> Result<ListView<'a, $ty>> {
            list_values(b, table, name, $tname)
        }
    };
}

list_getter!(list_i32, Int32Array, "int32");
list_getter!(list_f32, Float32Array, "float32");
list_getter!(list_bool, BooleanArray, "bool");

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
    build_list_primitive::<Int32Type, _, _>(rows)
}

/// Build a `list<float32>` array.
pub fn build_list_f32<I, R>(rows: I) -> ArrayRef
where
    I: IntoIterator<Item = R>,
    R: AsRef<[f32]>,
{
    build_list_primitive::<Float32Type, _, _>(rows)
}

/// Build a `list<T>` array of a primitive Arrow type.
fn build_list_primitive<T, I, R>(rows: I) -> ArrayRef
where
    T: ArrowPrimitiveType,
    I: IntoIterator<Item = R>,
    R: AsRef<[T::Native]>,
{
    let mut offsets: Vec<i32> = vec![0];
    let mut values: Vec<T::Native> = Vec::new();
    for r in rows {
        values.extend_from_slice(r.as_ref());
        offsets.push(values.len() as i32);
    }
    list_array(
        T::DATA_TYPE,
        Arc::new(PrimitiveArray::<T>::new(values.into(), None)),
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

/// The column names of `schema`, in order.
pub fn names(schema: &Schema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
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

    /// One text column in each of Arrow's forms reads the same through [`StrCol`]: values, nulls
    /// (a dictionary's null key and null value), bytes; keys and per-value results for the
    /// dictionary only; another type is an error naming the table and the column.
    #[test]
    fn str_col_reads_every_form_alike() {
        use arrow::array::{LargeStringArray, StringViewArray};
        let vals = vec![
            Some("answer"),
            None,
            Some("a-string-longer-than-twelve"),
            Some("answer"),
        ];
        let dict = DictionaryArray::<Int32Type>::new(
            Int32Array::from(vec![Some(0), Some(1), Some(2), Some(0)]),
            Arc::new(StringArray::from(vec![
                Some("answer"),
                None,
                Some("a-string-longer-than-twelve"),
            ])),
        );
        let forms: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vals.clone())),
            Arc::new(LargeStringArray::from(vals.clone())),
            Arc::new(StringViewArray::from(vals.clone())),
            Arc::new(dict),
        ];
        for (k, a) in forms.iter().enumerate() {
            let c = StrCol::of_array(a.as_ref()).unwrap();
            assert_eq!(c.len(), 4);
            let got: Vec<Option<&str>> = (0..4).map(|i| c.get(i)).collect();
            assert_eq!(got, vals, "form {k}");
            assert_eq!(c.bytes(2), b"a-string-longer-than-twelve");
            assert_eq!(
                c.sample_type(0),
                Some(crate::table::SampleType::Answer),
                "form {k}"
            );
            assert_eq!(c.sample_type(1), None);
            assert_eq!(c.views().is_some(), k == 2);
            let lens = c.map_values(4, |b| b.len());
            assert_eq!(lens[0], 6);
            if k == 3 {
                assert_eq!((c.key(0), c.key(1), c.key(3)), (Some(0), None, Some(0)));
                assert!(c.same_key_as_previous(3) == (c.key(3) == c.key(2)));
                assert_eq!(
                    c.per_value(|v| v.map(str::len)),
                    vec![Some(6), None, Some(27)]
                );
            } else {
                assert_eq!(c.key(0), None);
                assert!(c.per_value(|v| v.is_some()).is_empty());
            }
        }
        let b = RecordBatch::try_from_iter(vec![(
            "prompt_id",
            Arc::new(Int32Array::from(vec![1])) as ArrayRef,
        )])
        .unwrap();
        let e = str_col(&b, "t.parquet", "prompt_id").err().unwrap();
        assert_eq!(
            e.to_string(),
            "t.parquet: column `prompt_id` has type Int32, expected utf8"
        );
        assert!(StrCol::try_of(&b, "prompt_id").is_none());
        assert!(StrCol::try_of(&b, "absent").is_none());
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
        assert_eq!(
            names(&out.schema()),
            ["prompt_id", "zzz_extra", "acc_reward", "reward"]
        );
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
