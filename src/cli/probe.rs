//! `rlcr probe`: the command line of the faithfulness probe (help, flags, plan, summary line).
//! The engine is [`crate::probe::stage`].

use anyhow::Result;

use super::common::{Global, UsageError};
use super::flags::{LogitsArgs, ModelTable, VerifierArgs};
use crate::probe::{self, stage, stage::Plan, stage::VerifierFlags};
use crate::table::Shard;

pub const ABOUT: &str =
    "Faithfulness probe: cut the thinking, force an answer, Monte-Carlo its accuracy";
pub const LONG_ABOUT: &str = "\
For each answer row with a closed </think>, cut its thinking at several points (token
boundaries; cut f keeps round(f * L) of its L thinking tokens), force `</think><answer>`, sample N
continuations (default 50) up to </answer>, verify each (`<answer>` + continuation) with the
verifier score used on this table (its --verifier, --verifier-cmd, --countdown-compat, read from
the table's metadata; any of --verifier, --verifier-cmd, --countdown-compat given here replaces
them all, --verifier-timeout only itself; correct iff the full score,
countdown 1.0) and write probe_confidence = correct / N, one row per (answer, cut point), with the answer's
verbal confidence (mean parsed confidence of its confidence rows; null without any) and its
acc_reward. The N samples of a cut share its prefix (prefilled once). Answers without a closed
</think> are skipped and counted. The context is the answer's recorded context_ids.
--shard I/N probes only the answers whose prompt_id falls in shard I of N (as generate-answers).

Reads: a scored table and the model folder. Writes: a probe table (schema rlcr.probe).
Example:
  rlcr probe --model ckpt/iter-3 --input scored.parquet -o probe.parquet --cuts 5 --samples 50";

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("top_p", |a| a.help("Nucleus sampling (1 = off)")),
    mut_arg("min_p", |a| a.help("Drop tokens below P times the most likely one's probability (0 = off)")),
)]
pub struct Args {
    #[command(flatten)]
    pub stage: ModelTable,
    /// Number of cut points, evenly spaced fractions i/(K-1) of the thinking (0 and 1 included).
    #[arg(long, default_value_t = 5)]
    pub cuts: usize,
    /// Explicit cut fractions (comma-separated, increasing, in [0, 1]); replaces --cuts.
    #[arg(long, value_delimiter = ',', conflicts_with = "cuts")]
    pub cut_fractions: Option<Vec<f64>>,
    /// Continuations per cut (N).
    #[arg(long, default_value_t = 50)]
    pub samples: usize,
    /// Maximum new tokens per continuation.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    pub logits: LogitsArgs,
    /// Sequences decoded together (does not change the results).
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    #[command(flatten)]
    pub verifier: VerifierArgs,
    /// Only the answers of shard I of N (`--shard 0/4`), split by prompt_id.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
}

impl Plan {
    /// The validated plan (usage errors exit 2).
    fn from_args(g: &Global, a: &Args) -> Result<Plan> {
        let usage = |e: anyhow::Error| UsageError(format!("{e:#}"));
        let fractions = match &a.cut_fractions {
            Some(f) => {
                probe::check_fractions(f).map_err(usage)?;
                f.clone()
            }
            None => probe::even_fractions(a.cuts).map_err(usage)?,
        };
        if a.samples == 0 {
            return Err(UsageError("--samples must be at least 1".into()).into());
        }
        if a.max_new_tokens == 0 {
            return Err(UsageError("--max-new-tokens must be at least 1".into()).into());
        }
        if a.batch_size == 0 {
            return Err(UsageError("--batch-size must be at least 1".into()).into());
        }
        let v = &a.verifier;
        let verifier_timeout = v.timeout()?;
        let params = a.logits.params();
        params.validate().map_err(usage)?;
        Ok(Plan {
            job: a.stage.job(g, a.shard)?,
            fractions,
            samples: a.samples,
            max_new_tokens: a.max_new_tokens,
            params,
            batch_size: a.batch_size,
            verifier: VerifierFlags {
                verifier: v.verifier,
                verifier_cmd: v.verifier_cmd.clone(),
                verifier_timeout,
                countdown_compat: v.countdown_compat,
            },
        })
    }
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let s = stage::run(&Plan::from_args(g, &a)?)?;
    crate::info!("{}", s.sampling.line("probe", "span"));
    crate::info!("{}", s.line());
    Ok(())
}
