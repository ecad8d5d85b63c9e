//! Training: the policy-gradient update (`rlcr update`) and the supervised warm start (`rlcr sft`).
//!
//! Layers, bottom up:
//! - [`loss`]: the RL math over plain slices (PPO/GRPO token loss with asymmetric and dual clip,
//!   loss aggregation, KL estimators, entropy): the reference, pinned by the worked numbers of `docs/math.md`.
//! - [`tensor`]: the same math over burn tensors, differentiable, checked equal to [`loss`].
//! - [`schedule`]: learning-rate warmup and decay at the global optimizer step.
//! - [`optim`]: AdamW with global gradient-norm clipping; its state keyed by parameter path.
//! - [`policy`]: response log-probs (policy, reference, behaviour) through one function.
//! - [`data`], [`sft`]: training rows from tables, checked once up front.
//! - [`trainer`]: the loop (update batches, micro-batches with accumulation, clipping, steps).
//! - [`checkpoint`], [`session`]: the output folder, resuming, metrics.
//! - [`load`]: the model to train, with a fresh or continued LoRA adapter.
//!
//! The central design decision is that every aggregation mode is a weighted token sum whose
//! weights are computed once over the whole update batch, so micro-batching (gradient
//! accumulation) never changes the loss or its gradient.
pub mod checkpoint;
pub mod critic;
pub mod data;
pub mod diagnostics;
pub mod load;
pub mod loss;
pub mod optim;
pub mod policy;
pub mod schedule;
pub mod session;
pub mod sft;
pub mod stage;
pub mod tensor;
pub mod trainer;
