//! Checkpoint folders written by `update` and `sft`, and resuming from them.
//!
//! Layout of `NEW_DIR`:
//! ```text
//! NEW_DIR/                      a complete Hugging Face folder (weights in the input's dtypes,
//!   config.json, model*.safetensors, tokenizer*, chat template, generation_config.json)
//!   train_metrics.jsonl         one JSON object per optimizer step, the whole run so far
//!   runs/STAGE/events.out.tfevents.rlcr-STAGE
//!                               the same steps as TensorBoard scalars (`crate::tensorboard`)
//!   rlcr-train/
//!     trainer_state.json        global step, stage, resolved config, switches, inputs, summary
//!     optimizer.safetensors     AdamW moments by parameter path (see `optim`)
//! ```
//! The optimizer state sits in a subfolder because vLLM loads every `*.safetensors` at the top of
//! a folder without an index; transformers and vLLM ignore the other extra files.
//!
//! The folder is written atomically (a temporary folder beside it, renamed at the end), so an
//! interrupted `update` leaves either the old folder or the complete new one. The metrics file
//! and the event file carry the input folder's steps forward (when the call resumes it), so the
//! newest checkpoint of an RL loop holds the curve of the whole run: `tensorboard --logdir
//! NEW_DIR/runs` shows it, like Hugging Face's `output_dir/runs`.
use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::model::Model;

use super::diagnostics::StepDiagnostics;
use super::optim::{AdamW, AdamWConfig, STATE_FILE};
use super::trainer::StepMetrics;

/// Subfolder holding the trainer state.
pub const STATE_DIR: &str = "rlcr-train";
/// The trainer state file inside [`STATE_DIR`].
pub const TRAINER_STATE: &str = "trainer_state.json";
/// Metrics file at the top of the folder.
pub const METRICS_FILE: &str = "train_metrics.jsonl";
/// Folder of the TensorBoard event files, one subfolder (run) per stage.
pub const RUNS_DIR: &str = "runs";
/// Format tag of [`TrainerState`].
pub const STATE_FORMAT: &str = "rlcr.trainer_state.v1";

/// The folder's training metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainerState {
    /// [`STATE_FORMAT`].
    pub format: String,
    /// Optimizer steps taken over the whole run (the schedule's step).
    pub global_step: u64,
    /// `update` or `sft`.
    pub stage: String,
    /// rlcr version that wrote it.
    pub version: String,
    /// The resolved configuration of the call that wrote it.
    pub config: serde_json::Value,
    /// The environment switches in force ([`crate::switches::Switches::recorded`]); null in
    /// folders written before they were recorded.
    #[serde(default)]
    pub switches: serde_json::Value,
    /// Input model folder and table(s).
    pub inputs: Vec<String>,
    /// Metrics of this call: the last step and means over its steps.
    pub summary: Summary,
}

/// Summary metrics of one `update`/`sft` call.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    /// Optimizer steps taken by this call (skipped ones excluded).
    pub steps: u64,
    /// Steps skipped (non-finite gradient norm, nothing learnable).
    pub skipped: u64,
    /// Mean over the call's steps of each metric.
    pub mean: Option<StepMetrics>,
    /// The last step's metrics.
    pub last: Option<StepMetrics>,
    /// Training wall time, seconds.
    pub seconds: f64,
    /// Learnable tokens per second of wall time (forward + backward + optimizer).
    pub tokens_per_second: f64,
}

impl Summary {
    /// Summarise a call's step metrics.
    pub fn of(steps: &[StepMetrics], seconds: f64) -> Self {
        let done: Vec<&StepMetrics> = steps.iter().filter(|m| !m.skipped).collect();
        let mean = if done.is_empty() {
            None
        } else {
            let n = done.len() as f64;
            let avg = |f: &dyn Fn(&StepMetrics) -> f64| done.iter().map(|m| f(m)).sum::<f64>() / n;
            // Counts average in whole numbers (rounded down).
            let avg_count = |f: &dyn Fn(&StepMetrics) -> usize| {
                done.iter().map(|m| f(m)).sum::<usize>() / done.len()
            };
            Some(StepMetrics {
                step: done.last().map(|m| m.step).unwrap_or(0),
                epoch: 0,
                mini_batch: 0,
                lr: avg(&|m| m.lr),
                loss: avg(&|m| m.loss),
                pg_loss: avg(&|m| m.pg_loss),
                kl_loss: avg(&|m| m.kl_loss),
                entropy: avg(&|m| m.entropy),
                confidence_entropy: avg(&|m| m.confidence_entropy),
                confidence_value_entropy: avg(&|m| m.confidence_value_entropy),
                approx_kl: avg(&|m| m.approx_kl),
                clip_frac_low: avg(&|m| m.clip_frac_low),
                clip_frac_high: avg(&|m| m.clip_frac_high),
                clip_frac_dual: avg(&|m| m.clip_frac_dual),
                grad_norm: avg(&|m| m.grad_norm),
                tokens: avg_count(&|m| m.tokens),
                rows: avg_count(&|m| m.rows),
                confidence_rows: avg_count(&|m| m.confidence_rows),
                inert_rows: avg_count(&|m| m.inert_rows),
                seconds: avg(&|m| m.seconds),
                skipped: false,
                // Lengths averaged; the KL and mismatch are measured once, on the first step.
                diag: StepDiagnostics {
                    response_length: avg_some(&done, &|m| m.diag.response_length),
                    confidence_length: avg_some(&done, &|m| m.diag.confidence_length),
                    ..steps.first().map(|m| m.diag.clone()).unwrap_or_default()
                },
            })
        };
        let tokens: usize = steps.iter().map(|m| m.tokens).sum();
        Summary {
            steps: done.len() as u64,
            skipped: (steps.len() - done.len()) as u64,
            mean,
            last: steps.last().cloned(),
            seconds,
            tokens_per_second: if seconds > 0.0 {
                tokens as f64 / seconds
            } else {
                0.0
            },
        }
    }
}

/// The mean of `f` over the steps where it has a value (`None` when none has).
fn avg_some(steps: &[&StepMetrics], f: &dyn Fn(&StepMetrics) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = steps.iter().filter_map(|m| f(m)).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// What `--resume` found in a model folder.
pub struct Resumed {
    /// The optimizer with its moments and step counter.
    pub opt: AdamW,
    /// The global step of the trainer state.
    pub global_step: u64,
    /// The stage that wrote it (`update` or `sft`).
    pub stage: String,
}

/// The part of [`TrainerState`] a resume needs (the rest may hold non-finite metrics).
#[derive(Deserialize)]
struct ResumeHeader {
    format: String,
    global_step: u64,
    stage: String,
}

/// The stage recorded in `dir`'s trainer state, if it has one.
pub fn saved_stage(dir: &Path) -> Option<String> {
    let text = fs::read_to_string(dir.join(STATE_DIR).join(TRAINER_STATE)).ok()?;
    serde_json::from_str::<ResumeHeader>(&text)
        .ok()
        .map(|h| h.stage)
}

/// Whether `dir` holds a trainer state to resume from.
pub fn has_state(dir: &Path) -> bool {
    dir.join(STATE_DIR).join(TRAINER_STATE).is_file()
}

/// Load the optimizer and trainer state saved in model folder `dir`. `cfg` is the new run's
/// AdamW configuration; moments go on `device` (the inner, non-autodiff device).
pub fn load_resume(dir: &Path, cfg: AdamWConfig, device: &burn::tensor::Device) -> Result<Resumed> {
    let sp = dir.join(STATE_DIR).join(TRAINER_STATE);
    let text = fs::read_to_string(&sp).with_context(|| {
        format!(
            "--resume: reading {} (the folder was not written by `rlcr update`/`rlcr sft`?)",
            sp.display()
        )
    })?;
    let state: ResumeHeader =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", sp.display()))?;
    if state.format != STATE_FORMAT {
        bail!("{}: unknown format {:?}", sp.display(), state.format);
    }
    let op = dir.join(STATE_DIR).join(STATE_FILE);
    let opt = AdamW::load(&op, cfg, device)?;
    if opt.step != state.global_step {
        bail!(
            "{}: optimizer step {} differs from the trainer state's global step {}",
            dir.display(),
            opt.step,
            state.global_step
        );
    }
    Ok(Resumed {
        opt,
        global_step: state.global_step,
        stage: state.stage,
    })
}

/// The metric lines of an earlier checkpoint (empty when it has none).
pub fn previous_metrics(dir: &Path) -> Result<Vec<String>> {
    let p = dir.join(METRICS_FILE);
    if !p.is_file() {
        return Ok(Vec::new());
    }
    let text = fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect())
}

/// The event file of `stage` inside checkpoint folder `dir`.
pub fn events_path(dir: &Path, stage: &str) -> std::path::PathBuf {
    dir.join(RUNS_DIR)
        .join(stage)
        .join(format!("events.out.tfevents.rlcr-{stage}"))
}

/// The events of a checkpoint's whole run: the input folder's events (`previous` = its metrics
/// lines, used when it has no event file or a damaged one; their wall time is now), then this
/// call's `records` (framed by [`crate::tensorboard::record`]).
pub fn carried_events(
    dir: Option<&Path>,
    stage: &str,
    previous: &[String],
    records: &[u8],
) -> Vec<u8> {
    use crate::tensorboard as tb;
    let now = tb::now();
    let mut out = tb::record(&tb::version_event(now));
    if let Some(dir) = dir {
        let old = fs::read(events_path(dir, stage)).ok();
        match old.as_deref().and_then(tb::records_after_version) {
            Some(rest) => out.extend_from_slice(rest),
            None => {
                for l in previous {
                    let v = serde_json::from_str(l).unwrap_or(serde_json::Value::Null);
                    if let Some((step, s)) = tb::step_scalars(&v) {
                        out.extend(tb::record(&tb::scalars_event(now, step as i64, &s)));
                    }
                }
            }
        }
    }
    out.extend_from_slice(records);
    out
}

/// One metrics line: the step metrics plus the stage.
pub fn metrics_line(stage: &str, m: &StepMetrics) -> Result<String> {
    serde_json::to_string(&metrics_value(stage, m)?).context("serialising metrics")
}

/// The JSON object of one metrics line.
pub fn metrics_value(stage: &str, m: &StepMetrics) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(m).context("serialising metrics")?;
    if let Some(o) = v.as_object_mut() {
        o.insert("stage".into(), serde_json::Value::String(stage.to_string()));
        // JSON has no infinities or NaN: write them as strings rather than null.
        for (_, x) in o.iter_mut() {
            if x.is_null() {
                *x = serde_json::Value::String("nan".into());
            }
        }
    }
    Ok(v)
}

/// Write the checkpoint folder `out` atomically: the model (HF layout, input dtypes, side files
/// copied), the optimizer state, the trainer state, the metrics lines and, when `events` is
/// not empty, the TensorBoard event file ([`events_path`]).
pub fn write_checkpoint(
    model: &Model,
    out: &Path,
    opt: Option<&AdamW>,
    state: &TrainerState,
    metrics: &[String],
    events: &[u8],
) -> Result<()> {
    crate::fs::write_folder(out, |tmp| {
        // The model's own atomic save into a scratch subfolder, then its files moved up.
        let scratch = tmp.join(".model");
        model.save(&scratch)?;
        for entry in
            fs::read_dir(&scratch).with_context(|| format!("listing {}", scratch.display()))?
        {
            let entry = entry?;
            let to = tmp.join(entry.file_name());
            fs::rename(entry.path(), &to)
                .with_context(|| format!("moving {} into place", to.display()))?;
        }
        fs::remove_dir(&scratch).with_context(|| format!("removing {}", scratch.display()))?;
        let sd = tmp.join(STATE_DIR);
        fs::create_dir(&sd).with_context(|| format!("creating {}", sd.display()))?;
        if let Some(opt) = opt {
            opt.save(&sd.join(STATE_FILE))?;
        }
        let json = serde_json::to_string_pretty(state).context("serialising the trainer state")?;
        fs::write(sd.join(TRAINER_STATE), json + "\n")
            .with_context(|| format!("writing {}", sd.join(TRAINER_STATE).display()))?;
        let mut text = metrics.join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        fs::write(tmp.join(METRICS_FILE), text)
            .with_context(|| format!("writing {}", tmp.join(METRICS_FILE).display()))?;
        if !events.is_empty() {
            let p = events_path(tmp, &state.stage);
            if let Some(d) = p.parent() {
                fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            }
            fs::write(&p, events).with_context(|| format!("writing {}", p.display()))?;
        }
        Ok(())
    })
    .with_context(|| format!("writing checkpoint {}", out.display()))
}
