//! TensorBoard event files, read by TensorBoard's own reader (`scripts/check_tensorboard.py`,
//! `EventAccumulator`): `update`'s scalars equal `train_metrics.jsonl` in the checkpoint's
//! `runs/update` (the whole run, carried over a resume) and in a shared `--tensorboard` folder
//! (one file per call, one curve); `report --tensorboard` writes metrics.json's figures per input,
//! and `report --train-metrics` draws the training curves. `.ci/run` installs tensorboard and sets
//! `RLCR_REQUIRE_PYTHON=1`, which turns a missing package into a failure.
use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::Workdir;

/// Scalars of a run folder as TensorBoard reads them: tag → [(step, value, wall_time)].
pub(crate) type Run = BTreeMap<String, Vec<(i64, f32, f64)>>;

/// Read run folders with TensorBoard; `None` when the package is missing and not required.
pub(crate) fn read_runs(dirs: &[&Path]) -> Option<Vec<Run>> {
    use crate::support::python::{script, Needs, Py};
    let out = Py::script(script("check_tensorboard.py"), Needs::Tables)
        .args(dirs)
        .stdout()?;
    let v: Value = serde_json::from_slice(&out).expect("json");
    let num = |x: &Value| match x {
        Value::String(s) if s == "nan" => f32::NAN,
        x => x.as_f64().expect("number") as f32,
    };
    Some(
        dirs.iter()
            .map(|d| {
                let run = &v[d.to_str().expect("utf-8 path")];
                run.as_object()
                    .expect("run")
                    .iter()
                    .map(|(tag, pts)| {
                        let pts = pts
                            .as_array()
                            .expect("points")
                            .iter()
                            .map(|p| {
                                (
                                    p[0].as_i64().expect("step"),
                                    num(&p[1]),
                                    p[2].as_f64().expect("wall time"),
                                )
                            })
                            .collect();
                        (tag.clone(), pts)
                    })
                    .collect()
            })
            .collect(),
    )
}

/// What a run must hold: for every non-skipped line of `train_metrics.jsonl`, every numeric key
/// (but `step`) at that step with the line's value (as f32), and `tokens_per_second`.
pub(crate) fn expected_from_metrics(lines: &[Value]) -> BTreeMap<String, Vec<(i64, f32)>> {
    let mut want: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    for l in lines {
        if l["skipped"] == Value::Bool(true) {
            continue;
        }
        let step = l["step"].as_i64().expect("step");
        for (k, v) in l.as_object().expect("object") {
            let x = match v {
                Value::Number(n) => n.as_f64().expect("f64") as f32,
                Value::String(s) if s == "nan" => f32::NAN,
                _ => continue,
            };
            if k != "step" {
                want.entry(k.clone()).or_default().push((step, x));
            }
        }
        let tps = l["tokens"].as_f64().expect("tokens") / l["seconds"].as_f64().expect("seconds");
        want.entry("tokens_per_second".into())
            .or_default()
            .push((step, tps as f32));
    }
    want
}

pub(crate) fn assert_run_equals(run: &Run, want: &BTreeMap<String, Vec<(i64, f32)>>, what: &str) {
    assert_eq!(
        run.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: tags"
    );
    for (tag, pts) in want {
        let got: Vec<(i64, f32)> = run[tag].iter().map(|p| (p.0, p.1)).collect();
        let same = got.len() == pts.len()
            && got
                .iter()
                .zip(pts)
                .all(|(a, b)| a.0 == b.0 && (a.1 == b.1 || (a.1.is_nan() && b.1.is_nan())));
        assert!(
            same,
            "{what}: {tag}: TensorBoard {got:?} != metrics {pts:?}"
        );
    }
    // Wall times are real clock times, in step order.
    let times: Vec<f64> = run["loss"].iter().map(|p| p.2).collect();
    assert!(times.iter().all(|&t| t > 1.6e9), "{what}: {times:?}");
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{what}: {times:?}");
}

#[test]
fn tensorboard_reads_what_update_and_report_write() {
    let w = Workdir::new();
    let lines = crate::support::train::update_twice(&w, &["--tensorboard", "tb/update"]);
    assert_eq!(lines.len(), 4);
    let want = expected_from_metrics(&lines);
    assert!(want.contains_key("grad_norm") && want.contains_key("clip_frac_high"));
    // The update diagnostics: the mismatch once per call (steps 1 and 3), lengths every step.
    for tag in [
        "mismatch/logp_max",
        "mismatch/logp_mean",
        "mismatch/ratio_max",
        "mismatch/ratio_mean",
    ] {
        let steps: Vec<i64> = want[tag].iter().map(|p| p.0).collect();
        assert_eq!(steps, vec![1, 3], "{tag}");
    }
    assert_eq!(want["response_length"].len(), 4);
    // The report: two iterations, with the training curves and their TensorBoard scalars.
    crate::report::write_scored(&w.path("s1.parquet"), &crate::report::anchor_rows());
    // The second: every confidence 1.0 (ECE = Brier = 1 − accuracy).
    let sure: Vec<crate::report::Row> = crate::report::anchor_rows()
        .into_iter()
        .map(|mut r| {
            if r.0 == "confidence" {
                r.5 = Some(1.0);
            }
            r
        })
        .collect();
    crate::report::write_scored(&w.path("s2.parquet"), &sure);
    w.run(&[
        "report",
        "--input",
        "s1.parquet",
        "--input",
        "s2.parquet",
        "--train-metrics",
        "it2",
        "--tensorboard",
        "tb/report",
        "--iterations",
        "5,10",
        "--held-in",
        "greedy=s2.parquet",
        "--held-in",
        "greedy=s1.parquet",
        "-o",
        "rep",
    ]);
    assert!(w.path("rep/training.svg").is_file() && w.path("rep/training.png").is_file());
    let page = std::fs::read_to_string(w.path("rep/report.md")).unwrap();
    // The inputs' iterations (not their positions) in the table and metrics.json.
    assert!(page.contains("| iteration | input |"), "{page}");
    assert!(page.contains("\n| 5 | `s1.parquet` |"), "{page}");
    assert!(
        page.contains("| iteration | input | accuracy | held-in greedy |"),
        "{page}"
    );
    assert!(page.contains("## Update diagnostics"), "{page}");
    assert!(page.contains("\n| 10 | `s2.parquet` |"), "{page}");
    assert!(
        page.contains("## Training curves\n\n4 optimizer steps (1–4) from `"),
        "{page}"
    );
    let svg = std::fs::read_to_string(w.path("rep/training.svg")).unwrap();
    for panel in ["Loss", "KL", "Clip fractions", "Entropy", "Gradient norm"] {
        assert!(svg.contains(panel), "{panel} missing from training.svg");
    }
    let dirs = [
        w.path("it2/runs/update"),
        w.path("tb/update"),
        w.path("it1/runs/update"),
        w.path("tb/report"),
    ];
    let refs: Vec<&Path> = dirs.iter().map(|d| d.as_path()).collect();
    let Some(runs) = read_runs(&refs) else {
        return;
    };
    // The last checkpoint: the whole run; the shared folder: the two calls' files, one curve.
    assert_run_equals(&runs[0], &want, "it2/runs/update");
    assert_run_equals(&runs[1], &want, "tb/update");
    // The first call's steps (1 and 2).
    let first: BTreeMap<String, Vec<(i64, f32)>> = want
        .iter()
        .map(|(k, v)| (k.clone(), v.iter().filter(|p| p.0 <= 2).copied().collect()))
        .collect();
    assert_run_equals(&runs[2], &first, "it1/runs/update");
    // The report's scalars: metrics.json's `overall` figures (as f32), at iterations 5 and 10.
    let m: Value = crate::support::json::read(w.path("rep/metrics.json"));
    assert_eq!(m["reports"][0]["iteration"], 5);
    assert_eq!(m["reports"][1]["iteration"], 10);
    let rep = &runs[3];
    let overall: Vec<(i64, &Value)> = (0..2)
        .map(|i| (5 + 5 * i as i64, &m["reports"][i]["overall"]))
        .collect();
    assert_report_scalars(rep, &overall, "tb/report");
    // The held-in set's accuracy beside the batch's: iteration 5's from s2, 10's from s1.
    let held: Vec<(i64, f32)> = rep["held_in/greedy/accuracy"]
        .iter()
        .map(|p| (p.0, p.1))
        .collect();
    let acc = |i: usize| m["reports"][i]["overall"]["accuracy"].as_f64().unwrap() as f32;
    assert_eq!(held, vec![(5, acc(1)), (10, acc(0))]);
    assert_eq!(
        m["reports"][0]["held_in"]["greedy"]["input"],
        serde_json::json!("s2.parquet")
    );
    // Standard errors stay out of the dashboard.
    assert!(
        !rep.keys().any(|k| k.starts_with("se/")),
        "{:?}",
        rep.keys()
    );
}

/// A report's TensorBoard run holds, at each `(step, overall)`, metrics.json's `overall` figures
/// (as f32; a figure without a value, such as the AUROC of one class, has no scalar) and nothing
/// at other steps. Accuracy must be there at every step.
pub(crate) fn assert_report_scalars(run: &Run, overall: &[(i64, &Value)], what: &str) {
    assert!(!overall.is_empty(), "{what}: no report");
    for (tag, path) in [
        ("accuracy", "/accuracy"),
        ("ece", "/ece"),
        ("brier", "/brier"),
        ("auroc", "/auroc"),
        ("mean_confidence", "/mean_confidence"),
        ("answer_turn/reward_mean", "/answer_turn/reward_mean"),
        ("answer_turn/length_mean", "/answer_turn/length_mean"),
        (
            "confidence_turn/length_mean",
            "/confidence_turn/length_mean",
        ),
    ] {
        let got: Vec<(i64, f32)> = run
            .get(tag)
            .map(|pts| pts.iter().map(|p| (p.0, p.1)).collect())
            .unwrap_or_default();
        let want: Vec<(i64, f32)> = overall
            .iter()
            .filter_map(|(step, o)| {
                o.pointer(path)
                    .and_then(Value::as_f64)
                    .map(|x| (*step, x as f32))
            })
            .collect();
        if tag == "accuracy" {
            assert_eq!(want.len(), overall.len(), "{what}: accuracy missing");
        }
        assert_eq!(got, want, "{what}: {tag} (run has {:?})", run.keys());
    }
}
