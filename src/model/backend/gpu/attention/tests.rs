//! The kernels on the wgpu device (lavapipe in CI; `RLCR_WGPU_DEVICE` picks the adapter)
//! against an f64 evaluation and the CPU's composite on the same values.
//!
//! A test-only file: its parent declares it `#[cfg(test)] #[cfg(feature = "wgpu")] mod tests;`.
use super::*;
use burn::tensor::{Device, TensorData};

use super::super::{assert_close, assert_near, wide};
use crate::model::backend::composite_attention;

/// `len` test values `2·sin(0.731·k + shift)`.
fn wave(len: usize, shift: f32) -> Vec<f32> {
    (0..len)
        .map(|k| (k as f32 * 0.731 + shift).sin() * 2.0)
        .collect()
}

/// A `[b, 1, rows, keys]` mask: row `r` of batch `bi` hides the keys `s` with
/// `(s + r + bi) % 3 == 0`, never its own slot `s = r`; `alone`: the last row of the last batch
/// sees only its own slot.
fn hidden(b: usize, rows: usize, keys: usize, alone: bool) -> Vec<bool> {
    (0..b * rows * keys)
        .map(|k| {
            let (bi, r, s) = (k / (rows * keys), (k / keys) % rows, k % keys);
            let only_own = alone && bi == b - 1 && r == rows - 1;
            s != r && (only_own || (s + r + bi) % 3 == 0)
        })
        .collect()
}

/// In f64, the softmax's numerators `exp(x − max)` over the scores `x = scale·(q·k_s)` of the
/// query `q(i)` against the keys `s` of `visible` (`key(s, i)`, `i < d`), and their sum.
fn weights(
    q: impl Fn(usize) -> f64,
    key: impl Fn(usize, usize) -> f64,
    visible: &[usize],
    d: usize,
    scale: f64,
) -> (Vec<f64>, f64) {
    let sc: Vec<f64> = visible
        .iter()
        .map(|&s| (0..d).map(|i| q(i) * key(s, i)).sum::<f64>() * scale)
        .collect();
    let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
    let total = w.iter().sum();
    (w, total)
}

/// The options of [`composite_attention`] for `scale` (the masks say which keys a row sees).
fn options(scale: f64) -> burn::tensor::ops::AttentionModuleOptions {
    burn::tensor::ops::AttentionModuleOptions {
        scale: Some(scale),
        softcap: None,
        is_causal: false,
    }
}

/// Attention over a cache described by slot flags: two rows of three tokens at slots 5..8 of
/// a 300-slot cache (more keys than a cube's units), query heads grouped two to a key/value
/// head, flags with holes (padding slots) before and inside the call, one padding query;
/// each output within 1e-5 of f64's softmax over the slots the rule makes visible (a real
/// query: real slots up to its own; a padding one: its own), the slots after the query's
/// own ignored whatever they hold.
#[test]
fn slot_attention_matches_f64() {
    let dev = super::super::test_device();
    let (b, kv, g, t, d, cap, start) = (2usize, 2usize, 2usize, 3usize, 8usize, 300usize, 5);
    let rows = g * t;
    let qs = wave(b * kv * rows * d, 0.3);
    let (ks, vs) = (wave(b * kv * cap * d, 1.1), wave(b * kv * cap * d, 2.7));
    // Row 0: slot 2 is padding, the call's second token (slot 6) too; row 1: slot 0.
    let real = |bi: usize, s: usize| !matches!((bi, s), (0, 2) | (0, 6) | (1, 0));
    let flags: Vec<f32> = (0..b * cap)
        .map(|k| (k % cap < start + t && real(k / cap, k % cap)) as u8 as f32)
        .collect();
    let mut info = vec![start as f32];
    info.extend((0..b * t).map(|k| k as f32));
    let f32s = |v: &[f32], shape: [usize; 4]| {
        BurnTensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), &dev).reshape(shape)
    };
    let q = f32s(&qs, [b, kv, rows, d]);
    let (k, v) = (f32s(&ks, [b, kv, cap, d]), f32s(&vs, [b, kv, cap, d]));
    let fl = BurnTensor::<2>::from_data(TensorData::new(flags, [b, cap]), &dev);
    let step = BurnTensor::<1>::from_data(TensorData::new(info, [1 + b * t]), &dev);
    let scale = 1.0 / (d as f64).sqrt();
    let out = slot_attention(&q, &k, &v, &fl, &step, t, scale as f32).expect("runs on wgpu");
    assert_eq!(out.dims(), [b, t, kv * g, d]);
    let got = crate::model::read_f32(out).unwrap();
    for bi in 0..b {
        for h in 0..kv {
            for r in 0..rows {
                let (j, ti) = (r / t, r % t);
                let own = start + ti;
                let visible: Vec<usize> = (0..=own)
                    .filter(|&s| if real(bi, own) { real(bi, s) } else { s == own })
                    .collect();
                let at = |x: &[f32], s: usize, i: usize| x[((bi * kv + h) * cap + s) * d + i];
                let qrow = |i: usize| qs[((bi * kv + h) * rows + r) * d + i] as f64;
                let key = |s: usize, i: usize| at(&ks, s, i) as f64;
                let (w, total) = weights(qrow, key, &visible, d, scale);
                for i in 0..d {
                    let exact: f64 = visible
                        .iter()
                        .zip(&w)
                        .map(|(&s, wi)| wi * at(&vs, s, i) as f64)
                        .sum::<f64>()
                        / total;
                    let o = ((bi * t + ti) * kv * g + h * g + j) * d + i;
                    let diff = (got[o] as f64 - exact).abs();
                    assert!(diff < 1e-5, "{bi} {h} {r} {i}: {} vs {exact}", got[o]);
                }
            }
        }
    }
}

/// Strided queries (a head slice), more keys than a cube's units (300 > 256) and fewer,
/// masks hiding some keys per row (never all); within 1e-5 of f64 and of the CPU.
#[test]
fn attention_kernel_matches_the_cpu() {
    let dev = super::super::test_device();
    let cpu = Device::flex();
    for (b, heads, rows, keys, d) in [(2usize, 2usize, 3usize, 300usize, 16usize), (1, 3, 5, 7, 8)]
    {
        let scale = 1.0 / (d as f64).sqrt();
        let qs = wave(b * (heads + 1) * rows * d, 0.3);
        let (ks, vs) = (
            wave(b * heads * keys * d, 1.1),
            wave(b * heads * keys * d, 2.7),
        );
        let ms = hidden(b, rows, keys, false);
        let on = |dv: &Device| {
            let q = BurnTensor::<4>::from_data(
                TensorData::new(qs.clone(), [b, heads + 1, rows, d]),
                dv,
            )
            .slice([0..b, 1..heads + 1, 0..rows, 0..d]);
            let k =
                BurnTensor::<4>::from_data(TensorData::new(ks.clone(), [b, heads, keys, d]), dv);
            let v =
                BurnTensor::<4>::from_data(TensorData::new(vs.clone(), [b, heads, keys, d]), dv);
            let m = BurnTensor::<4, Bool>::from_data(
                TensorData::new(ms.clone(), [b, 1, rows, keys]),
                dv,
            );
            (q, k, v, m)
        };
        let (q, k, v, m) = on(&dev);
        let got = crate::model::read_f32(
            attention(&q, &k, &v, &m, scale as f32).expect("the kernel runs on wgpu"),
        )
        .unwrap();
        let (q, k, v, m) = on(&cpu);
        let want = crate::model::read_f32(composite_attention(q, k, v, &m, options(scale), false))
            .unwrap();
        for bi in 0..b {
            for h in 0..heads {
                for r in 0..rows {
                    let qrow: Vec<f64> = (0..d)
                        .map(|i| qs[((bi * (heads + 1) + h + 1) * rows + r) * d + i] as f64)
                        .collect();
                    let kv = |t: &[f32], s: usize, i: usize| {
                        t[((bi * heads + h) * keys + s) * d + i] as f64
                    };
                    let visible: Vec<usize> = (0..keys)
                        .filter(|&s| !ms[(bi * rows + r) * keys + s])
                        .collect();
                    let (w, total) = weights(|i| qrow[i], |s, i| kv(&ks, s, i), &visible, d, scale);
                    for i in 0..d {
                        let exact: f64 = visible
                            .iter()
                            .zip(&w)
                            .map(|(&s, wi)| wi * kv(&vs, s, i))
                            .sum::<f64>()
                            / total;
                        let at = ((bi * heads + h) * rows + r) * d + i;
                        let (g, e) = (got[at], want[at]);
                        assert_close(
                            g,
                            exact,
                            e,
                            format_args!("[{b},{heads},{rows},{keys},{d}] {at}"),
                        );
                    }
                }
            }
        }
    }
    // More keys than the kernel holds keep the composite.
    let big = MAX_KEYS + 1;
    let q = BurnTensor::<4>::from_data(TensorData::new(vec![0.5f32; 4], [1, 1, 1, 4]), &dev);
    let kv =
        BurnTensor::<4>::from_data(TensorData::new(vec![0.5f32; big * 4], [1, 1, big, 4]), &dev);
    let m =
        BurnTensor::<4, Bool>::from_data(TensorData::new(vec![false; big], [1, 1, 1, big]), &dev);
    assert!(attention(&q, &kv, &kv, &m, 0.5).is_none());
}

/// `(y, ∂L/∂q, ∂L/∂k, ∂L/∂v, launches forward, launches backward)` of `L = Σ y·c` on the
/// autodiff wgpu device, `q` a head slice of a wider tensor; `fused`: [`attention`], else
/// the composite ([`crate::model::backend::composite_attention`]).
#[allow(clippy::type_complexity)]
fn train(
    (qs, ks, vs, ms, cs): (&[f32], &[f32], &[f32], &[bool], &[f32]),
    [b, heads, rows, keys, d]: [usize; 5],
    fused: bool,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, u64, u64) {
    let ad = super::super::test_device().autodiff();
    let wide =
        BurnTensor::<4>::from_data(TensorData::new(qs.to_vec(), [b, heads + 1, rows, d]), &ad)
            .require_grad();
    let k = BurnTensor::<4>::from_data(TensorData::new(ks.to_vec(), [b, heads, keys, d]), &ad)
        .require_grad();
    let v = BurnTensor::<4>::from_data(TensorData::new(vs.to_vec(), [b, heads, keys, d]), &ad)
        .require_grad();
    let m = BurnTensor::<4, Bool>::from_data(TensorData::new(ms.to_vec(), [b, 1, rows, keys]), &ad);
    let c = BurnTensor::<4>::from_data(TensorData::new(cs.to_vec(), [b, heads, rows, d]), &ad);
    let q = wide.clone().slice([0..b, 1..heads + 1, 0..rows, 0..d]);
    let scale = 1.0 / (d as f64).sqrt();
    let run = || match fused {
        true => attention(&q, &k, &v, &m, scale as f32).expect("runs on autodiff wgpu"),
        false => composite_attention(q.clone(), k.clone(), v.clone(), &m, options(scale), false),
    };
    let (y, grads, fwd, bwd) = super::super::loss_backward(run, c);
    let read = |t: BurnTensor<4>| crate::model::read_f32(t).unwrap();
    let dwide = read(wide.grad(&grads).unwrap());
    let dq = (0..b * heads)
        .flat_map(|bh| {
            let at = ((bh / heads) * (heads + 1) + bh % heads + 1) * rows * d;
            dwide[at..at + rows * d].to_vec()
        })
        .collect();
    let (dk, dv) = (read(k.grad(&grads).unwrap()), read(v.grad(&grads).unwrap()));
    (read(y), dq, dk, dv, fwd, bwd)
}

/// Training's attention (autodiff tensors, a strided `q`, more keys than a cube's units and
/// fewer, masks hiding some keys, a row that sees only itself) against float64 (`y`, `∂L/∂q`,
/// `∂L/∂k`, `∂L/∂v` within 1e-5 of each one's largest value, from the module
/// documentation's formulas) and against burn's derived backward of the composite (the
/// same bound); one launch forward, two backward where the composite takes nine and more.
/// Twice the same inputs: the same bits (no atomics).
#[test]
fn training_attention_matches_float64_and_the_composite() {
    let _pool = crate::model::memory::pool_test_lock();
    for dims in [[2usize, 2, 3, 300, 16], [1, 3, 5, 7, 8]] {
        let [b, heads, rows, keys, d] = dims;
        let scale = 1.0 / (d as f64).sqrt();
        let qs = wave(b * (heads + 1) * rows * d, 0.3);
        let (ks, vs) = (
            wave(b * heads * keys * d, 1.1),
            wave(b * heads * keys * d, 2.7),
        );
        let cs = wave(b * heads * rows * d, 0.9);
        let ms = hidden(b, rows, keys, true);
        let inputs = (&qs[..], &ks[..], &vs[..], &ms[..], &cs[..]);
        let (y, dq, dk, dv, fwd, bwd) = train(inputs, dims, true);
        let (cy, cdq, cdk, cdv, cfwd, cbwd) = train(inputs, dims, false);
        // float64
        let (mut ey, mut edq) = (vec![0f64; y.len()], vec![0f64; y.len()]);
        let (mut edk, mut edv) = (vec![0f64; dk.len()], vec![0f64; dv.len()]);
        for bi in 0..b {
            for h in 0..heads {
                let kv =
                    |t: &[f32], s: usize, i: usize| t[((bi * heads + h) * keys + s) * d + i] as f64;
                for r in 0..rows {
                    let qrow: Vec<f64> = (0..d)
                        .map(|i| qs[((bi * (heads + 1) + h + 1) * rows + r) * d + i] as f64)
                        .collect();
                    let o = ((bi * heads + h) * rows + r) * d;
                    let grow: Vec<f64> = (0..d).map(|i| cs[o + i] as f64).collect();
                    let visible: Vec<usize> = (0..keys)
                        .filter(|&s| !ms[(bi * rows + r) * keys + s])
                        .collect();
                    let (w, total) = weights(|i| qrow[i], |s, i| kv(&ks, s, i), &visible, d, scale);
                    let p: Vec<f64> = w.iter().map(|x| x / total).collect();
                    let dp: Vec<f64> = visible
                        .iter()
                        .map(|&s| (0..d).map(|i| grow[i] * kv(&vs, s, i)).sum::<f64>())
                        .collect();
                    let delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                    for (n, &s) in visible.iter().enumerate() {
                        let ds = p[n] * (dp[n] - delta);
                        let kb = ((bi * heads + h) * keys + s) * d;
                        for i in 0..d {
                            ey[o + i] += p[n] * kv(&vs, s, i);
                            edq[o + i] += scale * ds * kv(&ks, s, i);
                            edk[kb + i] += scale * ds * qrow[i];
                            edv[kb + i] += p[n] * grow[i];
                        }
                    }
                }
            }
        }
        for (got, exact, composite, what) in [
            (&y, &ey, &cy, "y"),
            (&dq, &edq, &cdq, "dq"),
            (&dk, &edk, &cdk, "dk"),
            (&dv, &edv, &cdv, "dv"),
        ] {
            let what = format!("{dims:?} {what}");
            assert_near(got, exact, &what);
            assert_near(got, &wide(composite), &what);
        }
        eprintln!(
            "{dims:?} launches forward / backward (with the loss's): \
             kernel {fwd} / {bwd}, composite {cfwd} / {cbwd}"
        );
        assert_eq!(fwd, 1, "one launch forward");
        // The loss's own backward (the product with c and the sum) is in both counts.
        assert!(bwd + 8 <= cbwd, "backward {bwd} vs the composite's {cbwd}");
        let again = train(inputs, dims, true);
        assert_eq!(
            (again.0, again.1, again.2, again.3),
            (y, dq, dk, dv),
            "the same bits again"
        );
    }
}

/// Attention from the q/k/v product ([`qkv_attention`]: RoPE on q and k, then attention
/// over the head-major tensor) against the path it replaces, burn's composites for RoPE
/// and attention after the split, on the same values: a strided `[B, T, H + 2K, d]`
/// product (query heads grouped three to a key/value head), a causal mask with a padding
/// token (which sees only itself); the output (`[B, T, H, d]`) and, on autodiff tensors,
/// `∂L/∂qkv` within 1e-5 of each one's largest value, and again for a contiguous product. Two
/// launches forward, three backward with the loss's own; the same bits twice.
#[test]
fn qkv_attention_matches_the_split_path() {
    let _pool = crate::model::memory::pool_test_lock();
    let (b, t, heads, kv, d) = (2usize, 5usize, 6usize, 2usize, 8usize);
    let (n, g) = (heads + 2 * kv, heads / kv);
    let xs = wave(b * t * (n + 1) * d, 0.3);
    let xs0: Vec<f32> = xs[..b * t * n * d].to_vec();
    let cs = wave(b * t * heads * d, 0.9);
    // Tables in the GPU layout: cos = [c, c], sin = [−s, s] per position.
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for _ in 0..b {
        for p in 0..t {
            let ang: Vec<f64> = (0..d / 2)
                .map(|i| p as f64 / 10000f64.powf(2.0 * i as f64 / d as f64))
                .collect();
            let c: Vec<f32> = ang.iter().map(|a| a.cos() as f32).collect();
            let s: Vec<f32> = ang.iter().map(|a| a.sin() as f32).collect();
            cos.extend(c.iter().chain(&c));
            sin.extend(s.iter().map(|v| -v).chain(s.iter().copied()));
        }
    }
    // Causal; token 3 of row 1 is padding (it sees itself, and nobody sees it).
    let pad = |bi: usize, k: usize| bi == 1 && k == 3;
    let ms: Vec<bool> = (0..b * g * t * t)
        .map(|k| {
            let (bi, r, s) = (k / (g * t * t), (k / t) % (g * t), k % t);
            let q = r % t;
            if pad(bi, q) {
                s != q
            } else {
                s > q || pad(bi, s)
            }
        })
        .collect();
    // `extra`: 1, the product a slice of a wider tensor (strided); 0, the whole tensor.
    let run = |ad: bool, fused: bool, extra: usize| {
        let base = super::super::test_device();
        let dev = if ad { base.autodiff() } else { base };
        let mut wide =
            BurnTensor::<4>::from_data(TensorData::new(xs.clone(), [b, t, n + 1, d]), &dev);
        if extra == 0 {
            wide = BurnTensor::<4>::from_data(TensorData::new(xs0.clone(), [b, t, n, d]), &dev);
        }
        if ad {
            wide = wide.require_grad();
        }
        let qkv = wide.clone().slice([0..b, 0..t, extra..n + extra, 0..d]);
        let table =
            |v: &[f32]| BurnTensor::<4>::from_data(TensorData::new(v.to_vec(), [b, 1, t, d]), &dev);
        let (ct, st) = (table(&cos), table(&sin));
        let m =
            BurnTensor::<4, Bool>::from_data(TensorData::new(ms.clone(), [b, 1, g * t, t]), &dev);
        let scale = 1.0 / (d as f64).sqrt();
        let f = || match fused {
            true => qkv_attention(&qkv, &ct, &st, heads, &m, scale as f32).expect("runs on wgpu"),
            false => {
                let x = qkv.clone().swap_dims(1, 2);
                let swap = super::super::rope_swap_index(d, &dev);
                let qk =
                    super::super::rope(x.clone().slice([0..b, 0..heads + kv]), &ct, &st, &swap);
                let q = qk
                    .clone()
                    .slice([0..b, 0..heads])
                    .reshape([b, kv, g * t, d]);
                let k = qk.slice([0..b, heads..heads + kv]);
                let v = x.slice([0..b, heads + kv..n]);
                composite_attention(q, k, v, &m, options(scale), false)
                    .reshape([b, heads, t, d])
                    .swap_dims(1, 2)
            }
        };
        let c = BurnTensor::<4>::from_data(TensorData::new(cs.clone(), [b, t, heads, d]), &dev);
        let read = |x: BurnTensor<4>| crate::model::read_f32(x).unwrap();
        if !ad {
            let l0 = crate::model::transfer::thread_launches();
            let y = f();
            return (
                read(y),
                None,
                crate::model::transfer::thread_launches() - l0,
                0,
            );
        }
        let (y, grads, fwd, bwd) = super::super::loss_backward(f, c);
        let dx = read(wide.grad(&grads).unwrap());
        (read(y), Some(dx), fwd, bwd)
    };
    let near = |got: &[f32], want: &[f32], what: &str| {
        let size = want.iter().fold(0f32, |a, b| a.max(b.abs()));
        for (k, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * size,
                "{what}[{k}]: {a} vs {b} (largest {size})"
            );
        }
    };
    let (y, dx, fwd, bwd) = run(true, true, 1);
    let (cy, cdx, cfwd, cbwd) = run(true, false, 1);
    assert_eq!(y.len(), b * t * heads * d);
    near(&y, &cy, "y");
    let (dx, cdx) = (dx.unwrap(), cdx.unwrap());
    // The first head of each token is not part of the product: no gradient.
    near(&dx, &cdx, "dqkv");
    assert!(dx.iter().step_by(d * (n + 1)).all(|&v| v == 0.0));
    eprintln!(
        "launches forward / backward (with the loss's): fused {fwd} / {bwd}, \
         split path {cfwd} / {cbwd}"
    );
    assert_eq!(fwd, 2, "RoPE and attention");
    assert!(
        bwd + 10 <= cbwd,
        "backward {bwd} vs the split path's {cbwd}"
    );
    let again = run(true, true, 1);
    assert_eq!(
        (again.0, again.1.unwrap()),
        (y.clone(), dx),
        "the same bits again"
    );
    // Plain tensors (log-probs): the same output as the autodiff path.
    let (py, _, pfwd, _) = run(false, true, 1);
    assert_eq!(py, y, "plain and autodiff tensors: the same kernels");
    assert_eq!(pfwd, 2);
    // The whole product, contiguous (as a projection writes it): RoPE's backward writes the
    // gradient in the product's own layout.
    let (y0, dx0, _, _) = run(true, true, 0);
    let (cy0, cdx0, _, _) = run(true, false, 0);
    near(&y0, &cy0, "y, contiguous product");
    near(&dx0.unwrap(), &cdx0.unwrap(), "dqkv, contiguous product");
}
