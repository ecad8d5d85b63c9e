//! The reader of TinyZero's countdown files (Parquet or JSONL with `target`, `nums`); other
//! datasets go through [`super::dataset`]. Errors name the file, the row (or line) and the column.
use std::io::BufRead;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::synth::countdown_row;
use super::PromptRow;
use crate::table::{self, Reader};

fn read_jsonl_values(path: &Path) -> Result<Vec<(usize, Value)>> {
    let f =
        std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut out = vec![];
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line =
            line.with_context(|| format!("{}, line {}: cannot read", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line)
            .with_context(|| format!("{}, line {}: not valid JSON", path.display(), i + 1))?;
        if !v.is_object() {
            bail!("{}, line {}: expected a JSON object", path.display(), i + 1);
        }
        out.push((i + 1, v));
    }
    Ok(out)
}

/// Rows of a Parquet file as JSON objects (row number, object).
fn parquet_rows(path: &Path) -> Result<Vec<(usize, Value)>> {
    let r = Reader::open(path)?.as_written();
    let mut out = vec![];
    let mut row = 0usize;
    for b in r {
        let b = b?;
        for i in 0..b.num_rows() {
            let mut m = serde_json::Map::new();
            for (f, c) in b.schema().fields().iter().zip(b.columns()) {
                let v = table::json::value(c.as_ref(), i).with_context(|| {
                    format!("{}, row {row}, column `{}`", path.display(), f.name())
                })?;
                m.insert(f.name().clone(), v);
            }
            out.push((row, Value::Object(m)));
            row += 1;
        }
    }
    Ok(out)
}

pub fn read_countdown(path: &Path) -> Result<Vec<PromptRow>> {
    let parquet = super::dataset::is_parquet(path);
    let rows = if parquet {
        parquet_rows(path)?
    } else {
        read_jsonl_values(path)?
    };
    let what = if parquet { "row" } else { "line" };
    let mut out = vec![];
    for (n, v) in rows {
        let loc = || format!("{}, {what} {n}", path.display());
        let target = v
            .get("target")
            .and_then(Value::as_i64)
            .with_context(|| format!("{}, column `target`: missing or not an integer", loc()))?;
        let nums: Vec<i64> = v
            .get("nums")
            .and_then(Value::as_array)
            .with_context(|| format!("{}, column `nums`: missing or not a list", loc()))?
            .iter()
            .map(|x| x.as_i64())
            .collect::<Option<Vec<_>>>()
            .with_context(|| format!("{}, column `nums`: not a list of integers", loc()))?;
        if nums.is_empty() {
            bail!("{}, column `nums`: empty list", loc());
        }
        let id = match v.get("id") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(x)) => format!("countdown-{x}"),
            _ => format!("countdown-{n:06}"),
        };
        out.push(countdown_row(id, nums, target, None));
    }
    Ok(out)
}
