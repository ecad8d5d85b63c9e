//! `inspect`: describe a Parquet table.
//!
//! Streams the file once, so it works on tables larger than memory: per column the null count and a
//! summary (numbers: min/mean/max; strings: distinct values up to a cap; lists: lengths), and for
//! trajectory tables the rows, mean reward and mean response length by `sample_type`.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::Result;
use arrow::array::{
    Array, BooleanArray, Float32Array, Float64Array, Int32Array, Int64Array, ListArray,
};
use arrow::datatypes::DataType;

use super::{cols, Reader};

#[derive(Default)]
struct Summary {
    nulls: usize,
    min: f64,
    max: f64,
    sum: f64,
    n: usize,
    distinct: BTreeMap<String, usize>,
    too_many: bool,
}

impl Summary {
    fn num(&mut self, v: f64) {
        if self.n == 0 {
            self.min = v;
            self.max = v;
        }
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += v;
        self.n += 1;
    }
    fn text(&mut self, s: &str) {
        if self.too_many {
            return;
        }
        *self.distinct.entry(s.to_string()).or_default() += 1;
        if self.distinct.len() > 20 {
            self.too_many = true;
            self.distinct.clear();
        }
    }
}

#[derive(Default)]
struct TypeStats {
    rows: usize,
    reward_sum: f64,
    reward_n: usize,
    len_sum: usize,
}

/// Describe the table at `path` (a file or a folder of part files) on `out`, streaming it once.
pub fn describe(path: &Path, out: &mut dyn Write) -> Result<()> {
    // as the file stores them: the types shown are the file's
    let reader = Reader::open(path)?.as_written();
    let name = path.display().to_string();
    let schema = reader.schema();
    let meta = reader.metadata().clone();
    let total = reader.num_rows();
    let mut sums: Vec<Summary> = schema.fields().iter().map(|_| Summary::default()).collect();
    let mut by_type: BTreeMap<String, TypeStats> = BTreeMap::new();
    for b in reader {
        let b = b?;
        for (k, c) in b.columns().iter().enumerate() {
            let s = &mut sums[k];
            s.nulls += c.null_count();
            let any = c.as_any();
            if let Some(x) = any.downcast_ref::<Float32Array>() {
                x.iter().flatten().for_each(|v| s.num(v as f64));
            } else if let Some(x) = any.downcast_ref::<Float64Array>() {
                x.iter().flatten().for_each(|v| s.num(v));
            } else if let Some(x) = any.downcast_ref::<Int32Array>() {
                x.iter().flatten().for_each(|v| s.num(v as f64));
            } else if let Some(x) = any.downcast_ref::<Int64Array>() {
                x.iter().flatten().for_each(|v| s.num(v as f64));
            } else if let Some(x) = any.downcast_ref::<BooleanArray>() {
                x.iter().flatten().for_each(|v| s.num(v as u8 as f64));
            } else if let Some(x) = cols::StrCol::of_array(c.as_ref()) {
                (0..x.len())
                    .filter_map(|i| x.get(i))
                    .for_each(|v| s.text(v));
            } else if let Some(x) = any.downcast_ref::<ListArray>() {
                let o = x.value_offsets();
                for i in 0..x.len() {
                    if x.is_valid(i) {
                        s.num((o[i + 1] - o[i]) as f64);
                    }
                }
            }
        }
        if let Ok(st) = cols::str_col(&b, &name, "sample_type") {
            let reward = cols::f32_col(&b, &name, "reward").ok();
            let resp = cols::list_col(&b, &name, "response_ids").ok();
            for i in 0..b.num_rows() {
                let t = by_type.entry(st.value(i).to_string()).or_default();
                t.rows += 1;
                if let Some(r) = reward {
                    if r.is_valid(i) {
                        t.reward_sum += r.value(i) as f64;
                        t.reward_n += 1;
                    }
                }
                if let Some(l) = resp {
                    t.len_sum += l.value_length(i) as usize;
                }
            }
        }
    }
    writeln!(out, "file: {name}")?;
    writeln!(out, "rows: {total}")?;
    writeln!(out, "metadata:")?;
    for (k, v) in &meta {
        if k == "ARROW:schema" {
            continue;
        }
        writeln!(out, "  {k}: {v}")?;
    }
    writeln!(out, "columns:")?;
    for (f, s) in schema.fields().iter().zip(&sums) {
        let ty = type_name(f.data_type());
        let mut line = format!("  {:<20} {:<28} nulls {}", f.name(), ty, s.nulls);
        if matches!(f.data_type(), DataType::List(_)) && s.n > 0 {
            line += &format!(
                "  len min {} mean {:.2} max {}",
                s.min,
                s.sum / s.n as f64,
                s.max
            );
        } else if s.n > 0 {
            line += &format!(
                "  min {} mean {:.6} max {}",
                s.min,
                s.sum / s.n as f64,
                s.max
            );
        } else if !s.distinct.is_empty() && s.distinct.len() <= 10 {
            let vals: Vec<String> = s
                .distinct
                .iter()
                .map(|(k, v)| format!("{}={v}", short(k)))
                .collect();
            line += &format!("  values {}", vals.join(", "));
        } else if s.too_many || !s.distinct.is_empty() {
            line += "  many distinct values";
        }
        writeln!(out, "{line}")?;
    }
    if !by_type.is_empty() {
        writeln!(out, "by sample_type:")?;
        for (t, s) in &by_type {
            let mr = if s.reward_n > 0 {
                format!("{:.6}", s.reward_sum / s.reward_n as f64)
            } else {
                "-".into()
            };
            writeln!(
                out,
                "  {t:<12} rows {:<8} mean reward {mr:<10} mean response tokens {:.2}",
                s.rows,
                s.len_sum as f64 / s.rows.max(1) as f64
            )?;
        }
    }
    Ok(())
}

fn short(s: &str) -> String {
    let mut t: String = s.chars().take(24).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    format!("{t:?}")
}

fn type_name(dt: &DataType) -> String {
    match dt {
        DataType::Utf8 => "utf8".into(),
        DataType::Int32 => "int32".into(),
        DataType::Int64 => "int64".into(),
        DataType::Float32 => "float32".into(),
        DataType::Float64 => "float64".into(),
        DataType::Boolean => "bool".into(),
        DataType::List(f) => format!("list<{}>", type_name(f.data_type())),
        DataType::Struct(fs) => format!(
            "struct<{}>",
            fs.iter()
                .map(|f| format!("{}:{}", f.name(), type_name(f.data_type())))
                .collect::<Vec<_>>()
                .join(",")
        ),
        other => format!("{other}"),
    }
}
