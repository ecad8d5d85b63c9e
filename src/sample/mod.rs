//! Sampling: turning a model and contexts into responses, token by token, reproducibly.
//!
//! The pure half (no model) is a set of small modules over plain slices:
//! - [`logits`]: temperature / top-k / top-p / min-p / greedy, and the behaviour log-prob
//!   (log-softmax at temperature 1; see the module for why);
//! - [`rng`]: one ChaCha20 stream per sample, derived from (seed, prompt_id, answer_idx,
//!   confidence_idx), so results do not depend on batch size, order or threads;
//! - [`stop`]: EOS / stop strings / max-new-tokens, and the incremental detokeniser whose
//!   per-token offsets locate tags;
//! - [`spans`]: answer and confidence spans from tag positions to token indices;
//! - [`prompts`]: the default RLCR instructions of the two turns.
//!
//! Over a model:
//! - [`sampler`]: the batched sampler (prefill once per shared context, expand, decode with a KV
//!   cache, rows leave the batch as they finish), written against the small [`StepModel`] trait;
//! - [`draw`]: the same draw as [`logits`] with tensor ops on the model's device (GPU backends:
//!   a decode step reads back only the sampled ids and their log-probs);
//! - [`fingerprint`]: the model fingerprint recorded in the tables' metadata;
//! - [`multiturn`]: multi-turn rollouts against an [`env`]ironment process (information tokens,
//!   turn ids, per-turn rewards), run as a stage by [`multiturn_stage`];
//! - the stage engines behind clap-free plans: [`answer_stage`] (`generate-answers`),
//!   [`confidence_stage`] (`generate-confidence`), with what they share in [`stage`].
pub mod answer_stage;
pub mod confidence_stage;
pub mod draw;
pub mod env;
pub mod fingerprint;
pub mod logits;
pub mod multiturn;
pub mod multiturn_stage;
pub mod policy;
pub mod prompts;
pub mod rng;
pub mod sampler;
pub mod spans;
pub mod stage;
pub mod stop;

pub use logits::{logprob_of, Processor, SamplingParams};
pub use prompts::{Message, DEFAULT_CONFIDENCE_PROMPT, DEFAULT_SYSTEM_PROMPT};
pub use rng::{sample_rng, uniform, SampleKey};
pub use sampler::{generate, GenConfig, Generated, Group, SampleId, StepModel};
pub use spans::{answer_span, confidence_span, Span};
pub use stop::{Detokenizer, FinishReason, StopCriteria};
