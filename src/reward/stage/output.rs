//! The scoring stage's output: the seven score columns built row by row ([`ScoreBuilders`]) and
//! encoded on the scoring thread ([`encode_row_group`]), so that the writer only splices them
//! between the input's copied column chunks.
use std::borrow::Cow;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{
    Array, ArrayRef, BooleanArray, Float32Array, Int32Array, ListArray, RecordBatch, StringBuilder,
    StructArray,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field};
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnChunk, ArrowColumnWriter};
use rayon::prelude::*;

use super::SCORE_COLUMNS;
use crate::reward::rows;
use crate::table::splice::{self, Source};
use crate::table::TRAJECTORY;

/// One scored row, on its way to the column builders.
pub(super) struct Scored<'a> {
    pub(super) answer: Option<Cow<'a, str>>,
    pub(super) components: rows::Components,
    pub(super) acc: f32,
    pub(super) reward: f32,
    pub(super) confidence: Option<f32>,
    pub(super) conf_reward: Option<f32>,
    pub(super) format_ok: bool,
}

pub(super) fn score_fields() -> Result<Vec<Field>> {
    SCORE_COLUMNS
        .iter()
        .map(|n| {
            TRAJECTORY
                .column(n)
                .map(|c| c.field())
                .ok_or_else(|| anyhow!("internal: {n} missing from the trajectory schema"))
        })
        .collect()
}

/// Builders of the seven score columns of one row group, filled row by row.
pub(super) struct ScoreBuilders {
    answer: StringBuilder,
    format_ok: Vec<bool>,
    acc: Vec<f32>,
    conf: Vec<f32>,
    conf_valid: Vec<bool>,
    conf_reward: Vec<f32>,
    conf_reward_valid: Vec<bool>,
    reward: Vec<f32>,
    names: StringBuilder,
    turns: Vec<i32>,
    values: Vec<f32>,
    weights: Vec<f32>,
    offsets: Vec<i32>,
}

/// A float column from its values and validity (no null buffer when every value is valid, as
/// arrow's builders make it).
fn f32_array(values: Vec<f32>, valid: Vec<bool>) -> Float32Array {
    let nulls = valid
        .iter()
        .any(|v| !v)
        .then(|| arrow::buffer::NullBuffer::from(valid));
    Float32Array::new(values.into(), nulls)
}

impl ScoreBuilders {
    /// Plain vectors (pushes inline; arrow's builders' appends are calls, a few per score
    /// column per row), made into arrays once per row group.
    pub(super) fn new(rows: usize) -> ScoreBuilders {
        let comps = rows * 3;
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        ScoreBuilders {
            answer: StringBuilder::with_capacity(rows, rows * 16),
            format_ok: Vec::with_capacity(rows),
            acc: Vec::with_capacity(rows),
            conf: Vec::with_capacity(rows),
            conf_valid: Vec::with_capacity(rows),
            conf_reward: Vec::with_capacity(rows),
            conf_reward_valid: Vec::with_capacity(rows),
            reward: Vec::with_capacity(rows),
            names: StringBuilder::with_capacity(comps, comps * 10),
            turns: Vec::with_capacity(comps),
            values: Vec::with_capacity(comps),
            weights: Vec::with_capacity(comps),
            offsets,
        }
    }

    pub(super) fn push(&mut self, r: &Scored<'_>) {
        self.answer.append_option(r.answer.as_deref());
        self.format_ok.push(r.format_ok);
        self.acc.push(r.acc);
        self.conf.push(r.confidence.unwrap_or(0.0));
        self.conf_valid.push(r.confidence.is_some());
        self.conf_reward.push(r.conf_reward.unwrap_or(0.0));
        self.conf_reward_valid.push(r.conf_reward.is_some());
        self.reward.push(r.reward);
        for c in &r.components {
            self.names.append_value(&c.name);
            self.turns.push(c.turn);
            self.values.push(c.value);
            self.weights.push(c.weight);
        }
        let last = self.offsets.last().copied().unwrap_or(0);
        self.offsets.push(last + r.components.len() as i32);
    }

    /// The arrays, in [`SCORE_COLUMNS`] order, typed as `fields`.
    pub(super) fn finish(mut self, fields: &[Field]) -> Result<Vec<ArrayRef>> {
        let DataType::List(item) = fields[6].data_type() else {
            bail!("internal: reward_components is not a list");
        };
        let DataType::Struct(sfields) = item.data_type() else {
            bail!("internal: reward_components items are not structs");
        };
        let st = StructArray::try_new(
            sfields.clone(),
            vec![
                Arc::new(self.names.finish()),
                Arc::new(Int32Array::from(std::mem::take(&mut self.turns))),
                Arc::new(Float32Array::from(std::mem::take(&mut self.values))),
                Arc::new(Float32Array::from(std::mem::take(&mut self.weights))),
            ],
            None,
        )?;
        let comps = ListArray::try_new(
            item.clone(),
            OffsetBuffer::new(std::mem::take(&mut self.offsets).into()),
            Arc::new(st),
            None,
        )?;
        Ok(vec![
            Arc::new(self.answer.finish()),
            Arc::new(BooleanArray::from(std::mem::take(&mut self.format_ok))) as ArrayRef,
            Arc::new(Float32Array::from(std::mem::take(&mut self.acc))),
            Arc::new(f32_array(
                std::mem::take(&mut self.conf),
                std::mem::take(&mut self.conf_valid),
            )),
            Arc::new(f32_array(
                std::mem::take(&mut self.conf_reward),
                std::mem::take(&mut self.conf_reward_valid),
            )),
            Arc::new(Float32Array::from(std::mem::take(&mut self.reward))),
            Arc::new(comps),
        ])
    }
}

/// Encode the columns of one output row group on the scoring side (in parallel, so the writer
/// thread only splices): the score columns' leaves in output order, or, for a row group a filter
/// thinned (`kept` holds its rows), every leaf.
pub(super) fn encode_row_group(
    enc: &splice::Encoders,
    fields: &[Field],
    index: usize,
    arrays: &[ArrayRef],
    kept: &[RecordBatch],
) -> Result<Vec<ArrowColumnChunk>> {
    let _t = crate::trace::span("score: encode columns");
    let lay = enc.layout();
    let filtered = !kept.is_empty();
    let mut writers: Vec<Option<ArrowColumnWriter>> = if filtered {
        enc.column_writers(index)?.into_iter().map(Some).collect()
    } else {
        // only the new columns' writers, in output order: give them their output leaf indices
        let mut w = enc.new_column_writers(index)?.into_iter();
        let mut all: Vec<Option<ArrowColumnWriter>> =
            (0..lay.descr.num_columns()).map(|_| None).collect();
        for (k, src) in lay.sources.iter().enumerate() {
            if let Source::New(_) = src {
                for &leaf in &lay.output_leaves[k] {
                    all[leaf] = w.next();
                }
            }
        }
        all
    };
    // (field, array, writers of its leaves) for every column to encode
    let mut jobs: Vec<(Field, ArrayRef, Vec<ArrowColumnWriter>)> = Vec::new();
    for (k, src) in lay.sources.iter().enumerate() {
        let (field, array) = match src {
            Source::New(j) => (fields[*j].clone(), arrays[*j].clone()),
            Source::Copy(_) if !filtered => continue,
            Source::Copy(_) => {
                let f = lay.arrow.field(k).clone();
                let parts: Vec<&dyn Array> = kept
                    .iter()
                    .map(|b| {
                        b.column_by_name(f.name())
                            .map(|c| c.as_ref())
                            .context("internal: a kept column was not read")
                    })
                    .collect::<Result<_>>()?;
                let a = arrow::compute::concat(&parts)?;
                (f, a)
            }
        };
        let ws = lay.output_leaves[k]
            .iter()
            .map(|&leaf| {
                writers
                    .get_mut(leaf)
                    .and_then(Option::take)
                    .context("internal: no writer for an output leaf")
            })
            .collect::<Result<_>>()?;
        jobs.push((field, array, ws));
    }
    let encoded: Vec<Vec<ArrowColumnChunk>> = jobs
        .into_par_iter()
        .map(|(field, array, ws)| -> Result<Vec<ArrowColumnChunk>> {
            let leaves = compute_leaves(&field, &array)?;
            if leaves.len() != ws.len() {
                bail!(
                    "internal: column `{}` has {} leaves, schema {}",
                    field.name(),
                    leaves.len(),
                    ws.len()
                );
            }
            leaves
                .iter()
                .zip(ws)
                .map(|(leaf, mut w)| {
                    w.write(leaf)?;
                    Ok(w.close()?)
                })
                .collect()
        })
        .collect::<Result<_>>()?;
    Ok(encoded.into_iter().flatten().collect())
}

/// What the scoring thread sends the writer for one input row group.
pub(super) enum RowGroupOut {
    /// The row group whole: copy its chunks, splice in these score chunks.
    Spliced(usize, usize, Vec<ArrowColumnChunk>),
    /// A thinned row group: every column encoded.
    Encoded(usize, usize, Vec<ArrowColumnChunk>),
    /// No row of it is kept.
    Skipped(usize, usize),
}
