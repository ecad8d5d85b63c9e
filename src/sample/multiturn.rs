//! Multi-turn rollouts with an environment: the model writes a turn, the environment
//! answers with an observation, the observation's tokens join the response as **information
//! tokens**, and the model's next turn continues from the KV cache; until the environment says
//! `done`, `--max-turns` model turns were written, or the response budget is spent.
//!
//! Per sample the result is one response made of model tokens and observation tokens, with
//! - `info_mask[t]`: true for model tokens, false for observation tokens (never trained);
//! - `token_turn_ids[t]`: the 0-based model turn of a model token, -1 for observation tokens
//!   (the schema's "-1 for non-trainable tokens");
//! - `logprobs[t]`: the behaviour log-prob of a model token (as in [`super::sampler`]), 0 for an
//!   observation token (it was not sampled);
//! - one [`Turn`] per model turn with its text, how it ended and the environment's reply.
//!
//! How a wave runs (the single-turn sampler's waves, see [`super::sampler`], with turns):
//! 1. prefill each distinct context once, expand to one row per sample;
//! 2. every active row draws its next token; a row whose turn ends (a `--stop` string, an EOS
//!    token, the per-turn `--max-new-tokens`, or the response budget) is collected;
//! 3. the ended turns of this step go to the environment in one exchange (rows in wave order);
//!    a row whose episode ends leaves the batch; a row that continues gets its observation
//!    tokens (cut to nothing and the episode ended when they would overflow the budget);
//! 4. rows with an observation feed `[last model token, observation…]` in one cached forward
//!    (left-padded, at least [`MIN_OBS_SLOTS`] slots wide), the others feed their last token in a
//!    decode step; each row samples from the logits of its own last real slot. The cache is never
//!    rebuilt: a turn continues where the last one stopped. Draws are made as in the single-turn
//!    sampler (see [`super::sampler`]): on the host from the logits read back, or, on a
//!    model that [draws on its device](StepModel::draws_on_device), next to the logits (those of
//!    the two calls stacked there), reading back only the sampled ids and log-probs.
//!
//! Determinism: draws come from each sample's own ChaCha20 stream; a row's computation is
//! invisible to padding and to the other rows (the model's mask), decode steps stay decode
//! steps and observation feeds are never narrower than [`MIN_OBS_SLOTS`] slots, whatever the
//! batch; so with a deterministic environment the rollouts do not depend on `--batch-size` (the
//! same bounds as the single-turn sampler, see there). An EOS token inside a rollout that goes on
//! (chat-style tool use: `<|im_end|>` then a tool message) is kept in the text; a final EOS is
//! left out of the text, as in single-turn responses.
use anyhow::{ensure, Context, Result};
use rayon::prelude::*;

use super::env::{EnvReply, EnvRequest, Environment};
use super::sampler::{
    draw_rows, in_waves, reselect, retire_finished, start_wave, step_logits, wave_results,
    GenConfig, Generated, Logits, Part, RowResponse, SampleId, Slots, StepModel, WaveGroup,
    WaveRow,
};
use super::stop::{DecodeFn, FinishReason};
use crate::model::Message;

/// Observation feeds are padded to at least this many slots (narrow forwards round differently
/// from wide ones; see [`super::sampler::prefill_chunks`]).
pub const MIN_OBS_SLOTS: usize = 8;

/// Tokenise an observation (plain text, no special-token handling beyond the tokenizer's own).
pub type EncodeFn<'a> = dyn Fn(&str) -> Result<Vec<u32>> + Sync + 'a;

/// One prompt and the rollouts to draw from it.
#[derive(Debug, Clone)]
pub struct Episode {
    pub context: Vec<u32>,
    pub messages: Vec<Message>,
    pub data_source: String,
    pub ground_truth: serde_json::Value,
    pub samples: Vec<SampleId>,
}

/// Limits of a rollout beyond the per-turn `GenConfig::stop.max_new_tokens`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Model turns at most.
    pub max_turns: usize,
    /// Response tokens at most (model and observation tokens together).
    pub max_response_tokens: usize,
}

/// One model turn and the environment's reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// The model's text of this turn.
    pub text: String,
    /// `stop`, `eos` or `length`.
    pub finish: &'static str,
    pub reward: Option<f64>,
    pub extra: Option<serde_json::Value>,
    pub done: bool,
    /// Observation tokens appended after this turn.
    pub observation_tokens: usize,
}

/// One rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    pub ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub info_mask: Vec<bool>,
    pub turn_ids: Vec<i32>,
    pub text: String,
    pub ends: Vec<usize>,
    pub turns: Vec<Turn>,
    /// `stop` when the environment ended the episode, `length` when a limit did.
    pub finish: FinishReason,
}

impl Rollout {
    /// As a single-turn [`Generated`] (the columns every generation stage writes).
    pub fn generated(&self) -> Generated {
        Generated {
            ids: self.ids.clone(),
            logprobs: self.logprobs.clone(),
            text: self.text.clone(),
            ends: self.ends.clone(),
            finish: self.finish,
        }
    }
}

/// Counters after every model step.
#[derive(Debug, Clone, Copy, Default)]
pub struct Report {
    pub tokens: usize,
    pub finished: usize,
    pub env_requests: usize,
}

struct Row {
    response: RowResponse,
    id: SampleId,
    /// Index of the episode (in the caller's order).
    episode: usize,
    ctx_len: usize,
    info: Vec<bool>,
    turn_ids: Vec<i32>,
    turns: Vec<Turn>,
    turn_tokens: usize,
    turn_start_text: usize,
    /// The EOS that ended this turn, not yet given to the detokeniser.
    held_eos: Option<u32>,
    /// How the current turn ended (set when it does).
    turn_end: Option<&'static str>,
    /// Observation tokens to feed after the last model token.
    obs: Vec<u32>,
}

impl WaveRow for Row {
    fn response(&mut self) -> &mut RowResponse {
        &mut self.response
    }
}

impl Row {
    /// Room left in the response.
    fn room(&self, limits: &Limits, max_pos: usize) -> usize {
        let n = self.response.ids.len();
        let by_budget = limits.max_response_tokens.saturating_sub(n);
        let by_model = max_pos.saturating_sub(self.ctx_len + n);
        by_budget.min(by_model)
    }

    /// Record a drawn model token and its behaviour log-prob, check the turn's end conditions.
    fn record(
        &mut self,
        tok: u32,
        lp: f32,
        cfg: &GenConfig,
        limits: &Limits,
        max_pos: usize,
        decode: &DecodeFn<'_>,
    ) -> Result<()> {
        self.response.push(tok, lp);
        self.info.push(true);
        self.turn_ids.push(self.turns.len() as i32);
        self.turn_tokens += 1;
        let detok = &mut self.response.detok;
        if cfg.stop.is_eos(tok) {
            self.held_eos = Some(tok);
            detok.finish(decode)?;
            self.turn_end = Some("eos");
            return Ok(());
        }
        let from = detok.push(tok, decode)?;
        let text = detok.text();
        let mut start = self.turn_start_text.min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        if cfg
            .stop
            .stop_string_in(&text[start..], from.saturating_sub(start))
        {
            self.turn_end = Some("stop");
        } else if self.turn_tokens >= cfg.stop.max_new_tokens || self.room(limits, max_pos) == 0 {
            self.turn_end = Some("length");
        }
        if self.turn_end.is_some() {
            self.response.detok.finish(decode)?;
        }
        Ok(())
    }

    fn turn_text(&self) -> String {
        let text = self.response.detok.text();
        let mut start = self.turn_start_text.min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        text[start..].to_string()
    }

    /// Apply the environment's reply to the turn that just ended.
    fn apply(
        &mut self,
        reply: EnvReply,
        limits: &Limits,
        max_pos: usize,
        encode: &EncodeFn<'_>,
        decode: &DecodeFn<'_>,
    ) -> Result<()> {
        let finish = self.turn_end.take().unwrap_or("length");
        let text = self.turn_text();
        let mut turn = Turn {
            text,
            finish,
            reward: reply.turn_reward,
            extra: reply.extra,
            done: reply.done,
            observation_tokens: 0,
        };
        let mut end = if reply.done {
            Some(FinishReason::Stop)
        } else if self.turns.len() + 1 >= limits.max_turns {
            Some(FinishReason::Length)
        } else {
            None
        };
        let mut obs = Vec::new();
        if end.is_none() {
            obs = encode(&reply.observation)
                .with_context(|| format!("{}: tokenising the observation", self.sample_name()))?;
            // The observation and at least one model token must fit.
            if obs.len() + 1 > self.room(limits, max_pos) {
                obs.clear();
                end = Some(FinishReason::Length);
            }
        }
        if let Some(eos) = self.held_eos.take() {
            if end.is_some() {
                self.response.detok.push_silent();
            } else {
                self.response.detok.push(eos, decode)?;
            }
        }
        for &t in &obs {
            self.response.push(t, 0.0);
            self.info.push(false);
            self.turn_ids.push(-1);
            self.response.detok.push(t, decode)?;
        }
        self.response.detok.finish(decode)?;
        turn.observation_tokens = obs.len();
        self.turns.push(turn);
        self.turn_tokens = 0;
        self.turn_start_text = self.response.detok.text().len();
        self.obs = obs;
        self.response.finish = end;
        Ok(())
    }

    fn sample_name(&self) -> String {
        format!("sample {}/a{}", self.id.prompt_id, self.id.answer_idx)
    }
}

/// Roll out every sample of `episodes` against `env`; results per episode, in order.
#[allow(clippy::too_many_arguments)]
pub fn rollout<M: StepModel>(
    model: &M,
    decode: &DecodeFn<'_>,
    encode: &EncodeFn<'_>,
    episodes: &[Episode],
    cfg: &GenConfig,
    limits: &Limits,
    env: &mut dyn Environment,
    on_step: &mut dyn FnMut(Report),
) -> Result<Vec<Vec<Rollout>>> {
    cfg.check()?;
    ensure!(limits.max_turns > 0, "--max-turns must be at least 1");
    ensure!(
        limits.max_response_tokens > 0,
        "--max-response-tokens must be at least 1"
    );
    let mut next_id = 0u64;
    in_waves(episodes, model.max_positions(), cfg.batch_size, |parts| {
        run_wave(
            model,
            decode,
            encode,
            episodes,
            parts,
            cfg,
            limits,
            env,
            &mut next_id,
            on_step,
        )
    })
}

impl WaveGroup for Episode {
    fn context(&self) -> &[u32] {
        &self.context
    }
    fn samples(&self) -> &[SampleId] {
        &self.samples
    }
}

#[allow(clippy::too_many_arguments)]
fn run_wave<M: StepModel>(
    model: &M,
    decode: &DecodeFn<'_>,
    encode: &EncodeFn<'_>,
    episodes: &[Episode],
    parts: &[Part],
    cfg: &GenConfig,
    limits: &Limits,
    env: &mut dyn Environment,
    next_id: &mut u64,
    on_step: &mut dyn FnMut(Report),
) -> Result<Vec<Rollout>> {
    let vocab = model.vocab();
    let max_pos = model.max_positions();
    let room = limits.max_response_tokens.min(64);
    // 1. Prefill (left-padded, in chunks); 2. expand to one row per sample.
    let (mut cache, mut logits, mut rows, expand) = start_wave(
        model,
        episodes,
        parts,
        room,
        cfg.prefill_chunk,
        |e, id, out| Row {
            response: RowResponse::new(cfg.seed, id, out),
            id: id.clone(),
            episode: e,
            ctx_len: episodes[e].context.len(),
            info: Vec::new(),
            turn_ids: Vec::new(),
            turns: Vec::new(),
            turn_tokens: 0,
            turn_start_text: 0,
            held_eos: None,
            turn_end: None,
            obs: Vec::new(),
        },
    )?;
    let n_rows = rows.len();
    // Row r reads logits row `src[r]` of `logits`.
    let mut src: Vec<usize> = expand;
    let mut results: Vec<Option<Rollout>> = vec![None; n_rows];

    loop {
        // Draw one token per row.
        let drawn = draw_rows(&logits, &mut rows, &src, vocab, cfg)?;
        rows.par_iter_mut()
            .zip(drawn.par_iter())
            .try_for_each(|(row, &(tok, lp))| row.record(tok, lp, cfg, limits, max_pos, decode))?;
        // The environment's turn.
        let ended: Vec<usize> = (0..rows.len())
            .filter(|&i| rows[i].turn_end.is_some())
            .collect();
        if !ended.is_empty() {
            let requests: Vec<EnvRequest> = ended
                .iter()
                .map(|&i| {
                    let r = &rows[i];
                    let ep = &episodes[r.episode];
                    let id = *next_id;
                    *next_id += 1;
                    EnvRequest {
                        id,
                        prompt_id: r.id.prompt_id.clone(),
                        sample_id: format!("{}/a{}", r.id.prompt_id, r.id.answer_idx),
                        turn: r.turns.len() as u32,
                        messages: ep.messages.clone(),
                        response_so_far: r.response.detok.text().to_string(),
                        turn_text: r.turn_text(),
                        finish: r.turn_end.unwrap_or("length"),
                        data_source: ep.data_source.clone(),
                        ground_truth: ep.ground_truth.clone(),
                    }
                })
                .collect();
            let replies = {
                let _t = crate::trace::span_with("environment", || {
                    vec![("requests", requests.len().into())]
                });
                env.step(&requests)?
            };
            ensure!(
                replies.len() == requests.len(),
                "internal: {} environment replies for {} requests",
                replies.len(),
                requests.len()
            );
            for (&i, reply) in ended.iter().zip(replies) {
                rows[i].apply(reply, limits, max_pos, encode, decode)?;
            }
        }
        // Finished rows leave.
        let before = rows.len();
        let keep;
        (rows, keep) = retire_finished(rows, &mut results, |row, f| {
            let (out, g) = row.response.into_generated(f);
            let rollout = Rollout {
                ids: g.ids,
                logprobs: g.logprobs,
                info_mask: row.info,
                turn_ids: row.turn_ids,
                text: g.text,
                ends: g.ends,
                turns: row.turns,
                finish: g.finish,
            };
            (out, rollout)
        });
        on_step(Report {
            tokens: before,
            finished: before - rows.len(),
            env_requests: ended.len(),
        });
        if rows.is_empty() {
            break;
        }
        reselect(model, &mut cache, before, &keep)?;
        let b = rows.len();
        // The logits of each model call below, stacked; row i draws from `src[i]`.
        let mut parts = Vec::new();
        src = vec![0; b];
        // Rows with an observation: [last model token, observation...] in one forward.
        let obs_rows: Vec<usize> = (0..b).filter(|&i| !rows[i].obs.is_empty()).collect();
        if !obs_rows.is_empty() {
            let w = obs_rows
                .iter()
                .map(|&i| rows[i].obs.len() + 1)
                .max()
                .unwrap_or(1)
                .max(MIN_OBS_SLOTS);
            let mut ids = vec![0u32; b * w];
            let mut valid = vec![false; b * w];
            for &i in &obs_rows {
                let r = &rows[i];
                let n = r.obs.len() + 1;
                let at = i * w + (w - n);
                // The last model token sits right before the observation in `ids`.
                let response = &r.response.ids;
                let last_model = response[response.len() - r.obs.len() - 1];
                ids[at] = last_model;
                ids[at + 1..(i + 1) * w].copy_from_slice(&r.obs);
                valid[at..(i + 1) * w].fill(true);
            }
            let _t = crate::trace::span_with("observation", || {
                vec![("rows", b.into()), ("tokens", w.into())]
            });
            let at = parts.len() * b;
            let slots = Slots {
                batch: b,
                len: w,
                ids: &ids,
                valid: &valid,
            };
            parts.push(step_logits(model, &mut cache, slots)?);
            for &i in &obs_rows {
                src[i] = at + i;
            }
        }
        // Rows in the middle of a turn: one decode step.
        let dec_rows: Vec<usize> = (0..b).filter(|&i| rows[i].obs.is_empty()).collect();
        if !dec_rows.is_empty() {
            let mut ids = vec![0u32; b];
            let mut valid = vec![false; b];
            for &i in &dec_rows {
                ids[i] = *rows[i].response.ids.last().unwrap_or(&0);
                valid[i] = true;
            }
            let _t = crate::trace::span_with("decode step", || vec![("rows", b.into())]);
            let at = parts.len() * b;
            let slots = Slots {
                batch: b,
                len: 1,
                ids: &ids,
                valid: &valid,
            };
            parts.push(step_logits(model, &mut cache, slots)?);
            for &i in &dec_rows {
                src[i] = at + i;
            }
        }
        for r in rows.iter_mut() {
            r.obs.clear();
        }
        logits = Logits::cat(parts)?;
    }
    wave_results(results)
}

#[cfg(test)]
mod tests {
    use super::super::logits::{logprob_of, SamplingParams};
    use super::super::sampler::tests::{sample_ids, step_row, toy};
    use super::super::stop::tests::toy_decode;
    use super::super::stop::StopCriteria;
    use super::*;

    /// Replies with an observation `[t<turn>]` until turn `done_at`, then `done`; rewards the
    /// turn with its length; records every request.
    struct FakeEnv {
        done_at: u32,
        seen: Vec<EnvRequest>,
    }

    impl Environment for FakeEnv {
        fn step(&mut self, requests: &[EnvRequest]) -> Result<Vec<EnvReply>> {
            self.seen.extend_from_slice(requests);
            Ok(requests
                .iter()
                .map(|r| EnvReply {
                    observation: format!("[t{}]", r.turn),
                    done: r.turn >= self.done_at,
                    turn_reward: Some(r.turn_text.len() as f64),
                    extra: None,
                })
                .collect())
        }
    }

    fn encode(s: &str) -> Result<Vec<u32>> {
        Ok(s.bytes().map(|b| b as u32).collect())
    }

    fn cfg(batch_size: usize) -> GenConfig {
        GenConfig {
            params: SamplingParams::default(),
            stop: StopCriteria {
                eos: vec![0],
                stop_strings: vec!["a".into()],
                max_new_tokens: 6,
            },
            allowed_vocab: 128,
            seed: 5,
            batch_size,
            prefill_chunk: 4,
        }
    }

    fn episodes() -> Vec<Episode> {
        [vec![72u32, 105, 33], vec![1, 2], vec![9; 11], vec![5]]
            .into_iter()
            .enumerate()
            .map(|(g, c)| Episode {
                context: c,
                messages: vec![Message::new("user", &format!("q{g}"))],
                data_source: "toy".into(),
                ground_truth: serde_json::json!(g),
                samples: sample_ids(&format!("p{g}"), 3),
            })
            .collect()
    }

    fn run(batch: usize, limits: Limits) -> (Vec<Vec<Rollout>>, Vec<EnvRequest>) {
        let m = toy();
        let mut env = FakeEnv {
            done_at: 2,
            seen: vec![],
        };
        let got = rollout(
            &m,
            &toy_decode,
            &encode,
            &episodes(),
            &cfg(batch),
            &limits,
            &mut env,
            &mut |_| {},
        )
        .unwrap();
        (got, env.seen)
    }

    const LIMITS: Limits = Limits {
        max_turns: 4,
        max_response_tokens: 40,
    };

    #[test]
    fn turns_observations_and_masks() {
        let (got, seen) = run(4, LIMITS);
        let mut multi = 0;
        for (g, res) in got.iter().enumerate() {
            for (k, r) in res.iter().enumerate() {
                let n = r.ids.len();
                assert!(n <= LIMITS.max_response_tokens);
                assert_eq!(
                    (r.logprobs.len(), r.info_mask.len(), r.turn_ids.len()),
                    (n, n, n)
                );
                assert_eq!(r.ends.len(), n);
                // Observation tokens are exactly the environment's text after each turn but the last.
                let mut t = 0;
                let mut turn = 0usize;
                while t < n {
                    // model tokens of `turn`
                    let s = t;
                    while t < n && r.info_mask[t] {
                        assert_eq!(r.turn_ids[t], turn as i32, "p{g}/a{k} token {t}");
                        t += 1;
                    }
                    assert!(t > s, "a turn has at least one model token");
                    let obs = encode(&format!("[t{turn}]")).unwrap();
                    if t < n {
                        assert_eq!(&r.ids[t..t + obs.len()], &obs[..]);
                        for u in t..t + obs.len() {
                            assert!(!r.info_mask[u]);
                            assert_eq!(r.turn_ids[u], -1);
                            assert_eq!(r.logprobs[u], 0.0);
                        }
                        assert_eq!(r.turns[turn].observation_tokens, obs.len());
                        t += obs.len();
                    }
                    turn += 1;
                }
                assert_eq!(turn, r.turns.len());
                assert!(r.turns.len() <= 3, "done at turn 2");
                if r.turns.len() == 3 {
                    assert_eq!(r.finish, FinishReason::Stop);
                    assert!(r.turns[2].done);
                }
                multi += (r.turns.len() > 1) as usize;
                for tn in &r.turns {
                    assert_eq!(tn.reward, Some(tn.text.len() as f64));
                }
                assert!(r.text.contains("[t0]") || r.turns.len() == 1);
            }
        }
        assert!(multi >= 6, "most rollouts have several turns ({multi})");
        // Requests: one per turn, ids 0.., turn numbers in order, response_so_far a prefix of the text.
        let total: usize = got.iter().flatten().map(|r| r.turns.len()).sum();
        assert_eq!(seen.len(), total);
        let mut ids: Vec<u64> = seen.iter().map(|r| r.id).collect();
        ids.sort();
        assert_eq!(ids, (0..total as u64).collect::<Vec<_>>());
        for q in &seen {
            let (g, k): (usize, usize) = (
                q.prompt_id[1..].parse().unwrap(),
                q.sample_id.rsplit("/a").next().unwrap().parse().unwrap(),
            );
            let r = &got[g][k];
            assert!(r.text.starts_with(&q.response_so_far) || r.turns.len() == q.turn as usize + 1);
            assert_eq!(r.turns[q.turn as usize].text, q.turn_text);
            assert_eq!(q.messages[0].content, format!("q{g}"));
        }
    }

    #[test]
    fn model_turns_continue_from_the_cache() {
        // The toy's logits hash every real token seen, so a cache that lost, repeated or
        // misplaced a slot would change them: every model token's log-prob must equal the one
        // recomputed from the whole sequence, fed at once to a fresh cache.
        let m = toy();
        let (got, _) = run(3, LIMITS);
        for (e, res) in episodes().iter().zip(&got) {
            for r in res {
                for t in 0..r.ids.len() {
                    if !r.info_mask[t] {
                        continue;
                    }
                    let mut seq = e.context.clone();
                    seq.extend_from_slice(&r.ids[..t]);
                    let mut c = m.new_cache(1, 0).unwrap();
                    let l = step_row(&m, &mut c, &seq);
                    assert_eq!(r.logprobs[t], logprob_of(&l, r.ids[t] as usize));
                }
            }
        }
    }

    #[test]
    fn same_rollouts_for_every_batch_size() {
        let (reference, _) = run(1, LIMITS);
        for b in [2, 5, 12, 100] {
            let (got, _) = run(b, LIMITS);
            assert_eq!(got, reference, "batch {b}");
        }
    }

    #[test]
    fn limits_end_rollouts() {
        let (got, _) = run(
            4,
            Limits {
                max_turns: 1,
                max_response_tokens: 40,
            },
        );
        for r in got.iter().flatten() {
            assert_eq!(r.turns.len(), 1);
            assert!(r.info_mask.iter().all(|&x| x));
            assert_eq!(r.finish, FinishReason::Length);
        }
        let (got, _) = run(
            4,
            Limits {
                max_turns: 4,
                max_response_tokens: 9,
            },
        );
        for r in got.iter().flatten() {
            assert!(r.ids.len() <= 9);
            // an observation never ends a response
            assert!(r.info_mask.last().copied().unwrap_or(true));
        }
    }
}
