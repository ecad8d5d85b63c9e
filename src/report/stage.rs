//! The `report` stage: reads the inputs of a validated [`Plan`], analyses them (see the module
//! above) and writes the report folder, every file replaced together ([`crate::fs::fill_folder`]).
//!
//! Streams each input once (plus a short second pass for the example texts of the last input), so
//! it handles tables larger than memory at ≈ 50 bytes per row.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{Analysis, Options};
use crate::table::{self, Meta};

/// What to report, checked by the caller: the inputs exist, `out` is not a file nor an input,
/// `iterations` has one increasing number per input, every `held_in` set one path per input.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The scored tables, in order (iterations, or arms when labelled).
    pub inputs: Vec<PathBuf>,
    /// One label per input (arms to compare), or empty.
    pub labels: Vec<String>,
    /// The training iteration of each input.
    pub iterations: Vec<u64>,
    /// Fixed probe sets: a name and one scored table per input.
    pub held_in: Vec<(String, Vec<PathBuf>)>,
    /// A probe table (`rlcr probe` output).
    pub probe: Option<PathBuf>,
    /// A `train_metrics.jsonl` or the folder that holds one.
    pub train_metrics: Option<PathBuf>,
    /// A TensorBoard run folder to write the `overall` figures into.
    pub tensorboard: Option<PathBuf>,
    /// The output folder.
    pub out: PathBuf,
    /// Bins, ECE rule, missing-confidence rule.
    pub opts: Options,
    /// Example rows per kind in report.md (0: none, and no second pass).
    pub examples: usize,
    /// The settings recorded in calibration.parquet's metadata.
    pub config: serde_json::Value,
}

/// What [`run`] wrote.
#[derive(Clone, Debug)]
pub struct Summary {
    /// Files written into the output folder.
    pub files: usize,
    /// The last input's accuracy, ECE, Brier and AUROC, as one line.
    pub headline: String,
}

/// Analyse the plan's inputs and write the report folder (and the TensorBoard events).
pub fn run(plan: &Plan) -> Result<Summary> {
    let training = plan
        .train_metrics
        .as_deref()
        .map(super::training::read)
        .transpose()?;
    let opts = &plan.opts;
    let mut analyses = Vec::with_capacity(plan.inputs.len());
    let mut examples = None;
    for (i, path) in plan.inputs.iter().enumerate() {
        // Examples (and their second pass) only for the last input, which report.md details.
        let k = if i + 1 == plan.inputs.len() {
            plan.examples
        } else {
            0
        };
        let (mut an, ex) = super::analyse_file(path, opts, k)?;
        an.report.iteration = plan.iterations[i];
        for (name, sets) in &plan.held_in {
            let (h, _) = super::analyse_file(&sets[i], opts, 0)?;
            an.report
                .held_in
                .insert(name.clone(), super::HeldIn::of(&h.report));
        }
        analyses.push(an);
        examples = ex;
    }
    let probe = match &plan.probe {
        Some(p) => {
            let rows = super::read_probe(p)?;
            let s = super::probe::summarize(&rows, opts.bins, opts.ece_rule);
            Some((rows, s))
        }
        None => None,
    };
    let written = crate::fs::fill_folder(&plan.out, |staging| {
        let probe_ref = probe.as_ref().map(|(r, s)| (r, s));
        let mut w = super::write_outputs(
            staging,
            &analyses,
            &plan.labels,
            examples.as_ref(),
            probe_ref,
            training.as_ref(),
        )?;
        w.push(write_calibration(plan, &analyses, staging)?);
        Ok(w)
    })?;
    if let Some(dir) = &plan.tensorboard {
        write_tensorboard(dir, &analyses)?;
    }
    Ok(Summary {
        files: written.len(),
        headline: headline(&analyses),
    })
}

fn headline(analyses: &[Analysis]) -> String {
    let Some(m) = analyses.last().map(|a| &a.report.overall) else {
        return String::new();
    };
    let f = |v: Option<f64>| super::plot::fmt_opt(v, 4);
    format!(
        "accuracy {}, ECE {}, Brier {}, AUROC {}",
        f(m.accuracy),
        f(m.ece),
        f(m.brier),
        f(m.auroc)
    )
}

/// The inputs' `overall` figures as one TensorBoard event per input, at its iteration; the file
/// is named by the first one, so a report of the same iteration replaces its own file.
fn write_tensorboard(dir: &Path, analyses: &[Analysis]) -> Result<()> {
    use crate::tensorboard as tb;
    let now = tb::now();
    let mut events = Vec::with_capacity(analyses.len());
    for an in analyses {
        let v = serde_json::to_value(&an.report.overall).context("serialising the metrics")?;
        let mut scalars = tb::numeric_leaves(&v, &["se"]);
        for (name, h) in &an.report.held_in {
            if let Some(acc) = h.accuracy {
                scalars.push((format!("held_in/{name}/accuracy"), acc as f32));
            }
        }
        events.push((now, an.report.iteration as i64, scalars));
    }
    let first = analyses.first().map_or(1, |a| a.report.iteration);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(tb::file_name(first, "report"));
    crate::fs::write_atomic(&path, &tb::encode_file(now, &events))
}

/// `calibration.parquet` (one row per input and bin) with the standard table metadata.
fn write_calibration(plan: &Plan, analyses: &[Analysis], dir: &Path) -> Result<String> {
    let reports: Vec<super::Report> = analyses.iter().map(|x| x.report.clone()).collect();
    let batch = super::calibration_batch(&reports)?;
    let meta = Meta {
        schema_name: "rlcr.calibration".to_string(),
        schema_version: 1,
        stage: "report".to_string(),
        config: plan.config.clone(),
        inputs: plan
            .inputs
            .iter()
            .chain(plan.probe.iter())
            .cloned()
            .collect(),
        extra: Default::default(),
    };
    let out = dir.join("calibration.parquet");
    table::write_table(&out, batch.schema(), &[batch], &meta)?;
    Ok("calibration.parquet".to_string())
}
