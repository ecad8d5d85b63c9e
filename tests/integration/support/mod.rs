//! Helpers shared by the integration tests: [`table`] (read, write and edit tables) and
//! [`pipeline`] (the `prepare → generate-answers` start most tests share).
pub mod pipeline;
pub mod table;
