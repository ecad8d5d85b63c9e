//! Training speed and memory of rlcr's update step on the CPU (Flex) backend.
//!
//! ```text
//! cargo run --example bench_train -- [qwen39m | smollm2 | MODEL_DIR] [BATCH] [LEN] [MICRO] [REPS] [f32 | bf16] [full | ckpt]
//! ```
//! The sixth argument is `update --precision` (default f32), the seventh `ckpt` for
//! `--checkpoint-activations` (default `full`: every activation kept). `LORA_RANK=R` in the
//! environment trains a rank-R LoRA adapter on every projection instead (base weights frozen);
//! `WEIGHTS=bf16` makes the model a bf16 checkpoint (a LoRA base is then held in bf16).
//! Measures forward + backward (the PPO loss over every response token, gradients accumulated
//! over micro-batches of MICRO rows) and the AdamW step separately, and prints the peak resident
//! memory, wall time and CPU time (the machine is shared: tokens per CPU-second is the figure that
//! does not depend on the load). Each row is 1 context token + (LEN − 1) response tokens, so the
//! LM head and the loss cover (almost) every position, as a causal-LM loss does.
//!
//! - `qwen39m`: a 38.9M-parameter Qwen2 config (hidden 512, 8 layers, 8 heads, 2 KV heads, FFN
//!   1408, vocab 32000), random weights. Reference: transformers does forward+backward on it at
//!   711 tokens/s on this machine (2 threads, fp32), batch 8 × 256.
//! - `smollm2`: SmolLM2-135M's shape, random weights (the memory check: micro-batch 4 × 512).
//!
//! Defaults: qwen39m, 8 rows, 256 tokens, micro-batch 8, 3 repetitions.
use std::path::Path;
use std::time::Instant;

use rlcr::model::{self, weights, ModelConfig, Transformer};
use rlcr::train::data::TrainRow;
use rlcr::train::loss::{ClipConfig, KlEstimator, LossAgg};
use rlcr::train::optim::{clip_coef, global_grad_norm, AdamW, AdamWConfig};
use rlcr::train::schedule::{Schedule, ScheduleKind};
use rlcr::train::trainer::{batch_gradients, Objective, TrainConfig};

const QWEN39M: &str = r#"{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2",
 "vocab_size":32000,"hidden_size":512,"intermediate_size":1408,"num_hidden_layers":8,
 "num_attention_heads":8,"num_key_value_heads":2,"rms_norm_eps":1e-6,"rope_theta":1000000.0,
 "max_position_embeddings":4096,"tie_word_embeddings":true,"torch_dtype":"float32"}"#;

const SMOLLM2: &str = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama",
 "vocab_size":49152,"hidden_size":576,"intermediate_size":1536,"num_hidden_layers":30,
 "num_attention_heads":9,"num_key_value_heads":3,"rms_norm_eps":1e-5,"rope_theta":100000.0,
 "max_position_embeddings":8192,"tie_word_embeddings":true,"torch_dtype":"float32"}"#;

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// CPU seconds used by this process so far (user + system), from /proc/self/stat.
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

fn main() -> anyhow::Result<()> {
    rlcr::alloc::retain_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("qwen39m");
    let batch: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(8);
    let len: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(256);
    let micro: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(batch);
    let reps: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(3);
    let precision = match args.get(5).map(String::as_str) {
        None | Some("f32") => rlcr::model::sgemm::Precision::F32,
        Some("bf16") => rlcr::model::sgemm::Precision::Bf16,
        Some(other) => anyhow::bail!("precision {other:?}: f32 or bf16"),
    };
    let checkpoint_activations = match args.get(6).map(String::as_str) {
        None | Some("full") => false,
        Some("ckpt") => true,
        Some(other) => anyhow::bail!("{other:?}: full or ckpt"),
    };
    let device = model::device_from_str("cpu")?.autodiff();
    // WEIGHTS=bf16: a bf16 checkpoint (the random weights rounded to bf16). Training every
    // weight holds f32 master weights whatever the checkpoint (as `update` does); a LoRA base is
    // frozen and held in bf16.
    let lora_rank = std::env::var("LORA_RANK").ok().filter(|v| !v.is_empty());
    let bf16_weights = match std::env::var("WEIGHTS").ok().as_deref() {
        None | Some("") | Some("f32") => false,
        Some("bf16") => true,
        Some(other) => anyhow::bail!("WEIGHTS={other:?}: f32 or bf16"),
    };
    let storage = if bf16_weights && lora_rank.is_some() {
        weights::Storage::AsStored
    } else {
        weights::Storage::F32
    };
    let (m, c): (Transformer, ModelConfig) = match which {
        "qwen39m" | "smollm2" => {
            let c = ModelConfig::from_json(if which == "qwen39m" { QWEN39M } else { SMOLLM2 })?;
            let mut tensors = weights::random_tensors(&c, 0);
            if bf16_weights {
                for t in tensors.values_mut() {
                    t.dtype = safetensors::Dtype::BF16;
                    for v in t.data.iter_mut() {
                        *v = half::bf16::from_f32(*v).to_f32();
                    }
                }
            }
            (weights::build_with(&c, tensors, &device, storage)?.0, c)
        }
        dir => {
            let dir = Path::new(dir);
            let c = ModelConfig::load(dir)?;
            (weights::load_with(&c, dir, &device, storage)?.0, c)
        }
    };
    println!(
        "weights: {} checkpoint, held {}",
        if bf16_weights { "bf16" } else { "f32" },
        if storage == weights::Storage::AsStored {
            "as stored (bf16 matrices in bf16)"
        } else {
            "in f32"
        }
    );
    // LORA_RANK=R: train a rank-R adapter on every projection (alpha 16) with the base frozen,
    // as `update --lora-rank R` does.
    let m = match lora_rank {
        Some(r) => {
            use rlcr::model::lora;
            let spec = lora::LoraSpec {
                r: r.parse()?,
                alpha: 16.0,
                dropout: 0.0,
                targets: lora::Target::ALL.to_vec(),
                rslora: false,
                base: None,
            };
            println!("LoRA adapter: rank {}, all seven projections", spec.r);
            lora::attach(m, &c, &spec, lora::Init::Fresh { seed: 0 })?
        }
        None => m,
    };
    let params: usize = {
        use burn::module::Module;
        m.num_params()
    };
    println!(
        "{which}: {:.1}M parameters, rss after load {:.0} MiB",
        params as f64 / 1e6,
        peak_rss_mib()
    );
    let ctx = 1;
    let vocab = m.dims.vocab.min(32000);
    let rows: Vec<TrainRow> = (0..batch)
        .map(|b| {
            let ids: Vec<u32> = (0..len)
                .map(|t| ((b * 7919 + t * 104729) % vocab) as u32)
                .collect();
            let n = len - ctx;
            TrainRow {
                context: ids[..ctx].to_vec(),
                response: ids[ctx..].to_vec(),
                old_logp: vec![-10.0; n],
                adv: (0..n)
                    .map(|t| if (b + t) % 2 == 0 { 1.0 } else { -1.0 })
                    .collect(),
                mask: vec![true; n],
                ref_logp: None,
                is_confidence: false,
            }
        })
        .collect();
    let cfg = TrainConfig {
        objective: Objective::Policy {
            clip: ClipConfig::default(),
            kl_coef: 0.0,
            kl_kind: KlEstimator::K3,
            entropy_coef: 0.0,
            conf_entropy_coef: 0.0,
            conf_value_entropy_coef: 0.0,
            value_tokens: None,
        },
        loss_agg: LossAgg::TokenMean,
        agg_len: len,
        schedule: Schedule::new(1e-6, 0.0, ScheduleKind::Constant, None)?,
        grad_clip: 1.0,
        micro_batch: micro,
        mini_batches: 1,
        epochs: 1,
        temperature: 1.0,
        shuffle: false,
        seed: 0,
        precision,
        checkpoint_activations,
    };
    let refs: Vec<&TrainRow> = rows.iter().collect();
    let mut opt = AdamW::new(AdamWConfig::default());
    let mut model = m;
    let tokens = batch * len;
    let mut fb = Vec::new();
    let mut st = Vec::new();
    // RESULT names: `train_b8_l256` for the 38.9M config (as before), `train_smollm2_b8_l512`
    // for SmolLM2's shape (scripts/bench_transformers.py uses the same names).
    let tag = match which {
        "qwen39m" => String::new(),
        "smollm2" => "_smollm2".to_string(),
        _ => "_model".to_string(),
    };
    // bf16 runs end in `_bf16`, as transformers' autocast runs do.
    let suf = if precision == rlcr::model::sgemm::Precision::Bf16 {
        "_bf16"
    } else {
        ""
    };
    for rep in 0..reps {
        let t0 = Instant::now();
        let c0 = cpu_seconds();
        let (grads, sums) = batch_gradients(&model, &refs, &cfg)?;
        let t_fb = t0.elapsed().as_secs_f64();
        let c_fb = cpu_seconds() - c0;
        let t1 = Instant::now();
        let norm = global_grad_norm(&model, &grads);
        model = opt.step(model, grads, 1e-6, clip_coef(norm, 1.0));
        let t_step = t1.elapsed().as_secs_f64();
        println!(
            "rep {rep}: forward+backward {t_fb:.2} s wall, {c_fb:.2} s cpu ({:.0} tok/s, {:.0} tok per cpu-s), clip+AdamW {t_step:.2} s, loss {:.4}, grad norm {norm:.3}, peak rss {:.0} MiB",
            tokens as f64 / t_fb,
            tokens as f64 / c_fb,
            sums.loss,
            peak_rss_mib()
        );
        if rep > 0 || reps == 1 {
            // Machine-readable (scripts/bench.sh); the first repetition is a warm-up.
            println!(
                "RESULT train{tag}_b{batch}_l{len}{suf} {:.2} {:.2}",
                tokens as f64 / t_fb,
                tokens as f64 / c_fb
            );
            // The whole update step: forward + backward, global clipping, AdamW.
            println!(
                "RESULT step{tag}_b{batch}_l{len}{suf} {:.2} {:.2}",
                tokens as f64 / t0.elapsed().as_secs_f64(),
                tokens as f64 / (cpu_seconds() - c0)
            );
        }
        fb.push(t_fb);
        st.push(t_step);
    }
    // The first repetition warms the allocator and thread pool: report the best of the rest.
    let best = |v: &[f64]| {
        v.iter()
            .skip(usize::from(v.len() > 1))
            .copied()
            .fold(f64::INFINITY, f64::min)
    };
    // Peak resident memory (MiB) in both columns of a RESULT line.
    println!(
        "RESULT rss{tag}_b{batch}_l{len}{suf} {:.0} {:.0}",
        peak_rss_mib(),
        peak_rss_mib()
    );
    println!(
        "{which} batch {batch}x{len} micro {micro}: forward+backward {:.0} tokens/s (best), AdamW step {:.2} s, peak rss {:.0} MiB",
        tokens as f64 / best(&fb),
        best(&st),
        peak_rss_mib()
    );
    Ok(())
}
