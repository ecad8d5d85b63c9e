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
use std::hash::Hasher;

use anyhow::{bail, Result};
use arrow::array::{Array, RecordBatch};
use arrow::datatypes::Schema;

use super::cols::{self, StrCol};
use super::schema::{SampleType, TableSpec};

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

/// A 128-bit digest of `parts`: two independent 64-bit folded-multiply streams over the bytes,
/// eight at a time (a few nanoseconds for a typical id, where two SipHash passes cost ten times
/// that on a 10M-row table). Only compared in memory, never written; the length of each part goes
/// into the stream, so `("ab", "c")` and `("a", "bc")` differ.
fn h128(parts: &[&dyn HashPart]) -> u128 {
    let mut h = H128::new();
    for p in parts {
        p.feed(&mut h);
    }
    h.finish()
}

#[inline]
fn fold(x: u64, k: u64) -> u64 {
    let m = x as u128 * k as u128;
    (m as u64) ^ ((m >> 64) as u64)
}

struct H128 {
    a: u64,
    b: u64,
}

impl H128 {
    fn new() -> Self {
        H128 {
            a: 0x243F_6A88_85A3_08D3,
            b: 0x1319_8A2E_0370_7344,
        }
    }
    #[inline]
    fn word(&mut self, w: u64) {
        self.a = fold(self.a ^ w, 0x9E37_79B9_7F4A_7C15).wrapping_add(0xA409_3822_299F_31D0);
        self.b = fold(self.b ^ w.rotate_left(29), 0xC2B2_AE3D_27D4_EB4F)
            .wrapping_add(0x082E_FA98_EC4E_6C89);
    }
    fn bytes(&mut self, s: &[u8]) {
        let mut chunks = s.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.word(u64::from_le_bytes(w));
        }
        let r = chunks.remainder();
        let mut w = [0u8; 8];
        w[..r.len()].copy_from_slice(r);
        self.word(u64::from_le_bytes(w));
        self.word(s.len() as u64);
    }
    fn finish(&self) -> u128 {
        let a = fold(self.a, 0xFF51_AFD7_ED55_8CCD);
        let b = fold(self.b, 0xC4CE_B9FE_1A85_EC53);
        ((a as u128) << 64) | b as u128
    }
}

/// The identity digest of a `sample_id` (one per row of every table), about 15 instructions per
/// 16 bytes of id where the two-stream [`H128`] costs ~120 for a typical id. The id is cut into
/// 128-bit words: the first packed as Arrow packs a short string in a view (its length in the low
/// 32 bits, its first 12 bytes above, zeros after), then 16 bytes a word, the last one the id's
/// last 16 bytes (zero-padded when shorter); distinct ids give distinct word sequences. The first word goes through [`short_key`], a
/// bijection, and each next word is xored in and mixed again: so ids of up to 12 bytes (most are:
/// `prompt/a0/c1`) never share a digest, and longer ones do with chance ~2^-128 a pair. [`IdLog`]
/// keeps the top 96 bits.
#[inline]
fn id_key(id: &[u8]) -> u128 {
    let n = id.len();
    let mut w = [0u8; 16];
    w[..4].copy_from_slice(&(n as u32).to_le_bytes());
    if n <= 12 {
        w[4..4 + n].copy_from_slice(id);
        return short_key(u128::from_le_bytes(w));
    }
    w[4..].copy_from_slice(&id[..12]);
    let mut h = short_key(u128::from_le_bytes(w));
    let mut words = id[12..].chunks_exact(16);
    for c in &mut words {
        let mut w = [0u8; 16];
        w.copy_from_slice(c);
        h = short_key(h ^ u128::from_le_bytes(w));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        // the last 16 bytes of the id (overlapping bytes already taken: for one length, still a
        // function of every byte), or the rest zero-padded when the id is shorter than 16
        let mut w = [0u8; 16];
        if n >= 16 {
            w.copy_from_slice(&id[n - 16..]);
        } else {
            w[..rest.len()].copy_from_slice(rest);
        }
        h = short_key(h ^ u128::from_le_bytes(w));
    }
    h
}

/// [`id_key`] of the string an Arrow string view holds: the view itself is the first word when
/// the string is inline (up to 12 bytes; the bytes past its length masked, whatever a writer left
/// there); a longer string is read from its data buffer.
#[inline]
fn view_key(a: &arrow::array::StringViewArray, i: usize) -> u128 {
    let v = a.views()[i];
    let len = v as u32;
    if len <= 12 {
        let bits = 32 + 8 * len;
        let mask = if bits == 128 {
            u128::MAX
        } else {
            (1u128 << bits) - 1
        };
        short_key(v & mask)
    } else {
        // the view's buffer index and offset (arrow's `value` checks more, per call)
        let (buf, off) = ((v >> 64) as u32 as usize, (v >> 96) as u32 as usize);
        let bytes = a
            .data_buffers()
            .get(buf)
            .and_then(|b| b.as_slice().get(off..off + len as usize));
        id_key(bytes.unwrap_or_else(|| a.value(i).as_bytes()))
    }
}

/// A bijection on 128 bits that spreads every input bit over the whole word: four Feistel rounds
/// over the two 64-bit halves, each round function one folded 64x64->128 multiply. Bijective
/// whatever the round function, so distinct inputs always give distinct outputs.
#[inline]
fn short_key(x: u128) -> u128 {
    let (mut lo, mut hi) = (x as u64, (x >> 64) as u64);
    hi ^= fold(lo ^ 0xA409_3822_299F_31D0, 0x9E37_79B9_7F4A_7C15);
    lo ^= fold(hi ^ 0x082E_FA98_EC4E_6C89, 0xC2B2_AE3D_27D4_EB4F);
    hi ^= fold(lo ^ 0x4528_21E6_38D0_1377, 0xFF51_AFD7_ED55_8CCD);
    lo ^= fold(hi ^ 0xBE54_66CF_34E9_0C6C, 0xC4CE_B9FE_1A85_EC53);
    ((hi as u128) << 64) | lo as u128
}

trait HashPart {
    fn feed(&self, h: &mut H128);
}
impl HashPart for &str {
    fn feed(&self, h: &mut H128) {
        h.bytes(self.as_bytes());
    }
}
impl HashPart for &[u8] {
    fn feed(&self, h: &mut H128) {
        h.bytes(self);
    }
}
impl HashPart for i32 {
    fn feed(&self, h: &mut H128) {
        h.word(*self as u32 as u64 | 1 << 40);
    }
}

/// The columns the row rules read: identities, links, token lists and spans. A stage that reads
/// only some columns for its own work reads these (those present) for validation.
pub const RULE_COLUMNS: [&str; 16] = [
    "sample_id",
    "sample_type",
    "prompt_id",
    "answer_idx",
    "confidence_idx",
    "response_ids",
    "response_logprobs",
    "token_advantages",
    "loss_mask",
    "ref_logprobs",
    "values",
    "returns",
    "token_turn_ids",
    "info_mask",
    "answer_span",
    "confidence_span",
];

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

/// [`id_key`] of row `i` of a text column (string views: from the view itself).
#[inline]
fn row_id_key(ids: &StrCol, i: usize) -> u128 {
    match ids.views() {
        Some(a) => view_key(a, i),
        None => id_key(ids.bytes(i)),
    }
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

/// A hasher for keys that already are 128-bit hashes: their low 64 bits, untouched.
#[derive(Default, Clone, Copy)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u128(&mut self, i: u128) {
        self.0 = i as u64;
    }
}

/// The identities seen, for the duplicate check: per row, the top 96 bits of the `sample_id`'s
/// digest and the row number (`digest | row` in one `u128`), in 4096 buckets by the digest's top
/// 12 bits; each bucket is walked once in [`IdLog::first_duplicate`]. Appending is sequential
/// (4096 write streams stay in cache) where a hash set's inserts are random accesses into a table
/// of the whole input (on a 1M-row table that was half of the validator's time); a 96-bit digest
/// keeps collisions out of reach (≈ n² / 2⁹⁷).
struct IdLog {
    buckets: Vec<Vec<u128>>,
}

const ID_BUCKET_BITS: u32 = 12;
const ROW_BITS: u32 = 32;

impl IdLog {
    fn new() -> Self {
        IdLog {
            buckets: (0..1 << ID_BUCKET_BITS).map(|_| Vec::new()).collect(),
        }
    }

    fn reserve(&mut self, rows: usize) {
        let per = rows / self.buckets.len() + rows / self.buckets.len() / 8 + 8;
        for b in &mut self.buckets {
            b.reserve(per);
        }
    }

    /// Log row `row`'s digest (rows beyond `u32::MAX` are refused before).
    #[inline]
    fn push(&mut self, digest: u128, row: u32) {
        let bucket = (digest >> (128 - ID_BUCKET_BITS)) as usize;
        self.buckets[bucket].push((digest >> ROW_BITS << ROW_BITS) | row as u128);
    }

    /// The first row (in table order) whose identity an earlier row has, and that earlier row
    /// (its first occurrence).
    ///
    /// A bucket holds its rows in table order (rows are pushed in order), so each bucket is
    /// walked once through a small open-addressing table of its digests (cache-resident; a few
    /// instructions a row, where sorting the bucket cost ten times that): the first repeat met is
    /// the bucket's earliest, and the earliest over the buckets is the table's.
    fn first_duplicate(&mut self) -> Option<(usize, usize)> {
        let row = |x: u128| (x & u32::MAX as u128) as usize;
        let mut first: Option<(usize, usize)> = None;
        // slot -> 1 + index into the bucket (0: empty)
        let mut slots: Vec<u32> = Vec::new();
        for b in &self.buckets {
            if b.len() < 2 {
                continue;
            }
            let bits = (usize::BITS - (b.len() - 1).leading_zeros() + 1).max(4);
            let mask = (1usize << bits) - 1;
            slots.clear();
            slots.resize(1 << bits, 0);
            for (i, &x) in b.iter().enumerate() {
                // the digest's bits below the bucket's (the top bits pick the bucket)
                let mut at = (x >> (128 - ID_BUCKET_BITS - bits)) as usize & mask;
                loop {
                    match slots[at] {
                        0 => {
                            slots[at] = i as u32 + 1;
                            break;
                        }
                        j => {
                            let y = b[j as usize - 1];
                            if y >> ROW_BITS == x >> ROW_BITS {
                                let (later, earlier) = (row(x), row(y));
                                if first.is_none_or(|(r, _)| later < r) {
                                    first = Some((later, earlier));
                                }
                                break;
                            }
                            at = (at + 1) & mask;
                        }
                    }
                }
                if first.is_some_and(|(r, _)| r <= row(x)) {
                    // later rows of this bucket cannot be earlier repeats
                    break;
                }
            }
        }
        first
    }

    /// [`IdLog::first_duplicate`] by sorting each bucket (the reference the tests compare with).
    #[cfg(test)]
    fn first_duplicate_sorted(&self) -> Option<(usize, usize)> {
        let mut first: Option<(usize, usize)> = None;
        for b in &self.buckets {
            let mut b = b.clone();
            b.sort_unstable();
            for w in b.windows(2) {
                if w[0] >> ROW_BITS == w[1] >> ROW_BITS {
                    let row = |x: u128| (x & u32::MAX as u128) as usize;
                    let (earlier, later) = (row(w[0]), row(w[1]));
                    if first.is_none_or(|(r, _)| later < r) {
                        first = Some((later, earlier));
                    }
                }
            }
        }
        first
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

    /// The per-prompt digest table: repeats found in a prompt of any size (the table grows past
    /// its 64 first slots; digests sharing their high bits probe on), nothing carried from one
    /// prompt to the next, and the generation count's wrap empties the table.
    #[test]
    fn prompt_ids_find_repeats_within_a_prompt_only() {
        let mut t = PromptIds::default();
        t.enter(0);
        // the same high 64 bits: one long probe chain
        for k in 0..1000u128 {
            assert!(t.insert(k), "{k}");
        }
        assert!(t.slots.len() >= 2000 && t.slots.len().is_power_of_two());
        for k in [0u128, 1, 499, 999] {
            assert!(!t.insert(k), "{k} is a repeat");
        }
        assert!(t.insert(1000));
        t.enter(0); // still prompt 0: its digests stay
        assert!(!t.insert(7));
        t.enter(1);
        assert!(t.insert(7) && !t.insert(7));
        assert!(t.insert(5u128 << 64 | 3) && t.insert(6u128 << 64 | 3));
        t.enter(0); // a new run of prompt 0 (the table's rows are not grouped): empty again
        assert!(t.insert(999) && t.insert(7));
        t.generation = u32::MAX;
        t.prompt = Some(9);
        assert!(t.insert(42));
        t.enter(3);
        assert_eq!(t.generation, 1);
        assert!(t.slots.iter().all(|&s| s == (0, 0)));
        assert!(t.insert(42) && t.insert(999) && !t.insert(42));

        // through the validator: 200 answers of one prompt, the last repeating row 3's id
        let types = vec!["answer"; 200];
        let mut ids: Vec<String> = (0..200).map(|i| format!("p/a{i}")).collect();
        let aidx: Vec<i32> = (0..200).collect();
        fn refs(ids: &[String]) -> Vec<&str> {
            ids.iter().map(String::as_str).collect()
        }
        check(&table(&types, &refs(&ids), &aidx, &[3; 200])).unwrap();
        ids[199] = "p/a3".into();
        let e = check(&table(&types, &refs(&ids), &aidx, &[3; 200]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "t.parquet, row 199, column `sample_id`: duplicate sample_id \"p/a3\""
        );
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
    fn answers_by_prompt_runs_and_wide_indices() {
        let mut a = AnswerSet::default();
        let p = a.prompt(b"p");
        assert_eq!(a.prompt(b"p"), p);
        let q = a.prompt(b"q");
        assert_ne!(p, q);
        // Back to a prompt seen before (not adjacent): the same number.
        assert_eq!(a.prompt(b"p"), p);
        for idx in [0, 63, 64, -1, 1000] {
            assert!(!a.contains(p, idx));
            assert!(a.insert(p, idx), "{idx}");
            assert!(!a.insert(p, idx), "{idx}");
            assert!(a.contains(p, idx) && !a.contains(q, idx));
        }
    }

    #[test]
    fn split_prompt_runs_still_find_a_second_answer() {
        let b = table(
            &["answer", "answer", "answer"],
            &["p/a0", "x", "p/a0b"],
            &[0, 0, 0],
            &[3, 3, 3],
        );
        let pid = StringArray::from(vec!["p", "q", "p"]);
        let b = RecordBatch::try_new(
            b.schema(),
            std::iter::once(Arc::new(pid) as ArrayRef)
                .chain(b.columns()[1..].iter().cloned())
                .collect(),
        )
        .unwrap();
        let e = check(&b).unwrap_err().to_string();
        assert_eq!(e, "t.parquet, row 2, column `answer_idx`: a second answer row for prompt_id \"p\", answer_idx 0");
    }

    #[test]
    fn digests_separate_parts_and_values() {
        let d = |p: &str, a: i32| answer_key(p, a);
        assert_ne!(d("p1", 0), d("p1", 1));
        assert_ne!(d("p1", 0), d("p10", 0));
        assert_ne!(d("", 0), d("\0", 0));
        assert_ne!(h128(&[&"ab", &"c"]), h128(&[&"a", &"bc"]));
        assert_eq!(d("p", 3), d("p", 3));
        // 200k distinct ids, no collision in either half.
        let mut lo = HashSet::new();
        let mut hi = HashSet::new();
        for i in 0..200_000 {
            let h = h128(&[&format!("task-{i:08}/a{}", i % 7).as_str()]);
            assert!(lo.insert(h as u64) && hi.insert((h >> 64) as u64), "{i}");
        }
    }

    /// The inverse of [`short_key`]: its rounds undone in reverse order.
    fn short_key_inverse(y: u128) -> u128 {
        let (mut lo, mut hi) = (y as u64, (y >> 64) as u64);
        lo ^= fold(hi ^ 0xBE54_66CF_34E9_0C6C, 0xC4CE_B9FE_1A85_EC53);
        hi ^= fold(lo ^ 0x4528_21E6_38D0_1377, 0xFF51_AFD7_ED55_8CCD);
        lo ^= fold(hi ^ 0x082E_FA98_EC4E_6C89, 0xC2B2_AE3D_27D4_EB4F);
        hi ^= fold(lo ^ 0xA409_3822_299F_31D0, 0x9E37_79B9_7F4A_7C15);
        ((hi as u128) << 64) | lo as u128
    }

    /// Short ids: the digest is a bijection of the packed id (so distinct ids never share one);
    /// every id: the same read from bytes or from an Arrow string view (also one with bytes left
    /// past the string), and spread over every bit: 300k ids, short and long, distinct in their
    /// top 96 bits (what the duplicate check compares) and filling the 4096 buckets evenly.
    #[test]
    fn id_digests() {
        use arrow::array::StringViewArray;
        let mut x = 0x0123_4567_89AB_CDEFu128 << 64 | 0xFEDC_BA98;
        for _ in 0..10_000 {
            x = x.wrapping_mul(0x2545_F491_4F6C_DD1D_9E37_79B9_7F4A_7C15) ^ (x >> 61);
            assert_eq!(short_key_inverse(short_key(x)), x);
        }
        assert_ne!(id_key(b""), id_key(b"\0"));
        assert_ne!(id_key(b"a"), id_key(b"a\0"));
        assert_ne!(id_key(b"abcdefghijkl"), id_key(b"abcdefghijkl\0"));
        // longer ids: the length, every byte of every word and the words' order count
        let long = *b"0123456789abcdefghijklmnopqrstuv";
        assert_ne!(id_key(&long[..28]), id_key(&long[..29]));
        assert_ne!(
            id_key(&long[..28]),
            id_key(b"0123456789abcdefghijklmnopqr\0")
        );
        for k in 0..long.len() {
            let mut other = long;
            other[k] ^= 1;
            assert_ne!(id_key(&long), id_key(&other), "{k}");
        }
        let words: Vec<u8> = (0..44u8).collect();
        let mut swapped = words.clone();
        swapped[12..28].copy_from_slice(&words[28..44]);
        swapped[28..44].copy_from_slice(&words[12..28]);
        assert_ne!(id_key(&words), id_key(&swapped));
        let ids: Vec<String> = (0..40)
            .map(|l| {
                (0..l)
                    .map(|k| (b'a' + (k * 7 + l) as u8 % 26) as char)
                    .collect()
            })
            .chain(["p/a0", "task-00001234/a3/c1", "\u{e9}t\u{e9}/a1"].map(String::from))
            .collect();
        let views = StringViewArray::from_iter_values(&ids);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(view_key(&views, i), id_key(id.as_bytes()), "{id:?}");
        }
        // a view of "abc" with a stray byte after the string: the same digest as "abc"
        let v = views.views()[3];
        assert_eq!(v as u32, 3);
        let dirty = v | (0x5Au128 << (32 + 8 * 5));
        // SAFETY: an inline view (length 3 <= 12) refers to no buffer; its bytes are valid UTF-8
        let dirty = unsafe {
            StringViewArray::new_unchecked(
                vec![dirty].into(),
                Vec::<arrow::buffer::Buffer>::new().into(),
                None,
            )
        };
        assert_eq!(view_key(&dirty, 0), id_key(ids[3].as_bytes()));

        let mut top = HashSet::new();
        let mut buckets = vec![0usize; 1 << ID_BUCKET_BITS];
        for i in 0..300_000u32 {
            let id = match i % 3 {
                0 => format!("cd{i:07}/a{}", i % 8),
                1 => format!("q{i}/c{}", i % 5),
                _ => format!("task-{i:08}/a{}/c{}", i % 7, i % 3),
            };
            let k = id_key(id.as_bytes());
            assert!(top.insert(k >> ROW_BITS), "{id}");
            buckets[(k >> (128 - ID_BUCKET_BITS)) as usize] += 1;
        }
        // 73 ids per bucket on average; a fair spread stays well inside 40..120
        let (lo, hi) = (buckets.iter().min().unwrap(), buckets.iter().max().unwrap());
        assert!(*lo > 40 && *hi < 120, "{lo}..{hi}");
    }

    /// The row rules give the same verdicts and messages whether the ids come as plain strings,
    /// as dictionaries (`prompt_id`, `sample_type`) or as views (`sample_id`), as `score` reads
    /// them.
    #[test]
    fn dictionaries_and_views_read_the_same() {
        use arrow::array::{DictionaryArray, StringViewArray};
        use arrow::datatypes::Int32Type;
        let recast = |b: &RecordBatch| {
            let mut fields = Vec::new();
            let mut cols: Vec<ArrayRef> = Vec::new();
            for (f, c) in b.schema().fields().iter().zip(b.columns()) {
                let s = c.as_any().downcast_ref::<StringArray>();
                let (dt, c): (DataType, ArrayRef) = match (f.name().as_str(), s) {
                    ("prompt_id" | "sample_type", Some(s)) => {
                        let d: DictionaryArray<Int32Type> = s.iter().collect();
                        (d.data_type().clone(), Arc::new(d))
                    }
                    ("sample_id", Some(s)) => {
                        let v: StringViewArray = s.iter().collect();
                        (DataType::Utf8View, Arc::new(v))
                    }
                    _ => (f.data_type().clone(), c.clone()),
                };
                fields.push(Field::new(f.name(), dt, f.is_nullable()));
                cols.push(c);
            }
            RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
        };
        let run = |b: &RecordBatch| {
            let mut v = Validator::new("t.parquet", &TRAJECTORY);
            v.check_batch(b).and_then(|_| v.finish())
        };
        let long = "a-much-longer-sample-id/a0";
        let cases = [
            table(
                &["answer", "confidence", "answer", "confidence"],
                &["p/a0", "p/a0/c0", long, "p/a1/c0"],
                &[0, 0, 1, 1],
                &[3, 3, 3, 3],
            ),
            table(&["answer", "answer"], &["p/a0", "p/a0"], &[0, 1], &[3, 3]),
            table(&["answer", "answer"], &[long, long], &[0, 1], &[3, 3]),
            table(
                &["answer", "confidence"],
                &["p/a0", "p/a0"],
                &[0, 0],
                &[3, 3],
            ),
            table(&["answer", "answer"], &["p/a0", "p/a1"], &[0, 0], &[3, 3]),
            table(
                &["confidence", "answer"],
                &["p/a1/c0", "p/a1"],
                &[1, 1],
                &[3, 3],
            ),
            table(
                &["answer", "confidence"],
                &["p/a0", "p/a1/c0"],
                &[0, 1],
                &[3, 3],
            ),
        ];
        for (k, b) in cases.iter().enumerate() {
            let r = recast(b);
            assert!(matches!(r.column(0).data_type(), DataType::Dictionary(..)));
            assert_eq!(r.column(3).data_type(), &DataType::Utf8View);
            let (want, got) = (run(b), run(&r));
            match (&want, &got) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "case {k}"),
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "case {k}"),
                _ => panic!("case {k}: {want:?} vs {got:?}"),
            }
            assert_eq!(want.is_ok(), [0, 5].contains(&k), "case {k}: {want:?}");
        }
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

    /// The hashed walk finds the repeat sorting finds: ids from small pools (many repeats),
    /// all distinct, one planted repeat far apart, and digests made to share their bucket and
    /// their first slot (only the bits below differ), in logs of many sizes.
    #[test]
    fn first_duplicate_matches_sorting() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut found = 0;
        for case in 0..300usize {
            let n = 1 + (next() % 20_000) as usize;
            let mut log = IdLog::new();
            let pool = match case % 4 {
                0 => 1 + next() % (2 * n as u64),
                1 => u64::MAX,
                _ => 0,
            };
            for row in 0..n {
                let key = match case % 4 {
                    0 | 1 => id_key(format!("id{}", next() % pool).as_bytes()),
                    2 => id_key(format!("r{}", if row == n - 1 { n / 2 } else { row }).as_bytes()),
                    // one bucket, one first slot, digests apart in their low bits
                    _ => (0xABCu128 << 116) | ((next() % (n as u64 / 2 + 1)) as u128) << 32,
                };
                log.push(key, row as u32);
            }
            let want = log.first_duplicate_sorted();
            assert_eq!(log.first_duplicate(), want, "case {case}, {n} rows");
            found += want.is_some() as usize;
        }
        assert!(found > 100, "{found}");
    }

    #[test]
    fn messages_name_file_row_column() {
        let b = table(&["answer", "answer"], &["p/a0", "p/a0"], &[0, 1], &[3, 3]);
        let e = check(&b).unwrap_err().to_string();
        assert_eq!(
            e,
            "t.parquet, row 1, column `sample_id`: duplicate sample_id \"p/a0\""
        );
        // the first repeat in table order, whichever bucket its digest falls in
        let mut log = IdLog::new();
        for (row, id) in ["x", "y", "z", "y", "x", "z"].iter().enumerate() {
            log.push(id_key(id.as_bytes()), row as u32);
        }
        assert_eq!(log.first_duplicate(), Some((3, 1)));
        let mut log = IdLog::new();
        log.reserve(100);
        for row in 0..100 {
            log.push(id_key(format!("p{row}").as_bytes()), row);
        }
        assert_eq!(log.first_duplicate(), None);

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
