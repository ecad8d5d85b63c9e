//! `rlcr probe` on the tiny Qwen2 fixture through the real binary: row count (one per answer with
//! a closed `</think>` and cut), consistent counts, cut positions, determinism across batch sizes
//! (byte-identical files), and a bad input failing cleanly.

use arrow::array::{Float32Array, StringArray};
use rlcr::model::Tokenizer;
use rlcr::table::{cols, Meta, Reader, Writer, TRAJECTORY};

use crate::support::pipeline;
use crate::support::table::{f32s, i32s, read, strs};
use crate::{fixtures, Workdir};

/// A scored countdown table from the tiny model whose answers (but the last) get a closed
/// thinking: `<think>` is the response prefix, the first sampled ids (up to 5, tags removed)
/// are the thinking, then `</think><answer>1+2</answer>`. The last answer keeps no `</think>`.
/// Each answer gets 2 confidence rows whose parsed `confidence` is then set to known values.
/// Returns the thinking lengths of the answers with a closed think.
pub(crate) fn scored_input(wd: &Workdir) -> Vec<usize> {
    let model = fixtures().join("tiny-qwen2");
    let m = model.display().to_string();
    pipeline::easy_countdown(wd, None, 2, "prompts.parquet");
    let answers = pipeline::answers_args(
        &m,
        "prompts.parquet",
        "answers.parquet",
        2,
        8,
        &["--response-prefix", "<think>"],
    );
    pipeline::run(wd, &answers);
    let tok = Tokenizer::load(&model, None).unwrap();
    let special: Vec<u32> = [
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "<|endoftext|>",
        "<|im_end|>",
        "<|im_start|>",
    ]
    .iter()
    .map(|t| tok.token_id(t).unwrap())
    .collect();
    let b = read(&wd.path("answers.parquet"));
    let rids = cols::list_i32(&b, "answers", "response_ids").unwrap();
    let n = b.num_rows();
    assert_eq!(n, 4);
    let tail: Vec<u32> = {
        let mut t = vec![
            tok.token_id("</think>").unwrap(),
            tok.token_id("<answer>").unwrap(),
        ];
        t.extend(tok.encode("1+2", false).unwrap());
        t.push(tok.token_id("</answer>").unwrap());
        t
    };
    let mut ids: Vec<Vec<i32>> = Vec::new();
    let mut texts = Vec::new();
    let mut think_lens = Vec::new();
    for i in 0..n {
        let mut r: Vec<u32> = rids.values.values()[rids.range(i)]
            .iter()
            .map(|&t| t as u32)
            .filter(|t| !special.contains(t))
            .take(5)
            .collect();
        if i + 1 < n {
            think_lens.push(r.len());
            r.extend(&tail);
        }
        texts.push(tok.decode(&r, false).unwrap());
        ids.push(r.iter().map(|&t| t as i32).collect());
    }
    // Log-probs as long as the new responses (the trajectory contract; values unused here).
    let lps = cols::build_list_f32(ids.iter().map(|r| vec![-1.0f32; r.len()]));
    let new = cols::set_columns(
        &b,
        &TRAJECTORY,
        vec![
            ("response_ids", cols::build_list_i32(ids)),
            ("response_logprobs", lps),
            (
                "response_text",
                std::sync::Arc::new(StringArray::from(texts)) as arrow::array::ArrayRef,
            ),
            ("answer_span", cols::build_spans(&vec![None; n])),
        ],
    )
    .unwrap();
    let meta = Meta::new(&TRAJECTORY, "generate-answers", serde_json::json!({}), &[]);
    let mut w = Writer::create(&wd.path("forced.parquet"), new.schema(), &meta).unwrap();
    w.write(&new).unwrap();
    w.finish().unwrap();
    wd.run(&[
        "generate-confidence",
        "--model",
        &m,
        "--input",
        "forced.parquet",
        "-o",
        "traj.parquet",
        "--num-confidences",
        "2",
        "--max-new-tokens",
        "4",
    ]);
    wd.run(&["score", "--input", "traj.parquet", "-o", "raw.parquet"]);
    // Known parsed confidences: answer j's h-th confidence row gets 0.1·(j+1) + 0.2·h, so its
    // verbal confidence is 0.1·(j+1) + 0.1.
    let s = read(&wd.path("raw.parquet"));
    let st = strs(&s, "sample_type");
    let (mut j, mut h) = (-1i32, 0i32);
    let conf: Vec<Option<f32>> = st
        .iter()
        .map(|t| {
            if t == "answer" {
                j += 1;
                h = 0;
                None
            } else {
                let c = 0.1 * (j + 1) as f32 + 0.2 * h as f32;
                h += 1;
                Some(c)
            }
        })
        .collect();
    let s = cols::set_columns(
        &s,
        &TRAJECTORY,
        vec![(
            "confidence",
            std::sync::Arc::new(Float32Array::from(conf)) as arrow::array::ArrayRef,
        )],
    )
    .unwrap();
    let meta = Meta::new(&TRAJECTORY, "score", serde_json::json!({}), &[]);
    let mut w = Writer::create(&wd.path("scored.parquet"), s.schema(), &meta).unwrap();
    w.write(&s).unwrap();
    w.finish().unwrap();
    think_lens
}

pub(crate) fn probe_args<'a>(m: &'a str, out: &'a str, batch: &'a str) -> Vec<&'a str> {
    vec![
        "probe",
        "--model",
        m,
        "--input",
        "scored.parquet",
        "-o",
        out,
        "--cut-fractions",
        "0,0.5,1",
        "--samples",
        "6",
        "--max-new-tokens",
        "5",
        "--batch-size",
        batch,
    ]
}

#[test]
fn probe_rows_counts_and_determinism() {
    let wd = Workdir::new();
    let think_lens = scored_input(&wd);
    let m = fixtures().join("tiny-qwen2").display().to_string();
    let o = wd.output(&probe_args(&m, "probe.parquet", "4"));
    assert!(o.status.success(), "{}", crate::describe(&[], &o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("1 skipped"), "{err}");

    let p = read(&wd.path("probe.parquet"));
    // 3 answers with a closed think x 3 cuts
    assert_eq!(p.num_rows(), 9);
    let meta = Reader::open(&wd.path("probe.parquet")).unwrap();
    assert_eq!(
        meta.metadata().get("rlcr.schema").map(String::as_str),
        Some("rlcr.probe")
    );
    let ns = i32s(&p, "num_samples");
    let nc = i32s(&p, "num_correct");
    let conf = f32s(&p, "probe_confidence");
    let cut_index = i32s(&p, "cut_index");
    let cut_token = i32s(&p, "cut_token");
    let frac = f32s(&p, "cut_fraction");
    for r in 0..9 {
        assert_eq!(ns[r], 6);
        assert!((0..=6).contains(&nc[r]));
        assert_eq!(conf[r], Some(nc[r] as f32 / 6.0));
        assert_eq!(cut_index[r], (r % 3) as i32);
        assert_eq!(frac[r], Some([0.0, 0.5, 1.0][r % 3]));
        // the context opened <think>: thinking = response tokens [0, L)
        let l = think_lens[r / 3] as f64;
        let want = [0.0, (0.5 * l).round(), l][r % 3] as i32;
        assert_eq!(cut_token[r], want, "row {r}");
    }
    let verbal = f32s(&p, "verbal_confidence");
    assert_eq!(verbal.len(), 9);
    for (r, v) in verbal.iter().enumerate() {
        let j = (r / 3) as f32;
        let c0 = 0.1 * (j + 1.0);
        let c1 = c0 + 0.2;
        let want = ((c0 as f64 + c1 as f64) / 2.0) as f32;
        assert_eq!(*v, Some(want), "row {r}");
        assert!((want - (0.1 * (j + 1.0) + 0.1)).abs() < 1e-6);
    }
    // acc_reward is the answer's: "1+2" does not solve these tasks
    assert!(f32s(&p, "acc_reward").iter().all(|v| *v == Some(0.0)));
    let sid = strs(&p, "sample_id");
    let scored = read(&wd.path("scored.parquet"));
    let types = strs(&scored, "sample_type");
    let scored_ids: Vec<String> = strs(&scored, "sample_id")
        .into_iter()
        .zip(&types)
        .filter(|(_, t)| t.as_str() == "answer")
        .map(|(s, _)| s)
        .collect();
    assert_eq!(scored_ids.len(), 4);
    for r in 0..9 {
        assert_eq!(sid[r], scored_ids[r / 3]);
    }

    // same seed, other batch size: byte-identical file
    wd.run(&probe_args(&m, "probe2.parquet", "7"));
    let a = std::fs::read(wd.path("probe.parquet")).unwrap();
    let b = std::fs::read(wd.path("probe2.parquet")).unwrap();
    assert!(a == b, "probe tables differ across batch sizes");
}

#[test]
fn probe_rejects_unscored_input() {
    let wd = Workdir::new();
    let m = pipeline::tiny_qwen2();
    pipeline::easy_countdown(&wd, None, 1, "prompts.parquet");
    let answers = pipeline::answers_args(&m, "prompts.parquet", "scored.parquet", 1, 4, &[]);
    pipeline::run(&wd, &answers);
    let err = wd.fail(&probe_args(&m, "probe.parquet", "4"), 1);
    assert!(
        err.contains("scored.parquet") && err.contains("acc_reward"),
        "{err}"
    );
    assert!(!wd.listing().iter().any(|f| f.starts_with("probe")));
}

/// A JSON-lines verifier in plain sh: every request is correct (`yes`) or wrong (`no`); with
/// `$PROBE_LOG` set, requests are appended to that file.
const SH_VERIFIER: &str = r#"
while IFS= read -r line; do
  [ -n "$PROBE_LOG" ] && printf '%s\n' "$line" >> "$PROBE_LOG"
  id=${line#*\"id\":}; id=${id%%,*}
  printf '{"id":%s,"correct":%s}\n' "$id" "$1"
done
"#;

#[test]
fn probe_verifies_with_the_verifier_score_used() {
    let wd = Workdir::new();
    scored_input(&wd);
    wd.write("v.sh", SH_VERIFIER);
    let m = fixtures().join("tiny-qwen2").display().to_string();
    // A real score run with an external verifier that calls everything correct.
    wd.run(&[
        "score",
        "--input",
        "traj.parquet",
        "-o",
        "ext.parquet",
        "--verifier-cmd",
        "sh v.sh true",
    ]);
    let with_input = |out: &str, extra: &[&str]| {
        let mut args = probe_args(&m, out, "4");
        args[4] = "ext.parquet";
        args.extend_from_slice(extra);
        let o = wd
            .cmd(&args)
            .env("PROBE_LOG", wd.path(&format!("{out}.log")))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", crate::describe(&args, &o));
        read(&wd.path(out))
    };
    // No verifier flag: score's command, from the table's metadata. 3 answers x 3 cuts x 6
    // samples, each asked once, each `<answer>` + the continuation.
    let p = with_input("inherit.parquet", &[]);
    assert_eq!(p.num_rows(), 9);
    assert!(i32s(&p, "num_correct").iter().all(|&c| c == 6));
    assert!(f32s(&p, "probe_confidence").iter().all(|&c| c == Some(1.0)));
    let log = std::fs::read_to_string(wd.path("inherit.parquet.log")).unwrap();
    let reqs: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(reqs.len(), 54);
    let mut ids: Vec<u64> = reqs.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..54).collect::<Vec<u64>>());
    for r in &reqs {
        assert!(
            r["response"].as_str().unwrap().starts_with("<answer>"),
            "{r}"
        );
        assert_eq!(r["data_source"], "countdown");
        assert!(r["ground_truth"]["target"].is_number(), "{r}");
    }
    let meta = Reader::open(&wd.path("inherit.parquet")).unwrap();
    let cfg: serde_json::Value = serde_json::from_str(&meta.metadata()["rlcr.config"]).unwrap();
    assert_eq!(cfg["verifier"]["from"], "score metadata");
    assert_eq!(cfg["verifier"]["verifier_cmd"], "sh v.sh true");

    // An explicit command replaces the recorded one.
    let p = with_input("no.parquet", &["--verifier-cmd", "sh v.sh false"]);
    assert!(i32s(&p, "num_correct").iter().all(|&c| c == 0));
    // An explicit built-in verifier drops the recorded command: no request is made, and the
    // tiny model's continuations do not solve the tasks.
    let p = with_input("builtin.parquet", &["--verifier", "countdown"]);
    assert!(!wd.path("builtin.parquet.log").exists());
    assert!(i32s(&p, "num_correct").iter().all(|&c| c < 6));
}
