//! Progress reporting: an indicatif bar on a terminal, plain log lines otherwise.
//!
//! Long stages (sampling, training, probing, streaming millions of rows) call [`Progress::new`] with a
//! total and a unit, then [`Progress::inc`]. On a terminal (stderr is a TTY and not `--quiet`) this
//! draws a bar with a rate; otherwise it prints a plain line at most every few seconds, so logs
//! of batch jobs stay readable.
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Verbosity chosen on the command line: 0 quiet, 1 normal, 2+ verbose.
static VERBOSITY: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(1);

/// Set the global verbosity (called once by the CLI).
pub fn set_verbosity(v: u8) {
    VERBOSITY.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// The global verbosity: 0 quiet, 1 normal, 2+ verbose.
pub fn verbosity() -> u8 {
    VERBOSITY.load(std::sync::atomic::Ordering::Relaxed)
}

/// Print an informational line on stderr unless `--quiet`.
#[macro_export]
macro_rules! info {
    ($($t:tt)*) => {
        if $crate::progress::verbosity() >= 1 { eprintln!("rlcr: {}", format!($($t)*)); }
    };
}

/// Print a debug line on stderr with `-v`.
#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => {
        if $crate::progress::verbosity() >= 2 { eprintln!("rlcr: {}", format!($($t)*)); }
    };
}

/// A progress indicator: a bar on a terminal, periodic log lines otherwise, nothing with `--quiet`.
pub struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    unit: String,
    total: u64,
    done: u64,
    start: Instant,
    last_log: Instant,
    plain: bool,
}

impl Progress {
    /// Start a progress indicator for `total` units of work (`unit` like "rows" or "tokens").
    pub fn new(label: &str, total: u64, unit: &str) -> Self {
        let quiet = verbosity() == 0;
        let tty = std::io::stderr().is_terminal();
        let bar = if !quiet && tty {
            let b = ProgressBar::new(total);
            let style = ProgressStyle::with_template(&format!(
                "{{msg}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} ({{per_sec}}, eta {{eta}})"
            ))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            b.set_style(style);
            b.set_message(label.to_string());
            Some(b)
        } else {
            None
        };
        let now = Instant::now();
        Progress {
            bar,
            label: label.to_string(),
            unit: unit.to_string(),
            total,
            done: 0,
            start: now,
            last_log: now,
            plain: !quiet && !tty,
        }
    }

    /// Record `n` more units done.
    pub fn inc(&mut self, n: u64) {
        self.done += n;
        if let Some(b) = &self.bar {
            b.inc(n);
        } else if self.plain && self.last_log.elapsed() >= Duration::from_secs(5) {
            self.last_log = Instant::now();
            let secs = self.start.elapsed().as_secs_f64().max(1e-9);
            eprintln!(
                "rlcr: {}: {}/{} {} ({:.1} {}/s)",
                self.label,
                self.done,
                self.total,
                self.unit,
                self.done as f64 / secs,
                self.unit
            );
        }
    }

    /// Set a short message shown beside the bar (e.g. tokens/s).
    pub fn message(&self, msg: &str) {
        if let Some(b) = &self.bar {
            b.set_message(format!("{} {}", self.label, msg));
        }
    }

    /// Finish and clear the bar. Returns the elapsed seconds.
    pub fn finish(self) -> f64 {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        self.start.elapsed().as_secs_f64()
    }
}
