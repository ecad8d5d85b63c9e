//! The GGUF container: header, metadata key/values, tensor infos and the aligned data section.
//!
//! Layout (GGUF v2/v3, little-endian; <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>):
//! `"GGUF"`, `u32` version, `u64` tensor count, `u64` metadata count; then the metadata as
//! `(string key, u32 value type, value)`; then per tensor `(string name, u32 n_dims, u64 dims[n_dims],
//! u32 ggml type, u64 offset)`; then padding to `general.alignment` (default 32) and the data section.
//! A string is a `u64` byte length and UTF-8 bytes; an array is a `u32` element type, a `u64` count
//! and the elements.
//!
//! Design: the file is memory-mapped ([`GgufFile::open`]) or held in memory
//! ([`GgufFile::from_bytes`], for tests), parsed once up front, and every tensor's byte range is
//! validated at open time, so later reads are plain slices. Every read is bounds-checked and every
//! failure names the byte offset; counts and lengths are checked against the bytes that remain
//! before anything is allocated, so a corrupt count cannot make us allocate gigabytes, and array
//! nesting is capped, so a crafted file cannot overflow the stack. Nothing here panics on input.
//! The metadata values and their parsing are in [`super::metadata`], the tensor storage types in
//! [`super::ggml_type`].
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

pub use super::ggml_type::GgmlType;
pub use super::metadata::{f32_to_f64_decimal, Array, Value};

/// The four magic bytes at the start of every GGUF file.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// Default alignment of the data section and of every tensor's offset.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// At most this many dimensions per tensor (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;

/// One tensor's description from the tensor-info table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// llama.cpp name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// ggml dimensions, fastest-varying first (`ne[0]` is the row length). The row-major
    /// (PyTorch) shape is this reversed.
    pub dims: Vec<u64>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the data section, as stored in the file.
    pub offset: u64,
    /// Absolute byte range of the data in the file (validated to lie inside it).
    pub start: usize,
    /// Length of the data in bytes.
    pub n_bytes: usize,
    /// Number of elements (product of `dims`).
    pub n_elements: usize,
}

impl TensorInfo {
    /// The row-major shape (PyTorch/safetensors order): `dims` reversed.
    pub fn shape(&self) -> Vec<usize> {
        // ok: every dim was checked to fit in usize when the file was parsed (n_elements fits).
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// The bytes behind a [`GgufFile`]: a read-only memory map, or an owned buffer.
enum Bytes {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mmap(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file: metadata, tensor infos, and access to the tensor bytes.
pub struct GgufFile {
    bytes: Bytes,
    /// Where the bytes came from (for error messages).
    source: PathBuf,
    /// Format version (2 or 3).
    pub version: u32,
    /// Alignment of the data section (`general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: usize,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("source", &self.source)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-map and parse a GGUF file.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: the map is read-only and private to this process. Memory-mapping is sound as
        // long as nobody truncates or rewrites the file while we read it; that is the same
        // contract every GGUF reader (llama.cpp, gguf-py) relies on, and the file is an input we
        // never write.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("memory-mapping {}", path.display()))?;
        Self::parse(Bytes::Mmap(map), path.to_path_buf())
            .with_context(|| format!("reading GGUF file {}", path.display()))
    }

    /// Parse a GGUF image held in memory (tests, small files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse(Bytes::Owned(bytes), PathBuf::from("<memory>"))
    }

    fn parse(bytes: Bytes, source: PathBuf) -> Result<GgufFile> {
        let buf: &[u8] = &bytes;
        let mut c = Cursor { buf, pos: 0 };
        let magic = c.take(4, "the magic bytes")?;
        if magic != MAGIC {
            bail!(
                "not a GGUF file: the first bytes are {:?}, expected \"GGUF\"",
                String::from_utf8_lossy(magic)
            );
        }
        let version = c.u32("the version")?;
        if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            bail!("big-endian GGUF files are not supported (version field {version:#x})");
        }
        if version == 1 {
            bail!("GGUF version 1 is not supported (it predates 64-bit counts); convert the file again with a current llama.cpp");
        }
        if version != 2 && version != 3 {
            bail!("unsupported GGUF version {version} (supported: 2, 3)");
        }
        let n_tensors = c.u64("the tensor count")?;
        let n_kv = c.u64("the metadata count")?;
        // Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at
        // least 8 + 4 + 4 + 8.
        c.check_count(n_kv, 13, "metadata entries")?;

        let mut metadata = Vec::new();
        let mut meta_index = HashMap::new();
        for i in 0..n_kv {
            let at = c.pos;
            let key = c
                .string("a metadata key")
                .with_context(|| format!("metadata entry {i}"))?;
            let value = c
                .value(0)
                .with_context(|| format!("metadata entry {i} (`{key}`, at offset {at})"))?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                bail!("duplicate metadata key `{key}` at offset {at}");
            }
            metadata.push((key, value));
        }

        let alignment = match meta_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => {
                let a = v.as_i128().ok_or_else(|| {
                    anyhow!(
                        "general.alignment must be an integer, found {}",
                        v.type_name()
                    )
                })?;
                if a <= 0 || a > 1 << 30 || (a & (a - 1)) != 0 {
                    bail!("general.alignment must be a power of two, found {a}");
                }
                a as u64
            }
        };

        c.check_count(n_tensors, 24, "tensor infos")?;
        struct Raw {
            name: String,
            dims: Vec<u64>,
            ggml_type: GgmlType,
            offset: u64,
            at: usize,
        }
        let mut raws = Vec::new();
        let mut tensor_index = HashMap::new();
        for i in 0..n_tensors {
            let at = c.pos;
            let name = c
                .string("a tensor name")
                .with_context(|| format!("tensor info {i} at offset {at}"))?;
            let ctx = || format!("tensor info {i} (`{name}`, at offset {at})");
            let n_dims = c.u32("the number of dimensions").with_context(ctx)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                bail!(
                    "{}: {n_dims} dimensions (ggml allows 1 to {MAX_DIMS})",
                    ctx()
                );
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("a dimension").with_context(ctx)?);
            }
            let type_at = c.pos;
            let type_id = c.u32("the tensor type").with_context(ctx)?;
            let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
                anyhow!(
                    "{}: unknown or removed ggml type id {type_id} at offset {type_at}",
                    ctx()
                )
            })?;
            let offset = c.u64("the data offset").with_context(ctx)?;
            if tensor_index.insert(name.clone(), raws.len()).is_some() {
                bail!("duplicate tensor name `{name}` at offset {at}");
            }
            raws.push(Raw {
                name,
                dims,
                ggml_type,
                offset,
                at,
            });
        }

        let end_of_infos = c.pos as u64;
        let data_start = end_of_infos.div_ceil(alignment) * alignment;
        let file_len = buf.len() as u64;
        if !raws.is_empty() && data_start > file_len {
            bail!(
                "truncated GGUF: the data section should start at offset {data_start} but the file has {file_len} bytes"
            );
        }
        let mut tensors = Vec::with_capacity(raws.len());
        for r in raws {
            let ctx = || {
                format!(
                    "tensor `{}` ({}, dims {:?}, info at offset {})",
                    r.name, r.ggml_type, r.dims, r.at
                )
            };
            let n_elements = r
                .dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n <= (1u64 << 40))
                .ok_or_else(|| anyhow!("{}: the element count overflows", ctx()))?;
            let (block, type_size) = r.ggml_type.block_layout();
            if !r.dims[0].is_multiple_of(block) {
                bail!(
                    "{}: the row length {} is not a multiple of the {} block size {block}",
                    ctx(),
                    r.dims[0],
                    r.ggml_type
                );
            }
            let n_bytes = n_elements / block * type_size;
            if !r.offset.is_multiple_of(alignment) {
                bail!(
                    "{}: data offset {} is not a multiple of the alignment {alignment}",
                    ctx(),
                    r.offset
                );
            }
            let start = data_start
                .checked_add(r.offset)
                .filter(|&s| s.checked_add(n_bytes).is_some_and(|e| e <= file_len))
                .ok_or_else(|| {
                    anyhow!(
                        "truncated GGUF: {}: data at offset {} + {} bytes ends past the end of the file ({file_len} bytes)",
                        ctx(),
                        data_start.saturating_add(r.offset),
                        n_bytes
                    )
                })?;
            tensors.push(TensorInfo {
                name: r.name,
                dims: r.dims,
                ggml_type: r.ggml_type,
                offset: r.offset,
                // All three fit in usize: they are bounded by the file length.
                start: start as usize,
                n_bytes: n_bytes as usize,
                n_elements: n_elements as usize,
            });
        }

        Ok(GgufFile {
            version,
            alignment,
            data_start: data_start.min(file_len) as usize,
            metadata,
            meta_index,
            tensors,
            tensor_index,
            source,
            bytes,
        })
    }

    /// Where the file came from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// An optional value converted by `f`; an error naming `expected` when present and `f`
    /// refuses it.
    fn get_as<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        f: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| {
                anyhow!(
                    "metadata `{key}` must be {expected}, found {}",
                    v.type_name()
                )
            }),
        }
    }

    /// An optional string value; an error when present with another type.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.get_as(key, "a string", Value::as_str)
    }

    /// An optional non-negative integer value; an error when present with another type or
    /// negative.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get_as(key, "an integer", Value::as_i128)? {
            None => Ok(None),
            Some(i) => u64::try_from(i)
                .map(Some)
                .map_err(|_| anyhow!("metadata `{key}` must not be negative, found {i}")),
        }
    }

    /// An optional float value (integers accepted); an error when present with another type.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get_as(key, "a number", Value::as_f64)
    }

    /// An optional bool value; an error when present with another type.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get_as(key, "a bool", Value::as_bool)
    }

    /// An optional array of strings; an error when present with another type.
    pub fn get_strings(&self, key: &str) -> Result<Option<&[String]>> {
        self.get_as(key, "an array of strings", |v| v.as_array()?.as_strings())
    }

    /// An optional array value; an error when present with another type.
    pub fn get_array(&self, key: &str) -> Result<Option<&Array>> {
        self.get_as(key, "an array", Value::as_array)
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// One tensor info by its llama.cpp name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's raw bytes (validated at open time to lie inside the file).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8]> {
        self.bytes
            .get(t.start..t.start + t.n_bytes)
            .ok_or_else(|| anyhow!("tensor `{}` does not belong to this file", t.name))
    }
}

/// A bounds-checked little-endian reader over the file's bytes.
pub(super) struct Cursor<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(super) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        match self
            .pos
            .checked_add(n)
            .and_then(|end| self.buf.get(self.pos..end))
        {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(anyhow!(
                "truncated GGUF: {what} needs {n} bytes at offset {} but only {} remain (file size {})",
                self.pos,
                self.remaining(),
                self.buf.len()
            )),
        }
    }

    pub(super) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(super) fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(super) fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Refuse a count whose minimal encoding would not fit in the remaining bytes.
    pub(super) fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<()> {
        if count.saturating_mul(min_size) > self.remaining() as u64 {
            bail!(
                "truncated or corrupt GGUF: {count} {what} at offset {} cannot fit in the {} remaining bytes",
                self.pos,
                self.remaining()
            );
        }
        Ok(())
    }

    fn len(&mut self, what: &str) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        if n > self.remaining() as u64 {
            bail!(
                "truncated or corrupt GGUF: {what} at offset {at} claims {n} bytes but only {} remain",
                self.remaining()
            );
        }
        Ok(n as usize)
    }

    pub(super) fn string(&mut self, what: &str) -> Result<String> {
        let n = self.len(what)?;
        let at = self.pos;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| anyhow!("{what} at offset {at} is not valid UTF-8: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::writer::{f32_bytes, s, strs, Writer};
    use super::*;
    use proptest::prelude::*;

    fn every_value_type() -> Vec<(String, Value)> {
        vec![
            ("t.u8".into(), Value::U8(200)),
            ("t.i8".into(), Value::I8(-100)),
            ("t.u16".into(), Value::U16(60000)),
            ("t.i16".into(), Value::I16(-30000)),
            ("t.u32".into(), Value::U32(4_000_000_000)),
            ("t.i32".into(), Value::I32(-2_000_000_000)),
            ("t.u64".into(), Value::U64(u64::MAX)),
            ("t.i64".into(), Value::I64(i64::MIN)),
            ("t.f32".into(), Value::F32(1e-5)),
            ("t.f64".into(), Value::F64(-1.5e300)),
            ("t.bool".into(), Value::Bool(true)),
            ("t.str".into(), s("héllo\n{{ x }}")),
            ("t.empty_str".into(), s("")),
            ("t.a_u8".into(), Value::Array(Array::U8(vec![1, 2, 255]))),
            ("t.a_i8".into(), Value::Array(Array::I8(vec![-1, 2]))),
            ("t.a_u16".into(), Value::Array(Array::U16(vec![7]))),
            ("t.a_i16".into(), Value::Array(Array::I16(vec![-7, 7]))),
            ("t.a_u32".into(), Value::Array(Array::U32(vec![1, 2, 3]))),
            ("t.a_i32".into(), Value::Array(Array::I32(vec![3, -3]))),
            ("t.a_u64".into(), Value::Array(Array::U64(vec![u64::MAX]))),
            ("t.a_i64".into(), Value::Array(Array::I64(vec![-5]))),
            ("t.a_f32".into(), Value::Array(Array::F32(vec![0.5, -0.25]))),
            ("t.a_f64".into(), Value::Array(Array::F64(vec![1e-300]))),
            (
                "t.a_bool".into(),
                Value::Array(Array::Bool(vec![true, false])),
            ),
            ("t.a_str".into(), strs(&["Ġ t", "", "<|im_end|>"])),
            ("t.a_empty".into(), Value::Array(Array::I32(vec![]))),
            (
                "t.a_nested".into(),
                Value::Array(Array::Array(vec![
                    Array::String(vec!["a".into()]),
                    Array::String(vec!["b".into(), "c".into()]),
                ])),
            ),
        ]
    }

    fn sample() -> Writer {
        let mut w = Writer::default();
        for (k, v) in every_value_type() {
            w.kv(&k, v);
        }
        // A 3 × 2 f32 matrix (ggml dims [2, 3]) and a 5-element vector (not a multiple of 32
        // bytes, so the next tensor needs padding).
        w.tensor("m", &[2, 3], 0, f32_bytes(&[1., 2., 3., 4., 5., 6.]));
        w.tensor("v", &[5], 0, f32_bytes(&[7., 8., 9., 10., 11.]));
        w.tensor("h", &[2], 1, vec![0x00, 0x3C, 0x00, 0xC0]);
        w
    }

    #[test]
    fn metadata_of_every_type_round_trips() {
        let g = GgufFile::from_bytes(sample().to_bytes()).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.metadata(), &every_value_type()[..]);
        assert_eq!(g.get("t.u32"), Some(&Value::U32(4_000_000_000)));
        assert_eq!(g.get_u64("t.u64").unwrap(), Some(u64::MAX));
        assert!(g.get_u64("t.i8").is_err()); // negative
        assert!(g.get_u64("t.str").is_err()); // wrong type
        assert_eq!(g.get_u64("absent").unwrap(), None);
        // f32 metadata converts through its shortest decimal: 1e-5, not 9.99999974737875e-6.
        assert_ne!(1e-5f32 as f64, 1e-5);
        assert_eq!(g.get_f64("t.f32").unwrap(), Some(1e-5));
        assert_eq!(g.get_f64("t.i32").unwrap(), Some(-2e9));
        assert_eq!(g.get_str("t.str").unwrap(), Some("héllo\n{{ x }}"));
        assert_eq!(g.get_bool("t.bool").unwrap(), Some(true));
        let a = g.get_array("t.a_str").unwrap().unwrap();
        assert_eq!(a.as_strings().unwrap()[0], "Ġ t");
        assert_eq!(a.elem_type_name(), "string");
        assert_eq!(
            g.get_array("t.a_i16").unwrap().unwrap().to_i128s(),
            Some(vec![-7, 7])
        );
        assert_eq!(
            g.get("t.a_nested").unwrap().type_name(),
            "array[array[string]]"
        );
    }

    #[test]
    fn tensors_and_alignment() {
        for alignment in [32u64, 64, 1] {
            let mut w = sample();
            w.alignment = alignment;
            if alignment != 32 {
                w.kv("general.alignment", Value::U32(alignment as u32));
            }
            let bytes = w.to_bytes();
            let g = GgufFile::from_bytes(bytes).unwrap();
            assert_eq!(g.alignment, alignment);
            assert_eq!(g.data_start as u64 % alignment, 0);
            let m = g.tensor("m").unwrap();
            assert_eq!(m.dims, vec![2, 3]);
            assert_eq!(m.shape(), vec![3, 2]);
            assert_eq!((m.n_elements, m.n_bytes, m.offset), (6, 24, 0));
            let v = g.tensor("v").unwrap();
            assert_eq!(v.offset, 24u64.div_ceil(alignment) * alignment);
            assert_eq!(
                g.tensor_bytes(v).unwrap(),
                &f32_bytes(&[7., 8., 9., 10., 11.])[..]
            );
            let h = g.tensor("h").unwrap();
            assert_eq!(h.ggml_type, GgmlType::F16);
            assert_eq!(g.tensor_bytes(h).unwrap(), &[0x00, 0x3C, 0x00, 0xC0]);
            assert_eq!(g.tensors().len(), 3);
        }
    }

    fn err(bytes: Vec<u8>) -> String {
        format!("{:#}", GgufFile::from_bytes(bytes).unwrap_err())
    }

    #[test]
    fn every_truncation_is_an_error() {
        let full = sample().to_bytes();
        assert!(GgufFile::from_bytes(full.clone()).is_ok());
        for n in 0..full.len() {
            let e = err(full[..n].to_vec());
            assert!(
                e.contains("truncated") || e.contains("cannot fit") || e.contains("remain"),
                "prefix {n}: {e}"
            );
        }
    }

    #[test]
    fn header_errors() {
        let good = sample().to_bytes();
        let mut b = good.clone();
        b[0] = b'X';
        assert!(err(b).contains("not a GGUF file"));
        let mut b = good.clone();
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert!(err(b).contains("version 1"));
        let mut b = good.clone();
        b[4..8].copy_from_slice(&3u32.to_be_bytes());
        assert!(err(b).contains("big-endian"));
        let mut b = good.clone();
        b[4..8].copy_from_slice(&9u32.to_le_bytes());
        assert!(err(b).contains("unsupported GGUF version 9"));
        let mut b = good.clone();
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // metadata count
        assert!(err(b).contains("metadata entries at offset 24 cannot fit"));
        let mut b = good;
        b[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes()); // tensor count
        assert!(err(b).contains("tensor infos"));
        let w = Writer {
            version: 2,
            ..Writer::default()
        };
        assert_eq!(GgufFile::from_bytes(w.to_bytes()).unwrap().version, 2);
    }

    /// A file with one metadata entry whose payload bytes are given raw.
    fn one_kv(key: &str, ty: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend((key.len() as u64).to_le_bytes());
        b.extend(key.as_bytes());
        b.extend(ty.to_le_bytes());
        b.extend(payload);
        b
    }

    #[test]
    fn metadata_errors() {
        assert!(
            err(one_kv("k", 13, &[0; 8])).contains("unknown metadata value type 13 at offset 33")
        );
        assert!(err(one_kv("k", 7, &[2])).contains("invalid bool byte 2 at offset 37"));
        // A string claiming 2^40 bytes.
        let e = err(one_kv("k", 8, &(1u64 << 40).to_le_bytes()));
        assert!(e.contains("claims 1099511627776 bytes"), "{e}");
        // Invalid UTF-8.
        let mut p = 2u64.to_le_bytes().to_vec();
        p.extend([0xC3, 0x28]);
        assert!(err(one_kv("k", 8, &p)).contains("not valid UTF-8"));
        // An array of 2^61 uint64.
        let mut p = 10u32.to_le_bytes().to_vec();
        p.extend((1u64 << 61).to_le_bytes());
        assert!(err(one_kv("k", 9, &p)).contains("array elements"));
        // An unknown array element type.
        let mut p = 42u32.to_le_bytes().to_vec();
        p.extend(0u64.to_le_bytes());
        assert!(err(one_kv("k", 9, &p)).contains("unknown array element type 42"));
        // Arrays nested 20 deep.
        let mut p = Vec::new();
        for _ in 0..20 {
            p.extend(9u32.to_le_bytes());
            p.extend(1u64.to_le_bytes());
        }
        p.extend(0u32.to_le_bytes());
        p.extend(0u64.to_le_bytes());
        assert!(err(one_kv("k", 9, &p)).contains("nested deeper"));
        // Duplicate keys.
        let mut w = Writer::default();
        w.kv("a", Value::U8(1)).kv("a", Value::U8(2));
        assert!(err(w.to_bytes()).contains("duplicate metadata key `a`"));
        // Bad alignment.
        for a in [Value::U32(0), Value::U32(24), s("32")] {
            let mut w = Writer::default();
            w.kv("general.alignment", a);
            assert!(err(w.to_bytes()).contains("general.alignment"));
        }
    }

    #[test]
    fn tensor_errors() {
        let one = |dims: &[u64], ty: u32, data: Vec<u8>| {
            let mut w = Writer::default();
            w.tensor("t", dims, ty, data);
            w.to_bytes()
        };
        assert!(GgufFile::from_bytes(one(&[4], 0, vec![0; 16])).is_ok());
        assert!(err(one(&[], 0, vec![])).contains("0 dimensions"));
        assert!(err(one(&[1, 1, 1, 1, 1], 0, vec![0; 4])).contains("5 dimensions"));
        assert!(err(one(&[4], 4, vec![0; 16])).contains("unknown or removed ggml type id 4"));
        assert!(
            err(one(&[16], 8, vec![0; 34])).contains("not a multiple of the Q8_0 block size 32")
        );
        assert!(err(one(&[1 << 32, 1 << 32], 0, vec![])).contains("overflows"));
        // Data shorter than the tensor needs.
        let mut b = one(&[8], 0, vec![0; 32]);
        b.truncate(b.len() - 1);
        assert!(err(b).contains("ends past the end of the file"));
        // Misaligned offset: patch the stored offset (the last 8 bytes of the info table).
        let mut w = Writer::default();
        w.tensor("t", &[8], 0, vec![0; 32]);
        let mut b = w.to_bytes();
        let info_end = 24 + 8 + 1 + 4 + 8 + 4 + 8;
        b[info_end - 8..info_end].copy_from_slice(&4u64.to_le_bytes());
        assert!(err(b).contains("not a multiple of the alignment 32"));
        let mut w = Writer::default();
        w.tensor("t", &[1], 0, vec![0; 4])
            .tensor("t", &[1], 0, vec![0; 4]);
        assert!(err(w.to_bytes()).contains("duplicate tensor name `t`"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Corrupting any byte never panics: either a clean error or a (different) valid file.
        #[test]
        fn random_corruption_never_panics(pos in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
            let mut b = sample().to_bytes();
            let i = pos.index(b.len());
            b[i] = byte;
            let _ = GgufFile::from_bytes(b.clone());
            let n = cut.index(b.len());
            let _ = GgufFile::from_bytes(b[..n].to_vec());
        }
    }
}
