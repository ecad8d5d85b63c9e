//! A long-lived child process speaking lines: the transport under the two JSON-lines protocols,
//! the external verifier ([`crate::reward::external`], `score --verifier-cmd`) and the multi-turn
//! environment ([`crate::sample::env`], `generate-multiturn --env-cmd`). The protocols (what a
//! request and a reply hold, how replies are matched, the error messages) stay with them.
//!
//! The command runs through `sh -c`, so arguments and pipes work; its stderr passes through to
//! ours. It runs in a process group of its own, killed as a whole ([`kill_group`]) on an error,
//! a timeout or a drop while it still runs, so no grandchild outlives rlcr. A writer thread
//! writes the lines it is given (flushing each) while a reader thread hands over every non-blank
//! line of the child's stdout, trimmed, so a child that answers while rlcr is still writing
//! cannot deadlock.
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// What the reader thread hands over.
pub enum FromChild {
    /// A non-blank line of the child's stdout, trimmed.
    Line(String),
    /// The child closed its stdout (with the read error, if reading failed).
    Eof(Option<String>),
}

/// How [`LineChild::finish`] went wrong.
pub enum FinishError {
    /// The child exited with a non-zero status.
    Failed(ExitStatus),
    /// The child still ran when the timeout passed; it was killed.
    Hung,
    /// Waiting for the child failed.
    Wait(std::io::Error),
}

/// A running `sh -c CMD` child with a writer and a reader thread.
pub struct LineChild {
    child: Child,
    to_writer: Option<Sender<String>>,
    writer: Option<JoinHandle<()>>,
    from_reader: Receiver<FromChild>,
    reader: Option<JoinHandle<()>>,
}

impl LineChild {
    /// Start `sh -c CMD` in its own process group; `what` names the child in errors
    /// (`starting the {what} `CMD``, `{what} stdin`).
    pub fn spawn(cmd: &str, what: &str) -> Result<LineChild> {
        Self::spawn_with_env(cmd, what, &[])
    }

    /// [`LineChild::spawn`] with `envs` set (or replaced) in the child's environment.
    pub fn spawn_with_env(
        cmd: &str,
        what: &str,
        envs: &[(&str, std::ffi::OsString)],
    ) -> Result<LineChild> {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            // Its own process group, so that killing it also kills what it started (a hung
            // `sh -c 'python verify.py'` would otherwise leave python running, holding our stderr).
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting the {what} `{cmd}`"))?;
        let stdin = child
            .stdin
            .take()
            .with_context(|| format!("{what} stdin"))?;
        let stdout = child
            .stdout
            .take()
            .with_context(|| format!("{what} stdout"))?;
        let (to_writer, writer_rx) = mpsc::channel::<String>();
        let writer = std::thread::spawn(move || {
            let mut w = std::io::BufWriter::new(stdin);
            while let Ok(line) = writer_rx.recv() {
                if w.write_all(line.as_bytes()).is_err() || w.flush().is_err() {
                    return;
                }
            }
            // channel closed: dropping `w` closes the child's stdin
        });
        let (reader_tx, from_reader) = mpsc::channel::<FromChild>();
        let reader = std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            loop {
                line.clear();
                let msg = match r.read_line(&mut line) {
                    Ok(0) => FromChild::Eof(None),
                    Ok(_) if line.trim().is_empty() => continue,
                    Ok(_) => FromChild::Line(line.trim().to_string()),
                    Err(e) => FromChild::Eof(Some(e.to_string())),
                };
                let eof = matches!(msg, FromChild::Eof(_));
                if reader_tx.send(msg).is_err() || eof {
                    return;
                }
            }
        });
        Ok(LineChild {
            child,
            to_writer: Some(to_writer),
            writer: Some(writer),
            from_reader,
            reader: Some(reader),
        })
    }

    /// Queue `line` (with its `\n`) for the child's stdin; false once the child stopped reading.
    pub fn send(&self, line: String) -> bool {
        self.to_writer
            .as_ref()
            .is_some_and(|tx| tx.send(line).is_ok())
    }

    /// The next line of the child's stdout, waiting at most `wait`.
    pub fn recv_timeout(&self, wait: Duration) -> Result<FromChild, RecvTimeoutError> {
        self.from_reader.recv_timeout(wait)
    }

    /// The child's exit status if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The exit status, if the child exits within a short grace period, else `still running`.
    pub fn exit_status(&mut self) -> String {
        for _ in 0..50 {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.to_string();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        "still running".to_string()
    }

    /// Kill the child's process group.
    pub fn kill(&mut self) {
        kill_group(&mut self.child);
    }

    /// Close the child's stdin and wait for it to exit: killed when it still runs after
    /// `timeout`; a non-zero exit is an error.
    pub fn finish(&mut self, timeout: Duration) -> Result<(), FinishError> {
        self.to_writer.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    if let Some(r) = self.reader.take() {
                        let _ = r.join();
                    }
                    return if st.success() {
                        Ok(())
                    } else {
                        Err(FinishError::Failed(st))
                    };
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => {
                    self.kill();
                    return Err(FinishError::Hung);
                }
                Err(e) => return Err(FinishError::Wait(e)),
            }
        }
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        self.to_writer.take();
        if let Ok(None) = self.child.try_wait() {
            kill_group(&mut self.child);
        }
    }
}

/// SIGKILL the child's process group (the child and everything it started), then reap the child.
/// The child was started as the leader of its own group ([`LineChild::spawn`]), so its pid is
/// the group's id.
pub fn kill_group(child: &mut Child) {
    if let Ok(pgid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: killpg only sends a signal; a group that is already gone gives ESRCH, ignored.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A reply line of either protocol read as far as they agree: a JSON object with an integer
/// `id`. The error says what is wrong (`not JSON (…)`, `not a JSON object`, `no integer "id"`).
pub fn reply_object(
    line: &str,
) -> std::result::Result<(u64, serde_json::Map<String, serde_json::Value>), String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
    let serde_json::Value::Object(obj) = v else {
        return Err("not a JSON object".into());
    };
    let id = obj
        .get("id")
        .and_then(|x| x.as_u64())
        .ok_or("no integer \"id\"")?;
    Ok((id, obj))
}

/// At most 200 characters of a line, with `…` when cut (for error messages).
pub fn shown(line: &str) -> String {
    let mut shown: String = line.chars().take(200).collect();
    if shown.len() < line.len() {
        shown.push('…');
    }
    shown
}
