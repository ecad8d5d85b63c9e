//! The split of synthetic tasks into training, held-out and out-of-domain tables, shared by the
//! countdown ([`super::synth`]) and arithmetic ([`super::arith`]) generators: a task is held out
//! when [`key_bucket`] of its canonical problem falls in the first `heldout_percent` of 100
//! buckets, so no held-out problem can appear in training under any seed.

/// Which tasks of a shape a table holds.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Split {
    /// Every task, no split (the historical behaviour).
    #[default]
    All,
    /// Tasks whose canonical problem is not held out.
    Train,
    /// Tasks whose canonical problem is held out (never in `train`).
    Heldout,
    /// Out of domain: `max_numbers + 1` numbers per task (never in `train` or `heldout`).
    Hard,
}

impl Split {
    pub fn name(self) -> &'static str {
        match self {
            Split::All => "all",
            Split::Train => "train",
            Split::Heldout => "heldout",
            Split::Hard => "hard",
        }
    }
}

/// The bucket (0..100) of a canonical key: FNV-1a 64 of its UTF-8 bytes (offset
/// 0xcbf29ce484222325, prime 0x100000001b3), then SplitMix64's finalizer
/// (`z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27; z *= 0x94d049bb133111eb; z ^= z >> 31`),
/// modulo 100. Fixed by this formula (not by a library's hasher), so splits are the same across
/// versions and platforms.
pub fn key_bucket(key: &str) -> u32 {
    let z = crate::hash::splitmix64_mix(crate::hash::fnv1a64(key.as_bytes()));
    (z % 100) as u32
}
