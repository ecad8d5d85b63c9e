//! Training settings for the tests that drive the trainer directly.
use rlcr::train::loss::{KlEstimator, LossAgg};
use rlcr::train::schedule::{Schedule, ScheduleKind};
use rlcr::train::trainer::{Objective, TrainConfig};

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
