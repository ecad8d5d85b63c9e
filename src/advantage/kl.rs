//! KL penalty in the reward: per-token estimators and the fixed / adaptive coefficient controller
//! (verl `kl_penalty`, `apply_kl_penalty`, `AdaptiveKLController`; `docs/math.md` §2.7).
//!
//! With `d = logp − ref_logp` (behaviour policy log-prob minus reference log-prob, per token):
//! `k1 = d`, `abs = |d|`, `k2 = d²/2`, `k3 = clamp(eˣ − x − 1, −10, 10)` with `x = clamp(−d, −20, 20)`.
//! The penalised token reward is `r_t − β·kl_t·m_t`; for sequence-level estimators the row's score
//! becomes `r − β·Σ_t kl_t·m_t` (the row sum of the token-level rewards, as verl's GRPO does).
//! The controller's state (β before and after the batch, the measured KL) is written into the
//! output's metadata so the next iteration can resume it.

use serde::{Deserialize, Serialize};

/// Clamp applied to `-d` inside k3 (verl `low_var_kl`).
pub const K3_LOG_CLAMP: f64 = 20.0;
/// Clamp applied to the value of k3 (verl `low_var_kl`).
pub const K3_VALUE_CLAMP: f64 = 10.0;

/// KL estimator (`docs/math.md` §2.7), one enum for both places verl uses its `kl_penalty`: the
/// KL in the reward (`advantage --kl-estimator`, verl `algorithm.kl_penalty`, default `kl` = k1)
/// and the KL loss (`update --kl-estimator`, verl `actor.kl_loss_type`, default `low_var_kl` =
/// k3). Both stages parse it with the same names, ours and verl's: `k1`/`kl`, `abs`, `k2`/`mse`,
/// `k3`/`low_var_kl`/`low-var-kl`. verl's straight-through variants (`k1+`, `k3+`: the forward
/// value of k1/k3 with the gradient of k2) are not offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KlEstimator {
    /// `d` (verl `kl`): unbiased for KL(π‖ref), can be negative.
    #[value(alias = "kl")]
    K1,
    /// `|d|` (verl `abs`).
    Abs,
    /// `d²/2` (verl `mse`).
    #[value(alias = "mse")]
    K2,
    /// Schulman's k3 with verl's clamps (verl `low_var_kl`): `clamp(eˣ − x − 1, −10, 10)`,
    /// `x = clamp(ref − logp, −20, 20)`; never negative.
    #[value(alias = "low_var_kl", alias = "low-var-kl")]
    K3,
}

/// One token's KL estimate from the behaviour log-prob `logp` and the reference log-prob `ref_logp`.
pub fn kl_value(logp: f64, ref_logp: f64, est: KlEstimator) -> f64 {
    let d = logp - ref_logp;
    match est {
        KlEstimator::K1 => d,
        KlEstimator::Abs => d.abs(),
        KlEstimator::K2 => 0.5 * d * d,
        KlEstimator::K3 => {
            let x = (-d).clamp(-K3_LOG_CLAMP, K3_LOG_CLAMP);
            (x.exp() - x - 1.0).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)
        }
    }
}

/// Adaptive controller update (Ziegler et al. 2019; verl `AdaptiveKLController.update`):
/// `err = clip(current_kl / target − 1, −0.2, 0.2)`, `β ← β · (1 + err · n_steps / horizon)`.
pub fn adaptive_kl_coef(
    coef: f64,
    current_kl: f64,
    target: f64,
    horizon: f64,
    n_steps: u64,
) -> f64 {
    let err = (current_kl / target - 1.0).clamp(-0.2, 0.2);
    coef * (1.0 + err * n_steps as f64 / horizon)
}

/// The KL coefficient controller (`--kl-coef`, `--kl-target`, `--kl-horizon`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum KlController {
    /// β stays at `coef`.
    Fixed {
        /// β.
        coef: f64,
    },
    /// β follows the measured KL towards `target`.
    Adaptive {
        /// Current β.
        coef: f64,
        /// Target KL per token.
        target: f64,
        /// Horizon in rows (verl `kl_ctrl.horizon`, default 10000).
        horizon: f64,
    },
}

impl KlController {
    /// The coefficient to apply to the current batch.
    pub fn coef(&self) -> f64 {
        match *self {
            KlController::Fixed { coef } | KlController::Adaptive { coef, .. } => coef,
        }
    }

    /// Update after a batch of `n_steps` rows whose mean per-row masked-mean KL is `current_kl`.
    pub fn update(&mut self, current_kl: f64, n_steps: u64) {
        if let KlController::Adaptive {
            coef,
            target,
            horizon,
        } = self
        {
            *coef = adaptive_kl_coef(*coef, current_kl, *target, *horizon, n_steps);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    // One parser for both stages: ours and verl's names, nothing else.
    #[test]
    fn names_ours_and_verls() {
        for (names, want) in [
            (&["k1", "kl"][..], KlEstimator::K1),
            (&["abs"][..], KlEstimator::Abs),
            (&["k2", "mse"][..], KlEstimator::K2),
            (&["k3", "low_var_kl", "low-var-kl"][..], KlEstimator::K3),
        ] {
            for n in names {
                assert_eq!(KlEstimator::from_str(n, false), Ok(want), "{n}");
            }
            // metadata spells the canonical name
            let json = serde_json::to_string(&want).unwrap();
            assert_eq!(json, format!("\"{}\"", names[0]));
        }
        for bad in ["full", "k3+", "k1+", "K3", "lowvar"] {
            assert!(KlEstimator::from_str(bad, false).is_err(), "{bad}");
        }
    }

    // The estimator table of docs/math.md §2.7.
    #[test]
    fn kl_estimator_table() {
        let rows: [(f64, f64, [f64; 4]); 4] = [
            (-1.0, -1.5, [0.5, 0.5, 0.125, 0.106531]),
            (-2.0, -1.0, [-1.0, 1.0, 0.5, 0.718282]),
            (-0.1, -0.1, [0.0, 0.0, 0.0, 0.0]),
            (-30.0, -1.0, [-29.0, 29.0, 420.5, 10.0]),
        ];
        for (lp, rf, want) in rows {
            for (est, w) in [
                KlEstimator::K1,
                KlEstimator::Abs,
                KlEstimator::K2,
                KlEstimator::K3,
            ]
            .into_iter()
            .zip(want)
            {
                let got = kl_value(lp, rf, est);
                assert!(
                    (got - w).abs() < 1e-6,
                    "{est:?}({lp}, {rf}) = {got}, want {w}"
                );
            }
        }
        // The k3 clamp on the log-ratio: x = 20 (not 29) before the ±10 clamp; below it, unclamped.
        assert_eq!(kl_value(-30.0, -1.0, KlEstimator::K3), 10.0);
        let x: f64 = 2.0;
        assert!((kl_value(-3.0, -1.0, KlEstimator::K3) - (x.exp() - x - 1.0)).abs() < 1e-12);
    }

    // docs/math.md §2.7: KL in the reward, β = 0.001, per-token k1 = [0.02, −0.01, 0.03, 0, 0.05].
    #[test]
    fn kl_in_reward_worked_example() {
        let r = [0.0, 0.0, 0.0, 0.0, 1.0];
        let k1 = [0.02, -0.01, 0.03, 0.0, 0.05];
        let c = KlController::Fixed { coef: 0.001 };
        let out: Vec<f64> = r.iter().zip(k1).map(|(r, k)| r - c.coef() * k).collect();
        let want = [-0.00002, 0.00001, -0.00003, 0.0, 0.99995];
        for (g, w) in out.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{g} vs {w}");
        }
    }

    // docs/math.md §2.7: adaptive controller (kl_coef 0.2, target 6, horizon 1e4, n_steps 256).
    #[test]
    fn adaptive_controller_worked_example() {
        for (kl, want) in [(9.0, 0.201024), (3.0, 0.198976), (6.3, 0.200256)] {
            let mut c = KlController::Adaptive {
                coef: 0.2,
                target: 6.0,
                horizon: 1e4,
            };
            c.update(kl, 256);
            assert!(
                (c.coef() - want).abs() < 1e-9,
                "kl {kl}: {} vs {want}",
                c.coef()
            );
        }
        let mut f = KlController::Fixed { coef: 0.2 };
        f.update(100.0, 256);
        assert_eq!(f.coef(), 0.2);
    }
}
