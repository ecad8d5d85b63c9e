//! The write pass of `rlcr advantage`: streams the input row group by row group, builds each row's
//! `loss_mask`, `token_advantages` (and `returns`, `trajectory_score` for GAE) from what the keys
//! pass prepared, gathers the per-sample-type statistics, and writes the output with
//! [`splice`] (input columns copied as encoded chunks, only the new columns encoded).
use super::*;

/// Per-sample-type statistics gathered in pass 2.
#[derive(Default)]
struct TypeStats {
    rows: u64,
    reward: MaskedMoments,
    adv: MaskedMoments,
    tokens: u64,
    masked_tokens: u64,
    null_span: u64,
    empty_mask: u64,
    dropped_zero_std: u64,
}

impl TypeStats {
    fn json(&self) -> serde_json::Value {
        let sd = |m: &MaskedMoments| m.var_unbiased().sqrt();
        json!({
            "rows": self.rows,
            "reward_mean": self.reward.mean(),
            "reward_std": sd(&self.reward),
            "advantage_mean": self.adv.mean(),
            "advantage_std": sd(&self.adv),
            "tokens": self.tokens,
            "masked_tokens": self.masked_tokens,
            "null_span": self.null_span,
            "empty_mask": self.empty_mask,
            "dropped_zero_std": self.dropped_zero_std,
        })
    }
    /// Add the integer counters of `o` (the moments are pushed row by row by the writer thread, in
    /// row order, so that they do not depend on the batch size).
    fn merge_counts(&mut self, o: &TypeStats) {
        self.rows += o.rows;
        self.tokens += o.tokens;
        self.masked_tokens += o.masked_tokens;
        self.null_span += o.null_span;
        self.empty_mask += o.empty_mask;
        self.dropped_zero_std += o.dropped_zero_std;
    }
}

/// The names of the columns this stage writes (replaced when present in the input).
fn new_fields(plan: &Plan) -> Result<Vec<Field>> {
    let mut names = vec!["advantage", "token_advantages", "loss_mask"];
    if plan.estimator == Estimator::Gae {
        names.extend(["returns", "trajectory_score"]);
    }
    let schema = table::trajectory_schema();
    names
        .iter()
        .map(|n| {
            schema
                .field_with_name(n)
                .cloned()
                .with_context(|| format!("internal: `{n}` is not a trajectory column"))
        })
        .collect()
}

struct Built {
    /// The new columns, in the order of [`new_fields`].
    columns: Vec<ArrayRef>,
    rows: usize,
    stats: [TypeStats; 2],
    /// Per row: (is confidence, reward if any, scalar advantage).
    values: Vec<(bool, Option<f64>, f64)>,
}

/// Messages from the decoding thread to the encoding thread.
enum Msg {
    Batch(usize, Box<Built>),
    EndRowGroup(usize),
}

pub(super) fn pass2(plan: &Plan, prep: Prepared) -> Result<()> {
    let parts = splice::open_parts(&plan.input)?;
    let fields = new_fields(plan)?;
    let layout = splice::Layout::new(&parts[0], &fields, &[], splice::Placement::Append, true)?;
    let props = table::io::writer_properties(table::io::Encoding::TokenLists, None)?;
    let (mut splice, encoders) = splice::create(layout, props, &plan.out)?;
    let mut progress = crate::progress::Progress::new("advantage", prep.rows as u64, "rows");
    let config = json!({
        "estimator": plan.estimator,
        "plan": plan,
        "argv": plan.argv,
    });
    let mut stats = [TypeStats::default(), TypeStats::default()];
    // (part, row group) in output order.
    let jobs: Vec<(usize, usize)> = parts
        .iter()
        .enumerate()
        .flat_map(|(p, part)| (0..part.row_groups()).map(move |rg| (p, rg)))
        .collect();
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Msg>>(2);
    std::thread::scope(|s| -> Result<()> {
        let prep = &prep;
        let parts = &parts;
        let jobs = &jobs;
        s.spawn(move || {
            // The rules of single rows on the token columns (pass 1 checked the keys).
            let display = plan.input.display().to_string();
            let validator = Validator::new(&display, &TRAJECTORY);
            let mut invalid = None;
            let mut base = 0usize;
            for (index, &(p, rg)) in jobs.iter().enumerate() {
                let part = &parts[p];
                let r = (|| -> Result<()> {
                    // A file handle of this thread's own: a clone would share the file offset
                    // with the writer thread, which reads the same file to copy chunks.
                    let f = File::open(&part.path).context("reopening the input")?;
                    let descr = part.meta.metadata().file_metadata().schema_descr();
                    let mask =
                        ProjectionMask::roots(descr, pass2_projection(plan, part.meta.schema()));
                    let reader =
                        ParquetRecordBatchReaderBuilder::new_with_metadata(f, part.meta.clone())
                            .with_projection(mask)
                            .with_row_groups(vec![rg])
                            .with_batch_size(plan.batch_size)
                            .build()?;
                    let mut rows = 0;
                    for batch in reader {
                        let batch = batch.with_context(|| {
                            format!("row group {rg}: corrupt or truncated Parquet data")
                        })?;
                        // the types a `Reader` yields (pass 1 read the same table through one)
                        let batch = table::io::as_read(&batch, &TRAJECTORY, &display, base)?;
                        let n = batch.num_rows();
                        if let Err(e) = validator.check_rows(&batch, base) {
                            invalid = Some(e);
                            return Ok(());
                        }
                        let built = build_batch(plan, prep, &batch, base)?;
                        base += n;
                        rows += n;
                        if tx.send(Ok(Msg::Batch(index, Box::new(built)))).is_err() {
                            return Ok(());
                        }
                    }
                    if rows != part.rg_rows(rg) {
                        bail!(
                            "row group {rg} read {rows} rows, its metadata says {}",
                            part.rg_rows(rg)
                        );
                    }
                    let _ = tx.send(Ok(Msg::EndRowGroup(index)));
                    Ok(())
                })()
                .with_context(|| format!("{}", part.path.display()));
                let r = match invalid.take() {
                    Some(e) => Err(e),
                    None => r,
                };
                if let Err(e) = r {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        });
        let mut writers: Option<Vec<parquet::arrow::arrow_writer::ArrowColumnWriter>> = None;
        for msg in rx {
            match msg? {
                Msg::Batch(index, built) => {
                    if writers.is_none() {
                        writers = Some(encoders.new_column_writers(index)?);
                    }
                    let ws = writers
                        .as_mut()
                        .ok_or_else(|| anyhow!("internal: no column writers"))?;
                    if ws.len() != built.columns.len() {
                        bail!(
                            "internal: {} column writers for {} new columns",
                            ws.len(),
                            built.columns.len()
                        );
                    }
                    // Every new column is a single leaf; encode them in parallel (each writer still
                    // sees its batches in order, so the bytes do not depend on the thread count).
                    use rayon::prelude::*;
                    ws.par_iter_mut()
                        .zip(built.columns.par_iter())
                        .zip(fields.par_iter())
                        .map(|((w, col), field)| -> Result<()> {
                            for leaf in parquet::arrow::arrow_writer::compute_leaves(field, col)? {
                                w.write(&leaf)
                                    .with_context(|| format!("encoding `{}`", field.name()))?;
                            }
                            Ok(())
                        })
                        .collect::<Result<Vec<()>>>()?;
                    progress.inc(built.rows as u64);
                    for (acc, b) in stats.iter_mut().zip(&built.stats) {
                        acc.merge_counts(b);
                    }
                    for &(conf, r, a) in &built.values {
                        let t = &mut stats[conf as usize];
                        if let Some(r) = r {
                            t.reward.push(r);
                        }
                        t.adv.push(a);
                    }
                }
                Msg::EndRowGroup(index) => {
                    let ws = match writers.take() {
                        Some(ws) => ws,
                        None => encoders.new_column_writers(index)?,
                    };
                    let chunks = ws
                        .into_iter()
                        .map(|w| w.close())
                        .collect::<parquet::errors::Result<Vec<_>>>()
                        .context("encoding the new columns")?;
                    let (p, rg) = jobs[index];
                    splice.write_row_group(&parts[p], rg, chunks)?;
                }
            }
        }
        Ok(())
    })?;
    progress.finish();

    let statistics = json!({
        "rows": prep.rows,
        "answer": stats[0].json(),
        "confidence": stats[1].json(),
        "groups": prep.groups,
        "kl": prep.kl,
        "whitening": prep.whiten.map(|(m, v, n)| json!({"mean": m, "var": v, "tokens": n})),
    });
    print_stats(&statistics);
    let mut meta = Meta::new(&TRAJECTORY, "advantage", config, &[plan.input.as_path()]);
    meta.extra
        .insert("statistics".into(), statistics.to_string());
    splice.finish(meta.key_values())
}

/// Columns pass 2 decodes (everything else is copied without decoding): what the masks and
/// token advantages need, and the per-token lists the validator checks against `response_ids`.
fn pass2_projection(plan: &Plan, schema: &Schema) -> Vec<usize> {
    let mut names = vec!["sample_type", "reward"];
    names.extend(TOKEN_COLUMNS);
    if plan.estimator == Estimator::Gae {
        names.push("reward_components");
    }
    names
        .iter()
        .filter_map(|n| schema.index_of(n).ok())
        .collect()
}

fn print_stats(s: &serde_json::Value) {
    for t in ["answer", "confidence"] {
        let v = &s[t];
        if v["rows"].as_u64().unwrap_or(0) == 0 {
            continue;
        }
        crate::info!(
            "{t}: {} rows, reward {:.4} ± {:.4}, advantage {:.4} ± {:.4}, {} of {} tokens in the loss mask",
            v["rows"],
            v["reward_mean"].as_f64().unwrap_or(f64::NAN),
            v["reward_std"].as_f64().unwrap_or(f64::NAN),
            v["advantage_mean"].as_f64().unwrap_or(f64::NAN),
            v["advantage_std"].as_f64().unwrap_or(f64::NAN),
            v["masked_tokens"],
            v["tokens"],
        );
    }
    if let Some(g) = s["groups"].as_object() {
        for (k, v) in g {
            if v.is_null() {
                continue;
            }
            crate::info!(
                "{k} groups: {} ({} singletons), zero-std fraction {:.3}",
                v["groups"],
                v["singletons"],
                v["zero_std_fraction"].as_f64().unwrap_or(0.0)
            );
        }
    }
    if !s["kl"].is_null() {
        crate::info!(
            "KL in reward: coef {} , mean KL {:.6}, next coef {}",
            s["kl"]["coef"],
            s["kl"]["current_kl"].as_f64().unwrap_or(f64::NAN),
            s["kl"]["next_coef"]
        );
    }
}

fn build_batch(plan: &Plan, prep: &Prepared, batch: &RecordBatch, base: usize) -> Result<Built> {
    let n = batch.num_rows();
    let st = table::cols::str_col(batch, &plan.input.display().to_string(), "sample_type")?;
    let rew = match batch.column_by_name("reward") {
        Some(_) => Some(cols::floats(batch, "reward")?),
        None => None,
    };
    let tok = TokCols::read(batch, plan)?;
    let comp = if plan.estimator == Estimator::Gae {
        cols::components(batch, "reward_components")?
    } else {
        None
    };
    let gae = plan.estimator == Estimator::Gae;
    let mt = plan.estimator == Estimator::GrpoMultiturn;

    let total: usize = (0..n).map(|i| tok.lens.len_of(i)).sum();
    let mut offsets: Vec<i32> = Vec::with_capacity(n + 1);
    offsets.push(0);
    let mut tadv: Vec<f32> = Vec::with_capacity(total);
    let mut lmask: Vec<bool> = Vec::with_capacity(total);
    let mut rets: Vec<f32> = if gae {
        Vec::with_capacity(total)
    } else {
        Vec::new()
    };
    let mut scalar: Vec<f32> = Vec::with_capacity(n);
    let mut traj: Vec<f32> = Vec::new();
    let mut stats = [TypeStats::default(), TypeStats::default()];
    let mut values: Vec<(bool, Option<f64>, f64)> = Vec::with_capacity(n);

    let mut m: Vec<bool> = Vec::new();
    let mut klbuf: Vec<f64> = Vec::new();
    let mut comps: Vec<Component> = Vec::new();
    let mut row_turns: Vec<(i32, f64)> = Vec::new();
    let mut tokr: Vec<f64> = Vec::new();
    let mut gadv: Vec<f64> = Vec::new();
    let mut gret: Vec<f64> = Vec::new();
    let mut tbuf: Vec<f32> = Vec::new();
    let mut synth_turns: Vec<i32> = Vec::new();

    for i in 0..n {
        let row = base + i;
        (|| -> Result<()> {
            let kind = kind_of(&st, i)?;
            let ts = &mut stats[(kind == SampleType::Confidence) as usize];
            let null_span = tok.mask(i, kind, plan.on_missing_span, &mut m)?;
            let len = m.len();
            ts.rows += 1;
            ts.tokens += len as u64;
            ts.null_span += null_span as u64;
            let reward = match &rew {
                Some(r) if !r.is_null(i) => Some(r.value(i)),
                _ => None,
            };
            let a: f64;
            if gae {
                let score = reward.ok_or_else(|| anyhow!("column `reward`: null"))?;
                if let Some(kl) = &plan.kl {
                    tok.kl(i, kl, &m, &mut klbuf)?;
                }
                gae_raw(plan, &tok, comp.as_ref(), i, score, &m, &klbuf, &mut comps, &mut row_turns, &mut tokr, &mut gadv, &mut gret)?;
                let (mean, var, _) = prep.whiten.ok_or_else(|| anyhow!("internal: no whitening moments"))?;
                let mut first = None;
                let mut score_sum = 0.0;
                for t in 0..len {
                    if m[t] {
                        let w = gae::whiten_value(gadv[t], mean, var);
                        first.get_or_insert(w);
                        tadv.push(w as f32);
                        score_sum += gret[t];
                    } else {
                        tadv.push(0.0);
                    }
                    rets.push(gret[t] as f32);
                }
                a = first.unwrap_or(0.0);
                traj.push(score_sum as f32);
            } else {
                if plan.drop_zero_std && prep.zero_std[row] {
                    if m.iter().any(|&x| x) {
                        ts.dropped_zero_std += 1;
                    }
                    m.fill(false);
                }
                a = prep.adv[row] as f64;
                if mt {
                    tbuf.clear();
                    tbuf.resize(len, 0.0);
                    let (s, e) = (prep.turn_start[row] as usize, prep.turn_start[row + 1] as usize);
                    let turns = &prep.turns[s..e];
                    let ids: &[i32] = match opt_row(&tok.turns, i, "token_turn_ids")? {
                        Some(ids) => ids,
                        None => {
                            // No turn ids: the whole response is one turn, the row's only rewarded
                            // turn (or turn 0 when it has only global rewards).
                            let k = match turns {
                                [] => 0,
                                [(k, _)] => *k,
                                _ => bail!(
                                    "the row has rewards for {} turns but the table has no `token_turn_ids` to place them",
                                    turns.len()
                                ),
                            };
                            synth_turns.clear();
                            synth_turns.resize(len, k);
                            &synth_turns
                        }
                    };
                    adv::multiturn_token_advantages(ids, &m, turns, prep.global_adv[row], &plan.multiturn, &mut tbuf);
                    tadv.extend_from_slice(&tbuf);
                } else {
                    // adv::fill_token_advantages, written straight into the batch's buffer.
                    let af = a as f32;
                    tadv.extend(m.iter().map(|&b| if b { af } else { 0.0 }));
                }
            }
            let masked = m.iter().filter(|&&x| x).count();
            ts.masked_tokens += masked as u64;
            ts.empty_mask += (masked == 0) as u64;
            values.push((kind == SampleType::Confidence, reward, a));
            scalar.push(a as f32);
            lmask.extend_from_slice(&m);
            offsets.push(lmask.len() as i32);
            Ok(())
        })()
        .with_context(|| format!("row {row}"))?;
    }

    let offs = OffsetBuffer::new(ScalarBuffer::from(offsets));
    let list_f = |v: Vec<f32>| -> ArrayRef {
        Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            offs.clone(),
            Arc::new(Float32Array::from(v)),
            None,
        ))
    };
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Float32Array::from(scalar)),
        list_f(tadv),
        Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Boolean, true)),
            offs.clone(),
            Arc::new(BooleanArray::new(BooleanBuffer::from(lmask), None)),
            None,
        )),
    ];
    if gae {
        columns.push(list_f(rets));
        columns.push(Arc::new(Float32Array::from(traj)));
    }
    Ok(Built {
        columns,
        rows: n,
        stats,
        values,
    })
}
