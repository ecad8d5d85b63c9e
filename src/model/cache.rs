//! The KV cache: keys and values of every layer for a batch of rows, kept outside the module
//! and passed to [`Transformer::step`] as `&mut`, so that the same weights serve batched
//! sampling and the cache-free training forward.
//!
//! Design decisions:
//! - **`[B, K, capacity, d]` buffers written in place**: attention reads the whole buffer
//!   (contiguous, no copy) and hides unwritten slots. Capacity grows in chunks of
//!   [`KvCache::CHUNK`] slots, so a decode step attends over at most `CHUNK − 1` unused ones.
//! - **Rows are independent**: each has its own RoPE position counter (real tokens only) and a
//!   validity flag per slot, so a chunk with its own left padding leaves holes that stay hidden.
//!   Rows can be dropped, reordered or duplicated ([`KvCache::select_rows`]): finished rows,
//!   one prompt's cache shared by several continuations, a batch of 1 expanded to n.
//! - **On a GPU the slots are described on the device** ([`SlotStep`]): per row and slot a
//!   validity flag (`[B, capacity]`), set by the kernel that writes the keys and values, and a
//!   table of RoPE cos/sin for every position below the capacity (one per process, uploaded
//!   once, [`ops::rope_table`]). A call then uploads only its
//!   first slot and its tokens' positions (`1 + B·T` numbers), and the attention kernel derives
//!   each query's visible keys from the flags: no mask and no RoPE tables cross the bus per step.
//!   The host keeps the same flags ([`KvCache::select_rows`], [`KvCache::truncate`] and the CPU
//!   path read them there).
use std::cell::{Cell, RefCell};

use anyhow::{ensure, Result};
use burn::tensor::{Device, Int, Tensor, TensorData};

use super::batch::TokenBatch;
use super::ops;
use super::transfer::upload;
use super::transformer::Transformer;

/// Keys and values of every layer for a batch of rows, outside the module.
///
/// Buffers are `[B, K, capacity, d]`; slots `0..len` are written (padding slots included, masked
/// out), the rest is free. Every row advances by the same number of slots per call; each row has
/// its own RoPE position counter (real tokens only) and validity flags.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub(super) layers: Vec<(Tensor<4>, Tensor<4>)>,
    batch: usize,
    len: usize,
    cap: usize,
    chunk: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Per row, whether each written slot holds a real token.
    pub(super) valid: Vec<Vec<bool>>,
    next_pos: Vec<usize>,
    device: Device,
    /// RoPE inverse frequencies (for the device's position table).
    inv_freq: Vec<f32>,
    /// The slots on the device, where the GPU kernels read them ([`ops::slot_kernels`]).
    slots: Option<DeviceSlots>,
}

/// What the device keeps of a cache's slots (see the module docs).
#[derive(Debug, Clone)]
struct DeviceSlots {
    /// `[B, capacity]`: 1 where a slot holds a real token, 0 for padding and unwritten slots.
    flags: Tensor<2>,
    /// `[n, d]`, `n ≥ capacity`: for every position below `n` the RoPE cos of its `d/2` angles,
    /// then their sin ([`ops::rope_table`], shared by the process's caches).
    table: Tensor<2>,
}

/// The device inputs of one call through a cache on a GPU: what the RoPE and cache-write kernel
/// and the attention kernel read instead of RoPE tables and a mask built on the host.
///
/// A replayed step ([`super::graph::DecodeGraph`]) keeps these buffers fixed: `info` is written
/// in place into one buffer allocated with the graph instead of uploaded anew each call, and
/// `flags`, `table` and the key/value buffers are never reallocated inside the step (growth,
/// row selection and a copy of a shared buffer all happen before the capture; the kernels write
/// in place into unshared buffers).
pub(crate) struct SlotStep {
    /// `[1 + B·T]` f32 (exact below 2²⁴): the call's first slot, then the RoPE position of each
    /// of its `B·T` tokens, −1 for padding.
    #[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
    pub(crate) info: Tensor<1>,
    /// [`DeviceSlots::table`].
    pub(crate) table: Tensor<2>,
    /// [`DeviceSlots::flags`], written by each layer's cache-write kernel.
    pub(crate) flags: RefCell<Tensor<2>>,
    /// Set when a kernel did not apply and a layer took the host-described path, which leaves
    /// the device flags behind: the cache then drops them and describes its slots on the host.
    pub(crate) fell_back: Cell<bool>,
}

impl KvCache {
    /// Slots are added in multiples of this many when the buffer grows.
    pub const CHUNK: usize = 64;

    /// An empty cache for `batch` rows of `model`. `capacity` (the longest sequence expected) is
    /// only a hint for host-side bookkeeping: device buffers grow by [`Self::CHUNK`] slots as
    /// tokens arrive (one copy of the cache per chunk), because attention reads the whole buffer
    /// and a buffer sized for the longest possible sequence would make every decode step attend
    /// over all of its unused slots; this way at most `CHUNK − 1` are.
    pub fn new(model: &Transformer, batch: usize, capacity: usize) -> Self {
        let d = &model.dims;
        let device = model.device();
        let shape = [batch, d.kv_heads, 0, d.head_dim];
        let layers = (0..d.layers)
            .map(|_| (Tensor::zeros(shape, &device), Tensor::zeros(shape, &device)))
            .collect();
        let slots = ops::slot_kernels(&device, d.head_dim).then(|| DeviceSlots {
            flags: Tensor::zeros([batch, 0], &device),
            table: ops::rope_table(&d.inv_freq, capacity, &device),
        });
        KvCache {
            layers,
            batch,
            len: 0,
            cap: 0,
            chunk: Self::CHUNK,
            kv_heads: d.kv_heads,
            head_dim: d.head_dim,
            valid: vec![Vec::with_capacity(capacity); batch],
            next_pos: vec![0; batch],
            device,
            inv_freq: d.inv_freq.clone(),
            slots,
        }
    }

    /// Rows.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Slots written so far (the same for every row).
    pub fn len(&self) -> usize {
        self.len
    }

    /// No slot written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allocated slots.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The RoPE position the next real token of each row will get (= real tokens so far).
    pub fn positions(&self) -> &[usize] {
        &self.next_pos
    }

    /// Whether the device describes the slots ([`SlotStep`]) for the GPU kernels.
    pub fn slots_on_device(&self) -> bool {
        self.slots.is_some()
    }

    /// Make room for `extra` more slots (grows by whole chunks, copying once).
    pub fn reserve(&mut self, extra: usize) {
        let need = self.len + extra;
        if need <= self.cap {
            return;
        }
        let new_cap = need.div_ceil(self.chunk) * self.chunk;
        let add = [self.batch, self.kv_heads, new_cap - self.cap, self.head_dim];
        let fresh = self.cap == 0 || self.batch == 0;
        for (k, v) in self.layers.iter_mut() {
            let z = Tensor::zeros(add, &self.device);
            if fresh {
                *k = z.clone();
                *v = z;
            } else {
                k.inplace(|k| Tensor::cat(vec![k, z.clone()], 2));
                v.inplace(|v| Tensor::cat(vec![v, z], 2));
            }
        }
        if let Some(s) = &mut self.slots {
            let z = Tensor::zeros([self.batch, new_cap - self.cap], &self.device);
            if fresh {
                s.flags = z;
            } else {
                s.flags.inplace(|f| Tensor::cat(vec![f, z], 1));
            }
            if s.table.dims()[0] < new_cap {
                s.table = ops::rope_table(&self.inv_freq, new_cap, &self.device);
            }
        }
        self.cap = new_cap;
    }

    /// Keep rows `rows` in that order (indices may repeat): drop finished rows, reorder, or
    /// duplicate a shared prefix (`[0; n]` expands a batch of one to n rows).
    pub fn select_rows(&mut self, rows: &[usize]) -> Result<()> {
        for &r in rows {
            ensure!(
                r < self.batch,
                "row {r} out of range for a cache of {}",
                self.batch
            );
        }
        if rows.is_empty() {
            self.layers.iter_mut().for_each(|(k, v)| {
                let shape = [0, self.kv_heads, self.cap, self.head_dim];
                *k = Tensor::zeros(shape, &self.device);
                *v = Tensor::zeros(shape, &self.device);
            });
            if let Some(s) = &mut self.slots {
                s.flags = Tensor::zeros([0, self.cap], &self.device);
            }
        } else {
            let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
            let idx: Tensor<1, Int> = upload(TensorData::new(idx, [rows.len()]), &self.device);
            for (k, v) in self.layers.iter_mut() {
                k.inplace(|k| k.select(0, idx.clone()));
                v.inplace(|v| v.select(0, idx.clone()));
            }
            if let Some(s) = &mut self.slots {
                s.flags.inplace(|f| f.select(0, idx));
            }
        }
        self.valid = rows.iter().map(|&r| self.valid[r].clone()).collect();
        self.next_pos = rows.iter().map(|&r| self.next_pos[r]).collect();
        self.batch = rows.len();
        Ok(())
    }

    /// Forget every slot from `len` on (e.g. to reuse a prefix for another continuation). The
    /// device flags of those slots are left as they are: a call writes the flags of its own
    /// slots before any query reads them, and no query reads a slot after its own.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for (row, pos) in self.valid.iter_mut().zip(self.next_pos.iter_mut()) {
            row.truncate(len);
            *pos = row.iter().filter(|&&v| v).count();
        }
        self.len = len;
    }

    /// Append the slots of `input` (`B × T`, `B` the cache's rows): room is made, each row's
    /// flags and position counter advance. Returns the call's first slot and the RoPE position
    /// of each of its tokens (`[B·T]`, 0 for padding).
    pub(super) fn advance(&mut self, input: &TokenBatch) -> (usize, Vec<usize>) {
        let (b, t) = (input.batch, input.len);
        let start = self.len;
        self.reserve(t);
        let mut positions = vec![0usize; b * t];
        for r in 0..b {
            for s in 0..t {
                let ok = input.valid[r * t + s];
                if ok {
                    positions[r * t + s] = self.next_pos[r];
                    self.next_pos[r] += 1;
                }
                self.valid[r].push(ok);
            }
        }
        self.len += t;
        (start, positions)
    }

    /// The device inputs of the call [`Self::advance`] just appended (`start`, `positions`,
    /// validity from `input`), when the device describes the slots; one upload of
    /// [`slot_info`]. The flags and the table move into the step until [`Self::end_step`]
    /// (a call that fails in between leaves the cache describing its slots on the host).
    pub(super) fn slot_step(
        &mut self,
        input: &TokenBatch,
        start: usize,
        positions: &[usize],
    ) -> Option<SlotStep> {
        if input.batch == 0 || self.slots.is_none() {
            return None;
        }
        let info = slot_info(input, start, positions);
        let n = info.len();
        self.slot_step_with(input, upload(TensorData::new(info, [n]), &self.device))
    }

    /// [`Self::slot_step`] with the slot description already on the device (`info`, `[1 + B·T]`,
    /// as [`slot_info`] gives it): a replayed step writes it into the same buffer every step.
    pub(super) fn slot_step_with(
        &mut self,
        input: &TokenBatch,
        info: Tensor<1>,
    ) -> Option<SlotStep> {
        if input.batch == 0 {
            return None;
        }
        // Moved, not cloned: a buffer held twice would be copied before each in-place write.
        let s = self.slots.take()?;
        Some(SlotStep {
            info,
            table: s.table,
            flags: RefCell::new(s.flags),
            fell_back: Cell::new(false),
        })
    }

    /// Stop describing the slots on the device, as after a step that fell back: the RoPE
    /// tables and the mask are built on the host from then on.
    #[cfg(all(test, feature = "wgpu"))]
    pub(crate) fn describe_slots_on_host(&mut self) {
        self.slots = None;
    }

    /// Take the device's description back from a finished step; when a layer fell back to the
    /// host's, the device flags are behind and the cache describes its slots on the host from
    /// now on.
    pub(super) fn end_step(&mut self, step: Option<SlotStep>) {
        if let Some(step) = step.filter(|s| !s.fell_back.get()) {
            self.slots = Some(DeviceSlots {
                flags: step.flags.into_inner(),
                table: step.table,
            });
        }
    }
}

/// The slot description of a call through a cache that [`KvCache::advance`] appended at `start`
/// with `positions` (validity from `input`): the first slot, then the RoPE position of each of
/// its `B·T` tokens, −1 for padding (f32, exact below 2²⁴).
pub(super) fn slot_info(input: &TokenBatch, start: usize, positions: &[usize]) -> Vec<f32> {
    let mut info = Vec::with_capacity(1 + positions.len());
    info.push(start as f32);
    info.extend(
        positions
            .iter()
            .zip(&input.valid)
            .map(|(&p, &ok)| if ok { p as f32 } else { -1.0 }),
    );
    info
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::read_f32;
    use crate::model::transformer::tests::{alone, cpu, ids, load, max_diff};

    /// On a GPU the cache still describes its slots on the device: no step fell back.
    fn kept_on_device(cache: &KvCache, device: &Device) {
        let gpu = !ops::on_host(device);
        assert_eq!(cache.slots_on_device(), gpu, "slots on the device");
    }

    /// Decoding through the cache equals the cache-free forward of each whole sequence, also
    /// across a growth of the buffers; the same on `device` (`cpu()` here; the GPU kernels'
    /// tests call it on wgpu against the CPU).
    pub(crate) fn decode_and_grow(device: &Device, name: &str) -> f32 {
        let m = load(name, device);
        let v = m.dims.vocab;
        let prompts: Vec<Vec<u32>> = vec![ids(7, 60, 360), ids(8, 41, 360)];
        // Buffers grow by chunks of 64 slots: the 60-slot prompt takes one, decoding past 64
        // forces a growth.
        let mut cache = KvCache::new(&m, 2, 8);
        let mut seqs = prompts.clone();
        let mut logits = read_f32(
            m.step(&mut cache, &TokenBatch::left_padded(&prompts))
                .unwrap(),
        )
        .unwrap();
        let mut worst = 0f32;
        for step in 0..10 {
            for (b, s) in seqs.iter().enumerate() {
                let full = alone(&m, s);
                let last = &full[(s.len() - 1) * v..s.len() * v];
                worst = worst.max(max_diff(&logits[b * v..(b + 1) * v], last));
            }
            let next: Vec<u32> = (0..2).map(|b| ((step * 31 + b * 7) % 360) as u32).collect();
            for (s, &n) in seqs.iter_mut().zip(&next) {
                s.push(n);
            }
            logits = read_f32(m.step(&mut cache, &TokenBatch::step(&next)).unwrap()).unwrap();
        }
        assert!(cache.capacity() >= 128, "cache grew");
        assert_eq!(cache.len(), 70);
        assert_eq!(cache.positions(), &[70, 51]);
        kept_on_device(&cache, device);
        worst
    }

    #[test]
    fn kv_cache_decoding_equals_full_forward_and_grows() {
        for name in ["tiny-qwen2", "tiny-llama"] {
            let worst = decode_and_grow(&cpu(), name);
            assert!(worst < 1e-5, "{name}: cached vs full differ by {worst}");
        }
    }

    /// Row selection (dropping, duplicating, reordering), a multi-token chunk with its own left
    /// padding appended to the cache, and a truncation back to a shared prefix: each step's
    /// logits against the cache-free forward of the whole sequence. Returns the largest
    /// difference per check, in that order.
    pub(crate) fn select_chunk_truncate(device: &Device) -> [f32; 3] {
        let m = load("tiny-qwen2", device);
        let v = m.dims.vocab;
        let prompts: Vec<Vec<u32>> = vec![ids(1, 5, 360), ids(2, 12, 360), ids(3, 8, 360)];
        let mut cache = KvCache::new(&m, 3, 32);
        m.step(&mut cache, &TokenBatch::left_padded(&prompts))
            .unwrap();
        // Drop row 1, duplicate row 2 three times, keep row 0 last.
        cache.select_rows(&[2, 2, 2, 0]).unwrap();
        let next = [10u32, 11, 12, 13];
        // Row k's logits in `got` against the cache-free forward of its prompt, its next token
        // and `tail`.
        let against = |got: &[f32], k: usize, tail: &[u32]| {
            let (src, tok) = ([2usize, 2, 2, 0][k], next[k]);
            let mut s = prompts[src].clone();
            s.push(tok);
            s.extend_from_slice(tail);
            let full = alone(&m, &s);
            max_diff(&got[k * v..(k + 1) * v], &full[(s.len() - 1) * v..])
        };
        let mut worst = [0f32; 3];
        let got = read_f32(m.step(&mut cache, &TokenBatch::step(&next)).unwrap()).unwrap();
        for k in 0..4 {
            worst[0] = worst[0].max(against(&got, k, &[]));
        }
        // A multi-token chunk with its own left padding appended to the cache.
        let tails: [&[u32]; 4] = [&[5, 6], &[7], &[8, 9], &[1]];
        let chunk = TokenBatch::left_padded(&tails);
        let got = read_f32(m.step(&mut cache, &chunk).unwrap()).unwrap();
        for (k, tail) in tails.iter().enumerate() {
            worst[1] = worst[1].max(against(&got, k, tail));
        }
        // Truncating back to the prefix and continuing equals the first continuation.
        cache.truncate(12);
        let again = read_f32(m.step(&mut cache, &TokenBatch::step(&next)).unwrap()).unwrap();
        worst[2] = against(&again, 3, &[]);
        kept_on_device(&cache, device);
        worst
    }

    #[test]
    fn shared_prefix_and_row_selection() {
        let [rows, chunk, truncated] = select_chunk_truncate(&cpu());
        assert!(rows < 1e-5, "selected rows: {rows}");
        assert!(chunk < 1e-5, "chunk rows: {chunk}");
        assert!(truncated < 1e-5, "after truncation: {truncated}");
    }
}
