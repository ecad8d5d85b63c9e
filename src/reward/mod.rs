//! Rewards without a model: verifiers, answer and confidence parsing, format checks, the Brier
//! reward and the structured multi-turn rewards. Pure functions over strings; the `rlcr score` engine
//! ([`stage`]) streams a table through [`rows`].
//!
//! Map:
//! - [`countdown`]: the countdown verifier, default mode (response only, last `<answer>` anywhere,
//!   exact rationals) and the TinyZero-exact mode, which evaluates equations with
//!   [`pyexpr`] (a Python 3 arithmetic evaluator, never `eval`) over [`bigint`] integers
//!   (`num-bigint` behind an `i128` fast path). [`countdown::evaluate`] is the public evaluator
//!   of countdown equations (exact rationals) for other stages.
//! - [`rational`]: exact `i128` rationals with a double fallback, shared by math and countdown.
//! - [`math`]: numeric answers (integers, decimals, fractions, `\boxed{}`, simple LaTeX).
//! - [`qa`]: SQuAD exact match and token F1, multiple-choice letters.
//! - [`rlcr`]: RLCR's `tabc` format family, the turn-2 confidence format, strict and lenient
//!   confidence parsing, Brier; RLCR's five-term single-completion reward.
//! - [`structured`]: named per-turn and global components, `mean(turns) + sum(globals)`.
//! - [`external`]: a verifier child process speaking JSON lines, and what its requests carry
//!   (the table's values with their stored types).
//! - [`adapters`]: the reward adapters for verl's and TRL's reward functions, compiled in and
//!   written to a cache folder that the verifier command finds on its `PATH`.
//! - [`rows`]: one answer row or confidence row scored under the stage's settings (presets,
//!   gating, components).
//! - [`text`]: Python-compatible whitespace, stripping and tag search.
//! - [`stage`]: the `rlcr score` engine: a clap-free [`stage::Plan`] → [`stage::run`] over a
//!   trajectory table (validate, verify, score, splice the score columns into the copied rows);
//!   its input side (batches, validation, the columns a batch is scored from) and output side
//!   (the score columns' builders and encoding) are its submodules.
//!
//! Design decisions: every parser is total (no input string can panic, each has a property test
//! on arbitrary strings) and bounded (nesting, length, integer size); defaults (`docs/math.md` §1, §5):
//! strict confidence, NaN rejected, gating as a flag, response-only extraction.
pub mod adapters;
pub mod bigint;
pub mod countdown;
pub mod external;
pub mod math;
pub mod pyexpr;
pub mod qa;
pub mod rational;
pub mod rlcr;
pub mod rows;
pub mod stage;
pub mod structured;
pub mod text;

use serde::{Deserialize, Serialize};

/// The built-in verifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum VerifierKind {
    /// Countdown equations (TinyZero's task), score 0 / 0.1 / 1.
    Countdown,
    /// Numeric answers compared by value.
    Math,
    /// SQuAD exact match (RLCR's HotpotQA check).
    Exact,
    /// SQuAD token F1 (the accuracy is the F1 value).
    F1,
    /// Multiple-choice letters.
    Choice,
}

/// The verifier a stage is asked for: a built-in one, or `auto` (picked per row by
/// `data_source`, [`auto_verifier`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum VerifierChoice {
    Auto,
    Countdown,
    Math,
    Exact,
    F1,
    Choice,
}

impl VerifierChoice {
    /// The fixed verifier, `None` for `auto`.
    pub fn kind(self) -> Option<VerifierKind> {
        match self {
            VerifierChoice::Auto => None,
            VerifierChoice::Countdown => Some(VerifierKind::Countdown),
            VerifierChoice::Math => Some(VerifierKind::Math),
            VerifierChoice::Exact => Some(VerifierKind::Exact),
            VerifierChoice::F1 => Some(VerifierKind::F1),
            VerifierChoice::Choice => Some(VerifierKind::Choice),
        }
    }
}

impl VerifierKind {
    pub fn name(self) -> &'static str {
        match self {
            VerifierKind::Countdown => "countdown",
            VerifierKind::Math => "math",
            VerifierKind::Exact => "exact",
            VerifierKind::F1 => "f1",
            VerifierKind::Choice => "choice",
        }
    }
}

/// `--verifier auto`: the verifier for a `data_source`, by case-insensitive substring, first
/// match wins: `countdown` → countdown; `mmlu`, `gpqa`, `commonsense`, `csqa`, `arc`, `medqa`,
/// `choice`, `mcq` → choice; `hotpot`, `squad`, `trivia`, `simpleqa`, `natural_questions`, `nq`,
/// `qa` → exact; anything else → math (RLCR's rule: exact match for HotpotQA, math otherwise).
pub fn auto_verifier(data_source: &str) -> VerifierKind {
    let s = data_source.to_ascii_lowercase();
    let has = |keys: &[&str]| keys.iter().any(|k| s.contains(k));
    if has(&["countdown"]) {
        VerifierKind::Countdown
    } else if has(&[
        "mmlu",
        "gpqa",
        "commonsense",
        "csqa",
        "arc",
        "medqa",
        "choice",
        "mcq",
    ]) {
        VerifierKind::Choice
    } else if has(&[
        "hotpot",
        "squad",
        "trivia",
        "simpleqa",
        "natural_questions",
        "nq",
        "qa",
    ]) {
        VerifierKind::Exact
    } else {
        VerifierKind::Math
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks() {
        assert_eq!(auto_verifier("countdown"), VerifierKind::Countdown);
        assert_eq!(auto_verifier("hotpot"), VerifierKind::Exact);
        assert_eq!(auto_verifier("HotpotQA-modified"), VerifierKind::Exact);
        assert_eq!(auto_verifier("gpqa"), VerifierKind::Choice);
        assert_eq!(auto_verifier("big-math-digits"), VerifierKind::Math);
        assert_eq!(auto_verifier("gsm8k"), VerifierKind::Math);
        // prepare --from arithmetic-synth's three data sources
        for ds in ["arithmetic", "arithmetic-heldout", "arithmetic-hard"] {
            assert_eq!(auto_verifier(ds), VerifierKind::Math, "{ds}");
        }
        assert_eq!(auto_verifier(""), VerifierKind::Math);
    }
}
