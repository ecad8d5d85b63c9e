//! One row of a trajectory table scored under the stage's settings: the pure core of
//! `rlcr score`, with no Arrow in sight.
//!
//! Answer rows ([`score_answer`]): the verifier's verdict `correct` (1/0, or the F1 value), the
//! format check (`--answer-format`, RLCR's `ta` by default: the two-turn design puts the
//! confidence in its own row), and `accuracy` = `correct`, or 0 when gating is on and the format
//! failed (RLCR gates; `docs/math.md` §1.2). Confidence rows ([`score_confidence`]): the turn-2
//! format and the strict confidence parse, `conf_reward = 1 − (acc − c)²` with `acc` the accuracy of the
//! row's own answer, 0 on a format or parse failure.
//!
//! The scalar `reward` is always [`structured::total`] of the row's components, so it can be
//! recomputed from `reward_components`. The presets are component sets:
//! - `rlcr` (default): answers `accuracy`·1 + `format`·format_weight (listed only when the weight
//!   is not 0: the `format_ok` column has it), and, kept with weight 0 for logging, `countdown`
//!   (the 0/0.1/1 score) and `extra.*`; confidences `brier`·1.
//! - `rlcr-single`: RLCR's single-completion reward on answer rows that carry their own
//!   confidence (`--answer-format tabc`): `format`·0.5 + `accuracy`·0.5 + `brier`·0.5 +
//!   `mean_confidence`·1e-6 + `confidence_one_or_zero`·1e-6 (its HotpotQA weights;
//!   `docs/math.md` §1.2).
//! - `tinyzero`: answers `countdown`·1 (the 0/0.1/1 score; the countdown verifier is required),
//!   `accuracy`·0 and `format`·0; confidences as `rlcr`.
//! - a rewards TOML ([`structured::RewardSpec`]) replaces the preset's components.
use std::borrow::Cow;
use std::path::PathBuf;

use anyhow::Result;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::countdown::{self, Task};
use super::rlcr::{self, FormatPattern, RlcrTerms};
use super::structured::{self, Component, ComponentSpec, RewardSpec, Source, Value};
use super::text::last_answer;
use super::{math, qa, VerifierChoice, VerifierKind};
use crate::usage::{as_usage, usage};

/// How countdown answers are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CountdownCompat {
    /// Response only, last `<answer>` anywhere, exact rationals.
    #[default]
    Default,
    /// TinyZero's `compute_score` on prompt + response, quirks included.
    Tinyzero,
}

/// The reward presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    #[default]
    Rlcr,
    RlcrSingle,
    Tinyzero,
}

/// `--answer-format` values.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AnswerFormat {
    Ta,
    Tac,
    Tabc,
    Tbac,
    /// Only require an extractable answer.
    None,
}

/// `--format-gate` values.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatGate {
    /// On with the built-in verifiers; off with --verifier-cmd and --reward-preset tinyzero.
    #[default]
    Auto,
    /// A failed answer format scores 0, whatever the verifier says.
    On,
    /// The verifier's verdict stands; format_ok is still recorded.
    Off,
}

/// The scoring settings as asked for (the flags of `score`), resolved by [`Request::settings`].
#[derive(Debug, Clone)]
pub struct Request {
    /// `--verifier` (unset: auto).
    pub verifier: Option<VerifierChoice>,
    /// An external verifier replaces the built-in ones (`--verifier-cmd`).
    pub external: bool,
    /// `--countdown-compat` (unset: default).
    pub countdown_compat: Option<CountdownCompat>,
    /// `--verifier-timeout` in seconds (unset: the default).
    pub timeout: Option<f64>,
    /// The reward preset.
    pub preset: Preset,
    /// A structured rewards TOML replacing the preset's components.
    pub rewards: Option<PathBuf>,
    /// `--answer-format` (unset: `ta`, `tabc` with the rlcr-single preset).
    pub answer_format: Option<AnswerFormat>,
    /// Confidence rows must contain `<analysis>`.
    pub require_analysis: bool,
    /// Whether a failed answer format zeroes the accuracy.
    pub format_gate: FormatGate,
    /// Weight of format_ok in the rlcr preset.
    pub format_weight: f64,
}

impl Request {
    /// The resolved settings; a contradictory or out-of-range request is a usage error.
    pub fn settings(&self) -> Result<Settings> {
        let verifier = self.verifier.and_then(VerifierChoice::kind);
        if self.external && verifier.is_some() {
            return Err(usage(
                "--verifier-cmd replaces the built-in verifiers; drop --verifier",
            ));
        }
        verifier_timeout(self.timeout)?;
        if !self.format_weight.is_finite() {
            return Err(usage("--format-weight must be a finite number"));
        }
        if self.preset == Preset::Tinyzero
            && matches!(verifier, Some(k) if k != VerifierKind::Countdown)
        {
            return Err(usage(
                "--reward-preset tinyzero needs the countdown verifier",
            ));
        }
        if self.preset == Preset::Tinyzero && self.external {
            return Err(usage(
                "--reward-preset tinyzero needs the countdown verifier, not --verifier-cmd",
            ));
        }
        let answer_format = match self.answer_format {
            None if self.preset == Preset::RlcrSingle => Some(FormatPattern::Tabc),
            None => Some(FormatPattern::Ta),
            Some(AnswerFormat::Ta) => Some(FormatPattern::Ta),
            Some(AnswerFormat::Tac) => Some(FormatPattern::Tac),
            Some(AnswerFormat::Tabc) => Some(FormatPattern::Tabc),
            Some(AnswerFormat::Tbac) => Some(FormatPattern::Tbac),
            Some(AnswerFormat::None) => None,
        };
        if self.preset == Preset::RlcrSingle
            && !answer_format.is_some_and(FormatPattern::has_confidence)
        {
            return Err(usage(
                "--reward-preset rlcr-single needs an answer format with a confidence (tac, tabc, \
                 tbac)",
            ));
        }
        // An external verifier is the user's reward: rlcr's answer format gates it only when
        // asked.
        let gate = match self.format_gate {
            FormatGate::On => true,
            FormatGate::Off => false,
            FormatGate::Auto => !self.external && self.preset != Preset::Tinyzero,
        };
        let structured = match &self.rewards {
            Some(p) => Some(RewardSpec::from_file(p).map_err(as_usage)?),
            None => None,
        };
        Ok(Settings {
            verifier,
            countdown_compat: self.countdown_compat.unwrap_or_default(),
            answer_format,
            require_analysis: self.require_analysis,
            gate,
            preset: self.preset,
            format_weight: self.format_weight,
            structured,
        })
    }
}

/// A verifier timeout as given, checked: a positive number of seconds (usage error otherwise).
pub fn verifier_timeout(t: Option<f64>) -> Result<Option<f64>> {
    match t {
        Some(t) if !(t.is_finite() && t > 0.0) => Err(usage(format!(
            "--verifier-timeout must be a positive number of seconds, got {t}"
        ))),
        t => Ok(t),
    }
}

/// The stage's scoring settings (resolved; recorded in the output metadata).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Settings {
    /// `None`: pick by `data_source` ([`super::auto_verifier`]).
    pub verifier: Option<VerifierKind>,
    pub countdown_compat: CountdownCompat,
    /// Format required of answer rows; `None`: only that an answer can be extracted.
    pub answer_format: Option<FormatPattern>,
    /// Turn-2 rows must contain `<analysis>`.
    pub require_analysis: bool,
    /// Accuracy is 0 when the answer's format fails.
    pub gate: bool,
    pub preset: Preset,
    /// Weight of the answer format in the `rlcr` preset.
    pub format_weight: f64,
    /// Structured rewards replacing the preset's components.
    pub structured: Option<RewardSpec>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            verifier: None,
            countdown_compat: CountdownCompat::Default,
            answer_format: Some(FormatPattern::Ta),
            require_analysis: false,
            gate: true,
            preset: Preset::Rlcr,
            format_weight: 0.0,
            structured: None,
        }
    }
}

/// A parsed ground truth for one verifier.
#[derive(Debug, Clone, PartialEq)]
pub enum GroundTruth {
    Countdown(Task),
    Golds(Vec<String>),
}

impl GroundTruth {
    /// Parse the ground-truth column text for `kind`.
    pub fn parse(kind: VerifierKind, text: &str) -> anyhow::Result<GroundTruth> {
        Ok(match kind {
            VerifierKind::Countdown => GroundTruth::Countdown(Task::from_json(text)?),
            _ => GroundTruth::Golds(qa::gold_strings(text)),
        })
    }
}

/// The scores of one answer row (`'a`: the response it was read from).
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerScore<'a> {
    /// The extracted answer (a slice of the response whenever it is one).
    pub answer: Option<Cow<'a, str>>,
    pub format_ok: bool,
    /// The verifier's verdict, before gating.
    pub correct: f64,
    /// `acc_reward`: `correct`, gated by format when gating is on.
    pub accuracy: f64,
    /// The countdown score (0 / 0.1 / 1), countdown rows only.
    pub countdown: Option<f32>,
    /// Numbers from an external verifier's `extra`.
    pub extra: Vec<(String, f64)>,
    /// Parsed confidence, for answer rows that carry one (`tac`/`tabc`/`tbac`).
    pub confidence: Option<f64>,
    /// RLCR's five terms (`rlcr-single` preset only).
    pub rlcr_terms: Option<RlcrTerms>,
}

/// The verdict of a built-in verifier: (extracted answer, correct, countdown score). The answer
/// borrows from `response` unless it lies (partly) in the TinyZero prompt prefix.
pub fn verify_builtin<'a>(
    kind: VerifierKind,
    settings: &Settings,
    response: &'a str,
    prompt_prefix: Option<&str>,
    gt: &GroundTruth,
) -> (Option<Cow<'a, str>>, f64, Option<f32>) {
    match (kind, gt) {
        (VerifierKind::Countdown, GroundTruth::Countdown(task)) => {
            let (answer, verdict) = match settings.countdown_compat {
                CountdownCompat::Default => {
                    let o = countdown::score_response(response, task);
                    (o.answer.map(Cow::Borrowed), o.verdict)
                }
                CountdownCompat::Tinyzero => {
                    let prefix = prompt_prefix.unwrap_or("");
                    let full = format!("{prefix}{response}");
                    let o = countdown::tinyzero_compute_score(&full, task);
                    let answer = o.answer.map(|a| {
                        // where the equation sits in `full`
                        let off = a.as_ptr() as usize - full.as_ptr() as usize;
                        match off.checked_sub(prefix.len()) {
                            Some(r) => Cow::Borrowed(&response[r..r + a.len()]),
                            None => Cow::Owned(a.to_string()),
                        }
                    });
                    (answer, o.verdict)
                }
            };
            let correct = if verdict == countdown::Verdict::Correct {
                1.0
            } else {
                0.0
            };
            (answer, correct, Some(verdict.score()))
        }
        (_, GroundTruth::Golds(golds)) => {
            let answer = match kind {
                VerifierKind::Math => math::extract_answer(response),
                _ => last_answer(response),
            };
            let correct = match answer {
                None => 0.0,
                Some(a) => match kind {
                    VerifierKind::Math => golds.iter().any(|g| math::math_equal(a, g)) as u8 as f64,
                    VerifierKind::Exact => qa::best_exact(a, golds) as u8 as f64,
                    VerifierKind::F1 => qa::best_f1(a, golds),
                    VerifierKind::Choice => qa::choice_correct(a, golds) as u8 as f64,
                    VerifierKind::Countdown => 0.0,
                },
            };
            (answer.map(Cow::Borrowed), correct, None)
        }
        // a countdown ground truth given to a text verifier or vice versa cannot happen: the
        // caller parses the ground truth for the verifier it runs
        _ => (None, 0.0, None),
    }
}

/// Complete an answer row's scores from a verdict.
pub fn score_answer<'a>(
    settings: &Settings,
    response: &str,
    answer: Option<Cow<'a, str>>,
    correct: f64,
    countdown: Option<f32>,
    extra: Vec<(String, f64)>,
) -> AnswerScore<'a> {
    let format_ok = match settings.answer_format {
        Some(p) => rlcr::format_ok(response, p),
        None => answer.is_some(),
    };
    let confidence = match settings.answer_format {
        Some(p) if p.has_confidence() => rlcr::parse_confidence_strict(response),
        _ => None,
    };
    let (accuracy, rlcr_terms) = if settings.preset == Preset::RlcrSingle {
        let p = settings.answer_format.unwrap_or(FormatPattern::Tabc);
        let t = RlcrTerms::compute(response, p, correct >= 1.0);
        (t.accuracy, Some(t))
    } else {
        (
            if settings.gate && !format_ok {
                0.0
            } else {
                correct
            },
            None,
        )
    };
    AnswerScore {
        answer,
        format_ok,
        correct,
        accuracy,
        countdown,
        extra,
        confidence,
        rlcr_terms,
    }
}

/// The scores of one confidence row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConfidenceScore {
    /// Turn-2 structure and a strict parse.
    pub format_ok: bool,
    /// The strictly parsed confidence (even when the structure fails).
    pub confidence: Option<f64>,
    /// `1 − (acc − c)²`, 0 when `format_ok` is false.
    pub conf_reward: f64,
}

/// Score a confidence row given its answer's accuracy.
pub fn score_confidence(
    settings: &Settings,
    response: &str,
    answer_accuracy: f64,
) -> ConfidenceScore {
    let confidence = rlcr::parse_confidence_strict(response);
    let format_ok =
        confidence.is_some() && rlcr::confidence_structure_ok(response, settings.require_analysis);
    let conf_reward = if format_ok {
        rlcr::brier_reward(answer_accuracy, confidence)
    } else {
        0.0
    };
    ConfidenceScore {
        format_ok,
        confidence,
        conf_reward,
    }
}

/// What a confidence row knows of its answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParentAnswer {
    pub correct: f64,
    pub accuracy: f64,
}

/// The row being scored, for component values.
pub enum RowScore<'a> {
    Answer(&'a AnswerScore<'a>),
    Confidence(&'a ConfidenceScore, ParentAnswer),
}

/// A builtin source's value for a row ([`structured`] module docs).
pub fn builtin_value(source: &str, row: &RowScore<'_>) -> Value {
    let b = |x: bool| Value::Scalar(if x { 1.0 } else { 0.0 });
    match row {
        RowScore::Answer(a) => match source {
            "correct" => Value::Scalar(a.correct),
            "accuracy" => Value::Scalar(a.accuracy),
            "format_ok" => b(a.format_ok),
            "answer_present" => b(a.answer.is_some()),
            "countdown" => a
                .countdown
                .map_or(Value::Missing, |s| Value::Scalar(s as f64)),
            "confidence" => a.confidence.map_or(Value::Missing, Value::Scalar),
            "brier" => match (&a.rlcr_terms, a.confidence) {
                (Some(t), _) => Value::Scalar(t.brier),
                (None, Some(c)) if a.format_ok => {
                    Value::Scalar(rlcr::brier_reward(a.accuracy, Some(c)))
                }
                _ => Value::Missing,
            },
            s => match s.strip_prefix("extra.") {
                Some(name) => a
                    .extra
                    .iter()
                    .find(|(k, _)| k == name)
                    .map_or(Value::Missing, |(_, v)| Value::Scalar(*v)),
                None => Value::Missing,
            },
        },
        RowScore::Confidence(c, parent) => match source {
            "correct" => Value::Scalar(parent.correct),
            "accuracy" => Value::Scalar(parent.accuracy),
            "format_ok" => b(c.format_ok),
            "brier" => Value::Scalar(c.conf_reward),
            "confidence" => c.confidence.map_or(Value::Missing, Value::Scalar),
            _ => Value::Missing,
        },
    }
}

/// A row's reward components: up to two held inline (the default preset's rows: accuracy and
/// the countdown score, or the Brier term), so that scoring such a row allocates nothing for
/// them (an allocation and a free per row, freed on another thread, were 4 % of `score`'s
/// instructions on light rows); more (other presets, a rewards TOML) go to the heap as before.
/// Two, not more: every row's result is moved a few times on its way to the writer.
pub type Components = smallvec::SmallVec<[Component; 2]>;

/// The preset's components for a row.
pub fn preset_components(settings: &Settings, row: &RowScore<'_>) -> Components {
    let b = |x: bool| if x { 1.0 } else { 0.0 };
    match row {
        RowScore::Answer(a) => {
            let mut v = Components::new();
            match settings.preset {
                Preset::Rlcr => {
                    v.push(Component::new("accuracy", 0, a.accuracy, 1.0));
                    // with weight 0 (the default) it would only repeat the format_ok column
                    if settings.format_weight != 0.0 {
                        v.push(Component::new(
                            "format",
                            0,
                            b(a.format_ok),
                            settings.format_weight,
                        ));
                    }
                    if let Some(s) = a.countdown {
                        v.push(Component::new("countdown", 0, s as f64, 0.0));
                    }
                }
                Preset::RlcrSingle => {
                    let t = a.rlcr_terms.unwrap_or(RlcrTerms {
                        format: 0.0,
                        accuracy: 0.0,
                        brier: 0.0,
                        mean_confidence: 0.0,
                        confidence_one_or_zero: 0.0,
                    });
                    let w = rlcr::RLCR_HOTPOT_WEIGHTS;
                    v.push(Component::new("format", 0, t.format, w[0]));
                    v.push(Component::new("accuracy", 0, t.accuracy, w[1]));
                    v.push(Component::new("brier", 0, t.brier, w[2]));
                    v.push(Component::new(
                        "mean_confidence",
                        0,
                        t.mean_confidence,
                        w[3],
                    ));
                    v.push(Component::new(
                        "confidence_one_or_zero",
                        0,
                        t.confidence_one_or_zero,
                        w[4],
                    ));
                    if let Some(s) = a.countdown {
                        v.push(Component::new("countdown", 0, s as f64, 0.0));
                    }
                }
                Preset::Tinyzero => {
                    v.push(Component::new(
                        "countdown",
                        0,
                        a.countdown.unwrap_or(0.0) as f64,
                        1.0,
                    ));
                    v.push(Component::new("accuracy", 0, a.accuracy, 0.0));
                    v.push(Component::new("format", 0, b(a.format_ok), 0.0));
                }
            }
            for (k, x) in &a.extra {
                v.push(Component::new(format!("extra.{k}"), 0, *x, 0.0));
            }
            v
        }
        RowScore::Confidence(c, _) => {
            smallvec::smallvec![Component::new("brier", 1, c.conf_reward, 1.0)]
        }
    }
}

/// The row's components: the structured spec's when one is set (`column` gives values of
/// column sources), else the preset's.
pub fn components(
    settings: &Settings,
    row: &RowScore<'_>,
    mut column: impl FnMut(&ComponentSpec, &str) -> Value,
) -> Components {
    match &settings.structured {
        None => preset_components(settings, row),
        Some(spec) => {
            let is_conf = matches!(row, RowScore::Confidence(..));
            structured::row_components(spec, is_conf, |c| match &c.source {
                Source::Builtin(s) => builtin_value(s, row),
                Source::Column(name) => column(c, name),
            })
            .into()
        }
    }
}

/// The scalar reward of a row: the total of its components.
pub fn reward(components: &[Component]) -> f64 {
    structured::total(components)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn countdown_gt() -> GroundTruth {
        GroundTruth::parse(
            VerifierKind::Countdown,
            r#"{"target": 23, "numbers": [2, 3, 7]}"#,
        )
        .unwrap()
    }

    fn answer<'a>(
        settings: &Settings,
        kind: VerifierKind,
        response: &'a str,
        gt: &GroundTruth,
    ) -> AnswerScore<'a> {
        let (a, c, s) = verify_builtin(kind, settings, response, None, gt);
        score_answer(settings, response, a, c, s, Vec::new())
    }

    /// [`answer`] of the countdown task of [`countdown_gt`].
    fn countdown_answer<'a>(settings: &Settings, response: &'a str) -> AnswerScore<'a> {
        answer(settings, VerifierKind::Countdown, response, &countdown_gt())
    }

    #[test]
    fn rlcr_two_turn_rewards() {
        let s = Settings::default();
        let good = countdown_answer(&s, "r</think>\n<answer>3*7+2</answer>");
        assert_eq!(
            (good.format_ok, good.correct, good.accuracy, good.countdown),
            (true, 1.0, 1.0, Some(1.0))
        );
        let comps = preset_components(&s, &RowScore::Answer(&good));
        assert_eq!(reward(&comps), 1.0);
        // correct but no </think>: gated to 0, the countdown score is kept for logging
        let bad = countdown_answer(&s, "<answer>3*7+2</answer>");
        assert_eq!(
            (bad.format_ok, bad.correct, bad.accuracy),
            (false, 1.0, 0.0)
        );
        assert_eq!(reward(&preset_components(&s, &RowScore::Answer(&bad))), 0.0);
        let ungated = Settings {
            gate: false,
            format_weight: 0.25,
            ..Settings::default()
        };
        let ungated_reward = |response: &str| {
            let a = countdown_answer(&ungated, response);
            reward(&preset_components(&ungated, &RowScore::Answer(&a)))
        };
        assert_eq!(ungated_reward("<answer>3*7+2</answer>"), 1.0);
        assert_eq!(ungated_reward("x</think><answer>3*7+2</answer>"), 1.25);
        // confidences: Brier against the answer's accuracy (`docs/math.md` §2.3: acc 1, c 0.9 → 0.99)
        let c = score_confidence(
            &s,
            "<analysis>ok</analysis><confidence>0.9</confidence>",
            1.0,
        );
        assert!((c.conf_reward - 0.99).abs() < 1e-12);
        let parent = ParentAnswer {
            correct: 1.0,
            accuracy: 1.0,
        };
        assert!(
            (reward(&preset_components(&s, &RowScore::Confidence(&c, parent))) - 0.99).abs() < 1e-6
        );
        let c = score_confidence(&s, "<confidence>0.2</confidence>", 0.0);
        assert!((c.conf_reward - 0.96).abs() < 1e-12);
        let c = score_confidence(&s, "<confidence>nan</confidence>", 0.0);
        assert_eq!(
            (c.format_ok, c.confidence, c.conf_reward),
            (false, None, 0.0)
        );
        let c = score_confidence(&s, "<confidence>0.2</confidence> extra", 0.0);
        assert_eq!(
            (c.format_ok, c.confidence, c.conf_reward),
            (false, Some(0.2), 0.0)
        );
    }

    #[test]
    fn tinyzero_preset_and_compat() {
        let s = Settings {
            preset: Preset::Tinyzero,
            countdown_compat: CountdownCompat::Tinyzero,
            gate: false,
            ..Settings::default()
        };
        let gt = countdown_gt();
        let prefix = "User: Using the numbers [2, 3, 7] ... Assistant: Let me solve this step by step.\n<think>";
        let resp = "reasoning</think>\n<answer>3*7-2</answer>";
        let (a, c, sc) = verify_builtin(VerifierKind::Countdown, &s, resp, Some(prefix), &gt);
        let row = score_answer(&s, resp, a, c, sc, Vec::new());
        assert_eq!(row.countdown, Some(0.1));
        assert!((reward(&preset_components(&s, &RowScore::Answer(&row))) - 0.1).abs() < 1e-7);
        // without the prompt there is no marker: score 0
        let (_, _, sc) = verify_builtin(VerifierKind::Countdown, &s, resp, None, &gt);
        assert_eq!(sc, Some(0.0));
        // the extracted equation borrows from the response, unless it starts in the prompt
        let (a, _, _) = verify_builtin(VerifierKind::Countdown, &s, resp, Some(prefix), &gt);
        assert!(matches!(a, Some(Cow::Borrowed("3*7-2"))), "{a:?}");
        let (a, _, sc) = verify_builtin(
            VerifierKind::Countdown,
            &s,
            "7+2</answer>",
            Some("Assistant: <answer>3*"),
            &gt,
        );
        assert!(matches!(&a, Some(Cow::Owned(x)) if x == "3*7+2"), "{a:?}");
        assert_eq!(sc, Some(1.0));
    }

    #[test]
    fn rlcr_single_preset_reproduces_weighted_totals() {
        let s = Settings {
            preset: Preset::RlcrSingle,
            answer_format: Some(FormatPattern::Tabc),
            ..Settings::default()
        };
        let gt = GroundTruth::parse(VerifierKind::Exact, "\"Paris\"").unwrap();
        let mk = |ans: &str, conf: &str| {
            format!("<think>t</think><answer>{ans}</answer> <analysis>a</analysis> <confidence>{conf}</confidence>")
        };
        for (resp, want) in [
            (mk("Paris", "0.8"), 1.4800008),
            (mk("Lyon", "0.8"), 0.6800008),
            (mk("Lyon", "0.0"), 1.0000010),
        ] {
            let a = answer(&s, VerifierKind::Exact, &resp, &gt);
            let comps = preset_components(&s, &RowScore::Answer(&a));
            // the components are stored as f32: compare at f32 precision
            assert!(
                (reward(&comps) - want).abs() < 1e-6,
                "{resp}: {} vs {want}",
                reward(&comps)
            );
        }
    }

    #[test]
    fn other_verifiers() {
        let s = Settings {
            answer_format: None,
            ..Settings::default()
        };
        let gt = GroundTruth::parse(VerifierKind::Math, "\"\\\\frac{1}{2}\"").unwrap();
        assert_eq!(
            answer(&s, VerifierKind::Math, "so \\boxed{0.5}", &gt).accuracy,
            1.0
        );
        let gt = GroundTruth::parse(VerifierKind::F1, "[\"the cat sat down\"]").unwrap();
        assert!(
            (answer(&s, VerifierKind::F1, "<answer>cat sat</answer>", &gt).accuracy - 0.8).abs()
                < 1e-12
        );
        let gt = GroundTruth::parse(VerifierKind::Choice, "\"C\"").unwrap();
        assert_eq!(
            answer(&s, VerifierKind::Choice, "<answer>(C)</answer>", &gt).accuracy,
            1.0
        );
        assert_eq!(
            answer(&s, VerifierKind::Choice, "no tag C", &gt).accuracy,
            0.0
        );
    }

    #[test]
    fn structured_components() {
        let spec = RewardSpec::from_toml(
            r#"
            [[turn]]
            name = "format_score"
            weight = 0.15
            source = "format_ok"
            [[turn]]
            name = "validity"
            weight = 0.1
            column = "validity"
            [[global]]
            name = "exact_match"
            weight = 0.3
            source = "correct"
            [[global]]
            name = "_raw_exact_match"
            weight = 1.0
            source = "correct"
            "#,
        )
        .unwrap();
        let s = Settings {
            structured: Some(spec),
            ..Settings::default()
        };
        let a = countdown_answer(&s, "r</think><answer>3*7+2</answer>");
        let comps = components(&s, &RowScore::Answer(&a), |_, name| {
            assert_eq!(name, "validity");
            Value::PerTurn(vec![Some(1.0), Some(0.0)])
        });
        // turn 0: 0.15 + 0.1 = 0.25; turn 1: 0.0; mean 0.125; globals 0.3 (raw skipped)
        assert!((reward(&comps) - 0.425).abs() < 1e-6, "{comps:?}");
        assert_eq!(comps.len(), 5);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1500))]
        // No verifier panics, whatever the response and the ground truth.
        #[test]
        fn verifiers_never_panic(resp in "(<answer>|</answer>|\\\\boxed\\{|\\}|[0-9./,=%$ ()A-Ea-z\\-]|\\\\frac|\\{|.){0,40}", gt in ".{0,20}") {
            let s = Settings { answer_format: Some(FormatPattern::Tabc), ..Settings::default() };
            for kind in [VerifierKind::Math, VerifierKind::Exact, VerifierKind::F1, VerifierKind::Choice] {
                let g = GroundTruth::parse(kind, &gt).unwrap();
                let (a, c, sc) = verify_builtin(kind, &s, &resp, None, &g);
                let row = score_answer(&s, &resp, a, c, sc, Vec::new());
                proptest::prop_assert!((0.0..=1.0).contains(&row.accuracy));
            }
            let c = score_confidence(&s, &resp, 1.0);
            proptest::prop_assert!((0.0..=1.0).contains(&c.conf_reward));
        }
    }

    fn gate(
        verifier: Option<VerifierChoice>,
        external: bool,
        preset: Preset,
        format_gate: FormatGate,
    ) -> bool {
        let r = Request {
            verifier,
            external,
            countdown_compat: None,
            timeout: None,
            preset,
            rewards: None,
            answer_format: None,
            require_analysis: false,
            format_gate,
            format_weight: 0.0,
        };
        r.settings().unwrap().gate
    }

    /// The external verifier's reward is the user's: rlcr's format gate stands in front of it
    /// only when asked; the built-in verifiers keep it.
    #[test]
    fn format_gate_auto_is_off_for_an_external_verifier() {
        use FormatGate::{Auto, Off, On};
        assert!(gate(None, false, Preset::Rlcr, Auto));
        assert!(gate(Some(VerifierChoice::Math), false, Preset::Rlcr, Auto));
        assert!(!gate(None, true, Preset::Rlcr, Auto));
        assert!(gate(None, true, Preset::Rlcr, On));
        assert!(!gate(None, false, Preset::Tinyzero, Auto));
        assert!(!gate(None, false, Preset::Rlcr, Off));
    }
}
