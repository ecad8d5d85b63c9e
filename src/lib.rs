//! rlcr: reinforcement learning with calibration rewards for Hugging Face language models.
//!
//! The toolkit is a set of independent stages over Parquet trajectory tables (see `README.md` and `docs/`):
//! `prepare` → `generate-answers` → `generate-confidence` → `score` → `advantage` → `update`, with
//! `probe`, `report` and `logprobs` beside them. Every stage is a subcommand of the `rlcr` binary;
//! this library holds everything they do, and knows nothing about the command line except the
//! `cli` module, which parses flags, reads tables, calls the library and writes tables.
//!
//! Module map:
//! - [`child`]: a long-lived `sh -c` child speaking lines (external verifier, environment).
//! - [`fs`]: atomic files and folders, stale-temp cleanup (used by every writer).
//! - [`hash`]: the fixed hashes of the file formats (FNV-1a, SplitMix64): shards, fingerprints, splits.
//! - [`table`]: schemas, Parquet I/O, metadata, validation.
//! - [`model`]: Llama/Qwen2 decoder in burn, weights, tokenizer, chat template, GGUF import.
//! - [`sample`]: batched sampling with a KV cache and per-sample seeded RNG.
//! - [`reward`]: verifiers, parsers, Brier, structured rewards.
//! - [`advantage`]: advantage estimators (pure math).
//! - [`train`]: log-probs, losses, optimizer, checkpoints.
//! - [`logprobs`]: the `logprobs` stage (a model's log-probs of a table's responses, added as a
//!   column) around [`model::logprobs`].
//! - [`prepare`]: the prompts tables (dataset readers, synthetic countdown tasks and splits).
//! - [`probe`], [`report`]: faithfulness probe; calibration metrics and plots.
//! - [`tensorboard`]: TensorBoard event files (training and report scalars).
//! - [`alloc`]: allocator settings applied at startup (freed tensor buffers stay in the process).
//! - [`switches`]: every `RLCR_*` environment variable, read once, typed and documented.

pub mod advantage;
pub mod alloc;
pub mod child;
pub mod cli;
pub mod fs;
pub mod hash;
pub mod logprobs;
pub mod model;
pub mod prepare;
pub mod probe;
pub mod progress;
pub mod report;
pub mod reward;
pub mod sample;
pub mod switches;
pub mod table;
pub mod tensorboard;
pub mod trace;
pub mod train;

/// The crate version, written into every output's `rlcr.version` metadata key.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
