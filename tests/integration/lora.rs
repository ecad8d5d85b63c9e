//! LoRA adapters end to end: `update`/`sft --lora-rank` write PEFT's layout, PEFT loads it with
//! rlcr's figures, every model stage reads an adapter folder, `merge-lora` equals PEFT's merge, and
//! only the adapter trains.
use std::path::{Path, PathBuf};

use super::support::json::read as json;
use super::support::python::{script, Needs, Py};
use super::support::table::column_f32;
use super::support::train::{metrics, train_rows, write_rows};
use super::{fixtures, Workdir};

/// Run `scripts/peft_lora.py` with `RLCR_PYTHON` (default `python3`). `None` when torch,
/// transformers or peft is not importable and `RLCR_REQUIRE_TORCH` is not `1` (`.ci/run` sets it
/// after installing them).
fn peft(args: &[&Path]) -> Option<serde_json::Value> {
    peft_in(None, args)
}

/// [`peft`] run in the working directory `cwd` (default: the test binary's), offline: with
/// `HF_HUB_OFFLINE=1` a base that is not a folder is an error, not a download.
fn peft_in(cwd: Option<&Path>, args: &[&Path]) -> Option<serde_json::Value> {
    let mut run = Py::script(script("peft_lora.py"), Needs::Torch)
        .args(args)
        .env("HF_HUB_OFFLINE", "1");
    if let Some(d) = cwd {
        run = run.cwd(d);
    }
    run.json()
}

fn max_gap(a: &[Vec<f32>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut gap = 0f64;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.len(), y.len());
        for (&p, &q) in x.iter().zip(y) {
            gap = gap.max((p as f64 - q).abs());
        }
    }
    gap
}

/// Tensor names of a safetensors file.
fn names(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    v.sort();
    v
}

/// `update --lora-rank` on the Qwen2 and Llama fixtures writes an adapter folder in PEFT's layout
/// (no full weights; the optimizer state holds the adapter's moments only); PEFT's
/// `PeftModel.from_pretrained` on it gives `rlcr logprobs --model ADAPTER`'s figures within 1e-4;
/// `merge-lora` writes PEFT's `merge_and_unload()` (within 1e-6) and the merged folder gives the
/// same log-probs; a second update continues the adapter and its optimizer state.
#[test]
fn peft_loads_what_update_writes_with_lora() {
    let w = Workdir::new();
    write_rows(&w.path("train.parquet"), &train_rows());
    let qwen = fixtures().join("tiny-qwen2");
    let llama = fixtures().join("tiny-llama");
    let cases: [(&Path, &str, &str, usize); 2] = [
        (&qwen, "qwen-lora", "q_proj,v_proj", 2),
        (&llama, "llama-lora", "all-linear", 7),
    ];
    for (model, out, target, n_targets) in cases {
        w.run(&[
            "update",
            "--model",
            model.to_str().unwrap(),
            "--input",
            "train.parquet",
            "-o",
            out,
            "--lr",
            "3e-2",
            "--epochs",
            "2",
            "--lora-rank",
            "4",
            "--lora-alpha",
            "16",
            "--lora-target",
            target,
        ]);
        let dir = w.path(out);
        assert!(
            !dir.join("model.safetensors").exists(),
            "full weights written"
        );
        assert!(!dir.join("config.json").exists());
        assert!(dir.join("tokenizer.json").is_file());
        let cfg = json(dir.join("adapter_config.json"));
        assert_eq!(cfg["peft_type"], "LORA");
        assert_eq!(cfg["task_type"], "CAUSAL_LM");
        assert_eq!(cfg["r"], 4);
        assert_eq!(cfg["lora_alpha"], 16.0);
        assert_eq!(cfg["base_model_name_or_path"], model.to_str().unwrap());
        assert_eq!(cfg["target_modules"].as_array().unwrap().len(), n_targets);
        let layers = 2;
        let tensors = names(&dir.join("adapter_model.safetensors"));
        assert_eq!(tensors.len(), layers * n_targets * 2);
        assert!(tensors.contains(
            &"base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight".to_string()
        ));
        // The optimizer holds the adapter's moments and nothing else.
        let opt = names(&dir.join("rlcr-train/optimizer.safetensors"));
        assert_eq!(opt.len(), layers * n_targets * 2 * 2, "{opt:?}");
        assert!(opt.iter().all(|n| n.contains(".lora.")), "{opt:?}");
        let state = json(dir.join("rlcr-train/trainer_state.json"));
        assert_eq!(state["config"]["lora"]["config"]["r"], 4);
        // Every model stage reads the adapter folder (merged at load).
        w.run(&[
            "logprobs",
            "--model",
            out,
            "--input",
            "train.parquet",
            "-o",
            &format!("{out}.lp.parquet"),
        ]);
        w.run(&[
            "merge-lora",
            "--adapter",
            out,
            "-o",
            &format!("{out}-merged"),
        ]);
        w.run(&[
            "logprobs",
            "--model",
            &format!("{out}-merged"),
            "--input",
            "train.parquet",
            "-o",
            &format!("{out}.merged.lp.parquet"),
        ]);
        let ours = column_f32(&w.path(&format!("{out}.lp.parquet")), "logprobs");
        let merged = column_f32(&w.path(&format!("{out}.merged.lp.parquet")), "logprobs");
        let base = {
            w.run(&[
                "logprobs",
                "--model",
                model.to_str().unwrap(),
                "--input",
                "train.parquet",
                "-o",
                &format!("{out}.base.lp.parquet"),
            ]);
            column_f32(&w.path(&format!("{out}.base.lp.parquet")), "logprobs")
        };
        let as64 = |v: &[Vec<f32>]| -> Vec<Vec<f64>> {
            v.iter()
                .map(|r| r.iter().map(|&x| x as f64).collect())
                .collect()
        };
        let moved = max_gap(&base, &as64(&ours));
        assert!(moved > 1e-3, "{out}: the adapter did not move ({moved})");
        let merged_gap = max_gap(&merged, &as64(&ours));
        assert!(merged_gap <= 1e-5, "{out}: merged vs adapter {merged_gap}");
        // A second update continues the adapter and its optimizer state.
        let next = format!("{out}-2");
        w.run(&[
            "update",
            "--model",
            out,
            "--input",
            "train.parquet",
            "-o",
            &next,
            "--lr",
            "3e-2",
            "--resume",
            "auto",
        ]);
        let steps: Vec<u64> = metrics(&w.path(&next))
            .iter()
            .map(|m| m["step"].as_u64().unwrap())
            .collect();
        assert_eq!(steps, vec![1, 2, 3]);
        let cfg2 = json(w.path(&next).join("adapter_config.json"));
        assert_eq!(
            cfg2["base_model_name_or_path"],
            cfg["base_model_name_or_path"]
        );
        // The other side: PEFT (no rlcr code) on the same folders.
        let table = w.path("train.parquet");
        let Some(theirs) = peft(&[Path::new("logprobs"), &table, model, &dir]) else {
            return;
        };
        let theirs: Vec<Vec<f64>> = serde_json::from_value(theirs[0]["logprobs"].clone()).unwrap();
        let gap = max_gap(&ours, &theirs);
        eprintln!("{out}: |rlcr - peft| <= {gap:.2e}, adapter moves {moved:.2e}");
        assert!(gap <= 1e-4, "{out}: rlcr and PEFT differ by {gap}");
        let merged_dir: PathBuf = w.path(&format!("{out}-merged"));
        let m = peft(&[Path::new("merged"), model, &dir, &merged_dir]).unwrap();
        eprintln!("{out}: merge-lora vs PEFT merge_and_unload: {m}");
        assert!(m["max_abs_diff"].as_f64().unwrap() <= 1e-6, "{m}");
    }
}

/// `sft --lora-rank` trains an adapter too (its loss falls); flags that contradict an adapter
/// folder given as --model are usage errors, as are LoRA flags without --lora-rank; a PEFT adapter
/// whose base cannot be found names the paths it tried.
#[test]
fn lora_flags_and_errors() {
    let w = Workdir::new();
    write_rows(&w.path("train.parquet"), &train_rows());
    let qwen = fixtures().join("tiny-qwen2");
    let q = qwen.to_str().unwrap();
    // Usage errors (exit 2) that write nothing: each flag set with the text its error names.
    let peft_dir = fixtures().join("lora/tiny-qwen2-peft");
    let peft = peft_dir.to_str().unwrap();
    for (model, flags, needle) in [
        (q, &["--lora-alpha", "4"][..], "need --lora-rank"),
        (
            q,
            &["--lora-rank", "4", "--lora-target", "q_proj,qkv"][..],
            "unknown LoRA target `qkv`",
        ),
        (
            q,
            &["--lora-rank", "4", "--lora-dropout", "1.5"][..],
            "--lora-dropout",
        ),
        (peft, &["--lora-rank", "4"][..], "is an adapter with r = 8"),
    ] {
        let mut args = vec![
            "update",
            "--model",
            model,
            "--input",
            "train.parquet",
            "-o",
            "x",
        ];
        args.extend_from_slice(flags);
        let e = w.fail(&args, 2);
        assert!(e.contains(needle), "{flags:?}: {e}");
        assert!(!w.path("x").exists());
    }
    // A copy of the PEFT adapter away from its base: the error names what was tried.
    let lost = w.path("lost");
    std::fs::create_dir(&lost).unwrap();
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(peft_dir.join(f), lost.join(f)).unwrap();
    }
    w.refuse(
        &[
            "logprobs",
            "--model",
            "lost",
            "--input",
            "train.parquet",
            "-o",
            "lp.parquet",
        ],
        1,
        "is not a model folder here",
        "lp.parquet",
    );
    // Continuing the PEFT adapter with rlcr: its settings carry over (rsLoRA, r = 8).
    w.run(&[
        "update",
        "--model",
        peft_dir.to_str().unwrap(),
        "--input",
        "train.parquet",
        "-o",
        "cont",
        "--lr",
        "1e-2",
    ]);
    let cfg = json(w.path("cont/adapter_config.json"));
    assert_eq!(cfg["use_rslora"], true);
    assert_eq!(cfg["r"], 8);
    // Its base recorded as found from here (the fixture's own path is relative to its folder).
    let base = cfg["base_model_name_or_path"].as_str().unwrap();
    assert_eq!(Path::new(base), fixtures().join("tiny-qwen2"), "{base}");
}

/// Run `rlcr` in `dir`; require success.
fn run_in(w: &Workdir, dir: &Path, args: &[&str]) {
    let o = w.cmd(args).current_dir(dir).output().unwrap();
    assert!(
        o.status.success(),
        "in {}:\n{}",
        dir.display(),
        super::describe(args, &o)
    );
}

/// An adapter written in one folder loads from another working directory: `update` run inside a
/// project with a relative `--model` records the base's absolute path; rlcr (adapter as --model,
/// or `--model BASE --adapter DIR`) and PEFT (`PeftModel`, `AutoPeftModelForCausalLM`, offline)
/// load it from elsewhere and agree; an adapter that recorded its base relative to the project
/// (PEFT's `save_pretrained` after a relative `from_pretrained`) loads from elsewhere too;
/// `generate-answers --adapter` samples the tokens of the model `merge-lora` writes, with the
/// fingerprint of the adapter folder given as --model.
#[test]
fn adapters_load_from_any_working_directory() {
    let w = Workdir::new();
    let proj = w.path("proj");
    let base = proj.join("ckpt/base");
    std::fs::create_dir_all(&base).unwrap();
    for e in std::fs::read_dir(fixtures().join("tiny-qwen2")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), base.join(e.file_name())).unwrap();
    }
    write_rows(&proj.join("train.parquet"), &train_rows());
    run_in(
        &w,
        &proj,
        &[
            "update",
            "--model",
            "ckpt/base",
            "--input",
            "train.parquet",
            "-o",
            "runs/a",
            "--lr",
            "3e-2",
            "--epochs",
            "2",
            "--lora-rank",
            "4",
            "--lora-alpha",
            "16",
        ],
    );
    let cfg = json(proj.join("runs/a/adapter_config.json"));
    let recorded = cfg["base_model_name_or_path"].as_str().unwrap();
    assert_eq!(
        Path::new(recorded),
        base.canonicalize().unwrap(),
        "{recorded}"
    );
    // The same adapter recorded relative to the project, as an older writer or PEFT leaves it.
    let old = proj.join("runs/old");
    std::fs::create_dir_all(&old).unwrap();
    for e in std::fs::read_dir(proj.join("runs/a")).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), old.join(e.file_name())).unwrap();
        }
    }
    let mut rel = cfg.clone();
    rel["base_model_name_or_path"] = "ckpt/base".into();
    std::fs::write(old.join("adapter_config.json"), rel.to_string()).unwrap();

    // rlcr from another working directory, three ways, and from inside the project.
    let away = w.path("elsewhere/deeper");
    std::fs::create_dir_all(&away).unwrap();
    let table = proj.join("train.parquet");
    let t = table.to_str().unwrap();
    let a = proj.join("runs/a");
    let a_str = a.to_str().unwrap();
    let base_str = base.to_str().unwrap();
    run_in(
        &w,
        &away,
        &[
            "logprobs",
            "--model",
            a_str,
            "--input",
            t,
            "-o",
            "a.parquet",
        ],
    );
    run_in(
        &w,
        &away,
        &[
            "logprobs",
            "--model",
            "../../proj/runs/old",
            "--input",
            t,
            "-o",
            "old.parquet",
        ],
    );
    run_in(
        &w,
        &away,
        &[
            "logprobs",
            "--model",
            base_str,
            "--adapter",
            a_str,
            "--input",
            t,
            "-o",
            "flag.parquet",
        ],
    );
    run_in(
        &w,
        &proj,
        &[
            "logprobs",
            "--model",
            "runs/a",
            "--input",
            t,
            "-o",
            "here.parquet",
        ],
    );
    let here = column_f32(&proj.join("here.parquet"), "logprobs");
    for name in ["a", "old", "flag"] {
        let got = column_f32(&away.join(format!("{name}.parquet")), "logprobs");
        assert_eq!(got, here, "{name}");
    }
    let base_lp = {
        run_in(
            &w,
            &proj,
            &[
                "logprobs",
                "--model",
                "ckpt/base",
                "--input",
                t,
                "-o",
                "b.parquet",
            ],
        );
        column_f32(&proj.join("b.parquet"), "logprobs")
    };
    let as64 = |v: &[Vec<f32>]| -> Vec<Vec<f64>> {
        v.iter()
            .map(|r| r.iter().map(|&x| x as f64).collect())
            .collect()
    };
    assert!(
        max_gap(&base_lp, &as64(&here)) > 1e-3,
        "the adapter did not move"
    );

    // Sampling: --adapter gives the merged model's tokens and the adapter folder's fingerprint.
    super::support::pipeline::easy_countdown(&w, None, 4, "prompts.parquet");
    let prompts = w.path("prompts.parquet");
    let p = prompts.to_str().unwrap();
    run_in(
        &w,
        &away,
        &[
            "merge-lora",
            "--model",
            base_str,
            "--adapter",
            a_str,
            "-o",
            "merged",
        ],
    );
    // `--base` stays an alias of merge-lora's --model.
    run_in(
        &w,
        &away,
        &[
            "merge-lora",
            "--base",
            base_str,
            "--adapter",
            a_str,
            "-o",
            "merged2",
        ],
    );
    let gen = |model: &[&str], out: &str| {
        let mut args = vec!["--seed", "7", "generate-answers"];
        args.extend_from_slice(model);
        args.extend_from_slice(&[
            "--input",
            p,
            "-o",
            out,
            "--num-answers",
            "2",
            "--max-new-tokens",
            "12",
            "--temperature",
            "1.0",
        ]);
        run_in(&w, &away, &args);
        let b = super::support::table::read(&away.join(out));
        let ids = super::support::table::lists_i32(&b, "response_ids");
        let meta = rlcr::table::Reader::open(&away.join(out))
            .unwrap()
            .metadata()
            .clone();
        let cfg: serde_json::Value = serde_json::from_str(&meta["rlcr.config"]).unwrap();
        (ids, cfg)
    };
    let (with_flag, cfg_flag) = gen(&["--model", base_str, "--adapter", a_str], "flag.parquet");
    let (merged, _) = gen(&["--model", "merged"], "merged.parquet");
    let (as_model, cfg_dir) = gen(&["--model", a_str], "dir.parquet");
    let (plain, _) = gen(&["--model", base_str], "base.parquet");
    assert_eq!(with_flag, merged, "--adapter vs merge-lora's model");
    assert_eq!(
        with_flag, as_model,
        "--adapter vs the adapter folder as --model"
    );
    assert_ne!(with_flag, plain, "the adapter changes nothing sampled");
    assert_eq!(cfg_flag["adapter"], a_str);
    assert_eq!(cfg_flag["model_fingerprint"], cfg_dir["model_fingerprint"]);
    // An adapter folder as --model and --adapter together is a mistake, named.
    let o = w
        .cmd(&[
            "logprobs",
            "--model",
            a_str,
            "--adapter",
            a_str,
            "--input",
            t,
            "-o",
            "x.parquet",
        ])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("is an adapter folder; with --adapter give the base"),
        "{e}"
    );

    // PEFT from elsewhere, offline: the recorded base is found without the Hub.
    let Some(theirs) = peft_in(Some(&away), &[Path::new("logprobs"), &table, &base, &a]) else {
        return;
    };
    let theirs: Vec<Vec<f64>> = serde_json::from_value(theirs[0]["logprobs"].clone()).unwrap();
    let gap = max_gap(&here, &theirs);
    assert!(gap <= 1e-4, "PeftModel: rlcr and PEFT differ by {gap}");
    let auto = peft_in(
        Some(&away),
        &[
            Path::new("auto-logprobs"),
            &table,
            Path::new("../../proj/runs/a"),
        ],
    )
    .unwrap();
    assert_eq!(auto[0]["base"], recorded);
    let theirs: Vec<Vec<f64>> = serde_json::from_value(auto[0]["logprobs"].clone()).unwrap();
    let gap = max_gap(&here, &theirs);
    eprintln!("AutoPeftModelForCausalLM from elsewhere: |rlcr - peft| <= {gap:.2e}");
    assert!(
        gap <= 1e-4,
        "AutoPeftModelForCausalLM: rlcr and PEFT differ by {gap}"
    );
}
