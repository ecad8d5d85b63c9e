//! The command line, `prepare`, `schema`, `inspect`, and bad-input behaviour of the foundation.
use crate::Workdir;

#[test]
fn every_subcommand_has_help() {
    let wd = Workdir::new();
    for sub in [
        "prepare",
        "generate-answers",
        "generate-confidence",
        "score",
        "advantage",
        "update",
        "sft",
        "probe",
        "report",
        "logprobs",
        "import-gguf",
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
    let e = wd.fail(
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
    );
    assert!(e.contains("bad.jsonl, line 2, field `ground_truth`"), "{e}");
    assert!(!wd.path("b.parquet").exists());
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
    let e = wd.fail(
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
    );
    assert!(e.contains("text.parquet"), "{e}");
    assert!(!wd.path("o.parquet").exists());
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
        let want: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
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
