//! The default instructions of the two-turn RLCR rollout (seed 000) and the conversations they
//! build.
//!
//! RLCR's own `TABC` system prompt (ANCHORS.md §1.1) asks for think → answer → analysis →
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
//!   eval-time `confidence_at_end` re-prompt, ANCHORS.md §1.2).

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

/// Turn 1: `[system?, user]`. An empty system prompt is left out (the template's own default
/// system message, if any, then applies).
pub fn answer_messages(system: &str, user: &str) -> Vec<Message> {
    let mut m = Vec::with_capacity(2);
    if !system.is_empty() {
        m.push(Message::new("system", system));
    }
    m.push(Message::new("user", user));
    m
}

/// Turn 2: the answer's conversation + `assistant(answer)` + `user(query)`.
pub fn confidence_messages(
    answer_conversation: &[Message],
    answer: &str,
    query: &str,
) -> Vec<Message> {
    let mut m = answer_conversation.to_vec();
    m.push(Message::new("assistant", answer));
    m.push(Message::new("user", query));
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
        let a = answer_messages("sys", "2+2?");
        assert_eq!(
            a,
            vec![Message::new("system", "sys"), Message::new("user", "2+2?")]
        );
        assert_eq!(answer_messages("", "q"), vec![Message::new("user", "q")]);
        let c = confidence_messages(&a, "<answer>4</answer>", "conf?");
        assert_eq!(c.len(), 4);
        assert_eq!(c[2], Message::new("assistant", "<answer>4</answer>"));
        assert_eq!(c[3], Message::new("user", "conf?"));
        let j = serde_json::to_string(&c[..1]).unwrap();
        assert_eq!(j, r#"[{"role":"system","content":"sys"}]"#);
    }
}
