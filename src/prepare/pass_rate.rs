//! Keeping the prompts a group-relative advantage can learn from.
//!
//! A prompt whose sampled answers are all right (or all wrong) gives every answer of its group
//! the same reward, so every advantage of the group is 0 and the group teaches nothing; a batch
//! made mostly of such prompts trains on the few that are left. When a policy's verdict on most
//! problems is fixed (it knows a sum or it does not), most of every batch is of that kind.
//! Filtering a prompt pool by the pass rate the starting policy reaches on it — answers sampled
//! with `generate-answers`, judged by `score` — keeps the prompts in between, the curriculum
//! that pass-rate filtering gives in RL recipes for reasoning models.
//!
//! A prompt's pass rate is the mean `acc_reward` of its answer rows in the scored table
//! (confidence rows are not counted): with a 0/1 verifier, the fraction of its answers judged
//! right. A row is kept when `min < rate < max`: the defaults 0 and 1 keep exactly the prompts
//! that were neither always right nor always wrong.
//!
//! `keep_decided` keeps a share of the others besides: the confidence turn of an RLCR loop
//! learns what its stated confidence should be from problems the policy always or never gets
//! right (their answers get no advantage, their confidences do: a Brier reward that differs
//! with the stated value), and a pool of coin-flip problems alone teaches it one number, the
//! pool's mean accuracy. The kept share is spread evenly through each class in input order
//! (the `j`-th decided prompt of a class is kept when `⌊(j + 1)·f⌋ > ⌊j·f⌋`): no draw, the same
//! rows for the same inputs.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use arrow::array::Array;

use super::PromptRow;
use crate::table::{cols, Reader, SampleType};
use crate::usage::usage;

/// The filter of a `prepare` call (`--pass-rates`, `--min-pass-rate`, `--max-pass-rate`).
#[derive(Clone, Debug, PartialEq)]
pub struct PassRateFilter {
    /// Scored answers to the prompts (`score`'s output: `prompt_id`, `sample_type`,
    /// `acc_reward`).
    pub scored: PathBuf,
    /// Rows are kept when `min < pass rate < max`.
    pub min: f64,
    pub max: f64,
    /// The share (0..=1) of the other rows kept as well, in each of the two classes (at or
    /// below `min`, at or above `max`).
    pub keep_decided: f64,
}

impl PassRateFilter {
    /// The filter, its bounds checked (usage errors): `0 <= min < max <= 1`,
    /// `0 <= keep_decided <= 1`.
    pub fn new(scored: PathBuf, min: f64, max: f64, keep_decided: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&min) || !(0.0..=1.0).contains(&max) || min >= max {
            return Err(usage(format!(
                "--min-pass-rate {min} and --max-pass-rate {max}: both must lie in 0..=1 with \
                 the minimum below the maximum (a row is kept when min < pass rate < max)"
            )));
        }
        if !(0.0..=1.0).contains(&keep_decided) {
            return Err(usage(format!(
                "--keep-decided {keep_decided}: the share of always- and never-right prompts \
                 kept must lie in 0..=1"
            )));
        }
        Ok(Self {
            scored,
            min,
            max,
            keep_decided,
        })
    }
}

/// What the filter did, for the summary line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Filtered {
    /// Rows before the filter.
    pub rows: usize,
    /// Rows kept.
    pub kept: usize,
    /// Rows at a rate of `min` or below (with the default 0: never right).
    pub too_hard: usize,
    /// Rows at a rate of `max` or above (with the default 1: always right).
    pub too_easy: usize,
    /// Of `too_hard` and `too_easy`, the rows kept all the same (`keep_decided`).
    pub decided_kept: usize,
}

/// Per prompt id: (answers, sum of their `acc_reward`), over the answer rows of `scored`.
pub fn answer_totals(scored: &Path) -> Result<HashMap<String, (usize, f64)>> {
    let shown = scored.display().to_string();
    let reader = Reader::open_columns(scored, &["prompt_id", "sample_type", "acc_reward"])
        .with_context(|| format!("--pass-rates {shown}"))?;
    let mut totals: HashMap<String, (usize, f64)> = HashMap::new();
    let mut base = 0usize;
    for batch in reader {
        let b = batch?;
        let ids = cols::str_col(&b, &shown, "prompt_id")?;
        let types = cols::str_col(&b, &shown, "sample_type")?;
        let acc = cols::f32_col(&b, &shown, "acc_reward")?;
        for i in 0..b.num_rows() {
            let row = base + i;
            if types.sample_type(i) != Some(SampleType::Answer) {
                continue;
            }
            let Some(id) = ids.get(i) else {
                bail!("{shown}, row {row}, column prompt_id: null in an answer row");
            };
            if acc.is_null(i) {
                bail!(
                    "{shown}, row {row}, column acc_reward: null (the answers are not scored: \
                     run `rlcr score` on them first)"
                );
            }
            let r = acc.value(i) as f64;
            if !r.is_finite() {
                bail!("{shown}, row {row}, column acc_reward: {r} is not a number");
            }
            let t = totals.entry(id.to_string()).or_default();
            t.0 += 1;
            t.1 += r;
        }
        base += b.num_rows();
    }
    if totals.is_empty() {
        bail!("{shown}: no answer rows to take pass rates from");
    }
    Ok(totals)
}

/// The rows of `rows` whose pass rate in `f.scored` lies strictly between `f.min` and `f.max`,
/// and the share `f.keep_decided` of the others (module documentation), in their order. A row
/// whose prompt has no answer in the scored table is an error (naming the row and its id): a
/// pass rate cannot be guessed.
pub fn filter(rows: Vec<PromptRow>, f: &PassRateFilter) -> Result<(Vec<PromptRow>, Filtered)> {
    let totals = answer_totals(&f.scored)?;
    let mut out = Filtered {
        rows: rows.len(),
        ..Filtered::default()
    };
    let mut kept = Vec::with_capacity(rows.len());
    for (i, r) in rows.into_iter().enumerate() {
        let Some(&(n, sum)) = totals.get(&r.prompt_id) else {
            bail!(
                "row {i}: prompt id {:?} has no answer in {} (--pass-rates needs the scored \
                 answers of every prompt it filters)",
                r.prompt_id,
                f.scored.display()
            );
        };
        let rate = sum / n as f64;
        let seen = if rate <= f.min {
            out.too_hard += 1;
            out.too_hard
        } else if rate >= f.max {
            out.too_easy += 1;
            out.too_easy
        } else {
            kept.push(r);
            continue;
        };
        // The `seen`-th decided row of its class (1-based): kept when the running share
        // passes a whole number.
        let share = |j: usize| (j as f64 * f.keep_decided).floor();
        if share(seen) > share(seen - 1) {
            out.decided_kept += 1;
            kept.push(r);
        }
    }
    out.kept = kept.len();
    if kept.is_empty() {
        bail!(
            "--pass-rates {}: no prompt has a pass rate strictly between {} and {} ({} at or \
             below, {} at or above); nothing was written",
            f.scored.display(),
            f.min,
            f.max,
            out.too_hard,
            out.too_easy
        );
    }
    Ok((kept, out))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Float32Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn row(id: &str) -> PromptRow {
        PromptRow {
            prompt_id: id.to_string(),
            messages: serde_json::json!([{"role": "user", "content": id}]),
            data_source: "t".into(),
            ground_truth: serde_json::Value::Null,
            extra_info: None,
        }
    }

    /// A scored table of `(prompt_id, sample_type, acc_reward)` rows.
    fn scored(dir: &Path, rows: &[(&str, &str, Option<f32>)]) -> PathBuf {
        let s = |k: usize| -> ArrayRef {
            let v: Vec<&str> = rows
                .iter()
                .map(|r| if k == 0 { r.0 } else { r.1 })
                .collect();
            Arc::new(StringArray::from(v))
        };
        let acc: ArrayRef = Arc::new(Float32Array::from(
            rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        ));
        let schema = Arc::new(Schema::new(vec![
            Field::new("prompt_id", DataType::Utf8, false),
            Field::new("sample_type", DataType::Utf8, false),
            Field::new("acc_reward", DataType::Float32, true),
        ]));
        let b = RecordBatch::try_new(schema.clone(), vec![s(0), s(1), acc]).unwrap();
        let path = dir.join("scored.parquet");
        let file = std::fs::File::create(&path).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
        w.write(&b).unwrap();
        w.close().unwrap();
        path
    }

    #[test]
    fn keeps_the_prompts_between_the_bounds_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let table = scored(
            dir.path(),
            &[
                ("a", "answer", Some(1.0)),
                ("a", "answer", Some(1.0)),
                ("b", "answer", Some(0.0)),
                ("b", "answer", Some(1.0)),
                ("b", "confidence", Some(0.0)),
                ("b", "confidence", Some(0.0)),
                ("c", "answer", Some(0.0)),
                ("c", "answer", Some(0.0)),
                ("d", "answer", Some(1.0)),
                ("d", "answer", Some(0.0)),
                ("d", "answer", Some(0.0)),
                ("d", "answer", Some(0.0)),
            ],
        );
        let rows = vec![row("d"), row("a"), row("b"), row("c")];
        // Rates: a 1, b 0.5 (its confidence rows do not count), c 0, d 0.25.
        let f = PassRateFilter::new(table.clone(), 0.0, 1.0, 0.0).unwrap();
        let (kept, n) = filter(rows.clone(), &f).unwrap();
        let ids: Vec<&str> = kept.iter().map(|r| r.prompt_id.as_str()).collect();
        assert_eq!(ids, ["d", "b"]);
        assert_eq!(
            n,
            Filtered {
                rows: 4,
                kept: 2,
                too_hard: 1,
                too_easy: 1,
                decided_kept: 0
            }
        );
        // The bounds are strict: 0.25 is not above 0.25, 0.5 is not below 0.5.
        let f = PassRateFilter::new(table.clone(), 0.25, 0.75, 0.0).unwrap();
        let ids: Vec<String> = filter(rows.clone(), &f)
            .unwrap()
            .0
            .into_iter()
            .map(|r| r.prompt_id)
            .collect();
        assert_eq!(ids, ["b"]);
        let f = PassRateFilter::new(table, 0.0, 0.5, 0.0).unwrap();
        let (kept, n) = filter(rows, &f).unwrap();
        assert_eq!(kept[0].prompt_id, "d");
        assert_eq!((n.kept, n.too_hard, n.too_easy), (1, 1, 2));
    }

    #[test]
    fn refuses_what_it_cannot_judge() {
        let dir = tempfile::tempdir().unwrap();
        let table = scored(
            dir.path(),
            &[("a", "answer", Some(1.0)), ("b", "answer", Some(1.0))],
        );
        let f = PassRateFilter::new(table.clone(), 0.0, 1.0, 0.0).unwrap();
        let e = format!("{:#}", filter(vec![row("a"), row("z")], &f).unwrap_err());
        assert!(e.contains("row 1") && e.contains("\"z\""), "{e}");
        let e = format!("{:#}", filter(vec![row("a"), row("b")], &f).unwrap_err());
        assert!(e.contains("nothing was written"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let table = scored(
            dir.path(),
            &[("a", "answer", Some(1.0)), ("a", "answer", None)],
        );
        let f = PassRateFilter::new(table, 0.0, 1.0, 0.0).unwrap();
        let e = format!("{:#}", filter(vec![row("a")], &f).unwrap_err());
        assert!(e.contains("row 1, column acc_reward"), "{e}");

        for (lo, hi) in [(0.5, 0.5), (0.6, 0.4), (-0.1, 1.0), (0.0, 1.5)] {
            assert!(
                PassRateFilter::new("s".into(), lo, hi, 0.0).is_err(),
                "{lo} {hi}"
            );
        }
    }

    /// `keep_decided`: the share of each decided class kept, spread evenly in input order (a
    /// half keeps the 2nd, 4th, … of each class; a third the 3rd, 6th, …; 1 keeps every row;
    /// 0 none), the in-between rows all kept; a share outside 0..=1 is a usage error.
    #[test]
    fn keeps_a_share_of_the_decided_prompts_evenly() {
        let dir = tempfile::tempdir().unwrap();
        // h1..h6 never right, e1..e3 always right, m1, m2 in between.
        let ids = [
            "h1", "e1", "m1", "h2", "h3", "e2", "h4", "m2", "h5", "e3", "h6",
        ];
        let mut answers = Vec::new();
        for id in ids {
            let (a, b) = match &id[..1] {
                "h" => (0.0, 0.0),
                "e" => (1.0, 1.0),
                _ => (0.0, 1.0),
            };
            answers.push((id, "answer", Some(a)));
            answers.push((id, "answer", Some(b)));
        }
        let table = scored(dir.path(), &answers);
        let rows: Vec<PromptRow> = ids.iter().map(|id| row(id)).collect();
        let kept = |share: f64| {
            let f = PassRateFilter::new(table.clone(), 0.0, 1.0, share).unwrap();
            let (kept, n) = filter(rows.clone(), &f).unwrap();
            let ids: Vec<String> = kept.into_iter().map(|r| r.prompt_id).collect();
            (ids.join(" "), n)
        };
        let (half, n) = kept(0.5);
        assert_eq!(half, "m1 h2 e2 h4 m2 h6");
        assert_eq!((n.rows, n.kept, n.too_hard, n.too_easy), (11, 6, 6, 3));
        assert_eq!(n.decided_kept, 4);
        assert_eq!(kept(1.0 / 3.0).0, "m1 h3 m2 e3 h6");
        assert_eq!(kept(1.0).0, ids.join(" "));
        assert_eq!(kept(0.0).0, "m1 m2");
        for bad in [-0.1, 1.5, f64::NAN] {
            assert!(
                PassRateFilter::new(table.clone(), 0.0, 1.0, bad).is_err(),
                "{bad}"
            );
        }
    }
}
