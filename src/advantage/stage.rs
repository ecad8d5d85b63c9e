//! The `rlcr advantage` engine: advantage estimators over a scored table (no model), behind a
//! clap-free [`Plan`] and [`run`]; the estimators themselves are the pure functions of
//! [`crate::advantage`].
//!
//! Two passes over the input, so that memory stays bounded by a few scalars per row (about 48 bytes
//! for the rlcr tree) whatever the response lengths:
//! 1. **keys pass**: decodes only the group keys and rewards (plus, for KL in the reward or GAE,
//!    the token columns needed for the penalty or the whitening moments) and computes every row's
//!    sequence-level advantage with the pure functions of [`crate::advantage`];
//! 2. **write pass**: streams the table row group by row group, builds `loss_mask`,
//!    `token_advantages` (and `returns`, `trajectory_score` for GAE) for each row, and writes the
//!    output with [`splice`]: every input column is copied as encoded Parquet chunks, only the new
//!    columns are encoded (stale ones of the same name are replaced). One thread decodes and
//!    computes, the encoders run in parallel on rayon.
//!
//! Statistics (reward and advantage mean/std per sample type, group counts with the zero-std
//! fraction, masked-token and null-span counts, the KL controller's state, the whitening moments)
//! are printed and stored in the output's `rlcr.statistics` metadata; the resolved plan goes into
//! `rlcr.config`. They are accumulated row by row in row order, so they (like every output value)
//! do not depend on `--batch-size`, the row-group layout or the thread count.
//!
//! Choices the seeds leave open (also in `--help`):
//! - group keys: rlcr = answers by `prompt_id`, confidences by `(prompt_id, answer_idx)`; grpo and
//!   rloo = `(prompt_id, sample_type)`; grpo-multiturn = `prompt_id` (all rows and turns).
//! - the scalar `advantage` of a grpo-multiturn row is `w_turn · mean_k A_turn + w_global ·
//!   A_global`; of a GAE row, the whitened advantage of its first learnable token (the estimate
//!   for the whole response).
//! - KL in the reward uses the row's loss mask as verl uses its response mask; the controller's
//!   measured KL is the mean over rows of the per-row masked mean (0 for an empty mask); the
//!   coefficient applied is the current one, the updated one is stored as `kl.next_coef` for
//!   `--kl-state`.
//! - `reward_components`: turn ≥ 0 is a turn reward (`Σ weight · value` per turn), turn −1 or
//!   null is global, `_raw_*` names are skipped; a row without components uses `reward` as its
//!   global reward.
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{Array, ArrayRef, BooleanArray, Float32Array, ListArray, RecordBatch};
use arrow::buffer::{BooleanBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use serde_json::json;

use crate::advantage::{
    self as adv, gae, Estimator, GroupSummary, KlController, KlEstimator, MaskedMoments,
    MissingSpan, MultiTurnConfig, Norm, RewardDistribution, SampleType, Singleton, TreeConfig,
    TurnReward,
};
use crate::table::intern::{FastMap, Interner};
use crate::table::{self, splice, Meta, StrCol, Validator, TRAJECTORY};
use crate::usage::usage;

mod cols;
mod write;
use cols::{Component, Flat};
use write::pass2;

/// Parity presets for the group normalisation (explicit flags win).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// verl: std, unbiased, eps 1e-6, singleton → r/(1+eps).
    Verl,
    /// TRL GRPOTrainer: std, unbiased, eps 1e-4, singleton → 0.
    Trl,
    /// RLCR's training runs: mean only (`scale_rewards: false`), eps 1e-4, singleton → 0.
    Rlcr,
    /// KG-R1: std, unbiased, eps 1e-6, singleton verl, turn weight 0.5.
    KgR1,
}

/// What a [`Preset`] sets, or the defaults without one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PresetDefaults {
    /// Group normalisation.
    pub norm: Norm,
    /// Added to the std before dividing.
    pub eps: f64,
    /// Groups of one row.
    pub singleton: Singleton,
    /// grpo-multiturn: weight of the turn advantage.
    pub turn_weight: f64,
}

impl Preset {
    /// The settings of `preset` (`None`: std, eps 1e-6, singleton 0, turn weight 1).
    pub fn defaults(preset: Option<Preset>) -> PresetDefaults {
        let (norm, eps, singleton, turn_weight) = match preset {
            None => (Norm::Std, 1e-6, Singleton::Zero, 1.0),
            Some(Preset::Verl) => (Norm::Std, 1e-6, Singleton::Verl, 1.0),
            Some(Preset::Trl) => (Norm::Std, 1e-4, Singleton::Zero, 1.0),
            Some(Preset::Rlcr) => (Norm::Mean, 1e-4, Singleton::Zero, 1.0),
            Some(Preset::KgR1) => (Norm::Std, 1e-6, Singleton::Verl, 0.5),
        };
        PresetDefaults {
            norm,
            eps,
            singleton,
            turn_weight,
        }
    }
}

/// The validated plan: every choice resolved, KL state loaded.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    pub estimator: Estimator,
    pub tree: TreeConfig,
    pub multiturn: MultiTurnConfig,
    pub drop_zero_std: bool,
    pub on_missing_span: MissingSpan,
    pub gamma: f64,
    pub lam: f64,
    pub reward_distribution: RewardDistribution,
    pub kl: Option<KlPlan>,
    pub preset: Option<Preset>,
    #[serde(skip)]
    pub batch_size: usize,
    /// The scored table (a file or a folder of part files).
    #[serde(skip)]
    pub input: PathBuf,
    /// The training table written.
    #[serde(skip)]
    pub out: PathBuf,
    /// The command line, stored in `rlcr.config`.
    #[serde(skip)]
    pub argv: Vec<String>,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct KlPlan {
    pub estimator: KlEstimator,
    pub controller: KlController,
}

/// The KL coefficient controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KlCtrl {
    Fixed,
    Adaptive,
}

/// The KL-in-the-reward settings as asked for, resolved by [`KlRequest::plan`].
#[derive(Debug, Clone)]
pub struct KlRequest {
    /// Per-token estimator.
    pub estimator: KlEstimator,
    /// Fixed or adaptive coefficient.
    pub ctrl: KlCtrl,
    /// The coefficient (0: off, unless adaptive).
    pub coef: f64,
    /// Adaptive controller: target KL.
    pub target: f64,
    /// Adaptive controller: horizon (rows).
    pub horizon: f64,
    /// A previous output whose metadata holds the controller's next coefficient.
    pub state: Option<PathBuf>,
}

impl KlRequest {
    /// The KL plan for `estimator` (`None`: no KL in the reward): the values checked (usage
    /// errors), then the coefficient read from the state table when one is given.
    pub fn plan(&self, estimator: Estimator) -> Result<Option<KlPlan>> {
        if !self.coef.is_finite() {
            return Err(usage(format!(
                "--kl-coef must be finite, got {}",
                self.coef
            )));
        }
        if self.coef < 0.0 {
            return Err(usage(format!("--kl-coef must be >= 0, got {}", self.coef)));
        }
        if self.coef == 0.0 && self.ctrl == KlCtrl::Fixed {
            return Ok(None);
        }
        if estimator == Estimator::GrpoMultiturn {
            return Err(usage(
                "KL in the reward is not supported with grpo-multiturn (structured rewards have \
                 no token-level score); use gae or a sequence estimator",
            ));
        }
        if self.ctrl == KlCtrl::Adaptive && !(self.target > 0.0 && self.horizon > 0.0) {
            return Err(usage("--kl-target and --kl-horizon must be > 0"));
        }
        let coef = match &self.state {
            Some(p) => read_kl_state(p)?,
            None => self.coef,
        };
        let controller = match self.ctrl {
            KlCtrl::Fixed => KlController::Fixed { coef },
            KlCtrl::Adaptive => KlController::Adaptive {
                coef,
                target: self.target,
                horizon: self.horizon,
            },
        };
        Ok(Some(KlPlan {
            estimator: self.estimator,
            controller,
        }))
    }
}

impl Plan {
    /// Check the resolved settings (every error a usage error, nothing read).
    pub fn validate(&self) -> Result<()> {
        let eps = self.tree.ans.eps;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(usage(format!(
                "--eps must be a finite number >= 0, got {eps}"
            )));
        }
        for (name, v) in [
            ("--lambda-ans", self.tree.lambda_ans),
            ("--lambda-conf", self.tree.lambda_conf),
            ("--global-weight", self.multiturn.global_weight),
            ("--turn-weight", self.multiturn.turn_weight),
        ] {
            if !v.is_finite() {
                return Err(usage(format!("{name} must be finite, got {v}")));
            }
        }
        if !(0.0..=1.0).contains(&self.gamma) || !(0.0..=1.0).contains(&self.lam) {
            return Err(usage(format!(
                "--gamma and --lam must lie in [0, 1], got {} and {}",
                self.gamma, self.lam
            )));
        }
        if self.batch_size == 0 {
            return Err(usage("--batch-size must be at least 1"));
        }
        if self.drop_zero_std && self.estimator == Estimator::Gae {
            return Err(usage(
                "--drop-zero-std applies to grouped estimators, not gae",
            ));
        }
        Ok(())
    }

    /// Does the keys pass need token-level columns?
    fn tokens_in_pass1(&self) -> bool {
        self.kl.is_some() || self.estimator == Estimator::Gae
    }
}

/// The coefficient for this iteration from a previous output's metadata (`kl_controller.next_coef`).
pub fn read_kl_state(p: &Path) -> Result<f64> {
    let r = table::Reader::open(p).with_context(|| format!("--kl-state {}", p.display()))?;
    let stats = r.metadata().get("rlcr.statistics").ok_or_else(|| {
        anyhow!(
            "--kl-state {}: no rlcr.statistics metadata (not written by `rlcr advantage`)",
            p.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(stats)
        .with_context(|| format!("--kl-state {}: rlcr.statistics is not JSON", p.display()))?;
    v.pointer("/kl/next_coef")
        .and_then(|x| x.as_f64())
        .ok_or_else(|| {
            anyhow!(
                "--kl-state {}: no kl.next_coef in its statistics (written without KL in the reward?)",
                p.display()
            )
        })
}

/// Compute the advantages of `plan.input` into `plan.out`: the keys pass, then the write pass.
pub fn run(plan: &Plan) -> Result<()> {
    let input = plan.input.clone();
    // The output may be neither the input nor one of its part files.
    crate::fs::check_distinct(&[&input], &plan.out)?;
    let files = table::io::input_files(&input)?;
    crate::fs::check_distinct(
        &files.iter().map(|f| f.as_path()).collect::<Vec<_>>(),
        &plan.out,
    )?;
    let schema = table::Reader::open(&input)?.file_schema();
    check_columns(plan, &schema, &input.display().to_string())?;
    let (t, c) = (std::time::Instant::now(), cpu_seconds());
    let prep = pass1(plan, &input)?;
    let (t2, c2) = (std::time::Instant::now(), cpu_seconds());
    crate::debug!(
        "keys pass: {} rows in {:.2} s ({:.2} s CPU)",
        prep.rows,
        (t2 - t).as_secs_f64(),
        c2 - c
    );
    pass2(plan, prep)?;
    crate::debug!(
        "write pass: {:.2} s ({:.2} s CPU)",
        t2.elapsed().as_secs_f64(),
        cpu_seconds() - c2
    );
    Ok(())
}

/// CPU time (user + system) of this process so far, for `-v` timing lines; 0 where
/// `/proc/self/stat` is not available.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which is in parentheses and may hold spaces).
    let Some(rest) = stat.rsplit_once(')').map(|x| x.1) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// Every column the plan needs must exist (optional ones are optional).
fn check_columns(plan: &Plan, schema: &Schema, file: &str) -> Result<()> {
    let has = |c: &str| schema.field_with_name(c).is_ok();
    let mut need: Vec<&str> = vec!["prompt_id", "sample_type", "response_ids"];
    match plan.estimator {
        Estimator::Rlcr => need.extend(["answer_idx", "reward"]),
        Estimator::Grpo | Estimator::Rloo | Estimator::Gae => need.push("reward"),
        Estimator::GrpoMultiturn => {
            if !has("reward_components") {
                need.push("reward");
            }
        }
    }
    if plan.estimator == Estimator::Gae {
        need.push("values");
    }
    if plan.kl.is_some() {
        need.extend(["ref_logprobs", "response_logprobs"]);
    }
    table::check_schema(file, schema, &TRAJECTORY, &need)
}

// ------------------------------------------------------------------------------------------------
// Per-batch column views and per-row token work shared by both passes.

/// The token-level columns of one batch (only those present / needed).
struct TokCols {
    lens: Flat<()>,
    ans_span: Option<cols::Spans>,
    conf_span: Option<cols::Spans>,
    info: Option<Flat<bool>>,
    turns: Option<Flat<i32>>,
    logp: Option<Flat<f64>>,
    refp: Option<Flat<f64>>,
    values: Option<Flat<f64>>,
}

impl TokCols {
    fn read(b: &RecordBatch, plan: &Plan) -> Result<TokCols> {
        let kl = plan.kl.is_some();
        let gae = plan.estimator == Estimator::Gae;
        Ok(TokCols {
            lens: cols::list_lengths(b, "response_ids")?
                .ok_or_else(|| anyhow!("missing column `response_ids`"))?,
            ans_span: cols::spans(b, "answer_span")?,
            conf_span: cols::spans(b, "confidence_span")?,
            info: cols::bool_lists(b, "info_mask")?,
            turns: cols::int_lists(b, "token_turn_ids")?,
            logp: if kl {
                cols::float_lists(b, "response_logprobs")?
            } else {
                None
            },
            refp: if kl {
                cols::float_lists(b, "ref_logprobs")?
            } else {
                None
            },
            values: if gae {
                cols::float_lists(b, "values")?
            } else {
                None
            },
        })
    }

    /// Fill row i's loss mask; returns whether its span was null.
    fn mask(
        &self,
        i: usize,
        kind: SampleType,
        missing: MissingSpan,
        out: &mut Vec<bool>,
    ) -> Result<bool> {
        let len = self.response_len(i)?;
        out.clear();
        out.resize(len, false);
        let span = match kind {
            SampleType::Answer => self.ans_span.as_ref().and_then(|s| s.get(i)),
            SampleType::Confidence => self.conf_span.as_ref().and_then(|s| s.get(i)),
        };
        let col = match kind {
            SampleType::Answer => "answer_span",
            SampleType::Confidence => "confidence_span",
        };
        let info = opt_row(&self.info, i, "info_mask")?;
        let turns = opt_row(&self.turns, i, "token_turn_ids")?;
        adv::fill_loss_mask(out, span, missing, info, turns)
            .with_context(|| format!("column `{col}`"))?;
        Ok(span.is_none())
    }

    fn response_len(&self, i: usize) -> Result<usize> {
        if let Some(v) = &self.lens.valid {
            if !v[i] {
                bail!("column `response_ids`: null");
            }
        }
        Ok(self.lens.len_of(i))
    }

    /// Row i's per-token KL `kl_t · m_t` into `out`; returns `(Σ, masked count)`.
    fn kl(
        &self,
        i: usize,
        plan: &KlPlan,
        mask: &[bool],
        out: &mut Vec<f64>,
    ) -> Result<(f64, usize)> {
        let lp = req_row(&self.logp, i, "response_logprobs", mask.len())?;
        let rf = req_row(&self.refp, i, "ref_logprobs", mask.len())?;
        out.clear();
        let (mut s, mut n) = (0.0, 0);
        for t in 0..mask.len() {
            let k = if mask[t] {
                let k = adv::kl_value(lp[t], rf[t], plan.estimator);
                if !k.is_finite() {
                    bail!(
                        "token {t}: KL is not finite (log-probs {} and {})",
                        lp[t],
                        rf[t]
                    );
                }
                s += k;
                n += 1;
                k
            } else {
                0.0
            };
            out.push(k);
        }
        Ok((s, n))
    }
}

fn opt_row<'a, T>(f: &'a Option<Flat<T>>, i: usize, name: &str) -> Result<Option<&'a [T]>> {
    match f {
        None => Ok(None),
        Some(f) => match f.row(i) {
            Some(r) => Ok(Some(r)),
            None => bail!("column `{name}`: null"),
        },
    }
}

fn req_row<'a>(f: &'a Option<Flat<f64>>, i: usize, name: &str, len: usize) -> Result<&'a [f64]> {
    let r = opt_row(f, i, name)?.ok_or_else(|| anyhow!("missing column `{name}`"))?;
    if r.len() != len {
        bail!(
            "column `{name}` has {} entries for a response of {len} tokens",
            r.len()
        );
    }
    Ok(r)
}

fn kind_of(s: &StrCol, i: usize) -> Result<SampleType> {
    match s.get(i) {
        None => bail!("column `sample_type`: null"),
        Some(v) => v.parse().map_err(|e| anyhow!("column `sample_type`: {e}")),
    }
}

fn reward_of(r: &arrow::array::Float64Array, i: usize) -> Result<f64> {
    if r.is_null(i) {
        bail!("column `reward`: null (run `rlcr score` first)");
    }
    let v = r.value(i);
    if !v.is_finite() {
        bail!("column `reward`: {v} is not finite");
    }
    Ok(v)
}

/// Split a row's components into sorted per-turn rewards `Σ w·v` and the global sum (`_raw_*`
/// skipped); returns `None` when the row has no component.
fn structured(comps: &[Component], turns: &mut Vec<(i32, f64)>) -> Result<Option<f64>> {
    turns.clear();
    let mut global = 0.0;
    let mut any = false;
    for c in comps {
        if c.name.starts_with("_raw_") {
            continue;
        }
        let v = c.weight * c.value;
        if !v.is_finite() {
            bail!("column `reward_components`: `{}` is not finite", c.name);
        }
        any = true;
        match c.turn {
            Some(k) if k >= 0 => match turns.iter_mut().find(|t| t.0 == k) {
                Some(t) => t.1 += v,
                None => turns.push((k, v)),
            },
            _ => global += v,
        }
    }
    turns.sort_by_key(|t| t.0);
    Ok(any.then_some(global))
}

// ------------------------------------------------------------------------------------------------
// Pass 1: keys and rewards → per-row advantages.

/// What pass 1 hands to pass 2.
#[derive(Default)]
struct Prepared {
    rows: usize,
    /// Sequence-level advantage per row (outcome estimators and grpo-multiturn).
    adv: Vec<f32>,
    zero_std: Vec<bool>,
    /// grpo-multiturn: row r's `(turn, A_turn)` are `turns[turn_start[r]..turn_start[r+1]]`.
    turn_start: Vec<u32>,
    turns: Vec<(i32, f64)>,
    global_adv: Vec<f64>,
    /// gae: whitening moments of the raw advantages over masked tokens.
    whiten: Option<(f64, f64, u64)>,
    groups: serde_json::Value,
    kl: serde_json::Value,
}

/// Columns the keys pass decodes: the keys and rewards, and the identities the validator's
/// cross-row rules read.
fn projection(plan: &Plan) -> Vec<&'static str> {
    let mut names = vec![
        "prompt_id",
        "sample_type",
        "reward",
        "answer_idx",
        "sample_id",
        "confidence_idx",
    ];
    match plan.estimator {
        Estimator::GrpoMultiturn | Estimator::Gae => names.push("reward_components"),
        Estimator::Rlcr | Estimator::Grpo | Estimator::Rloo => {}
    }
    if plan.tokens_in_pass1() {
        names.extend(TOKEN_COLUMNS);
    }
    names
}

/// The per-token columns (and the spans over them) the masks and token advantages are built
/// from, and the validator checks against `response_ids`.
const TOKEN_COLUMNS: [&str; 8] = [
    "response_ids",
    "answer_span",
    "confidence_span",
    "info_mask",
    "token_turn_ids",
    "response_logprobs",
    "ref_logprobs",
    "values",
];

/// The keys pass. Validates the table as it goes (the one [`Validator`]: the rules of the columns
/// read here and the cross-row rules; pass 2 checks the token columns), so its errors name the
/// file, row and column.
fn pass1(plan: &Plan, input: &Path) -> Result<Prepared> {
    // `sample_id` is read for the validator alone: as string views, compared where Parquet
    // decoded them
    // and `prompt_id`, `sample_type` as dictionaries: a kind found once per distinct value, a
    // prompt looked up when its key changes
    let reader = table::Reader::open_columns(input, &projection(plan))?
        .with_dictionaries(&["prompt_id", "sample_type"])
        .with_views(&["sample_id"]);
    let display = reader.display.clone();
    let mut validator = Validator::new(&display, &TRAJECTORY);
    validator.reserve(reader.num_rows());

    let mut prompts = Interner::default();
    let mut max_answer: Vec<i32> = Vec::new(); // per prompt: largest answer_idx of a confidence row
    let mut rewards: Vec<f64> = Vec::new();
    let mut kinds: Vec<SampleType> = Vec::new();
    let mut prompt: Vec<u32> = Vec::new();
    let mut answer: Vec<u32> = Vec::new();
    // grpo-multiturn
    let mut turn_rewards: Vec<TurnReward> = Vec::new();
    let mut globals: Vec<f64> = Vec::new();
    let mut comps: Vec<Component> = Vec::new();
    let mut row_turns: Vec<(i32, f64)> = Vec::new();
    // KL and GAE
    let mut kl_rows_mean = 0.0f64; // Σ_rows masked-mean KL
    let mut kl_tokens = 0u64;
    let mut moments = MaskedMoments::default();
    let mut m: Vec<bool> = Vec::new();
    let mut klbuf: Vec<f64> = Vec::new();
    let mut tokr: Vec<f64> = Vec::new();
    let mut gadv: Vec<f64> = Vec::new();
    let mut gret: Vec<f64> = Vec::new();

    let est = plan.estimator;
    let mut base = 0usize;
    for batch in reader {
        let batch = batch.context("decoding a record batch")?;
        validator.check_batch(&batch)?;
        let n = batch.num_rows();
        let pid = table::cols::str_col(&batch, &display, "prompt_id")?;
        let st = table::cols::str_col(&batch, &display, "sample_type")?;
        // the kind of each dictionary value (other values and null rows: `kind_of`'s message)
        let st_kinds = st.per_value(|v| v.and_then(|v| v.parse::<SampleType>().ok()));
        // the previous row's prompt_id key and prompt number (keys are per batch)
        let mut last_pid: Option<(i32, u32)> = None;
        let aidx = if est == Estimator::Rlcr {
            Some(cols::ints(&batch, "answer_idx").with_context(|| display.clone())?)
        } else {
            None
        };
        let rew = if batch.column_by_name("reward").is_some() {
            Some(cols::floats(&batch, "reward")?)
        } else {
            None
        };
        let comp = if matches!(est, Estimator::GrpoMultiturn | Estimator::Gae) {
            cols::components(&batch, "reward_components")?
        } else {
            None
        };
        let tok = if plan.tokens_in_pass1() {
            Some(TokCols::read(&batch, plan)?)
        } else {
            None
        };
        for i in 0..n {
            let row = base + i;
            (|| -> Result<()> {
                let kind = match st.key(i).and_then(|k| st_kinds.get(k as usize)) {
                    Some(&Some(k)) => k,
                    _ => kind_of(&st, i)?,
                };
                let p = match (pid.key(i), last_pid) {
                    (Some(k), Some((lk, lp))) if k == lk => lp,
                    (k, _) => {
                        if pid.is_null(i) {
                            bail!("column `prompt_id`: null");
                        }
                        let p = prompts.intern(pid.value(i));
                        last_pid = k.map(|k| (k, p));
                        p
                    }
                };
                let mut score = match (est, &rew) {
                    (Estimator::GrpoMultiturn, _) => 0.0,
                    (_, Some(r)) => reward_of(r, i)?,
                    (_, None) => bail!("missing column `reward`"),
                };
                if let (Some(tok), Some(kl)) = (&tok, &plan.kl) {
                    tok.mask(i, kind, plan.on_missing_span, &mut m)?;
                    let (s, c) = tok.kl(i, kl, &m, &mut klbuf)?;
                    kl_rows_mean += if c > 0 { s / c as f64 } else { 0.0 };
                    kl_tokens += c as u64;
                    if est != Estimator::Gae {
                        score -= kl.controller.coef() * s;
                    }
                }
                match est {
                    Estimator::Rlcr | Estimator::Grpo | Estimator::Rloo => {
                        rewards.push(score);
                        kinds.push(kind);
                        prompt.push(p);
                        if let Some(a) = &aidx {
                            if a.is_null(i) {
                                bail!("column `answer_idx`: null");
                            }
                            let k = a.value(i);
                            // Only confidence rows have an answer group (answer rows: unused 0);
                            // the validator checked the links (one answer per key, none missing).
                            if kind == SampleType::Answer {
                                answer.push(0);
                                return Ok(());
                            }
                            if k < 0 {
                                bail!("column `answer_idx`: {k} is negative");
                            }
                            // Raw index for now; made dense after the pass (see `dense_answers`).
                            let pi = p as usize;
                            if max_answer.len() <= pi {
                                max_answer.resize(pi + 1, -1);
                            }
                            max_answer[pi] = max_answer[pi].max(k);
                            answer.push(k as u32);
                        }
                    }
                    Estimator::GrpoMultiturn => {
                        if let Some(c) = &comp {
                            c.row(i, &mut comps)?;
                        } else {
                            comps.clear();
                        }
                        let g = match structured(&comps, &mut row_turns)? {
                            Some(g) => g,
                            None => match &rew {
                                Some(r) => reward_of(r, i)?,
                                None => bail!("no reward_components and no reward"),
                            },
                        };
                        for &(k, v) in &row_turns {
                            turn_rewards.push(TurnReward {
                                row: row as u32,
                                turn: k,
                                value: v,
                            });
                        }
                        globals.push(g);
                        prompt.push(p);
                    }
                    Estimator::Gae => {
                        let tok = tok
                            .as_ref()
                            .ok_or_else(|| anyhow!("internal: no token columns"))?;
                        if plan.kl.is_none() {
                            tok.mask(i, kind, plan.on_missing_span, &mut m)?;
                        }
                        gae_raw(
                            plan,
                            tok,
                            comp.as_ref(),
                            i,
                            score,
                            &m,
                            &klbuf,
                            &mut comps,
                            &mut row_turns,
                            &mut tokr,
                            &mut gadv,
                            &mut gret,
                        )?;
                        moments.extend(&gadv, &m);
                    }
                }
                Ok(())
            })()
            .with_context(|| format!("{display}, row {row}"))?;
        }
        base += n;
    }
    let rows = base;
    if rows == 0 {
        bail!("{display}: the table has no rows; nothing was written");
    }
    validator.finish()?;
    if rows > u32::MAX as usize {
        bail!(
            "{display}: {rows} rows: more than the 4 294 967 295 one table may hold for \
             `rlcr advantage`"
        );
    }

    let mut prep = Prepared {
        rows,
        ..Default::default()
    };
    let n_prompts = prompts.len();
    match est {
        Estimator::Rlcr => {
            let n_answers = dense_answers(&kinds, &prompt, &mut answer, &max_answer);
            let out = adv::rlcr_tree(
                &rewards, &kinds, &prompt, &answer, n_prompts, n_answers, &plan.tree,
            );
            prep.adv = out.advantages.iter().map(|&x| x as f32).collect();
            prep.zero_std = out.zero_std;
            prep.groups = json!({
                "answer": summary_json(&out.answers),
                "confidence": summary_json(&out.confidences),
                "prompt_level": out.prompt_level.as_ref().map(summary_json),
            });
        }
        Estimator::Grpo | Estimator::Rloo => {
            // Groups are (prompt, sample_type): id = 2·prompt + type.
            let gid: Vec<u32> = prompt
                .iter()
                .zip(&kinds)
                .map(|(&p, &k)| 2 * p + (k == SampleType::Confidence) as u32)
                .collect();
            let out = if est == Estimator::Grpo {
                adv::grpo(&rewards, &gid, 2 * n_prompts, &plan.tree.ans)
            } else {
                adv::rloo(&rewards, &gid, 2 * n_prompts, plan.tree.ans.singleton)
            };
            let conf_cfg = plan.tree.conf;
            prep.adv = (0..rows)
                .map(|i| match kinds[i] {
                    SampleType::Answer => (plan.tree.lambda_ans * out.advantages[i]) as f32,
                    SampleType::Confidence => {
                        // --norm-conf may differ from --norm: recompute from the group stats.
                        let a = if est == Estimator::Grpo && conf_cfg.norm != plan.tree.ans.norm {
                            adv::normalized(rewards[i], &out.stats[gid[i] as usize], &conf_cfg)
                        } else {
                            out.advantages[i]
                        };
                        (plan.tree.lambda_conf * a) as f32
                    }
                })
                .collect();
            prep.zero_std = out.zero_std;
            let ans: Vec<_> = out.stats.iter().step_by(2).copied().collect();
            let conf: Vec<_> = out.stats.iter().skip(1).step_by(2).copied().collect();
            prep.groups = json!({
                "answer": summary_json(&GroupSummary::of(&ans)),
                "confidence": summary_json(&GroupSummary::of(&conf)),
            });
        }
        Estimator::GrpoMultiturn => {
            let out =
                adv::grpo_multiturn(&turn_rewards, &globals, &prompt, n_prompts, &plan.multiturn);
            prep.adv = out.row_adv.iter().map(|&x| x as f32).collect();
            prep.zero_std = out.zero_std;
            prep.turn_start = Vec::with_capacity(rows + 1);
            prep.turns = Vec::with_capacity(turn_rewards.len());
            let mut e = 0usize;
            for r in 0..rows {
                prep.turn_start.push(prep.turns.len() as u32);
                while e < turn_rewards.len() && turn_rewards[e].row as usize == r {
                    prep.turns.push((turn_rewards[e].turn, out.turn_adv[e]));
                    e += 1;
                }
            }
            prep.turn_start.push(prep.turns.len() as u32);
            prep.global_adv = out.global_adv;
            prep.groups = json!({
                "turn": summary_json(&out.turns),
                "global": summary_json(&out.globals),
            });
        }
        Estimator::Gae => {
            prep.whiten = Some((moments.mean(), moments.var_unbiased(), moments.count()));
            prep.groups = json!(null);
        }
    }
    if let Some(kl) = &plan.kl {
        let current = if rows > 0 {
            kl_rows_mean / rows as f64
        } else {
            0.0
        };
        let mut next = kl.controller;
        next.update(current, rows as u64);
        prep.kl = json!({
            "estimator": kl.estimator,
            "controller": kl.controller,
            "coef": kl.controller.coef(),
            "current_kl": current,
            "masked_tokens": kl_tokens,
            "next_coef": next.coef(),
        });
    }
    Ok(prep)
}

/// Turn the raw `answer_idx` of confidence rows into dense ids of `(prompt, answer_idx)`:
/// `base[prompt] + answer_idx`, with `base` the prefix sums of `max_answer + 1` per prompt (no
/// hashing; answer indices are small). When the indices are so sparse that this space would be much
/// larger than the number of rows, fall back to numbering the distinct pairs with a hash map.
/// Returns the number of ids.
fn dense_answers(
    kinds: &[SampleType],
    prompt: &[u32],
    answer: &mut [u32],
    max_answer: &[i32],
) -> usize {
    let mut base = Vec::with_capacity(max_answer.len());
    let mut total = 0usize;
    for &m in max_answer {
        base.push(total);
        total += (m + 1) as usize;
    }
    if total <= 2 * answer.len() + 1024 {
        for i in 0..answer.len() {
            if kinds[i] == SampleType::Confidence {
                answer[i] = (base[prompt[i] as usize] + answer[i] as usize) as u32;
            }
        }
        return total;
    }
    let mut ids: FastMap<(u32, u32), u32> = FastMap::default();
    for i in 0..answer.len() {
        if kinds[i] == SampleType::Confidence {
            let n = ids.len() as u32;
            answer[i] = *ids.entry((prompt[i], answer[i])).or_insert(n);
        }
    }
    ids.len()
}

fn summary_json(s: &GroupSummary) -> serde_json::Value {
    json!({
        "groups": s.groups,
        "singletons": s.singletons,
        "zero_std": s.zero_std,
        "zero_std_fraction": s.zero_std_fraction(),
    })
}

/// Raw (unwhitened) GAE of one row into `adv`, `ret`: the sequence reward on tokens by the chosen
/// distribution, minus `β·kl`, then [`gae::gae_row`].
#[allow(clippy::too_many_arguments)]
fn gae_raw(
    plan: &Plan,
    tok: &TokCols,
    comp: Option<&cols::Components>,
    i: usize,
    reward: f64,
    mask: &[bool],
    kl: &[f64],
    comps: &mut Vec<Component>,
    turns: &mut Vec<(i32, f64)>,
    tokr: &mut Vec<f64>,
    adv_out: &mut Vec<f64>,
    ret_out: &mut Vec<f64>,
) -> Result<()> {
    let len = mask.len();
    let values = req_row(&tok.values, i, "values", len)?;
    if let Some(v) = values.iter().find(|v| !v.is_finite()) {
        bail!("column `values`: {v} is not finite");
    }
    match comp {
        Some(c) => c.row(i, comps)?,
        None => comps.clear(),
    }
    let global = structured(comps, turns)?;
    tokr.clear();
    tokr.resize(len, 0.0);
    match (plan.reward_distribution, global) {
        (RewardDistribution::FinalTokenOnly, Some(g)) => {
            adv::distribute_final_token(adv::final_token_total(turns, g), mask, tokr);
        }
        (RewardDistribution::FinalTokenOnly, None) => {
            adv::distribute_final_token(reward, mask, tokr);
        }
        (RewardDistribution::TurnProportional, Some(g)) => {
            let ids = opt_row(&tok.turns, i, "token_turn_ids")?;
            adv::distribute_turn_proportional(turns, g, ids, mask, tokr);
        }
        (RewardDistribution::TurnProportional, None) => {
            adv::distribute_turn_proportional(&[], reward, None, mask, tokr);
        }
    }
    if let Some(k) = &plan.kl {
        let beta = k.controller.coef();
        for (r, kv) in tokr.iter_mut().zip(kl) {
            *r -= beta * kv;
        }
    }
    adv_out.clear();
    adv_out.resize(len, 0.0);
    ret_out.clear();
    ret_out.resize(len, 0.0);
    gae::gae_row(tokr, values, mask, plan.gamma, plan.lam, adv_out, ret_out);
    Ok(())
}

#[cfg(test)]
mod tests;
