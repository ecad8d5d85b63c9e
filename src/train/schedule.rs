//! Learning-rate schedules: linear warmup, then constant, linear decay or cosine decay.
//!
//! The formulas are those of Hugging Face transformers' `get_{constant,linear,cosine}_schedule_with_warmup`
//! (which verl uses too), evaluated at the *global* optimizer step, so that a run split over many
//! `rlcr update` processes (one per RL iteration, each resuming the step counter) follows one
//! schedule. As in transformers, step `s` (0-based, the number of optimizer steps already taken)
//! uses `lr · s / warmup` during warmup: the very first step of a run with warmup has lr 0.
//!
//! Warmup is given in steps, or as a fraction of the total steps when it is below 1 (verl's
//! `lr_warmup_steps_ratio`, RLCR's `warmup_ratio`).
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// Shape of the schedule after warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleKind {
    /// Constant after warmup (transformers `constant_with_warmup`).
    #[default]
    Constant,
    /// Linear decay to 0 at `total_steps`.
    Linear,
    /// Half-cosine decay to 0 at `total_steps`.
    Cosine,
}

/// A resolved learning-rate schedule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Peak learning rate.
    pub lr: f64,
    /// Warmup steps.
    pub warmup_steps: u64,
    /// Shape after warmup.
    pub kind: ScheduleKind,
    /// Total optimizer steps of the run (needed by `linear` and `cosine`).
    pub total_steps: Option<u64>,
}

impl Schedule {
    /// Build a schedule; `warmup` < 1 is a fraction of `total_steps`, ≥ 1 a step count.
    pub fn new(lr: f64, warmup: f64, kind: ScheduleKind, total_steps: Option<u64>) -> Result<Self> {
        if !(lr.is_finite() && lr >= 0.0) {
            bail!("--lr must be a finite number >= 0, got {lr}");
        }
        if !(warmup.is_finite() && warmup >= 0.0) {
            bail!("--warmup must be a finite number >= 0, got {warmup}");
        }
        if kind != ScheduleKind::Constant && total_steps.is_none() {
            bail!(
                "--schedule {} needs --total-steps (the optimizer steps of the whole run)",
                match kind {
                    ScheduleKind::Linear => "linear",
                    _ => "cosine",
                }
            );
        }
        let warmup_steps = if warmup > 0.0 && warmup < 1.0 {
            let Some(t) = total_steps else {
                bail!("a fractional --warmup ({warmup}) needs --total-steps");
            };
            (warmup * t as f64).ceil() as u64
        } else {
            if warmup.fract() != 0.0 {
                bail!(
                    "--warmup must be a whole number of steps or a fraction below 1, got {warmup}"
                );
            }
            warmup as u64
        };
        Ok(Self {
            lr,
            warmup_steps,
            kind,
            total_steps,
        })
    }

    /// The learning rate of global optimizer step `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * step as f64 / self.warmup_steps.max(1) as f64;
        }
        let total = self.total_steps.unwrap_or(u64::MAX);
        let progress = || {
            let num = step.saturating_sub(self.warmup_steps) as f64;
            let den = total.saturating_sub(self.warmup_steps).max(1) as f64;
            num / den
        };
        match self.kind {
            ScheduleKind::Constant => self.lr,
            ScheduleKind::Linear => {
                let num = total.saturating_sub(step) as f64;
                let den = total.saturating_sub(self.warmup_steps).max(1) as f64;
                self.lr * (num / den).max(0.0)
            }
            ScheduleKind::Cosine => {
                let p = progress();
                self.lr * (0.5 * (1.0 + (std::f64::consts::PI * p).cos())).max(0.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-15 + 1e-12 * b.abs()
    }

    /// Hand values of transformers' lambdas, lr = 1, warmup 2, total 10.
    #[test]
    fn schedules_by_hand() {
        let c = Schedule::new(1.0, 2.0, ScheduleKind::Constant, None).unwrap();
        let got: Vec<f64> = (0..5).map(|s| c.lr_at(s)).collect();
        assert_eq!(got, vec![0.0, 0.5, 1.0, 1.0, 1.0]);

        // Linear after warmup: (10 − s) / 8. Cosine: progress (s − 2)/8: s = 6 → ½(1 + cos(π/2))
        // = 0.5; s = 4 → ½(1 + cos(π/4)) = 0.853553.
        let linear: &[(u64, f64)] = &[
            (0, 0.0),
            (1, 0.5),
            (2, 1.0),
            (3, 0.875),
            (6, 0.5),
            (10, 0.0),
            (12, 0.0),
        ];
        let cosine: &[(u64, f64)] = &[
            (1, 0.5),
            (2, 1.0),
            (4, 0.853_553_390_593_273_7),
            (6, 0.5),
            (10, 0.0),
        ];
        for (kind, cases) in [
            (ScheduleKind::Linear, linear),
            (ScheduleKind::Cosine, cosine),
        ] {
            let sched = Schedule::new(1.0, 2.0, kind, Some(10)).unwrap();
            for &(s, want) in cases {
                let got = sched.lr_at(s);
                assert!(close(got, want), "{kind:?} step {s}: {got}");
            }
        }
    }

    #[test]
    fn warmup_fraction_and_errors() {
        let s = Schedule::new(2e-6, 0.05, ScheduleKind::Constant, Some(100)).unwrap();
        assert_eq!(s.warmup_steps, 5);
        assert!(close(s.lr_at(1), 0.4e-6));
        assert!(Schedule::new(1.0, 0.5, ScheduleKind::Constant, None).is_err());
        assert!(Schedule::new(1.0, 0.0, ScheduleKind::Cosine, None).is_err());
        assert!(Schedule::new(1.0, 2.5, ScheduleKind::Constant, None).is_err());
        assert!(Schedule::new(-1.0, 0.0, ScheduleKind::Constant, None).is_err());
        assert!(Schedule::new(f64::NAN, 0.0, ScheduleKind::Constant, None).is_err());
        // No warmup: the first step has the full lr.
        let s = Schedule::new(3.0, 0.0, ScheduleKind::Constant, None).unwrap();
        assert_eq!(s.lr_at(0), 3.0);
    }
}
