//! The GGUF reader on arbitrary bytes: parse, plan the import (hyperparameters, tokenizer,
//! tensor names and shapes) and dequantize every tensor. Errors are fine; panics, overflows and
//! huge allocations are bugs.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rlcr::model::gguf::{self, GgufFile};

fuzz_target!(|data: &[u8]| {
    let Ok(g) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for t in g.tensors() {
        let Ok(bytes) = g.tensor_bytes(t) else {
            continue;
        };
        // bounded by the input size: the reader checked that the data lies inside the file
        let _ = gguf::dequantize(t.ggml_type, bytes, t.n_elements);
    }
    let Ok(plan) = gguf::import::Plan::new(&g) else {
        return;
    };
    for t in &plan.tensors {
        let _ = gguf::import::materialize(&g, t);
    }
    let mut json = Vec::new();
    let _ = plan.tokenizer.write_tokenizer_json(&mut json);
});
