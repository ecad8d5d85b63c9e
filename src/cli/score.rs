//! `rlcr score`: the command line of the scoring stage (help, flags, plan, summary line). The
//! engine is [`crate::reward::stage`].
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use super::common::Global;
use super::flags::{TableIo, VerifierArgs};
use crate::reward::rows::{AnswerFormat, FormatGate, Preset, Request, Settings};
use crate::reward::stage::{self, Plan};
use crate::reward::VerifierChoice;
use crate::table::Shard;

pub const ABOUT: &str =
    "Score a trajectory table: accuracy, format, confidence, Brier, structured rewards";
pub const LONG_ABOUT: &str = "\
Score every row of a trajectory table without a model.

Answers: acc_reward = the verifier's verdict on the extracted answer (1/0; the F1 value for f1),
0 when the format check fails and gating is on (--format-gate auto, the default: on with the
built-in verifiers, off with --verifier-cmd, whose reward is the user's to decide; off with
--reward-preset tinyzero). Confidence rows: the last <confidence> parsed
strictly (a finite number in [0,1]; nan, inf, 80%, 1.2 are failures), conf_reward =
1 - (acc - c)^2 with acc taken from the row's own answer, 0 on a format or parse failure.
reward = the total of reward_components: `mean over turns + sum of globals`, which for
the presets is: rlcr (answers: acc + format-weight * format; confidences: Brier), rlcr-single
(RLCR's single-completion 0.5*(format + acc + brier) + 1e-6 * (mean conf + 0/1 conf), for
--answer-format tabc), tinyzero (answers: the countdown score 0 / 0.1 / 1). --rewards FILE.toml
defines named components instead:
  preset = \"kg-r1\"            # optional: KG-R1's defaults (format_score 0.15, is_answer_score
                               # 0.1, kg_query_validity 0.1; exact_match 0.3, retrieval_quality 0.4)
  [[turn]]                     # or [[global]]
  name = \"format_score\"
  weight = 0.15
  source = \"format_ok\"        # correct, accuracy, format_ok, answer_present, countdown, brier,
                               # confidence, extra.NAME; or: column = \"a_column\" (number, bool,
                               # or a list with one value per turn)
  rows = \"all\"                # answer | confidence | all
Components named _raw_* are kept in reward_components but not summed.

Verifiers (--verifier auto picks by data_source: countdown; hotpot/squad/trivia/... -> exact;
mmlu/gpqa/... -> choice; otherwise math): countdown (last <answer> anywhere, + - * / × ÷ − and
parentheses, each number once, |value - target| < 1e-5; --countdown-compat tinyzero reproduces
TinyZero's compute_score on prompt + response, quirks included), math, exact, f1, choice, or an
external program (--verifier-cmd CMD, run with sh -c): rlcr writes one JSON request per answer row
on its stdin, {\"id\", \"sample_id\", \"data_source\", \"prompt\", \"response\", \"answer\",
\"ground_truth\", \"messages\", \"extra_info\", \"columns\"} (values with the types the table
stored: text stays text), and reads one reply per line on its stdout, {\"id\", \"correct\":
true|false|number, \"extra\": {NAME: number}} or {\"id\", \"error\": TEXT}, in any order; its stderr
passes through; --verifier-timeout bounds the wait for each reply. The reward is the program's:
no format gate in front unless --format-gate on. Confidence rows keep rlcr's own rules (the
<confidence> tag parsed strictly, Brier against the answer's reward). The reward adapters for verl's
compute_score and TRL's reward functions come with rlcr: the command finds them on its PATH and in
$RLCR_REWARDS, from any folder, and they import MODULE from the working folder:
  --verifier-cmd \"verl_reward.py my_rewards:compute_score\"
  --verifier-cmd \"trl_reward.py my_rewards:accuracy_reward\"

--shard I/N scores only the rows whose prompt_id falls in shard I of N (as generate-answers; a
prompt's answers and confidences stay together), in one pass without a temp copy (their columns
are encoded again); row numbers in errors count over the whole input, which is validated whole.

Re-scoring an already scored table replaces every score column and drops the advantage columns.
Columns the stage does not compute are copied as encoded Parquet chunks, so it streams millions of
rows and never loads token lists.

Reads: a trajectory table. Writes: the same rows with answer, format_ok, acc_reward, confidence,
conf_reward, reward, reward_components.
Example:
  rlcr score --input trajectory.parquet -o scored.parquet --verifier countdown";

#[derive(clap::Args, Debug, Serialize)]
pub struct Args {
    #[command(flatten)]
    #[serde(flatten)]
    pub io: TableIo,
    /// Recorded in `rlcr.config` with the defaults filled in (see [`Plan::try_from`]).
    #[command(flatten)]
    #[serde(skip)]
    pub verifier: VerifierArgs,
    /// Reward preset.
    #[arg(long, value_enum, default_value = "rlcr")]
    pub reward_preset: Preset,
    /// Structured rewards definition, TOML; replaces the preset's components.
    #[arg(long)]
    pub rewards: Option<PathBuf>,
    /// Format required of answer rows [default: ta; tabc with --reward-preset rlcr-single].
    #[arg(long, value_enum)]
    pub answer_format: Option<AnswerFormat>,
    /// Confidence rows must contain <analysis>…</analysis> before <confidence>.
    #[arg(long)]
    pub require_analysis: bool,
    /// Accuracy is 0 when the answer's format fails: auto = on with the built-in verifiers, off
    /// with --verifier-cmd (the external reward decides) and with --reward-preset tinyzero.
    #[arg(long, value_enum, default_value_t = FormatGate::Auto)]
    pub format_gate: FormatGate,
    /// Weight of format_ok in the answers' reward (rlcr preset).
    #[arg(long, default_value_t = 0.0)]
    pub format_weight: f64,
    /// Only the rows of shard I of N (`--shard 0/4`), split by prompt_id.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
}

/// Turn the flags into validated settings.
pub fn settings_from_args(a: &Args) -> Result<Settings> {
    let v = &a.verifier;
    Request {
        verifier: v.verifier,
        external: v.verifier_cmd.is_some(),
        countdown_compat: v.countdown_compat,
        timeout: v.verifier_timeout,
        preset: a.reward_preset,
        rewards: a.rewards.clone(),
        answer_format: a.answer_format,
        require_analysis: a.require_analysis,
        format_gate: a.format_gate,
        format_weight: a.format_weight,
    }
    .settings()
}

impl TryFrom<(&Global, &Args)> for Plan {
    type Error = anyhow::Error;

    /// The validated plan (usage errors exit 2).
    fn try_from((g, a): (&Global, &Args)) -> Result<Plan> {
        let settings = settings_from_args(a)?;
        let v = &a.verifier;
        let timeout = v.timeout()?.unwrap_or(60.0);
        let external = v
            .verifier_cmd
            .clone()
            .map(|c| (c, Duration::from_secs_f64(timeout)));
        // the flags with their defaults, as `probe` reads them back
        let mut args = serde_json::to_value(a)?;
        args["verifier"] = serde_json::to_value(v.verifier.unwrap_or(VerifierChoice::Auto))?;
        args["verifier_cmd"] = serde_json::to_value(&v.verifier_cmd)?;
        args["verifier_timeout"] = timeout.into();
        args["countdown_compat"] = serde_json::to_value(settings.countdown_compat)?;
        let config = serde_json::json!({
            "args": args,
            "settings": &settings,
            "shard": a.shard,
            "seed": g.seed,
            "argv": g.argv,
        });
        Ok(Plan {
            input: a.io.input.clone(),
            out: a.io.out.clone(),
            settings,
            external,
            shard: a.shard,
            config,
        })
    }
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let plan = Plan::try_from((g, &a))?;
    let summary = stage::run(&plan)?;
    crate::info!("{}", summary.line(&a.io.out));
    Ok(())
}
