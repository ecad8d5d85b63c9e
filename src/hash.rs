//! The fixed hashes that are part of rlcr's file formats: FNV-1a (64 bit) and SplitMix64.
//!
//! They are written out here, not taken from a hashing crate, because their exact values are
//! stored or relied on across versions and platforms: a row's shard (`--shard I/N`:
//! `fnv1a64(prompt_id) mod N`), a model folder's fingerprint in every sampled table's metadata,
//! the held-out split of the synthetic tasks (a problem's bucket), and the LoRA dropout masks
//! (seeded per step, layer and row). A general-purpose hasher (`foldhash`, `rustc-hash`) may change
//! its output between releases; these formulas do not.

/// FNV-1a offset basis, 64 bit.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a prime, 64 bit.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Streaming FNV-1a, 64 bit: `h = 0xcbf29ce484222325; for each byte b: h = (h ^ b) * 0x100000001b3`.
#[derive(Debug, Clone, Copy)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(FNV_OFFSET)
    }
}

impl Fnv64 {
    /// Hash `bytes` after what was hashed so far.
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }

    /// Hash one 64-bit word as one FNV-1a step (`h = (h ^ x) * prime`; a word-at-a-time variant,
    /// not the bytes of `x`): the LoRA dropout masks key a row by its token ids this way.
    pub fn update_word(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(FNV_PRIME);
    }

    /// The hash of everything given to [`Fnv64::update`] and [`Fnv64::update_word`].
    pub fn finish(self) -> u64 {
        self.0
    }
}

/// FNV-1a, 64 bit, of `bytes` ([`Fnv64`] in one call).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = Fnv64::default();
    h.update(bytes);
    h.finish()
}

/// SplitMix64's finalizer (Steele, Lea and Flood 2014; the mixing step of `java.util.SplittableRandom`):
/// `z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27; z *= 0x94d049bb133111eb; z ^= z >> 31`.
pub fn splitmix64_mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One SplitMix64 output for the state `z`: the golden-ratio increment `0x9e3779b97f4a7c15`, then
/// [`splitmix64_mix`].
pub fn splitmix64(z: u64) -> u64 {
    splitmix64_mix(z.wrapping_add(0x9e37_79b9_7f4a_7c15))
}

/// `bytes` as little-endian 64-bit words, the last one zero-padded (none after a whole number of
/// words): how rlcr's word-at-a-time hashers (the interner's, the validator's id digest) read a
/// key.
pub fn le_words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    let chunks = bytes.chunks_exact(8);
    let rest = chunks.remainder();
    let word = |c: &[u8]| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    };
    chunks
        .map(word)
        .chain((!rest.is_empty()).then(|| word(rest)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_reference_values() {
        // Published FNV-1a 64 test vectors (Fowler, Noll and Vo's reference list).
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
        // Streaming in pieces gives the one-call value.
        let mut h = Fnv64::default();
        h.update(b"foo");
        h.update(b"bar");
        assert_eq!(h.finish(), fnv1a64(b"foobar"));
    }

    #[test]
    fn splitmix_reference_values() {
        // The first outputs of SplitMix64 seeded with 0 (the reference C code's `next()` from
        // state 0: each call adds the increment, then mixes).
        let mut s = 0u64;
        let mut next = || {
            let out = splitmix64(s);
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            out
        };
        assert_eq!(next(), 0xe220a8397b1dcdaf);
        assert_eq!(next(), 0x6e789e6aa1b965f4);
        assert_eq!(next(), 0x06c45d188009454f);
    }
}
