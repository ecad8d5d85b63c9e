//! `rlcr values`: a critic's value of every response token (the `values` column GAE needs). A thin
//! shell over [`crate::train::critic`] (the critic flags of `rlcr update` are
//! [`super::flags::CriticArgs`]).
use std::path::PathBuf;

use anyhow::Result;

use super::common::{Global, UsageError};
use crate::train::critic::{self, ValuesPlan};

pub const ABOUT: &str = "Add a critic's per-token values to a table (the `values` column of GAE)";
pub const LONG_ABOUT: &str = "\
Run a critic (a value model: the policy's architecture with a scalar value head) over every row's
context + response and write its value of each response token as column `values` (--column);
every other column passes through. The value of response token i is the head applied to the hidden
state of the slot before it (verl's critic). Then `rlcr advantage --estimator gae` computes
advantages and returns from it, and `rlcr update --critic DIR --critic-out NEW` trains the critic
(verl's clipped value loss) next to the policy.

--critic takes a critic folder written by `update --critic-out` (a Hugging Face
`*ForTokenClassification` folder with num_labels = 1: score.weight [1, h], score.bias [1]) or any
policy folder, which starts a critic with a zero value head (every value 0 until it is trained);
a LoRA adapter folder starts it from its base with the adapter merged in.
In transformers: AutoModelForTokenClassification.from_pretrained(DIR).logits[..., 0] are the values
of every position (the value of response token i sits at the position before it).

Reads: a table with context_ids and response_ids. Writes: the same rows plus the values column.
Example:
  rlcr values --critic ckpt/critic-0 --input scored.parquet -o valued.parquet";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Critic folder (or a policy or LoRA adapter folder: zero value head).
    #[arg(long)]
    pub critic: PathBuf,
    /// Input table.
    #[arg(long)]
    pub input: PathBuf,
    /// Output table.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Name of the new column.
    #[arg(long, default_value = "values")]
    pub column: String,
    /// Rows per forward pass.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    if a.batch_size == 0 {
        return Err(UsageError("--batch-size must be at least 1".into()).into());
    }
    let line = critic::run_values(&ValuesPlan {
        critic: a.critic,
        input: a.input,
        out: a.out,
        column: a.column,
        batch_size: a.batch_size,
        device: g.device,
        argv: g.argv.clone(),
    })?;
    crate::info!("{line}");
    Ok(())
}
