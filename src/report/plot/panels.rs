//! Figures of panels in a grid: histograms of rewards and lengths, metrics against iteration,
//! training curves against the global step.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::frame::{
    axes, bars, dashed, decimals_for, empty_note, fmt_opt, legend_strip, panel_grid, polyline,
    Axes, Mark,
};
use super::palette::{INK, SERIES};
use super::Figure;
use crate::report::metrics;

// ---------------------------------------------------------------------------------------------
// Histograms of the two turns

/// Histogram input of one panel.
#[derive(Clone, Debug, PartialEq)]
pub struct HistPanel {
    /// Panel title.
    pub title: String,
    /// x-axis label.
    pub x_label: String,
    /// Values.
    pub values: Vec<f64>,
    /// Integer data (lengths): integer-aligned bins.
    pub integer: bool,
    /// Bar colour index into [`palette::SERIES`].
    pub color: usize,
}

/// Bin layout of a histogram panel: `(lo, width, counts)`.
///
/// Real data: 20 bins over `[min(0, min v), max(1, max v)]` (rewards live in `[0, 1]`, so every
/// reward histogram shares that axis). Integer data: bins of integer width `w = ceil((max+1)/30)`
/// starting at 0, bin of `v` = `floor(v / w)` in integer arithmetic.
pub fn hist_layout(values: &[f64], integer: bool) -> (f64, f64, Vec<u64>) {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if integer {
        let max = finite.iter().fold(0u64, |m, &v| m.max(v.max(0.0) as u64));
        let w = (max + 1).div_ceil(30).max(1);
        let nb = (max / w + 1) as usize;
        let mut counts = vec![0u64; nb];
        for &v in &finite {
            counts[((v.max(0.0) as u64) / w) as usize] += 1;
        }
        (0.0, w as f64, counts)
    } else {
        let lo = finite.iter().fold(0f64, |m, &v| m.min(v));
        let hi = finite.iter().fold(1f64, |m, &v| m.max(v));
        let bins = 20;
        (
            lo,
            (hi - lo) / bins as f64,
            metrics::histogram(&finite, lo, hi, bins),
        )
    }
}

/// A grid of histograms (rewards and lengths of answers and confidences side by side).
#[derive(Clone, Debug, PartialEq)]
pub struct Histograms {
    /// Title.
    pub title: String,
    /// Panels, row-major.
    pub panels: Vec<HistPanel>,
    /// Grid (rows, cols).
    pub grid: (usize, usize),
}

impl Figure for Histograms {
    fn size(&self) -> (u32, u32) {
        (520 * self.grid.1 as u32, 60 + 380 * self.grid.0 as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        panel_grid(root, &self.title, self.grid, &self.panels, draw_hist_panel)
    }
}

fn draw_hist_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &HistPanel) -> Result<()> {
    let (lo, w, counts) = hist_layout(&p.values, p.integer);
    // Integer-friendly count axis: 0..ceil(1.12·max), at most 6 labels, never duplicated.
    let top = (counts.iter().copied().max().unwrap_or(0) as f64 * 1.12)
        .ceil()
        .max(1.0);
    let n_ylabels = (top as usize + 1).min(6);
    let hi = lo + w * counts.len() as f64;
    let hi = if hi > lo { hi } else { lo + 1.0 };
    let n_xlabels = if p.integer {
        ((hi - lo) as usize + 1).min(8)
    } else {
        6
    };
    let mean = metrics::mean(&p.values);
    let std = metrics::std_unbiased(&p.values);
    let d = if p.integer { 1 } else { 3 };
    let caption = format!(
        "{} (n = {}, mean {} ± {})",
        p.title,
        p.values.len(),
        fmt_opt(mean, d),
        fmt_opt(std, d)
    );
    let int = p.integer;
    let x_fmt = |v: &f64| {
        if int {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    };
    let y_fmt = |v: &f64| {
        if (v - v.round()).abs() < 1e-9 {
            format!("{v:.0}")
        } else {
            String::new()
        }
    };
    let mut chart = axes(
        area,
        &Axes::panel(
            (&caption, 15),
            58,
            (lo..hi, 0.0..top),
            (n_xlabels, n_ylabels),
            (&x_fmt, &y_fmt),
            (&p.x_label, "Rows"),
        ),
    )?;
    let rects: Vec<[(f64, f64); 2]> = counts
        .iter()
        .enumerate()
        .filter(|(_, &c)| c > 0)
        .map(|(i, &c)| {
            let x0 = lo + w * i as f64;
            [(x0, 0.0), (x0 + w, c as f64)]
        })
        .collect();
    let color = SERIES[p.color % SERIES.len()];
    bars(&mut chart, &rects, color.mix(0.8).filled())?;
    if let Some(m) = mean {
        let style = ShapeStyle::from(&INK).stroke_width(1);
        dashed(&mut chart, ((m, 0.0), (m, top)), (6, 4), style)?;
    }
    if p.values.is_empty() {
        empty_note(area, "no rows")?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Line charts (metrics against iteration, training curves against the step)

/// One line.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// One value per x position; `None` breaks the line.
    pub values: Vec<Option<f64>>,
}

/// One panel of line charts.
#[derive(Clone, Debug, PartialEq)]
pub struct LinePanel {
    /// Panel title.
    pub title: String,
    /// y-axis label.
    pub y_label: String,
    /// Fixed y range, else from the data.
    pub y_range: Option<(f64, f64)>,
    /// Lines.
    pub series: Vec<Series>,
}

/// What the shared x axis of a [`LineCharts`] counts: it sets the panel size, the ticks and how
/// points are marked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XAxis {
    /// Iterations: whole numbers, not necessarily evenly spaced (evaluations every few
    /// iterations); every value gets a dot.
    Iterations,
    /// Global optimizer steps (training curves): lines, dots only while there are few points.
    Steps,
}

/// Panels of line charts over a shared numeric x axis. A series' values are aligned with `xs`;
/// `None` breaks the line.
#[derive(Clone, Debug, PartialEq)]
pub struct LineCharts {
    /// Title.
    pub title: String,
    /// x-axis label.
    pub x_label: String,
    /// What the x axis counts.
    pub axis: XAxis,
    /// The x value of each position (the series' values are aligned with them), increasing.
    pub xs: Vec<f64>,
    /// Panels, row-major.
    pub panels: Vec<LinePanel>,
    /// Grid (rows, cols).
    pub grid: (usize, usize),
}

impl Figure for LineCharts {
    fn size(&self) -> (u32, u32) {
        let (w, h) = match self.axis {
            XAxis::Iterations => (600, 420),
            XAxis::Steps => (520, 400),
        };
        (w * self.grid.1 as u32, 60 + h * self.grid.0 as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        panel_grid(root, &self.title, self.grid, &self.panels, |area, p| {
            draw_line_panel(area, p, &self.x_label, &self.xs, self.axis)
        })
    }
}

/// The smallest and largest value of a panel's series (infinite when it has none).
fn data_range(p: &LinePanel) -> (f64, f64) {
    let vals = p.series.iter().flat_map(|s| s.values.iter().flatten());
    let lo = vals.clone().copied().fold(f64::INFINITY, f64::min);
    let hi = vals.copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// The y range of a line panel: its fixed range (with a little headroom) or the data's, padded,
/// from 0 when every value is non-negative.
fn y_extent(p: &LinePanel) -> (f64, f64) {
    match p.y_range {
        // A little headroom so that a line at the top of a fixed range stays visible.
        Some((lo, hi)) => (lo, hi + (hi - lo) * 0.04),
        None => {
            let (lo, hi) = data_range(p);
            if !lo.is_finite() {
                (0.0, 1.0)
            } else if hi - lo < 1e-9 {
                let pad = 0.5_f64.max(hi.abs() * 0.1);
                (
                    (lo - pad).min(if lo >= 0.0 { 0.0 } else { lo - pad }),
                    hi + pad,
                )
            } else {
                let pad = (hi - lo) * 0.08;
                (if lo >= 0.0 { 0.0 } else { lo - pad }, hi + pad)
            }
        }
    }
}

/// Most points drawn with a dot each.
const MAX_DOTS: usize = 40;

/// The y range of a training-curve panel: the data's, padded, from 0 when every value is
/// non-negative; a constant series (a learning rate) gets half its value of room on each side.
fn step_y_extent(p: &LinePanel) -> (f64, f64) {
    let (lo, hi) = data_range(p);
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    let pad = if hi - lo <= 1e-12 * hi.abs().max(lo.abs()) {
        if hi == 0.0 {
            1.0
        } else {
            hi.abs().max(lo.abs()) * 0.5
        }
    } else {
        (hi - lo) * 0.08
    };
    (if lo >= 0.0 { 0.0 } else { lo - pad }, hi + pad)
}

/// The x range of a panel and its number of tick labels.
fn x_extent(xs: &[f64], axis: XAxis) -> (f64, f64, usize) {
    match axis {
        XAxis::Iterations => {
            let xmin = xs.first().copied().unwrap_or(0.0);
            let xmax = xs.last().copied().unwrap_or(0.0).max(xmin);
            // A margin of 3% of the span (at least 0.3) keeps the end points off the frame.
            let pad = ((xmax - xmin) * 0.03).max(0.3);
            // One label per whole number when the span is short, else about 12 round ones.
            let n_labels = ((xmax - xmin) as usize + 1).clamp(2, 12);
            (xmin - pad, xmax + pad, n_labels)
        }
        XAxis::Steps => {
            let xlo = xs.iter().copied().fold(f64::INFINITY, f64::min);
            let xhi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if !xlo.is_finite() {
                (0.0, 1.0, 8)
            } else if xhi - xlo < 1.0 {
                (xlo - 1.0, xhi + 1.0, 8)
            } else {
                let pad = (xhi - xlo) * 0.03;
                (xlo - pad, xhi + pad, 8)
            }
        }
    }
}

/// One panel of lines aligned with `xs`, a legend strip below it. Consecutive runs of values
/// become separate lines (`None` breaks a line). Against iterations every value gets a dot and a
/// lone value a zero-length line too; against steps, dots only while there are few points, and on
/// a lone value.
fn draw_line_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &LinePanel,
    x_label: &str,
    xs: &[f64],
    axis: XAxis,
) -> Result<()> {
    let steps = axis == XAxis::Steps;
    let (ylo, yhi) = if steps { step_y_extent(p) } else { y_extent(p) };
    let ydec = decimals_for(yhi - ylo);
    // Scientific labels for a panel of very small or very large values (a learning rate).
    let sci = steps && !(1e-2..1e5).contains(&yhi.abs().max(ylo.abs()));
    let (xlo, xhi, n_labels) = x_extent(xs, axis);
    // Whole numbers only (iterations are never negative).
    let x_fmt = |v: &f64| {
        let r = v.round();
        if (v - r).abs() < 1e-6 && (steps || r >= 0.0) {
            format!("{r:.0}")
        } else {
            String::new()
        }
    };
    let y_fmt = |v: &f64| {
        if steps && v.abs() <= (yhi - ylo) * 1e-9 {
            "0".to_string()
        } else if sci {
            format!("{v:.1e}")
        } else {
            format!("{v:.ydec$}")
        }
    };
    let frame = Axes::panel(
        (&p.title, 16),
        if steps { 70 } else { 60 },
        (xlo..xhi, ylo..yhi),
        (n_labels, 6),
        (&x_fmt, &y_fmt),
        (x_label, &p.y_label),
    );
    let (dot, every_dot) = if steps {
        (3, xs.len() <= MAX_DOTS)
    } else {
        (4, true)
    };
    let (chart_area, foot) = area.split_vertically(area.dim_in_pixel().1 as i32 - 50);
    let mut chart = axes(&chart_area, &frame)?;
    let mut legend = Vec::new();
    for (k, s) in p.series.iter().enumerate() {
        let color = SERIES[k % SERIES.len()];
        let style = ShapeStyle::from(&color).stroke_width(2);
        legend.push((Mark::Line(style), s.name.clone()));
        let mut runs: Vec<Vec<(f64, f64)>> = vec![vec![]];
        for (x, v) in xs.iter().zip(&s.values) {
            match (v, runs.last_mut()) {
                (Some(v), Some(r)) => r.push((*x, *v)),
                _ => runs.push(vec![]),
            }
        }
        for run in runs.into_iter().filter(|r| !r.is_empty()) {
            let lone = run.len() == 1;
            let dot = if every_dot || lone { dot } else { 0 };
            let line = (!steps || !lone, style);
            polyline(&mut chart, &run, line, (dot, color.filled()))?;
        }
    }
    legend_strip(&foot, &legend)
}
