//! The critic: `rlcr values`, GAE from its values against numpy, the clipped value loss
//! of `update --critic`, and the critic folder loading back in rlcr and in transformers.

use super::Workdir;
use crate::support::kb;
use crate::support::pipeline::tiny_qwen2 as tiny;
use crate::support::python::{script, Needs, Py};
use crate::support::table::{column_bool, column_f32};

/// Run scripts/check_critic.py; `None` when its Python packages are missing (exit 3) and
/// RLCR_REQUIRE_TORCH is not 1.
fn check(args: &[&str]) -> Option<serde_json::Value> {
    Py::script(script("check_critic.py"), Needs::Torch)
        .args(args)
        .json()
}

/// A scored multi-turn table (kb environment, dense turn rewards).
fn scored(w: &Workdir) {
    kb::prompts(w, 4, 5, "p.parquet");
    let env = kb::env_cmd("--length-bonus 0.01");
    w.run(&[
        "--seed",
        "3",
        "generate-multiturn",
        "--model",
        &tiny(),
        "--input",
        "p.parquet",
        "-o",
        "r.parquet",
        "--env-cmd",
        &env,
        "--num-answers",
        "3",
        "--max-turns",
        "3",
        "--max-new-tokens",
        "10",
        "--max-response-tokens",
        "80",
        "--stop",
        "</query>",
        "--stop",
        "</answer>",
    ]);
    kb::score_turn_rewards(w, "r.parquet", "s.parquet", &["--format-gate", "off"]);
}

#[test]
fn critic_trains_gae_matches_numpy_and_the_folder_loads_back() {
    let w = Workdir::new();
    scored(&w);
    // A policy folder starts a critic with a zero head: every value is 0.
    w.run(&[
        "values",
        "--critic",
        &tiny(),
        "--input",
        "s.parquet",
        "-o",
        "v0.parquet",
    ]);
    w.run(&[
        "advantage",
        "--input",
        "v0.parquet",
        "-o",
        "t0.parquet",
        "--estimator",
        "gae",
    ]);
    // Policy and critic trained together; the value loss falls over the steps on this fixed table.
    w.run(&[
        "update",
        "--model",
        &tiny(),
        "--input",
        "t0.parquet",
        "-o",
        "p1",
        "--lr",
        "1e-3",
        "--epochs",
        "6",
        "--critic",
        &tiny(),
        "--critic-out",
        "c1",
        "--critic-lr",
        "5e-4",
        "--cliprange-value",
        "10",
    ]);
    let metrics: Vec<serde_json::Value> =
        std::fs::read_to_string(w.path("c1/critic_metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    assert_eq!(metrics.len(), 6);
    let loss: Vec<f64> = metrics
        .iter()
        .map(|m| m["vf_loss"].as_f64().unwrap())
        .collect();
    assert!(loss[0] > 1e-3, "{loss:?}");
    assert!(loss[5] < 0.5 * loss[0], "value loss did not fall: {loss:?}");
    for k in 1..6 {
        assert!(
            loss[k] < loss[k - 1],
            "value loss rose at step {k}: {loss:?}"
        );
    }
    // Step 1's loss by hand: a zero head predicts 0 = the old values, so the loss is
    // 0.5 · mean over learnable tokens of R².
    let (mut sum, mut n) = (0f64, 0usize);
    for (ret, mask) in column_f32(&w.path("t0.parquet"), "returns")
        .iter()
        .zip(column_bool(&w.path("t0.parquet"), "loss_mask"))
    {
        for (r, m) in ret.iter().zip(mask) {
            if m {
                sum += (*r as f64).powi(2);
                n += 1;
            }
        }
    }
    let by_hand = 0.5 * sum / n as f64;
    assert!(
        (loss[0] - by_hand).abs() < 1e-5 * by_hand.max(1.0),
        "{} vs {by_hand}",
        loss[0]
    );
    // The folder is a token-classification checkpoint with one label.
    let cfg: serde_json::Value = crate::support::json::read(w.path("c1/config.json"));
    assert_eq!(cfg["architectures"][0], "Qwen2ForTokenClassification");
    assert_eq!(cfg["id2label"].as_object().unwrap().len(), 1);

    // It loads back in rlcr: non-zero values now.
    let c1 = w.path("c1").display().to_string();
    w.run(&[
        "values",
        "--critic",
        &c1,
        "--input",
        "s.parquet",
        "-o",
        "v1.parquet",
    ]);
    // and in transformers, with the same values.
    if let Some(v) = check(&["values", &c1, &w.path("v1.parquet").display().to_string()]) {
        let d = v["max_abs_diff"].as_f64().unwrap();
        assert!(v["tokens"].as_u64().unwrap() > 100);
        assert!(d < 1e-4, "transformers vs rlcr values: {v}");
    }

    // GAE from the critic's values with KL in the reward (reference = the updated policy),
    // against numpy on the written table, for both reward distributions.
    let p1 = w.path("p1").display().to_string();
    w.run(&[
        "logprobs",
        "--model",
        &p1,
        "--input",
        "v1.parquet",
        "-o",
        "v1r.parquet",
        "--column",
        "ref_logprobs",
    ]);
    for (dist, gamma, lam) in [
        ("turn_proportional", "1.0", "1.0"),
        ("final_token_only", "0.9", "0.95"),
    ] {
        let out = format!("t1-{dist}.parquet");
        w.run(&[
            "advantage",
            "--input",
            "v1r.parquet",
            "-o",
            &out,
            "--estimator",
            "gae",
            "--gamma",
            gamma,
            "--lam",
            lam,
            "--kl-coef",
            "0.1",
            "--reward-distribution",
            dist,
        ]);
        // Observation tokens: never learnable in GAE mode either.
        let (info, mask) = (
            column_bool(&w.path(&out), "info_mask"),
            column_bool(&w.path(&out), "loss_mask"),
        );
        let mut observations = 0;
        for (i, m) in info.iter().zip(&mask) {
            for (&x, &y) in i.iter().zip(m) {
                assert!(x || !y, "{dist}: an observation token is learnable");
                observations += usize::from(!x);
            }
        }
        assert!(observations > 50, "{dist}: {observations}");
        let Some(r) = check(&[
            "gae",
            &w.path(&out).display().to_string(),
            "--gamma",
            gamma,
            "--lam",
            lam,
            "--kl-coef",
            "0.1",
            "--dist",
            dist,
        ]) else {
            return;
        };
        assert!(r["tokens"].as_u64().unwrap() > 100, "{r}");
        assert!(r["adv_std"].as_f64().unwrap() > 1e-3, "{r}");
        assert_eq!(r["masked_nonzero"], 0, "{dist}: {r}");
        for k in ["token_advantages", "returns"] {
            assert!(r[k].as_f64().unwrap() < 1e-4, "{dist} {k}: {r}");
        }
        assert!(
            r["trajectory_score"].as_f64().unwrap() < 1e-3,
            "{dist}: {r}"
        );
    }
}

#[test]
fn value_loss_matches_verl_by_hand() {
    use rlcr::train::critic::value_loss;
    use rlcr::train::loss::LossAgg;
    // One row, three tokens, the last masked. cv = 0.5.
    // t0: pred 1.0, old 0.0 -> clip 0.5; R = 2: max((1-2)^2, (0.5-2)^2) = 2.25, clipped
    // t1: pred 0.2, old 0.0 -> clip 0.2; R = 0: max(0.04, 0.04) = 0.04, not clipped
    // token-mean: 0.5 * (2.25 + 0.04) / 2 = 0.5725; clipfrac 1/2
    let (l, cf) = value_loss(
        &[vec![1.0, 0.2, 9.0]],
        &[vec![0.0, 0.0, 0.0]],
        &[vec![2.0, 0.0, -9.0]],
        &[vec![true, true, false]],
        0.5,
        LossAgg::TokenMean,
        3,
    );
    assert!((l - 0.5725).abs() < 1e-12, "{l}");
    assert!((cf - 0.5).abs() < 1e-12);
}
