//! Calibration and accuracy metrics as pure functions over slices.
//!
//! Every function takes plain slices (`conf[i]` a stated confidence, `label[i]` the correctness of
//! the answer it is about) and returns `None` when the quantity is undefined (no samples; AUROC
//! with a single class), never NaN, so that `metrics.json` says `null` rather than a number that
//! poisons downstream averages. Inputs are expected to be finite: the data layer
//! ([`super::data`]) drops or zero-fills missing confidences before they reach this module (see
//! [`super::data::MissingConfidence`]).
//!
//! Semantics follow RLCR's evaluation code (`eval/eval_utils.py`; `docs/math.md` §4) with one
//! deliberate change of default: the ECE bin of a confidence is the integer
//! `min(floor(c·B), B−1)` ([`BinRule::Floor`]), which puts `c = 0.3` in bin 3 as a reader
//! expects; RLCR's exact rule ([`BinRule::Rlcr`], float `linspace` edges and `digitize`) is kept
//! to reproduce their tables, where `0.3` lands in bin 2 because `linspace(0,1,11)[3]` is
//! `0.30000000000000004`. The two rules differ only at exact multiples of `1/B`.
//!
//! Fast paths (AUROC by ranks, ECE by one pass) sit beside slow obvious references
//! (`*_reference`), checked equal on random inputs in the tests.

use serde::{Deserialize, Serialize};

/// Which rule maps a confidence to one of `B` equal-width bins over `[0, 1]`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum BinRule {
    /// `bin = min(floor(c·B), B−1)`, clamped at 0 below (the toolkit default, `docs/math.md` §4.1).
    #[default]
    Floor,
    /// RLCR's exact rule: `edges = linspace(0, 1, B+1)` computed as numpy does (`i · (1/B)`),
    /// `edges[0] = −inf`, `edges[B] = +inf`, `bin = digitize(c, edges) − 1` (left-closed bins).
    Rlcr,
}

impl BinRule {
    /// The name used in flags and in `metrics.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            BinRule::Floor => "floor",
            BinRule::Rlcr => "rlcr",
        }
    }
}

/// numpy's `linspace(0, 1, bins + 1)[i]`: `i · (1/bins)`, with the last edge exactly 1.
///
/// numpy computes `step = (stop − start)/div` and `y = arange(num) · step + start`, then sets the
/// last element to `stop`; for `bins = 10`, `edge(3) = 0.30000000000000004`.
pub fn linspace_edge(i: usize, bins: usize) -> f64 {
    if i >= bins {
        1.0
    } else {
        i as f64 * (1.0 / bins as f64)
    }
}

/// The bin of confidence `c` among `bins` bins (`bins ≥ 1`) under `rule`.
///
/// - [`BinRule::Floor`]: `min(floor(c·B), B−1)`, and 0 for `c < 0` (also for NaN, which the Rust
///   float-to-integer cast maps to 0).
/// - [`BinRule::Rlcr`]: the number of interior edges `linspace_edge(i)`, `1 ≤ i ≤ B−1`, that are
///   `≤ c` (this is `digitize(c, edges) − 1` with infinite outer edges), found from the floor guess
///   and corrected by at most a step either way.
///
/// Worked example (`docs/math.md` §4.1, `B = 10`, RLCR rule): `[0.9, 0.8, 0.3, 0.75, 0.1, 1.0, 0.3, 0.0]` →
/// `[9, 8, 2, 7, 1, 9, 2, 0]`.
pub fn bin_index(c: f64, bins: usize, rule: BinRule) -> usize {
    let last = bins.saturating_sub(1);
    // Saturating float→int cast: negative and NaN give 0, +inf gives usize::MAX.
    let guess = ((c * bins as f64).floor() as usize).min(last);
    match rule {
        BinRule::Floor => guess,
        BinRule::Rlcr => {
            let mut k = guess;
            while k > 0 && linspace_edge(k, bins) > c {
                k -= 1;
            }
            while k < last && linspace_edge(k + 1, bins) <= c {
                k += 1;
            }
            k
        }
    }
}

/// Slow reference for [`bin_index`]: a linear scan that mirrors `numpy.digitize` literally.
pub fn bin_index_reference(c: f64, bins: usize, rule: BinRule) -> usize {
    match rule {
        BinRule::Floor => {
            let mut k = 0;
            for i in 0..bins {
                if c * bins as f64 >= i as f64 {
                    k = i;
                }
            }
            k
        }
        BinRule::Rlcr => {
            // edges[0] = -inf ≤ c always; edges[bins] = +inf never; count edges ≤ c, minus one.
            let mut count = 1;
            for i in 1..bins {
                if linspace_edge(i, bins) <= c {
                    count += 1;
                }
            }
            count - 1
        }
    }
}

/// One row of the reliability table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bin {
    /// 0-based bin index.
    pub index: usize,
    /// Lower edge as displayed: `i/B` for [`BinRule::Floor`], `linspace_edge(i)` for
    /// [`BinRule::Rlcr`] (whose outermost edges are ±inf in RLCR's code; shown as 0 and 1).
    pub lower: f64,
    /// Upper edge as displayed (see `lower`).
    pub upper: f64,
    /// Samples in the bin.
    pub count: u64,
    /// Mean confidence in the bin (`None` when empty).
    pub mean_confidence: Option<f64>,
    /// Mean label (accuracy) in the bin (`None` when empty).
    pub accuracy: Option<f64>,
}

impl Bin {
    /// `|mean_confidence − accuracy|`, `None` when the bin is empty.
    pub fn gap(&self) -> Option<f64> {
        Some((self.mean_confidence? - self.accuracy?).abs())
    }
}

/// The reliability table: `bins` rows, one per bin, empty bins included.
///
/// For bin `b` with members `S_b`: `count = |S_b|`, `mean_confidence = Σ_{S_b} c / |S_b|`,
/// `accuracy = Σ_{S_b} y / |S_b|`. Sums are accumulated in input order (deterministic).
/// `bins = 0` gives an empty table. Panics never; mismatched lengths use the shorter slice.
pub fn reliability_bins(conf: &[f64], label: &[f64], bins: usize, rule: BinRule) -> Vec<Bin> {
    let mut n = vec![0u64; bins];
    let mut sc = vec![0f64; bins];
    let mut sy = vec![0f64; bins];
    if bins > 0 {
        for (&c, &y) in conf.iter().zip(label) {
            let b = bin_index(c, bins, rule);
            n[b] += 1;
            sc[b] += c;
            sy[b] += y;
        }
    }
    (0..bins)
        .map(|i| {
            let (lower, upper) = match rule {
                BinRule::Floor => (i as f64 / bins as f64, (i + 1) as f64 / bins as f64),
                BinRule::Rlcr => (linspace_edge(i, bins), linspace_edge(i + 1, bins)),
            };
            let cnt = n[i];
            Bin {
                index: i,
                lower,
                upper,
                count: cnt,
                mean_confidence: (cnt > 0).then(|| sc[i] / cnt as f64),
                accuracy: (cnt > 0).then(|| sy[i] / cnt as f64),
            }
        })
        .collect()
}

/// Expected calibration error from a reliability table:
/// `ECE = Σ_b (n_b / N) · |mean(c_b) − mean(y_b)|`, `N = Σ_b n_b`; `None` when `N = 0`.
pub fn ece_from_bins(bins: &[Bin]) -> Option<f64> {
    let total: u64 = bins.iter().map(|b| b.count).sum();
    if total == 0 {
        return None;
    }
    let s: f64 = bins
        .iter()
        .filter_map(|b| Some(b.count as f64 * b.gap()?))
        .sum();
    Some(s / total as f64)
}

/// Expected calibration error (`docs/math.md` §4.1):
/// `ECE = Σ_b (n_b/N) · |mean(c_b) − mean(y_b)|` with `B = bins` equal-width bins under `rule`.
///
/// Worked example (`docs/math.md` §4.1): `y = [1,0,1,1,0,1,0,1]`, `c = [0.9,0.8,0.3,0.75,0.1,1.0,0.3,0.0]`, `B = 10`,
/// RLCR rule → 0.331250; constant `c = 1` at accuracy 0.75 → 0.25. Empty input → `None`.
pub fn ece(conf: &[f64], label: &[f64], bins: usize, rule: BinRule) -> Option<f64> {
    ece_from_bins(&reliability_bins(conf, label, bins, rule))
}

/// Slow reference for [`ece`]: for each bin, collect its members and average them.
pub fn ece_reference(conf: &[f64], label: &[f64], bins: usize, rule: BinRule) -> Option<f64> {
    let n = conf.len().min(label.len());
    if n == 0 || bins == 0 {
        return None;
    }
    let mut total = 0.0;
    for b in 0..bins {
        let members: Vec<usize> = (0..n)
            .filter(|&i| bin_index_reference(conf[i], bins, rule) == b)
            .collect();
        if members.is_empty() {
            continue;
        }
        let m = members.len() as f64;
        let mc = members.iter().map(|&i| conf[i]).sum::<f64>() / m;
        let my = members.iter().map(|&i| label[i]).sum::<f64>() / m;
        total += m / n as f64 * (mc - my).abs();
    }
    Some(total)
}

/// Brier score `mean((c − y)²)` over all samples (`docs/math.md` §4.2); `None` when empty.
///
/// Worked example (`docs/math.md` §4.2): 0.287813 for the vector above; 0.25 for constant `c = 1` at accuracy 0.75.
pub fn brier(conf: &[f64], label: &[f64]) -> Option<f64> {
    let n = conf.len().min(label.len());
    if n == 0 {
        return None;
    }
    let s: f64 = conf.iter().zip(label).map(|(c, y)| (c - y) * (c - y)).sum();
    Some(s / n as f64)
}

/// Whether a label counts as a positive (correct) for AUROC: `y ≥ 0.5`.
///
/// Labels are 0/1 in every table rlcr writes (`acc_reward`); the threshold only matters for an
/// external table with graded correctness.
pub fn is_positive(y: f64) -> bool {
    y >= 0.5
}

/// Area under the ROC curve of `score` for separating positives ([`is_positive`]) from
/// negatives, with ties counted ½: the Mann–Whitney statistic
/// `AUROC = P(s⁺ > s⁻) + ½·P(s⁺ = s⁻)`, which equals sklearn's `roc_curve` + `auc`.
///
/// Computed in `O(n log n)` from mid-ranks: sort by score, give each tie group of sorted
/// positions `a..b` (0-based, exclusive end) the doubled mid-rank `a + 1 + b`, sum the doubled
/// ranks `R2` of the positives, then `AUROC = (R2 − n⁺(n⁺+1)) / (2·n⁺·n⁻)`; all in integers
/// until the final division, so the result does not depend on summation order.
///
/// `None` when there are no positives or no negatives (sklearn returns NaN with a warning).
/// Worked example (`docs/math.md` §4.3): 0.633333 for the vector above; a constant score gives 0.5.
pub fn auroc(score: &[f64], label: &[f64]) -> Option<f64> {
    let n = score.len().min(label.len());
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| score[a].total_cmp(&score[b]));
    let mut n_pos: u128 = 0;
    let mut r2: u128 = 0;
    let mut a = 0;
    while a < n {
        let mut b = a + 1;
        while b < n && score[idx[b]] == score[idx[a]] {
            b += 1;
        }
        let pos_here = idx[a..b].iter().filter(|&&i| is_positive(label[i])).count() as u128;
        n_pos += pos_here;
        r2 += pos_here * (a as u128 + 1 + b as u128);
        a = b;
    }
    let n_neg = n as u128 - n_pos;
    if n_pos == 0 || n_neg == 0 {
        return None;
    }
    // R2 ≥ n⁺(n⁺+1) always (the positives' ranks are at least 1..n⁺), so no underflow.
    let num = r2 - n_pos * (n_pos + 1);
    Some(num as f64 / (2 * n_pos * n_neg) as f64)
}

/// Standard error of an AUROC `a` over `n_pos` positives and `n_neg` negatives (Hanley & McNeil
/// 1982): `Q1 = a/(2−a)`, `Q2 = 2a²/(1+a)`,
/// `SE = sqrt((a(1−a) + (n⁺−1)(Q1−a²) + (n⁻−1)(Q2−a²)) / (n⁺·n⁻))`. It treats every row as
/// independent (answers of one prompt are not: with several samples per prompt it is a lower
/// bound). `None` without positives or negatives. The worked vector's (a = 0.633333, 5 positives,
/// 3 negatives) gives 0.210004.
pub fn auroc_se(a: f64, n_pos: u64, n_neg: u64) -> Option<f64> {
    if n_pos == 0 || n_neg == 0 {
        return None;
    }
    let (p, q) = (n_pos as f64, n_neg as f64);
    let q1 = a / (2.0 - a);
    let q2 = 2.0 * a * a / (1.0 + a);
    let v = (a * (1.0 - a) + (p - 1.0) * (q1 - a * a) + (q - 1.0) * (q2 - a * a)) / (p * q);
    Some(v.max(0.0).sqrt())
}

/// Standard error of the ECE by the delta method on its bins: with `d = c − y`, `n_b` rows in
/// bin `b` and `s_b²` the unbiased variance of `d` in the bin (0 for a bin of one row),
/// `SE = sqrt(Σ_b n_b·s_b²) / N`: the spread of each bin's gap `mean(d_b)` weighted by `n_b/N`,
/// the bin weights and the sign of each gap held fixed (near a zero gap, where `|·|` bends, it
/// understates the uncertainty). `None` when empty. The worked vector (RLCR rule, 10 bins): bins 9
/// {−0.1, 0} and 2 {−0.7, 0.3} have variances 0.005 and 0.5, the rest one row each:
/// `sqrt(2·0.005 + 2·0.5)/8 = 0.125623`.
pub fn ece_se(conf: &[f64], label: &[f64], bins: usize, rule: BinRule) -> Option<f64> {
    let n = conf.len().min(label.len());
    if n == 0 || bins == 0 {
        return None;
    }
    let mut groups: Vec<Vec<f64>> = vec![Vec::new(); bins];
    for (&c, &y) in conf.iter().zip(label) {
        groups[bin_index(c, bins, rule)].push(c - y);
    }
    let s: f64 = groups
        .iter()
        .filter_map(|d| Some(d.len() as f64 * std_unbiased(d)?.powi(2)))
        .sum();
    Some(s.sqrt() / n as f64)
}

/// Standard error of the Brier score: the standard error of the mean of `(c − y)²`
/// ([`standard_error_of_mean`]); `None` with fewer than two rows.
pub fn brier_se(conf: &[f64], label: &[f64]) -> Option<f64> {
    let sq: Vec<f64> = conf
        .iter()
        .zip(label)
        .map(|(c, y)| (c - y) * (c - y))
        .collect();
    standard_error_of_mean(&sq)
}

/// Slow reference for [`auroc`]: count all positive/negative pairs, `1` for a win, `½` for a tie.
pub fn auroc_reference(score: &[f64], label: &[f64]) -> Option<f64> {
    let n = score.len().min(label.len());
    let (mut wins, mut pairs) = (0.0, 0u64);
    for i in 0..n {
        if !is_positive(label[i]) {
            continue;
        }
        for j in 0..n {
            if is_positive(label[j]) {
                continue;
            }
            pairs += 1;
            if score[i] > score[j] {
                wins += 1.0;
            } else if score[i] == score[j] {
                wins += 0.5;
            }
        }
    }
    (pairs > 0).then(|| wins / pairs as f64)
}

/// Accuracy (pass@1 over all samples, `docs/math.md` §4.4): `mean(y)` with `y = 1` correct, `0` wrong;
/// `None` when empty.
pub fn accuracy(label: &[f64]) -> Option<f64> {
    mean(label)
}

/// Fraction of `true` flags (format rate, parse rate); `None` when empty.
pub fn rate(flags: &[bool]) -> Option<f64> {
    (!flags.is_empty()).then(|| flags.iter().filter(|&&f| f).count() as f64 / flags.len() as f64)
}

/// Arithmetic mean; `None` when empty.
pub fn mean(x: &[f64]) -> Option<f64> {
    (!x.is_empty()).then(|| x.iter().sum::<f64>() / x.len() as f64)
}

/// Sample standard deviation with Bessel's correction, `sqrt(Σ(x − x̄)² / (n − 1))` (verl,
/// TRL and RLCR all log the unbiased std); `None` when `n < 2`.
pub fn std_unbiased(x: &[f64]) -> Option<f64> {
    if x.len() < 2 {
        return None;
    }
    let m = mean(x)?;
    let ss: f64 = x.iter().map(|v| (v - m) * (v - m)).sum();
    Some((ss / (x.len() - 1) as f64).sqrt())
}

/// Binomial standard error of a proportion `p = k/n`: `sqrt(p(1−p)/n)` (`docs/math.md` §4.5:
/// 37/50 → 0.0620, 25/50 → 0.0707, 0/50 and 50/50 → 0). `None` when `n = 0`.
pub fn binomial_se(k: u64, n: u64) -> Option<f64> {
    if n == 0 {
        return None;
    }
    let p = k as f64 / n as f64;
    Some((p * (1.0 - p) / n as f64).sqrt())
}

/// Standard error of the mean `s / sqrt(n)` with the unbiased `s` ([`std_unbiased`]);
/// `None` when `n < 2`.
pub fn standard_error_of_mean(x: &[f64]) -> Option<f64> {
    Some(std_unbiased(x)? / (x.len() as f64).sqrt())
}

/// Pearson correlation `cov(x, y) / (σ_x σ_y)`; `None` when fewer than two pairs or when either
/// side is constant.
pub fn pearson(x: &[f64], y: &[f64]) -> Option<f64> {
    let n = x.len().min(y.len());
    if n < 2 {
        return None;
    }
    let (x, y) = (&x[..n], &y[..n]);
    let (mx, my) = (mean(x)?, mean(y)?);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    (sxx > 0.0 && syy > 0.0).then(|| sxy / (sxx * syy).sqrt())
}

/// Counts of a histogram with `bins` equal-width bins over `[lo, hi]`.
///
/// Bin of `v`: `min(floor((v − lo)/(hi − lo) · B), B−1)`, values below `lo` go to bin 0 and above
/// `hi` to bin `B−1` (the same closed-last-bin rule as [`BinRule::Floor`]). A degenerate range
/// (`hi ≤ lo`) puts everything in bin 0. Non-finite values are skipped.
pub fn histogram(values: &[f64], lo: f64, hi: f64, bins: usize) -> Vec<u64> {
    let mut counts = vec![0u64; bins];
    if bins == 0 {
        return counts;
    }
    let width = hi - lo;
    for &v in values.iter().filter(|v| v.is_finite()) {
        let b = if width > 0.0 {
            (((v - lo) / width * bins as f64).floor().max(0.0) as usize).min(bins - 1)
        } else {
            0
        };
        counts[b] += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // docs/math.md §4.1–4.3 (copied into fixtures/report/calibration_vectors.json as well).
    const Y: [f64; 8] = [1., 0., 1., 1., 0., 1., 0., 1.];
    const C: [f64; 8] = [0.9, 0.8, 0.3, 0.75, 0.1, 1.0, 0.3, 0.0];

    fn close(a: Option<f64>, b: f64, tol: f64) -> bool {
        matches!(a, Some(a) if (a - b).abs() <= tol)
    }

    #[test]
    fn worked_example_bins_rlcr_rule() {
        let got: Vec<usize> = C.iter().map(|&c| bin_index(c, 10, BinRule::Rlcr)).collect();
        assert_eq!(got, vec![9, 8, 2, 7, 1, 9, 2, 0]);
        assert_eq!(linspace_edge(3, 10), 0.30000000000000004);
    }

    #[test]
    fn worked_example_ece_brier_auroc() {
        assert!(close(ece(&C, &Y, 10, BinRule::Rlcr), 0.331250, 5e-7));
        assert!(close(brier(&C, &Y), 0.287813, 5e-7));
        assert!(close(auroc(&C, &Y), 0.633333, 5e-7));
        // exact fractions behind the rounded figures: Brier 2.3025/8, AUROC 9.5/15
        assert!(close(brier(&C, &Y), 0.287_812_5, 1e-15)); // 2.3025 / 8
        assert!(close(auroc(&C, &Y), 9.5 / 15.0, 1e-15));
    }

    #[test]
    fn calibration_vectors_from_fixture_file() {
        let v: serde_json::Value = serde_json::from_str(include_str!(
            "../../fixtures/report/calibration_vectors.json"
        ))
        .expect("fixture parses");
        let nums = |x: &serde_json::Value| -> Vec<f64> {
            x.as_array()
                .expect("array")
                .iter()
                .map(|n| n.as_f64().expect("number"))
                .collect()
        };
        let cases = v["calibration"].as_array().expect("cases");
        assert_eq!(cases.len(), 2);
        for case in cases {
            let (y, c) = (nums(&case["y"]), nums(&case["c"]));
            let bins = case["bins"].as_u64().expect("bins") as usize;
            let f = |k: &str| case[k].as_f64().expect("figure");
            assert!(
                close(ece(&c, &y, bins, BinRule::Rlcr), f("ece_rlcr"), 5e-7),
                "{}",
                case["name"]
            );
            assert!(close(brier(&c, &y), f("brier"), 5e-7), "{}", case["name"]);
            assert!(close(auroc(&c, &y), f("auroc"), 5e-7), "{}", case["name"]);
            if let Some(idx) = case.get("rlcr_bin_index") {
                let want: Vec<usize> = nums(idx).iter().map(|&i| i as usize).collect();
                let got: Vec<usize> = c
                    .iter()
                    .map(|&x| bin_index(x, bins, BinRule::Rlcr))
                    .collect();
                assert_eq!(got, want);
            }
        }
        for p in v["probe_standard_error"].as_array().expect("probe") {
            let (k, n) = (
                p["correct"].as_u64().expect("k"),
                p["n"].as_u64().expect("n"),
            );
            assert!(close(
                Some(k as f64 / n as f64),
                p["confidence"].as_f64().expect("c"),
                1e-12
            ));
            assert!(close(
                binomial_se(k, n),
                p["se"].as_f64().expect("se"),
                5e-5
            ));
        }
    }

    #[test]
    fn floor_rule_by_hand() {
        // Floor rule: 0.3·10 = 3.0000000000000004 → floor 3, so both 0.3s go to bin 3.
        let got: Vec<usize> = C
            .iter()
            .map(|&c| bin_index(c, 10, BinRule::Floor))
            .collect();
        assert_eq!(got, vec![9, 8, 3, 7, 1, 9, 3, 0]);
        // Bins by hand (c, y):
        //  0: (0.0,1)          |0 − 1|      = 1     × 1/8
        //  1: (0.1,0)          |0.1 − 0|    = 0.1   × 1/8
        //  3: (0.3,1),(0.3,0)  |0.3 − 0.5|  = 0.2   × 2/8
        //  7: (0.75,1)         |0.75 − 1|   = 0.25  × 1/8
        //  8: (0.8,0)          |0.8 − 0|    = 0.8   × 1/8
        //  9: (0.9,1),(1.0,1)  |0.95 − 1|   = 0.05  × 2/8
        // ECE = (1 + 0.1 + 0.4 + 0.25 + 0.8 + 0.1) / 8 = 2.65 / 8 = 0.33125.
        // Same as the RLCR rule here: both 0.3s move together, so the bin mean is unchanged.
        assert!(close(ece(&C, &Y, 10, BinRule::Floor), 0.33125, 1e-12));
        // A case where the rules differ: c = [0.3, 0.25], y = [1, 0].
        // Floor: bins 3 and 2, each alone: (|0.3−1| + |0.25−0|)/2 = 0.475.
        // RLCR: both in bin 2: |0.275 − 0.5| = 0.225.
        let (c, y) = ([0.3, 0.25], [1.0, 0.0]);
        assert!(close(ece(&c, &y, 10, BinRule::Floor), 0.475, 1e-12));
        assert!(close(ece(&c, &y, 10, BinRule::Rlcr), 0.225, 1e-12));
        // 5 bins, floor: c = [0.2, 0.39, 0.4, 0.99, 1.0], y = [0, 1, 1, 1, 0]
        // bins: 1, 1, 2, 4, 4 → bin1 |0.295−0.5|=0.205×2, bin2 |0.4−1|=0.6×1, bin4 |0.995−0.5|=0.495×2
        // ECE = (0.41 + 0.6 + 0.99)/5 = 0.4
        let c = [0.2, 0.39, 0.4, 0.99, 1.0];
        let y = [0.0, 1.0, 1.0, 1.0, 0.0];
        let got: Vec<usize> = c.iter().map(|&v| bin_index(v, 5, BinRule::Floor)).collect();
        assert_eq!(got, vec![1, 1, 2, 4, 4]);
        assert!(close(ece(&c, &y, 5, BinRule::Floor), 0.4, 1e-12));
    }

    #[test]
    fn constant_confidence_rlvr_like() {
        // docs/math.md §4: constant c = 1.0, accuracy 0.75 → ECE 0.25, Brier 0.25, AUROC 0.5.
        let y = [1., 1., 1., 0., 1., 0., 1., 1.];
        let c = [1.0; 8];
        for rule in [BinRule::Floor, BinRule::Rlcr] {
            assert!(close(ece(&c, &y, 10, rule), 0.25, 1e-12));
        }
        assert!(close(brier(&c, &y), 0.25, 1e-12));
        assert!(close(auroc(&c, &y), 0.5, 1e-12));
    }

    #[test]
    fn reliability_table_by_hand() {
        let t = reliability_bins(&C, &Y, 10, BinRule::Rlcr);
        assert_eq!(t.len(), 10);
        let counts: Vec<u64> = t.iter().map(|b| b.count).collect();
        assert_eq!(counts, vec![1, 1, 2, 0, 0, 0, 0, 1, 1, 2]);
        assert_eq!(t[2].mean_confidence, Some(0.3));
        assert_eq!(t[2].accuracy, Some(0.5));
        assert_eq!(t[3].mean_confidence, None);
        assert_eq!(t[9].mean_confidence, Some(0.95));
        assert_eq!(t[3].lower, 0.30000000000000004);
        assert_eq!(t[9].upper, 1.0);
        let f = reliability_bins(&C, &Y, 10, BinRule::Floor);
        assert_eq!(f[3].lower, 0.3);
        assert_eq!(f[3].count, 2);
    }

    #[test]
    fn edge_cases() {
        assert_eq!(ece(&[], &[], 10, BinRule::Floor), None);
        assert_eq!(brier(&[], &[]), None);
        assert_eq!(auroc(&[0.2, 0.3], &[1.0, 1.0]), None);
        assert_eq!(auroc(&[0.2, 0.3], &[0.0, 0.0]), None);
        assert_eq!(auroc(&[0.2, 0.3], &[0.0, 1.0]), Some(1.0));
        assert_eq!(auroc(&[0.2, 0.3], &[1.0, 0.0]), Some(0.0));
        assert_eq!(bin_index(-0.5, 10, BinRule::Floor), 0);
        assert_eq!(bin_index(-0.5, 10, BinRule::Rlcr), 0);
        assert_eq!(bin_index(7.0, 10, BinRule::Rlcr), 9);
        assert_eq!(bin_index(f64::NAN, 10, BinRule::Floor), 0);
        assert_eq!(bin_index(0.5, 1, BinRule::Rlcr), 0);
        assert_eq!(std_unbiased(&[1.0]), None);
        assert_eq!(pearson(&[1.0, 1.0], &[0.0, 1.0]), None);
    }

    #[test]
    fn standard_errors_worked_example() {
        assert!(close(binomial_se(37, 50), 0.0620, 5e-5));
        assert!(close(binomial_se(25, 50), 0.0707, 5e-5));
        assert_eq!(binomial_se(0, 50), Some(0.0));
        assert_eq!(binomial_se(50, 50), Some(0.0));
        assert_eq!(binomial_se(0, 0), None);
        // by hand: sqrt(0.74·0.26/50) = sqrt(0.003848)
        assert!(close(binomial_se(37, 50), 0.003848f64.sqrt(), 1e-15));
    }

    #[test]
    fn small_stats_by_hand() {
        // [2, 4, 4, 4, 5, 5, 7, 9]: mean 5, Σ(x−5)² = 32, unbiased var 32/7.
        let x = [2., 4., 4., 4., 5., 5., 7., 9.];
        assert_eq!(mean(&x), Some(5.0));
        assert_eq!(accuracy(&[1.0, 0.0, 1.0, 1.0]), Some(0.75));
        assert_eq!(rate(&[true, false, false, false]), Some(0.25));
        assert_eq!(rate(&[]), None);
        assert!(close(std_unbiased(&x), (32.0f64 / 7.0).sqrt(), 1e-12));
        assert!(close(
            standard_error_of_mean(&x),
            (32.0f64 / 7.0 / 8.0).sqrt(),
            1e-12
        ));
        // perfectly anti-correlated
        assert!(close(pearson(&[1., 2., 3.], &[3., 2., 1.]), -1.0, 1e-12));
        // [1,2,3] vs [1,3,2]: cov = 1·(−1)·... by hand: dx = [−1,0,1], dy = [−1,1,0] → Σ = 1; 2·2 → 0.5
        assert!(close(pearson(&[1., 2., 3.], &[1., 3., 2.]), 0.5, 1e-12));
        assert_eq!(
            histogram(&[0.0, 0.05, 0.1, 0.95, 1.0, 2.0, -1.0], 0.0, 1.0, 10),
            vec![3, 1, 0, 0, 0, 0, 0, 0, 0, 3]
        );
        assert_eq!(histogram(&[3.0, 3.0], 3.0, 3.0, 4), vec![2, 0, 0, 0]);
        assert_eq!(histogram(&[f64::NAN], 0.0, 1.0, 2), vec![0, 0]);
    }

    fn conf_strategy() -> impl Strategy<Value = f64> {
        // Mix exact multiples of 0.1 (where the rules differ) with arbitrary values.
        prop_oneof![
            (0u32..=10).prop_map(|k| k as f64 / 10.0),
            0.0f64..=1.0,
            (0u32..=20).prop_map(|k| k as f64 * 0.05)
        ]
    }

    proptest! {
        #[test]
        fn bin_index_matches_reference(c in conf_strategy(), bins in 1usize..25) {
            for rule in [BinRule::Floor, BinRule::Rlcr] {
                prop_assert_eq!(bin_index(c, bins, rule), bin_index_reference(c, bins, rule));
            }
        }

        #[test]
        fn ece_matches_reference(
            data in prop::collection::vec((conf_strategy(), prop::bool::ANY), 0..60),
            bins in 1usize..15,
        ) {
            let c: Vec<f64> = data.iter().map(|d| d.0).collect();
            let y: Vec<f64> = data.iter().map(|d| d.1 as u8 as f64).collect();
            for rule in [BinRule::Floor, BinRule::Rlcr] {
                let (a, b) = (ece(&c, &y, bins, rule), ece_reference(&c, &y, bins, rule));
                match (a, b) {
                    (None, None) => {}
                    (Some(a), Some(b)) => prop_assert!((a - b).abs() < 1e-12, "{} vs {}", a, b),
                    _ => prop_assert!(false, "{:?} vs {:?}", a, b),
                }
            }
        }

        #[test]
        fn auroc_matches_reference(data in prop::collection::vec((conf_strategy(), prop::bool::ANY), 0..80)) {
            let c: Vec<f64> = data.iter().map(|d| d.0).collect();
            let y: Vec<f64> = data.iter().map(|d| d.1 as u8 as f64).collect();
            let (a, b) = (auroc(&c, &y), auroc_reference(&c, &y));
            match (a, b) {
                (None, None) => {}
                (Some(a), Some(b)) => prop_assert!((a - b).abs() < 1e-12, "{} vs {}", a, b),
                _ => prop_assert!(false, "{:?} vs {:?}", a, b),
            }
        }
    }

    #[test]
    fn standard_errors_match_hand_calculations() {
        let y = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0];
        let c = [0.9, 0.8, 0.3, 0.75, 0.1, 1.0, 0.3, 0.0];
        let a = auroc(&c, &y).unwrap();
        let se = auroc_se(a, 5, 3).unwrap();
        assert!((se - 0.210_004_288).abs() < 1e-6, "{se}");
        assert_eq!(auroc_se(0.5, 0, 3), None);
        let e = ece_se(&c, &y, 10, BinRule::Rlcr).unwrap();
        assert!((e - 0.125_623_445).abs() < 1e-6, "{e}");
        assert_eq!(ece_se(&[], &[], 10, BinRule::Rlcr), None);
        // (c − y)² = [0.01, 0.64, 0.49, 0.0625, 0.01, 0, 0.09, 1]: mean 0.287813 (docs/math.md §4.2),
        // unbiased std 0.377817, SE = std / sqrt(8) = 0.133578 (numpy: np.std(x, ddof=1)/sqrt(8)).
        let b = brier_se(&c, &y).unwrap();
        assert!((b - 0.133_578).abs() < 1e-5, "{b}");
    }
}
