//! What every chart of the report shares: the palette, the title band, the legend strip, the
//! hatching, and [`Axes`], the description of a chart's frame from which [`axes`] builds the
//! plotters chart. A figure is then only its data, its labels and the marks it draws.

use std::ops::Range;

use anyhow::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::Pe;

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
use palette::{GRID, INK, MUTED};

pub(super) const FONT_FAMILY: &str = "sans-serif";

/// A title band: a title line and an optional muted subtitle, centred.
pub(super) fn title_band<DB: DrawingBackend>(
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
pub(super) fn empty_note<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    note: &str,
) -> Result<()> {
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
pub(super) enum Mark {
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
pub(super) fn legend_strip<DB: DrawingBackend>(
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
pub(super) fn hatch<DB: DrawingBackend>(
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
pub(super) fn decimals_for(span: f64) -> usize {
    if span >= 20.0 {
        0
    } else if span >= 2.0 {
        1
    } else {
        2
    }
}

/// A chart over two `f64` axes.
pub(super) type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A `{v:.1}` tick label (the axes of probabilities).
pub(super) fn tenths(v: &f64) -> String {
    format!("{v:.1}")
}

/// How a tick's value is written.
pub(super) type TickLabel<'a> = &'a dyn Fn(&f64) -> String;

/// The frame of one chart: margins, ranges, ticks and the words on its axes.
pub(super) struct Axes<'a> {
    /// Caption above the chart and its font size (panels of a grid).
    pub caption: Option<(&'a str, u32)>,
    /// Margins: top, bottom, left, right.
    pub margin: [u32; 4],
    /// Sizes of the x and y label areas.
    pub label_area: (u32, u32),
    /// x range.
    pub x: Range<f64>,
    /// y range.
    pub y: Range<f64>,
    /// How many x and y tick labels.
    pub ticks: (usize, usize),
    /// x tick label.
    pub x_fmt: TickLabel<'a>,
    /// y tick label.
    pub y_fmt: TickLabel<'a>,
    /// x and y axis descriptions.
    pub desc: (&'a str, &'a str),
    /// Font sizes of the axis descriptions and of the tick labels.
    pub font: (u32, u32),
}

impl<'a> Axes<'a> {
    /// A single chart filling its figure below a title band: both axes in tenths.
    pub fn single(
        x: Range<f64>,
        y: Range<f64>,
        desc: (&'a str, &'a str),
        font: (u32, u32),
    ) -> Self {
        Axes {
            caption: None,
            margin: [8, 0, 12, 28],
            label_area: (52, 62),
            x,
            y,
            ticks: (11, 11),
            x_fmt: &tenths,
            y_fmt: &tenths,
            desc,
            font,
        }
    }

    /// One captioned panel of a grid of charts.
    pub fn panel(
        caption: (&'a str, u32),
        y_area: u32,
        (x, y): (Range<f64>, Range<f64>),
        ticks: (usize, usize),
        (x_fmt, y_fmt): (TickLabel<'a>, TickLabel<'a>),
        desc: (&'a str, &'a str),
    ) -> Self {
        Axes {
            caption: Some(caption),
            margin: [14, 14, 14, 24],
            label_area: (44, y_area),
            x,
            y,
            ticks,
            x_fmt,
            y_fmt,
            desc,
            font: (14, 12),
        }
    }
}

/// Build the chart an [`Axes`] describes on `area` and draw its mesh, ticks and labels.
pub(super) fn axes<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    a: &Axes,
) -> Result<Chart<'a, DB>> {
    let mut b = ChartBuilder::on(area);
    if let Some((text, size)) = a.caption {
        b.caption(text, (FONT_FAMILY, size).into_font().color(&INK));
    }
    let [top, bottom, left, right] = a.margin;
    let mut chart = b
        .margin_top(top)
        .margin_bottom(bottom)
        .margin_left(left)
        .margin_right(right)
        .x_label_area_size(a.label_area.0)
        .y_label_area_size(a.label_area.1)
        .build_cartesian_2d(a.x.clone(), a.y.clone())
        .pe()?;
    chart
        .configure_mesh()
        .x_labels(a.ticks.0)
        .y_labels(a.ticks.1)
        .x_label_formatter(a.x_fmt)
        .y_label_formatter(a.y_fmt)
        .x_desc(a.desc.0)
        .y_desc(a.desc.1)
        .axis_desc_style((FONT_FAMILY, a.font.0).into_font().color(&INK))
        .label_style((FONT_FAMILY, a.font.1).into_font().color(&INK))
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(MUTED)
        .draw()
        .pe()?;
    Ok(chart)
}

/// A single-chart figure: white ground, a title band of `head` pixels, a legend strip of `foot`
/// pixels at the bottom; returns the chart's area and the strip's.
pub(super) fn single_frame<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    (title, subtitle): (&str, &str),
    foot: i32,
) -> Result<(DrawingArea<DB, Shift>, DrawingArea<DB, Shift>)> {
    root.fill(&WHITE).pe()?;
    let (head, rest) = root.split_vertically(76);
    let (body, foot) = rest.split_vertically(rest.dim_in_pixel().1 as i32 - foot);
    title_band(&head, title, subtitle)?;
    Ok((body, foot))
}

/// A figure of panels: white ground, a title band, then `draw` on each panel's area of a
/// `(rows, cols)` grid, row-major.
pub(super) fn panel_grid<DB: DrawingBackend, P>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    grid: (usize, usize),
    panels: &[P],
    draw: impl Fn(&DrawingArea<DB, Shift>, &P) -> Result<()>,
) -> Result<()> {
    root.fill(&WHITE).pe()?;
    let (head, body) = root.split_vertically(60);
    title_band(&head, title, "")?;
    for (area, p) in body.split_evenly(grid).iter().zip(panels) {
        draw(area, p)?;
    }
    Ok(())
}

/// Filled bars (`[corner, corner]` in data coordinates), then their thin white edges.
pub(super) fn bars<DB: DrawingBackend>(
    chart: &mut Chart<DB>,
    rects: &[[(f64, f64); 2]],
    fill: ShapeStyle,
) -> Result<()> {
    for style in [fill, ShapeStyle::from(&WHITE).stroke_width(1)] {
        chart
            .draw_series(rects.iter().map(|&r| Rectangle::new(r, style)))
            .pe()?;
    }
    Ok(())
}

/// A dashed segment from `a` to `b` with dashes of `size` and gaps of `gap` pixels.
pub(super) fn dashed<DB: DrawingBackend>(
    chart: &mut Chart<DB>,
    (a, b): ((f64, f64), (f64, f64)),
    (size, gap): (u32, u32),
    style: ShapeStyle,
) -> Result<()> {
    chart
        .draw_series(DashedLineSeries::new(vec![a, b], size, gap, style))
        .pe()?;
    Ok(())
}

/// Points joined by a line (when `line`) and marked with dots of radius `dot` (when non-zero).
pub(super) fn polyline<DB: DrawingBackend>(
    chart: &mut Chart<DB>,
    pts: &[(f64, f64)],
    (line, style): (bool, ShapeStyle),
    (dot, dot_style): (u32, ShapeStyle),
) -> Result<()> {
    if line {
        chart
            .draw_series(LineSeries::new(pts.to_vec(), style))
            .pe()?;
    }
    if dot > 0 {
        chart
            .draw_series(pts.iter().map(|&q| Circle::new(q, dot, dot_style)))
            .pe()?;
    }
    Ok(())
}
