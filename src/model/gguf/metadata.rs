//! GGUF metadata values: the thirteen value types of the key/value section (scalars, strings and
//! arrays of any of them, arrays nested at most a few levels), their typed accessors, and their
//! bounds-checked parsing from the file's bytes (no count is trusted before the bytes that remain
//! can hold it).
use anyhow::{bail, Context, Result};

use super::reader::Cursor;

/// Deepest array nesting accepted (arrays of arrays of ...); real files use 1.
const MAX_ARRAY_DEPTH: usize = 8;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A metadata array: homogeneous, typed by its element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

impl Value {
    /// The GGUF name of the value's type (`uint32`, `string`, `array[string]`, ...).
    pub fn type_name(&self) -> String {
        match self {
            Value::U8(_) => "uint8".into(),
            Value::I8(_) => "int8".into(),
            Value::U16(_) => "uint16".into(),
            Value::I16(_) => "int16".into(),
            Value::U32(_) => "uint32".into(),
            Value::I32(_) => "int32".into(),
            Value::U64(_) => "uint64".into(),
            Value::I64(_) => "int64".into(),
            Value::F32(_) => "float32".into(),
            Value::F64(_) => "float64".into(),
            Value::Bool(_) => "bool".into(),
            Value::String(_) => "string".into(),
            Value::Array(a) => format!("array[{}]", a.elem_type_name()),
        }
    }

    /// The value as an integer, if it is one of the integer types (any width or sign).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as a float: floats as they are, integers converted. An `f32` becomes the `f64`
    /// with the same shortest decimal form (`1e-5f32` → `1e-5`, not `9.99999974737875e-6`), which
    /// is the number the model's authors wrote before llama.cpp stored it as `f32`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F64(v) => Some(v),
            Value::F32(v) => Some(f32_to_f64_decimal(v)),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// The value as a string slice, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a bool, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as an array, if it is one.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// `f32` → `f64` through the shortest decimal that round-trips the `f32`.
pub fn f32_to_f64_decimal(v: f32) -> f64 {
    if !v.is_finite() {
        return v as f64;
    }
    // ok: Rust's Display of a finite f32 is always a valid f64 literal.
    format!("{v}").parse::<f64>().unwrap_or(v as f64)
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF name of the element type.
    pub fn elem_type_name(&self) -> String {
        match self {
            Array::U8(_) => "uint8".into(),
            Array::I8(_) => "int8".into(),
            Array::U16(_) => "uint16".into(),
            Array::I16(_) => "int16".into(),
            Array::U32(_) => "uint32".into(),
            Array::I32(_) => "int32".into(),
            Array::U64(_) => "uint64".into(),
            Array::I64(_) => "int64".into(),
            Array::F32(_) => "float32".into(),
            Array::F64(_) => "float64".into(),
            Array::Bool(_) => "bool".into(),
            Array::String(_) => "string".into(),
            Array::Array(v) => match v.first() {
                Some(a) => format!("array[{}]", a.elem_type_name()),
                None => "array".into(),
            },
        }
    }

    /// The elements as strings, if this is a string array.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }

    /// The elements as integers, if this is an integer array (any width or sign).
    pub fn to_i128s(&self) -> Option<Vec<i128>> {
        fn conv<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => conv(v),
            Array::I8(v) => conv(v),
            Array::U16(v) => conv(v),
            Array::I16(v) => conv(v),
            Array::U32(v) => conv(v),
            Array::I32(v) => conv(v),
            Array::U64(v) => conv(v),
            Array::I64(v) => conv(v),
            _ => return None,
        })
    }
}

/// Parsing of metadata values (the value-type id is read before the value).
impl Cursor<'_> {
    pub(super) fn value(&mut self, depth: usize) -> Result<Value> {
        let at = self.pos;
        let ty = self.u32("a value type")?;
        self.value_of(ty, at, depth)
    }

    fn value_of(&mut self, ty: u32, at: usize, depth: usize) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>("a uint8")?[0]),
            1 => Value::I8(i8::from_le_bytes(self.array("an int8")?)),
            2 => Value::U16(u16::from_le_bytes(self.array("a uint16")?)),
            3 => Value::I16(i16::from_le_bytes(self.array("an int16")?)),
            4 => Value::U32(u32::from_le_bytes(self.array("a uint32")?)),
            5 => Value::I32(i32::from_le_bytes(self.array("an int32")?)),
            6 => Value::F32(f32::from_le_bytes(self.array("a float32")?)),
            7 => Value::Bool(self.bool()?),
            8 => Value::String(self.string("a string value")?),
            9 => Value::Array(self.array_value(depth + 1)?),
            10 => Value::U64(u64::from_le_bytes(self.array("a uint64")?)),
            11 => Value::I64(i64::from_le_bytes(self.array("an int64")?)),
            12 => Value::F64(f64::from_le_bytes(self.array("a float64")?)),
            _ => bail!("unknown metadata value type {ty} at offset {at}"),
        })
    }

    fn bool(&mut self) -> Result<bool> {
        let at = self.pos;
        match self.array::<1>("a bool")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => bail!("invalid bool byte {b} at offset {at} (expected 0 or 1)"),
        }
    }

    fn array_value(&mut self, depth: usize) -> Result<Array> {
        if depth > MAX_ARRAY_DEPTH {
            bail!(
                "arrays nested deeper than {MAX_ARRAY_DEPTH} levels at offset {}",
                self.pos
            );
        }
        let at = self.pos;
        let ty = self.u32("an array element type")?;
        let n = self.u64("an array length")?;
        // Smallest encoding of one element, to refuse impossible counts before allocating.
        let min_size = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            _ => bail!("unknown array element type {ty} at offset {at}"),
        };
        self.check_count(n, min_size, "array elements")?;
        let n = n as usize;
        macro_rules! prim {
            ($variant:ident, $t:ty, $what:expr) => {{
                let bytes = self.take(n * std::mem::size_of::<$t>(), $what)?;
                Array::$variant(
                    bytes
                        .chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| {
                            let mut a = [0u8; std::mem::size_of::<$t>()];
                            a.copy_from_slice(c);
                            <$t>::from_le_bytes(a)
                        })
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            0 => Array::U8(self.take(n, "a uint8 array")?.to_vec()),
            1 => prim!(I8, i8, "an int8 array"),
            2 => prim!(U16, u16, "a uint16 array"),
            3 => prim!(I16, i16, "an int16 array"),
            4 => prim!(U32, u32, "a uint32 array"),
            5 => prim!(I32, i32, "an int32 array"),
            6 => prim!(F32, f32, "a float32 array"),
            7 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool()?);
                }
                Array::Bool(v)
            }
            8 => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(
                        self.string("a string array element")
                            .with_context(|| format!("element {i} of the array at offset {at}"))?,
                    );
                }
                Array::String(v)
            }
            9 => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(
                        self.array_value(depth + 1)
                            .with_context(|| format!("element {i} of the array at offset {at}"))?,
                    );
                }
                Array::Array(v)
            }
            10 => prim!(U64, u64, "a uint64 array"),
            11 => prim!(I64, i64, "an int64 array"),
            12 => prim!(F64, f64, "a float64 array"),
            _ => bail!("unknown array element type {ty} at offset {at}"),
        })
    }
}
