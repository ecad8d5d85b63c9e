//! `rlcr update` and `rlcr sft` end to end on the tiny Qwen2 fixture: the real binary, real
//! tables, real checkpoint folders.
use std::path::{Path, PathBuf};

use burn::tensor::Device;
use rlcr::model::Model;
use rlcr::table::{write_table, Meta, TRAJECTORY};
use rlcr::train::data::{rows_to_batch, TrainRow};
use rlcr::train::policy::host_logprobs;

use super::support::python::{script, Needs, Py};
use super::support::table::column_f32;
use super::support::train::{metrics, tensors, train_rows, update_twice, write_rows};
use super::{fixtures, Workdir};

fn tiny() -> PathBuf {
    fixtures().join("tiny-qwen2")
}

fn mean_logp(dir: &Path, rows: &[TrainRow], positive: bool) -> f64 {
    let m = Model::load(dir, &Device::flex()).unwrap();
    let pairs: Vec<(&[u32], &[u32])> = rows
        .iter()
        .filter(|r| (r.adv[0] > 0.0) == positive)
        .map(|r| (r.context.as_slice(), r.response.as_slice()))
        .collect();
    let lp = host_logprobs(&m.transformer, &pairs, 8, 1.0, None).unwrap();
    lp.iter()
        .map(|l| l.iter().map(|&x| x as f64).sum::<f64>() / l.len() as f64)
        .sum::<f64>()
        / lp.len() as f64
}

#[test]
fn update_with_lr_zero_writes_the_same_weights() {
    let w = Workdir::new();
    let t = w.path("train.parquet");
    write_rows(&t, &train_rows());
    let model = tiny();
    w.run(&[
        "update",
        "--model",
        model.to_str().unwrap(),
        "--input",
        "train.parquet",
        "-o",
        "new",
        "--lr",
        "0",
        "--micro-batch",
        "2",
        "--mini-batches",
        "2",
    ]);
    let a = tensors(&model);
    let b = tensors(&w.path("new"));
    assert_eq!(a.len(), b.len());
    for (k, ta) in &a {
        assert!(b[k] == *ta, "{k} differs");
    }
    let m = metrics(&w.path("new"));
    assert_eq!(m.len(), 2);
    assert_eq!(m[1]["step"], 2);
    assert!(m[0]["grad_norm"].as_f64().unwrap() > 0.0);
    assert!(w.path("new/rlcr-train/optimizer.safetensors").is_file());
    assert!(w.path("new/rlcr-train/trainer_state.json").is_file());
    assert!(w.path("new/tokenizer.json").is_file());
}

#[test]
fn update_learns_and_resumes() {
    let w = Workdir::new();
    let rows = train_rows();
    let model = tiny();
    let m = update_twice(&w, &[]);
    let steps: Vec<u64> = m.iter().map(|x| x["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![1, 2, 3, 4]);
    let state: serde_json::Value =
        crate::support::json::read(w.path("it2/rlcr-train/trainer_state.json"));
    assert_eq!(state["global_step"], 4);
    assert_eq!(state["stage"], "update");
    assert_eq!(state["config"]["train"]["micro_batch"], 4);
    // Positive-advantage responses gained probability, negative ones lost it.
    let (p0, n0) = (
        mean_logp(&model, &rows, true),
        mean_logp(&model, &rows, false),
    );
    let (p1, n1) = (
        mean_logp(&w.path("it2"), &rows, true),
        mean_logp(&w.path("it2"), &rows, false),
    );
    assert!(p1 > p0, "positive {p0} -> {p1}");
    assert!(n1 < n0, "negative {n0} -> {n1}");
    // The second epoch of the first call trains off-policy: the ratio moved.
    assert!(m[1]["approx_kl"].as_f64().unwrap().abs() > 0.0);
    assert_eq!(m[0]["confidence_rows"], 2);
}

/// `--precision bf16`: the step learns as f32's does (positive-advantage responses gain, negative
/// ones lose), the weights differ from the f32 run's by a small fraction of the step, and the
/// choice is recorded in the trainer state (so a resumed run sees it).
#[test]
fn update_in_bf16_learns_and_records_its_precision() {
    let w = Workdir::new();
    let rows = train_rows();
    write_rows(&w.path("train.parquet"), &rows);
    let model = tiny();
    for (out, precision) in [("f32", "f32"), ("bf16", "bf16")] {
        w.run(&[
            "update",
            "--model",
            model.to_str().unwrap(),
            "--input",
            "train.parquet",
            "-o",
            out,
            "--lr",
            "3e-3",
            "--micro-batch",
            "4",
            "--epochs",
            "2",
            "--precision",
            precision,
        ]);
        let state: serde_json::Value =
            crate::support::json::read(w.path(&format!("{out}/rlcr-train/trainer_state.json")));
        assert_eq!(state["config"]["train"]["precision"], precision);
    }
    let (p0, n0) = (
        mean_logp(&model, &rows, true),
        mean_logp(&model, &rows, false),
    );
    let (p1, n1) = (
        mean_logp(&w.path("bf16"), &rows, true),
        mean_logp(&w.path("bf16"), &rows, false),
    );
    assert!(p1 > p0, "positive {p0} -> {p1}");
    assert!(n1 < n0, "negative {n0} -> {n1}");
    // Same direction as f32, a different and nearby point: |bf16 − f32| is a small fraction of
    // the f32 step |f32 − start| (and not zero).
    let (a, b, s) = (
        tensors(&w.path("f32")),
        tensors(&w.path("bf16")),
        tensors(&model),
    );
    let (mut moved, mut apart) = (0f64, 0f64);
    let f32s = |t: &(String, Vec<usize>, Vec<u8>)| -> Vec<f32> {
        assert_eq!(t.0, "F32");
        t.2.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    for (k, ta) in &a {
        let (ta, tb, ts) = (f32s(ta), f32s(&b[k]), f32s(&s[k]));
        for ((x, y), z) in ta.iter().zip(&tb).zip(&ts) {
            moved += ((x - z) as f64).powi(2);
            apart += ((x - y) as f64).powi(2);
        }
    }
    let ratio = (apart / moved).sqrt();
    eprintln!("bf16 vs f32 after 2 steps: {ratio:.3e} of the f32 step");
    assert!(ratio > 0.0 && ratio < 0.2, "{ratio}");
}

/// `update --precision bf16` on a bf16 checkpoint trains f32 master weights and writes bf16 (every
/// tensor, the input's names), the weights moved; `logprobs --precision bf16` on the written folder
/// (held in bf16) gives the bits of the library's autocast forward on the same folder loaded for
/// training (f32 master weights), and differs from f32 products (the mode is on).
#[test]
fn update_in_bf16_on_a_bf16_checkpoint_writes_bf16() {
    use rlcr::model::sgemm::{autocast, Precision};
    let w = Workdir::new();
    let rows = train_rows();
    write_rows(&w.path("train.parquet"), &rows);
    let model = fixtures().join("tiny-qwen2-bf16");
    w.run(&[
        "update",
        "--model",
        model.to_str().unwrap(),
        "--input",
        "train.parquet",
        "-o",
        "out",
        "--lr",
        "3e-3",
        "--precision",
        "bf16",
    ]);
    let (before, after) = (tensors(&model), tensors(&w.path("out")));
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    assert!(after.values().all(|t| t.0 == "BF16"), "written dtypes");
    let moved = after
        .iter()
        .filter(|(k, t)| t.2 != before[k.as_str()].2)
        .count();
    assert!(moved > 0, "no tensor moved");
    for (precision, col) in [("bf16", "lp16"), ("f32", "lp32")] {
        w.run(&[
            "logprobs",
            "--model",
            "out",
            "--input",
            "train.parquet",
            "-o",
            &format!("{col}.parquet"),
            "--column",
            col,
            "--precision",
            precision,
        ]);
    }
    // RLCR_WEIGHTS_BF16=0: the weights widened to f32 at load, the same numbers.
    let mut c = w.cmd(&[
        "logprobs",
        "--model",
        "out",
        "--input",
        "train.parquet",
        "-o",
        "wide.parquet",
        "--column",
        "lp32",
    ]);
    let o = c.env("RLCR_WEIGHTS_BF16", "0").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lp16 = column_f32(&w.path("lp16.parquet"), "lp16");
    let lp32 = column_f32(&w.path("lp32.parquet"), "lp32");
    assert_eq!(lp32, column_f32(&w.path("wide.parquet"), "lp32"));
    // Sampling from the bf16-held checkpoint: the tokens and log-probs of the widened one.
    let questions = ["What is 12 + 7?", "Name a prime."];
    let p = crate::sample::prompts(&w, &questions);
    let mut sampled = Vec::new();
    for (out, widen) in [("s16.parquet", "1"), ("s32.parquet", "0")] {
        let mut c = w.cmd(&[
            "--seed",
            "3",
            "generate-answers",
            "--model",
            "out",
            "--input",
            p.to_str().unwrap(),
            "-o",
            out,
            "--num-answers",
            "2",
            "--max-new-tokens",
            "24",
        ]);
        let o = c.env("RLCR_WEIGHTS_BF16", widen).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let b = crate::support::table::read(&w.path(out));
        sampled.push((
            crate::support::table::id_lists(&b, "response_ids"),
            crate::support::table::lists_f32(&b, "response_logprobs"),
        ));
    }
    assert!(sampled[0].0.iter().map(Vec::len).sum::<usize>() > 0);
    assert_eq!(sampled[0], sampled[1], "sampling: bf16-held vs widened");
    let m = Model::load(&w.path("out"), &Device::flex().autodiff()).unwrap();
    let pairs: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|r| (r.context.as_slice(), r.response.as_slice()))
        .collect();
    let want = {
        let _bf16 = autocast(Precision::Bf16);
        rlcr::model::logprobs(&m.transformer, &pairs, 8, false, None)
            .unwrap()
            .logprobs
    };
    let bits = |v: &[Vec<f32>]| -> Vec<u32> { v.iter().flatten().map(|x| x.to_bits()).collect() };
    assert_eq!(bits(&lp16), bits(&want));
    let apart = lp16
        .iter()
        .flatten()
        .zip(lp32.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(apart > 1e-4, "bf16 logprobs equal f32's ({apart})");

    // A LoRA adapter trained beside the bf16 base (held in bf16, frozen): an adapter folder whose
    // log-probs (base + adapter, merged at load) moved from the base's.
    w.run(&[
        "update",
        "--model",
        model.to_str().unwrap(),
        "--input",
        "train.parquet",
        "-o",
        "lora",
        "--lr",
        "1e-2",
        "--lora-rank",
        "4",
        "--precision",
        "bf16",
    ]);
    assert!(w.path("lora/adapter_model.safetensors").exists());
    let (base_lp, lora_lp) = (
        mean_logp(&model, &rows, true),
        mean_logp(&w.path("lora"), &rows, true),
    );
    assert!(lora_lp > base_lp, "positive rows {base_lp} -> {lora_lp}");
}

#[test]
fn update_kl_needs_reference_log_probs() {
    let w = Workdir::new();
    write_rows(&w.path("train.parquet"), &train_rows());
    let model = tiny();
    let args = [
        "update",
        "--model",
        model.to_str().unwrap(),
        "--input",
        "train.parquet",
        "-o",
        "new",
        "--kl-coef",
        "0.1",
    ];
    w.refuse(&args, 1, "--ref-model", "new");
    let mut with_ref = args.to_vec();
    with_ref.extend(["--ref-model", model.to_str().unwrap()]);
    w.run(&with_ref);
    // The policy starts equal to the reference: the first step's KL is 0.
    let m = metrics(&w.path("new"));
    assert!(m[0]["kl_loss"].as_f64().unwrap().abs() < 1e-6, "{}", m[0]);
}

#[test]
fn update_rejects_bad_flags_as_usage_errors() {
    let w = Workdir::new();
    write_rows(&w.path("train.parquet"), &train_rows());
    let model = tiny();
    for bad in [
        ["--clip-dual", "1"],
        ["--micro-batch", "0"],
        ["--schedule", "cosine"],
        ["--precision", "fp16"],
    ] {
        let mut a = vec![
            "update",
            "--model",
            model.to_str().unwrap(),
            "--input",
            "train.parquet",
            "-o",
            "new",
        ];
        a.extend(bad);
        let err = w.fail(&a, 2);
        assert!(!err.is_empty());
        assert!(!w.path("new").exists());
    }
}

/// `--conf-entropy-coef`: with every advantage 0 the bonus is the whole loss, so the answer rows
/// contribute nothing and the confidence rows' entropy rises step by step. The first step's
/// `confidence_entropy` metric (the model before any step) equals the mean, over the confidence
/// rows' learnable tokens, of the entropies `rlcr logprobs --entropy-column` computes on the
/// inference path. Without the flag the same table gives a zero gradient. Bad values are usage
/// errors; a table without confidence rows is refused, naming the file.
#[test]
fn update_conf_entropy_bonus_raises_the_confidence_entropy() {
    let w = Workdir::new();
    let mut rows = train_rows();
    for r in &mut rows {
        r.adv = vec![0.0; r.response.len()];
    }
    write_rows(&w.path("train.parquet"), &rows);
    let model = tiny();
    let m = model.to_str().unwrap();
    let upd = |out: &str, extra: &[&str]| {
        let mut a = vec![
            "update",
            "--model",
            m,
            "--input",
            "train.parquet",
            "-o",
            out,
            "--lr",
            "1e-2",
            "--epochs",
            "4",
            "--micro-batch",
            "4",
        ];
        a.extend(extra);
        w.run(&a);
        metrics(&w.path(out))
    };
    let on = upd("on", &["--conf-entropy-coef", "1.0"]);
    let ce: Vec<f64> = on
        .iter()
        .map(|x| x["confidence_entropy"].as_f64().unwrap())
        .collect();
    assert!(
        ce.windows(2).all(|p| p[1] > p[0]),
        "confidence entropy did not rise step by step: {ce:?}"
    );
    // Independent figure: the inference path's entropies of the input model.
    w.run(&[
        "logprobs",
        "--model",
        m,
        "--input",
        "train.parquet",
        "-o",
        "ent.parquet",
        "--entropy-column",
        "entropy",
    ]);
    let ent = column_f32(&w.path("ent.parquet"), "entropy");
    let (mut sum, mut n) = (0f64, 0usize);
    for (r, e) in rows.iter().zip(&ent) {
        if r.is_confidence {
            for (t, &keep) in r.mask.iter().enumerate() {
                if keep {
                    sum += e[t] as f64;
                    n += 1;
                }
            }
        }
    }
    assert!(n > 0);
    let want = sum / n as f64;
    assert!(
        (ce[0] - want).abs() < 1e-4,
        "first step's confidence_entropy {} vs logprobs' {want}",
        ce[0]
    );
    // Without the bonus every row is inert (advantages 0, no KL or entropy term): all but one skip
    // the passes (the one left keeps the optimizer's zero-gradient step), so the metric covers
    // that row alone.
    let off = upd("off", &[]);
    assert_eq!(off[0]["grad_norm"].as_f64().unwrap(), 0.0, "{}", off[0]);
    let learnable = rows.iter().filter(|r| r.mask.iter().any(|&m| m)).count();
    assert_eq!(
        off[0]["inert_rows"].as_u64().unwrap() as usize,
        learnable - 1,
        "{}",
        off[0]
    );
    // With it, the answer rows alone are inert (the bonus reaches confidence rows only).
    let answers = rows
        .iter()
        .filter(|r| !r.is_confidence && r.mask.iter().any(|&m| m))
        .count();
    assert!(answers > 0);
    assert_eq!(
        on[0]["inert_rows"].as_u64().unwrap() as usize,
        answers,
        "{}",
        on[0]
    );
    for bad in ["-0.1", "nan", "inf"] {
        let err = w.fail(
            &[
                "update",
                "--model",
                m,
                "--input",
                "train.parquet",
                "-o",
                "bad",
                "--conf-entropy-coef",
                bad,
            ],
            2,
        );
        assert!(err.contains("--conf-entropy-coef"), "{bad}: {err}");
        assert!(!w.path("bad").exists());
    }
    let answers: Vec<TrainRow> = rows.into_iter().filter(|r| !r.is_confidence).collect();
    write_rows(&w.path("answers.parquet"), &answers);
    let err = w.fail(
        &[
            "update",
            "--model",
            m,
            "--input",
            "answers.parquet",
            "-o",
            "bad",
            "--conf-entropy-coef",
            "0.1",
        ],
        1,
    );
    assert!(
        err.contains("answers.parquet")
            && err.contains("--conf-entropy-coef")
            && err.contains("has none"),
        "{err}"
    );
    assert!(!w.path("bad").exists());
}

/// `--conf-value-entropy-coef`: confidence rows that end in `0.7` (the tiny tokenizer's digits),
/// every advantage 0, so the bonus is the whole loss. The first step's
/// `confidence_value_entropy` equals the entropy over the ten digits computed independently: the
/// inference path's log-prob of each digit at the value position (the row with its `7` replaced
/// by that digit), renormalised on the host. The bonus raises it step by step. A table whose
/// confidence rows write no value (`train_rows`' arbitrary ids) is refused.
#[test]
fn update_conf_value_entropy_bonus_spreads_the_value_digit() {
    let w = Workdir::new();
    let model = tiny();
    let m = model.to_str().unwrap();
    let tok = Model::load(&model, &Device::flex()).unwrap().tokenizer;
    let seven = tok.encode("0.7", false).unwrap();
    assert_eq!(seven.len(), 3, "{seven:?}");
    let mut rows = train_rows();
    for r in rows.iter_mut() {
        if r.is_confidence {
            r.response.truncate(2);
            r.response.extend(&seven);
            r.mask = vec![true; r.response.len()];
        }
        r.adv = vec![0.0; r.response.len()];
        r.old_logp = vec![0.0; r.response.len()];
    }
    let lp_of = |rows: &[TrainRow]| {
        let pairs: Vec<(&[u32], &[u32])> = rows
            .iter()
            .map(|r| (r.context.as_slice(), r.response.as_slice()))
            .collect();
        let m = Model::load(&model, &Device::flex()).unwrap();
        host_logprobs(&m.transformer, &pairs, 8, 1.0, None).unwrap()
    };
    let old = lp_of(&rows);
    for (r, lp) in rows.iter_mut().zip(old) {
        r.old_logp = lp;
    }
    write_rows(&w.path("train.parquet"), &rows);
    // Independent figure: ln p(d) at the value position for each digit d.
    let digits: Vec<u32> = (0..10)
        .map(|d| {
            let ids = tok.encode(&d.to_string(), false).unwrap();
            assert_eq!(ids.len(), 1);
            ids[0]
        })
        .collect();
    let conf: Vec<&TrainRow> = rows.iter().filter(|r| r.is_confidence).collect();
    let mut want = 0f64;
    for r in &conf {
        let pos = r.response.len() - 1;
        let variants: Vec<TrainRow> = digits
            .iter()
            .map(|&d| {
                let mut v = (*r).clone();
                v.response[pos] = d;
                v
            })
            .collect();
        let lps: Vec<f64> = lp_of(&variants).iter().map(|l| l[pos] as f64).collect();
        let z: f64 = lps.iter().map(|l| l.exp()).sum();
        want += -lps
            .iter()
            .map(|l| {
                let q = l.exp() / z;
                q * q.ln()
            })
            .sum::<f64>();
    }
    want /= conf.len() as f64;
    let mut a = vec![
        "update",
        "--model",
        m,
        "--input",
        "train.parquet",
        "-o",
        "on",
        "--lr",
        "1e-3",
        "--epochs",
        "4",
        "--micro-batch",
        "4",
        "--conf-value-entropy-coef",
        "1.0",
    ];
    w.run(&a);
    let on = metrics(&w.path("on"));
    let hv: Vec<f64> = on
        .iter()
        .map(|x| x["confidence_value_entropy"].as_f64().unwrap())
        .collect();
    assert!(
        (hv[0] - want).abs() < 1e-4,
        "first step's confidence_value_entropy {} vs {want} from the digits' log-probs",
        hv[0]
    );
    assert!(
        hv.windows(2).all(|p| p[1] > p[0]) && hv[3] < 10f64.ln(),
        "value entropy did not rise step by step (below ln 10): {hv:?}"
    );
    // Arbitrary ids: no confidence row writes a value.
    write_rows(&w.path("novalue.parquet"), &train_rows());
    a[4] = "novalue.parquet";
    a[6] = "bad";
    let err = w.fail(&a, 1);
    assert!(
        err.contains("novalue.parquet") && err.contains("no confidence row writes a value"),
        "{err}"
    );
    assert!(!w.path("bad").exists());
    for bad in ["-1", "nan"] {
        a[14] = bad;
        let err = w.fail(&a, 2);
        assert!(err.contains("--conf-value-entropy-coef"), "{bad}: {err}");
    }
}

fn write_messages(path: &Path, convs: &[Vec<(&str, &str)>]) {
    use arrow::array::{RecordBatch, StringArray};
    use std::sync::Arc;
    let msgs: Vec<String> = convs
        .iter()
        .map(|c| {
            let v: Vec<serde_json::Value> = c
                .iter()
                .map(|(r, t)| serde_json::json!({"role": r, "content": t}))
                .collect();
            serde_json::Value::from(v).to_string()
        })
        .collect();
    let b = RecordBatch::try_from_iter([(
        "messages",
        Arc::new(StringArray::from(msgs)) as arrow::array::ArrayRef,
    )])
    .unwrap();
    let meta = Meta::new(&TRAJECTORY, "prepare", serde_json::json!({}), &[]);
    write_table(path, b.schema(), &[b], &meta).unwrap();
}

#[test]
fn sft_on_messages_lowers_the_loss() {
    let w = Workdir::new();
    let convs = vec![
        vec![
            ("user", "What is 2+3?"),
            ("assistant", "<think>2+3=5</think><answer>5</answer>"),
        ],
        vec![
            ("system", "Be brief."),
            ("user", "Capital of France?"),
            ("assistant", "<answer>Paris</answer>"),
        ],
        vec![
            ("user", "How sure are you?"),
            ("assistant", "<confidence>0.9</confidence>"),
        ],
    ];
    write_messages(&w.path("sft.parquet"), &convs);
    let model = tiny();
    w.run(&[
        "sft",
        "--model",
        model.to_str().unwrap(),
        "--input",
        "sft.parquet",
        "-o",
        "sft",
        "--lr",
        "1e-2",
        "--epochs",
        "6",
        "--batch-size",
        "3",
    ]);
    let m = metrics(&w.path("sft"));
    assert_eq!(m.len(), 6);
    let first = m[0]["loss"].as_f64().unwrap();
    let last = m[5]["loss"].as_f64().unwrap();
    // Untrained tiny model: the NLL starts near ln(384) ≈ 5.95 per token.
    assert!(first > 5.0 && first < 7.0, "first loss {first}");
    assert!(last < first - 1.0, "loss {first} -> {last}");
    assert_eq!(m[0]["stage"], "sft");
    // The folder is a loadable model.
    Model::load(&w.path("sft"), &Device::flex()).unwrap();
    // A conversation that does not end with the assistant: an error naming the row.
    write_messages(
        &w.path("bad.parquet"),
        &[convs[0].clone(), vec![("user", "hi")]],
    );
    let err = w.fail(
        &[
            "sft",
            "--model",
            model.to_str().unwrap(),
            "--input",
            "bad.parquet",
            "-o",
            "x",
        ],
        1,
    );
    assert!(err.contains("row 1") && err.contains("assistant"), "{err}");
}

#[test]
fn sft_only_correct_keeps_correct_answers() {
    use arrow::array::{ArrayRef, Float32Array, RecordBatch};
    use std::sync::Arc;
    let w = Workdir::new();
    let rows = train_rows();
    let b = rows_to_batch(&rows).unwrap();
    let acc: ArrayRef = Arc::new(Float32Array::from(vec![1.0, 0.0, 1.0, 1.0, 0.0, 1.0]));
    let schema = b.schema();
    let mut cols: Vec<(&str, ArrayRef)> = schema
        .fields()
        .iter()
        .zip(b.columns())
        .map(|(f, c)| (f.name().as_str(), c.clone()))
        .collect();
    cols.push(("acc_reward", acc));
    let b = RecordBatch::try_from_iter(cols).unwrap();
    let meta = Meta::new(&TRAJECTORY, "score", serde_json::json!({}), &[]);
    write_table(&w.path("scored.parquet"), b.schema(), &[b], &meta).unwrap();
    let model = tiny();
    w.run(&[
        "sft",
        "--model",
        model.to_str().unwrap(),
        "--input",
        "scored.parquet",
        "-o",
        "sft",
        "--only-correct",
        "--batch-size",
        "100",
    ]);
    // Rows 0, 2, 3 are correct answers; rows 4, 5 are confidence rows (dropped without
    // --min-conf-reward).
    let m = metrics(&w.path("sft"));
    assert_eq!(m.len(), 1);
    assert_eq!(m[0]["rows"], 3);
    let tokens: usize = [0usize, 2, 3].iter().map(|&i| rows[i].response.len()).sum();
    assert_eq!(m[0]["tokens"], tokens);
}

/// Run `scripts/hf_logprobs.py` with `RLCR_PYTHON` (default `python3`). `None` when torch or
/// transformers is not importable and `RLCR_REQUIRE_TORCH` is not `1` (`.ci/run` sets it after
/// installing them), so the test says "skipped" only where the tools are absent.
fn hf(args: &[&Path]) -> Option<serde_json::Value> {
    Py::script(script("hf_logprobs.py"), Needs::Torch)
        .args(args)
        .json()
}

/// "The written folder loads in Hugging Face transformers": folders written by `update`
/// (from the f32 Qwen2 and Llama fixtures, and from a bf16 copy made by transformers itself) and by
/// `sft` load with `AutoModelForCausalLM.from_pretrained` with no missing, unexpected or
/// mismatched tensors, keep their dtype, and transformers' log-probs of the trained model equal
/// `rlcr logprobs` on the same folder within 1e-4 (the parity tolerance of the model tests; the
/// observed gap is ~1e-6 in f32). The weights really moved: log-probs differ from the input
/// model's by more than 1e-3.
#[test]
fn hf_transformers_loads_what_update_and_sft_write() {
    let w = Workdir::new();
    write_rows(&w.path("train.parquet"), &train_rows());
    let Some(_) = hf(&[
        Path::new("--to-bf16"),
        &fixtures().join("tiny-llama"),
        &w.path("llama-bf16"),
    ]) else {
        return;
    };
    write_messages(
        &w.path("sft.parquet"),
        &[vec![
            ("user", "What is 2+3?"),
            (
                "assistant",
                "<answer>5</answer><confidence>0.9</confidence>",
            ),
        ]],
    );
    let qwen = fixtures().join("tiny-qwen2");
    let llama = fixtures().join("tiny-llama");
    let bf16 = w.path("llama-bf16");
    let cases: [(&str, &Path, &str, &str); 4] = [
        ("update", &qwen, "qwen-new", "float32"),
        ("update", &llama, "llama-new", "float32"),
        ("update", &bf16, "bf16-new", "bfloat16"),
        ("sft", &qwen, "qwen-sft", "float32"),
    ];
    let mut models: Vec<PathBuf> = Vec::new();
    for (stage, model, out, _) in cases {
        let input = if stage == "sft" {
            "sft.parquet"
        } else {
            "train.parquet"
        };
        w.run(&[
            stage,
            "--model",
            model.to_str().unwrap(),
            "--input",
            input,
            "-o",
            out,
            "--lr",
            "1e-2",
        ]);
        w.run(&[
            "logprobs",
            "--model",
            out,
            "--input",
            "train.parquet",
            "-o",
            &format!("{out}.lp.parquet"),
        ]);
        models.push(w.path(out));
        models.push(model.to_path_buf());
    }
    // One Python process for all eight folders (importing torch dominates its time).
    let table = w.path("train.parquet");
    let mut args: Vec<&Path> = vec![&table];
    args.extend(models.iter().map(|p| p.as_path()));
    let hf_out = hf(&args).unwrap();
    let lists = |v: &serde_json::Value| -> Vec<Vec<f64>> {
        serde_json::from_value(v["logprobs"].clone()).unwrap()
    };
    for (i, (stage, _, out, dtype)) in cases.iter().enumerate() {
        let ours = column_f32(&w.path(&format!("{out}.lp.parquet")), "logprobs");
        let (after, before) = (&hf_out[2 * i], &hf_out[2 * i + 1]);
        assert_eq!(
            after["dtype"], *dtype,
            "{out}: dtype of the written tensors"
        );
        let (theirs, before) = (lists(after), lists(before));
        assert_eq!(ours.len(), theirs.len());
        let (mut gap, mut moved) = (0f64, 0f64);
        for ((o, t), b) in ours.iter().zip(&theirs).zip(&before) {
            assert_eq!(o.len(), t.len());
            for ((&o, &t), &b) in o.iter().zip(t).zip(b) {
                gap = gap.max((o as f64 - t).abs());
                moved = moved.max((t - b).abs());
            }
        }
        eprintln!("{stage} {out}: |rlcr - transformers| <= {gap:.2e}, moved {moved:.2e}");
        assert!(gap <= 1e-4, "{out}: rlcr and transformers differ by {gap}");
        assert!(moved > 1e-3, "{out}: the weights did not move ({moved})");
    }
}

/// `RLCR_GPU_F32=split` (f32 products as four products of bf16-split operands, for GPUs whose
/// f32 matmul is TF32) through burn's products on the CPU (`RLCR_GEMM=burn RLCR_ATTENTION=burn`,
/// where the split applies as on a GPU): the log-probs are within 1e-5 of the plain products'
/// and not bit-identical to them (the split ran: its sums round differently), and an update step
/// through it (the casts' backward) gives the plain step's loss, gradient norm and entropy. The
/// GPU run of scripts/gpu_check.sh measures it against float64 on CUDA.
#[test]
fn split_f32_products_match_plain_products() {
    let wd = Workdir::new();
    write_rows(&wd.path("train.parquet"), &train_rows());
    let m = tiny();
    let m = m.to_str().unwrap();
    for split in ["fast", "split"] {
        let lp = format!("{split}.parquet");
        let stages: [&[&str]; 2] = [
            &[
                "-q",
                "logprobs",
                "--model",
                m,
                "--input",
                "train.parquet",
                "-o",
                &lp,
                "--column",
                "lp",
            ],
            &[
                "-q",
                "update",
                "--model",
                m,
                "--input",
                "train.parquet",
                "-o",
                split,
                "--lr",
                "1e-3",
                "--micro-batch",
                "4",
                "--mini-batches",
                "1",
            ],
        ];
        for args in stages {
            let o = wd
                .cmd(args)
                .env("RLCR_GEMM", "burn")
                .env("RLCR_ATTENTION", "burn")
                .env("RLCR_GPU_F32", split)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", super::describe(args, &o));
        }
    }
    let lp = |f: &str| {
        crate::support::table::lists_f32(&crate::support::table::read(&wd.path(f)), "lp").concat()
    };
    let (plain, split) = (lp("fast.parquet"), lp("split.parquet"));
    assert_eq!(plain.len(), split.len());
    let worst = plain
        .iter()
        .zip(&split)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!("split products: max |Δ logprob| to the plain products {worst:.2e}");
    assert!(worst < 1e-5, "split vs plain: {worst}");
    assert!(
        worst > 0.0,
        "the split products gave the plain bits: did they run?"
    );
    let (a, b) = (metrics(&wd.path("fast")), metrics(&wd.path("split")));
    for key in ["loss", "grad_norm", "entropy"] {
        let (x, y) = (a[0][key].as_f64().unwrap(), b[0][key].as_f64().unwrap());
        let rel = (x - y).abs() / x.abs().max(1e-12);
        eprintln!("update, split products: {key} {x} vs {y} (relative Δ {rel:.1e})");
        assert!(rel < 1e-5, "{key}: plain {x} vs split {y}");
    }
}

/// The rollout/trainer mismatch through the binary. The table's behaviour log-probs are the
/// tiny model's own (batched no-graph path): on the first step, before any optimizer step, the
/// gap to the trainer's log-probs is at rounding level (≤ 1e-4) and is in the metrics line, the
/// TensorBoard keys and the summary line; later steps do not carry it. `--ref-model` (the model
/// itself) with `--kl-coef 0` reports the KL to it: k3 of equal log-probs, 0. The same table with
/// every behaviour log-prob shifted by −0.5 reports a gap of 0.5 (ratio |e^0.5 − 1| = 0.6487), and
/// `--max-mismatch 1e-3` refuses it: exit 1, the mismatch named, no output folder.
#[test]
fn update_reports_the_rollout_trainer_mismatch_and_refuses_a_shifted_table() {
    let w = Workdir::new();
    let rows = train_rows();
    write_rows(&w.path("t.parquet"), &rows);
    let mut shifted = rows.clone();
    for r in &mut shifted {
        r.old_logp.iter_mut().for_each(|x| *x -= 0.5);
    }
    write_rows(&w.path("s.parquet"), &shifted);
    let model = crate::fixtures().join("tiny-qwen2");
    let m = model.to_str().unwrap();
    let base = ["--micro-batch", "2", "--mini-batches", "2", "--lr", "1e-3"];
    let mut args = vec!["update", "--model", m, "--input", "t.parquet", "-o", "a"];
    args.extend(["--ref-model", m, "--max-mismatch", "1e-4"]);
    args.extend(base);
    let o = w.output(&args);
    assert!(o.status.success(), "{}", crate::describe(&args, &o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("logp mismatch max"), "{err}");
    assert!(err.contains("KL to reference"), "{err}");
    let lines = metrics(&w.path("a"));
    assert_eq!(lines.len(), 2);
    let f = |l: &serde_json::Value, k: &str| l[k].as_f64().unwrap_or_else(|| panic!("{k}: {l}"));
    let (lmax, rmax) = (
        f(&lines[0], "mismatch/logp_max"),
        f(&lines[0], "mismatch/ratio_max"),
    );
    eprintln!("CPU rollout/trainer mismatch: logp max {lmax:e}, ratio max {rmax:e}");
    assert!(lmax <= 1e-4 && rmax <= 1e-4, "{}", lines[0]);
    assert!(f(&lines[0], "mismatch/logp_mean") <= lmax);
    assert!(f(&lines[0], "ref_kl").abs() < 1e-9, "{}", lines[0]);
    assert!(lines[1].get("mismatch/logp_max").is_none() && lines[1].get("ref_kl").is_none());
    // Answer rows 0..3 and confidence rows 4, 5: the response lengths of each update batch.
    assert!(f(&lines[0], "response_length") > 0.0);
    // The shifted table: reported ...
    let mut args = vec!["update", "--model", m, "--input", "s.parquet", "-o", "b"];
    args.extend(base);
    w.run(&args);
    let l = &metrics(&w.path("b"))[0];
    assert!((f(l, "mismatch/logp_max") - 0.5).abs() < 1e-4, "{l}");
    assert!((f(l, "mismatch/logp_mean") - 0.5).abs() < 1e-4, "{l}");
    assert!(
        (f(l, "mismatch/ratio_max") - 0.648_721_270_7).abs() < 1e-3,
        "{l}"
    );
    // ... and refused.
    let mut args = vec!["update", "--model", m, "--input", "s.parquet", "-o", "c"];
    args.extend(["--max-mismatch", "1e-3"]);
    args.extend(base);
    let err = w.fail(&args, 1);
    assert!(
        err.contains("rollout/trainer mismatch") && err.contains("--max-mismatch"),
        "{err}"
    );
    assert!(
        !w.path("c").exists(),
        "a refused update wrote {:?}",
        w.listing()
    );
    // A negative limit is a usage error.
    let mut args = vec!["update", "--model", m, "--input", "t.parquet", "-o", "d"];
    args.push("--max-mismatch=-1");
    let err = w.fail(&args, 2);
    assert!(err.contains("--max-mismatch"), "{err}");
}
