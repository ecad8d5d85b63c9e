//! Hugging Face's rotate-half rotary embedding (RoPE), forward and backward in one pass each, on
//! f32 slices; rlcr's `model::fused` wraps it as an autodiff op. For one row `x = [x₁ | x₂]`
//! (`d` entries, halves of `d/2`) with that position's `c = cos`, `s = sin` (`d/2` each):
//!
//! ```text
//! y = [x₁·c − x₂·s | x₂·c + x₁·s]
//! ∂L/∂x₁ = g₁·c + g₂·s        ∂L/∂x₂ = (−g₁)·s + g₂·c       with g = [g₁ | g₂] = ∂L/∂y
//! ```
//!
//! evaluated operation by operation as burn's composite (`slice`, four `mul`s, `sub`, `add`,
//! `cat`) and its autodiff backward evaluate them, each gradient entry `+ 0.0` last as burn's
//! slice backward adds the two halves' zero-padded gradients: the same bits (tested by rlcr's
//! `model::fused`). The input may be a strided view (the rows of `[B, n, T, d]` with the last axis
//! contiguous, as the attention's `q`/`k` view of the fused projection is); the outputs are
//! contiguous. Rows run in parallel.
use rayon::prelude::*;

/// Where the rows of a `[B, n, T, d]` input live: element `(b, h, t, j)` is at
/// `offset + b·strides[0] + h·strides[1] + t·strides[2] + j`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub shape: [usize; 4],
    pub strides: [usize; 3],
    pub offset: usize,
}

impl Rows {
    /// The layout of a contiguous `[B, n, T, d]` tensor.
    pub fn contiguous(shape: [usize; 4]) -> Rows {
        let [_, n, t, d] = shape;
        Rows {
            shape,
            strides: [n * t * d, t * d, d],
            offset: 0,
        }
    }

    fn start(&self, row: usize) -> usize {
        let [_, n, t, _] = self.shape;
        let (b, h, i) = (row / (n * t), row / t % n, row % t);
        self.offset + b * self.strides[0] + h * self.strides[1] + i * self.strides[2]
    }
}

/// Forward: `y` (contiguous `[B, n, T, d]`) from `x` laid out as `rows` and `cos`, `sin`
/// (`[B, T, d/2]` each, contiguous).
///
/// # Panics
/// If `d` is odd or a length disagrees with the shape (caller bugs).
pub fn forward(x: &[f32], rows: Rows, cos: &[f32], sin: &[f32]) -> Vec<f32> {
    let [b, n, t, d] = rows.shape;
    let half = d / 2;
    assert!(d.is_multiple_of(2) && cos.len() == b * t * half && sin.len() == cos.len());
    let mut y = vec![0f32; b * n * t * d];
    if d == 0 {
        return y;
    }
    y.par_chunks_mut(d).enumerate().for_each(|(row, out)| {
        let src = &x[rows.start(row)..rows.start(row) + d];
        let p = (row / (n * t) * t + row % t) * half;
        let (c, s) = (&cos[p..p + half], &sin[p..p + half]);
        let (x1, x2) = src.split_at(half);
        let (o1, o2) = out.split_at_mut(half);
        for j in 0..half {
            o1[j] = x1[j] * c[j] - x2[j] * s[j];
            o2[j] = x2[j] * c[j] + x1[j] * s[j];
        }
    });
    y
}

/// Backward: `∂L/∂x` (contiguous `[B, n, T, d]`) from `g = ∂L/∂y` (contiguous, same shape).
///
/// # Panics
/// If `d` is odd or a length disagrees with the shape (caller bugs).
pub fn backward(g: &[f32], shape: [usize; 4], cos: &[f32], sin: &[f32]) -> Vec<f32> {
    let [b, n, t, d] = shape;
    let half = d / 2;
    assert!(d.is_multiple_of(2) && g.len() == b * n * t * d && cos.len() == b * t * half);
    let mut dx = vec![0f32; g.len()];
    if d == 0 {
        return dx;
    }
    dx.par_chunks_mut(d)
        .zip(g.par_chunks(d))
        .enumerate()
        .for_each(|(row, (out, gr))| {
            let p = (row / (n * t) * t + row % t) * half;
            let (c, s) = (&cos[p..p + half], &sin[p..p + half]);
            let (g1, g2) = gr.split_at(half);
            let (o1, o2) = out.split_at_mut(half);
            for j in 0..half {
                o1[j] = (g1[j] * c[j] + g2[j] * s[j]) + 0.0;
                o2[j] = ((-g1[j]) * s[j] + g2[j] * c[j]) + 0.0;
            }
        });
    dx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::data;

    /// Against the definition in f64, on a strided input (every other head of a wider buffer).
    #[test]
    fn matches_the_definition_in_f64() {
        let (b, n, t, d) = (2, 3, 5, 8);
        let half = d / 2;
        // The buffer holds 2n heads per (b, t) row: [B, T, 2n, d]; the input is heads 0..n seen
        // as [B, n, T, d].
        let buf = data(b * t * 2 * n * d, 1);
        let rows = Rows {
            shape: [b, n, t, d],
            strides: [t * 2 * n * d, d, 2 * n * d],
            offset: 0,
        };
        let angle: Vec<f64> = (0..b * t * half).map(|i| 0.37 * i as f64).collect();
        let cos: Vec<f32> = angle.iter().map(|a| a.cos() as f32).collect();
        let sin: Vec<f32> = angle.iter().map(|a| a.sin() as f32).collect();
        let g = data(b * n * t * d, 2);
        let y = forward(&buf, rows, &cos, &sin);
        let dx = backward(&g, rows.shape, &cos, &sin);
        for bi in 0..b {
            for h in 0..n {
                for ti in 0..t {
                    let src = (bi * t + ti) * 2 * n * d + h * d;
                    let dst = ((bi * n + h) * t + ti) * d;
                    let p = (bi * t + ti) * half;
                    for j in 0..half {
                        let (x1, x2) = (buf[src + j] as f64, buf[src + half + j] as f64);
                        let (c, s) = (cos[p + j] as f64, sin[p + j] as f64);
                        let (g1, g2) = (g[dst + j] as f64, g[dst + half + j] as f64);
                        // Two products and a sum, each rounded once in f32.
                        let close = |got: f32, a: f64, b: f64| {
                            (got as f64 - (a + b)).abs() <= 2e-7 * (a.abs() + b.abs()) + 1e-30
                        };
                        assert!(close(y[dst + j], x1 * c, -x2 * s));
                        assert!(close(y[dst + half + j], x2 * c, x1 * s));
                        assert!(close(dx[dst + j], g1 * c, g2 * s));
                        assert!(close(dx[dst + half + j], -g1 * s, g2 * c));
                    }
                }
            }
        }
    }
}
