//! `rlcr advantage`: the command line of the advantage stage (help, flags, plan). The engine is
//! [`crate::advantage::stage`]; the estimators are the pure functions of [`crate::advantage`].
use std::path::PathBuf;

use anyhow::Result;

use super::common::Global;
use super::flags::TableIo;
use crate::advantage::stage::{self, KlCtrl, KlRequest, Plan, Preset};
use crate::advantage::{
    ConfNorm, Estimator, GroupNorm, KlEstimator, MissingSpan, MultiTurnConfig, Norm,
    RewardDistribution, Singleton, StdKind, TreeConfig,
};

pub const ABOUT: &str =
    "Compute advantages, token advantages and loss masks (RLCR tree, GRPO, RLOO, multi-turn GRPO, GAE)";
pub const LONG_ABOUT: &str = "\
Compute per-row advantages from the rewards of a scored table, and put them on tokens.

Estimators (--estimator):
  rlcr            (default) answers normalised per prompt over their G_a rewards, times
                  --lambda-ans; confidences normalised per answer over their G_c Brier rewards, times
                  --lambda-conf. Confidences of different answers are never pooled. --conf-norm
                  answer+prompt adds a prompt-level scaling step (centre per answer, then divide by the
                  prompt-level std of the centred values).
  grpo            outcome GRPO per (prompt, sample_type).
  rloo            leave-one-out baseline per (prompt, sample_type).
  grpo-multiturn  KG-R1's multi-turn GRPO: turn rewards (pooled over all turns of a prompt) and
                  global rewards normalised separately per prompt, combined as --turn-weight * A_turn +
                  --global-weight * A_global on each turn's tokens (needs reward_components; turns are
                  matched through token_turn_ids).
  gae             verl's masked GAE (--gamma, --lam) over a `values` column, returns before
                  whitening, batch-wide masked whitening; the sequence reward goes on tokens by
                  --reward-distribution.

Group normalisation: --norm std|mean, --std unbiased|biased, --eps, --singleton zero|verl, or a
--preset (verl, trl, rlcr, kg-r1) that explicit flags override. Zero-std groups get advantage 0;
--drop-zero-std also removes them from the loss mask.

Masks: answer rows learn on answer_span, confidence rows on confidence_span; a null span means the
whole response (or nothing with --on-missing-span skip). info_mask (0 = observation) and
token_turn_ids (-1 = not trainable) are honoured when present.

KL in the reward (--kl-coef > 0, needs ref_logprobs and response_logprobs): per-token
--kl-estimator k1|abs|k2|k3 (verl's clamps), subtracted from the token rewards (for sequence
estimators: from the row's score); --kl-ctrl adaptive with --kl-target/--kl-horizon, resumable with
--kl-state PREVIOUS_OUTPUT.

Reads: a scored trajectory table. Writes: the same rows and columns plus advantage,
token_advantages, loss_mask (and returns, trajectory_score with gae); statistics in the metadata.
Example:
  rlcr advantage --input scored.parquet -o train.parquet --estimator rlcr --lambda-conf 0.5";

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub io: TableIo,
    /// Estimator.
    #[arg(long, value_enum, default_value = "rlcr")]
    pub estimator: Estimator,
    /// Weight of answer advantages (rlcr, grpo, rloo).
    #[arg(long, default_value_t = 1.0)]
    pub lambda_ans: f64,
    /// Weight of confidence advantages (rlcr, grpo, rloo).
    #[arg(long, default_value_t = 1.0)]
    pub lambda_conf: f64,
    /// Confidence normalisation of the rlcr tree: per answer, or per answer then prompt-level scale.
    #[arg(long, value_enum, default_value = "answer")]
    pub conf_norm: ConfNorm,
    /// Parity preset for --norm/--std/--eps/--singleton/--turn-weight (explicit flags win).
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// Group normalisation: divide by std, or only subtract the mean. [default: std]
    #[arg(long, value_enum)]
    pub norm: Option<Norm>,
    /// Override --norm for confidence rows (RLCR's confidence reproduction uses mean).
    #[arg(long, value_enum)]
    pub norm_conf: Option<Norm>,
    /// Standard deviation convention. [default: unbiased]
    #[arg(long, value_enum)]
    pub std: Option<StdKind>,
    /// Added to the std before dividing (verl 1e-6, TRL/RLCR 1e-4). [default: 1e-6]
    #[arg(long)]
    pub eps: Option<f64>,
    /// Groups of one row: advantage 0, or verl's mean 0 / std 1. [default: zero]
    #[arg(long, value_enum)]
    pub singleton: Option<Singleton>,
    /// Remove rows of zero-std groups from the loss mask (DAPO-style dynamic filtering).
    #[arg(long)]
    pub drop_zero_std: bool,
    /// Loss mask of a row whose span is null.
    #[arg(long, value_enum, default_value = "whole")]
    pub on_missing_span: MissingSpan,
    /// grpo-multiturn: weight of the turn advantage (KG-R1: 0.5). [default: 1.0]
    #[arg(long)]
    pub turn_weight: Option<f64>,
    /// grpo-multiturn: weight of the global advantage.
    #[arg(long, default_value_t = 1.0)]
    pub global_weight: f64,
    /// gae: discount.
    #[arg(long, default_value_t = 1.0)]
    pub gamma: f64,
    /// gae: lambda.
    #[arg(long, default_value_t = 1.0)]
    pub lam: f64,
    /// gae: how the sequence reward is put on tokens.
    #[arg(long, value_enum, default_value = "final_token_only")]
    pub reward_distribution: RewardDistribution,
    /// KL coefficient in the reward (0 = off; needs ref_logprobs).
    #[arg(long, default_value_t = 0.0)]
    pub kl_coef: f64,
    /// KL estimator (verl names kl, mse, low_var_kl accepted).
    #[arg(long, value_enum, default_value = "k1")]
    pub kl_estimator: KlEstimator,
    /// KL controller.
    #[arg(long, value_enum, default_value = "fixed")]
    pub kl_ctrl: KlCtrl,
    /// Adaptive controller: target KL.
    #[arg(long, default_value_t = 0.1)]
    pub kl_target: f64,
    /// Adaptive controller: horizon (rows).
    #[arg(long, default_value_t = 10000.0)]
    pub kl_horizon: f64,
    /// Resume the adaptive controller from a previous `rlcr advantage` output's metadata.
    #[arg(long)]
    pub kl_state: Option<PathBuf>,
    /// Rows per batch while streaming.
    #[arg(long, default_value_t = 8192)]
    pub batch_size: usize,
}

impl TryFrom<(&Global, &Args)> for Plan {
    type Error = anyhow::Error;

    /// The validated plan: the flags first, then the KL controller (its state read last); usage
    /// errors exit 2.
    fn try_from((g, a): (&Global, &Args)) -> Result<Plan> {
        let d = Preset::defaults(a.preset);
        let ans = GroupNorm {
            norm: a.norm.unwrap_or(d.norm),
            std: a.std.unwrap_or(StdKind::Unbiased),
            eps: a.eps.unwrap_or(d.eps),
            singleton: a.singleton.unwrap_or(d.singleton),
        };
        let conf = GroupNorm {
            norm: a.norm_conf.unwrap_or(ans.norm),
            ..ans
        };
        let mut plan = Plan {
            estimator: a.estimator,
            tree: TreeConfig {
                ans,
                conf,
                lambda_ans: a.lambda_ans,
                lambda_conf: a.lambda_conf,
                conf_norm: a.conf_norm,
            },
            multiturn: MultiTurnConfig {
                norm: ans,
                turn_weight: a.turn_weight.unwrap_or(d.turn_weight),
                global_weight: a.global_weight,
            },
            drop_zero_std: a.drop_zero_std,
            on_missing_span: a.on_missing_span,
            gamma: a.gamma,
            lam: a.lam,
            reward_distribution: a.reward_distribution,
            kl: None,
            preset: a.preset,
            batch_size: a.batch_size,
            input: a.io.input.clone(),
            out: a.io.out.clone(),
            argv: g.argv.clone(),
        };
        plan.validate()?;
        let kl = KlRequest {
            estimator: a.kl_estimator,
            ctrl: a.kl_ctrl,
            coef: a.kl_coef,
            target: a.kl_target,
            horizon: a.kl_horizon,
            state: a.kl_state.clone(),
        };
        plan.kl = kl.plan(a.estimator)?;
        Ok(plan)
    }
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    stage::run(&Plan::try_from((g, &a))?)
}
