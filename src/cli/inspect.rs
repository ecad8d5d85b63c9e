//! `rlcr inspect`: describe a Parquet table.
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str = "Describe a table: schema, rlcr metadata, row count, per-column summaries";
pub const LONG_ABOUT: &str = "\
Print the schema, the rlcr metadata (stage, config, inputs, version), the row count and per-column
summaries; for trajectory tables also rows by sample_type, mean reward and lengths.

Example:
  rlcr inspect scored.parquet";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Parquet file.
    pub file: PathBuf,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("inspect"))
}
