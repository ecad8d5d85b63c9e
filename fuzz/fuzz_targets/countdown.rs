//! Fuzz target `countdown`: see [`harness::countdown`] (shared with the regression tests).
#![no_main]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::countdown(data));
