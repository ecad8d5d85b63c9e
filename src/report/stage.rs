//! The `report` stage: reads the inputs of a validated [`Plan`], analyses them (see the module
//! above) and writes the report folder, every file replaced together ([`crate::fs::fill_folder`]).
//!
//! Streams each input once (plus a short second pass for the example texts of the last input), so
//! it handles tables larger than memory at ≈ 50 bytes per row.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{Analysis, Options};
use crate::table::{self, Meta};
use crate::usage::{usage, UsageError};

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
    /// The other inputs, the output folder and the settings, as the request gave them.
    pub settings: Settings,
}

/// The parts of a report that a [`Request`] passes to its [`Plan`] as given, once checked.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A probe table (`rlcr probe` output).
    pub probe: Option<PathBuf>,
    /// A `train_metrics.jsonl` or the folder that holds one.
    pub train_metrics: Option<PathBuf>,
    /// A TensorBoard run folder to write the `overall` figures into (not with labelled inputs).
    pub tensorboard: Option<PathBuf>,
    /// The output folder: a folder, neither a file nor an input's folder.
    pub out: PathBuf,
    /// Bins, ECE rule, missing-confidence rule.
    pub opts: Options,
    /// Example rows per kind in report.md (0: none, and no second pass).
    pub examples: usize,
    /// The settings recorded in calibration.parquet's metadata.
    pub config: serde_json::Value,
}

/// A report as asked for: the inputs as named (`[LABEL=]PATH`, `NAME=PATH`), checked into a
/// [`Plan`] by [`Request::plan`] (every error a usage error, before anything is read).
#[derive(Clone, Debug)]
pub struct Request {
    /// `PATH` per input (iterations, in order), or `LABEL=PATH` per input (arms).
    pub inputs: Vec<String>,
    /// The training iteration of each input, or empty (1, 2, …).
    pub iterations: Vec<u64>,
    /// `NAME=PATH`: a fixed probe set's scored table per input, in input order.
    pub held_in: Vec<String>,
    /// As [`Plan::settings`].
    pub settings: Settings,
}

impl Request {
    /// The checked plan: the labels, the inputs' existence, the output folder, the iteration
    /// numbers, the held-in sets, the TensorBoard folder and the training metrics file.
    pub fn plan(self) -> Result<Plan> {
        let (paths, labels) = inputs(&self.inputs)?;
        let s = &self.settings;
        for p in paths.iter().chain(s.probe.iter()) {
            if !p.exists() {
                return Err(usage(format!("{}: no such input", p.display())));
            }
        }
        if s.out.is_file() {
            return Err(usage(format!(
                "-o {}: is a file; report writes a folder of files",
                s.out.display()
            )));
        }
        // The folder must not be (or hold) an input: calibration.parquet would become a part file.
        let ins: Vec<&Path> = paths
            .iter()
            .chain(s.probe.iter())
            .map(|p| p.as_path())
            .collect();
        if crate::fs::folder_is_one_of(&s.out, &ins)? {
            return Err(usage(format!(
                "-o {}: is an input folder; write the report somewhere else",
                s.out.display()
            )));
        }
        let labelled = !labels.is_empty();
        let iterations = iteration_numbers(&self.iterations, paths.len(), labelled)?;
        let held_in = held_in_sets(&self.held_in, paths.len(), labelled)?;
        if s.tensorboard.is_some() && labelled {
            return Err(usage(
                "--tensorboard: labelled inputs are arms, not steps; report them one at a time",
            ));
        }
        if let Some(p) = &s.train_metrics {
            let f = super::training::metrics_path(p);
            if !f.is_file() {
                return Err(usage(format!(
                    "--train-metrics {}: no such file (give a train_metrics.jsonl or the model \
                     folder that holds one)",
                    f.display()
                )));
            }
        }
        Ok(Plan {
            inputs: paths,
            labels,
            iterations,
            held_in,
            settings: self.settings,
        })
    }
}

/// `--held-in NAME=PATH` values grouped by name (in order of first appearance), each name with
/// one path per input.
fn held_in_sets(
    given: &[String],
    n_inputs: usize,
    labelled: bool,
) -> Result<Vec<(String, Vec<PathBuf>)>> {
    if given.is_empty() {
        return Ok(vec![]);
    }
    if labelled {
        return Err(
            UsageError("--held-in: labelled inputs are arms, not iterations".to_string()).into(),
        );
    }
    let mut sets: Vec<(String, Vec<PathBuf>)> = Vec::new();
    for g in given {
        let Some((name, path)) = g.split_once('=').filter(|(n, p)| {
            !n.is_empty()
                && !p.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        }) else {
            return Err(UsageError(format!(
                "--held-in {g}: expected NAME=PATH (NAME of letters, digits, `-_.`)"
            ))
            .into());
        };
        match sets.iter_mut().find(|s| s.0 == name) {
            Some(s) => s.1.push(PathBuf::from(path)),
            None => sets.push((name.to_string(), vec![PathBuf::from(path)])),
        }
    }
    for (name, paths) in &sets {
        if paths.len() != n_inputs {
            return Err(UsageError(format!(
                "--held-in: {} tables for set {name:?} and {n_inputs} inputs (one per input, in input order)",
                paths.len()
            ))
            .into());
        }
        if let Some(p) = paths.iter().find(|p| !p.exists()) {
            return Err(
                UsageError(format!("--held-in {name}={}: no such input", p.display())).into(),
            );
        }
    }
    Ok(sets)
}

/// `LABEL=PATH` → (Some(LABEL), PATH) when LABEL is a plain word (letters, digits, `-_.`) and the
/// whole text is not an existing path; otherwise (None, the text).
pub fn split_label(s: &str) -> (Option<String>, PathBuf) {
    match s.split_once('=') {
        Some((l, p))
            if !l.is_empty()
                && !p.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && !Path::new(s).exists() =>
        {
            (Some(l.to_string()), PathBuf::from(p))
        }
        _ => (None, PathBuf::from(s)),
    }
}

/// The inputs' paths and labels (empty when none is labelled); usage error when only some are
/// labelled, or when labels repeat (an arm's runs) but not every arm is given as many times.
fn inputs(given: &[String]) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let parsed: Vec<(Option<String>, PathBuf)> = given.iter().map(|s| split_label(s)).collect();
    let n_labelled = parsed.iter().filter(|p| p.0.is_some()).count();
    if n_labelled == 0 {
        return Ok((parsed.into_iter().map(|p| p.1).collect(), vec![]));
    }
    if n_labelled != parsed.len() {
        return Err(
            UsageError("--input: label every input (LABEL=PATH) or none".to_string()).into(),
        );
    }
    let (labels, paths): (Vec<String>, Vec<PathBuf>) = parsed
        .into_iter()
        .map(|(l, p)| (l.unwrap_or_default(), p))
        .unzip();
    // Arms in order of first appearance, with their counts.
    let counts: Vec<(&str, usize)> = super::compare::arms(&labels)
        .into_iter()
        .map(|a| (a, labels.iter().filter(|l| l.as_str() == a).count()))
        .collect();
    if counts.iter().any(|c| c.1 != counts[0].1) {
        let said: Vec<String> = counts.iter().map(|(l, n)| format!("{l:?} × {n}")).collect();
        return Err(UsageError(format!(
            "--input: give every arm once per run (an arm's runs are its inputs, in order); \
             labels given: {}",
            said.join(", ")
        ))
        .into());
    }
    Ok((paths, labels))
}

/// The iteration number of each of `n` inputs: `given` (one per input, increasing) or 1, 2, ….
fn iteration_numbers(given: &[u64], n: usize, labelled: bool) -> Result<Vec<u64>> {
    if given.is_empty() {
        return Ok((1..=n as u64).collect());
    }
    if labelled {
        return Err(UsageError(
            "--iterations: labelled inputs are arms, not iterations".to_string(),
        )
        .into());
    }
    if given.len() != n {
        return Err(UsageError(format!(
            "--iterations: {} numbers for {n} inputs (one per input, in input order)",
            given.len()
        ))
        .into());
    }
    if let Some(w) = given.windows(2).find(|w| w[1] <= w[0]) {
        return Err(UsageError(format!(
            "--iterations: {} after {}; the inputs' iterations must increase",
            w[1], w[0]
        ))
        .into());
    }
    Ok(given.to_vec())
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
        .settings
        .train_metrics
        .as_deref()
        .map(super::training::read)
        .transpose()?;
    let opts = &plan.settings.opts;
    let mut analyses = Vec::with_capacity(plan.inputs.len());
    let mut examples = None;
    for (i, path) in plan.inputs.iter().enumerate() {
        // Examples (and their second pass) only for the last input, which report.md details.
        let k = if i + 1 == plan.inputs.len() {
            plan.settings.examples
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
    let probe = match &plan.settings.probe {
        Some(p) => {
            let rows = super::read_probe(p)?;
            let s = super::probe::summarize(&rows, opts.bins, opts.ece_rule);
            Some((rows, s))
        }
        None => None,
    };
    let written = crate::fs::fill_folder(&plan.settings.out, |staging| {
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
    if let Some(dir) = &plan.settings.tensorboard {
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
        config: plan.settings.config.clone(),
        inputs: plan
            .inputs
            .iter()
            .chain(plan.settings.probe.iter())
            .cloned()
            .collect(),
        extra: Default::default(),
    };
    let out = dir.join("calibration.parquet");
    table::write_table(&out, batch.schema(), &[batch], &meta)?;
    Ok("calibration.parquet".to_string())
}
