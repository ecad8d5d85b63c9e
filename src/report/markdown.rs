//! `report.md`: the human-readable page that ties the figures and tables together.
//!
//! Plain CommonMark with pipe tables, readable as text and rendered by any viewer (GitHub, VS
//! Code). Numbers are formatted with fixed precision so that the page is deterministic. Example
//! texts go into fenced code blocks whose fence is longer than any backtick run inside, so a
//! model's output cannot break the page; long texts are cut at a character boundary with a note.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::metrics::BinRule;
use super::plot::fmt_opt;
use super::probe::ProbeSummary;
use super::summary::{Metrics, Report, TurnStats};
use super::training::CallDiagnostics;

/// One example row, resolved to text.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExampleRow {
    /// `sample_id` of the row shown.
    pub sample_id: String,
    /// Its sample type.
    pub sample_type: String,
    /// Parsed confidence.
    pub confidence: Option<f64>,
    /// `acc_reward`.
    pub acc: Option<f64>,
    /// `response_text` of the row.
    pub response_text: String,
    /// For a confidence row: its answer row's extracted answer or, failing that, its response.
    pub answer_text: Option<String>,
    /// `ground_truth`, if the table has it.
    pub ground_truth: Option<String>,
}

/// The example sections of one report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExampleSet {
    /// Wrong answers stated with the highest confidence.
    pub most_confident_wrong: Vec<ExampleRow>,
    /// Correct answers stated with the lowest confidence.
    pub least_confident_right: Vec<ExampleRow>,
    /// Confidence rows whose confidence does not parse.
    pub unparseable: Vec<ExampleRow>,
    /// Answer rows with a broken format.
    pub malformed_answers: Vec<ExampleRow>,
}

/// File names of the figures written beside `report.md` (None = not drawn).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FigureFiles {
    /// Reliability diagram.
    pub reliability: Option<String>,
    /// Reward/length histograms.
    pub histograms: Option<String>,
    /// Metrics against iteration.
    pub iterations: Option<String>,
    /// Training curves against the global step, with a one-line description.
    pub training: Option<(String, String)>,
    /// Probe curve.
    pub probe_curve: Option<String>,
    /// Probe vs verbal scatter.
    pub probe_scatter: Option<String>,
}

/// Longest example text shown, in characters.
pub const MAX_EXAMPLE_CHARS: usize = 700;

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn pct(v: Option<f64>) -> String {
    match v {
        Some(v) => format!("{:.1}%", 100.0 * v),
        None => "–".to_string(),
    }
}

/// Cut `s` to at most `max` characters, noting how much was left out. Control characters other
/// than newline and tab (a sampled model emits anything) become `�`, so the page stays text.
pub fn truncate(s: &str, max: usize) -> String {
    let clean = |c: char| {
        if c.is_control() && c != '\n' && c != '\t' {
            '\u{FFFD}'
        } else {
            c
        }
    };
    let n = s.chars().count();
    let cut: String = s.chars().take(max).map(clean).collect();
    if n <= max {
        cut
    } else {
        format!("{cut}\n… ({} more characters)", n - max)
    }
}

/// A fenced code block that survives any content.
pub fn fenced(s: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in s.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}text\n{s}\n{fence}\n")
}

/// The calibration cells that the per-source, per-iteration and probe tables share: mean
/// confidence, Brier, ECE and AUROC at four decimals, joined by the column separator.
fn calibration_cells(
    mean: Option<f64>,
    brier: Option<f64>,
    ece: Option<f64>,
    auroc: Option<f64>,
) -> String {
    [mean, brier, ece, auroc].map(|v| fmt_opt(v, 4)).join(" | ")
}

fn mean_pm(mean: Option<f64>, std: Option<f64>, d: usize) -> String {
    match (mean, std) {
        (Some(m), Some(s)) => format!("{m:.d$} ± {s:.d$}"),
        (Some(m), None) => format!("{m:.d$}"),
        _ => "–".to_string(),
    }
}

fn headline(out: &mut String, m: &Metrics, r: &Report) {
    let rule = r.options.ece_rule;
    let _ = writeln!(out, "| metric | value |\n|---|---|");
    let acc = match (m.accuracy, m.accuracy_se) {
        (Some(a), Some(se)) => format!("{a:.4} (± {se:.4} s.e.)"),
        (a, _) => fmt_opt(a, 4),
    };
    let rows: Vec<(String, String)> = vec![
        ("Accuracy (answers)".into(), acc),
        ("Mean confidence".into(), fmt_opt(m.mean_confidence, 4)),
        ("Brier score".into(), fmt_opt(m.brier, 4)),
        (
            format!("ECE ({} rule, {} bins)", rule.as_str(), r.options.bins),
            fmt_opt(m.ece, 4),
        ),
        (
            format!(
                "ECE ({} rule)",
                if rule == BinRule::Floor {
                    BinRule::Rlcr.as_str()
                } else {
                    BinRule::Floor.as_str()
                }
            ),
            fmt_opt(
                if rule == BinRule::Floor {
                    m.ece_rlcr
                } else {
                    m.ece_floor
                },
                4,
            ),
        ),
        ("AUROC (confidence → correct)".into(), fmt_opt(m.auroc, 4)),
        (
            "Format rate: answers / confidences".into(),
            format!(
                "{} / {}",
                pct(m.format_rate_answers),
                pct(m.format_rate_confidences)
            ),
        ),
        (
            "Confidence parse rate: strict / lenient".into(),
            format!(
                "{} / {}",
                pct(m.parse_rate_strict),
                pct(m.parse_rate_lenient)
            ),
        ),
        (
            "Calibration rows".into(),
            format!(
                "{} {} rows ({} missing confidences counted as 0)",
                m.calibration_rows, m.calibration_rows_from, m.missing_confidences_as_zero
            ),
        ),
        (
            "Mean length (tokens): answers / confidences".into(),
            format!(
                "{} / {}",
                fmt_opt(m.answer_turn.length_mean, 1),
                fmt_opt(m.confidence_turn.length_mean, 1)
            ),
        ),
        (
            "Mean answer length (tokens): correct / wrong".into(),
            format!(
                "{} / {}",
                fmt_opt(m.length_correct_answers, 1),
                fmt_opt(m.length_wrong_answers, 1)
            ),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    out.push('\n');
}

fn turn_row(out: &mut String, name: &str, groups: &str, t: &TurnStats) {
    let len = match (t.length_min, t.length_max) {
        (Some(a), Some(b)) => format!("{} ({a}–{b})", mean_pm(t.length_mean, t.length_std, 1)),
        _ => mean_pm(t.length_mean, t.length_std, 1),
    };
    let _ = writeln!(
        out,
        "| {name} | {} | {} (`{}`) | {len} | {groups}: {} | {} | {} |",
        t.rows,
        mean_pm(t.reward_mean, t.reward_std, 4),
        t.reward_column,
        t.groups,
        t.groups_with_signal,
        pct(t.signal_fraction),
    );
}

fn examples_section(out: &mut String, title: &str, blurb: &str, rows: &[ExampleRow]) {
    let _ = writeln!(out, "### {title}\n\n{blurb}\n");
    if rows.is_empty() {
        let _ = writeln!(out, "_None._\n");
        return;
    }
    for (i, e) in rows.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}. `{}` ({}) · confidence {} · acc_reward {}",
            i + 1,
            e.sample_id.replace('`', "'"),
            e.sample_type,
            fmt_opt(e.confidence, 3),
            fmt_opt(e.acc, 0)
        );
        if let Some(gt) = &e.ground_truth {
            let _ = writeln!(
                out,
                "\n   ground truth: `{}`",
                truncate(gt, 200).replace('`', "'").replace('\n', " ")
            );
        }
        if let Some(a) = &e.answer_text {
            let _ = writeln!(out, "\n   The answer it is about:\n");
            out.push_str(&indent(&fenced(&truncate(a, MAX_EXAMPLE_CHARS))));
        }
        let _ = writeln!(out, "\n   The {} response:\n", e.sample_type);
        out.push_str(&indent(&fenced(&truncate(
            &e.response_text,
            MAX_EXAMPLE_CHARS,
        ))));
        out.push('\n');
    }
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| {
            if l.is_empty() {
                "\n".to_string()
            } else {
                format!("   {l}\n")
            }
        })
        .collect()
}

/// A small or large figure in scientific notation, `–` when absent.
fn fmt_sci(v: Option<f64>) -> String {
    match v {
        Some(0.0) => "0".to_string(),
        Some(x) if x.is_finite() => format!("{x:.2e}"),
        Some(x) => format!("{x}"),
        None => "–".to_string(),
    }
}

/// `## Update diagnostics`: one row per `update` call.
fn update_section(out: &mut String, calls: &[CallDiagnostics]) {
    let _ = writeln!(out, "## Update diagnostics\n");
    let _ = writeln!(
        out,
        "Per `update` call (one per iteration of a loop): the KL of the policy that sampled the \
         batch to the reference (k3, over every learnable token), the rollout/trainer mismatch \
         before the first optimizer step (|Δ| = |response_logprobs − the trainer's log-prob| over \
         the first update batch's learnable tokens; rounding level, ≤ 1e-4, when sampler and \
         trainer agree), the mean approximate KL to the behaviour policy and the mean response \
         lengths over the call's steps.\n"
    );
    // The turns' gradients only when measured (`update --turn-grad-norms`).
    let turns = calls.iter().any(|c| c.grad_answer_norm.is_some());
    if turns {
        let _ = writeln!(
            out,
            "`grad answers` and `grad conf.` are the norms of the answer rows' and the confidence \
             rows' parts of the first update batch's gradient, `cos` the cosine between them \
             (below 0: the turns pull the shared weights apart).\n"
        );
    }
    let (head, rule) = if turns {
        (" grad answers | grad conf. | cos |", "---|---|---|")
    } else {
        ("", "")
    };
    let _ = writeln!(
        out,
        "| call | first step | steps | KL to ref. | max abs Δ logp | mean abs Δ logp | max abs(r − 1) | mean abs(r − 1) | approx. KL | len. answers | len. conf. |{head}\n|---|---|---|---|---|---|---|---|---|---|---|{rule}"
    );
    for c in calls {
        let tail = if turns {
            format!(
                " {} | {} | {} |",
                fmt_opt(c.grad_answer_norm, 4),
                fmt_opt(c.grad_confidence_norm, 4),
                fmt_opt(c.grad_turn_cosine, 3)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |{tail}",
            c.call,
            c.first_step,
            c.steps,
            fmt_sci(c.ref_kl),
            fmt_sci(c.mismatch_logp_max),
            fmt_sci(c.mismatch_logp_mean),
            fmt_sci(c.mismatch_ratio_max),
            fmt_sci(c.mismatch_ratio_mean),
            fmt_sci(c.approx_kl),
            fmt_opt(c.response_length, 1),
            fmt_opt(c.confidence_length, 1)
        );
    }
    out.push('\n');
}

/// Render `report.md`. `reports` are in iteration order; the detailed sections describe the last.
pub fn render(
    reports: &[Report],
    examples: Option<&ExampleSet>,
    probe: Option<&ProbeSummary>,
    figs: &FigureFiles,
    calls: &[CallDiagnostics],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# rlcr calibration report\n");
    let Some(r) = reports.last() else {
        let _ = writeln!(out, "_No input._");
        return out;
    };
    let m = &r.overall;
    let _ = writeln!(
        out,
        "Input: `{}` · {} rows ({} answers, {} confidences) · {} bins, {} rule · missing confidence → {}\n",
        r.input.replace('`', "'"),
        m.rows,
        m.answers,
        m.confidences,
        r.options.bins,
        r.options.ece_rule.as_str(),
        match r.options.missing_confidence {
            super::data::MissingConfidence::Zero => "0 (RLCR eval)",
            super::data::MissingConfidence::Drop => "dropped",
        }
    );
    if reports.len() > 1 {
        let _ = writeln!(
            out,
            "This page describes the last of {} inputs; the iteration summary is below.\n",
            reports.len()
        );
    }
    let _ = writeln!(out, "## Headline\n");
    headline(&mut out, m, r);
    if let Some(f) = &figs.reliability {
        let _ = writeln!(out, "![Reliability diagram]({f})\n");
    }
    let _ = writeln!(out, "## Calibration bins\n");
    let _ = writeln!(
        out,
        "| bin | range | n | mean confidence | accuracy | gap |\n|---|---|---|---|---|---|"
    );
    for (i, b) in r.reliability.iter().enumerate() {
        let close = if i + 1 == r.reliability.len() {
            "]"
        } else {
            ")"
        };
        let _ = writeln!(
            out,
            "| {} | [{:.2}, {:.2}{close} | {} | {} | {} | {} |",
            b.index,
            b.lower,
            b.upper,
            b.count,
            fmt_opt(b.mean_confidence, 4),
            fmt_opt(b.accuracy, 4),
            fmt_opt(b.gap(), 4)
        );
    }
    out.push('\n');

    let _ = writeln!(out, "## Training signal by turn\n");
    let _ = writeln!(
        out,
        "A group carries signal when its rewards are not all equal (non-zero std): only those groups give \
         a non-zero group-normalised advantage.\n"
    );
    let _ = writeln!(
        out,
        "| turn | rows | reward mean ± std | length, tokens: mean ± std (min–max) | groups | with signal | fraction |\n|---|---|---|---|---|---|---|"
    );
    turn_row(&mut out, "answers", "G_a groups (prompts)", &m.answer_turn);
    turn_row(
        &mut out,
        "confidences",
        "G_c groups (answers)",
        &m.confidence_turn,
    );
    out.push('\n');
    if let Some(f) = &figs.histograms {
        let _ = writeln!(out, "![Rewards and lengths of the two turns]({f})\n");
    }

    if !r.per_source.is_empty() {
        let _ = writeln!(out, "## By data source\n");
        let _ = writeln!(
            out,
            "| data_source | answers | accuracy | mean conf. | Brier | ECE | AUROC | format (ans.) | parse (strict) |\n|---|---|---|---|---|---|---|---|---|"
        );
        for (s, pm) in &r.per_source {
            let name = if s.is_empty() {
                "(none)".to_string()
            } else {
                cell(s)
            };
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} | {} |",
                pm.answers,
                fmt_opt(pm.accuracy, 4),
                calibration_cells(pm.mean_confidence, pm.brier, pm.ece, pm.auroc),
                pct(pm.format_rate_answers),
                pct(pm.parse_rate_strict)
            );
        }
        out.push('\n');
    }

    let held = super::held_in_names(reports);
    if reports.len() == 1 && !held.is_empty() {
        let _ = writeln!(out, "## Held-in probe sets\n");
        let _ = writeln!(
            out,
            "| set | input | answers | accuracy |\n|---|---|---|---|"
        );
        for (n, h) in &r.held_in {
            let _ = writeln!(
                out,
                "| {} | `{}` | {} | {} ± {} |",
                cell(n),
                cell(&h.input).replace('`', "'"),
                h.answers,
                fmt_opt(h.accuracy, 4),
                fmt_opt(h.accuracy_se, 4)
            );
        }
        out.push('\n');
    }
    // The update calls line up with the inputs when there is one per input (a loop's file).
    let aligned = !calls.is_empty() && calls.len() == reports.len();
    if reports.len() > 1 {
        let _ = writeln!(out, "## Across iterations\n");
        if !held.is_empty() {
            let _ = writeln!(
                out,
                "`accuracy` is the sampled batch's; `held-in NAME` the same policy's on a fixed \
                 probe set (the same prompts every iteration).\n"
            );
        }
        let mut head = "| iteration | input | accuracy |".to_string();
        let mut rule = "|---|---|---|".to_string();
        for n in &held {
            head += &format!(" held-in {} |", cell(n));
            rule += "---|";
        }
        head += " mean conf. | Brier | ECE | AUROC | signal G_a | signal G_c | len. answers | len. conf. |";
        rule += "---|---|---|---|---|---|---|---|";
        if aligned {
            head += " KL to ref. | mismatch max |";
            rule += "---|---|";
        }
        let _ = writeln!(out, "{head}\n{rule}");
        for (k, r) in reports.iter().enumerate() {
            let m = &r.overall;
            let mut extra = String::new();
            for n in &held {
                extra += &format!(
                    " {} |",
                    fmt_opt(r.held_in.get(n).and_then(|h| h.accuracy), 4)
                );
            }
            let tail = if aligned {
                format!(
                    " {} | {} |",
                    fmt_sci(calls[k].ref_kl),
                    fmt_sci(calls[k].mismatch_logp_max)
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "| {} | `{}` | {} |{extra} {} | {} | {} | {} | {} |{tail}",
                r.iteration,
                cell(&r.input).replace('`', "'"),
                fmt_opt(m.accuracy, 4),
                calibration_cells(m.mean_confidence, m.brier, m.ece, m.auroc),
                pct(m.answer_turn.signal_fraction),
                pct(m.confidence_turn.signal_fraction),
                fmt_opt(m.answer_turn.length_mean, 1),
                fmt_opt(m.confidence_turn.length_mean, 1)
            );
        }
        out.push('\n');
        if let Some(f) = &figs.iterations {
            let _ = writeln!(out, "![Metrics against iteration]({f})\n");
        }
    }

    if let Some((f, what)) = &figs.training {
        let _ = writeln!(out, "## Training curves\n");
        let _ = writeln!(out, "{what}\n");
        let _ = writeln!(out, "![Training curves against the global step]({f})\n");
    }
    if !calls.is_empty() {
        update_section(&mut out, calls);
    }

    if let Some(p) = probe {
        let _ = writeln!(out, "## Faithfulness probe\n");
        let _ = writeln!(
            out,
            "{} rollouts, {} probe rows. At each cut the thinking is truncated, `</think>` and the answer \
             opening are forced, and N continuations are verified; the probe confidence is correct / N.\n",
            p.rollouts, p.rows
        );
        let _ = writeln!(
            out,
            "| cut | fraction | rollouts | correct / samples | mean probe ± s.e. | mean binomial s.e. | ends correct | ends wrong | Brier | AUROC |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for c in &p.cuts {
            let _ = writeln!(
                out,
                "| {} | {:.3} | {} | {} / {} | {} | {:.4} | {} | {} | {} | {} |",
                c.cut_index,
                c.cut_fraction,
                c.rollouts,
                c.correct,
                c.samples,
                mean_pm(Some(c.mean_probe), c.se, 4),
                c.mean_binomial_se,
                fmt_opt(c.mean_probe_correct, 4),
                fmt_opt(c.mean_probe_wrong, 4),
                fmt_opt(c.brier, 4),
                fmt_opt(c.auroc, 4)
            );
        }
        out.push('\n');
        let _ = writeln!(
            out,
            "| signal | n | mean | Brier | ECE | AUROC |\n|---|---|---|---|---|---|"
        );
        for (name, s) in [
            ("probe at the last cut", &p.final_probe),
            ("verbal confidence", &p.verbal),
        ] {
            let _ = writeln!(
                out,
                "| {name} | {} | {} |",
                s.n,
                calibration_cells(s.mean, s.brier, s.ece, s.auroc)
            );
        }
        let _ = writeln!(
            out,
            "\nAccuracy of the probed answers: {} · Pearson r (last-cut probe, verbal): {}\n",
            fmt_opt(p.accuracy, 4),
            fmt_opt(p.pearson_final_probe_verbal, 3)
        );
        for (alt, f) in [
            ("Probe curve", &figs.probe_curve),
            ("Probe vs verbal confidence", &figs.probe_scatter),
        ] {
            if let Some(f) = f {
                let _ = writeln!(out, "![{alt}]({f})\n");
            }
        }
    }

    if let Some(ex) = examples {
        let _ = writeln!(out, "## Examples\n");
        examples_section(
            &mut out,
            "Most confident and wrong",
            "Wrong answers whose stated confidence is highest.",
            &ex.most_confident_wrong,
        );
        examples_section(
            &mut out,
            "Least confident and right",
            "Correct answers whose stated confidence is lowest.",
            &ex.least_confident_right,
        );
        examples_section(
            &mut out,
            "Unparseable confidences",
            "Confidence rows without a valid confidence in [0, 1].",
            &ex.unparseable,
        );
        examples_section(
            &mut out,
            "Malformed answers",
            "Answer rows that fail the format check.",
            &ex.malformed_answers,
        );
    }

    let d = &r.diagnostics;
    let _ = writeln!(out, "## Diagnostics\n");
    let missing = if d.missing_columns.is_empty() {
        "none".to_string()
    } else {
        d.missing_columns.join(", ")
    };
    let _ = writeln!(
        out,
        "- Columns missing from the input (figures that need them are empty): {missing}"
    );
    let _ = writeln!(
        out,
        "- Confidences outside [0, 1] or not finite (treated as missing): {}",
        d.invalid_confidences
    );
    let _ = writeln!(
        out,
        "- Confidence rows without their answer row in the table: {}",
        d.confidences_without_answer
    );
    let _ = writeln!(
        out,
        "- Confidence rows whose acc_reward differs from their answer's: {}",
        d.label_mismatches
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_and_truncation() {
        assert_eq!(fenced("a"), "```text\na\n```\n");
        assert_eq!(fenced("x ```` y"), "`````text\nx ```` y\n`````\n");
        assert_eq!(truncate("héllo", 10), "héllo");
        assert_eq!(truncate("héllo", 2), "hé\n… (3 more characters)");
        assert_eq!(cell("a|b\nc"), "a\\|b c");
        assert_eq!(
            truncate("a\u{0}b\u{1b}[0m\n\tc", 20),
            "a\u{FFFD}b\u{FFFD}[0m\n\tc"
        );
    }
}
