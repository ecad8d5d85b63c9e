//! Typed, lenient access to the numeric columns `rlcr advantage` reads, one record batch at a
//! time (text columns: [`crate::table::StrCol`]).
//!
//! Tables come from rlcr, polars or DuckDB, so the physical types vary (`LargeUtf8`, `LargeList`,
//! `Int64` indices, `Float64` rewards, integer `info_mask`): every accessor casts to one canonical
//! type with arrow's `cast` (free when the type already matches) and reports the column by name when
//! it cannot. Lists are flattened to `(offsets, values)` with offsets rebased to 0, so the per-row
//! code indexes plain slices.
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, GenericListArray, Int32Array, OffsetSizeTrait,
    RecordBatch, StructArray,
};
use arrow::compute::cast;
use arrow::datatypes::{ArrowPrimitiveType, DataType, Float64Type, Int32Type};

use crate::advantage::Span;
use crate::table::StrCol;

/// A column cast to `to`, or `None` when the batch has no such column.
pub fn opt_cast(batch: &RecordBatch, name: &str, to: &DataType) -> Result<Option<ArrayRef>> {
    let Some(col) = batch.column_by_name(name) else {
        return Ok(None);
    };
    if col.data_type() == to {
        return Ok(Some(col.clone()));
    }
    let c = cast(col, to)
        .with_context(|| format!("column `{name}`: cannot read {} as {to}", col.data_type()))?;
    Ok(Some(c))
}

fn need(batch: &RecordBatch, name: &str, to: &DataType) -> Result<ArrayRef> {
    opt_cast(batch, name, to)?.ok_or_else(|| anyhow!("missing column `{name}`"))
}

/// An integer column as `Int32`.
pub fn ints(batch: &RecordBatch, name: &str) -> Result<Int32Array> {
    Ok(need(batch, name, &DataType::Int32)?
        .as_primitive::<arrow::datatypes::Int32Type>()
        .clone())
}

/// A float column as `Float64`.
pub fn floats(batch: &RecordBatch, name: &str) -> Result<Float64Array> {
    Ok(need(batch, name, &DataType::Float64)?
        .as_primitive::<arrow::datatypes::Float64Type>()
        .clone())
}

/// A list column flattened: `offsets[i]..offsets[i+1]` are row i's values (rebased to 0); `valid[i]`
/// is false for a null list.
pub struct Flat<T> {
    pub offsets: Vec<usize>,
    pub values: Vec<T>,
    pub valid: Option<Vec<bool>>,
}

impl<T> Flat<T> {
    /// Row i's values, or `None` for a null list.
    pub fn row(&self, i: usize) -> Option<&[T]> {
        if let Some(v) = &self.valid {
            if !v[i] {
                return None;
            }
        }
        Some(&self.values[self.offsets[i]..self.offsets[i + 1]])
    }

    /// Row i's length (0 for a null list).
    pub fn len_of(&self, i: usize) -> usize {
        self.offsets[i + 1] - self.offsets[i]
    }
}

/// The offsets (rebased to 0) and the child values of a `List` or `LargeList` column.
fn list_parts(col: &ArrayRef, name: &str) -> Result<(Vec<usize>, ArrayRef)> {
    /// The offsets and child values of one list array, whatever its offset width.
    fn parts<O: OffsetSizeTrait>(l: &GenericListArray<O>) -> (Vec<usize>, ArrayRef) {
        let o = l.value_offsets();
        let first = o[0].as_usize();
        let last = o[o.len() - 1].as_usize();
        let offs = o.iter().map(|&x| x.as_usize() - first).collect();
        (offs, l.values().slice(first, last - first))
    }
    match col.data_type() {
        DataType::List(_) => Ok(parts(col.as_list::<i32>())),
        DataType::LargeList(_) => Ok(parts(col.as_list::<i64>())),
        other => bail!("column `{name}`: expected a list, found {other}"),
    }
}

fn validity(col: &ArrayRef) -> Option<Vec<bool>> {
    col.nulls()
        .map(|n| (0..col.len()).map(|i| n.is_valid(i)).collect())
}

fn no_null_items(values: &ArrayRef, name: &str) -> Result<()> {
    if values.null_count() > 0 {
        bail!("column `{name}`: a list holds a null element");
    }
    Ok(())
}

/// A list column's row lengths only (e.g. `response_ids`); `None` when absent.
pub fn list_lengths(batch: &RecordBatch, name: &str) -> Result<Option<Flat<()>>> {
    let Some(col) = batch.column_by_name(name) else {
        return Ok(None);
    };
    let (offsets, _) = list_parts(col, name)?;
    Ok(Some(Flat {
        offsets,
        values: Vec::new(),
        valid: validity(col),
    }))
}

/// A list column with its items cast to `to` (`what` names it in errors) and converted by
/// `values`; `None` when absent.
fn cast_lists<T>(
    batch: &RecordBatch,
    name: &str,
    to: &DataType,
    what: &str,
    values: impl FnOnce(&ArrayRef) -> Vec<T>,
) -> Result<Option<Flat<T>>> {
    let Some(col) = batch.column_by_name(name) else {
        return Ok(None);
    };
    let (offsets, vals) = list_parts(col, name)?;
    no_null_items(&vals, name)?;
    let v = cast(&vals, to).with_context(|| {
        format!(
            "column `{name}`: cannot read {} items as {what}",
            vals.data_type()
        )
    })?;
    Ok(Some(Flat {
        offsets,
        values: values(&v),
        valid: validity(col),
    }))
}

/// A list-of-numbers column with its items cast to `T` (`what` names `T` in errors); `None` when
/// absent.
fn primitive_lists<T: ArrowPrimitiveType>(
    batch: &RecordBatch,
    name: &str,
    what: &str,
) -> Result<Option<Flat<T::Native>>> {
    cast_lists(batch, name, &T::DATA_TYPE, what, |v| {
        v.as_primitive::<T>().values().to_vec()
    })
}

/// A list-of-floats column as `f64`; `None` when absent.
pub fn float_lists(batch: &RecordBatch, name: &str) -> Result<Option<Flat<f64>>> {
    primitive_lists::<Float64Type>(batch, name, "floats")
}

/// A list-of-ints column as `i32`; `None` when absent.
pub fn int_lists(batch: &RecordBatch, name: &str) -> Result<Option<Flat<i32>>> {
    primitive_lists::<Int32Type>(batch, name, "int32")
}

/// A list-of-bools column (integers accepted: non-zero is true); `None` when absent.
pub fn bool_lists(batch: &RecordBatch, name: &str) -> Result<Option<Flat<bool>>> {
    cast_lists(batch, name, &DataType::Boolean, "booleans", |v| {
        v.as_boolean().values().iter().collect()
    })
}

/// A span column (`struct<start, end>`, nullable); `None` when absent.
pub struct Spans {
    start: Int32Array,
    end: Int32Array,
    valid: Option<Vec<bool>>,
}

impl Spans {
    /// Row i's span, `None` when null.
    pub fn get(&self, i: usize) -> Option<Span> {
        if let Some(v) = &self.valid {
            if !v[i] {
                return None;
            }
        }
        if self.start.is_null(i) || self.end.is_null(i) {
            return None;
        }
        Some(Span {
            start: self.start.value(i),
            end: self.end.value(i),
        })
    }
}

/// Read a span column.
pub fn spans(batch: &RecordBatch, name: &str) -> Result<Option<Spans>> {
    let Some(col) = batch.column_by_name(name) else {
        return Ok(None);
    };
    let s: &StructArray = col.as_struct_opt().ok_or_else(|| {
        anyhow!(
            "column `{name}`: expected struct<start, end>, found {}",
            col.data_type()
        )
    })?;
    let part = |f: &str| -> Result<Int32Array> {
        let c = s
            .column_by_name(f)
            .ok_or_else(|| anyhow!("column `{name}`: no field `{f}`"))?;
        let c = cast(c, &DataType::Int32).with_context(|| format!("column `{name}.{f}`"))?;
        Ok(c.as_primitive::<arrow::datatypes::Int32Type>().clone())
    };
    Ok(Some(Spans {
        start: part("start")?,
        end: part("end")?,
        valid: validity(col),
    }))
}

/// One structured reward component.
#[derive(Clone, Debug, PartialEq)]
pub struct Component {
    pub name: String,
    /// `None` (or negative) for a global component.
    pub turn: Option<i32>,
    pub value: f64,
    pub weight: f64,
}

/// `reward_components` (`list<struct<name, turn, value, weight>>`); `None` when absent.
pub struct Components {
    offsets: Vec<usize>,
    valid: Option<Vec<bool>>,
    /// The names, as utf8 (read through [`StrCol`]).
    name: ArrayRef,
    turn: Int32Array,
    value: Float64Array,
    weight: Float64Array,
}

impl Components {
    /// Row i's components (empty for a null list). Null `value` → error; null `weight` → 1.
    pub fn row(&self, i: usize, out: &mut Vec<Component>) -> Result<()> {
        out.clear();
        if let Some(v) = &self.valid {
            if !v[i] {
                return Ok(());
            }
        }
        let names = StrCol::of_array(self.name.as_ref())
            .ok_or_else(|| anyhow!("internal: reward_components names are not text"))?;
        for j in self.offsets[i]..self.offsets[i + 1] {
            if self.value.is_null(j) {
                bail!(
                    "reward_components: component {} has a null value",
                    j - self.offsets[i]
                );
            }
            out.push(Component {
                name: names.get(j).unwrap_or_default().to_string(),
                turn: (!self.turn.is_null(j)).then(|| self.turn.value(j)),
                value: self.value.value(j),
                weight: if self.weight.is_null(j) {
                    1.0
                } else {
                    self.weight.value(j)
                },
            });
        }
        Ok(())
    }
}

/// Read `reward_components`.
pub fn components(batch: &RecordBatch, name: &str) -> Result<Option<Components>> {
    let Some(col) = batch.column_by_name(name) else {
        return Ok(None);
    };
    let (offsets, vals) = list_parts(col, name)?;
    let s: &StructArray = vals.as_struct_opt().ok_or_else(|| {
        anyhow!(
            "column `{name}`: expected list<struct<name, turn, value, weight>>, found {}",
            col.data_type()
        )
    })?;
    let field = |f: &str, to: &DataType| -> Result<ArrayRef> {
        match s.column_by_name(f) {
            Some(c) => cast(c, to).with_context(|| format!("column `{name}.{f}`")),
            None if f == "weight" => {
                Ok(Arc::new(Float64Array::from(vec![1.0; s.len()])) as ArrayRef)
            }
            None if f == "turn" => Ok(arrow::array::new_null_array(&DataType::Int32, s.len())),
            None => bail!("column `{name}`: no field `{f}`"),
        }
    };
    Ok(Some(Components {
        offsets,
        valid: validity(col),
        name: field("name", &DataType::Utf8)?,
        turn: field("turn", &DataType::Int32)?
            .as_primitive::<arrow::datatypes::Int32Type>()
            .clone(),
        value: field("value", &DataType::Float64)?
            .as_primitive::<arrow::datatypes::Float64Type>()
            .clone(),
        weight: field("weight", &DataType::Float64)?
            .as_primitive::<arrow::datatypes::Float64Type>()
            .clone(),
    }))
}
