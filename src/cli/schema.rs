//! `rlcr schema`: print a table schema.
use anyhow::Result;

use super::common::{Global, UsageError};
use crate::table::schema;

pub const ABOUT: &str = "Print a table schema (trajectory, prompts, probe) as JSON";
pub const LONG_ABOUT: &str = "\
Print the machine-readable schema of a table kind: columns, types, nullability and which stage writes
them (the same JSON as the files in schemas/). Without a name, list the table kinds.

Example:
  rlcr schema trajectory";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Table kind: trajectory, prompts or probe.
    pub name: Option<String>,
}

pub fn run(_g: &Global, a: Args) -> Result<()> {
    let spec = match &a.name {
        None => None,
        Some(n) => Some(schema::by_name(n).ok_or_else(|| {
            UsageError(format!(
                "unknown table kind {n:?}; expected one of: trajectory, prompts, probe"
            ))
        })?),
    };
    schema::describe(spec, &mut std::io::stdout().lock())
}
