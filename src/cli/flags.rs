//! Flag groups shared by the stages, defined once and flattened (`#[command(flatten)]`) into
//! each stage's `Args`: the input and output tables, the model folder, the sampling settings,
//! the verifier choice, the optimizer and the critic of `update`. Their help is generic; each stage's long help says what it reads and
//! writes.
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use super::common::{as_usage, Global, UsageError};
use crate::model::sgemm::Precision;
use crate::model::ChatOptions;
use crate::reward::rows::CountdownCompat;
use crate::reward::VerifierChoice;
use crate::sample::logits::SamplingParams;
use crate::sample::stage::{ModelJob, SamplingPlan};
use crate::table::Shard;
use crate::train::critic::{CriticConfig, CriticPlan};
use crate::train::load::{LoraRequest, TrainLora};
use crate::train::loss::LossAgg;
use crate::train::optim::AdamWConfig;
use crate::train::schedule::{Schedule, ScheduleKind};
use crate::train::session::ResumeMode;
use crate::train::stage::TrainJob;
use crate::train::trainer::{Objective, TrainConfig};

/// `--input` and `-o/--out` of a stage that reads a table and writes another.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct TableIo {
    /// Input table (a Parquet file or a folder of part files).
    #[arg(long)]
    pub input: PathBuf,
    /// Output table (written atomically; never one of the inputs).
    #[arg(short = 'o', long)]
    pub out: PathBuf,
}

/// `--model` and `--adapter` of a stage that runs the policy.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelFolder {
    /// Hugging Face model folder (config.json, *.safetensors, tokenizer.json), or a LoRA adapter
    /// folder whose base_model_name_or_path names its base.
    #[arg(long)]
    pub model: PathBuf,
    /// LoRA adapter folder (PEFT's layout: adapter_config.json, adapter_model.safetensors) to
    /// apply to the base model --model, whatever base the adapter records: merged at load to
    /// sample or score, kept separate and trained further by update and sft.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
}

/// How a stage that renders prompts applies the chat template.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ChatArgs {
    /// Jinja chat template file used instead of the model folder's (its special tokens are
    /// kept).
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Extra variables for the chat template, as transformers' `apply_chat_template(**kwargs)`:
    /// `key=value` pairs with JSON values, comma-separated, or a JSON object; repeatable. Qwen3:
    /// `enable_thinking=false` starts the answer with an empty `<think>` block.
    #[arg(long, value_name = "K=V,...")]
    pub chat_template_kwargs: Vec<String>,
}

impl ChatArgs {
    /// The validated options (a malformed kwarg is a usage error).
    pub fn options(&self) -> Result<ChatOptions> {
        let kwargs = ChatOptions::parse_kwargs(&self.chat_template_kwargs)
            .map_err(|e| UsageError(format!("--chat-template-kwargs: {e:#}")))?;
        Ok(ChatOptions {
            template: self.chat_template.clone(),
            kwargs,
        })
    }
}

/// The model folder, chat template and table flags of a stage that runs the model over a table,
/// in this order in every such stage's help.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelTable {
    #[command(flatten)]
    pub model: ModelFolder,
    #[command(flatten)]
    pub chat: ChatArgs,
    #[command(flatten)]
    pub io: TableIo,
}

impl ModelTable {
    /// The shared part of the stage's plan (the chat flags checked).
    pub fn job(&self, g: &Global, shard: Option<Shard>) -> Result<ModelJob> {
        Ok(ModelJob {
            chat: self.chat.options()?,
            model: self.model.model.clone(),
            adapter: self.model.adapter.clone(),
            device: g.device,
            input: self.io.input.clone(),
            out: self.io.out.clone(),
            shard,
            seed: g.seed,
            argv: g.argv.clone(),
        })
    }
}

/// The sampling flags and the shard of a stage that samples the model over a table, one row group
/// per prompt (`generate-answers`, `generate-confidence`), after the stage's own flags in its help.
#[derive(clap::Args, Debug, Clone)]
pub struct SampledShard {
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Only the prompts of shard I of N (`--shard 0/4`), split by prompt_id.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
}

impl SampledShard {
    /// The shared part of the stage's plan (the model and table flags of `stage`) and its
    /// sampling plan.
    pub fn job(&self, g: &Global, stage: &ModelTable) -> Result<(ModelJob, SamplingPlan)> {
        Ok((stage.job(g, self.shard)?, self.sampling.plan()))
    }
}

/// How the next token is drawn from the logits: the flags of every stage that samples
/// (`generate-*`, `probe`).
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct LogitsArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens with total probability >= P (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Drop tokens whose probability is below P times the most likely one's (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
}

impl LogitsArgs {
    /// The logits settings.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
        }
    }
}

/// Sampling settings shared by the generation stages.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct SamplingArgs {
    /// Maximum number of new tokens per response.
    #[arg(long, default_value_t = 512)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    #[serde(flatten)]
    pub logits: LogitsArgs,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Extra stop strings (the response ends after the first one).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Text the assistant turn starts with (e.g. `<think>`): written after the generation prompt
    /// and recorded as a partial assistant message in `messages`; the response continues it.
    #[arg(long)]
    pub response_prefix: Option<String>,
}

impl SamplingArgs {
    /// The logits settings.
    pub fn params(&self) -> SamplingParams {
        self.logits.params()
    }

    /// The library's sampling plan (the ranges are checked when the policy is loaded).
    pub fn plan(&self) -> SamplingPlan {
        SamplingPlan {
            params: self.params(),
            max_new_tokens: self.max_new_tokens,
            batch_size: self.batch_size,
            stop: self.stop.clone(),
            response_prefix: self.response_prefix.clone(),
        }
    }
}

/// The verifier flags of the stages that verify answers (`score`, `probe`). Unset, `score` uses
/// the defaults written in the help and `probe` the settings `score` recorded in its input.
#[derive(clap::Args, Debug, Clone)]
pub struct VerifierArgs {
    /// Verifier; auto picks by data_source [default: auto].
    #[arg(long, value_enum)]
    pub verifier: Option<VerifierChoice>,
    /// External verifier command (run with `sh -c`) speaking JSON lines on stdin/stdout; replaces
    /// the built-in verifiers.
    #[arg(long)]
    pub verifier_cmd: Option<String>,
    /// Seconds the external verifier may take to send its next reply [default: 60].
    #[arg(long)]
    pub verifier_timeout: Option<f64>,
    /// How countdown answers are read: default (response only) or tinyzero (TinyZero's
    /// compute_score on prompt + response) [default: default].
    #[arg(long, value_enum)]
    pub countdown_compat: Option<CountdownCompat>,
}

impl VerifierArgs {
    /// The timeout given, checked: a positive number of seconds (usage error otherwise).
    pub fn timeout(&self) -> Result<Option<f64>> {
        crate::reward::rows::verifier_timeout(self.verifier_timeout)
    }
}

/// Optimizer, schedule and checkpoint flags shared by `update` and `sft`.
#[derive(clap::Args, Debug, Clone)]
pub struct OptimArgs {
    /// Rows per micro-batch (one forward/backward; gradients are accumulated over the update batch).
    #[arg(long, default_value_t = 4)]
    pub micro_batch: usize,
    /// Passes over the table.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Max global gradient norm (PyTorch clip_grad_norm_); 0 or inf turns clipping off.
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f64,
    /// Warmup: steps, or a fraction of --total-steps when below 1.
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Learning-rate shape after warmup.
    #[arg(long, value_enum, default_value_t = ScheduleKind::Constant)]
    pub schedule: ScheduleKind,
    /// Optimizer steps of the whole run (all iterations); needed by linear/cosine schedules.
    #[arg(long)]
    pub total_steps: Option<u64>,
    /// AdamW β₁.
    #[arg(long, default_value_t = 0.9)]
    pub beta1: f64,
    /// AdamW β₂.
    #[arg(long, default_value_t = 0.999)]
    pub beta2: f64,
    /// AdamW ε.
    #[arg(long, default_value_t = 1e-8)]
    pub adam_eps: f64,
    /// Decoupled weight decay.
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Loss aggregation over the update batch.
    #[arg(long, value_enum, default_value_t = LossAgg::TokenMean)]
    pub loss_agg: LossAgg,
    /// L_max of seq-mean-token-sum-norm (default: the longest response of the table).
    #[arg(long)]
    pub agg_len: Option<usize>,
    /// Shuffle the rows before each epoch (with --seed).
    #[arg(long)]
    pub shuffle: bool,
    /// Continue the optimizer state and step counter saved in the --model folder
    /// (`--resume` = yes; `auto` resumes when there is a state).
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "yes", default_value_t = ResumeMode::No)]
    pub resume: ResumeMode,
    /// Precision of the matrix products of forward and backward: f32, or bf16 (operands
    /// rounded to bfloat16, products summed in f32, as torch's autocast; weights, gradients
    /// and optimizer state stay f32, and the checkpoint is written in the dtypes it was read
    /// in). On the CPU bf16 runs on VDPBF16PS where the CPU has avx512_bf16 and works
    /// everywhere else (slower there than f32); CUDA runs bf16 matmuls; wgpu has no bf16
    /// arithmetic (an error).
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    pub precision: Precision,
    /// Activation checkpointing: keep only each decoder layer's input in the forward pass and
    /// recompute the layer during backward. Same gradients; the activation memory of one layer
    /// instead of all of them, for one more forward pass (BENCHMARKS.md has the measured trade).
    #[arg(long)]
    pub checkpoint_activations: bool,
    /// TensorBoard run folder that also receives this call's steps as they happen (one event
    /// file per call, named by its first global step, so the calls of a resumed run continue
    /// one curve). NEW_DIR/runs/STAGE gets the whole run's events either way.
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
}

impl OptimArgs {
    /// The AdamW configuration.
    pub fn adamw(&self) -> AdamWConfig {
        AdamWConfig {
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.adam_eps,
            weight_decay: self.weight_decay,
        }
    }

    /// The resolved loop configuration (`--agg-len` unset: 1 here, the stage puts the table's
    /// longest response in its place). Flag errors are usage errors (exit code 2).
    pub fn train_config(
        &self,
        objective: Objective,
        lr: f64,
        mini_batches: usize,
        temperature: f64,
        seed: u64,
    ) -> Result<TrainConfig> {
        let cfg = TrainConfig {
            objective,
            loss_agg: self.loss_agg,
            agg_len: self.agg_len.unwrap_or(1),
            schedule: Schedule::new(lr, self.warmup, self.schedule, self.total_steps)
                .map_err(as_usage)?,
            grad_clip: self.grad_clip,
            micro_batch: self.micro_batch,
            mini_batches,
            epochs: self.epochs,
            temperature,
            shuffle: self.shuffle,
            seed,
            precision: self.precision,
            checkpoint_activations: self.checkpoint_activations,
        };
        cfg.validate().map_err(as_usage)?;
        self.adamw().validate().map_err(as_usage)?;
        Ok(cfg)
    }

    /// The part of an `update` or `sft` plan these flags and the model, table and output give:
    /// the loop configuration `train`, the adapter settings `lora`, and the trainer state's
    /// `config` as [`OptimArgs::record`] starts it (the stage adds its own flags).
    #[allow(clippy::too_many_arguments)]
    pub fn job(
        &self,
        g: &Global,
        m: &ModelFolder,
        lora: TrainLora,
        input: &Path,
        out: &Path,
        lr: f64,
        train: TrainConfig,
    ) -> TrainJob {
        TrainJob {
            model: m.model.clone(),
            lora,
            input: input.to_path_buf(),
            out: out.to_path_buf(),
            train,
            agg_len: self.agg_len,
            adamw: self.adamw(),
            resume: self.resume,
            tensorboard: self.tensorboard.clone(),
            device: g.device,
            seed: g.seed,
            config: self.record(g, m, input, lr),
        }
    }

    /// What `update` and `sft` record of a call in the trainer state's `config`, before the
    /// stage's own flags.
    pub fn record(&self, g: &Global, m: &ModelFolder, input: &Path, lr: f64) -> serde_json::Value {
        serde_json::json!({
            "model": m.model,
            "adapter": m.adapter,
            "input": input,
            "lr": lr,
            "adamw": self.adamw(),
            "resume": self.resume,
            "tensorboard": self.tensorboard,
            "device": g.device,
            "seed": g.seed,
            "argv": g.argv,
        })
    }
}

/// The LoRA flags of `update` and `sft` (PEFT's names and defaults).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LoraArgs {
    /// Train a LoRA adapter of rank R instead of every weight: the base weights stay frozen (no
    /// gradients, no optimizer state) and the output is an adapter folder in PEFT's layout
    /// (adapter_config.json, adapter_model.safetensors). An adapter given with --adapter, or as
    /// --model, is always continued (then these flags may be left out).
    #[arg(long, value_name = "R")]
    pub lora_rank: Option<usize>,
    /// lora_alpha: the adapter's output is scaled by alpha / R [default: 8, PEFT's].
    #[arg(long, value_name = "A", allow_negative_numbers = true)]
    pub lora_alpha: Option<f64>,
    /// Dropout probability on the adapter's input, training only [default: 0].
    #[arg(long, value_name = "P")]
    pub lora_dropout: Option<f64>,
    /// Adapted projections: a comma-separated list of q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj, or all-linear [default: all-linear; PEFT's own default for Llama and
    /// Qwen2 is q_proj,v_proj].
    #[arg(long, value_name = "LIST")]
    pub lora_target: Option<String>,
    /// rsLoRA: scale by alpha / sqrt(R) instead of alpha / R.
    #[arg(long)]
    pub lora_rslora: bool,
}

impl LoraArgs {
    /// The checked LoRA settings of training `m` (usage errors).
    pub fn resolve(&self, m: &ModelFolder) -> Result<TrainLora> {
        let request = LoraRequest {
            rank: self.lora_rank,
            alpha: self.lora_alpha,
            dropout: self.lora_dropout,
            target: self.lora_target.clone(),
            rslora: self.lora_rslora,
        };
        request.resolve(&m.model, m.adapter.clone())
    }
}

/// The critic flags of `rlcr update`.
#[derive(clap::Args, Debug, Clone)]
pub struct CriticArgs {
    /// Also train this critic (critic, policy or LoRA adapter folder) on the table's
    /// values/returns/loss_mask with verl's clipped value loss; needs --critic-out.
    #[arg(long, requires = "critic_out")]
    pub critic: Option<PathBuf>,
    /// Output folder of the trained critic.
    #[arg(long, requires = "critic")]
    pub critic_out: Option<PathBuf>,
    /// Weight of the value loss (scales the critic's gradient before clipping).
    #[arg(long, default_value_t = 1.0)]
    pub vf_coef: f64,
    /// verl's critic.cliprange_value: predictions move at most this far from the old values
    /// before the clipped term takes over.
    #[arg(long, default_value_t = 0.5)]
    pub cliprange_value: f64,
    /// Learning rate of the critic (verl: 1e-5).
    #[arg(long, default_value_t = 1e-5)]
    pub critic_lr: f64,
}

impl CriticArgs {
    /// The critic's training after the policy's (same epochs, mini-batches, micro-batch, grad
    /// clip, loss aggregation and AdamW settings as the policy's update), if asked for.
    pub fn plan(
        &self,
        g: &Global,
        input: &Path,
        o: &OptimArgs,
        mini_batches: usize,
    ) -> Option<CriticPlan> {
        let (Some(dir), Some(out)) = (&self.critic, &self.critic_out) else {
            return None;
        };
        Some(CriticPlan {
            critic: dir.clone(),
            input: input.to_path_buf(),
            out: out.clone(),
            cfg: CriticConfig {
                vf_coef: self.vf_coef,
                cliprange_value: self.cliprange_value,
                loss_agg: o.loss_agg,
                agg_len: o.agg_len.unwrap_or(0),
                lr: self.critic_lr,
                grad_clip: o.grad_clip,
                micro_batch: o.micro_batch,
                mini_batches,
                epochs: o.epochs,
                adam: o.adamw(),
                precision: o.precision,
            },
            device: g.device,
        })
    }
}
