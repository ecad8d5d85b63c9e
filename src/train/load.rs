//! Loading the model a training stage trains: the policy of `update`, the model of `sft`.
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::model::lora::{self, LoraSpec};
use crate::model::{weights::Storage, AdapterUse, Model};
use crate::usage::as_usage;
use crate::UsageError;

/// The LoRA settings of a training call as given (PEFT's names; `None`: not given, PEFT's
/// default applies).
#[derive(Debug, Clone, Default)]
pub struct LoraRequest {
    /// Rank of a fresh adapter; `None` trains every weight (or continues a given adapter).
    pub rank: Option<usize>,
    /// lora_alpha [default: 8, PEFT's].
    pub alpha: Option<f64>,
    /// Dropout on the adapter's input [default: 0].
    pub dropout: Option<f64>,
    /// Adapted projections, comma-separated, or all-linear [default: all-linear].
    pub target: Option<String>,
    /// Scale by alpha / sqrt(r) instead of alpha / r.
    pub rslora: bool,
}

impl LoraRequest {
    /// The checked settings for training the model folder `base` with the adapter folder
    /// `adapter` (if any); `base` is recorded as a fresh adapter's base_model_name_or_path. Bad
    /// values, and a fresh adapter's settings without a rank, are usage errors.
    pub fn resolve(&self, base: &Path, adapter: Option<PathBuf>) -> Result<TrainLora> {
        let Some(r) = self.rank else {
            if self.alpha.is_some() || self.target.is_some() || self.rslora {
                return Err(UsageError(
                    "--lora-alpha, --lora-target and --lora-rslora need --lora-rank".into(),
                )
                .into());
            }
            return Ok(TrainLora {
                adapter,
                spec: None,
                dropout: self.dropout,
            });
        };
        let targets = lora::parse_targets(self.target.as_deref().unwrap_or("all-linear"))
            .map_err(as_usage)?;
        let spec = LoraSpec {
            r,
            alpha: self.alpha.unwrap_or(8.0),
            dropout: self.dropout.unwrap_or(0.0),
            targets,
            rslora: self.rslora,
            base: Some(base.display().to_string()),
        };
        spec.validate().map_err(as_usage)?;
        Ok(TrainLora {
            adapter,
            spec: Some(spec),
            dropout: self.dropout,
        })
    }
}

/// How the trained model takes LoRA: an adapter folder to continue, a fresh adapter to add, a
/// new dropout for the adapter.
#[derive(Debug, Clone, Default)]
pub struct TrainLora {
    /// Adapter folder applied to the model folder and trained further.
    pub adapter: Option<PathBuf>,
    /// A fresh adapter's settings (checked).
    pub spec: Option<LoraSpec>,
    /// Dropout to set on the adapter, fresh or continued.
    pub dropout: Option<f64>,
}

impl TrainLora {
    /// Load the model folder `dir` to train on `device` (an autodiff device) through
    /// [`trainable`].
    pub fn load(&self, dir: &Path, device: &burn::tensor::Device, seed: u64) -> Result<Model> {
        trainable(
            dir,
            self.adapter.as_deref(),
            self.spec.clone(),
            self.dropout,
            device,
            seed,
        )
    }
}

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
                    return Err(UsageError(format!(
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
            return Err(UsageError(format!(
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
            .map_err(|e| UsageError(format!("{e:#}")))?;
        for l in m.transformer.layers.iter_mut() {
            if let Some(x) = l.lora.as_mut() {
                x.dropout = p;
            }
        }
    }
    Ok(m)
}
