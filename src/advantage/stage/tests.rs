//! Tests of the advantage engine's helpers: structured rewards and dense answer ids.
//!
//! A test-only file: its parent declares it `#[cfg(test)] mod tests;`.
use super::*;

fn comp(name: &str, turn: Option<i32>, value: f64, weight: f64) -> Component {
    Component {
        name: name.into(),
        turn,
        value,
        weight,
    }
}

#[test]
fn structured_sums_weighted_turns_and_globals_skipping_raw() {
    let mut turns = vec![];
    let g = structured(
        &[
            comp("format_score", Some(2), 1.0, 0.15),
            comp("kg_query_validity", Some(1), 0.5, 0.1),
            comp("format_score", Some(1), 1.0, 0.15),
            comp("exact_match", Some(-1), 1.0, 0.3),
            comp("retrieval_quality", None, 0.5, 0.4),
            comp("_raw_exact_match", None, 1.0, 1.0),
        ],
        &mut turns,
    )
    .unwrap();
    assert!((g.unwrap() - 0.5).abs() < 1e-12);
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[0].0, 1);
    assert!((turns[0].1 - 0.2).abs() < 1e-12);
    assert_eq!(turns[1].0, 2);
    assert!((turns[1].1 - 0.15).abs() < 1e-12);
    assert_eq!(structured(&[], &mut turns).unwrap(), None);
    assert_eq!(
        structured(&[comp("_raw_x", None, 1.0, 1.0)], &mut turns).unwrap(),
        None
    );
    assert!(structured(&[comp("x", None, f64::NAN, 1.0)], &mut turns).is_err());
}

#[test]
fn dense_answer_ids_both_paths_agree() {
    use SampleType::{Answer as A, Confidence as C};
    let kinds = [A, C, C, C, C, A, C];
    let prompt = [0, 0, 0, 1, 1, 1, 0];
    // (prompt, answer_idx) pairs: (0,1) (0,0) (1,0) (1,1) (0,1): four distinct answers.
    let check = |raw: [u32; 7], max: Vec<i32>, n_expected: Option<usize>| {
        let mut ans = raw;
        let n = dense_answers(&kinds, &prompt, &mut ans, &max);
        if let Some(e) = n_expected {
            assert_eq!(n, e);
        }
        let ids: Vec<u32> = (0..7).filter(|&i| kinds[i] == C).map(|i| ans[i]).collect();
        assert!(ids.iter().all(|&i| (i as usize) < n));
        // same pair ⇔ same id
        assert_eq!(ids[0], ids[4]);
        let mut d = ids.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), 4, "{ids:?}");
    };
    // Small indices: prefix sums (ids 0..2 for prompt 0, 2..4 for prompt 1).
    check([0, 1, 0, 0, 1, 0, 1], vec![1, 1], Some(4));
    // Huge indices: the hash-map fallback numbers the distinct pairs.
    let big = 1_000_000_000;
    check(
        [0, big, 0, 0, big, 0, big],
        vec![big as i32, big as i32],
        Some(4),
    );
}
