//! The `rlcr import` engine: records of another tool ([`super::read`]) → a trajectory table that
//! `score`, `report` and `probe` read, behind a clap-free [`Plan`] and [`run`].
//!
//! Design decisions:
//! - **Prompts and answers.** Records with the same prompt at the same step form one prompt
//!   (`prompt_id` `s{step}-p{n}`, or `p{n}` without a step, numbered in order of first
//!   appearance); each completion is an answer row (`answer_idx` in order). Ground truth and
//!   data source are the first record's; a later record of the same prompt with another ground
//!   truth is an error.
//! - **Two turns.** A chat record whose conversation ends with an assistant message followed by a
//!   user message is a confidence turn: its completions are confidence rows of the answer that
//!   assistant message holds (the answer row is made from it, or is the record that produced it
//!   when the file holds that too: same prompt, same text). **One turn** (RLCR's single
//!   completion, `<answer>…</answer><confidence>…</confidence>`): the answer row carries both
//!   spans, and `score --answer-format tac` (or `tabc`) reads its confidence.
//! - **Tokens.** Prompts are tokenized as the model saw them where the log allows it: a chat
//!   conversation is rendered with the model's chat template (generation prompt added), a text
//!   prompt (TRL's rendered prompt, a completions request) is tokenized as it is. verl's dump
//!   drops the template's special tokens from `input`, so its context ids are those of the text
//!   without them. A completion is tokenized as text, or taken from the response's token ids when
//!   the server returned them (`token_id:N`, vLLM's `return_tokens_as_token_ids`).
//! - **Spans** follow the sampling stages' rules on the decoded text (`docs/schemas.md`); an
//!   answer without `<think>` (nor one opened by the prompt) spans from its first token to the end
//!   of its last `</answer>`.
//! - **Log-probs.** `response_logprobs` is written when every row has them: the response's
//!   per-token log-probs, used where its tokens are the tokenizer's (same token boundaries over the
//!   same text, or the same ids). Otherwise the column is left out (a table without behaviour
//!   log-probs, as the schema allows for a table not made by sampling) and the summary says why.
//! - **Finish reasons**: the response's `finish_reason` (`length` stays `length`, anything else is
//!   `stop`); tools that do not log it give `stop`.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use serde::Serialize;
use serde_json::Value;

use super::{Completion, Format, Prompt, ReadOptions, Record, TokenLogprob};
use crate::model::{ChatOptions, ChatTemplate, Message, ModelConfig, Tokenizer};
use crate::sample::spans::{
    answer_span, confidence_span, context_opens, context_opens_confidence, Span, THINK_OPEN,
};
use crate::sample::stage::SampledColumns;
use crate::sample::{FinishReason, Generated};
use crate::table::{self, cols, Meta, Validator, TRAJECTORY};

/// What to import: the validated form of `rlcr import`'s flags.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Files, or folders of `*.jsonl` / `*.json` files.
    pub inputs: Vec<PathBuf>,
    pub format: Format,
    /// The ground truth's key.
    pub label_key: String,
    /// OpenAI Batch API input file.
    pub requests: Option<PathBuf>,
    /// The model folder whose tokenizer and chat template are used.
    pub model: PathBuf,
    pub chat: ChatOptions,
    /// `data_source` of records that carry none.
    pub data_source: String,
    /// The trajectory table written.
    pub out: PathBuf,
    /// The settings recorded in the output's `rlcr.config`.
    pub config: Value,
}

/// What [`run`] did (also stored as `rlcr.import_summary`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub files: usize,
    pub records: usize,
    /// Failed requests skipped (OpenAI).
    pub failed_requests: usize,
    pub prompts: usize,
    pub answers: usize,
    pub confidences: usize,
    /// Answer rows with an answer span / a confidence span (single completion).
    pub answer_spans: usize,
    pub answer_confidence_spans: usize,
    /// Confidence rows with a confidence span.
    pub confidence_spans: usize,
    /// Rows whose behaviour log-probs were recorded and line up with the tokens.
    pub rows_with_logprobs: usize,
    /// Whether `response_logprobs` was written (every row had them).
    pub logprobs_written: bool,
    /// Rows whose completion text does not survive the tokenizer's round trip (the table holds
    /// the decoded text).
    pub text_changed: usize,
}

impl Summary {
    /// The summary line.
    pub fn line(&self, out: &std::path::Path) -> String {
        let mut s = format!(
            "import: {} records from {} file(s) -> {} prompts, {} answers ({} with an answer span, \
             {} with a confidence span), {} confidence rows ({} with a span)",
            self.records,
            self.files,
            self.prompts,
            self.answers,
            self.answer_spans,
            self.answer_confidence_spans,
            self.confidences,
            self.confidence_spans
        );
        if self.failed_requests > 0 {
            s += &format!("; {} failed requests skipped", self.failed_requests);
        }
        s += &if self.logprobs_written {
            "; response_logprobs written".to_string()
        } else {
            format!(
                "; no response_logprobs ({} of {} rows had usable log-probs)",
                self.rows_with_logprobs,
                self.answers + self.confidences
            )
        };
        if self.text_changed > 0 {
            s += &format!(
                "; {} completions did not round-trip through the tokenizer (decoded text kept)",
                self.text_changed
            );
        }
        format!("{s} -> {}", out.display())
    }
}

/// An answer being assembled.
struct Answer {
    text: String,
    /// The completion that produced it (one-turn record), if the file holds it.
    completion: Option<Completion>,
    /// Confidence turns: (full conversation, completion).
    confidences: Vec<(Vec<Message>, Completion)>,
}

/// A prompt being assembled.
struct Group {
    prompt: Prompt,
    step: Option<i64>,
    ground_truth: Option<Value>,
    data_source: Option<String>,
    answers: Vec<Answer>,
    /// Where its ground truth came from (for the error on a conflicting one).
    first: super::Loc,
}

/// The prompt and the assistant/user tail of a two-turn chat record.
fn split_turns(p: &Prompt) -> Option<(Prompt, &str, &[Message])> {
    let Prompt::Chat(m) = p else { return None };
    let n = m.len();
    if n >= 3 && m[n - 1].role == "user" && m[n - 2].role == "assistant" {
        Some((
            Prompt::Chat(m[..n - 2].to_vec()),
            m[n - 2].content.as_str(),
            m,
        ))
    } else {
        None
    }
}

fn prompt_key(p: &Prompt, step: Option<i64>) -> String {
    let body = match p {
        Prompt::Text(t) => format!("t{t}"),
        Prompt::Chat(m) => format!("c{}", serde_json::to_string(m).unwrap_or_default()),
    };
    format!("{step:?}\u{0}{body}")
}

/// Group the records into prompts and answers (see the module docs).
fn group(records: Vec<Record>) -> Result<Vec<Group>> {
    let mut groups: Vec<Group> = Vec::new();
    let mut by_key: HashMap<String, usize> = HashMap::new();
    for r in records {
        let two = split_turns(&r.prompt).map(|(p, a, all)| (p, a.to_string(), all.to_vec()));
        let prompt = match &two {
            Some((p, _, _)) => p.clone(),
            None => r.prompt.clone(),
        };
        let key = prompt_key(&prompt, r.step);
        let gi = *by_key.entry(key).or_insert_with(|| {
            groups.push(Group {
                prompt,
                step: r.step,
                ground_truth: r.ground_truth.clone(),
                data_source: r.data_source.clone(),
                answers: Vec::new(),
                first: r.loc.clone(),
            });
            groups.len() - 1
        });
        let g = &mut groups[gi];
        if let Some(b) = &r.ground_truth {
            if let Some(a) = g.ground_truth.as_ref().filter(|a| *a != b) {
                bail!(
                    "{}: ground truth {b} differs from {a} given for the same prompt at {}",
                    r.loc,
                    g.first
                );
            }
            if g.ground_truth.is_none() {
                g.ground_truth = Some(b.clone());
                g.first = r.loc.clone();
            }
        }
        if g.data_source.is_none() {
            g.data_source = r.data_source.clone();
        }
        match two {
            Some((_, answer_text, all)) => {
                let ai = match g.answers.iter().position(|a| a.text == answer_text) {
                    Some(i) => i,
                    None => {
                        g.answers.push(Answer {
                            text: answer_text,
                            completion: None,
                            confidences: Vec::new(),
                        });
                        g.answers.len() - 1
                    }
                };
                for c in r.completions {
                    g.answers[ai].confidences.push((all.clone(), c));
                }
            }
            None => {
                for c in r.completions {
                    // The answer a confidence turn quoted, met again as its own record.
                    let quoted = g.answers.iter().position(|a| {
                        a.text == c.text && a.completion.is_none() && !a.confidences.is_empty()
                    });
                    match quoted {
                        Some(i) => g.answers[i].completion = Some(c),
                        None => g.answers.push(Answer {
                            text: c.text.clone(),
                            completion: Some(c),
                            confidences: Vec::new(),
                        }),
                    }
                }
            }
        }
    }
    Ok(groups)
}

/// The tokenizer and template of the model folder.
struct Encoder {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    model: PathBuf,
}

impl Encoder {
    /// `(text, ids)` of a prompt, with the generation prompt for a conversation.
    fn context(&self, p: &Prompt) -> Result<(String, Vec<u32>)> {
        let text = match p {
            Prompt::Text(t) => t.clone(),
            Prompt::Chat(m) => {
                let t = self.template.as_ref().with_context(|| {
                    format!(
                        "{}: no chat template to render the conversations with (give one with \
                         --chat-template)",
                        self.model.display()
                    )
                })?;
                t.render(m, true)?
            }
        };
        let ids = self.tokenizer.encode(&text, false)?;
        Ok((text, ids))
    }

    /// The response of a completion: ids, decoded text, per-token ends and log-probs (when they
    /// line up with the ids).
    fn response(&self, text: &str, lp: Option<&[TokenLogprob]>) -> Result<Generated> {
        let from_ids = lp.and_then(token_ids);
        let ids = match &from_ids {
            Some(ids) => ids.clone(),
            None => self.tokenizer.encode(text, false)?,
        };
        let decode = |ids: &[u32]| self.tokenizer.decode(ids, false);
        let (decoded, ends) = crate::sample::stop::offsets_of(&ids, None, &decode)?;
        let logprobs = match (lp, &from_ids) {
            (Some(lp), Some(_)) => lp.iter().map(|t| t.logprob).collect(),
            (Some(lp), None) => aligned(lp, &decoded, &ends).unwrap_or_default(),
            (None, _) => Vec::new(),
        };
        Ok(Generated {
            ids,
            logprobs,
            text: decoded,
            ends,
            finish: FinishReason::Stop,
        })
    }
}

/// The ids of a response whose log-prob tokens are all `token_id:N`.
fn token_ids(lp: &[TokenLogprob]) -> Option<Vec<u32>> {
    if lp.is_empty() {
        return None;
    }
    lp.iter()
        .map(|t| t.token.strip_prefix("token_id:")?.parse::<u32>().ok())
        .collect()
}

/// The log-probs of `lp` when its tokens cover `text` with the same boundaries as the
/// tokenizer's tokens (`ends`); trailing zero-width entries (an end-of-sequence token decoded to
/// nothing) are dropped.
fn aligned(lp: &[TokenLogprob], text: &str, ends: &[usize]) -> Option<Vec<f32>> {
    let mut lp = lp;
    while let Some((last, rest)) = lp.split_last() {
        let width = last.bytes.as_ref().map_or(last.token.len(), Vec::len);
        if width > 0 {
            break;
        }
        lp = rest;
    }
    if lp.len() != ends.len() {
        return None;
    }
    let mut bytes: Vec<u8> = Vec::with_capacity(text.len());
    for (t, &end) in lp.iter().zip(ends) {
        match &t.bytes {
            Some(b) => bytes.extend_from_slice(b),
            None => bytes.extend_from_slice(t.token.as_bytes()),
        }
        if bytes.len() != end {
            return None;
        }
    }
    (bytes == text.as_bytes()).then(|| lp.iter().map(|t| t.logprob).collect())
}

fn finish_of(c: &Completion) -> FinishReason {
    match c.finish.as_deref() {
        Some("length") => FinishReason::Length,
        _ => FinishReason::Stop,
    }
}

/// The conversation recorded for a prompt (a text prompt as one user message).
fn messages_of(p: &Prompt) -> Vec<Message> {
    match p {
        Prompt::Text(t) => vec![Message::new("user", t)],
        Prompt::Chat(m) => m.clone(),
    }
}

/// Import the records of `plan` into its output table.
pub fn run(plan: &Plan) -> Result<Summary> {
    let files = super::input_files(&plan.inputs)?;
    let mut all_inputs: Vec<&std::path::Path> = files.iter().map(PathBuf::as_path).collect();
    if let Some(r) = &plan.requests {
        all_inputs.push(r);
    }
    crate::fs::check_distinct(&all_inputs, &plan.out)?;
    let read = super::read(
        &files,
        &ReadOptions {
            format: plan.format,
            label_key: plan.label_key.clone(),
            requests: plan.requests.clone(),
        },
    )?;
    let mut summary = Summary {
        files: files.len(),
        records: read.records.len(),
        failed_requests: read.failed,
        ..Summary::default()
    };
    if read.records.is_empty() {
        bail!(
            "{}: no records to import; nothing was written",
            files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let groups = group(read.records)?;
    if let Some(g) = groups.iter().find(|g| g.ground_truth.is_none()) {
        bail!(
            "{}: no ground truth under the key `{}` (score needs one per prompt); give the key \
             the records use with --label-key{}",
            g.first,
            plan.label_key,
            if plan.format == Format::Openai {
                " (looked up in the line, then in the request's metadata)"
            } else {
                ""
            }
        );
    }

    let (dir, _) = crate::model::lora::resolve(&plan.model, None)?;
    let config = ModelConfig::load(&dir)
        .with_context(|| format!("reading the model folder {}", plan.model.display()))?;
    let enc = Encoder {
        tokenizer: Tokenizer::load(&dir, Some(&config))?,
        template: plan.chat.template_for(&dir)?,
        model: plan.model.clone(),
    };

    let mut c = SampledColumns::default();
    let (mut prompt_ids, mut sources, mut truths) = (Vec::new(), Vec::new(), Vec::new());
    let mut rows_lp = 0usize;
    for (gi, g) in groups.iter().enumerate() {
        let prompt_id = match g.step {
            Some(s) => format!("s{s}-p{gi:06}"),
            None => format!("p{gi:06}"),
        };
        let truth = serde_json::to_string(g.ground_truth.as_ref().unwrap_or(&Value::Null))?;
        let source = g
            .data_source
            .clone()
            .unwrap_or_else(|| plan.data_source.clone());
        let (ctx_text, ctx_ids) = enc
            .context(&g.prompt)
            .with_context(|| format!("{}: the prompt", g.first))?;
        let prefilled = context_opens(&ctx_text, THINK_OPEN, &["</think>"]);
        let prompt_messages = messages_of(&g.prompt);
        let mut push = |c: &mut SampledColumns,
                        kind: &'static str,
                        k: usize,
                        h: Option<usize>,
                        messages: &[Message],
                        ctx: &[u32],
                        gen: &Generated,
                        spans: (Option<Span>, Option<Span>)|
         -> Result<()> {
            let sample_id = match h {
                Some(h) => format!("{prompt_id}/a{k}/c{h}"),
                None => format!("{prompt_id}/a{k}"),
            };
            c.push(
                kind,
                crate::sample::stage::to_i32(k, "answer_idx")?,
                h.map(|h| crate::sample::stage::to_i32(h, "confidence_idx"))
                    .transpose()?,
                sample_id,
                messages,
                ctx,
                gen,
                spans.0,
                spans.1,
            )?;
            prompt_ids.push(prompt_id.clone());
            sources.push(source.clone());
            truths.push(truth.clone());
            Ok(())
        };
        for (k, a) in g.answers.iter().enumerate() {
            let lp = a.completion.as_ref().and_then(|c| c.logprobs.as_deref());
            let mut gen = enc.response(&a.text, lp)?;
            if let Some(comp) = &a.completion {
                gen.finish = finish_of(comp);
            }
            summary.text_changed += usize::from(gen.text != a.text);
            rows_lp += usize::from(!gen.logprobs.is_empty() || gen.ids.is_empty());
            let think = prefilled || !gen.text.contains(THINK_OPEN);
            let aspan = answer_span(&gen.text, &gen.ends, think);
            let cspan = confidence_span(&gen.text, &gen.ends, false);
            summary.answer_spans += usize::from(aspan.is_some());
            summary.answer_confidence_spans += usize::from(cspan.is_some());
            push(
                &mut c,
                "answer",
                k,
                None,
                prompt_messages.as_slice(),
                ctx_ids.as_slice(),
                &gen,
                (aspan, cspan),
            )?;
            for (h, (conv, comp)) in a.confidences.iter().enumerate() {
                let (cctx_text, cctx_ids) = enc.context(&Prompt::Chat(conv.clone()))?;
                let mut gen = enc.response(&comp.text, comp.logprobs.as_deref())?;
                gen.finish = finish_of(comp);
                summary.text_changed += usize::from(gen.text != comp.text);
                rows_lp += usize::from(!gen.logprobs.is_empty() || gen.ids.is_empty());
                let span =
                    confidence_span(&gen.text, &gen.ends, context_opens_confidence(&cctx_text));
                summary.confidence_spans += usize::from(span.is_some());
                push(
                    &mut c,
                    "confidence",
                    k,
                    Some(h),
                    conv.as_slice(),
                    cctx_ids.as_slice(),
                    &gen,
                    (None, span),
                )?;
                summary.confidences += 1;
            }
            summary.answers += 1;
        }
    }
    summary.prompts = groups.len();
    summary.rows_with_logprobs = rows_lp;
    let n = c.len();
    summary.logprobs_written = rows_lp == n;

    let base = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("prompt_id", DataType::Utf8, false),
            Field::new("data_source", DataType::Utf8, false),
            Field::new("ground_truth", DataType::Utf8, false),
        ])),
        vec![
            Arc::new(StringArray::from(prompt_ids)) as ArrayRef,
            Arc::new(StringArray::from(sources)),
            Arc::new(StringArray::from(truths)),
        ],
    )?;
    let mut batch = cols::set_columns(&base, &TRAJECTORY, c.into_arrays())?;
    if !summary.logprobs_written {
        batch = cols::drop_columns(&batch, &["response_logprobs"])?;
    }
    // What score and report will check, checked before anything is written.
    let name = plan.out.display().to_string();
    let mut v = Validator::new(&name, &TRAJECTORY);
    v.check_batch(&batch)?;
    v.finish()?;
    let mut meta = Meta::new(&TRAJECTORY, "import", plan.config.clone(), &all_inputs);
    meta.extra
        .insert("import_summary".into(), serde_json::to_string(&summary)?);
    table::write_table(&plan.out, batch.schema(), &[batch], &meta)?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(tokens: &[&str]) -> Vec<TokenLogprob> {
        tokens
            .iter()
            .map(|t| TokenLogprob {
                token: t.to_string(),
                bytes: None,
                logprob: -1.0,
            })
            .collect()
    }

    #[test]
    fn logprobs_line_up_only_on_the_same_boundaries() {
        let text = "ab c";
        // Tokens "ab", " c": ends 2, 4.
        assert_eq!(
            aligned(&lp(&["ab", " c"]), text, &[2, 4]),
            Some(vec![-1.0; 2])
        );
        // A trailing end-of-sequence token that decodes to nothing is dropped.
        assert_eq!(
            aligned(&lp(&["ab", " c", ""]), text, &[2, 4]),
            Some(vec![-1.0; 2])
        );
        // Other boundaries, other counts, other text: no log-probs.
        assert_eq!(aligned(&lp(&["a", "b c"]), text, &[2, 4]), None);
        assert_eq!(aligned(&lp(&["ab c"]), text, &[2, 4]), None);
        assert_eq!(aligned(&lp(&["ab", " d"]), text, &[2, 4]), None);
        assert_eq!(
            token_ids(&lp(&["token_id:5", "token_id:9"])),
            Some(vec![5, 9])
        );
        assert_eq!(token_ids(&lp(&["token_id:5", "x"])), None);
    }

    /// A completion's tokens: the server's ids when it returned them (`token_id:N`), else the
    /// tokenizer's; log-probs kept on the same tokens only.
    #[test]
    fn responses_take_server_ids_and_aligned_logprobs() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-qwen2");
        let enc = Encoder {
            tokenizer: Tokenizer::load(&dir, None).unwrap(),
            template: None,
            model: dir.clone(),
        };
        let text = "<think>7 plus 5 is 12.</think> <answer>12</answer>";
        let ids = enc.tokenizer.encode(text, false).unwrap();
        let pieces: Vec<TokenLogprob> = ids
            .iter()
            .enumerate()
            .map(|(i, &t)| TokenLogprob {
                token: enc.tokenizer.decode(&[t], false).unwrap(),
                bytes: None,
                logprob: -(i as f32) / 10.0,
            })
            .collect();
        let want: Vec<f32> = pieces.iter().map(|t| t.logprob).collect();
        let g = enc.response(text, Some(&pieces)).unwrap();
        assert_eq!(
            (g.ids.clone(), g.logprobs.clone(), g.text.as_str()),
            (ids.clone(), want.clone(), text)
        );
        // Ids as vLLM returns them with return_tokens_as_token_ids: used as they are, even where
        // the tokenizer would split the text otherwise.
        let mut as_ids: Vec<TokenLogprob> = ids
            .iter()
            .zip(&want)
            .map(|(t, &l)| TokenLogprob {
                token: format!("token_id:{t}"),
                bytes: None,
                logprob: l,
            })
            .collect();
        as_ids.swap(1, 2);
        let g = enc.response("ignored", Some(&as_ids)).unwrap();
        assert_eq!(g.ids[1], ids[2]);
        assert_eq!(g.logprobs.len(), ids.len());
        // One entry for the whole text: other boundaries, no log-probs (the ids are the tokenizer's).
        let whole = [TokenLogprob {
            token: text.into(),
            bytes: None,
            logprob: -1.0,
        }];
        let g = enc.response(text, Some(&whole)).unwrap();
        assert_eq!(g.ids, ids);
        assert!(g.logprobs.is_empty());
    }

    fn rec(line: usize, prompt: Prompt, texts: &[&str], gt: &str) -> Record {
        Record {
            loc: super::super::Loc {
                file: "f.jsonl".into(),
                line,
                row: false,
            },
            prompt,
            completions: texts
                .iter()
                .map(|t| Completion {
                    text: t.to_string(),
                    finish: None,
                    logprobs: None,
                })
                .collect(),
            ground_truth: Some(Value::String(gt.into())),
            data_source: None,
            step: None,
        }
    }

    #[test]
    fn two_turn_records_attach_to_their_answers() {
        let q = vec![Message::new("user", "q")];
        let conv = |a: &str| {
            vec![
                Message::new("user", "q"),
                Message::new("assistant", a),
                Message::new("user", "how sure?"),
            ]
        };
        let gs = group(vec![
            rec(1, Prompt::Chat(q.clone()), &["A1", "A2"], "4"),
            rec(
                2,
                Prompt::Chat(conv("A2")),
                &["<confidence>0.5</confidence>"],
                "4",
            ),
            rec(3, Prompt::Chat(conv("A3")), &["c1", "c2"], "4"),
        ])
        .unwrap();
        assert_eq!(gs.len(), 1);
        let a = &gs[0].answers;
        assert_eq!(a.len(), 3);
        assert_eq!((a[1].text.as_str(), a[1].confidences.len()), ("A2", 1));
        assert!(a[1].completion.is_some());
        assert_eq!((a[2].text.as_str(), a[2].confidences.len()), ("A3", 2));
        assert!(a[2].completion.is_none());
        let e = group(vec![
            rec(1, Prompt::Text("p".into()), &["x"], "4"),
            rec(2, Prompt::Text("p".into()), &["y"], "5"),
        ])
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
        assert!(e.contains("f.jsonl, line 2") && e.contains("line 1"), "{e}");
    }
}
