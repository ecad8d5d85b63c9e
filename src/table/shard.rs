//! `--shard I/N`: split a stage's work across machines, disjoint by `prompt_id`.
//!
//! A row belongs to shard `fnv1a64(prompt_id) mod N`. The hash is fixed (FNV-1a, 64 bit) so every
//! machine and every version agrees, and whole prompts go to one shard, so the groups the advantage
//! estimators normalise over (all answers of a prompt, all confidences of an answer) never split.
//! The union of the N shard outputs holds exactly the rows of the unsharded output; stages accept
//! a folder of part files as input, so the parts need no merge step.
//!
//! Stages with `--shard`: generate-answers and generate-confidence (skip the other prompts before
//! sampling), logprobs and probe (skip the other rows), score (copies the shard's rows to a temp
//! file beside the output, then scores it like a whole table). Each records the shard in its
//! output's `rlcr.config` as `"shard": {"index": I, "count": N}` (null when unsharded).
use std::str::FromStr;

use anyhow::{bail, Context};
use arrow::array::{BooleanArray, RecordBatch};

/// Shard `index` of `count` (0-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// Whether the prompt belongs to this shard.
    pub fn contains(&self, prompt_id: &str) -> bool {
        self.count <= 1 || fnv1a64(prompt_id.as_bytes()) % self.count as u64 == self.index as u64
    }
}

impl Shard {
    /// The rows of `batch` whose `prompt_id` belongs to this shard, in order. `first_row` is the
    /// batch's first row in the table (for errors, which name `table`, the row and the column).
    pub fn filter(
        &self,
        batch: &RecordBatch,
        table: &str,
        first_row: usize,
    ) -> anyhow::Result<RecordBatch> {
        let keep = self.selection(batch, table, first_row)?;
        Ok(arrow::compute::filter_record_batch(batch, &keep)?)
    }

    /// Which rows of `batch` belong to this shard (the mask [`Shard::filter`] applies).
    pub fn selection(
        &self,
        batch: &RecordBatch,
        table: &str,
        first_row: usize,
    ) -> anyhow::Result<BooleanArray> {
        let pid = super::cols::str_col(batch, table, "prompt_id")
            .with_context(|| "--shard splits rows by `prompt_id`".to_string())?;
        let mut keep = Vec::with_capacity(batch.num_rows());
        for i in 0..batch.num_rows() {
            if pid.is_null(i) {
                bail!(
                    "{table}, row {}, column `prompt_id`: null (--shard splits rows by prompt_id)",
                    first_row + i
                );
            }
            keep.push(self.contains(pid.value(i)));
        }
        Ok(BooleanArray::from(keep))
    }
}

impl FromStr for Shard {
    type Err = anyhow::Error;

    /// Parse `I/N` with `0 <= I < N`.
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let (i, n) = s
            .split_once('/')
            .with_context(|| format!("--shard {s:?}: expected I/N, e.g. 0/4"))?;
        let index: u32 = i
            .trim()
            .parse()
            .with_context(|| format!("--shard {s:?}: I is not a number"))?;
        let count: u32 = n
            .trim()
            .parse()
            .with_context(|| format!("--shard {s:?}: N is not a number"))?;
        if count == 0 || index >= count {
            bail!("--shard {s:?}: need 0 <= I < N");
        }
        Ok(Shard { index, count })
    }
}

use crate::hash::fnv1a64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_keeps_the_shard_rows_in_order() {
        use arrow::array::{ArrayRef, Int32Array, StringArray};
        use std::sync::Arc;
        let ids: Vec<String> = (0..40).map(|k| format!("p{}", k / 4)).collect();
        let batch = |prompt_id: ArrayRef, k: ArrayRef| {
            RecordBatch::try_from_iter_with_nullable([
                ("prompt_id", prompt_id, true),
                ("k", k, false),
            ])
            .unwrap()
        };
        let b = batch(
            Arc::new(StringArray::from(ids.clone())),
            Arc::new(Int32Array::from((0..40).collect::<Vec<i32>>())),
        );
        let mut seen = Vec::new();
        for i in 0..3 {
            let s = Shard { index: i, count: 3 };
            let f = s.filter(&b, "t", 0).unwrap();
            let k = f.column(1).as_any().downcast_ref::<Int32Array>().unwrap();
            let k: Vec<i32> = k.values().to_vec();
            assert!(k.windows(2).all(|w| w[0] < w[1]), "order kept");
            // whole prompts: 4 rows each
            assert_eq!(k.len() % 4, 0);
            for &r in &k {
                assert!(s.contains(&ids[r as usize]));
            }
            seen.extend(k);
        }
        seen.sort();
        assert_eq!(seen, (0..40).collect::<Vec<i32>>());
        // a null prompt_id is an error naming the row
        let b = batch(
            Arc::new(StringArray::from(vec![Some("a"), None])),
            Arc::new(Int32Array::from(vec![0, 1])),
        );
        let e = Shard { index: 0, count: 2 }
            .filter(&b, "t.parquet", 10)
            .unwrap_err();
        assert!(format!("{e:#}").contains("t.parquet, row 11"), "{e:#}");
    }

    #[test]
    fn shards_partition_ids() {
        let shards: Vec<Shard> = (0..3).map(|i| format!("{i}/3").parse().unwrap()).collect();
        for k in 0..1000 {
            let id = format!("prompt-{k}");
            assert_eq!(shards.iter().filter(|s| s.contains(&id)).count(), 1);
        }
        assert!("3/3".parse::<Shard>().is_err());
        assert!("x/3".parse::<Shard>().is_err());
        assert!("1".parse::<Shard>().is_err());
        assert!("0/0".parse::<Shard>().is_err());
    }
}
