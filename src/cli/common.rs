//! Options and helpers shared by every subcommand.
pub use crate::usage::{as_usage, usage, UsageError};

/// Settings that apply to every subcommand (global flags).
#[derive(Debug, Clone)]
pub struct Global {
    /// `--seed`.
    pub seed: u64,
    /// `--device`.
    pub device: crate::model::DeviceSpec,
    /// The command line as typed, for provenance.
    pub argv: Vec<String>,
}

/// clap value parser of `--device`: the syntax and that this build has the backend (so a device
/// the build lacks is a usage error, exit 2, on every subcommand); the model stages open the
/// parsed [`crate::model::DeviceSpec`].
pub fn parse_device(s: &str) -> Result<crate::model::DeviceSpec, String> {
    s.parse::<crate::model::DeviceSpec>()
        .map_err(|e| format!("{e:#}"))
}
