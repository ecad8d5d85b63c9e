//! Dataset files as Hugging Face `datasets` leaves them on disk (Parquet, JSON lines, JSON), with a
//! column mapping onto the prompts table, and the seeded draws of the loop over a dataset.
//!
//! Inputs. Each `--input` is a file, a folder (its `*.parquet`, `*.jsonl`, `*.ndjson` and `*.json`
//! files in name order) or a glob (`data/train-*.parquet`, `shards/**/*.jsonl`: `*`, `?` and
//! `[…]` within one path component, `**` for any number of folders). A glob matcher of our own
//! (about 80 lines) instead of the `glob` crate: the crate is small, but rlcr needs only these
//! four forms, and its own errors name the pattern that matched nothing.
//!
//! Formats, from the extension (`--from` forces one): `.parquet` (nested columns read as JSON
//! values: verl's `prompt` is `list<struct<role, content>>`, its `reward_model` a struct),
//! `.jsonl`/`.ndjson` (one object per line), `.json` (JSON lines, which is what `datasets`'
//! `to_json` writes; an array of records; or an object of equal-length column lists, what
//! `to_dict` gives). A Parquet file written by `rlcr prepare` itself (`rlcr.schema` =
//! `rlcr.prompts` in its metadata, or exactly a prompts table's columns: the same table filtered
//! by pandas, polars or pyarrow, which drop that metadata) is read back row for row, with no
//! mapping: the loop prepares a dataset once and draws its iterations from that table.
//!
//! Mapping, per row:
//! - the prompt: the column `--prompt-key` (default `prompt`, else `messages`), text (one user
//!   message) or a list of `{role, content}` messages; or `--input-template`, a text with
//!   `{column}` fields (`{{`/`}}` for braces; `\n`, `\t`, `\\` escapes);
//! - the label: `--label-key` (default: the first of `ground_truth`,
//!   `reward_model.ground_truth` (verl), `solution`, `answer`), any JSON value, kept as
//!   `ground_truth`; a dataset with none of them gets a null ground truth (reward functions that
//!   need no label);
//! - `data_source`: `--data-source` (a constant), `--data-source-key` (a column), else the column
//!   `data_source`, else the format's name;
//! - `extra_info`: the source's `extra_info` object when it has one (verl's `split`, `index`, …),
//!   plus every other column of the row except the prompt column, under its own name (the label
//!   too), so a reward function sees the row as it was;
//! - `prompt_id`: the column `id`, else verl's `{data_source}-{split}-{index}` from
//!   `extra_info`, else `{data_source}-{row}` (with the file's stem when there are several files).
//!
//! A key with a dot (`reward_model.ground_truth`) names a field inside a struct column unless a
//! column has that very name. A mapped column that no row has, a value of the wrong type and an
//! empty prompt are errors naming the file, the row (Parquet: 0-based row; JSON lines: 1-based
//! line; JSON array: 0-based record) and the column.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::PromptRow;
use crate::table::{self, Reader, PROMPTS};

/// A file format `prepare` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Parquet,
    /// One JSON object per line.
    Jsonl,
    /// JSON lines, an array of records, or an object of column lists.
    Json,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Jsonl => "jsonl",
            Format::Json => "json",
        }
    }

    /// The format of `path` from its extension, else from its first bytes.
    pub fn of(path: &Path) -> Result<Format> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        Ok(match ext.as_str() {
            "parquet" | "pq" => Format::Parquet,
            "jsonl" | "ndjson" => Format::Jsonl,
            "json" => Format::Json,
            _ if is_parquet(path) => Format::Parquet,
            _ => bail!(
                "{}: unknown format (the extension is not .parquet, .jsonl, .ndjson or .json); \
                 name it with --from parquet|jsonl|json",
                path.display()
            ),
        })
    }
}

/// Whether `path` starts with Parquet's magic bytes.
pub fn is_parquet(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == b"PAR1"
}

// ---------------------------------------------------------------------------------------------
// inputs: files, folders, globs

fn has_wildcard(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

fn is_dataset_file(p: &Path) -> bool {
    p.extension().is_some_and(|e| {
        matches!(
            e.to_string_lossy().to_ascii_lowercase().as_str(),
            "parquet" | "jsonl" | "ndjson" | "json"
        )
    })
}

/// The files of the inputs, in order (each pattern's matches sorted by name); a file named twice
/// is read once.
pub fn expand_inputs(patterns: &[String]) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in patterns {
        for f in expand(p)? {
            if !out.contains(&f) {
                out.push(f);
            }
        }
    }
    Ok(out)
}

/// The files one input names.
pub fn expand(pattern: &str) -> Result<Vec<PathBuf>> {
    if !has_wildcard(pattern) {
        let p = PathBuf::from(pattern);
        let md = std::fs::metadata(&p).with_context(|| format!("{pattern}: cannot open"))?;
        if !md.is_dir() {
            return Ok(vec![p]);
        }
        let mut v: Vec<PathBuf> = std::fs::read_dir(&p)
            .with_context(|| format!("{pattern}: cannot list folder"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| f.is_file() && is_dataset_file(f) && !hidden(f))
            .collect();
        v.sort();
        if v.is_empty() {
            bail!("{pattern}: the folder holds no .parquet, .jsonl, .ndjson or .json file");
        }
        return Ok(v);
    }
    let comps: Vec<&str> = pattern.split('/').collect();
    let first_wild = comps.iter().position(|c| has_wildcard(c)).unwrap_or(0);
    let base = comps[..first_wild].join("/");
    let base = match (base.as_str(), pattern.starts_with('/')) {
        ("", true) => PathBuf::from("/"),
        ("", false) => PathBuf::from("."),
        (b, _) => PathBuf::from(b),
    };
    let mut found = Vec::new();
    walk(&base, &comps[first_wild..], first_wild == 0, &mut found);
    found.sort();
    found.dedup();
    if found.is_empty() {
        bail!("{pattern}: no file matches");
    }
    Ok(found)
}

fn hidden(p: &Path) -> bool {
    p.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

/// Match `comps` below `dir`; `strip` drops a leading `./` the walk added.
fn walk(dir: &Path, comps: &[&str], strip: bool, out: &mut Vec<PathBuf>) {
    let clean = |p: PathBuf| -> PathBuf {
        if strip {
            p.strip_prefix(".").map(Path::to_path_buf).unwrap_or(p)
        } else {
            p
        }
    };
    let Some((c, rest)) = comps.split_first() else {
        if dir.is_file() {
            out.push(clean(dir.to_path_buf()));
        }
        return;
    };
    if *c == "**" {
        walk(dir, rest, strip, out);
        for e in entries(dir) {
            if e.is_dir() && !hidden(&e) {
                walk(&e, comps, strip, out);
            }
        }
    } else if has_wildcard(c) {
        for e in entries(dir) {
            let name = e
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if (c.starts_with('.') || !name.starts_with('.')) && wildcard_match(c, &name) {
                walk(&e, rest, strip, out);
            }
        }
    } else if !c.is_empty() {
        walk(&dir.join(c), rest, strip, out);
    } else {
        walk(dir, rest, strip, out);
    }
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Whether `name` matches the one-component pattern `pat` (`*`, `?`, `[abc]`, `[a-z]`, `[!x]`).
pub fn wildcard_match(pat: &str, name: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let s: Vec<char> = name.chars().collect();
    // Iterative matcher with one backtrack point (the last `*`).
    let (mut pi, mut si) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        let step = match p.get(pi) {
            Some('*') => {
                star = Some((pi, si));
                pi += 1;
                continue;
            }
            Some('?') => Some(pi + 1),
            Some('[') => class_match(&p, pi, s[si]),
            Some(&c) if c == s[si] => Some(pi + 1),
            _ => None,
        };
        match (step, star) {
            (Some(next), _) => {
                pi = next;
                si += 1;
            }
            (None, Some((sp, ss))) => {
                pi = sp + 1;
                si = ss + 1;
                star = Some((sp, ss + 1));
            }
            (None, None) => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The pattern index after the class at `p[start] == '['` when it matches `c`, else None. An
/// unclosed `[` matches itself.
fn class_match(p: &[char], start: usize, c: char) -> Option<usize> {
    let mut i = start + 1;
    let negate = matches!(p.get(i), Some('!') | Some('^'));
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    while i < p.len() && (first || p[i] != ']') {
        first = false;
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            hit |= p[i] <= c && c <= p[i + 2];
            i += 3;
        } else {
            hit |= p[i] == c;
            i += 1;
        }
    }
    if i >= p.len() {
        return (c == '[').then_some(start + 1);
    }
    (hit != negate).then_some(i + 1)
}

// ---------------------------------------------------------------------------------------------
// reading records

/// The rows of one file as JSON objects.
pub struct Records {
    pub path: PathBuf,
    pub format: Format,
    /// How rows are counted in messages: `row` (0-based), `line` (1-based), `record` (0-based).
    pub unit: &'static str,
    /// The word for a column in messages: `column` (Parquet) or `field` (JSON).
    pub col_word: &'static str,
    /// Column names: the schema's, or every key some row has, in first-seen order.
    pub columns: Vec<String>,
    /// (number shown in messages, the row).
    pub rows: Vec<(usize, Map<String, Value>)>,
    /// The file is an rlcr prompts table.
    pub rlcr_prompts: bool,
}

impl Records {
    fn loc(&self, n: usize) -> String {
        format!("{}, {} {n}", self.path.display(), self.unit)
    }

    /// Whether the column of `key` exists (a dotted key: its first part, unless a column has the
    /// whole name).
    pub fn has(&self, key: &str) -> bool {
        self.columns.iter().any(|c| c == key)
            || key
                .split_once('.')
                .is_some_and(|(head, _)| self.columns.iter().any(|c| c == head))
    }
}

/// Read the rows of `path` in `format`.
pub fn read_records(path: &Path, format: Format) -> Result<Records> {
    let (unit, col_word, rows, columns, rlcr_prompts) = match format {
        Format::Parquet => {
            let (rows, columns, prompts) = parquet_records(path)?;
            ("row", "column", rows, columns, prompts)
        }
        Format::Jsonl => {
            let rows = jsonl_records(path)?;
            let cols = keys_of(&rows);
            ("line", "field", rows, cols, false)
        }
        Format::Json => {
            let (unit, rows) = json_records(path)?;
            let cols = keys_of(&rows);
            (unit, "field", rows, cols, false)
        }
    };
    Ok(Records {
        path: path.to_path_buf(),
        format,
        unit,
        col_word,
        columns,
        rows,
        rlcr_prompts,
    })
}

fn keys_of(rows: &[(usize, Map<String, Value>)]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (_, r) in rows {
        for k in r.keys() {
            if seen.insert(k.as_str()) {
                out.push(k.clone());
            }
        }
    }
    out
}

type Rows = Vec<(usize, Map<String, Value>)>;

/// Whether `columns` are a prompts table's: `prompt_id`, `messages`, `data_source` and
/// `ground_truth`, and besides them only `extra_info` and pandas' index columns
/// (`__index_level_N__`). A prompts table filtered or rewritten by pandas, polars or pyarrow keeps
/// its columns but loses rlcr's file metadata; read through the column mapping instead, its
/// `prompt_id` would be replaced and its `ground_truth` (JSON text) encoded a second time, and a
/// verifier would judge every answer against a quoted string.
fn prompts_shaped(columns: &[String]) -> bool {
    let required = ["prompt_id", "messages", "data_source", "ground_truth"];
    let pandas_index = |c: &str| {
        c.strip_prefix("__index_level_")
            .and_then(|r| r.strip_suffix("__"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    required.iter().all(|r| columns.iter().any(|c| c == r))
        && columns
            .iter()
            .all(|c| required.contains(&c.as_str()) || c == "extra_info" || pandas_index(c))
}

fn parquet_records(path: &Path) -> Result<(Rows, Vec<String>, bool)> {
    let r = Reader::open(path)?.as_written();
    let columns = table::cols::names(&r.schema());
    let prompts = (r.metadata().get("rlcr.schema").map(String::as_str) == Some(PROMPTS.name)
        || prompts_shaped(&columns))
        && ["prompt_id", "messages", "data_source"]
            .iter()
            .all(|c| columns.iter().any(|x| x == c));
    let mut out = vec![];
    let mut row = 0usize;
    for b in r {
        let b = b?;
        for i in 0..b.num_rows() {
            let mut m = Map::new();
            for (f, c) in b.schema().fields().iter().zip(b.columns()) {
                let v = table::json::value(c.as_ref(), i).with_context(|| {
                    format!("{}, row {row}, column `{}`", path.display(), f.name())
                })?;
                m.insert(f.name().clone(), v);
            }
            out.push((row, m));
            row += 1;
        }
    }
    Ok((out, columns, prompts))
}

/// JSON lines: (1-based line number, object).
pub fn jsonl_records(path: &Path) -> Result<Rows> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot open (or not UTF-8 text)", path.display()))?;
    lines_of(path, &text)
}

fn lines_of(path: &Path, text: &str) -> Result<Rows> {
    let mut out = vec![];
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{}, line {}: not valid JSON", path.display(), i + 1))?;
        match v {
            Value::Object(m) => out.push((i + 1, m)),
            _ => bail!("{}, line {}: expected a JSON object", path.display(), i + 1),
        }
    }
    Ok(out)
}

/// A `.json` file: JSON lines, an array of records, or an object of equal-length column lists
/// (or of one list of records).
fn json_records(path: &Path) -> Result<(&'static str, Rows)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot open (or not UTF-8 text)", path.display()))?;
    let head = text.trim_start();
    if head.starts_with('{') {
        // JSON lines when every line is an object (what `datasets` writes), unless the file is
        // one object of column lists; else one document.
        if let Ok(rows) = lines_of(path, &text) {
            let columnar = rows.len() == 1 && columns_of(&rows[0].1).is_some();
            if !columnar {
                return Ok(("line", rows));
            }
        }
    }
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON (nor JSON lines)", path.display()))?;
    let records = |items: Vec<Value>| -> Result<Rows> {
        items
            .into_iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::Object(m) => Ok((i, m)),
                _ => bail!("{}, record {i}: expected a JSON object", path.display()),
            })
            .collect()
    };
    match v {
        Value::Array(items) => Ok(("record", records(items)?)),
        Value::Object(m) => {
            if let Some(rows) = columns_of(&m) {
                return Ok(("record", rows));
            }
            let lists: Vec<(&String, &Vec<Value>)> = m
                .iter()
                .filter_map(|(k, x)| x.as_array().map(|a| (k, a)))
                .collect();
            let of_records: Vec<&(&String, &Vec<Value>)> = lists
                .iter()
                .filter(|(_, a)| a.iter().all(Value::is_object))
                .collect();
            if let [(_, a)] = of_records.as_slice() {
                return Ok(("record", records((*a).clone())?));
            }
            bail!(
                "{}: a JSON object that is neither JSON lines, nor columns (lists of one length), \
                 nor one list of records",
                path.display()
            )
        }
        _ => bail!(
            "{}: expected JSON lines, an array of records or an object of columns",
            path.display()
        ),
    }
}

/// The rows of an object of equal-length column lists (`{"question": [...], "answer": [...]}`).
fn columns_of(m: &Map<String, Value>) -> Option<Rows> {
    let lists: Vec<(&String, &Vec<Value>)> = m
        .iter()
        .map(|(k, x)| x.as_array().map(|a| (k, a)))
        .collect::<Option<_>>()?;
    let n = lists.first()?.1.len();
    if n == 0 || lists.iter().any(|(_, a)| a.len() != n) {
        return None;
    }
    Some(
        (0..n)
            .map(|i| {
                let row: Map<String, Value> = lists
                    .iter()
                    .map(|(k, a)| ((*k).clone(), a[i].clone()))
                    .collect();
                (i, row)
            })
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------------
// mapping

/// One piece of an `--input-template`.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Text(String),
    Field(String),
}

/// A parsed `--input-template`.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub source: String,
    pub pieces: Vec<Piece>,
}

impl Template {
    /// Parse `{column}` fields, `{{`/`}}` braces and the `\n`, `\t`, `\\` escapes.
    pub fn parse(s: &str) -> std::result::Result<Template, String> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut it = s.chars().peekable();
        while let Some(c) = it.next() {
            match c {
                '\\' => match it.peek() {
                    Some('n') => {
                        it.next();
                        text.push('\n');
                    }
                    Some('t') => {
                        it.next();
                        text.push('\t');
                    }
                    Some('\\') => {
                        it.next();
                        text.push('\\');
                    }
                    _ => text.push('\\'),
                },
                '{' if it.peek() == Some(&'{') => {
                    it.next();
                    text.push('{');
                }
                '}' if it.peek() == Some(&'}') => {
                    it.next();
                    text.push('}');
                }
                '}' => return Err("a `}` without its `{` (write `}}` for a brace)".into()),
                '{' => {
                    let mut name = String::new();
                    loop {
                        match it.next() {
                            Some('}') => break,
                            Some('{') | None => {
                                return Err("a `{` without its `}` (write `{{` for a brace)".into())
                            }
                            Some(ch) => name.push(ch),
                        }
                    }
                    let name = name.trim().to_string();
                    if name.is_empty() {
                        return Err("an empty field `{}` (name a column)".into());
                    }
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(Piece::Field(name));
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        if !pieces.iter().any(|p| matches!(p, Piece::Field(_))) {
            return Err("the template names no column (`{column}`)".into());
        }
        Ok(Template {
            source: s.to_string(),
            pieces,
        })
    }

    fn fields(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Field(f) => Some(f.as_str()),
            Piece::Text(_) => None,
        })
    }
}

/// How source columns become a prompt row.
#[derive(Clone, Debug, Default)]
pub struct Mapping {
    /// The prompt column (text or messages); default `prompt`, else `messages`.
    pub prompt_key: Option<String>,
    /// A template over columns instead of a prompt column.
    pub template: Option<Template>,
    /// The label column; default: the first of [`LABEL_KEYS`] present.
    pub label_key: Option<String>,
    /// The data-source column.
    pub data_source_key: Option<String>,
    /// A constant data source.
    pub data_source: Option<String>,
}

/// The label columns tried, in order, when `--label-key` is not given.
pub const LABEL_KEYS: [&str; 4] = [
    "ground_truth",
    "reward_model.ground_truth",
    "solution",
    "answer",
];

/// The value at `key` in `row` (a dotted key: inside struct columns, unless a column has the
/// whole name); None when absent.
pub fn lookup<'v>(row: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    if let Some(v) = row.get(key) {
        return Some(v);
    }
    let (head, rest) = key.split_once('.')?;
    let mut v = row.get(head)?;
    for part in rest.split('.') {
        v = v.get(part)?;
    }
    Some(v)
}

/// The messages of a prompt cell: text → one user message; a list of `{role, content}` (other
/// keys dropped). `what` names the cell in errors.
pub fn messages_from(v: &Value, what: &dyn Fn() -> String) -> Result<Value> {
    match v {
        Value::String(s) => {
            if s.trim().is_empty() {
                bail!("{}: empty prompt", what());
            }
            Ok(json!([{"role": "user", "content": s}]))
        }
        Value::Array(items) => {
            if items.is_empty() {
                bail!("{}: empty message list", what());
            }
            for (k, m) in items.iter().enumerate() {
                let ok = m.get("role").is_some_and(Value::is_string)
                    && m.get("content").is_some_and(Value::is_string);
                if !ok {
                    bail!("{}: message {k} needs string `role` and `content`", what());
                }
            }
            if items
                .iter()
                .all(|m| m["content"].as_str().is_some_and(|c| c.trim().is_empty()))
            {
                bail!("{}: empty prompt (every message is empty)", what());
            }
            Ok(Value::Array(
                items
                    .iter()
                    .map(|m| json!({"role": m["role"], "content": m["content"]}))
                    .collect(),
            ))
        }
        Value::Null => bail!("{}: null where a prompt is required", what()),
        _ => bail!(
            "{}: expected text or a list of {{role, content}} messages, found {}",
            what(),
            kind(v)
        ),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// How the rows of one file were mapped (for the summary line).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolved {
    /// `prompt COLUMN` or `template`.
    pub prompt: String,
    /// The label column, if any.
    pub label: Option<String>,
}

/// Map the rows of `rec` onto prompt rows. `default_source` is the data source when neither the
/// mapping nor the file names one; `several` adds the file's stem to generated ids.
pub fn map_records(
    rec: &Records,
    m: &Mapping,
    default_source: &str,
    several: bool,
) -> Result<(Vec<PromptRow>, Resolved)> {
    if rec.rlcr_prompts {
        return Ok((
            prompts_rows(rec)?,
            Resolved {
                prompt: "messages".into(),
                label: Some("ground_truth".into()),
            },
        ));
    }
    let file = rec.path.display().to_string();
    let cols = || rec.columns.join(", ");
    let missing = |key: &str, flag: &str| -> anyhow::Error {
        anyhow::anyhow!(
            "{file}: {} `{key}` ({flag}) is missing; the file has: {}",
            rec.col_word,
            cols()
        )
    };
    // which columns
    let prompt_key: Option<String> = match (&m.template, &m.prompt_key) {
        (Some(t), _) => {
            for f in t.fields() {
                if !rec.has(f) {
                    return Err(missing(f, "--input-template"));
                }
            }
            None
        }
        (None, Some(k)) => {
            if !rec.has(k) {
                return Err(missing(k, "--prompt-key"));
            }
            Some(k.clone())
        }
        (None, None) => Some(
            ["prompt", "messages"]
                .into_iter()
                .find(|k| rec.has(k))
                .with_context(|| {
                    format!(
                        "{file}: no prompt {}: `prompt` (or `messages`) is missing; name one with \
                         --prompt-key or build the prompt with --input-template; the file has: {}",
                        rec.col_word,
                        cols()
                    )
                })?
                .to_string(),
        ),
    };
    let auto_prompt = m.template.is_none() && m.prompt_key.is_none();
    let label_key: Option<String> = match &m.label_key {
        Some(k) if !rec.has(k) => return Err(missing(k, "--label-key")),
        Some(k) => Some(k.clone()),
        None => LABEL_KEYS
            .iter()
            .find(|k| {
                rec.has(k)
                    && (!k.contains('.') || rec.rows.iter().any(|(_, r)| lookup(r, k).is_some()))
            })
            .map(|k| k.to_string()),
    };
    let ds_key: Option<String> = match (&m.data_source, &m.data_source_key) {
        (Some(_), _) => None,
        (None, Some(k)) if !rec.has(k) => return Err(missing(k, "--data-source-key")),
        (None, Some(k)) => Some(k.clone()),
        (None, None) => rec.has("data_source").then(|| "data_source".to_string()),
    };
    let stem = rec
        .path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();

    let mut out = Vec::with_capacity(rec.rows.len());
    for (n, row) in &rec.rows {
        let at = |key: &str| format!("{}, {} `{key}`", rec.loc(*n), rec.col_word);
        // prompt: without --prompt-key, a row without `prompt` may give `messages`
        let row_prompt_key: Option<String> = match &prompt_key {
            Some(k) if auto_prompt && row.get(k).is_none_or(Value::is_null) => {
                if row.get("messages").is_some_and(|v| !v.is_null()) {
                    Some("messages".to_string())
                } else {
                    Some(k.clone())
                }
            }
            other => other.clone(),
        };
        let messages = match (&m.template, &row_prompt_key) {
            (Some(t), _) => {
                let mut s = String::new();
                for p in &t.pieces {
                    match p {
                        Piece::Text(x) => s.push_str(x),
                        Piece::Field(f) => match lookup(row, f) {
                            None => bail!("{}: missing (--input-template)", at(f)),
                            Some(Value::Null) => {
                                bail!("{}: null (--input-template)", at(f))
                            }
                            Some(Value::String(x)) => s.push_str(x),
                            Some(v) => s.push_str(&v.to_string()),
                        },
                    }
                }
                if s.trim().is_empty() {
                    bail!(
                        "{}: empty prompt (--input-template gave only white space)",
                        rec.loc(*n)
                    );
                }
                json!([{"role": "user", "content": s}])
            }
            (None, Some(k)) => {
                let v = lookup(row, k).with_context(|| format!("{}: missing", at(k)))?;
                messages_from(v, &|| at(k))?
            }
            (None, None) => bail!("internal: no prompt mapping"),
        };
        let prompt_key = row_prompt_key.as_ref();
        // label
        let ground_truth = match &label_key {
            None => Value::Null,
            Some(k) => match lookup(row, k) {
                None => bail!("{}: missing", at(k)),
                Some(Value::Null) => bail!("{}: null where a label is required", at(k)),
                Some(v) => v.clone(),
            },
        };
        // data source
        let data_source = match (&m.data_source, &ds_key) {
            (Some(c), _) => c.clone(),
            (None, Some(k)) => match lookup(row, k) {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                // the column `data_source` found, not named: a row without one gets the default
                None | Some(Value::Null) if m.data_source_key.is_none() => {
                    default_source.to_string()
                }
                None => bail!("{}: missing", at(k)),
                Some(v) => bail!("{}: expected non-empty text, found {}", at(k), kind(v)),
            },
            (None, None) => default_source.to_string(),
        };
        // extra_info: the source's own object, then every other column under its name
        let mut extra = Map::new();
        match row.get("extra_info") {
            Some(Value::Object(o)) => extra = o.clone(),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(Value::Object(o)) => extra = o,
                _ => {
                    extra.insert("extra_info".into(), Value::String(s.clone()));
                }
            },
            Some(Value::Null) | None => {}
            Some(v) => {
                extra.insert("extra_info".into(), v.clone());
            }
        }
        for (k, v) in row {
            if Some(k) == prompt_key || k == "extra_info" {
                continue;
            }
            extra.entry(k.clone()).or_insert_with(|| v.clone());
        }
        // id
        let prompt_id = match row.get("id") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::Number(x)) => x.to_string(),
            _ => match verl_index(row) {
                Some((split, idx)) => format!("{data_source}-{split}{idx}"),
                None if several => format!("{data_source}-{stem}-{n:06}"),
                None => format!("{data_source}-{n:06}"),
            },
        };
        out.push(PromptRow {
            prompt_id,
            messages,
            data_source,
            ground_truth,
            extra_info: (!extra.is_empty()).then_some(Value::Object(extra)),
        });
    }
    let resolved = Resolved {
        prompt: match &prompt_key {
            Some(k) => format!("prompt `{k}`"),
            None => "prompt from --input-template".into(),
        },
        label: label_key,
    };
    Ok((out, resolved))
}

/// verl's row id: `extra_info.index` with `extra_info.split` (`("train-", "10")`).
fn verl_index(row: &Map<String, Value>) -> Option<(String, String)> {
    let e = row.get("extra_info")?;
    let idx = e.get("index").filter(|x| !x.is_null())?;
    let split = e
        .get("split")
        .and_then(Value::as_str)
        .map(|s| format!("{s}-"))
        .unwrap_or_default();
    let idx = idx
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| idx.to_string());
    Some((split, idx))
}

/// The rows of an rlcr prompts table, as they are.
fn prompts_rows(rec: &Records) -> Result<Vec<PromptRow>> {
    let mut out = Vec::with_capacity(rec.rows.len());
    for (n, row) in &rec.rows {
        let at = |key: &str| format!("{}, column `{key}`", rec.loc(*n));
        let text = |key: &str| -> Result<String> {
            match row.get(key) {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => bail!("{}: missing or not text", at(key)),
            }
        };
        // JSON text, or a native nested value
        let json_cell = |key: &str| -> Option<Value> {
            match row.get(key) {
                Some(Value::String(s)) => {
                    Some(serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())))
                }
                Some(Value::Null) | None => None,
                Some(v) => Some(v.clone()),
            }
        };
        let messages =
            json_cell("messages").with_context(|| format!("{}: missing", at("messages")))?;
        let messages = messages_from(&messages, &|| at("messages"))?;
        out.push(PromptRow {
            prompt_id: text("prompt_id")?,
            messages,
            data_source: text("data_source")?,
            ground_truth: json_cell("ground_truth").unwrap_or(Value::Null),
            extra_info: json_cell("extra_info"),
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// draws of the loop over a dataset

/// The row order of epoch `epoch`: a seeded Fisher-Yates shuffle (ChaCha8 seeded with `seed`, the
/// epoch as its stream), or the file order without a seed.
pub fn epoch_order(n: usize, seed: Option<u64>, epoch: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    if let Some(seed) = seed {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(epoch);
        for i in (1..n).rev() {
            let j = rng.random_range(0..=i as u64) as usize;
            v.swap(i, j);
        }
    }
    v
}

/// Which rows draw `k` (0-based) takes: the loop's iteration k+1 takes the next `per` rows of its
/// epoch's order, `ceil(n / per)` draws per epoch (the last of an epoch takes what is left, so
/// every row is drawn exactly once per epoch), a new order per epoch. Returns the rows, the epoch
/// and the draw's index within it.
pub fn draw(n: usize, per: usize, seed: Option<u64>, k: u64) -> (Vec<usize>, u64, u64) {
    if n == 0 || per == 0 {
        return (vec![], 0, 0);
    }
    let per_epoch = n.div_ceil(per) as u64;
    let (epoch, b) = (k / per_epoch, k % per_epoch);
    let order = epoch_order(n, seed, epoch);
    let start = b as usize * per;
    let end = (start + per).min(n);
    (order[start..end].to_vec(), epoch, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        for (p, s, want) in [
            ("*.parquet", "train-0.parquet", true),
            ("*.parquet", "train.jsonl", false),
            (
                "train-?????-of-*.parquet",
                "train-00000-of-00002.parquet",
                true,
            ),
            ("train-[0-9]*", "train-3x", true),
            ("train-[!0-9]*", "train-3x", false),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("*", "", true),
            ("[ab]", "b", true),
            ("x[", "x[", true),
        ] {
            assert_eq!(wildcard_match(p, s), want, "{p} vs {s}");
        }
    }

    #[test]
    fn globs_walk_folders() {
        let d = tempfile::tempdir().unwrap();
        for f in [
            "data/train-1.parquet",
            "data/train-0.parquet",
            "data/test-0.parquet",
            "data/sub/train-2.parquet",
        ] {
            let p = d.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x").unwrap();
        }
        let root = d.path().display().to_string();
        let names = |pat: &str| -> Vec<String> {
            expand(&format!("{root}/{pat}"))
                .unwrap()
                .iter()
                .map(|p| p.strip_prefix(d.path()).unwrap().display().to_string())
                .collect()
        };
        assert_eq!(
            names("data/train-*.parquet"),
            ["data/train-0.parquet", "data/train-1.parquet"]
        );
        assert_eq!(
            names("**/train-*.parquet"),
            [
                "data/sub/train-2.parquet",
                "data/train-0.parquet",
                "data/train-1.parquet"
            ]
        );
        let e = expand(&format!("{root}/data/valid-*.parquet")).unwrap_err();
        assert!(format!("{e:#}").contains("no file matches"), "{e:#}");
        assert_eq!(expand(&format!("{root}/data")).unwrap().len(), 3);
    }

    #[test]
    fn templates() {
        let t = Template::parse(r"{question}\n\nAnswer in <answer></answer>. {{x}}").unwrap();
        assert_eq!(
            t.pieces,
            vec![
                Piece::Field("question".into()),
                Piece::Text("\n\nAnswer in <answer></answer>. {x}".into())
            ]
        );
        assert!(Template::parse("no fields").is_err());
        assert!(Template::parse("{open").is_err());
        assert!(Template::parse("close}").is_err());
        assert!(Template::parse("{}").is_err());
    }

    #[test]
    fn draws_cover_each_epoch_once_and_reshuffle() {
        let (n, per) = (10, 4);
        let mut epochs: Vec<Vec<usize>> = vec![];
        for k in 0..6u64 {
            let (rows, e, b) = draw(n, per, Some(7), k);
            assert_eq!(e, k / 3);
            assert_eq!(b, k % 3);
            assert_eq!(rows.len(), if b == 2 { 2 } else { 4 });
            if b == 0 {
                epochs.push(vec![]);
            }
            epochs.last_mut().unwrap().extend(rows);
        }
        for e in &epochs {
            let mut s = e.clone();
            s.sort();
            assert_eq!(s, (0..n).collect::<Vec<_>>());
        }
        assert_ne!(epochs[0], epochs[1], "epochs share an order");
        assert_eq!(draw(n, per, Some(7), 4), draw(n, per, Some(7), 4));
        assert_ne!(draw(n, per, Some(8), 0).0, draw(n, per, Some(7), 0).0);
        assert_eq!(draw(n, per, None, 1).0, vec![4, 5, 6, 7]);
    }
}
