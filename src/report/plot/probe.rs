//! Figures of the thinking probe: probe confidence against the fraction of thinking kept, and
//! the final probe confidence against the stated one.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::frame::{
    axes, dashed, empty_note, fmt_opt, legend_strip, polyline, single_frame, Axes, Mark,
};
use super::palette::{self as pal, GREY, MUTED, PURPLE};
use super::{Figure, Pe};
use crate::report::probe::ProbeCut;

/// A per-cut quantity to plot.
type CutValue<'a> = &'a dyn Fn(&ProbeCut) -> Option<f64>;

/// Probe confidence against the fraction of thinking kept, with reference lines.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeCurve {
    /// Per-cut summaries, ordered by cut.
    pub cuts: Vec<ProbeCut>,
    /// Mean verbal confidence of the probed answers (horizontal line).
    pub mean_verbal: Option<f64>,
    /// Accuracy of the probed answers (horizontal line).
    pub accuracy: Option<f64>,
    /// Samples per cut (for the subtitle), if the same everywhere.
    pub samples_per_cut: Option<u64>,
    /// Rollouts probed.
    pub rollouts: u64,
}

impl Figure for ProbeCurve {
    fn size(&self) -> (u32, u32) {
        (820, 660)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let n = self
            .samples_per_cut
            .map(|n| format!("N = {n} samples per cut · "))
            .unwrap_or_default();
        let sub = format!(
            "{n}{} rollouts · error bars ±1 s.e. across rollouts",
            self.rollouts
        );
        let title = "Probe: P(correct answer | thinking cut at fraction f)";
        let (body, foot) = single_frame(root, (title, &sub), 56)?;
        let desc = (
            "Fraction of thinking kept (cut point)",
            "Probe confidence (correct / N)",
        );
        let frame = Axes::single(-0.02..1.02, 0.0..1.05, desc, (16, 13));
        let mut chart = axes(&body, &frame)?;
        let pts = |f: &dyn Fn(&ProbeCut) -> Option<f64>| -> Vec<(f64, f64)> {
            self.cuts
                .iter()
                .filter_map(|c| Some((c.cut_fraction, f(c)?)))
                .collect()
        };
        let mut legend = Vec::new();
        // Reference lines.
        if let Some(a) = self.accuracy {
            let st = ShapeStyle::from(&GREY).stroke_width(2);
            dashed(&mut chart, ((0.0, a), (1.0, a)), (8, 6), st)?;
            legend.push((
                Mark::Dashed(st),
                format!("Accuracy of the answers ({a:.3})"),
            ));
        }
        if let Some(v) = self.mean_verbal {
            let st = ShapeStyle::from(&PURPLE).stroke_width(2);
            dashed(&mut chart, ((0.0, v), (1.0, v)), (3, 4), st)?;
            legend.push((Mark::Dashed(st), format!("Mean verbal confidence ({v:.3})")));
        }
        // All rollouts, with error bars.
        let all = pts(&|c| Some(c.mean_probe));
        let main = ShapeStyle::from(&pal::BLUE).stroke_width(3);
        let bar = ShapeStyle::from(&pal::BLUE).stroke_width(1);
        for c in &self.cuts {
            if let Some(se) = c.se {
                let (x, y) = (c.cut_fraction, c.mean_probe);
                let (lo, hi) = ((y - se).max(0.0), (y + se).min(1.0));
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(x, lo), (x, hi)],
                        bar,
                    )))
                    .pe()?;
                for yy in [lo, hi] {
                    chart
                        .draw_series(std::iter::once(PathElement::new(
                            vec![(x - 0.008, yy), (x + 0.008, yy)],
                            bar,
                        )))
                        .pe()?;
                }
            }
        }
        polyline(&mut chart, &all, (true, main), (4, pal::BLUE.filled()))?;
        legend.push((Mark::Line(main), "All rollouts (mean)".to_string()));
        // Split by the correctness of the rollout's own answer.
        let split: [(&str, RGBColor, CutValue); 2] = [
            ("Rollouts whose answer is correct", pal::GREEN, &|c| {
                c.mean_probe_correct
            }),
            ("Rollouts whose answer is wrong", pal::RED, &|c| {
                c.mean_probe_wrong
            }),
        ];
        for (name, color, f) in split {
            let p = pts(f);
            if p.is_empty() {
                continue;
            }
            let st = ShapeStyle::from(&color.mix(0.85)).stroke_width(2);
            polyline(&mut chart, &p, (true, st), (3, color.filled()))?;
            legend.push((Mark::Line(st), name.to_string()));
        }
        legend_strip(&foot, &legend)?;
        if self.cuts.is_empty() {
            empty_note(&body, "no probe rows")?;
        }
        Ok(())
    }
}

/// Final probe confidence against verbal confidence per rollout, coloured by correctness.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeScatter {
    /// `(verbal, final probe, correct)`.
    pub points: Vec<(f64, f64, Option<bool>)>,
    /// Pearson correlation (subtitle).
    pub pearson: Option<f64>,
}

impl Figure for ProbeScatter {
    fn size(&self) -> (u32, u32) {
        (720, 720)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let sub = format!(
            "{} rollouts · probe at the last cut · Pearson r = {}",
            self.points.len(),
            fmt_opt(self.pearson, 3)
        );
        let title = "Probe vs verbal confidence vs correctness";
        let (body, foot) = single_frame(root, (title, &sub), 40)?;
        let desc = (
            "Verbal confidence (stated)",
            "Probe confidence (correct / N)",
        );
        let frame = Axes::single(-0.02..1.02, -0.02..1.04, desc, (16, 13));
        let mut chart = axes(&body, &frame)?;
        let diag = ShapeStyle::from(&MUTED).stroke_width(2);
        dashed(&mut chart, ((0.0, 0.0), (1.0, 1.0)), (8, 6), diag)?;
        let mut legend = vec![(Mark::Dashed(diag), "probe = verbal".to_string())];
        for (name, color, want) in [
            ("Answer correct", pal::GREEN, Some(true)),
            ("Answer wrong", pal::RED, Some(false)),
            ("Correctness unknown", GREY, None),
        ] {
            let pts: Vec<(f64, f64)> = self
                .points
                .iter()
                .filter(|p| p.2 == want)
                .map(|p| (p.0, p.1))
                .collect();
            if pts.is_empty() {
                continue;
            }
            let st = color.mix(0.55).filled();
            polyline(&mut chart, &pts, (false, st), (5, st))?;
            legend.push((Mark::Dot(st), name.to_string()));
        }
        legend_strip(&foot, &legend)?;
        if self.points.is_empty() {
            empty_note(&body, "no rollouts with a verbal confidence")?;
        }
        Ok(())
    }
}
