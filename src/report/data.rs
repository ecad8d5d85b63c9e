//! The report's compact in-memory view of a trajectory table.
//!
//! `report` reads tables with millions of rows, so it keeps one small record per row (≈ 50 bytes:
//! interned prompt and data-source ids, lengths, rewards, flags) and never holds the response
//! texts. Texts are needed twice: for the lenient confidence parse, which runs on each batch as it
//! streams by ([`Rows::push_batch`]), and for the handful of example rows in `report.md`, which a
//! second pass fetches by row number ([`collect_texts`]).
//!
//! Columns are looked up by name (the trajectory schema, `docs/schemas.md`). Only `sample_type` is required; every
//! other column is optional so that `report` works on any table of the pipeline (an answers table
//! before scoring gives lengths and format counts, not calibration). A missing column reads as all
//! nulls and is listed in [`Rows::missing_columns`] so that `metrics.json` can say why a figure is
//! null. Physical types are accepted loosely (Utf8/LargeUtf8/Utf8View, float32/float64, any
//! integer, List/LargeList) because files written by polars or DuckDB differ from ours.
//!
//! Policy for confidences: a value that is not finite or not in `[0, 1]` is treated as missing
//! (it cannot come from `score`'s strict parser); what a missing confidence becomes in the
//! calibration metrics is [`MissingConfidence`] (RLCR's eval counts it as 0.0, `docs/math.md` §4).

use std::collections::{BTreeSet, HashMap};

use anyhow::{bail, Context, Result};
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, Int64Type};
use serde::{Deserialize, Serialize};

use crate::table::intern::Interner;
pub use crate::table::SampleType;
use crate::table::StrCol;

/// What a confidence row without a valid parsed confidence counts as in calibration metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MissingConfidence {
    /// Confidence 0.0, as RLCR's evaluation does (`docs/math.md` §4): a model that fails to state a
    /// confidence is scored as if it said "certainly wrong".
    #[default]
    Zero,
    /// Leave the row out of calibration metrics (they then describe parsed confidences only).
    Drop,
}

/// The columns `report` looks at; all but `sample_type` are optional.
pub const COLUMNS: &[&str] = &[
    "sample_type",
    "prompt_id",
    "answer_idx",
    "data_source",
    "response_ids",
    "response_text",
    "format_ok",
    "acc_reward",
    "confidence",
    "conf_reward",
    "reward",
];

/// One table, one record per row, in file order.
#[derive(Clone, Debug, Default)]
pub struct Rows {
    /// `sample_type`.
    pub kind: Vec<SampleType>,
    /// Interned `prompt_id` (see [`Rows::prompts`]); null reads as "".
    pub prompt: Vec<u32>,
    /// `answer_idx` (−1 when null or absent).
    pub answer_idx: Vec<i32>,
    /// Interned `data_source` (see [`Rows::sources`]); null or absent reads as "".
    pub source: Vec<u32>,
    /// Response length in tokens (`len(response_ids)`), `None` when unknown.
    pub length: Vec<Option<u32>>,
    /// `format_ok`.
    pub format_ok: Vec<Option<bool>>,
    /// `acc_reward`.
    pub acc: Vec<Option<f64>>,
    /// `confidence` (strict, from `score`), `None` if null, non-finite or outside `[0, 1]`.
    pub confidence: Vec<Option<f64>>,
    /// Lenient re-parse of `response_text` ([`lenient_confidence`]); falls back to `confidence`.
    pub lenient: Vec<Option<f64>>,
    /// `conf_reward`.
    pub conf_reward: Vec<Option<f64>>,
    /// `reward`.
    pub reward: Vec<Option<f64>>,
    /// Prompt ids.
    pub prompts: Interner,
    /// Data sources.
    pub sources: Interner,
    /// Columns of [`COLUMNS`] the table does not have.
    pub missing_columns: BTreeSet<String>,
    /// Confidence values present but rejected (non-finite or outside `[0, 1]`).
    pub invalid_confidences: u64,
}

impl Rows {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.kind.len()
    }
    /// No rows.
    pub fn is_empty(&self) -> bool {
        self.kind.is_empty()
    }

    /// Append one record batch. Errors name the column and the row (global, 0-based).
    pub fn push_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        let base = self.len();
        let n = batch.num_rows();
        // Text columns stay borrowed from the batch.
        let st = batch
            .column_by_name("sample_type")
            .context("the table has no `sample_type` column (is it a trajectory table?)")?;
        let st = text(st, "sample_type")?;
        let m = &mut self.missing_columns;
        let prompt = optional(batch, m, "prompt_id", text)?;
        let aidx = optional(batch, m, "answer_idx", ints)?;
        let source = optional(batch, m, "data_source", text)?;
        let lens = optional(batch, m, "response_ids", list_lens)?;
        let response = optional(batch, m, "response_text", text)?;
        let fmt = optional(batch, m, "format_ok", |a, name| {
            a.as_boolean_opt()
                .with_context(|| format!("column `{name}`: expected bool, found {}", a.data_type()))
        })?;
        let acc = optional(batch, m, "acc_reward", f64s)?;
        let conf = optional(batch, m, "confidence", f64s)?;
        let conf_reward = optional(batch, m, "conf_reward", f64s)?;
        let reward = optional(batch, m, "reward", f64s)?;

        for i in 0..n {
            let row = base + i;
            let kind = match st.get(i).map(str::parse::<SampleType>) {
                Some(Ok(k)) => k,
                _ => bail!(
                    "row {row}, column `sample_type`: expected 'answer' or 'confidence', found {:?}",
                    st.get(i)
                ),
            };
            self.kind.push(kind);
            let p = prompt.and_then(|c| c.get(i)).unwrap_or("");
            self.prompt.push(self.prompts.intern(p));
            self.answer_idx.push(
                aidx.as_ref()
                    .and_then(|v| v[i])
                    .map(|x| i32::try_from(x).unwrap_or(-1))
                    .unwrap_or(-1),
            );
            let s = source.and_then(|c| c.get(i)).unwrap_or("");
            self.source.push(self.sources.intern(s));
            self.length.push(lens.as_ref().and_then(|v| v[i]));
            self.format_ok
                .push(fmt.and_then(|b| b.is_valid(i).then(|| b.value(i))));
            let get = |v: &Option<Vec<Option<f64>>>| v.as_ref().and_then(|v| v[i]);
            self.acc.push(get(&acc));
            let raw_c = get(&conf);
            let c = raw_c.filter(|c| c.is_finite() && (0.0..=1.0).contains(c));
            if raw_c.is_some() && c.is_none() {
                self.invalid_confidences += 1;
            }
            self.confidence.push(c);
            // The regex runs only where the strict parse failed (a few percent of rows).
            let lenient = match c {
                Some(c) => Some(c),
                None if kind == SampleType::Confidence => {
                    response.and_then(|c| c.get(i)).and_then(lenient_confidence)
                }
                None => None,
            };
            self.lenient.push(lenient);
            self.conf_reward.push(get(&conf_reward));
            self.reward.push(get(&reward));
        }
        Ok(())
    }

    /// Build from batches (convenience for tests and small tables).
    pub fn from_batches<'a>(batches: impl IntoIterator<Item = &'a RecordBatch>) -> Result<Rows> {
        let mut r = Rows::default();
        for b in batches {
            r.push_batch(b)?;
        }
        Ok(r)
    }

    /// Row index of the answer row of each `(prompt, answer_idx)`, first occurrence.
    pub fn answer_rows(&self) -> HashMap<(u32, i32), usize> {
        let mut m = HashMap::new();
        for i in 0..self.len() {
            if self.kind[i] == SampleType::Answer {
                m.entry((self.prompt[i], self.answer_idx[i])).or_insert(i);
            }
        }
        m
    }
}

/// The text shown for one example row.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RowText {
    /// `sample_id` (or "" when absent).
    pub sample_id: String,
    /// `response_text` (or "").
    pub response_text: String,
    /// `answer` (the extracted final answer), if present.
    pub answer: Option<String>,
    /// `ground_truth` (JSON text), if present.
    pub ground_truth: Option<String>,
}

/// Second pass: the texts of the rows whose global indices are in `wanted`, for a batch that
/// starts at global row `base`. Missing text columns give empty strings.
pub fn collect_texts(
    batch: &RecordBatch,
    base: usize,
    wanted: &BTreeSet<usize>,
    out: &mut HashMap<usize, RowText>,
) -> Result<()> {
    let n = batch.num_rows();
    let hits: Vec<usize> = wanted.range(base..base + n).copied().collect();
    if hits.is_empty() {
        return Ok(());
    }
    let get = |name: &str| -> Result<Option<Vec<Option<String>>>> {
        batch
            .column_by_name(name)
            .map(|a| strings(a, name))
            .transpose()
    };
    let sid = get("sample_id")?;
    let text = get("response_text")?;
    let answer = get("answer")?;
    let gt = get("ground_truth")?;
    for row in hits {
        let i = row - base;
        let s = |v: &Option<Vec<Option<String>>>| v.as_ref().and_then(|v| v[i].clone());
        out.insert(
            row,
            RowText {
                sample_id: s(&sid).unwrap_or_default(),
                response_text: s(&text).unwrap_or_default(),
                answer: s(&answer),
                ground_truth: s(&gt),
            },
        );
    }
    Ok(())
}

/// A string column as owned optional strings.
fn strings(a: &ArrayRef, name: &str) -> Result<Vec<Option<String>>> {
    let s = text(a, name)?;
    Ok((0..s.len()).map(|i| s.get(i).map(str::to_string)).collect())
}

/// Widen a float32 through its shortest decimal representation: `0.7f32` becomes the f64 `0.7`
/// that the model wrote, not `0.699999988079071` (plain widening), which the floor rule would put
/// in bin 6 instead of 7. Values with more than ~7 significant digits were never representable in
/// the column anyway, so nothing is lost.
pub fn widen_f32(x: f32) -> f64 {
    if !x.is_finite() {
        return x as f64;
    }
    // Fast path for |x| ≤ 1 (confidences, rewards): f32 spacing there is < 6e-8, so at most one
    // decimal with six or fewer fractional digits maps to x; if `round(x·1e6)/1e6` maps back to
    // x it is that decimal, hence the shortest representation (correctly rounded to f64).
    if x.abs() <= 1.0 {
        let d = (x as f64 * 1e6).round() / 1e6;
        if d as f32 == x {
            return d;
        }
    }
    widen_f32_slow(x)
}

/// [`widen_f32`] by formatting and parsing (the reference; also the path for other values).
pub fn widen_f32_slow(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

/// A numeric column as optional f64 (any float or integer type; float32 through [`widen_f32`]).
pub fn f64s(a: &ArrayRef, name: &str) -> Result<Vec<Option<f64>>> {
    if let Some(p) = a.as_primitive_opt::<arrow::datatypes::Float32Type>() {
        return Ok((0..p.len())
            .map(|i| p.is_valid(i).then(|| widen_f32(p.value(i))))
            .collect());
    }
    if !(a.data_type().is_floating() || a.data_type().is_integer()) {
        bail!(
            "column `{name}`: expected a number, found {}",
            a.data_type()
        );
    }
    cast_values::<Float64Type>(a, name, "float64")
}

/// Column `name` of `batch` read by `read`; `None`, noted in `missing`, when the table lacks it.
fn optional<'b, T>(
    batch: &'b RecordBatch,
    missing: &mut BTreeSet<String>,
    name: &str,
    read: impl FnOnce(&'b ArrayRef, &str) -> Result<T>,
) -> Result<Option<T>> {
    match batch.column_by_name(name) {
        Some(a) => read(a, name).map(Some),
        None => {
            missing.insert(name.to_string());
            Ok(None)
        }
    }
}

/// An integer column (any integer type) as optional i64.
pub fn ints(a: &ArrayRef, name: &str) -> Result<Vec<Option<i64>>> {
    if !a.data_type().is_integer() {
        bail!(
            "column `{name}`: expected an integer, found {}",
            a.data_type()
        );
    }
    cast_values::<Int64Type>(a, name, "int64")
}

/// A numeric column cast to `T` (`what` names it in errors), nulls as `None`.
fn cast_values<T: arrow::datatypes::ArrowPrimitiveType>(
    a: &ArrayRef,
    name: &str,
    what: &str,
) -> Result<Vec<Option<T::Native>>> {
    let c = arrow::compute::cast(a, &T::DATA_TYPE)
        .with_context(|| format!("column `{name}`: cannot read {} as {what}", a.data_type()))?;
    let p = c
        .as_primitive_opt::<T>()
        .with_context(|| format!("column `{name}`: expected {what} after cast"))?;
    Ok((0..p.len())
        .map(|i| p.is_valid(i).then(|| p.value(i)))
        .collect())
}

/// A text column read in place (Utf8, LargeUtf8, Utf8View or a dictionary of strings).
pub fn text<'a>(a: &'a ArrayRef, name: &str) -> Result<StrCol<'a>> {
    StrCol::of_array(a.as_ref())
        .with_context(|| format!("column `{name}`: expected text, found {}", a.data_type()))
}

/// Lengths of the lists of a List or LargeList column (`None` for null rows), from the offsets.
fn list_lens(a: &ArrayRef, name: &str) -> Result<Vec<Option<u32>>> {
    let clamp = |l: i64| Some(u32::try_from(l.max(0)).unwrap_or(u32::MAX));
    if let Some(l) = a.as_list_opt::<i32>() {
        let o = l.value_offsets();
        Ok((0..l.len())
            .map(|i| {
                if l.is_valid(i) {
                    clamp((o[i + 1] - o[i]) as i64)
                } else {
                    None
                }
            })
            .collect())
    } else if let Some(l) = a.as_list_opt::<i64>() {
        let o = l.value_offsets();
        Ok((0..l.len())
            .map(|i| {
                if l.is_valid(i) {
                    clamp(o[i + 1] - o[i])
                } else {
                    None
                }
            })
            .collect())
    } else {
        bail!("column `{name}`: expected a list, found {}", a.data_type());
    }
}

/// Lenient confidence parse for evaluation (`docs/math.md` §1.2): RLCR's eval-time extractor, shared
/// with the reward module ([`crate::reward::rlcr::parse_confidence_lenient`]) so that `report` and
/// `score` agree on what "leniently parsed" means: the last `<confidence>…</confidence>`, read
/// with Python's `float()` or else its first number, a value in `(1, 100]` read as a percentage.
///
/// The strict parse (finite float in `[0, 1]`, nothing else in the tag) is `score`'s `confidence`
/// column; the report counts a row as leniently parsed when either parse succeeds.
pub fn lenient_confidence(text: &str) -> Option<f64> {
    crate::reward::rlcr::parse_confidence_lenient(text)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use arrow::array::{BooleanArray, Float32Array, Int32Array, ListArray, StringArray};
    use arrow::datatypes::{DataType, Field, Int32Type, Schema};
    use std::sync::Arc;

    /// One synthetic row for tests: (sample_type, prompt, answer_idx, source, len, format_ok,
    /// acc, confidence, conf_reward, reward, text).
    pub type TRow<'a> = (
        &'a str,
        &'a str,
        i32,
        &'a str,
        usize,
        bool,
        f32,
        Option<f32>,
        Option<f32>,
        f32,
        &'a str,
    );

    /// A trajectory-like batch from rows (only the columns the report reads, plus sample_id).
    pub fn batch(rows: &[TRow]) -> RecordBatch {
        let sid: Vec<String> = rows
            .iter()
            .map(|r| match r.0 {
                "answer" => format!("{}/a{}", r.1, r.2),
                _ => format!("{}/a{}/c", r.1, r.2),
            })
            .collect();
        let ids = ListArray::from_iter_primitive::<Int32Type, _, _>(
            rows.iter()
                .map(|r| Some((0..r.4 as i32).map(Some).collect::<Vec<_>>())),
        );
        let schema = Schema::new(vec![
            Field::new("sample_type", DataType::Utf8, false),
            Field::new("prompt_id", DataType::Utf8, false),
            Field::new("answer_idx", DataType::Int32, false),
            Field::new("sample_id", DataType::Utf8, false),
            Field::new("data_source", DataType::Utf8, false),
            Field::new("response_ids", ids.data_type().clone(), true),
            Field::new("response_text", DataType::Utf8, false),
            Field::new("format_ok", DataType::Boolean, false),
            Field::new("acc_reward", DataType::Float32, false),
            Field::new("confidence", DataType::Float32, true),
            Field::new("conf_reward", DataType::Float32, true),
            Field::new("reward", DataType::Float32, false),
        ]);
        let cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(StringArray::from_iter_values(sid)),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.3))),
            Arc::new(ids),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.10))),
            Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.5)))),
            Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r.6))),
            Arc::new(Float32Array::from_iter(rows.iter().map(|r| r.7))),
            Arc::new(Float32Array::from_iter(rows.iter().map(|r| r.8))),
            Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r.9))),
        ];
        // ok: test helper with consistent lengths
        RecordBatch::try_new(Arc::new(schema), cols).expect("batch")
    }

    #[test]
    fn float32_widening_keeps_the_written_decimal() {
        // Regression: plain widening put a stated 0.7 into bin 6 under the floor rule.
        assert_eq!(0.7f32 as f64, 0.699999988079071);
        assert_eq!(widen_f32(0.7), 0.7);
        assert_eq!(widen_f32(0.1), 0.1);
        assert_eq!(widen_f32(1.0), 1.0);
        assert_eq!(widen_f32(1.0 / 3.0), 0.33333334);
        assert!(widen_f32(f32::NAN).is_nan());
        assert_eq!(widen_f32(-0.3), -0.3);
        assert_eq!(widen_f32(12.5), 12.5);
        use crate::report::metrics::{bin_index, BinRule};
        assert_eq!(bin_index(widen_f32(0.7), 10, BinRule::Floor), 7);
    }

    proptest::proptest! {
        #[test]
        fn widen_fast_path_matches_formatting(bits in proptest::prelude::any::<u32>(), k in 0u32..=1_000_000) {
            let x = f32::from_bits(bits);
            if x.is_finite() {
                proptest::prop_assert_eq!(widen_f32(x).to_bits(), widen_f32_slow(x).to_bits());
            }
            // Decimals with ≤ 6 places, as a model writes them.
            let y = (k as f64 / 1e6) as f32;
            proptest::prop_assert_eq!(widen_f32(y).to_bits(), widen_f32_slow(y).to_bits());
            proptest::prop_assert_eq!(widen_f32(-y).to_bits(), widen_f32_slow(-y).to_bits());
        }
    }

    #[test]
    fn rows_from_batch() {
        let b = batch(&[
            (
                "answer",
                "p0",
                0,
                "countdown",
                12,
                true,
                1.0,
                None,
                None,
                1.0,
                "<answer>4</answer>",
            ),
            (
                "confidence",
                "p0",
                0,
                "countdown",
                5,
                true,
                1.0,
                Some(0.75),
                Some(0.9375),
                0.9375,
                "<confidence>0.75</confidence>",
            ),
            (
                "confidence",
                "p0",
                0,
                "countdown",
                4,
                false,
                1.0,
                None,
                Some(0.0),
                0.0,
                "<confidence>80</confidence>",
            ),
            (
                "confidence",
                "p0",
                0,
                "math",
                4,
                false,
                1.0,
                Some(1.5),
                Some(0.0),
                0.0,
                "x",
            ),
        ]);
        let r = Rows::from_batches([&b]).expect("rows");
        assert_eq!(r.len(), 4);
        assert_eq!(r.kind[1], SampleType::Confidence);
        assert_eq!(r.length, vec![Some(12), Some(5), Some(4), Some(4)]);
        assert_eq!(r.confidence[1], Some(0.75));
        assert_eq!(r.confidence[3], None);
        assert_eq!(r.invalid_confidences, 1);
        assert_eq!(r.lenient[2], Some(0.8));
        assert_eq!(r.lenient[3], None);
        assert_eq!(r.sources.len(), 2);
        assert!(r.missing_columns.is_empty());
        assert_eq!(r.answer_rows().get(&(0, 0)), Some(&0));
        let mut want = BTreeSet::new();
        want.insert(1usize);
        let mut out = HashMap::new();
        collect_texts(&b, 0, &want, &mut out).expect("texts");
        assert_eq!(out[&1].sample_id, "p0/a0/c");
        assert_eq!(out[&1].response_text, "<confidence>0.75</confidence>");
    }

    #[test]
    fn bad_sample_type_names_row_and_column() {
        let b = batch(&[
            ("answer", "p", 0, "s", 1, true, 1.0, None, None, 1.0, ""),
            ("turn3", "p", 0, "s", 1, true, 1.0, None, None, 1.0, ""),
        ]);
        let e = Rows::from_batches([&b]).expect_err("must fail");
        let msg = format!("{e:#}");
        assert!(
            msg.contains("row 1") && msg.contains("sample_type") && msg.contains("turn3"),
            "{msg}"
        );
    }

    #[test]
    fn missing_optional_columns_are_listed() {
        let schema = Schema::new(vec![Field::new("sample_type", DataType::Utf8, false)]);
        let b = RecordBatch::try_new(
            Arc::new(schema),
            vec![Arc::new(StringArray::from(vec!["answer"])) as ArrayRef],
        )
        .expect("batch");
        let r = Rows::from_batches([&b]).expect("rows");
        assert_eq!(r.length, vec![None]);
        assert!(r.missing_columns.contains("acc_reward"));
        assert!(r.missing_columns.contains("response_ids"));
        assert_eq!(r.missing_columns.len(), COLUMNS.len() - 1);
    }
}
