//! Arrow values as JSON: the one converter (foreign datasets whose cells are nested: verl's
//! `reward_model.ground_truth`, `extra_info`, `prompt` lists; the cells of the external
//! verifier's requests). Text in any of Arrow's forms reads as a JSON string.
use anyhow::{bail, Result};
use arrow::array::{
    Array, ArrayRef, BooleanArray, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array,
    Int8Array, LargeListArray, ListArray, MapArray, StructArray, UInt16Array, UInt32Array,
    UInt64Array, UInt8Array,
};
use serde_json::{Map, Value};

/// The value of row `i` of `a` as JSON (null for a null cell).
pub fn value(a: &dyn Array, i: usize) -> Result<Value> {
    if a.is_null(i) {
        return Ok(Value::Null);
    }
    let any = a.as_any();
    macro_rules! try_num {
        ($($t:ty),*) => {$(
            if let Some(x) = any.downcast_ref::<$t>() {
                return Ok(serde_json::json!(x.value(i)));
            }
        )*};
    }
    try_num!(
        Int8Array,
        Int16Array,
        Int32Array,
        Int64Array,
        UInt8Array,
        UInt16Array,
        UInt32Array,
        UInt64Array
    );
    if let Some(x) = any.downcast_ref::<Float32Array>() {
        return Ok(float(x.value(i) as f64));
    }
    if let Some(x) = any.downcast_ref::<Float64Array>() {
        return Ok(float(x.value(i)));
    }
    if let Some(x) = any.downcast_ref::<BooleanArray>() {
        return Ok(Value::Bool(x.value(i)));
    }
    // text in any form (plain, large, views, a dictionary of strings)
    if let Some(x) = super::cols::StrCol::of_array(a) {
        return Ok(x
            .get(i)
            .map_or(Value::Null, |s| Value::String(s.to_string())));
    }
    let list = |v: ArrayRef| {
        (0..v.len())
            .map(|j| value(v.as_ref(), j))
            .collect::<Result<Vec<_>>>()
            .map(Value::Array)
    };
    if let Some(x) = any.downcast_ref::<ListArray>() {
        return list(x.value(i));
    }
    if let Some(x) = any.downcast_ref::<LargeListArray>() {
        return list(x.value(i));
    }
    if let Some(x) = any.downcast_ref::<StructArray>() {
        let mut m = Map::new();
        for (f, c) in x.fields().iter().zip(x.columns()) {
            m.insert(f.name().clone(), value(c.as_ref(), i)?);
        }
        return Ok(Value::Object(m));
    }
    if let Some(x) = any.downcast_ref::<MapArray>() {
        // A map with text keys is an object; any other map a list of {key, value} pairs.
        let e = x.value(i);
        let (keys, vals) = (e.column(0), e.column(1));
        let mut m = Map::new();
        for j in 0..e.len() {
            match value(keys.as_ref(), j)? {
                Value::String(k) => {
                    m.insert(k, value(vals.as_ref(), j)?);
                }
                _ => {
                    return (0..e.len())
                        .map(|j| {
                            Ok(serde_json::json!({
                                "key": value(keys.as_ref(), j)?,
                                "value": value(vals.as_ref(), j)?
                            }))
                        })
                        .collect::<Result<Vec<_>>>()
                        .map(Value::Array)
                }
            }
        }
        return Ok(Value::Object(m));
    }
    if let Some(d) =
        any.downcast_ref::<arrow::array::DictionaryArray<arrow::datatypes::Int32Type>>()
    {
        let k = d.keys().value(i) as usize;
        return value(d.values().as_ref(), k);
    }
    bail!(
        "unsupported Arrow type {} for JSON conversion",
        a.data_type()
    )
}

fn float(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 9e15 {
        // Integral floats (pandas turns int columns with nulls into floats) read back as integers.
        serde_json::json!(f as i64)
    } else {
        serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Int64Type;

    #[test]
    fn nested_values() {
        let l =
            ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(3), Some(4)])]);
        assert_eq!(value(&l, 0).unwrap(), serde_json::json!([3, 4]));
        let f = Float64Array::from(vec![2.0, 2.5]);
        assert_eq!(value(&f, 0).unwrap(), serde_json::json!(2));
        assert_eq!(value(&f, 1).unwrap(), serde_json::json!(2.5));
        // text as views and as a dictionary, a null value under a valid key
        let v = arrow::array::StringViewArray::from(vec![Some("a-longer-than-inline-text"), None]);
        assert_eq!(
            value(&v, 0).unwrap(),
            serde_json::json!("a-longer-than-inline-text")
        );
        assert_eq!(value(&v, 1).unwrap(), Value::Null);
        let d = arrow::array::DictionaryArray::<arrow::datatypes::Int32Type>::new(
            arrow::array::Int32Array::from(vec![1, 0]),
            std::sync::Arc::new(arrow::array::StringArray::from(vec![None, Some("x")])),
        );
        assert_eq!(value(&d, 0).unwrap(), serde_json::json!("x"));
        assert_eq!(value(&d, 1).unwrap(), Value::Null);
    }
}
