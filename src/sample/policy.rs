//! The sampling policy: a loaded [`Model`] seen by the sampler, plus the conversation encoding of
//! the two turns.
//!
//! Design decisions:
//! - [`Policy`] implements [`StepModel`] over the model's [`Transformer`] and [`KvCache`]: a step
//!   is one cached forward. On the CPU its last-position logits `[B, V]` go to the host sampler;
//!   on a GPU they stay on the device and [`super::draw`] samples there, so a decode step reads
//!   back only the sampled ids and their log-probs (the KV cache never leaves the device).
//! - **Generation prompts**: a conversation ending with a user message is rendered with the
//!   template's generation prompt; one ending with an assistant message is *continued* (HF's
//!   `continue_final_message`: render without the generation prompt and cut right after the last
//!   occurrence of the final message's stripped content). That is how a response prefix (a
//!   pre-filled `<think>`, TinyZero's "Let me solve this step by step.\n<think>") is written down
//!   in the `messages` column.
//! - **Turn 2 keeps turn 1's tokens**: the confidence context is the rendered conversation with the
//!   answer spliced in as the **sampled ids** (`encode(text before) ++ response ids ++
//!   encode(text after)`), not a re-tokenisation of the answer text, which could differ from what
//!   was sampled (byte-level BPE does not round-trip arbitrary sampled sequences). The split
//!   points come from rendering once with a sentinel in place of the answer; if the template
//!   rewrites assistant content (some drop earlier turns' reasoning) the splice is impossible
//!   and the whole text is tokenised instead (counted and reported).
use std::path::Path;

use anyhow::{bail, Context, Result};
use burn::tensor::Device;

use super::sampler::{GenConfig, ReplayedStep, Slots, StepModel};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::model::graph::DecodeGraph;
use crate::model::graph::GraphMode;
use crate::model::{self, ChatOptions, KvCache, Message, Model};

/// A model ready to sample from.
pub struct Policy {
    pub model: Model,
    /// See [`super::fingerprint`].
    pub fingerprint: String,
    /// Sample on the model's device ([`super::draw`]); `false`: on the host (the default on the
    /// CPU, where the host sampler is the reference and nothing needs to cross).
    pub device_draw: bool,
    /// Decode steps recorded once per batch width and replayed ([`crate::model::graph`];
    /// `RLCR_CUDA_GRAPH`), or launched step by step (`None`). `Eager` runs
    /// the recorded path's steps without a recording: the reference a replay is tested against.
    pub decode_graph: Option<GraphMode>,
    /// How its prompts are rendered (recorded in the outputs' metadata).
    pub chat: ChatOptions,
}

impl Policy {
    /// Load the model folder `dir` on `device`, render its prompts as `chat` says, and
    /// fingerprint it.
    pub fn load(dir: &Path, device: &Device, chat: &ChatOptions) -> Result<Self> {
        Self::open(dir, None, device, chat)
    }

    /// [`Policy::load`] with a LoRA `adapter` folder merged into the base folder `dir` (`None`:
    /// `dir` alone, which may itself be an adapter folder).
    pub fn open(
        dir: &Path,
        adapter: Option<&Path>,
        device: &Device,
        chat: &ChatOptions,
    ) -> Result<Self> {
        let mut model =
            Model::open(dir, adapter, device, model::AdapterUse::Merge).with_context(|| {
                match adapter {
                    Some(a) => format!(
                        "loading the model {} with the adapter {}",
                        dir.display(),
                        a.display()
                    ),
                    None => format!("loading the model {}", dir.display()),
                }
            })?;
        model.set_chat_options(chat)?;
        let fingerprint = super::fingerprint::fingerprint_with(dir, adapter)?;
        Ok(Policy {
            model,
            fingerprint,
            device_draw: crate::model::ops::draws_on_device(device),
            decode_graph: crate::model::ops::replays_decode(device).then_some(GraphMode::Replay),
            chat: chat.clone(),
        })
    }

    /// Ids below this can be sampled: the LM head's full width (see [`super::logits`]).
    pub fn allowed_vocab(&self) -> usize {
        self.model.transformer.dims.vocab
    }

    /// Decode ids with special tokens kept (the tags of the fixture tokenizers are special).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.model.tokenizer.decode(ids, false)
    }

    /// Render `messages` for generation (see the module docs): the text the model continues.
    pub fn render_for_generation(&self, messages: &[Message]) -> Result<String> {
        let chat = self.model.chat()?;
        match messages.last() {
            Some(m) if m.role == "assistant" => {
                let full = chat.render(messages, false)?;
                // The exact content first; the stripped one (HF's rule) for templates that trim.
                for content in [m.content.as_str(), m.content.trim()] {
                    if let Some(pos) = full.rfind(content) {
                        return Ok(full[..pos + content.len()].to_string());
                    }
                }
                bail!(
                    "the chat template does not write the final assistant message (the response \
                     prefix {:?}) into the prompt, so it cannot be continued",
                    m.content
                )
            }
            _ => chat.render(messages, true),
        }
    }

    /// Context of a turn-1 sample: (rendered text, ids).
    pub fn encode_context(&self, messages: &[Message]) -> Result<(String, Vec<u32>)> {
        let text = self.render_for_generation(messages)?;
        let ids = self.model.tokenizer.encode(&text, false)?;
        Ok((text, ids))
    }

    /// Context of a turn-2 sample: `before` (ending with the answer's user message or with a
    /// partial assistant message holding the response prefix), then the assistant message
    /// `prefix + answer_text` whose answer part is spliced in as `answer_ids`, then `after` (the
    /// confidence query and possibly a confidence prefix). Returns (rendered text, ids, whether
    /// the ids were spliced).
    pub fn encode_with_answer(
        &self,
        before: &[Message],
        answer_prefix: &str,
        answer_text: &str,
        answer_ids: &[u32],
        after: &[Message],
    ) -> Result<(String, Vec<u32>, bool)> {
        const SENTINEL: &str = "\u{E000}rlcr-answer\u{E001}";
        let build = |content: String| {
            let mut m = before.to_vec();
            m.push(Message {
                role: "assistant".into(),
                content,
            });
            m.extend_from_slice(after);
            m
        };
        let real = self.render_for_generation(&build(format!("{answer_prefix}{answer_text}")))?;
        let marked = self.render_for_generation(&build(format!("{answer_prefix}{SENTINEL}")))?;
        if let Some(pos) = marked.find(SENTINEL) {
            let (pre, post) = (&marked[..pos], &marked[pos + SENTINEL.len()..]);
            if !post.contains(SENTINEL)
                && real.len() == pre.len() + answer_text.len() + post.len()
                && real.starts_with(pre)
                && real.ends_with(post)
            {
                let tok = &self.model.tokenizer;
                let mut ids = tok.encode(pre, false)?;
                ids.extend_from_slice(answer_ids);
                ids.extend(tok.encode(post, false)?);
                return Ok((real, ids, true));
            }
        }
        let ids = self.model.tokenizer.encode(&real, false)?;
        Ok((real, ids, false))
    }
}

impl StepModel for Policy {
    type Cache = KvCache;

    fn vocab(&self) -> usize {
        self.model.transformer.dims.vocab
    }

    fn max_positions(&self) -> usize {
        self.model.config.max_position_embeddings
    }

    fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        Ok(KvCache::new(&self.model.transformer, batch, capacity))
    }

    fn step(&self, cache: &mut KvCache, slots: Slots<'_>) -> Result<Vec<f32>> {
        model::read_f32(self.step_device(cache, slots)?)
    }

    fn select_rows(&self, cache: &mut KvCache, rows: &[usize]) -> Result<()> {
        cache.select_rows(rows)
    }

    fn draws_on_device(&self) -> bool {
        self.device_draw
    }

    fn step_device(
        &self,
        cache: &mut KvCache,
        slots: Slots<'_>,
    ) -> Result<burn::tensor::Tensor<2>> {
        self.model.transformer.step(cache, &slots.to_batch()?)
    }

    fn replays(&self) -> bool {
        self.device_draw && self.decode_graph.is_some()
    }

    fn decode_graph(
        &self,
        cache: KvCache,
        steps: usize,
        cfg: &GenConfig,
    ) -> Result<std::result::Result<Box<dyn ReplayedStep<KvCache>>, KvCache>> {
        // A cache whose slots fell back to the host's description cannot run from fixed
        // buffers: the wave goes on step by step.
        let mode = match self.decode_graph {
            Some(mode) if cache.slots_on_device() => mode,
            _ => return Ok(Err(cache)),
        };
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        {
            let draw = (super::draw::draw_params(&cfg.params), cfg.allowed_vocab);
            let g = DecodeGraph::new(&self.model.transformer, cache, steps, Some(draw), mode)?;
            Ok(Ok(Box::new(g)))
        }
        // Without a GPU backend no cache describes its slots on the device.
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        {
            let _ = (mode, steps, cfg);
            Ok(Err(cache))
        }
    }
}

/// The sampler's view of a [`DecodeGraph`] with its draw: the drawn ids and log-probs read back
/// (`[rows, 2]`, one read a step).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl ReplayedStep<KvCache> for DecodeGraph {
    fn rows(&self) -> usize {
        self.batch()
    }

    fn room(&self) -> usize {
        DecodeGraph::room(self)
    }

    fn step(&mut self, tokens: &[u32], live: &[bool], uniforms: &[f64]) -> Result<Vec<(u32, f32)>> {
        // The draws in f32, as the step-by-step device draw uploads them.
        let u: Vec<f32> = uniforms.iter().map(|&x| x as f32).collect();
        let out = DecodeGraph::step(self, tokens, live, &u)?;
        let drawn = out
            .drawn
            .context("internal: a sampler's decode step without its draw")?;
        let v = model::read_f32(drawn)?;
        anyhow::ensure!(
            v.len() == 2 * tokens.len(),
            "internal: {} values for {} sampled tokens",
            v.len(),
            tokens.len()
        );
        Ok(v.chunks_exact(2).map(|c| (c[0] as u32, c[1])).collect())
    }

    fn into_cache(self: Box<Self>) -> KvCache {
        DecodeGraph::into_cache(*self)
    }
}

#[cfg(test)]
mod tests {
    //! The sampler on the fixture models (fixtures/tiny-qwen2, fixtures/tiny-llama) against
    //! transformers' figures (fixtures/refs) and the model's own cache-free log-probs.
    use std::path::PathBuf;

    use super::*;
    use crate::model::TokenBatch;
    use crate::sample::logits::SamplingParams;
    use crate::sample::sampler::tests::groups_of;
    use crate::sample::sampler::{generate, GenConfig, Generated, Group};
    use crate::sample::spans::{answer_span, Span};
    use crate::sample::stop::StopCriteria;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(name)
    }

    fn policy(name: &str) -> Policy {
        let device = crate::model::device_from_str("cpu").unwrap();
        Policy::load(&fixture(name), &device, &ChatOptions::default()).unwrap()
    }

    /// `(input_ids, greedy_next)` of every sequence of a reference file.
    fn refs(file: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
        let text = std::fs::read_to_string(fixture("refs").join(file)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ids = |x: &serde_json::Value| -> Vec<u32> {
            x.as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect()
        };
        v["sequences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (ids(&s["input_ids"]), ids(&s["greedy_next"])))
            .collect()
    }

    fn cfg(p: &Policy, params: SamplingParams, max_new: usize, batch: usize) -> GenConfig {
        GenConfig {
            params,
            stop: StopCriteria {
                eos: p.model.tokenizer.stop_ids.clone(),
                stop_strings: vec![],
                max_new_tokens: max_new,
            },
            allowed_vocab: p.allowed_vocab(),
            seed: 11,
            batch_size: batch,
            prefill_chunk: 16,
        }
    }

    /// Sampling with every filter on: temperature 0.7, top-k 50, top-p 0.9, min-p 0.01.
    fn filtered() -> SamplingParams {
        SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 50,
            min_p: 0.01,
        }
    }

    fn groups(contexts: &[Vec<u32>], n: u32) -> Vec<Group> {
        groups_of(contexts, n, "q")
    }

    fn run(p: &Policy, gs: &[Group], c: &GenConfig) -> Vec<Vec<Generated>> {
        let decode = |ids: &[u32]| p.decode(ids);
        generate(p, &decode, gs, c, &mut |_| {}).unwrap()
    }

    fn chat_contexts(model: &str) -> Vec<Vec<u32>> {
        refs(&format!("{model}.chat.f32.json"))
            .into_iter()
            .map(|(ids, _)| ids)
            .collect()
    }

    #[test]
    fn temperature_zero_is_transformers_greedy() {
        for model in ["tiny-qwen2", "tiny-llama"] {
            let p = policy(model);
            // Every prefix of every reference sequence as its own context, ragged in one run:
            // the first greedy token must be transformers' argmax at that position.
            let mut contexts = Vec::new();
            let mut expect = Vec::new();
            for file in ["seqs.f64.json", "chat.f32.json"] {
                for (ids, greedy) in refs(&format!("{model}.{file}")) {
                    for t in (0..ids.len()).step_by(3) {
                        contexts.push(ids[..=t].to_vec());
                        expect.push(greedy[t]);
                    }
                }
            }
            let c = cfg(&p, SamplingParams::greedy(), 1, 7);
            let got = run(&p, &groups(&contexts, 1), &c);
            let firsts: Vec<u32> = got.iter().map(|g| g[0].ids[0]).collect();
            assert_eq!(firsts, expect, "{model}");
            assert!(
                expect.iter().any(|&t| t >= 360),
                "{model}: padded rows are reachable"
            );
        }
    }

    #[test]
    fn greedy_continuation_equals_cache_free_argmax() {
        let p = policy("tiny-qwen2");
        let contexts = chat_contexts("tiny-qwen2");
        let mut c = cfg(&p, SamplingParams::greedy(), 12, 4);
        c.stop.eos.clear();
        let got = run(&p, &groups(&contexts, 2), &c);
        for (ctx, g) in contexts.iter().zip(&got) {
            assert_eq!(g[0].ids, g[1].ids, "greedy samples of one prompt agree");
            // Independent path: the cache-free forward on the growing sequence.
            let mut seq = ctx.clone();
            for &t in &g[0].ids {
                let input = TokenBatch::left_padded(&[seq.clone()]);
                let logits =
                    crate::model::read_f32(p.model.transformer.forward(&input).unwrap()).unwrap();
                let v = p.vocab();
                let last = &logits[(seq.len() - 1) * v..seq.len() * v];
                assert_eq!(t as usize, crate::sample::logits::argmax(last, v));
                seq.push(t);
            }
        }
    }

    #[test]
    fn behaviour_logprobs_equal_recomputed_logprobs() {
        for model in ["tiny-qwen2", "tiny-llama"] {
            let p = policy(model);
            let contexts = chat_contexts(model);
            for params in [SamplingParams::default(), filtered()] {
                let got = run(&p, &groups(&contexts, 3), &cfg(&p, params, 24, 4));
                let mut rows: Vec<(&[u32], &[u32])> = Vec::new();
                let mut ours: Vec<&[f32]> = Vec::new();
                for (ctx, g) in contexts.iter().zip(&got) {
                    for s in g {
                        rows.push((ctx, &s.ids));
                        ours.push(&s.logprobs);
                    }
                }
                let re =
                    crate::model::logprobs(&p.model.transformer, &rows, 5, false, None).unwrap();
                let mut worst = 0f32;
                for (a, b) in ours.iter().zip(&re.logprobs) {
                    assert_eq!(a.len(), b.len());
                    for (x, y) in a.iter().zip(b) {
                        worst = worst.max((x - y).abs());
                    }
                }
                assert!(worst < 1e-4, "{model} {params:?}: max |Δ| = {worst}");
            }
        }
    }

    #[test]
    fn same_results_for_any_batch_size() {
        let p = policy("tiny-llama");
        let mut contexts = chat_contexts("tiny-llama");
        contexts.push(contexts[0][..20].to_vec());
        contexts.extend(
            refs("tiny-llama.rand.f64.json")
                .into_iter()
                .take(2)
                .map(|(ids, _)| ids),
        );
        let gs = groups(&contexts, 4);
        let base = run(&p, &gs, &cfg(&p, SamplingParams::default(), 20, 1));
        let lens: std::collections::BTreeSet<usize> =
            base.iter().flatten().map(|g| g.ids.len()).collect();
        assert!(lens.len() > 1, "rows finish at different times: {lens:?}");
        for b in [3, 5, 16] {
            let got = run(&p, &gs, &cfg(&p, SamplingParams::default(), 20, b));
            for (x, y) in got.iter().flatten().zip(base.iter().flatten()) {
                assert_eq!(x.ids, y.ids, "batch {b}");
                assert_eq!(x.logprobs, y.logprobs, "batch {b}");
                assert_eq!(x.text, y.text, "batch {b}");
            }
        }
    }

    /// The device draw ([`crate::sample::draw`], here on the CPU's tensors) through the whole
    /// sampler: the host sampler's tokens, log-probs within f32 rounding.
    #[test]
    fn device_draw_generates_the_host_samples() {
        for model in ["tiny-qwen2", "tiny-llama"] {
            let mut p = policy(model);
            let contexts = chat_contexts(model);
            for params in [
                SamplingParams::default(),
                SamplingParams::greedy(),
                filtered(),
            ] {
                let c = cfg(&p, params, 16, 5);
                p.device_draw = false;
                let host = run(&p, &groups(&contexts, 3), &c);
                p.device_draw = true;
                let dev = run(&p, &groups(&contexts, 3), &c);
                let mut worst = 0f32;
                for (h, d) in host.iter().flatten().zip(dev.iter().flatten()) {
                    assert_eq!(h.ids, d.ids, "{model} {params:?}");
                    assert_eq!(h.text, d.text);
                    for (x, y) in h.logprobs.iter().zip(&d.logprobs) {
                        worst = worst.max((x - y).abs());
                    }
                }
                assert!(
                    worst < 1e-5,
                    "{model} {params:?}: log-probs differ by {worst}"
                );
            }
        }
    }

    /// `RLCR_CUDA_GRAPH=on` on wgpu (lavapipe in CI): the sampler decoding through recorded
    /// and replayed steps, finished rows kept as padding until half of a batch has finished,
    /// gives the tokens, log-probs and texts of the same steps launched one by one, bit for bit,
    /// and the tokens and texts of the step-by-step sampler that compacts its batch every step
    /// (log-probs within f32 rounding: the batch widths differ). The replayed run launches
    /// fewer kernels than either.
    #[cfg(feature = "wgpu")]
    #[test]
    fn decode_graph_replays_generate_the_step_by_step_samples() {
        use crate::model::transfer::thread_launches;
        let dev = crate::model::backend::gpu::test_device();
        for model in ["tiny-qwen2", "tiny-llama"] {
            let mut p = Policy::load(&fixture(model), &dev, &ChatOptions::default()).unwrap();
            assert!(p.device_draw);
            let contexts = chat_contexts(model);
            for params in [SamplingParams::default(), filtered()] {
                let mut c = cfg(&p, params, 12, 6);
                // One id in eight ends a row, so rows finish at different steps: the recorded
                // path keeps them as padding, records again at half its width, and the
                // step-by-step sampler compacts every step.
                c.stop.eos = (5..p.allowed_vocab() as u32).step_by(8).collect();
                let mut runs = Vec::new();
                for mode in [None, Some(GraphMode::Eager), Some(GraphMode::Replay)] {
                    p.decode_graph = mode;
                    assert_eq!(p.replays(), mode.is_some());
                    let l0 = thread_launches();
                    let out = run(&p, &groups(&contexts, 3), &c);
                    runs.push((out, thread_launches() - l0));
                }
                let [(steps, l_steps), (eager, l_eager), (replay, l_replay)] =
                    <[_; 3]>::try_from(runs).unwrap();
                let lens: std::collections::BTreeSet<usize> =
                    steps.iter().flatten().map(|g| g.ids.len()).collect();
                assert!(lens.len() > 1, "{model}: rows finish at {lens:?} tokens");
                eprintln!(
                    "{model} {params:?}: launches step by step {l_steps}, recorded path eager \
                     {l_eager}, replayed {l_replay}; response lengths {lens:?}"
                );
                let mut worst = 0f32;
                for ((s, e), r) in steps.iter().zip(&eager).zip(&replay) {
                    for ((s, e), r) in s.iter().zip(e).zip(r) {
                        assert_eq!(r, e, "{model} {params:?}: replayed vs eager");
                        assert_eq!(
                            (&r.ids, &r.text, &r.finish),
                            (&s.ids, &s.text, &s.finish),
                            "{model} {params:?}: replayed vs step by step"
                        );
                        for (x, y) in r.logprobs.iter().zip(&s.logprobs) {
                            worst = worst.max((x - y).abs());
                        }
                    }
                }
                eprintln!("{model} {params:?}: max |replayed - step by step| log-prob {worst:e}");
                assert!(worst < 1e-5, "{model} {params:?}: {worst}");
                assert!(
                    l_replay < l_eager && l_replay < l_steps,
                    "{model}: {l_replay} launches replayed"
                );
            }
        }
    }

    /// The policy with a script: at response position i, token `script[i]` (if any) gets +100
    /// on its logit, which makes it certain. Tags then appear where the script puts them.
    struct Forced<'a> {
        p: &'a Policy,
        script: Vec<Option<u32>>,
    }

    impl StepModel for Forced<'_> {
        type Cache = (KvCache, usize);
        fn vocab(&self) -> usize {
            self.p.vocab()
        }
        fn max_positions(&self) -> usize {
            self.p.max_positions()
        }
        fn new_cache(&self, batch: usize, capacity: usize) -> Result<Self::Cache> {
            Ok((self.p.new_cache(batch, capacity)?, 0))
        }
        fn step(&self, cache: &mut Self::Cache, slots: Slots<'_>) -> Result<Vec<f32>> {
            let mut l = self.p.step(&mut cache.0, slots)?;
            // Prefill calls have len > 1 (contexts are long); each decode call is one position.
            cache.1 = if slots.len > 1 { 0 } else { cache.1 + 1 };
            if let Some(Some(t)) = self.script.get(cache.1) {
                let v = self.vocab();
                for r in 0..slots.batch {
                    l[r * v + *t as usize] += 100.0;
                }
            }
            Ok(l)
        }
        fn select_rows(&self, cache: &mut Self::Cache, rows: &[usize]) -> Result<()> {
            self.p.select_rows(&mut cache.0, rows)
        }
    }

    #[test]
    fn forced_tags_give_spans_that_decode_to_the_tags() {
        let p = policy("tiny-qwen2");
        let tok = &p.model.tokenizer;
        let enc = |s: &str| tok.encode(s, false).unwrap();
        let special = |s: &str| tok.token_id(s).unwrap();
        // "x" + "<think>" spelled as plain text pieces (not the special token) + 3 free tokens +
        // </think><answer> (special) + "42" + "</answer>" split as "</ans" + "wer>" + "\n" + EOS.
        let mut script: Vec<Option<u32>> = vec![Some(enc("x")[0])];
        let open: Vec<u32> = [enc("<th"), enc("ink>")].concat();
        assert!(open.len() >= 2, "the opening tag is split over tokens");
        script.extend(open.iter().map(|&t| Some(t)));
        script.extend([None, None, None]);
        script.push(Some(special("</think>")));
        script.push(Some(special("<answer>")));
        script.extend(enc("42").into_iter().map(Some));
        let close: Vec<u32> = [enc("</ans"), enc("wer>")].concat();
        script.extend(close.iter().map(|&t| Some(t)));
        script.extend(enc("\n").into_iter().map(Some));
        script.push(Some(tok.stop_ids[0]));
        let f = Forced {
            p: &p,
            script: script.clone(),
        };
        let contexts = chat_contexts("tiny-qwen2");
        let mut c = cfg(&p, SamplingParams::default(), 40, 4);
        c.stop.eos = vec![tok.stop_ids[0]];
        let decode = |ids: &[u32]| p.decode(ids);
        let got = generate(&f, &decode, &groups(&contexts, 3), &c, &mut |_| {}).unwrap();
        for g in got.iter().flatten() {
            assert_eq!(g.ids.len(), script.len(), "{:?}", g.text);
            let span = answer_span(&g.text, &g.ends, false).expect("span found");
            assert_eq!(
                span,
                Span {
                    start: 1,
                    end: script.len() - 2
                }
            );
            let text = p.decode(&g.ids[span.start..span.end]).unwrap();
            assert!(
                text.starts_with("<think>") && text.ends_with("</answer>"),
                "{text:?}"
            );
            // The tokenizer's own streaming offsets agree with the sampler's.
            let d = p
                .model
                .tokenizer
                .decode_with_offsets(&g.ids[..g.ids.len() - 1])
                .unwrap();
            assert_eq!(d.text, g.text);
            let a = g.text.find("<think>").unwrap();
            let b = g.text.rfind("</answer>").unwrap() + "</answer>".len();
            assert_eq!(d.tokens_covering(a..b), Some(span.start..span.end));
            // The prefilled variant starts at 0.
            assert_eq!(
                answer_span(&g.text, &g.ends, true).map(|s| s.start),
                Some(0)
            );
        }
    }

    #[test]
    fn confidence_context_splices_the_sampled_answer_ids() {
        let p = policy("tiny-qwen2");
        let before = vec![
            Message::new("system", "sys"),
            Message::new("user", "What is 12 + 7?"),
        ];
        // An answer whose ids are not the canonical tokenization of its text: "ab" as two
        // single-byte tokens where BPE may merge them differently.
        let answer_ids: Vec<u32> = [
            p.model.tokenizer.encode("a", false).unwrap(),
            p.model.tokenizer.encode("b", false).unwrap(),
            vec![p.model.tokenizer.token_id("<answer>").unwrap()],
        ]
        .concat();
        let answer_text = p.decode(&answer_ids).unwrap();
        let after = vec![Message::new("user", "conf?")];
        let (text, ids, spliced) = p
            .encode_with_answer(&before, "", &answer_text, &answer_ids, &after)
            .unwrap();
        assert!(spliced);
        assert_eq!(
            p.decode(&ids).unwrap(),
            text,
            "the ids decode to the rendered conversation"
        );
        let s = ids
            .windows(answer_ids.len())
            .position(|w| w == answer_ids.as_slice());
        assert!(s.is_some(), "context contains the answer's ids");
        assert!(text.ends_with("<|im_start|>assistant\n"), "{text:?}");
        assert!(
            text.contains(
                "<|im_start|>assistant\nab<answer><|im_end|>\n<|im_start|>user\nconf?<|im_end|>"
            ),
            "{text:?}"
        );
        // A response prefix in the answer conversation and a confidence prefix after the query.
        let after2 = vec![
            Message::new("user", "conf?"),
            Message::new("assistant", "<analysis>"),
        ];
        let (text2, ids2, ok2) = p
            .encode_with_answer(&before, "<think>", &answer_text, &answer_ids, &after2)
            .unwrap();
        assert!(ok2);
        assert!(
            text2.ends_with("<|im_start|>assistant\n<analysis>"),
            "{text2:?}"
        );
        assert!(
            text2.contains("assistant\n<think>ab<answer><|im_end|>"),
            "{text2:?}"
        );
        assert!(ids2
            .windows(answer_ids.len())
            .any(|w| w == answer_ids.as_slice()));
    }
}
#[cfg(test)]
mod backend_rounding {
    //! What the sampler's batch-size independence rests on, checked on the backend in use: a
    //! row's logits do not depend on how many rows share the step, nor on how its context is cut
    //! into chunks (of 8 slots or more), nor on left padding or cache capacity.
    use super::*;

    #[test]
    fn row_logits_do_not_depend_on_the_batch_layout() {
        let device = crate::model::device_from_str("cpu").unwrap();
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-llama");
        let p = Policy::load(&dir, &device, &ChatOptions::default()).unwrap();
        let v = p.vocab();
        // Feed `chunks` (each: per-row ids and validity of `w` slots) and return row 0's logits.
        let run = |rows: usize, chunks: &[(Vec<u32>, Vec<bool>)], cap: usize| -> Vec<f32> {
            let mut c = p.new_cache(rows, cap).unwrap();
            let mut l = Vec::new();
            for (ids, valid) in chunks {
                let w = ids.len() / rows;
                let slots = Slots {
                    batch: rows,
                    len: w,
                    ids,
                    valid,
                };
                l = p.step(&mut c, slots).unwrap();
            }
            l[..v].to_vec()
        };
        let ctx: Vec<u32> = (1..=40).collect();
        let whole =
            |rows: usize, cap: usize| run(rows, &[(ctx.repeat(rows), vec![true; 40 * rows])], cap);
        let base = whole(8, 64);
        for rows in [1, 2, 5, 16, 33] {
            assert_eq!(whole(rows, 64), base, "{rows} rows");
        }
        assert_eq!(whole(8, 256), base, "cache capacity");
        // chunked prefill, 8-slot chunks
        let chunks: Vec<(Vec<u32>, Vec<bool>)> = ctx
            .chunks(8)
            .map(|c| (c.repeat(8), vec![true; c.len() * 8]))
            .collect();
        assert_eq!(run(8, &chunks, 64), base, "chunks of 8");
        // left padding of row 0 by 11 slots
        let mut ids = vec![0u32; 11];
        ids.extend(&ctx);
        let mut valid = vec![false; 11];
        valid.extend(vec![true; 40]);
        let rows: Vec<u32> = (0..8).flat_map(|_| ids.clone()).collect();
        let vs: Vec<bool> = (0..8).flat_map(|_| valid.clone()).collect();
        assert_eq!(run(8, &[(rows, vs)], 64), base, "left padding");
        // decode steps: 1 to 33 rows agree
        let step = |n: usize| run(n, &[(vec![5u32; n], vec![true; n])], 64);
        let s8 = step(8);
        for n in [1, 2, 3, 5, 16, 17, 33] {
            assert_eq!(step(n), s8, "step with {n} rows");
        }
    }
}
