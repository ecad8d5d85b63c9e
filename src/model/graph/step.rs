//! [`DecodeGraph`]: the recorded decode step of a GPU backend (see the parent module).
use anyhow::{ensure, Result};
use burn::tensor::{Int, Tensor, TensorData};

use super::GraphMode;
use crate::model::batch::TokenBatch;
use crate::model::cache::{slot_info, KvCache};
use crate::model::ops::{self, DrawParams, StepGraph};
use crate::model::transfer::upload;
use crate::model::transformer::{embed_ids, Transformer};

/// What one step gives, on the device: the logits `[B, V]` and, when the graph draws, one token
/// and its behaviour log-prob per row (`[B, 2]` f32, as [`ops::draw`]). In replay mode these are
/// the recorded outputs, overwritten by the next step: read them before it.
#[derive(Debug, Clone)]
pub struct StepOutput {
    pub logits: Tensor<2>,
    pub drawn: Option<Tensor<2>>,
}

/// The draw inside the step: its fixed settings and its input buffer.
#[derive(Debug)]
struct Draw {
    params: DrawParams,
    allowed: usize,
    /// `[2, B]`: each row's uniform, then the logits row it reads (its own).
    rows: Tensor<2>,
}

/// A decode step over a fixed batch and cache capacity whose launches are captured once and
/// replayed (see the module docs).
pub struct DecodeGraph {
    model: Transformer,
    cache: KvCache,
    mode: GraphMode,
    /// `[B]`: each row's token (0 for a row without one).
    ids: Tensor<1, Int>,
    /// `[1 + B]`: the step's slot, then each row's position (−1: none).
    info: Tensor<1>,
    draw: Option<Draw>,
    /// The recorded step and its outputs, once captured.
    captured: Option<(StepGraph, StepOutput)>,
}

impl std::fmt::Debug for DecodeGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeGraph")
            .field("batch", &self.cache.batch())
            .field("len", &self.cache.len())
            .field("capacity", &self.cache.capacity())
            .field("mode", &self.mode)
            .field("captured", &self.captured.is_some())
            .finish()
    }
}

impl DecodeGraph {
    /// A decode step for the rows of `cache` (moved in; its slots described on the device, i.e.
    /// a plain GPU device) with room for `steps` more tokens a row (the capacity is reserved now
    /// and fixed). With `draw`, the step ends with the sampler's draw at those settings over the
    /// first `allowed` ids.
    pub fn new(
        model: &Transformer,
        mut cache: KvCache,
        steps: usize,
        draw: Option<(DrawParams, usize)>,
        mode: GraphMode,
    ) -> Result<Self> {
        ensure!(
            cache.slots_on_device(),
            "a replayable decode step needs a cache whose slots the GPU describes (a plain wgpu \
             or CUDA device)"
        );
        let b = cache.batch();
        ensure!(b > 0, "a decode step needs at least one row");
        let v = model.dims.vocab;
        ensure!(
            v < 1 << 24 && b < 1 << 24,
            "ids and rows are exact in f32 only below 2^24"
        );
        cache.reserve(steps);
        let device = model.device();
        let ids = upload(TensorData::new(vec![0i32; b], [b]), &device);
        let info = upload(TensorData::new(vec![0f32; 1 + b], [1 + b]), &device);
        let draw = draw.map(|(params, allowed)| Draw {
            params,
            allowed: allowed.clamp(1, v),
            rows: upload(TensorData::new(vec![0f32; 2 * b], [2, b]), &device),
        });
        Ok(DecodeGraph {
            model: model.clone(),
            cache,
            mode,
            ids,
            info,
            draw,
            captured: None,
        })
    }

    /// Rows.
    pub fn batch(&self) -> usize {
        self.cache.batch()
    }

    /// Steps left before the cache is full.
    pub fn room(&self) -> usize {
        self.cache.capacity() - self.cache.len()
    }

    /// Whether the step has been captured (later steps replay it).
    pub fn captured(&self) -> bool {
        self.captured.is_some()
    }

    /// The cache (its host bookkeeping: length, positions, validity).
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// The cache back, for growth or row selection (the graph is dropped).
    pub fn into_cache(self) -> KvCache {
        self.cache
    }

    /// One decode step: row `r` takes token `tokens[r]` when `live[r]` (a finished row takes
    /// none and stays in the batch) and, with a draw, the uniform `uniforms[r]` in [0, 1).
    pub fn step(&mut self, tokens: &[u32], live: &[bool], uniforms: &[f32]) -> Result<StepOutput> {
        let b = self.batch();
        ensure!(
            tokens.len() == b && live.len() == b,
            "internal: {} tokens and {} flags for {b} rows",
            tokens.len(),
            live.len()
        );
        ensure!(
            self.room() > 0,
            "the decode step's cache is full ({} slots): a longer generation needs a new graph \
             over a larger cache",
            self.cache.capacity()
        );
        let input = TokenBatch::new(b, 1, tokens.to_vec(), live.to_vec())?;
        self.model.check_cached(&self.cache, &input)?;
        if let Some(d) = &self.draw {
            ensure!(
                uniforms.len() == b,
                "internal: {} uniforms for {b} rows",
                uniforms.len()
            );
            let mut rows = uniforms.to_vec();
            rows.extend((0..b).map(|r| r as f32));
            ops::write_f32(&d.rows, &rows)?;
        }
        // Room was checked: no growth, the buffers stay where the capture saw them.
        let (start, positions) = self.cache.advance(&input);
        ops::write_ids(&self.ids, &embed_ids(&input))?;
        ops::write_f32(&self.info, &slot_info(&input, start, &positions))?;
        if let Some((graph, out)) = &self.captured {
            // Safety: the graph owns every buffer the capture saw (the model's weights, the
            // cache, the input buffers and the outputs; intermediates stay guarded by the
            // graph), and the inputs were written on this thread's stream.
            unsafe { graph.replay()? };
            return Ok(out.clone());
        }
        let Self {
            model,
            cache,
            mode,
            ids,
            info,
            draw,
            captured,
        } = self;
        let run = || -> Result<StepOutput> {
            let logits = model.step_on_device(cache, &input, start, &positions, ids, info);
            ensure!(
                cache.slots_on_device(),
                "a layer's slot kernel did not apply: the step cannot run from fixed buffers"
            );
            let drawn = match draw.as_ref() {
                Some(d) => Some(ops::draw(&logits, &d.rows, true, &d.params, d.allowed)?),
                None => None,
            };
            Ok(StepOutput { logits, drawn })
        };
        match mode {
            GraphMode::Eager => {
                let mut run = run;
                run()
            }
            GraphMode::Replay => {
                let (first, recorded, graph) = ops::capture(info, run)?;
                *captured = Some((graph, recorded));
                Ok(first)
            }
        }
    }
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    //! On the wgpu device (lavapipe in CI): steps replayed from one capture against the same
    //! steps run eagerly on the same buffers, and against the model's ordinary cached step.
    use super::*;
    use crate::model::backend::gpu::test_device;
    use crate::model::read_f32;
    use crate::model::transfer::{thread_counts, thread_launches};
    use crate::model::transformer::tests::{ids, load};

    const ROWS: usize = 3;
    const STEPS: usize = 7;
    /// Row 1 finishes after this many steps and stays in the batch, masked.
    const FINISHED_AFTER: usize = 3;

    fn prompts() -> Vec<Vec<u32>> {
        vec![ids(11, 5, 360), ids(12, 9, 360), ids(13, 2, 360)]
    }

    /// Step `k`'s tokens, live flags and uniforms.
    fn inputs(k: usize) -> (Vec<u32>, Vec<bool>, Vec<f32>) {
        let tokens = ids(100 + k as u64, ROWS, 360);
        let live = (0..ROWS).map(|r| r != 1 || k < FINISHED_AFTER).collect();
        let u = (0..ROWS)
            .map(|r| ((k * 7 + r * 3) % 10) as f32 / 10.0 + 0.05)
            .collect();
        (tokens, live, u)
    }

    fn params() -> DrawParams {
        DrawParams {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            min_p: 0.0,
        }
    }

    fn prefilled(m: &Transformer) -> KvCache {
        let mut cache = KvCache::new(m, ROWS, 16);
        m.step(&mut cache, &TokenBatch::left_padded(&prompts()))
            .unwrap();
        cache
    }

    /// Per step: the logits, the drawn `(token, log-prob)` pairs, and the step's launches and
    /// uploads (the output read excluded).
    type Run = Vec<(Vec<f32>, Vec<f32>, u64, u64)>;

    fn through_graph(m: &Transformer, mode: GraphMode) -> (Run, KvCache) {
        let mut g = DecodeGraph::new(m, prefilled(m), STEPS, Some((params(), 360)), mode).unwrap();
        let mut run = Vec::new();
        for k in 0..STEPS {
            let (tokens, live, u) = inputs(k);
            let (l0, u0) = (thread_launches(), thread_counts().uploads);
            let out = g.step(&tokens, &live, &u).unwrap();
            let (l1, u1) = (thread_launches(), thread_counts().uploads);
            let logits = read_f32(out.logits).unwrap();
            let drawn = read_f32(out.drawn.unwrap()).unwrap();
            run.push((logits, drawn, l1 - l0, u1 - u0));
        }
        assert_eq!(g.captured(), mode == GraphMode::Replay);
        (run, g.into_cache())
    }

    /// The model's ordinary cached step (ids and slots uploaded per call) and the draw, over a
    /// cache of the graph's capacity.
    fn through_step(m: &Transformer) -> Run {
        let mut cache = prefilled(m);
        cache.reserve(STEPS);
        let mut run = Vec::new();
        for k in 0..STEPS {
            let (tokens, live, u) = inputs(k);
            let (l0, u0) = (thread_launches(), thread_counts().uploads);
            let batch = TokenBatch::new(ROWS, 1, tokens, live).unwrap();
            let logits = m.step(&mut cache, &batch).unwrap();
            let mut rows = u;
            rows.extend((0..ROWS).map(|r| r as f32));
            let rows = upload(TensorData::new(rows, [2, ROWS]), &m.device());
            let drawn = ops::draw(&logits, &rows, true, &params(), 360).unwrap();
            let (l1, u1) = (thread_launches(), thread_counts().uploads);
            run.push((
                read_f32(logits).unwrap(),
                read_f32(drawn).unwrap(),
                l1 - l0,
                u1 - u0,
            ));
        }
        run
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Seven decode steps of three rows replayed from one capture (the first step runs eagerly
    /// and is captured) give the logits, tokens and log-probs of the same steps run eagerly on
    /// the same buffers, and of the model's ordinary cached step, bit for bit, with a row that
    /// finishes after three steps kept in the batch as padding. The replays launch nothing
    /// (their launches were recorded) and write only the three input buffers; every step's
    /// logits differ from the last (the replays read the refreshed inputs). Both cache layouts
    /// (tiny-qwen2's biases, tiny-llama's none) and the caches' host bookkeeping agree.
    #[test]
    fn graph_replayed_steps_equal_eager_steps_bit_for_bit() {
        let dev = test_device();
        for name in ["tiny-qwen2", "tiny-llama"] {
            let m = load(name, &dev);
            let t0 = std::time::Instant::now();
            let (eager, eager_cache) = through_graph(&m, GraphMode::Eager);
            let t1 = std::time::Instant::now();
            let (replay, replay_cache) = through_graph(&m, GraphMode::Replay);
            let t2 = std::time::Instant::now();
            let plain = through_step(&m);
            eprintln!(
                "{name}: {STEPS} steps eager {:.0} ms, captured + replayed {:.0} ms",
                (t1 - t0).as_secs_f64() * 1e3,
                (t2 - t1).as_secs_f64() * 1e3
            );
            let mut worst = 0f32;
            for k in 0..STEPS {
                let (e, r, p) = (&eager[k], &replay[k], &plain[k]);
                eprintln!(
                    "{name} step {k}: launches eager {} replay {} plain {}; uploads eager {} \
                     replay {} plain {}; drawn {:?}",
                    e.2, r.2, p.2, e.3, r.3, p.3, r.1
                );
                for (a, b) in e.0.iter().zip(&r.0) {
                    worst = worst.max((a - b).abs());
                }
                assert_eq!(bits(&r.0), bits(&e.0), "{name} step {k}: logits");
                assert_eq!(bits(&r.1), bits(&e.1), "{name} step {k}: draws");
                assert_eq!(bits(&p.0), bits(&e.0), "{name} step {k}: logits vs step");
                assert_eq!(bits(&p.1), bits(&e.1), "{name} step {k}: draws vs step");
                assert!(e.2 > 0 && e.3 == 3, "{name} step {k}: an eager step");
                if k > 0 {
                    assert_eq!((r.2, r.3), (0, 3), "{name} step {k}: a replay");
                    assert_ne!(bits(&r.0), bits(&replay[k - 1].0), "{name} step {k}");
                }
            }
            eprintln!("{name}: max |replay - eager| = {worst:e}");
            assert_eq!(replay_cache.len(), eager_cache.len());
            assert_eq!(replay_cache.positions(), eager_cache.positions());
            let [p0, p1, p2] = [5, 9, 2].map(|n| n + STEPS);
            assert_eq!(
                replay_cache.positions(),
                &[p0, p1 - STEPS + FINISHED_AFTER, p2]
            );
        }
    }

    /// A graph refuses a step past its capacity instead of growing the cache under the
    /// recording, and refuses a cache the GPU does not describe.
    #[test]
    fn graph_refuses_a_full_cache_and_a_host_cache() {
        let dev = test_device();
        let m = load("tiny-llama", &dev);
        let cache = prefilled(&m);
        let room = cache.capacity() - cache.len();
        let mut g = DecodeGraph::new(&m, cache, 0, None, GraphMode::Replay).unwrap();
        assert_eq!(g.room(), room);
        let (tokens, live, u) = inputs(0);
        for _ in 0..room {
            g.step(&tokens, &live, &u).unwrap();
        }
        let err = g.step(&tokens, &live, &u).unwrap_err().to_string();
        assert!(err.contains("cache is full"), "{err}");
        let mut host = prefilled(&m);
        host.describe_slots_on_host();
        let err = DecodeGraph::new(&m, host, 4, None, GraphMode::Eager)
            .unwrap_err()
            .to_string();
        assert!(err.contains("slots the GPU describes"), "{err}");
    }
}
