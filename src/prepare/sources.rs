//! Dataset readers of `prepare`: TinyZero's countdown files (Parquet or JSONL with `target`,
//! `nums`), verl dataset Parquet and JSONL prompts. Errors name the file, the row (or line) and the
//! column.
use std::io::BufRead;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

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

fn is_parquet(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == b"PAR1"
}

/// Rows of a Parquet file as JSON objects (row number, object).
fn parquet_rows(path: &Path) -> Result<Vec<(usize, Value)>> {
    let r = Reader::open(path)?;
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
    let parquet = is_parquet(path);
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

fn messages_from(v: &Value, loc: &dyn Fn() -> String, key: &str) -> Result<Value> {
    match v {
        Value::String(s) => Ok(json!([{"role": "user", "content": s}])),
        Value::Array(items) => {
            for (k, m) in items.iter().enumerate() {
                let ok = m.get("role").is_some_and(Value::is_string)
                    && m.get("content").is_some_and(Value::is_string);
                if !ok {
                    bail!(
                        "{}, column `{key}`: message {k} needs string `role` and `content`",
                        loc()
                    );
                }
            }
            if items.is_empty() {
                bail!("{}, column `{key}`: empty message list", loc());
            }
            Ok(Value::Array(
                items
                    .iter()
                    .map(|m| json!({"role": m["role"], "content": m["content"]}))
                    .collect(),
            ))
        }
        _ => bail!(
            "{}, column `{key}`: expected text or a list of messages",
            loc()
        ),
    }
}

pub fn read_verl(path: &Path) -> Result<Vec<PromptRow>> {
    if !is_parquet(path) {
        // Reader::open gives the precise message (empty, not Parquet, ...).
        Reader::open(path)?;
    }
    let mut out = vec![];
    for (n, v) in parquet_rows(path)? {
        let loc = || format!("{}, row {n}", path.display());
        let prompt = v
            .get("prompt")
            .with_context(|| format!("{}: column `prompt` is missing", path.display()))?;
        let messages = messages_from(prompt, &loc, "prompt")?;
        let data_source = v
            .get("data_source")
            .and_then(Value::as_str)
            .unwrap_or("verl")
            .to_string();
        let gt = v
            .get("reward_model")
            .and_then(|r| r.get("ground_truth"))
            .cloned()
            .with_context(|| format!("{}, column `reward_model.ground_truth`: missing", loc()))?;
        let extra = v.get("extra_info").cloned().filter(|x| !x.is_null());
        let id = match extra.as_ref().and_then(|e| e.get("index")) {
            Some(idx) if !idx.is_null() => {
                let split = extra
                    .as_ref()
                    .and_then(|e| e.get("split"))
                    .and_then(Value::as_str)
                    .map(|s| format!("{s}-"))
                    .unwrap_or_default();
                let idx = idx
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| idx.to_string());
                format!("{data_source}-{split}{idx}")
            }
            _ => format!("{data_source}-{n:06}"),
        };
        out.push(PromptRow {
            prompt_id: id,
            messages,
            data_source,
            ground_truth: gt,
            extra_info: extra,
        });
    }
    Ok(out)
}

pub fn read_jsonl(path: &Path) -> Result<Vec<PromptRow>> {
    let mut out = vec![];
    for (n, v) in read_jsonl_values(path)? {
        let loc = || format!("{}, line {n}", path.display());
        let messages = if let Some(m) = v.get("messages") {
            messages_from(m, &loc, "messages")?
        } else if let Some(p) = v.get("prompt") {
            messages_from(p, &loc, "prompt")?
        } else {
            bail!("{}: needs `prompt` or `messages`", loc());
        };
        let gt = v
            .get("ground_truth")
            .cloned()
            .with_context(|| format!("{}, field `ground_truth`: missing", loc()))?;
        let data_source = match v.get("data_source") {
            None | Some(Value::Null) => "jsonl".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => bail!("{}, field `data_source`: expected text", loc()),
        };
        let id = match v.get("id") {
            None | Some(Value::Null) => format!("{data_source}-{n:06}"),
            Some(Value::String(s)) => s.clone(),
            Some(x) => x.to_string(),
        };
        let mut extra = v.clone();
        if let Some(m) = extra.as_object_mut() {
            for k in ["messages", "prompt", "ground_truth", "data_source", "id"] {
                m.remove(k);
            }
        }
        let extra = extra
            .as_object()
            .filter(|m| !m.is_empty())
            .map(|_| extra.clone());
        out.push(PromptRow {
            prompt_id: id,
            messages,
            data_source,
            ground_truth: gt,
            extra_info: extra,
        });
    }
    Ok(out)
}
