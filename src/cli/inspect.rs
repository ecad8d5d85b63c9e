//! `rlcr inspect`: describe a Parquet table.
//!
//! The description is [`crate::table::inspect::describe`]'s.
use std::path::PathBuf;

use anyhow::Result;

use super::common::Global;

pub const ABOUT: &str = "Describe a table: schema, rlcr metadata, row count, per-column summaries";
pub const LONG_ABOUT: &str = "\
Print the schema, the rlcr metadata (stage, config, inputs, version), the row count and per-column
summaries; for trajectory tables also rows, mean reward and mean response length by sample_type.
Reads one file (or a folder of part files); writes nothing.

Example:
  rlcr inspect scored.parquet";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Parquet file (or folder of part files).
    pub file: PathBuf,
}

pub fn run(_g: &Global, a: Args) -> Result<()> {
    crate::table::inspect::describe(&a.file, &mut std::io::stdout().lock())
}
