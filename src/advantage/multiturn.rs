//! Multi-turn GRPO with turn and global rewards (KG-R1's
//! `compute_grpo_multiturn_advantage`; `docs/math.md` §2.4).
//!
//! A row carries structured rewards: per-turn rewards `R_{i,k}` (the weighted sum of the components
//! of turn k) and a global reward `G_i` (the weighted sum of the global components, `_raw_*` names
//! excluded by the caller). Turn rewards of every row and turn of one prompt form **one** group (KG-R1
//! pools them); global rewards form one group per prompt. Both are normalised with the same
//! [`GroupNorm`], then combined per token: a token of turn k of row i gets
//! `w_turn · A_turn(i,k) + w_global · A_global(i)`; tokens outside the loss mask or with turn id −1 get
//! 0. The default weights are 1.0 / 1.0; KG-R1's `0.5 · A_turn + A_global` is the
//! [`MultiTurnConfig::kg_r1`] preset.

use super::group::{group_stats, normalized, GroupNorm, GroupSummary};
use serde::Serialize;

/// One turn reward of one row: `R_{row, turn}`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TurnReward {
    /// Row index.
    pub row: u32,
    /// Turn id (matches the row's `token_turn_ids`; ≥ 0).
    pub turn: i32,
    /// The turn's reward (weighted sum of its components).
    pub value: f64,
}

/// Settings of the multi-turn estimator.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MultiTurnConfig {
    /// Normalisation of both groups.
    pub norm: GroupNorm,
    /// Weight of the turn advantage (`--turn-weight`, default 1.0; KG-R1 0.5).
    pub turn_weight: f64,
    /// Weight of the global advantage (`--global-weight`, default 1.0).
    pub global_weight: f64,
}

impl Default for MultiTurnConfig {
    fn default() -> Self {
        MultiTurnConfig {
            norm: GroupNorm::default(),
            turn_weight: 1.0,
            global_weight: 1.0,
        }
    }
}

impl MultiTurnConfig {
    /// KG-R1's combination `0.5 · A_turn + 1.0 · A_global` with its normalisation (unbiased std,
    /// eps 1e-6, singleton → mean 0, std 1).
    pub fn kg_r1() -> Self {
        MultiTurnConfig {
            norm: GroupNorm {
                singleton: super::Singleton::Verl,
                ..GroupNorm::default()
            },
            turn_weight: 0.5,
            global_weight: 1.0,
        }
    }
}

/// Result of [`grpo_multiturn`].
#[derive(Clone, Debug, PartialEq)]
pub struct MultiTurnOutput {
    /// `A_turn` for every entry of the input turn rewards (same order).
    pub turn_adv: Vec<f64>,
    /// `A_global` per row.
    pub global_adv: Vec<f64>,
    /// Per row: `w_turn · mean_k A_turn(i,k) + w_global · A_global(i)` (the scalar `advantage`
    /// column; the mean over the row's rewarded turns, 0 when it has none).
    pub row_adv: Vec<f64>,
    /// Per row: neither part carries signal (the prompt's turn group is empty or zero-std, and its
    /// global group is zero-std).
    pub zero_std: Vec<bool>,
    /// Turn groups (one per prompt with turn rewards).
    pub turns: GroupSummary,
    /// Global groups (one per prompt).
    pub globals: GroupSummary,
}

/// Multi-turn GRPO advantages (`docs/math.md` §2.4).
///
/// Formulas: `A_turn(i,k) = norm(R_{i,k}; {R_{i',k'} : prompt(i') = prompt(i), all turns k'})`,
/// `A_global(i) = norm(G_i; {G_{i'} : prompt(i') = prompt(i)})`, with `norm` of [`normalized`].
///
/// Edge cases: singleton and zero-std groups as in [`normalized`]; a row without turn rewards has
/// only its global part. `prompt[row] < n_prompts`, `globals.len() == prompt.len()` and every
/// `turns[e].row < prompt.len()` (caller invariants).
pub fn grpo_multiturn(
    turns: &[TurnReward],
    globals: &[f64],
    prompt: &[u32],
    n_prompts: usize,
    cfg: &MultiTurnConfig,
) -> MultiTurnOutput {
    assert_eq!(
        globals.len(),
        prompt.len(),
        "globals and prompt differ in length"
    );
    let n = prompt.len();
    let tv: Vec<f64> = turns.iter().map(|t| t.value).collect();
    let tg: Vec<u32> = turns.iter().map(|t| prompt[t.row as usize]).collect();
    let tstats = group_stats(&tv, &tg, n_prompts, cfg.norm.std);
    let turn_adv: Vec<f64> = tv
        .iter()
        .zip(&tg)
        .map(|(&x, &g)| normalized(x, &tstats[g as usize], &cfg.norm))
        .collect();
    let gstats = group_stats(globals, prompt, n_prompts, cfg.norm.std);
    let global_adv: Vec<f64> = globals
        .iter()
        .zip(prompt)
        .map(|(&x, &g)| normalized(x, &gstats[g as usize], &cfg.norm))
        .collect();
    let mut sum = vec![0f64; n];
    let mut cnt = vec![0u32; n];
    for (t, a) in turns.iter().zip(&turn_adv) {
        sum[t.row as usize] += a;
        cnt[t.row as usize] += 1;
    }
    let row_adv = (0..n)
        .map(|i| {
            let mt = if cnt[i] > 0 {
                sum[i] / cnt[i] as f64
            } else {
                0.0
            };
            cfg.turn_weight * mt + cfg.global_weight * global_adv[i]
        })
        .collect();
    let zero_std = (0..n)
        .map(|i| {
            let p = prompt[i] as usize;
            (tstats[p].count == 0 || tstats[p].zero_std) && gstats[p].zero_std
        })
        .collect();
    MultiTurnOutput {
        turn_adv,
        global_adv,
        row_adv,
        zero_std,
        turns: GroupSummary::of(&tstats),
        globals: GroupSummary::of(&gstats),
    }
}

/// Write one row's multi-turn token advantages.
///
/// `out[t] = w_turn · A_turn(turn_ids[t]) + w_global · A_global` where `mask[t]` and
/// `turn_ids[t] ≥ 0`; 0 elsewhere. `row_turns` lists the row's `(turn, A_turn)` pairs; a turn without
/// an entry contributes 0 (only the global part reaches its tokens, as in KG-R1).
pub fn multiturn_token_advantages(
    turn_ids: &[i32],
    mask: &[bool],
    row_turns: &[(i32, f64)],
    global_adv: f64,
    cfg: &MultiTurnConfig,
    out: &mut [f32],
) {
    debug_assert!(turn_ids.len() == mask.len() && mask.len() == out.len());
    // Turn ids are tiny and rows have few turns: a linear lookup cached on the last turn seen.
    let mut last = (i32::MIN, 0.0f64);
    for ((o, &k), &m) in out.iter_mut().zip(turn_ids).zip(mask) {
        if !m || k < 0 {
            *o = 0.0;
            continue;
        }
        if k != last.0 {
            let a = row_turns
                .iter()
                .find(|(t, _)| *t == k)
                .map(|(_, a)| *a)
                .unwrap_or(0.0);
            last = (k, a);
        }
        *o = (cfg.turn_weight * last.1 + cfg.global_weight * global_adv) as f32;
    }
}

/// Slow reference for [`grpo_multiturn`]'s turn and global parts.
pub fn grpo_multiturn_ref(
    turns: &[TurnReward],
    globals: &[f64],
    prompt: &[u32],
    cfg: &MultiTurnConfig,
) -> (Vec<f64>, Vec<f64>) {
    use super::group::normalized_ref;
    let ta = turns
        .iter()
        .map(|t| {
            let m: Vec<f64> = turns
                .iter()
                .filter(|u| prompt[u.row as usize] == prompt[t.row as usize])
                .map(|u| u.value)
                .collect();
            normalized_ref(t.value, &m, &cfg.norm)
        })
        .collect();
    let ga = (0..globals.len())
        .map(|i| {
            let m: Vec<f64> = (0..globals.len())
                .filter(|&j| prompt[j] == prompt[i])
                .map(|j| globals[j])
                .collect();
            normalized_ref(globals[i], &m, &cfg.norm)
        })
        .collect();
    (ta, ga)
}

#[cfg(test)]
mod tests {
    use super::super::group::tests::close;
    use super::*;
    use proptest::prelude::*;

    /// Hand calculation: one prompt, two rows. Row 0: turns {1: 0.25, 2: 0.15}, global 0.7;
    /// row 1: turn {1: 0.05}, global 0.3.
    #[test]
    fn hand_example() {
        let turns = [
            TurnReward {
                row: 0,
                turn: 1,
                value: 0.25,
            },
            TurnReward {
                row: 0,
                turn: 2,
                value: 0.15,
            },
            TurnReward {
                row: 1,
                turn: 1,
                value: 0.05,
            },
        ];
        let globals = [0.7, 0.3];
        let cfg = MultiTurnConfig::kg_r1();
        let out = grpo_multiturn(&turns, &globals, &[0, 0], 1, &cfg);
        // Turn group {0.25, 0.15, 0.05}: mean 0.15, unbiased std 0.1.
        let d = 0.1 + 1e-6;
        close(&out.turn_adv, &[0.1 / d, 0.0, -0.1 / d], 1e-12);
        // Global group {0.7, 0.3}: mean 0.5, std sqrt(0.08).
        let s = 0.08f64.sqrt() + 1e-6;
        close(&out.global_adv, &[0.2 / s, -0.2 / s], 1e-12);
        close(
            &out.row_adv,
            &[
                0.5 * (0.1 / d + 0.0) / 2.0 + 0.2 / s,
                0.5 * (-0.1 / d) - 0.2 / s,
            ],
            1e-12,
        );
        // Tokens of row 0: turn ids [-1, 1, 1, -1, 2, 2, 3], last one outside the mask.
        let ids = [-1, 1, 1, -1, 2, 2, 3];
        let mask = [true, true, true, true, true, true, false];
        let mut tok = [9f32; 7];
        multiturn_token_advantages(
            &ids,
            &mask,
            &[(1, out.turn_adv[0]), (2, 0.0)],
            out.global_adv[0],
            &cfg,
            &mut tok,
        );
        let t1 = (0.5 * 0.1 / d + 0.2 / s) as f32;
        let t2 = (0.2 / s) as f32;
        assert_eq!(tok, [0.0, t1, t1, 0.0, t2, t2, 0.0]);
        // A turn with tokens but no reward gets the global part only.
        let mut tok = [9f32; 2];
        multiturn_token_advantages(&[5, 5], &[true, true], &[(1, 1.0)], 0.5, &cfg, &mut tok);
        assert_eq!(tok, [0.5, 0.5]);
    }

    #[test]
    fn default_weights_are_one_and_one() {
        let c = MultiTurnConfig::default();
        assert_eq!((c.turn_weight, c.global_weight), (1.0, 1.0));
        assert_eq!(MultiTurnConfig::kg_r1().turn_weight, 0.5);
    }

    #[test]
    fn zero_std_rows_need_both_parts_flat() {
        let turns = [
            TurnReward {
                row: 0,
                turn: 0,
                value: 0.1,
            },
            TurnReward {
                row: 1,
                turn: 0,
                value: 0.1,
            },
        ];
        let out = grpo_multiturn(&turns, &[1.0, 1.0], &[0, 0], 1, &MultiTurnConfig::default());
        assert_eq!(out.zero_std, vec![true, true]);
        assert_eq!(out.row_adv, vec![0.0, 0.0]);
        let out = grpo_multiturn(&turns, &[1.0, 0.0], &[0, 0], 1, &MultiTurnConfig::default());
        assert_eq!(out.zero_std, vec![false, false]);
    }

    proptest! {
        #[test]
        fn fast_equals_reference(
            rows in prop::collection::vec((0u32..3, -1.0f64..1.0, prop::collection::vec((0i32..3, prop_oneof![Just(0.0), Just(0.1), -1.0f64..1.0]), 0..3)), 1..12),
        ) {
            let prompt: Vec<u32> = rows.iter().map(|r| r.0).collect();
            let globals: Vec<f64> = rows.iter().map(|r| r.1).collect();
            let mut turns = vec![];
            for (i, r) in rows.iter().enumerate() {
                let mut seen = vec![];
                for &(t, v) in &r.2 {
                    if !seen.contains(&t) {
                        seen.push(t);
                        turns.push(TurnReward { row: i as u32, turn: t, value: v });
                    }
                }
            }
            let cfg = MultiTurnConfig::default();
            let out = grpo_multiturn(&turns, &globals, &prompt, 3, &cfg);
            let (ta, ga) = grpo_multiturn_ref(&turns, &globals, &prompt, &cfg);
            for (x, y) in out.turn_adv.iter().zip(&ta).chain(out.global_adv.iter().zip(&ga)) {
                prop_assert!((x - y).abs() <= 1e-9 * (1.0 + y.abs()), "{} vs {}", x, y);
            }
        }
    }
}
