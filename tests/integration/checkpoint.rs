//! Activation checkpointing (`--checkpoint-activations`): the same gradients as the full graph,
//! on every fixture family (Qwen2 with biases and tied embeddings, Llama untied, Qwen3 with its
//! q/k norms), with every loss term that reaches the model (clipped policy loss, KL, the
//! entropy bonus on the graph), over several micro-batches; and `update` with the flag
//! write the weights they write without it.
use burn::tensor::Device;
use rlcr::model::Model;
use rlcr::train::data::TrainRow;
use rlcr::train::trainer::{batch_gradients, grads_to_host, Objective, TrainConfig};

use super::support::train::{tensors, train_rows, write_rows};
use super::{fixtures, support, Workdir};

fn config(checkpoint_activations: bool, objective: Objective) -> TrainConfig {
    TrainConfig {
        loss_agg: rlcr::train::loss::LossAgg::SeqMeanTokenMean,
        agg_len: 16,
        temperature: 0.9,
        checkpoint_activations,
        ..support::train::config(objective, 2)
    }
}

fn policy() -> Objective {
    Objective::Policy {
        clip: Default::default(),
        kl_coef: 0.1,
        kl_kind: rlcr::train::loss::KlEstimator::K3,
        entropy_coef: 0.01,
        conf_entropy_coef: 0.02,
        conf_value_entropy_coef: 0.0,
        value_tokens: None,
    }
}

/// Rows with token ids inside every fixture's vocabulary, off-policy (ratios ≠ 1, some clipped)
/// and with reference log-probs for the KL term.
fn rows() -> Vec<TrainRow> {
    train_rows()
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            let n = r.response.len();
            r.old_logp = r
                .old_logp
                .iter()
                .enumerate()
                .map(|(k, &l)| l + 0.3 * ((i + k) % 3) as f32 - 0.3)
                .collect();
            r.ref_logp = Some((0..n).map(|k| r.old_logp[k] - 0.05 * k as f32).collect());
            r
        })
        .collect()
}

#[test]
fn checkpointed_gradients_equal_the_full_graph() {
    let device = Device::flex().autodiff();
    let rows = rows();
    let refs: Vec<&TrainRow> = rows.iter().collect();
    for name in ["tiny-qwen2", "tiny-llama", "tiny-qwen3"] {
        let m = Model::load(&fixtures().join(name), &device).unwrap();
        for objective in [policy(), Objective::Sft] {
            let run = |ckpt: bool| {
                let (g, sums) =
                    batch_gradients(&m.transformer, &refs, &config(ckpt, objective)).unwrap();
                (grads_to_host(&m.transformer, &g), sums.loss)
            };
            let (full, loss_full) = run(false);
            let (ckpt, loss_ckpt) = run(true);
            assert_eq!(
                loss_full, loss_ckpt,
                "{name}: the loss is computed the same way"
            );
            assert_eq!(
                full.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                ckpt.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                "{name}: parameters with a gradient"
            );
            // Bit for bit: each layer is recomputed by the same operations on the same input
            // bits, and its upstream gradient enters as `∂(Σ y·g)/∂y = 1·g = g` exactly.
            for ((path, a), (_, b)) in full.iter().zip(&ckpt) {
                assert!(
                    a.iter().any(|&x| x != 0.0),
                    "{name}: {path} has a zero gradient"
                );
                let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    a == b,
                    "{name} {objective:?}: {path} differs (by up to {d:e}) with checkpointing"
                );
            }
            eprintln!(
                "{name}: {} gradients bit-identical with checkpointing",
                full.len()
            );
        }
    }
}

/// The checkpointed forward really keeps no layer on the graph: a loss of its log-probs reaches
/// only the final norm and the LM head until `LayerCheckpoints::backward` runs the layers again.
#[test]
fn checkpointed_forward_keeps_no_layer_on_the_graph() {
    use burn::optim::GradientsParams;
    use rlcr::train::policy::{response_logprobs_subset, EntropyMode};
    let device = Device::flex().autodiff();
    let m = Model::load(&fixtures().join("tiny-qwen3"), &device).unwrap();
    let rows = rows();
    let pairs: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|r| (r.context.as_slice(), r.response.as_slice()))
        .collect();
    for ckpt in [false, true] {
        let out =
            response_logprobs_subset(&m.transformer, &pairs, 1.0, EntropyMode::Off, None, ckpt)
                .unwrap();
        assert_eq!(out.checkpoints.is_some(), ckpt);
        let grads = GradientsParams::from_grads(out.logp.sum().backward(), &m.transformer);
        let with_grad: Vec<String> = grads_to_host(&m.transformer, &grads)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        if ckpt {
            assert_eq!(with_grad, vec!["norm", "lm_head"], "checkpointed graph");
        } else {
            assert!(with_grad.iter().any(|k| k.starts_with("layers.")));
        }
    }
}

#[test]
fn update_with_checkpointing_writes_the_same_weights() {
    let w = Workdir::new();
    write_rows(&w.path("train.parquet"), &train_rows());
    let model = fixtures().join("tiny-qwen2");
    for ckpt in [false, true] {
        let out = if ckpt { "ckpt" } else { "full" };
        let mut args = vec![
            "update",
            "--model",
            model.to_str().unwrap(),
            "--input",
            "train.parquet",
            "-o",
            out,
            "--lr",
            "1e-3",
            "--micro-batch",
            "2",
        ];
        if ckpt {
            args.push("--checkpoint-activations");
        }
        w.run(&args);
    }
    let (a, b) = (tensors(&w.path("full")), tensors(&w.path("ckpt")));
    assert_eq!(a.len(), b.len());
    let mut moved = false;
    for (k, (dt, shape, bytes)) in &a {
        let (dt2, shape2, bytes2) = &b[k];
        assert_eq!((dt, shape), (dt2, shape2), "{k}");
        let f = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        // The same gradients bit for bit, so the same weights bit for bit.
        assert!(bytes == bytes2, "{k} differs with --checkpoint-activations");
        moved |= f(bytes) != f(&tensors(&model)[k].2);
    }
    assert!(moved, "the update moved the weights");
    let cfg: serde_json::Value =
        crate::support::json::read(w.path("ckpt/rlcr-train/trainer_state.json"));
    assert_eq!(cfg["config"]["train"]["checkpoint_activations"], true);
}
