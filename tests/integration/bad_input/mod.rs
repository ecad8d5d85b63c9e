//! Bad inputs for every stage that reads a table or a model, table-driven.
//!
//! One set of good ("golden") inputs is made once per test process by running the real pipeline
//! on the tiny Qwen2 fixture (prompts → answers → trajectory → scored → train, and a probe table);
//! each case copies one of them with a single defect (not Parquet, truncated, corrupt pages, empty
//! file, zero rows, a wrong column type, a missing column, a null, a list-length mismatch, a span
//! out of range, an unknown `sample_type`, a duplicate `sample_id`, a confidence row without its
//! answer, a non-finite number, a token id outside the vocabulary, a context longer than the
//! model's, a broken model folder, a failing external verifier) into a folder of its own and runs
//! the stage on it. Every case must give:
//! - exit code 1 and, on stderr (with `-q`), exactly one line `rlcr: error: …` naming the file and,
//!   where the defect sits in a row, the row and the column;
//! - no panic (`panicked at`, a backtrace);
//! - nothing in the output folder (no output, no temp file) and no temp file anywhere;
//! - every input (table files, model folders) byte-identical afterwards.
//!
//! Each stage also runs once on the golden input and must succeed (the control: a failure below
//! is caused by the defect, not by the setup). Failures are collected per stage and reported
//! together. Zero rows: `inspect` and `report` describe an empty table (exit 0); every other
//! stage refuses it with exit 1 (docs/getting-started.md, exit codes).
//!
//! This file holds the harness (running the binary, the golden inputs, the defects, the checks);
//! [`stages`] the cases of each stage.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arrow::array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, ListArray, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field};
use rlcr::model::Tokenizer;
use rlcr::table::cols;

use crate::fixtures;
use crate::support::pipeline;
use crate::support::table::{
    self, drop_col, edit_f32s, edit_ids, keep_rows, lists_f32, lists_i32, null_at, replace,
    set_f32, set_span, set_str,
};

// ---------------------------------------------------------------------------------------------
// Running the binary

/// The outcome of one run.
pub struct Run {
    pub code: Option<i32>,
    pub stderr: String,
    pub secs: f64,
}

/// Run `rlcr ARGS` in `dir` with stdout/stderr going to files (so a stray grandchild holding
/// them cannot block the test), killed after `limit`.
pub fn run_in(dir: &Path, args: &[String], limit: Duration) -> Run {
    let logs = dir.with_extension("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let (so, se) = (logs.join("stdout"), logs.join("stderr"));
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rlcr"))
        .current_dir(dir)
        .args(args)
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&so).unwrap())
        .stderr(std::fs::File::create(&se).unwrap())
        .spawn()
        .expect("spawning rlcr");
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Run {
        code: status.and_then(|s| s.code()),
        stderr: std::fs::read_to_string(&se).unwrap_or_default(),
        secs: t0.elapsed().as_secs_f64(),
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Hash of every file under `paths` (recursively), by path.
pub fn snapshot(paths: &[PathBuf]) -> BTreeMap<PathBuf, u64> {
    use std::hash::{Hash, Hasher};
    fn walk(p: &Path, out: &mut BTreeMap<PathBuf, u64>) {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            entries.sort();
            for e in entries {
                walk(&e, out);
            }
        } else if let Ok(bytes) = std::fs::read(p) {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            bytes.hash(&mut h);
            out.insert(p.to_path_buf(), h.finish());
        }
    }
    let mut out = BTreeMap::new();
    for p in paths {
        walk(p, &mut out);
    }
    out
}

/// Every path under `dir` (relative), recursively.
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, p: &Path, out: &mut Vec<String>) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                let path = e.path();
                out.push(
                    path.strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .to_string(),
                );
                if path.is_dir() {
                    walk(root, &path, out);
                }
            }
        }
    }
    let mut v = Vec::new();
    walk(dir, dir, &mut v);
    v.sort();
    v
}

/// Names that look like temp files of an atomic write.
pub fn temp_names(dir: &Path) -> Vec<String> {
    tree(dir)
        .into_iter()
        .filter(|n| {
            let base = n.rsplit('/').next().unwrap_or(n);
            base.contains("rlcr-tmp")
                || base.contains("rlcr-staging")
                || base.contains(".tmp-")
                || base.starts_with(".tmp")
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Golden inputs, made once

pub struct Golden {
    pub dir: PathBuf,
    pub prompts: PathBuf,
    pub sft: PathBuf,
    pub answers: PathBuf,
    pub trajectory: PathBuf,
    pub scored: PathBuf,
    pub train: PathBuf,
    pub probe: PathBuf,
    pub countdown: PathBuf,
    pub verl: PathBuf,
}

static GOLDEN: OnceLock<Golden> = OnceLock::new();

fn pid_alive(pid: &str) -> bool {
    Path::new("/proc").join(pid).exists()
}

/// The golden inputs (made on first use; a folder under the target's tmp dir, per process).
pub fn golden() -> &'static Golden {
    GOLDEN.get_or_init(make_golden)
}

fn make_golden() -> Golden {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    // Folders of earlier test processes that are gone.
    if let Ok(rd) = std::fs::read_dir(base) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if let Some(pid) = n.strip_prefix("bad-input-") {
                if !pid_alive(pid) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
    let dir = base.join(format!("bad-input-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model = fixtures().join("tiny-qwen2");
    let m = model.display().to_string();
    let ok = |args: &[&str]| {
        let r = run_in(&dir, &s(args), Duration::from_secs(300));
        assert!(
            r.code == Some(0),
            "golden input: rlcr {args:?} failed:\n{}",
            r.stderr
        );
    };
    let run = |v: Vec<String>| ok(&v.iter().map(String::as_str).collect::<Vec<_>>());
    run(pipeline::easy_countdown_args(2, "prompts.parquet"));
    let mut sft = pipeline::easy_countdown_args(2, "sft.parquet");
    sft.push("--sft".into());
    run(sft);
    run(pipeline::answers_args(
        &m,
        "prompts.parquet",
        "raw-answers.parquet",
        2,
        2,
        &["--response-prefix", "<think>"],
    ));
    // Every answer gets a closed thinking and an answer, so `probe` has something to cut.
    let tok = Tokenizer::load(&model, None).unwrap();
    let id = |t: &str| tok.token_id(t).unwrap();
    let mut ids: Vec<u32> = tok.encode("12", false).unwrap();
    ids.extend([id("</think>"), id("<answer>")]);
    ids.extend(tok.encode("3+4", false).unwrap());
    ids.extend([id("</answer>"), id("<|im_end|>")]);
    let ids: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
    let raw = table::read(&dir.join("raw-answers.parquet"));
    let n = raw.num_rows();
    let b = cols::set_columns(
        &raw,
        &rlcr::table::TRAJECTORY,
        vec![
            ("response_ids", cols::build_list_i32(vec![ids.clone(); n])),
            (
                "response_text",
                Arc::new(StringArray::from(vec!["12</think><answer>3+4</answer>"; n])),
            ),
            (
                "response_logprobs",
                cols::build_list_f32(vec![vec![-1.0f32; ids.len()]; n]),
            ),
            ("answer_span", cols::build_spans(&vec![None; n])),
            (
                "finish_reason",
                Arc::new(StringArray::from(vec!["stop"; n])),
            ),
        ],
    )
    .unwrap();
    table::write(&b, &dir.join("answers.parquet"), "rlcr.trajectory");
    ok(&[
        "generate-confidence",
        "--model",
        &m,
        "--input",
        "answers.parquet",
        "-o",
        "trajectory.parquet",
        "--num-confidences",
        "1",
        "--max-new-tokens",
        "2",
    ]);
    ok(&[
        "score",
        "--input",
        "trajectory.parquet",
        "-o",
        "scored.parquet",
    ]);
    ok(&[
        "advantage",
        "--input",
        "scored.parquet",
        "-o",
        "train.parquet",
    ]);
    ok(&[
        "probe",
        "--model",
        &m,
        "--input",
        "scored.parquet",
        "-o",
        "probe.parquet",
        "--samples",
        "1",
        "--cuts",
        "1",
        "--max-new-tokens",
        "2",
    ]);
    // TinyZero's countdown Parquet (target, nums) and a verl dataset Parquet.
    let cd = RecordBatch::try_from_iter(vec![
        (
            "target",
            Arc::new(Int64Array::from(vec![7, 12, 5])) as ArrayRef,
        ),
        (
            "nums",
            Arc::new(ListArray::from_iter_primitive::<
                arrow::datatypes::Int64Type,
                _,
                _,
            >(vec![
                Some(vec![Some(3), Some(4)]),
                Some(vec![Some(3), Some(4)]),
                Some(vec![Some(2), Some(3)]),
            ])),
        ),
    ])
    .unwrap();
    table::write(&cd, &dir.join("countdown.parquet"), "test");
    let verl = RecordBatch::try_from_iter(vec![
        (
            "data_source",
            Arc::new(StringArray::from(vec!["gsm8k", "gsm8k"])) as ArrayRef,
        ),
        (
            "prompt",
            Arc::new(StringArray::from(vec!["What is 2+2?", "What is 3*3?"])),
        ),
        (
            "reward_model",
            Arc::new(arrow::array::StructArray::from(vec![(
                Arc::new(Field::new("ground_truth", DataType::Utf8, true)),
                Arc::new(StringArray::from(vec!["4", "9"])) as ArrayRef,
            )])),
        ),
    ])
    .unwrap();
    table::write(&verl, &dir.join("verl.parquet"), "test");
    Golden {
        prompts: dir.join("prompts.parquet"),
        sft: dir.join("sft.parquet"),
        answers: dir.join("answers.parquet"),
        trajectory: dir.join("trajectory.parquet"),
        scored: dir.join("scored.parquet"),
        train: dir.join("train.parquet"),
        probe: dir.join("probe.parquet"),
        countdown: dir.join("countdown.parquet"),
        verl: dir.join("verl.parquet"),
        dir,
    }
}

fn row_of(b: &RecordBatch, sample_type: &str, nth: usize) -> usize {
    let st = cols::str_col(b, "t", "sample_type").unwrap();
    (0..b.num_rows())
        .filter(|&i| st.value(i) == sample_type)
        .nth(nth)
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Model surgery

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Rewrite a safetensors file through `edit` on its header (tensors by name: dtype, shape, bytes).
pub fn edit_safetensors(
    path: &Path,
    edit: impl FnOnce(&mut BTreeMap<String, (String, Vec<usize>, Vec<u8>)>),
) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut tensors = BTreeMap::new();
    let mut meta = None;
    for (k, v) in header.as_object().unwrap() {
        if k == "__metadata__" {
            meta = Some(v.clone());
            continue;
        }
        let off = v["data_offsets"].as_array().unwrap();
        let (a, z) = (
            off[0].as_u64().unwrap() as usize,
            off[1].as_u64().unwrap() as usize,
        );
        let shape = v["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        tensors.insert(
            k.clone(),
            (
                v["dtype"].as_str().unwrap().to_string(),
                shape,
                data[a..z].to_vec(),
            ),
        );
    }
    edit(&mut tensors);
    let mut h = serde_json::Map::new();
    if let Some(m) = meta {
        h.insert("__metadata__".into(), m);
    }
    let mut body = Vec::new();
    for (k, (dt, shape, b)) in &tensors {
        h.insert(
            k.clone(),
            serde_json::json!({"dtype": dt, "shape": shape, "data_offsets": [body.len(), body.len() + b.len()]}),
        );
        body.extend_from_slice(b);
    }
    let mut hb = serde_json::to_vec(&serde_json::Value::Object(h)).unwrap();
    while !hb.len().is_multiple_of(8) {
        hb.push(b' ');
    }
    let mut out = (hb.len() as u64).to_le_bytes().to_vec();
    out.extend(hb);
    out.extend(body);
    std::fs::write(path, out).unwrap();
}

/// Ways to break a model folder (applied to a copy of the tiny Qwen2 fixture).
#[derive(Clone, Copy, Debug)]
pub enum ModelDefect {
    NoFolder,
    NoConfig,
    ConfigNotJson,
    NoWeights,
    TruncatedWeights,
    MissingTensor,
    WrongShape,
    NoTokenizer,
    TokenizerBeyondVocab,
}

pub const MODEL_DEFECTS: [ModelDefect; 9] = [
    ModelDefect::NoFolder,
    ModelDefect::NoConfig,
    ModelDefect::ConfigNotJson,
    ModelDefect::NoWeights,
    ModelDefect::TruncatedWeights,
    ModelDefect::MissingTensor,
    ModelDefect::WrongShape,
    ModelDefect::NoTokenizer,
    ModelDefect::TokenizerBeyondVocab,
];

/// Make the broken model folder `dir`; returns what the message must contain.
pub fn break_model(d: ModelDefect, dir: &Path) -> Vec<String> {
    if !matches!(d, ModelDefect::NoFolder) {
        copy_dir(&fixtures().join("tiny-qwen2"), dir);
    }
    let st = dir.join("model.safetensors");
    let folder = dir.file_name().unwrap().to_string_lossy().to_string();
    match d {
        ModelDefect::NoFolder => vec![folder],
        ModelDefect::NoConfig => {
            std::fs::remove_file(dir.join("config.json")).unwrap();
            vec![folder, "config.json".into()]
        }
        ModelDefect::ConfigNotJson => {
            std::fs::write(dir.join("config.json"), "{\"hidden_size\": 64,").unwrap();
            vec![folder, "config.json".into()]
        }
        ModelDefect::NoWeights => {
            std::fs::remove_file(&st).unwrap();
            vec![folder, "safetensors".into()]
        }
        ModelDefect::TruncatedWeights => {
            let b = std::fs::read(&st).unwrap();
            std::fs::write(&st, &b[..b.len() / 2]).unwrap();
            vec![folder, "model.safetensors".into()]
        }
        ModelDefect::MissingTensor => {
            edit_safetensors(&st, |t| {
                t.remove("model.layers.1.mlp.down_proj.weight").unwrap();
            });
            vec![folder, "model.layers.1.mlp.down_proj.weight".into()]
        }
        ModelDefect::WrongShape => {
            edit_safetensors(&st, |t| {
                let e = t.get_mut("model.layers.0.self_attn.q_proj.weight").unwrap();
                e.1 = vec![32, 128];
            });
            vec![folder, "model.layers.0.self_attn.q_proj.weight".into()]
        }
        ModelDefect::NoTokenizer => {
            std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
            vec![folder, "tokenizer".into()]
        }
        ModelDefect::TokenizerBeyondVocab => {
            // A tokenizer with a token id (1000) the model's 384-row embedding does not have.
            let p = dir.join("tokenizer.json");
            let mut t: serde_json::Value = crate::support::json::read(&p);
            t["model"]["vocab"]["zzextra"] = serde_json::json!(1000);
            std::fs::write(&p, serde_json::to_string(&t).unwrap()).unwrap();
            vec![folder, "1000".into(), "384".into()]
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cases

/// What the case's input file holds.
pub enum Input {
    Bytes(Vec<u8>),
    Table(RecordBatch, &'static str),
    /// A folder of part files `parts/` (name, bytes).
    Folder(Vec<(String, Vec<u8>)>),
}

/// A check on the case folder after the run.
pub type AfterCheck = fn(&Path) -> Result<(), String>;

/// One bad input for one stage.
pub struct Case {
    pub label: String,
    /// The stage's `--input` (written as `in.parquet` in the case folder); `None`: the golden one.
    pub input: Option<Input>,
    /// A broken model folder (`model/` in the case folder); `None`: the fixture.
    pub model: Option<ModelDefect>,
    /// Extra flags.
    pub extra: Vec<String>,
    /// What the one-line message must contain (besides `rlcr: error:`).
    pub needles: Vec<String>,
    /// The expected exit code (1, or 0 for the controls and zero-row tables where that is the rule).
    pub code: i32,
    /// Lines the case's child process (an external verifier) may add to stderr.
    pub child_stderr: bool,
    /// Wall-time limit of the run.
    pub limit: Duration,
    /// A last check on the case folder after the run.
    pub after: Option<AfterCheck>,
}

impl Case {
    pub fn new(label: &str, needles: &[&str]) -> Self {
        Case {
            label: label.to_string(),
            input: None,
            model: None,
            extra: vec![],
            needles: needles.iter().map(|x| x.to_string()).collect(),
            code: 1,
            child_stderr: false,
            limit: Duration::from_secs(120),
            after: None,
        }
    }
    pub fn table(label: &str, b: RecordBatch, schema: &'static str, needles: &[&str]) -> Self {
        let mut c = Case::new(label, needles);
        c.input = Some(Input::Table(b, schema));
        c
    }
    pub fn bytes(label: &str, b: Vec<u8>, needles: &[&str]) -> Self {
        let mut c = Case::new(label, needles);
        c.input = Some(Input::Bytes(b));
        c
    }
    fn ok(mut self) -> Self {
        self.code = 0;
        self
    }
    fn flags(mut self, f: &[&str]) -> Self {
        self.extra.extend(f.iter().map(|x| x.to_string()));
        self
    }
}

/// How a stage is called.
pub struct Stage {
    pub name: &'static str,
    /// The golden input the cases start from.
    pub golden: PathBuf,
    /// Whether the stage reads a model (`--model`).
    pub model: bool,
    /// The command line, given the input, the model and the output path.
    pub argv: fn(&str, &str, &str) -> Vec<String>,
    /// The output path inside the case's `out/` folder.
    pub out: &'static str,
    /// Whether to run the golden input first as a control (it must succeed).
    pub control: bool,
}

/// The file-level defects every table reader must survive (`file` = golden table).
pub fn file_cases(file: &Path) -> Vec<Case> {
    let bytes = std::fs::read(file).unwrap();
    let mut corrupt = bytes.clone();
    // Garbage over the data pages, footer intact.
    let end = corrupt.len() * 2 / 3;
    for (k, x) in corrupt[8..end].iter_mut().enumerate() {
        *x = (k as u8).wrapping_mul(37).wrapping_add(11);
    }
    vec![
        Case::bytes(
            "not Parquet",
            b"prompt_id,messages\nq1,hello\n".to_vec(),
            &["in.parquet", "not a Parquet file"],
        ),
        Case::bytes("empty file", vec![], &["in.parquet", "empty"]),
        Case::bytes(
            "truncated",
            bytes[..bytes.len() / 2].to_vec(),
            &["in.parquet"],
        ),
        Case::bytes(
            "truncated by 1 byte",
            bytes[..bytes.len() - 1].to_vec(),
            &["in.parquet"],
        ),
        Case::bytes("corrupt pages", corrupt, &["in.parquet"]),
    ]
}

/// Defects of an input given as a folder of part files (`golden` is one good part). `dup`: the
/// stage checks row identities, so the same part twice is an error at the first row of the copy.
pub fn folder_cases(golden: &Path, schema: &'static str, dup: bool) -> Vec<Case> {
    let good = std::fs::read(golden).unwrap();
    let t = table::read(golden);
    let other = {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.parquet");
        let name = t.schema().field(t.num_columns() - 1).name().clone();
        table::write(&drop_col(&t, &name), &p, schema);
        std::fs::read(p).unwrap()
    };
    let folder = |label: &str, files: Vec<(&str, Vec<u8>)>, needles: &[&str]| {
        let mut c = Case::new(label, needles);
        c.input = Some(Input::Folder(
            files.into_iter().map(|(n, b)| (n.to_string(), b)).collect(),
        ));
        c
    };
    let rows = t.num_rows().to_string();
    let mut v = vec![
        folder(
            "folder without parts",
            vec![("notes.txt", b"not a part".to_vec())],
            &["parts", "no"],
        ),
        folder(
            "parts with different schemas",
            vec![("part-0.parquet", good.clone()), ("part-1.parquet", other)],
            &["part-1.parquet", "schema"],
        ),
        folder(
            "a truncated part",
            vec![
                ("part-0.parquet", good.clone()),
                ("part-1.parquet", good[..good.len() / 2].to_vec()),
            ],
            &["part-1.parquet"],
        ),
    ];
    if dup {
        v.push(folder(
            "the same part twice",
            vec![("part-0.parquet", good.clone()), ("part-1.parquet", good)],
            &["parts", &format!("row {rows}")],
        ));
    }
    v
}

/// Run every case of `stage` (plus the control on the golden input); panics with the list of
/// failures.
pub fn check_stage(stage: &Stage, cases: Vec<Case>) {
    let wd = crate::Workdir::new();
    let mut failures = Vec::new();
    let control = stage
        .control
        .then(|| Case::new("control (golden input)", &[]).ok());
    let t0 = Instant::now();
    let n = cases.len();
    for (k, case) in control.into_iter().chain(cases).enumerate() {
        let dir = wd.path(&format!("case-{k:02}"));
        std::fs::create_dir_all(dir.join("out")).unwrap();
        if let Err(e) = check_case(stage, &case, &dir) {
            failures.push(format!("[{} #{k} {}] {e}", stage.name, case.label));
        }
    }
    eprintln!(
        "bad input: {}: {n} cases{} in {:.1} s",
        stage.name,
        if stage.control { " + control" } else { "" },
        t0.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n\n{}",
        failures.len(),
        n + 1,
        failures.join("\n\n")
    );
}

fn check_case(stage: &Stage, case: &Case, dir: &Path) -> Result<(), String> {
    let input = match &case.input {
        None => stage.golden.clone(),
        Some(Input::Bytes(b)) => {
            let p = dir.join("in.parquet");
            std::fs::write(&p, b).unwrap();
            p
        }
        Some(Input::Table(b, schema)) => {
            let p = dir.join("in.parquet");
            table::write(b, &p, schema);
            p
        }
        Some(Input::Folder(files)) => {
            let p = dir.join("parts");
            std::fs::create_dir_all(&p).unwrap();
            for (name, bytes) in files {
                std::fs::write(p.join(name), bytes).unwrap();
            }
            p
        }
    };
    let mut needles = case.needles.clone();
    let model = match case.model {
        None => fixtures().join("tiny-qwen2"),
        Some(d) => {
            assert!(
                stage.model,
                "{}: a model case for a stage without a model",
                stage.name
            );
            let m = dir.join("model");
            needles.extend(break_model(d, &m));
            m
        }
    };
    let out = dir.join("out").join(stage.out);
    let mut args = vec!["-q".to_string()];
    args.extend((stage.argv)(
        &input.display().to_string(),
        &model.display().to_string(),
        &out.display().to_string(),
    ));
    args.extend(case.extra.iter().cloned());
    let watched = vec![input.clone(), model.clone(), golden().dir.clone()];
    let before = snapshot(&watched);
    let r = run_in(dir, &args, case.limit);
    let after = snapshot(&watched);
    let cmd = format!("rlcr {}", args.join(" "));
    let ctx = |what: &str| {
        format!(
            "{what}\n  command: {cmd}\n  exit: {:?} after {:.2} s\n  stderr: {}",
            r.code,
            r.secs,
            r.stderr.trim_end().replace('\n', "\n          ")
        )
    };
    if r.stderr.contains("panicked") || r.stderr.contains("RUST_BACKTRACE") {
        return Err(ctx("panic"));
    }
    if r.code != Some(case.code) {
        return Err(ctx(&format!("expected exit code {}", case.code)));
    }
    if before != after {
        let changed: Vec<_> = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k) != after.get(*k))
            .collect();
        return Err(ctx(&format!("inputs changed: {changed:?}")));
    }
    let temps = temp_names(dir);
    if !temps.is_empty() {
        return Err(ctx(&format!("temp files left: {temps:?}")));
    }
    if case.code == 0 {
        return Ok(());
    }
    let written = tree(&dir.join("out"));
    if !written.is_empty() {
        return Err(ctx(&format!("wrote into the output folder: {written:?}")));
    }
    // One message: a line `rlcr: error: …`, possibly with indented detail lines under it (a
    // list of every problem of a model folder); a verifier's own stderr lines may come before.
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let ours: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("rlcr"))
        .collect();
    let details_ok = ours.len() == 1
        && lines[ours[0] + 1..]
            .iter()
            .all(|l| l.starts_with(' ') || l.starts_with('\t'));
    if !details_ok || (!case.child_stderr && ours[0] != 0) {
        return Err(ctx(
            "expected exactly one message `rlcr: error: …` on stderr",
        ));
    }
    let msg = lines[ours[0]..].join("\n");
    let msg = msg.as_str();
    if !msg.starts_with("rlcr: error: ") {
        return Err(ctx("the line does not start with `rlcr: error: `"));
    }
    let missing: Vec<&String> = needles
        .iter()
        .filter(|n| !msg.contains(n.as_str()))
        .collect();
    if !missing.is_empty() {
        return Err(ctx(&format!("the message does not name {missing:?}")));
    }
    if let Some(f) = case.after {
        f(dir).map_err(|e| ctx(&e))?;
    }
    Ok(())
}

/// The model cases of a model stage.
pub fn model_cases() -> Vec<Case> {
    MODEL_DEFECTS
        .iter()
        .map(|&d| {
            let mut c = Case::new(&format!("model: {d:?}"), &[]);
            c.model = Some(d);
            c
        })
        .collect()
}

mod stages;
