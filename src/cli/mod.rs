//! The command line: one file per subcommand, each with the same skeleton (help text, `Args`,
//! `run`, private helpers), in the manner of xsv.
//!
//! Flow: [`main`] reads `argv`, merges a `--config FILE.toml` or `$RLCR_CONFIG` ([`crate::runfile`]: a run
//! file with a section per stage, or a stage's flags; flags on the command line win), parses with
//! clap, sets up logging, dispatches to the stage's `run`, and maps the outcome to
//! the documented exit codes: 0 success, 1 error (bad input, I/O), 2 usage. Errors print as anyhow's
//! `{:#}` chain on stderr. A broken pipe on stdout is success (`rlcr inspect x | head` is quiet).
use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub mod advantage;
pub mod common;
pub mod completions;
pub mod docs;
pub mod flags;
pub mod generate_answers;
pub mod generate_confidence;
pub mod generate_multiturn;
pub mod import;
pub mod import_gguf;
pub mod inspect;
pub mod logprobs;
pub mod merge_lora;
pub mod prepare;
pub mod probe;
pub mod report;
pub mod schema;
pub mod score;
pub mod sft;
pub mod update;
pub mod values;

pub use common::{Global, UsageError};

/// rlcr: train language models with reinforcement learning to answer correctly and say how sure
/// they are (RLCR: accuracy reward + Brier calibration reward).
///
/// Every stage is a subcommand that reads Parquet tables and writes a new one; nothing is modified
/// in place. Chain them by hand, or with the Makefile loop in `scripts/rl.mk`.
#[derive(Parser, Debug)]
#[command(name = "rlcr", version, about, long_about = None, propagate_version = true)]
#[command(args_override_self = true, after_help = AFTER_HELP)]
pub struct Cli {
    /// Seed for every random choice (sampling, synthetic data); same seed, same output.
    #[arg(long, global = true, default_value_t = 0, help_heading = GLOBAL)]
    pub seed: u64,
    /// More log output (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = GLOBAL)]
    pub verbose: u8,
    /// No progress bars or informational lines; errors only.
    #[arg(short, long, global = true, help_heading = GLOBAL)]
    pub quiet: bool,
    /// Device for model stages: `cpu` (default), `wgpu[:N]` (a GPU through Vulkan/Metal/DX12; a
    /// build with `--features wgpu`) or `cuda[:N]` (a build with `--features cuda`). A device this
    /// build lacks is a usage error.
    #[arg(long, global = true, default_value = "cpu", value_parser = common::parse_device, help_heading = GLOBAL)]
    pub device: crate::model::DeviceSpec,
    /// Write a Chrome trace of the stage's phases (read, prefill, decode steps, forward, backward,
    /// optimizer, write) to FILE when the command ends; open it in ui.perfetto.dev.
    #[arg(long, global = true, value_name = "FILE", help_heading = GLOBAL)]
    pub trace: Option<std::path::PathBuf>,
    /// Flags from a TOML file (default: $RLCR_CONFIG): a run file (global flags at the top, one
    /// table per stage, e.g. [generate-answers], [update]; each stage reads its own) or a file of
    /// one stage's flags. Keys are flag names; flags on the command line win; an unknown section
    /// or key is an error.
    #[arg(long, global = true, value_name = "FILE", help_heading = GLOBAL)]
    pub config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// The stages.
#[derive(Subcommand, Debug)]
pub enum Command {
    #[command(about = prepare::ABOUT, long_about = prepare::LONG_ABOUT)]
    Prepare(prepare::Args),
    #[command(about = generate_answers::ABOUT, long_about = generate_answers::LONG_ABOUT)]
    GenerateAnswers(generate_answers::Args),
    #[command(about = generate_confidence::ABOUT, long_about = generate_confidence::LONG_ABOUT)]
    GenerateConfidence(generate_confidence::Args),
    #[command(about = generate_multiturn::ABOUT, long_about = generate_multiturn::LONG_ABOUT)]
    GenerateMultiturn(generate_multiturn::Args),
    #[command(about = score::ABOUT, long_about = score::LONG_ABOUT)]
    Score(score::Args),
    #[command(about = advantage::ABOUT, long_about = advantage::LONG_ABOUT)]
    Advantage(advantage::Args),
    #[command(about = update::ABOUT, long_about = update::LONG_ABOUT)]
    Update(update::Args),
    #[command(about = sft::ABOUT, long_about = sft::LONG_ABOUT)]
    Sft(sft::Args),
    #[command(about = probe::ABOUT, long_about = probe::LONG_ABOUT)]
    Probe(probe::Args),
    #[command(about = report::ABOUT, long_about = report::LONG_ABOUT)]
    Report(report::Args),
    #[command(about = logprobs::ABOUT, long_about = logprobs::LONG_ABOUT)]
    Logprobs(logprobs::Args),
    #[command(about = values::ABOUT, long_about = values::LONG_ABOUT)]
    Values(values::Args),
    #[command(about = import::ABOUT, long_about = import::LONG_ABOUT)]
    Import(import::Args),
    #[command(name = "import-gguf", about = import_gguf::ABOUT, long_about = import_gguf::LONG_ABOUT)]
    ImportGguf(import_gguf::Args),
    #[command(name = "merge-lora", about = merge_lora::ABOUT, long_about = merge_lora::LONG_ABOUT)]
    MergeLora(merge_lora::Args),
    #[command(about = schema::ABOUT, long_about = schema::LONG_ABOUT)]
    Schema(schema::Args),
    #[command(about = inspect::ABOUT, long_about = inspect::LONG_ABOUT)]
    Inspect(inspect::Args),
    #[command(about = completions::ABOUT, long_about = completions::LONG_ABOUT)]
    Completions(completions::Args),
}

/// The heading of the global flags in every `--help`, after the stage's own options.
const GLOBAL: &str = "Global options";

/// The end of the top-level `--help`: the loop and a quick start.
const AFTER_HELP: &str = "\
The loop: `make -f scripts/rl.mk` runs a whole RLCR run as a Makefile (a supervised warm start, then
per iteration generate-answers, generate-confidence, score, advantage, update and report; an
interrupted run resumes where it stopped). Its variables choose the model, the task and the sizes:
`make -f scripts/rl.mk RUN=exp1 MODEL=path/to/hf-folder ITERS=8 LR=2e-5`.

Quick start (one iteration by hand, on a Hugging Face model folder MODEL):
  rlcr prepare --from countdown-synth --count 64 -o prompts.parquet
  rlcr generate-answers --model MODEL --input prompts.parquet -o answers.parquet
  rlcr generate-confidence --model MODEL --input answers.parquet -o trajectory.parquet
  rlcr score --input trajectory.parquet -o scored.parquet
  rlcr advantage --input scored.parquet -o train.parquet
  rlcr update --model MODEL --input train.parquet -o MODEL-1
  rlcr report --input scored.parquet -o report/

`rlcr <stage> --help` gives a stage's options; `--config run.toml` (or RLCR_CONFIG) reads them
from one file with a section per stage. Shell completions: `rlcr completions bash|zsh|fish`.";

/// The command-line definition with what is known only at run time: the long version
/// (`rlcr --version`: commit, features, CPU kernels).
pub fn command() -> clap::Command {
    Cli::command().long_version(crate::long_version())
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let cmd = command();
    let env_config = crate::switches::get().config.as_deref();
    let merged = match crate::runfile::merge(&cmd, argv, env_config) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rlcr: error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let matches = match cmd.try_get_matches_from(merged.argv) {
        Ok(m) => m,
        Err(e) => {
            // clap prints help/version to stdout with exit 0 and usage errors with exit 2.
            let _ = e.print();
            if e.use_stderr() {
                // A bad value that came from the config file: say where it was written.
                let bad = e
                    .get(clap::error::ContextKind::InvalidArg)
                    .map(|v| v.to_string());
                for (flag, origin) in &merged.from_file {
                    if bad.as_deref().is_some_and(|b| b.starts_with(flag.as_str())) {
                        eprintln!("note: {flag} was set by the config file {origin}");
                    }
                }
            }
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(2);
        }
    };
    crate::progress::set_verbosity(if cli.quiet { 0 } else { 1 + cli.verbose });
    let trace = cli.trace.clone();
    if trace.is_some() {
        crate::trace::enable();
    }
    let result = {
        let _t = crate::trace::span("rlcr");
        run(cli)
    };
    // The trace is written whatever the outcome: a failing run is worth looking at too.
    if let Some(path) = trace {
        match crate::trace::write(&path) {
            Ok(n) => crate::info!("trace: {n} events -> {}", path.display()),
            Err(e) if result.is_ok() => return exit_for(&e),
            Err(e) => eprintln!("rlcr: warning: {e:#}"),
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => exit_for(&e),
    }
}

/// Map an error to an exit code and print it.
fn exit_for(e: &anyhow::Error) -> ExitCode {
    if is_broken_pipe(e) {
        return ExitCode::SUCCESS;
    }
    if let Some(u) = e.downcast_ref::<UsageError>() {
        eprintln!("rlcr: {u}");
        return ExitCode::from(2);
    }
    eprintln!("rlcr: error: {e:#}");
    ExitCode::from(1)
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Dispatch a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    let g = Global {
        seed: cli.seed,
        device: cli.device,
        argv: std::env::args().collect(),
    };
    match cli.command {
        Command::Prepare(a) => prepare::run(&g, a),
        Command::GenerateAnswers(a) => generate_answers::run(&g, a),
        Command::GenerateConfidence(a) => generate_confidence::run(&g, a),
        Command::GenerateMultiturn(a) => generate_multiturn::run(&g, a),
        Command::Score(a) => score::run(&g, a),
        Command::Advantage(a) => advantage::run(&g, a),
        Command::Update(a) => update::run(&g, a),
        Command::Sft(a) => sft::run(&g, a),
        Command::Probe(a) => probe::run(&g, a),
        Command::Report(a) => report::run(&g, a),
        Command::Logprobs(a) => logprobs::run(&g, a),
        Command::Values(a) => values::run(&g, a),
        Command::Import(a) => import::run(&g, a),
        Command::ImportGguf(a) => import_gguf::run(&g, a),
        Command::MergeLora(a) => merge_lora::run(&g, a),
        Command::Schema(a) => schema::run(&g, a),
        Command::Inspect(a) => inspect::run(&g, a),
        Command::Completions(a) => completions::run(&g, a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
        command().debug_assert();
    }
}
