//! The environment of multi-turn rollouts (`rlcr generate-multiturn --env-cmd CMD`): one
//! long-lived child process speaking JSON lines, in the manner of `score --verifier-cmd`.
//!
//! Protocol (one JSON object per line, UTF-8):
//! - request, on the child's stdin, after every model turn:
//!   `{"id": 7, "prompt_id": "kb-000003", "sample_id": "kb-000003/a1", "turn": 0,
//!   "messages": [{"role": "user", "content": "…"}], "response_so_far": "…", "turn_text": "…",
//!   "finish": "stop", "data_source": "kb", "ground_truth": <JSON>}`.
//!   `id` numbers the requests of the run (0, 1, …; only for matching the reply), `turn` is the
//!   0-based model turn that just ended, `messages` the conversation the rollout answers,
//!   `response_so_far` everything after the context so far (model turns and earlier
//!   observations, decoded), `turn_text` the text of this model turn alone, `finish` how the
//!   turn ended: `stop` (a `--stop` string), `eos` (an end-of-sequence token) or `length`
//!   (`--max-new-tokens` of the turn or the response budget), and `ground_truth` the prompt's
//!   (parsed JSON; a string when the column is not JSON).
//! - reply, on the child's stdout: `{"id": 7, "observation": "…", "done": false,
//!   "turn_reward": 0.1, "extra": {…}}`: `observation` (text, may be empty) is appended to the
//!   response as information tokens when the rollout continues; `done: true` ends the rollout;
//!   `turn_reward` (optional number) is this turn's reward; `extra` (optional object) is kept in
//!   the table (`env_extra`). Replies may come in any order; they are matched by id. Blank lines
//!   are skipped; anything else that is not such a reply (not JSON, a missing field, an id that
//!   was not asked or was answered already) is an error. Logs go to stderr.
//!
//! The command runs through `sh -c` in a process group of its own, killed as a whole on any
//! error or timeout (no grandchild outlives rlcr). Requests of one exchange are written by a
//! writer thread while a reader thread parses replies, so a child that answers while rlcr is
//! still writing cannot deadlock. `--env-timeout` bounds the wait for each reply.
use std::collections::HashMap;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::child::{reply_object, shown, FinishError, FromChild, LineChild};
use crate::model::Message;

/// One request: a model turn has ended.
#[derive(Debug, Clone, Serialize)]
pub struct EnvRequest {
    pub id: u64,
    pub prompt_id: String,
    pub sample_id: String,
    pub turn: u32,
    pub messages: Vec<Message>,
    pub response_so_far: String,
    pub turn_text: String,
    /// `stop`, `eos` or `length`.
    pub finish: &'static str,
    pub data_source: String,
    pub ground_truth: serde_json::Value,
}

/// One parsed reply.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvReply {
    pub observation: String,
    pub done: bool,
    pub turn_reward: Option<f64>,
    pub extra: Option<serde_json::Value>,
}

/// What the multi-turn sampler needs from an environment: replies to a batch of ended turns, in
/// request order.
pub trait Environment {
    fn step(&mut self, requests: &[EnvRequest]) -> Result<Vec<EnvReply>>;
}

/// Parse one reply line: `(id, reply)` or what is wrong with it.
pub fn parse_reply(line: &str) -> std::result::Result<(u64, EnvReply), String> {
    let (id, obj) = reply_object(line)?;
    let observation = match obj.get("observation") {
        Some(serde_json::Value::String(s)) => s.clone(),
        None | Some(serde_json::Value::Null) => String::new(),
        Some(_) => return Err("\"observation\" is not text".into()),
    };
    let done = match obj.get("done") {
        Some(serde_json::Value::Bool(b)) => *b,
        _ => return Err("\"done\" missing or not a boolean".into()),
    };
    let turn_reward = match obj.get("turn_reward") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Number(n)) => {
            let f = n.as_f64().filter(|f| f.is_finite());
            Some(f.ok_or("\"turn_reward\" is not a finite number")?)
        }
        Some(serde_json::Value::Bool(b)) => Some(*b as u8 as f64),
        Some(_) => return Err("\"turn_reward\" is not a number".into()),
    };
    let extra = match obj.get("extra") {
        None | Some(serde_json::Value::Null) => None,
        Some(x @ serde_json::Value::Object(_)) => Some(x.clone()),
        Some(_) => return Err("\"extra\" is not an object".into()),
    };
    Ok((
        id,
        EnvReply {
            observation,
            done,
            turn_reward,
            extra,
        },
    ))
}

/// A running environment child (`sh -c CMD`).
pub struct ExternalEnv {
    cmd: String,
    child: LineChild,
    timeout: Duration,
    next_id: u64,
}

impl ExternalEnv {
    /// Start `sh -c CMD` in its own process group.
    pub fn spawn(cmd: &str, timeout: Duration) -> Result<ExternalEnv> {
        Ok(ExternalEnv {
            cmd: cmd.to_string(),
            child: LineChild::spawn(cmd, "environment")?,
            timeout,
            next_id: 0,
        })
    }

    /// Ids for the next `n` requests.
    pub fn take_ids(&mut self, n: usize) -> std::ops::Range<u64> {
        let s = self.next_id;
        self.next_id += n as u64;
        s..self.next_id
    }

    /// Kill the child's process group and fail with `msg`.
    fn fail(&mut self, msg: String) -> anyhow::Error {
        self.child.kill();
        anyhow::anyhow!("environment `{}` {msg}; it was stopped", self.cmd)
    }

    /// Close the child's stdin and wait for it to exit (killed after the timeout); a non-zero
    /// exit is an error.
    pub fn finish(mut self) -> Result<()> {
        match self.child.finish(self.timeout) {
            Ok(()) => Ok(()),
            Err(FinishError::Failed(st)) => bail!("environment `{}` exited with {st}", self.cmd),
            Err(FinishError::Hung) => Err(anyhow::anyhow!(
                "environment `{}` did not exit after its input closed; it was stopped",
                self.cmd
            )),
            Err(FinishError::Wait(e)) => Err(e).context("waiting for the environment"),
        }
    }
}

impl Environment for ExternalEnv {
    fn step(&mut self, requests: &[EnvRequest]) -> Result<Vec<EnvReply>> {
        let mut pos_of: HashMap<u64, usize> = HashMap::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            if pos_of.insert(r.id, i).is_some() {
                bail!("internal: duplicate environment request id {}", r.id);
            }
        }
        for r in requests {
            let mut line = serde_json::to_string(r).context("serialising a request")?;
            line.push('\n');
            if !self.child.send(line) {
                let st = self.child.exit_status();
                return Err(self.fail(format!(
                    "stopped reading requests ({st}) at request id {} (sample_id {}, turn {})",
                    r.id, r.sample_id, r.turn
                )));
            }
        }
        let mut out: Vec<Option<EnvReply>> = vec![None; requests.len()];
        let mut missing = requests.len();
        let waiting = |out: &[Option<EnvReply>]| -> String {
            out.iter()
                .position(|o| o.is_none())
                .map(|i| {
                    format!(
                        "request id {} (sample_id {}, turn {})",
                        requests[i].id, requests[i].sample_id, requests[i].turn
                    )
                })
                .unwrap_or_default()
        };
        let mut last_reply = Instant::now();
        while missing > 0 {
            // Wait in short slices so that a child that exits while a grandchild still holds
            // its output open is noticed at once, not only at the timeout.
            let left = self.timeout.saturating_sub(last_reply.elapsed());
            let got = self.child.recv_timeout(left.min(Duration::from_millis(50)));
            if let Err(RecvTimeoutError::Timeout) = got {
                if !left.is_zero() {
                    if let Some(st) = self.child.try_wait() {
                        let w = waiting(&out);
                        return Err(self.fail(format!("exited ({st}) while rlcr waited for {w}")));
                    }
                    continue;
                }
            }
            match got {
                Ok(FromChild::Line(line)) => {
                    let (id, rep) = match parse_reply(&line) {
                        Ok(x) => x,
                        Err(e) => {
                            let shown = shown(&line);
                            return Err(self.fail(format!(
                                "wrote a line that is not a reply {{\"id\", \"observation\", \"done\"}}: {e}: {shown:?}"
                            )));
                        }
                    };
                    let Some(&i) = pos_of.get(&id) else {
                        return Err(self.fail(format!(
                            "replied with id {id}, which was not asked (waiting for {})",
                            waiting(&out)
                        )));
                    };
                    if out[i].is_some() {
                        return Err(self.fail(format!("replied twice to id {id}")));
                    }
                    out[i] = Some(rep);
                    missing -= 1;
                    last_reply = Instant::now();
                }
                Ok(FromChild::Eof(err)) => {
                    let st = self.child.exit_status();
                    let w = waiting(&out);
                    return Err(self.fail(format!(
                        "closed its output ({st}{}) while rlcr waited for {w}",
                        err.map(|e| format!(", read error: {e}"))
                            .unwrap_or_default()
                    )));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let st = self.child.exit_status();
                    return Err(self.fail(format!("output reader stopped ({st})")));
                }
                Err(RecvTimeoutError::Timeout) => {
                    let w = waiting(&out);
                    return Err(self.fail(format!(
                        "gave no reply within {:.1}s (--env-timeout) while rlcr waited for {w}",
                        self.timeout.as_secs_f64()
                    )));
                }
            }
        }
        Ok(out.into_iter().flatten().collect())
    }
}
