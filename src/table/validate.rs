//! Validation of input tables, with errors a person can act on.
//!
//! Two levels: [`check_schema`] looks at the schema once (missing column, wrong type), and a
//! [`Validator`] looks at rows while a stage streams batches (null where a value is required,
//! unknown `sample_type`, duplicate `sample_id`, list lengths that disagree with `response_ids`,
//! spans out of range, non-finite numbers, confidence rows whose answer is missing). Every message
//! names the file, the column and the first offending row (0-based over the whole file). Stages
//! validate before they write anything, so a bad input leaves no output.
//!
//! Memory: duplicate detection keeps a 128-bit hash per `sample_id` (16 bytes a row), not the
//! strings, so a 10M-row table costs about 160 MB at most.
use std::collections::HashSet;
use std::hash::{Hash, Hasher};

use anyhow::{bail, Result};
use arrow::array::{Array, RecordBatch};
use arrow::datatypes::Schema;

use super::cols;
use super::schema::TableSpec;

/// Check that `required` columns are present and that every column the spec knows has its type.
pub fn check_schema(
    file: &str,
    schema: &Schema,
    spec: &TableSpec,
    required: &[&str],
) -> Result<()> {
    for name in required {
        if schema.field_with_name(name).is_err() {
            let Some(c) = spec.column(name) else {
                bail!("internal error: `{name}` is not a column of {}", spec.name);
            };
            bail!(
                "{file}: column `{name}` is missing (expected {}: {}, written by `rlcr {}`)",
                c.ty.name(),
                c.doc,
                c.written_by
            );
        }
    }
    for f in schema.fields() {
        if let Some(c) = spec.column(f.name()) {
            if !c.ty.accepts(f.data_type()) {
                bail!(
                    "{file}: column `{}` has type {}, expected {}",
                    f.name(),
                    f.data_type(),
                    c.ty.name()
                );
            }
        }
    }
    Ok(())
}

fn h128(parts: &[&dyn HashPart]) -> u128 {
    let mut a = std::collections::hash_map::DefaultHasher::new();
    let mut b = std::collections::hash_map::DefaultHasher::new();
    0xA5u8.hash(&mut b);
    for p in parts {
        p.feed(&mut a);
        p.feed(&mut b);
    }
    ((a.finish() as u128) << 64) | b.finish() as u128
}

trait HashPart {
    fn feed(&self, h: &mut std::collections::hash_map::DefaultHasher);
}
impl HashPart for &str {
    fn feed(&self, h: &mut std::collections::hash_map::DefaultHasher) {
        self.hash(h);
    }
}
impl HashPart for i32 {
    fn feed(&self, h: &mut std::collections::hash_map::DefaultHasher) {
        self.hash(h);
    }
}

/// Row-level validation of a trajectory table while streaming.
pub struct Validator {
    file: String,
    spec: &'static TableSpec,
    row: usize,
    ids: HashSet<u128>,
    answers: HashSet<u128>,
    conf_refs: Vec<(u128, usize)>,
    check_ids: bool,
}

impl Validator {
    /// A validator for `file` against `spec`.
    pub fn new(file: &str, spec: &'static TableSpec) -> Self {
        Validator {
            file: file.to_string(),
            spec,
            row: 0,
            ids: HashSet::new(),
            answers: HashSet::new(),
            conf_refs: Vec::new(),
            check_ids: true,
        }
    }

    /// Skip duplicate / dangling-reference checks (e.g. for a shard that holds only some rows).
    pub fn without_id_checks(mut self) -> Self {
        self.check_ids = false;
        self
    }

    /// Check one batch; rows are numbered from the start of the file.
    pub fn check_batch(&mut self, b: &RecordBatch) -> Result<()> {
        let file = self.file.clone();
        let n = b.num_rows();
        // Nulls in non-nullable columns.
        for (f, c) in b.schema().fields().iter().zip(b.columns()) {
            if let Some(spec) = self.spec.column(f.name()) {
                if !spec.nullable && c.null_count() > 0 {
                    let r = (0..n).find(|&i| c.is_null(i)).unwrap_or(0);
                    bail!(
                        "{file}, row {}, column `{}`: null where a value is required",
                        self.row + r,
                        f.name()
                    );
                }
            }
        }
        // Non-finite numbers in scalar float columns that feed the math.
        for name in [
            "acc_reward",
            "reward",
            "advantage",
            "conf_reward",
            "confidence",
        ] {
            if let Ok(c) = cols::f32_col(b, &file, name) {
                if let Some(r) = (0..n).find(|&i| c.is_valid(i) && !c.value(i).is_finite()) {
                    bail!(
                        "{file}, row {}, column `{name}`: value {} is not a finite number",
                        self.row + r,
                        c.value(r)
                    );
                }
            }
        }
        // List lengths that must equal response_ids.
        if let Ok(resp) = cols::list_col(b, &file, "response_ids") {
            let offs = resp.value_offsets();
            let rlen = |i: usize| (offs[i + 1] - offs[i]) as usize;
            for name in [
                "response_logprobs",
                "token_advantages",
                "loss_mask",
                "ref_logprobs",
                "values",
                "returns",
                "token_turn_ids",
                "info_mask",
            ] {
                if let Ok(l) = cols::list_col(b, &file, name) {
                    let lo = l.value_offsets();
                    for i in 0..n {
                        if l.is_null(i) {
                            continue;
                        }
                        let ll = (lo[i + 1] - lo[i]) as usize;
                        if ll != rlen(i) {
                            bail!(
                                "{file}, row {}, column `{name}`: {ll} values but `response_ids` has {} tokens",
                                self.row + i,
                                rlen(i)
                            );
                        }
                    }
                }
            }
            for name in ["answer_span", "confidence_span"] {
                if b.column_by_name(name).is_some() {
                    let sp = cols::spans(b, &file, name)?;
                    for (i, s) in sp.iter().enumerate() {
                        if let Some((s0, s1)) = s {
                            if *s0 < 0 || s1 < s0 || *s1 as usize > rlen(i) {
                                bail!(
                                    "{file}, row {}, column `{name}`: span {{start: {s0}, end: {s1}}} is outside the response's {} tokens",
                                    self.row + i,
                                    rlen(i)
                                );
                            }
                        }
                    }
                }
            }
        }
        // sample_type values, ids, answer references.
        if let Ok(st) = cols::str_col(b, &file, "sample_type") {
            let conf_idx = cols::i32_col(b, &file, "confidence_idx").ok();
            for i in 0..n {
                let t = st.value(i);
                if t != "answer" && t != "confidence" {
                    bail!(
                        "{file}, row {}, column `sample_type`: unknown value {t:?} (expected \"answer\" or \"confidence\")",
                        self.row + i
                    );
                }
                if t == "confidence" {
                    if let Some(ci) = conf_idx {
                        if ci.is_null(i) {
                            bail!(
                                "{file}, row {}, column `confidence_idx`: null on a confidence row",
                                self.row + i
                            );
                        }
                    }
                }
            }
            if self.check_ids {
                let pid = cols::str_col(b, &file, "prompt_id").ok();
                let aidx = cols::i32_col(b, &file, "answer_idx").ok();
                if let (Some(pid), Some(aidx)) = (pid, aidx) {
                    for i in 0..n {
                        let key = h128(&[&pid.value(i), &aidx.value(i)]);
                        if st.value(i) == "answer" {
                            self.answers.insert(key);
                        } else {
                            self.conf_refs.push((key, self.row + i));
                        }
                    }
                }
            }
        }
        if self.check_ids {
            if let Ok(ids) = cols::str_col(b, &file, "sample_id") {
                for i in 0..n {
                    if !self.ids.insert(h128(&[&ids.value(i)])) {
                        bail!(
                            "{file}, row {}, column `sample_id`: duplicate sample_id {:?}",
                            self.row + i,
                            ids.value(i)
                        );
                    }
                }
            }
        }
        self.row += n;
        Ok(())
    }

    /// Rows checked so far.
    pub fn rows(&self) -> usize {
        self.row
    }

    /// Final checks that need the whole table (confidence rows without their answer).
    pub fn finish(self) -> Result<()> {
        for (key, row) in &self.conf_refs {
            if !self.answers.contains(key) {
                bail!(
                    "{}, row {row}, column `answer_idx`: confidence row whose answer (same prompt_id and answer_idx, sample_type \"answer\") is not in the table",
                    self.file
                );
            }
        }
        Ok(())
    }
}

/// Validate a whole table in memory (convenience for small inputs).
pub fn validate_batches(
    file: &str,
    spec: &'static TableSpec,
    required: &[&str],
    batches: &[RecordBatch],
    schema: &Schema,
) -> Result<()> {
    check_schema(file, schema, spec, required)?;
    let mut v = Validator::new(file, spec);
    for b in batches {
        v.check_batch(b)?;
    }
    v.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::cols::*;
    use crate::table::schema::TRAJECTORY;
    use arrow::array::{ArrayRef, Float32Array, Int32Array, StringArray};
    use arrow::datatypes::{DataType, Field};
    use std::sync::Arc;

    fn table(types: &[&str], ids: &[&str], aidx: &[i32], lp_lens: &[usize]) -> RecordBatch {
        let n = types.len();
        let schema = Arc::new(Schema::new(vec![
            Field::new("prompt_id", DataType::Utf8, false),
            Field::new("sample_type", DataType::Utf8, false),
            Field::new("answer_idx", DataType::Int32, false),
            Field::new("sample_id", DataType::Utf8, false),
            Field::new(
                "response_ids",
                crate::table::schema::ColType::ListInt32.arrow(),
                false,
            ),
            Field::new(
                "response_logprobs",
                crate::table::schema::ColType::ListFloat32.arrow(),
                false,
            ),
            Field::new("reward", DataType::Float32, false),
        ]));
        let cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec!["p"; n])),
            Arc::new(StringArray::from(types.to_vec())),
            Arc::new(Int32Array::from(aidx.to_vec())),
            Arc::new(StringArray::from(ids.to_vec())),
            build_list_i32((0..n).map(|_| vec![1, 2, 3])),
            build_list_f32(lp_lens.iter().map(|&l| vec![-0.5f32; l])),
            Arc::new(Float32Array::from(vec![1.0; n])),
        ];
        RecordBatch::try_new(schema, cols).unwrap()
    }

    fn check(b: &RecordBatch) -> Result<()> {
        validate_batches(
            "t.parquet",
            &TRAJECTORY,
            &["sample_id"],
            std::slice::from_ref(b),
            &b.schema(),
        )
    }

    #[test]
    fn good_table_passes() {
        let b = table(
            &["answer", "confidence"],
            &["p/a0", "p/a0/c0"],
            &[0, 0],
            &[3, 3],
        );
        check(&b).unwrap();
    }

    #[test]
    fn messages_name_file_row_column() {
        let b = table(&["answer", "answer"], &["p/a0", "p/a0"], &[0, 1], &[3, 3]);
        let e = check(&b).unwrap_err().to_string();
        assert_eq!(
            e,
            "t.parquet, row 1, column `sample_id`: duplicate sample_id \"p/a0\""
        );

        let b = table(
            &["answer", "confidence"],
            &["p/a0", "p/a1/c0"],
            &[0, 1],
            &[3, 3],
        );
        let e = check(&b).unwrap_err().to_string();
        assert!(
            e.starts_with("t.parquet, row 1, column `answer_idx`: confidence row whose answer"),
            "{e}"
        );

        let b = table(&["answer", "answer"], &["p/a0", "p/a1"], &[0, 1], &[3, 2]);
        let e = check(&b).unwrap_err().to_string();
        assert_eq!(e, "t.parquet, row 1, column `response_logprobs`: 2 values but `response_ids` has 3 tokens");

        let b = table(&["answer", "bogus"], &["p/a0", "p/a1"], &[0, 1], &[3, 3]);
        let e = check(&b).unwrap_err().to_string();
        assert!(
            e.contains("row 1, column `sample_type`: unknown value \"bogus\""),
            "{e}"
        );

        let b = table(&["answer"], &["p/a0"], &[0], &[3]);
        let e = validate_batches(
            "t.parquet",
            &TRAJECTORY,
            &["acc_reward"],
            std::slice::from_ref(&b),
            &b.schema(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("t.parquet: column `acc_reward` is missing"),
            "{e}"
        );
    }

    #[test]
    fn wrong_type_and_nulls_and_nan() {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "reward",
            DataType::Utf8,
            false,
        )]));
        let e = check_schema("x.parquet", &schema, &TRAJECTORY, &[])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "x.parquet: column `reward` has type Utf8, expected float32"
        );

        let schema = Arc::new(Schema::new(vec![Field::new(
            "reward",
            DataType::Float32,
            true,
        )]));
        let b = RecordBatch::try_new(
            schema,
            vec![Arc::new(Float32Array::from(vec![
                Some(1.0),
                None,
                Some(f32::NAN),
            ]))],
        )
        .unwrap();
        let e = validate_batches(
            "t.parquet",
            &TRAJECTORY,
            &[],
            std::slice::from_ref(&b),
            &b.schema(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "t.parquet, row 1, column `reward`: null where a value is required"
        );
        let schema = Arc::new(Schema::new(vec![Field::new(
            "reward",
            DataType::Float32,
            true,
        )]));
        let b = RecordBatch::try_new(
            schema,
            vec![Arc::new(Float32Array::from(vec![1.0, f32::INFINITY]))],
        )
        .unwrap();
        let e = validate_batches(
            "t.parquet",
            &TRAJECTORY,
            &[],
            std::slice::from_ref(&b),
            &b.schema(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "t.parquet, row 1, column `reward`: value inf is not a finite number"
        );
    }

    #[test]
    fn rows_count_across_batches_and_spans() {
        let b1 = table(&["answer"], &["p/a0"], &[0], &[3]);
        let b2 = table(&["answer"], &["p/a1"], &[1], &[3]);
        let b2 = set_columns(
            &b2,
            &TRAJECTORY,
            vec![("answer_span", build_spans(&[Some((1, 4))]))],
        )
        .unwrap();
        let mut v = Validator::new("t.parquet", &TRAJECTORY);
        v.check_batch(&b1).unwrap();
        let e = v.check_batch(&b2).unwrap_err().to_string();
        assert_eq!(e, "t.parquet, row 1, column `answer_span`: span {start: 1, end: 4} is outside the response's 3 tokens");
    }
}
