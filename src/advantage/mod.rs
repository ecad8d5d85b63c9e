//! Advantage estimators: pure math over slices and dense group indices, no I/O.
//!
//! Everything here follows the manner of verl's `core_algos.py`: plain functions that take rewards
//! (as `f64` slices) and a group index per row (dense `u32` ids `0..n_groups`, built by the caller
//! from `prompt_id` or `(prompt_id, answer_idx)`), and return values. Each function documents its
//! formula (derived with worked numbers in `docs/math.md`), the public implementation it reproduces
//! and its edge-case policy, and has a slow,
//! obvious reference implementation next to it that the tests check it against on random inputs.
//!
//! Layout:
//! - [`group`]: group statistics and normalisation (mean/std, `--norm`, `--std`, `--eps`,
//!   `--singleton`, zero-std detection). Every grouped estimator is built on it.
//! - [`outcome`]: sequence-level estimators: GRPO outcome, RLOO and the RLCR confidence tree
//!   (answers per prompt, confidences per answer, never pooled across answers).
//! - [`multiturn`]: structured multi-turn GRPO (KG-R1's) (turn rewards and global rewards normalised
//!   separately per prompt, combined with weights, written per turn).
//! - [`gae`]: verl's masked GAE recursion and batch-wide masked whitening.
//! - [`kl`]: KL estimators (k1/abs/k2/k3 with verl's clamps) and the fixed/adaptive KL controller.
//! - [`tokens`]: loss masks from spans, `info_mask` and turn ids; putting sequence rewards and
//!   advantages on tokens (`final_token_only`, `turn_proportional`).
//!
//! Design decisions:
//! - Arithmetic is `f64` throughout (rewards arrive as `f32`); results are rounded to `f32` only
//!   when written. The order of every sum is the row order, so results do not depend on batch sizes
//!   or thread counts.
//! - A group whose rewards are all bit-identical is "zero-std": its advantages are exactly 0
//!   (`docs/math.md` §2.1), instead of a rounding residue divided by `eps`.
//! - The choices people argue about are closed enums (clap `ValueEnum` + serde) whose names are the
//!   flag values, so the choice is recorded verbatim in the output's metadata.

pub mod gae;
pub mod group;
pub mod kl;
pub mod multiturn;
pub mod outcome;
pub mod stage;
pub mod tokens;

use serde::{Deserialize, Serialize};

pub use gae::{gae_row, masked_whiten, whiten_value, MaskedMoments, WHITEN_EPS};
pub use group::{
    group_stats, n_groups_of, normalize_in_groups, normalized, GroupNorm, GroupStat, GroupSummary,
};
pub use kl::{adaptive_kl_coef, kl_value, KlController, KlEstimator};
pub use multiturn::{
    grpo_multiturn, multiturn_token_advantages, MultiTurnConfig, MultiTurnOutput, TurnReward,
};
pub use outcome::{grpo, rlcr_tree, rloo, Outcome, SampleType, TreeConfig, TreeOutput};
pub use tokens::{
    distribute_final_token, distribute_turn_proportional, fill_loss_mask, fill_token_advantages,
    final_token_total, masked_sum, MissingSpan, RewardDistribution, Span,
};

/// The advantage estimator (`--estimator`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Estimator {
    /// The RLCR tree: answers per prompt over G_a, confidences per answer over G_c.
    Rlcr,
    /// Outcome GRPO per prompt over all rows of one sample type (verl `grpo`).
    Grpo,
    /// Leave-one-out baseline per prompt and sample type (verl `rloo`).
    Rloo,
    /// Structured multi-turn (KG-R1): turn and global rewards normalised separately per prompt.
    GrpoMultiturn,
    /// Generalised advantage estimation with a `values` column (verl `gae`).
    Gae,
}

/// What a group normalisation divides by (`--norm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Norm {
    /// `(r - mean) / (std + eps)` (verl `norm_adv_by_std_in_grpo=True`, TRL `scale_rewards="group"`).
    Std,
    /// `r - mean` only (Dr.GRPO; RLCR's `scale_rewards: false`).
    Mean,
}

/// Which standard deviation (`--std`); `docs/math.md` §2.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StdKind {
    /// Bessel-corrected, divide by N−1 (`torch.std`; verl, TRL, RLCR).
    Unbiased,
    /// Divide by N (numpy's default, the DeepSeekMath paper text).
    Biased,
}

/// What a group of one row gets (`--singleton`); `docs/math.md` §2.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Singleton {
    /// Advantage 0 (TRL; the toolkit default: no raw-reward leakage), counted in the statistics.
    Zero,
    /// verl/KG-R1: mean 0, std 1, so `A = r / (1 + eps)` (or `r` with `--norm mean`).
    Verl,
}

/// The confidence branch of the RLCR tree (`--conf-norm`); `docs/math.md` §2.3.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub enum ConfNorm {
    /// Level 1 only: each confidence normalised within its own answer's G_c group.
    #[value(name = "answer")]
    #[serde(rename = "answer")]
    Answer,
    /// Variant (c): centre within the answer, then scale by the prompt-level statistics of the
    /// G_a·G_c centred values (answer correctness never leaks into the sign or the centring).
    #[value(name = "answer+prompt")]
    #[serde(rename = "answer+prompt")]
    AnswerPrompt,
}
