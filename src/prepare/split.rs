//! The split of synthetic tasks into training, held-out and out-of-domain tables, shared by the
//! countdown ([`super::synth`]) and arithmetic ([`super::arith`]) generators: a task is held out
//! when [`key_bucket`] of its canonical problem falls in the first `heldout_percent` of 100
//! buckets, so no held-out problem can appear in training under any seed.

use anyhow::{bail, Result};

use super::PromptRow;

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

/// `count` rows of `draw`, which gets the number of rows kept so far (a row's id is
/// [`task_id`] of it) and returns `None` for a draw it does not keep (no task, or a task outside
/// the split). After 10 000 + 10 000 · `count` draws it gives up with the error `give_up` words:
/// the shape cannot fill the split.
pub fn draw_rows(
    count: usize,
    give_up: impl Fn() -> String,
    mut draw: impl FnMut(usize) -> Option<PromptRow>,
) -> Result<Vec<PromptRow>> {
    let mut rows = Vec::with_capacity(count);
    let mut attempts = 0u64;
    while rows.len() < count {
        attempts += 1;
        if attempts > 10_000 + 10_000 * count as u64 {
            bail!("{}", give_up());
        }
        if let Some(row) = draw(rows.len()) {
            rows.push(row);
        }
    }
    Ok(rows)
}

/// The id of the `n`-th task of a table of `count`: `prefix-` and `n` zero-padded to the digits
/// of `count` (at least 6), so that ids sort in task order.
pub fn task_id(prefix: &str, n: usize, count: usize) -> String {
    let width = count.max(1).to_string().len().max(6);
    format!("{prefix}-{n:0width$}")
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
