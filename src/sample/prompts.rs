//! The default instructions of the two-turn RLCR rollout and the conversations they
//! build.
//!
//! RLCR's own `TABC` system prompt asks for think → answer → analysis →
//! confidence in **one** completion. The two-turn split samples the answer first and asks for the
//! confidence in a second user turn, with the answer fixed. So:
//! - the default **system prompt** describes the whole protocol in TABC's words: turn 1 produces
//!   `<think>…</think><answer>…</answer>` and stops; when asked afterwards, the assistant analyses
//!   its uncertainty in `<analysis>…</analysis>` and states a probability in `[0, 1]` in
//!   `<confidence>…</confidence>` (knowing in turn 1 that a confidence will be asked costs nothing
//!   and keeps one system prompt for both turns, so the conversation of a confidence row is a
//!   plain extension of its answer's);
//! - the default **confidence query** is the turn-2 user message: analyse, then a number between
//!   0 and 1 inclusive, without changing the answer (the nearest public precedent is RLCR's
//!   eval-time `confidence_at_end` re-prompt).

/// Default system prompt (both turns), TABC-style.
pub const DEFAULT_SYSTEM_PROMPT: &str = "\
A conversation between User and Assistant. The user asks a question, and the Assistant solves it. \
The Assistant first thinks about the reasoning process in the mind and then provides the user with \
the final answer. The reasoning process is enclosed within <think> </think> tags and the final \
answer within <answer> </answer> tags, i.e., <think> reasoning process here </think> \
<answer> final answer here </answer>. After the answer, the Assistant stops. When the user then \
asks how confident the Assistant is, the Assistant analyzes its confidence and the uncertainty in \
its solution within <analysis> </analysis> tags and gives its confidence that the final answer is \
correct, a number between 0 and 1 (inclusive), within <confidence> </confidence> tags, i.e., \
<analysis> analysis here </analysis> <confidence> confidence level here </confidence>.";

/// Default turn-2 user message asking for the confidence in the answer above.
pub const DEFAULT_CONFIDENCE_PROMPT: &str = "\
How confident are you that your final answer above is correct? Do not change or repeat the answer. \
First analyze your confidence and the sources of uncertainty in your solution within \
<analysis> </analysis> tags, then give the probability that your final answer is correct, a \
number between 0 and 1 (inclusive), within <confidence> </confidence> tags.";

pub use crate::model::Message;

/// Turn 1, the conversation an answer responds to: `system` (a `--system-prompt`) replaces the
/// prompt's own system message; otherwise the prompt's system message is kept, and
/// [`DEFAULT_SYSTEM_PROMPT`] is added when it has none. An empty system prompt is left out (the
/// template's own default system message, if any, then applies). A response `prefix` becomes a
/// final partial assistant message.
pub fn answer_messages(
    prompt: &[Message],
    system: Option<&str>,
    prefix: Option<&str>,
) -> Vec<Message> {
    let rest = without_system(prompt);
    let system = match system {
        Some(s) => s,
        None if rest.len() < prompt.len() => prompt[0].content.as_str(),
        None => DEFAULT_SYSTEM_PROMPT,
    };
    assemble(Some(system), rest, prefix)
}

/// The messages of `prompt` after its own system message, if it opens with one.
pub fn without_system(prompt: &[Message]) -> &[Message] {
    match prompt.first() {
        Some(m) if m.role == "system" => &prompt[1..],
        _ => prompt,
    }
}

/// A conversation to sample from: the `system` message (left out when `None` or empty), the
/// `rest`, and a response `prefix` as a final partial assistant message (left out when empty).
pub fn assemble(system: Option<&str>, rest: &[Message], prefix: Option<&str>) -> Vec<Message> {
    let mut m = Vec::with_capacity(rest.len() + 2);
    if let Some(s) = system.filter(|s| !s.is_empty()) {
        m.push(Message::new("system", s));
    }
    m.extend_from_slice(rest);
    if let Some(p) = prefix.filter(|p| !p.is_empty()) {
        m.push(Message::new("assistant", p));
    }
    m
}

/// Turn 2 starts from an answer's recorded conversation (its `messages`): returns the messages
/// before the answer (with `system`, when given, replacing the system message; `""` for none)
/// and the answer's response prefix (a final partial assistant message, else empty).
pub fn answer_turn(mut m: Vec<Message>, system: Option<&str>) -> (Vec<Message>, String) {
    let prefix = match m.last() {
        Some(last) if last.role == "assistant" => m.pop().map(|x| x.content).unwrap_or_default(),
        _ => String::new(),
    };
    if let Some(s) = system {
        if m.first().is_some_and(|x| x.role == "system") {
            m.remove(0);
        }
        if !s.is_empty() {
            m.insert(0, Message::new("system", s));
        }
    }
    (m, prefix)
}

/// The messages after the answer in turn 2: `user(query)`, then the response `prefix` as a
/// partial assistant message when there is one.
pub fn confidence_query(query: &str, prefix: Option<&str>) -> Vec<Message> {
    let mut m = vec![Message::new("user", query)];
    if let Some(p) = prefix.filter(|p| !p.is_empty()) {
        m.push(Message::new("assistant", p));
    }
    m
}

/// Turn 2, the conversation a confidence responds to: the messages before the answer +
/// `assistant(answer)` + the query messages ([`confidence_query`]).
pub fn confidence_messages(before: &[Message], answer: &str, query: &[Message]) -> Vec<Message> {
    let mut m = Vec::with_capacity(before.len() + 1 + query.len());
    m.extend_from_slice(before);
    m.push(Message::new("assistant", answer));
    m.extend_from_slice(query);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_mention_every_tag() {
        for tag in [
            "<think>",
            "</think>",
            "<answer>",
            "</answer>",
            "<analysis>",
            "</analysis>",
            "<confidence>",
            "</confidence>",
        ] {
            assert!(DEFAULT_SYSTEM_PROMPT.contains(tag), "{tag}");
        }
        for tag in [
            "<analysis>",
            "<confidence>",
            "</confidence>",
            "between 0 and 1",
        ] {
            assert!(DEFAULT_CONFIDENCE_PROMPT.contains(tag), "{tag}");
        }
    }

    #[test]
    fn conversations() {
        let user = [Message::new("user", "2+2?")];
        let a = answer_messages(&user, Some("sys"), None);
        assert_eq!(
            a,
            vec![Message::new("system", "sys"), Message::new("user", "2+2?")]
        );
        // an empty system prompt is left out; none given: the default, or the prompt's own
        assert_eq!(answer_messages(&user, Some(""), None), user.to_vec());
        let d = answer_messages(&user, None, Some("<think>"));
        assert_eq!(d[0], Message::new("system", DEFAULT_SYSTEM_PROMPT));
        assert_eq!(d[2], Message::new("assistant", "<think>"));
        let own = [Message::new("system", "mine"), Message::new("user", "q")];
        assert_eq!(answer_messages(&own, None, None), own.to_vec());
        assert_eq!(answer_messages(&own, Some("new"), None)[0].content, "new");
        // turn 2 from the recorded conversation of an answer with a prefix
        let (before, prefix) = answer_turn(d.clone(), None);
        assert_eq!((before.as_slice(), prefix.as_str()), (&d[..2], "<think>"));
        let (before2, _) = answer_turn(d.clone(), Some(""));
        assert_eq!(before2, user.to_vec());
        let q = confidence_query("conf?", Some("<analysis>"));
        let c = confidence_messages(&a, "<answer>4</answer>", &q);
        assert_eq!(c.len(), 5);
        assert_eq!(c[2], Message::new("assistant", "<answer>4</answer>"));
        assert_eq!(c[3], Message::new("user", "conf?"));
        assert_eq!(c[4], Message::new("assistant", "<analysis>"));
        assert_eq!(confidence_query("q", Some("")).len(), 1);
        let j = serde_json::to_string(&c[..1]).unwrap();
        assert_eq!(j, r#"[{"role":"system","content":"sys"}]"#);
    }
}
