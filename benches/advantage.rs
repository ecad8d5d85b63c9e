//! Benchmark harness for `rlcr advantage` (not a test; run once by hand):
//!
//! ```text
//! cargo bench --bench advantage -- [ROWS] [ESTIMATOR...]
//! ```
//!
//! Generates a scored RLCR table of ROWS rows (default 10 000 000) in a temporary folder: prompts of
//! G_a = 4 answers (32–95 response tokens, spans inside) and G_c = 2 confidences per answer (8–23
//! tokens), Brier rewards, every tenth confidence span null. Then runs the real binary on it once per
//! estimator (default `rlcr`) and prints wall time, CPU time (the load-independent figure on a
//! shared machine), rows/s, tokens/s, peak RSS (polled from `/proc/PID/status` VmHWM) and the
//! stage's own per-pass timings. `RLCR_BENCH_DIR=DIR` keeps (and reuses) the generated table;
//! `RLCR_BIN=PATH` runs another build of the binary.
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{
    Array, ArrayRef, Float32Array, Int32Array, ListArray, RecordBatch, StringArray, StructArray,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Fields, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

const G_A: usize = 4;
const G_C: usize = 2;
const ROWS_PER_PROMPT: usize = G_A + G_A * G_C;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn span_type() -> DataType {
    DataType::Struct(Fields::from(vec![
        Field::new("start", DataType::Int32, false),
        Field::new("end", DataType::Int32, false),
    ]))
}

fn schema() -> Arc<Schema> {
    let item = |t: DataType| Arc::new(Field::new("item", t, true));
    Arc::new(Schema::new(vec![
        Field::new("prompt_id", DataType::Utf8, false),
        Field::new("sample_type", DataType::Utf8, false),
        Field::new("answer_idx", DataType::Int32, false),
        Field::new("confidence_idx", DataType::Int32, true),
        Field::new("sample_id", DataType::Utf8, false),
        Field::new("response_ids", DataType::List(item(DataType::Int32)), false),
        Field::new("answer_span", span_type(), true),
        Field::new("confidence_span", span_type(), true),
        Field::new("acc_reward", DataType::Float32, false),
        Field::new("confidence", DataType::Float32, true),
        Field::new("conf_reward", DataType::Float32, true),
        Field::new("reward", DataType::Float32, false),
    ]))
}

fn spans(v: &[Option<(i32, i32)>]) -> ArrayRef {
    let DataType::Struct(fields) = span_type() else {
        unreachable!()
    };
    Arc::new(StructArray::new(
        fields,
        vec![
            Arc::new(Int32Array::from(
                v.iter().map(|s| s.map_or(0, |x| x.0)).collect::<Vec<_>>(),
            )),
            Arc::new(Int32Array::from(
                v.iter().map(|s| s.map_or(0, |x| x.1)).collect::<Vec<_>>(),
            )),
        ],
        Some(NullBuffer::from(
            v.iter().map(|s| s.is_some()).collect::<Vec<_>>(),
        )),
    ))
}

/// Write `rows` rows; returns the number of response tokens.
fn generate(path: &Path, rows: usize) -> u64 {
    let schema = schema();
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(Default::default()))
        .build();
    let f = std::fs::File::create(path).expect("create bench table");
    let mut w = ArrowWriter::try_new(f, schema.clone(), Some(props)).expect("writer");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let prompts = rows.div_ceil(ROWS_PER_PROMPT);
    let per_batch = 4096; // prompts per batch
    let mut written = 0usize;
    let mut tokens = 0u64;
    let mut p = 0usize;
    while p < prompts && written < rows {
        let (mut pid, mut st, mut aidx, mut cidx, mut sid) =
            (vec![], vec![], vec![], vec![], vec![]);
        let (mut lens, mut ids, mut asp, mut csp) = (vec![], vec![], vec![], vec![]);
        let (mut acc_r, mut conf, mut conf_r, mut rew) = (vec![], vec![], vec![], vec![]);
        for _ in 0..per_batch {
            if p >= prompts || written >= rows {
                break;
            }
            let name = format!("task-{p:08}");
            let accs: Vec<f32> = (0..G_A).map(|_| (rng.below(3) == 0) as u8 as f32).collect();
            let mut emit = |kind: &'static str,
                            k: usize,
                            h: Option<usize>,
                            len: usize,
                            span: Option<(i32, i32)>,
                            acc: f32,
                            c: Option<f32>,
                            r: f32,
                            rng: &mut Rng| {
                if written >= rows {
                    return;
                }
                pid.push(name.clone());
                st.push(kind);
                aidx.push(k as i32);
                cidx.push(h.map(|h| h as i32));
                sid.push(match h {
                    None => format!("{name}/a{k}"),
                    Some(h) => format!("{name}/a{k}/c{h}"),
                });
                lens.push(len);
                ids.extend((0..len).map(|_| rng.below(32000) as i32));
                asp.push(if kind == "answer" { span } else { None });
                csp.push(if kind == "confidence" { span } else { None });
                acc_r.push(acc);
                conf.push(c);
                conf_r.push(c.map(|_| r));
                rew.push(r);
                tokens += len as u64;
                written += 1;
            };
            for (k, &acc) in accs.iter().enumerate() {
                let len = 32 + rng.below(64) as usize;
                emit(
                    "answer",
                    k,
                    None,
                    len,
                    Some((1, len as i32 - 1)),
                    acc,
                    None,
                    acc,
                    &mut rng,
                );
            }
            for (k, &acc) in accs.iter().enumerate() {
                for h in 0..G_C {
                    let len = 8 + rng.below(16) as usize;
                    let c = (rng.below(11) as f32) / 10.0;
                    let span = if rng.below(10) == 0 {
                        None
                    } else {
                        Some((0, len as i32 - 1))
                    };
                    let r = 1.0 - (acc - c) * (acc - c);
                    let _ = rng.unit();
                    emit(
                        "confidence",
                        k,
                        Some(h),
                        len,
                        span,
                        acc,
                        Some(c),
                        r,
                        &mut rng,
                    );
                }
            }
            p += 1;
        }
        let cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(pid)),
            Arc::new(StringArray::from(st)),
            Arc::new(Int32Array::from(aidx)),
            Arc::new(Int32Array::from(cidx)),
            Arc::new(StringArray::from(sid)),
            Arc::new(ListArray::new(
                Arc::new(Field::new("item", DataType::Int32, true)),
                OffsetBuffer::from_lengths(lens),
                Arc::new(Int32Array::from(ids)),
                None,
            )),
            spans(&asp),
            spans(&csp),
            Arc::new(Float32Array::from(acc_r)),
            Arc::new(Float32Array::from(conf)),
            Arc::new(Float32Array::from(conf_r)),
            Arc::new(Float32Array::from(rew)),
        ];
        w.write(&RecordBatch::try_new(schema.clone(), cols).expect("batch"))
            .expect("write");
    }
    w.close().expect("close");
    tokens
}

/// Response tokens of an existing table (from the `response_ids` offsets).
fn count_tokens(path: &Path) -> u64 {
    let f = std::fs::File::open(path).expect("open bench table");
    let b =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).expect("parquet");
    let idx = b.schema().index_of("response_ids").expect("response_ids");
    let mask = parquet::arrow::ProjectionMask::roots(b.parquet_schema(), [idx]);
    let mut n = 0u64;
    for batch in b.with_projection(mask).build().expect("reader") {
        let batch = batch.expect("batch");
        let l = arrow::array::AsArray::as_list::<i32>(batch.column(0));
        n += (l.value_offsets()[l.len()] - l.value_offsets()[0]) as u64;
    }
    n
}

/// CPU time (user + system) of this process's waited-for children, from `/proc/self/stat`
/// (`cutime`, `cstime`; clock ticks of 1/100 s).
fn children_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (t(13) + t(14)) / 100.0
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let rows: usize = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let mut estimators: Vec<String> = args.iter().skip(1).cloned().collect();
    if estimators.is_empty() {
        estimators.push("rlcr".into());
    }
    // RLCR_BENCH_DIR keeps the generated table (and reuses it on the next run).
    let tmp = tempfile::tempdir().expect("tempdir");
    let keep = std::env::var_os("RLCR_BENCH_DIR").map(std::path::PathBuf::from);
    let dir = keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let input = dir.join(format!("scored-{rows}.parquet"));
    let t = Instant::now();
    let tokens = if keep.is_some() && input.exists() {
        count_tokens(&input)
    } else {
        generate(&input, rows)
    };
    let size = std::fs::metadata(&input).map(|m| m.len()).unwrap_or(0);
    println!(
        "generated {rows} rows, {tokens} response tokens ({:.1} per row), {:.0} MiB, in {:.1} s",
        tokens as f64 / rows as f64,
        size as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    for est in &estimators {
        let out = dir.join(format!("train-{est}.parquet"));
        let t = Instant::now();
        // RLCR_BIN runs another build of the binary (e.g. an optimised copy).
        let bin = std::env::var_os("RLCR_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_rlcr").into());
        let cpu0 = children_cpu_seconds();
        let mut child = Command::new(bin)
            .args(["-v", "advantage", "--input"])
            .arg(&input)
            .arg("-o")
            .arg(&out)
            .args(["--estimator", est])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn rlcr");
        let pid = child.id();
        let stderr = child.stderr.take().expect("stderr");
        let lines = std::thread::spawn(move || {
            use std::io::BufRead;
            std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
                .filter(|l| l.contains(" pass: "))
                .collect::<Vec<_>>()
        });
        let mut peak = 0;
        let status = loop {
            if let Some(k) = peak_rss_kib(pid) {
                peak = peak.max(k);
            }
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let cpu = children_cpu_seconds() - cpu0;
        for l in lines.join().unwrap_or_default() {
            println!("  {l}");
        }
        let secs = t.elapsed().as_secs_f64();
        assert!(status.success(), "rlcr advantage failed: {status}");
        let osize = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
        println!(
            "rlcr advantage --estimator {est}: {secs:.2} s wall, {cpu:.2} s CPU, {:.2} M rows/s, {:.1} M tokens/s, peak RSS {:.0} MiB, output {:.0} MiB",
            rows as f64 / secs / 1e6,
            tokens as f64 / secs / 1e6,
            peak as f64 / 1024.0,
            osize as f64 / (1 << 20) as f64
        );
    }
}
