//! Training rows: what `update` and `sft` read from a table, checked once up front.
//!
//! A [`TrainRow`] is one sample: its context and response ids, and per response token the
//! behaviour log-prob, the advantage and whether the token is learnable. `update` reads them from
//! a training table (`rlcr advantage` output); `sft` builds them from chat messages or from a
//! trajectory table. Every check that depends on user data happens here, with the file, row and
//! column in the message, so the training loop itself never meets a malformed row.
use std::path::Path;

use anyhow::{bail, Result};
use arrow::array::{Array, RecordBatch};

use crate::table::validate::RULE_COLUMNS;
use crate::table::{check_schema, cols, Reader, SampleType, Validator, TRAJECTORY};

/// One training sample.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainRow {
    /// Tokens before the response (prompt and template).
    pub context: Vec<u32>,
    /// The response tokens.
    pub response: Vec<u32>,
    /// Behaviour-policy log-prob per response token (unused by SFT: zeros).
    pub old_logp: Vec<f32>,
    /// Advantage per response token (SFT: 1 on learnable tokens).
    pub adv: Vec<f32>,
    /// Learnable per response token.
    pub mask: Vec<bool>,
    /// Reference log-probs per response token, when given by the table.
    pub ref_logp: Option<Vec<f32>>,
    /// True for confidence rows (`sample_type == "confidence"`), for the metrics split.
    pub is_confidence: bool,
}

impl TrainRow {
    /// Number of learnable tokens.
    pub fn n_learnable(&self) -> usize {
        self.mask.iter().filter(|&&m| m).count()
    }

    /// Context plus response length.
    pub fn total_len(&self) -> usize {
        self.context.len() + self.response.len()
    }
}

/// Columns `update` reads.
pub const UPDATE_COLUMNS: &[&str] = &[
    "sample_type",
    "context_ids",
    "response_ids",
    "response_logprobs",
    "token_advantages",
    "loss_mask",
    "ref_logprobs",
];

/// Read a training table into rows (`update`), validated with the one [`Validator`] (identities,
/// links, list lengths, spans) as every stage's input is. `want_ref` reads the `ref_logprobs`
/// column too (required then).
pub fn read_update_rows(path: &Path, want_ref: bool) -> Result<Vec<TrainRow>> {
    let mode = if want_ref {
        RefColumn::Required
    } else {
        RefColumn::Skip
    };
    read_update_rows_with(path, mode)
}

/// Whether [`read_update_rows_with`] reads the `ref_logprobs` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefColumn {
    /// Not read.
    Skip,
    /// Read; an error when the table has none (the KL loss needs it).
    Required,
    /// Read when the table has it (the KL-to-reference diagnostic).
    IfPresent,
}

/// [`read_update_rows`] with the `ref_logprobs` column read as `mode` says.
pub fn read_update_rows_with(path: &Path, mode: RefColumn) -> Result<Vec<TrainRow>> {
    let mut names: Vec<&str> = UPDATE_COLUMNS.to_vec();
    names.extend(RULE_COLUMNS.iter().filter(|c| !UPDATE_COLUMNS.contains(c)));
    let reader = Reader::open_columns(path, &names)?;
    let name = path.display().to_string();
    check_schema(&name, &reader.file_schema(), &TRAJECTORY, &[])?;
    let mut validator = Validator::new(&name, &TRAJECTORY);
    validator.reserve(reader.num_rows());
    for c in [
        "context_ids",
        "response_ids",
        "response_logprobs",
        "token_advantages",
        "loss_mask",
    ] {
        if !reader.has_column(c) {
            bail!(
                "{name}: column `{c}` is missing (update needs a training table from `rlcr advantage`)"
            );
        }
    }
    let want_ref = match mode {
        RefColumn::Skip => false,
        RefColumn::Required => true,
        RefColumn::IfPresent => reader.has_column("ref_logprobs"),
    };
    if want_ref && !reader.has_column("ref_logprobs") {
        bail!(
            "{name}: --kl-coef > 0 needs reference log-probs: give --ref-model DIR, or add a \
             `ref_logprobs` column with `rlcr logprobs --column ref_logprobs`"
        );
    }
    let mut rows = Vec::with_capacity(reader.num_rows());
    for batch in reader {
        let batch = batch?;
        validator.check_batch(&batch)?;
        rows_from_batch(&batch, &name, rows.len(), want_ref, &mut rows)?;
    }
    validator.finish()?;
    Ok(rows)
}

/// Append the rows of one record batch; `first_row` numbers rows in messages.
pub fn rows_from_batch(
    b: &RecordBatch,
    table: &str,
    first_row: usize,
    want_ref: bool,
    out: &mut Vec<TrainRow>,
) -> Result<()> {
    let ctx = cols::list_i32(b, table, "context_ids")?;
    let resp = cols::list_i32(b, table, "response_ids")?;
    let old = cols::list_f32(b, table, "response_logprobs")?;
    let adv = cols::list_f32(b, table, "token_advantages")?;
    let mask = cols::list_bool(b, table, "loss_mask")?;
    let refl = if want_ref {
        Some(cols::list_f32(b, table, "ref_logprobs")?)
    } else {
        None
    };
    let stype = if b.column_by_name("sample_type").is_some() {
        Some(cols::str_col(b, table, "sample_type")?)
    } else {
        None
    };
    for i in 0..b.num_rows() {
        let row = first_row + i;
        let at = |col: &str| format!("{table}: row {row}, column `{col}`");
        for (col, null) in [
            ("context_ids", ctx.is_null(i)),
            ("response_ids", resp.is_null(i)),
            ("response_logprobs", old.is_null(i)),
            ("token_advantages", adv.is_null(i)),
            ("loss_mask", mask.is_null(i)),
        ] {
            if null {
                bail!("{}: null", at(col));
            }
        }
        let ids =
            |v: &cols::ListView<'_, arrow::array::Int32Array>, col: &str| -> Result<Vec<u32>> {
                v.values.values()[v.range(i)]
                    .iter()
                    .map(|&x| {
                        u32::try_from(x)
                            .map_err(|_| anyhow::anyhow!("{}: negative token id {x}", at(col)))
                    })
                    .collect()
            };
        let context = ids(&ctx, "context_ids")?;
        let response = ids(&resp, "response_ids")?;
        let n = response.len();
        let floats =
            |v: &cols::ListView<'_, arrow::array::Float32Array>, col: &str| -> Result<Vec<f32>> {
                if v.len_of(i) != n {
                    bail!(
                        "{}: {} values for {n} response tokens",
                        at(col),
                        v.len_of(i)
                    );
                }
                let r = v.range(i);
                if v.values.null_count() > 0 && (r.clone()).any(|k| v.values.is_null(k)) {
                    bail!("{}: null element", at(col));
                }
                Ok(v.values.values()[r].to_vec())
            };
        let old_logp = floats(&old, "response_logprobs")?;
        let advs = floats(&adv, "token_advantages")?;
        if mask.len_of(i) != n {
            bail!(
                "{}: {} values for {n} response tokens",
                at("loss_mask"),
                mask.len_of(i)
            );
        }
        let r = mask.range(i);
        let m: Vec<bool> = r
            .map(|k| mask.values.is_valid(k) && mask.values.value(k))
            .collect();
        let ref_logp = match &refl {
            Some(v) => {
                if v.is_null(i) {
                    bail!("{}: null", at("ref_logprobs"));
                }
                Some(floats(v, "ref_logprobs")?)
            }
            None => None,
        };
        for t in 0..n {
            if !m[t] {
                continue;
            }
            if !advs[t].is_finite() {
                bail!(
                    "{}: token {t}: advantage {} is not finite",
                    at("token_advantages"),
                    advs[t]
                );
            }
            if !(old_logp[t].is_finite() && old_logp[t] <= 0.0) {
                bail!(
                    "{}: token {t}: {} is not a log-probability",
                    at("response_logprobs"),
                    old_logp[t]
                );
            }
            if let Some(rl) = &ref_logp {
                if !(rl[t].is_finite() && rl[t] <= 0.0) {
                    bail!(
                        "{}: token {t}: {} is not a log-probability",
                        at("ref_logprobs"),
                        rl[t]
                    );
                }
            }
        }
        if context.is_empty() && !response.is_empty() {
            bail!(
                "{}: empty context (the first response token has nothing to condition on)",
                at("context_ids")
            );
        }
        let is_confidence = match stype {
            Some(s) if s.is_valid(i) => match s.value(i).parse::<SampleType>() {
                Ok(t) => t == SampleType::Confidence,
                Err(e) => bail!("{}: {e}", at("sample_type")),
            },
            Some(_) => bail!("{}: null", at("sample_type")),
            None => false,
        };
        out.push(TrainRow {
            context,
            response,
            old_logp,
            adv: advs,
            mask: m,
            ref_logp,
            is_confidence,
        });
    }
    Ok(())
}

/// Check token ids against a vocabulary size, naming the first offending row and column.
pub fn check_vocab(rows: &[TrainRow], vocab: usize, table: &str) -> Result<()> {
    for (i, r) in rows.iter().enumerate() {
        for (col, ids) in [("context_ids", &r.context), ("response_ids", &r.response)] {
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                bail!(
                    "{table}: row {i}, column `{col}`: token id {bad} is outside the model's \
                     vocabulary of {vocab}"
                );
            }
        }
    }
    Ok(())
}

/// Check that every row's context + response fits the model's `max_pos` positions.
pub fn check_positions(rows: &[TrainRow], max_pos: usize, table: &str) -> Result<()> {
    if let Some((i, r)) = rows
        .iter()
        .enumerate()
        .find(|(_, r)| r.total_len() > max_pos)
    {
        bail!(
            "{table}: row {i}, column `context_ids`: context ({}) + response ({}) is {} tokens, but \
             the model accepts at most {max_pos} positions",
            r.context.len(),
            r.response.len(),
            r.total_len()
        );
    }
    Ok(())
}

/// The training-table columns of `rows` as one record batch (`sample_type`, `context_ids`,
/// `response_ids`, `response_logprobs`, `token_advantages`, `loss_mask`, and `ref_logprobs`
/// when every row has them): the inverse of [`rows_from_batch`], for tests and tools.
pub fn rows_to_batch(rows: &[TrainRow]) -> Result<RecordBatch> {
    use std::sync::Arc;
    let ids = |f: &dyn Fn(&TrainRow) -> &Vec<u32>| -> Result<Vec<Vec<i32>>> {
        rows.iter()
            .map(|r| {
                f(r).iter()
                    .map(|&x| {
                        i32::try_from(x).map_err(|_| anyhow::anyhow!("token id {x} too large"))
                    })
                    .collect()
            })
            .collect()
    };
    let mut cols_out: Vec<(&str, arrow::array::ArrayRef)> = vec![
        (
            "sample_type",
            Arc::new(arrow::array::StringArray::from_iter_values(
                rows.iter().map(|r| {
                    if r.is_confidence {
                        "confidence"
                    } else {
                        "answer"
                    }
                }),
            )),
        ),
        ("context_ids", cols::build_list_i32(ids(&|r| &r.context)?)),
        ("response_ids", cols::build_list_i32(ids(&|r| &r.response)?)),
        (
            "response_logprobs",
            cols::build_list_f32(rows.iter().map(|r| r.old_logp.clone())),
        ),
        (
            "token_advantages",
            cols::build_list_f32(rows.iter().map(|r| r.adv.clone())),
        ),
        (
            "loss_mask",
            cols::build_list_bool(rows.iter().map(|r| r.mask.clone())),
        ),
    ];
    if rows.iter().all(|r| r.ref_logp.is_some()) {
        cols_out.push((
            "ref_logprobs",
            cols::build_list_f32(rows.iter().map(|r| r.ref_logp.clone().unwrap_or_default())),
        ));
    }
    Ok(RecordBatch::try_from_iter(cols_out)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{write_table, Meta, TRAJECTORY};

    fn row(i: u32) -> TrainRow {
        TrainRow {
            context: vec![1, 2, i],
            response: vec![3, 4, 5],
            old_logp: vec![-0.5, -1.0, -2.0],
            adv: vec![0.5, 0.5, 0.0],
            mask: vec![true, true, false],
            ref_logp: Some(vec![-0.4, -1.1, -2.5]),
            is_confidence: i % 2 == 1,
        }
    }

    fn write(dir: &Path, rows: &[TrainRow]) -> std::path::PathBuf {
        let b = rows_to_batch(rows).expect("batch");
        let p = dir.join("train.parquet");
        let meta = Meta::new(&TRAJECTORY, "advantage", serde_json::json!({}), &[]);
        write_table(&p, b.schema(), &[b], &meta).expect("write");
        p
    }

    #[test]
    fn table_round_trip() {
        let d = tempfile::tempdir().expect("tmp");
        let rows: Vec<TrainRow> = (0..5).map(row).collect();
        let p = write(d.path(), &rows);
        assert_eq!(read_update_rows(&p, true).expect("read"), rows);
        let no_ref: Vec<TrainRow> = read_update_rows(&p, false).expect("read");
        assert!(no_ref.iter().all(|r| r.ref_logp.is_none()));
    }

    #[test]
    fn bad_rows_are_errors_naming_row_and_column() {
        let d = tempfile::tempdir().expect("tmp");
        let mut rows: Vec<TrainRow> = (0..3).map(row).collect();
        rows[2].adv = vec![0.5];
        let p = write(d.path(), &rows);
        let e = format!("{:#}", read_update_rows(&p, false).expect_err("length"));
        assert!(e.contains("row 2") && e.contains("token_advantages"), "{e}");

        let mut rows: Vec<TrainRow> = (0..3).map(row).collect();
        rows[1].old_logp[1] = 0.5;
        let p = write(d.path(), &rows);
        let e = format!("{:#}", read_update_rows(&p, false).expect_err("logprob"));
        assert!(
            e.contains("row 1") && e.contains("response_logprobs"),
            "{e}"
        );
        // ... but a positive value under a masked token is ignored.
        let mut rows: Vec<TrainRow> = (0..3).map(row).collect();
        rows[1].old_logp[2] = f32::NAN;
        let p = write(d.path(), &rows);
        assert!(read_update_rows(&p, false).is_ok());

        let mut rows: Vec<TrainRow> = (0..3).map(row).collect();
        rows[0].adv[0] = f32::INFINITY;
        let p = write(d.path(), &rows);
        let e = format!("{:#}", read_update_rows(&p, false).expect_err("adv"));
        assert!(e.contains("row 0") && e.contains("not finite"), "{e}");

        let mut rows: Vec<TrainRow> = (0..3).map(row).collect();
        for r in &mut rows {
            r.ref_logp = None;
        }
        let p = write(d.path(), &rows);
        let e = format!("{:#}", read_update_rows(&p, true).expect_err("ref"));
        assert!(e.contains("--ref-model"), "{e}");
    }

    #[test]
    fn missing_column_is_an_error() {
        let d = tempfile::tempdir().expect("tmp");
        let rows: Vec<TrainRow> = (0..2).map(row).collect();
        let b = rows_to_batch(&rows).expect("batch");
        let b = crate::table::cols::drop_columns(&b, &["loss_mask"]).expect("drop");
        let p = d.path().join("t.parquet");
        let meta = Meta::new(&TRAJECTORY, "advantage", serde_json::json!({}), &[]);
        write_table(&p, b.schema(), &[b], &meta).expect("write");
        let e = format!("{:#}", read_update_rows(&p, false).expect_err("missing"));
        assert!(
            e.contains("loss_mask") && e.contains("rlcr advantage"),
            "{e}"
        );
    }

    #[test]
    fn vocab_check() {
        let rows = vec![row(7)];
        assert!(check_vocab(&rows, 8, "t").is_ok());
        let e = check_vocab(&rows, 7, "t").expect_err("oov").to_string();
        assert!(e.contains("row 0") && e.contains("token id 7"), "{e}");
    }
}
