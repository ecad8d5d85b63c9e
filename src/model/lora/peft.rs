//! Adapter folders in PEFT's layout: `adapter_config.json` (read strictly, written as PEFT
//! writes it) and `adapter_model.safetensors` (f32, PEFT names `[r, in]` / `[out, r]`), and the
//! base model an adapter names (`base_model_name_or_path`), found from any working directory.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use super::{export, LoraSpec, Target, CONFIG_FILE, WEIGHTS_FILE};
use crate::model::config::ModelConfig;
use crate::model::transformer::Transformer;
use crate::model::weights::{self, HostTensor};

impl LoraSpec {
    /// PEFT's `adapter_config.json` for this adapter.
    pub fn to_peft_json(&self) -> Value {
        let targets: Vec<&str> = self.targets.iter().map(|t| t.name()).collect();
        json!({
            "alpha_pattern": {},
            "auto_mapping": null,
            "base_model_name_or_path": self.base,
            "bias": "none",
            "exclude_modules": null,
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "layer_replication": null,
            "layers_pattern": null,
            "layers_to_transform": null,
            "lora_alpha": self.alpha,
            "lora_bias": false,
            "lora_dropout": self.dropout,
            "modules_to_save": null,
            "peft_type": "LORA",
            "r": self.r,
            "rank_pattern": {},
            "revision": null,
            "target_modules": targets,
            "task_type": "CAUSAL_LM",
            "use_dora": false,
            "use_rslora": self.rslora,
        })
    }

    /// Read PEFT's `adapter_config.json` text (`file` names it in errors). Settings that change
    /// the function and that this implementation does not compute are refused by name.
    pub fn from_peft_json(text: &str, file: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text).with_context(|| format!("parsing {file}"))?;
        let o = v
            .as_object()
            .with_context(|| format!("{file}: not a JSON object"))?;
        let get = |k: &str| o.get(k).filter(|x| !x.is_null());
        match get("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            other => bail!("{file}: peft_type {other:?} is not supported (only \"LORA\")"),
        }
        let r = get("r")
            .and_then(Value::as_u64)
            .with_context(|| format!("{file}: `r` must be a positive integer"))?
            as usize;
        let num = |k: &str, default: f64| -> Result<f64> {
            match get(k) {
                None => Ok(default),
                Some(x) => x
                    .as_f64()
                    .with_context(|| format!("{file}: `{k}` must be a number, got {x}")),
            }
        };
        let flag = |k: &str| get(k).and_then(Value::as_bool).unwrap_or(false);
        let alpha = num("lora_alpha", 8.0)?;
        let dropout = num("lora_dropout", 0.0)?;
        let targets = match get("target_modules") {
            Some(Value::String(s)) if s == "all-linear" => Target::ALL.to_vec(),
            Some(Value::Array(a)) => {
                let mut set = BTreeSet::new();
                for t in a {
                    let s = t
                        .as_str()
                        .with_context(|| format!("{file}: target_modules holds {t}"))?;
                    set.insert(s.parse::<Target>().with_context(|| file.to_string())?);
                }
                set.into_iter().collect()
            }
            other => bail!(
                "{file}: target_modules {other:?} is not supported (a list of q_proj, k_proj, \
                 v_proj, o_proj, gate_proj, up_proj, down_proj, or \"all-linear\")"
            ),
        };
        for k in ["use_dora", "fan_in_fan_out", "lora_bias", "use_qalora"] {
            ensure!(!flag(k), "{file}: `{k}: true` is not supported");
        }
        if let Some(b) = get("bias").and_then(Value::as_str) {
            ensure!(
                b == "none",
                "{file}: bias \"{b}\" is not supported (only \"none\")"
            );
        }
        for k in ["rank_pattern", "alpha_pattern"] {
            if let Some(m) = get(k) {
                ensure!(
                    m.as_object().is_none_or(|m| m.is_empty()),
                    "{file}: a non-empty `{k}` (per-module ranks or alphas) is not supported"
                );
            }
        }
        for k in [
            "layers_to_transform",
            "layers_pattern",
            "modules_to_save",
            "exclude_modules",
            "layer_replication",
            "target_parameters",
            "trainable_token_indices",
        ] {
            if let Some(x) = get(k) {
                let empty = x.as_array().is_some_and(|a| a.is_empty());
                ensure!(empty, "{file}: `{k}` = {x} is not supported");
            }
        }
        let spec = LoraSpec {
            r,
            alpha,
            dropout,
            targets,
            rslora: flag("use_rslora"),
            base: get("base_model_name_or_path")
                .and_then(Value::as_str)
                .map(str::to_string),
        };
        spec.validate().with_context(|| file.to_string())?;
        Ok(spec)
    }
}

/// Whether `dir` is an adapter folder (has `adapter_config.json`).
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).is_file()
}

/// Read an adapter folder's `adapter_config.json`.
pub fn read_config(dir: &Path) -> Result<LoraSpec> {
    let cp = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&cp).with_context(|| format!("reading {}", cp.display()))?;
    LoraSpec::from_peft_json(&text, &cp.display().to_string())
}

/// Read an adapter folder: its configuration and its tensors (f32 on the host, PEFT names).
pub fn read_adapter(dir: &Path) -> Result<(LoraSpec, BTreeMap<String, HostTensor>)> {
    let spec = read_config(dir)?;
    let wp = dir.join(WEIGHTS_FILE);
    ensure!(
        wp.is_file(),
        "{}: no {WEIGHTS_FILE} (PyTorch adapter_model.bin files are not supported; save the \
         adapter with safe_serialization=True)",
        dir.display()
    );
    let tensors = weights::read_safetensors_file(&wp)?;
    Ok((spec, tensors))
}

/// The base model folder of an adapter folder, from its `base_model_name_or_path`:
/// - an absolute path (what [`save_adapter`] writes) is taken as it is;
/// - a relative one is tried, in order, relative to the working directory (how transformers and
///   PEFT take it), then relative to the adapter folder and to each of its ancestors, nearest
///   first. An adapter whose base was recorded relative to the directory it was written from
///   (PEFT's `save_pretrained` after `from_pretrained("ckpt/sft")`) thus loads from any working
///   directory as long as that directory is an ancestor of the adapter folder, which is where
///   a run's checkpoints live.
///
/// The first candidate holding a `config.json` wins; none is an error naming every path tried
/// and the `--model BASE --adapter DIR` form that needs no lookup.
pub fn resolve_base(adapter: &Path, spec: &LoraSpec) -> Result<PathBuf> {
    let Some(base) = spec.base.as_deref() else {
        bail!(
            "{}: base_model_name_or_path is not set; give the base model folder with --model \
             and the adapter with --adapter",
            adapter.join(CONFIG_FILE).display()
        );
    };
    let candidates = base_candidates(adapter, Path::new(base));
    for c in &candidates {
        if c.join("config.json").is_file() {
            return Ok(c.clone());
        }
    }
    let tried: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    bail!(
        "{}: the base model `{base}` is not a model folder here (tried {}); give it with --model \
         BASE --adapter {}",
        adapter.join(CONFIG_FILE).display(),
        tried.join(", "),
        adapter.display()
    )
}

/// The folders [`resolve_base`] tries for the recorded base `p`, in order, without repeats.
fn base_candidates(adapter: &Path, p: &Path) -> Vec<PathBuf> {
    if p.is_absolute() {
        return vec![p.to_path_buf()];
    }
    let mut out = vec![p.to_path_buf()];
    // The adapter's real location, so that `..` and a relative --model both climb correctly.
    let here = adapter
        .canonicalize()
        .unwrap_or_else(|_| normalize(adapter));
    for dir in here.ancestors() {
        let c = normalize(&dir.join(p));
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// The `base_model_name_or_path` an adapter on the base folder `base` records: its canonical
/// absolute path (symlinks resolved). PEFT's `AutoPeftModelForCausalLM` and transformers take a
/// relative path relative to the working directory, and offline they then look for a Hub
/// repository of that name; an absolute path loads the base from any working directory, in
/// rlcr and in PEFT. A base that moves afterwards is given with `--model BASE --adapter DIR`.
pub fn recorded_base(base: &Path) -> Result<String> {
    let abs = base
        .canonicalize()
        .with_context(|| format!("resolving the base model folder {}", base.display()))?;
    abs.to_str().map(str::to_string).with_context(|| {
        format!(
            "the base model folder {} is not valid UTF-8; PEFT's adapter_config.json cannot \
             record it",
            abs.display()
        )
    })
}

/// `p` with `x/..` pairs and `.` removed (lexically; a path through a symlinked folder keeps
/// working as long as its `..` are not crossed).
pub fn normalize(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            c => out.push(c.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// `(base folder, adapter folder)` of a `--model` / `--adapter` pair: an explicit adapter on
/// the base `model`; else `model` itself when it is an adapter folder (its base resolved with
/// [`resolve_base`]); else no adapter.
pub fn resolve(model: &Path, adapter: Option<&Path>) -> Result<(PathBuf, Option<PathBuf>)> {
    match adapter {
        Some(a) => {
            ensure!(
                !is_adapter_dir(model),
                "--model {} is an adapter folder; with --adapter give the base model folder",
                model.display()
            );
            ensure!(
                is_adapter_dir(a),
                "--adapter {}: no {CONFIG_FILE} in it",
                a.display()
            );
            Ok((model.to_path_buf(), Some(a.to_path_buf())))
        }
        None if is_adapter_dir(model) => {
            let spec = read_config(model)?;
            Ok((resolve_base(model, &spec)?, Some(model.to_path_buf())))
        }
        None => Ok((model.to_path_buf(), None)),
    }
}

/// Check the adapter's tensors against the model's shapes: the error lists every missing,
/// unknown and mis-shaped tensor.
pub fn check_tensors(
    c: &ModelConfig,
    spec: &LoraSpec,
    tensors: &BTreeMap<String, HostTensor>,
    file: &str,
) -> Result<()> {
    match weights::mismatch(&spec.expected_tensors(c), tensors, |_| false) {
        None => Ok(()),
        Some(m) => bail!(
            "{file}: the adapter does not fit the base model (r = {}){m}",
            spec.r
        ),
    }
}

/// [`read_adapter`] and [`check_tensors`] against the model `c`: the adapter folder's
/// configuration and tensors, known to fit.
pub fn read_checked(
    dir: &Path,
    c: &ModelConfig,
) -> Result<(LoraSpec, BTreeMap<String, HostTensor>)> {
    let (spec, tensors) = read_adapter(dir)?;
    let file = dir.join(WEIGHTS_FILE).display().to_string();
    check_tensors(c, &spec, &tensors, &file)?;
    Ok((spec, tensors))
}

/// Write an adapter folder's two files into `dir` (which exists): the config and the tensors
/// (f32, PEFT names and layouts).
pub fn write_adapter_files(
    dir: &Path,
    spec: &LoraSpec,
    tensors: &[(String, HostTensor)],
) -> Result<()> {
    let cp = dir.join(CONFIG_FILE);
    let text = serde_json::to_string_pretty(&spec.to_peft_json())? + "\n";
    std::fs::write(&cp, text).with_context(|| format!("writing {}", cp.display()))?;
    weights::write_safetensors_file(&dir.join(WEIGHTS_FILE), tensors)
}

/// Save the adapter of `model` as an adapter folder at `out` (atomic): the two PEFT files and
/// the tokenizer and chat-template files of the base folder `base` (as TRL saves them; the base's
/// `config.json` is not copied, so the folder is not mistaken for a full model). The config
/// records `base` as [`recorded_base`] writes it (whatever `spec.base` says), so the folder
/// loads from any working directory.
pub fn save_adapter(model: &Transformer, spec: &LoraSpec, base: &Path, out: &Path) -> Result<()> {
    let tensors = export(model)?;
    let spec = LoraSpec {
        base: Some(recorded_base(base)?),
        ..spec.clone()
    };
    crate::fs::write_folder(out, |tmp| {
        write_adapter_files(tmp, &spec, &tensors)?;
        for name in weights::COPIED_FILES {
            let from = base.join(name);
            if from.is_file() && !matches!(*name, "config.json" | "generation_config.json") {
                std::fs::copy(&from, tmp.join(name))
                    .with_context(|| format!("copying {}", from.display()))?;
            }
        }
        Ok(())
    })
    .with_context(|| format!("saving the adapter to {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::super::parse_targets;
    use super::*;

    #[test]
    fn peft_config_round_trips_and_refuses_what_it_cannot_compute() {
        let spec = LoraSpec {
            r: 4,
            alpha: 16.0,
            dropout: 0.05,
            targets: parse_targets("v_proj,q_proj,down_proj").unwrap(),
            rslora: false,
            base: Some("fixtures/tiny-llama".into()),
        };
        assert_eq!(spec.targets, vec![Target::Q, Target::V, Target::Down]);
        assert_eq!(spec.scaling(), 4.0);
        let text = spec.to_peft_json().to_string();
        assert_eq!(LoraSpec::from_peft_json(&text, "x").unwrap(), spec);
        let mut v = spec.to_peft_json();
        v["use_rslora"] = true.into();
        let rs = LoraSpec::from_peft_json(&v.to_string(), "x").unwrap();
        assert_eq!(rs.scaling(), 8.0);
        for (k, bad) in [
            ("use_dora", json!(true)),
            ("bias", json!("all")),
            ("rank_pattern", json!({"q_proj": 2})),
            ("layers_to_transform", json!([0])),
            ("modules_to_save", json!(["lm_head"])),
            ("peft_type", json!("IA3")),
            ("target_modules", json!(".*proj")),
            ("target_modules", json!(["q_proj", "fc1"])),
            ("r", json!(0)),
        ] {
            let mut v = spec.to_peft_json();
            v[k] = bad.clone();
            let e = LoraSpec::from_peft_json(&v.to_string(), "cfg.json").unwrap_err();
            assert!(format!("{e:#}").contains("cfg.json"), "{k}: {e:#}");
        }
        assert_eq!(parse_targets("all-linear").unwrap().len(), 7);
        assert!(parse_targets("q_proj,qkv").is_err());
    }

    /// The base an adapter records is found from any working directory: an absolute path as it
    /// is, a relative one (adapters written elsewhere) next to the adapter folder or one of its
    /// ancestors, nearest first; a base found nowhere names every path tried.
    #[test]
    fn adapter_base_resolves_from_any_working_directory() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        let base = root.join("ckpt/sft");
        let adapter = root.join("runs/x/iter-0001/model");
        for f in [&base, &adapter] {
            std::fs::create_dir_all(f).unwrap();
        }
        std::fs::write(base.join("config.json"), "{}").unwrap();
        let spec = |b: &str| LoraSpec {
            r: 2,
            alpha: 8.0,
            dropout: 0.0,
            targets: vec![Target::Q],
            rslora: false,
            base: Some(b.into()),
        };
        // What save_adapter records: absolute and canonical, through a relative spelling.
        let written = recorded_base(&root.join("runs/../ckpt/./sft")).unwrap();
        assert_eq!(Path::new(&written), base);
        assert_eq!(resolve_base(&adapter, &spec(&written)).unwrap(), base);
        // Recorded relative to the directory the adapter was written from (an ancestor).
        assert_eq!(resolve_base(&adapter, &spec("ckpt/sft")).unwrap(), base);
        // The nearest ancestor wins.
        let near = root.join("runs/ckpt/sft");
        std::fs::create_dir_all(&near).unwrap();
        std::fs::write(near.join("config.json"), "{}").unwrap();
        assert_eq!(resolve_base(&adapter, &spec("ckpt/sft")).unwrap(), near);
        let e = format!(
            "{:#}",
            resolve_base(&adapter, &spec("nowhere/base")).unwrap_err()
        );
        assert!(e.contains("--model BASE --adapter"), "{e}");
        assert!(
            e.contains(&root.join("runs/nowhere/base").display().to_string()),
            "{e}"
        );
        let e = format!(
            "{:#}",
            resolve_base(&adapter, &spec("/no/such/base")).unwrap_err()
        );
        assert!(e.contains("(tried /no/such/base)"), "{e}");
        assert!(recorded_base(&root.join("missing")).is_err());
    }
}
