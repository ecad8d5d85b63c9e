//! `rlcr report`: calibration metrics and plots.
use std::path::PathBuf;

use anyhow::Result;

use super::common::{not_built, Global};

pub const ABOUT: &str =
    "Calibration report: accuracy, Brier, ECE, AUROC, reliability diagram, curves";
pub const LONG_ABOUT: &str = "\
Compute calibration metrics (accuracy, format rate, parse rate, mean confidence, Brier, ECE, AUROC,
lengths, per data_source) and draw a reliability diagram; with several --input files (iterations),
also metrics against iteration.

Reads: one or more scored tables (and optionally a probe table). Writes: REPORT_DIR with
metrics.json, calibration.parquet, reliability.svg/.png, report.md.
Example:
  rlcr report --input scored.parquet -o report/";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scored table(s); several = one per iteration, in order.
    #[arg(long, required = true)]
    pub input: Vec<PathBuf>,
    /// Probe table.
    #[arg(long)]
    pub probe: Option<PathBuf>,
    /// Output folder.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Number of calibration bins.
    #[arg(long, default_value_t = 10)]
    pub bins: usize,
    /// Resolved configuration file (TOML); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_g: &Global, _a: Args) -> Result<()> {
    Err(not_built("report"))
}
