//! The batched sampler: contexts in, sampled responses out, with a KV cache.
//!
//! Work comes as [`Group`]s: one context shared by several samples (a prompt and its G_a answers,
//! or an answer's conversation and its G_c confidences). The sampler sorts groups by context
//! length (longest first, to limit padding), packs them into **waves** of at most `batch_size`
//! sample rows, and for each wave:
//! 1. **prefills each distinct context once** (left-padded, in column chunks of at most
//!    `prefill_chunk` slots to bound the attention memory);
//! 2. **expands the cache** to one row per sample (`select_rows` with repeated indices), so the
//!    G samples of a group share the prefix computation;
//! 3. **decodes step by step**: each row draws its token from its own RNG stream (one uniform per
//!    token), records the behaviour log-prob, feeds its incremental detokeniser and checks its
//!    stop conditions. On the CPU the logits of every row's last position come to the host and
//!    [`Processor`] draws; a model that [draws on its device](StepModel::draws_on_device) gets
//!    the rows' uniforms as one small upload and returns only the sampled ids and log-probs
//!    ([`super::draw`]), so the logits and the KV cache never leave the device;
//! 4. rows that finish **leave the batch** (the cache is compacted with `select_rows`) and the
//!    rest keeps going until every row is done. A model that [replays](StepModel::replays) a
//!    recorded decode step (`RLCR_CUDA_GRAPH`; on CUDA one dispatch a step instead of a
//!    launch a kernel) keeps finished rows in the batch as padding, since a recording is for one
//!    batch width, until half of the batch has finished or its cache is full; the cache is then
//!    compacted and grown and the step recorded again ([`ReplayedStep`]). The rows compute what
//!    they would step by step: padding rows take no token and no other row sees them.
//!
//! Determinism: a row's tokens depend on its own logits and its own ChaCha20 stream (see
//! [`super::rng`]); host-side choices run on rayon per row with no shared state; results are
//! returned in input order. The model's mask makes a padded row compute the same function as the
//! row alone, its CPU decode matmul sums each row in order whatever the row count (1–16 rows;
//! gemm beyond, which agrees on the fixtures), and prefill chunks are never narrower than 8 slots
//! ([`prefill_chunks`]); so on the fixtures the output is bit for bit the same for every
//! `batch_size` and thread count (the `backend_rounding` test pins these facts). What remains is
//! inside the backend's kernels: gemm splits sums over more than 512 terms into blocks (rows > 16
//! of a large model then round differently from rows ≤ 16), and the attention's sum over keys is
//! split the same way once a cache exceeds 512 slots, at boundaries that move with the wave's
//! padding. Log-probs can then differ by ~1e-6 between batch sizes, and a sampled token changes
//! only when its uniform falls within that distance of a boundary of the cumulative distribution
//! (about one token in a million). Exactness there needs batch-invariant kernels in the model.
//!
//! Waves are static (a wave's rows are all admitted at its start): admitting new rows into a
//! running cache would need caches of different lengths to be merged. Groups larger than
//! `batch_size` are split across waves (each part prefills the context again).
use anyhow::{bail, ensure, Context, Result};
use burn::tensor::Tensor;
use rayon::prelude::*;

use super::logits::{Processor, SamplingParams};
use super::rng::{sample_rng, uniform, SampleKey};
use super::stop::{DecodeFn, Detokenizer, FinishReason, StopCriteria};
use crate::model::TokenBatch;

/// The slots one model call appends: `batch` rows of `len` slots each, `ids`/`valid` holding
/// `batch·len` entries row-major (`false` = padding).
#[derive(Debug, Clone, Copy)]
pub struct Slots<'a> {
    pub batch: usize,
    pub len: usize,
    pub ids: &'a [u32],
    pub valid: &'a [bool],
}

impl Slots<'_> {
    /// The slots as the model's owned input (checked for `batch·len` ids and flags).
    pub fn to_batch(self) -> Result<TokenBatch> {
        TokenBatch::new(self.batch, self.len, self.ids.to_vec(), self.valid.to_vec())
    }
}

/// What the sampler needs from a model: a KV cache it can grow by any number of slots per call,
/// whose rows can be selected/duplicated, and next-token logits on the host.
pub trait StepModel: Sync {
    type Cache;
    /// Width of a logits row (the model's vocabulary, padded rows included).
    fn vocab(&self) -> usize;
    /// Longest sequence (context + response) the model accepts.
    fn max_positions(&self) -> usize;
    /// An empty cache for `batch` rows with room for `capacity` slots.
    fn new_cache(&self, batch: usize, capacity: usize) -> Result<Self::Cache>;
    /// Append `slots` to every row and return the logits of every row's last slot,
    /// `batch·vocab` on the host.
    fn step(&self, cache: &mut Self::Cache, slots: Slots<'_>) -> Result<Vec<f32>>;
    /// Keep rows `rows` in that order (indices may repeat).
    fn select_rows(&self, cache: &mut Self::Cache, rows: &[usize]) -> Result<()>;
    /// Whether the sampler draws on the model's device: [`Self::step_device`] then
    /// [`super::draw::draw`], reading back only the sampled ids and their log-probs. `false`
    /// (the default): the logits come to the host ([`Self::step`]) and [`Processor`] draws.
    fn draws_on_device(&self) -> bool {
        false
    }
    /// Whether decode steps replay a recorded step ([`Self::decode_graph`]; `RLCR_CUDA_GRAPH`).
    fn replays(&self) -> bool {
        false
    }
    /// A decode step over the rows of `cache` (moved in) with room for `steps` more tokens a
    /// row, recorded once and replayed, its draw at `cfg`'s settings; `Err(cache)` (the cache
    /// back) when this cache cannot run from fixed buffers, and the wave goes on step by step.
    #[allow(clippy::type_complexity)]
    fn decode_graph(
        &self,
        cache: Self::Cache,
        _steps: usize,
        _cfg: &GenConfig,
    ) -> Result<std::result::Result<Box<dyn ReplayedStep<Self::Cache>>, Self::Cache>> {
        Ok(Err(cache))
    }
    /// [`Self::step`] with the logits `[batch, vocab]` left on the model's device.
    fn step_device(&self, _cache: &mut Self::Cache, _slots: Slots<'_>) -> Result<Tensor<2>> {
        bail!("internal: this model samples on the host")
    }
}

/// A decode step recorded once and replayed ([`crate::model::graph`]): a fixed batch of rows
/// over a cache of fixed capacity, the draw inside the step.
pub trait ReplayedStep<C> {
    /// Rows of the batch (finished ones included).
    fn rows(&self) -> usize;
    /// Steps left before the cache is full.
    fn room(&self) -> usize;
    /// One step: row `r` takes `tokens[r]` when `live[r]` (a finished row takes none and stays
    /// in the batch) and draws with the uniform `uniforms[r]`. Returns `(token, behaviour
    /// log-prob)` per row (a finished row's is meaningless).
    fn step(&mut self, tokens: &[u32], live: &[bool], uniforms: &[f64]) -> Result<Vec<(u32, f32)>>;
    /// The cache back (the recording is dropped).
    fn into_cache(self: Box<Self>) -> C;
}

/// The last step's logits: on the host, or on the model's device ([`StepModel::draws_on_device`]).
pub(crate) enum Logits {
    Host(Vec<f32>),
    Device(Box<Tensor<2>>),
}

impl Logits {
    /// The logits of several model calls as one, rows in call order (all from the same path; on
    /// the device a concatenation there, nothing read).
    pub(crate) fn cat(parts: Vec<Logits>) -> Result<Logits> {
        if parts.len() == 1 {
            return parts.into_iter().next().context("internal: no logits");
        }
        let mut host = Vec::new();
        let mut device = Vec::new();
        for p in parts {
            match p {
                Logits::Host(l) => host.extend_from_slice(&l),
                Logits::Device(l) => device.push(*l),
            }
        }
        match (host.is_empty(), device.is_empty()) {
            (_, true) => Ok(Logits::Host(host)),
            (true, false) => Ok(Logits::Device(Box::new(Tensor::cat(device, 0)))),
            (false, false) => bail!("internal: host and device logits in one step"),
        }
    }
}

/// What every sample row of a wave carries, single-turn or multi-turn: its place in the wave's
/// output, its drawing state (its own ChaCha20 stream and the host sampler's scratch), the
/// response so far (ids, behaviour log-probs, the incremental detokeniser) and how it ended.
pub(crate) struct RowResponse {
    /// Index into the wave's output.
    pub(crate) out: usize,
    pub(crate) rng: rand_chacha::ChaCha20Rng,
    pub(crate) proc_: Processor,
    pub(crate) ids: Vec<u32>,
    pub(crate) logprobs: Vec<f32>,
    pub(crate) detok: Detokenizer,
    /// Set when the response has ended; [`retire_finished`] then takes the row out.
    pub(crate) finish: Option<FinishReason>,
}

impl RowResponse {
    /// The empty response of sample `id` (its stream drawn from `seed`), going to place `out`.
    pub(crate) fn new(seed: u64, id: &SampleId, out: usize) -> Self {
        RowResponse {
            out,
            rng: sample_rng(seed, &id.key()),
            proc_: Processor::new(),
            ids: Vec::new(),
            logprobs: Vec::new(),
            detok: Detokenizer::new(),
            finish: None,
        }
    }

    /// Append a token and its behaviour log-prob.
    pub(crate) fn push(&mut self, tok: u32, lp: f32) {
        self.ids.push(tok);
        self.logprobs.push(lp);
    }

    /// The finished response, ended by `finish`, and its place in the wave's output.
    pub(crate) fn into_generated(self, finish: FinishReason) -> (usize, Generated) {
        let (text, ends) = self.detok.into_parts();
        let g = Generated {
            ids: self.ids,
            logprobs: self.logprobs,
            text,
            ends,
            finish,
        };
        (self.out, g)
    }
}

/// A sample row of a wave, as [`draw_rows`] and [`retire_finished`] see it: its
/// [`RowResponse`].
pub(crate) trait WaveRow {
    fn response(&mut self) -> &mut RowResponse;
}

/// One draw per sample row: row `r` takes the next uniform of its own stream and draws from
/// logits row `src[r]` (each row's draw is the same on one path whatever the other rows). On the
/// host [`Processor`] draws, rows in parallel; on the device [`super::draw::draw`] draws all
/// rows at once (one upload, one read). Returns `(token, behaviour log-prob)` per row.
pub(crate) fn draw_rows<R: WaveRow + Send>(
    logits: &Logits,
    rows: &mut [R],
    src: &[usize],
    vocab: usize,
    cfg: &GenConfig,
) -> Result<Vec<(u32, f32)>> {
    ensure!(
        src.len() == rows.len(),
        "internal: {} logits rows for {} sample rows",
        src.len(),
        rows.len()
    );
    match logits {
        Logits::Host(l) => rows
            .par_iter_mut()
            .zip(src.par_iter())
            .map(|(row, &k)| {
                let l = l
                    .get(k * vocab..(k + 1) * vocab)
                    .context("internal: a sample row reads beyond the logits")?;
                let r = row.response();
                let u = uniform(&mut r.rng);
                Ok(r.proc_
                    .choose_with_logprob(l, cfg.allowed_vocab, &cfg.params, u))
            })
            .collect(),
        Logits::Device(l) => {
            // Each row's next uniform from its own stream, as the host path draws it.
            let u: Vec<f64> = rows
                .iter_mut()
                .map(|r| uniform(&mut r.response().rng))
                .collect();
            super::draw::draw(l, src, &u, &cfg.params, cfg.allowed_vocab)
        }
    }
}

/// One model call ([`StepModel::step`]) with the logits where the sampler draws them: on the
/// device when the model [draws there](StepModel::draws_on_device), else on the host (checked
/// for `batch · vocab` values).
pub(crate) fn step_logits<M: StepModel>(
    model: &M,
    cache: &mut M::Cache,
    slots: Slots<'_>,
) -> Result<Logits> {
    if model.draws_on_device() {
        return Ok(Logits::Device(Box::new(model.step_device(cache, slots)?)));
    }
    let (batch, vocab) = (slots.batch, model.vocab());
    let l = model.step(cache, slots)?;
    ensure!(
        l.len() == batch * vocab,
        "model returned {} logits for {batch} rows of {vocab}",
        l.len()
    );
    Ok(Logits::Host(l))
}

/// [`prefill`] with the last chunk's logits where the sampler draws them (see [`step_logits`]).
pub(crate) fn prefill_logits<M: StepModel>(
    model: &M,
    cache: &mut M::Cache,
    contexts: &[&[u32]],
    chunk: usize,
) -> Result<Logits> {
    if model.draws_on_device() {
        let l = prefill_with(cache, contexts, chunk, |c, s| model.step_device(c, s))?;
        Ok(Logits::Device(Box::new(
            l.context("internal: an empty wave")?,
        )))
    } else {
        Ok(Logits::Host(prefill(model, cache, contexts, chunk)?))
    }
}

/// Owned identity of a sample (see [`SampleKey`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleId {
    pub prompt_id: String,
    pub answer_idx: u32,
    pub confidence_idx: Option<u32>,
}

impl SampleId {
    pub fn key(&self) -> SampleKey<'_> {
        SampleKey {
            prompt_id: &self.prompt_id,
            answer_idx: self.answer_idx,
            confidence_idx: self.confidence_idx,
        }
    }
}

/// One context and the samples to draw from it.
#[derive(Debug, Clone)]
pub struct Group {
    pub context: Vec<u32>,
    pub samples: Vec<SampleId>,
}

/// Settings of a generation run.
#[derive(Debug, Clone)]
pub struct GenConfig {
    pub params: SamplingParams,
    pub stop: StopCriteria,
    /// Only ids below this can be sampled (the tokenizer's vocabulary; see [`super::logits`]).
    pub allowed_vocab: usize,
    /// `--seed`.
    pub seed: u64,
    /// Sample rows decoded together.
    pub batch_size: usize,
    /// Prefill at most this many slots per forward call.
    pub prefill_chunk: usize,
}

impl GenConfig {
    /// Check what every sampling run needs: valid sampling parameters, at least one new token.
    pub fn check(&self) -> Result<()> {
        self.params.validate()?;
        ensure!(
            self.stop.max_new_tokens > 0,
            "--max-new-tokens must be at least 1"
        );
        Ok(())
    }
}

/// One generated response.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub ids: Vec<u32>,
    /// Behaviour log-prob of each id (temperature 1, full vocabulary).
    pub logprobs: Vec<f32>,
    /// Decoded text (special tokens kept, a final EOS left out).
    pub text: String,
    /// End byte offset in `text` of every token (see [`super::stop::Detokenizer`]).
    pub ends: Vec<usize>,
    pub finish: FinishReason,
}

/// Counters reported after every decode step.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepReport {
    /// Tokens generated in this step (one per active row).
    pub tokens: usize,
    /// Samples that finished in this step.
    pub finished: usize,
}

/// A sample row in flight.
struct Row {
    response: RowResponse,
    /// Max new tokens for this row (also bounded by the model's positions).
    limit: usize,
}

impl WaveRow for Row {
    fn response(&mut self) -> &mut RowResponse {
        &mut self.response
    }
}

impl Row {
    /// Record a drawn token and its behaviour log-prob, check stop conditions.
    fn record(&mut self, tok: u32, lp: f32, cfg: &GenConfig, decode: &DecodeFn<'_>) -> Result<()> {
        let r = &mut self.response;
        r.push(tok, lp);
        if cfg.stop.is_eos(tok) {
            r.detok.finish(decode)?;
            r.detok.push_silent();
            r.finish = Some(FinishReason::Stop);
            return Ok(());
        }
        let from = r.detok.push(tok, decode)?;
        if cfg.stop.stop_string_in(r.detok.text(), from) {
            r.finish = Some(FinishReason::Stop);
        } else if r.ids.len() >= self.limit {
            r.finish = Some(FinishReason::Length);
        }
        if r.finish.is_some() {
            r.detok.finish(decode)?;
        }
        Ok(())
    }
}

/// A contiguous part of a group assigned to one wave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WavePart {
    pub group: usize,
    pub samples: std::ops::Range<usize>,
}

/// Split groups (sizes `sizes`, in order) into waves of at most `batch_size` samples.
pub fn plan_waves(sizes: &[usize], batch_size: usize) -> Vec<Vec<WavePart>> {
    let b = batch_size.max(1);
    let mut waves = Vec::new();
    let mut cur: Vec<WavePart> = Vec::new();
    let mut used = 0;
    for (g, &n) in sizes.iter().enumerate() {
        let mut s = 0;
        while s < n {
            if used == b {
                waves.push(std::mem::take(&mut cur));
                used = 0;
            }
            let take = (n - s).min(b - used);
            cur.push(WavePart {
                group: g,
                samples: s..s + take,
            });
            used += take;
            s += take;
        }
    }
    if !cur.is_empty() {
        waves.push(cur);
    }
    waves
}

/// Generate every sample of `groups`; `on_step` is called after each decode step. Returns, per
/// group, its samples' responses in order.
pub fn generate<M: StepModel>(
    model: &M,
    decode: &DecodeFn<'_>,
    groups: &[Group],
    cfg: &GenConfig,
    on_step: &mut dyn FnMut(StepReport),
) -> Result<Vec<Vec<Generated>>> {
    cfg.check()?;
    in_waves(groups, model.max_positions(), cfg.batch_size, |parts| {
        run_wave(model, decode, groups, parts, cfg, on_step)
    })
}

/// What the wave scheduler needs of a unit of work: one context and the samples drawn from it
/// (a [`Group`] here, an [`super::multiturn::Episode`] for rollouts).
pub(crate) trait WaveGroup {
    fn context(&self) -> &[u32];
    fn samples(&self) -> &[SampleId];
}

impl WaveGroup for Group {
    fn context(&self) -> &[u32] {
        &self.context
    }
    fn samples(&self) -> &[SampleId] {
        &self.samples
    }
}

/// The part of a wave taken from one group: its index in the caller's order and the range of
/// its samples.
pub(crate) type Part = (usize, std::ops::Range<usize>);

/// Check that every group's context fits the model, then run their samples in waves of at most
/// `batch_size` ([`plan_waves`]) through `run_wave`, which returns one result per sample of its
/// parts, in order. Returns, per group, its samples' results in order.
///
/// Waves of similar context lengths waste less on padding, so groups are taken longest context
/// first; what a row computes does not depend on its wave, and results go back to input order.
pub(crate) fn in_waves<G: WaveGroup, T>(
    groups: &[G],
    max_pos: usize,
    batch_size: usize,
    mut run_wave: impl FnMut(&[Part]) -> Result<Vec<T>>,
) -> Result<Vec<Vec<T>>> {
    for (g, group) in groups.iter().enumerate() {
        let context = group.context();
        ensure!(!context.is_empty(), "group {g}: empty context");
        if context.len() >= max_pos {
            let who = group
                .samples()
                .first()
                .map(|s| format!("prompt {}", s.prompt_id))
                .unwrap_or_else(|| format!("group {g}"));
            bail!(
                "{who}: the context is {} tokens, but the model accepts at most {max_pos} \
                 positions (context + response); shorten the prompt",
                context.len()
            );
        }
    }
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&g| std::cmp::Reverse(groups[g].context().len()));
    let sizes: Vec<usize> = order.iter().map(|&g| groups[g].samples().len()).collect();
    let mut out: Vec<Vec<Option<T>>> = groups
        .iter()
        .map(|g| (0..g.samples().len()).map(|_| None).collect())
        .collect();
    for wave in plan_waves(&sizes, batch_size) {
        let parts: Vec<Part> = wave
            .iter()
            .map(|p| (order[p.group], p.samples.clone()))
            .collect();
        let mut it = run_wave(&parts)?.into_iter();
        for (g, samples) in &parts {
            for s in samples.clone() {
                out[*g][s] = it.next();
            }
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(g, v)| {
            v.into_iter()
                .enumerate()
                .map(|(s, x)| {
                    x.with_context(|| format!("internal: sample {s} of group {g} not generated"))
                })
                .collect()
        })
        .collect()
}

/// A started wave: its cache, the prefill's logits, the sample rows, and for each row its logits
/// row of the prefill.
pub(crate) type WaveStart<C, R> = (C, Logits, Vec<R>, Vec<usize>);

/// Start a wave: a cache with one row per part (its group's context, prefilled left-padded in
/// column chunks, `room` response slots to start with), expanded to one row per sample, each
/// built by `row` from its group index, sample id and place in the wave's output. Returns the
/// cache, the rows, and for each row its logits row of the prefill.
pub(crate) fn start_wave<M: StepModel, G: WaveGroup, R>(
    model: &M,
    groups: &[G],
    parts: &[Part],
    room: usize,
    prefill_chunk: usize,
    mut row: impl FnMut(usize, &SampleId, usize) -> R,
) -> Result<WaveStart<M::Cache, R>> {
    let contexts: Vec<&[u32]> = parts.iter().map(|(g, _)| groups[*g].context()).collect();
    let longest = contexts.iter().map(|c| c.len()).max().unwrap_or(0);
    let n_ctx = contexts.len();
    let mut cache = model.new_cache(n_ctx, longest + room)?;
    let logits = prefill_logits(model, &mut cache, &contexts, prefill_chunk)?;
    let mut expand = Vec::new();
    let mut rows = Vec::new();
    for (pi, (g, samples)) in parts.iter().enumerate() {
        for si in samples.clone() {
            expand.push(pi);
            rows.push(row(*g, &groups[*g].samples()[si], rows.len()));
        }
    }
    reselect(model, &mut cache, n_ctx, &expand)?;
    Ok((cache, logits, rows, expand))
}

/// The results of a wave once every row has finished (a missing one is an internal error).
pub(crate) fn wave_results<T>(results: Vec<Option<T>>) -> Result<Vec<T>> {
    results
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.with_context(|| format!("internal: row {i} of the wave did not finish")))
        .collect()
}

/// Response slots allocated with a wave's cache; it grows as responses get longer.
const INITIAL_ROOM: usize = 64;

/// Prefill chunks are never narrower than this many slots (a narrow last chunk is merged into
/// the previous one): like row counts, chunks of 1–3 slots round differently.
const MIN_CHUNK: usize = 8;

/// Column chunks `[start, end)` covering `0..len`: width `chunk`, the last one merged into the
/// previous when it would be narrower than [`MIN_CHUNK`].
pub fn prefill_chunks(len: usize, chunk: usize) -> Vec<(usize, usize)> {
    let chunk = chunk.max(MIN_CHUNK);
    let mut out: Vec<(usize, usize)> = Vec::new();
    let mut s = 0;
    while s < len {
        let e = (s + chunk).min(len);
        out.push((s, e));
        s = e;
    }
    if out.len() >= 2 {
        let (ls, le) = out[out.len() - 1];
        if le - ls < MIN_CHUNK {
            out.pop();
            if let Some(last) = out.last_mut() {
                last.1 = le;
            }
        }
    }
    out
}

/// Make the cache hold `rows` (indices into its `current` rows, in that order, repeats allowed);
/// skips the copy when nothing changes.
pub(crate) fn reselect<M: StepModel>(
    model: &M,
    cache: &mut M::Cache,
    current: usize,
    rows: &[usize],
) -> Result<()> {
    let identity = rows.len() == current && rows.iter().enumerate().all(|(i, &r)| i == r);
    if !identity {
        model.select_rows(cache, rows)?;
    }
    Ok(())
}

/// After a decode step: hand every finished row (its response ended) to `done`, which gives
/// its result and its place in `results`, and keep the others in order. Returns the rows kept
/// and their indices in `rows` (for [`reselect`]).
pub(crate) fn retire_finished<R: WaveRow, T>(
    rows: Vec<R>,
    results: &mut [Option<T>],
    mut done: impl FnMut(R, FinishReason) -> (usize, T),
) -> (Vec<R>, Vec<usize>) {
    let mut keep = Vec::with_capacity(rows.len());
    let mut next = Vec::with_capacity(rows.len());
    for (i, mut row) in rows.into_iter().enumerate() {
        match row.response().finish {
            Some(f) => {
                let (out, result) = done(row, f);
                results[out] = Some(result);
            }
            None => {
                keep.push(i);
                next.push(row);
            }
        }
    }
    (next, keep)
}

/// Prefill: run the `contexts`, left-padded to the longest, through `cache` (empty, one row per
/// context) in column chunks of about `chunk` tokens ([`prefill_chunks`]). Returns the logits of
/// every context's last token, `contexts.len() · vocab`, checked for that length.
pub(crate) fn prefill<M: StepModel>(
    model: &M,
    cache: &mut M::Cache,
    contexts: &[&[u32]],
    chunk: usize,
) -> Result<Vec<f32>> {
    let (vocab, n_ctx) = (model.vocab(), contexts.len());
    let logits = prefill_with(cache, contexts, chunk, |c, s| model.step(c, s))?.unwrap_or_default();
    ensure!(
        logits.len() == n_ctx * vocab,
        "model returned {} logits for {n_ctx} rows of {vocab}",
        logits.len()
    );
    Ok(logits)
}

/// [`prefill`] through `step` (host or device logits); the last chunk's output (`None`: no
/// context tokens).
fn prefill_with<C, T>(
    cache: &mut C,
    contexts: &[&[u32]],
    chunk: usize,
    mut step: impl FnMut(&mut C, Slots<'_>) -> Result<T>,
) -> Result<Option<T>> {
    let n_ctx = contexts.len();
    let longest = contexts.iter().map(|c| c.len()).max().unwrap_or(0);
    let mut logits = None;
    for (s, e) in prefill_chunks(longest, chunk) {
        let w = e - s;
        let mut ids = Vec::with_capacity(n_ctx * w);
        let mut valid = Vec::with_capacity(n_ctx * w);
        for c in contexts {
            let pad = longest - c.len();
            for k in s..e {
                let real = k >= pad;
                ids.push(if real { c[k - pad] } else { 0 });
                valid.push(real);
            }
        }
        let _t = crate::trace::span_with("prefill", || {
            vec![("rows", n_ctx.into()), ("tokens", w.into())]
        });
        let slots = Slots {
            batch: n_ctx,
            len: w,
            ids: &ids,
            valid: &valid,
        };
        logits = Some(step(cache, slots)?);
    }
    Ok(logits)
}

/// Where a wave's rows decode: step by step through the model (its cache holding `width` rows),
/// or through a recorded step ([`StepModel::decode_graph`]).
enum Decoder<C> {
    Steps { cache: C, width: usize },
    Replay(Box<dyn ReplayedStep<C>>),
}

/// One wave: prefill the parts' contexts, expand, decode until all rows finish. Results in the
/// order of the wave's samples.
fn run_wave<M: StepModel>(
    model: &M,
    decode: &DecodeFn<'_>,
    groups: &[Group],
    parts: &[Part],
    cfg: &GenConfig,
    on_step: &mut dyn FnMut(StepReport),
) -> Result<Vec<Generated>> {
    let vocab = model.vocab();
    let max_pos = model.max_positions();
    // Attention reads the whole cache buffer each step, so start small and let it grow (the
    // model grows it in chunks) rather than paying for max_new_tokens empty slots from step one.
    let room = cfg.stop.max_new_tokens.min(INITIAL_ROOM);
    // 1. Prefill (left-padded, in column chunks); 2. expand to one row per sample.
    let (cache, logits, mut rows, expand) = start_wave(
        model,
        groups,
        parts,
        room,
        cfg.prefill_chunk,
        |g, id, out| Row {
            response: RowResponse::new(cfg.seed, id, out),
            limit: cfg
                .stop
                .max_new_tokens
                .min(max_pos - groups[g].context.len()),
        },
    )?;
    let n_rows = rows.len();
    let mut results: Vec<Option<Generated>> = vec![None; n_rows];
    let mut replay = model.replays();
    // Where the rows decode, and `slot[r]`: the batch row of sample row `r` there.
    let mut dec = Decoder::Steps {
        cache,
        width: expand.len(),
    };
    let mut slot: Vec<usize> = (0..n_rows).collect();

    // 3. Decode. The first draw reads the prefill's logits (row r its context's, `expand[r]`).
    let mut drawn = draw_rows(&logits, &mut rows, &expand, vocab, cfg)?;
    loop {
        rows.par_iter_mut()
            .zip(drawn.par_iter())
            .try_for_each(|(row, &(tok, lp))| row.record(tok, lp, cfg, decode))?;
        let before = rows.len();
        let keep;
        (rows, keep) = retire_finished(rows, &mut results, |row, f| row.response.into_generated(f));
        slot = keep.iter().map(|&i| slot[i]).collect();
        on_step(StepReport {
            tokens: before,
            finished: before - rows.len(),
        });
        if rows.is_empty() {
            break;
        }
        // A recorded step keeps its finished rows as padding until half of its batch has
        // finished or its cache is full; then the cache is compacted to the live rows (and
        // grown) and the step recorded again for the new width.
        dec = match dec {
            Decoder::Replay(g) if g.room() > 0 && 2 * rows.len() > g.rows() => Decoder::Replay(g),
            other => {
                let (mut cache, width) = match other {
                    Decoder::Replay(g) => {
                        let width = g.rows();
                        (g.into_cache(), width)
                    }
                    Decoder::Steps { cache, width } => (cache, width),
                };
                reselect(model, &mut cache, width, &slot)?;
                slot = (0..rows.len()).collect();
                let width = rows.len();
                if replay {
                    let steps = rows
                        .iter()
                        .map(|r| r.limit - r.response.ids.len())
                        .max()
                        .unwrap_or(1);
                    match model.decode_graph(cache, steps, cfg)? {
                        Ok(g) => Decoder::Replay(g),
                        Err(cache) => {
                            replay = false;
                            Decoder::Steps { cache, width }
                        }
                    }
                } else {
                    Decoder::Steps { cache, width }
                }
            }
        };
        let next = |r: &Row| *r.response.ids.last().unwrap_or(&0);
        drawn = match &mut dec {
            Decoder::Steps { cache, .. } => {
                let ids: Vec<u32> = rows.iter().map(next).collect();
                let valid = vec![true; ids.len()];
                let _t =
                    crate::trace::span_with("decode step", || vec![("rows", ids.len().into())]);
                let slots = Slots {
                    batch: ids.len(),
                    len: 1,
                    ids: &ids,
                    valid: &valid,
                };
                let logits = step_logits(model, cache, slots)?;
                draw_rows(&logits, &mut rows, &slot, vocab, cfg)?
            }
            Decoder::Replay(g) => {
                let b = g.rows();
                let (mut ids, mut live, mut u) = (vec![0u32; b], vec![false; b], vec![0f64; b]);
                for (row, &s) in rows.iter_mut().zip(&slot) {
                    ids[s] = next(row);
                    live[s] = true;
                    u[s] = uniform(&mut row.response.rng);
                }
                let _t = crate::trace::span_with("replayed decode step", || {
                    vec![("rows", b.into()), ("live", slot.len().into())]
                });
                let out = g.step(&ids, &live, &u)?;
                slot.iter()
                    .map(|&s| out.get(s).copied())
                    .collect::<Option<Vec<_>>>()
                    .context("internal: a replayed step returned too few rows")?
            }
        };
    }
    wave_results(results)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::stop::tests::toy_decode;
    use super::*;

    /// A deterministic toy model: the logits of a row are a hash of every real token it has seen,
    /// so any mix-up of rows, caches or positions changes the output.
    pub(crate) struct Toy {
        pub vocab: usize,
        pub max_pos: usize,
        /// Logit bonus of the EOS id 0 (higher = shorter responses).
        pub eos_bias: f32,
    }

    pub(crate) struct ToyCache {
        rows: Vec<Vec<u32>>,
        slots: usize,
    }

    fn mix(mut h: u64, x: u64) -> u64 {
        h ^= x
            .wrapping_add(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(h << 6)
            .wrapping_add(h >> 2);
        h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h ^ (h >> 31)
    }

    impl StepModel for Toy {
        type Cache = ToyCache;
        fn vocab(&self) -> usize {
            self.vocab
        }
        fn max_positions(&self) -> usize {
            self.max_pos
        }
        fn new_cache(&self, batch: usize, _capacity: usize) -> Result<ToyCache> {
            Ok(ToyCache {
                rows: vec![Vec::new(); batch],
                slots: 0,
            })
        }
        fn step(&self, cache: &mut ToyCache, slots: Slots<'_>) -> Result<Vec<f32>> {
            let Slots {
                batch,
                len,
                ids,
                valid,
            } = slots;
            assert_eq!(batch, cache.rows.len());
            let mut out = Vec::with_capacity(batch * self.vocab);
            for r in 0..batch {
                for s in 0..len {
                    if valid[r * len + s] {
                        cache.rows[r].push(ids[r * len + s]);
                    }
                }
                let h = cache.rows[r].iter().fold(1u64, |h, &t| mix(h, t as u64));
                for v in 0..self.vocab {
                    let x = mix(h, v as u64);
                    let mut l = (x % 10_000) as f32 / 1000.0 - 5.0;
                    if v == 0 {
                        l += self.eos_bias;
                    }
                    out.push(l);
                }
            }
            cache.slots += len;
            Ok(out)
        }
        fn select_rows(&self, cache: &mut ToyCache, rows: &[usize]) -> Result<()> {
            cache.rows = rows.iter().map(|&r| cache.rows[r].clone()).collect();
            Ok(())
        }
    }

    /// One row of `ids` (no padding) appended to `cache`; the host logits of its last slot.
    pub(crate) fn step_row<M: StepModel>(model: &M, cache: &mut M::Cache, ids: &[u32]) -> Vec<f32> {
        let valid = vec![true; ids.len()];
        let slots = Slots {
            batch: 1,
            len: ids.len(),
            ids,
            valid: &valid,
        };
        model.step(cache, slots).unwrap()
    }

    pub(crate) fn toy() -> Toy {
        Toy {
            vocab: 300,
            max_pos: 64,
            eos_bias: 3.0,
        }
    }

    fn cfg(batch_size: usize) -> GenConfig {
        GenConfig {
            params: SamplingParams::default(),
            stop: StopCriteria {
                eos: vec![0],
                stop_strings: vec![],
                max_new_tokens: 20,
            },
            allowed_vocab: 256,
            seed: 42,
            batch_size,
            prefill_chunk: 3,
        }
    }

    fn groups() -> Vec<Group> {
        let ctx = [
            vec![72u32, 105, 33],
            vec![1, 2],
            vec![9, 9, 9, 9, 9, 9, 9],
            vec![5],
        ];
        groups_of(&ctx, 3, "p")
    }

    /// Answers `0..n` of prompt `prompt_id`.
    pub(crate) fn sample_ids(prompt_id: &str, n: u32) -> Vec<SampleId> {
        (0..n)
            .map(|k| SampleId {
                prompt_id: prompt_id.to_string(),
                answer_idx: k,
                confidence_idx: None,
            })
            .collect()
    }

    /// One group per context `j`, of `n` answers of prompt `{prefix}{j}`.
    pub(crate) fn groups_of(contexts: &[Vec<u32>], n: u32, prefix: &str) -> Vec<Group> {
        contexts
            .iter()
            .enumerate()
            .map(|(j, c)| Group {
                context: c.clone(),
                samples: sample_ids(&format!("{prefix}{j}"), n),
            })
            .collect()
    }

    /// The same sample generated alone, without the sampler (reference).
    fn alone(model: &Toy, ctx: &[u32], id: &SampleId, cfg: &GenConfig) -> Generated {
        let mut c = model.new_cache(1, 0).unwrap();
        let mut logits = step_row(model, &mut c, ctx);
        let mut rng = sample_rng(cfg.seed, &id.key());
        let mut pr = Processor::new();
        let mut ids = Vec::new();
        let mut lps = Vec::new();
        let finish = loop {
            let t = pr.choose(&logits, cfg.allowed_vocab, &cfg.params, uniform(&mut rng));
            ids.push(t);
            lps.push(super::super::logits::logprob_of(&logits, t as usize));
            if t == 0 {
                break FinishReason::Stop;
            }
            if ids.len() == cfg.stop.max_new_tokens.min(model.max_pos - ctx.len()) {
                break FinishReason::Length;
            }
            logits = step_row(model, &mut c, &[t]);
        };
        let text_ids: Vec<u32> = ids.iter().copied().filter(|&t| t != 0).collect();
        Generated {
            text: toy_decode(&text_ids).unwrap(),
            ends: Vec::new(),
            ids,
            logprobs: lps,
            finish,
        }
    }

    #[test]
    fn prefill_chunks_are_never_narrow() {
        assert_eq!(prefill_chunks(10, 4), vec![(0, 10)]);
        assert_eq!(prefill_chunks(20, 8), vec![(0, 8), (8, 20)]);
        assert_eq!(prefill_chunks(24, 8), vec![(0, 8), (8, 16), (16, 24)]);
        assert_eq!(prefill_chunks(530, 512), vec![(0, 512), (512, 530)]);
        assert_eq!(prefill_chunks(517, 512), vec![(0, 517)]);
        assert_eq!(prefill_chunks(600, 512), vec![(0, 512), (512, 600)]);
        assert_eq!(prefill_chunks(3, 512), vec![(0, 3)]);
        assert_eq!(prefill_chunks(0, 512), vec![]);
    }

    #[test]
    fn waves_are_planned_in_order() {
        let w = plan_waves(&[3, 5, 1], 4);
        assert_eq!(
            w,
            vec![
                vec![
                    WavePart {
                        group: 0,
                        samples: 0..3
                    },
                    WavePart {
                        group: 1,
                        samples: 0..1
                    }
                ],
                vec![WavePart {
                    group: 1,
                    samples: 1..5
                }],
                vec![WavePart {
                    group: 2,
                    samples: 0..1
                }],
            ]
        );
        assert_eq!(plan_waves(&[], 4), Vec::<Vec<WavePart>>::new());
        assert_eq!(plan_waves(&[2], 0).len(), 2);
    }

    #[test]
    fn batched_equals_alone_for_every_batch_size() {
        let m = toy();
        let gs = groups();
        let reference: Vec<Vec<Generated>> = gs
            .iter()
            .map(|g| {
                g.samples
                    .iter()
                    .map(|s| alone(&m, &g.context, s, &cfg(1)))
                    .collect()
            })
            .collect();
        // The sampled responses differ across samples of one group (own streams) ...
        assert_ne!(reference[0][0].ids, reference[0][1].ids);
        let mut lengths = std::collections::BTreeSet::new();
        for b in [1, 2, 5, 12, 100] {
            let mut steps = 0;
            let mut tokens = 0;
            let got = generate(&m, &toy_decode, &gs, &cfg(b), &mut |r| {
                steps += 1;
                tokens += r.tokens;
            })
            .unwrap();
            for (g, (a, r)) in got.iter().zip(&reference).enumerate() {
                for (s, (x, y)) in a.iter().zip(r).enumerate() {
                    assert_eq!(x.ids, y.ids, "batch {b} group {g} sample {s}");
                    assert_eq!(x.logprobs, y.logprobs);
                    assert_eq!(x.finish, y.finish);
                    assert_eq!(x.text, y.text);
                    assert_eq!(x.ends.len(), x.ids.len());
                    lengths.insert(x.ids.len());
                }
            }
            let total: usize = got.iter().flatten().map(|g| g.ids.len()).sum();
            assert_eq!(tokens, total);
            assert!(steps > 0);
        }
        // ... and rows finish at different times (the compaction path is exercised).
        assert!(lengths.len() > 3, "{lengths:?}");
    }

    #[test]
    fn stop_strings_and_length_limits() {
        let m = Toy {
            eos_bias: -100.0,
            ..toy()
        };
        let gs = groups();
        let mut c = cfg(4);
        c.stop.max_new_tokens = 5;
        let got = generate(&m, &toy_decode, &gs, &c, &mut |_| {}).unwrap();
        assert!(got
            .iter()
            .flatten()
            .all(|g| g.ids.len() == 5 && g.finish == FinishReason::Length));
        // Context near the model's limit: the response is cut at max_pos.
        let long = vec![Group {
            context: vec![7; 62],
            samples: vec![SampleId {
                prompt_id: "x".into(),
                answer_idx: 0,
                confidence_idx: None,
            }],
        }];
        let got = generate(&m, &toy_decode, &long, &c, &mut |_| {}).unwrap();
        assert_eq!(got[0][0].ids.len(), 2);
        assert_eq!(got[0][0].finish, FinishReason::Length);
        // Too long: a clear error naming the prompt.
        let too_long = vec![Group {
            context: vec![7; 64],
            samples: long[0].samples.clone(),
        }];
        let e = generate(&m, &toy_decode, &too_long, &c, &mut |_| {}).unwrap_err();
        assert!(
            format!("{e}").contains("prompt x") && format!("{e}").contains("64 tokens"),
            "{e}"
        );
        // A stop string made of a character the first sample produces: the response ends at it.
        // (ASCII ids only, so that token i is character i.)
        c.allowed_vocab = 128;
        let first = &generate(&m, &toy_decode, &gs[..1], &c, &mut |_| {}).unwrap()[0][0];
        let ch = first.text.chars().nth(2).unwrap().to_string();
        c.stop.stop_strings = vec![ch.clone()];
        let cut = &generate(&m, &toy_decode, &gs[..1], &c, &mut |_| {}).unwrap()[0][0];
        assert_eq!(cut.finish, FinishReason::Stop);
        assert!(cut.text.ends_with(&ch), "{:?}", cut.text);
        assert!(cut.ids.len() <= 3);
        assert_eq!(cut.ids[..], first.ids[..cut.ids.len()]);
        assert_eq!(cut.ids.len(), first.text.find(&ch).unwrap() + 1);
    }

    #[test]
    fn greedy_follows_argmax() {
        let m = toy();
        let mut c = cfg(3);
        c.params = SamplingParams::greedy();
        c.stop.max_new_tokens = 6;
        let gs = groups();
        let got = generate(&m, &toy_decode, &gs, &c, &mut |_| {}).unwrap();
        for (g, res) in gs.iter().zip(&got) {
            // every sample of a group is the same greedy continuation
            assert!(res.iter().all(|r| r.ids == res[0].ids));
            let mut cache = m.new_cache(1, 0).unwrap();
            let mut l = step_row(&m, &mut cache, &g.context);
            for &t in &res[0].ids {
                assert_eq!(t as usize, super::super::logits::argmax(&l, 256));
                l = step_row(&m, &mut cache, &[t]);
            }
        }
    }
}
