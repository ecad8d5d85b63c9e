//! Comparison of labelled inputs (arms, e.g. `base`, `rlvr`, `rlcr` evaluated on the same prompts):
//! one table with every figure and its standard error, per bucket (all rows, then each
//! `data_source`, e.g. held-out `countdown-heldout` and out-of-domain `countdown-hard`), and the arms'
//! reliability diagrams side by side (one row of panels per bucket). An arm given several times
//! (one input per run, e.g. per seed) also gets its figures across the runs: each one's mean and
//! the standard error of that mean, and its difference to the first arm run by run
//! ([`across_runs`]).
use std::collections::BTreeSet;
use std::fmt::Write as _;

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Serialize;

use super::metrics::{mean, std_unbiased};
use super::plot::{self, Figure, Reliability};
use super::{Bin, Metrics, Report};

/// The label of the bucket of all rows.
pub const ALL: &str = "all";

/// Buckets of a comparison: [`ALL`], then every `data_source` of any report, sorted.
pub fn buckets(reports: &[Report]) -> Vec<String> {
    let sources: BTreeSet<&String> = reports.iter().flat_map(|r| r.per_source.keys()).collect();
    let mut out = vec![ALL.to_string()];
    // One source only: its bucket is the same rows as `all`.
    if sources.len() > 1 {
        out.extend(sources.into_iter().cloned());
    }
    out
}

fn metrics_of<'a>(r: &'a Report, bucket: &str) -> Option<&'a Metrics> {
    if bucket == ALL {
        Some(&r.overall)
    } else {
        r.per_source.get(bucket)
    }
}

fn bins_of<'a>(r: &'a Report, bucket: &str) -> Option<&'a Vec<Bin>> {
    if bucket == ALL {
        Some(&r.reliability)
    } else {
        r.per_source_reliability.get(bucket)
    }
}

/// `0.412 ± 0.015`, `-` when missing.
fn pm(v: Option<f64>, se: Option<f64>) -> String {
    match (v, se) {
        (Some(v), Some(s)) => format!("{v:.3} ± {s:.3}"),
        (Some(v), None) => format!("{v:.3}"),
        _ => "-".to_string(),
    }
}

/// The comparison table (Markdown): one row per (bucket, arm).
pub fn table(labels: &[String], reports: &[Report]) -> String {
    let mut out = String::from(
        "| bucket | arm | answers | accuracy | ECE | Brier | AUROC | mean confidence | format ok (answers / confidences) | confidence parsed |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for b in buckets(reports) {
        for (label, r) in labels.iter().zip(reports) {
            let Some(m) = metrics_of(r, &b) else {
                continue;
            };
            let se = &m.se;
            let _ = writeln!(
                out,
                "| {b} | {label} | {} | {} | {} | {} | {} | {} | {} / {} | {} |",
                m.answers,
                pm(m.accuracy, m.accuracy_se),
                pm(m.ece, se.ece),
                pm(m.brier, se.brier),
                pm(m.auroc, se.auroc),
                pm(m.mean_confidence, se.mean_confidence),
                pm(m.format_rate_answers, se.format_rate_answers),
                pm(m.format_rate_confidences, se.format_rate_confidences),
                pm(m.parse_rate_strict, se.parse_rate_strict),
            );
        }
    }
    out
}

/// The Markdown section: the table, how to read it, and the figure.
pub fn section(labels: &[String], reports: &[Report], figure: Option<&str>) -> String {
    let mut out = String::from("## Comparison\n\n");
    let rule = reports
        .first()
        .map(|r| {
            format!(
                "{} bins, {} rule",
                r.options.bins,
                r.options.ece_rule.as_str()
            )
        })
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "Arms: {}. Calibration over the confidence rows (a missing confidence counts as the report's \
missing-confidence policy says); ECE with {rule}. `±` is one standard error with rows taken as \
independent (several samples of one prompt are not, so these are lower bounds): binomial for \
accuracy and rates, the mean's for Brier and mean confidence, Hanley–McNeil for AUROC, the delta \
method over the bins for ECE.\n",
        arms(labels)
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let shown = display_labels(labels);
    out.push_str(&table(&shown, reports));
    let runs = across_runs(labels, reports);
    if !runs.is_empty() {
        let first = runs.first().map_or("", |r| r.arm.as_str());
        let _ = writeln!(
            out,
            "\n### Across runs\n\nEach arm's inputs are its runs (`#2` is an arm's second input, e.g. \
its second seed; run `i` of every arm belongs together). Per figure: the mean over the runs and \
`±` the standard error of that mean from the runs' spread, `sqrt(Σ(x − x̄)² / (n − 1) / n)`; \
the last columns take each run's figure minus run `i` of `{first}` and give the same mean and \
standard error of those differences.\n"
        );
        out.push_str(&runs_table(&runs));
    }
    if let Some(f) = figure {
        let _ = writeln!(out, "\n![Reliability diagrams, arms side by side]({f})");
    }
    out.push('\n');
    out
}

/// The labels as the per-input table and figure show them: as given when every arm is given
/// once, else each with its run, `rlcr #2` for the second input labelled `rlcr`.
pub fn display_labels(labels: &[String]) -> Vec<String> {
    if arms(labels).len() == labels.len() {
        return labels.to_vec();
    }
    let mut seen: Vec<&str> = Vec::new();
    labels
        .iter()
        .map(|l| {
            seen.push(l);
            let run = seen.iter().filter(|s| **s == l.as_str()).count();
            format!("{l} #{run}")
        })
        .collect()
}

/// The arms in order of first appearance.
pub(crate) fn arms(labels: &[String]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for l in labels {
        if !out.contains(&l.as_str()) {
            out.push(l);
        }
    }
    out
}

/// A figure over runs: the mean over the runs that have it, `x̄ = Σx / n`, and the standard error
/// of that mean, `sqrt(Σ(x − x̄)² / (n − 1)) / sqrt(n)` (none below two runs).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    pub mean: Option<f64>,
    pub se: Option<f64>,
    /// Runs that have the figure.
    pub runs: usize,
}

impl Spread {
    pub fn of(values: &[Option<f64>]) -> Spread {
        let xs: Vec<f64> = values.iter().flatten().copied().collect();
        Spread {
            mean: mean(&xs),
            se: std_unbiased(&xs).map(|s| s / (xs.len() as f64).sqrt()),
            runs: xs.len(),
        }
    }

    fn cell(&self) -> String {
        pm(self.mean, self.se)
    }
}

/// One arm in one bucket across its runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AcrossRuns {
    pub bucket: String,
    pub arm: String,
    /// Inputs of this arm.
    pub runs: usize,
    pub accuracy: Spread,
    pub ece: Spread,
    pub brier: Spread,
    pub auroc: Spread,
    pub mean_confidence: Spread,
    /// This arm's figures minus the first arm's, run by run (run `i` of each), over the runs
    /// where both have the figure; `None` for the first arm.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minus_first: Option<Differences>,
}

/// Run-by-run differences to the first arm.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Differences {
    /// The arm they are taken against.
    pub first: String,
    pub accuracy: Spread,
    pub ece: Spread,
    pub brier: Spread,
    pub auroc: Spread,
}

/// Every (bucket, arm) across its runs, when some arm is given more than once: run `i` of an
/// arm is its `i`-th input. Empty when every arm is given once.
pub fn across_runs(labels: &[String], reports: &[Report]) -> Vec<AcrossRuns> {
    let arms = arms(labels);
    if arms.len() == labels.len() {
        return vec![];
    }
    let runs_of = |arm: &str| -> Vec<&Report> {
        labels
            .iter()
            .zip(reports)
            .filter(|(l, _)| l.as_str() == arm)
            .map(|(_, r)| r)
            .collect()
    };
    type Get = fn(&Metrics) -> Option<f64>;
    let figure = |runs: &[&Report], bucket: &str, get: Get| -> Vec<Option<f64>> {
        runs.iter()
            .map(|r| metrics_of(r, bucket).and_then(get))
            .collect()
    };
    let difference = |a: &[Option<f64>], b: &[Option<f64>]| -> Spread {
        let d: Vec<Option<f64>> = a.iter().zip(b).map(|(x, y)| Some((*x)? - (*y)?)).collect();
        Spread::of(&d)
    };
    let (accuracy, ece, brier, auroc): (Get, Get, Get, Get) =
        (|m| m.accuracy, |m| m.ece, |m| m.brier, |m| m.auroc);
    let mut out = Vec::new();
    for b in buckets(reports) {
        let first = runs_of(arms[0]);
        for arm in &arms {
            let runs = runs_of(arm);
            let minus_first = (*arm != arms[0]).then(|| {
                let d = |get: Get| difference(&figure(&runs, &b, get), &figure(&first, &b, get));
                Differences {
                    first: arms[0].to_string(),
                    accuracy: d(accuracy),
                    ece: d(ece),
                    brier: d(brier),
                    auroc: d(auroc),
                }
            });
            out.push(AcrossRuns {
                bucket: b.clone(),
                arm: arm.to_string(),
                runs: runs.len(),
                accuracy: Spread::of(&figure(&runs, &b, accuracy)),
                ece: Spread::of(&figure(&runs, &b, ece)),
                brier: Spread::of(&figure(&runs, &b, brier)),
                auroc: Spread::of(&figure(&runs, &b, auroc)),
                mean_confidence: Spread::of(&figure(&runs, &b, |m| m.mean_confidence)),
                minus_first,
            });
        }
    }
    out
}

/// The across-runs table (Markdown): one row per (bucket, arm).
pub fn runs_table(rows: &[AcrossRuns]) -> String {
    let first = rows
        .iter()
        .find_map(|r| r.minus_first.as_ref().map(|d| d.first.clone()))
        .unwrap_or_default();
    let mut out = format!(
        "| bucket | arm | runs | accuracy | ECE | Brier | AUROC | mean confidence | accuracy − {first} | ECE − {first} | Brier − {first} | AUROC − {first} |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        let d = |f: fn(&Differences) -> &Spread| {
            r.minus_first
                .as_ref()
                .map_or(String::new(), |d| signed(f(d)))
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.bucket,
            r.arm,
            r.runs,
            r.accuracy.cell(),
            r.ece.cell(),
            r.brier.cell(),
            r.auroc.cell(),
            r.mean_confidence.cell(),
            d(|d| &d.accuracy),
            d(|d| &d.ece),
            d(|d| &d.brier),
            d(|d| &d.auroc),
        );
    }
    out
}

/// `+0.012 ± 0.008`, `-` when missing.
fn signed(s: &Spread) -> String {
    match (s.mean, s.se) {
        (Some(v), Some(e)) => format!("{v:+.3} ± {e:.3}"),
        (Some(v), None) => format!("{v:+.3}"),
        _ => "-".to_string(),
    }
}

/// Reliability diagrams in a grid: one row per bucket, one column per arm.
pub struct Grid {
    pub panels: Vec<Reliability>,
    pub cols: usize,
}

impl Grid {
    pub fn new(labels: &[String], reports: &[Report]) -> Grid {
        let mut panels = Vec::new();
        for b in buckets(reports) {
            for (label, r) in labels.iter().zip(reports) {
                let bins = bins_of(r, &b).cloned().unwrap_or_default();
                let m = metrics_of(r, &b);
                let note = format!(
                    "Brier {} · AUROC {}",
                    plot::fmt_opt(m.and_then(|m| m.brier), 3),
                    plot::fmt_opt(m.and_then(|m| m.auroc), 3)
                );
                panels.push(Reliability::new(
                    bins,
                    r.options.ece_rule,
                    &format!("{label} · {b} · "),
                    &note,
                ));
            }
        }
        Grid {
            panels,
            cols: labels.len().max(1),
        }
    }

    fn rows(&self) -> usize {
        self.panels.len().div_ceil(self.cols).max(1)
    }
}

impl Figure for Grid {
    fn size(&self) -> (u32, u32) {
        let (w, h) = self.panels.first().map(|p| p.size()).unwrap_or((720, 700));
        (w * self.cols as u32, h * self.rows() as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let areas = root.split_evenly((self.rows(), self.cols));
        for (p, area) in self.panels.iter().zip(areas.iter()) {
            p.draw(area)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::data::tests::batch;
    use crate::report::{summary, Options, Rows};

    /// Two sources, two arms: the table has a row per (bucket, arm) with hand-checked figures.
    #[test]
    fn table_rows_and_figures() {
        // Arm a: in `countdown`, answer right with confidence 0.8 and wrong with 0.4; in
        // `countdown-hard`, one wrong answer with confidence 0.6.
        #[rustfmt::skip]
        let t = vec![
            ("answer", "p0", 0, "countdown", 5, true, 1.0, None, None, 1.0, "a"),
            ("answer", "p0", 1, "countdown", 5, true, 0.0, None, None, 0.0, "a"),
            ("answer", "p1", 0, "countdown-hard", 5, true, 0.0, None, None, 0.0, "a"),
            ("confidence", "p0", 0, "countdown", 3, true, 1.0, Some(0.8), Some(0.96), 0.96, "c"),
            ("confidence", "p0", 1, "countdown", 3, true, 0.0, Some(0.4), Some(0.84), 0.84, "c"),
            ("confidence", "p1", 0, "countdown-hard", 3, true, 0.0, Some(0.6), Some(0.64), 0.64, "c"),
        ];
        let rows = Rows::from_batches([&batch(&t)]).unwrap();
        let r = summary::build("a.parquet", &rows, &Options::default());
        let labels = vec!["rlvr".to_string(), "rlcr".to_string()];
        let reports = vec![r.clone(), r];
        assert_eq!(buckets(&reports), ["all", "countdown", "countdown-hard"]);
        let md = table(&labels, &reports);
        let lines: Vec<&str> = md.lines().skip(2).collect();
        assert_eq!(lines.len(), 6, "{md}");
        // all: accuracy 1/3, SE sqrt((1/3)(2/3)/3) = 0.272; Brier (0.04 + 0.16 + 0.36)/3 = 0.187;
        // AUROC: the positive (0.8) beats both negatives = 1.
        assert!(
            lines[0].starts_with("| all | rlvr | 3 | 0.333 ± 0.272 |"),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("| 0.187 ± "), "{}", lines[0]);
        assert!(lines[0].contains("| 1.000 ± 0.000 |"), "{}", lines[0]);
        // countdown: Brier (0.04 + 0.16)/2 = 0.100; ECE (floor rule): bins 8 and 4, gaps 0.2 and
        // 0.4, weights ½ → 0.300.
        assert!(
            lines[2].starts_with("| countdown | rlvr | 2 | 0.500 ± 0.354 | 0.300 "),
            "{}",
            lines[2]
        );
        assert!(lines[2].contains("| 0.100 ± 0.060 |"), "{}", lines[2]);
        // countdown-hard: no positive, no AUROC.
        assert!(
            lines[4].starts_with("| countdown-hard | rlvr | 1 | 0.000 ± 0.000 | 0.600 "),
            "{}",
            lines[4]
        );
        let g = Grid::new(&labels, &reports);
        assert_eq!((g.panels.len(), g.cols, g.rows()), (6, 2, 3));
        assert_eq!(g.size(), (1440, 2100));
        let svg = plot::to_svg(&g).unwrap();
        assert!(svg.contains("rlcr · countdown-hard"));
        // Every text (titles, counts above bars) lies inside the figure: a panel's counts are
        // placed in its own area, not the first panel's coordinates shifted by its offset.
        let texts = text_positions(&svg);
        for &(x, y, _) in &texts {
            assert!(x <= 1440.0 && y <= 2100.0, "text at ({x}, {y})");
        }
        // The count of panel (row 3, column 2) sits in that panel: x in 720..1440, y in 1400..2100.
        let counts: Vec<(f64, f64)> = texts
            .iter()
            .filter(|t| t.2.contains(">\n1\n</text>") || t.2.contains(">1</text>"))
            .map(|t| (t.0, t.1))
            .collect();
        assert!(
            counts
                .iter()
                .any(|&(x, y)| (720.0..1440.0).contains(&x) && (1400.0..2100.0).contains(&y)),
            "{counts:?}"
        );
    }

    /// An arm given three times: its figures across the runs, and the second arm's differences
    /// to the first run by run, against numpy (`x.mean()`, `x.std(ddof=1) / sqrt(n)`): base
    /// accuracy 0.40, 0.45, 0.50 → 0.45 ± 0.028868; rlcr 0.42, 0.50, 0.51 → 0.476667 ± 0.028480,
    /// minus base +0.026667 ± 0.012019; rlcr's AUROC missing in run 2: 0.6, 0.7 → 0.65 ± 0.05 over
    /// two runs, minus base's 0.5 and 0.45 → +0.175 ± 0.075.
    #[test]
    fn across_runs_against_numpy() {
        let rows = Rows::from_batches([&batch(&[(
            "answer",
            "p0",
            0,
            "countdown",
            5,
            true,
            1.0,
            None,
            None,
            1.0,
            "a",
        )])])
        .unwrap();
        let mut r = summary::build("a.parquet", &rows, &Options::default());
        r.per_source.clear();
        let run = |acc: f64, auroc: Option<f64>| {
            let mut r = r.clone();
            r.overall.accuracy = Some(acc);
            r.overall.auroc = auroc;
            r
        };
        let labels: Vec<String> = ["base", "rlcr", "base", "rlcr", "base", "rlcr"]
            .map(String::from)
            .to_vec();
        let reports = vec![
            run(0.40, Some(0.5)),
            run(0.42, Some(0.6)),
            run(0.45, Some(0.55)),
            run(0.50, None),
            run(0.50, Some(0.45)),
            run(0.51, Some(0.7)),
        ];
        let a = across_runs(&labels, &reports);
        assert_eq!(a.len(), 2);
        let close = |s: &Spread, mean: f64, se: f64, runs: usize| {
            assert!((s.mean.unwrap() - mean).abs() < 1e-12, "{s:?}");
            assert!((s.se.unwrap() - se).abs() < 1e-12, "{s:?}");
            assert_eq!(s.runs, runs, "{s:?}");
        };
        assert_eq!((a[0].arm.as_str(), a[0].runs), ("base", 3));
        close(&a[0].accuracy, 0.45, 0.028867513459481284, 3);
        assert!(a[0].minus_first.is_none());
        close(&a[1].accuracy, 0.4766666666666666, 0.02848001248439178, 3);
        close(&a[1].auroc, 0.6499999999999999, 0.04999999999999999, 2);
        let d = a[1].minus_first.as_ref().unwrap();
        assert_eq!(d.first, "base");
        close(&d.accuracy, 0.026666666666666655, 0.01201850425154663, 3);
        close(&d.auroc, 0.17499999999999996, 0.07499999999999997, 2);
        let md = runs_table(&a);
        assert!(
            md.contains("| all | rlcr | 3 | 0.477 ± 0.028 |")
                && md.contains("| +0.027 ± 0.012 |")
                && md.contains("| +0.175 ± 0.075 |"),
            "{md}"
        );
        assert_eq!(
            display_labels(&labels),
            ["base #1", "rlcr #1", "base #2", "rlcr #2", "base #3", "rlcr #3"]
        );
        // Every arm once: no runs, labels as given.
        let once = &labels[..2];
        assert!(across_runs(once, &reports[..2]).is_empty());
        assert_eq!(display_labels(once), once);
    }

    /// `(x, y, rest of the element)` of every `<text>` of an SVG.
    fn text_positions(svg: &str) -> Vec<(f64, f64, &str)> {
        svg.split("<text x=\"")
            .skip(1)
            .map(|part| {
                let (x, rest) = part.split_once('"').unwrap();
                let y = rest
                    .split("y=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap();
                (x.parse().unwrap(), y.parse().unwrap(), part)
            })
            .collect()
    }
}
