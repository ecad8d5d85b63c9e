//! The matrix products of one forward + backward of the 38.9M Qwen2 config (8 × 256 tokens) on
//! burn's Flex backend, i.e. the gemm crate (burn-flex calls `gemm::gemm` with rayon
//! parallelism), each timed alone: where training time goes, and how fast the gemm is on this
//! machine. `scripts/bench_transformers.py gemm` times the same products with torch.
//!
//! ```text
//! cargo run --example bench_gemm -- [REPS]
//! ```
//! Every shape is run forward (`X·W`), as the input gradient (`dY·Wᵀ`, a transposed view) and as
//! the weight gradient (`Xᵀ·dY`), the way burn's autodiff computes them. Prints one
//! `RESULT gemm_<name> <GFLOP/s wall> <GFLOP per CPU-second>` line per product and the totals.
//!
//! `GEMM=rlcr` times rlcr's packed kernel (`rlcr::model::sgemm`, what training and prefill use on
//! Flex) on the same products instead of burn's matmul (`GEMM=burn`, the default: the gemm
//! crate); `GEMM=bf16` times the bf16 mode's product (`rlcr_kernels::bf16`: both operands
//! rounded to bf16, then VDPBF16PS with f32 sums, or the f32 kernel on widened operands on CPUs
//! without avx512_bf16); `SHAPES=smollm2` takes SmolLM2-135M's projections (8 × 512 rows) instead.
use std::time::Instant;

use burn::tensor::{Device, Tensor, TensorData};
use rlcr::model::sgemm::{self, View};

/// On-CPU seconds of every thread of this process (rayon workers included).
fn cpu_secs() -> f64 {
    let mut ns = 0u64;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) {
                ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(0);
            }
        }
    }
    ns as f64 * 1e-9
}

/// One timed matrix product.
type Product<'a> = Box<dyn Fn() -> usize + 'a>;

fn host(t: &Tensor<2>) -> Vec<f32> {
    t.clone()
        .into_data()
        .try_into_vec::<f32>()
        .expect("f32 tensor")
}

fn rand(shape: [usize; 2], dev: &Device) -> Tensor<2> {
    let n = shape[0] * shape[1];
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 % 1000) as f32) * 1e-3 - 0.5)
        .collect();
    Tensor::from_data(TensorData::new(v, shape), dev)
}

fn main() {
    rlcr::alloc::retain_freed_memory();
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let dev = Device::flex();
    let ours = std::env::var("GEMM").is_ok_and(|v| v == "rlcr");
    let bf16 = std::env::var("GEMM").is_ok_and(|v| v == "bf16");
    let smol = std::env::var("SHAPES").is_ok_and(|v| v == "smollm2");
    // (name, in, out, uses per forward): the 38.9M Qwen2 config, or SmolLM2-135M's.
    let (n, shapes) = if smol {
        (
            8 * 512,
            vec![
                ("qkv", 576usize, 960usize, 30usize),
                ("o", 576, 576, 30),
                ("gate_up", 576, 3072, 30),
                ("down", 1536, 576, 30),
                ("lm_head", 576, 49152, 1),
            ],
        )
    } else {
        (
            8 * 256,
            vec![
                ("qkv", 512usize, 768usize, 8usize),
                ("o", 512, 512, 8),
                ("gate_up", 512, 2816, 8),
                ("down", 1408, 512, 8),
                ("lm_head", 512, 32000, 1),
            ],
        )
    };
    let (mut total_flop, mut total_wall, mut total_cpu) = (0f64, 0f64, 0f64);
    for (name, i, o, uses) in shapes {
        let x = rand([n, i], &dev);
        let w = rand([i, o], &dev);
        let dy = rand([n, o], &dev);
        let flop = 2.0 * (n * i * o) as f64;
        let (xh, wh, dyh) = (host(&x), host(&w), host(&dy));
        let isa = rlcr::model::cpu::isa();
        let sg = |m: usize, nn: usize, k: usize, a: View<'_>, b: View<'_>| {
            let mut c = vec![0f32; m * nn];
            assert!(sgemm::sgemm(m, nn, k, a, b, &mut c, isa), "no kernel");
            c
        };
        // bf16: both operands rounded (timed: training rounds them per product) and multiplied by
        // rlcr_kernels::bf16::gemm (VDPBF16PS where the CPU has avx512_bf16).
        let bg = |m: usize, nn: usize, k: usize, a: View<'_>, b: View<'_>, ta: bool, tb: bool| {
            let round = |v: &View<'_>| {
                let mut h = vec![0u16; v.data.len()];
                rlcr_kernels::bf16::round_slice(v.data, &mut h);
                h
            };
            let (ah, bh) = (round(&a), round(&b));
            let (av, bv) = (
                View::rows(&ah, a.rs.max(a.cs)),
                View::rows(&bh, b.rs.max(b.cs)),
            );
            let (av, bv) = (if ta { av.t() } else { av }, if tb { bv.t() } else { bv });
            let mut c = vec![0f32; m * nn];
            assert!(
                rlcr_kernels::bf16::gemm(m, nn, k, av, bv, &mut c, isa),
                "no kernel"
            );
            c
        };
        let products: [(&str, Product<'_>); 3] = if bf16 {
            [
                (
                    "fwd",
                    Box::new(|| {
                        bg(
                            n,
                            o,
                            i,
                            View::rows(&xh, i),
                            View::rows(&wh, o),
                            false,
                            false,
                        )
                        .len()
                    }),
                ),
                (
                    "dx",
                    Box::new(|| {
                        bg(
                            n,
                            i,
                            o,
                            View::rows(&dyh, o),
                            View::rows(&wh, o),
                            false,
                            true,
                        )
                        .len()
                    }),
                ),
                (
                    "dw",
                    Box::new(|| {
                        bg(
                            i,
                            o,
                            n,
                            View::rows(&xh, i),
                            View::rows(&dyh, o),
                            true,
                            false,
                        )
                        .len()
                    }),
                ),
            ]
        } else if ours {
            [
                (
                    "fwd",
                    Box::new(|| sg(n, o, i, View::rows(&xh, i), View::rows(&wh, o)).len()),
                ),
                (
                    "dx",
                    Box::new(|| sg(n, i, o, View::rows(&dyh, o), View::rows(&wh, o).t()).len()),
                ),
                (
                    "dw",
                    Box::new(|| sg(i, o, n, View::rows(&xh, i).t(), View::rows(&dyh, o)).len()),
                ),
            ]
        } else {
            [
                (
                    "fwd",
                    Box::new(|| x.clone().matmul(w.clone()).into_data().num_elements()),
                ),
                (
                    "dx",
                    Box::new(|| {
                        dy.clone()
                            .matmul(w.clone().transpose())
                            .into_data()
                            .num_elements()
                    }),
                ),
                (
                    "dw",
                    Box::new(|| {
                        x.clone()
                            .transpose()
                            .matmul(dy.clone())
                            .into_data()
                            .num_elements()
                    }),
                ),
            ]
        };
        for (kind, f) in products {
            let _ = f(); // warm-up
            let (w0, c0) = (Instant::now(), cpu_secs());
            for _ in 0..reps {
                let _ = f();
            }
            let wall = w0.elapsed().as_secs_f64() / reps as f64;
            let cpu = (cpu_secs() - c0) / reps as f64;
            println!(
                "RESULT gemm_{name}_{kind} {:.2} {:.2}   # [{}x{}x{}] {:.1} ms wall {:.1} ms cpu",
                flop / wall * 1e-9,
                flop / cpu * 1e-9,
                n,
                i,
                o,
                wall * 1e3,
                cpu * 1e3
            );
            total_flop += flop * uses as f64;
            total_wall += wall * uses as f64;
            total_cpu += cpu * uses as f64;
        }
    }
    println!(
        "RESULT gemm_all_fwd_bwd {:.2} {:.2}   # every product of one forward+backward: {:.0} GFLOP, \
         {:.2} s wall, {:.2} s cpu",
        total_flop / total_wall * 1e-9,
        total_flop / total_cpu * 1e-9,
        total_flop * 1e-9,
        total_wall,
        total_cpu
    );
}
