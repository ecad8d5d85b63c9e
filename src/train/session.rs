//! One training call from start to finish, shared by `update` and `sft`: resume the optimizer,
//! run the loop with a progress bar, write the checkpoint folder with its state and metrics.
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::model::Model;
use crate::progress::Progress;

use super::checkpoint::{
    has_state, load_resume, metrics_line, previous_metrics, write_checkpoint, Summary,
    TrainerState, STATE_FORMAT,
};
use super::data::TrainRow;
use super::optim::{AdamW, AdamWConfig};
use super::trainer::{train, StepMetrics, TrainConfig};

/// `--resume`: continue the optimizer and step counter saved in the `--model` folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ResumeMode {
    /// Start a fresh optimizer at step 0.
    #[default]
    No,
    /// Resume; an error when the folder has no trainer state.
    Yes,
    /// Resume when the folder has a trainer state, else start fresh (the first RL iteration).
    Auto,
}

/// Everything about a call except the model and rows.
pub struct Session {
    /// `update` or `sft`.
    pub stage: String,
    /// Output folder.
    pub out: PathBuf,
    /// Resume mode.
    pub resume: ResumeMode,
    /// AdamW hyper-parameters.
    pub adamw: AdamWConfig,
    /// The loop's configuration.
    pub train: TrainConfig,
    /// Resolved configuration recorded in the trainer state.
    pub config: serde_json::Value,
    /// Input paths recorded in the trainer state.
    pub inputs: Vec<String>,
}

/// The optimizer to start from: a fresh one, or the state saved in `dir`.
pub fn start_optimizer(
    dir: &Path,
    mode: ResumeMode,
    cfg: AdamWConfig,
    model: &crate::model::Transformer,
) -> Result<(AdamW, bool)> {
    let resume = match mode {
        ResumeMode::No => false,
        ResumeMode::Yes => {
            if !has_state(dir) {
                bail!(
                    "--resume: {} has no trainer state (rlcr-train/trainer_state.json); use \
                     --resume auto to start fresh when there is none",
                    dir.display()
                );
            }
            true
        }
        ResumeMode::Auto => has_state(dir),
    };
    if !resume {
        return Ok((AdamW::new(cfg), false));
    }
    let inner = model.device().inner();
    let r = load_resume(dir, cfg, &inner)?;
    r.opt.check_against(model)?;
    crate::info!(
        "resuming from {} at global step {}",
        dir.display(),
        r.global_step
    );
    Ok((r.opt, true))
}

/// Train `model` on `rows` and write the checkpoint folder. Returns the step metrics.
pub fn run(mut model: Model, rows: &[TrainRow], s: &Session) -> Result<Vec<StepMetrics>> {
    s.train.validate()?;
    s.adamw.validate()?;
    let (mut opt, resumed) = start_optimizer(&model.dir, s.resume, s.adamw, &model.transformer)?;
    let total = (s.train.epochs * s.train.mini_batches) as u64;
    let mut progress = Progress::new(&s.stage, total, "steps");
    let mut lines = if resumed {
        previous_metrics(&model.dir)?
    } else {
        Vec::new()
    };
    let t0 = Instant::now();
    let transformer = model.transformer;
    let (trained, steps) = train(transformer, &mut opt, rows, &s.train, |m| {
        lines.push(metrics_line(&s.stage, m)?);
        progress.message(&format!("loss {:.4} gnorm {:.3}", m.loss, m.grad_norm));
        progress.inc(1);
        crate::debug!(
            "step {}: loss {:.6} pg {:.6} kl {:.6} entropy {:.4} clip {:.3}/{:.3}/{:.3} gnorm {:.4} lr {:.3e} tokens {}",
            m.step,
            m.loss,
            m.pg_loss,
            m.kl_loss,
            m.entropy,
            m.clip_frac_low,
            m.clip_frac_high,
            m.clip_frac_dual,
            m.grad_norm,
            m.lr,
            m.tokens
        );
        Ok(())
    })?;
    let seconds = t0.elapsed().as_secs_f64();
    progress.finish();
    model.transformer = trained;
    let summary = Summary::of(&steps, seconds);
    let state = TrainerState {
        format: STATE_FORMAT.to_string(),
        global_step: opt.step,
        stage: s.stage.clone(),
        version: crate::VERSION.to_string(),
        config: s.config.clone(),
        inputs: s.inputs.clone(),
        summary: summary.clone(),
    };
    write_checkpoint(&model, &s.out, Some(&opt), &state, &lines)?;
    if let Some(m) = &summary.mean {
        crate::info!(
            "{}: {} steps, mean loss {:.5}, grad norm {:.4}, {:.1} tokens/s; wrote {}",
            s.stage,
            summary.steps,
            m.loss,
            m.grad_norm,
            summary.tokens_per_second,
            s.out.display()
        );
    }
    Ok(steps)
}
