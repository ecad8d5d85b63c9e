//! Experiment: variants of the decode matmul kernel (not part of the crate).
use std::arch::x86_64::*;
use std::time::Instant;

fn cpu_secs() -> f64 {
    let mut ns = 0u64;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) {
                ns += s.split_whitespace().next().and_then(|x| x.parse().ok()).unwrap_or(0);
            }
        }
    }
    ns as f64 * 1e-9
}

#[target_feature(enable = "avx2,fma")]
unsafe fn v_base<const R: usize, const KB: usize, const PF: bool>(xt: &[f32], k: usize, w: *const f32, ldw: usize, out: *mut f32, ldo: usize, groups: usize) {
    let xp = xt.as_ptr();
    let mut k0 = 0;
    while k0 < k {
        let k1 = (k0 + KB).min(k);
        for g in 0..groups {
            unsafe {
                let mut acc = [_mm256_setzero_ps(); R];
                if k0 > 0 {
                    for (r, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_loadu_ps(out.add(r * ldo + g * 8));
                    }
                }
                let wp = w.add(g * 8);
                for kk in k0..k1 {
                    let row = wp.add(kk * ldw);
                    if PF {
                        _mm_prefetch::<_MM_HINT_T0>(row.add(128) as *const i8);
                    }
                    let wv = _mm256_loadu_ps(row);
                    let xr = xp.add(kk * R);
                    for (r, a) in acc.iter_mut().enumerate() {
                        let x = _mm256_broadcast_ss(&*xr.add(r));
                        *a = _mm256_fmadd_ps(x, wv, *a);
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(out.add(r * ldo + g * 8), *a);
                }
            }
        }
        k0 = k1;
    }
}

/// 16 columns x R rows (R <= 6), k-blocked.
#[target_feature(enable = "avx2,fma")]
unsafe fn v_16<const R: usize, const KB: usize>(xt: &[f32], k: usize, w: *const f32, ldw: usize, out: *mut f32, ldo: usize, groups16: usize) {
    let xp = xt.as_ptr();
    let mut k0 = 0;
    while k0 < k {
        let k1 = (k0 + KB).min(k);
        for g in 0..groups16 {
            unsafe {
                let mut a0 = [_mm256_setzero_ps(); R];
                let mut a1 = [_mm256_setzero_ps(); R];
                if k0 > 0 {
                    for r in 0..R {
                        a0[r] = _mm256_loadu_ps(out.add(r * ldo + g * 16));
                        a1[r] = _mm256_loadu_ps(out.add(r * ldo + g * 16 + 8));
                    }
                }
                let wp = w.add(g * 16);
                for kk in k0..k1 {
                    let row = wp.add(kk * ldw);
                    let w0 = _mm256_loadu_ps(row);
                    let w1 = _mm256_loadu_ps(row.add(8));
                    let xr = xp.add(kk * R);
                    for r in 0..R {
                        let x = _mm256_broadcast_ss(&*xr.add(r));
                        a0[r] = _mm256_fmadd_ps(x, w0, a0[r]);
                        a1[r] = _mm256_fmadd_ps(x, w1, a1[r]);
                    }
                }
                for r in 0..R {
                    _mm256_storeu_ps(out.add(r * ldo + g * 16), a0[r]);
                    _mm256_storeu_ps(out.add(r * ldo + g * 16 + 8), a1[r]);
                }
            }
        }
        k0 = k1;
    }
}

#[derive(Clone, Copy)]
struct P(*mut f32);
unsafe impl Send for P {}
unsafe impl Sync for P {}

fn run(name: &str, m: usize, k: usize, n: usize, f: &(dyn Fn(&[f32], &[f32], *mut f32, usize, usize) + Sync)) {
    use rayon::prelude::*;
    let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.01).collect();
    let w: Vec<f32> = (0..k * n).map(|i| (i % 17) as f32 * 0.01).collect();
    let mut out = vec![0f32; m * n];
    let mut xt = vec![0f32; k * m];
    for kk in 0..k { for r in 0..m { xt[kk * m + r] = x[r * k + kk]; } }
    let reps = (2_000_000_000 / (k * n * 4)).max(3);
    let jobs = 4;
    let cols_per = n / jobs;
    let once = |out: &mut Vec<f32>| {
        let p = P(out.as_mut_ptr());
        (0..jobs).into_par_iter().for_each(|j| {
            let p = p;
            f(&xt, &w[j * cols_per..], unsafe { p.0.add(j * cols_per) }, n, cols_per);
        });
    };
    once(&mut out);
    let (c0, w0) = (cpu_secs(), Instant::now());
    for _ in 0..reps { once(&mut out); }
    let c = (cpu_secs() - c0) / reps as f64 * 1e3;
    let wl = w0.elapsed().as_secs_f64() / reps as f64 * 1e3;
    println!("{name:40} {m}x{k}x{n}: cpu {c:7.2} ms wall {wl:7.2} ms  ({:.1} GB/s cpu)  chk {}", (k * n * 4) as f64 / c / 1e6, out[n - 1]);
}

/// Panel-packed W: [N/8][K][8]; each group reads one contiguous K*8 stream.
#[target_feature(enable = "avx2,fma")]
unsafe fn v_packed<const R: usize>(xt: &[f32], k: usize, wp: *const f32, out: *mut f32, ldo: usize, groups: usize) {
    let xp = xt.as_ptr();
    for g in 0..groups {
        unsafe {
            let mut acc = [_mm256_setzero_ps(); R];
            let panel = wp.add(g * k * 8);
            for kk in 0..k {
                let wv = _mm256_loadu_ps(panel.add(kk * 8));
                let xr = xp.add(kk * R);
                for (r, a) in acc.iter_mut().enumerate() {
                    let x = _mm256_broadcast_ss(&*xr.add(r));
                    *a = _mm256_fmadd_ps(x, wv, *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add(r * ldo + g * 8), *a);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// HF layout W [N, K]: out[r, c] = dot(x[r], W[c]); 4 W rows x 2 x rows per tile.
#[target_feature(enable = "avx2,fma")]
unsafe fn v_dot(x: &[f32], m: usize, k: usize, w: *const f32, out: *mut f32, ldo: usize, c0: usize, c1: usize) {
    let xp = x.as_ptr();
    let k8 = k / 8 * 8;
    let mut c = c0;
    while c + 4 <= c1 {
        let mut r = 0;
        while r + 2 <= m {
            unsafe {
                let mut acc = [[_mm256_setzero_ps(); 2]; 4];
                let wr = [w.add(c * k), w.add((c + 1) * k), w.add((c + 2) * k), w.add((c + 3) * k)];
                let xr = [xp.add(r * k), xp.add((r + 1) * k)];
                let mut kk = 0;
                while kk < k8 {
                    let x0 = _mm256_loadu_ps(xr[0].add(kk));
                    let x1 = _mm256_loadu_ps(xr[1].add(kk));
                    for i in 0..4 {
                        let wv = _mm256_loadu_ps(wr[i].add(kk));
                        acc[i][0] = _mm256_fmadd_ps(wv, x0, acc[i][0]);
                        acc[i][1] = _mm256_fmadd_ps(wv, x1, acc[i][1]);
                    }
                    kk += 8;
                }
                for i in 0..4 {
                    for j in 0..2 {
                        let mut s = hsum(acc[i][j]);
                        for t in k8..k {
                            s += *wr[i].add(t) * *xr[j].add(t);
                        }
                        *out.add((r + j) * ldo + c + i) = s;
                    }
                }
            }
            r += 2;
        }
        c += 4;
    }
}

fn main() {
    for &(k, n) in &[(576usize, 49152usize), (576, 3072), (1536, 576)] {
        use rayon::prelude::*;
        let m = 8;
        let w: Vec<f32> = (0..k * n).map(|i| (i % 17) as f32 * 0.01).collect();
        let x: Vec<f32> = (0..k * m).map(|i| (i % 13) as f32 * 0.01).collect();
        let mut out = vec![0f32; m * n];
        let reps = (2_000_000_000 / (k * n * 4)).max(3);
        let jobs = 4;
        let per = n / jobs;
        let once = |out: &mut Vec<f32>| {
            let p = P(out.as_mut_ptr());
            (0..jobs).into_par_iter().for_each(|j| {
                let p = p;
                unsafe { v_dot(&x, m, k, w.as_ptr(), p.0, n, j * per, (j + 1) * per) };
            });
        };
        once(&mut out);
        let (c0, w0) = (cpu_secs(), Instant::now());
        for _ in 0..reps { once(&mut out); }
        let c = (cpu_secs() - c0) / reps as f64 * 1e3;
        let wl = w0.elapsed().as_secs_f64() / reps as f64 * 1e3;
        println!("{:40} {m}x{k}x{n}: cpu {c:7.2} ms wall {wl:7.2} ms  ({:.1} GB/s cpu)", "DOT (HF layout)", (k * n * 4) as f64 / c / 1e6);
    }
    for &(k, n) in &[(576usize, 49152usize), (576, 3072), (1536, 576)] {
        let m = 8;
        {
            // Packed variant: pack once, time the kernel over the packed buffer.
            use rayon::prelude::*;
            let w: Vec<f32> = (0..k * n).map(|i| (i % 17) as f32 * 0.01).collect();
            let mut packed = vec![0f32; k * n];
            for g in 0..n / 8 { for kk in 0..k { for c in 0..8 { packed[g * k * 8 + kk * 8 + c] = w[kk * n + g * 8 + c]; } } }
            let xt: Vec<f32> = (0..k * m).map(|i| (i % 13) as f32 * 0.01).collect();
            let mut out = vec![0f32; m * n];
            let reps = (2_000_000_000 / (k * n * 4)).max(3);
            let jobs = 4;
            let gper = n / 8 / jobs;
            let once = |out: &mut Vec<f32>| {
                let p = P(out.as_mut_ptr());
                (0..jobs).into_par_iter().for_each(|j| {
                    let p = p;
                    unsafe { v_packed::<8>(&xt, k, packed.as_ptr().add(j * gper * k * 8), p.0.add(j * gper * 8), n, gper) };
                });
            };
            once(&mut out);
            let (c0, w0) = (cpu_secs(), Instant::now());
            for _ in 0..reps { once(&mut out); }
            let c = (cpu_secs() - c0) / reps as f64 * 1e3;
            let wl = w0.elapsed().as_secs_f64() / reps as f64 * 1e3;
            println!("{:40} {m}x{k}x{n}: cpu {c:7.2} ms wall {wl:7.2} ms  ({:.1} GB/s cpu)", "PACKED panels", (k * n * 4) as f64 / c / 1e6);
        }
        run("base KB16", m, k, n, &|xt, w, o, ld, cols| unsafe { v_base::<8, 16, false>(xt, k, w.as_ptr(), ld, o, ld, cols / 8) });
        run("base KB8", m, k, n, &|xt, w, o, ld, cols| unsafe { v_base::<8, 8, false>(xt, k, w.as_ptr(), ld, o, ld, cols / 8) });
        run("base KB16 prefetch", m, k, n, &|xt, w, o, ld, cols| unsafe { v_base::<8, 16, true>(xt, k, w.as_ptr(), ld, o, ld, cols / 8) });
        run("base KB4 prefetch", m, k, n, &|xt, w, o, ld, cols| unsafe { v_base::<8, 4, true>(xt, k, w.as_ptr(), ld, o, ld, cols / 8) });
        run("16col x4 rows x2 passes KB16", m, k, n, &|xt, w, o, ld, cols| unsafe {
            let mut xa = vec![0f32; k * 4];
            let mut xb = vec![0f32; k * 4];
            for kk in 0..k { for r in 0..4 { xa[kk * 4 + r] = xt[kk * 8 + r]; xb[kk * 4 + r] = xt[kk * 8 + 4 + r]; } }
            v_16::<4, 16>(&xa, k, w.as_ptr(), ld, o, ld, cols / 16);
            v_16::<4, 16>(&xb, k, w.as_ptr(), ld, o.add(4 * ld), ld, cols / 16);
        });
    }
}
