//! Comparison of labelled inputs (arms, e.g. `base`, `rlvr`, `rlcr` evaluated on the same prompts):
//! one table with every figure and its standard error, per bucket (all rows, then each
//! `data_source`, e.g. held-out `countdown-heldout` and out-of-domain `countdown-hard`), and the arms'
//! reliability diagrams side by side (one row of panels per bucket).
use std::collections::BTreeSet;
use std::fmt::Write as _;

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

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
        labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out.push_str(&table(labels, reports));
    if let Some(f) = figure {
        let _ = writeln!(out, "\n![Reliability diagrams, arms side by side]({f})");
    }
    out.push('\n');
    out
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
