//! Structured multi-turn rewards (KG-R1's `KGFormatMultiTurnRewardManager`): named
//! per-turn components and global components with weights,
//! `total = mean over turns(Σ weight·value of that turn) + Σ weight·value of the globals`,
//! with components whose name starts with `_raw_` kept for logging but left out of the total
//! (`docs/math.md` §1.3).
//!
//! A [`RewardSpec`] is read from TOML:
//! ```toml
//! preset = "kg-r1"          # optional: start from KG-R1's defaults (below)
//!
//! [[turn]]                  # a per-turn component
//! name = "format_score"
//! weight = 0.15
//! source = "format_ok"      # a value the score stage computes, or:
//! # column = "my_column"    # a column of the table: number/bool, or a list with one value per turn
//! # rows = "answer"         # "answer", "confidence" or "all" (default)
//!
//! [[global]]                # a global component (turn -1 in reward_components)
//! name = "retrieval_quality"
//! weight = 0.4
//! column = "retrieval_quality"
//! ```
//! KG-R1's defaults (`preset = "kg-r1"`): turn `format_score` 0.15 (source `format_ok`),
//! `is_answer_score` 0.1 (`answer_present`), `kg_query_validity` 0.1 (column
//! `kg_query_validity`); global `exact_match` 0.3 (`correct`), `retrieval_quality` 0.4 (column
//! `retrieval_quality`). Components listed in the file replace preset components of the same
//! name and add the others.
//!
//! Sources the score stage provides: `correct` (the verifier's verdict, 1/0, or the F1 value;
//! confidence rows take their answer's), `accuracy` (= `acc_reward`, gated by format when gating
//! is on), `format_ok`, `answer_present`, `countdown` (0 / 0.1 / 1), `brier` (= `conf_reward`,
//! confidence rows), `confidence` (parsed c), and `extra.NAME` (a number the external verifier
//! returned in `extra`). A value that does not exist for a row (a null cell, `brier` on an answer,
//! `countdown` under another verifier) leaves the component out of that row: it is not counted as
//! a turn and not listed.
//!
//! Turns: a scalar value belongs to the row's own turn (0 for answers, 1 for confidences, as in the
//! `token_turn_ids` convention); a list column gives turn `i` to its `i`-th element. A row with no
//! turn component has a turn mean of 0 (KG-R1 would divide by zero).
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// One entry of `reward_components`: `turn` is -1 for global components.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Component {
    /// Static for the presets' names (no allocation per row).
    pub name: Cow<'static, str>,
    pub turn: i32,
    pub value: f32,
    pub weight: f32,
}

impl Component {
    pub fn new(
        name: impl Into<Cow<'static, str>>,
        turn: i32,
        value: f64,
        weight: f64,
    ) -> Component {
        Component {
            name: name.into(),
            turn,
            value: value as f32,
            weight: weight as f32,
        }
    }

    /// Logging-only components (`_raw_*`) are left out of the total.
    pub fn counts(&self) -> bool {
        !self.name.starts_with("_raw_")
    }
}

/// The structured total: `mean over turns(Σ_turn w·v) + Σ_global w·v`, `_raw_*` skipped. Computed in
/// f64 from the f32 values and weights stored in the table, so that the `reward` column can be
/// recomputed exactly from `reward_components`.
pub fn total(components: &[Component]) -> f64 {
    // turns are few (one for the presets): a linear list beats a map and allocates nothing
    // for up to eight of them
    let mut small: [(i32, f64); 8] = [(0, 0.0); 8];
    let mut n_small = 0usize;
    let mut more: Vec<(i32, f64)> = Vec::new();
    let mut global = 0.0;
    for c in components.iter().filter(|c| c.counts()) {
        let wv = c.weight as f64 * c.value as f64;
        if c.turn < 0 {
            global += wv;
            continue;
        }
        if let Some(t) = small[..n_small].iter_mut().find(|t| t.0 == c.turn) {
            t.1 += wv;
        } else if let Some(t) = more.iter_mut().find(|t| t.0 == c.turn) {
            t.1 += wv;
        } else if n_small < small.len() {
            small[n_small] = (c.turn, wv);
            n_small += 1;
        } else {
            more.push((c.turn, wv));
        }
    }
    let count = n_small + more.len();
    let turn_mean = match count {
        0 => 0.0,
        1 => small[0].1,
        _ => {
            // sum in turn order, as the reference does, so that the result does not depend on
            // the order of the components
            if more.is_empty() {
                let turns = &mut small[..n_small];
                turns.sort_unstable_by_key(|t| t.0);
                turns.iter().map(|t| t.1).sum::<f64>() / count as f64
            } else {
                let mut all: Vec<(i32, f64)> = small[..n_small].to_vec();
                all.extend(more);
                all.sort_unstable_by_key(|t| t.0);
                all.iter().map(|t| t.1).sum::<f64>() / count as f64
            }
        }
    };
    turn_mean + global
}

/// Reference implementation of [`total`] (a map of turns), for the tests.
pub fn total_reference(components: &[Component]) -> f64 {
    let mut turns: BTreeMap<i32, f64> = BTreeMap::new();
    let mut global = 0.0;
    for c in components.iter().filter(|c| c.counts()) {
        let wv = c.weight as f64 * c.value as f64;
        if c.turn < 0 {
            global += wv;
        } else {
            *turns.entry(c.turn).or_insert(0.0) += wv;
        }
    }
    let turn_mean = if turns.is_empty() {
        0.0
    } else {
        turns.values().sum::<f64>() / turns.len() as f64
    };
    turn_mean + global
}

/// Which rows a component applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Rows {
    #[default]
    All,
    Answer,
    Confidence,
}

/// Where a component's value comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A value the score stage computes (see the module docs).
    Builtin(String),
    /// A column of the input table.
    Column(String),
}

/// The builtin source names.
pub const BUILTIN_SOURCES: &[&str] = &[
    "correct",
    "accuracy",
    "format_ok",
    "answer_present",
    "countdown",
    "brier",
    "confidence",
];

/// One component definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentSpec {
    pub name: String,
    pub weight: f64,
    /// `true` for global components.
    pub global: bool,
    pub source: Source,
    pub rows: Rows,
}

/// A set of components (the parsed rewards TOML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct RewardSpec {
    pub components: Vec<ComponentSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    name: String,
    weight: f64,
    source: Option<String>,
    column: Option<String>,
    #[serde(default)]
    rows: Rows,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    preset: Option<String>,
    #[serde(default)]
    turn: Vec<RawEntry>,
    #[serde(default)]
    global: Vec<RawEntry>,
}

impl RewardSpec {
    /// KG-R1's defaults.
    pub fn kg_r1() -> RewardSpec {
        let c = |name: &str, weight: f64, global: bool, source: Source| ComponentSpec {
            name: name.into(),
            weight,
            global,
            source,
            rows: Rows::All,
        };
        RewardSpec {
            components: vec![
                c(
                    "format_score",
                    0.15,
                    false,
                    Source::Builtin("format_ok".into()),
                ),
                c(
                    "is_answer_score",
                    0.1,
                    false,
                    Source::Builtin("answer_present".into()),
                ),
                c(
                    "kg_query_validity",
                    0.1,
                    false,
                    Source::Column("kg_query_validity".into()),
                ),
                c("exact_match", 0.3, true, Source::Builtin("correct".into())),
                c(
                    "retrieval_quality",
                    0.4,
                    true,
                    Source::Column("retrieval_quality".into()),
                ),
            ],
        }
    }

    /// Parse the TOML text (see the module docs).
    pub fn from_toml(text: &str) -> Result<RewardSpec> {
        let raw: RawSpec = toml::from_str(text).context("rewards TOML")?;
        let mut spec = match raw.preset.as_deref() {
            None => RewardSpec::default(),
            Some("kg-r1") => RewardSpec::kg_r1(),
            Some(other) => bail!("unknown rewards preset {other:?} (known: \"kg-r1\")"),
        };
        for (global, entries) in [(false, raw.turn), (true, raw.global)] {
            for e in entries {
                let source = match (e.source, e.column) {
                    (Some(s), None) => {
                        if !BUILTIN_SOURCES.contains(&s.as_str()) && !s.starts_with("extra.") {
                            bail!(
                                "component {:?}: unknown source {s:?} (known: {}, extra.NAME; or use column = ...)",
                                e.name,
                                BUILTIN_SOURCES.join(", ")
                            );
                        }
                        Source::Builtin(s)
                    }
                    (None, Some(c)) => Source::Column(c),
                    _ => bail!(
                        "component {:?}: give exactly one of `source` and `column`",
                        e.name
                    ),
                };
                if !e.weight.is_finite() {
                    bail!("component {:?}: weight must be a finite number", e.name);
                }
                let c = ComponentSpec {
                    name: e.name,
                    weight: e.weight,
                    global,
                    source,
                    rows: e.rows,
                };
                match spec.components.iter_mut().find(|x| x.name == c.name) {
                    Some(x) => *x = c,
                    None => spec.components.push(c),
                }
            }
        }
        if spec.components.is_empty() {
            bail!("rewards TOML defines no component (add [[turn]] or [[global]] entries, or preset = \"kg-r1\")");
        }
        Ok(spec)
    }

    pub fn from_file(path: &Path) -> Result<RewardSpec> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        RewardSpec::from_toml(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Columns the spec reads.
    pub fn columns(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self
            .components
            .iter()
            .filter_map(|c| match &c.source {
                Source::Column(n) => Some(n.as_str()),
                Source::Builtin(_) => None,
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// A component value for one row, before turns are assigned.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Missing,
    Scalar(f64),
    /// One value per turn (a list column); `None` elements are missing.
    PerTurn(Vec<Option<f64>>),
}

/// Build one row's components from the spec. `is_confidence` selects the row kind and its turn
/// (0 answer, 1 confidence); `value` gives each component's value.
pub fn row_components(
    spec: &RewardSpec,
    is_confidence: bool,
    mut value: impl FnMut(&ComponentSpec) -> Value,
) -> Vec<Component> {
    let row_turn = if is_confidence { 1 } else { 0 };
    let mut out = Vec::with_capacity(spec.components.len());
    for c in &spec.components {
        let applies = match c.rows {
            Rows::All => true,
            Rows::Answer => !is_confidence,
            Rows::Confidence => is_confidence,
        };
        if !applies {
            continue;
        }
        match value(c) {
            Value::Missing => {}
            Value::Scalar(v) => out.push(Component::new(
                c.name.clone(),
                if c.global { -1 } else { row_turn },
                v,
                c.weight,
            )),
            Value::PerTurn(vs) => {
                if c.global {
                    // a list for a global component: its sum
                    let s: f64 = vs.iter().flatten().sum();
                    if vs.iter().any(Option::is_some) {
                        out.push(Component::new(c.name.clone(), -1, s, c.weight));
                    }
                } else {
                    for (i, v) in vs.iter().enumerate() {
                        if let Some(v) = v {
                            out.push(Component::new(c.name.clone(), i as i32, *v, c.weight));
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worked structure (`docs/math.md` §1.3): turn rewards {1: 0.15, 2: 0.20}, globals exact_match 0.3,
    /// retrieval_quality 0.4, `_raw_exact_match` 0.6 logged only: total = 0.175 + 0.7 = 0.875.
    #[test]
    fn seed_001_total() {
        let cs = vec![
            Component::new("format_score", 1, 1.0, 0.15),
            Component::new("format_score", 2, 1.0, 0.15),
            Component::new("is_answer_score", 2, 0.5, 0.1),
            Component::new("exact_match", -1, 1.0, 0.3),
            Component::new("retrieval_quality", -1, 1.0, 0.4),
            Component::new("_raw_exact_match", -1, 0.6, 1.0),
        ];
        // turn 1: 0.15; turn 2: 0.15 + 0.05 = 0.20; mean 0.175; globals 0.7
        assert!((total(&cs) - 0.875).abs() < 1e-6);
        assert_eq!(total(&[]), 0.0);
        // only globals: the turn mean is 0
        assert!((total(&cs[3..5]) - 0.7).abs() < 1e-6);
    }

    proptest::proptest! {
        #[test]
        fn total_equals_reference(cs in proptest::collection::vec((0usize..3, -1i32..12, -2.0f32..2.0, -1.0f32..1.0), 0..30)) {
            let names = ["a", "_raw_b", "c"];
            let comps: Vec<Component> = cs
                .iter()
                .map(|&(n, t, v, w)| Component { name: names[n].into(), turn: t, value: v, weight: w })
                .collect();
            proptest::prop_assert_eq!(total(&comps).to_bits(), total_reference(&comps).to_bits());
        }
    }

    #[test]
    fn toml_spec() {
        let spec = RewardSpec::from_toml(
            r#"
            preset = "kg-r1"
            [[turn]]
            name = "format_score"
            weight = 0.2
            source = "format_ok"
            [[global]]
            name = "brier"
            weight = 1.0
            source = "brier"
            rows = "confidence"
            "#,
        )
        .unwrap();
        assert_eq!(spec.components.len(), 6);
        assert_eq!(spec.components[0].weight, 0.2);
        assert_eq!(
            spec.columns(),
            vec!["kg_query_validity", "retrieval_quality"]
        );
        assert!(RewardSpec::from_toml("[[turn]]\nname='x'\nweight=1\n").is_err());
        assert!(RewardSpec::from_toml("[[turn]]\nname='x'\nweight=1\nsource='nope'\n").is_err());
        assert!(RewardSpec::from_toml("preset='zzz'").is_err());
        assert!(RewardSpec::from_toml("").is_err());
        assert!(RewardSpec::from_toml("[[turn]]\nname='x'\nweight=1\nsource='extra.q'\n").is_ok());
    }

    #[test]
    fn rows_and_turns() {
        let spec = RewardSpec::kg_r1();
        let cs = row_components(&spec, false, |c| match c.name.as_str() {
            "format_score" => Value::Scalar(1.0),
            "is_answer_score" => Value::Scalar(1.0),
            "kg_query_validity" => Value::PerTurn(vec![Some(1.0), None, Some(0.0)]),
            "exact_match" => Value::Scalar(1.0),
            _ => Value::Missing,
        });
        // turn 0: 0.15 + 0.1 + 0.1 = 0.35; turn 2: 0.0; mean 0.175; global 0.3
        assert_eq!(cs.len(), 5);
        assert!((total(&cs) - 0.475).abs() < 1e-6);
        let on_conf = row_components(&spec, true, |_| Value::Scalar(1.0));
        assert!(on_conf.iter().filter(|c| c.turn >= 0).all(|c| c.turn == 1));
    }
}
