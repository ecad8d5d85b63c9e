//! Figures of the report, drawn with plotters on its SVG and bitmap backends from one drawing
//! function per figure, so the SVG and the PNG show the same thing.
//!
//! Design decisions:
//! - **No system libraries.** plotters is built without its `ttf` feature (which needs
//!   fontconfig/freetype); text goes through its `ab_glyph` support with DejaVu Sans embedded in
//!   the binary (`include_bytes!`, Bitstream Vera licence, see `DejaVuSans.LICENSE`), registered
//!   once under the family names `sans-serif`, `serif` and `monospace`.
//! - **Deterministic output.** The SVG text depends only on the inputs (integer pixel coordinates,
//!   layouts measured with the embedded font, values formatted with fixed precision), so it is
//!   tested against a golden file; the PNG is rendered from the same calls.
//! - **Atomic files.** PNGs are rendered to a temporary file in the target folder whose name still
//!   ends in `.png` (the encoder picks the format by extension) and renamed into place.
//! - Figures are plain data structs implementing [`Figure`]; the report code fills them, this
//!   module only draws. Empty inputs draw an empty frame with a note, never an error.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use super::metrics::{self, Bin, BinRule};
use super::probe::ProbeCut;

/// DejaVu Sans (Bitstream Vera licence, `src/report/DejaVuSans.LICENSE`).
pub static FONT: &[u8] = include_bytes!("DejaVuSans.ttf");

/// Register the embedded font with plotters (idempotent, thread-safe).
pub fn register_font() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        for family in ["sans-serif", "serif", "monospace"] {
            plotters::style::register_font(family, FontStyle::Normal, FONT)
                .map_err(|_| "the embedded font DejaVuSans.ttf cannot be parsed".to_string())?;
        }
        Ok(())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// Map plotters' errors (generic over the backend) into anyhow.
trait Pe<T> {
    fn pe(self) -> Result<T>;
}
impl<T, E: std::fmt::Display> Pe<T> for std::result::Result<T, E> {
    fn pe(self) -> Result<T> {
        self.map_err(|e| anyhow!("drawing failed: {e}"))
    }
}

/// A figure drawable on any plotters backend.
pub trait Figure {
    /// Pixel size (width, height).
    fn size(&self) -> (u32, u32);
    /// Draw onto `root` (which has exactly [`Figure::size`]).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()>;
}

/// Render a figure as SVG text.
pub fn to_svg(fig: &impl Figure) -> Result<String> {
    register_font()?;
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, fig.size()).into_drawing_area();
        fig.draw(&root)?;
        root.present().pe()?;
    }
    Ok(s)
}

/// Render a figure as a PNG file at `path`, atomically (temp file + rename).
pub fn write_png(fig: &impl Figure, path: &Path) -> Result<()> {
    register_font()?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("figure.png");
    // `.NAME.rlcr-tmp-PID.png`: the encoder needs the extension; stale ones of killed runs go.
    let prefix = format!(".{name}.rlcr-tmp-");
    crate::fs::remove_stale(dir, &prefix, ".png");
    let tmp = dir.join(format!("{prefix}{}.png", std::process::id()));
    let res = (|| -> Result<()> {
        let root = BitMapBackend::new(&tmp, fig.size()).into_drawing_area();
        fig.draw(&root)?;
        root.present().pe()?;
        Ok(())
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("rendering {}", path.display())));
    }
    crate::fs::slow_write_hook();
    std::fs::rename(&tmp, path)
        .with_context(|| format!("moving the rendered PNG to {}", path.display()))
}

/// Render an SVG and write it atomically.
pub fn write_svg(fig: &impl Figure, path: &Path) -> Result<()> {
    let s = to_svg(fig)?;
    crate::fs::write_atomic(path, s.as_bytes())
}

// ---------------------------------------------------------------------------------------------
// Style

/// Colours (the matplotlib "tab10" palette, familiar to readers of ML papers).
pub mod palette {
    use plotters::style::RGBColor;
    /// Blue.
    pub const BLUE: RGBColor = RGBColor(31, 119, 180);
    /// Orange.
    pub const ORANGE: RGBColor = RGBColor(255, 127, 14);
    /// Green.
    pub const GREEN: RGBColor = RGBColor(44, 160, 44);
    /// Red.
    pub const RED: RGBColor = RGBColor(214, 39, 40);
    /// Purple.
    pub const PURPLE: RGBColor = RGBColor(148, 103, 189);
    /// Brown.
    pub const BROWN: RGBColor = RGBColor(140, 86, 75);
    /// Pink.
    pub const PINK: RGBColor = RGBColor(227, 119, 194);
    /// Grey.
    pub const GREY: RGBColor = RGBColor(127, 127, 127);
    /// Olive.
    pub const OLIVE: RGBColor = RGBColor(188, 189, 34);
    /// Cyan.
    pub const CYAN: RGBColor = RGBColor(23, 190, 207);
    /// Dark text.
    pub const INK: RGBColor = RGBColor(33, 33, 33);
    /// Secondary text.
    pub const MUTED: RGBColor = RGBColor(100, 100, 100);
    /// Grid lines.
    pub const GRID: RGBColor = RGBColor(228, 228, 228);
    /// Series colours in order.
    pub const SERIES: [RGBColor; 10] = [
        BLUE, ORANGE, GREEN, RED, PURPLE, BROWN, PINK, GREY, OLIVE, CYAN,
    ];
}
use palette as pal;
use palette::{GREY, GRID, INK, MUTED, PURPLE, SERIES};

const FONT_FAMILY: &str = "sans-serif";

/// A title band: a title line and an optional muted subtitle, centred.
fn title_band<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
) -> Result<()> {
    let (w, h) = area.dim_in_pixel();
    let cx = (w / 2) as i32;
    let title_style = (FONT_FAMILY, 22)
        .into_font()
        .color(&INK)
        .pos(Pos::new(HPos::Center, VPos::Center));
    let sub_style = (FONT_FAMILY, 14)
        .into_font()
        .color(&MUTED)
        .pos(Pos::new(HPos::Center, VPos::Center));
    if subtitle.is_empty() {
        area.draw(&Text::new(
            title.to_string(),
            (cx, h as i32 / 2),
            title_style,
        ))
        .pe()?;
    } else {
        area.draw(&Text::new(
            title.to_string(),
            (cx, h as i32 / 2 - 11),
            title_style,
        ))
        .pe()?;
        area.draw(&Text::new(
            subtitle.to_string(),
            (cx, h as i32 / 2 + 14),
            sub_style,
        ))
        .pe()?;
    }
    Ok(())
}

/// `0.123` with `d` decimals, or "–" for `None`.
pub fn fmt_opt(v: Option<f64>, d: usize) -> String {
    match v {
        Some(v) => format!("{v:.d$}"),
        None => "–".to_string(),
    }
}

/// A note in the middle of an empty panel.
fn empty_note<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, note: &str) -> Result<()> {
    let (w, h) = area.dim_in_pixel();
    let style = (FONT_FAMILY, 15)
        .into_font()
        .color(&MUTED)
        .pos(Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new(
        note.to_string(),
        (w as i32 / 2, h as i32 / 2),
        style,
    ))
    .pe()
}

/// A legend entry's symbol.
#[derive(Clone, Copy, Debug)]
enum Mark {
    /// A filled box.
    Swatch(ShapeStyle),
    /// A solid line.
    Line(ShapeStyle),
    /// A dashed line.
    Dashed(ShapeStyle),
    /// A dot.
    Dot(ShapeStyle),
    /// A box with diagonal hatching (fill style, line style).
    Hatch(ShapeStyle, ShapeStyle),
}

/// Height of a legend strip with `rows` rows.
const LEGEND_ROW: i32 = 22;

/// A legend laid out in centred rows below a chart, so it never covers data. Items wrap to a new
/// row when the width runs out.
fn legend_strip<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    items: &[(Mark, String)],
) -> Result<()> {
    let font = (FONT_FAMILY, 13)
        .into_font()
        .color(&INK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    let (w, h) = area.dim_in_pixel();
    let (sym, gap) = (24, 22);
    let mut widths = Vec::with_capacity(items.len());
    for (_, t) in items {
        let (tw, _) = area.estimate_text_size(t, &font).pe()?;
        widths.push(sym + 6 + tw as i32 + gap);
    }
    let mut rows: Vec<Vec<usize>> = vec![vec![]];
    let mut cur = 0;
    for (i, &iw) in widths.iter().enumerate() {
        let full = rows.last().is_some_and(|r| !r.is_empty()) && cur + iw - gap > w as i32 - 16;
        if full {
            rows.push(vec![]);
            cur = 0;
        }
        if let Some(r) = rows.last_mut() {
            r.push(i);
        }
        cur += iw;
    }
    let top = (h as i32 - rows.len() as i32 * LEGEND_ROW) / 2 + LEGEND_ROW / 2;
    for (r, row) in rows.iter().enumerate() {
        let total: i32 = row.iter().map(|&i| widths[i]).sum::<i32>() - gap;
        let mut x = (w as i32 - total) / 2;
        let y = top + r as i32 * LEGEND_ROW;
        for &i in row {
            let (mark, text) = &items[i];
            match *mark {
                Mark::Swatch(st) => area
                    .draw(&Rectangle::new([(x, y - 7), (x + sym, y + 7)], st))
                    .pe()?,
                Mark::Line(st) => area
                    .draw(&PathElement::new(vec![(x, y), (x + sym, y)], st))
                    .pe()?,
                Mark::Dashed(st) => area
                    .draw(&plotters::element::DashedPathElement::new(
                        vec![(x, y), (x + sym, y)],
                        6,
                        4,
                        st,
                    ))
                    .pe()?,
                Mark::Dot(st) => area.draw(&Circle::new((x + sym / 2, y), 5, st)).pe()?,
                Mark::Hatch(fill, line) => {
                    area.draw(&Rectangle::new([(x, y - 7), (x + sym, y + 7)], fill))
                        .pe()?;
                    hatch(area, (x, y - 7), (x + sym, y + 7), line, 5)?;
                    area.draw(&Rectangle::new([(x, y - 7), (x + sym, y + 7)], line))
                        .pe()?;
                }
            }
            area.draw(&Text::new(text.clone(), (x + sym + 6, y), font.clone()))
                .pe()?;
            x += widths[i];
        }
    }
    Ok(())
}

/// Diagonal hatching (lines `x − y = c`, `spacing` pixels apart) inside the pixel rectangle with
/// corners `a` and `b`.
fn hatch<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    a: (i32, i32),
    b: (i32, i32),
    style: ShapeStyle,
    spacing: i32,
) -> Result<()> {
    let (x0, x1) = (a.0.min(b.0), a.0.max(b.0));
    let (y0, y1) = (a.1.min(b.1), a.1.max(b.1));
    let mut c = x0 - y1 + spacing / 2;
    while c < x1 - y0 {
        let lo = y0.max(x0 - c);
        let hi = y1.min(x1 - c);
        if lo < hi {
            area.draw(&PathElement::new(vec![(lo + c, lo), (hi + c, hi)], style))
                .pe()?;
        }
        c += spacing.max(2);
    }
    Ok(())
}

/// A sample count in at most five characters: `987`, `9876`, `98.8k`, `988k`, `1.23M`.
pub fn compact_count(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=99_949 => format!("{:.1}k", n as f64 / 1e3),
        99_950..=999_499 => format!("{:.0}k", n as f64 / 1e3),
        _ => format!("{:.2}M", n as f64 / 1e6),
    }
}

/// Decimals for axis labels over a range of width `span`.
fn decimals_for(span: f64) -> usize {
    if span >= 20.0 {
        0
    } else if span >= 2.0 {
        1
    } else {
        2
    }
}

// ---------------------------------------------------------------------------------------------
// Reliability diagram

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
        root.fill(&WHITE).pe()?;
        let (head, rest) = root.split_vertically(76);
        let (body, foot) = rest.split_vertically(rest.dim_in_pixel().1 as i32 - 40);
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
        title_band(&head, &title, &sub)?;

        let mut chart = ChartBuilder::on(&body)
            .margin_left(12)
            .margin_right(28)
            .margin_top(8)
            .x_label_area_size(52)
            .y_label_area_size(62)
            .build_cartesian_2d(0f64..1f64, 0f64..1.08f64)
            .pe()?;
        chart
            .configure_mesh()
            .x_labels(11)
            .y_labels(11)
            .x_label_formatter(&|v| format!("{v:.1}"))
            .y_label_formatter(&|v| format!("{v:.1}"))
            .x_desc("Stated confidence")
            .y_desc("Accuracy")
            .axis_desc_style((FONT_FAMILY, 17).into_font().color(&INK))
            .label_style((FONT_FAMILY, 14).into_font().color(&INK))
            .bold_line_style(GRID)
            .light_line_style(TRANSPARENT)
            .axis_style(MUTED)
            .draw()
            .pe()?;

        let bar = pal::BLUE.mix(0.8).filled();
        let gap_fill = pal::RED.mix(0.12).filled();
        let gap_line = ShapeStyle::from(&pal::RED.mix(0.85)).stroke_width(1);
        let diag = ShapeStyle::from(&MUTED).stroke_width(2);
        let filled: Vec<&Bin> = self.bins.iter().filter(|b| b.count > 0).collect();
        // Bars at the bins' accuracy, separated by thin white edges.
        for style in [bar, ShapeStyle::from(&WHITE).stroke_width(1)] {
            chart
                .draw_series(filled.iter().filter_map(|b| {
                    Some(Rectangle::new(
                        [(b.lower, 0.0), (b.upper, b.accuracy?)],
                        style,
                    ))
                }))
                .pe()?;
        }
        // The gap between accuracy and mean confidence: light fill, hatching and an outline, so
        // it reads the same over the bar (under-confident bins) and above it (over-confident).
        chart
            .draw_series(filled.iter().filter_map(|b| {
                Some(Rectangle::new(
                    [(b.lower, b.accuracy?), (b.upper, b.mean_confidence?)],
                    gap_fill,
                ))
            }))
            .pe()?;
        // backend_coord is in the backend's pixels, root.draw in root's: they differ when the
        // diagram is one panel of a larger figure (report::compare::Grid).
        let base = root.get_base_pixel();
        let rel = |(x, y): (i32, i32)| (x - base.0, y - base.1);
        for b in &filled {
            if let (Some(acc), Some(conf)) = (b.accuracy, b.mean_confidence) {
                let p = rel(chart.backend_coord(&(b.lower, acc)));
                let q = rel(chart.backend_coord(&(b.upper, conf)));
                hatch(root, p, q, gap_line, 7)?;
            }
        }
        chart
            .draw_series(filled.iter().filter_map(|b| {
                Some(Rectangle::new(
                    [(b.lower, b.accuracy?), (b.upper, b.mean_confidence?)],
                    gap_line,
                ))
            }))
            .pe()?;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, 0.0), (1.0, 1.0)],
                8,
                6,
                diag,
            ))
            .pe()?;
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
        root.fill(&WHITE).pe()?;
        let (head, body) = root.split_vertically(60);
        title_band(&head, &self.title, "")?;
        for (area, p) in body.split_evenly(self.grid).iter().zip(&self.panels) {
            draw_hist_panel(area, p)?;
        }
        Ok(())
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
    let color = SERIES[p.color % SERIES.len()];
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT_FAMILY, 15).into_font().color(&INK))
        .margin(14)
        .margin_right(24)
        .x_label_area_size(44)
        .y_label_area_size(58)
        .build_cartesian_2d(lo..hi, 0f64..top)
        .pe()?;
    let int = p.integer;
    chart
        .configure_mesh()
        .x_labels(n_xlabels)
        .y_labels(n_ylabels)
        .x_label_formatter(&|v| {
            if int {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        })
        .y_label_formatter(&|v| {
            if (v - v.round()).abs() < 1e-9 {
                format!("{v:.0}")
            } else {
                String::new()
            }
        })
        .x_desc(p.x_label.as_str())
        .y_desc("Rows")
        .axis_desc_style((FONT_FAMILY, 14).into_font().color(&INK))
        .label_style((FONT_FAMILY, 12).into_font().color(&INK))
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(MUTED)
        .draw()
        .pe()?;
    let ymax = top;
    chart
        .draw_series(
            counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| {
                    let x0 = lo + w * i as f64;
                    Rectangle::new([(x0, 0.0), (x0 + w, c as f64)], color.mix(0.8).filled())
                }),
        )
        .pe()?;
    chart
        .draw_series(
            counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| {
                    let x0 = lo + w * i as f64;
                    Rectangle::new(
                        [(x0, 0.0), (x0 + w, c as f64)],
                        ShapeStyle::from(&WHITE).stroke_width(1),
                    )
                }),
        )
        .pe()?;
    if let Some(m) = mean {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(m, 0.0), (m, ymax)],
                6,
                4,
                ShapeStyle::from(&INK).stroke_width(1),
            ))
            .pe()?;
    }
    if p.values.is_empty() {
        empty_note(area, "no rows")?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Line charts (metrics against iteration)

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

/// Panels of line charts over a shared x axis of whole numbers (iterations, which need not be
/// evenly spaced: evaluations every few iterations).
#[derive(Clone, Debug, PartialEq)]
pub struct LineCharts {
    /// Title.
    pub title: String,
    /// x-axis label.
    pub x_label: String,
    /// The x value of each position (the series' values are aligned with them), increasing.
    pub xs: Vec<f64>,
    /// Panels, row-major.
    pub panels: Vec<LinePanel>,
    /// Grid (rows, cols).
    pub grid: (usize, usize),
}

impl Figure for LineCharts {
    fn size(&self) -> (u32, u32) {
        (600 * self.grid.1 as u32, 60 + 420 * self.grid.0 as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        root.fill(&WHITE).pe()?;
        let (head, body) = root.split_vertically(60);
        title_band(&head, &self.title, "")?;
        for (area, p) in body.split_evenly(self.grid).iter().zip(&self.panels) {
            draw_line_panel(area, p, &self.x_label, &self.xs)?;
        }
        Ok(())
    }
}

/// The y range of a line panel: its fixed range (with a little headroom) or the data's, padded,
/// from 0 when every value is non-negative.
fn y_extent(p: &LinePanel) -> (f64, f64) {
    match p.y_range {
        // A little headroom so that a line at the top of a fixed range stays visible.
        Some((lo, hi)) => (lo, hi + (hi - lo) * 0.04),
        None => {
            let vals: Vec<f64> = p
                .series
                .iter()
                .flat_map(|s| s.values.iter().flatten().copied())
                .collect();
            let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
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

fn draw_line_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &LinePanel,
    x_label: &str,
    xs: &[f64],
) -> Result<()> {
    let (chart_area, foot) = area.split_vertically(area.dim_in_pixel().1 as i32 - 50);
    let (ylo, yhi) = y_extent(p);
    let ydec = decimals_for(yhi - ylo);
    let xmin = xs.first().copied().unwrap_or(0.0);
    let xmax = xs.last().copied().unwrap_or(0.0).max(xmin);
    // A margin of 3% of the span (at least 0.3) keeps the end points off the frame.
    let pad = ((xmax - xmin) * 0.03).max(0.3);
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(p.title.as_str(), (FONT_FAMILY, 16).into_font().color(&INK))
        .margin(14)
        .margin_right(24)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(xmin - pad..xmax + pad, ylo..yhi)
        .pe()?;
    // One label per whole number when the span is short, else about 12 round ones.
    let n_labels = ((xmax - xmin) as usize + 1).clamp(2, 12);
    chart
        .configure_mesh()
        .x_labels(n_labels)
        .y_labels(6)
        // Whole numbers only (iterations).
        .x_label_formatter(&|v| {
            let r = v.round();
            if (v - r).abs() < 1e-6 && r >= 0.0 {
                format!("{r:.0}")
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| format!("{v:.ydec$}"))
        .x_desc(x_label)
        .y_desc(p.y_label.as_str())
        .axis_desc_style((FONT_FAMILY, 14).into_font().color(&INK))
        .label_style((FONT_FAMILY, 12).into_font().color(&INK))
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(MUTED)
        .draw()
        .pe()?;
    let mut legend = Vec::new();
    for (k, s) in p.series.iter().enumerate() {
        let color = SERIES[k % SERIES.len()];
        let style = ShapeStyle::from(&color).stroke_width(2);
        legend.push((Mark::Line(style), s.name.clone()));
        // Consecutive runs of values become separate lines; a lone value is a dot.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![vec![]];
        for (x, v) in xs.iter().zip(&s.values) {
            match (v, runs.last_mut()) {
                (Some(v), Some(r)) => r.push((*x, *v)),
                _ => runs.push(vec![]),
            }
        }
        for run in runs.into_iter().filter(|r| !r.is_empty()) {
            chart
                .draw_series(LineSeries::new(run.clone(), style))
                .pe()?;
            chart
                .draw_series(run.iter().map(|&pt| Circle::new(pt, 4, color.filled())))
                .pe()?;
        }
    }
    legend_strip(&foot, &legend)
}

/// Panels of line charts over a numeric x axis (training curves against the global step). A
/// series' values are aligned with `steps`; `None` breaks the line. Points get dots only when
/// there are few of them.
#[derive(Clone, Debug, PartialEq)]
pub struct StepCharts {
    /// Title.
    pub title: String,
    /// x-axis label.
    pub x_label: String,
    /// The x value of each position.
    pub steps: Vec<f64>,
    /// Panels, row-major.
    pub panels: Vec<LinePanel>,
    /// Grid (rows, cols).
    pub grid: (usize, usize),
}

/// Most points drawn with a dot each.
const MAX_DOTS: usize = 40;

impl Figure for StepCharts {
    fn size(&self) -> (u32, u32) {
        (520 * self.grid.1 as u32, 60 + 400 * self.grid.0 as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        root.fill(&WHITE).pe()?;
        let (head, body) = root.split_vertically(60);
        title_band(&head, &self.title, "")?;
        for (area, p) in body.split_evenly(self.grid).iter().zip(&self.panels) {
            draw_step_panel(area, p, &self.x_label, &self.steps)?;
        }
        Ok(())
    }
}

/// The y range of a training-curve panel: the data's, padded, from 0 when every value is
/// non-negative; a constant series (a learning rate) gets half its value of room on each side.
fn step_y_extent(p: &LinePanel) -> (f64, f64) {
    let vals: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.values.iter().flatten().copied())
        .collect();
    let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
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

fn draw_step_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &LinePanel,
    x_label: &str,
    steps: &[f64],
) -> Result<()> {
    let (chart_area, foot) = area.split_vertically(area.dim_in_pixel().1 as i32 - 50);
    let (ylo, yhi) = step_y_extent(p);
    let ydec = decimals_for(yhi - ylo);
    // Scientific labels for a panel of very small or very large values (a learning rate).
    let top = yhi.abs().max(ylo.abs());
    let sci = !(1e-2..1e5).contains(&top);
    let xlo = steps.iter().copied().fold(f64::INFINITY, f64::min);
    let xhi = steps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (xlo, xhi) = if !xlo.is_finite() {
        (0.0, 1.0)
    } else if xhi - xlo < 1.0 {
        (xlo - 1.0, xhi + 1.0)
    } else {
        let pad = (xhi - xlo) * 0.03;
        (xlo - pad, xhi + pad)
    };
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(p.title.as_str(), (FONT_FAMILY, 16).into_font().color(&INK))
        .margin(14)
        .margin_right(24)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(xlo..xhi, ylo..yhi)
        .pe()?;
    chart
        .configure_mesh()
        .x_labels(8)
        .y_labels(6)
        .x_label_formatter(&|v| {
            let r = v.round();
            if (v - r).abs() < 1e-6 {
                format!("{r:.0}")
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| {
            if v.abs() <= (yhi - ylo) * 1e-9 {
                "0".to_string()
            } else if sci {
                format!("{v:.1e}")
            } else {
                format!("{v:.ydec$}")
            }
        })
        .x_desc(x_label)
        .y_desc(p.y_label.as_str())
        .axis_desc_style((FONT_FAMILY, 14).into_font().color(&INK))
        .label_style((FONT_FAMILY, 12).into_font().color(&INK))
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(MUTED)
        .draw()
        .pe()?;
    let mut legend = Vec::new();
    for (k, s) in p.series.iter().enumerate() {
        let color = SERIES[k % SERIES.len()];
        let style = ShapeStyle::from(&color).stroke_width(2);
        legend.push((Mark::Line(style), s.name.clone()));
        let mut runs: Vec<Vec<(f64, f64)>> = vec![vec![]];
        for (x, v) in steps.iter().zip(&s.values) {
            match (v, runs.last_mut()) {
                (Some(v), Some(r)) => r.push((*x, *v)),
                _ => runs.push(vec![]),
            }
        }
        let dots = steps.len() <= MAX_DOTS;
        for run in runs.into_iter().filter(|r| !r.is_empty()) {
            if run.len() > 1 {
                chart
                    .draw_series(LineSeries::new(run.clone(), style))
                    .pe()?;
            }
            if dots || run.len() == 1 {
                chart
                    .draw_series(run.iter().map(|&pt| Circle::new(pt, 3, color.filled())))
                    .pe()?;
            }
        }
    }
    legend_strip(&foot, &legend)
}

// ---------------------------------------------------------------------------------------------
// Probe curves

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
        root.fill(&WHITE).pe()?;
        let (head, rest) = root.split_vertically(76);
        let (body, foot) = rest.split_vertically(rest.dim_in_pixel().1 as i32 - 56);
        let n = self
            .samples_per_cut
            .map(|n| format!("N = {n} samples per cut · "))
            .unwrap_or_default();
        title_band(
            &head,
            "Probe: P(correct answer | thinking cut at fraction f)",
            &format!(
                "{n}{} rollouts · error bars ±1 s.e. across rollouts",
                self.rollouts
            ),
        )?;
        let mut chart = ChartBuilder::on(&body)
            .margin_left(12)
            .margin_right(28)
            .margin_top(8)
            .x_label_area_size(52)
            .y_label_area_size(62)
            .build_cartesian_2d(-0.02f64..1.02f64, 0f64..1.05f64)
            .pe()?;
        chart
            .configure_mesh()
            .x_labels(11)
            .y_labels(11)
            .x_label_formatter(&|v| format!("{v:.1}"))
            .y_label_formatter(&|v| format!("{v:.1}"))
            .x_desc("Fraction of thinking kept (cut point)")
            .y_desc("Probe confidence (correct / N)")
            .axis_desc_style((FONT_FAMILY, 16).into_font().color(&INK))
            .label_style((FONT_FAMILY, 13).into_font().color(&INK))
            .bold_line_style(GRID)
            .light_line_style(TRANSPARENT)
            .axis_style(MUTED)
            .draw()
            .pe()?;
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
            chart
                .draw_series(DashedLineSeries::new(vec![(0.0, a), (1.0, a)], 8, 6, st))
                .pe()?;
            legend.push((
                Mark::Dashed(st),
                format!("Accuracy of the answers ({a:.3})"),
            ));
        }
        if let Some(v) = self.mean_verbal {
            let st = ShapeStyle::from(&PURPLE).stroke_width(2);
            chart
                .draw_series(DashedLineSeries::new(vec![(0.0, v), (1.0, v)], 3, 4, st))
                .pe()?;
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
        chart.draw_series(LineSeries::new(all.clone(), main)).pe()?;
        chart
            .draw_series(all.iter().map(|&q| Circle::new(q, 4, pal::BLUE.filled())))
            .pe()?;
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
            chart.draw_series(LineSeries::new(p.clone(), st)).pe()?;
            chart
                .draw_series(p.iter().map(|&q| Circle::new(q, 3, color.filled())))
                .pe()?;
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
        root.fill(&WHITE).pe()?;
        let (head, rest) = root.split_vertically(76);
        let (body, foot) = rest.split_vertically(rest.dim_in_pixel().1 as i32 - 40);
        title_band(
            &head,
            "Probe vs verbal confidence vs correctness",
            &format!(
                "{} rollouts · probe at the last cut · Pearson r = {}",
                self.points.len(),
                fmt_opt(self.pearson, 3)
            ),
        )?;
        let mut chart = ChartBuilder::on(&body)
            .margin_left(12)
            .margin_right(28)
            .margin_top(8)
            .x_label_area_size(52)
            .y_label_area_size(62)
            .build_cartesian_2d(-0.02f64..1.02f64, -0.02f64..1.04f64)
            .pe()?;
        chart
            .configure_mesh()
            .x_labels(11)
            .y_labels(11)
            .x_label_formatter(&|v| format!("{v:.1}"))
            .y_label_formatter(&|v| format!("{v:.1}"))
            .x_desc("Verbal confidence (stated)")
            .y_desc("Probe confidence (correct / N)")
            .axis_desc_style((FONT_FAMILY, 16).into_font().color(&INK))
            .label_style((FONT_FAMILY, 13).into_font().color(&INK))
            .bold_line_style(GRID)
            .light_line_style(TRANSPARENT)
            .axis_style(MUTED)
            .draw()
            .pe()?;
        let diag = ShapeStyle::from(&MUTED).stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, 0.0), (1.0, 1.0)],
                8,
                6,
                diag,
            ))
            .pe()?;
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
            chart
                .draw_series(pts.iter().map(|&q| Circle::new(q, 5, st)))
                .pe()?;
            legend.push((Mark::Dot(st), name.to_string()));
        }
        legend_strip(&foot, &legend)?;
        if self.points.is_empty() {
            empty_note(&body, "no rollouts with a verbal confidence")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::probe::{scatter_points, summarize, tests as ptests, ProbeRows};

    const Y: [f64; 8] = [1., 0., 1., 1., 0., 1., 0., 1.];
    const C: [f64; 8] = [0.9, 0.8, 0.3, 0.75, 0.1, 1.0, 0.3, 0.0];

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/report")
            .join(name)
    }

    /// Compare with a golden file; `RLCR_BLESS=1` rewrites it.
    fn golden(name: &str, got: &str) {
        let path = fixture(name);
        if std::env::var_os("RLCR_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, got).expect("bless");
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{}: {e} (run with RLCR_BLESS=1 to create)", path.display())
        });
        assert!(
            want == got,
            "{} differs from the rendered SVG (RLCR_BLESS=1 to update after checking the PNG)",
            path.display()
        );
    }

    fn anchor_diagram() -> Reliability {
        let bins = metrics::reliability_bins(&C, &Y, 10, BinRule::Rlcr);
        Reliability::new(bins, BinRule::Rlcr, "", "Brier 0.2878 · AUROC 0.6333")
    }

    #[test]
    fn reliability_svg_is_deterministic_and_golden() {
        let fig = anchor_diagram();
        let a = to_svg(&fig).expect("svg");
        let b = to_svg(&fig).expect("svg");
        assert_eq!(a, b);
        assert!(a.contains("ECE = 0.331"), "title carries ECE");
        assert!(a.contains("\n2\n</text>"), "counts above bars");
        golden("reliability_anchor.svg", &a);
    }

    /// The training-curves figure of a small run: eight panels against the global step, a gap
    /// where a value is `"nan"`, the skipped step left out, the once-per-call figures (KL to the
    /// reference, rollout/trainer mismatch) as points on the first step of each of three calls.
    #[test]
    fn training_curves_svg_is_golden() {
        let mut lines = String::new();
        for step in 1..=12u32 {
            let x = step as f64;
            let grad = if step == 5 {
                "\"nan\"".to_string()
            } else {
                format!("{}", 2.0 / x)
            };
            lines += &format!(
                "{{\"step\":{step},\"loss\":{},\"pg_loss\":{},\"kl_loss\":{},\"approx_kl\":{},\
                 \"clip_frac_low\":{},\"clip_frac_high\":{},\"clip_frac_dual\":0,\"entropy\":{},\
                 \"confidence_entropy\":{},\"grad_norm\":{grad},\"lr\":0.001,\"skipped\":false,\
                 \"stage\":\"update\",\"epoch\":0,\"mini_batch\":{},\"response_length\":{},\
                 \"confidence_length\":{}{}}}\n",
                1.0 / x,
                0.9 / x,
                0.01 * x,
                0.002 * x,
                0.05 * (x % 3.0),
                0.02 * (x % 4.0),
                2.0 - 0.05 * x,
                1.5 - 0.04 * x,
                (step - 1) % 4,
                20.0 + x,
                6.0 + (x % 2.0),
                if step % 4 == 1 {
                    format!(
                        ",\"ref_kl\":{},\"mismatch/logp_max\":{},\"mismatch/logp_mean\":{},\
                         \"mismatch/ratio_max\":{}",
                        0.001 * x,
                        2e-6 * x,
                        1e-6 * x,
                        2e-6 * x
                    )
                } else {
                    String::new()
                },
            );
        }
        lines += "{\"step\":12,\"loss\":\"nan\",\"skipped\":true,\"stage\":\"update\"}\n";
        let c = crate::report::training::parse(&lines, "train_metrics.jsonl").expect("parse");
        assert_eq!((c.steps.len(), c.skipped), (12, 1));
        assert_eq!(crate::report::training::per_call(&c).len(), 3);
        let fig = crate::report::training::figure(&c);
        let a = to_svg(&fig).expect("svg");
        assert_eq!(a, to_svg(&fig).expect("svg"));
        for t in [
            "Training curves (update)",
            "Gradient norm",
            "Clip fractions",
            "global optimizer step",
            "Rollout/trainer mismatch (before the first step)",
            "Response length",
        ] {
            assert!(a.contains(t), "{t}");
        }
        golden("training_curves.svg", &a);
        if let Some(keep) = std::env::var_os("RLCR_PLOT_DIR") {
            write_png(&fig, &std::path::Path::new(&keep).join("training.png")).expect("png");
        }
    }

    #[test]
    fn renders_every_figure_to_png() {
        let dir = tempfile::tempdir().expect("tmp");
        let fig = anchor_diagram();
        let p = dir.path().join("reliability.png");
        write_png(&fig, &p).expect("png");
        let bytes = std::fs::read(&p).expect("read");
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // Empty table still draws.
        let empty = Reliability::new(
            metrics::reliability_bins(&[], &[], 10, BinRule::Floor),
            BinRule::Floor,
            "",
            "",
        );
        write_png(&empty, &dir.path().join("empty.png")).expect("png");
        to_svg(&empty).expect("svg");

        let hist = Histograms {
            title: "Rewards and lengths by turn".into(),
            grid: (2, 2),
            panels: vec![
                HistPanel {
                    title: "Answer reward".into(),
                    x_label: "reward".into(),
                    values: vec![0.0, 1.0, 1.0, 0.1],
                    integer: false,
                    color: 0,
                },
                HistPanel {
                    title: "Confidence reward".into(),
                    x_label: "reward".into(),
                    values: vec![0.99, 0.91, 0.64, 0.0],
                    integer: false,
                    color: 1,
                },
                HistPanel {
                    title: "Answer length".into(),
                    x_label: "tokens".into(),
                    values: (0..200).map(|i| (i % 97) as f64).collect(),
                    integer: true,
                    color: 0,
                },
                HistPanel {
                    title: "Confidence length".into(),
                    x_label: "tokens".into(),
                    values: vec![],
                    integer: true,
                    color: 1,
                },
            ],
        };
        write_png(&hist, &dir.path().join("hist.png")).expect("png");
        let lines = LineCharts {
            title: "Metrics by iteration".into(),
            x_label: "iteration".into(),
            xs: vec![0.0, 5.0, 10.0],
            grid: (1, 2),
            panels: vec![
                LinePanel {
                    title: "Calibration".into(),
                    y_label: "value".into(),
                    y_range: Some((0.0, 1.0)),
                    series: vec![
                        Series {
                            name: "accuracy".into(),
                            values: vec![Some(0.2), Some(0.4), Some(0.5)],
                        },
                        Series {
                            name: "ECE".into(),
                            values: vec![Some(0.3), None, Some(0.1)],
                        },
                    ],
                },
                LinePanel {
                    title: "Length".into(),
                    y_label: "tokens".into(),
                    y_range: None,
                    series: vec![Series {
                        name: "answers".into(),
                        values: vec![Some(100.0), Some(80.0), Some(90.0)],
                    }],
                },
            ],
        };
        write_png(&lines, &dir.path().join("lines.png")).expect("png");
        let p = ProbeRows::from_batches([&ptests::probe_batch(&ptests::sample())]).expect("probe");
        let s = summarize(&p, 10, BinRule::Floor);
        let curve = ProbeCurve {
            cuts: s.cuts.clone(),
            mean_verbal: s.verbal.mean,
            accuracy: s.accuracy,
            samples_per_cut: Some(50),
            rollouts: s.rollouts,
        };
        write_png(&curve, &dir.path().join("curve.png")).expect("png");
        let sc = ProbeScatter {
            points: scatter_points(&p),
            pearson: s.pearson_final_probe_verbal,
        };
        write_png(&sc, &dir.path().join("scatter.png")).expect("png");
        if let Some(keep) = std::env::var_os("RLCR_PLOT_DIR") {
            // Manual inspection: copy the PNGs somewhere visible.
            for f in [
                "reliability.png",
                "empty.png",
                "hist.png",
                "lines.png",
                "curve.png",
                "scatter.png",
            ] {
                let _ = std::fs::copy(dir.path().join(f), std::path::Path::new(&keep).join(f));
            }
        }
    }

    #[test]
    fn compact_counts() {
        let got: Vec<String> = [
            0, 9_999, 10_000, 99_949, 99_950, 116_528, 999_499, 999_500, 1_234_567,
        ]
        .iter()
        .map(|&n| compact_count(n))
        .collect();
        assert_eq!(
            got,
            ["0", "9999", "10.0k", "99.9k", "100k", "117k", "999k", "1.00M", "1.23M"]
        );
    }

    #[test]
    fn hist_layout_by_hand() {
        // Integer: max 61 → w = ceil(62/30) = 3; bins 0..=20; 61/3 = 20.
        let (lo, w, c) = hist_layout(&[0.0, 2.0, 3.0, 61.0], true);
        assert_eq!((lo, w, c.len()), (0.0, 3.0, 21));
        assert_eq!((c[0], c[1], c[20]), (2, 1, 1));
        // Real: [0, 1] with 20 bins; 0.1 → bin 2, 1.0 → bin 19.
        let (lo, w, c) = hist_layout(&[0.0, 0.1, 1.0], false);
        assert_eq!((lo, c.len()), (0.0, 20));
        assert!((w - 0.05).abs() < 1e-15);
        assert_eq!((c[0], c[2], c[19]), (1, 1, 1));
    }
}
