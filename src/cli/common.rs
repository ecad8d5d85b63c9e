//! Options and helpers shared by every subcommand.
use std::fmt;

/// Settings that apply to every subcommand (global flags).
#[derive(Debug, Clone)]
pub struct Global {
    /// `--seed`.
    pub seed: u64,
    /// `--device`.
    pub device: String,
    /// The command line as typed, for provenance.
    pub argv: Vec<String>,
}

/// A usage error: the command line asks for something that cannot be done (exit code 2).
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}
