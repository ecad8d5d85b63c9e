//! The machine's roofline: measured f32 FMA peak (512- and 256-bit registers), bf16 dot-product
//! peak (`VDPBF16PS`, where the CPU has `avx512_bf16`) and memory bandwidth (copy and triad), on
//! THREADS threads (default: all cores). `scripts/bench.sh` runs it at the start of every run
//! and gives every figure also as a fraction of these bounds.
//!
//! ```text
//! cargo run --release --example bench_peak            # PEAK lines on stdout
//! THREADS=1 cargo run --release --example bench_peak
//! ```
//!
//! Output lines: `PEAK <name> <value> <unit>   # note`, names `f32_fma_zmm`, `f32_fma_ymm`,
//! `bf16_dot_zmm` (GFLOP/s; one FMA = 2 FLOP, one `VDPBF16PS` lane = 2 products = 4 FLOP),
//! `bw_copy`, `bw_triad` (GB/s, STREAM's convention: bytes read + bytes written, write-allocate
//! traffic not counted), `bw_read` (GB/s read by a sum over one array: what a decode step that
//! streams its weights can reach), and `flags` (the CPU's SIMD flags).
//!
//! Method: each thread runs 24 (zmm) or 14 (ymm) independent accumulator chains in inline
//! assembly for a fixed number of iterations; best of 5 runs.
//! Bandwidth: 3 arrays of 64 Mi f32 (256 MiB each, far above any cache), split over the threads,
//! best of 5 passes after a warm-up pass that faults the pages in.
use std::time::Instant;

fn threads() -> usize {
    std::env::var("THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// On-CPU nanoseconds of the calling thread (`/proc/thread-self/schedstat`; 0 where unreadable).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0)
}

/// Best wall time of `reps` runs of `f` on `t` threads at once, and the smallest per-thread CPU
/// time of any run (the time a thread actually ran: a shared machine's load stretches the wall
/// time but not this, so `work / cpu` is the per-core rate whatever the neighbours do).
fn best_parallel(t: usize, reps: usize, f: impl Fn(usize) + Sync) -> (f64, f64) {
    let (mut wall, mut cpu) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps {
        let start = Instant::now();
        let per_thread: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..t)
                .map(|i| {
                    let f = &f;
                    s.spawn(move || {
                        let c0 = thread_cpu_ns();
                        f(i);
                        thread_cpu_ns().saturating_sub(c0)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        wall = wall.min(start.elapsed().as_secs_f64());
        let longest = per_thread.into_iter().max().unwrap_or(0) as f64 * 1e-9;
        if longest > 0.0 {
            cpu = cpu.min(longest);
        }
    }
    (wall, cpu)
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    //! Inline assembly, so the compiler cannot reorder, spill or rotate the chains: every loop
    //! iteration is exactly CHAINS independent instructions plus the loop counter.
    use std::arch::asm;

    /// Independent accumulator chains per thread on 512-bit registers (zmm0–zmm23; zmm30/31 hold
    /// the operands). 12 chains reached half the rate of 24 on a Xeon.
    pub const ZMM_CHAINS: usize = 24;
    /// On 256-bit registers (an AVX2 CPU has 16: ymm0–ymm13 accumulate, ymm14/15 are operands).
    pub const YMM_CHAINS: usize = 14;

    macro_rules! zmm_loop {
        ($iters:expr, $ins:literal) => {
            asm!(
                "2:",
                concat!($ins, " zmm0, zmm30, zmm31"), concat!($ins, " zmm1, zmm30, zmm31"),
                concat!($ins, " zmm2, zmm30, zmm31"), concat!($ins, " zmm3, zmm30, zmm31"),
                concat!($ins, " zmm4, zmm30, zmm31"), concat!($ins, " zmm5, zmm30, zmm31"),
                concat!($ins, " zmm6, zmm30, zmm31"), concat!($ins, " zmm7, zmm30, zmm31"),
                concat!($ins, " zmm8, zmm30, zmm31"), concat!($ins, " zmm9, zmm30, zmm31"),
                concat!($ins, " zmm10, zmm30, zmm31"), concat!($ins, " zmm11, zmm30, zmm31"),
                concat!($ins, " zmm12, zmm30, zmm31"), concat!($ins, " zmm13, zmm30, zmm31"),
                concat!($ins, " zmm14, zmm30, zmm31"), concat!($ins, " zmm15, zmm30, zmm31"),
                concat!($ins, " zmm16, zmm30, zmm31"), concat!($ins, " zmm17, zmm30, zmm31"),
                concat!($ins, " zmm18, zmm30, zmm31"), concat!($ins, " zmm19, zmm30, zmm31"),
                concat!($ins, " zmm20, zmm30, zmm31"), concat!($ins, " zmm21, zmm30, zmm31"),
                concat!($ins, " zmm22, zmm30, zmm31"), concat!($ins, " zmm23, zmm30, zmm31"),
                "dec {n}",
                "jnz 2b",
                n = inout(reg) $iters => _,
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
                out("zmm30") _, out("zmm31") _,
                options(nostack, nomem),
            )
        };
    }

    /// `iters × CHAINS` FMAs on 512-bit registers (`vfmadd231ps zmm`).
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma_zmm(iters: usize) {
        // SAFETY: registers declared clobbered; avx512f promised by the caller.
        unsafe { zmm_loop!(iters, "vfmadd231ps") }
    }

    /// `iters × CHAINS` FMAs on 256-bit registers (`vfmadd231ps ymm`).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma_ymm(iters: usize) {
        // SAFETY: registers declared clobbered; avx2 + fma promised by the caller.
        unsafe {
            asm!(
                "2:",
                "vfmadd231ps ymm0, ymm14, ymm15", "vfmadd231ps ymm1, ymm14, ymm15",
                "vfmadd231ps ymm2, ymm14, ymm15", "vfmadd231ps ymm3, ymm14, ymm15",
                "vfmadd231ps ymm4, ymm14, ymm15", "vfmadd231ps ymm5, ymm14, ymm15",
                "vfmadd231ps ymm6, ymm14, ymm15", "vfmadd231ps ymm7, ymm14, ymm15",
                "vfmadd231ps ymm8, ymm14, ymm15", "vfmadd231ps ymm9, ymm14, ymm15",
                "vfmadd231ps ymm10, ymm14, ymm15", "vfmadd231ps ymm11, ymm14, ymm15",
                "vfmadd231ps ymm12, ymm14, ymm15", "vfmadd231ps ymm13, ymm14, ymm15",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) iters => _,
                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
                out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
                options(nostack, nomem),
            )
        }
    }

    /// `iters × CHAINS` `vdpbf16ps zmm` (32 bf16 products summed pairwise into 16 f32 lanes).
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX512_BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn dot_bf16(iters: usize) {
        // SAFETY: registers declared clobbered; avx512bf16 promised by the caller.
        unsafe { zmm_loop!(iters, "vdpbf16ps") }
    }
}

fn main() {
    let t = threads();
    let flags: Vec<&str> = {
        #[cfg(target_arch = "x86_64")]
        {
            [
                ("avx2", std::arch::is_x86_feature_detected!("avx2")),
                ("fma", std::arch::is_x86_feature_detected!("fma")),
                ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
                ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
                ("avx512vl", std::arch::is_x86_feature_detected!("avx512vl")),
                (
                    "avx512vnni",
                    std::arch::is_x86_feature_detected!("avx512vnni"),
                ),
                (
                    "avx512bf16",
                    std::arch::is_x86_feature_detected!("avx512bf16"),
                ),
                (
                    "avx512fp16",
                    std::arch::is_x86_feature_detected!("avx512fp16"),
                ),
            ]
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| n)
            .collect()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Vec::new()
        }
    };
    println!("PEAK flags {} -   # threads {t}", flags.join(","));
    let has = |f: &str| flags.contains(&f);

    #[cfg(target_arch = "x86_64")]
    {
        use kernels::*;
        let iters = 10_000_000;
        // Two lines per kernel: GFLOP/s on the wall clock over the t threads, and GFLOP per
        // CPU-second of one thread (`NAME_cpu`: the per-core rate, what tokens-per-CPU-second
        // figures compare against; equal to wall / t on an idle machine).
        let report = |name: &str,
                      chains: usize,
                      lanes: f64,
                      flop: f64,
                      (wall, cpu): (f64, f64),
                      note: &str| {
            let work = iters as f64 * chains as f64 * lanes * flop / 1e9;
            println!(
                "PEAK {name} {:.1} GFLOP/s   # {note}, {t} threads",
                t as f64 * work / wall
            );
            println!(
                "PEAK {name}_cpu {:.1} GFLOP/cpu-s   # {note}, per CPU-second of one thread",
                work / cpu
            );
        };
        if has("avx512f") {
            // SAFETY: avx512f detected.
            let s = best_parallel(t, 5, |_| {
                unsafe { fma_zmm(iters) };
            });
            report("f32_fma_zmm", ZMM_CHAINS, 16.0, 2.0, s, "vfmadd on zmm");
        }
        if has("avx2") && has("fma") {
            // SAFETY: avx2 + fma detected.
            let s = best_parallel(t, 5, |_| {
                unsafe { fma_ymm(iters) };
            });
            report("f32_fma_ymm", YMM_CHAINS, 8.0, 2.0, s, "vfmadd on ymm");
        }
        if has("avx512f") && has("avx512bf16") {
            // SAFETY: avx512f + avx512bf16 detected.
            let s = best_parallel(t, 5, |_| {
                unsafe { dot_bf16(iters) };
            });
            report("bf16_dot_zmm", ZMM_CHAINS, 16.0, 4.0, s, "vdpbf16ps on zmm");
        }
    }

    // Memory bandwidth: STREAM copy (c = a) and triad (a = b + s·c), per-thread slices.
    let n = 64 << 20;
    let mut a = vec![1f32; n];
    let mut b = vec![2f32; n];
    let mut c = vec![0f32; n];
    let chunk = n.div_ceil(t);
    let mut copy = f64::INFINITY;
    let mut triad = f64::INFINITY;
    let mut read = f64::INFINITY;
    for rep in 0..6 {
        let start = Instant::now();
        std::thread::scope(|s| {
            for (src, dst) in a.chunks(chunk).zip(c.chunks_mut(chunk)) {
                s.spawn(move || dst.copy_from_slice(src));
            }
        });
        let tc = start.elapsed().as_secs_f64();
        let start = Instant::now();
        std::thread::scope(|s| {
            for ((x, y), z) in a
                .chunks_mut(chunk)
                .zip(b.chunks(chunk))
                .zip(c.chunks(chunk))
            {
                s.spawn(move || {
                    for ((x, y), z) in x.iter_mut().zip(y).zip(z) {
                        *x = y + 0.5 * z;
                    }
                });
            }
        });
        let tt = start.elapsed().as_secs_f64();
        // Read only: 16 independent sums per thread (vector lanes), nothing written.
        let start = Instant::now();
        let sums: Vec<f32> = std::thread::scope(|s| {
            let handles: Vec<_> = b
                .chunks(chunk)
                .map(|y| {
                    s.spawn(move || {
                        let mut acc = [0f32; 16];
                        let (blocks, _) = y.as_chunks::<16>();
                        for blk in blocks {
                            for (a, &v) in acc.iter_mut().zip(blk) {
                                *a += v;
                            }
                        }
                        acc.iter().sum::<f32>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0.0))
                .collect()
        });
        let tr = start.elapsed().as_secs_f64();
        std::hint::black_box(sums);
        if rep > 0 {
            copy = copy.min(tc);
            triad = triad.min(tt);
            read = read.min(tr);
        }
        std::hint::black_box((&a, &b, &c));
    }
    let bytes = (n * 4) as f64;
    println!(
        "PEAK bw_copy {:.1} GB/s   # 256 MiB read + 256 MiB written, {t} threads",
        2.0 * bytes / copy / 1e9
    );
    println!(
        "PEAK bw_triad {:.1} GB/s   # 2 x 256 MiB read + 256 MiB written, {t} threads",
        3.0 * bytes / triad / 1e9
    );
    println!(
        "PEAK bw_read {:.1} GB/s   # 256 MiB read (a sum), {t} threads",
        bytes / read / 1e9
    );
    b[0] = a[1];
}
