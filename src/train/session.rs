//! One training call from start to finish, shared by `update` and `sft`: resume the optimizer,
//! run the loop with a progress bar, write the checkpoint folder with its state and metrics.
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::model::memory::PoolWatch;
use crate::model::Model;
use crate::progress::Progress;

use super::checkpoint::{
    carried_events, has_state, load_resume, metrics_value, previous_metrics, saved_stage,
    write_checkpoint, Summary, TrainerState, STATE_FORMAT,
};
use super::data::TrainRow;
use super::optim::{AdamW, AdamWConfig};
use super::trainer::{train_guarded, Guards, StepMetrics, TrainConfig};

/// `--resume`: continue the optimizer and step counter saved in the `--model` folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ResumeMode {
    /// Start a fresh optimizer at step 0.
    #[default]
    No,
    /// Resume; an error when the folder has no trainer state.
    Yes,
    /// Resume when the folder has a trainer state written by the same stage, else start fresh
    /// (the first RL iteration, or `update` after `sft`: the SFT moments and step count belong
    /// to another objective).
    Auto,
}

/// Everything about a call except the model and rows.
pub struct Session {
    /// `update` or `sft`.
    pub stage: String,
    /// Output folder.
    pub out: PathBuf,
    /// Resume mode.
    pub resume: ResumeMode,
    /// AdamW hyper-parameters.
    pub adamw: AdamWConfig,
    /// The loop's configuration.
    pub train: TrainConfig,
    /// Resolved configuration recorded in the trainer state.
    pub config: serde_json::Value,
    /// Input paths recorded in the trainer state.
    pub inputs: Vec<String>,
    /// A TensorBoard run folder that also gets this call's steps, one event flushed per step
    /// (`--tensorboard`); the checkpoint's own `runs/` copy is written either way.
    pub tensorboard: Option<PathBuf>,
}

/// The optimizer to start from: a fresh one, or the state saved in `dir`.
pub fn start_optimizer(
    dir: &Path,
    stage: &str,
    mode: ResumeMode,
    cfg: AdamWConfig,
    model: &crate::model::Transformer,
) -> Result<(AdamW, bool)> {
    let resume = match mode {
        ResumeMode::No => false,
        ResumeMode::Yes => {
            if !has_state(dir) {
                bail!(
                    "--resume: {} has no trainer state (rlcr-train/trainer_state.json); use \
                     --resume auto to start fresh when there is none",
                    dir.display()
                );
            }
            true
        }
        ResumeMode::Auto => match saved_stage(dir) {
            Some(s) if s == stage => true,
            Some(s) => {
                crate::info!(
                    "{}: the trainer state was written by `{s}`, not `{stage}`: starting a fresh \
                     optimizer",
                    dir.display()
                );
                false
            }
            None => false,
        },
    };
    if !resume {
        return Ok((AdamW::new(cfg), false));
    }
    let inner = model.device().inner();
    let r = load_resume(dir, cfg, &inner)?;
    r.opt.check_against(model)?;
    crate::info!(
        "resuming the `{}` optimizer state of {} at global step {}",
        r.stage,
        dir.display(),
        r.global_step
    );
    Ok((r.opt, true))
}

/// Train `model` on `rows` and write the checkpoint folder. Returns the step metrics.
pub fn run(model: Model, rows: &[TrainRow], s: &Session) -> Result<Vec<StepMetrics>> {
    run_guarded(model, rows, s, &Guards::default())
}

/// [`run`] with the [`Guards`] of the loop (a refused first batch writes nothing).
pub fn run_guarded(
    mut model: Model,
    rows: &[TrainRow],
    s: &Session,
    guards: &Guards,
) -> Result<Vec<StepMetrics>> {
    s.train.validate()?;
    s.adamw.validate()?;
    for dir in [model.dir.as_path(), model.state_dir()] {
        if let (Ok(a), Ok(b)) = (dir.canonicalize(), s.out.canonicalize()) {
            if a == b {
                bail!(
                    "-o {}: the output folder is the input model folder; write a new folder \
                     (inputs are never modified in place)",
                    s.out.display()
                );
            }
        }
    }
    // A fresh adapter starts a fresh optimizer: a state saved beside the base weights holds
    // moments of the base weights, which the adapter's training does not step.
    let fresh_adapter = matches!(&model.adapter, Some(a) if a.dir.is_none());
    let mode = match s.resume {
        ResumeMode::Yes if fresh_adapter => bail!(
            "--resume: a new LoRA adapter has no optimizer state to resume; give the adapter \
             folder of an earlier run as --model, or use --resume auto"
        ),
        ResumeMode::Auto if fresh_adapter => ResumeMode::No,
        m => m,
    };
    let state_dir = model.state_dir().to_path_buf();
    let (mut opt, resumed) =
        start_optimizer(&state_dir, &s.stage, mode, s.adamw, &model.transformer)?;
    let total = (s.train.epochs * s.train.mini_batches) as u64;
    let mut progress = Progress::new(&s.stage, total, "steps");
    let mut lines = if resumed {
        previous_metrics(&state_dir)?
    } else {
        Vec::new()
    };
    let previous = resumed.then(|| (model.dir.clone(), lines.clone()));
    // TensorBoard: this call's events, framed; streamed to --tensorboard as they come.
    let mut records = Vec::new();
    let mut live = match &s.tensorboard {
        Some(dir) => Some(crate::tensorboard::EventWriter::create(
            &dir.join(crate::tensorboard::file_name(opt.step + 1, &s.stage)),
        )?),
        None => None,
    };
    let t0 = Instant::now();
    let transformer = model.transformer;
    // The GPU memory pool, read after every optimizer step (no reading on the CPU).
    let mut pool = PoolWatch::new(&transformer.device());
    let (trained, steps) = train_guarded(transformer, &mut opt, rows, &s.train, guards, |m| {
        if let Some(w) = pool.as_mut() {
            w.sample();
        }
        let v = metrics_value(&s.stage, m)?;
        if let Some((step, scalars)) = crate::tensorboard::step_scalars(&v) {
            let r = crate::tensorboard::record(&crate::tensorboard::scalars_event(
                crate::tensorboard::now(),
                step as i64,
                &scalars,
            ));
            if let Some(w) = live.as_mut() {
                w.append(&r)?;
            }
            records.extend(r);
        }
        lines.push(serde_json::to_string(&v)?);
        progress.message(&format!("loss {:.4} gnorm {:.3}", m.loss, m.grad_norm));
        progress.inc(1);
        crate::debug!(
            "step {}: loss {:.6} pg {:.6} kl {:.6} entropy {:.4} clip {:.3}/{:.3}/{:.3} gnorm {:.4} lr {:.3e} tokens {}",
            m.step,
            m.loss,
            m.pg_loss,
            m.kl_loss,
            m.entropy,
            m.clip_frac_low,
            m.clip_frac_high,
            m.clip_frac_dual,
            m.grad_norm,
            m.lr,
            m.tokens
        );
        Ok(())
    })?;
    let seconds = t0.elapsed().as_secs_f64();
    progress.finish();
    model.transformer = trained;
    let summary = Summary::of(&steps, seconds);
    let state = TrainerState {
        format: STATE_FORMAT.to_string(),
        global_step: opt.step,
        stage: s.stage.clone(),
        version: crate::VERSION.to_string(),
        config: s.config.clone(),
        switches: crate::switches::get().recorded_json(),
        inputs: s.inputs.clone(),
        summary: summary.clone(),
    };
    let events = match &previous {
        Some((dir, old)) => carried_events(Some(dir.as_path()), &s.stage, old, &records),
        None => carried_events(None, &s.stage, &[], &records),
    };
    write_checkpoint(&model, &s.out, Some(&opt), &state, &lines, &events)?;
    if let Some(m) = &summary.mean {
        crate::info!(
            "{}: {} steps, mean loss {:.5}, grad norm {:.4}, {:.1} tokens/s{}; wrote {}",
            s.stage,
            summary.steps,
            m.loss,
            m.grad_norm,
            summary.tokens_per_second,
            diagnostics_text(steps.first()),
            s.out.display()
        );
    }
    if let Some(line) = crate::model::memory::line(&mut pool, &s.stage) {
        crate::info!("{line}");
    }
    Ok(steps)
}

/// The first step's diagnostics for the summary line: `, logp mismatch max … mean …, ratio
/// |r − 1| max …, KL to reference …, grad norm answers … confidences … (cosine …)` (each part
/// only when measured).
pub fn diagnostics_text(first: Option<&StepMetrics>) -> String {
    let Some(m) = first else {
        return String::new();
    };
    let mut out = String::new();
    if let (Some(a), Some(b)) = (m.diag.mismatch_logp_max, m.diag.mismatch_logp_mean) {
        out += &format!(", logp mismatch max {a:.2e} mean {b:.2e}");
    }
    if let (Some(a), Some(b)) = (m.diag.mismatch_ratio_max, m.diag.mismatch_ratio_mean) {
        out += &format!(", ratio |r - 1| max {a:.2e} mean {b:.2e}");
    }
    if let Some(k) = m.diag.ref_kl {
        out += &format!(", KL to reference {k:.4e}");
    }
    if let Some(t) = m.diag.turns {
        let (a, c) = (t.answer_norm, t.confidence_norm);
        out += &format!(", grad norm answers {a:.4} confidences {c:.4}");
        if let Some(cos) = t.cosine {
            out += &format!(" (cosine {cos:.3})");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::weights::weight_files;
    use std::collections::BTreeMap;

    /// dtype, shape and raw bytes of one tensor.
    type Raw = (String, Vec<usize>, Vec<u8>);

    /// Every tensor of a folder, straight from the files.
    fn read_checkpoint(dir: &Path) -> Result<BTreeMap<String, Raw>> {
        let mut out = BTreeMap::new();
        for f in weight_files(dir)? {
            let bytes = std::fs::read(&f)?;
            let st = safetensors::SafeTensors::deserialize(&bytes)?;
            for (name, v) in st.tensors() {
                out.insert(
                    name,
                    (
                        format!("{:?}", v.dtype()),
                        v.shape().to_vec(),
                        v.data().to_vec(),
                    ),
                );
            }
        }
        Ok(out)
    }
    use crate::train::checkpoint::{METRICS_FILE, STATE_DIR, TRAINER_STATE};
    use crate::train::loss::LossAgg;
    use crate::train::policy::host_logprobs;
    use crate::train::trainer::tests::{config, rows, tiny, tiny_dir};
    use burn::module::Module;

    fn session(out: &Path, lr: f64, resume: ResumeMode, epochs: usize) -> Session {
        let mut train = config(LossAgg::TokenMean, 2);
        train.schedule = crate::train::schedule::Schedule::new(
            lr,
            0.0,
            crate::train::schedule::ScheduleKind::Constant,
            None,
        )
        .expect("schedule");
        train.epochs = epochs;
        Session {
            stage: "update".into(),
            out: out.to_path_buf(),
            resume,
            adamw: AdamWConfig::default(),
            train,
            config: serde_json::json!({"test": true}),
            inputs: vec![],
            tensorboard: None,
        }
    }

    /// A temporary folder, the tiny model and 4 training rows of it drawn with `seed`.
    fn setup(seed: u64) -> (tempfile::TempDir, Model, Vec<TrainRow>) {
        let m = tiny();
        let rows = rows(&m.transformer, 4, seed, 0.2);
        (tempfile::tempdir().expect("tmp"), m, rows)
    }

    /// The steps and scalars of an event file (the version record first).
    fn event_steps(path: &Path) -> Vec<(i64, Vec<(String, f32)>)> {
        let ev =
            crate::tensorboard::read_events(&std::fs::read(path).expect("events")).expect("decode");
        assert_eq!(
            ev[0].file_version.as_deref(),
            Some(crate::tensorboard::FILE_VERSION)
        );
        ev[1..]
            .iter()
            .map(|e| (e.step, e.scalars.clone()))
            .collect()
    }

    /// With lr = 0 the written weights are bit-identical to the input's (same names, dtypes,
    /// bytes), and the folder carries the trainer state and one metrics line per step.
    #[test]
    fn lr_zero_writes_bit_identical_weights() {
        let (d, m, rows) = setup(5);
        let out = d.path().join("new");
        let steps = run(m, &rows, &session(&out, 0.0, ResumeMode::No, 2)).expect("run");
        assert_eq!(steps.len(), 2);
        assert!(steps.iter().all(|s| !s.skipped && s.grad_norm > 0.0));
        let a = read_checkpoint(&tiny_dir()).expect("input");
        let b = read_checkpoint(&out).expect("output");
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        for (k, ta) in &a {
            let tb = &b[k];
            assert_eq!(ta.0, tb.0, "{k}");
            assert_eq!(ta.1, tb.1, "{k}");
            assert!(ta.2 == tb.2, "{k}: bytes differ");
        }
        for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            assert!(out.join(f).is_file(), "{f} not copied");
        }
        let lines = std::fs::read_to_string(out.join(METRICS_FILE)).expect("metrics");
        assert_eq!(lines.lines().count(), 2);
        let first: serde_json::Value =
            serde_json::from_str(lines.lines().next().expect("line")).expect("json");
        assert_eq!(first["stage"], "update");
        assert_eq!(first["step"], 1);
        assert_eq!(first["lr"], 0.0);
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join(STATE_DIR).join(TRAINER_STATE)).expect("state"),
        )
        .expect("json");
        assert_eq!(state["global_step"], 2);
        assert_eq!(state["summary"]["steps"], 2);
        // No temporary folders left beside the output.
        let names: Vec<String> = std::fs::read_dir(d.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, vec!["new".to_string()]);
    }

    /// Two calls of one epoch each, the second resuming from the first's folder, end with the
    /// same weights as one call of two epochs; the metrics file holds the whole run.
    #[test]
    fn resume_continues_exactly() {
        let (d, m, rows) = setup(6);
        let one = d.path().join("one");
        let two = d.path().join("two");
        let both = d.path().join("both");
        let live = d.path().join("tb");
        let mut s1 = session(&one, 1e-3, ResumeMode::No, 1);
        s1.tensorboard = Some(live.clone());
        run(m, &rows, &s1).expect("first");
        let m1 = Model::load(&one, &burn::tensor::Device::flex().autodiff()).expect("load one");
        let mut s2 = session(&two, 1e-3, ResumeMode::Yes, 1);
        s2.tensorboard = Some(live.clone());
        run(m1, &rows, &s2).expect("second");
        run(tiny(), &rows, &session(&both, 1e-3, ResumeMode::No, 2)).expect("both");
        // Writing over the input folder is refused.
        let e = run(
            Model::load(&one, &burn::tensor::Device::flex().autodiff()).expect("load"),
            &rows,
            &session(&one, 1e-3, ResumeMode::No, 1),
        )
        .expect_err("in place");
        assert!(format!("{e:#}").contains("input model folder"), "{e:#}");
        let a = read_checkpoint(&two).expect("two");
        let b = read_checkpoint(&both).expect("both");
        let c = read_checkpoint(&tiny_dir()).expect("input");
        for (k, ta) in &a {
            assert!(
                ta.2 == b[k].2,
                "{k}: resumed run differs from the continuous one"
            );
        }
        assert!(
            a.iter().any(|(k, t)| t.2 != c[k].2),
            "the weights did not move"
        );
        let lines = std::fs::read_to_string(two.join(METRICS_FILE)).expect("metrics");
        let steps: Vec<u64> = lines
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).expect("json")["step"]
                    .as_u64()
                    .expect("step")
            })
            .collect();
        assert_eq!(steps, vec![1, 2]);
        // The event files: the checkpoint's holds the whole run, with the metrics lines' values
        // (the first call's events carried over byte for byte); the live folder one file per call.
        let carried = event_steps(&crate::train::checkpoint::events_path(&two, "update"));
        let want: Vec<(i64, Vec<(String, f32)>)> = lines
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json");
                let (s, sc) = crate::tensorboard::step_scalars(&v).expect("scalars");
                (s as i64, sc)
            })
            .collect();
        assert_eq!(carried, want);
        assert!(carried[0].1.iter().any(|(t, _)| t == "grad_norm"));
        let first = event_steps(&crate::train::checkpoint::events_path(&one, "update"));
        assert_eq!(first, want[..1].to_vec());
        let mut names: Vec<String> = std::fs::read_dir(&live)
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "events.out.tfevents.0000000001.rlcr-update",
                "events.out.tfevents.0000000002.rlcr-update"
            ]
        );
        assert_eq!(event_steps(&live.join(&names[1])), want[1..].to_vec());
        // Resume from a folder without state: an error with `yes`, a fresh start with `auto`.
        let m = tiny();
        let start = |dir: &Path, stage: &str, mode: ResumeMode| {
            start_optimizer(dir, stage, mode, AdamWConfig::default(), &m.transformer)
                .map(|(opt, resumed)| (resumed, opt.step))
        };
        let e = start(&tiny_dir(), "update", ResumeMode::Yes).expect_err("no state");
        assert!(format!("{e:#}").contains("no trainer state"), "{e:#}");
        // (folder, stage, mode) → (resumed, step): `auto` starts afresh without state and does
        // not carry another stage's state over; `yes` does.
        for (dir, stage, mode, want) in [
            (tiny_dir(), "update", ResumeMode::Auto, (false, 0)),
            (one.clone(), "sft", ResumeMode::Auto, (false, 0)),
            (one.clone(), "sft", ResumeMode::Yes, (true, 1)),
        ] {
            let got = start(&dir, stage, mode).expect("start");
            assert_eq!(got, want, "{} {stage} {mode:?}", dir.display());
        }
    }

    /// `rlcr logprobs` semantics on the written folder equal the in-memory trained model.
    #[test]
    fn written_folder_reproduces_the_in_memory_model() {
        let (d, mut m, rows) = setup(7);
        let cfg = session(&d.path().join("x"), 1e-2, ResumeMode::No, 3).train;
        let mut opt = AdamW::new(AdamWConfig::default());
        let (trained, _) =
            crate::train::trainer::train(m.transformer, &mut opt, &rows, &cfg, |_| Ok(()))
                .expect("train");
        m.transformer = trained;
        let out = d.path().join("new");
        let state = TrainerState {
            format: STATE_FORMAT.into(),
            global_step: opt.step,
            stage: "update".into(),
            version: crate::VERSION.into(),
            config: serde_json::json!({}),
            switches: serde_json::json!({}),
            inputs: vec![],
            summary: Summary::default(),
        };
        write_checkpoint(&m, &out, Some(&opt), &state, &[], &[]).expect("write");
        let pairs: Vec<(&[u32], &[u32])> = rows
            .iter()
            .map(|r| (r.context.as_slice(), r.response.as_slice()))
            .collect();
        let mem = host_logprobs(&m.transformer.valid(), &pairs, 4, 1.0, None).expect("mem");
        let back = Model::load(&out, &burn::tensor::Device::flex()).expect("reload");
        let disk = crate::model::logprobs(&back.transformer, &pairs, 4, false, None)
            .expect("logprobs")
            .logprobs;
        let orig = crate::model::logprobs(&tiny().transformer.valid(), &pairs, 4, false, None)
            .expect("logprobs")
            .logprobs;
        let mut moved = 0f32;
        for ((a, b), o) in mem.iter().zip(&disk).zip(&orig) {
            for ((x, y), z) in a.iter().zip(b).zip(o) {
                assert!((x - y).abs() <= 2e-6, "{x} vs {y}");
                moved = moved.max((x - z).abs());
            }
        }
        assert!(
            moved > 1e-2,
            "training did not change the log-probs ({moved})"
        );
    }
}
