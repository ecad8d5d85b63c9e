//! The command line: one file per subcommand, each with the same skeleton (help text, `Args`,
//! `run`, private helpers), in the manner of xsv.
//!
//! Flow: [`main`] reads `argv`, merges a `--config FILE.toml` (flags on the command line win over the
//! file), parses with clap, sets up logging, dispatches to the stage's `run`, and maps the outcome to
//! the documented exit codes: 0 success, 1 error (bad input, I/O), 2 usage. Errors print as anyhow's
//! `{:#}` chain on stderr. A broken pipe on stdout is success (`rlcr inspect x | head` is quiet).
use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub mod advantage;
pub mod common;
pub mod flags;
pub mod generate_answers;
pub mod generate_confidence;
pub mod generate_multiturn;
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
#[command(args_override_self = true)]
pub struct Cli {
    /// Seed for every random choice (sampling, synthetic data); same seed, same output.
    #[arg(long, global = true, default_value_t = 0)]
    pub seed: u64,
    /// More log output (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// No progress bars or informational lines; errors only.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Device for model stages: `cpu` (default), `wgpu[:N]` (a GPU through Vulkan/Metal/DX12; a
    /// build with `--features wgpu`) or `cuda[:N]` (a build with `--features cuda`). A device this
    /// build lacks is a usage error.
    #[arg(long, global = true, default_value = "cpu", value_parser = common::parse_device)]
    pub device: String,
    /// Write a Chrome trace of the stage's phases (read, prefill, decode steps, forward, backward,
    /// optimizer, write) to FILE when the command ends; open it in ui.perfetto.dev.
    #[arg(long, global = true, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
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
    #[command(name = "import-gguf", about = import_gguf::ABOUT, long_about = import_gguf::LONG_ABOUT)]
    ImportGguf(import_gguf::Args),
    #[command(name = "merge-lora", about = merge_lora::ABOUT, long_about = merge_lora::LONG_ABOUT)]
    MergeLora(merge_lora::Args),
    #[command(about = schema::ABOUT, long_about = schema::LONG_ABOUT)]
    Schema(schema::Args),
    #[command(about = inspect::ABOUT, long_about = inspect::LONG_ABOUT)]
    Inspect(inspect::Args),
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let argv = match merge_config(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rlcr: error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let matches = match Cli::command().try_get_matches_from(argv) {
        Ok(m) => m,
        Err(e) => {
            // clap prints help/version to stdout with exit 0 and usage errors with exit 2.
            let _ = e.print();
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
        device: cli.device.clone(),
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
        Command::ImportGguf(a) => import_gguf::run(&g, a),
        Command::MergeLora(a) => merge_lora::run(&g, a),
        Command::Schema(a) => schema::run(&g, a),
        Command::Inspect(a) => inspect::run(&g, a),
    }
}

/// Merge `--config FILE.toml` into the argument list: the file's keys become flags inserted right
/// after the subcommand name, so that flags given on the command line (which come later) override
/// them (`args_override_self`). Keys are flag names (`num-answers` or `num_answers`); `true` becomes
/// a bare flag, `false` is dropped, arrays repeat the flag, tables are not allowed.
pub fn merge_config(argv: Vec<OsString>) -> Result<Vec<OsString>> {
    let mut cfg_path: Option<(usize, usize, OsString)> = None;
    for (i, a) in argv.iter().enumerate() {
        let s = a.to_string_lossy();
        if s == "--" {
            break;
        }
        if s == "--config" {
            let Some(v) = argv.get(i + 1) else {
                return Err(UsageError("--config needs a FILE.toml".into()).into());
            };
            cfg_path = Some((i, 2, v.clone()));
        } else if let Some(v) = s.strip_prefix("--config=") {
            cfg_path = Some((i, 1, OsString::from(v)));
        }
    }
    let Some((at, len, path)) = cfg_path else {
        return Ok(argv);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading config file {}", path.to_string_lossy()))?;
    let table: toml::Table = toml::from_str(&text)
        .with_context(|| format!("parsing config file {}", path.to_string_lossy()))?;
    let mut extra: Vec<OsString> = Vec::new();
    for (k, v) in &table {
        let flag = format!("--{}", k.replace('_', "-"));
        push_value(&mut extra, &flag, v)
            .with_context(|| format!("config file {}: key `{k}`", path.to_string_lossy()))?;
    }
    let mut out: Vec<OsString> = Vec::with_capacity(argv.len() + extra.len());
    // Find the subcommand: the first argument that names one.
    let names: Vec<String> = Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    let mut inserted = false;
    for (i, a) in argv.into_iter().enumerate() {
        if i >= at && i < at + len {
            continue;
        }
        let is_sub = !inserted && i > 0 && names.iter().any(|n| a.to_string_lossy() == *n);
        out.push(a);
        if is_sub {
            out.append(&mut extra);
            inserted = true;
        }
    }
    if !inserted {
        return Err(UsageError("--config needs a subcommand".into()).into());
    }
    Ok(out)
}

fn push_value(out: &mut Vec<OsString>, flag: &str, v: &toml::Value) -> Result<()> {
    match v {
        toml::Value::Boolean(true) => out.push(flag.into()),
        toml::Value::Boolean(false) => {}
        toml::Value::String(s) => {
            out.push(flag.into());
            out.push(s.into());
        }
        toml::Value::Integer(i) => {
            out.push(flag.into());
            out.push(i.to_string().into());
        }
        toml::Value::Float(f) => {
            out.push(flag.into());
            out.push(f.to_string().into());
        }
        toml::Value::Array(items) => {
            for it in items {
                push_value(out, flag, it)?;
            }
        }
        _ => bail!("only strings, numbers, booleans and arrays are allowed"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
