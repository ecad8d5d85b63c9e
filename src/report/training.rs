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

use super::{metrics, plot};

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
    /// The call (0-based `update`/`sft` run) of each kept line: a call starts at a line of
    /// epoch 0, update batch 0 (a loop's file holds one call per iteration).
    pub calls: Vec<usize>,
}

/// What one `update` call reported about itself: the figures measured once per call (on its
/// first step) and the means of the per-step ones.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct CallDiagnostics {
    /// 1-based call number (the loop's iteration when the file holds the whole loop).
    pub call: usize,
    /// Global step of the call's first kept line.
    pub first_step: u64,
    /// Kept lines (optimizer steps) of the call.
    pub steps: usize,
    /// KL of the behaviour policy to the reference (k3), when measured.
    pub ref_kl: Option<f64>,
    /// Rollout/trainer mismatch before the first step: max and mean |Δ log-prob|.
    pub mismatch_logp_max: Option<f64>,
    pub mismatch_logp_mean: Option<f64>,
    /// max and mean |exp(Δ) − 1|.
    pub mismatch_ratio_max: Option<f64>,
    pub mismatch_ratio_mean: Option<f64>,
    /// The first update batch's gradient split by turn (`update --turn-grad-norms`): the answer
    /// rows' and the confidence rows' norms and the cosine between the two.
    pub grad_answer_norm: Option<f64>,
    pub grad_confidence_norm: Option<f64>,
    pub grad_turn_cosine: Option<f64>,
    /// Mean response length of answer and confidence rows over the call's steps.
    pub response_length: Option<f64>,
    pub confidence_length: Option<f64>,
    /// Mean approximate KL to the behaviour policy over the call's steps.
    pub approx_kl: Option<f64>,
}

/// The diagnostics of each call of a training file, in order.
pub fn per_call(c: &TrainingCurves) -> Vec<CallDiagnostics> {
    let n = c.calls.iter().max().map_or(0, |m| m + 1);
    let mut out = Vec::new();
    for k in 0..n {
        let idx: Vec<usize> = (0..c.steps.len()).filter(|&i| c.calls[i] == k).collect();
        let Some(&first) = idx.first() else { continue };
        let col = |key: &str| c.series.get(key);
        let first_of =
            |key: &str| -> Option<f64> { col(key).and_then(|v| idx.iter().find_map(|&i| v[i])) };
        let mean_of = |key: &str| -> Option<f64> {
            let v = col(key)?;
            let xs: Vec<f64> = idx.iter().filter_map(|&i| v[i]).collect();
            metrics::mean(&xs)
        };
        out.push(CallDiagnostics {
            call: k + 1,
            first_step: c.steps[first],
            steps: idx.len(),
            ref_kl: first_of("ref_kl"),
            mismatch_logp_max: first_of("mismatch/logp_max"),
            mismatch_logp_mean: first_of("mismatch/logp_mean"),
            mismatch_ratio_max: first_of("mismatch/ratio_max"),
            mismatch_ratio_mean: first_of("mismatch/ratio_mean"),
            grad_answer_norm: first_of("grad/answer_norm"),
            grad_confidence_norm: first_of("grad/confidence_norm"),
            grad_turn_cosine: first_of("grad/turn_cosine"),
            response_length: mean_of("response_length"),
            confidence_length: mean_of("confidence_length"),
            approx_kl: mean_of("approx_kl"),
        });
    }
    out
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
    let mut call: Option<usize> = None;
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
        let starts_call = o.get("epoch").and_then(Value::as_u64) == Some(0)
            && o.get("mini_batch").and_then(Value::as_u64) == Some(0);
        if starts_call || call.is_none() {
            call = Some(call.map_or(0, |k| k + 1));
        }
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
        c.calls.push(call.unwrap_or(0));
        for col in c.series.values_mut() {
            col.resize(n + 1, None);
        }
    }
    if c.steps.is_empty() {
        bail!("{source}: no training steps (every line skipped, or the file is empty)");
    }
    Ok(c)
}

/// The training-curves figure: loss, KL (to the behaviour policy, the KL loss, and the behaviour
/// policy's KL to the reference once per call), clip fractions, entropy, gradient norm, learning
/// rate, the rollout/trainer mismatch (once per call) and the response lengths against the global
/// step.
pub fn figure(c: &TrainingCurves) -> plot::LineCharts {
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
    // The turns' parts of the first batch's gradient only when measured (`--turn-grad-norms`).
    let mut grad_series = vec![s("grad norm", "grad_norm")];
    if c.series.contains_key("grad/answer_norm") {
        grad_series.push(s("answers' part (first batch)", "grad/answer_norm"));
        grad_series.push(s("confidences' part (first batch)", "grad/confidence_norm"));
    }
    let stage = if c.stages.is_empty() {
        String::new()
    } else {
        format!(" ({})", c.stages.join(", "))
    };
    plot::LineCharts {
        title: format!("Training curves{stage}"),
        x_label: "global optimizer step".to_string(),
        axis: plot::XAxis::Steps,
        xs: c.steps.iter().map(|&s| s as f64).collect(),
        grid: (3, 3),
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
                    s("behaviour policy to reference (k3)", "ref_kl"),
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
            panel("Gradient norm", "norm before clipping", None, grad_series),
            panel("Learning rate", "lr", None, vec![s("lr", "lr")]),
            panel(
                "Rollout/trainer mismatch (before the first step)",
                "|difference|",
                None,
                vec![
                    s("max |Δ log-prob|", "mismatch/logp_max"),
                    s("mean |Δ log-prob|", "mismatch/logp_mean"),
                    s("max |ratio − 1|", "mismatch/ratio_max"),
                ],
            ),
            panel(
                "Response length",
                "tokens",
                None,
                vec![
                    s("answers", "response_length"),
                    s("confidences", "confidence_length"),
                ],
            ),
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
        assert_eq!(f.xs, vec![1.0, 2.0]);
        assert!(f
            .panels
            .iter()
            .all(|p| p.series.iter().all(|s| s.values.len() == 2)));
    }

    /// Two calls (epoch 0 / update batch 0 starts each): the first-step figures and the means
    /// of each call, by hand.
    #[test]
    fn diagnostics_per_call() {
        let text = r#"{"step":1,"epoch":0,"mini_batch":0,"approx_kl":0.0,"response_length":10.0,"ref_kl":0.0,"mismatch/logp_max":2e-6,"mismatch/logp_mean":1e-7,"mismatch/ratio_max":2e-6,"mismatch/ratio_mean":1e-7,"skipped":false}
{"step":2,"epoch":0,"mini_batch":1,"approx_kl":0.02,"response_length":14.0,"skipped":false}
{"step":3,"epoch":0,"mini_batch":0,"approx_kl":0.01,"response_length":20.0,"confidence_length":6.0,"ref_kl":0.004,"mismatch/logp_max":3e-6,"mismatch/logp_mean":2e-7,"mismatch/ratio_max":3e-6,"mismatch/ratio_mean":2e-7,"grad/answer_norm":0.3,"grad/confidence_norm":0.05,"grad/turn_cosine":-0.2,"skipped":false}
{"step":3,"epoch":0,"mini_batch":1,"skipped":true}
{"step":4,"epoch":1,"mini_batch":0,"approx_kl":0.03,"response_length":22.0,"confidence_length":8.0,"skipped":false}
"#;
        let c = parse(text, "m.jsonl").unwrap();
        assert_eq!(c.calls, vec![0, 0, 1, 1]);
        let d = per_call(&c);
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].call, d[0].first_step, d[0].steps), (1, 1, 2));
        assert_eq!(d[0].ref_kl, Some(0.0));
        assert_eq!(d[0].mismatch_logp_max, Some(2e-6));
        assert_eq!(d[0].response_length, Some(12.0));
        assert_eq!(d[0].confidence_length, None);
        assert_eq!(d[0].approx_kl, Some(0.01));
        assert_eq!((d[1].call, d[1].first_step, d[1].steps), (2, 3, 2));
        assert_eq!(d[1].ref_kl, Some(0.004));
        assert_eq!(d[1].mismatch_ratio_mean, Some(2e-7));
        assert_eq!(
            (
                d[0].grad_answer_norm,
                d[0].grad_confidence_norm,
                d[0].grad_turn_cosine
            ),
            (None, None, None)
        );
        assert_eq!(
            (
                d[1].grad_answer_norm,
                d[1].grad_confidence_norm,
                d[1].grad_turn_cosine
            ),
            (Some(0.3), Some(0.05), Some(-0.2))
        );
        // The gradient panel draws the turns' parts only where they were measured.
        let grad_panel = |c: &TrainingCurves| {
            let f = figure(c);
            let p = f
                .panels
                .iter()
                .find(|p| p.title == "Gradient norm")
                .cloned();
            p.map(|p| p.series.len())
        };
        assert_eq!(grad_panel(&c), Some(3));
        assert_eq!(grad_panel(&parse(LINES, "m.jsonl").unwrap()), Some(1));
        assert_eq!(d[1].response_length, Some(21.0));
        assert_eq!(d[1].confidence_length, Some(7.0));
        assert!((d[1].approx_kl.unwrap() - 0.02).abs() < 1e-15);
        // Lines without epoch / update batch (older files): one call.
        let c = parse(LINES, "m.jsonl").unwrap();
        assert_eq!(c.calls, vec![0, 0]);
        assert_eq!(per_call(&c).len(), 1);
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
