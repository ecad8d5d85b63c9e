//! Training curves: the per-step metrics that `update` and `sft` write (`train_metrics.jsonl`),
//! read back and drawn against the global optimizer step beside the calibration figures.
//!
//! The file of the newest checkpoint of a loop holds the steps of every iteration (each call
//! carries its input folder's lines forward), so one file gives the curve of the whole run.
//! Skipped steps (non-finite gradient norm, nothing learnable) are left out: they describe no
//! update. `"nan"` (JSON's stand-in for a non-finite value) reads as a gap in the line.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::plot;

/// The metrics file inside a checkpoint folder.
pub const METRICS_FILE: &str = "train_metrics.jsonl";

/// The per-step metrics of a training run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainingCurves {
    /// The file read.
    pub source: String,
    /// Stages named by the lines (`update`, `sft`), in order of appearance.
    pub stages: Vec<String>,
    /// Global optimizer step of each kept line.
    pub steps: Vec<u64>,
    /// Each numeric key's value per kept line (`None`: absent or non-finite).
    pub series: BTreeMap<String, Vec<Option<f64>>>,
    /// Lines left out as skipped steps.
    pub skipped: usize,
}

impl TrainingCurves {
    /// The values of `key` (all `None` when the file never has it).
    pub fn values(&self, key: &str) -> Vec<Option<f64>> {
        self.series
            .get(key)
            .cloned()
            .unwrap_or_else(|| vec![None; self.steps.len()])
    }
}

/// `path` itself when it is a file, else `path/train_metrics.jsonl` (a checkpoint folder).
pub fn metrics_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(METRICS_FILE)
    } else {
        path.to_path_buf()
    }
}

/// Read a `train_metrics.jsonl` (or the one of a checkpoint folder). Errors name the file and
/// the line.
pub fn read(path: &Path) -> Result<TrainingCurves> {
    let file = metrics_path(path);
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("{}: cannot read the training metrics", file.display()))?;
    parse(&text, &file.display().to_string())
}

/// Parse the lines of a metrics file (`source` names it in errors).
pub fn parse(text: &str, source: &str) -> Result<TrainingCurves> {
    let mut c = TrainingCurves {
        source: source.to_string(),
        ..Default::default()
    };
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{source}, line {}: not a JSON object", i + 1))?;
        let Some(o) = v.as_object() else {
            bail!("{source}, line {}: not a JSON object", i + 1);
        };
        let Some(step) = o.get("step").and_then(Value::as_u64) else {
            bail!(
                "{source}, line {}: no `step` (a non-negative integer)",
                i + 1
            );
        };
        if let Some(s) = o.get("stage").and_then(Value::as_str) {
            if !c.stages.iter().any(|x| x == s) {
                c.stages.push(s.to_string());
            }
        }
        if o.get("skipped").and_then(Value::as_bool) == Some(true) {
            c.skipped += 1;
            continue;
        }
        let n = c.steps.len();
        for (k, x) in o {
            let val = match x {
                Value::Number(num) => num.as_f64(),
                Value::String(s) if s == "nan" => None,
                _ => continue,
            };
            if k == "step" {
                continue;
            }
            let col = c.series.entry(k.clone()).or_insert_with(|| vec![None; n]);
            col.push(val.filter(|v| v.is_finite()));
        }
        c.steps.push(step);
        for col in c.series.values_mut() {
            col.resize(n + 1, None);
        }
    }
    if c.steps.is_empty() {
        bail!("{source}: no training steps (every line skipped, or the file is empty)");
    }
    Ok(c)
}

/// The training-curves figure: loss, KL, clip fractions, entropy, gradient norm and learning rate
/// against the global step.
pub fn figure(c: &TrainingCurves) -> plot::StepCharts {
    let s = |name: &str, key: &str| plot::Series {
        name: name.to_string(),
        values: c.values(key),
    };
    let panel = |title: &str, y: &str, y_range: Option<(f64, f64)>, series| plot::LinePanel {
        title: title.to_string(),
        y_label: y.to_string(),
        y_range,
        series,
    };
    let stage = if c.stages.is_empty() {
        String::new()
    } else {
        format!(" ({})", c.stages.join(", "))
    };
    plot::StepCharts {
        title: format!("Training curves{stage}"),
        x_label: "global optimizer step".to_string(),
        steps: c.steps.iter().map(|&s| s as f64).collect(),
        grid: (2, 3),
        panels: vec![
            panel(
                "Loss",
                "loss",
                None,
                vec![s("loss", "loss"), s("policy-gradient loss", "pg_loss")],
            ),
            panel(
                "KL",
                "nats",
                None,
                vec![
                    s("approx. KL to the behaviour policy", "approx_kl"),
                    s("KL loss (reference)", "kl_loss"),
                ],
            ),
            panel(
                "Clip fractions",
                "fraction of tokens",
                None,
                vec![
                    s("low", "clip_frac_low"),
                    s("high", "clip_frac_high"),
                    s("dual", "clip_frac_dual"),
                ],
            ),
            panel(
                "Entropy",
                "nats per token",
                None,
                vec![
                    s("all learnable tokens", "entropy"),
                    s("confidence rows", "confidence_entropy"),
                ],
            ),
            panel(
                "Gradient norm",
                "norm before clipping",
                None,
                vec![s("grad norm", "grad_norm")],
            ),
            panel("Learning rate", "lr", None, vec![s("lr", "lr")]),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: &str = r#"{"step":1,"loss":0.5,"pg_loss":0.5,"grad_norm":2.0,"lr":0.001,"skipped":false,"stage":"update"}
{"step":1,"loss":"nan","grad_norm":"nan","lr":0.001,"skipped":true,"stage":"update"}

{"step":2,"loss":0.25,"pg_loss":0.2,"grad_norm":"nan","lr":0.001,"skipped":false,"stage":"update","entropy":1.5}
"#;

    #[test]
    fn parses_steps_skipped_and_gaps() {
        let c = parse(LINES, "m.jsonl").unwrap();
        assert_eq!(c.steps, vec![1, 2]);
        assert_eq!(c.skipped, 1);
        assert_eq!(c.stages, vec!["update"]);
        assert_eq!(c.values("loss"), vec![Some(0.5), Some(0.25)]);
        assert_eq!(c.values("grad_norm"), vec![Some(2.0), None]);
        // A key first seen on a later line is None before it.
        assert_eq!(c.values("entropy"), vec![None, Some(1.5)]);
        assert_eq!(c.values("absent"), vec![None, None]);
        let f = figure(&c);
        assert_eq!(f.steps, vec![1.0, 2.0]);
        assert!(f
            .panels
            .iter()
            .all(|p| p.series.iter().all(|s| s.values.len() == 2)));
    }

    #[test]
    fn errors_name_file_and_line() {
        let e = parse("{\"step\":1}\nnot json\n", "m.jsonl").unwrap_err();
        assert!(format!("{e:#}").contains("m.jsonl, line 2"), "{e:#}");
        let e = parse("{\"loss\":1}\n", "m.jsonl").unwrap_err();
        assert!(format!("{e:#}").contains("line 1: no `step`"), "{e:#}");
        let e = parse("", "m.jsonl").unwrap_err();
        assert!(format!("{e:#}").contains("no training steps"), "{e:#}");
    }
}
