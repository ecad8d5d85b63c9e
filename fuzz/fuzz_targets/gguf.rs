//! Fuzz target `gguf`: see [`harness::gguf`] (shared with the regression tests).
#![no_main]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::gguf(data));
