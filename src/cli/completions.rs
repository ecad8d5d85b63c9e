//! `rlcr completions`: a shell completion script for bash, zsh or fish, generated from the same
//! command-line definition as `--help` (clap_complete: a small crate with no dependency beyond
//! clap, a few seconds of a cold build).
use std::io::Write;

use anyhow::{Context, Result};

use super::common::Global;

pub const ABOUT: &str = "Print a shell completion script (bash, zsh or fish)";
pub const LONG_ABOUT: &str = "\
Print a completion script for SHELL on stdout: subcommands, flags and the values of flags that take
a fixed set (estimators, verifiers, devices' kinds), from the same definitions as --help.

Install (once; a new shell picks it up):
  bash: rlcr completions bash > ~/.local/share/bash-completion/completions/rlcr
  zsh:  rlcr completions zsh > ~/.zfunc/_rlcr   (with `fpath+=(~/.zfunc)` before `compinit` in ~/.zshrc)
  fish: rlcr completions fish > ~/.config/fish/completions/rlcr.fish";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The shell.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The shells a script is written for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// The completion script for `shell`.
pub fn script(shell: Shell) -> Vec<u8> {
    let mut cmd = super::command();
    let mut out = Vec::new();
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut cmd, "rlcr", &mut out);
    out
}

pub fn run(_g: &Global, a: Args) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(&script(a.shell))
        .and_then(|()| out.flush())
        .context("writing the completion script to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_names_the_stages_and_their_flags() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let s = String::from_utf8(script(shell)).expect("utf-8");
            for word in [
                "generate-answers",
                "update",
                "num-answers",
                "max-new-tokens",
                "config",
            ] {
                assert!(s.contains(word), "{shell:?} lacks {word}");
            }
        }
    }
}
