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
//! - **One way to draw a chart.** Every chart is an [`frame::Axes`] description (ranges, ticks,
//!   axis words, fonts) built by one function, inside one of two frames (a single chart under a
//!   title band, or a grid of panels); a figure's own code is its data, labels and marks.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

mod frame;
mod panels;
mod probe;
mod reliability;

pub use frame::{compact_count, fmt_opt, palette};
pub use panels::{hist_layout, HistPanel, Histograms, LineCharts, LinePanel, Series, XAxis};
pub use probe::{ProbeCurve, ProbeScatter};
pub use reliability::Reliability;

/// DejaVu Sans (Bitstream Vera licence, `src/report/DejaVuSans.LICENSE`).
pub static FONT: &[u8] = include_bytes!("../DejaVuSans.ttf");

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::metrics::{self, BinRule};
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
            axis: XAxis::Iterations,
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
            // Manual inspection: the SVGs and PNGs somewhere visible.
            let keep = std::path::Path::new(&keep);
            write_svg(&fig, &keep.join("reliability.svg")).expect("svg");
            write_svg(&empty, &keep.join("empty.svg")).expect("svg");
            write_svg(&hist, &keep.join("hist.svg")).expect("svg");
            write_svg(&lines, &keep.join("lines.svg")).expect("svg");
            write_svg(&curve, &keep.join("curve.svg")).expect("svg");
            write_svg(&sc, &keep.join("scatter.svg")).expect("svg");
            for f in [
                "reliability.png",
                "empty.png",
                "hist.png",
                "lines.png",
                "curve.png",
                "scatter.png",
            ] {
                let _ = std::fs::copy(dir.path().join(f), keep.join(f));
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
