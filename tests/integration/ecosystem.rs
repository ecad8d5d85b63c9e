//! Tables written by rlcr open in polars and DuckDB with the documented types and metadata
//! (`scripts/check_tables.py`). `.ci/run` installs both and sets `RLCR_REQUIRE_PYTHON=1`, which turns
//! a missing module into a failure; elsewhere the test says it was skipped.
use std::path::Path;
use std::process::Command;

use crate::Workdir;

/// Run the checker on tables; panics on a failed check.
pub fn check_tables(files: &[&Path]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check_tables.py");
    let out = match Command::new("python3").arg(&script).args(files).output() {
        Ok(o) => o,
        Err(e) => {
            if std::env::var("RLCR_REQUIRE_PYTHON").is_ok_and(|v| v == "1") {
                panic!("python3 not runnable: {e}");
            }
            eprintln!("skipped: python3 not runnable: {e}");
            return;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(3) {
        if std::env::var("RLCR_REQUIRE_PYTHON").is_ok_and(|v| v == "1") {
            panic!("polars/duckdb missing: {stderr}");
        }
        eprintln!("skipped: {stderr}");
        return;
    }
    assert!(
        out.status.success(),
        "check_tables.py failed:\n{stderr}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn prompts_table_opens_in_polars_and_duckdb() {
    let wd = Workdir::new();
    wd.run(&[
        "prepare",
        "--from",
        "countdown-synth",
        "--count",
        "20",
        "-o",
        "p.parquet",
    ]);
    check_tables(&[&wd.path("p.parquet")]);
}

/// Run `scripts/inspect_table.py --json` on a table; `None` when polars/duckdb are missing and not
/// required.
fn inspect_json(table: &Path) -> Option<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/inspect_table.py");
    let required = std::env::var("RLCR_REQUIRE_PYTHON").is_ok_and(|v| v == "1");
    let out = Command::new("python3")
        .arg(&script)
        .arg(table)
        .arg("--json")
        .output();
    match out {
        Ok(o) if o.status.success() => Some(serde_json::from_slice(&o.stdout).unwrap()),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr).to_string();
            if !required && err.contains("No module named") {
                eprintln!("skipped: {err}");
                return None;
            }
            panic!("inspect.py failed:\n{err}");
        }
        Err(e) if !required => {
            eprintln!("skipped: python3 not runnable: {e}");
            None
        }
        Err(e) => panic!("python3 not runnable: {e}"),
    }
}

/// Every table of one loop iteration (prompts, answers, trajectory, scored, advantage, probe,
/// calibration) opens in polars and DuckDB with the documented types; the README's recipes
/// (`scripts/inspect.sql`, `scripts/inspect_table.py`) slice the same span tokens in both and compute
/// the same Brier, accuracy and mean confidence as `rlcr report` (to 1e-6).
#[test]
fn loop_tables_open_in_polars_and_duckdb_and_recipes_match_report() {
    let wd = Workdir::new();
    let m = crate::fixtures().join("tiny-qwen2").display().to_string();
    let prepare = crate::support::pipeline::easy_countdown_args(4, "prompts.parquet");
    let answers = crate::support::pipeline::answers_args(
        &m,
        "prompts.parquet",
        "answers.parquet",
        2,
        12,
        &["--response-prefix", "<think>"],
    );
    let (prepare, answers): (Vec<&str>, Vec<&str>) = (
        prepare.iter().map(String::as_str).collect(),
        answers.iter().map(String::as_str).collect(),
    );
    let steps: [&[&str]; 6] = [
        &prepare,
        &answers,
        &[
            "generate-confidence",
            "--model",
            &m,
            "--input",
            "answers.parquet",
            "-o",
            "traj.parquet",
            "--num-confidences",
            "2",
            "--max-new-tokens",
            "6",
            "--response-prefix",
            "<confidence>0.",
        ],
        &["score", "--input", "traj.parquet", "-o", "scored.parquet"],
        &[
            "advantage",
            "--input",
            "scored.parquet",
            "-o",
            "adv.parquet",
        ],
        &["report", "--input", "scored.parquet", "-o", "report0"],
    ];
    for s in steps {
        wd.run(s);
    }
    let tables = [
        "prompts.parquet",
        "answers.parquet",
        "traj.parquet",
        "scored.parquet",
        "adv.parquet",
        "report0/calibration.parquet",
    ];
    let paths: Vec<std::path::PathBuf> = tables.iter().map(|t| wd.path(t)).collect();
    let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
    check_tables(&refs);
    // The untrained model neither solves nor states confidences: give the scored rows known,
    // varied values (answers alternate right/wrong; confidences 0.05·k, every fifth unparsed) so
    // the comparison with `report` is not 0 = 0.
    let b = {
        let r = rlcr::table::Reader::open(&wd.path("scored.parquet")).unwrap();
        let batches = r.read_all().unwrap();
        rlcr::table::io::concat(&batches[0].schema(), &batches).unwrap()
    };
    let st = rlcr::table::cols::str_col(&b, "scored", "sample_type").unwrap();
    let (mut acc, mut conf) = (Vec::new(), Vec::new());
    let mut answer = -1i32;
    for i in 0..b.num_rows() {
        if st.value(i) == "answer" {
            answer += 1;
            conf.push(None);
        } else {
            conf.push((i % 5 != 0).then_some(0.05 * (i % 20) as f32));
        }
        acc.push((answer % 2) as f32);
    }
    let b = rlcr::table::cols::set_columns(
        &b,
        &rlcr::table::TRAJECTORY,
        vec![
            (
                "acc_reward",
                std::sync::Arc::new(arrow::array::Float32Array::from(acc)) as _,
            ),
            (
                "confidence",
                std::sync::Arc::new(arrow::array::Float32Array::from(conf)) as _,
            ),
        ],
    )
    .unwrap();
    let meta = rlcr::table::Meta::new(
        &rlcr::table::TRAJECTORY,
        "score",
        serde_json::json!({}),
        &[],
    );
    rlcr::table::write_table(&wd.path("known.parquet"), b.schema(), &[b], &meta).unwrap();
    wd.run(&["report", "--input", "known.parquet", "-o", "report"]);
    let Some(v) = inspect_json(&wd.path("known.parquet")) else {
        return;
    };
    let metrics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(wd.path("report/metrics.json")).unwrap())
            .unwrap();
    let overall = &metrics["reports"][0]["overall"];
    for side in ["polars", "duckdb"] {
        let rows = v[side].as_array().unwrap();
        assert_eq!(rows.len(), 1, "{side}: one data_source: {rows:?}");
        for (ours, theirs) in [
            ("brier", "brier"),
            ("mean_confidence", "mean_confidence"),
            ("accuracy", "accuracy"),
        ] {
            let a = rows[0][ours].as_f64().unwrap();
            let b = overall[theirs].as_f64().unwrap();
            assert!((a - b).abs() < 1e-6, "{side} {ours} {a} vs report {b}");
            assert!(b > 0.05, "{ours} {b}: the known values are not trivial");
        }
        assert_eq!(rows[0]["confidences"], 16, "{side}");
    }
    assert_eq!(v["span_tokens"], v["span_tokens_polars"]);
    assert!(!v["span_tokens"].as_array().unwrap().is_empty());
}
