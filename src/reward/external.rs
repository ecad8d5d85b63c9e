//! External verifier (`--verifier-cmd CMD`): one long-lived child process speaking JSON lines.
//!
//! Protocol (one JSON object per line, UTF-8):
//! - request, on the child's stdin:
//!   `{"id": 17, "sample_id": "p3/a1", "data_source": "hotpot", "prompt": "…", "response": "…",
//!   "answer": "…" | null, "ground_truth": <the ground-truth JSON value>, "messages": [...],
//!   "extra_info": {...} | null, "columns": {...}}`; `id` is the row's 0-based position in the
//!   input table, `prompt` the content of the last user message (or null), `answer` what rlcr
//!   extracted (the last `<answer>`), `ground_truth` the parsed JSON (a string when the column is
//!   not JSON), `messages` the conversation the response answers (`{role, content}` list, a
//!   trailing assistant prefill included), `extra_info` the row's `extra_info` (parsed JSON;
//!   `prepare` keeps every source column but the prompt there), `columns` every other column of
//!   the table that is not one of rlcr's own (columns a user added to the prompts table) as JSON
//!   values. The last three fields were added after the first six: a verifier that reads only
//!   those keeps working, and a request without them (the faithfulness probe's) means none;
//! - reply, on the child's stdout: `{"id": 17, "correct": true, "extra": {"f1": 0.5}}` where
//!   `correct` is a boolean or a number (used as the accuracy, e.g. a partial score) and `extra` an
//!   optional object whose numeric fields become `extra.NAME` reward components (others are
//!   ignored); or `{"id": 17, "error": "why"}`: the verifier could not score that request (its
//!   reward function raised), which stops rlcr with an error naming that request. Replies may
//!   come in any order; they are matched by id. Blank lines are skipped; any other line that is
//!   not such a reply is an error (print logs to stderr).
//!
//! Values keep the types the table stored: a text column's cell is a JSON string even when its
//! text would parse as JSON (`"7"` stays `"7"`), and `ground_truth`, whose column holds JSON text
//! by the trajectory schema (what `prepare` writes: a label stored as text is `"7"` there),
//! arrives as that JSON value ([`ground_truth_value`]); `extra_info` as its own column reader
//! gives it (a struct's row, or its JSON text parsed).
//!
//! The command runs through `sh -c`, so arguments and pipes work, with the reward adapters'
//! folder first on its `PATH` and in `$RLCR_REWARDS` ([`super::adapters`]). Its stderr passes
//! through to ours. It runs in a process group of its own, which is killed as a whole on a
//! timeout or an error, so no grandchild outlives rlcr. Requests are pipelined (at most
//! [`MAX_IN_FLIGHT`] outstanding) by a writer thread; a reader thread parses replies. The timeout
//! is per request in the sense that matters for a child that answers in turn: if no reply arrives
//! for `timeout` while requests are outstanding, the child is killed and the error names the
//! oldest request waited for. If the child exits or closes its stdout early without an error
//! reply, the error names the oldest request left unanswered and the last id answered, with the
//! exit status. Results are stored by id, so the output never depends on timing.
use std::collections::HashMap;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::Array;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::child::{reply_object, shown, FinishError, FromChild, LineChild};
use crate::table::TRAJECTORY;

/// Most requests outstanding at once.
pub const MAX_IN_FLIGHT: usize = 256;

/// One request (serialised with `id` first).
#[derive(Debug, Clone, Serialize)]
pub struct Request<'a> {
    pub id: u64,
    pub sample_id: &'a str,
    pub data_source: &'a str,
    pub prompt: Option<&'a str>,
    pub response: &'a str,
    pub answer: Option<&'a str>,
    pub ground_truth: &'a serde_json::Value,
    /// The conversation the response answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages: Option<serde_json::Value>,
    /// The row's `extra_info`, parsed (null when the table has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_info: Option<serde_json::Value>,
    /// The table's columns that are not rlcr's, by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub columns: Option<serde_json::Map<String, serde_json::Value>>,
}

/// One parsed reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// 1.0 / 0.0 for booleans, the number otherwise.
    pub correct: f64,
    /// Numeric fields of `extra`, sorted by name.
    pub extra: Vec<(String, f64)>,
}

/// A running verifier child.
pub struct ExternalVerifier {
    cmd: String,
    child: LineChild,
    timeout: Duration,
    last_answered: Option<u64>,
}

/// A reply line: a verdict, or the verifier's error for that request.
#[derive(Debug, Clone, PartialEq)]
enum Answered {
    Verdict(Reply),
    Failed(String),
}

fn parse_reply(line: &str) -> std::result::Result<(u64, Answered), String> {
    let (id, obj) = reply_object(line)?;
    if let Some(e) = obj.get("error") {
        let msg = match e {
            serde_json::Value::String(t) => t.clone(),
            other => other.to_string(),
        };
        return Ok((id, Answered::Failed(msg)));
    }
    let correct = match obj.get("correct") {
        Some(serde_json::Value::Bool(b)) => {
            if *b {
                1.0
            } else {
                0.0
            }
        }
        Some(serde_json::Value::Number(n)) => {
            n.as_f64().ok_or("\"correct\" is not a finite number")?
        }
        _ => return Err("\"correct\" missing or not a boolean/number".into()),
    };
    if !correct.is_finite() {
        return Err("\"correct\" is not finite".into());
    }
    let mut extra = Vec::new();
    match obj.get("extra") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(m)) => {
            for (k, x) in m {
                if let Some(f) = x.as_f64().or_else(|| x.as_bool().map(|b| b as u8 as f64)) {
                    extra.push((k.clone(), f));
                }
            }
            extra.sort_by(|a, b| a.0.cmp(&b.0));
        }
        Some(_) => return Err("\"extra\" is not an object".into()),
    }
    Ok((id, Answered::Verdict(Reply { correct, extra })))
}

/// The verifier's own error for one request (`{"id", "error"}`): the request's position in the
/// batch lets a caller name its row.
#[derive(Debug)]
pub struct RequestFailed {
    /// Position of the request in the batch given to [`ExternalVerifier::verify`].
    pub index: usize,
    pub id: u64,
    pub sample_id: String,
    pub cmd: String,
    pub message: String,
}

impl std::fmt::Display for RequestFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "external verifier `{}` failed on request id {} (sample_id {}): {}",
            self.cmd, self.id, self.sample_id, self.message
        )
    }
}

impl std::error::Error for RequestFailed {}

impl ExternalVerifier {
    /// Start `sh -c CMD`.
    pub fn spawn(cmd: &str, timeout: Duration) -> Result<ExternalVerifier> {
        Ok(ExternalVerifier {
            cmd: cmd.to_string(),
            child: LineChild::spawn_with_env(
                cmd,
                "external verifier",
                &super::adapters::command_env(),
            )?,
            timeout,
            last_answered: None,
        })
    }

    fn kill(&mut self) {
        self.child.kill();
    }

    /// Verify a batch; replies come back in request order. `sample_ids[i]` names request `i` in
    /// errors.
    pub fn verify(&mut self, requests: &[Request<'_>]) -> Result<Vec<Reply>> {
        let mut pos_of: HashMap<u64, usize> = HashMap::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            if pos_of.insert(r.id, i).is_some() {
                bail!("internal: duplicate external-verifier request id {}", r.id);
            }
        }
        let mut out: Vec<Option<Reply>> = vec![None; requests.len()];
        let mut outstanding: std::collections::BTreeSet<usize> = std::collections::BTreeSet::new();
        let mut next = 0usize;
        let mut done = 0usize;
        let mut last_progress = Instant::now();
        while done < requests.len() {
            while next < requests.len() && outstanding.len() < MAX_IN_FLIGHT {
                let r = &requests[next];
                let mut line =
                    serde_json::to_string(r).context("serialising a verifier request")?;
                line.push('\n');
                if !self.child.send(line) {
                    let st = self.child.exit_status();
                    bail!(
                        "external verifier `{}` stopped reading requests ({st}) at request id {} (sample_id {})",
                        self.cmd, r.id, r.sample_id
                    );
                }
                outstanding.insert(next);
                next += 1;
            }
            let wait = self.timeout.saturating_sub(last_progress.elapsed());
            let got = self.child.recv_timeout(wait).map(|m| match m {
                FromChild::Line(t) => FromReader::parse(&t),
                FromChild::Eof(e) => FromReader::Eof(e),
            });
            match got {
                Ok(FromReader::Reply(id, Answered::Failed(message))) => {
                    self.kill();
                    let index = pos_of.get(&id).copied();
                    let Some(index) = index else {
                        bail!(
                            "external verifier `{}` reported an error for id {id}, which was not asked: {message}",
                            self.cmd
                        );
                    };
                    return Err(RequestFailed {
                        index,
                        id,
                        sample_id: requests[index].sample_id.to_string(),
                        cmd: self.cmd.clone(),
                        message,
                    }
                    .into());
                }
                Ok(FromReader::Reply(id, Answered::Verdict(rep))) => {
                    let Some(&i) = pos_of.get(&id) else {
                        self.kill();
                        bail!(
                            "external verifier `{}` replied with id {id}, which was not asked",
                            self.cmd
                        );
                    };
                    if !outstanding.remove(&i) {
                        self.kill();
                        bail!("external verifier `{}` replied twice to id {id}", self.cmd);
                    }
                    out[i] = Some(rep);
                    done += 1;
                    self.last_answered = Some(id);
                    last_progress = Instant::now();
                }
                Ok(FromReader::Bad(msg)) => {
                    self.kill();
                    bail!("external verifier `{}` wrote a line that is not a reply {{\"id\", \"correct\"}}: {msg}", self.cmd);
                }
                Ok(FromReader::Eof(err)) => {
                    let first = outstanding.iter().next().copied().unwrap_or(0);
                    let st = self.child.exit_status();
                    let last = self
                        .last_answered
                        .map_or("none".to_string(), |x| x.to_string());
                    bail!(
                        "external verifier `{}` closed its output ({st}{}) with {} request(s) unanswered, the oldest request id {} (sample_id {}); last id answered: {last}",
                        self.cmd,
                        err.map(|e| format!(", read error: {e}")).unwrap_or_default(),
                        outstanding.len(),
                        requests[first].id,
                        requests[first].sample_id
                    );
                }
                Err(RecvTimeoutError::Timeout) => {
                    let first = outstanding.iter().next().copied().unwrap_or(0);
                    self.kill();
                    bail!(
                        "external verifier `{}` gave no reply within {:.1}s while rlcr waited for request id {} (sample_id {}); {} request(s) outstanding; the verifier was killed",
                        self.cmd,
                        self.timeout.as_secs_f64(),
                        requests[first].id,
                        requests[first].sample_id,
                        outstanding.len()
                    );
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let st = self.child.exit_status();
                    bail!("external verifier `{}` reader stopped ({st})", self.cmd);
                }
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.ok_or_else(|| anyhow!("internal: no reply for request id {}", requests[i].id))
            })
            .collect()
    }

    /// Close the child's stdin and wait for it to exit (killing it after `timeout`); a non-zero
    /// exit is an error.
    pub fn finish(mut self) -> Result<()> {
        match self.child.finish(self.timeout) {
            Ok(()) => Ok(()),
            Err(FinishError::Failed(st)) => {
                bail!("external verifier `{}` exited with {st}", self.cmd)
            }
            Err(FinishError::Hung) => bail!(
                "external verifier `{}` did not exit after its input closed; killed",
                self.cmd
            ),
            Err(FinishError::Wait(e)) => Err(e).context("waiting for the external verifier"),
        }
    }
}

/// A line of the verifier's output, read.
enum FromReader {
    Reply(u64, Answered),
    Bad(String),
    Eof(Option<String>),
}

impl FromReader {
    fn parse(line: &str) -> FromReader {
        match parse_reply(line) {
            Ok((id, rep)) => FromReader::Reply(id, rep),
            Err(e) => FromReader::Bad(format!("{e}: {:?}", shown(line))),
        }
    }
}

/// The columns of a table the requests carry: `extra_info` and every column that is not in the
/// trajectory schema (columns a user added), in the table's order.
pub fn request_columns(fields: &arrow::datatypes::Fields) -> Vec<String> {
    fields
        .iter()
        .map(|f| f.name())
        .filter(|n| *n == "extra_info" || TRAJECTORY.column(n).is_none())
        .cloned()
        .collect()
}

/// The ground truth as requests carry it: the column's JSON text parsed (a label stored as text
/// is the JSON string `"7"` there and stays a string); text that is not JSON, as a string.
pub fn ground_truth_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// Row `i`'s `extra_info` (null when absent) and its other request columns, by name, with the
/// types the table stored them in: `extra_info` through its own reader (a struct's row, or its
/// JSON text parsed), every other cell as its Arrow value in JSON (text stays text, numbers stay
/// numbers, lists and structs nest). An error names the column.
pub fn row_columns<'a>(
    cols: impl IntoIterator<Item = (&'a str, &'a dyn Array)>,
    i: usize,
) -> Result<(Value, Map<String, Value>)> {
    let mut extra_info = Value::Null;
    let mut columns = Map::new();
    for (name, a) in cols {
        if name == "extra_info" {
            extra_info = crate::table::nested::extra_info_value(a, i)
                .with_context(|| format!("column `{name}`"))?;
        } else {
            let v = crate::table::json::value(a, i).with_context(|| format!("column `{name}`"))?;
            columns.insert(name.to_string(), v);
        }
    }
    Ok((extra_info, columns))
}

/// The content of the last user message of a conversation (`messages` as JSON text), for a
/// request's `prompt`.
pub fn last_user_content(messages_json: &str) -> Option<String> {
    let v: Value = serde_json::from_str(messages_json).ok()?;
    v.as_array()?
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(|r| r.as_str()) == Some("user"))
        .and_then(|m| m.get("content")?.as_str().map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = r#"id=$(printf '%s' "$line" | sed -E 's/^\{"id":([0-9]+).*/\1/')"#;

    fn reqs(gt: &serde_json::Value, answers: &[&'static str]) -> Vec<Request<'static>> {
        let gt: &'static serde_json::Value = Box::leak(Box::new(gt.clone()));
        answers
            .iter()
            .enumerate()
            .map(|(i, a)| Request {
                id: i as u64 * 10,
                sample_id: Box::leak(format!("p{i}/a0").into_boxed_str()),
                data_source: "hotpot",
                prompt: Some("Capital of France?"),
                response: "<answer>x</answer>",
                answer: Some(a),
                ground_truth: gt,
                messages: None,
                extra_info: None,
                columns: None,
            })
            .collect()
    }

    #[test]
    fn pipelined_and_matched_by_id() {
        let cmd = format!(
            r#"while IFS= read -r line; do {ID}; case "$line" in *'"answer":"Paris"'*) c=true;; *) c=0.25;; esac; printf '{{"id":%s,"correct":%s,"extra":{{"n":2,"s":"x"}}}}\n' "$id" "$c"; done"#
        );
        let mut v = ExternalVerifier::spawn(&cmd, Duration::from_secs(20)).unwrap();
        let answers: Vec<&'static str> = (0..600)
            .map(|i| if i % 3 == 0 { "Paris" } else { "Lyon" })
            .collect();
        let rq = reqs(&serde_json::json!("Paris"), &answers);
        let got = v.verify(&rq).unwrap();
        for (i, r) in got.iter().enumerate() {
            assert_eq!(r.correct, if i % 3 == 0 { 1.0 } else { 0.25 }, "row {i}");
            assert_eq!(r.extra, vec![("n".to_string(), 2.0)]);
        }
        // a second batch on the same child
        let got = v.verify(&rq[..5]).unwrap();
        assert_eq!(got.len(), 5);
        v.finish().unwrap();
    }

    #[test]
    fn replies_out_of_order() {
        let cmd = format!(
            r#"while IFS= read -r line; do {ID}; a=$id; IFS= read -r line || break; {ID}; printf '{{"id":%s,"correct":false}}\n{{"id":%s,"correct":true}}\n' "$id" "$a"; done"#
        );
        let mut v = ExternalVerifier::spawn(&cmd, Duration::from_secs(20)).unwrap();
        let rq = reqs(&serde_json::json!("Paris"), &["a", "b", "c", "d"]);
        let got: Vec<f64> = v.verify(&rq).unwrap().iter().map(|r| r.correct).collect();
        assert_eq!(got, vec![1.0, 0.0, 1.0, 0.0]);
        v.finish().unwrap();
    }

    /// The error of verifying `answers` (ground truth "Paris") with the verifier `cmd`.
    fn verify_error(cmd: &str, timeout: Duration, answers: &[&'static str]) -> String {
        let mut v = ExternalVerifier::spawn(cmd, timeout).unwrap();
        let rq = reqs(&serde_json::json!("Paris"), answers);
        format!("{:#}", v.verify(&rq).unwrap_err())
    }

    #[test]
    fn child_dies_error_names_ids() {
        let cmd = format!(
            r#"IFS= read -r line; {ID}; printf '{{"id":%s,"correct":true}}\n' "$id"; exit 3"#
        );
        let err = verify_error(&cmd, Duration::from_secs(20), &["a", "b", "c"]);
        assert!(err.contains("request id 10 (sample_id p1/a0)"), "{err}");
        assert!(err.contains("last id answered: 0"), "{err}");
        assert!(err.contains("exit status: 3"), "{err}");
    }

    #[test]
    fn timeout_kills_and_names_the_request() {
        let t = Instant::now();
        let err = verify_error(
            "IFS= read -r line; exec sleep 30",
            Duration::from_millis(300),
            &["a"],
        );
        assert!(t.elapsed() < Duration::from_secs(10));
        assert!(err.contains("no reply within 0.3s"), "{err}");
        assert!(err.contains("request id 0 (sample_id p0/a0)"), "{err}");
    }

    #[test]
    fn garbage_on_stdout_is_an_error() {
        let err = verify_error(
            "IFS= read -r line; echo hello; exec sleep 5",
            Duration::from_secs(20),
            &["a"],
        );
        assert!(err.contains("not a reply"), "{err}");
        assert!(err.contains("hello"), "{err}");
    }

    #[test]
    fn unknown_id_and_bad_correct() {
        assert!(parse_reply(r#"{"id": 1, "correct": "yes"}"#).is_err());
        assert!(parse_reply(r#"{"correct": true}"#).is_err());
        assert!(parse_reply(r#"{"id": 1, "correct": true, "extra": 3}"#).is_err());
        assert_eq!(
            parse_reply(r#"{"id": 1, "correct": 0.5}"#).unwrap().1,
            Answered::Verdict(Reply {
                correct: 0.5,
                extra: vec![]
            })
        );
        assert_eq!(
            parse_reply(r#"{"id": 1, "error": "ValueError: x"}"#)
                .unwrap()
                .1,
            Answered::Failed("ValueError: x".into())
        );
        let err = verify_error(
            r#"IFS= read -r line; echo '{"id": 999, "correct": true}'; exec sleep 5"#,
            Duration::from_secs(20),
            &["a"],
        );
        assert!(err.contains("id 999"), "{err}");
    }

    /// An error reply names its own request, not the oldest one outstanding, and carries the
    /// verifier's message.
    #[test]
    fn error_reply_names_its_request() {
        let cmd = format!(
            r#"while IFS= read -r line; do {ID}; if [ "$id" = 20 ]; then printf '{{"id":%s,"error":"ValueError: cannot parse"}}\n' "$id"; exit 1; fi; done"#
        );
        let mut v = ExternalVerifier::spawn(&cmd, Duration::from_secs(20)).unwrap();
        let rq = reqs(&serde_json::json!("Paris"), &["a", "b", "c", "d"]);
        let e = v.verify(&rq).unwrap_err();
        let f = e.downcast_ref::<RequestFailed>().expect("a RequestFailed");
        assert_eq!((f.index, f.id, f.sample_id.as_str()), (2, 20, "p2/a0"));
        let err = format!("{e:#}");
        assert!(err.contains("request id 20 (sample_id p2/a0)"), "{err}");
        assert!(err.contains("ValueError: cannot parse"), "{err}");
    }

    /// Request values keep the table's types: text that looks like JSON stays text.
    #[test]
    fn request_columns_keep_stored_types() {
        use arrow::array::{Int64Array, StringArray};
        let note = StringArray::from(vec![Some("7"), Some("true"), None, Some("[1]")]);
        let n = Int64Array::from(vec![7, 8, 9, 10]);
        let ei = StringArray::from(vec![r#"{"answer": "7"}"#, "{}", "null", r#"{"k": [1]}"#]);
        let cols: Vec<(&str, &dyn Array)> = vec![("note", &note), ("n", &n), ("extra_info", &ei)];
        let (e0, c0) = row_columns(cols.iter().copied(), 0).unwrap();
        assert_eq!(e0, serde_json::json!({"answer": "7"}));
        assert_eq!(c0["note"], serde_json::json!("7"));
        assert_eq!(c0["n"], serde_json::json!(7));
        let (_, c1) = row_columns(cols.iter().copied(), 1).unwrap();
        assert_eq!(c1["note"], serde_json::json!("true"));
        let (e2, c2) = row_columns(cols.iter().copied(), 2).unwrap();
        assert_eq!((e2, &c2["note"]), (Value::Null, &Value::Null));
        let (_, c3) = row_columns(cols.iter().copied(), 3).unwrap();
        assert_eq!(c3["note"], serde_json::json!("[1]"));
        // ground truth: the column's JSON text
        assert_eq!(ground_truth_value(r#""7""#), serde_json::json!("7"));
        assert_eq!(ground_truth_value("7"), serde_json::json!(7));
        assert_eq!(ground_truth_value("Paris"), serde_json::json!("Paris"));
    }
}
