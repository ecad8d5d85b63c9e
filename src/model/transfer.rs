//! rlcr's host ↔ device boundary, counted.
//!
//! Every tensor made from host data in the decode and update loops goes through [`upload`], and
//! every read back to the host through [`read`] (or [`super::read_f32`], built on it). Each keeps
//! counts (calls and bytes) per thread and for the whole process, so a test can assert how many
//! transfers a decode step or an optimizer step makes on a GPU backend (where each read is a
//! synchronisation with the device), and a run can report them.
//!
//! On Flex (`--device cpu`) both are plain copies in host memory, counted the same way.
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{anyhow, Result};
use burn::tensor::kind::Basic;
use burn::tensor::{Device, Tensor, TensorData};

/// Transfer counts: calls and bytes in each direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfers {
    /// Reads to the host.
    pub reads: u64,
    pub read_bytes: u64,
    /// Tensors created from host data.
    pub uploads: u64,
    pub upload_bytes: u64,
}

impl std::ops::Sub for Transfers {
    type Output = Transfers;
    fn sub(self, o: Transfers) -> Transfers {
        Transfers {
            reads: self.reads - o.reads,
            read_bytes: self.read_bytes - o.read_bytes,
            uploads: self.uploads - o.uploads,
            upload_bytes: self.upload_bytes - o.upload_bytes,
        }
    }
}

thread_local! {
    static THREAD: Cell<Transfers> = const { Cell::new(Transfers { reads: 0, read_bytes: 0, uploads: 0, upload_bytes: 0 }) };
}

static READS: AtomicU64 = AtomicU64::new(0);
static READ_BYTES: AtomicU64 = AtomicU64::new(0);
static UPLOADS: AtomicU64 = AtomicU64::new(0);
static UPLOAD_BYTES: AtomicU64 = AtomicU64::new(0);

/// The counts of the calling thread (the loops of one run live on one thread; tests running in
/// parallel do not see each other's transfers).
pub fn thread_counts() -> Transfers {
    THREAD.with(|c| c.get())
}

/// The counts of the whole process.
pub fn process_counts() -> Transfers {
    Transfers {
        reads: READS.load(Ordering::Relaxed),
        read_bytes: READ_BYTES.load(Ordering::Relaxed),
        uploads: UPLOADS.load(Ordering::Relaxed),
        upload_bytes: UPLOAD_BYTES.load(Ordering::Relaxed),
    }
}

fn count(read: bool, bytes: u64) {
    THREAD.with(|c| {
        let mut t = c.get();
        if read {
            t.reads += 1;
            t.read_bytes += bytes;
        } else {
            t.uploads += 1;
            t.upload_bytes += bytes;
        }
        c.set(t);
    });
    let (n, b) = if read {
        (&READS, &READ_BYTES)
    } else {
        (&UPLOADS, &UPLOAD_BYTES)
    };
    n.fetch_add(1, Ordering::Relaxed);
    b.fetch_add(bytes, Ordering::Relaxed);
}

thread_local! {
    static THREAD_LAUNCHES: Cell<u64> = const { Cell::new(0) };
    /// The names of the kernels the thread launches while [`kernels_launched`] runs.
    static THREAD_KERNELS: std::cell::RefCell<Option<Vec<&'static str>>> = const { std::cell::RefCell::new(None) };
}

static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// Kernel launches the calling thread issued on a GPU backend since [`count_launches`] was first
/// called (burn's CubeCL backends report each launch before submitting it, on the issuing
/// thread). 0 on the CPU, where burn's ops are not kernels. On a GPU each launch costs host time
/// (about 27 µs a launch on an H200 with burn's CUDA backend), so a decode step's launch count is
/// its floor.
pub fn thread_launches() -> u64 {
    THREAD_LAUNCHES.with(|c| c.get())
}

/// [`thread_launches`] for the whole process.
pub fn process_launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// Start counting kernel launches ([`thread_launches`]): installs a CubeCL launch observer for
/// the rest of the process (one atomic add and one thread-local add per launch). Idempotent;
/// opening a wgpu or CUDA device calls it. A no-op in builds without a GPU backend.
pub fn count_launches() {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        use burn::cubecl::logging::{LaunchObservation, LaunchObserver};
        struct Counter;
        impl LaunchObserver for Counter {
            fn launched(&self, kernel: &'static str) {
                THREAD_LAUNCHES.with(|c| c.set(c.get() + 1));
                THREAD_KERNELS.with(|k| {
                    if let Some(names) = k.borrow_mut().as_mut() {
                        names.push(kernel);
                    }
                });
                LAUNCHES.fetch_add(1, Ordering::Relaxed);
            }
        }
        static ONCE: std::sync::Once = std::sync::Once::new();
        // The observation stays installed for the process: dropping it would uninstall it.
        ONCE.call_once(|| std::mem::forget(LaunchObservation::new(std::sync::Arc::new(Counter))));
    }
}

/// Runs `f` and returns what it returns with the names of the kernels the calling thread launched
/// meanwhile, in order (empty on the CPU). Tests use it to check which kernels a step runs: no
/// sum may add with atomics (their order, and so the sum's last bits, would vary run to run).
pub fn kernels_launched<R>(f: impl FnOnce() -> R) -> (R, Vec<&'static str>) {
    count_launches();
    let outer = THREAD_KERNELS.with(|k| k.borrow_mut().replace(Vec::new()));
    let r = f();
    let names = THREAD_KERNELS.with(|k| std::mem::replace(&mut *k.borrow_mut(), outer));
    (r, names.unwrap_or_default())
}

/// A tensor on `device` from host data (counted as one upload of the data's bytes).
pub fn upload<const D: usize, K: Basic>(data: TensorData, device: &Device) -> Tensor<D, K> {
    count(false, data.bytes().len() as u64);
    Tensor::from_data(data, device)
}

/// Count an in-place write of `bytes` into an existing device buffer as one upload (a replayed
/// step refreshes its inputs so instead of uploading new tensors).
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
pub(crate) fn count_write(bytes: u64) {
    count(false, bytes);
}

/// Read a tensor to the host (counted as one read of its bytes; one synchronisation on a GPU).
pub fn read<const D: usize, K: Basic>(t: Tensor<D, K>) -> Result<TensorData> {
    let data = t
        .try_into_data()
        .map_err(|e| anyhow!("reading a tensor back: {e:?}"))?;
    count(true, data.bytes().len() as u64);
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_calls_and_bytes_per_thread() {
        let d = Device::flex();
        let before = thread_counts();
        let t: Tensor<2> = upload(TensorData::new(vec![1f32; 6], [2, 3]), &d);
        let i: Tensor<1, burn::tensor::Int> = upload(TensorData::new(vec![1i32, 2], [2]), &d);
        let back = read(t.clone() * 2.0).unwrap();
        assert_eq!(
            back.convert::<f32>().try_into_vec::<f32>().unwrap(),
            vec![2f32; 6]
        );
        let got = thread_counts() - before;
        assert_eq!(
            got,
            Transfers {
                reads: 1,
                read_bytes: 24,
                uploads: 2,
                upload_bytes: 24 + 8,
            }
        );
        drop(i);
        // Another thread's transfers are not this thread's.
        let before = thread_counts();
        std::thread::spawn(move || read(t).unwrap()).join().unwrap();
        assert_eq!(thread_counts() - before, Transfers::default());
        assert!(process_counts().reads >= 2);
    }
}

#[cfg(test)]
mod transfer_counts {
    //! Host ↔ device transfers of a decode step and of an optimizer step, on the CPU and (builds
    //! with `--features wgpu`; `RLCR_WGPU_DEVICE` picks the adapter, default `wgpu`) on a GPU
    //! backend, where the sampler draws on the device.
    use super::*;
    use crate::model::Model;
    use crate::sample::logits::SamplingParams;
    use crate::sample::policy::Policy;
    use crate::sample::sampler::{generate, GenConfig, Group, SampleId, Slots, StepModel};
    use crate::sample::stop::StopCriteria;

    fn devices() -> Vec<String> {
        let mut d = vec!["cpu".to_string()];
        if cfg!(feature = "wgpu") {
            d.push(std::env::var("RLCR_WGPU_DEVICE").unwrap_or_else(|_| "wgpu".into()));
        }
        d
    }

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(name)
    }

    /// tiny-qwen2's policy on the device `spec`, whether it draws on the device (on every GPU
    /// backend, not on the CPU), and its vocabulary.
    fn policy(spec: &str) -> (Policy, bool, u64) {
        let device = crate::model::device_from_str(spec).unwrap();
        let p = Policy::load(
            &fixture("tiny-qwen2"),
            &device,
            &crate::model::ChatOptions::default(),
        )
        .unwrap();
        let on_device = p.draws_on_device();
        assert_eq!(on_device, spec != "cpu", "{spec}: where the sampler draws");
        let vocab = p.vocab() as u64;
        (p, on_device, vocab)
    }

    /// Both tests' sampling: temperature, top-k and top-p (the device draw's costliest path).
    const PARAMS: SamplingParams = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.0,
    };

    /// The most kernel launches a decode step may take on a GPU backend per layer, on both
    /// fixture models, with top-k and top-p ([`PARAMS`]) and without (temperature only, the RL
    /// default). Measured on lavapipe (`launches_per_decode_step` prints the counts): 9, the fused
    /// q/k/v product, RoPE with the cache write, attention, the output product, the residual add
    /// with RMSNorm, the fused gate/up product, SwiGLU, the down product, the residual add with
    /// the next RMSNorm (tiny-qwen2's q/k/v bias is added inside the RoPE kernel). A ceiling, so
    /// that more launches (each costs host time on a GPU) fail here; at most [`LAYER_CEILING`].
    const LAYER_LAUNCHES: u64 = 9;

    /// The same for the rest of the step: the embedding lookup, the first RMSNorm, the LM head
    /// and the draw (one kernel whatever the settings). Measured: 4; at most [`HEAD_CEILING`].
    const HEAD_LAUNCHES: u64 = 4;

    /// The ceilings a GPU decode step must keep: per layer, and for the head and the draw with
    /// top-k and top-p on (about 310 a step for a 30-layer model).
    const LAYER_CEILING: u64 = 10;
    const HEAD_CEILING: u64 = 10;
    const _: () = assert!(LAYER_LAUNCHES <= LAYER_CEILING && HEAD_LAUNCHES <= HEAD_CEILING);

    /// Kernel launches and host transfers of each decode step (between two consecutive step
    /// reports) of 4 rows sampling 6 tokens from `p` with `params`.
    fn decode_steps(p: &Policy, params: SamplingParams) -> (Vec<u64>, Vec<Transfers>) {
        let (rows, steps) = (4u32, 6usize);
        let ctx: Vec<u32> = (1..=9).collect();
        let groups = vec![Group {
            context: ctx,
            samples: (0..rows)
                .map(|k| SampleId {
                    prompt_id: "q".into(),
                    answer_idx: k,
                    confidence_idx: None,
                })
                .collect(),
        }];
        let cfg = GenConfig {
            params,
            // No EOS: every row decodes `steps` tokens, none leaves the batch early.
            stop: StopCriteria {
                eos: vec![],
                stop_strings: vec![],
                max_new_tokens: steps,
            },
            allowed_vocab: p.vocab(),
            seed: 3,
            batch_size: rows as usize,
            prefill_chunk: 16,
        };
        let decode = |ids: &[u32]| p.decode(ids);
        let mut marks = Vec::new();
        let mut launches = Vec::new();
        generate(p, &decode, &groups, &cfg, &mut |_| {
            marks.push(thread_counts());
            launches.push(thread_launches());
        })
        .unwrap();
        assert_eq!(marks.len(), steps);
        let launches = launches.windows(2).map(|w| w[1] - w[0]).collect();
        let transfers = marks.windows(2).map(|w| w[1] - w[0]).collect();
        (launches, transfers)
    }

    /// The launch ceilings of [`LAYER_LAUNCHES`] and [`HEAD_LAUNCHES`] on the GPU backend of the
    /// build (lavapipe in CI); none on the CPU, which launches no kernels. A layer's launches are
    /// the difference between each fixture model's step and the step of the same model cut to
    /// its first layer; the head's and the draw's are the rest.
    #[test]
    fn launches_per_decode_step() {
        for spec in devices().into_iter().filter(|s| s != "cpu") {
            for name in ["tiny-qwen2", "tiny-llama"] {
                for cut in [true, false] {
                    let params = if cut {
                        PARAMS
                    } else {
                        SamplingParams {
                            top_k: 0,
                            top_p: 1.0,
                            ..PARAMS
                        }
                    };
                    let per_step = |layers: Option<usize>| {
                        let device = crate::model::device_from_str(&spec).unwrap();
                        let mut p = Policy::load(
                            &fixture(name),
                            &device,
                            &crate::model::ChatOptions::default(),
                        )
                        .unwrap();
                        let m = &mut p.model.transformer;
                        if let Some(n) = layers {
                            m.layers.truncate(n);
                            m.dims.layers = n;
                        }
                        let (launches, _) = decode_steps(&p, params);
                        let first = launches[0];
                        assert!(launches.iter().all(|&n| n == first), "{launches:?}");
                        (first, p.model.transformer.layers.len() as u64)
                    };
                    let (all, layers) = per_step(None);
                    let (one, _) = per_step(Some(1));
                    let layer = (all - one) / (layers - 1);
                    let head = one - layer;
                    eprintln!(
                        "{spec} {name} top-k/top-p {cut}: {all} kernel launches a step, {layer} a \
                         layer ({layers}), {head} for the head and the draw"
                    );
                    assert_eq!(all, layers * layer + head, "{spec} {name}");
                    assert!(
                        layer <= LAYER_LAUNCHES && head <= HEAD_LAUNCHES,
                        "{spec} {name} (top-k and top-p: {cut}): {layer} kernel launches a layer \
                         (at most {LAYER_LAUNCHES}), {head} for the head and the draw (at most \
                         {HEAD_LAUNCHES})"
                    );
                }
            }
        }
    }

    /// Per decode step (between two consecutive step reports): the model's inputs go up (token
    /// ids, and the RoPE tables and the attention mask on the CPU, the cache's slots on a GPU,
    /// with the draws); one read comes back:
    /// the sampled ids with their log-probs on a GPU (8 bytes a row), the logits on the CPU.
    /// Kernel launches: none on the CPU (on a GPU, [`launches_per_decode_step`]).
    #[test]
    fn per_decode_step() {
        for spec in devices() {
            let (p, on_device, vocab) = policy(&spec);
            let rows = 4u64;
            let (launches, transfers) = decode_steps(&p, PARAMS);
            if !on_device {
                assert!(
                    launches.iter().all(|&n| n == 0),
                    "the CPU launches no kernels"
                );
            }
            for d in transfers {
                let (uploads, read_bytes) = if on_device {
                    (3, rows * 8)
                } else {
                    (4, rows * vocab * 4)
                };
                assert_eq!(d.reads, 1, "{spec}: reads per decode step");
                assert_eq!(
                    d.read_bytes, read_bytes,
                    "{spec}: bytes read per decode step"
                );
                assert_eq!(d.uploads, uploads, "{spec}: uploads per decode step");
                // The weights never travel again: a step uploads only its small inputs.
                assert!(
                    d.upload_bytes < 16 << 10,
                    "{spec}: {} bytes up",
                    d.upload_bytes
                );
            }
            // The cached step itself, without the sampler: no read at all.
            let mut cache = p.new_cache(2, 16).unwrap();
            let before = thread_counts();
            let slots = Slots {
                batch: 2,
                len: 3,
                ids: &[1, 2, 3, 4, 5, 6],
                valid: &[true; 6],
            };
            let l = p.step_device(&mut cache, slots).unwrap();
            let d = thread_counts() - before;
            let uploads = if on_device { 2 } else { 4 };
            assert_eq!((d.reads, d.uploads), (0, uploads), "{spec}: a cached step");
            drop(l);
        }
    }

    /// Per multi-turn step (between two consecutive step reports): one model call when every
    /// row is in the middle of a turn or every row feeds an observation, two when both kinds
    /// are in the batch (each uploads its token ids, and the RoPE tables and the attention mask
    /// on the CPU, the cache's slots on a GPU);
    /// a cache compaction when rows left uploads their indices. One read: the sampled ids with
    /// their log-probs on a GPU (8 bytes a row, whatever the number of calls, the draws going
    /// up as one upload), each call's logits on the CPU.
    #[test]
    fn per_multiturn_step() {
        use crate::sample::env::{EnvReply, EnvRequest, Environment};
        use crate::sample::multiturn::{rollout, Episode, Limits};

        /// Never done before turn 3; every observation is 3 tokens.
        struct Env;
        impl Environment for Env {
            fn step(&mut self, requests: &[EnvRequest]) -> Result<Vec<EnvReply>> {
                Ok(requests
                    .iter()
                    .map(|r| EnvReply {
                        observation: "obs".into(),
                        done: r.turn >= 3,
                        turn_reward: None,
                        extra: None,
                    })
                    .collect())
            }
        }
        let encode = |_: &str| -> Result<Vec<u32>> { Ok(vec![5, 6, 7]) };

        for spec in devices() {
            let (p, on_device, vocab) = policy(&spec);
            let episodes: Vec<Episode> = [(1..=9).collect::<Vec<u32>>(), vec![3, 1, 4, 1, 5]]
                .into_iter()
                .enumerate()
                .map(|(g, context)| Episode {
                    context,
                    messages: vec![crate::model::Message::new("user", "q")],
                    data_source: "t".into(),
                    ground_truth: serde_json::Value::Null,
                    samples: (0..4)
                        .map(|k| SampleId {
                            prompt_id: format!("q{g}"),
                            answer_idx: k,
                            confidence_idx: None,
                        })
                        .collect(),
                })
                .collect();
            let cfg = GenConfig {
                params: PARAMS,
                // Every even id ends a turn: turns end at different steps in different rows, so
                // some steps feed observations and decode in the same batch.
                stop: StopCriteria {
                    eos: (0..p.vocab() as u32).step_by(2).collect(),
                    stop_strings: vec![],
                    max_new_tokens: 4,
                },
                allowed_vocab: p.vocab(),
                seed: 3,
                batch_size: 8,
                prefill_chunk: 16,
            };
            let limits = Limits {
                max_turns: 4,
                max_response_tokens: 40,
            };
            let decode = |ids: &[u32]| p.decode(ids);
            let mut marks = Vec::new();
            rollout(
                &p,
                &decode,
                &encode,
                &episodes,
                &cfg,
                &limits,
                &mut Env,
                &mut |r| marks.push((r, thread_counts())),
            )
            .unwrap();
            let mut calls_seen = [0usize; 3];
            for w in marks.windows(2) {
                let ((prev, t0), (now, t1)) = (w[0], w[1]);
                let d = t1 - t0;
                // Rows that left the batch after the previous step: one upload of the kept rows.
                let compacted = u64::from(prev.finished > 0);
                let rows = now.tokens as u64;
                let calls = if on_device {
                    assert_eq!(d.reads, 1, "{spec}: reads per multi-turn step");
                    assert_eq!(d.read_bytes, rows * 8, "{spec}: bytes read per step");
                    let model_uploads = d.uploads - 1 - compacted;
                    assert_eq!(model_uploads % 2, 0, "{spec}: {d:?}");
                    model_uploads / 2
                } else {
                    assert_eq!(d.read_bytes, d.reads * rows * vocab * 4, "{spec}: {d:?}");
                    assert_eq!(d.uploads, 4 * d.reads + compacted, "{spec}: {d:?}");
                    d.reads
                };
                assert!((1..=2).contains(&calls), "{spec}: {calls} model calls");
                calls_seen[calls as usize] += 1;
                // The weights never travel again (the embedding table alone is 384 × 64 f32,
                // 96 KiB): a step uploads only its inputs, the attention mask the largest.
                assert!(
                    d.upload_bytes < 64 << 10,
                    "{spec}: {} bytes up",
                    d.upload_bytes
                );
            }
            assert!(
                calls_seen[1] > 0 && calls_seen[2] > 0,
                "{spec}: steps with one and with two model calls ({calls_seen:?})"
            );
        }
    }

    /// Per optimizer step: one read per micro-batch (every metric at once) and one for the
    /// gradient norm; uploads are the micro-batches' token ids, masks and per-token columns.
    #[test]
    fn per_optimizer_step() {
        use crate::train::optim::{AdamW, AdamWConfig};
        use crate::train::trainer::tests::{config, rows};
        use crate::train::trainer::train;
        for spec in devices() {
            let device = crate::model::device_from_str(&spec).unwrap();
            let m = Model::load(&fixture("tiny-qwen2"), &device.autodiff()).unwrap();
            let data = rows(&m.transformer, 8, 7, 0.3);
            let micro = 2;
            let mut cfg = config(crate::train::loss::LossAgg::TokenMean, micro);
            cfg.mini_batches = 2;
            let per_step = data.len() / cfg.mini_batches / micro;
            assert_eq!(per_step * cfg.mini_batches * micro, data.len());
            let mut opt = AdamW::new(AdamWConfig::default());
            let mut marks = vec![thread_counts()];
            let (_, metrics) = train(m.transformer, &mut opt, &data, &cfg, |_| {
                marks.push(thread_counts());
                Ok(())
            })
            .unwrap();
            assert_eq!(metrics.len(), 2);
            for w in marks.windows(2) {
                let d = w[1] - w[0];
                assert_eq!(
                    d.reads,
                    per_step as u64 + 1,
                    "{spec}: reads per optimizer step ({per_step} micro-batches)"
                );
                // Per micro-batch: token ids, RoPE cos and sin, the attention mask, and the
                // per-token columns (behaviour and reference log-probs, advantages, loss mask,
                // weights, confidence mask); a GPU also uploads the targets of the generic
                // log-prob head (the CPU's fused head reads them on the host).
                let per_micro = if spec == "cpu" { 10 } else { 11 };
                assert_eq!(
                    d.uploads,
                    per_step as u64 * per_micro,
                    "{spec}: uploads per optimizer step"
                );
                assert!(
                    d.upload_bytes < 64 << 10,
                    "{spec}: {} bytes up",
                    d.upload_bytes
                );
            }
        }
    }
}
