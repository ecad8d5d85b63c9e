//! Tests of the training step, and the tiny model, config and rows that other modules' tests
//! share.
//!
//! A test-only file: its parent declares it `#[cfg(test)] mod tests;`.
use super::*;
use crate::model::Model;
use crate::train::optim::AdamWConfig;
use crate::train::policy::{host_logprobs, response_logprobs};
use crate::train::schedule::ScheduleKind;
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::Device;
use clap::ValueEnum;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

pub(crate) fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-qwen2")
}

pub(crate) fn tiny() -> Model {
    Model::load(&tiny_dir(), &Device::flex().autodiff()).expect("tiny-qwen2 fixture")
}

/// The log-probs (temperature 1) `model` gives the responses of `rows`.
fn current_logprobs(model: &Transformer, rows: &[TrainRow]) -> Vec<Vec<f32>> {
    let pairs: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|r| (r.context.as_slice(), r.response.as_slice()))
        .collect();
    host_logprobs(&model.valid(), &pairs, 8, 1.0, None).expect("logprobs")
}

/// Ragged rows of random ids; behaviour log-probs = current ones + noise within ±`noise`
/// (so ratios stay inside the clip range when `noise` is small), advantages ±, a few masked
/// tokens.
pub(crate) fn rows(model: &Transformer, n: usize, seed: u64, noise: f32) -> Vec<TrainRow> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut out: Vec<TrainRow> = (0..n)
        .map(|i| {
            let c = rng.random_range(2..7);
            let r = rng.random_range(2..9);
            let context: Vec<u32> = (0..c).map(|_| rng.random_range(0..360)).collect();
            let response: Vec<u32> = (0..r).map(|_| rng.random_range(0..360)).collect();
            let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
            let adv: Vec<f32> = (0..r)
                .map(|_| sign * rng.random_range(0.2f32..1.5))
                .collect();
            let mask: Vec<bool> = (0..r).map(|t| t == 0 || rng.random_bool(0.85)).collect();
            TrainRow {
                context,
                response,
                old_logp: vec![0.0; r],
                adv,
                mask,
                ref_logp: None,
                is_confidence: i % 3 == 2,
            }
        })
        .collect();
    let lp = current_logprobs(model, &out);
    for (row, lp) in out.iter_mut().zip(lp) {
        let mut noisy: Vec<f32> = lp
            .iter()
            .map(|l| (l + rng.random_range(-noise..=noise)).min(0.0))
            .collect();
        row.ref_logp = Some(lp.iter().map(|l| (l - 0.05).min(0.0)).collect());
        std::mem::swap(&mut row.old_logp, &mut noisy);
    }
    out
}

pub(crate) fn config(agg: LossAgg, micro: usize) -> TrainConfig {
    TrainConfig {
        objective: Objective::Policy {
            clip: ClipConfig::default(),
            kl_coef: 0.1,
            kl_kind: KlEstimator::K3,
            entropy_coef: 0.01,
            conf_entropy_coef: 0.05,
            conf_value_entropy_coef: 0.0,
            value_tokens: None,
        },
        loss_agg: agg,
        agg_len: 8,
        schedule: Schedule::new(1e-3, 0.0, ScheduleKind::Constant, None).expect("schedule"),
        grad_clip: 1.0,
        micro_batch: micro,
        mini_batches: 1,
        epochs: 1,
        temperature: 1.0,
        shuffle: false,
        seed: 0,
        precision: Precision::F32,
        checkpoint_activations: false,
    }
}

/// The largest |a − b| over two lists of named gradients (same names, same order) and the
/// largest |a|.
pub(crate) fn max_abs_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let mut diff = 0f32;
    let mut scale = 0f32;
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        for (x, y) in va.iter().zip(vb) {
            diff = diff.max((x - y).abs());
            scale = scale.max(x.abs());
        }
    }
    (diff, scale)
}

/// Inert rows (every advantage 0, no KL or entropy term) are left out of the passes without
/// changing the gradient: the same batch whose zero advantages are replaced by 1e-30 (not
/// inert, so every row runs; their terms are ~1e-30 of the others', far below f32's
/// resolution) gives the same gradient up to the summation order of other micro-batches, for
/// every aggregation mode. The denominators keep the inert rows: halving the batch's learnable
/// tokens would double a token-mean gradient. A batch of inert rows alone still takes its
/// (zero-gradient) optimizer step.
#[test]
fn inert_rows_are_skipped_without_changing_the_gradient() {
    let m = tiny();
    let mut base = rows(&m.transformer, 6, 7, 0.3);
    for r in base.iter_mut().skip(1).step_by(2) {
        r.adv.iter_mut().for_each(|a| *a = 0.0);
    }
    let mut tiny_adv = base.clone();
    for r in tiny_adv.iter_mut().skip(1).step_by(2) {
        r.adv.iter_mut().for_each(|a| *a = 1e-30);
    }
    let plain = |agg, micro| {
        let mut c = config(agg, micro);
        if let Objective::Policy {
            kl_coef,
            entropy_coef,
            conf_entropy_coef,
            ..
        } = &mut c.objective
        {
            *kl_coef = 0.0;
            *entropy_coef = 0.0;
            *conf_entropy_coef = 0.0;
        }
        c
    };
    for &agg in LossAgg::value_variants() {
        let cfg = plain(agg, 2);
        assert!(cfg.row_is_inert(&base[1]) && !cfg.row_is_inert(&tiny_adv[1]));
        let a: Vec<&TrainRow> = base.iter().collect();
        let b: Vec<&TrainRow> = tiny_adv.iter().collect();
        let (ga, sa) = batch_gradients(&m.transformer, &a, &cfg).expect("skipping");
        let (gb, sb) = batch_gradients(&m.transformer, &b, &cfg).expect("all rows");
        assert_eq!((sa.inert_rows, sb.inert_rows), (3, 0));
        assert_eq!(sa.tokens, sb.tokens);
        assert!(sa.forward_tokens < sb.forward_tokens);
        let (diff, scale) = max_abs_diff(
            &grads_to_host(&m.transformer, &ga),
            &grads_to_host(&m.transformer, &gb),
        );
        assert!(scale > 1e-3, "{agg:?}: gradients vanish ({scale})");
        assert!(
            diff <= 1e-6 * scale,
            "{agg:?}: |Δgrad| {diff:e} of {scale:e}"
        );
        assert!((sa.loss - sb.loss).abs() <= 1e-6 * sb.loss.abs().max(1e-3));
        // With an entropy bonus or a KL term no row is inert.
        let (_, s) = batch_gradients(&m.transformer, &a, &config(agg, 2)).expect("bonus");
        assert_eq!(s.inert_rows, 0);
    }
    // A batch of inert rows alone: one row still runs and the step is taken, not skipped.
    let only: Vec<TrainRow> = base.iter().skip(1).step_by(2).cloned().collect();
    let cfg = plain(LossAgg::TokenMean, 2);
    let mut opt = AdamW::new(AdamWConfig::default());
    let (_, steps) =
        train(m.transformer.clone(), &mut opt, &only, &cfg, |_| Ok(())).expect("train");
    assert_eq!(steps.len(), 1);
    assert!(!steps[0].skipped);
    assert_eq!(steps[0].inert_rows, 2);
    assert_eq!(steps[0].grad_norm, 0.0);
}

/// D6/D7: 4 micro-batches of one row give the same gradient as one batch of four rows, for
/// every aggregation mode (with KL loss, entropy bonus and confidence entropy bonus on).
#[test]
fn accumulation_over_micro_batches_equals_full_batch() {
    let m = tiny();
    let rows = rows(&m.transformer, 4, 1, 0.3);
    let refs: Vec<&TrainRow> = rows.iter().collect();
    for &agg in LossAgg::value_variants() {
        let (g4, s4) = batch_gradients(&m.transformer, &refs, &config(agg, 4)).expect("full");
        let (g1, s1) = batch_gradients(&m.transformer, &refs, &config(agg, 1)).expect("micro");
        let h4 = grads_to_host(&m.transformer, &g4);
        let h1 = grads_to_host(&m.transformer, &g1);
        let (diff, scale) = max_abs_diff(&h4, &h1);
        assert!(scale > 1e-3, "{agg:?}: gradients vanish ({scale})");
        eprintln!(
            "{agg:?}: max |Δgrad| {diff:e}, max |grad| {scale:e}, loss {} vs {}",
            s4.loss, s1.loss
        );
        assert!(
            diff <= 1e-5,
            "{agg:?}: max |Δgrad| = {diff} (scale {scale})"
        );
        assert!(
            (s4.loss - s1.loss).abs() < 1e-6,
            "{agg:?}: {} vs {}",
            s4.loss,
            s1.loss
        );
        assert_eq!(s4.tokens, s1.tokens);
    }
}

/// Replace one coordinate of the parameter at `path` by `value + delta`.
struct Perturb {
    path: Vec<String>,
    target: String,
    index: usize,
    delta: f32,
}

impl ModuleMapper for Perturb {
    fn enter_module(&mut self, name: &str, _c: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _c: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if self.path.join(".") != self.target {
            return param;
        }
        let (id, t, mapper) = param.consume();
        let dims = t.dims();
        let device = t.device();
        let mut v = t
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .expect("f32");
        v[self.index] += self.delta;
        let t = Tensor::<D>::from_data(TensorData::new(v, dims), &device).require_grad();
        Param::from_mapped_value(id, t, mapper)
    }
}

/// The gradient of the PPO loss (with KL, entropy and confidence-entropy terms) against central finite
/// differences of the loss, at the largest-gradient coordinate of several parameters.
/// In f32 (the model's RoPE tables are f32, so an f64 copy of the module does not run): with
/// h = 1e-2 the observed relative error is about 1e-4; the tolerance is 2e-3.
#[test]
fn ppo_gradient_matches_finite_differences() {
    let m = tiny();
    // Small noise: every ratio stays well inside [0.8, 1.2], so no clip switches on or off
    // within ±h.
    let rows = rows(&m.transformer, 4, 2, 0.05);
    let refs: Vec<&TrainRow> = rows.iter().collect();
    let cfg = config(LossAgg::TokenMean, 2);
    let (g, _) = batch_gradients(&m.transformer, &refs, &cfg).expect("grads");
    let host = grads_to_host(&m.transformer, &g);
    let h = 1e-2f32;
    let mut checked = 0;
    for target in [
        "embed",
        "layers.0.attn.qkv",
        "layers.1.attn.o",
        "layers.0.mlp.gate_up",
        "layers.1.mlp.down",
        "layers.1.post_norm",
        "norm",
    ] {
        let Some((_, gv)) = host.iter().find(|(n, _)| n == target) else {
            panic!(
                "no gradient for {target}; have {:?}",
                host.iter().map(|x| &x.0).collect::<Vec<_>>()
            );
        };
        let (index, &grad) = gv
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
            .expect("non-empty");
        let loss_at = |delta: f32| {
            let mut p = Perturb {
                path: vec![],
                target: target.to_string(),
                index,
                delta,
            };
            let pm = m.transformer.clone().map(&mut p);
            batch_gradients(&pm, &refs, &cfg).expect("loss").1.loss
        };
        let fd = (loss_at(h) - loss_at(-h)) / (2.0 * h as f64);
        let err = (fd - grad as f64).abs();
        eprintln!(
            "{target}[{index}]: autodiff {grad:e} fd {fd:e} rel err {:e}",
            err / (grad as f64).abs()
        );
        assert!(
            err <= 2e-3 * (grad as f64).abs() + 2e-5,
            "{target}[{index}]: autodiff {grad:e} vs finite difference {fd:e}"
        );
        checked += 1;
    }
    assert_eq!(checked, 7);
}

/// Repeated on-policy updates on a fixed batch raise the log-probs of positive-advantage
/// responses and lower those of negative ones.
#[test]
fn repeated_updates_move_log_probs_the_right_way() {
    let m = tiny();
    let mut rows = rows(&m.transformer, 6, 3, 0.0);
    for r in &mut rows {
        r.mask = vec![true; r.response.len()];
        let s = if r.adv[0] > 0.0 { 1.0 } else { -1.0 };
        r.adv = vec![s; r.response.len()];
    }
    let mean_lp = |model: &Transformer, rows: &[TrainRow]| -> (f64, f64) {
        let lp = current_logprobs(model, rows);
        let (mut pos, mut neg) = (0.0, 0.0);
        for (r, l) in rows.iter().zip(&lp) {
            let s: f64 = l.iter().map(|&x| x as f64).sum::<f64>() / l.len() as f64;
            if r.adv[0] > 0.0 {
                pos += s;
            } else {
                neg += s;
            }
        }
        (pos, neg)
    };
    let (pos0, neg0) = mean_lp(&m.transformer, &rows);
    let mut cfg = config(LossAgg::TokenMean, 2);
    cfg.objective = Objective::Policy {
        clip: ClipConfig::default(),
        kl_coef: 0.0,
        kl_kind: KlEstimator::K3,
        entropy_coef: 0.0,
        conf_entropy_coef: 0.0,
        conf_value_entropy_coef: 0.0,
        value_tokens: None,
    };
    cfg.schedule = Schedule::new(1e-2, 0.0, ScheduleKind::Constant, None).expect("schedule");
    let mut opt = AdamW::new(AdamWConfig::default());
    let mut model = m.transformer;
    for _ in 0..5 {
        // On-policy: behaviour log-probs are the current ones (ratio 1 at the start).
        let lp = current_logprobs(&model, &rows);
        for (r, l) in rows.iter_mut().zip(lp) {
            r.old_logp = l;
        }
        let (m2, steps) = train(model, &mut opt, &rows, &cfg, |_| Ok(())).expect("train");
        model = m2;
        assert!(!steps[0].skipped);
        assert!(steps[0].clip_frac_low == 0.0 && steps[0].clip_frac_high == 0.0);
        assert!(steps[0].approx_kl.abs() < 1e-6, "on-policy ratio is 1");
    }
    let (pos1, neg1) = mean_lp(&model, &rows);
    eprintln!("positive {pos0} -> {pos1}; negative {neg0} -> {neg1}");
    assert!(pos1 > pos0 + 0.1, "positive rows: {pos0} -> {pos1}");
    assert!(neg1 < neg0 - 0.1, "negative rows: {neg0} -> {neg1}");
    assert_eq!(opt.step, 5);
}

/// Entropy and log-probs of the training path against transformers' figures (oracle refs,
/// f64): a sequence cut into context and response.
#[test]
fn training_logprobs_and_entropy_match_transformers() {
    let m = tiny();
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/refs/tiny-qwen2.rand.f64.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("refs")).expect("json");
    let seqs = v["sequences"].as_array().expect("sequences");
    let mut pairs = Vec::new();
    let mut want_lp = Vec::new();
    let mut want_ent = Vec::new();
    for (j, s) in seqs.iter().enumerate() {
        let ids: Vec<u32> = s["input_ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect();
        let f = |k: &str| -> Vec<f64> {
            s[k].as_array()
                .expect(k)
                .iter()
                .map(|x| x.as_f64().expect("f64"))
                .collect()
        };
        let cut = 5 + 7 * j; // ragged: different context lengths per row
        let end = ids.len() - 3 * j; // and different response lengths
        pairs.push((ids[..cut].to_vec(), ids[cut..end].to_vec()));
        want_lp.push(f("logprobs")[cut - 1..end - 1].to_vec());
        want_ent.push(f("entropy")[cut - 1..end - 1].to_vec());
    }
    let out = response_logprobs(&m.transformer, &pairs, 1.0, EntropyMode::Detached).expect("lp");
    let lp = crate::model::read_f32(out.logp).expect("host");
    let ent = crate::model::read_f32(out.entropy.expect("entropy")).expect("host");
    let lp = crate::train::policy::split_right_aligned(&lp, &out.resp_lens, out.max_resp);
    let ent = crate::train::policy::split_right_aligned(&ent, &out.resp_lens, out.max_resp);
    let mut worst = 0f64;
    for j in 0..pairs.len() {
        assert_eq!(lp[j].len(), want_lp[j].len());
        for t in 0..lp[j].len() {
            worst = worst.max((lp[j][t] as f64 - want_lp[j][t]).abs());
            worst = worst.max((ent[j][t] as f64 - want_ent[j][t]).abs());
        }
    }
    eprintln!("max deviation from transformers: {worst:e}");
    assert!(worst < 1e-4, "max deviation from transformers: {worst}");
    // At temperature 1 the training path gives the numbers of `rlcr logprobs`.
    let rows: Vec<(&[u32], &[u32])> = pairs
        .iter()
        .map(|(c, r)| (c.as_slice(), r.as_slice()))
        .collect();
    let inner = m.transformer.valid();
    let a = crate::model::logprobs(&inner, &rows, 2, false, None)
        .expect("logprobs")
        .logprobs;
    let b = host_logprobs(&inner, &rows, 3, 1.0, None).expect("host");
    for (x, y) in a.iter().zip(&b) {
        for (p, q) in x.iter().zip(y) {
            assert!((p - q).abs() < 2e-6, "{p} vs {q}");
        }
    }
    // Temperature divides the logits: at T = 2 the log-probs differ.
    let c = host_logprobs(&inner, &rows, 3, 2.0, None).expect("host");
    assert!((c[0][0] - b[0][0]).abs() > 1e-3);
}

/// The value position of a confidence row: the last learnable digit right after `digit .`.
#[test]
fn value_mask_finds_the_first_decimal_of_the_last_value() {
    // digits 0..9 are ids 10..19, `.` is 5.
    let v = ValueTokens {
        digits: [10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
        point: 5,
    };
    let all = |n: usize| vec![true; n];
    let at = |m: Vec<bool>| -> Vec<usize> { (0..m.len()).filter(|&i| m[i]).collect() };
    // `<c>0.7</c>`: the 7.
    assert_eq!(at(v.value_mask(&[3, 10, 5, 17, 4], &all(5))), vec![3]);
    // `0.75`: the first decimal only.
    assert_eq!(at(v.value_mask(&[10, 5, 17, 15], &all(4))), vec![2]);
    // Two numbers: the last one (the confidence tag comes last).
    let r = [10, 5, 13, 40, 10, 5, 17, 2];
    assert_eq!(at(v.value_mask(&r, &all(8))), vec![6]);
    // The last one masked: the one before.
    let mut m = all(8);
    m[6] = false;
    assert_eq!(at(v.value_mask(&r, &m)), vec![2]);
    // No value (`.7`, `0.` then a letter, no digit before the point): none.
    assert!(at(v.value_mask(&[5, 17, 4], &all(3))).is_empty());
    assert!(at(v.value_mask(&[10, 5, 40], &all(3))).is_empty());
    assert!(at(v.value_mask(&[40, 5, 17], &all(3))).is_empty());
    assert!(at(v.value_mask(&[], &[])).is_empty());
}

#[test]
fn epoch_batches_split_and_shuffle() {
    let mut cfg = config(LossAgg::TokenMean, 1);
    cfg.mini_batches = 3;
    let b = epoch_batches(7, &cfg, 0).expect("batches");
    assert_eq!(b, vec![vec![0, 1, 2], vec![3, 4], vec![5, 6]]);
    cfg.shuffle = true;
    let s0 = epoch_batches(7, &cfg, 0).expect("batches");
    let s1 = epoch_batches(7, &cfg, 1).expect("batches");
    assert_ne!(s0, s1);
    assert_eq!(s0, epoch_batches(7, &cfg, 0).expect("batches"));
    let mut all: Vec<usize> = s0.concat();
    all.sort();
    assert_eq!(all, (0..7).collect::<Vec<_>>());
    cfg.mini_batches = 8;
    assert!(epoch_batches(7, &cfg, 0).is_err());
}

/// Two optimizer steps on a GPU (lavapipe in CI) add every sum in a fixed order: no kernel that
/// adds with atomics runs (burn's `Tensor::sum` launches one wherever the device has float
/// atomic adds, lavapipe as CUDA), and two runs of the same steps give the same loss, gradient
/// norm and log-probs after, bit for bit; with the activations checkpointed too, and for a
/// critic's steps.
#[cfg(feature = "wgpu")]
#[test]
fn gpu_update_steps_sum_without_atomics() {
    use crate::model::transfer::kernels_launched;
    let _pool = crate::model::memory::pool_test_lock();
    let dev = crate::model::backend::gpu::test_device().autodiff();
    let run = |checkpoint_activations: bool| {
        let m = Model::load(&tiny_dir(), &dev).expect("tiny-qwen2 on the GPU");
        let rows = rows(&m.transformer, 4, 1, 0.3);
        let cfg = TrainConfig {
            checkpoint_activations,
            ..config(LossAgg::TokenMean, 2)
        };
        let mut opt = AdamW::new(AdamWConfig::default());
        let ((model, steps), names) = kernels_launched(|| {
            let (m1, mut s1) =
                train(m.transformer, &mut opt, &rows, &cfg, |_| Ok(())).expect("step 1");
            let (m2, s2) = train(m1, &mut opt, &rows, &cfg, |_| Ok(())).expect("step 2");
            s1.extend(s2);
            (m2, s1)
        });
        let figures: Vec<[f64; 4]> = steps
            .iter()
            .map(|s| [s.loss, s.grad_norm, s.entropy, s.approx_kl])
            .collect();
        (figures, current_logprobs(&model, &rows), names)
    };
    for checkpointed in [false, true] {
        let (f1, lp1, names) = run(checkpointed);
        let atomic = names.iter().filter(|n| n.contains("SharedSum")).count();
        assert!(
            atomic == 0,
            "checkpointed {checkpointed}: {atomic} atomic sums launched (`SharedSumKernel`)"
        );
        assert!(
            names.iter().any(|n| n.contains("ReduceKernel")),
            "checkpointed {checkpointed}: the steps' sums ran as reductions: {names:?}"
        );
        let (f2, lp2, _) = run(checkpointed);
        assert_eq!(
            f1, f2,
            "checkpointed {checkpointed}: the steps' figures differ"
        );
        assert_eq!(
            lp1, lp2,
            "checkpointed {checkpointed}: the log-probs after differ"
        );
    }
    // The critic's two steps (its loss, clip fraction, token count and gradient norm).
    let critic = || {
        use crate::train::critic::{train_critic, CriticConfig, CriticRow};
        let c = crate::model::value::Critic::load(&tiny_dir(), &dev).expect("tiny critic");
        let crows: Vec<CriticRow> = rows(&c.model.body, 4, 1, 0.3)
            .into_iter()
            .map(|r| {
                let n = r.response.len();
                CriticRow {
                    returns: (0..n).map(|i| 0.25 * (i % 5) as f32 - 0.5).collect(),
                    old_values: (0..n).map(|i| 0.1 * (i % 3) as f32).collect(),
                    context: r.context,
                    response: r.response,
                    mask: r.mask,
                }
            })
            .collect();
        let cfg = CriticConfig {
            vf_coef: 0.5,
            cliprange_value: 0.2,
            loss_agg: LossAgg::TokenMean,
            agg_len: 8,
            lr: 1e-3,
            grad_clip: 1.0,
            micro_batch: 2,
            mini_batches: 2,
            epochs: 1,
            adam: AdamWConfig::default(),
            precision: Precision::F32,
        };
        let ((_, steps), names) =
            kernels_launched(|| train_critic(c.model, &crows, &cfg, &mut |_| {}).expect("critic"));
        let figures: Vec<[f64; 4]> = steps
            .iter()
            .map(|s| [s.vf_loss, s.vf_clipfrac, s.grad_norm, s.vpred_mean])
            .collect();
        (figures, names)
    };
    let (c1, names) = critic();
    let atomic = names.iter().filter(|n| n.contains("SharedSum")).count();
    assert!(
        atomic == 0,
        "critic: {atomic} atomic sums launched (`SharedSumKernel`)"
    );
    assert_eq!(c1, critic().0, "the critic's steps differ between two runs");
}
