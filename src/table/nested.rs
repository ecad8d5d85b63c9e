//! The nested columns: `messages` as `list<struct<role:utf8, content:utf8>>` and `extra_info` as
//! a struct whose fields are inferred from the table's values, so that polars and DuckDB users
//! query them directly (`messages[1].content` in DuckDB, `pl.col("extra_info").struct.field("split")`
//! in polars) instead of decoding JSON text.
//!
//! Why a struct for `extra_info` and not `map<string, string>`: the datasets it comes from hold
//! it as a struct already (verl's Parquet files, written by pandas/pyarrow from Python dicts:
//! `struct<split, index, answer, question>`), polars has no map type (it reads a Parquet map as a
//! list of key/value structs) and a map's values would still be JSON text to decode, while both
//! tools read a struct's fields with their own types. A struct needs one type per key across
//! the table: the fields are inferred over every row at write time (nested objects and lists
//! become nested structs and lists, a null value is a null field, integers and floats share
//! float64). A row's `extra_info` reads back as it was written, so the struct is only chosen
//! where that holds: every object at the same place has the same keys (a struct cannot tell a
//! missing key from a null one). The one change: a float with a whole value reads back as an
//! integer (`1.0` as `1`), as `prepare` reads every Parquet float (pandas writes integer columns
//! with nulls as floats). Values that have no struct type (a key missing from some rows, a string
//! in one row and a number in another, rows that are not objects, no keys at all) keep the column
//! as JSON text, the format of schema version 1, which every reader still accepts. `messages` is native when
//! every message is exactly `{role, content}` with string values, else JSON text likewise.
//!
//! Stages keep working on JSON values: [`messages_text`] and [`extra_info_value`] read either
//! form, [`messages_column`] and [`extra_info_column`] write the native one where it fits.
use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use arrow::array::builder::NullBufferBuilder;
use arrow::array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int64Array, ListArray, StringArray, StructArray,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Fields};
use serde_json::{Map, Value};

/// Fields of one message.
pub fn message_fields() -> Fields {
    Fields::from(vec![
        Field::new("role", DataType::Utf8, false),
        Field::new("content", DataType::Utf8, false),
    ])
}

/// `list<struct<role:utf8, content:utf8>>`.
pub fn messages_type() -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(message_fields()),
        false,
    )))
}

/// Whether `dt` is a native messages type (a list of structs with utf8 `role` and `content`).
pub fn is_native_messages(dt: &DataType) -> bool {
    match dt {
        DataType::List(f) | DataType::LargeList(f) => match f.data_type() {
            DataType::Struct(fs) => ["role", "content"].iter().all(|n| {
                fs.find(n).is_some_and(|(_, f)| {
                    matches!(f.data_type(), DataType::Utf8 | DataType::LargeUtf8)
                })
            }),
            _ => false,
        },
        _ => false,
    }
}

/// A conversation's `(role, content)` pairs.
type Conversation<'a> = Vec<(&'a str, &'a str)>;

/// A native `messages` column as exactly [`messages_type`] (other tools write the same data with
/// nullable fields, large lists or more fields): `role` and `content` taken by name, every
/// other message field dropped. A null role or content is an error naming the row.
pub fn canonical_messages(col: &dyn Array) -> Result<ArrayRef> {
    if col.data_type() == &messages_type() {
        return Ok(arrow::array::make_array(col.to_data()));
    }
    let list = arrow::compute::cast(
        col,
        &DataType::List(Arc::new(Field::new(
            "item",
            match col.data_type() {
                DataType::List(f) | DataType::LargeList(f) => f.data_type().clone(),
                t => return Err(anyhow!("type {t}: not a list of messages")),
            },
            true,
        ))),
    )?;
    let list = list
        .as_any()
        .downcast_ref::<ListArray>()
        .ok_or_else(|| anyhow!("internal: list of messages"))?;
    let items = list
        .values()
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or_else(|| anyhow!("not a list of structs"))?;
    let field = |name: &str| -> Result<StringArray> {
        let c = items
            .column_by_name(name)
            .ok_or_else(|| anyhow!("messages have no `{name}` field"))?;
        let c = arrow::compute::cast(c, &DataType::Utf8)?;
        text_array(c.as_ref())
    };
    let (roles, contents) = (field("role")?, field("content")?);
    let offsets = list.value_offsets();
    for i in 0..list.len() {
        if list.is_null(i) {
            continue;
        }
        for j in offsets[i] as usize..offsets[i + 1] as usize {
            if items.is_null(j) || roles.is_null(j) || contents.is_null(j) {
                return Err(anyhow!(
                    "row {i}, message {}: a null message, role or content",
                    j - offsets[i] as usize
                ));
            }
        }
    }
    let values = StructArray::new(
        message_fields(),
        vec![Arc::new(roles) as ArrayRef, Arc::new(contents)],
        None,
    );
    Ok(Arc::new(ListArray::new(
        Arc::new(Field::new(
            "item",
            DataType::Struct(message_fields()),
            false,
        )),
        list.offsets().clone(),
        Arc::new(values),
        list.nulls().cloned(),
    )))
}

/// The `(role, content)` pairs of a conversation when it has exactly that shape.
fn role_content(v: &Value) -> Option<Conversation<'_>> {
    v.as_array()?
        .iter()
        .map(|m| {
            let o = m.as_object()?;
            if o.len() != 2 {
                return None;
            }
            Some((o.get("role")?.as_str()?, o.get("content")?.as_str()?))
        })
        .collect()
}

/// The `messages` column of `rows` (`None` = null): native when every conversation is a list of
/// `{role, content}` strings, else JSON text.
pub fn messages_column(rows: &[Option<&Value>]) -> ArrayRef {
    let pairs: Option<Vec<Option<Conversation>>> = rows
        .iter()
        .map(|r| match r {
            None => Some(None),
            Some(v) => role_content(v).map(Some),
        })
        .collect();
    let Some(pairs) = pairs else {
        return Arc::new(StringArray::from(
            rows.iter()
                .map(|r| r.map(|v| v.to_string()))
                .collect::<Vec<_>>(),
        ));
    };
    let flat: Vec<(&str, &str)> = pairs.iter().flatten().flatten().copied().collect();
    let roles: ArrayRef = Arc::new(StringArray::from_iter_values(flat.iter().map(|p| p.0)));
    let contents: ArrayRef = Arc::new(StringArray::from_iter_values(flat.iter().map(|p| p.1)));
    let items = StructArray::new(message_fields(), vec![roles, contents], None);
    let offsets =
        OffsetBuffer::from_lengths(pairs.iter().map(|p| p.as_ref().map_or(0, |v| v.len())));
    let mut nulls = NullBufferBuilder::new(rows.len());
    for p in &pairs {
        nulls.append(p.is_some());
    }
    let field = Arc::new(Field::new(
        "item",
        DataType::Struct(message_fields()),
        false,
    ));
    Arc::new(ListArray::new(
        field,
        offsets,
        Arc::new(items),
        nulls.finish(),
    ))
}

/// The `messages` column from JSON texts (rows that do not parse keep the column as text).
pub fn messages_column_from_text(texts: &[Option<&str>]) -> ArrayRef {
    let parsed: Option<Vec<Option<Value>>> = texts
        .iter()
        .map(|t| match t {
            None => Some(None),
            Some(s) => serde_json::from_str(s).ok().map(Some),
        })
        .collect();
    match parsed {
        Some(vals) => messages_column(&vals.iter().map(|v| v.as_ref()).collect::<Vec<_>>()),
        None => Arc::new(StringArray::from(texts.to_vec())),
    }
}

/// A `messages` column, native or text, as JSON text per row (`[{"content": …, "role": …}]` for
/// native rows).
pub fn messages_text(col: &dyn Array) -> Result<StringArray> {
    if is_native_messages(col.data_type()) {
        let mut out = Vec::with_capacity(col.len());
        for i in 0..col.len() {
            out.push(if col.is_null(i) {
                None
            } else {
                Some(super::json::value(col, i)?.to_string())
            });
        }
        return Ok(StringArray::from(out));
    }
    let c = match col.data_type() {
        DataType::Utf8 => return text_array(col),
        DataType::LargeUtf8 | DataType::Utf8View => arrow::compute::cast(col, &DataType::Utf8)?,
        t => {
            return Err(anyhow!(
                "type {t}: expected list<struct<role, content>> or JSON text"
            ))
        }
    };
    text_array(c.as_ref())
}

fn text_array(col: &dyn Array) -> Result<StringArray> {
    col.as_any()
        .downcast_ref::<StringArray>()
        .cloned()
        .ok_or_else(|| anyhow!("internal: utf8 column"))
}

// ---------------------------------------------------------------------------------------------
// extra_info

/// The Arrow type inferred for a set of JSON values.
#[derive(Clone, Debug, PartialEq)]
enum Ty {
    /// Only nulls seen so far.
    Null,
    Bool,
    Int,
    Float,
    Str,
    List(Box<Ty>),
    Struct(BTreeMap<String, Ty>),
}

/// The type of one value; `None` for a value with none (a number outside i64/f64).
fn ty_of(v: &Value) -> Option<Ty> {
    Some(match v {
        Value::Null => Ty::Null,
        Value::Bool(_) => Ty::Bool,
        Value::Number(n) if n.is_i64() => Ty::Int,
        Value::Number(n) if n.is_f64() => Ty::Float,
        Value::Number(_) => return None,
        Value::String(_) => Ty::Str,
        Value::Array(a) => {
            let mut t = Ty::Null;
            for x in a {
                t = unify(t, ty_of(x)?)?;
            }
            Ty::List(Box::new(t))
        }
        Value::Object(o) => {
            let mut m = BTreeMap::new();
            for (k, x) in o {
                m.insert(k.clone(), ty_of(x)?);
            }
            Ty::Struct(m)
        }
    })
}

/// The common type of two, if any: objects with the same keys, lists of a common type, integers
/// with floats, a null with anything.
fn unify(a: Ty, b: Ty) -> Option<Ty> {
    Some(match (a, b) {
        (Ty::Null, t) | (t, Ty::Null) => t,
        (Ty::Int, Ty::Float) | (Ty::Float, Ty::Int) => Ty::Float,
        (Ty::List(x), Ty::List(y)) => Ty::List(Box::new(unify(*x, *y)?)),
        (Ty::Struct(mut x), Ty::Struct(y)) => {
            if x.len() != y.len() {
                return None;
            }
            for (k, t) in y {
                let merged = unify(x.remove(&k)?, t)?;
                x.insert(k, merged);
            }
            Ty::Struct(x)
        }
        (a, b) if a == b => a,
        _ => return None,
    })
}

/// Whether every part of `t` has an Arrow type Parquet can hold (no all-null leaves, no structs
/// without fields).
fn writable(t: &Ty) -> bool {
    match t {
        Ty::Null => false,
        Ty::List(x) => writable(x),
        Ty::Struct(m) => !m.is_empty() && m.values().all(writable),
        _ => true,
    }
}

fn arrow_type(t: &Ty) -> DataType {
    match t {
        Ty::Null => DataType::Null,
        Ty::Bool => DataType::Boolean,
        Ty::Int => DataType::Int64,
        Ty::Float => DataType::Float64,
        Ty::Str => DataType::Utf8,
        Ty::List(x) => DataType::List(Arc::new(Field::new("item", arrow_type(x), true))),
        Ty::Struct(m) => DataType::Struct(struct_fields(m)),
    }
}

fn struct_fields(m: &BTreeMap<String, Ty>) -> Fields {
    Fields::from(
        m.iter()
            .map(|(k, t)| Field::new(k, arrow_type(t), true))
            .collect::<Vec<_>>(),
    )
}

/// A present, non-null value.
fn non_null<'a>(v: &Option<&'a Value>) -> Option<&'a Value> {
    v.filter(|x| !x.is_null())
}

/// `f` of each of `vals` that is not null (None or JSON null), else `None`.
fn cells<'a, T>(vals: &[Option<&'a Value>], f: impl Fn(&'a Value) -> Option<T>) -> Vec<Option<T>> {
    vals.iter().map(|v| non_null(v).and_then(&f)).collect()
}

/// The array of `vals` (None or JSON null = null) with type `t`.
fn build(t: &Ty, vals: &[Option<&Value>]) -> ArrayRef {
    let get = non_null;
    match t {
        Ty::Null => Arc::new(arrow::array::NullArray::new(vals.len())),
        Ty::Bool => Arc::new(BooleanArray::from(cells(vals, Value::as_bool))),
        Ty::Int => Arc::new(Int64Array::from(cells(vals, Value::as_i64))),
        Ty::Float => Arc::new(Float64Array::from(cells(vals, Value::as_f64))),
        Ty::Str => Arc::new(StringArray::from(cells(vals, Value::as_str))),
        Ty::List(x) => {
            let items: Vec<Option<&Value>> = vals
                .iter()
                .flat_map(|v| get(v).and_then(Value::as_array).into_iter().flatten())
                .map(Some)
                .collect();
            let child = build(x, &items);
            let offsets = OffsetBuffer::from_lengths(
                vals.iter()
                    .map(|v| get(v).and_then(Value::as_array).map_or(0, |a| a.len())),
            );
            let mut nulls = NullBufferBuilder::new(vals.len());
            for v in vals {
                nulls.append(get(v).is_some());
            }
            Arc::new(ListArray::new(
                Arc::new(Field::new("item", arrow_type(x), true)),
                offsets,
                child,
                nulls.finish(),
            ))
        }
        Ty::Struct(m) => {
            let objs: Vec<Option<&Map<String, Value>>> = vals
                .iter()
                .map(|v| get(v).and_then(Value::as_object))
                .collect();
            let children: Vec<ArrayRef> = m
                .iter()
                .map(|(k, t)| {
                    let col: Vec<Option<&Value>> =
                        objs.iter().map(|o| o.and_then(|o| o.get(k))).collect();
                    build(t, &col)
                })
                .collect();
            let mut nulls = NullBufferBuilder::new(vals.len());
            for o in &objs {
                nulls.append(o.is_some());
            }
            Arc::new(StructArray::new(struct_fields(m), children, nulls.finish()))
        }
    }
}

/// The `extra_info` column of `rows` (`None` = null): a struct inferred over the rows when every
/// row is an object (or null) with the same keys, each of one type, else JSON text. Either way
/// [`extra_info_value`] gives every row back (a whole float as an integer).
pub fn extra_info_column(rows: &[Option<&Value>]) -> ArrayRef {
    let mut t = Some(Ty::Null);
    for v in rows.iter().flatten() {
        t = match (t, v) {
            (Some(acc), Value::Object(_)) => ty_of(v).and_then(|x| unify(acc, x)),
            (Some(acc), Value::Null) => Some(acc),
            _ => None,
        };
    }
    match t {
        Some(t) if writable(&t) => build(&t, rows),
        _ => Arc::new(StringArray::from(
            rows.iter()
                .map(|r| r.filter(|v| !v.is_null()).map(|v| v.to_string()))
                .collect::<Vec<_>>(),
        )),
    }
}

/// Whether `dt` is a type `extra_info` may have: JSON text, a struct, or a map.
pub fn is_extra_info_type(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Struct(_)
            | DataType::Map(_, _)
    )
}

/// Row `i` of an `extra_info` column as JSON: text parsed, a struct's fields (nulls included, as
/// pandas reads them; a whole float as an integer), a map's entries. Null for a null cell.
pub fn extra_info_value(col: &dyn Array, i: usize) -> Result<Value> {
    if col.is_null(i) {
        return Ok(Value::Null);
    }
    match col.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let c = arrow::compute::cast(&col.slice(i, 1), &DataType::Utf8)?;
            let s = text_array(c.as_ref())?;
            serde_json::from_str(s.value(0)).map_err(|e| anyhow!("not JSON text ({e})"))
        }
        DataType::Map(_, _) => {
            let m = col
                .as_any()
                .downcast_ref::<arrow::array::MapArray>()
                .ok_or_else(|| anyhow!("internal: map column"))?;
            let e = m.value(i);
            let (keys, values) = (e.column(0), e.column(1));
            let mut out = Map::new();
            for j in 0..e.len() {
                let k = match super::json::value(keys.as_ref(), j)? {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                out.insert(k, super::json::value(values.as_ref(), j)?);
            }
            Ok(Value::Object(out))
        }
        _ => super::json::value(col, i),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_native_and_back() {
        let a = json!([{"role": "user", "content": "hi"}]);
        let b = json!([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]);
        let col = messages_column(&[Some(&a), Some(&b)]);
        assert_eq!(col.data_type(), &messages_type());
        assert!(is_native_messages(col.data_type()));
        let t = messages_text(col.as_ref()).unwrap();
        let back: Value = serde_json::from_str(t.value(1)).unwrap();
        assert_eq!(back, b);
        // Another key, or a non-string content: JSON text, unchanged.
        let c = json!([{"role": "user", "content": [{"type": "text", "text": "x"}]}]);
        let col = messages_column(&[Some(&a), Some(&c)]);
        assert_eq!(col.data_type(), &DataType::Utf8);
        let t = messages_text(col.as_ref()).unwrap();
        assert_eq!(serde_json::from_str::<Value>(t.value(1)).unwrap(), c);
    }

    /// polars writes the same conversations with nullable fields (and large lists): they read
    /// back as the canonical type with the same values.
    #[test]
    fn nullable_message_fields_become_canonical() {
        let fields = Fields::from(vec![
            Field::new("content", DataType::Utf8, true),
            Field::new("role", DataType::Utf8, true),
            Field::new("name", DataType::Utf8, true),
        ]);
        let items = StructArray::new(
            fields.clone(),
            vec![
                Arc::new(StringArray::from(vec!["hi", "yo"])) as ArrayRef,
                Arc::new(StringArray::from(vec!["user", "assistant"])),
                Arc::new(StringArray::from(vec![None::<&str>, None])),
            ],
            None,
        );
        let list = ListArray::new(
            Arc::new(Field::new("item", DataType::Struct(fields), true)),
            OffsetBuffer::from_lengths([2, 0]),
            Arc::new(items),
            None,
        );
        assert!(is_native_messages(list.data_type()));
        let c = canonical_messages(&list).unwrap();
        assert_eq!(c.data_type(), &messages_type());
        let t = messages_text(c.as_ref()).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(t.value(0)).unwrap(),
            json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
        );
        assert_eq!(t.value(1), "[]");
    }

    #[test]
    fn extra_info_struct_inferred() {
        let r0 = json!({"split": "train", "index": 0, "score": 1, "tags": ["a"], "m": {"x": true}});
        let r2 = json!({"split": null, "index": 7, "score": 0.5, "tags": [], "m": null});
        let r3 = json!({"split": "test", "index": 8, "score": 2.5, "tags": null, "m": {"x": null}});
        let col = extra_info_column(&[Some(&r0), None, Some(&r2), Some(&r3)]);
        let DataType::Struct(fs) = col.data_type() else {
            panic!("{}", col.data_type())
        };
        let names: Vec<&str> = fs.iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["index", "m", "score", "split", "tags"]);
        assert_eq!(fs.find("index").unwrap().1.data_type(), &DataType::Int64);
        assert_eq!(fs.find("score").unwrap().1.data_type(), &DataType::Float64);
        assert_eq!(extra_info_value(col.as_ref(), 1).unwrap(), Value::Null);
        // Every row back exactly: explicit nulls stay, `[]` stays empty, integers beside floats
        // stay integers.
        for (i, r) in [(0, &r0), (2, &r2), (3, &r3)] {
            let back = extra_info_value(col.as_ref(), i).unwrap();
            assert_eq!(&back, r, "row {i}");
            assert_eq!(back.to_string(), r.to_string(), "row {i}");
        }
        // A whole float comes back as an integer.
        let w = json!({"w": 2.0});
        let col = extra_info_column(&[Some(&w)]);
        assert_eq!(
            extra_info_value(col.as_ref(), 0).unwrap().to_string(),
            r#"{"w":2}"#
        );
    }

    #[test]
    fn extra_info_falls_back_to_text() {
        for rows in [
            vec![json!({"a": 1}), json!({"a": "x"})],
            vec![json!({"a": 1}), json!(3)],
            vec![json!({}), json!({})],
            vec![json!({"a": null})],
            // A key missing from a row (a struct would read it back as null).
            vec![json!({"a": 1, "b": 2}), json!({"a": 3})],
            vec![json!({"a": {"x": 1}}), json!({"a": {"x": 1, "y": 2}})],
            vec![json!({"a": [{"x": 1}, {"y": 2}]})],
            vec![json!({"a": 1}), json!({}), json!({"a": 2})],
        ] {
            let refs: Vec<Option<&Value>> = rows.iter().map(Some).collect();
            let col = extra_info_column(&refs);
            assert_eq!(col.data_type(), &DataType::Utf8, "{rows:?}");
            for (i, r) in rows.iter().enumerate() {
                let back = extra_info_value(col.as_ref(), i).unwrap();
                assert_eq!(back.to_string(), r.to_string());
            }
        }
    }
}
