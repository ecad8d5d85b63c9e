//! The inputs of a forward call: token ids with a validity flag per slot ([`TokenBatch`]), and
//! (context, response) rows laid out for per-token log-probs ([`ResponseBatch`]).
//!
//! Rows are left-padded, so every row's last slot is a real token (what sampling needs) and
//! responses end at the last slot (what scoring needs); the transformer numbers real tokens from
//! 0 in every row and hides padding, so any padding pattern computes each row's own function.
use anyhow::{bail, ensure, Result};

/// Token ids of a batch with a validity flag per slot (`false` = padding).
///
/// Rows are usually left-padded (then every row's last slot is a real token, which is what
/// sampling needs), but any pattern of padding works: real tokens are numbered 0, 1, … in order
/// and padding is invisible to them.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBatch {
    pub batch: usize,
    pub len: usize,
    /// `batch · len` ids, row-major (padding slots hold any id, conventionally 0).
    pub ids: Vec<u32>,
    /// `batch · len` flags, `false` for padding.
    pub valid: Vec<bool>,
}

impl TokenBatch {
    /// A batch from explicit parts (lengths are checked).
    pub fn new(batch: usize, len: usize, ids: Vec<u32>, valid: Vec<bool>) -> Result<Self> {
        ensure!(
            ids.len() == batch * len && valid.len() == batch * len,
            "token batch: {} ids and {} flags for {batch}×{len} slots",
            ids.len(),
            valid.len()
        );
        Ok(TokenBatch {
            batch,
            len,
            ids,
            valid,
        })
    }

    /// Left-pad `rows` to the longest one.
    pub fn left_padded<R: AsRef<[u32]>>(rows: &[R]) -> Self {
        let len = rows.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(rows.len() * len);
        let mut valid = Vec::with_capacity(rows.len() * len);
        for r in rows {
            let r = r.as_ref();
            let pad = len - r.len();
            ids.extend(std::iter::repeat_n(0u32, pad));
            valid.extend(std::iter::repeat_n(false, pad));
            ids.extend_from_slice(r);
            valid.extend(std::iter::repeat_n(true, r.len()));
        }
        TokenBatch {
            batch: rows.len(),
            len,
            ids,
            valid,
        }
    }

    /// One token per row, all real (a decode step).
    pub fn step(ids: &[u32]) -> Self {
        TokenBatch {
            batch: ids.len(),
            len: 1,
            ids: ids.to_vec(),
            valid: vec![true; ids.len()],
        }
    }

    /// Every real token's id is below `vocab`, or an error naming the first that is not.
    pub(super) fn check_vocab(&self, vocab: usize) -> Result<()> {
        for (i, (&id, &ok)) in self.ids.iter().zip(&self.valid).enumerate() {
            if ok && id as usize >= vocab {
                bail!(
                    "token id {id} (row {}, position {}) is outside the model's vocabulary of \
                     {vocab}",
                    i / self.len.max(1),
                    i % self.len.max(1)
                );
            }
        }
        Ok(())
    }
}

/// Rows of (context, response) ids laid out for
/// [`Transformer::response_logprobs`](super::Transformer::response_logprobs): each
/// `context ++ response` left-padded to the longest, so responses end at the last slot.
#[derive(Debug, Clone)]
pub struct ResponseBatch {
    pub tokens: TokenBatch,
    /// Response length of every row.
    pub resp_lens: Vec<usize>,
    /// Longest response (R).
    pub max_resp: usize,
    /// `[B·R]` response ids right-aligned (padding 0), the targets of the R predicted slots.
    pub(super) targets_right: Vec<u32>,
}

impl ResponseBatch {
    /// Lay out `(context, response)` rows. Every row needs a non-empty context.
    pub fn new<C: AsRef<[u32]>, R: AsRef<[u32]>>(rows: &[(C, R)]) -> Result<Self> {
        let mut seqs = Vec::with_capacity(rows.len());
        let mut resp_lens = Vec::with_capacity(rows.len());
        for (i, (c, r)) in rows.iter().enumerate() {
            let (c, r) = (c.as_ref(), r.as_ref());
            ensure!(
                !c.is_empty(),
                "row {i}: empty context (the first response token has nothing to condition on)"
            );
            let mut s = Vec::with_capacity(c.len() + r.len());
            s.extend_from_slice(c);
            s.extend_from_slice(r);
            seqs.push(s);
            resp_lens.push(r.len());
        }
        let max_resp = resp_lens.iter().copied().max().unwrap_or(0);
        let mut targets_right = vec![0u32; rows.len() * max_resp];
        for (i, (_, r)) in rows.iter().enumerate() {
            let r = r.as_ref();
            let off = i * max_resp + (max_resp - r.len());
            targets_right[off..off + r.len()].copy_from_slice(r);
        }
        Ok(ResponseBatch {
            tokens: TokenBatch::left_padded(&seqs),
            resp_lens,
            max_resp,
            targets_right,
        })
    }

    /// `[B·R]` gather index turning right-aligned columns into left-aligned ones.
    pub(super) fn left_align_index(&self) -> Vec<i32> {
        let r = self.max_resp;
        let mut idx = Vec::with_capacity(self.resp_lens.len() * r);
        for &len in &self.resp_lens {
            let shift = r - len;
            for i in 0..r {
                idx.push((i + shift).min(r - 1) as i32);
            }
        }
        idx
    }

    /// `[B·R]` row-major mask of the left-aligned output: true for real response tokens.
    pub fn mask(&self) -> Vec<bool> {
        let r = self.max_resp;
        let mut m = Vec::with_capacity(self.resp_lens.len() * r);
        for &len in &self.resp_lens {
            m.extend((0..r).map(|i| i < len));
        }
        m
    }

    /// Split a left-aligned `[B·R]` host buffer into one vector per row.
    pub fn split_rows(&self, flat: &[f32]) -> Vec<Vec<f32>> {
        let r = self.max_resp;
        self.resp_lens
            .iter()
            .enumerate()
            .map(|(i, &len)| flat[i * r..i * r + len].to_vec())
            .collect()
    }
}
