//! `--trace FILE`: where the time goes, as a Chrome trace (open it in `chrome://tracing` or
//! <https://ui.perfetto.dev>).
//!
//! Profilers that read hardware counters (`perf`) are not available on every machine (shared VMs
//! often lack them), so the stages mark their own phases: a [`span`] guard records one complete
//! event (`"ph": "X"`) with its start, duration and thread when it is dropped. When tracing is off
//! (the default), [`span`] is one relaxed atomic load and returns `None`: the marks can sit inside
//! the decode loop. Events are kept in memory (a few dozen bytes each; a long run with one span per
//! decode step stays in the megabytes) and written once, atomically, when the command ends, also
//! when it fails, so a slow or failing run can be looked at.
//!
//! Threads are numbered in the order they first record an event (the main thread is usually 1);
//! each gets a `thread_name` metadata event with its Rust thread name when it has one.
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

static ENABLED: AtomicBool = AtomicBool::new(false);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);
static START: OnceLock<Instant> = OnceLock::new();
static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());

thread_local! {
    static TID: u64 = {
        let tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
        let name = std::thread::current().name().unwrap_or("worker").to_string();
        push(Event {
            name: "thread_name".into(),
            ph: "M",
            ts: 0.0,
            dur: None,
            pid: 1,
            tid,
            args: Some(serde_json::json!({ "name": name })),
        });
        tid
    };
}

/// One trace event in the Chrome trace format (times in microseconds).
#[derive(Debug, Clone, Serialize)]
struct Event {
    name: String,
    ph: &'static str,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u32,
    tid: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<serde_json::Value>,
}

fn push(e: Event) {
    // A poisoned lock only means another thread panicked while pushing; the events are plain data.
    let mut v = EVENTS.lock().unwrap_or_else(|p| p.into_inner());
    v.push(e);
}

/// Turn tracing on (for the rest of the process).
pub fn enable() {
    START.get_or_init(Instant::now);
    ENABLED.store(true, Ordering::Relaxed);
}

/// Is tracing on?
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A phase being timed; records itself when dropped.
#[must_use = "the span ends when this guard is dropped"]
pub struct Span {
    name: &'static str,
    start: Instant,
    args: Option<serde_json::Value>,
}

impl Span {
    /// Attach arguments shown with the event (e.g. rows, tokens).
    pub fn arg(mut self, key: &str, value: impl Into<serde_json::Value>) -> Span {
        let m = self
            .args
            .get_or_insert_with(|| serde_json::Value::Object(Default::default()));
        if let Some(o) = m.as_object_mut() {
            o.insert(key.to_string(), value.into());
        }
        self
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let Some(t0) = START.get() else { return };
        let ts = self.start.saturating_duration_since(*t0).as_secs_f64() * 1e6;
        let dur = self.start.elapsed().as_secs_f64() * 1e6;
        let tid = TID.with(|t| *t);
        push(Event {
            name: self.name.to_string(),
            ph: "X",
            ts,
            dur: Some(dur),
            pid: 1,
            tid,
            args: self.args.take(),
        });
    }
}

/// Start timing a phase: `let _s = trace::span("decode step");`. `None` when tracing is off.
#[inline]
pub fn span(name: &'static str) -> Option<Span> {
    if !enabled() {
        return None;
    }
    Some(Span {
        name,
        start: Instant::now(),
        args: None,
    })
}

/// Like [`span`], with arguments computed only when tracing is on.
#[inline]
pub fn span_with(
    name: &'static str,
    args: impl FnOnce() -> Vec<(&'static str, serde_json::Value)>,
) -> Option<Span> {
    let mut s = span(name)?;
    for (k, v) in args() {
        s = s.arg(k, v);
    }
    Some(s)
}

/// Write the events recorded so far to `path` (atomically), sorted by thread and start time.
pub fn write(path: &Path) -> Result<usize> {
    let mut events = EVENTS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    events.sort_by(|a, b| {
        (a.tid, a.ts)
            .partial_cmp(&(b.tid, b.ts))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let json = serde_json::to_vec(&serde_json::json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
    }))
    .context("encoding the trace")?;
    crate::fs::write_atomic(path, &json)
        .with_context(|| format!("writing the trace {}", path.display()))?;
    Ok(events.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_nest_and_serialise_as_complete_events() {
        // Tracing is process-global: this is the only unit test that turns it on.
        assert!(span("off").is_none() || enabled());
        enable();
        {
            let _outer = span("outer").map(|s| s.arg("rows", 3));
            std::thread::sleep(std::time::Duration::from_millis(5));
            let _inner = span_with("inner", || vec![("tokens", 7.into())]);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        std::thread::Builder::new()
            .name("helper".into())
            .spawn(|| drop(span("on another thread")))
            .unwrap()
            .join()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.json");
        write(&p).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        let find = |n: &str| ev.iter().find(|e| e["name"] == n).unwrap().clone();
        let (outer, inner) = (find("outer"), find("inner"));
        assert_eq!(outer["ph"], "X");
        assert_eq!(outer["args"]["rows"], 3);
        assert_eq!(inner["args"]["tokens"], 7);
        let f = |e: &serde_json::Value, k: &str| e[k].as_f64().unwrap();
        // inner lies within outer; outer lasted at least the 7 ms slept
        assert!(f(&inner, "ts") >= f(&outer, "ts"));
        assert!(f(&inner, "ts") + f(&inner, "dur") <= f(&outer, "ts") + f(&outer, "dur") + 1.0);
        assert!(f(&outer, "dur") >= 7000.0, "{outer}");
        assert!(f(&inner, "dur") >= 2000.0 && f(&inner, "dur") < f(&outer, "dur"));
        let other = find("on another thread");
        assert_ne!(other["tid"], outer["tid"]);
        assert!(ev
            .iter()
            .any(|e| e["ph"] == "M" && e["tid"] == other["tid"] && e["args"]["name"] == "helper"));
    }
}
