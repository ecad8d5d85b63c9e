//! Dense ids for strings: the one interner of the crate (`advantage` numbers prompts with it,
//! `report` numbers prompts and data sources), and the fast hasher it uses.
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};

/// FxHash (rustc's hasher): a multiply-rotate per word, several times faster than SipHash on the
/// short keys used here. Keys come from the user's own table, so hash flooding is not a concern.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for w in crate::hash::le_words(bytes) {
            self.add(w);
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    fn write_i32(&mut self, i: i32) {
        self.add(i as u32 as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// A `HashMap` with [`FxHasher`].
pub type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FxHasher>>;

/// Strings mapped to dense ids in first-seen order (deterministic for a given table), with a
/// fast path for runs of equal strings (a table keeps a prompt's rows together: a `memcmp`
/// against the previous string instead of a hash).
///
/// Memory: each distinct string is kept once (in `names`); the index holds its 64-bit FxHash and
/// id (16 bytes an entry), with an exact comparison on a hit and a second map for the strings
/// whose hash collides with another's.
#[derive(Clone, Debug, Default)]
pub struct Interner {
    names: Vec<String>,
    by_hash: HashMap<u64, u32, BuildHasherDefault<Identity>>,
    collided: HashMap<String, u32>,
    last: Option<u32>,
}

/// The keys of `by_hash` are hashes already.
#[derive(Default, Clone, Copy, Debug)]
pub struct Identity(u64);

impl std::hash::Hasher for Identity {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = i;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl Interner {
    /// The id of `s`, adding it if new.
    #[inline]
    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(id) = self.last {
            if self.names[id as usize] == s {
                return id;
            }
        }
        let id = self.lookup(s);
        self.last = Some(id);
        id
    }

    fn lookup(&mut self, s: &str) -> u32 {
        let h = BuildHasherDefault::<FxHasher>::default().hash_one(s);
        let next = self.names.len() as u32;
        match self.by_hash.get(&h) {
            Some(&id) if self.names[id as usize] == s => id,
            Some(_) => {
                let id = *self.collided.entry(s.to_string()).or_insert(next);
                if id == next {
                    self.names.push(s.to_string());
                }
                id
            }
            None => {
                self.by_hash.insert(h, next);
                self.names.push(s.to_string());
                next
            }
        }
    }

    /// The string of an id (empty for an unknown id).
    pub fn name(&self, id: u32) -> &str {
        self.names
            .get(id as usize)
            .map(String::as_str)
            .unwrap_or("")
    }

    /// Number of distinct strings.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// No strings yet.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dense_stable_and_named() {
        let mut it = Interner::default();
        let ids: Vec<u32> = ["a", "a", "b", "a", "c", "b"]
            .iter()
            .map(|s| it.intern(s))
            .collect();
        assert_eq!(ids, vec![0, 0, 1, 0, 2, 1]);
        assert_eq!((it.len(), it.name(2), it.name(9)), (3, "c", ""));
        assert!(!it.is_empty() && Interner::default().is_empty());
    }

    #[test]
    fn colliding_hashes_get_their_own_ids() {
        let mut it = Interner::default();
        let a = it.intern("a");
        // forge a collision: "b" finds "a"'s entry under its own hash
        let hb = BuildHasherDefault::<FxHasher>::default().hash_one("b");
        it.by_hash.insert(hb, a);
        it.last = None;
        let b = it.intern("b");
        assert_ne!(a, b);
        it.last = None;
        assert_eq!((it.intern("b"), it.intern("a")), (b, a));
        assert_eq!((it.name(a), it.name(b), it.len()), ("a", "b", 2));
    }
}
