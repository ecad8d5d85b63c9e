//! Loading the model a training stage trains: the policy of `update`, the model of `sft`.
use std::fmt;
use std::path::Path;

use anyhow::Result;

use crate::model::lora::LoraSpec;
use crate::model::{weights::Storage, AdapterUse, Model};

/// A LoRA setting the model on disk cannot honour (a fresh adapter's settings on an adapter that
/// differs, a dropout without any adapter): a wrong flag, not a broken file.
#[derive(Debug)]
pub struct FlagConflict(pub String);

impl fmt::Display for FlagConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FlagConflict {}

/// Load the model to train on `device` (an autodiff device): an adapter (`--adapter`, or an
/// adapter folder as `--model`) is kept separate and trainable (the flags, when given, must
/// agree with it; --lora-dropout may change); a model folder gets a fresh adapter when
/// --lora-rank is given.
pub fn trainable(
    dir: &Path,
    adapter: Option<&Path>,
    spec: Option<LoraSpec>,
    lora_dropout: Option<f64>,
    device: &burn::tensor::Device,
    seed: u64,
) -> Result<Model> {
    let mut m = match (&spec, adapter) {
        // The base is frozen under a fresh adapter: bf16 matrices stay bf16.
        (Some(_), None) => {
            Model::open_with(dir, None, device, AdapterUse::Train, Storage::AsStored)?
        }
        _ => Model::open(dir, adapter, device, AdapterUse::Train)?,
    };
    let Some(have) = m.adapter.as_mut() else {
        return match spec {
            Some(spec) => m.add_adapter(spec, seed),
            None => {
                if let Some(p) = lora_dropout {
                    return Err(FlagConflict(format!(
                        "--lora-dropout {p} needs --lora-rank (or an adapter: --adapter, or \
                         an adapter folder as --model)"
                    ))
                    .into());
                }
                Ok(m)
            }
        };
    };
    if let Some(want) = spec {
        let same = want.r == have.spec.r
            && want.alpha == have.spec.alpha
            && want.targets == have.spec.targets
            && want.rslora == have.spec.rslora;
        if !same {
            return Err(FlagConflict(format!(
                "{} is an adapter with r = {}, alpha = {}, targets {:?}, rslora {}; \
                 the --lora-* flags ask for another (leave them out to continue it)",
                adapter.unwrap_or(dir).display(),
                have.spec.r,
                have.spec.alpha,
                have.spec.targets,
                have.spec.rslora
            ))
            .into());
        }
    }
    if let Some(p) = lora_dropout {
        have.spec.dropout = p;
        have.spec
            .validate()
            .map_err(|e| FlagConflict(format!("{e:#}")))?;
        for l in m.transformer.layers.iter_mut() {
            if let Some(x) = l.lora.as_mut() {
                x.dropout = p;
            }
        }
    }
    Ok(m)
}
