//! The reliability diagram.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::frame::{
    axes, bars, compact_count, dashed, empty_note, fmt_opt, hatch, legend_strip, single_frame,
    Axes, Mark, FONT_FAMILY,
};
use super::palette::{self as pal, INK, MUTED};
use super::{Figure, Pe};
use crate::report::metrics::{self, Bin, BinRule};

/// Reliability diagram: per bin, a bar at the bin's accuracy, the gap to the bin's mean confidence
/// shaded, the diagonal of perfect calibration, the sample count above each bar, and ECE in the
/// title.
#[derive(Clone, Debug, PartialEq)]
pub struct Reliability {
    /// The reliability table.
    pub bins: Vec<Bin>,
    /// ECE of the table.
    pub ece: Option<f64>,
    /// The rule the bins use (shown in the subtitle).
    pub rule: BinRule,
    /// Extra words for the subtitle (e.g. Brier and AUROC).
    pub note: String,
    /// Title prefix (e.g. the input's name).
    pub title: String,
}

impl Reliability {
    /// A diagram from a reliability table, with ECE computed from it.
    pub fn new(bins: Vec<Bin>, rule: BinRule, title: &str, note: &str) -> Reliability {
        let ece = metrics::ece_from_bins(&bins);
        Reliability {
            bins,
            ece,
            rule,
            note: note.to_string(),
            title: title.to_string(),
        }
    }
}

impl Figure for Reliability {
    fn size(&self) -> (u32, u32) {
        (720, 700)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let n: u64 = self.bins.iter().map(|b| b.count).sum();
        let title = format!("{}ECE = {}", self.title, fmt_opt(self.ece, 4));
        let mut sub = format!(
            "n = {n} · {} bins ({} rule) · counts above bars",
            self.bins.len(),
            self.rule.as_str()
        );
        if !self.note.is_empty() {
            sub = format!("{sub} · {}", self.note);
        }
        let (body, foot) = single_frame(root, (&title, &sub), 40)?;
        let desc = ("Stated confidence", "Accuracy");
        let mut chart = axes(&body, &Axes::single(0.0..1.0, 0.0..1.08, desc, (17, 14)))?;

        let bar = pal::BLUE.mix(0.8).filled();
        let gap_fill = pal::RED.mix(0.12).filled();
        let gap_line = ShapeStyle::from(&pal::RED.mix(0.85)).stroke_width(1);
        let diag = ShapeStyle::from(&MUTED).stroke_width(2);
        let filled: Vec<&Bin> = self.bins.iter().filter(|b| b.count > 0).collect();
        // Bars at the bins' accuracy, separated by thin white edges.
        let rects: Vec<[(f64, f64); 2]> = filled
            .iter()
            .filter_map(|b| Some([(b.lower, 0.0), (b.upper, b.accuracy?)]))
            .collect();
        bars(&mut chart, &rects, bar)?;
        // The gap between accuracy and mean confidence: light fill, hatching and an outline, so
        // it reads the same over the bar (under-confident bins) and above it (over-confident).
        let gaps: Vec<[(f64, f64); 2]> = filled
            .iter()
            .filter_map(|b| Some([(b.lower, b.accuracy?), (b.upper, b.mean_confidence?)]))
            .collect();
        chart
            .draw_series(gaps.iter().map(|&r| Rectangle::new(r, gap_fill)))
            .pe()?;
        // backend_coord is in the backend's pixels, root.draw in root's: they differ when the
        // diagram is one panel of a larger figure (report::compare::Grid).
        let base = root.get_base_pixel();
        let rel = |(x, y): (i32, i32)| (x - base.0, y - base.1);
        for [p, q] in &gaps {
            let (p, q) = (rel(chart.backend_coord(p)), rel(chart.backend_coord(q)));
            hatch(root, p, q, gap_line, 7)?;
        }
        chart
            .draw_series(gaps.iter().map(|&r| Rectangle::new(r, gap_line)))
            .pe()?;
        dashed(&mut chart, ((0.0, 0.0), (1.0, 1.0)), (8, 6), diag)?;
        // Counts above bars, on a white label so that the diagonal does not run through them.
        let count_style = (FONT_FAMILY, 13)
            .into_font()
            .color(&INK)
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        for b in &filled {
            let top = b
                .accuracy
                .unwrap_or(0.0)
                .max(b.mean_confidence.unwrap_or(0.0));
            let (x, y) = rel(chart.backend_coord(&((b.lower + b.upper) / 2.0, top)));
            let y = y - 4;
            let label = compact_count(b.count);
            let (w, h) = root.estimate_text_size(&label, &count_style).pe()?;
            let (w, h) = (w as i32, h as i32);
            root.draw(&Rectangle::new(
                [(x - w / 2 - 2, y - h - 1), (x + w / 2 + 2, y + 1)],
                WHITE.mix(0.85).filled(),
            ))
            .pe()?;
            root.draw(&Text::new(label, (x, y), count_style.clone()))
                .pe()?;
        }
        legend_strip(
            &foot,
            &[
                (Mark::Swatch(bar), "Accuracy of the bin".to_string()),
                (
                    Mark::Hatch(gap_fill, gap_line),
                    "Gap to the bin's mean confidence".to_string(),
                ),
                (Mark::Dashed(diag), "Perfect calibration".to_string()),
            ],
        )?;
        if n == 0 {
            empty_note(&body, "no rows with a confidence and a label")?;
        }
        Ok(())
    }
}
