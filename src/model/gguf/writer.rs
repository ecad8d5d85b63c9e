//! A minimal GGUF writer: metadata of any [`Value`], tensors given as raw bytes in any ggml type.
//!
//! For tests and fixtures (the import tests build small synthetic models with it); it does no
//! quantization of its own and no validation, so it can also write deliberately broken files.
use super::reader::{Array, Value};

/// One tensor to write: name, ggml dims (fastest first), ggml type id, raw data.
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

/// Builder of a GGUF image.
pub struct Writer {
    /// Format version written in the header (3 by default).
    pub version: u32,
    /// Data alignment used for the layout (32 by default); write `general.alignment` yourself
    /// when you change it.
    pub alignment: u64,
    /// Metadata in file order.
    pub kv: Vec<(String, Value)>,
    /// Tensors in file order.
    pub tensors: Vec<RawTensor>,
}

impl Default for Writer {
    fn default() -> Self {
        Writer {
            version: 3,
            alignment: 32,
            kv: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_payload(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend(x.to_le_bytes()),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    macro_rules! prim {
        ($ty:expr, $v:expr) => {{
            out.extend(($ty as u32).to_le_bytes());
            out.extend(($v.len() as u64).to_le_bytes());
            for x in $v {
                out.extend(x.to_le_bytes());
            }
        }};
    }
    match a {
        Array::U8(v) => prim!(0, v),
        Array::I8(v) => prim!(1, v),
        Array::U16(v) => prim!(2, v),
        Array::I16(v) => prim!(3, v),
        Array::U32(v) => prim!(4, v),
        Array::I32(v) => prim!(5, v),
        Array::F32(v) => prim!(6, v),
        Array::U64(v) => prim!(10, v),
        Array::I64(v) => prim!(11, v),
        Array::F64(v) => prim!(12, v),
        Array::Bool(v) => {
            out.extend(7u32.to_le_bytes());
            out.extend((v.len() as u64).to_le_bytes());
            out.extend(v.iter().map(|&b| b as u8));
        }
        Array::String(v) => {
            out.extend(8u32.to_le_bytes());
            out.extend((v.len() as u64).to_le_bytes());
            for s in v {
                put_str(out, s);
            }
        }
        Array::Array(v) => {
            out.extend(9u32.to_le_bytes());
            out.extend((v.len() as u64).to_le_bytes());
            for inner in v {
                put_array(out, inner);
            }
        }
    }
}

impl Writer {
    /// Add a metadata entry.
    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        self.kv.push((key.to_string(), v));
        self
    }

    /// Add a tensor: ggml dims (fastest first), ggml type id, and its bytes as stored.
    pub fn tensor(&mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.push(RawTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            type_id,
            data,
        });
        self
    }

    /// The file image. Tensor data is laid out in order, each at an aligned offset.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            out.extend(value_type(v).to_le_bytes());
            put_payload(&mut out, v);
        }
        let a = self.alignment as usize;
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            offsets.push(offset);
            offset = (offset + t.data.len()).div_ceil(a) * a;
        }
        for (t, off) in self.tensors.iter().zip(&offsets) {
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.type_id.to_le_bytes());
            out.extend((*off as u64).to_le_bytes());
        }
        out.resize(out.len().div_ceil(a) * a, 0);
        let data_start = out.len();
        for (t, off) in self.tensors.iter().zip(&offsets) {
            out.resize(data_start + off, 0);
            out.extend(&t.data);
        }
        out
    }
}

/// Little-endian f32 bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A string value.
pub fn s(x: &str) -> Value {
    Value::String(x.to_string())
}

/// A string array value.
pub fn strs(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|x| x.to_string()).collect()))
}

/// GPT-2's byte → printable character map (`bytes_to_unicode`): the alphabet of byte-level BPE
/// vocabularies. Printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100 onwards
/// in byte order (so the space 0x20 becomes `Ġ`, U+0120).
pub fn byte_level_alphabet() -> Vec<char> {
    let keep =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256u32;
    (0u32..256)
        .map(|b| {
            let c = if keep(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(c).unwrap_or('?')
        })
        .collect()
}
