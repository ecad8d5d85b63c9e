//! The usage error: a request that cannot be carried out as asked (a value out of range, two
//! settings that exclude each other, a LoRA setting the model on disk cannot honour): a wrong
//! flag, not a broken file. The stages' plans return it from wherever the check lives, so the
//! command line maps it to exit code 2 whichever module found it.
use std::fmt;

/// A usage error (exit code 2 on the command line).
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// `msg` as a [`UsageError`] in an [`anyhow::Error`].
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// Any error as a [`UsageError`] with its whole chain as the message (for the checks of a
/// library type whose error is a plain `anyhow::Error`).
pub fn as_usage(e: anyhow::Error) -> anyhow::Error {
    usage(format!("{e:#}"))
}
