//! Sequence-level (outcome) estimators: GRPO, RLOO and the RLCR confidence tree.
//!
//! Each returns one advantage per row plus the per-row zero-std flag (for `--drop-zero-std`) and
//! group summaries (for the logged statistics). Lambdas are applied by the tree; for GRPO and RLOO the
//! caller multiplies by a per-type weight if it wants one.
//!
//! The tree is group normalisation with a particular keying: answer rows are grouped by
//! prompt, confidence rows by *their own answer* `(prompt, answer_idx)`. Confidences of different
//! answers are never pooled: an answer's correctness changes every one of its confidences' Brier
//! rewards by the same kind of shift, and pooling would turn that into confidence advantages
//! (`docs/math.md` §2.3, variant (b), shows the leak). The optional prompt-level step (variant
//! (c)) keeps the per-answer centring and only rescales by the prompt-level spread.

use super::group::{
    group_stats, normalize_in_groups, normalized, GroupNorm, GroupStat, GroupSummary,
};
use super::{ConfNorm, Norm, Singleton};
use serde::Serialize;

/// The two row types of the RLCR tree (`sample_type`): the table's own enum.
pub use crate::table::SampleType;

/// Result of a grouped outcome estimator.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// One advantage per row.
    pub advantages: Vec<f64>,
    /// The row belongs to a zero-std group (no learning signal; `--drop-zero-std` masks it).
    pub zero_std: Vec<bool>,
    /// Per-group statistics, indexed by group id.
    pub stats: Vec<GroupStat>,
    /// Counts over the groups.
    pub summary: GroupSummary,
}

/// Outcome GRPO (verl `compute_grpo_outcome_advantage`, TRL; `docs/math.md` §2.1):
/// `A_i = (s_i − mean_g) / (std_g + eps)` (or `s_i − mean_g` with `Norm::Mean`, Dr.GRPO), where `s_i`
/// is the row's sequence score (reward, minus the KL penalty when there is one).
///
/// Edge cases: see [`normalized`] (singleton by `cfg.singleton`, zero-std groups give exactly 0).
pub fn grpo(scores: &[f64], groups: &[u32], n_groups: usize, cfg: &GroupNorm) -> Outcome {
    let (advantages, stats) = normalize_in_groups(scores, groups, n_groups, cfg);
    finish(advantages, groups, stats)
}

fn finish(advantages: Vec<f64>, groups: &[u32], stats: Vec<GroupStat>) -> Outcome {
    let zero_std = groups.iter().map(|&g| stats[g as usize].zero_std).collect();
    let summary = GroupSummary::of(&stats);
    Outcome {
        advantages,
        zero_std,
        stats,
        summary,
    }
}

/// RLOO (verl `rloo`; `docs/math.md` §2.2): for a group of `n > 1` rows,
/// `A_i = s_i − mean(s_j, j ≠ i) = n/(n−1) · (s_i − mean_g)`; no std scaling (`--norm`, `--std` and
/// `--eps` do not apply).
///
/// Edge cases: singleton → `s_i` under `Singleton::Verl` (verl), 0 under `Singleton::Zero`;
/// zero-std group → exactly 0.
pub fn rloo(scores: &[f64], groups: &[u32], n_groups: usize, singleton: Singleton) -> Outcome {
    let stats = group_stats(scores, groups, n_groups, super::StdKind::Unbiased);
    let mut sums = vec![0f64; n_groups];
    for (&x, &g) in scores.iter().zip(groups) {
        sums[g as usize] += x;
    }
    let advantages = scores
        .iter()
        .zip(groups)
        .map(|(&x, &g)| {
            let s = &stats[g as usize];
            if s.count <= 1 {
                match singleton {
                    Singleton::Zero => 0.0,
                    Singleton::Verl => x,
                }
            } else if s.zero_std {
                0.0
            } else {
                x - (sums[g as usize] - x) / (s.count - 1) as f64
            }
        })
        .collect();
    finish(advantages, groups, stats)
}

/// Slow reference for [`rloo`]: the mean of the other rows, by an explicit loop.
pub fn rloo_ref(scores: &[f64], groups: &[u32], singleton: Singleton) -> Vec<f64> {
    (0..scores.len())
        .map(|i| {
            let members: Vec<usize> = (0..scores.len())
                .filter(|&j| groups[j] == groups[i])
                .collect();
            if members.len() == 1 {
                return match singleton {
                    Singleton::Zero => 0.0,
                    Singleton::Verl => scores[i],
                };
            }
            if members.iter().all(|&j| scores[j] == scores[i]) {
                return 0.0;
            }
            let others: Vec<f64> = members
                .iter()
                .filter(|&&j| j != i)
                .map(|&j| scores[j])
                .collect();
            scores[i] - others.iter().sum::<f64>() / others.len() as f64
        })
        .collect()
}

/// Settings of the RLCR tree (`--norm`/`--std`/`--eps`/`--singleton` per branch, `--lambda-ans`,
/// `--lambda-conf`, `--conf-norm`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TreeConfig {
    /// Normalisation of answer rows within their prompt.
    pub ans: GroupNorm,
    /// Normalisation of confidence rows within their answer (and, with `AnswerPrompt`, the
    /// prompt-level scaling step).
    pub conf: GroupNorm,
    /// Multiplies every answer advantage.
    pub lambda_ans: f64,
    /// Multiplies every confidence advantage.
    pub lambda_conf: f64,
    /// Level 1 only, or variant (c) with a prompt-level second step.
    pub conf_norm: ConfNorm,
}

impl Default for TreeConfig {
    fn default() -> Self {
        TreeConfig {
            ans: GroupNorm::default(),
            conf: GroupNorm::default(),
            lambda_ans: 1.0,
            lambda_conf: 1.0,
            conf_norm: ConfNorm::Answer,
        }
    }
}

/// Result of [`rlcr_tree`].
#[derive(Clone, Debug, PartialEq)]
pub struct TreeOutput {
    /// One advantage per row, lambdas applied.
    pub advantages: Vec<f64>,
    /// Answer rows: the prompt's answer group is zero-std. Confidence rows: the answer's confidence
    /// group is zero-std (level 1; its centred values are all 0).
    pub zero_std: Vec<bool>,
    /// Answer groups (one per prompt with answer rows).
    pub answers: GroupSummary,
    /// Confidence groups (one per answer with confidence rows).
    pub confidences: GroupSummary,
    /// The prompt-level groups of the second step (only with `ConfNorm::AnswerPrompt`).
    pub prompt_level: Option<GroupSummary>,
}

/// The RLCR tree estimator (`docs/math.md` §2.3, with its worked tree).
///
/// Inputs per row: `rewards[i]` (acc reward on answer rows, Brier reward on confidence rows),
/// `kinds[i]`, `prompt[i]` (dense prompt id, `< n_prompts`) and `answer[i]` (dense id of the row's
/// `(prompt, answer_idx)`, `< n_answers`; only read on confidence rows).
///
/// Formulas:
/// - answer row (j,k): `A = λ_ans · norm_ans(r_jk; {r_jk' : k'})`, the group being the prompt's answers;
/// - confidence row (j,k,h), `ConfNorm::Answer`: `A = λ_conf · norm_conf(r_jkh; {r_jkh' : h'})`, the
///   group being the G_c confidences of answer (j,k) only;
/// - `ConfNorm::AnswerPrompt` (variant (c)): `x_jkh = r_jkh − mean_h'(r_jkh')` (centring within the
///   answer), then `A = λ_conf · norm_conf(x_jkh; {x_jk'h' : k', h'})` over the prompt's G_a·G_c
///   centred values.
///
/// Edge cases: groups of one row follow `singleton` of their branch (for the centring of variant (c),
/// `Singleton::Verl` keeps `x = r`, `Zero` gives `x = 0`); zero-std groups give exactly 0 (a
/// degenerate answer, acc 1 with confidences [1, 1, 1], gets [0, 0, 0]).
///
/// Invariant (tested): with `ConfNorm::Answer`, the advantages of one answer's confidences depend on
/// that answer's confidence rewards only.
pub fn rlcr_tree(
    rewards: &[f64],
    kinds: &[SampleType],
    prompt: &[u32],
    answer: &[u32],
    n_prompts: usize,
    n_answers: usize,
    cfg: &TreeConfig,
) -> TreeOutput {
    let n = rewards.len();
    assert!(
        kinds.len() == n && prompt.len() == n && answer.len() == n,
        "tree inputs differ in length"
    );
    // One id space: answer rows use their prompt id, confidence rows n_prompts + their answer id.
    let gid: Vec<u32> = (0..n)
        .map(|i| match kinds[i] {
            SampleType::Answer => prompt[i],
            SampleType::Confidence => (n_prompts + answer[i] as usize) as u32,
        })
        .collect();
    // Level-1 statistics use the confidence branch's std convention for confidence groups and the
    // answer branch's for answer groups; compute with each and pick.
    let stats_a = group_stats(rewards, &gid, n_prompts + n_answers, cfg.ans.std);
    let stats_c = if cfg.conf.std == cfg.ans.std {
        None
    } else {
        Some(group_stats(
            rewards,
            &gid,
            n_prompts + n_answers,
            cfg.conf.std,
        ))
    };
    let stats_c = stats_c.as_ref().unwrap_or(&stats_a);
    let answers = GroupSummary::of(&stats_a[..n_prompts]);
    let confidences = GroupSummary::of(&stats_c[n_prompts..]);
    let zero_std: Vec<bool> = (0..n)
        .map(|i| match kinds[i] {
            SampleType::Answer => stats_a[gid[i] as usize].zero_std,
            SampleType::Confidence => stats_c[gid[i] as usize].zero_std,
        })
        .collect();

    let mut advantages = vec![0f64; n];
    let mut prompt_level = None;
    match cfg.conf_norm {
        ConfNorm::Answer => {
            for i in 0..n {
                advantages[i] = match kinds[i] {
                    SampleType::Answer => {
                        cfg.lambda_ans * normalized(rewards[i], &stats_a[gid[i] as usize], &cfg.ans)
                    }
                    SampleType::Confidence => {
                        cfg.lambda_conf
                            * normalized(rewards[i], &stats_c[gid[i] as usize], &cfg.conf)
                    }
                };
            }
        }
        ConfNorm::AnswerPrompt => {
            let centre = GroupNorm {
                norm: Norm::Mean,
                ..cfg.conf
            };
            // Level 1 (centre) for confidence rows; level-2 groups: confidence rows by prompt.
            let mut x = vec![0f64; n];
            for i in 0..n {
                if kinds[i] == SampleType::Confidence {
                    x[i] = normalized(rewards[i], &stats_c[gid[i] as usize], &centre);
                }
            }
            // Answer rows get a dummy group (id n_prompts) so they never enter level-2 statistics.
            let g2: Vec<u32> = (0..n)
                .map(|i| match kinds[i] {
                    SampleType::Answer => n_prompts as u32,
                    SampleType::Confidence => prompt[i],
                })
                .collect();
            let stats2 = group_stats(&x, &g2, n_prompts + 1, cfg.conf.std);
            prompt_level = Some(GroupSummary::of(&stats2[..n_prompts]));
            for i in 0..n {
                advantages[i] = match kinds[i] {
                    SampleType::Answer => {
                        cfg.lambda_ans * normalized(rewards[i], &stats_a[gid[i] as usize], &cfg.ans)
                    }
                    SampleType::Confidence => {
                        cfg.lambda_conf * normalized(x[i], &stats2[g2[i] as usize], &cfg.conf)
                    }
                };
            }
        }
    }
    TreeOutput {
        advantages,
        zero_std,
        answers,
        confidences,
        prompt_level,
    }
}

/// Slow reference for [`rlcr_tree`]: every row scans the table for its group's members.
pub fn rlcr_tree_ref(
    rewards: &[f64],
    kinds: &[SampleType],
    prompt: &[u32],
    answer: &[u32],
    cfg: &TreeConfig,
) -> Vec<f64> {
    use super::group::normalized_ref;
    let n = rewards.len();
    let conf_members = |i: usize| -> Vec<usize> {
        (0..n)
            .filter(|&j| {
                kinds[j] == SampleType::Confidence
                    && prompt[j] == prompt[i]
                    && answer[j] == answer[i]
            })
            .collect()
    };
    let centred = |i: usize| -> f64 {
        let m: Vec<f64> = conf_members(i).iter().map(|&j| rewards[j]).collect();
        let centre = GroupNorm {
            norm: Norm::Mean,
            ..cfg.conf
        };
        normalized_ref(rewards[i], &m, &centre)
    };
    (0..n)
        .map(|i| match kinds[i] {
            SampleType::Answer => {
                let m: Vec<f64> = (0..n)
                    .filter(|&j| kinds[j] == SampleType::Answer && prompt[j] == prompt[i])
                    .map(|j| rewards[j])
                    .collect();
                cfg.lambda_ans * normalized_ref(rewards[i], &m, &cfg.ans)
            }
            SampleType::Confidence => match cfg.conf_norm {
                ConfNorm::Answer => {
                    let m: Vec<f64> = conf_members(i).iter().map(|&j| rewards[j]).collect();
                    cfg.lambda_conf * normalized_ref(rewards[i], &m, &cfg.conf)
                }
                ConfNorm::AnswerPrompt => {
                    let m: Vec<f64> = (0..n)
                        .filter(|&j| kinds[j] == SampleType::Confidence && prompt[j] == prompt[i])
                        .map(centred)
                        .collect();
                    cfg.lambda_conf * normalized_ref(centred(i), &m, &cfg.conf)
                }
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::group::n_groups_of;
    use super::super::group::tests::{arb_rows, close};
    use super::super::StdKind;
    use super::*;
    use proptest::prelude::*;

    /// The worked tree of `docs/math.md` §2.3: one prompt, answer 1 correct with confidences [0.9, 0.6, 0.3], answer 2 wrong
    /// with [0.2, 0.5, 0.8]. Rows: the two answers, then the six confidences.
    fn tree_3_2() -> (Vec<f64>, Vec<SampleType>, Vec<u32>, Vec<u32>) {
        let brier = |acc: f64, c: f64| 1.0 - (acc - c) * (acc - c);
        let mut r = vec![1.0, 0.0];
        let mut k = vec![SampleType::Answer; 2];
        let mut a = vec![0, 1];
        for (ans, acc, cs) in [(0u32, 1.0, [0.9, 0.6, 0.3]), (1, 0.0, [0.2, 0.5, 0.8])] {
            for c in cs {
                r.push(brier(acc, c));
                k.push(SampleType::Confidence);
                a.push(ans);
            }
        }
        let p = vec![0; 8];
        (r, k, p, a)
    }

    fn run(cfg: &TreeConfig) -> Vec<f64> {
        let (r, k, p, a) = tree_3_2();
        let out = rlcr_tree(&r, &k, &p, &a, 1, 2, cfg);
        close(&out.advantages, &rlcr_tree_ref(&r, &k, &p, &a, cfg), 1e-12);
        out.advantages
    }

    fn conf(norm: Norm, std: StdKind, eps: f64) -> TreeConfig {
        let g = GroupNorm {
            norm,
            std,
            eps,
            singleton: Singleton::Verl,
        };
        TreeConfig {
            ans: g,
            conf: g,
            ..TreeConfig::default()
        }
    }

    #[test]
    fn worked_tree_brier_rewards() {
        let (r, ..) = tree_3_2();
        close(&r[2..], &[0.99, 0.84, 0.51, 0.96, 0.75, 0.36], 1e-12);
    }

    #[test]
    fn worked_tree_level_one() {
        let t = 1e-6;
        let a = run(&conf(Norm::Std, StdKind::Unbiased, 1e-6));
        close(
            &a[2..],
            &[0.855183, 0.244338, -1.099521, 0.886793, 0.197065, -1.083859],
            t,
        );
        // Answer rows [1, 0]: mean 0.5, unbiased std sqrt(0.5).
        let h = 0.5 / (0.5f64.sqrt() + 1e-6);
        close(&a[..2], &[h, -h], 1e-12);
        let a = run(&conf(Norm::Std, StdKind::Biased, 1e-6));
        close(
            &a[2..],
            &[1.047380, 0.299251, -1.346631, 1.086095, 0.241354, -1.327449],
            t,
        );
        let a = run(&conf(Norm::Mean, StdKind::Unbiased, 1e-6));
        close(&a[2..], &[0.21, 0.06, -0.27, 0.27, 0.06, -0.33], t);
        close(&a[..2], &[0.5, -0.5], 1e-12);
        // eps 1e-4 (TRL/RLCR): by hand for answer 1, std = sqrt(0.0639) (deviations .21 .06 -.27).
        let a = run(&conf(Norm::Std, StdKind::Unbiased, 1e-4));
        let s = ((0.21f64 * 0.21 + 0.06 * 0.06 + 0.27 * 0.27) / 2.0).sqrt();
        close(
            &a[2..5],
            &[0.21 / (s + 1e-4), 0.06 / (s + 1e-4), -0.27 / (s + 1e-4)],
            1e-9,
        );
    }

    #[test]
    fn worked_tree_variant_c_answer_then_prompt() {
        let mut c = conf(Norm::Std, StdKind::Unbiased, 1e-6);
        c.conf_norm = ConfNorm::AnswerPrompt;
        let a = run(&c);
        close(
            &a[2..],
            &[0.848871, 0.242535, -1.091406, 1.091406, 0.242535, -1.333941],
            1e-6,
        );
    }

    #[test]
    fn worked_tree_variant_b_pooled_is_grpo_by_prompt() {
        // Variant (b) is not a tree option (it leaks correctness); it is GRPO over the prompt's
        // confidence rows, which is what `--estimator grpo` does per (prompt, type).
        let (r, ..) = tree_3_2();
        let out = grpo(&r[2..], &[0; 6], 1, &GroupNorm::default());
        close(
            &out.advantages,
            &[1.010898, 0.416252, -0.891969, 0.891969, 0.059465, -1.486615],
            1e-6,
        );
    }

    #[test]
    fn worked_tree_variant_d_gigpo_sum_composes() {
        let (r, k, p, a) = tree_3_2();
        let centre = GroupNorm {
            norm: Norm::Mean,
            ..GroupNorm::default()
        };
        let prompt = grpo(&r[2..], &[0; 6], 1, &centre);
        let tc = TreeConfig {
            ans: centre,
            conf: centre,
            ..TreeConfig::default()
        };
        let tree = rlcr_tree(&r, &k, &p, &a, 1, 2, &tc);
        let sum: Vec<f64> = (0..6)
            .map(|i| prompt.advantages[i] + tree.advantages[i + 2])
            .collect();
        close(&sum, &[0.465, 0.165, -0.495, 0.495, 0.075, -0.705], 1e-6);
    }

    #[test]
    fn degenerate_answer_gets_zeros_and_is_flagged() {
        let r = vec![1.0, 0.0, 1.0, 1.0, 1.0, 0.9, 0.5, 0.7];
        let k = [
            [SampleType::Answer; 2].as_slice(),
            &[SampleType::Confidence; 6],
        ]
        .concat();
        let a = vec![0, 1, 0, 0, 0, 1, 1, 1];
        let out = rlcr_tree(&r, &k, &[0; 8], &a, 1, 2, &TreeConfig::default());
        assert_eq!(&out.advantages[2..5], &[0.0, 0.0, 0.0]);
        assert_eq!(
            out.zero_std,
            vec![false, false, true, true, true, false, false, false]
        );
        assert_eq!(
            out.confidences,
            GroupSummary {
                groups: 2,
                singletons: 0,
                zero_std: 1
            }
        );
        assert_eq!(
            out.answers,
            GroupSummary {
                groups: 1,
                singletons: 0,
                zero_std: 0
            }
        );
    }

    #[test]
    fn lambdas_scale_each_branch() {
        let base = run(&TreeConfig::default());
        let scaled = run(&TreeConfig {
            lambda_ans: 2.0,
            lambda_conf: 0.25,
            ..TreeConfig::default()
        });
        for i in 0..8 {
            let l = if i < 2 { 2.0 } else { 0.25 };
            assert!((scaled[i] - l * base[i]).abs() < 1e-15);
        }
    }

    #[test]
    fn rloo_worked_example() {
        let out = rloo(&[1.0, 0.0, 0.0, 1.0], &[0; 4], 1, Singleton::Verl);
        close(
            &out.advantages,
            &[0.666667, -0.666667, -0.666667, 0.666667],
            1e-6,
        );
        assert_eq!(rloo(&[0.7], &[0], 1, Singleton::Verl).advantages, vec![0.7]);
        assert_eq!(rloo(&[0.7], &[0], 1, Singleton::Zero).advantages, vec![0.0]);
        assert_eq!(
            rloo(&[0.3; 3], &[0; 3], 1, Singleton::Zero).advantages,
            vec![0.0; 3]
        );
    }

    /// `r` with the confidence rewards of answer `victim` replaced by `noise` (cycled).
    fn with_confidences_of(
        r: &[f64],
        k: &[SampleType],
        a: &[u32],
        victim: u32,
        noise: &[f64],
    ) -> Vec<f64> {
        let mut r2 = r.to_vec();
        let mut n = 0;
        for i in 0..r.len() {
            if k[i] == SampleType::Confidence && a[i] == victim {
                r2[i] = noise[n % noise.len()];
                n += 1;
            }
        }
        r2
    }

    /// A random tree: prompts × answers (1..4) × confidences (1..4) with rewards from a small set.
    fn arb_tree(
    ) -> impl Strategy<Value = (Vec<f64>, Vec<SampleType>, Vec<u32>, Vec<u32>, usize, usize)> {
        prop::collection::vec(
            prop::collection::vec(prop::collection::vec(0u8..6, 1..4), 1..4),
            1..4,
        )
        .prop_map(|prompts| {
            let (mut r, mut k, mut p, mut a) = (vec![], vec![], vec![], vec![]);
            let mut n_ans = 0u32;
            for (j, answers) in prompts.iter().enumerate() {
                for confs in answers {
                    // answer reward: 1 if the first draw is even.
                    r.push(if confs[0] % 2 == 0 { 1.0 } else { 0.0 });
                    k.push(SampleType::Answer);
                    p.push(j as u32);
                    a.push(n_ans);
                    for &c in confs {
                        r.push(1.0 - (c as f64 / 5.0 - 0.5).powi(2));
                        k.push(SampleType::Confidence);
                        p.push(j as u32);
                        a.push(n_ans);
                    }
                    n_ans += 1;
                }
            }
            let np = prompts.len();
            (r, k, p, a, np, n_ans as usize)
        })
    }

    fn arb_tree_cfg() -> impl Strategy<Value = TreeConfig> {
        (
            prop_oneof![Just(Norm::Std), Just(Norm::Mean)],
            prop_oneof![Just(StdKind::Unbiased), Just(StdKind::Biased)],
            prop_oneof![Just(Singleton::Zero), Just(Singleton::Verl)],
            prop_oneof![Just(ConfNorm::Answer), Just(ConfNorm::AnswerPrompt)],
            0.1f64..2.0,
        )
            .prop_map(|(norm, std, singleton, conf_norm, l)| {
                let g = GroupNorm {
                    norm,
                    std,
                    eps: 1e-6,
                    singleton,
                };
                TreeConfig {
                    ans: g,
                    conf: g,
                    lambda_ans: 1.0,
                    lambda_conf: l,
                    conf_norm,
                }
            })
    }

    proptest! {
        #[test]
        fn tree_fast_equals_reference((r, k, p, a, np, na) in arb_tree(), cfg in arb_tree_cfg()) {
            let out = rlcr_tree(&r, &k, &p, &a, np, na, &cfg);
            let slow = rlcr_tree_ref(&r, &k, &p, &a, &cfg);
            for (x, y) in out.advantages.iter().zip(&slow) {
                prop_assert!((x - y).abs() <= 1e-9 * (1.0 + y.abs()), "{} vs {}", x, y);
            }
        }

        /// Changing one answer's confidence rewards never changes another answer's confidence
        /// advantages (level 1), nor any answer advantage.
        #[test]
        fn confidences_of_other_answers_are_untouched(
            (r, k, p, a, np, na) in arb_tree(),
            cfg in arb_tree_cfg(),
            victim in 0usize..16,
            noise in prop::collection::vec(0.0f64..1.0, 4),
        ) {
            let cfg = TreeConfig { conf_norm: ConfNorm::Answer, ..cfg };
            let victim = (victim % na) as u32;
            let r2 = with_confidences_of(&r, &k, &a, victim, &noise);
            let before = rlcr_tree(&r, &k, &p, &a, np, na, &cfg).advantages;
            let after = rlcr_tree(&r2, &k, &p, &a, np, na, &cfg).advantages;
            for i in 0..r.len() {
                if k[i] == SampleType::Answer || a[i] != victim {
                    prop_assert_eq!(before[i].to_bits(), after[i].to_bits(), "row {}", i);
                }
            }
        }

        /// Variant (c): another answer's confidence rewards may change the prompt-level scale, never
        /// the sign of a confidence advantage.
        #[test]
        fn variant_c_keeps_signs_of_other_answers(
            (r, k, p, a, np, na) in arb_tree(),
            victim in 0usize..16,
            noise in prop::collection::vec(0.0f64..1.0, 4),
        ) {
            let cfg = TreeConfig { conf_norm: ConfNorm::AnswerPrompt, ..TreeConfig::default() };
            let victim = (victim % na) as u32;
            let r2 = with_confidences_of(&r, &k, &a, victim, &noise);
            let before = rlcr_tree(&r, &k, &p, &a, np, na, &cfg).advantages;
            let after = rlcr_tree(&r2, &k, &p, &a, np, na, &cfg).advantages;
            for i in 0..r.len() {
                if k[i] == SampleType::Confidence && a[i] != victim && before[i].abs() > 1e-9 && after[i].abs() > 1e-9 {
                    prop_assert_eq!(before[i] > 0.0, after[i] > 0.0, "row {}", i);
                }
            }
        }

        #[test]
        fn rloo_fast_equals_reference((v, g) in arb_rows(40), verl in any::<bool>()) {
            let s = if verl { Singleton::Verl } else { Singleton::Zero };
            let out = rloo(&v, &g, n_groups_of(&g), s);
            let slow = rloo_ref(&v, &g, s);
            for (x, y) in out.advantages.iter().zip(&slow) {
                prop_assert!((x - y).abs() <= 1e-9 * (1.0 + y.abs()), "{} vs {}", x, y);
            }
        }

        #[test]
        fn rloo_sums_to_zero((v, g) in arb_rows(40)) {
            let n = n_groups_of(&g);
            let out = rloo(&v, &g, n, Singleton::Zero);
            for gid in 0..n {
                let sum: f64 = out.advantages.iter().zip(&g).filter(|(_, &h)| h as usize == gid).map(|(x, _)| x).sum();
                prop_assert!(sum.abs() < 1e-9 * 40.0, "group {} sums to {}", gid, sum);
            }
        }
    }
}
