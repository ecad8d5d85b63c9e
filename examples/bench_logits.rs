//! Host-side cost of one sampling decision over a 49152-entry vocabulary (SmolLM2's): the draw
//! (temperature, filters, inverse CDF) and the behaviour log-prob.
//!
//! ```text
//! cargo run --example bench_logits
//! ```
use std::time::Instant;

use rlcr::sample::logits::{logsumexp, Processor, SamplingParams};

fn main() {
    let v = 49_152;
    let logits: Vec<f32> = (0..v)
        .map(|i| ((i * 7919 % 1000) as f32) / 100.0 - 5.0)
        .collect();
    let n = 200;
    for (name, p) in [
        ("T=1", SamplingParams::default()),
        (
            "T=0.7 top_p=0.9",
            SamplingParams {
                temperature: 0.7,
                top_p: 0.9,
                ..Default::default()
            },
        ),
        (
            "T=0.7 top_k=50",
            SamplingParams {
                temperature: 0.7,
                top_k: 50,
                ..Default::default()
            },
        ),
        ("greedy", SamplingParams::greedy()),
    ] {
        let mut pr = Processor::new();
        let t = Instant::now();
        let mut acc = 0u64;
        for i in 0..n {
            acc += pr
                .choose_with_logprob(&logits, v, &p, (i as f64 + 0.5) / n as f64)
                .0 as u64;
        }
        let choose = t.elapsed().as_secs_f64() / n as f64;
        let t = Instant::now();
        let mut s = 0.0;
        for _ in 0..n {
            s += logsumexp(&logits);
        }
        let lse = t.elapsed().as_secs_f64() / n as f64;
        println!(
            "{name}: token + behaviour log-prob {:.0} µs (a separate logsumexp: {:.0} µs) [{acc} {s:.1}]",
            choose * 1e6,
            lse * 1e6
        );
    }
}
