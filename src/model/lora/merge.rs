//! `merge-lora`'s engine: `W ← W + s·B·A` on the host for every adapted projection, and the
//! full model folder written from it (the folder PEFT's `merge_and_unload()` +
//! `save_pretrained()` writes). Sampling stages merge the same way at load
//! ([`merged_checkpoint`]), so a merged folder and an adapter folder sample the same tokens.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};

use super::{peft, LoraSpec, CONFIG_FILE};
use crate::model::config::ModelConfig;
use crate::model::weights::{self, HostTensor};

/// `W ← W + s·B·A` for every adapted projection of the base tensors `base` (Hugging Face names
/// and layouts, f32 on the host; dtypes kept). `ΔW = B·A` is formed one output row at a time in
/// f32 and scaled before it is added, as PEFT's `merge`.
pub fn merge_into(
    base: &mut BTreeMap<String, HostTensor>,
    c: &ModelConfig,
    spec: &LoraSpec,
    adapter: &BTreeMap<String, HostTensor>,
) -> Result<()> {
    let s = spec.scaling() as f32;
    let r = spec.r;
    for l in 0..c.num_hidden_layers {
        for &t in &spec.targets {
            let (an, bn) = t.peft_names(l);
            let (i, o) = t.shape(c);
            let a = &adapter
                .get(&an)
                .with_context(|| format!("missing {an}"))?
                .data;
            let b = &adapter
                .get(&bn)
                .with_context(|| format!("missing {bn}"))?
                .data;
            let wn = t.weight_name(l);
            let w = base
                .get_mut(&wn)
                .with_context(|| format!("the base model has no `{wn}`"))?;
            ensure!(
                w.shape == [o, i] && a.len() == r * i && b.len() == o * r,
                "`{wn}`: shape {:?} does not fit the adapter's [{o}, {i}]",
                w.shape
            );
            let mut row = vec![0f32; i];
            for oo in 0..o {
                row.fill(0.0);
                for k in 0..r {
                    let coef = b[oo * r + k];
                    let ak = &a[k * i..(k + 1) * i];
                    for (x, &y) in row.iter_mut().zip(ak) {
                        *x += coef * y;
                    }
                }
                for (x, &d) in w.data[oo * i..(oo + 1) * i].iter_mut().zip(&row) {
                    *x += d * s;
                }
            }
        }
    }
    Ok(())
}

/// The base checkpoint in `dir` (tensors of model `c`, checked) with the adapter `spec` / `adapter`
/// merged in: what a model folder holding the merged weights would load.
pub fn merged_checkpoint(
    dir: &Path,
    c: &ModelConfig,
    spec: &LoraSpec,
    adapter: &BTreeMap<String, HostTensor>,
) -> Result<BTreeMap<String, HostTensor>> {
    let mut tensors = weights::read_checkpoint(dir)?;
    weights::check_tensors(c, &tensors)
        .with_context(|| format!("loading weights from {}", dir.display()))?;
    merge_into(&mut tensors, c, spec, adapter)?;
    Ok(tensors)
}

/// What `merge-lora` merges and where it writes: the base folder, the adapter folder and the
/// output folder, resolved and checked.
#[derive(Debug, Clone)]
pub struct MergePlan {
    pub base: PathBuf,
    pub adapter: PathBuf,
    pub out: PathBuf,
}

impl MergePlan {
    /// The plan for the adapter folder `adapter` on the base `model` (else the base the adapter
    /// records, [`peft::resolve_base`]), written to `out`, which must be neither input.
    pub fn new(adapter: &Path, model: Option<&Path>, out: &Path) -> Result<Self> {
        let (base, found) = match model {
            Some(b) => peft::resolve(b, Some(adapter))?,
            None => peft::resolve(adapter, None)?,
        };
        let Some(adapter) = found else {
            anyhow::bail!("--adapter {}: no {CONFIG_FILE} in it", adapter.display());
        };
        crate::fs::check_distinct(&[&base, &adapter], out)?;
        Ok(MergePlan {
            base,
            adapter,
            out: out.to_path_buf(),
        })
    }
}

/// Write the full model folder base + adapter at `plan.out` (atomic; every tensor in the base's
/// dtype, in the checkpoint's own order; the base's config, tokenizer and template files copied).
pub fn run(plan: &MergePlan) -> Result<()> {
    let (base, adapter, out) = (&plan.base, &plan.adapter, &plan.out);
    let c = ModelConfig::load(base)?;
    let (spec, at) = peft::read_checked(adapter, &c)?;
    let mut tensors = merged_checkpoint(base, &c, &spec, &at)?;
    // The checkpoint's own order (embedding, layers, norm, head), then anything tolerated.
    let mut ordered = Vec::with_capacity(tensors.len());
    for (n, _) in weights::expected_tensors(&c) {
        if let Some(t) = tensors.remove(&n) {
            ordered.push((n, t));
        }
    }
    ordered.extend(tensors);
    crate::fs::write_folder(out, |tmp| {
        weights::write_safetensors(tmp, &ordered, weights::MAX_SHARD_BYTES)?;
        weights::copy_side_files(base, tmp)
    })
    .with_context(|| format!("writing the merged model {}", out.display()))
}
