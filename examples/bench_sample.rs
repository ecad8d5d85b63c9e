//! Sampling speed of rlcr's batched sampler (the code path of `generate-answers`): prefill once
//! per prompt, expand, decode with the KV cache, temperature-1 sampling with per-sample streams.
//!
//! ```text
//! cargo run --release --example bench_sample -- [MODEL_DIR | smollm2] [BATCH] [NEW] [PROMPTS]
//! ```
//! `smollm2` builds random weights with SmolLM2-135M-Instruct's shape (the speed does not depend
//! on the values) and samples from a 32-token prompt; a folder path loads a real checkpoint and
//! uses its chat template on a short question. Defaults: smollm2, batch 8, 128 new tokens,
//! PROMPTS = BATCH distinct prompts (1 sample each; pass 1 to sample BATCH answers of one prompt,
//! sharing its prefill). EOS is ignored so that every row makes exactly NEW tokens, as in the
//! transformers reference (71.8 tok/s for 8 × 128 new tokens, fp32, 2 threads, this machine).
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rlcr::model::{self, weights, ModelConfig};
use rlcr::sample::policy::Policy;
use rlcr::sample::sampler::{generate, GenConfig, Group, SampleId, Slots, StepModel};
use rlcr::sample::{SamplingParams, StopCriteria};

const SMOLLM2: &str = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama",
 "vocab_size":49152,"hidden_size":576,"intermediate_size":1536,"num_hidden_layers":30,
 "num_attention_heads":9,"num_key_value_heads":3,"rms_norm_eps":1e-5,"rope_theta":100000.0,
 "max_position_embeddings":8192,"tie_word_embeddings":true,"torch_dtype":"float32"}"#;

/// A transformer without a tokenizer (random SmolLM2-shaped weights).
struct Bare {
    t: model::Transformer,
    max_pos: usize,
}

impl StepModel for Bare {
    type Cache = model::KvCache;
    fn vocab(&self) -> usize {
        self.t.dims.vocab
    }
    fn max_positions(&self) -> usize {
        self.max_pos
    }
    fn new_cache(&self, batch: usize, capacity: usize) -> anyhow::Result<model::KvCache> {
        Ok(model::KvCache::new(&self.t, batch, capacity))
    }
    fn step(&self, cache: &mut model::KvCache, slots: Slots<'_>) -> anyhow::Result<Vec<f32>> {
        model::read_f32(self.t.step(cache, &slots.to_batch()?)?)
    }
    fn select_rows(&self, cache: &mut model::KvCache, rows: &[usize]) -> anyhow::Result<()> {
        cache.select_rows(rows)
    }
}

/// Any model, with the time spent inside it counted (the rest is the sampler's own work).
struct Timed<'a, M> {
    inner: &'a M,
    nanos: AtomicU64,
}

impl<M> Timed<'_, M> {
    fn add(&self, t: Instant) {
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

impl<M: StepModel> StepModel for Timed<'_, M> {
    type Cache = M::Cache;
    fn vocab(&self) -> usize {
        self.inner.vocab()
    }
    fn max_positions(&self) -> usize {
        self.inner.max_positions()
    }
    fn new_cache(&self, batch: usize, capacity: usize) -> anyhow::Result<M::Cache> {
        self.inner.new_cache(batch, capacity)
    }
    fn step(&self, cache: &mut M::Cache, slots: Slots<'_>) -> anyhow::Result<Vec<f32>> {
        let t = Instant::now();
        let r = self.inner.step(cache, slots);
        self.add(t);
        r
    }
    fn select_rows(&self, cache: &mut M::Cache, rows: &[usize]) -> anyhow::Result<()> {
        let t = Instant::now();
        let r = self.inner.select_rows(cache, rows);
        self.add(t);
        r
    }
}

/// CPU seconds used by this process so far (user + system), from /proc/self/stat (100 Hz ticks).
fn cpu_seconds() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    let f: Vec<&str> = s
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let tick = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (tick(11) + tick(12)) / 100.0
}

fn groups(contexts: Vec<Vec<u32>>, batch: usize) -> Vec<Group> {
    let per = batch / contexts.len().max(1);
    contexts
        .into_iter()
        .enumerate()
        .map(|(j, c)| Group {
            context: c,
            samples: (0..per as u32)
                .map(|k| SampleId {
                    prompt_id: format!("bench-{j}"),
                    answer_idx: k,
                    confidence_idx: None,
                })
                .collect(),
        })
        .collect()
}

fn run<M: StepModel>(
    m: &M,
    decode: &rlcr::sample::stop::DecodeFn<'_>,
    gs: &[Group],
    cfg: &GenConfig,
    label: &str,
) -> anyhow::Result<()> {
    // Warm-up (allocator, thread pool): a short run.
    let mut warm = cfg.clone();
    warm.stop.max_new_tokens = 4;
    generate(m, decode, gs, &warm, &mut |_| {})?;
    let timed = Timed {
        inner: m,
        nanos: AtomicU64::new(0),
    };
    let t0 = Instant::now();
    let c0 = cpu_seconds();
    let mut tokens = 0usize;
    let out = generate(&timed, decode, gs, cfg, &mut |r| tokens += r.tokens)?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - c0;
    let rows: usize = out.iter().map(|g| g.len()).sum();
    let model = timed.nanos.load(Ordering::Relaxed) as f64 * 1e-9;
    println!(
        "{label}: {rows} rows x {} new tokens, {tokens} tokens in {secs:.2} s = {:.1} tokens/s; \
         {cpu:.2} CPU s = {:.1} tokens per CPU-second (model {model:.2} s, sampler {:.3} s = {:.1}%)",
        cfg.stop.max_new_tokens,
        tokens as f64 / secs,
        tokens as f64 / cpu,
        secs - model,
        100.0 * (secs - model) / secs
    );
    // One machine-readable line for scripts/bench.sh.
    println!(
        "RESULT sample_b{rows}_n{} {:.2} {:.2}",
        cfg.stop.max_new_tokens,
        tokens as f64 / secs,
        tokens as f64 / cpu
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    rlcr::alloc::retain_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("smollm2");
    let batch: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(8);
    let new: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(128);
    let prompts: usize = args
        .get(3)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(batch)
        .clamp(1, batch);
    let device = model::device_from_str("cpu")?;
    let mk_cfg = |allowed: usize| GenConfig {
        params: SamplingParams::default(),
        stop: StopCriteria {
            eos: vec![],
            stop_strings: vec![],
            max_new_tokens: new,
        },
        allowed_vocab: allowed,
        seed: 0,
        batch_size: batch,
        prefill_chunk: 512,
    };
    if which == "smollm2" {
        let c = ModelConfig::from_json(SMOLLM2)?;
        let t = weights::build(&c, weights::random_tensors(&c, 0), &device)?.0;
        let m = Bare {
            t,
            max_pos: c.max_position_embeddings,
        };
        let contexts: Vec<Vec<u32>> = (0..prompts)
            .map(|j| {
                (0..32)
                    .map(|t| ((j * 7919 + t * 104_729) % 49_152) as u32)
                    .collect()
            })
            .collect();
        let decode = |_: &[u32]| -> anyhow::Result<String> { Ok(String::new()) };
        run(
            &m,
            &decode,
            &groups(contexts, batch),
            &mk_cfg(49_152),
            "smollm2-shaped (random weights)",
        )
    } else {
        let p = Policy::load(Path::new(which), &device, &Default::default())?;
        let questions = [
            "What is 12 + 7?",
            "Name a prime number larger than 10.",
            "What is the capital of France?",
            "Count from one to five.",
        ];
        let contexts = (0..prompts)
            .map(|j| {
                let msgs = vec![model::Message::new("user", questions[j % questions.len()])];
                Ok(p.encode_context(&msgs)?.1)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let decode = |ids: &[u32]| p.decode(ids);
        run(
            &p,
            &decode,
            &groups(contexts, batch),
            &mk_cfg(p.allowed_vocab()),
            which,
        )
    }
}
