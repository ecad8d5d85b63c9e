//! Micro-benchmark of the tensor operations in one decode step (CPU time, not wall time, so a
//! busy machine does not distort the figures).
use std::time::Instant;

use burn::tensor::{Device, Tensor, TensorData};

fn cpu_secs() -> f64 {
    // Sum of on-CPU nanoseconds of every thread of this process (rayon workers included).
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

fn time<F: FnMut()>(name: &str, reps: usize, mut f: F) {
    f();
    let (c0, w0) = (cpu_secs(), Instant::now());
    for _ in 0..reps {
        f();
    }
    let c = (cpu_secs() - c0) / reps as f64 * 1e3;
    let w = w0.elapsed().as_secs_f64() / reps as f64 * 1e3;
    println!("{name:50} cpu {c:8.3} ms   wall {w:8.3} ms");
}

fn rand(shape: [usize; 2], dev: &Device) -> Tensor<2> {
    let n = shape[0] * shape[1];
    let v: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1000) as f32) * 1e-4).collect();
    Tensor::from_data(TensorData::new(v, shape), dev)
}

fn main() {
    rlcr::alloc::retain_freed_memory();
    let dev = Device::flex();
    if std::env::args().any(|a| a == "head") {
        let head = rand([576, 49152], &dev);
        let x8 = rand([8, 576], &dev);
        for (name, prec) in [
            ("f32", rlcr::model::cpu::PackPrecision::F32),
            ("bf16", rlcr::model::cpu::PackPrecision::Bf16Rounded),
        ] {
            let p = rlcr::model::cpu::PackedMatrix::pack(&head, prec).unwrap();
            for _ in 0..3 {
                time(
                    &format!("packed {name} x[8,576] @ W[576,49152]"),
                    20,
                    || {
                        let _ = rlcr::model::cpu::packed_matmul(&x8, &head, &p)
                            .unwrap()
                            .into_data();
                    },
                );
            }
        }
        return;
    }
    bandwidth();
    let x = rand([8, 576], &dev);
    for (o, i) in [(3072usize, 576usize), (576, 1536), (960, 576), (49152, 576)] {
        let w_hf = rand([o, i], &dev); // [out, in]
        let w_t = rand([i, o], &dev); // [in, out]
        let xi = rand([8, i], &dev);
        time(
            &format!("x[8,{i}] @ W[{o},{i}]^T (HF layout view)"),
            200,
            || {
                let y = xi.clone().matmul(w_hf.clone().transpose());
                let _ = y.into_data();
            },
        );
        time(&format!("x[8,{i}] @ W[{i},{o}] (row-major)"), 200, || {
            let y = xi.clone().matmul(w_t.clone());
            let _ = y.into_data();
        });
        time(
            &format!("rlcr small_matmul x[8,{i}] W[{i},{o}]"),
            200,
            || {
                let y = rlcr::model::cpu::small_matmul(&xi, &w_t).unwrap();
                let _ = y.into_data();
            },
        );
        time(
            &format!("(W[{i},{o}]^T x^T)^T (row-major, transposed product)"),
            200,
            || {
                let y = w_t
                    .clone()
                    .transpose()
                    .matmul(xi.clone().transpose())
                    .transpose();
                let _ = y.into_data();
            },
        );
    }
    // gemm against the packed kernel as the number of rows grows.
    let w = rand([576, 3072], &dev);
    let p = rlcr::model::cpu::PackedMatrix::pack(&w, rlcr::model::cpu::PackPrecision::F32).unwrap();
    let pb = rlcr::model::cpu::PackedMatrix::pack(&w, rlcr::model::cpu::PackPrecision::Bf16Rounded)
        .unwrap();
    for m in [8usize, 16, 32, 64] {
        let xm = rand([m, 576], &dev);
        time(&format!("gemm   x[{m},576] @ W[576,3072]"), 100, || {
            let _ = xm.clone().matmul(w.clone()).into_data();
        });
        time(&format!("packed x[{m},576] @ W[576,3072]"), 100, || {
            let _ = rlcr::model::cpu::packed_matmul(&xm, &w, &p)
                .unwrap()
                .into_data();
        });
        time(
            &format!("packed bf16 x[{m},576] @ W[576,3072]"),
            100,
            || {
                let _ = rlcr::model::cpu::packed_matmul(&xm, &w, &pb)
                    .unwrap()
                    .into_data();
            },
        );
    }
    let xb = rand([1024, 576], &dev);
    let w = rand([3072, 576], &dev);
    time("x[1024,576] @ W[3072,576]^T (prefill)", 5, || {
        let _ = xb.clone().matmul(w.clone().transpose()).into_data();
    });
    let wt = rand([576, 3072], &dev);
    time("x[1024,576] @ W[576,3072] (prefill row-major)", 5, || {
        let _ = xb.clone().matmul(wt.clone()).into_data();
    });
    time("elementwise x*x [8,576] x100", 5, || {
        let mut y = x.clone();
        for _ in 0..100 {
            y = y.clone() * x.clone();
        }
        let _ = y.into_data();
    });
    time("into_data [8,576] x100", 5, || {
        for _ in 0..100 {
            let _ = x.clone().into_data();
        }
    });
}

#[allow(dead_code)]
pub fn bandwidth() {
    let v: Vec<f32> = (0..(113usize << 18)).map(|i| (i % 7) as f32).collect();
    let (c0, w0) = (cpu_secs(), Instant::now());
    let mut total = 0.0f32;
    for _ in 0..10 {
        let mut acc = [0f32; 16];
        for c in v.chunks_exact(16) {
            for j in 0..16 {
                acc[j] += c[j];
            }
        }
        total += acc.iter().sum::<f32>();
    }
    let c = cpu_secs() - c0;
    let w = w0.elapsed().as_secs_f64();
    let (c0, w0) = (cpu_secs(), Instant::now());
    let mut total2 = 0.0f32;
    for _ in 0..10 {
        use rayon::prelude::*;
        total2 += v
            .par_chunks(1 << 20)
            .map(|ch| {
                let mut acc = [0f32; 16];
                for c in ch.chunks_exact(16) {
                    for j in 0..16 {
                        acc[j] += c[j];
                    }
                }
                acc.iter().sum::<f32>()
            })
            .sum::<f32>();
    }
    println!(
        "stream-read 113MB x10 (rayon): {total2} cpu {:.1} GB/s wall {:.1} GB/s",
        1.185 / (cpu_secs() - c0) * 10.0 / 10.0,
        1.185 / w0.elapsed().as_secs_f64()
    );
    println!(
        "stream-read 113MB x10 (1 thread): {total} cpu {:.1} GB/s wall {:.1} GB/s",
        1.185 / c * 10.0 / 10.0,
        1.185 / w
    );
}
