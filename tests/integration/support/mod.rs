//! Helpers shared by the integration tests: [`table`] (read, write and edit tables) and
//! [`pipeline`] (the `prepare → generate-answers` start most tests share), [`kb`] (the multi-turn
//! tests' environment, prompts and turn-reward scoring), [`rlmk`] (`make -f scripts/rl.mk`),
//! [`python`] (the Python checkers, skipped or required by one rule), [`train`] (trainer settings),
//! [`json`] (reference figures and rlcr's JSON outputs).
pub mod json;
pub mod kb;
pub mod pipeline;
pub mod python;
pub mod rlmk;
pub mod table;
pub mod train;
