//! A user's reward function decides: through `score --verifier-cmd` and the reward adapters, the
//! answer's reward is the function's (no rlcr format gate in front unless asked), labels and columns
//! reach it with the types the dataset stored, a function that raises is named at its row by the
//! adapter and by rlcr alike, the adapters run from any folder, and the output records how it was
//! made.
use std::process::Output;
use std::sync::Arc;

use arrow::array::{Array, Float32Array, StringArray};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{Field, Schema};

use crate::support::pipeline::answers_responding;
use crate::support::table::{read, strs, write};
use crate::Workdir;

/// Labels stored as text that would parse as JSON (a number, a float, a boolean, null, a list).
const LABELS: [&str; 5] = ["7", "3.50", "true", "null", "[1]"];

/// The README's reward functions, which compare the answer to the label as text, checking the
/// types they are given (a wrong type raises, which fails the run).
const MY_REWARDS: &str = r#"
def _need_str(what, v):
    if not isinstance(v, str):
        raise TypeError(f"{what} is {type(v).__name__} {v!r}, expected the str the dataset stored")

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    _need_str("ground_truth", ground_truth)
    _need_str("extra_info['answer']", extra_info["answer"])
    return float(solution_str.split("<answer>")[-1].split("</answer>")[0].strip() == ground_truth)

def accuracy_reward(prompts, completions, answer, note, **kwargs):
    for a in answer:
        _need_str("answer", a)
    for n in note:
        _need_str("note", n)
    return [float(f"<answer>{a}</answer>" in c) for c, a in zip(completions, answer)]

def raises_on_13(data_source, solution_str, ground_truth, extra_info=None):
    if "13" in solution_str:
        raise ValueError("cannot parse this one")
    return 0.0

def trl_raises_on_13(prompts, completions, **kwargs):
    if any("13" in c for c in completions):
        raise KeyError("boom")
    return [0.0] * len(completions)
"#;

/// A prompts table of [`LABELS`] (a JSON lines dataset with the label as text) and its
/// trajectory table: one answer per prompt from the tiny model, the responses then replaced by
/// `response(row, label)`; plus a user column `note` holding the label text.
fn trajectory(wd: &Workdir, response: &dyn Fn(usize, &str) -> String, out: &str) {
    let lines: Vec<String> = LABELS
        .iter()
        .enumerate()
        .map(|(i, l)| {
            serde_json::json!({"question": format!("question {i}"), "answer": l}).to_string()
        })
        .collect();
    wd.write("data.jsonl", lines.join("\n") + "\n");
    wd.write("my_rewards.py", MY_REWARDS);
    wd.run(&[
        "prepare",
        "--input",
        "data.jsonl",
        "--input-template",
        "{question} Answer in <answer></answer>.",
        "--label-key",
        "answer",
        "-o",
        "p.parquet",
    ]);
    let mut notes = Vec::new();
    let b = answers_responding(wd, "p.parquet", 1, |i, gt| {
        let label: String = serde_json::from_str(gt).expect("a label stored as text");
        let text = response(i, &label);
        notes.push(label);
        text
    });
    let b = with_column(&b, "note", Arc::new(StringArray::from(notes)));
    write(&b, &wd.path(out), "rlcr.trajectory");
}

/// `b` with a text column `name` added at the end.
fn with_column(b: &RecordBatch, name: &str, a: ArrayRef) -> RecordBatch {
    let mut fields: Vec<Field> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(name, a.data_type().clone(), true));
    let mut cols = b.columns().to_vec();
    cols.push(a);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
}

fn adapter(name: &str) -> String {
    crate::own_data::adapter(name)
}

fn score(wd: &Workdir, input: &str, cmd: &str, extra: &[&str], out: &str) -> Output {
    let mut args = vec!["score", "--input", input, "-o", out, "--verifier-cmd", cmd];
    args.extend(extra);
    let mut c = wd.cmd(&args);
    c.env("PYTHONPATH", wd.root());
    c.output().expect("rlcr runs")
}

fn accs(wd: &Workdir, name: &str) -> Vec<f32> {
    let b = read(&wd.path(name));
    let a = b
        .column_by_name("acc_reward")
        .unwrap()
        .as_any()
        .downcast_ref::<Float32Array>()
        .unwrap()
        .clone();
    a.values().to_vec()
}

fn ok(o: &Output) {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// An answer without rlcr's `<think>` format gets the function's reward under
/// `--verifier-cmd`; `--format-gate on` still gates when asked, and the built-in verifiers keep
/// gating by default.
#[test]
fn external_reward_is_not_gated_by_rlcr_format_unless_asked() {
    let wd = Workdir::new();
    // every answer correct, none in <think>…</think><answer>…</answer>
    trajectory(&wd, &|_, l| format!("<answer>{l}</answer>"), "t.parquet");
    let cmd = format!(
        "python3 {} my_rewards:compute_score",
        adapter("verl_reward.py")
    );
    ok(&score(&wd, "t.parquet", &cmd, &[], "s.parquet"));
    assert_eq!(accs(&wd, "s.parquet"), vec![1.0; LABELS.len()]);
    ok(&score(
        &wd,
        "t.parquet",
        &cmd,
        &["--format-gate", "on"],
        "g.parquet",
    ));
    assert_eq!(accs(&wd, "g.parquet"), vec![0.0; LABELS.len()]);
    // the built-in exact-match verifier: gated by default (0), ungated with the flag (1)
    wd.run(&[
        "score",
        "--input",
        "t.parquet",
        "-o",
        "b.parquet",
        "--verifier",
        "exact",
    ]);
    assert_eq!(accs(&wd, "b.parquet"), vec![0.0; LABELS.len()]);
    let cfg = config(&wd, "s.parquet");
    assert_eq!(cfg["settings"]["gate"], false, "{cfg}");
    assert_eq!(config(&wd, "b.parquet")["settings"]["gate"], true);
}

/// verl's compute_score gets the label the dataset stored as text as a str ("7", not 7), and
/// `extra_info`'s copy of it too.
#[test]
fn verl_adapter_gets_a_numeric_looking_text_label_as_str() {
    let wd = Workdir::new();
    trajectory(
        &wd,
        &|_, l| format!("<think>.</think><answer>{l}</answer>"),
        "t.parquet",
    );
    let cmd = format!(
        "python3 {} my_rewards:compute_score",
        adapter("verl_reward.py")
    );
    let o = score(
        &wd,
        "t.parquet",
        &cmd,
        &["--format-gate", "off"],
        "s.parquet",
    );
    ok(&o);
    assert_eq!(accs(&wd, "s.parquet"), vec![1.0; LABELS.len()]);
}

/// TRL reward functions get the dataset's text columns as lists of str: the label through
/// `extra_info`, and a column the user added to the table (`note`).
#[test]
fn trl_adapter_gets_numeric_looking_text_columns_as_str() {
    let wd = Workdir::new();
    trajectory(
        &wd,
        &|_, l| format!("<think>.</think><answer>{l}</answer>"),
        "t.parquet",
    );
    let cmd = format!(
        "python3 {} my_rewards:accuracy_reward",
        adapter("trl_reward.py")
    );
    let o = score(
        &wd,
        "t.parquet",
        &cmd,
        &["--format-gate", "off"],
        "s.parquet",
    );
    ok(&o);
    assert_eq!(accs(&wd, "s.parquet"), vec![1.0; LABELS.len()]);
}

/// A reward function that raises on one row (not the first of its batch): the adapter's message
/// and rlcr's own last line name the same row and sample.
#[test]
fn a_raising_reward_is_named_at_the_same_row_by_adapter_and_rlcr() {
    let wd = Workdir::new();
    let bad = 3;
    trajectory(
        &wd,
        &|i, l| {
            if i == bad {
                "<answer>13</answer>".into()
            } else {
                format!("<answer>{l}</answer>")
            }
        },
        "t.parquet",
    );
    let b = read(&wd.path("t.parquet"));
    let sid = strs(&b, "sample_id")[bad].clone();
    for (a, f) in [
        ("verl_reward.py", "my_rewards:raises_on_13"),
        ("trl_reward.py", "my_rewards:trl_raises_on_13"),
    ] {
        let cmd = format!("python3 {} {f}", adapter(a));
        let o = score(&wd, "t.parquet", &cmd, &[], "bad.parquet");
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("raised on row {bad} (sample_id '{sid}')")),
            "{a}: {err}"
        );
        let last = err.lines().last().unwrap_or_default();
        assert!(last.starts_with("rlcr: error:"), "{a}: {last}");
        assert!(
            last.contains(&format!(", row {bad}: "))
                && last.contains(&format!("(sample_id {sid})")),
            "{a}: rlcr's last line names another row than the adapter: {last}"
        );
        assert!(
            last.contains("cannot parse this one") || last.contains("boom"),
            "{a}: {last}"
        );
        assert!(!wd.path("bad.parquet").exists());
    }
}

/// The adapters are found from a folder outside the repository with no PYTHONPATH: by name on
/// the verifier command's PATH, or through `$RLCR_REWARDS`; the user's module is imported from
/// the working folder.
#[test]
fn reward_adapters_run_from_any_folder() {
    let wd = Workdir::new();
    trajectory(&wd, &|_, l| format!("<answer>{l}</answer>"), "t.parquet");
    for (cmd, out) in [
        ("verl_reward.py my_rewards:compute_score", "v.parquet"),
        (
            r#"python3 "$RLCR_REWARDS/trl_reward.py" my_rewards:accuracy_reward"#,
            "t2.parquet",
        ),
    ] {
        let mut c = wd.cmd(&[
            "score",
            "--input",
            "t.parquet",
            "-o",
            out,
            "--verifier-cmd",
            cmd,
        ]);
        c.env_remove("PYTHONPATH")
            .env("XDG_CACHE_HOME", wd.path("cache"));
        let o = c.output().expect("rlcr runs");
        ok(&o);
        assert_eq!(accs(&wd, out), vec![1.0; LABELS.len()], "{cmd}");
    }
    // the adapters were written under the cache folder given, once
    let dirs: Vec<_> = std::fs::read_dir(wd.path("cache/rlcr"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(dirs[0].starts_with("rewards-"), "{dirs:?}");
}

fn config(wd: &Workdir, name: &str) -> serde_json::Value {
    let f = std::fs::File::open(wd.path(name)).unwrap();
    let r = parquet::file::reader::SerializedFileReader::new(f).unwrap();
    use parquet::file::reader::FileReader;
    let kv = r
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .unwrap()
        .clone();
    let c = kv
        .iter()
        .find(|k| k.key == "rlcr.config")
        .and_then(|k| k.value.clone())
        .unwrap();
    serde_json::from_str(&c).unwrap()
}

/// `score`'s `rlcr.config` holds the command line and the seed, as every stage's does.
#[test]
fn score_config_records_argv_and_seed() {
    let wd = Workdir::new();
    trajectory(&wd, &|_, l| format!("<answer>{l}</answer>"), "t.parquet");
    wd.run(&[
        "--seed",
        "11",
        "score",
        "--input",
        "t.parquet",
        "-o",
        "s.parquet",
        "--verifier",
        "exact",
    ]);
    let cfg = config(&wd, "s.parquet");
    assert_eq!(cfg["seed"], 11, "{cfg}");
    let argv: Vec<&str> = cfg["argv"]
        .as_array()
        .unwrap_or_else(|| panic!("no argv: {cfg}"))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        argv.ends_with(&[
            "score",
            "--input",
            "t.parquet",
            "-o",
            "s.parquet",
            "--verifier",
            "exact"
        ]),
        "{argv:?}"
    );
}
