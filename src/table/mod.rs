//! Tables: schemas, Parquet I/O, metadata, validation (atomic writes go through [`crate::fs`]).
//!
//! - [`schema`]: the column lists of the trajectory, prompts and probe tables (the contract).
//! - [`io`]: streaming [`Reader`] (file or folder of parts; LargeList/LargeUtf8 normalised) and
//!   atomic [`Writer`] (zstd, rlcr key-value metadata, refuses to overwrite an input).
//! - [`coerce`]: the widths other writers choose (`int64`, `double`, `list<int64>`, spans of
//!   `int64`) read in the schema's types where the values fit.
//! - [`cols`]: the column layer: typed column getters, the one text-column view [`StrCol`]
//!   (plain, large, views, dictionaries), and builders.
//! - [`json`]: Arrow values as JSON (the one converter).
//! - [`inspect`]: the per-column summary of a table (`rlcr inspect`), streamed once.
//! - [`intern`]: dense ids for strings (the one [`intern::Interner`]) and the fast hasher.
//! - [`validate`]: schema and row checks with file/row/column in every message: the one
//!   [`Validator`] every stage runs over its input.
//! - [`nested`]: the nested `messages` and `extra_info` columns, written natively, read in
//!   either form.
//! - [`levels`]: per-row lengths of list columns from their Parquet levels (no values decoded).
//! - [`splice`]: the row-preserving writer: an input's column chunks copied as they are, only new
//!   columns encoded.
pub mod coerce;
pub mod cols;
pub mod inspect;
pub mod intern;
pub mod io;
pub mod json;
pub mod levels;
pub mod nested;
pub mod schema;
pub mod shard;
pub mod splice;
pub mod validate;

pub use cols::StrCol;
pub use io::{write_table, Meta, Reader, Writer};
pub use schema::{ColType, ColumnSpec, SampleType, TableSpec, PROBE, PROMPTS, TRAJECTORY};
pub use shard::Shard;
pub use validate::{check_schema, Validator};

/// The full trajectory schema.
pub fn trajectory_schema() -> arrow::datatypes::SchemaRef {
    TRAJECTORY.arrow_schema()
}
