//! Speed of rlcr's decoder on the CPU (Flex) backend: prefill and batched greedy decoding with
//! the KV cache, the way the sampler drives it.
//!
//! ```text
//! cargo run --example bench_model -- [MODEL_DIR | smollm2] [BATCH] [PROMPT] [NEW] [prealloc]
//! ```
//! `smollm2` builds random weights with SmolLM2-135M's shape (speed does not depend on the
//! values); a folder path loads a real checkpoint. Defaults: smollm2, 8 rows, 128 prompt tokens,
//! 128 new tokens. Reference: Hugging Face transformers samples SmolLM2-135M at 71.8 tok/s for
//! 8 × 128 new tokens on this machine's 2 cores.
use std::path::Path;
use std::time::Instant;

use rlcr::model::{self, weights, KvCache, ModelConfig, TokenBatch, Transformer};

const SMOLLM2: &str = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama",
 "vocab_size":49152,"hidden_size":576,"intermediate_size":1536,"num_hidden_layers":30,
 "num_attention_heads":9,"num_key_value_heads":3,"rms_norm_eps":1e-5,"rope_theta":100000.0,
 "max_position_embeddings":8192,"tie_word_embeddings":true,"torch_dtype":"float32"}"#;

/// On-CPU seconds of every thread of this process (rayon workers included): unlike wall time,
/// not inflated by other processes on a shared machine.
fn cpu_secs() -> f64 {
    let mut ns = 0u64;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) {
                ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(0);
            }
        }
    }
    ns as f64 * 1e-9
}

fn main() -> anyhow::Result<()> {
    rlcr::alloc::retain_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("smollm2");
    let batch: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(8);
    let prompt: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(128);
    let new: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(128);
    // `prealloc`: allocate the cache for prompt + new slots up front (attention then spans them
    // all) instead of growing it by chunks.
    let prealloc = args.get(4).map(String::as_str) == Some("prealloc");
    let device = model::device_from_str("cpu")?;
    let m: Transformer = if which == "smollm2" {
        let c = ModelConfig::from_json(SMOLLM2)?;
        weights::build(&c, weights::random_tensors(&c, 0), &device)?.0
    } else {
        let dir = Path::new(which);
        let c = ModelConfig::load(dir)?;
        weights::load(&c, dir, &device)?.0
    };
    let vocab = m.dims.vocab.min(32000);
    let rows: Vec<Vec<u32>> = (0..batch)
        .map(|b| {
            (0..prompt)
                .map(|t| ((b * 7919 + t * 104729) % vocab) as u32)
                .collect()
        })
        .collect();
    let input = TokenBatch::left_padded(&rows);

    // Warm-up (allocator, thread pool).
    let mut cache = KvCache::new(&m, batch, prompt + new);
    m.step(&mut cache, &input)?;

    let (t0, c0) = (Instant::now(), cpu_secs());
    let h = m.hidden(&input)?;
    let _ = model::read_f32(h.slice([0..batch, prompt - 1..prompt, 0..m.dims.hidden]))?;
    let full = t0.elapsed().as_secs_f64();
    println!(
        "cache-free forward {batch}x{prompt}: {:.3} s = {:.0} tok/s (cpu {:.2} s)",
        full,
        (batch * prompt) as f64 / full,
        cpu_secs() - c0
    );

    let mut cache = KvCache::new(&m, batch, prompt + new);
    if prealloc {
        cache.reserve(prompt + new);
    }
    let (t0, c0) = (Instant::now(), cpu_secs());
    let mut logits = model::read_f32(m.step(&mut cache, &input)?)?;
    let prefill = t0.elapsed().as_secs_f64();
    let prefill_cpu = cpu_secs() - c0;
    println!(
        "prefill {batch}x{prompt} (cache): {:.3} s = {:.0} tok/s (cpu {:.2} s)",
        prefill,
        (batch * prompt) as f64 / prefill,
        prefill_cpu
    );
    let v = m.dims.vocab;
    let (t0, c0) = (Instant::now(), cpu_secs());
    for _ in 0..new {
        let next: Vec<u32> = (0..batch)
            .map(|b| {
                let row = &logits[b * v..(b + 1) * v];
                (0..v)
                    .max_by(|&i, &j| row[i].total_cmp(&row[j]))
                    .unwrap_or(0) as u32
            })
            .collect();
        logits = model::read_f32(m.step(&mut cache, &TokenBatch::step(&next))?)?;
    }
    let decode = t0.elapsed().as_secs_f64();
    let decode_cpu = cpu_secs() - c0;
    println!(
        "decode {batch}x{new}: {:.3} s = {:.1} ms/step = {:.1} tok/s (cpu {:.1} ms/step)",
        decode,
        decode * 1000.0 / new as f64,
        (batch * new) as f64 / decode,
        decode_cpu * 1000.0 / new as f64
    );
    println!(
        "prefill + decode: {:.1} new tok/s (transformers: 71.8)",
        (batch * new) as f64 / (prefill + decode)
    );
    Ok(())
}
