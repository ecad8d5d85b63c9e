//! `rlcr merge-lora`: fold a LoRA adapter into its base model and write a full model folder.
use std::path::PathBuf;

use anyhow::Result;

use super::common::Global;
use crate::model::lora::merge::{self, MergePlan};

pub const ABOUT: &str =
    "Merge a LoRA adapter (PEFT's layout) into its base model; write a full Hugging Face folder";
pub const LONG_ABOUT: &str = "\
Write W + scaling·B·A for every adapted projection (scaling = lora_alpha / r, or lora_alpha / √r
with use_rslora), every tensor in the base checkpoint's dtype, with the base's config, tokenizer
and chat template: the folder PEFT's merge_and_unload() + save_pretrained() writes, which
transformers, vLLM and every rlcr stage load as a plain model.

Not needed to sample: every stage that reads a model accepts an adapter folder as --model and
merges it in memory at load. Merge to hand the model to a tool that does not read adapters, or to
start full fine-tuning from it.

Reads: an adapter folder (adapter_config.json + adapter_model.safetensors, written by
`rlcr update/sft --lora-rank` or by PEFT) and its base: the model folder given with --model, else
the adapter's base_model_name_or_path (rlcr writes it as an absolute path; a relative one is
looked up from the working directory, then from the adapter folder and its ancestors).
--model and --adapter are the flags every stage that reads a model takes.
Writes: OUT (atomically). Costs: the base's weights in f32 in memory.
Example:
  rlcr merge-lora --adapter runs/x/iter-0003/model -o merged/
  rlcr merge-lora --model fixtures/tiny-qwen2 --adapter runs/x/iter-0003/model -o merged/";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Adapter folder (adapter_config.json, adapter_model.safetensors).
    #[arg(long, value_name = "DIR")]
    pub adapter: PathBuf,
    /// Base model folder [default: the adapter's base_model_name_or_path].
    #[arg(long, alias = "base", value_name = "BASE")]
    pub model: Option<PathBuf>,
    /// Output model folder.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
}

pub fn run(_g: &Global, a: Args) -> Result<()> {
    let plan = MergePlan::new(&a.adapter, a.model.as_deref(), &a.out)?;
    merge::run(&plan)?;
    crate::info!(
        "merged {} into {} -> {}",
        plan.adapter.display(),
        plan.base.display(),
        plan.out.display()
    );
    Ok(())
}
