//! `--shard I/N`: split a stage's work across machines, disjoint by `prompt_id`.
//!
//! A row belongs to shard `fnv1a64(prompt_id) mod N`. The hash is fixed (FNV-1a, 64 bit) so every
//! machine and every version agrees, and whole prompts go to one shard, so the groups the advantage
//! estimators normalise over (all answers of a prompt, all confidences of an answer) never split.
//! The union of the N shard outputs holds exactly the rows of the unsharded output; stages accept
//! a folder of part files as input, so the parts need no merge step.
use std::str::FromStr;

use anyhow::{bail, Context};

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

/// FNV-1a, 64 bit: `h = 0xcbf29ce484222325; for b: h = (h ^ b) * 0x100000001b3`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_reference_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
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
