//! Generalised advantage estimation with verl's masked recursion, and masked whitening.
//!
//! verl's `compute_gae_advantage_return` (`docs/math.md` §2.6) runs the GAE recursion backwards over the
//! response and *skips* masked positions (observation/info/padding tokens): they neither update the
//! next value nor decay the carried advantage, so a turn's last token sees the value of the next
//! turn's first token as its successor. Returns are `adv + V`, taken **before** whitening; then the
//! advantages are whitened over the whole update batch using only masked tokens.
//!
//! Whitening needs batch-wide moments before any row can be written, so the stage accumulates
//! [`MaskedMoments`] in a first pass and applies [`whiten_value`] in the second. The moments are
//! sums shifted by the first value seen, accumulated in row order: the same table gives the same
//! bits whatever the batch size.

/// The constant inside verl's `rsqrt(var + 1e-8)`.
pub const WHITEN_EPS: f64 = 1e-8;

/// GAE for one row (verl semantics).
///
/// ```text
/// nextv = 0; lastgae = 0
/// for t = T-1 .. 0:
///   delta   = r[t] + γ·nextv − V[t]
///   gae_new = delta + γ·λ·lastgae
///   nextv   = m[t] ? V[t]    : nextv
///   lastgae = m[t] ? gae_new : lastgae
///   adv[t]  = lastgae
/// ret = adv + V
/// ```
///
/// Edge cases: masked positions hold the carried advantage (as in verl; only the loss mask excludes
/// them) and their rewards are ignored; a row with no masked token gets `adv = 0`, `ret = V`.
/// All slices have the row's length (caller invariant).
pub fn gae_row(
    rewards: &[f64],
    values: &[f64],
    mask: &[bool],
    gamma: f64,
    lam: f64,
    adv: &mut [f64],
    ret: &mut [f64],
) {
    let n = rewards.len();
    assert!(values.len() == n && mask.len() == n && adv.len() == n && ret.len() == n);
    let mut nextv = 0.0;
    let mut lastgae = 0.0;
    for t in (0..n).rev() {
        if mask[t] {
            let delta = rewards[t] + gamma * nextv - values[t];
            lastgae = delta + gamma * lam * lastgae;
            nextv = values[t];
        }
        adv[t] = lastgae;
        ret[t] = lastgae + values[t];
    }
}

/// Slow reference for [`gae_row`]: compress the row to its masked positions `p_0 < … < p_{n−1}`,
/// compute `δ_j = r_{p_j} + γ·V_{p_{j+1}} − V_{p_j}` (with `V_{p_n} = 0`) and
/// `A_j = Σ_{l≥0} (γλ)^l δ_{j+l}` by the explicit double sum; a masked-out position takes the `A` of
/// the next masked position (0 if none).
pub fn gae_row_ref(
    rewards: &[f64],
    values: &[f64],
    mask: &[bool],
    gamma: f64,
    lam: f64,
) -> (Vec<f64>, Vec<f64>) {
    let p: Vec<usize> = (0..rewards.len()).filter(|&t| mask[t]).collect();
    let delta: Vec<f64> = (0..p.len())
        .map(|j| {
            let next = if j + 1 < p.len() {
                values[p[j + 1]]
            } else {
                0.0
            };
            rewards[p[j]] + gamma * next - values[p[j]]
        })
        .collect();
    let a: Vec<f64> = (0..p.len())
        .map(|j| {
            (j..p.len())
                .map(|l| (gamma * lam).powi((l - j) as i32) * delta[l])
                .sum()
        })
        .collect();
    let adv: Vec<f64> = (0..rewards.len())
        .map(|t| match p.iter().position(|&q| q >= t) {
            Some(j) => a[j],
            None => 0.0,
        })
        .collect();
    let ret = adv.iter().zip(values).map(|(a, v)| a + v).collect();
    (adv, ret)
}

/// Running moments of the masked tokens of a batch: count, mean and unbiased variance, from sums
/// shifted by the first value (numerically safe for values of similar magnitude, and exactly
/// reproducible in a fixed order).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MaskedMoments {
    n: u64,
    shift: f64,
    s1: f64,
    s2: f64,
}

impl MaskedMoments {
    /// Add one value.
    pub fn push(&mut self, x: f64) {
        if self.n == 0 {
            self.shift = x;
        }
        let d = x - self.shift;
        self.n += 1;
        self.s1 += d;
        self.s2 += d * d;
    }

    /// Add the masked values of one row.
    pub fn extend(&mut self, values: &[f64], mask: &[bool]) {
        for (&x, &m) in values.iter().zip(mask) {
            if m {
                self.push(x);
            }
        }
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.n
    }

    /// Mean (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.shift + self.s1 / self.n as f64
        }
    }

    /// Unbiased variance `Σ(x − mean)² / (n − 1)` (verl `masked_var(unbiased=True)`); 0 when fewer
    /// than two values (verl raises; we whiten such a batch to 0, see [`whiten_value`]).
    pub fn var_unbiased(&self) -> f64 {
        if self.n < 2 {
            return 0.0;
        }
        let n = self.n as f64;
        ((self.s2 - self.s1 * self.s1 / n) / (n - 1.0)).max(0.0)
    }
}

/// verl `masked_whiten` for one value: `(x − mean) · rsqrt(var + 1e-8)`.
pub fn whiten_value(x: f64, mean: f64, var: f64) -> f64 {
    (x - mean) / (var + WHITEN_EPS).sqrt()
}

/// Whiten a flat batch in place over its masked positions (every position is shifted and scaled,
/// as in verl; masked-out ones are excluded from the statistics only).
pub fn masked_whiten(values: &mut [f64], mask: &[bool]) {
    let mut m = MaskedMoments::default();
    m.extend(values, mask);
    let (mean, var) = (m.mean(), m.var_unbiased());
    for x in values.iter_mut() {
        *x = whiten_value(*x, mean, var);
    }
}

#[cfg(test)]
mod tests {
    use super::super::group::tests::close;
    use super::*;
    use proptest::prelude::*;

    fn run(r: &[f64], v: &[f64], m: &[bool], g: f64, l: f64) -> (Vec<f64>, Vec<f64>) {
        let mut a = vec![0.0; r.len()];
        let mut ret = vec![0.0; r.len()];
        gae_row(r, v, m, g, l, &mut a, &mut ret);
        let (ra, rr) = gae_row_ref(r, v, m, g, l);
        close(&a, &ra, 1e-12);
        close(&ret, &rr, 1e-12);
        (a, ret)
    }

    // The worked example of docs/math.md §2.6.
    #[test]
    fn gae_worked_example() {
        let r = [0.0, 0.0, 0.0, 0.0, 1.0];
        let v = [0.1, 0.2, 0.3, 0.4, 0.5];
        let all = [true; 5];
        let (a, ret) = run(&r, &v, &all, 1.0, 0.95);
        close(
            &a,
            &[0.778241, 0.713937, 0.646250, 0.575000, 0.500000],
            1e-6,
        );
        close(
            &ret,
            &[0.878241, 0.913937, 0.946250, 0.975000, 1.000000],
            1e-6,
        );
        let mut w = a.clone();
        masked_whiten(&mut w, &all);
        close(
            &w,
            &[1.232251, 0.647709, 0.032402, -0.615290, -1.297072],
            1e-6,
        );

        let (a, _) = run(&r, &v, &all, 1.0, 1.0);
        close(&a, &[0.9, 0.8, 0.7, 0.6, 0.5], 1e-12);

        let m = [true, true, false, false, true];
        let (a, ret) = run(&r, &v, &m, 1.0, 0.95);
        close(&a, &[0.83625, 0.775, 0.5, 0.5, 0.5], 1e-12);
        close(&ret, &[0.93625, 0.975, 0.8, 0.9, 1.0], 1e-12);
    }

    #[test]
    fn masked_tokens_ignore_their_rewards_and_empty_mask_is_zero() {
        let v = [0.1, 0.2, 0.3];
        let (a1, _) = run(&[0.0, 5.0, 1.0], &v, &[true, false, true], 0.9, 0.8);
        let (a2, _) = run(&[0.0, -7.0, 1.0], &v, &[true, false, true], 0.9, 0.8);
        assert_eq!(a1, a2);
        let (a, ret) = run(&[1.0; 3], &v, &[false; 3], 1.0, 1.0);
        assert_eq!(a, vec![0.0; 3]);
        assert_eq!(ret, v.to_vec());
    }

    #[test]
    fn whitening_edge_cases() {
        let mut m = MaskedMoments::default();
        assert_eq!((m.count(), m.mean(), m.var_unbiased()), (0, 0.0, 0.0));
        m.push(3.0);
        assert_eq!((m.mean(), m.var_unbiased()), (3.0, 0.0));
        assert_eq!(whiten_value(3.0, m.mean(), m.var_unbiased()), 0.0);
        m.push(5.0);
        assert_eq!((m.mean(), m.var_unbiased()), (4.0, 2.0));
    }

    proptest! {
        #[test]
        fn gae_fast_equals_reference(
            rows in prop::collection::vec((-1.0f64..1.0, -1.0f64..1.0, any::<bool>()), 0..30),
            gamma in 0.5f64..=1.0,
            lam in 0.0f64..=1.0,
        ) {
            let r: Vec<f64> = rows.iter().map(|x| x.0).collect();
            let v: Vec<f64> = rows.iter().map(|x| x.1).collect();
            let m: Vec<bool> = rows.iter().map(|x| x.2).collect();
            let mut a = vec![0.0; r.len()];
            let mut ret = vec![0.0; r.len()];
            gae_row(&r, &v, &m, gamma, lam, &mut a, &mut ret);
            let (ra, rr) = gae_row_ref(&r, &v, &m, gamma, lam);
            for (x, y) in a.iter().zip(&ra).chain(ret.iter().zip(&rr)) {
                prop_assert!((x - y).abs() < 1e-9, "{} vs {}", x, y);
            }
        }

        /// The shifted-sum moments equal the two-pass textbook values, and whitened masked values
        /// have mean 0 and unbiased variance var/(var + 1e-8).
        #[test]
        fn moments_equal_two_pass(v in prop::collection::vec(-10.0f64..10.0, 2..50)) {
            let mut m = MaskedMoments::default();
            for &x in &v { m.push(x); }
            let n = v.len() as f64;
            let mean = v.iter().sum::<f64>() / n;
            let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
            prop_assert!((m.mean() - mean).abs() < 1e-9);
            prop_assert!((m.var_unbiased() - var).abs() < 1e-8 * (1.0 + var));
            let mut w = v.clone();
            masked_whiten(&mut w, &vec![true; v.len()]);
            let wm = w.iter().sum::<f64>() / n;
            prop_assert!(wm.abs() < 1e-9);
        }
    }
}
