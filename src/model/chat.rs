//! Hugging Face chat templates rendered with minijinja, the way transformers renders them.
//!
//! transformers renders `chat_template` with a sandboxed Jinja2 environment configured with
//! `trim_blocks=True, lstrip_blocks=True` and the loop-controls extension, the variables
//! `messages`, `add_generation_prompt`, the special tokens (`bos_token`, `eos_token`, …), and the
//! globals `raise_exception` and `strftime_now`, plus its own `tojson` filter (Python's
//! `json.dumps(ensure_ascii=False)`). This module reproduces that environment:
//! - minijinja with trim/lstrip blocks and `minijinja-contrib`'s Python string/dict methods
//!   (`.strip()`, `.startswith()`, `.items()`, …);
//! - `raise_exception(msg)` fails the render with the template's message;
//! - `strftime_now(fmt)` formats a **fixed** instant, [`FIXED_NOW`] (2025-01-01 00:00:00, a
//!   Wednesday), so a rendering is reproducible; templates that print today's date (Llama 3.1)
//!   therefore differ from transformers' output on any other day, by design;
//! - `tojson` writes Python-style JSON (`", "` and `": "` separators, non-ASCII kept, `indent=`);
//! - transformers' `{% generation %}` marker tags are removed before parsing (they only mark
//!   assistant spans for masks in transformers and render nothing).
//!
//! The source is `chat_template.jinja` when the folder has one (transformers ≥ 4.43 prefers it),
//! else `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates of
//! which `default` is used). [`ChatOptions`] replaces it with a file (`--chat-template FILE`) and
//! passes extra variables to it (`--chat-template-kwargs enable_thinking=false`), as
//! `apply_chat_template(..., **kwargs)` does: Qwen3's template reads `enable_thinking`.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// The instant `strftime_now` formats: (year, month, day, hour, minute, second, weekday 0=Mon).
pub const FIXED_NOW: (i32, u32, u32, u32, u32, u32, u32) = (2025, 1, 1, 0, 0, 0, 2);

/// A chat template with the special-token strings it may reference and the extra variables it
/// is rendered with.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    unk_token: Option<String>,
    kwargs: BTreeMap<String, serde_json::Value>,
}

/// How a stage renders its prompts: the model folder's template unless `template` names a file,
/// rendered with the extra variables `kwargs` (transformers' `apply_chat_template(**kwargs)`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatOptions {
    /// A Jinja file replacing the folder's template (the folder's special tokens are kept).
    pub template: Option<PathBuf>,
    /// Extra template variables, e.g. `enable_thinking = false`.
    pub kwargs: BTreeMap<String, serde_json::Value>,
}

/// Variables the renderer sets itself; a kwarg may not replace them.
const RESERVED: &[&str] = &[
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
];

impl ChatOptions {
    /// Parse `--chat-template-kwargs` values: each is a JSON object (`{"enable_thinking":
    /// false}`) or a comma-separated list of `key=value` pairs whose values are JSON
    /// (`enable_thinking=false,max_depth=2,tags=["a","b"]`); a value that is not valid JSON is
    /// taken as a string (`mode=fast`). Later keys win.
    pub fn parse_kwargs(items: &[String]) -> Result<BTreeMap<String, serde_json::Value>> {
        let mut out = BTreeMap::new();
        for item in items {
            let text = item.trim();
            if text.starts_with('{') {
                let v: serde_json::Value = serde_json::from_str(text)
                    .with_context(|| format!("chat template kwargs `{text}`: invalid JSON"))?;
                let obj = v.as_object().with_context(|| {
                    format!("chat template kwargs `{text}`: expected a JSON object")
                })?;
                out.extend(obj.iter().map(|(k, v)| (k.clone(), v.clone())));
                continue;
            }
            for pair in split_top_level(text) {
                let pair = pair.trim();
                if pair.is_empty() {
                    continue;
                }
                let (k, v) = pair
                    .split_once('=')
                    .with_context(|| format!("chat template kwargs: `{pair}` is not key=value"))?;
                let k = k.trim();
                if k.is_empty() || !k.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    bail!("chat template kwargs: `{k}` is not a variable name");
                }
                let v = v.trim();
                let value = serde_json::from_str(v)
                    .unwrap_or_else(|_| serde_json::Value::String(v.to_string()));
                out.insert(k.to_string(), value);
            }
        }
        if let Some(k) = out.keys().find(|k| RESERVED.contains(&k.as_str())) {
            bail!("chat template kwargs: `{k}` is set by rlcr itself and cannot be passed");
        }
        Ok(out)
    }

    /// The template of the model folder `dir` with these options applied; `Ok(None)` when
    /// neither the folder nor the options give a template.
    pub fn template_for(&self, dir: &Path) -> Result<Option<ChatTemplate>> {
        let t = match &self.template {
            Some(file) => {
                let source = std::fs::read_to_string(file)
                    .with_context(|| format!("reading the chat template {}", file.display()))?;
                let t = ChatTemplate::with_specials(&source, &tokenizer_config(dir)?);
                // A syntax error is reported now, naming the file, not at the first prompt.
                environment()
                    .template_from_str(&t.source)
                    .map_err(|e| anyhow!("{e:#}"))
                    .with_context(|| format!("parsing the chat template {}", file.display()))?;
                Some(t)
            }
            None => ChatTemplate::load(dir)?,
        };
        Ok(t.map(|t| t.with_kwargs(self.kwargs.clone())))
    }

    /// The options as recorded in an output's metadata (`null` fields when unset).
    pub fn meta(&self) -> serde_json::Value {
        serde_json::json!({
            "chat_template": self.template.as_ref().map(|p| p.display().to_string()),
            "chat_template_kwargs": self.kwargs,
        })
    }
}

/// Split `a=1,b=[1,2],c="x,y"` at the commas outside brackets, braces and double quotes.
fn split_top_level(text: &str) -> Vec<&str> {
    let (mut out, mut depth, mut quoted, mut escaped, mut start) =
        (Vec::new(), 0i32, false, false, 0);
    for (i, c) in text.char_indices() {
        if quoted {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '[' | '{' => depth += 1,
            ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

/// `DIR/tokenizer_config.json` as JSON (`null` when the folder has none).
fn tokenizer_config(dir: &Path) -> Result<serde_json::Value> {
    let tc_path = dir.join("tokenizer_config.json");
    if !tc_path.exists() {
        return Ok(serde_json::Value::Null);
    }
    let text = std::fs::read_to_string(&tc_path)
        .with_context(|| format!("reading {}", tc_path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", tc_path.display()))
}

fn special_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl ChatTemplate {
    /// A template from its source and special tokens.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Self {
        ChatTemplate {
            source: strip_generation_tags(source),
            bos_token,
            eos_token,
            pad_token: None,
            unk_token: None,
            kwargs: BTreeMap::new(),
        }
    }

    /// The same template rendered with the extra variables `kwargs` (see [`ChatOptions`]).
    pub fn with_kwargs(mut self, kwargs: BTreeMap<String, serde_json::Value>) -> Self {
        self.kwargs = kwargs;
        self
    }

    /// The extra variables the template is rendered with.
    pub fn kwargs(&self) -> &BTreeMap<String, serde_json::Value> {
        &self.kwargs
    }

    /// Load the template of a model folder; `Ok(None)` when it has none.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let tc_path = dir.join("tokenizer_config.json");
        let tc = tokenizer_config(dir)?;
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.exists() {
            Some(
                std::fs::read_to_string(&jinja)
                    .with_context(|| format!("reading {}", jinja.display()))?,
            )
        } else {
            match tc.get("chat_template") {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Array(list)) => {
                    let pick = list
                        .iter()
                        .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                        .or_else(|| list.first());
                    match pick
                        .and_then(|t| t.get("template"))
                        .and_then(|t| t.as_str())
                    {
                        Some(s) => Some(s.to_string()),
                        None => bail!(
                            "{}: chat_template list has no `default` template",
                            tc_path.display()
                        ),
                    }
                }
                _ => None,
            }
        };
        let Some(source) = source else {
            return Ok(None);
        };
        Ok(Some(Self::with_specials(&source, &tc)))
    }

    /// A template from its source, with the special tokens (bos, eos, pad, unk) a
    /// `tokenizer_config.json` object `tc` names.
    fn with_specials(source: &str, tc: &serde_json::Value) -> Self {
        let mut t = ChatTemplate::new(
            source,
            special_text(tc.get("bos_token")),
            special_text(tc.get("eos_token")),
        );
        t.pad_token = special_text(tc.get("pad_token"));
        t.unk_token = special_text(tc.get("unk_token"));
        t
    }

    /// The template source (after removing `{% generation %}` tags).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render a conversation (any JSON-serialisable list of messages).
    pub fn render_json<M: Serialize>(
        &self,
        messages: &M,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let env = environment();
        let tmpl = env
            .template_from_str(&self.source)
            .map_err(|e| anyhow!("{e:#}"))
            .context("parsing the chat template")?;
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone(),
            eos_token => self.eos_token.clone(),
            pad_token => self.pad_token.clone(),
            unk_token => self.unk_token.clone(),
            ..Value::from_serialize(&self.kwargs),
        };
        tmpl.render(ctx)
            .map_err(|e| anyhow!("{e:#}"))
            .context("rendering the chat template")
    }

    /// Render a conversation of [`Message`]s.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_json(&messages, add_generation_prompt)
    }
}

/// Remove transformers' `{% generation %}` / `{% endgeneration %}` marker tags (with any
/// whitespace-control dashes).
fn strip_generation_tags(source: &str) -> String {
    let pattern = r"\{%-?\s*(end)?generation\s*-?%\}";
    let re = regex::Regex::new(pattern).expect("valid regex"); // ok: a constant, valid pattern
    re.replace_all(source, "").into_owned()
}

/// The Jinja environment transformers uses, rebuilt in minijinja.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| -> Result<String, Error> {
        Ok(strftime_fixed(&fmt))
    });
    env.add_filter("tojson", tojson);
    env
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `strftime` at [`FIXED_NOW`] for the common specifiers (`%Y %y %m %d %e %B %b %A %a %H %I %M
/// %S %p %j %%`); unknown specifiers are copied through.
pub fn strftime_fixed(fmt: &str) -> String {
    let (y, mo, d, h, mi, s, wd) = FIXED_NOW;
    let day_of_year = {
        let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        cum[(mo - 1) as usize] + d + u32::from(leap && mo > 2)
    };
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out += &format!("{y}"),
            Some('y') => out += &format!("{:02}", y % 100),
            Some('m') => out += &format!("{mo:02}"),
            Some('d') => out += &format!("{d:02}"),
            Some('e') => out += &format!("{d:>2}"),
            Some('B') => out += MONTHS[(mo - 1) as usize],
            Some('b') | Some('h') => out += &MONTHS[(mo - 1) as usize][..3],
            Some('A') => out += DAYS[wd as usize],
            Some('a') => out += &DAYS[wd as usize][..3],
            Some('H') => out += &format!("{h:02}"),
            Some('I') => out += &format!("{:02}", if h % 12 == 0 { 12 } else { h % 12 }),
            Some('M') => out += &format!("{mi:02}"),
            Some('S') => out += &format!("{s:02}"),
            Some('p') => out += if h < 12 { "AM" } else { "PM" },
            Some('j') => out += &format!("{day_of_year:03}"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// transformers' `tojson`: `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<Value> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    py_json(&value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn json_string(s: &str, out: &mut String) {
    // serde_json escapes exactly `"`, `\` and control characters, like json.dumps with
    // ensure_ascii=False (control characters as \uXXXX or short escapes alike).
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\"")));
}

fn newline(indent: Option<usize>, level: usize, out: &mut String) {
    if let Some(n) = indent {
        out.push('\n');
        out.push_str(&" ".repeat(n * level));
    }
}

/// A JSON object or array of `items` between `brackets`, as Python's `json.dumps` lays it out
/// (`{}` / `[]` when empty; with `indent`, one item a line); `item` writes one item.
fn py_json_items(
    items: &[Value],
    brackets: (char, char),
    indent: Option<usize>,
    level: usize,
    out: &mut String,
    mut item: impl FnMut(&Value, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    if items.is_empty() {
        out.push(brackets.0);
        out.push(brackets.1);
        return Ok(());
    }
    let item_sep = if indent.is_some() { "," } else { ", " };
    out.push(brackets.0);
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(item_sep);
        }
        newline(indent, level + 1, out);
        item(x, out)?;
    }
    newline(indent, level, out);
    out.push(brackets.1);
    Ok(())
}

fn py_json(v: &Value, indent: Option<usize>, level: usize, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Ok(i) = i64::try_from(v.clone()) {
                out.push_str(&i.to_string());
            } else if let Ok(f) = f64::try_from(v.clone()) {
                if f.is_finite() {
                    out.push_str(&serde_json::to_string(&f).unwrap_or_else(|_| f.to_string()));
                } else if f.is_nan() {
                    out.push_str("NaN");
                } else {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                }
            } else {
                out.push_str(&v.to_string());
            }
        }
        ValueKind::String => json_string(v.as_str().unwrap_or_default(), out),
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            py_json_items(&keys, ('{', '}'), indent, level, out, |k, out| {
                match k.as_str() {
                    Some(s) => json_string(s, out),
                    None => json_string(&k.to_string(), out),
                }
                out.push_str(": ");
                py_json(&v.get_item(k)?, indent, level + 1, out)
            })?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            py_json_items(&items, ('[', ']'), indent, level, out, |x, out| {
                py_json(x, indent, level + 1, out)
            })?;
        }
        _ => json_string(&v.to_string(), out),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_blocks_and_generation_prompt() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n  {% if m.role %}{{ m.role }}: {{ m.content.strip() }}\n  \
             {% endif %}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}",
            None,
            None,
        );
        let out = t.render(&[Message::new("user", "  hi ")], true).unwrap();
        assert_eq!(out, "user: hi\nassistant:");
    }

    #[test]
    fn raise_exception_fails_with_the_message() {
        let t = ChatTemplate::new("{{ raise_exception('only user/assistant') }}", None, None);
        let e = t.render(&[], false).unwrap_err();
        assert!(format!("{e:#}").contains("only user/assistant"));
    }

    #[test]
    fn fixed_strftime_and_python_tojson() {
        assert_eq!(strftime_fixed("%d %b %Y"), "01 Jan 2025");
        assert_eq!(strftime_fixed("%A %B %j %%"), "Wednesday January 001 %");
        let t = ChatTemplate::new(
            "{{ messages | tojson }}|{{ messages[0] | tojson(indent=2) }}",
            None,
            None,
        );
        let out = t.render(&[Message::new("user", "é \"q\"")], false).unwrap();
        assert_eq!(
            out,
            "[{\"role\": \"user\", \"content\": \"é \\\"q\\\"\"}]|{\n  \"role\": \"user\",\n  \
             \"content\": \"é \\\"q\\\"\"\n}"
        );
    }

    #[test]
    fn generation_tags_are_removed() {
        let t = ChatTemplate::new("a{% generation %}b{%- endgeneration -%}c", None, None);
        assert_eq!(t.render(&[], false).unwrap(), "abc");
    }

    #[test]
    fn kwargs_parse_as_json_values_and_reach_the_template() {
        let items = vec![
            "enable_thinking=false, depth=2,tags=[\"a\",\"b,c\"]".to_string(),
            "mode=fast".to_string(),
            r#"{"note": "x=y", "depth": 3}"#.to_string(),
        ];
        let kw = ChatOptions::parse_kwargs(&items).unwrap();
        assert_eq!(kw["enable_thinking"], serde_json::json!(false));
        assert_eq!(kw["depth"], serde_json::json!(3));
        assert_eq!(kw["tags"], serde_json::json!(["a", "b,c"]));
        assert_eq!(kw["mode"], serde_json::json!("fast"));
        assert_eq!(kw["note"], serde_json::json!("x=y"));
        for bad in ["enable_thinking", "a b=1", "messages=[]", "{\"x\": 1"] {
            assert!(
                ChatOptions::parse_kwargs(&[bad.to_string()]).is_err(),
                "{bad}"
            );
        }
        let t = ChatTemplate::new(
            "{% if add_generation_prompt %}A:{% if enable_thinking is defined and \
             enable_thinking is false %}<think></think>{% endif %}{% endif %}",
            None,
            None,
        );
        assert_eq!(t.render(&[], true).unwrap(), "A:");
        let off = t.clone().with_kwargs(kw);
        assert_eq!(off.render(&[], true).unwrap(), "A:<think></think>");
    }

    #[test]
    fn template_file_replaces_the_folder_template_and_keeps_its_tokens() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"eos_token": "<|im_end|>", "chat_template": "folder"}"#,
        )
        .unwrap();
        let file = dir.path().join("t.jinja");
        std::fs::write(&file, "{{ messages[0].content }}{{ eos_token }}{{ x }}").unwrap();
        let opts = ChatOptions {
            template: Some(file.clone()),
            kwargs: ChatOptions::parse_kwargs(&["x=1".to_string()]).unwrap(),
        };
        let t = opts.template_for(dir.path()).unwrap().unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "hi")], true).unwrap(),
            "hi<|im_end|>1"
        );
        let plain = ChatOptions::default()
            .template_for(dir.path())
            .unwrap()
            .unwrap();
        assert_eq!(plain.render(&[], true).unwrap(), "folder");
        std::fs::write(&file, "{% if %}").unwrap();
        let e = opts.template_for(dir.path()).unwrap_err();
        assert!(format!("{e:#}").contains("t.jinja"), "{e:#}");
    }
}
