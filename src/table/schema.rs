//! Table schemas: the trajectory table (`rlcr.trajectory` v2), the prompts table (v2) and the probe
//! table.
//!
//! Version 2 (both tables): `messages` is `list<struct<role, content>>` and the prompts table's
//! `extra_info` a struct (see [`super::nested`]); version 1 held both as JSON text, which every
//! stage still reads, so older tables need no migration (`docs/schemas.md`).
//!
//! One static list of [`ColumnSpec`] per table is the single source of truth: the Arrow schema the
//! writers use, the JSON printed by `rlcr schema`, and the files in `schemas/` (a test checks them
//! equal) all derive from it. Token ids are `list<int32>`, spans `struct<start:int32,end:int32>`
//! (0-based, end-exclusive, over the response ids), strings are plain Utf8 (never dictionaries: polars
//! would read them as Categorical).
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use serde_json::json;

/// The column types used by rlcr tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColType {
    Utf8,
    Int32,
    Float32,
    Bool,
    ListInt32,
    ListFloat32,
    ListBool,
    /// `struct<start:int32,end:int32>`.
    Span,
    /// `list<struct<name:utf8,turn:int32,value:float32,weight:float32>>`.
    RewardComponents,
    /// `list<struct<role:utf8,content:utf8>>`, or JSON text (schema version 1; still read).
    Messages,
    /// A struct whose fields are inferred per table, or JSON text where the values have no one
    /// type per key (and in schema version 1); a map is read too ([`super::nested`]).
    ExtraInfo,
}

impl ColType {
    /// The type as written in `schemas/*.json` and error messages.
    pub fn name(self) -> &'static str {
        match self {
            ColType::Utf8 => "utf8",
            ColType::Int32 => "int32",
            ColType::Float32 => "float32",
            ColType::Bool => "bool",
            ColType::ListInt32 => "list<int32>",
            ColType::ListFloat32 => "list<float32>",
            ColType::ListBool => "list<bool>",
            ColType::Span => "struct<start:int32,end:int32>",
            ColType::RewardComponents => {
                "list<struct<name:utf8,turn:int32,value:float32,weight:float32>>"
            }
            ColType::Messages => "list<struct<role:utf8,content:utf8>>",
            ColType::ExtraInfo => "struct (fields inferred per table) or utf8 (JSON text)",
        }
    }

    /// Whether a column of this type keeps the representation it was written with (native or
    /// JSON text) when a stage reads it, rather than being converted to [`ColType::arrow`].
    pub fn keeps_own_type(self) -> bool {
        matches!(self, ColType::Messages | ColType::ExtraInfo)
    }

    /// The Arrow type rlcr writes for this column.
    pub fn arrow(self) -> DataType {
        match self {
            ColType::Utf8 => DataType::Utf8,
            ColType::Int32 => DataType::Int32,
            ColType::Float32 => DataType::Float32,
            ColType::Bool => DataType::Boolean,
            ColType::ListInt32 => list_of(DataType::Int32),
            ColType::ListFloat32 => list_of(DataType::Float32),
            ColType::ListBool => list_of(DataType::Boolean),
            ColType::Span => DataType::Struct(span_fields()),
            ColType::RewardComponents => list_of(DataType::Struct(component_fields())),
            ColType::Messages => super::nested::messages_type(),
            // The type of a table whose extra information is unknown (none, or no one type per
            // key); `prepare` writes the struct it infers.
            ColType::ExtraInfo => DataType::Utf8,
        }
    }

    /// Whether an Arrow type read from a file is acceptable for this column (after the reader's
    /// normalisation of LargeList/LargeUtf8/Utf8View/dictionaries).
    pub fn accepts(self, dt: &DataType) -> bool {
        let list_item = |dt: &DataType, want: &DataType| match dt {
            DataType::List(f) | DataType::LargeList(f) => f.data_type() == want,
            _ => false,
        };
        match self {
            ColType::Utf8 => matches!(dt, DataType::Utf8 | DataType::LargeUtf8),
            ColType::Int32 => dt == &DataType::Int32,
            ColType::Float32 => dt == &DataType::Float32,
            ColType::Bool => dt == &DataType::Boolean,
            ColType::ListInt32 => list_item(dt, &DataType::Int32),
            ColType::ListFloat32 => list_item(dt, &DataType::Float32),
            ColType::ListBool => list_item(dt, &DataType::Boolean),
            ColType::Span => match dt {
                DataType::Struct(fs) => {
                    fs.len() == 2
                        && fs.iter().all(|f| {
                            (f.name() == "start" || f.name() == "end")
                                && f.data_type() == &DataType::Int32
                        })
                }
                _ => false,
            },
            ColType::RewardComponents => match dt {
                DataType::List(f) | DataType::LargeList(f) => {
                    matches!(f.data_type(), DataType::Struct(fs) if fs.find("name").is_some() && fs.find("value").is_some())
                }
                _ => false,
            },
            ColType::Messages => {
                matches!(dt, DataType::Utf8 | DataType::LargeUtf8)
                    || super::nested::is_native_messages(dt)
            }
            ColType::ExtraInfo => super::nested::is_extra_info_type(dt),
        }
    }
}

/// The `sample_type` of a trajectory row: the two turns of the RLCR tree. The one place the
/// column's values are spelled; stages parse them with [`str::parse`] (or
/// [`SampleType::from_bytes`] in hot loops) and write them with [`SampleType::as_str`].
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SampleType {
    /// Turn 1: `<think>…</think><answer>…</answer>`.
    Answer,
    /// Turn 2: `[<analysis>…</analysis>]<confidence>…</confidence>` about one answer.
    Confidence,
}

impl SampleType {
    /// Both values, in the order rlcr writes them.
    pub const ALL: [SampleType; 2] = [SampleType::Answer, SampleType::Confidence];

    /// The column value.
    pub fn as_str(self) -> &'static str {
        match self {
            SampleType::Answer => "answer",
            SampleType::Confidence => "confidence",
        }
    }

    /// The type a column value names (`None` for any other value).
    #[inline]
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        match b {
            b"answer" => Some(SampleType::Answer),
            b"confidence" => Some(SampleType::Confidence),
            _ => None,
        }
    }
}

impl std::fmt::Display for SampleType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `sample_type` value that is neither `answer` nor `confidence`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownSampleType(pub String);

impl std::fmt::Display for UnknownSampleType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown value {:?} (expected \"answer\" or \"confidence\")",
            self.0
        )
    }
}

impl std::error::Error for UnknownSampleType {}

impl std::str::FromStr for SampleType {
    type Err = UnknownSampleType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SampleType::from_bytes(s.as_bytes()).ok_or_else(|| UnknownSampleType(s.to_string()))
    }
}

fn list_of(dt: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", dt, true)))
}

/// Fields of a span struct.
pub fn span_fields() -> Fields {
    Fields::from(vec![
        Field::new("start", DataType::Int32, false),
        Field::new("end", DataType::Int32, false),
    ])
}

/// Fields of one reward component.
pub fn component_fields() -> Fields {
    Fields::from(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("turn", DataType::Int32, false),
        Field::new("value", DataType::Float32, false),
        Field::new("weight", DataType::Float32, false),
    ])
}

/// One column of an rlcr table.
#[derive(Clone, Copy, Debug)]
pub struct ColumnSpec {
    pub name: &'static str,
    pub ty: ColType,
    /// Whether null values are allowed.
    pub nullable: bool,
    /// The stage that writes the column.
    pub written_by: &'static str,
    /// What it means.
    pub doc: &'static str,
}

impl ColumnSpec {
    /// The Arrow field of this column.
    pub fn field(&self) -> Field {
        Field::new(self.name, self.ty.arrow(), self.nullable)
    }
}

/// A table kind: name, version, columns in canonical order.
#[derive(Debug)]
pub struct TableSpec {
    pub name: &'static str,
    pub version: u32,
    pub columns: &'static [ColumnSpec],
    pub doc: &'static str,
}

impl TableSpec {
    /// The column spec by name.
    pub fn column(&self, name: &str) -> Option<&ColumnSpec> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The full Arrow schema (every column).
    pub fn arrow_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns.iter().map(|c| c.field()).collect::<Vec<_>>(),
        ))
    }

    /// The machine-readable description written to `schemas/<kind>.json`.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "name": self.name,
            "version": self.version,
            "doc": self.doc,
            "columns": self.columns.iter().map(|c| json!({
                "name": c.name,
                "type": c.ty.name(),
                "nullable": c.nullable,
                "written_by": c.written_by,
                "doc": c.doc,
            })).collect::<Vec<_>>(),
        })
    }

    /// Position of a column in canonical order (unknown columns sort after every known one).
    pub fn order(&self, name: &str) -> usize {
        self.columns
            .iter()
            .position(|c| c.name == name)
            .unwrap_or(usize::MAX)
    }
}

macro_rules! col {
    ($name:literal, $ty:ident, $nullable:literal, $by:literal, $doc:literal) => {
        ColumnSpec {
            name: $name,
            ty: ColType::$ty,
            nullable: $nullable,
            written_by: $by,
            doc: $doc,
        }
    };
}

/// The trajectory table: one row per sample (answer or confidence).
pub static TRAJECTORY: TableSpec = TableSpec {
    name: "rlcr.trajectory",
    version: 2,
    doc: "One row per sample (answer or confidence); every stage passes all columns through and adds its own.",
    columns: &[
        col!("prompt_id", Utf8, false, "prepare", "stable id of the prompt"),
        col!("sample_type", Utf8, false, "generate-*", "`answer` or `confidence`"),
        col!("answer_idx", Int32, false, "generate-answers", "k, 0-based index of the answer within its prompt"),
        col!("confidence_idx", Int32, true, "generate-confidence", "h, 0-based index of the confidence within its answer; null on answers"),
        col!("sample_id", Utf8, false, "generate-*", "`{prompt_id}/a{k}` or `{prompt_id}/a{k}/c{h}`"),
        col!("data_source", Utf8, false, "prepare", "dataset name; picks the verifier"),
        col!("ground_truth", Utf8, false, "prepare", "verifier input, JSON text"),
        col!("messages", Messages, false, "generate-*", "the conversation the sample answers, a list of {role, content} (JSON text in version 1 tables, still read)"),
        col!("context_ids", ListInt32, false, "generate-*", "tokens fed to the model before the response"),
        col!("response_ids", ListInt32, false, "generate-*", "generated tokens"),
        col!("response_text", Utf8, false, "generate-*", "decoded response"),
        col!("response_logprobs", ListFloat32, false, "generate-*", "sampling-time log-probs (behaviour policy), one per response token"),
        col!("finish_reason", Utf8, false, "generate-*", "`stop` or `length`"),
        col!("answer_span", Span, true, "generate-answers", "<think>...</answer> in response tokens, end exclusive; null if not found"),
        col!("confidence_span", Span, true, "generate-confidence", "<analysis>/<confidence>...</confidence> in response tokens, end exclusive; null if not found"),
        col!("answer", Utf8, true, "score", "extracted final answer"),
        col!("format_ok", Bool, false, "score", "the response has the required format"),
        col!("acc_reward", Float32, false, "score", "1/0 on answers; confidence rows carry their own answer's value"),
        col!("confidence", Float32, true, "score", "parsed confidence in [0,1] (confidence rows); null if unparseable"),
        col!("conf_reward", Float32, true, "score", "Brier reward 1-(acc-c)^2 (confidence rows)"),
        col!("reward", Float32, false, "score", "the scalar this row's advantage is computed from"),
        col!("reward_components", RewardComponents, false, "score", "structured rewards: name, turn, value, weight"),
        col!("advantage", Float32, false, "advantage", "sequence-level advantage"),
        col!("token_advantages", ListFloat32, false, "advantage", "per response token, 0 outside the mask"),
        col!("loss_mask", ListBool, false, "advantage", "per response token, learnable or not"),
        col!("ref_logprobs", ListFloat32, true, "logprobs", "reference-policy log-probs per response token (KL)"),
        col!("values", ListFloat32, true, "values", "critic values per response token (GAE)"),
        col!("returns", ListFloat32, true, "advantage", "per-token returns (GAE)"),
        col!("token_turn_ids", ListInt32, true, "generate-multiturn", "per response token: turn id (>=0) or -1 for non-trainable tokens"),
        col!("info_mask", ListBool, true, "generate-multiturn", "per response token: false for environment/information tokens"),
        col!("trajectory_score", Float32, true, "advantage", "sum_t returns_t * mask_t"),
    ],
};

/// The prompts table written by `rlcr prepare`.
pub static PROMPTS: TableSpec = TableSpec {
    name: "rlcr.prompts",
    version: 2,
    doc: "One row per prompt; the input of generate-answers.",
    columns: &[
        col!(
            "prompt_id",
            Utf8,
            false,
            "prepare",
            "stable id of the prompt"
        ),
        col!(
            "messages",
            Messages,
            false,
            "prepare",
            "the prompt conversation, a list of {role, content} (usually one user turn; JSON text in version 1 tables, still read)"
        ),
        col!(
            "data_source",
            Utf8,
            false,
            "prepare",
            "dataset name; picks the verifier"
        ),
        col!(
            "ground_truth",
            Utf8,
            false,
            "prepare",
            "verifier input, JSON text"
        ),
        col!(
            "extra_info",
            ExtraInfo,
            true,
            "prepare",
            "anything else the source carried: a struct of its keys (JSON text when they have no one type each, and in version 1 tables)"
        ),
    ],
};

/// The probe table written by `rlcr probe`.
pub static PROBE: TableSpec = TableSpec {
    name: "rlcr.probe",
    version: 1,
    doc: "One row per (answer rollout, cut point) of the faithfulness probe.",
    columns: &[
        col!("sample_id", Utf8, false, "probe", "the answer row probed"),
        col!("prompt_id", Utf8, false, "probe", "its prompt"),
        col!("answer_idx", Int32, false, "probe", "its answer index"),
        col!(
            "cut_index",
            Int32,
            false,
            "probe",
            "index of the cut point, 0-based"
        ),
        col!(
            "cut_fraction",
            Float32,
            false,
            "probe",
            "fraction of the thinking kept"
        ),
        col!(
            "cut_token",
            Int32,
            false,
            "probe",
            "response token offset of the cut"
        ),
        col!(
            "num_samples",
            Int32,
            false,
            "probe",
            "continuations sampled (N)"
        ),
        col!(
            "num_correct",
            Int32,
            false,
            "probe",
            "continuations the verifier accepted (score == 1.0)"
        ),
        col!(
            "probe_confidence",
            Float32,
            false,
            "probe",
            "num_correct / num_samples"
        ),
        col!(
            "verbal_confidence",
            Float32,
            true,
            "probe",
            "mean parsed confidence of the answer's confidence rows"
        ),
        col!(
            "acc_reward",
            Float32,
            false,
            "probe",
            "the answer's accuracy reward"
        ),
    ],
};

/// Every table kind, by short name.
pub fn all() -> [(&'static str, &'static TableSpec); 3] {
    [
        ("trajectory", &TRAJECTORY),
        ("prompts", &PROMPTS),
        ("probe", &PROBE),
    ]
}

/// A table kind by short name (`trajectory`) or full name (`rlcr.trajectory`).
pub fn by_name(name: &str) -> Option<&'static TableSpec> {
    all()
        .into_iter()
        .find(|(short, spec)| *short == name || spec.name == name)
        .map(|(_, s)| s)
}

/// `rlcr schema`'s output: the JSON of `spec` (the same as its file in `schemas/`), or without
/// one a line per table kind (short name, full name, version, what it holds).
pub fn describe(spec: Option<&TableSpec>, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    match spec {
        Some(spec) => writeln!(out, "{}", serde_json::to_string_pretty(&spec.to_json())?)?,
        None => {
            for (short, spec) in all() {
                writeln!(
                    out,
                    "{short:<12} {} v{}: {}",
                    spec.name, spec.version, spec.doc
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sample_type` values parse, print and read from bytes the same way; any other value is
    /// refused with a message that lists the two.
    #[test]
    fn sample_type_round_trips() {
        for t in SampleType::ALL {
            assert_eq!(t.to_string().parse::<SampleType>(), Ok(t));
            assert_eq!(SampleType::from_bytes(t.as_str().as_bytes()), Some(t));
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
        let e = "Answer".parse::<SampleType>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown value \"Answer\" (expected \"answer\" or \"confidence\")"
        );
        assert_eq!(SampleType::from_bytes(b"answer "), None);
    }

    /// The files in `schemas/` are the published contract: they must equal what the code writes.
    #[test]
    fn schema_files_match_code() {
        for (short, spec) in all() {
            let path = format!("{}/schemas/{short}.json", env!("CARGO_MANIFEST_DIR"));
            let text =
                std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
            let file: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                file,
                spec.to_json(),
                "{path} differs from the code; regenerate with `rlcr schema {short} > {path}`"
            );
        }
    }

    #[test]
    fn spec_columns_match_the_contract() {
        // The names and types of the documented table (docs/schemas.md), in order (a hand-copied
        // list, independent of the static above).
        let want = [
            ("prompt_id", "utf8"),
            ("sample_type", "utf8"),
            ("answer_idx", "int32"),
            ("confidence_idx", "int32"),
            ("sample_id", "utf8"),
            ("data_source", "utf8"),
            ("ground_truth", "utf8"),
            ("messages", "list<struct<role:utf8,content:utf8>>"),
            ("context_ids", "list<int32>"),
            ("response_ids", "list<int32>"),
            ("response_text", "utf8"),
            ("response_logprobs", "list<float32>"),
            ("finish_reason", "utf8"),
            ("answer_span", "struct<start:int32,end:int32>"),
            ("confidence_span", "struct<start:int32,end:int32>"),
            ("answer", "utf8"),
            ("format_ok", "bool"),
            ("acc_reward", "float32"),
            ("confidence", "float32"),
            ("conf_reward", "float32"),
            ("reward", "float32"),
        ];
        for (i, (n, t)) in want.iter().enumerate() {
            assert_eq!(TRAJECTORY.columns[i].name, *n);
            assert_eq!(TRAJECTORY.columns[i].ty.name(), *t);
        }
        assert!(TRAJECTORY.column("confidence_idx").unwrap().nullable);
        assert!(!TRAJECTORY.column("sample_id").unwrap().nullable);
    }

    #[test]
    fn accepts_large_list() {
        let large = DataType::LargeList(Arc::new(Field::new("item", DataType::Int32, true)));
        assert!(ColType::ListInt32.accepts(&large));
        assert!(!ColType::ListFloat32.accepts(&large));
        assert!(ColType::Utf8.accepts(&DataType::LargeUtf8));
    }
}
