//! The command line, `prepare`, `schema`, `inspect`, and bad-input behaviour of the foundation.
use crate::Workdir;

#[test]
fn every_subcommand_has_help() {
    let wd = Workdir::new();
    for sub in [
        "prepare",
        "generate-answers",
        "generate-confidence",
        "generate-multiturn",
        "score",
        "advantage",
        "update",
        "sft",
        "probe",
        "report",
        "logprobs",
        "values",
        "import",
        "import-gguf",
        "merge-lora",
        "schema",
        "inspect",
    ] {
        let out = wd.run(&[sub, "--help"]);
        assert!(
            out.contains("Example:"),
            "`rlcr {sub} --help` has no example:\n{out}"
        );
        assert!(out.len() > 300, "`rlcr {sub} --help` is too short:\n{out}");
    }
}

#[test]
fn usage_errors_exit_2() {
    let wd = Workdir::new();
    wd.fail(&["no-such-command"], 2);
    wd.fail(
        &["prepare", "--from", "countdown-synth", "-o", "x.parquet"],
        2,
    );
    assert!(wd.listing().is_empty());
}

/// `prepare --sft-confidence`: warm-start confidences per number count; its usage errors exit 2
/// and write nothing.
#[test]
fn prepare_sft_confidence_per_difficulty() {
    let wd = Workdir::new();
    let base = [
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        "40",
        "--min-numbers",
        "2",
        "--max-numbers",
        "3",
        "--max-number",
        "3",
        "--max-target",
        "9",
        "--split",
        "train",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter()
            .chain(extra)
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
    };
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    for (extra, needle) in [
        (
            &["--sft", "--sft-confidence", "2=0.5", "-o", "x.parquet"][..],
            "no range for tasks of 3 numbers",
        ),
        (
            &[
                "--sft",
                "--sft-confidence",
                "2=0.5,3=0.25",
                "-o",
                "x.parquet",
            ][..],
            "0.25 is not one of",
        ),
        (
            &["--sft-confidence", "2=0.5,3=0.2", "-o", "x.parquet"][..],
            "--sft-confidence works with --sft",
        ),
    ] {
        let e = wd.fail(&refs(&with(extra)), 2);
        assert!(e.contains(needle), "{extra:?}: {e}");
    }
    assert!(wd.listing().is_empty());
    let args = with(&[
        "--sft",
        "--sft-confidence",
        "2=0.6,3=0.1-0.2",
        "-o",
        "s.parquet",
    ]);
    wd.run(&refs(&args));
    let b = rlcr::table::Reader::open(&wd.path("s.parquet"))
        .unwrap()
        .read_all()
        .unwrap();
    let ids = rlcr::table::cols::str_col(&b[0], "s", "prompt_id").unwrap();
    let m = rlcr::table::cols::messages(&b[0], "s").unwrap();
    let gt = rlcr::table::cols::str_col(&b[0], "s", "ground_truth").unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..b[0].num_rows() {
        if !ids.value(i).ends_with("/sft-c") {
            continue;
        }
        let k = serde_json::from_str::<serde_json::Value>(gt.value(i)).unwrap()["numbers"]
            .as_array()
            .unwrap()
            .len();
        let msgs: serde_json::Value = serde_json::from_str(m.value(i)).unwrap();
        let text = msgs.as_array().unwrap().last().unwrap()["content"]
            .as_str()
            .unwrap()
            .to_string();
        let c = text.split("<confidence>").nth(1).unwrap();
        let c = c.trim_end_matches("</confidence>").to_string();
        // Two numbers: always 0.6; three: 0.1 or 0.2.
        let allowed: &[&str] = if k == 2 { &["0.6"] } else { &["0.1", "0.2"] };
        assert!(allowed.contains(&c.as_str()), "{k} numbers: {text}");
        seen.insert((k, c));
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
}

#[test]
fn prepare_countdown_synth_and_inspect() {
    let wd = Workdir::new();
    wd.run(&[
        "--seed",
        "3",
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        "25",
        "-o",
        "p.parquet",
    ]);
    let out = wd.run(&["inspect", "p.parquet"]);
    assert!(out.contains("rows: 25"), "{out}");
    assert!(out.contains("rlcr.schema: rlcr.prompts"), "{out}");
    assert!(out.contains("rlcr.stage: prepare"), "{out}");
    assert!(out.contains("\"seed\":3"), "{out}");
    // Same seed, same bytes (the output path is part of the recorded config: same name).
    let wd2 = Workdir::new();
    wd2.run(&[
        "--seed",
        "3",
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        "25",
        "-o",
        "p.parquet",
    ]);
    assert!(
        std::fs::read(wd.path("p.parquet")).unwrap()
            == std::fs::read(wd2.path("p.parquet")).unwrap(),
        "same seed gave different bytes"
    );
    // Refuses to overwrite its own input (verl source reading p.parquet).
    let e = wd.fail(
        &[
            "prepare",
            "--from",
            "verl",
            "--input",
            "p.parquet",
            "-o",
            "p.parquet",
        ],
        1,
    );
    assert!(
        e.contains("never modifies an input") || e.contains("prompt"),
        "{e}"
    );
}

#[test]
fn prepare_jsonl_and_errors_name_the_line() {
    let wd = Workdir::new();
    wd.write(
        "in.jsonl",
        "{\"prompt\": \"What is 2+2?\", \"ground_truth\": \"4\", \"data_source\": \"math\", \"id\": \"q1\"}\n\
         {\"messages\": [{\"role\": \"user\", \"content\": \"Capital of France?\"}], \"ground_truth\": \"Paris\"}\n",
    );
    wd.run(&[
        "prepare",
        "--from",
        "jsonl",
        "--input",
        "in.jsonl",
        "-o",
        "p.parquet",
    ]);
    let out = wd.run(&["inspect", "p.parquet"]);
    assert!(out.contains("rows: 2"), "{out}");
    wd.write(
        "bad.jsonl",
        "{\"prompt\": \"x\", \"ground_truth\": 1}\n{\"prompt\": \"y\"}\n",
    );
    wd.refuse(
        &[
            "prepare",
            "--from",
            "jsonl",
            "--input",
            "bad.jsonl",
            "-o",
            "b.parquet",
        ],
        1,
        "bad.jsonl, line 2, field `ground_truth`",
        "b.parquet",
    );
}

#[test]
fn bad_parquet_inputs_exit_1_and_write_nothing() {
    let wd = Workdir::new();
    wd.write("empty.parquet", "");
    wd.write("text.parquet", "not parquet at all, just text\n");
    for (f, needle) in [
        ("empty.parquet", "empty"),
        ("text.parquet", "not a Parquet file"),
        ("missing.parquet", "cannot open"),
    ] {
        let e = wd.fail(&["inspect", f], 1);
        assert!(e.contains(f) && e.contains(needle), "{e}");
    }
    wd.refuse(
        &[
            "prepare",
            "--from",
            "verl",
            "--input",
            "text.parquet",
            "-o",
            "o.parquet",
        ],
        1,
        "text.parquet",
        "o.parquet",
    );
}

#[test]
fn schema_prints_json_matching_schemas_folder() {
    let wd = Workdir::new();
    for kind in ["trajectory", "prompts", "probe"] {
        let out = wd.run(&["schema", kind]);
        let got: serde_json::Value = serde_json::from_str(&out).unwrap();
        let file = crate::fixtures()
            .join("..")
            .join("schemas")
            .join(format!("{kind}.json"));
        let want: serde_json::Value = crate::support::json::read(file);
        assert_eq!(got, want);
    }
    wd.fail(&["schema", "nope"], 2);
}

#[test]
fn config_file_values_are_overridden_by_flags() {
    let wd = Workdir::new();
    wd.write("c.toml", "from = \"countdown-synth\"\ncount = 5\n");
    wd.run(&["prepare", "--config", "c.toml", "-o", "a.parquet"]);
    assert!(wd.run(&["inspect", "a.parquet"]).contains("rows: 5"));
    wd.run(&[
        "prepare",
        "--config",
        "c.toml",
        "--count",
        "7",
        "-o",
        "b.parquet",
    ]);
    assert!(wd.run(&["inspect", "b.parquet"]).contains("rows: 7"));
}

#[test]
fn broken_pipe_is_quiet() {
    use std::process::Stdio;
    let wd = Workdir::new();
    wd.run(&[
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        "3",
        "-o",
        "p.parquet",
    ]);
    let mut child = wd
        .cmd(&["schema", "trajectory"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(o.status.code() == Some(0), "status {:?}", o.status);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
}

#[test]
fn prepare_countdown_jsonl_and_verl_parquet() {
    use arrow::array::{
        Array, ArrayRef, Int64Array, ListArray, RecordBatch, StringArray, StructArray,
    };
    use arrow::datatypes::{DataType, Field, Fields, Int64Type, Schema};
    use std::sync::Arc;

    let wd = Workdir::new();
    wd.write(
        "cd.jsonl",
        "{\"target\": 23, \"nums\": [2, 3, 7]}\n{\"target\": 98, \"nums\": [44, 19, 35]}\n",
    );
    wd.run(&[
        "prepare",
        "--from",
        "countdown",
        "--input",
        "cd.jsonl",
        "-o",
        "c.parquet",
    ]);
    let batches = rlcr::table::Reader::open(&wd.path("c.parquet"))
        .unwrap()
        .read_all()
        .unwrap();
    let gt = rlcr::table::cols::str_col(&batches[0], "c", "ground_truth").unwrap();
    assert_eq!(gt.value(1), r#"{"numbers":[44,19,35],"target":98}"#);
    let msg = rlcr::table::cols::messages(&batches[0], "c").unwrap();
    assert!(msg
        .value(1)
        .contains("Using the numbers [44, 19, 35], create an equation that equals 98."));

    // A verl dataset Parquet: prompt list<struct<role, content>>, reward_model struct, extra_info.
    let msg_fields = Fields::from(vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
    ]);
    let msgs = StructArray::new(
        msg_fields.clone(),
        vec![
            Arc::new(StringArray::from(vec!["user", "user"])) as ArrayRef,
            Arc::new(StringArray::from(vec!["What is 2+2?", "What is 3*3?"])),
        ],
        None,
    );
    let prompt = ListArray::new(
        Arc::new(Field::new("item", DataType::Struct(msg_fields), true)),
        arrow::buffer::OffsetBuffer::new(vec![0i32, 1, 2].into()),
        Arc::new(msgs),
        None,
    );
    let rm_fields = Fields::from(vec![
        Field::new("style", DataType::Utf8, true),
        Field::new("ground_truth", DataType::Utf8, true),
    ]);
    let rm = StructArray::new(
        rm_fields,
        vec![
            Arc::new(StringArray::from(vec!["rule", "rule"])) as ArrayRef,
            Arc::new(StringArray::from(vec!["4", "9"])),
        ],
        None,
    );
    let ei_fields = Fields::from(vec![
        Field::new("split", DataType::Utf8, true),
        Field::new("index", DataType::Int64, true),
    ]);
    let ei = StructArray::new(
        ei_fields,
        vec![
            Arc::new(StringArray::from(vec!["train", "train"])) as ArrayRef,
            Arc::new(Int64Array::from(vec![10, 11])),
        ],
        None,
    );
    let _ = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(1)])]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("data_source", DataType::Utf8, true),
        Field::new("prompt", prompt.data_type().clone(), true),
        Field::new("reward_model", rm.data_type().clone(), true),
        Field::new("extra_info", ei.data_type().clone(), true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(vec!["gsm8k", "gsm8k"])),
            Arc::new(prompt),
            Arc::new(rm),
            Arc::new(ei),
        ],
    )
    .unwrap();
    let meta = rlcr::table::Meta::new(&rlcr::table::PROMPTS, "test", serde_json::json!({}), &[]);
    rlcr::table::write_table(&wd.path("verl.parquet"), schema, &[batch], &meta).unwrap();
    wd.run(&[
        "prepare",
        "--from",
        "verl",
        "--input",
        "verl.parquet",
        "-o",
        "v.parquet",
    ]);
    let b = rlcr::table::Reader::open(&wd.path("v.parquet"))
        .unwrap()
        .read_all()
        .unwrap();
    let ids = rlcr::table::cols::str_col(&b[0], "v", "prompt_id").unwrap();
    assert_eq!(ids.value(0), "gsm8k-train-10");
    let gt = rlcr::table::cols::str_col(&b[0], "v", "ground_truth").unwrap();
    assert_eq!(gt.value(1), "\"9\"");
    let m = rlcr::table::cols::messages(&b[0], "v").unwrap();
    assert_eq!(m.value(1), r#"[{"content":"What is 3*3?","role":"user"}]"#);

    // Missing field: file, line and column named; nothing written.
    wd.write(
        "bad.jsonl",
        "{\"target\": 23, \"nums\": [2, 3, 7]}\n{\"nums\": [1]}\n",
    );
    wd.refuse(
        &[
            "prepare",
            "--from",
            "countdown",
            "--input",
            "bad.jsonl",
            "-o",
            "b.parquet",
        ],
        1,
        "bad.jsonl, line 2, column `target`",
        "b.parquet",
    );
}

/// `--trace FILE` writes a Chrome trace with the stage's phases, also when the stage fails.
#[test]
fn trace_flag_writes_a_chrome_trace() {
    let wd = Workdir::new();
    let m = crate::fixtures().join("tiny-qwen2").display().to_string();
    wd.run(&[
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        "2",
        "-o",
        "p.parquet",
    ]);
    wd.run(&[
        "--trace",
        "gen.json",
        "generate-answers",
        "--model",
        &m,
        "--input",
        "p.parquet",
        "-o",
        "a.parquet",
        "--num-answers",
        "2",
        "--max-new-tokens",
        "4",
    ]);
    let names = |f: &str| -> Vec<(String, f64)> {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(wd.path(f)).unwrap()).unwrap();
        v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["dur"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    let ev = names("gen.json");
    let count = |n: &str| ev.iter().filter(|(k, _)| k == n).count();
    assert_eq!(count("rlcr"), 1);
    assert!(count("prefill") >= 1, "{ev:?}");
    // 4 new tokens: the first comes from the prefill's logits, then at most 3 decode steps
    assert!((1..=3).contains(&count("decode step")), "{ev:?}");
    assert_eq!(count("finish table (flush, fsync, rename)"), 1);
    let total = ev.iter().find(|(k, _)| k == "rlcr").unwrap().1;
    assert!(ev.iter().all(|(_, d)| *d <= total + 1.0));
    // A failing run still leaves its trace.
    wd.fail(
        &[
            "--trace",
            "bad.json",
            "score",
            "--input",
            "missing.parquet",
            "-o",
            "s.parquet",
        ],
        1,
    );
    assert_eq!(names("bad.json").len(), 1);
}

/// `advantage` (KL in the reward) and `update` (KL loss) take the same estimator names, ours and
/// verl's, from one parser (two parsers once disagreed: `low_var_kl` was accepted by one and refused by the other).
#[test]
fn kl_estimator_names_are_the_same_for_advantage_and_update() {
    let wd = Workdir::new();
    let stages: [&[&str]; 2] = [
        &[
            "advantage",
            "--input",
            "missing.parquet",
            "-o",
            "out.parquet",
            "--kl-coef",
            "0.001",
        ],
        &[
            "update",
            "--model",
            "missing-model",
            "--input",
            "missing.parquet",
            "-o",
            "out-model",
            "--kl-coef",
            "0.001",
        ],
    ];
    for stage in stages {
        for name in [
            "k1",
            "kl",
            "abs",
            "k2",
            "mse",
            "k3",
            "low_var_kl",
            "low-var-kl",
        ] {
            let args = [stage, &["--kl-estimator", name]].concat();
            // accepted: the run gets past the flags and fails on the missing input (exit 1)
            let err = wd.fail(&args, 1);
            assert!(!err.contains("invalid value"), "{args:?}: {err}");
        }
        for name in ["full", "k3+", "K3"] {
            let args = [stage, &["--kl-estimator", name]].concat();
            let err = wd.fail(&args, 2);
            assert!(err.contains("invalid value"), "{args:?}: {err}");
        }
    }
    assert!(wd.listing().is_empty(), "{:?}", wd.listing());
}

#[test]
fn prepare_arithmetic_synth_usage_errors_exit_2() {
    let wd = Workdir::new();
    let base = ["prepare", "--from", "arithmetic-synth", "-o", "x.parquet"];
    for (extra, needle) in [
        (
            &["--count", "4", "--ops", "+/"][..],
            "`/` is not one of + - *",
        ),
        (&["--count", "4", "--ops", "++"][..], "appears twice"),
        (
            &["--count", "4", "--min-digits", "3", "--max-digits", "2"][..],
            "--min-digits 3 is larger than --max-digits 2",
        ),
        (
            &["--count", "4", "--max-digits", "10"][..],
            "operands have 1 to 9 digits",
        ),
        (
            &["--count", "4", "--min-digits", "0"][..],
            "operands have 1 to 9 digits",
        ),
        (&["--ops", "+"][..], "needs --count N"),
        (
            &["--count", "4", "--sft", "--sft-confidence", "1=0.8,2=0.5"][..],
            "no range for tasks of 3 digits",
        ),
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let e = wd.fail(&args, 2);
        assert!(e.contains(needle), "{extra:?}: {e}");
    }
    assert!(wd.listing().is_empty());
    // digit counts are valid --sft-confidence difficulties
    wd.run(&[
        "prepare",
        "--from",
        "arithmetic-synth",
        "--count",
        "8",
        "--sft",
        "--sft-confidence",
        "1=0.8,2=0.4-0.5,3=0.1",
        "-o",
        "sft.parquet",
    ]);
}
