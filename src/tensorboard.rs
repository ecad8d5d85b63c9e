//! TensorBoard event files: the scalars of `update`/`sft` (one event per optimizer step) and of
//! `report` (one event per input), readable by TensorBoard and its Python reader
//! (`EventAccumulator`).
//!
//! Format: a file of TFRecords — `u64` length (little-endian), the masked CRC-32C of those 8
//! bytes, the record, the masked CRC-32C of the record — each holding one `tensorflow.Event`
//! protobuf. The first record carries `file_version = "brain.Event:2"`; every other one carries
//! `wall_time` (double, field 1), `step` (int64, field 2) and a `Summary` (field 5) of
//! `Value { tag (1), simple_value (2, float) }`. TensorBoard reads every file whose name contains
//! `tfevents` in a run folder, in name order, and joins their events into one curve per tag.
//!
//! Why a writer of our own and not a crate: the whole format is the four messages above, about 60
//! lines of varint/fixed-width encoding plus a 256-entry CRC-32C table. `tensorboard-rs` brings
//! `protobuf` with its generated code (and `image`, `crc`) into every build of the binary for
//! those same 60 lines, and gives no control over file naming (the loop needs deterministic names
//! so that a re-run iteration replaces its own file rather than adding a second copy of its
//! steps). The `crc32c` crate would save the table only. The encoder is checked against
//! TensorBoard's own reader in the integration tests and against a published CRC-32C check value
//! here; [`read_events`] decodes the files back (for carrying a checkpoint's curve forward and for
//! tests).
//!
//! Names: [`step_scalars`] turns a `train_metrics.jsonl` line into scalars whose tags are the
//! line's keys (plus `tokens_per_second`), so the dashboard and the JSON lines say the same thing.
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The `file_version` of the first record.
pub const FILE_VERSION: &str = "brain.Event:2";

// ---------------------------------------------------------------------------------------------
// CRC-32C (Castagnoli), reflected polynomial 0x82F63B78, as TFRecord uses.

const fn crc_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

static CRC_TABLE: [u32; 256] = crc_table();

/// CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c = CRC_TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// TFRecord's masked CRC: rotate right by 15, add a constant.
pub fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord around `data`.
pub fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

// ---------------------------------------------------------------------------------------------
// Protobuf encoding of Event / Summary / Summary.Value.

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn len_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, ((field << 3) | 2) as u64);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// An `Event` with the file version (the first record of a file).
pub fn version_event(wall_time: f64) -> Vec<u8> {
    let mut e = Vec::new();
    e.push(0x09); // field 1, fixed64
    e.extend_from_slice(&wall_time.to_le_bytes());
    len_field(&mut e, 3, FILE_VERSION.as_bytes());
    e
}

/// An `Event` at `step` with one scalar per `(tag, value)`.
pub fn scalars_event(wall_time: f64, step: i64, scalars: &[(String, f32)]) -> Vec<u8> {
    let mut summary = Vec::new();
    for (tag, v) in scalars {
        let mut val = Vec::with_capacity(tag.len() + 8);
        len_field(&mut val, 1, tag.as_bytes());
        val.push(0x15); // field 2, fixed32
        val.extend_from_slice(&v.to_le_bytes());
        len_field(&mut summary, 1, &val);
    }
    let mut e = Vec::with_capacity(summary.len() + 24);
    e.push(0x09);
    e.extend_from_slice(&wall_time.to_le_bytes());
    e.push(0x10); // field 2, varint (int64: two's complement as u64)
    varint(&mut e, step as u64);
    len_field(&mut e, 5, &summary);
    e
}

/// Seconds since the Unix epoch, now.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Named scalar values of one event.
pub type Scalars = Vec<(String, f32)>;

/// A whole event file: the version record, then one record per `(wall_time, step, scalars)`.
pub fn encode_file(wall_time: f64, events: &[(f64, i64, Scalars)]) -> Vec<u8> {
    let mut out = record(&version_event(wall_time));
    for (t, s, v) in events {
        out.extend(record(&scalars_event(*t, *s, v)));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Writer (events appended and flushed one step at a time).

/// An event file written while training runs: TensorBoard shows each step as soon as it is
/// flushed. Created with its version record; [`EventWriter::write`] appends one event.
pub struct EventWriter {
    file: File,
    path: PathBuf,
}

impl EventWriter {
    /// Create (or truncate) `path`, its folder included, and write the version record.
    pub fn create(path: &Path) -> Result<EventWriter> {
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = EventWriter {
            file,
            path: path.to_path_buf(),
        };
        w.append(&record(&version_event(now())))?;
        Ok(w)
    }

    /// Append encoded records (already framed by [`record`]) and flush.
    pub fn append(&mut self, records: &[u8]) -> Result<()> {
        self.file
            .write_all(records)
            .and_then(|()| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The name of an event file whose first event is at `first_step`: names sort in step order, so
/// TensorBoard reads a run's files in the order they continue each other, and a call that starts
/// again from the same step replaces its own file.
pub fn file_name(first_step: u64, what: &str) -> String {
    format!("events.out.tfevents.{first_step:010}.rlcr-{what}")
}

// ---------------------------------------------------------------------------------------------
// Scalars from the metrics files.

/// Keys of a `train_metrics.jsonl` line that are not scalars of the step.
const NOT_SCALARS: [&str; 2] = ["step", "skipped"];

/// The step and scalars of one `train_metrics.jsonl` line: every numeric key under its own name
/// (`"nan"`, JSON's stand-in for a non-finite value, as NaN) and `tokens_per_second`
/// (`tokens / seconds`). `None` for a skipped step (its values describe no update) or a line
/// without a step.
pub fn step_scalars(line: &Value) -> Option<(u64, Vec<(String, f32)>)> {
    let o = line.as_object()?;
    if o.get("skipped").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    let step = o.get("step")?.as_u64()?;
    let mut out = Vec::with_capacity(o.len() + 1);
    for (k, v) in o {
        if NOT_SCALARS.contains(&k.as_str()) {
            continue;
        }
        let x = match v {
            Value::Number(n) => n.as_f64(),
            Value::String(s) if s == "nan" => Some(f64::NAN),
            _ => None,
        };
        if let Some(x) = x {
            out.push((k.clone(), x as f32));
        }
    }
    let num = |k: &str| o.get(k).and_then(Value::as_f64);
    if let (Some(t), Some(s)) = (num("tokens"), num("seconds")) {
        if s > 0.0 {
            out.push(("tokens_per_second".to_string(), (t / s) as f32));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Some((step, out))
}

/// Every numeric leaf of a JSON value, named by its path joined with `/` (`answer_turn/reward_mean`),
/// skipping the subtrees named in `skip`. Nulls (figures that do not exist for an input) are left
/// out.
pub fn numeric_leaves(v: &Value, skip: &[&str]) -> Vec<(String, f32)> {
    fn walk(v: &Value, prefix: &str, skip: &[&str], out: &mut Vec<(String, f32)>) {
        match v {
            Value::Number(n) => {
                if let Some(x) = n.as_f64() {
                    out.push((prefix.to_string(), x as f32));
                }
            }
            Value::Object(m) => {
                for (k, x) in m {
                    if skip.contains(&k.as_str()) {
                        continue;
                    }
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}/{k}")
                    };
                    walk(x, &p, skip, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, "", skip, &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// Reading (carrying a curve forward; tests).

/// One decoded event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    /// The step (0 when absent, as protobuf defaults it).
    pub step: i64,
    /// `file_version`, on the first record.
    pub file_version: Option<String>,
    /// Scalars `(tag, simple_value)`.
    pub scalars: Vec<(String, f32)>,
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() - self.i < n {
            bail!("truncated protobuf");
        }
        let s = &self.b[self.i..self.i + n];
        self.i += n;
        Ok(s)
    }
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        bail!("varint longer than 10 bytes")
    }
    fn done(&self) -> bool {
        self.i >= self.b.len()
    }
    /// Next field: (number, wire type, payload for length-delimited / fixed, varint value).
    fn field(&mut self) -> Result<(u64, &'a [u8], u64)> {
        let key = self.varint()?;
        let (num, wt) = (key >> 3, key & 7);
        match wt {
            0 => Ok((num, &[], self.varint()?)),
            1 => Ok((num, self.take(8)?, 0)),
            2 => {
                let n = self.varint()? as usize;
                Ok((num, self.take(n)?, 0))
            }
            5 => Ok((num, self.take(4)?, 0)),
            _ => bail!("unsupported protobuf wire type {wt}"),
        }
    }
}

fn decode_event(b: &[u8]) -> Result<Event> {
    let mut e = Event {
        wall_time: 0.0,
        step: 0,
        file_version: None,
        scalars: vec![],
    };
    let mut c = Cursor { b, i: 0 };
    while !c.done() {
        match c.field()? {
            (1, p, _) if p.len() == 8 => {
                e.wall_time = f64::from_le_bytes(p.try_into().context("wall_time")?)
            }
            (2, _, v) => e.step = v as i64,
            (3, p, _) => e.file_version = Some(String::from_utf8_lossy(p).to_string()),
            (5, summary, _) => {
                let mut s = Cursor { b: summary, i: 0 };
                while !s.done() {
                    let (n, val, _) = s.field()?;
                    if n != 1 {
                        continue;
                    }
                    let (mut tag, mut x) = (String::new(), None);
                    let mut vc = Cursor { b: val, i: 0 };
                    while !vc.done() {
                        match vc.field()? {
                            (1, p, _) => tag = String::from_utf8_lossy(p).to_string(),
                            (2, p, _) if p.len() == 4 => {
                                x = Some(f32::from_le_bytes(p.try_into().context("value")?))
                            }
                            _ => {}
                        }
                    }
                    if let Some(x) = x {
                        e.scalars.push((tag, x));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(e)
}

/// Decode an event file's bytes, checking every record's two CRCs.
pub fn read_events(bytes: &[u8]) -> Result<Vec<Event>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes.len() - i < 12 {
            bail!("event file: truncated record header at byte {i}");
        }
        let len_bytes = &bytes[i..i + 8];
        let crc = u32::from_le_bytes(bytes[i + 8..i + 12].try_into().context("crc")?);
        if crc != masked_crc(len_bytes) {
            bail!("event file: bad length CRC at byte {i}");
        }
        let n = u64::from_le_bytes(len_bytes.try_into().context("length")?) as usize;
        let start = i + 12;
        if bytes.len() - start < n.saturating_add(4) {
            bail!("event file: truncated record at byte {i}");
        }
        let data = &bytes[start..start + n];
        let crc = u32::from_le_bytes(bytes[start + n..start + n + 4].try_into().context("crc")?);
        if crc != masked_crc(data) {
            bail!("event file: bad data CRC at byte {i}");
        }
        out.push(decode_event(data).with_context(|| format!("event file: record at byte {i}"))?);
        i = start + n + 4;
    }
    Ok(out)
}

/// The records of `bytes` after its version record (the events of an existing file, to append to
/// another), or `None` when the file does not decode.
pub fn records_after_version(bytes: &[u8]) -> Option<&[u8]> {
    read_events(bytes).ok()?;
    if bytes.len() < 12 {
        return None;
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().ok()?) as usize;
    bytes.get(12 + n + 4..)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // The standard check value of CRC-32C (RFC 3720, B.4): "123456789" → 0xE3069283.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        // 32 zero bytes → 0x8A9136AA (RFC 3720, B.4).
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    }

    #[test]
    fn version_record_bytes() {
        // A version record at wall time 0, by hand: 8-byte length 24, its masked CRC, the event
        // (09 + 8 zero bytes, 1a 0d "brain.Event:2"), its masked CRC.
        let r = record(&version_event(0.0));
        assert_eq!(&r[..8], &24u64.to_le_bytes());
        assert_eq!(r[12], 0x09);
        assert_eq!(&r[21..23], &[0x1a, 0x0d]);
        assert_eq!(&r[23..36], b"brain.Event:2");
        assert_eq!(r.len(), 12 + 24 + 4);
    }

    #[test]
    fn round_trip() {
        let ev = vec![
            (
                1.5,
                1,
                vec![("loss".to_string(), 0.25f32), ("lr".into(), 1e-3)],
            ),
            (2.5, 300, vec![("loss".to_string(), f32::NAN)]),
        ];
        let b = encode_file(1.0, &ev);
        let got = read_events(&b).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].file_version.as_deref(), Some(FILE_VERSION));
        assert_eq!((got[1].wall_time, got[1].step), (1.5, 1));
        assert_eq!(got[1].scalars, ev[0].2);
        assert_eq!(got[2].step, 300);
        assert!(got[2].scalars[0].1.is_nan());
        let rest = records_after_version(&b).unwrap();
        // (Compared as text: NaN != NaN.)
        assert_eq!(
            format!("{:?}", read_events(rest).unwrap()),
            format!("{:?}", &got[1..])
        );
        // A flipped byte is caught by the CRC.
        let mut bad = b.clone();
        let n = bad.len();
        bad[n - 6] ^= 1;
        assert!(read_events(&bad).is_err());
    }

    #[test]
    fn scalars_of_a_metrics_line() {
        let l: Value = serde_json::from_str(
            r#"{"step":3,"epoch":0,"loss":0.5,"grad_norm":"nan","tokens":100,"seconds":0.5,
                "skipped":false,"stage":"update"}"#,
        )
        .unwrap();
        let (step, s) = step_scalars(&l).unwrap();
        assert_eq!(step, 3);
        let names: Vec<&str> = s.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "epoch",
                "grad_norm",
                "loss",
                "seconds",
                "tokens",
                "tokens_per_second"
            ]
        );
        assert!(s[1].1.is_nan());
        assert_eq!(s[5].1, 200.0);
        let skipped: Value = serde_json::from_str(r#"{"step":3,"skipped":true}"#).unwrap();
        assert!(step_scalars(&skipped).is_none());
    }

    #[test]
    fn leaves_by_path() {
        let v: Value =
            serde_json::from_str(r#"{"a":1,"b":{"c":0.5,"d":null,"e":"x"},"se":{"a":0.1}}"#)
                .unwrap();
        assert_eq!(
            numeric_leaves(&v, &["se"]),
            vec![("a".to_string(), 1.0), ("b/c".to_string(), 0.5)]
        );
    }
}
