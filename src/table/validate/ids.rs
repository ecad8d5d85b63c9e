//! Row identities for the validator: the digests of `sample_id`s and of `(prompt_id,
//! answer_idx)` keys, and the log the duplicate check walks once a table is finished.
//!
//! Digests are compared in memory only, never written, so they are free to be fast rather than
//! stable across versions: [`id_key`] (a bijection for ids of up to 12 bytes) for every row's
//! identity, [`h128`] (two folded-multiply streams) for composite keys.
use std::hash::Hasher;

use crate::table::cols::StrCol;
/// A 128-bit digest of `parts`: two independent 64-bit folded-multiply streams over the bytes,
/// eight at a time (a few nanoseconds for a typical id, where two SipHash passes cost ten times
/// that on a 10M-row table). Only compared in memory, never written; the length of each part goes
/// into the stream, so `("ab", "c")` and `("a", "bc")` differ.
pub(super) fn h128(parts: &[&dyn HashPart]) -> u128 {
    let mut h = H128::new();
    for p in parts {
        p.feed(&mut h);
    }
    h.finish()
}

#[inline]
pub(super) fn fold(x: u64, k: u64) -> u64 {
    let m = x as u128 * k as u128;
    (m as u64) ^ ((m >> 64) as u64)
}

pub(super) struct H128 {
    a: u64,
    b: u64,
}

impl H128 {
    pub(super) fn new() -> Self {
        H128 {
            a: 0x243F_6A88_85A3_08D3,
            b: 0x1319_8A2E_0370_7344,
        }
    }
    #[inline]
    pub(super) fn word(&mut self, w: u64) {
        self.a = fold(self.a ^ w, 0x9E37_79B9_7F4A_7C15).wrapping_add(0xA409_3822_299F_31D0);
        self.b = fold(self.b ^ w.rotate_left(29), 0xC2B2_AE3D_27D4_EB4F)
            .wrapping_add(0x082E_FA98_EC4E_6C89);
    }
    pub(super) fn bytes(&mut self, s: &[u8]) {
        for w in crate::hash::le_words(s) {
            self.word(w);
        }
        // A zero word closes a whole number of words too (the digest's format).
        if s.len().is_multiple_of(8) {
            self.word(0);
        }
        self.word(s.len() as u64);
    }
    pub(super) fn finish(&self) -> u128 {
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
pub(super) fn id_key(id: &[u8]) -> u128 {
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
pub(super) fn view_key(a: &arrow::array::StringViewArray, i: usize) -> u128 {
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
pub(super) fn short_key(x: u128) -> u128 {
    feistel(x, 0..ROUNDS.len())
}

/// The round keys of [`short_key`]: per round, the constant xored into the half that goes
/// through [`fold`] and the multiplier.
pub(super) const ROUNDS: [(u64, u64); 4] = [
    (0xA409_3822_299F_31D0, 0x9E37_79B9_7F4A_7C15),
    (0x082E_FA98_EC4E_6C89, 0xC2B2_AE3D_27D4_EB4F),
    (0x4528_21E6_38D0_1377, 0xFF51_AFD7_ED55_8CCD),
    (0xBE54_66CF_34E9_0C6C, 0xC4CE_B9FE_1A85_EC53),
];

/// The [`ROUNDS`] numbered `rounds`, in that order: even rounds xor the folded low half into the
/// high one, odd rounds the folded high half into the low one. Each round undoes itself, so the
/// rounds in reverse order invert [`short_key`].
#[inline]
pub(super) fn feistel(x: u128, rounds: impl Iterator<Item = usize>) -> u128 {
    let (mut lo, mut hi) = (x as u64, (x >> 64) as u64);
    for r in rounds {
        let (k, m) = ROUNDS[r];
        if r % 2 == 0 {
            hi ^= fold(lo ^ k, m);
        } else {
            lo ^= fold(hi ^ k, m);
        }
    }
    ((hi as u128) << 64) | lo as u128
}

pub(super) trait HashPart {
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

/// [`id_key`] of row `i` of a text column (string views: from the view itself).
#[inline]
pub(super) fn row_id_key(ids: &StrCol, i: usize) -> u128 {
    match ids.views() {
        Some(a) => view_key(a, i),
        None => id_key(ids.bytes(i)),
    }
}

/// A hasher for keys that already are 128-bit hashes: their low 64 bits, untouched.
#[derive(Default, Clone, Copy)]
pub(super) struct Prehashed(u64);

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
pub(super) struct IdLog {
    buckets: Vec<Vec<u128>>,
}

pub(super) const ID_BUCKET_BITS: u32 = 12;
pub(super) const ROW_BITS: u32 = 32;

impl IdLog {
    pub(super) fn new() -> Self {
        IdLog {
            buckets: (0..1 << ID_BUCKET_BITS).map(|_| Vec::new()).collect(),
        }
    }

    pub(super) fn reserve(&mut self, rows: usize) {
        let per = rows / self.buckets.len() + rows / self.buckets.len() / 8 + 8;
        for b in &mut self.buckets {
            b.reserve(per);
        }
    }

    /// Log row `row`'s digest (rows beyond `u32::MAX` are refused before).
    #[inline]
    pub(super) fn push(&mut self, digest: u128, row: u32) {
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
    pub(super) fn first_duplicate(&mut self) -> Option<(usize, usize)> {
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
    pub(super) fn first_duplicate_sorted(&self) -> Option<(usize, usize)> {
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
