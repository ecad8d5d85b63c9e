//! Fuzz target `parquet`: see [`harness::parquet`] (shared with the regression tests).
#![no_main]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::parquet(data));
