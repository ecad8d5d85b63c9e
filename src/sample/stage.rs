//! What `generate-answers` and `generate-confidence` share (and `probe`, which samples from cut
//! responses): settings, sharding, opening the input, running the sampler with a progress bar and
//! a summary, sampling and writing in chunks, building the sampled rows' columns and the output's
//! metadata; and the engine that runs either of the first two over its input table
//! ([`TableStage`], [`run_table`]).
use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::{ArrayRef, Int32Array, StringArray};

use super::logits::SamplingParams;
use super::policy::Policy;
use super::sampler::{generate, GenConfig, Generated, Group, SampleId};
use super::spans::{answer_span, confidence_span, Span};
use super::stop::StopCriteria;
use crate::model::memory::PoolWatch;
use crate::model::transfer::Transfers;
use crate::model::Message;
use crate::progress::Progress;
use crate::table::{self, cols, Meta, Reader, SampleType, TableSpec, Writer, TRAJECTORY};

/// Slots prefilled per forward call. Bounds the attention scores' memory to
/// `rows · heads · chunk · context`, and keeps the CPU backend on its plain (not tiled) attention
/// for contexts up to ~1300 tokens, whose results do not depend on how the batch is padded.
pub const PREFILL_CHUNK: usize = 64;

/// Samples generated together before their rows are written: enough for the sampler to sort
/// contexts by length into full waves, few enough to keep memory bounded.
pub fn chunk_samples(batch_size: usize) -> usize {
    (batch_size * 16).max(256)
}

/// The sampling configuration of a stage, built from its flags and the policy.
pub fn gen_config(
    policy: &Policy,
    params: SamplingParams,
    max_new_tokens: usize,
    stop_strings: Vec<String>,
    seed: u64,
    batch_size: usize,
) -> Result<GenConfig> {
    params.validate()?;
    if max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    if batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let eos = policy.model.tokenizer.stop_ids.clone();
    if eos.is_empty() {
        crate::info!(
            "warning: the model defines no end-of-sequence token; responses end at --max-new-tokens or a --stop string"
        );
    }
    Ok(GenConfig {
        params,
        stop: StopCriteria {
            eos,
            stop_strings,
            max_new_tokens,
        },
        allowed_vocab: policy.allowed_vocab(),
        seed,
        batch_size,
        prefill_chunk: PREFILL_CHUNK,
    })
}

/// What the plans of the model stages share (`generate-answers`, `generate-confidence`,
/// `probe`): which model on which device, which table in and out, the shard, the seed, and the
/// command line recorded in the output's metadata.
#[derive(Debug, Clone)]
pub struct ModelJob {
    /// The model folder.
    pub model: std::path::PathBuf,
    /// A LoRA adapter folder merged into `model` at load.
    pub adapter: Option<std::path::PathBuf>,
    /// `cpu`, `wgpu[:N]`, `cuda[:N]`.
    pub device: crate::model::DeviceSpec,
    pub input: std::path::PathBuf,
    pub out: std::path::PathBuf,
    /// Only the rows of this shard (split by `prompt_id`).
    pub shard: Option<crate::table::Shard>,
    pub seed: u64,
    pub argv: Vec<String>,
    /// The chat template and its extra variables.
    pub chat: crate::model::ChatOptions,
}

impl ModelJob {
    /// The job's policy (its model, with its adapter merged in) on `device`.
    pub fn open_policy(&self, device: &burn::tensor::Device) -> Result<Policy> {
        Policy::open(&self.model, self.adapter.as_deref(), device, &self.chat)
    }
}

/// The sampling settings of a generation stage (the validated form of its sampling flags).
#[derive(Debug, Clone)]
pub struct SamplingPlan {
    /// Temperature, top-k, top-p, min-p.
    pub params: SamplingParams,
    /// Maximum number of new tokens per response.
    pub max_new_tokens: usize,
    /// Sequences decoded together.
    pub batch_size: usize,
    /// Extra stop strings (the response ends after the first one).
    pub stop: Vec<String>,
    /// Text the assistant turn starts with (recorded as a partial assistant message).
    pub response_prefix: Option<String>,
}

impl SamplingPlan {
    /// Load the policy and resolve the generation settings: the model, the [`gen_config`] and
    /// the metadata object [`sampling_meta`] starts with `"stage"` set to `stage_name`.
    pub fn load(
        &self,
        job: &ModelJob,
        device: &burn::tensor::Device,
        stage_name: &str,
    ) -> Result<(Policy, GenConfig, serde_json::Value)> {
        let policy = job.open_policy(device)?;
        let cfg = gen_config(
            &policy,
            self.params,
            self.max_new_tokens,
            self.stop.clone(),
            job.seed,
            self.batch_size,
        )?;
        let mut config = sampling_meta(&cfg, &policy, &job.model);
        config["stage"] = stage_name.into();
        Ok((policy, cfg, config))
    }
}

/// Running totals for the summary line and the metadata.
#[derive(Debug, Default)]
pub struct Summary {
    pub rows: usize,
    pub tokens: usize,
    pub finish: BTreeMap<&'static str, usize>,
    pub spans_found: usize,
    pub seconds: f64,
    /// Decode steps run (one token per active row each).
    pub steps: usize,
    /// Host ↔ device transfers of the sampling (prefill included).
    pub transfers: Transfers,
    /// Kernel launches of the sampling on a GPU backend (prefill included; 0 on the CPU).
    pub launches: u64,
    /// The GPU memory pool's peaks (`None` on the CPU).
    pub memory: Option<PoolWatch>,
}

impl Summary {
    pub fn add(&mut self, g: &Generated, span: Option<Span>) {
        self.rows += 1;
        *self.finish.entry(g.finish.as_str()).or_default() += 1;
        if span.is_some() {
            self.spans_found += 1;
        }
    }

    /// `STAGE: N rows, T tokens in S s (R tokens/s); finish: stop A, length B; spans: F of N`.
    pub fn line(&self, stage: &str, span_name: &str) -> String {
        let fin: Vec<String> = self
            .finish
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        format!(
            "{stage}: {} rows, {} tokens in {:.1} s ({:.1} tokens/s); finish: {}; {span_name} found in {} of {} rows",
            self.rows,
            self.tokens,
            self.seconds,
            self.tokens as f64 / self.seconds.max(1e-9),
            if fin.is_empty() { "-".to_string() } else { fin.join(", ") },
            self.spans_found,
            self.rows
        )
    }
}

impl Summary {
    /// `STAGE: host transfers per decode step: R reads (B bytes), U uploads (C bytes); N steps`
    /// (totals over the steps, prefill included, divided by the steps), and on a GPU backend
    /// `, K kernel launches` before the steps.
    pub fn transfer_line(&self, stage: &str) -> String {
        let n = self.steps.max(1) as f64;
        let t = &self.transfers;
        let launches = if self.launches > 0 {
            format!(", {:.1} kernel launches", self.launches as f64 / n)
        } else {
            String::new()
        };
        format!(
            "{stage}: host transfers per decode step: {:.2} reads ({:.0} bytes), {:.2} uploads \
             ({:.0} bytes){launches}; {} steps",
            t.reads as f64 / n,
            t.read_bytes as f64 / n,
            t.uploads as f64 / n,
            t.upload_bytes as f64 / n,
            self.steps
        )
    }

    /// [`PoolPeak::line`](crate::model::memory::PoolPeak::line) on a GPU backend, `None` on the
    /// CPU.
    pub fn memory_line(&mut self, stage: &str) -> Option<String> {
        crate::model::memory::line(&mut self.memory, stage)
    }

    /// Log what the sampling cost: the [`Self::transfer_line`], then on a GPU backend the
    /// [`Self::memory_line`].
    pub fn log_costs(&mut self, stage: &str) {
        crate::info!("{}", self.transfer_line(stage));
        if let Some(line) = self.memory_line(stage) {
            crate::info!("{line}");
        }
    }

    /// Log a finished stage: its [`Self::line`], then its [`Self::log_costs`].
    pub fn log(&mut self, stage: &str, span_name: &str) {
        crate::info!("{}", self.line(stage, span_name));
        self.log_costs(stage);
    }
}

/// Decode steps between two readings of the GPU memory pool while sampling.
const POOL_SAMPLE_EVERY: usize = 16;

/// What a sampling run costs, measured from its start: the wall time, the decode steps, this
/// thread's host transfers and kernel launches, and the GPU memory pool's peaks (read every
/// `POOL_SAMPLE_EVERY` steps).
pub struct Meter {
    start: std::time::Instant,
    moved: Transfers,
    launched: u64,
    steps: usize,
    pool: Option<PoolWatch>,
}

impl Meter {
    /// Start measuring; `pool` then gives the watch of the GPU memory pool (`None` on the CPU).
    pub fn start(pool: impl FnOnce() -> Option<PoolWatch>) -> Self {
        let start = std::time::Instant::now();
        let moved = crate::model::transfer::thread_counts();
        let launched = crate::model::transfer::thread_launches();
        Meter {
            start,
            moved,
            launched,
            steps: 0,
            pool: pool(),
        }
    }

    /// Count a decode step.
    pub fn step(&mut self) {
        self.steps += 1;
        if self.steps.is_multiple_of(POOL_SAMPLE_EVERY) {
            if let Some(w) = self.pool.as_mut() {
                w.sample();
            }
        }
    }

    /// Seconds since the start.
    pub fn seconds(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Add the run's costs so far to `summary` (its memory watch replaced by the run's).
    pub fn add_to(self, summary: &mut Summary) {
        summary.memory = self.pool;
        summary.seconds += self.start.elapsed().as_secs_f64();
        summary.steps += self.steps;
        summary.launches += crate::model::transfer::thread_launches() - self.launched;
        let moved = crate::model::transfer::thread_counts() - self.moved;
        let t = &mut summary.transfers;
        t.reads += moved.reads;
        t.read_bytes += moved.read_bytes;
        t.uploads += moved.uploads;
        t.upload_bytes += moved.upload_bytes;
    }
}

/// The sampler's groups for `items`: per item, its context (`context`) and `g` samples, the
/// `k`-th identified by `id(item, k)`.
pub fn groups<P>(
    items: &[P],
    g: usize,
    context: impl Fn(&P) -> Vec<u32>,
    id: impl Fn(&P, u32) -> SampleId,
) -> Vec<Group> {
    items
        .iter()
        .map(|p| Group {
            context: context(p),
            samples: (0..g as u32).map(|k| id(p, k)).collect(),
        })
        .collect()
}

/// Run the sampler over `groups` with the progress bar; adds the token count, the decode steps
/// and the transfers to `summary`.
pub fn run_groups(
    policy: &Policy,
    groups: &[Group],
    cfg: &GenConfig,
    progress: &mut Progress,
    summary: &mut Summary,
) -> Result<Vec<Vec<Generated>>> {
    let decode = |ids: &[u32]| policy.decode(ids);
    let base_tokens = summary.tokens;
    let base_secs = summary.seconds;
    let mut tokens = 0usize;
    let mut meter = Meter::start(|| {
        summary
            .memory
            .take()
            .or_else(|| PoolWatch::new(&policy.model.transformer.device()))
    });
    let out = generate(policy, &decode, groups, cfg, &mut |r| {
        tokens += r.tokens;
        meter.step();
        progress.inc(r.finished as u64);
        let secs = base_secs + meter.seconds();
        progress.message(&format!(
            "{:.1} tok/s",
            (base_tokens + tokens) as f64 / secs.max(1e-9)
        ));
    })?;
    summary.tokens += tokens;
    meter.add_to(summary);
    Ok(out)
}

/// The columns a generation stage writes for its sampled rows.
#[derive(Debug, Default)]
pub struct SampledColumns {
    pub sample_type: Vec<&'static str>,
    pub answer_idx: Vec<i32>,
    pub confidence_idx: Vec<Option<i32>>,
    pub sample_id: Vec<String>,
    pub messages: Vec<String>,
    pub context_ids: Vec<Vec<i32>>,
    pub response_ids: Vec<Vec<i32>>,
    pub response_text: Vec<String>,
    pub response_logprobs: Vec<Vec<f32>>,
    pub finish_reason: Vec<&'static str>,
    pub answer_span: Vec<Option<(i32, i32)>>,
    pub confidence_span: Vec<Option<(i32, i32)>>,
}

/// Open the input table of `job` and check its schema against `spec` (the `required` columns
/// present, every known column of its type): the reader and the name its errors give the file.
pub fn open_input(job: &ModelJob, spec: &TableSpec, required: &[&str]) -> Result<(Reader, String)> {
    let reader = Reader::open(&job.input)?;
    let name = job.input.display().to_string();
    table::check_schema(&name, &reader.schema(), spec, required)?;
    Ok((reader, name))
}

/// The metadata of a sampling stage's trajectory output: `config` (the sampling settings and the
/// stage's own) completed with the response prefix, the shard and the command line, and the input
/// table and the model as its provenance.
pub fn output_meta(
    job: &ModelJob,
    s: &SamplingPlan,
    stage_name: &str,
    mut config: serde_json::Value,
) -> Result<Meta> {
    config["response_prefix"] = s.response_prefix.clone().into();
    config["shard"] = serde_json::to_value(job.shard)?;
    config["argv"] = job.argv.clone().into();
    Ok(Meta::new(
        &TRAJECTORY,
        stage_name,
        config,
        &[job.input.as_path(), job.model.as_path()],
    ))
}

/// A sampling stage's run: the policy and its generation settings, with the progress bar and
/// the running totals every chunk adds to.
pub struct Sampler<'a> {
    pub policy: &'a Policy,
    pub cfg: &'a GenConfig,
    pub progress: Progress,
    pub summary: Summary,
}

impl<'a> Sampler<'a> {
    /// A run of `total` output rows under `stage_name` (the progress bar's title).
    pub fn new(policy: &'a Policy, cfg: &'a GenConfig, stage_name: &str, total: usize) -> Self {
        Sampler {
            policy,
            cfg,
            progress: Progress::new(stage_name, total as u64, "rows"),
            summary: Summary::default(),
        }
    }

    /// Sample `g` responses for each of `items`: its context `context(item)`, its k-th sample
    /// `id(item, k)` (see [`groups`], [`run_groups`]). Per item, its responses in order.
    pub fn sample<P>(
        &mut self,
        items: &[P],
        g: usize,
        context: impl Fn(&P) -> Vec<u32>,
        id: impl Fn(&P, u32) -> SampleId,
    ) -> Result<Vec<Vec<Generated>>> {
        let groups = groups(items, g, context, id);
        run_groups(
            self.policy,
            &groups,
            self.cfg,
            &mut self.progress,
            &mut self.summary,
        )
    }

    /// Sample `items` (`g` samples each) in chunks of about [`chunk_samples`] samples, in
    /// order, and write each chunk's rows (`sample(self, chunk)`) to `out` as soon as they are
    /// built (the writer opened with the first rows).
    pub fn write_chunks<P>(
        &mut self,
        items: &[P],
        g: usize,
        writer: &mut Option<Writer>,
        out: &std::path::Path,
        meta: &Meta,
        mut sample: impl FnMut(&mut Self, &[P]) -> Result<arrow::array::RecordBatch>,
    ) -> Result<()> {
        let per_chunk = (chunk_samples(self.cfg.batch_size) / g).max(1);
        for chunk in items.chunks(per_chunk) {
            let rows = sample(self, chunk)?;
            table::io::write_lazily(writer, out, meta, &rows)?;
        }
        Ok(())
    }

    /// Sample `g` responses for each of `items` ([`Self::sample`]) and build their rows: answer
    /// rows with their `answer_span` for prompts, confidence rows with their `confidence_span`
    /// for answers.
    pub(crate) fn sample_rows(&mut self, items: &[Item], g: usize) -> Result<Sampled> {
        let results = self.sample(items, g, |p| p.context_ids.clone(), Item::sample_id)?;
        let mut take = Vec::with_capacity(items.len() * g);
        let mut c = SampledColumns::default();
        for (p, res) in items.iter().zip(&results) {
            for (k, gen) in res.iter().enumerate() {
                let span = match p.kind {
                    ItemKind::Prompt => answer_span(&gen.text, &gen.ends, p.opened),
                    ItemKind::Answer(_) => confidence_span(&gen.text, &gen.ends, p.opened),
                };
                self.summary.add(gen, span);
                take.push(p.row as u32);
                let (sample_type, answer_idx, confidence_idx, sample_id, spans) = match p.kind {
                    ItemKind::Prompt => (
                        SampleType::Answer,
                        k,
                        None,
                        format!("{}/a{k}", p.prompt_id),
                        (span, None),
                    ),
                    ItemKind::Answer(a) => (
                        SampleType::Confidence,
                        a as usize,
                        Some(to_i32(k, "confidence_idx")?),
                        format!("{}/a{a}/c{k}", p.prompt_id),
                        (None, span),
                    ),
                };
                c.push(
                    sample_type.as_str(),
                    to_i32(answer_idx, "answer_idx")?,
                    confidence_idx,
                    sample_id,
                    &p.messages,
                    &p.context_ids,
                    gen,
                    spans.0,
                    spans.1,
                )?;
            }
        }
        Ok(Sampled {
            columns: c,
            input_rows: take,
        })
    }
}

/// What an [`Item`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ItemKind {
    /// A prompt: its `k`-th sample is answer `k`.
    Prompt,
    /// Answer `a` of its prompt: its `k`-th sample is the answer's confidence `k`.
    Answer(u32),
}

/// One input row ready to sample from: a prompt for its answers, or an answer for its
/// confidences.
pub(crate) struct Item {
    /// Row in its input batch.
    pub(crate) row: usize,
    pub(crate) prompt_id: String,
    pub(crate) kind: ItemKind,
    /// The conversation the samples respond to, and its token ids.
    pub(crate) messages: Vec<Message>,
    pub(crate) context_ids: Vec<u32>,
    /// Whether the context already opened the samples' span (see [`super::spans`]).
    pub(crate) opened: bool,
}

impl Item {
    /// The identity of the item's `k`-th sample.
    pub(crate) fn sample_id(&self, k: u32) -> SampleId {
        let prompt_id = self.prompt_id.clone();
        match self.kind {
            ItemKind::Prompt => SampleId {
                prompt_id,
                answer_idx: k,
                confidence_idx: None,
            },
            ItemKind::Answer(a) => SampleId {
                prompt_id,
                answer_idx: a,
                confidence_idx: Some(k),
            },
        }
    }
}

/// One batch of a stage's input: its rows, the input row of its first row, and the input's name
/// in errors.
pub(crate) struct InputBatch<'a> {
    pub(crate) rows: &'a arrow::array::RecordBatch,
    pub(crate) first_row: usize,
    pub(crate) name: &'a str,
}

impl InputBatch<'_> {
    /// The items `item(i, loc)` makes of the batch's rows, in order: row `i`, `loc` naming it in
    /// errors (`{name}, row N`); `None` skips the row.
    pub(crate) fn items(
        &self,
        mut item: impl FnMut(usize, &dyn Fn() -> String) -> Result<Option<Item>>,
    ) -> Result<Vec<Item>> {
        let mut items = Vec::new();
        for i in 0..self.rows.num_rows() {
            let loc = || format!("{}, row {}", self.name, self.first_row + i);
            if let Some(p) = item(i, &loc)? {
                items.push(p);
            }
        }
        Ok(items)
    }
}

/// The rows [`Sampler::sample_rows`] sampled: their columns, and the input row of each.
pub(crate) struct Sampled {
    pub(crate) columns: SampledColumns,
    pub(crate) input_rows: Vec<u32>,
}

/// A stage that samples from the rows of one input table (`generate-answers`: G_a answers per
/// prompt; `generate-confidence`: G_c confidences per answer), run by [`run_table`]: what the
/// stages do differently.
pub(crate) trait TableStage {
    /// A run's state (what it has read so far).
    type Run;
    /// What a run reports back to the stage ([`Self::end`]).
    type Report;
    /// The stage's name: the progress bar's title and the metadata's `stage`.
    const NAME: &'static str;
    /// The input's schema, and the columns it must have.
    const INPUT: &'static TableSpec;
    const REQUIRED: &'static [&'static str];
    /// The input rows to sample from, as the error names them when none is: `no {NOTHING}`.
    const NOTHING: &'static str;

    /// Check the opened input (`name` in errors) before any of its rows is read.
    fn check_input(&self, _reader: &Reader, _name: &str) -> Result<()> {
        Ok(())
    }
    /// Add the stage's own settings to the output's metadata `config`.
    fn config(&self, config: &mut serde_json::Value);
    /// A run's state at its start, over the input `name`.
    fn start(&self, name: &str) -> Self::Run;
    /// An input batch as the stage reads it and takes its output rows from (default: as read).
    fn conform(
        &self,
        _run: &mut Self::Run,
        batch: arrow::array::RecordBatch,
    ) -> Result<arrow::array::RecordBatch> {
        Ok(batch)
    }
    /// The items of one input batch.
    fn items(&self, run: &mut Self::Run, policy: &Policy, batch: &InputBatch) -> Result<Vec<Item>>;
    /// The output rows of a chunk of the items of `batch`, sampled.
    fn rows(
        &self,
        batch: &arrow::array::RecordBatch,
        chunk: &[Item],
        sampled: Sampled,
    ) -> Result<arrow::array::RecordBatch>;
    /// After the last row is sampled, before the output is closed.
    fn end(&self, run: Self::Run) -> Result<Self::Report>;
}

/// Run a [`TableStage`]: open the device and the input of `job` (schema checked, and then
/// [`TableStage::check_input`]; an input without rows is an error), load the policy, then per
/// input batch sample `g` responses for each of its items and write their rows chunk by chunk
/// ([`Sampler::write_chunks`]). The sampler's totals and the stage's [`TableStage::end`].
pub(crate) fn run_table<S: TableStage>(
    stage: &S,
    job: &ModelJob,
    sampling: &SamplingPlan,
    g: usize,
) -> Result<(Summary, S::Report)> {
    let device = job.device.open()?;
    let (reader, name) = open_input(job, S::INPUT, S::REQUIRED)?;
    stage.check_input(&reader, &name)?;
    let total = reader.num_rows();
    if total == 0 {
        bail!("{name}: the table has no rows; nothing was written");
    }
    let (policy, cfg, mut config) = sampling.load(job, &device, S::NAME)?;
    stage.config(&mut config);
    let meta = output_meta(job, sampling, S::NAME, config)?;
    let mut run = stage.start(&name);
    let mut sampler = Sampler::new(&policy, &cfg, S::NAME, total * g);
    let mut writer: Option<Writer> = None;
    let mut first_row = 0usize;
    for batch in reader {
        let batch = stage.conform(&mut run, batch?)?;
        let input = InputBatch {
            rows: &batch,
            first_row,
            name: &name,
        };
        let items = stage.items(&mut run, &policy, &input)?;
        sampler.write_chunks(&items, g, &mut writer, &job.out, &meta, |sm, chunk| {
            let sampled = sm.sample_rows(chunk, g)?;
            stage.rows(&batch, chunk, sampled)
        })?;
        first_row += batch.num_rows();
    }
    sampler.progress.finish();
    let report = stage.end(run)?;
    finish_output(writer, &name, S::NOTHING, job.shard.is_some())?;
    Ok((sampler.summary, report))
}

/// Fail on the first of `cols` (a column name and whether the row's value is null) that is
/// null: `{loc}, column `{name}`: {what}`.
pub fn require_values(loc: &dyn Fn() -> String, what: &str, cols: &[(&str, bool)]) -> Result<()> {
    match cols.iter().find(|(_, null)| *null) {
        Some((c, _)) => bail!("{}, column `{c}`: {what}", loc()),
        None => Ok(()),
    }
}

/// Close the output a stage wrote chunk by chunk; when no row reached it (`writer` never opened),
/// the error `{name}: no {what}[ in this shard]; nothing was written`.
pub fn finish_output(writer: Option<Writer>, name: &str, what: &str, sharded: bool) -> Result<()> {
    let Some(w) = writer else {
        bail!(
            "{name}: no {what}{}; nothing was written",
            if sharded { " in this shard" } else { "" }
        );
    };
    w.finish()?;
    Ok(())
}

/// Row `i` of the `list<int32>` column `col` (`v`) as the model's token ids: each in `0..vocab`,
/// else an error naming the row (`loc`) and the column.
pub fn token_ids(
    v: &cols::ListView<'_, Int32Array>,
    i: usize,
    loc: &dyn Fn() -> String,
    col: &str,
    vocab: usize,
) -> Result<Vec<u32>> {
    v.values.values()[v.range(i)]
        .iter()
        .map(|&t| match u32::try_from(t) {
            Ok(id) if (id as usize) < vocab => Ok(id),
            _ => bail!(
                "{}, column `{col}`: token id {t} is outside the model's vocabulary (0..{vocab})",
                loc()
            ),
        })
        .collect()
}

/// A token count or index as int32 (the table type); larger values are an error.
pub fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).with_context(|| format!("{what} {v} does not fit the table's int32"))
}

/// Token ids as int32.
pub fn ids_i32(ids: &[u32]) -> Vec<i32> {
    ids.iter().map(|&t| t as i32).collect()
}

impl SampledColumns {
    /// Append one sampled row.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        sample_type: &'static str,
        answer_idx: i32,
        confidence_idx: Option<i32>,
        sample_id: String,
        messages: &[Message],
        context_ids: &[u32],
        g: &Generated,
        answer_span: Option<Span>,
        confidence_span: Option<Span>,
    ) -> Result<()> {
        let span = |s: Option<Span>| -> Result<Option<(i32, i32)>> {
            s.map(|s| Ok((to_i32(s.start, "span start")?, to_i32(s.end, "span end")?)))
                .transpose()
        };
        self.sample_type.push(sample_type);
        self.answer_idx.push(answer_idx);
        self.confidence_idx.push(confidence_idx);
        self.sample_id.push(sample_id);
        self.messages
            .push(serde_json::to_string(messages).context("serialising messages")?);
        self.context_ids.push(ids_i32(context_ids));
        self.response_ids.push(ids_i32(&g.ids));
        self.response_text.push(g.text.clone());
        self.response_logprobs.push(g.logprobs.clone());
        self.finish_reason.push(g.finish.as_str());
        self.answer_span.push(span(answer_span)?);
        self.confidence_span.push(span(confidence_span)?);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.sample_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sample_id.is_empty()
    }

    /// The columns as `(name, array)` pairs for [`cols::set_columns`].
    pub fn into_arrays(self) -> Vec<(&'static str, ArrayRef)> {
        let s = |v: Vec<&'static str>| -> ArrayRef { Arc::new(StringArray::from(v)) };
        vec![
            ("sample_type", s(self.sample_type)),
            ("answer_idx", Arc::new(Int32Array::from(self.answer_idx))),
            (
                "confidence_idx",
                Arc::new(Int32Array::from(self.confidence_idx)),
            ),
            ("sample_id", Arc::new(StringArray::from(self.sample_id))),
            (
                "messages",
                crate::table::nested::messages_column_from_text(
                    &self
                        .messages
                        .iter()
                        .map(|m| Some(m.as_str()))
                        .collect::<Vec<_>>(),
                ),
            ),
            ("context_ids", cols::build_list_i32(self.context_ids)),
            ("response_ids", cols::build_list_i32(self.response_ids)),
            (
                "response_text",
                Arc::new(StringArray::from(self.response_text)),
            ),
            (
                "response_logprobs",
                cols::build_list_f32(self.response_logprobs),
            ),
            ("finish_reason", s(self.finish_reason)),
            ("answer_span", cols::build_spans(&self.answer_span)),
            ("confidence_span", cols::build_spans(&self.confidence_span)),
        ]
    }
}

/// Parse the JSON text of a `messages` cell (see [`parse_messages`]).
pub fn messages_cell(text: &str, loc: &dyn Fn() -> String) -> Result<Vec<Message>> {
    let v: serde_json::Value = serde_json::from_str(text)
        .with_context(|| format!("{}, column `messages`: not valid JSON", loc()))?;
    parse_messages(&v, loc)
}

/// Parse a `messages` JSON value (list of {role, content}) into messages.
pub fn parse_messages(v: &serde_json::Value, loc: &dyn Fn() -> String) -> Result<Vec<Message>> {
    let list = v.as_array().with_context(|| {
        format!(
            "{}, column `messages`: expected a JSON list of {{role, content}}",
            loc()
        )
    })?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = m.get("role").and_then(|r| r.as_str());
            let content = m.get("content").and_then(|c| c.as_str());
            match (role, content) {
                (Some(r), Some(c)) => Ok(Message {
                    role: r.to_string(),
                    content: c.to_string(),
                }),
                _ => bail!(
                    "{}, column `messages`, message {i}: expected {{\"role\": text, \"content\": text}}",
                    loc()
                ),
            }
        })
        .collect()
}

/// The sampling settings recorded in the output's metadata (`rlcr.config`).
pub fn sampling_meta(
    cfg: &GenConfig,
    policy: &Policy,
    model_dir: &std::path::Path,
) -> serde_json::Value {
    let chat = policy.chat.meta();
    serde_json::json!({
        "model": model_dir.display().to_string(),
        "adapter": policy.model.adapter.as_ref().and_then(|a| a.dir.as_ref()).map(|d| d.display().to_string()),
        "model_fingerprint": policy.fingerprint,
        "chat_template": chat["chat_template"],
        "chat_template_kwargs": chat["chat_template_kwargs"],
        "temperature": cfg.params.temperature,
        "top_k": cfg.params.top_k,
        "top_p": cfg.params.top_p,
        "min_p": cfg.params.min_p,
        "max_new_tokens": cfg.stop.max_new_tokens,
        "stop": cfg.stop.stop_strings,
        "eos_token_ids": cfg.stop.eos,
        "sampled_vocab": cfg.allowed_vocab,
        "batch_size": cfg.batch_size,
        "seed": cfg.seed,
        "rng": "chacha20 per sample from (seed, prompt_id, answer_idx, confidence_idx), v1",
        "behaviour_logprobs": "log_softmax of the model logits at temperature 1 over the full vocabulary",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_with_locations() {
        let v: serde_json::Value =
            serde_json::from_str(r#"[{"role":"user","content":"hi"}]"#).unwrap();
        let m = parse_messages(&v, &|| "t.parquet, row 3".into()).unwrap();
        assert_eq!(m, vec![Message::new("user", "hi")]);
        let bad: serde_json::Value = serde_json::from_str(r#"[{"role":"user"}]"#).unwrap();
        let e = parse_messages(&bad, &|| "t.parquet, row 3".into()).unwrap_err();
        assert!(format!("{e}").contains("row 3") && format!("{e}").contains("message 0"));
        let e = parse_messages(&serde_json::json!({}), &|| "x".into()).unwrap_err();
        assert!(format!("{e}").contains("JSON list"));
    }

    #[test]
    fn summary_line() {
        let mut s = Summary::default();
        let g = Generated {
            ids: vec![1, 2],
            logprobs: vec![0.0, 0.0],
            text: String::new(),
            ends: vec![0, 0],
            finish: super::super::stop::FinishReason::Length,
        };
        s.add(&g, None);
        s.add(&g, Some(Span { start: 0, end: 1 }));
        s.tokens = 4;
        s.seconds = 2.0;
        assert_eq!(
            s.line("generate-answers", "answer_span"),
            "generate-answers: 2 rows, 4 tokens in 2.0 s (2.0 tokens/s); finish: length 2; answer_span found in 1 of 2 rows"
        );
    }
}
