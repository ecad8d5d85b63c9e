//! `rlcr schema`: print a table schema.
use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str = "Print a table schema (trajectory, prompts, probe) as JSON";
pub const LONG_ABOUT: &str = "\
Print the machine-readable schema of a table kind: columns, types, nullability and which stage writes
them. Without a name, list the table kinds.

Example:
  rlcr schema trajectory";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Table kind: trajectory, prompts or probe.
    pub name: Option<String>,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("schema"))
}
