//! Multi-turn rollouts with an environment process (`rlcr generate-multiturn`) and the
//! masks of information tokens through score, advantage and update. The environment is the
//! example `scripts/kb_env.py` (Python standard library).
#![allow(clippy::needless_range_loop)] // parallel per-token columns are indexed together
use std::path::Path;

use arrow::array::{Array, BooleanArray, Float32Array, Int32Array, ListArray, StringArray};
use arrow::record_batch::RecordBatch;

use super::support::pipeline::tiny_qwen2 as tiny;
use super::{fixtures, Workdir};

use crate::support::kb::{self, env_cmd};
use crate::support::table::{read, strs};

fn list<T: arrow::array::ArrowPrimitiveType>(
    b: &RecordBatch,
    col: &str,
    i: usize,
) -> Vec<T::Native> {
    let l = b
        .column_by_name(col)
        .unwrap_or_else(|| panic!("no column {col}"))
        .as_any()
        .downcast_ref::<ListArray>()
        .unwrap();
    let v = l.value(i);
    v.as_any()
        .downcast_ref::<arrow::array::PrimitiveArray<T>>()
        .unwrap()
        .values()
        .to_vec()
}

fn bools(b: &RecordBatch, col: &str, i: usize) -> Vec<bool> {
    let l = b
        .column_by_name(col)
        .unwrap_or_else(|| panic!("no column {col}"))
        .as_any()
        .downcast_ref::<ListArray>()
        .unwrap();
    let v = l.value(i);
    let v = v.as_any().downcast_ref::<BooleanArray>().unwrap();
    (0..v.len()).map(|k| v.value(k)).collect()
}

/// Prompts from the example environment (seed 3) in `prompts.parquet`.
fn prompts(w: &Workdir, count: usize) {
    kb::prompts(w, count, 3, "prompts.parquet");
}

/// `generate-multiturn` on the tiny model with the example environment.
fn rollouts(
    w: &Workdir,
    out: &str,
    batch: usize,
    env: &str,
    extra: &[&str],
) -> std::process::Output {
    let model = tiny();
    let batch = batch.to_string();
    let mut args = vec![
        "--seed",
        "7",
        "generate-multiturn",
        "--model",
        &model,
        "--input",
        "prompts.parquet",
        "-o",
        out,
        "--env-cmd",
        env,
        "--num-answers",
        "3",
        "--max-turns",
        "3",
        "--max-new-tokens",
        "12",
        "--max-response-tokens",
        "96",
        "--stop",
        "</query>",
        "--stop",
        "</answer>",
        "--batch-size",
        &batch,
    ];
    args.extend_from_slice(extra);
    w.output(&args)
}

fn kb_observation_ids(model: &str, text: &str) -> Vec<u32> {
    let tok = rlcr::model::Tokenizer::load(Path::new(model), None).unwrap();
    tok.encode(text, false).unwrap()
}

#[test]
fn multiturn_rollouts_mark_observations_and_continue_from_the_cache() {
    let w = Workdir::new();
    prompts(&w, 4);
    let o = rollouts(&w, "r.parquet", 5, &env_cmd(""), &[]);
    assert!(
        o.status.success(),
        "{}",
        super::describe(&["generate-multiturn"], &o)
    );
    let b = read(&w.path("r.parquet"));
    assert_eq!(b.num_rows(), 12);
    let texts = strs(&b, "response_text");
    let turns = b
        .column_by_name("num_turns")
        .unwrap()
        .as_any()
        .downcast_ref::<Int32Array>()
        .unwrap()
        .clone();
    let no_query = kb_observation_ids(&tiny(), "\n<information>no valid query</information>\n");
    let mut multi = 0;
    let mut obs_tokens = 0;
    for i in 0..b.num_rows() {
        let ids = list::<arrow::datatypes::Int32Type>(&b, "response_ids", i);
        let lps = list::<arrow::datatypes::Float32Type>(&b, "response_logprobs", i);
        let info = bools(&b, "info_mask", i);
        let tt = list::<arrow::datatypes::Int32Type>(&b, "token_turn_ids", i);
        let rewards = list::<arrow::datatypes::Float32Type>(&b, "turn_rewards", i);
        let n = ids.len();
        assert!(n <= 96);
        assert_eq!((lps.len(), info.len(), tt.len()), (n, n, n));
        let nt = turns.value(i) as usize;
        assert_eq!(rewards.len(), nt, "one turn reward per model turn");
        assert!((1..=3).contains(&nt));
        // Walk the response: model turns (info true, turn id = turn) separated by observations
        // (info false, turn id -1) that are exactly the environment's text, tokenised.
        let mut t = 0;
        let mut turn = 0;
        while t < n {
            let s = t;
            while t < n && info[t] {
                assert_eq!(tt[t], turn, "row {i} token {t}");
                t += 1;
            }
            assert!(
                t > s && t - s <= 12,
                "row {i}: a model turn of {} tokens",
                t - s
            );
            if t < n {
                let e = (t..n).find(|&u| info[u]).unwrap_or(n);
                let obs: Vec<u32> = ids[t..e].iter().map(|&x| x as u32).collect();
                assert!(e < n, "row {i}: an observation never ends a response");
                for u in t..e {
                    assert_eq!(tt[u], -1, "row {i} observation token {u}");
                    assert_eq!(lps[u], 0.0);
                }
                assert!(
                    obs == no_query || texts[i].contains("<information>"),
                    "row {i}"
                );
                obs_tokens += obs.len();
                t = e;
            }
            turn += 1;
        }
        assert_eq!(turn as usize, nt, "row {i}: {}", texts[i]);
        multi += (nt > 1) as usize;
    }
    assert!(
        multi >= 6,
        "most rollouts take several turns ({multi} of 12)"
    );
    assert!(obs_tokens > 100);

    // The model's turns continue from the cache: every model token's behaviour log-prob equals
    // the cache-free `rlcr logprobs` of the whole sequence.
    w.run(&[
        "logprobs",
        "--model",
        &tiny(),
        "--input",
        "r.parquet",
        "-o",
        "lp.parquet",
        "--column",
        "check",
    ]);
    let l = read(&w.path("lp.parquet"));
    let mut worst = 0f32;
    let mut checked = 0;
    for i in 0..b.num_rows() {
        let ours = list::<arrow::datatypes::Float32Type>(&b, "response_logprobs", i);
        let theirs = list::<arrow::datatypes::Float32Type>(&l, "check", i);
        let info = bools(&b, "info_mask", i);
        for t in 0..ours.len() {
            if info[t] {
                worst = worst.max((ours[t] - theirs[t]).abs());
                checked += 1;
            }
        }
    }
    assert!(checked > 200);
    assert!(worst < 1e-4, "max |Δ log-prob| = {worst}");

    // The same seed gives the same table for another batch size.
    let o = rollouts(&w, "r1.parquet", 1, &env_cmd(""), &[]);
    assert!(
        o.status.success(),
        "{}",
        super::describe(&["generate-multiturn"], &o)
    );
    let c = read(&w.path("r1.parquet"));
    for col in [
        "sample_id",
        "response_ids",
        "response_logprobs",
        "info_mask",
        "token_turn_ids",
        "turn_rewards",
        "response_text",
        "finish_reason",
        "env_extra",
    ] {
        assert_eq!(
            b.column_by_name(col).unwrap().as_ref(),
            c.column_by_name(col).unwrap().as_ref(),
            "column {col}: batch 5 vs batch 1"
        );
    }
}

#[test]
fn turn_rewards_reach_score_and_advantage_and_observations_get_no_gradient() {
    let w = Workdir::new();
    prompts(&w, 4);
    let o = rollouts(&w, "r.parquet", 12, &env_cmd("--length-bonus 0.01"), &[]);
    assert!(
        o.status.success(),
        "{}",
        super::describe(&["generate-multiturn"], &o)
    );
    kb::score_turn_rewards(&w, "r.parquet", "s.parquet", &[]);
    let s = read(&w.path("s.parquet"));
    // reward_components: one `env` component per model turn with its turn id and value.
    let comps = s
        .column_by_name("reward_components")
        .unwrap()
        .as_any()
        .downcast_ref::<ListArray>()
        .unwrap();
    let reward = s
        .column_by_name("reward")
        .unwrap()
        .as_any()
        .downcast_ref::<Float32Array>()
        .unwrap();
    let mut nonzero = 0;
    for i in 0..s.num_rows() {
        let tr = list::<arrow::datatypes::Float32Type>(&s, "turn_rewards", i);
        let c = comps.value(i);
        let c = c
            .as_any()
            .downcast_ref::<arrow::array::StructArray>()
            .unwrap();
        let names = c
            .column_by_name("name")
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        let turns = c
            .column_by_name("turn")
            .unwrap()
            .as_any()
            .downcast_ref::<Int32Array>()
            .unwrap();
        let values = c
            .column_by_name("value")
            .unwrap()
            .as_any()
            .downcast_ref::<Float32Array>()
            .unwrap();
        let env: Vec<(i32, f32)> = (0..c.len())
            .filter(|&k| names.value(k) == "env")
            .map(|k| (turns.value(k), values.value(k)))
            .collect();
        let expect: Vec<(i32, f32)> = tr.iter().enumerate().map(|(k, &v)| (k as i32, v)).collect();
        assert_eq!(env, expect, "row {i}");
        // total = mean over turns + exact_match, by hand
        let exact: f32 = (0..c.len())
            .filter(|&k| names.value(k) == "exact_match")
            .map(|k| values.value(k))
            .sum();
        let mean = tr.iter().map(|&x| x as f64).sum::<f64>() / tr.len() as f64;
        assert!(
            (reward.value(i) as f64 - (mean + exact as f64)).abs() < 1e-6,
            "row {i}"
        );
        nonzero += (mean != 0.0) as usize;
    }
    assert!(nonzero > 0, "some turns earned a reward");

    // grpo-multiturn: observation tokens are never learnable, never get an advantage.
    w.run(&[
        "advantage",
        "--input",
        "s.parquet",
        "-o",
        "t.parquet",
        "--estimator",
        "grpo-multiturn",
    ]);
    let t = read(&w.path("t.parquet"));
    let mut model_tokens = 0;
    for i in 0..t.num_rows() {
        let info = bools(&t, "info_mask", i);
        let mask = bools(&t, "loss_mask", i);
        let adv = list::<arrow::datatypes::Float32Type>(&t, "token_advantages", i);
        for k in 0..info.len() {
            if !info[k] {
                assert!(
                    !mask[k],
                    "row {i} token {k}: an observation token is learnable"
                );
                assert_eq!(adv[k], 0.0, "row {i} token {k}");
            } else {
                model_tokens += mask[k] as usize;
            }
        }
    }
    assert!(model_tokens > 100);

    // On the gradients: the update's gradient does not move when the observation tokens'
    // advantages, behaviour and reference log-probs are replaced by anything (KL loss and
    // entropy bonus on), and does move when one model token's advantage changes.
    use rlcr::train::trainer::{batch_gradients, grads_to_host, TrainConfig};
    let rows = rlcr::train::data::read_update_rows(&w.path("t.parquet"), false).unwrap();
    let infos: Vec<Vec<bool>> = (0..t.num_rows())
        .map(|i| bools(&t, "info_mask", i))
        .collect();
    let device = burn::tensor::Device::flex().autodiff();
    let model = rlcr::model::Model::load(&fixtures().join("tiny-qwen2"), &device).unwrap();
    let with_ref = |rows: &[rlcr::train::data::TrainRow], junk: f32| {
        rows.iter()
            .zip(&infos)
            .map(|(r, info)| {
                let mut r = r.clone();
                let n = r.response.len();
                r.ref_logp = Some(
                    (0..n)
                        .map(|k| r.old_logp[k] - 0.05 * (k % 3) as f32)
                        .collect(),
                );
                for k in 0..n {
                    if !info[k] {
                        r.adv[k] = junk;
                        r.old_logp[k] = -junk.abs();
                        r.ref_logp.as_mut().unwrap()[k] = junk;
                    }
                }
                r
            })
            .collect::<Vec<_>>()
    };
    let cfg = TrainConfig {
        agg_len: 96,
        ..crate::support::train::config(crate::support::train::policy(0.1, 0.01), 4)
    };

    let grads = |rows: &[rlcr::train::data::TrainRow]| {
        let refs: Vec<&rlcr::train::data::TrainRow> = rows.iter().collect();
        let (g, _) = batch_gradients(&model.transformer, &refs, &cfg).unwrap();
        grads_to_host(&model.transformer, &g)
    };
    let a = grads(&with_ref(&rows, 0.0));
    let b = grads(&with_ref(&rows, 37.5));
    assert!(a.iter().any(|(_, v)| v.iter().any(|&x| x != 0.0)));
    assert_eq!(a, b, "observation tokens moved the gradient");
    let mut changed = with_ref(&rows, 0.0);
    let (i, k) = changed
        .iter()
        .enumerate()
        .find_map(|(i, r)| r.mask.iter().position(|&m| m).map(|k| (i, k)))
        .unwrap();
    changed[i].adv[k] += 1.0;
    assert_ne!(
        grads(&changed),
        a,
        "a model token's advantage must move the gradient"
    );
}

/// Environments that crash (leaving a grandchild), hang, write garbage, answer an id they were
/// not asked, or send a malformed reply: exit 1, a message naming the problem, nothing written,
/// and no process left behind.
#[test]
fn bad_environments_fail_cleanly() {
    let w = Workdir::new();
    prompts(&w, 2);
    let pidfile = w.path("grandchild.pid");
    for (fault, after, expect) in [
        ("crash", "1", "exit status: 3"),
        ("hang", "0", "no reply within 2.0s"),
        ("garbage", "2", "not a reply"),
        ("wrong-id", "0", "which was not asked"),
        ("bad-done", "0", "\"done\" missing or not a boolean"),
    ] {
        let cmd = format!(
            "KB_ENV_PIDFILE={} {}",
            pidfile.display(),
            env_cmd(&format!("--fault {fault} --fault-after {after}"))
        );
        let t = std::time::Instant::now();
        // A short timeout for the hanging environment; a generous one for the others, whose
        // first replies must come before their fault even on a loaded machine.
        let timeout = if fault == "hang" { "2" } else { "30" };
        let o = rollouts(&w, "bad.parquet", 4, &cmd, &["--env-timeout", timeout]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{fault}: {err}");
        assert!(err.contains(expect), "{fault}: {err}");
        assert!(err.contains("environment `"), "{fault}: {err}");
        assert!(t.elapsed().as_secs() < 90, "{fault}");
        assert!(!w.path("bad.parquet").exists(), "{fault}: output written");
        let leftovers: Vec<String> = w
            .listing()
            .into_iter()
            .filter(|f| f.contains("bad"))
            .collect();
        assert!(leftovers.is_empty(), "{fault}: {leftovers:?}");
    }
    // The crashing environment's grandchild was killed with its process group.
    let pid =
        std::fs::read_to_string(&pidfile).expect("the crash fault wrote its grandchild's pid");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let alive = std::process::Command::new("kill")
        .args(["-0", pid.trim()])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(!alive, "grandchild {pid} outlived rlcr");
}

/// Bad flags and tables: exit 1 (or 2 for usage), a message, nothing written.
#[test]
fn multiturn_and_values_reject_bad_input() {
    let w = Workdir::new();
    prompts(&w, 2);
    for (extra, expect) in [
        (&["--max-turns", "0"][..], "--max-turns must be at least 1"),
        (&["--max-response-tokens", "0"][..], "--max-response-tokens"),
        (
            &["--env-timeout", "0"][..],
            "--env-timeout must be a positive",
        ),
    ] {
        let o = rollouts(&w, "x.parquet", 4, &env_cmd(""), extra);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert!(err.contains(expect), "{extra:?}: {err}");
    }
    let o = rollouts(&w, "x.parquet", 4, "exit 0", &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("closed its output") || err.contains("exited"),
        "{err}"
    );
    // `values` needs token columns; a prompts table has none.
    let err = w.fail(
        &[
            "values",
            "--critic",
            &tiny(),
            "--input",
            "prompts.parquet",
            "-o",
            "v.parquet",
        ],
        1,
    );
    assert!(err.contains("context_ids"), "{err}");
    assert!(!w.path("x.parquet").exists() && !w.path("v.parquet").exists());
}
