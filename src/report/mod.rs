//! Calibration reports: metrics, the per-turn training-signal statistics, reliability diagrams,
//! histograms, iteration curves and the probe curves, written as `metrics.json`, figures (SVG and
//! PNG), `calibration.parquet` and `report.md`.
//!
//! Layers, each usable alone:
//! - [`metrics`]: pure functions over slices (accuracy, Brier, ECE with two bin rules, AUROC,
//!   standard errors, histograms), with formulas and worked examples in their doc comments.
//! - [`data`]: the compact per-row view of a trajectory table, streamed from record batches.
//! - [`summary`]: everything computed from that view ([`summary::Report`]), plus example picking.
//! - [`probe`]: reading and summarising a probe table (the faithfulness probe).
//! - [`plot`]: figures drawn with plotters and an embedded font (no system libraries).
//! - [`markdown`]: the `report.md` page.
//! - [`training`]: the training curves of `update`/`sft` (`train_metrics.jsonl`).
//! - [`stage`]: the `report` stage: a validated plan in, the report folder written.
//!
//! This module glues them: [`Analysis`] is one input's report with its figure inputs and example
//! texts; [`write_outputs`] writes every file but `calibration.parquet` (whose rows
//! [`calibration_batch`] builds; the CLI writes it with the table layer so it gets the standard
//! metadata). With several inputs (iterations), the detailed figures describe the last input and
//! `iterations.svg/png` plus a table in `report.md` follow the metrics across inputs; with a
//! training run's metrics ([`training`]), `training.svg/png` draws its loss, KL, clip fractions,
//! entropy, gradient norm and learning rate against the global step.

pub mod compare;
pub mod data;
pub mod markdown;
pub mod metrics;
pub mod plot;
pub mod probe;
pub mod stage;
pub mod summary;
pub mod training;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use serde::Serialize;

pub use data::{MissingConfidence, RowText, Rows, SampleType};
pub use markdown::{ExampleRow, ExampleSet, FigureFiles};
pub use metrics::{Bin, BinRule};
pub use probe::{ProbeRows, ProbeSummary};
pub use summary::{
    Examples, HeldIn, Metrics, Options, Report, StandardErrors, TurnSamples, TurnStats,
};

/// Examples of each kind shown in `report.md` by default.
pub const EXAMPLES_PER_KIND: usize = 3;

/// One input, analysed.
#[derive(Clone, Debug)]
pub struct Analysis {
    /// Metrics and tables.
    pub report: Report,
    /// Histogram inputs `(answers, confidences)`.
    pub samples: (TurnSamples, TurnSamples),
    /// Example rows chosen.
    pub examples: Examples,
}

impl Analysis {
    /// Analyse one table's rows, picking up to `examples` example rows of each kind.
    pub fn new(input: &str, rows: &Rows, opts: &Options, examples: usize) -> Analysis {
        Analysis {
            report: summary::build(input, rows, opts),
            samples: summary::turn_samples(rows),
            examples: summary::select_examples(rows, examples),
        }
    }
}

/// Columns read in the second pass, for the example texts.
pub const TEXT_COLUMNS: &[&str] = &["sample_id", "response_text", "answer", "ground_truth"];

/// Analyse one table on disk: one streaming pass over the columns the report reads (see
/// [`data::COLUMNS`]), then, when `examples > 0`, a second pass that fetches the texts of the
/// chosen example rows only (up to `examples` per kind). Memory: ≈ 50 bytes per row plus the
/// example texts.
pub fn analyse_file(
    path: &Path,
    opts: &Options,
    examples: usize,
) -> Result<(Analysis, Option<ExampleSet>)> {
    // The columns the validator's rules read too (identities, token lists, spans); the figures
    // do not need them.
    let mut columns = data::COLUMNS.to_vec();
    columns.extend(
        crate::table::validate::RULE_COLUMNS
            .iter()
            .filter(|c| !data::COLUMNS.contains(c)),
    );
    let reader = crate::table::Reader::open_columns(path, &columns)?;
    let display = reader.display.clone();
    let mut validator = crate::table::Validator::new(&display, &crate::table::TRAJECTORY);
    validator.reserve(reader.num_rows());
    let mut progress = crate::progress::Progress::new(
        &format!("report {display}"),
        reader.num_rows() as u64,
        "rows",
    );
    let mut rows = Rows::default();
    for batch in reader {
        let batch = batch?;
        validator.check_batch(&batch)?;
        rows.push_batch(&batch).with_context(|| display.clone())?;
        progress.inc(batch.num_rows() as u64);
    }
    validator.finish()?;
    progress.finish();
    let analysis = Analysis::new(&display, &rows, opts, examples);
    if examples == 0 {
        return Ok((analysis, None));
    }
    let wanted = analysis.examples.wanted_rows(&rows);
    let mut texts = HashMap::new();
    if !wanted.is_empty() {
        let reader = crate::table::Reader::open_columns(path, TEXT_COLUMNS)?;
        let mut base = 0usize;
        for batch in reader {
            let batch = batch?;
            data::collect_texts(&batch, base, &wanted, &mut texts)
                .with_context(|| display.clone())?;
            base += batch.num_rows();
            if wanted.range(base..).next().is_none() {
                break;
            }
        }
    }
    let ex = resolve_examples(&rows, &analysis.examples, &texts);
    Ok((analysis, Some(ex)))
}

/// Read a probe table (validated: `0 ≤ num_correct ≤ num_samples`, stored confidence = counts).
pub fn read_probe(path: &Path) -> Result<ProbeRows> {
    let reader = crate::table::Reader::open(path)?;
    let display = reader.display.clone();
    let mut p = ProbeRows::default();
    for batch in reader {
        p.push_batch(&batch?).with_context(|| display.clone())?;
    }
    Ok(p)
}

/// Turn chosen example rows and their fetched texts into printable examples.
pub fn resolve_examples(rows: &Rows, ex: &Examples, texts: &HashMap<usize, RowText>) -> ExampleSet {
    let answers = rows.answer_rows();
    let one = |i: usize| -> ExampleRow {
        let t = texts.get(&i).cloned().unwrap_or_default();
        let answer_text = (rows.kind[i] == SampleType::Confidence)
            .then(|| summary::answer_row_of(rows, &answers, i))
            .flatten()
            .and_then(|a| texts.get(&a))
            .map(|a| {
                a.answer
                    .clone()
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| a.response_text.clone())
            });
        ExampleRow {
            sample_id: t.sample_id,
            sample_type: rows.kind[i].as_str().to_string(),
            confidence: rows.confidence[i],
            acc: rows.acc[i],
            response_text: t.response_text,
            answer_text,
            ground_truth: t.ground_truth,
        }
    };
    let many = |v: &[usize]| v.iter().map(|&i| one(i)).collect();
    ExampleSet {
        most_confident_wrong: many(&ex.most_confident_wrong),
        least_confident_right: many(&ex.least_confident_right),
        unparseable: many(&ex.unparseable),
        malformed_answers: many(&ex.malformed_answers),
    }
}

/// The reliability diagram of a report.
pub fn reliability_figure(r: &Report) -> plot::Reliability {
    let m = &r.overall;
    let note = format!(
        "Brier {} · AUROC {}",
        plot::fmt_opt(m.brier, 4),
        plot::fmt_opt(m.auroc, 4)
    );
    plot::Reliability::new(
        r.reliability.clone(),
        r.options.ece_rule,
        "Reliability diagram · ",
        &note,
    )
}

/// The two turns' histograms: rewards (top) and lengths (bottom), answers left, confidences right.
pub fn histogram_figure(samples: &(TurnSamples, TurnSamples)) -> plot::Histograms {
    let (a, c) = samples;
    let panel = |title: &str, x: &str, v: &[f64], integer: bool, color: usize| plot::HistPanel {
        title: title.to_string(),
        x_label: x.to_string(),
        values: v.to_vec(),
        integer,
        color,
    };
    let lens = |t: &TurnSamples| t.lengths.iter().map(|&l| l as f64).collect::<Vec<f64>>();
    plot::Histograms {
        title: "Rewards and response lengths: answers (turn 1) vs confidences (turn 2)".to_string(),
        grid: (2, 2),
        panels: vec![
            panel("Answer reward", "reward", &a.rewards, false, 0),
            panel("Confidence reward", "reward", &c.rewards, false, 1),
            panel("Answer length", "tokens", &lens(a), true, 0),
            panel("Confidence length", "tokens", &lens(c), true, 1),
        ],
    }
}

/// The names of the held-in probe sets of `reports`, in name order.
pub fn held_in_names(reports: &[Report]) -> Vec<String> {
    let mut names: Vec<String> = reports
        .iter()
        .flat_map(|r| r.held_in.keys().cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Metrics against iteration, four panels; the held-in probe sets' accuracies beside the
/// sampled batch's.
pub fn iteration_figure(reports: &[Report]) -> plot::LineCharts {
    let s = |name: &str, f: &dyn Fn(&Metrics) -> Option<f64>| plot::Series {
        name: name.to_string(),
        values: reports.iter().map(|r| f(&r.overall)).collect(),
    };
    // A figure of both turns: the answers' beside the confidences'.
    let per_turn = |title: &str, y_label: &str, f: fn(&TurnStats) -> Option<f64>| plot::LinePanel {
        title: title.into(),
        y_label: y_label.into(),
        y_range: None,
        series: vec![
            s("answers", &|m| f(&m.answer_turn)),
            s("confidences", &|m| f(&m.confidence_turn)),
        ],
    };
    let held_in: Vec<plot::Series> = held_in_names(reports)
        .into_iter()
        .map(|n| plot::Series {
            name: format!("accuracy, held-in {n}"),
            values: reports
                .iter()
                .map(|r| r.held_in.get(&n).and_then(|h| h.accuracy))
                .collect(),
        })
        .collect();
    plot::LineCharts {
        title: "Metrics by iteration".to_string(),
        x_label: "iteration".to_string(),
        axis: plot::XAxis::Iterations,
        xs: reports.iter().map(|r| r.iteration as f64).collect(),
        grid: (2, 2),
        panels: vec![
            plot::LinePanel {
                title: "Accuracy and calibration".into(),
                y_label: "value".into(),
                y_range: Some((0.0, 1.0)),
                series: [
                    s("accuracy", &|m| m.accuracy),
                    s("mean confidence", &|m| m.mean_confidence),
                    s("Brier", &|m| m.brier),
                    s("ECE", &|m| m.ece),
                    s("AUROC", &|m| m.auroc),
                ]
                .into_iter()
                .chain(held_in)
                .collect(),
            },
            plot::LinePanel {
                title: "Format, parse and group signal".into(),
                y_label: "fraction".into(),
                y_range: Some((0.0, 1.0)),
                series: vec![
                    s("format ok (answers)", &|m| m.format_rate_answers),
                    s("format ok (confidences)", &|m| m.format_rate_confidences),
                    s("confidence parsed (strict)", &|m| m.parse_rate_strict),
                    s("G_a groups with signal", &|m| m.answer_turn.signal_fraction),
                    s("G_c groups with signal", &|m| {
                        m.confidence_turn.signal_fraction
                    }),
                ],
            },
            per_turn("Mean reward", "reward", |t| t.reward_mean),
            per_turn("Mean response length", "tokens", |t| t.length_mean),
        ],
    }
}

/// The probe figures.
pub fn probe_figures(p: &ProbeRows, s: &ProbeSummary) -> (plot::ProbeCurve, plot::ProbeScatter) {
    let n: Vec<u64> = p.rows.iter().map(|r| r.num_samples).collect();
    let same_n = n.first().copied().filter(|&f| n.iter().all(|&x| x == f));
    (
        plot::ProbeCurve {
            cuts: s.cuts.clone(),
            mean_verbal: s.verbal.mean,
            accuracy: s.accuracy,
            samples_per_cut: same_n,
            rollouts: s.rollouts,
        },
        plot::ProbeScatter {
            points: probe::scatter_points(p),
            pearson: s.pearson_final_probe_verbal,
        },
    )
}

/// `metrics.json`.
#[derive(Clone, Debug, Serialize)]
pub struct MetricsFile<'a> {
    /// rlcr version.
    pub rlcr_version: &'a str,
    /// One report per input, in input order.
    pub reports: Vec<&'a Report>,
    /// With an arm given more than once: every (bucket, arm) across its runs.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub across_runs: &'a [compare::AcrossRuns],
    /// Probe summary, when a probe table was given.
    pub probe: Option<&'a ProbeSummary>,
    /// What each `update` call of `--train-metrics` reported (KL to the reference, rollout/trainer
    /// mismatch, lengths), in call order.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub update_calls: &'a [training::CallDiagnostics],
}

/// The rows of `calibration.parquet`: one per (input, bin).
///
/// Columns: `iteration` int32 (the input's iteration, [`Report::iteration`]), `input` utf8, `bin` int32, `lower`/`upper` float64
/// (displayed edges), `count` int64, `mean_confidence`/`accuracy`/`gap` float64 (null for empty
/// bins).
pub fn calibration_batch(reports: &[Report]) -> Result<RecordBatch> {
    let rows: Vec<(u64, &Report, &Bin)> = reports
        .iter()
        .flat_map(|r| r.reliability.iter().map(move |b| (r.iteration, r, b)))
        .collect();
    let ints = |f: fn(&(u64, &Report, &Bin)) -> i32| -> ArrayRef {
        Arc::new(Int32Array::from_iter_values(rows.iter().map(f)))
    };
    let floats = |f: fn(&Bin) -> f64| -> ArrayRef {
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| f(r.2))))
    };
    let opt_floats = |f: fn(&Bin) -> Option<f64>| -> ArrayRef {
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| f(r.2))))
    };
    let input: ArrayRef = Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| r.1.input.as_str()),
    ));
    let count: ArrayRef = Arc::new(Int64Array::from_iter_values(
        rows.iter().map(|r| r.2.count as i64),
    ));
    // (name, values, nullable); the schema takes each column's type from its values.
    let columns = [
        ("iteration", ints(|r| r.0 as i32), false),
        ("input", input, false),
        ("bin", ints(|r| r.2.index as i32), false),
        ("lower", floats(|b| b.lower), false),
        ("upper", floats(|b| b.upper), false),
        ("count", count, false),
        ("mean_confidence", opt_floats(|b| b.mean_confidence), true),
        ("accuracy", opt_floats(|b| b.accuracy), true),
        ("gap", opt_floats(Bin::gap), true),
    ];
    RecordBatch::try_from_iter_with_nullable(columns).context("building the calibration table")
}

/// Write everything but `calibration.parquet` into `dir` (created if needed): `metrics.json`,
/// `reliability.svg/png`, `histograms.svg/png`, `iterations.svg/png` (several inputs),
/// `probe_curve.svg/png` and `probe_vs_verbal.svg/png` (probe given), `report.md`. With `labels`
/// (one per input: the inputs are arms, not iterations), `comparison.svg/png` (reliability
/// diagrams side by side, per bucket) and `comparison.md` replace the iteration figure, and
/// report.md opens with the comparison. Returns the names of the files written.
pub fn write_outputs(
    dir: &Path,
    analyses: &[Analysis],
    labels: &[String],
    examples: Option<&ExampleSet>,
    probe: Option<(&ProbeRows, &ProbeSummary)>,
    training: Option<&training::TrainingCurves>,
) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the output folder {}", dir.display()))?;
    let mut written = Vec::new();
    let mut figs = FigureFiles::default();
    let mut both = |stem: &str,
                    svg: &dyn Fn(&Path) -> Result<()>,
                    png: &dyn Fn(&Path) -> Result<()>|
     -> Result<String> {
        svg(&dir.join(format!("{stem}.svg")))?;
        png(&dir.join(format!("{stem}.png")))?;
        written.push(format!("{stem}.svg"));
        written.push(format!("{stem}.png"));
        Ok(format!("{stem}.png"))
    };
    let reports: Vec<Report> = analyses.iter().map(|a| a.report.clone()).collect();
    if let Some(last) = analyses.last() {
        let f = reliability_figure(&last.report);
        figs.reliability = Some(both("reliability", &|p| plot::write_svg(&f, p), &|p| {
            plot::write_png(&f, p)
        })?);
        let h = histogram_figure(&last.samples);
        figs.histograms = Some(both("histograms", &|p| plot::write_svg(&h, p), &|p| {
            plot::write_png(&h, p)
        })?);
    }
    let mut comparison = None;
    if !labels.is_empty() {
        let g = compare::Grid::new(&compare::display_labels(labels), &reports);
        let png = both("comparison", &|p| plot::write_svg(&g, p), &|p| {
            plot::write_png(&g, p)
        })?;
        comparison = Some(compare::section(labels, &reports, Some(&png)));
    } else if analyses.len() > 1 {
        let f = iteration_figure(&reports);
        figs.iterations = Some(both("iterations", &|p| plot::write_svg(&f, p), &|p| {
            plot::write_png(&f, p)
        })?);
    }
    if let Some(c) = training {
        let f = training::figure(c);
        let png = both("training", &|p| plot::write_svg(&f, p), &|p| {
            plot::write_png(&f, p)
        })?;
        let (first, last) = (c.steps.first(), c.steps.last());
        let what = format!(
            "{} optimizer steps ({}–{}) from `{}`{}.",
            c.steps.len(),
            first.copied().unwrap_or(0),
            last.copied().unwrap_or(0),
            c.source.replace('`', "'"),
            if c.skipped > 0 {
                format!(", {} skipped steps left out", c.skipped)
            } else {
                String::new()
            }
        );
        figs.training = Some((png, what));
    }
    if let Some((rows, s)) = probe {
        let (curve, scatter) = probe_figures(rows, s);
        figs.probe_curve = Some(both(
            "probe_curve",
            &|p| plot::write_svg(&curve, p),
            &|p| plot::write_png(&curve, p),
        )?);
        if !scatter.points.is_empty() {
            figs.probe_scatter = Some(both(
                "probe_vs_verbal",
                &|p| plot::write_svg(&scatter, p),
                &|p| plot::write_png(&scatter, p),
            )?);
        }
    }
    let calls = training.map(training::per_call).unwrap_or_default();
    let across_runs = compare::across_runs(labels, &reports);
    let mf = MetricsFile {
        rlcr_version: crate::VERSION,
        reports: reports.iter().collect(),
        across_runs: &across_runs,
        probe: probe.map(|p| p.1),
        update_calls: &calls,
    };
    let json = serde_json::to_string_pretty(&mf).context("serialising metrics.json")?;
    crate::fs::write_atomic(&dir.join("metrics.json"), format!("{json}\n").as_bytes())?;
    written.push("metrics.json".to_string());
    if let Some(c) = &comparison {
        crate::fs::write_atomic(&dir.join("comparison.md"), c.as_bytes())?;
        written.push("comparison.md".to_string());
    }
    let mut md = markdown::render(&reports, examples, probe.map(|p| p.1), &figs, &calls);
    if let Some(c) = comparison {
        // The comparison first, under the page's title line.
        let at = md.find('\n').map_or(md.len(), |i| i + 1);
        md.insert_str(at, &format!("\n{c}"));
    }
    crate::fs::write_atomic(&dir.join("report.md"), md.as_bytes())?;
    written.push("report.md".to_string());
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::data::tests::batch;
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn end_to_end_in_memory() {
        #[rustfmt::skip]
        let t = vec![
            ("answer", "p0", 0, "countdown", 10, true, 1.0, None, None, 1.0, "<think>x</think><answer>4</answer>"),
            ("answer", "p0", 1, "countdown", 20, false, 0.0, None, None, 0.0, "garbage ``` fence"),
            ("confidence", "p0", 0, "countdown", 3, true, 1.0, Some(0.2), Some(0.36), 0.36, "<confidence>0.2</confidence>"),
            ("confidence", "p0", 1, "countdown", 3, true, 0.0, Some(0.9), Some(0.19), 0.19, "<confidence>0.9</confidence>"),
            ("confidence", "p0", 1, "countdown", 3, false, 0.0, None, Some(0.0), 0.0, "<confidence>very</confidence>"),
        ];
        let b = batch(&t);
        let rows = Rows::from_batches([&b]).expect("rows");
        let a = Analysis::new(
            "scored.parquet",
            &rows,
            &Options::default(),
            EXAMPLES_PER_KIND,
        );
        let wanted: BTreeSet<usize> = a.examples.wanted_rows(&rows);
        let mut texts = HashMap::new();
        data::collect_texts(&b, 0, &wanted, &mut texts).expect("texts");
        let ex = resolve_examples(&rows, &a.examples, &texts);
        assert_eq!(ex.most_confident_wrong[0].sample_id, "p0/a1/c");
        assert_eq!(
            ex.most_confident_wrong[0].answer_text.as_deref(),
            Some("garbage ``` fence")
        );
        assert_eq!(
            ex.least_confident_right[0]
                .confidence
                .map(|c| (c * 10.0).round()),
            Some(2.0)
        );
        let dir = tempfile::tempdir().expect("tmp");
        let probe_rows =
            ProbeRows::from_batches([&probe::tests::probe_batch(&probe::tests::sample())])
                .expect("probe");
        let ps = probe::summarize(&probe_rows, 10, BinRule::Floor);
        let two = vec![a.clone(), a];
        let tc = training::parse(
            "{\"step\":1,\"loss\":0.5,\"skipped\":false}\n{\"step\":2,\"loss\":0.4}\n",
            "m.jsonl",
        )
        .expect("curves");
        let files = write_outputs(
            dir.path(),
            &two,
            &[],
            Some(&ex),
            Some((&probe_rows, &ps)),
            Some(&tc),
        )
        .expect("write");
        for f in [
            "metrics.json",
            "report.md",
            "reliability.svg",
            "reliability.png",
            "histograms.png",
            "iterations.png",
            "probe_curve.png",
            "probe_vs_verbal.png",
            "training.svg",
            "training.png",
        ] {
            assert!(files.iter().any(|x| x == f), "{f} missing from {files:?}");
            assert!(dir.path().join(f).is_file(), "{f}");
        }
        let md = std::fs::read_to_string(dir.path().join("report.md")).expect("md");
        assert!(md.contains("````text\n   garbage ``` fence"), "{md}");
        assert!(md.contains("## Across iterations"));
        // Iterations are numbered from 1, like the loop's iter-0001 folders.
        let rows: Vec<&str> = md
            .lines()
            .filter(|l| l.starts_with("| 1 | `") || l.starts_with("| 2 | `"))
            .collect();
        assert_eq!(rows.len(), 2, "{md}");
        assert!(!md.contains("| 0 | `"), "{md}");
        assert!(md.contains("## Faithfulness probe"));
        assert!(
            md.contains("## Training curves\n\n2 optimizer steps (1–2) from `m.jsonl`."),
            "{md}"
        );
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("metrics.json")).expect("json"),
        )
        .expect("parse");
        assert_eq!(json["reports"].as_array().map(|a| a.len()), Some(2));
        // c = [0.2, 0.9, 0 (missing)], y = [1, 0, 0]: Brier (0.64 + 0.81 + 0)/3
        let brier = json["reports"][0]["overall"]["brier"]
            .as_f64()
            .expect("brier");
        assert!((brier - 1.45 / 3.0).abs() < 1e-6, "{brier}");
        assert_eq!(json["probe"]["rollouts"].as_u64(), Some(2));
        let cb = calibration_batch(&[two_reports_first(&json)]).expect("batch");
        assert_eq!(cb.num_rows(), 10);
        if let Some(keep) = std::env::var_os("RLCR_PLOT_DIR") {
            for f in &files {
                let _ = std::fs::copy(
                    dir.path().join(f),
                    Path::new(&keep).join(format!("e2e-{f}")),
                );
            }
        }
    }

    fn two_reports_first(json: &serde_json::Value) -> Report {
        serde_json::from_value(json["reports"][0].clone()).expect("report round-trips through JSON")
    }
}
