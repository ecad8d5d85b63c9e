//! Validation of input tables, with errors a person can act on.
//!
//! Two levels: [`check_schema`] looks at the schema once (missing column, wrong type), and a
//! [`Validator`] looks at rows while a stage streams batches (null where a value is required,
//! unknown `sample_type`, duplicate `sample_id`, list lengths that disagree with `response_ids`,
//! spans out of range, non-finite numbers, confidence rows whose answer is missing). Every message
//! names the file, the column and the first offending row (0-based over the whole file). Stages
//! validate before they write anything, so a bad input leaves no output.
//!
//! Memory: duplicate detection keeps 16 bytes a row (a 96-bit digest of the `sample_id` and the
//! row number, checked when the table is finished), not the strings, so a 10M-row table costs
//! about 160 MB; answers cost a word per prompt.
use std::collections::HashSet;

use anyhow::{bail, Result};
use arrow::array::{Array, RecordBatch};
use arrow::datatypes::Schema;

use super::cols::{self, StrCol};
use super::schema::{SampleType, TableSpec};

mod ids;
use ids::{h128, row_id_key, IdLog, Prehashed};

/// Check that `required` columns are present and that every column the spec knows has its type
/// (as a [`super::Reader`] yields it: the types other writers choose where the values fit are
/// converted on read, [`super::coerce`]). Every missing column and every mismatch of the table is
/// reported in one error, one per line after the first when there are several.
pub fn check_schema(
    file: &str,
    schema: &Schema,
    spec: &TableSpec,
    required: &[&str],
) -> Result<()> {
    let mut problems: Vec<String> = Vec::new();
    for name in required {
        if schema.field_with_name(name).is_err() {
            let Some(c) = spec.column(name) else {
                bail!("internal error: `{name}` is not a column of {}", spec.name);
            };
            problems.push(format!(
                "column `{name}` is missing (expected {}: {}, written by `rlcr {}`)",
                c.ty.name(),
                c.doc,
                c.written_by
            ));
        }
    }
    for f in schema.fields() {
        if let Some(c) = spec.column(f.name()) {
            if !c.ty.accepts(f.data_type()) {
                problems.push(format!(
                    "column `{}` has type {}, expected {}",
                    f.name(),
                    f.data_type(),
                    c.ty.name()
                ));
            }
        }
    }
    match problems.as_slice() {
        [] => Ok(()),
        [one] => bail!("{file}: {one}"),
        many => bail!(
            "{file}: {} columns do not match the {} schema:\n  {}",
            many.len(),
            spec.name,
            many.join("\n  ")
        ),
    }
}

/// The columns the row rules read: identities, links, token lists and spans. A stage that reads
/// only some columns for its own work reads these (those present) for validation.
pub const RULE_COLUMNS: [&str; 16] = concat(&[
    &[
        "sample_id",
        "sample_type",
        "prompt_id",
        "answer_idx",
        "confidence_idx",
        "response_ids",
    ],
    &PER_TOKEN,
    &["answer_span", "confidence_span"],
]);

/// List columns that hold one value per response token.
pub const PER_TOKEN: [&str; 8] = [
    "response_logprobs",
    "token_advantages",
    "loss_mask",
    "ref_logprobs",
    "values",
    "returns",
    "token_turn_ids",
    "info_mask",
];

/// The names of `parts` one after the other, in a list of their total length `N` (checked when
/// the constant is evaluated).
const fn concat<const N: usize>(parts: &[&[&'static str]]) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut n, mut p) = (0, 0);
    while p < parts.len() {
        let mut i = 0;
        while i < parts[p].len() {
            out[n] = parts[p][i];
            n += 1;
            i += 1;
        }
        p += 1;
    }
    assert!(n == N, "the parts' lengths do not add up to N");
    out
}

/// Column `name` of `b` as a `T`, if it is there and of that type (no error built when not: the
/// row rules ask for columns a table may not have, on every batch).
fn typed<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> Option<&'a T> {
    b.column_by_name(name)?.as_any().downcast_ref::<T>()
}

/// A list column's name, its rows' lengths and (for a nullable list) which rows are null: what
/// [`Validator::check_lengths`] needs of a list instead of its values.
pub type ListLens<'a> = (&'a str, &'a [u32], Option<&'a [bool]>);

/// Row lengths (and null rows) of a decoded list column.
struct ListLengths {
    len: Vec<u32>,
    null: Option<Vec<bool>>,
}

impl ListLengths {
    fn of(l: &arrow::array::ListArray) -> Self {
        let len = l
            .value_offsets()
            .windows(2)
            .map(|w| (w[1] - w[0]) as u32)
            .collect();
        let null = (l.null_count() > 0).then(|| (0..l.len()).map(|i| l.is_null(i)).collect());
        ListLengths { len, null }
    }
}

/// What the cross-row rules learned about a table: the answer<->confidence links.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Links {
    /// Answer rows.
    pub answers: u64,
    /// Confidence rows (each has its answer: [`Validator::finish`] checked).
    pub confidences: u64,
    /// Some confidence row comes before its answer row (a stage streaming answers first must
    /// look ahead).
    pub forward: bool,
}

/// The key linking a confidence row to its answer: 128 bits of two SipHash digests of
/// `(prompt_id, answer_idx)` (collisions are out of reach at any table size). The one linker:
/// every stage that pairs confidences with answers uses this key.
pub fn answer_key(prompt_id: &str, answer_idx: i32) -> u128 {
    h128(&[&prompt_id, &answer_idx])
}

/// Row-level validation of a table while streaming: the one validator of every stage that reads
/// a trajectory table.
///
/// Two halves, callable apart when a stage reads a table in two passes:
/// - [`Validator::check_rows`]: rules of one row (nulls, non-finite numbers, unknown
///   `sample_type`, list lengths against `response_ids`, spans in range) on whatever columns the
///   batch holds;
/// - [`Validator::check_links`]: rules across rows (unique `sample_id`, one answer row per
///   `(prompt_id, answer_idx)`, confidence rows with their answer), finished by
///   [`Validator::finish`].
///
/// [`Validator::check_batch`] does both.
pub struct Validator {
    file: String,
    spec: &'static TableSpec,
    row: usize,
    ids: IdLog,
    /// The identity digests of the current prompt's rows (a run of rows of one prompt).
    prompt_ids: PromptIds,
    answers: AnswerSet,
    conf_refs: Vec<(u32, usize, i32)>,
    links: Links,
}

/// The identity digests of the current prompt's rows (rows of one prompt come together), in an
/// open-addressed table emptied for each prompt by a generation count: a repeat is found in a
/// probe or two however many rows the prompt has (was: a scan of the prompt's earlier digests for
/// every row, quadratic in the prompt's size).
#[derive(Default)]
struct PromptIds {
    /// The prompt whose digests the table holds.
    prompt: Option<u32>,
    /// The current generation (≥ 1 once a prompt was entered); a slot of another one is empty.
    generation: u32,
    /// `(generation, digest)`; a power of two long, at most half full.
    slots: Vec<(u32, u128)>,
    /// Digests of the current generation.
    len: usize,
}

impl PromptIds {
    /// Make prompt `p` the current one (emptying the table) unless it is already.
    #[inline]
    fn enter(&mut self, p: u32) {
        if self.prompt == Some(p) {
            return;
        }
        self.prompt = Some(p);
        self.len = 0;
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            // after 2^32 prompts: forget every older generation for real
            self.slots.fill((0, 0));
            self.generation = 1;
        }
    }
    /// Add `key` to the current prompt's digests; false if it is there already.
    #[inline]
    fn insert(&mut self, key: u128) -> bool {
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        // the digests' high bits are mixed (short ids: a bijection; long ones: chained words)
        let mut at = (key >> 64) as usize & mask;
        loop {
            let (g, k) = self.slots[at];
            if g != self.generation {
                self.slots[at] = (self.generation, key);
                self.len += 1;
                return true;
            }
            if k == key {
                return false;
            }
            at = (at + 1) & mask;
        }
    }
    /// Double the table (64 slots at first), keeping the current generation's digests.
    fn grow(&mut self) {
        let cap = (2 * self.slots.len()).max(64);
        let old = std::mem::replace(&mut self.slots, vec![(0, 0); cap]);
        self.len = 0;
        for (g, k) in old {
            if g == self.generation {
                self.insert(k);
            }
        }
    }
}

/// The answer rows seen so far, keyed by `(prompt, answer_idx)` where `prompt` numbers the
/// distinct `prompt_id`s. A table holds the rows of one prompt together, so the prompt_id is
/// compared with the previous row's (a `memcmp`) and only hashed when it changes; the
/// `answer_idx` of a prompt's answers are small, so they are bits of one word per prompt.
/// (Was: a 128-bit hash of `(prompt_id, answer_idx)` per row into a hash set; on a 10M-row table
/// that was seconds of hashing and ~270 MB of set.)
#[derive(Default)]
struct AnswerSet {
    /// `answer_key(prompt_id, -1)` → prompt number.
    prompts: std::collections::HashMap<u128, u32, std::hash::BuildHasherDefault<Prehashed>>,
    /// The prompt_id of the previous row and its number.
    last: Option<(Vec<u8>, u32)>,
    /// Per prompt: bit `a` set when the answer row with `answer_idx` a (0..64) was seen.
    bits: Vec<u64>,
    /// Answers whose `answer_idx` is outside 0..64: `(prompt, answer_idx)`.
    wide: HashSet<(u32, i32)>,
}

impl AnswerSet {
    /// The number of `prompt_id`.
    #[inline]
    fn prompt(&mut self, pid: &[u8]) -> u32 {
        if let Some((s, p)) = &self.last {
            if s.as_slice() == pid {
                return *p;
            }
        }
        let next = self.prompts.len() as u32;
        let p = *self.prompts.entry(h128(&[&pid, &-1])).or_insert(next);
        if p == next {
            self.bits.push(0);
        }
        match &mut self.last {
            Some((s, q)) => {
                s.clear();
                s.extend_from_slice(pid);
                *q = p;
            }
            None => self.last = Some((pid.to_vec(), p)),
        }
        p
    }
    /// Record an answer; false if it was there already.
    #[inline]
    fn insert(&mut self, p: u32, a: i32) -> bool {
        if (0..64).contains(&a) {
            let w = &mut self.bits[p as usize];
            let b = 1u64 << a;
            let fresh = *w & b == 0;
            *w |= b;
            fresh
        } else {
            self.wide.insert((p, a))
        }
    }
    #[inline]
    fn contains(&self, p: u32, a: i32) -> bool {
        if (0..64).contains(&a) {
            self.bits[p as usize] & (1u64 << a) != 0
        } else {
            self.wide.contains(&(p, a))
        }
    }
}

impl Validator {
    /// A validator for `file` against `spec`.
    pub fn new(file: &str, spec: &'static TableSpec) -> Self {
        Validator {
            file: file.to_string(),
            spec,
            row: 0,
            ids: IdLog::new(),
            prompt_ids: PromptIds::default(),
            answers: AnswerSet::default(),
            conf_refs: Vec::new(),
            links: Links::default(),
        }
    }

    /// Make room for the identities of `rows` rows up front (the id set then never grows by
    /// rehashing: on a 10M-row table that is most of its cost).
    pub fn reserve(&mut self, rows: usize) {
        self.ids.reserve(rows);
    }

    /// Check one batch (both halves); rows are numbered from the start of the table.
    pub fn check_batch(&mut self, b: &RecordBatch) -> Result<()> {
        self.check_rows(b, self.row)?;
        self.check_links(b)
    }

    /// The rules of single rows, on the columns `b` holds; its first row is row `first` of the
    /// table.
    pub fn check_rows(&self, b: &RecordBatch, first: usize) -> Result<()> {
        let file = self.file.as_str();
        let n = b.num_rows();
        // Nulls in non-nullable columns.
        for (f, c) in b.schema().fields().iter().zip(b.columns()) {
            if let Some(spec) = self.spec.column(f.name()) {
                if !spec.nullable && c.null_count() > 0 {
                    let r = (0..n).find(|&i| c.is_null(i)).unwrap_or(0);
                    bail!(
                        "{file}, row {}, column `{}`: null where a value is required",
                        first + r,
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
            if let Some(c) = typed::<arrow::array::Float32Array>(b, name) {
                if let Some(r) = (0..n).find(|&i| c.is_valid(i) && !c.value(i).is_finite()) {
                    bail!(
                        "{file}, row {}, column `{name}`: value {} is not a finite number",
                        first + r,
                        c.value(r)
                    );
                }
            }
        }
        // List lengths that must equal response_ids, spans inside the response.
        if let Some(resp) = typed::<arrow::array::ListArray>(b, "response_ids") {
            let resp = ListLengths::of(resp);
            let others: Vec<(&str, ListLengths)> = PER_TOKEN
                .iter()
                .filter_map(|&name| Some((name, ListLengths::of(typed(b, name)?))))
                .collect();
            let others: Vec<ListLens> = others
                .iter()
                .map(|(name, l)| (*name, l.len.as_slice(), l.null.as_deref()))
                .collect();
            self.check_lengths(b, first, (&resp.len, resp.null.as_deref()), &others)?;
        }
        // sample_type values; confidence rows carry their index.
        if let Some(st) = StrCol::try_of(b, "sample_type") {
            let conf_idx = typed::<arrow::array::Int32Array>(b, "confidence_idx");
            for i in 0..n {
                let t = match SampleType::from_bytes(st.bytes(i)) {
                    Some(t) => t,
                    None => {
                        let e = st.value(i).parse::<SampleType>().err();
                        let e = e.map(|e| e.to_string()).unwrap_or_default();
                        bail!("{file}, row {}, column `sample_type`: {e}", first + i)
                    }
                };
                if t == SampleType::Confidence {
                    if let Some(ci) = conf_idx {
                        if ci.is_null(i) {
                            bail!(
                                "{file}, row {}, column `confidence_idx`: null on a confidence row",
                                first + i
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The list rules with the lists' row lengths given instead of decoded (`score` reads them
    /// from the Parquet levels, [`super::levels`]): every list in `others` (name, lengths, null
    /// rows) as long as `response_ids` (`resp`), and the spans of `b` inside the response. `b`'s
    /// first row is row `first` of the table.
    pub fn check_lengths(
        &self,
        b: &RecordBatch,
        first: usize,
        resp: (&[u32], Option<&[bool]>),
        others: &[ListLens],
    ) -> Result<()> {
        let file = self.file.as_str();
        let (resp, resp_null) = resp;
        let all = std::iter::once(("response_ids", resp, resp_null)).chain(others.iter().copied());
        for (name, _, null) in all {
            let Some(r) = null.and_then(|nl| nl.iter().position(|&x| x)) else {
                continue;
            };
            if self.spec.column(name).is_some_and(|c| !c.nullable) {
                bail!(
                    "{file}, row {}, column `{name}`: null where a value is required",
                    first + r
                );
            }
        }
        for &(name, len, null) in others {
            // Equal lengths everywhere (one memcmp) is the common case.
            if len == resp {
                continue;
            }
            for i in 0..resp.len().min(len.len()) {
                if null.is_some_and(|nl| nl[i]) {
                    continue;
                }
                if len[i] != resp[i] {
                    bail!(
                        "{file}, row {}, column `{name}`: {} values but `response_ids` has {} tokens",
                        first + i,
                        len[i],
                        resp[i]
                    );
                }
            }
        }
        for name in ["answer_span", "confidence_span"] {
            if b.column_by_name(name).is_some() {
                let (sp, start, end) = cols::span_parts(b, file, name)?;
                for (i, &tokens) in resp.iter().enumerate().take(sp.len()) {
                    if sp.is_null(i) || start.is_null(i) || end.is_null(i) {
                        continue;
                    }
                    let (s0, s1) = (start.value(i), end.value(i));
                    if s0 < 0 || s1 < s0 || s1 as usize > tokens as usize {
                        bail!(
                            "{file}, row {}, column `{name}`: span {{start: {s0}, end: {s1}}} is outside the response's {tokens} tokens",
                            first + i
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// The rules across rows (the next `b.num_rows()` rows of the table, in order): unique
    /// `sample_id`, one answer row per `(prompt_id, answer_idx)`, and the links of confidence
    /// rows (checked in [`Validator::finish`]). `sample_type` values must have passed
    /// [`Validator::check_rows`].
    pub fn check_links(&mut self, b: &RecordBatch) -> Result<()> {
        let file = self.file.as_str();
        let n = b.num_rows();
        // the prompt number of every row, when the batch has the ids
        let mut prompt_of: Vec<u32> = Vec::new();
        if let Some(st) = StrCol::try_of(b, "sample_type") {
            let pid = StrCol::try_of(b, "prompt_id");
            let aidx = b
                .column_by_name("answer_idx")
                .and_then(|c| c.as_any().downcast_ref::<arrow::array::Int32Array>());
            if let (Some(pid), Some(aidx)) = (pid, aidx) {
                let aidx = aidx.values();
                // once per distinct value of a dictionary (all of them, in rlcr's own reads)
                let answer =
                    st.map_values(n, |t| SampleType::from_bytes(t) == Some(SampleType::Answer));
                prompt_of.reserve(n);
                let mut p = 0;
                for i in 0..n {
                    // rows of one prompt come together: equal dictionary keys need no lookup
                    if i == 0 || !pid.same_key_as_previous(i) {
                        p = self.answers.prompt(pid.bytes(i));
                    }
                    prompt_of.push(p);
                    let a = aidx[i];
                    if answer[i] {
                        self.links.answers += 1;
                        if !self.answers.insert(p, a) {
                            bail!(
                                "{file}, row {}, column `answer_idx`: a second answer row for prompt_id {:?}, answer_idx {}",
                                self.row + i,
                                pid.value(i),
                                a
                            );
                        }
                    } else {
                        self.links.confidences += 1;
                        // Only a confidence row whose answer has not been seen yet is kept for
                        // `finish` (tables written by generate-confidence have none).
                        if !self.answers.contains(p, a) {
                            self.links.forward = true;
                            self.conf_refs.push((p, self.row + i, a));
                        }
                    }
                }
            }
        }
        if let Some(ids) = StrCol::try_of(b, "sample_id") {
            if n > 0 && u32::try_from(self.row + n - 1).is_err() {
                bail!("tables of more than {} rows are not supported", u32::MAX);
            }
            for i in 0..n {
                let key = row_id_key(&ids, i);
                // A repeat within the rows of one prompt (a confidence row carrying its answer's
                // id) is found here, with its value; any other repeat when the table is finished.
                if let Some(&p) = prompt_of.get(i) {
                    self.prompt_ids.enter(p);
                    if !self.prompt_ids.insert(key) {
                        bail!(
                            "{file}, row {}, column `sample_id`: duplicate sample_id {:?}",
                            self.row + i,
                            ids.value(i)
                        );
                    }
                }
                self.ids.push(key, (self.row + i) as u32);
            }
        }
        self.row += n;
        Ok(())
    }

    /// Rows checked so far.
    pub fn rows(&self) -> usize {
        self.row
    }

    /// Final checks that need the whole table (confidence rows without their answer); the links.
    pub fn finish(mut self) -> Result<Links> {
        let orphan = self
            .conf_refs
            .iter()
            .find(|&&(p, _, aidx)| !self.answers.contains(p, aidx))
            .copied();
        let dup = self.ids.first_duplicate();
        // the first offending row in table order
        match (orphan, dup) {
            (Some((_, row, aidx)), d) if d.is_none_or(|(r, _)| row < r) => bail!(
                "{}, row {row}, column `answer_idx`: confidence row whose answer (same prompt_id, answer_idx {aidx}, sample_type \"answer\") is not in the table",
                self.file
            ),
            (_, Some((row, earlier))) => bail!(
                "{}, row {row}, column `sample_id`: duplicate sample_id (row {earlier} has the same)",
                self.file
            ),
            _ => Ok(self.links),
        }
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
    v.finish().map(|_| ())
}

#[cfg(test)]
mod tests;
