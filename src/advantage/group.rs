//! Group statistics and group normalisation, the building block of every grouped estimator.
//!
//! Rows carry a dense group id (`0..n_groups`). [`group_stats`] computes count, mean, standard
//! deviation and a zero-std flag per group in two passes (sum, then squared deviations around the
//! mean, both in row order, so the result is exact to the last bit regardless of how the caller
//! batches its work); [`normalized`] turns one reward into an advantage given its group's statistics
//! and the configuration. Keeping the two apart lets callers apply per-row settings (answer rows and
//! confidence rows may use different `--norm`) after one statistics pass.

use super::{Norm, Singleton, StdKind};
use serde::Serialize;

/// How a group of rewards becomes advantages (`--norm`, `--std`, `--eps`, `--singleton`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GroupNorm {
    /// Divide by the std (`Std`) or only centre (`Mean`).
    pub norm: Norm,
    /// Unbiased (N−1) or biased (N) standard deviation.
    pub std: StdKind,
    /// Added to the std before dividing: 1e-6 (verl, KG-R1, GiGPO) or 1e-4 (TRL, RLCR).
    pub eps: f64,
    /// Policy for groups of one row.
    pub singleton: Singleton,
}

impl Default for GroupNorm {
    /// The toolkit defaults (`docs/math.md` §5): std normalisation, unbiased std, eps 1e-6, singleton → 0.
    fn default() -> Self {
        GroupNorm {
            norm: Norm::Std,
            std: StdKind::Unbiased,
            eps: 1e-6,
            singleton: Singleton::Zero,
        }
    }
}

/// Statistics of one group.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct GroupStat {
    /// Number of rows in the group (0 for an id no row uses).
    pub count: u32,
    /// Arithmetic mean (0 for an empty group).
    pub mean: f64,
    /// Standard deviation with the requested convention; 0 for groups of fewer than two rows.
    pub std: f64,
    /// Every value of the group is bit-identical (and there are at least two): std is exactly 0.
    pub zero_std: bool,
}

/// Counts over the groups of one kind, for the statistics the stage logs (`docs/math.md` §2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
pub struct GroupSummary {
    /// Non-empty groups.
    pub groups: usize,
    /// Groups of exactly one row (handled by `--singleton`).
    pub singletons: usize,
    /// Groups of two or more rows whose rewards are all equal (no learning signal).
    pub zero_std: usize,
}

impl GroupSummary {
    /// Summarise a slice of group statistics (empty groups are ignored).
    pub fn of(stats: &[GroupStat]) -> Self {
        let mut s = GroupSummary::default();
        for g in stats {
            if g.count == 0 {
                continue;
            }
            s.groups += 1;
            if g.count == 1 {
                s.singletons += 1;
            } else if g.zero_std {
                s.zero_std += 1;
            }
        }
        s
    }

    /// Fraction of groups with two or more rows that are zero-std (TRL's `frac_reward_zero_std`,
    /// except that singletons are reported apart instead of being counted as zero-std); 0 when
    /// there is no such group.
    pub fn zero_std_fraction(&self) -> f64 {
        let multi = self.groups - self.singletons;
        if multi == 0 {
            0.0
        } else {
            self.zero_std as f64 / multi as f64
        }
    }

    /// Element-wise sum (used to merge answer and confidence summaries).
    pub fn add(&self, o: &GroupSummary) -> GroupSummary {
        GroupSummary {
            groups: self.groups + o.groups,
            singletons: self.singletons + o.singletons,
            zero_std: self.zero_std + o.zero_std,
        }
    }
}

/// Per-group count, mean, standard deviation and zero-std flag.
///
/// Formula: `mean_g = Σ_{i∈g} x_i / n_g`; `std_g = sqrt(Σ_{i∈g} (x_i − mean_g)² / d)` with
/// `d = n_g − 1` (unbiased, `torch.std`) or `d = n_g` (biased).
///
/// Edge cases: groups with no row get `count 0, mean 0, std 0`; a group of one row has std 0 and is
/// not flagged zero-std (singletons are a policy of their own, see [`normalized`]); a group of two or
/// more bit-identical values is flagged `zero_std` (`docs/math.md` §2.1). NaN values make their group's mean
/// and std NaN (the stage rejects non-finite rewards before calling this).
///
/// `groups[i]` must be `< n_groups` and `values.len() == groups.len()` (caller invariants; a
/// violation is a bug and panics).
pub fn group_stats(
    values: &[f64],
    groups: &[u32],
    n_groups: usize,
    std: StdKind,
) -> Vec<GroupStat> {
    assert_eq!(
        values.len(),
        groups.len(),
        "values and groups differ in length"
    );
    let mut stats = vec![GroupStat::default(); n_groups];
    let mut first = vec![0f64; n_groups];
    let mut sums = vec![0f64; n_groups];
    for (&x, &g) in values.iter().zip(groups) {
        let g = g as usize;
        let s = &mut stats[g];
        if s.count == 0 {
            first[g] = x;
            s.zero_std = true;
        } else if x != first[g] {
            s.zero_std = false;
        }
        s.count += 1;
        sums[g] += x;
    }
    for (s, sum) in stats.iter_mut().zip(&sums) {
        if s.count > 0 {
            s.mean = sum / s.count as f64;
        }
        if s.count < 2 {
            s.zero_std = false;
        }
    }
    let mut ss = vec![0f64; n_groups];
    for (&x, &g) in values.iter().zip(groups) {
        let d = x - stats[g as usize].mean;
        ss[g as usize] += d * d;
    }
    for (s, q) in stats.iter_mut().zip(&ss) {
        if s.count >= 2 && !s.zero_std {
            let d = match std {
                StdKind::Unbiased => (s.count - 1) as f64,
                StdKind::Biased => s.count as f64,
            };
            s.std = (q / d).sqrt();
        }
    }
    stats
}

/// The advantage of one value `x` given its group's statistics.
///
/// Formula (verl `compute_grpo_outcome_advantage`, TRL; `docs/math.md` §2.1):
/// `A = (x − mean_g) / (std_g + eps)` with `Norm::Std`, `A = x − mean_g` with `Norm::Mean`.
///
/// Edge cases:
/// - zero-std group (two or more identical values): `A = 0` exactly;
/// - singleton group: `Singleton::Zero` → `A = 0` (TRL, toolkit default); `Singleton::Verl` → mean 0
///   and std 1, so `A = x / (1 + eps)` (or `x` with `Norm::Mean`) (verl, KG-R1).
pub fn normalized(x: f64, s: &GroupStat, cfg: &GroupNorm) -> f64 {
    if s.count <= 1 {
        return match cfg.singleton {
            Singleton::Zero => 0.0,
            Singleton::Verl => match cfg.norm {
                Norm::Std => x / (1.0 + cfg.eps),
                Norm::Mean => x,
            },
        };
    }
    if s.zero_std {
        return 0.0;
    }
    match cfg.norm {
        Norm::Std => (x - s.mean) / (s.std + cfg.eps),
        Norm::Mean => x - s.mean,
    }
}

/// Normalise every value within its group: [`group_stats`] then [`normalized`] per row.
/// Returns the advantages (one per row) and the group statistics.
pub fn normalize_in_groups(
    values: &[f64],
    groups: &[u32],
    n_groups: usize,
    cfg: &GroupNorm,
) -> (Vec<f64>, Vec<GroupStat>) {
    let stats = group_stats(values, groups, n_groups, cfg.std);
    let adv = values
        .iter()
        .zip(groups)
        .map(|(&x, &g)| normalized(x, &stats[g as usize], cfg))
        .collect();
    (adv, stats)
}

/// Number of groups implied by a dense id slice (`max + 1`, 0 when empty).
pub fn n_groups_of(groups: &[u32]) -> usize {
    groups.iter().map(|&g| g as usize + 1).max().unwrap_or(0)
}

/// Slow, obvious reference for [`normalize_in_groups`]: for every row, collect its group's members
/// by scanning all rows and apply [`normalized_ref`].
pub fn normalize_in_groups_ref(values: &[f64], groups: &[u32], cfg: &GroupNorm) -> Vec<f64> {
    (0..values.len())
        .map(|i| {
            let members: Vec<f64> = (0..values.len())
                .filter(|&j| groups[j] == groups[i])
                .map(|j| values[j])
                .collect();
            normalized_ref(values[i], &members, cfg)
        })
        .collect()
}

/// Slow, obvious reference for one value `x` of a group whose values are `members` (textbook
/// formulas, same edge-case policy as [`normalized`]).
pub fn normalized_ref(x: f64, members: &[f64], cfg: &GroupNorm) -> f64 {
    let n = members.len();
    if n <= 1 {
        return match (cfg.singleton, cfg.norm) {
            (Singleton::Zero, _) => 0.0,
            (Singleton::Verl, Norm::Std) => x / (1.0 + cfg.eps),
            (Singleton::Verl, Norm::Mean) => x,
        };
    }
    if members.iter().all(|&m| m == members[0]) {
        return 0.0;
    }
    let mean = members.iter().sum::<f64>() / n as f64;
    let ss: f64 = members.iter().map(|m| (m - mean) * (m - mean)).sum();
    let d = match cfg.std {
        StdKind::Unbiased => n as f64 - 1.0,
        StdKind::Biased => n as f64,
    };
    match cfg.norm {
        Norm::Std => (x - mean) / ((ss / d).sqrt() + cfg.eps),
        Norm::Mean => x - mean,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= tol,
                "index {i}: {x} vs {y} (tol {tol}); {a:?} vs {b:?}"
            );
        }
    }

    fn cfg(norm: Norm, std: StdKind, eps: f64, singleton: Singleton) -> GroupNorm {
        GroupNorm {
            norm,
            std,
            eps,
            singleton,
        }
    }

    fn one_group(v: &[f64], c: &GroupNorm) -> Vec<f64> {
        let g = vec![0u32; v.len()];
        let (a, _) = normalize_in_groups(v, &g, 1, c);
        close(&a, &normalize_in_groups_ref(v, &g, c), 1e-12);
        a
    }

    // docs/math.md §2.1 worked table, columns: verl (unbiased, 1e-6), biased 1e-6, TRL (unbiased, 1e-4), Dr.GRPO.
    #[test]
    fn grpo_worked_table() {
        let verl = cfg(Norm::Std, StdKind::Unbiased, 1e-6, Singleton::Verl);
        let biased = cfg(Norm::Std, StdKind::Biased, 1e-6, Singleton::Verl);
        let trl = cfg(Norm::Std, StdKind::Unbiased, 1e-4, Singleton::Zero);
        let dr = cfg(Norm::Mean, StdKind::Unbiased, 1e-6, Singleton::Verl);
        let t = 1e-6;

        let r = [1.0, 0.0, 0.0, 1.0];
        close(
            &one_group(&r, &verl),
            &[0.866024, -0.866024, -0.866024, 0.866024],
            t,
        );
        close(
            &one_group(&r, &biased),
            &[0.999998, -0.999998, -0.999998, 0.999998],
            t,
        );
        close(
            &one_group(&r, &trl),
            &[0.865875, -0.865875, -0.865875, 0.865875],
            t,
        );
        close(&one_group(&r, &dr), &[0.5, -0.5, -0.5, 0.5], t);

        let r = [1.0, 0.0, 0.0, 0.0];
        close(
            &one_group(&r, &verl),
            &[1.499997, -0.499999, -0.499999, -0.499999],
            t,
        );
        close(
            &one_group(&r, &biased),
            &[1.732047, -0.577349, -0.577349, -0.577349],
            t,
        );
        // TRL column is given to 4 d.p. in the worked table; check it there and against a hand value.
        let a = one_group(&r, &trl);
        close(&a, &[1.4997, -0.4999, -0.4999, -0.4999], 1e-4);
        close(
            &a,
            &[
                0.75 / 0.5001,
                -0.25 / 0.5001,
                -0.25 / 0.5001,
                -0.25 / 0.5001,
            ],
            1e-12,
        );
        close(&one_group(&r, &dr), &[0.75, -0.25, -0.25, -0.25], t);

        let r = [1.0, 1.0, 1.0, 1.0];
        for c in [&verl, &biased, &trl, &dr] {
            assert_eq!(one_group(&r, c), vec![0.0; 4]);
        }

        let r = [0.2, 0.9, 0.5];
        close(&one_group(&r, &verl), &[-0.949155, 1.044071, -0.094916], t);
        close(
            &one_group(&r, &biased),
            &[-1.162472, 1.278720, -0.116247],
            t,
        );
        close(&one_group(&r, &trl), &[-0.948888, 1.043777, -0.094889], t);
        close(&one_group(&r, &dr), &[-0.333333, 0.366667, -0.033333], t);

        // Singleton: verl 0.7/(1+1e-6), TRL 0; Dr.GRPO verl 0.7 / TRL 0.
        close(&one_group(&[0.7], &verl), &[0.699999], t);
        assert_eq!(one_group(&[0.7], &trl), vec![0.0]);
        close(&one_group(&[0.7], &dr), &[0.7], 1e-15);
        let dr_zero = cfg(Norm::Mean, StdKind::Unbiased, 1e-6, Singleton::Zero);
        assert_eq!(one_group(&[0.7], &dr_zero), vec![0.0]);
    }

    #[test]
    fn zero_std_is_exact_even_when_the_mean_rounds() {
        // 0.1 * 3 / 3 != 0.1 in floating point; the group is still flagged and gets exact zeros.
        let v = [0.1, 0.1, 0.1];
        let s = group_stats(&v, &[0, 0, 0], 1, StdKind::Unbiased);
        assert!(s[0].zero_std);
        assert_eq!(s[0].std, 0.0);
        let c = GroupNorm::default();
        assert_eq!(one_group(&v, &c), vec![0.0; 3]);
        assert_eq!(
            one_group(
                &v,
                &GroupNorm {
                    norm: Norm::Mean,
                    ..c
                }
            ),
            vec![0.0; 3]
        );
    }

    #[test]
    fn summary_counts_and_fraction() {
        // groups: 0 = {1,0} (signal), 1 = {1,1} (zero std), 2 = {0.5} (singleton), 3 unused.
        let v = [1.0, 0.0, 1.0, 1.0, 0.5];
        let g = [0, 0, 1, 1, 2];
        let s = GroupSummary::of(&group_stats(&v, &g, 4, StdKind::Unbiased));
        assert_eq!(
            s,
            GroupSummary {
                groups: 3,
                singletons: 1,
                zero_std: 1
            }
        );
        assert!((s.zero_std_fraction() - 0.5).abs() < 1e-15);
        assert_eq!(GroupSummary::default().zero_std_fraction(), 0.0);
    }

    fn arb_cfg() -> impl Strategy<Value = GroupNorm> {
        (
            prop_oneof![Just(Norm::Std), Just(Norm::Mean)],
            prop_oneof![Just(StdKind::Unbiased), Just(StdKind::Biased)],
            prop_oneof![Just(1e-6), Just(1e-4)],
            prop_oneof![Just(Singleton::Zero), Just(Singleton::Verl)],
        )
            .prop_map(|(norm, std, eps, singleton)| GroupNorm {
                norm,
                std,
                eps,
                singleton,
            })
    }

    /// Rewards drawn from a small set so that ties and zero-std groups are common.
    pub(crate) fn arb_rows(max: usize) -> impl Strategy<Value = (Vec<f64>, Vec<u32>)> {
        prop::collection::vec(
            (
                prop_oneof![
                    Just(0.0),
                    Just(1.0),
                    Just(0.5),
                    -3.0f64..3.0,
                    (0u8..=10).prop_map(|c| 1.0 - (1.0 - c as f64 / 10.0).powi(2))
                ],
                0u32..6,
            ),
            1..max,
        )
        .prop_map(|rows| rows.into_iter().unzip())
    }

    proptest! {
        #[test]
        fn fast_equals_reference((v, g) in arb_rows(40), c in arb_cfg()) {
            let n = n_groups_of(&g);
            let (a, _) = normalize_in_groups(&v, &g, n, &c);
            let r = normalize_in_groups_ref(&v, &g, &c);
            for (x, y) in a.iter().zip(&r) {
                prop_assert!((x - y).abs() <= 1e-9 * (1.0 + y.abs()), "{} vs {}", x, y);
            }
        }

        /// Per group (two or more rows): advantages sum to zero with `--norm mean`, and have zero
        /// mean with `--norm std` (the std is a per-group constant, so the sum is zero as well).
        #[test]
        fn groups_sum_to_zero((v, g) in arb_rows(40), c in arb_cfg()) {
            let n = n_groups_of(&g);
            let (a, stats) = normalize_in_groups(&v, &g, n, &c);
            for (gid, s) in stats.iter().enumerate() {
                if s.count < 2 { continue; }
                let sum: f64 = a.iter().zip(&g).filter(|(_, &h)| h as usize == gid).map(|(x, _)| x).sum();
                let scale = match c.norm { Norm::Std => 1.0, Norm::Mean => 3.0 };
                prop_assert!(sum.abs() <= 1e-9 * scale * s.count as f64, "group {} sums to {}", gid, sum);
            }
        }

        /// With `--norm std` and unbiased std, a group with signal has sample std ≈ 1 (up to eps).
        #[test]
        fn unit_std_within_group((v, g) in arb_rows(40)) {
            let c = GroupNorm::default();
            let n = n_groups_of(&g);
            let (a, stats) = normalize_in_groups(&v, &g, n, &c);
            let (a_stats, _) = (group_stats(&a, &g, n, StdKind::Unbiased), ());
            for (s, t) in stats.iter().zip(&a_stats) {
                if s.count >= 2 && !s.zero_std && s.std > 1e-3 {
                    let expect = s.std / (s.std + c.eps);
                    prop_assert!((t.std - expect).abs() < 1e-9, "{} vs {}", t.std, expect);
                }
            }
        }
    }
}
