//! Training for the tests: fixed rows of the tiny model, trainer settings, and what a trained
//! folder holds (its tensors and its step metrics).
use std::collections::BTreeMap;
use std::path::Path;

use burn::tensor::Device;
use rlcr::model::Model;
use rlcr::table::{write_table, Meta, TRAJECTORY};
use rlcr::train::data::{rows_to_batch, TrainRow};
use rlcr::train::loss::{KlEstimator, LossAgg};
use rlcr::train::policy::host_logprobs;
use rlcr::train::schedule::{Schedule, ScheduleKind};
use rlcr::train::trainer::{Objective, TrainConfig};

use crate::Workdir;

/// The policy loss with every coefficient zero but `kl_coef` and `entropy_coef` (K3 KL, the
/// default clip range, no value tokens).
pub fn policy(kl_coef: f64, entropy_coef: f64) -> Objective {
    Objective::Policy {
        clip: Default::default(),
        kl_coef,
        kl_kind: KlEstimator::K3,
        entropy_coef,
        conf_entropy_coef: 0.0,
        conf_value_entropy_coef: 0.0,
        value_tokens: None,
    }
}

/// One epoch of one optimizer step over micro-batches of `micro_batch` rows at a constant lr of
/// 1e-3, token-mean loss, gradient clip 1, temperature 1, no shuffle, f32, no checkpointing;
/// a test changes what it needs with `TrainConfig { .., ..config(..) }`.
pub fn config(objective: Objective, micro_batch: usize) -> TrainConfig {
    TrainConfig {
        objective,
        loss_agg: LossAgg::TokenMean,
        agg_len: 64,
        schedule: Schedule::new(1e-3, 0.0, ScheduleKind::Constant, None).unwrap(),
        grad_clip: 1.0,
        micro_batch,
        mini_batches: 1,
        epochs: 1,
        temperature: 1.0,
        shuffle: false,
        seed: 0,
        precision: Default::default(),
        checkpoint_activations: false,
    }
}

/// Six rows of fixed token ids with on-policy behaviour log-probs; even rows positive, odd rows
/// negative advantages.
pub fn train_rows() -> Vec<TrainRow> {
    let m = Model::load(&crate::fixtures().join("tiny-qwen2"), &Device::flex()).unwrap();
    let mut rows: Vec<TrainRow> = (0..6u32)
        .map(|i| {
            let context: Vec<u32> = (0..3 + i % 3).map(|t| 20 + 7 * i + t).collect();
            let response: Vec<u32> = (0..4 + i % 4).map(|t| 100 + 13 * t + i).collect();
            let n = response.len();
            let s = if i % 2 == 0 { 1.0 } else { -1.0 };
            TrainRow {
                context,
                response,
                old_logp: vec![0.0; n],
                adv: vec![s; n],
                mask: (0..n).map(|t| t + 1 < n || i < 3).collect(),
                ref_logp: None,
                is_confidence: i >= 4,
            }
        })
        .collect();
    let pairs: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|r| (r.context.as_slice(), r.response.as_slice()))
        .collect();
    let lp = host_logprobs(&m.transformer, &pairs, 8, 1.0, None).unwrap();
    for (r, l) in rows.iter_mut().zip(lp) {
        r.old_logp = l;
    }
    rows
}

/// Rows as an `advantage` table at `path`.
pub fn write_rows(path: &Path, rows: &[TrainRow]) {
    let b = rows_to_batch(rows).unwrap();
    let meta = Meta::new(&TRAJECTORY, "advantage", serde_json::json!({}), &[]);
    write_table(path, b.schema(), &[b], &meta).unwrap();
}

/// Every tensor of a model folder: name → (dtype, shape, bytes).
pub fn tensors(dir: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for f in rlcr::model::weights::weight_files(dir).unwrap() {
        let bytes = std::fs::read(&f).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, v) in st.tensors() {
            out.insert(
                name,
                (
                    format!("{:?}", v.dtype()),
                    v.shape().to_vec(),
                    v.data().to_vec(),
                ),
            );
        }
    }
    out
}

/// Two `update` calls on [`train_rows`] (written to `train.parquet`): the tiny Qwen2 fixture into
/// `it1`, then `it1` into `it2` resuming its optimizer (`--resume auto`), two epochs of 4-row
/// micro-batches at lr 3e-3 each, with `extra` flags; the lines of `it2`'s `train_metrics.jsonl`
/// (the four steps of both calls).
pub fn update_twice(w: &Workdir, extra: &[&str]) -> Vec<serde_json::Value> {
    write_rows(&w.path("train.parquet"), &train_rows());
    let model = crate::fixtures().join("tiny-qwen2");
    let mut base = vec![
        "--input",
        "train.parquet",
        "--lr",
        "3e-3",
        "--micro-batch",
        "4",
        "--epochs",
        "2",
        "--resume",
        "auto",
    ];
    base.extend_from_slice(extra);
    for (from, to) in [(model.to_str().unwrap(), "it1"), ("it1", "it2")] {
        let mut args = vec!["update", "--model", from, "-o", to];
        args.extend(&base);
        w.run(&args);
    }
    metrics(&w.path("it2"))
}

/// The lines of a model folder's `train_metrics.jsonl`.
pub fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("train_metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
