//! Parity of rlcr's model with Hugging Face transformers on the fixture models.
//!
//! The reference figures in `fixtures/refs/` were computed with transformers 5.23 / torch 2.15 on
//! CPU (see the oracle README copied in `fixtures/refs/README.md`): per sequence, the log-prob
//! of every next token, the greedy next token, the entropy and log-sum-exp at every position and
//! the first 16 logits at the last position. f32 against f64 differs by at most 3e-6 on these
//! models, so an f32 implementation must agree within 1e-4.
use std::path::{Path, PathBuf};

use burn::tensor::Device;
use rlcr::model::{self, Message, Model, ResponseBatch, TokenBatch};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

pub(crate) struct RefSeq {
    pub(crate) ids: Vec<u32>,
    pub(crate) logprobs: Vec<f64>,
    greedy: Vec<u32>,
    entropy: Vec<f64>,
    logsumexp: Vec<f64>,
    last_logits_head: Vec<f64>,
    text: Option<String>,
    rendered: Option<String>,
}

pub(crate) fn load_refs(name: &str) -> Vec<RefSeq> {
    let path = fixtures().join("refs").join(name);
    let v: serde_json::Value = crate::support::json::read(&path);
    use crate::support::json::{f64s as nums, u32s as ints};
    v["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| RefSeq {
            ids: ints(&s["input_ids"]),
            logprobs: nums(&s["logprobs"]),
            greedy: ints(&s["greedy_next"]),
            entropy: nums(&s["entropy"]),
            logsumexp: nums(&s["logsumexp"]),
            last_logits_head: nums(&s["last_logits_head"]),
            text: s.get("text").and_then(|t| t.as_str()).map(str::to_string),
            rendered: s
                .get("rendered")
                .and_then(|t| t.as_str())
                .map(str::to_string),
        })
        .collect()
}

/// `log Σ exp x` of one logit row, in f64 (max-shifted).
fn log_sum_exp(row: &[f64]) -> f64 {
    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln()
}

fn cpu() -> Device {
    model::device_from_str("cpu").unwrap()
}

/// Compare every figure of every reference sequence; returns the largest log-prob difference.
pub(crate) fn check_refs(m: &Model, file: &str) -> f64 {
    let refs = load_refs(file);
    let vocab = m.config.vocab_size;
    let mut worst = 0f64;
    for (k, r) in refs.iter().enumerate() {
        let n = r.ids.len();
        let logits = m
            .transformer
            .forward(&TokenBatch::left_padded(std::slice::from_ref(&r.ids)))
            .unwrap();
        let logits = model::read_f32(logits).unwrap();
        assert_eq!(logits.len(), n * vocab);
        for t in 0..n {
            let row: Vec<f64> = logits[t * vocab..(t + 1) * vocab]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let lse = log_sum_exp(&row);
            let ent: f64 = -row.iter().map(|x| (x - lse).exp() * (x - lse)).sum::<f64>();
            let d_lse = (lse - r.logsumexp[t]).abs();
            let d_ent = (ent - r.entropy[t]).abs();
            assert!(
                d_lse < 1e-4,
                "{file} seq {k} pos {t}: logsumexp off by {d_lse}"
            );
            assert!(
                d_ent < 1e-4,
                "{file} seq {k} pos {t}: entropy off by {d_ent}"
            );
            let argmax = (0..vocab)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                .unwrap() as u32;
            if argmax != r.greedy[t] {
                // Only acceptable for a near tie (untrained models are nearly uniform).
                let gap = row[argmax as usize] - row[r.greedy[t] as usize];
                assert!(
                    gap < 1e-5,
                    "{file} seq {k} pos {t}: greedy {argmax} vs {} (gap {gap})",
                    r.greedy[t]
                );
            }
            if t + 1 < n {
                let lp = row[r.ids[t + 1] as usize] - lse;
                let d = (lp - r.logprobs[t]).abs();
                worst = worst.max(d);
                assert!(d < 1e-4, "{file} seq {k} pos {t}: logprob off by {d}");
            }
        }
        for (i, want) in r.last_logits_head.iter().enumerate() {
            let got = logits[(n - 1) * vocab + i] as f64;
            assert!(
                (got - want).abs() < 1e-4,
                "{file} seq {k}: logit {i} {got} vs {want}"
            );
        }
    }
    worst
}

#[test]
fn tiny_models_match_transformers() {
    for name in ["tiny-qwen2", "tiny-llama"] {
        let m = Model::load(&fixtures().join(name), &cpu()).unwrap();
        let mut worst = 0f64;
        for kind in ["seqs.f64", "rand.f64", "chat.f32"] {
            worst = worst.max(check_refs(&m, &format!("{name}.{kind}.json")));
        }
        eprintln!("{name}: max |logprob - transformers| = {worst:.2e}");
    }
}

#[test]
fn chat_template_and_ids_match_transformers() {
    for name in ["tiny-qwen2", "tiny-llama"] {
        let m = Model::load(&fixtures().join(name), &cpu()).unwrap();
        for r in load_refs(&format!("{name}.chat.f32.json")) {
            let text = r.text.clone().unwrap();
            let (rendered, ids) = m.encode_chat(&[Message::new("user", &text)], true).unwrap();
            assert_eq!(Some(rendered), r.rendered, "{name}: rendering of {text:?}");
            assert_eq!(ids, r.ids, "{name}: ids of {text:?}");
        }
    }
}

#[test]
fn library_logprobs_match_references_in_any_batching() {
    let m = Model::load(&fixtures().join("tiny-llama"), &cpu()).unwrap();
    let refs = load_refs("tiny-llama.rand.f64.json");
    // Split every sequence at a different point into context and response.
    let rows: Vec<(Vec<u32>, Vec<u32>)> = refs
        .iter()
        .enumerate()
        .map(|(k, r)| {
            let cut = 5 + 13 * k;
            (r.ids[..cut].to_vec(), r.ids[cut..].to_vec())
        })
        .collect();
    let borrowed: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|(c, r)| (c.as_slice(), r.as_slice()))
        .collect();
    for batch in [1, 3, 8] {
        let out = model::logprobs(&m.transformer, &borrowed, batch, true, None).unwrap();
        let ent = out.entropy.unwrap();
        for (k, r) in refs.iter().enumerate() {
            let cut = 5 + 13 * k;
            assert_eq!(out.logprobs[k].len(), r.ids.len() - cut);
            for (i, &lp) in out.logprobs[k].iter().enumerate() {
                let want = r.logprobs[cut - 1 + i];
                assert!(
                    (lp as f64 - want).abs() < 1e-4,
                    "batch {batch} row {k} tok {i}"
                );
                let want_e = r.entropy[cut - 1 + i];
                assert!((ent[k][i] as f64 - want_e).abs() < 1e-4);
            }
        }
    }
}

#[test]
fn response_logprobs_layout_is_left_aligned_with_mask() {
    let rows = vec![
        (vec![1u32, 2, 3], vec![4u32]),
        (vec![5u32], vec![6u32, 7, 8]),
    ];
    let b = ResponseBatch::new(&rows).unwrap();
    assert_eq!(b.max_resp, 3);
    assert_eq!(b.mask(), vec![true, false, false, true, true, true]);
    assert_eq!(b.tokens.len, 4);
    assert_eq!(b.tokens.ids, vec![1, 2, 3, 4, 5, 6, 7, 8]);
    let empty_ctx = vec![(Vec::<u32>::new(), vec![1u32])];
    assert!(ResponseBatch::new(&empty_ctx).is_err());
}

#[test]
fn save_load_round_trip_is_bit_identical_f32_and_bf16() {
    let dev = cpu();
    let tmp = tempfile::tempdir().unwrap();
    for name in ["tiny-qwen2", "tiny-llama"] {
        let src = fixtures().join(name);
        let m = Model::load(&src, &dev).unwrap();
        // f32: save, reload, compare every tensor bit for bit (and the file tensors).
        let out = tmp.path().join(format!("{name}-f32"));
        m.save(&out).unwrap();
        let a = model::weights::read_checkpoint(&src).unwrap();
        let b = model::weights::read_checkpoint(&out).unwrap();
        assert_same(&a, &b);
        for f in [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
        ] {
            assert_eq!(
                std::fs::read(src.join(f)).unwrap(),
                std::fs::read(out.join(f)).unwrap(),
                "{f} copied unchanged"
            );
        }
        // bf16: write a bf16 copy of the fixture, load → save → load.
        let bf = tmp.path().join(format!("{name}-bf16-src"));
        let mut t16 = a.clone();
        for t in t16.values_mut() {
            t.dtype = safetensors::Dtype::BF16;
        }
        std::fs::create_dir_all(&bf).unwrap();
        let list: Vec<_> = t16.clone().into_iter().collect();
        model::weights::write_safetensors(&bf, &list, usize::MAX).unwrap();
        model::weights::copy_side_files(&src, &bf).unwrap();
        let m16 = Model::load(&bf, &dev).unwrap();
        let out16 = tmp.path().join(format!("{name}-bf16-out"));
        m16.save(&out16).unwrap();
        let c = model::weights::read_checkpoint(&bf).unwrap();
        let d = model::weights::read_checkpoint(&out16).unwrap();
        assert!(d.values().all(|t| t.dtype == safetensors::Dtype::BF16));
        assert_same(&c, &d);
        // Saving over an existing folder replaces it atomically.
        m16.save(&out16).unwrap();
        assert_same(&c, &model::weights::read_checkpoint(&out16).unwrap());
        assert!(
            m16.save(&bf).is_err(),
            "refuses to overwrite its own source"
        );
    }
}

fn assert_same(
    a: &std::collections::BTreeMap<String, model::weights::HostTensor>,
    b: &std::collections::BTreeMap<String, model::weights::HostTensor>,
) {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (n, t) in a {
        let u = &b[n];
        assert_eq!(t.dtype, u.dtype, "{n}");
        assert_eq!(t.shape, u.shape, "{n}");
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&t.data), bits(&u.data), "{n}");
    }
}

#[test]
fn broken_checkpoints_name_the_tensor() {
    let dev = cpu();
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("tiny-qwen2");
    let all = model::weights::read_checkpoint(&src).unwrap();
    let write =
        |dir: &Path, tensors: std::collections::BTreeMap<String, model::weights::HostTensor>| {
            std::fs::create_dir_all(dir).unwrap();
            let list: Vec<_> = tensors.into_iter().collect();
            model::weights::write_safetensors(dir, &list, usize::MAX).unwrap();
            model::weights::copy_side_files(&src, dir).unwrap();
        };
    // Missing.
    let mut t = all.clone();
    t.remove("model.layers.1.mlp.up_proj.weight");
    let d = tmp.path().join("missing");
    write(&d, t);
    let e = format!("{:#}", Model::load(&d, &dev).unwrap_err());
    assert!(
        e.contains("missing tensors: model.layers.1.mlp.up_proj.weight"),
        "{e}"
    );
    // Wrong shape.
    let mut t = all.clone();
    let x = t.get_mut("model.layers.0.self_attn.k_proj.bias").unwrap();
    x.shape = vec![16];
    x.data.truncate(16);
    let d = tmp.path().join("shape");
    write(&d, t);
    let e = format!("{:#}", Model::load(&d, &dev).unwrap_err());
    assert!(
        e.contains("model.layers.0.self_attn.k_proj.bias: shape [16], expected [32]"),
        "{e}"
    );
    // Unknown.
    let mut t = all.clone();
    let extra = t["model.norm.weight"].clone();
    t.insert("model.layers.0.self_attn.q_norm.weight".into(), extra);
    let d = tmp.path().join("unknown");
    write(&d, t);
    let e = format!("{:#}", Model::load(&d, &dev).unwrap_err());
    assert!(
        e.contains("unknown tensors: model.layers.0.self_attn.q_norm.weight"),
        "{e}"
    );
}

#[test]
fn out_of_vocab_ids_are_an_error_not_a_panic() {
    let m = Model::load(&fixtures().join("tiny-qwen2"), &cpu()).unwrap();
    let e = m
        .transformer
        .forward(&TokenBatch::left_padded(&[vec![1u32, 384]]))
        .unwrap_err();
    assert!(format!("{e}").contains("token id 384"), "{e}");
    let e = model::logprobs(
        &m.transformer,
        &[(&[1u32][..], &[999u32][..])],
        4,
        false,
        None,
    )
    .unwrap_err();
    assert!(format!("{e}").contains("999"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// `rlcr logprobs` (the real binary)
// ---------------------------------------------------------------------------------------------

mod cli {
    use std::path::Path;
    use std::sync::Arc;

    use arrow::array::{Array, ArrayRef, Float32Array, ListArray, RecordBatch, StringArray};
    use arrow::datatypes::{Field, Schema};
    use rlcr::table::{self, cols, Meta, Reader};

    use super::load_refs;
    use crate::{fixtures, Workdir};

    /// A table with an id column, the token columns and a float column to pass through.
    fn write_input(path: &Path, rows: &[(Vec<i32>, Vec<i32>)]) {
        let ids: ArrayRef = Arc::new(StringArray::from(
            (0..rows.len()).map(|i| format!("p{i}")).collect::<Vec<_>>(),
        ));
        let ctx = cols::build_list_i32(rows.iter().map(|r| r.0.clone()));
        let resp = cols::build_list_i32(rows.iter().map(|r| r.1.clone()));
        let extra: ArrayRef = Arc::new(Float32Array::from(
            (0..rows.len()).map(|i| i as f32 * 0.5).collect::<Vec<_>>(),
        ));
        let schema = Arc::new(Schema::new(vec![
            Field::new("prompt_id", ids.data_type().clone(), false),
            Field::new("context_ids", ctx.data_type().clone(), false),
            Field::new("response_ids", resp.data_type().clone(), false),
            Field::new("reward", extra.data_type().clone(), false),
        ]));
        let b = RecordBatch::try_new(schema.clone(), vec![ids, ctx, resp, extra]).unwrap();
        let meta = Meta::new(&table::TRAJECTORY, "test", serde_json::json!({}), &[]);
        table::write_table(path, schema, &[b], &meta).unwrap();
    }

    fn read_lists(path: &Path, col: &str) -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        for b in Reader::open(path).unwrap() {
            let b = b.unwrap();
            let l = b
                .column_by_name(col)
                .unwrap()
                .as_any()
                .downcast_ref::<ListArray>()
                .unwrap()
                .clone();
            for i in 0..l.len() {
                let v = l.value(i);
                let f = v.as_any().downcast_ref::<Float32Array>().unwrap();
                out.push(f.values().to_vec());
            }
        }
        out
    }

    #[test]
    fn logprobs_column_matches_transformers_and_passes_columns_through() {
        let wd = Workdir::new();
        let refs = load_refs("tiny-qwen2.rand.f64.json");
        let rows: Vec<(Vec<i32>, Vec<i32>)> = refs
            .iter()
            .enumerate()
            .map(|(k, r)| {
                let cut = 3 + 17 * k;
                let ids: Vec<i32> = r.ids.iter().map(|&x| x as i32).collect();
                (ids[..cut].to_vec(), ids[cut..].to_vec())
            })
            .chain([(vec![5, 6], vec![])])
            .collect();
        let input = wd.path("in.parquet");
        write_input(&input, &rows);
        let model = fixtures().join("tiny-qwen2");
        wd.run(&[
            "logprobs",
            "--model",
            model.to_str().unwrap(),
            "--input",
            "in.parquet",
            "-o",
            "out.parquet",
            "--column",
            "ref_logprobs",
            "--entropy-column",
            "entropy",
            "--batch-size",
            "3",
        ]);
        let out = wd.path("out.parquet");
        let lps = read_lists(&out, "ref_logprobs");
        let ents = read_lists(&out, "entropy");
        assert_eq!(lps.len(), rows.len());
        for (k, r) in refs.iter().enumerate() {
            let cut = 3 + 17 * k;
            assert_eq!(lps[k].len(), r.ids.len() - cut);
            for (i, lp) in lps[k].iter().enumerate() {
                assert!((*lp as f64 - r.logprobs[cut - 1 + i]).abs() < 1e-4);
                assert!((ents[k][i] as f64 - r.entropy[cut - 1 + i]).abs() < 1e-4);
            }
        }
        assert!(lps[rows.len() - 1].is_empty(), "empty response, empty list");
        // Pass-through columns and metadata.
        let reader = Reader::open(&out).unwrap();
        assert_eq!(
            reader.metadata().get("rlcr.stage").map(String::as_str),
            Some("logprobs")
        );
        let names: Vec<String> = reader
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        for c in ["prompt_id", "context_ids", "response_ids", "reward"] {
            assert!(
                names.iter().any(|n| n == c),
                "{c} passed through: {names:?}"
            );
        }
        let b = reader.read_all().unwrap().remove(0);
        let rew = cols::f32_col(&b, "out", "reward").unwrap();
        assert_eq!(rew.value(3), 1.5);
    }

    #[test]
    fn bad_tables_fail_with_row_and_column_and_write_nothing() {
        let wd = Workdir::new();
        let model = fixtures().join("tiny-llama");
        let m = model.to_str().unwrap();
        // A token id outside the 384-row vocabulary in row 1.
        write_input(
            &wd.path("bad.parquet"),
            &[(vec![1, 2], vec![3]), (vec![4], vec![5, 384])],
        );
        let e = wd.fail(
            &[
                "logprobs",
                "--model",
                m,
                "--input",
                "bad.parquet",
                "-o",
                "o.parquet",
            ],
            1,
        );
        assert!(
            e.contains("row 1") && e.contains("response_ids") && e.contains("384"),
            "{e}"
        );
        // Empty context before a response.
        write_input(&wd.path("empty.parquet"), &[(vec![], vec![3])]);
        let e = wd.fail(
            &[
                "logprobs",
                "--model",
                m,
                "--input",
                "empty.parquet",
                "-o",
                "o.parquet",
            ],
            1,
        );
        assert!(e.contains("row 0") && e.contains("context_ids"), "{e}");
        // Usage errors.
        let e = wd.fail(
            &[
                "logprobs",
                "--model",
                m,
                "--input",
                "bad.parquet",
                "-o",
                "o.parquet",
                "--batch-size",
                "0",
            ],
            2,
        );
        assert!(e.contains("--batch-size"), "{e}");
        // Output = input.
        wd.refuse(
            &[
                "logprobs",
                "--model",
                m,
                "--input",
                "bad.parquet",
                "-o",
                "bad.parquet",
            ],
            1,
            "never modifies an input",
            "o.parquet",
        );
        assert_eq!(wd.listing(), vec!["bad.parquet", "empty.parquet"]);
    }
}

/// Next-token log-probs of one unpadded sequence, log-softmax in f64 (as the references).
fn seq_logprobs(m: &Model, ids: &[u32]) -> Vec<f64> {
    let vocab = m.config.vocab_size;
    let logits = m
        .transformer
        .forward(&TokenBatch::left_padded(&[ids.to_vec()]))
        .unwrap();
    let logits = model::read_f32(logits).unwrap();
    (0..ids.len() - 1)
        .map(|t| {
            let row: Vec<f64> = logits[t * vocab..(t + 1) * vocab]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let lse = log_sum_exp(&row);
            row[ids[t + 1] as usize] - lse
        })
        .collect()
}

/// Every parameter's gradient of the summed next-token NLL of `ids` (autodiff model), flattened
/// in module order.
fn nll_gradient(m: &Model, ids: &[u32]) -> Vec<f32> {
    use burn::optim::GradientsParams;
    use burn::tensor::{activation::log_softmax, Int, Tensor, TensorData};
    let n = ids.len();
    let logits = m
        .transformer
        .forward(&TokenBatch::left_padded(&[ids.to_vec()]))
        .unwrap();
    let v = logits.dims()[2];
    let lp = log_softmax(logits.reshape([n, v]), 1).narrow(0, 0, n - 1);
    let next: Vec<i64> = ids[1..].iter().map(|&i| i as i64).collect();
    let next = Tensor::<2, Int>::from_data(TensorData::new(next, [n - 1, 1]), &lp.device());
    let nll = lp.gather(1, next).sum().neg();
    let grads = GradientsParams::from_grads(nll.backward(), &m.transformer);
    rlcr::train::trainer::grads_to_host(&m.transformer, &grads)
        .into_iter()
        .flat_map(|(_, g)| g)
        .collect()
}

/// `--precision bf16` against torch's bf16 autocast on the fixture models
/// (`fixtures/refs/MODEL.rand.bf16.json`, written by `scripts/refs_bf16.py`), both measured
/// against the exact (float64) model: rlcr's bf16 log-probs are no further from exact than
/// torch's (rlcr keeps the products' outputs in f32; torch rounds them to bf16), they are within
/// twice torch's error of torch's own, and the mode is really on (far more than f32's 1e-4). The
/// gradient of the summed NLL moves from f32's by no more than 1.5 × what autocast moves
/// torch's gradient from float64's (relative L2 over every parameter), and moves at all.
#[test]
fn bf16_mode_is_as_close_to_exact_as_torch_autocast() {
    use rlcr::model::sgemm::{autocast, Precision};
    for name in ["tiny-qwen2", "tiny-llama"] {
        let exact = load_refs(&format!("{name}.rand.f64.json"));
        let path = fixtures()
            .join("refs")
            .join(format!("{name}.rand.bf16.json"));
        let torch: serde_json::Value = crate::support::json::read(&path);
        let torch = torch["sequences"].as_array().unwrap();
        assert_eq!(torch.len(), exact.len());
        let plain = Model::load(&fixtures().join(name), &cpu()).unwrap();
        let train = Model::load(&fixtures().join(name), &cpu().autodiff()).unwrap();
        for (k, (ex, tb)) in exact.iter().zip(torch).enumerate() {
            let tb_lp = crate::support::json::f64s(&tb["logprobs"]);
            assert_eq!(tb["input_ids"].as_array().unwrap().len(), ex.ids.len());
            let worst = |a: &[f64], b: &[f64]| {
                assert_eq!(a.len(), b.len());
                a.iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f64, f64::max)
            };
            let lp32 = seq_logprobs(&plain, &ex.ids);
            let lp16 = {
                let _bf16 = autocast(Precision::Bf16);
                seq_logprobs(&plain, &ex.ids)
            };
            let (d32, ours, theirs) = (
                worst(&lp32, &ex.logprobs),
                worst(&lp16, &ex.logprobs),
                worst(&tb_lp, &ex.logprobs),
            );
            let cross = worst(&lp16, &tb_lp);
            eprintln!(
                "{name} seq {k}: max |logprob - exact|: f32 {d32:.1e}, rlcr bf16 {ours:.2e}, \
                 torch autocast {theirs:.2e}; rlcr bf16 vs torch {cross:.2e}"
            );
            assert!(d32 < 1e-4, "{name} seq {k}: f32 off by {d32}");
            assert!(
                ours > 1e-3,
                "{name} seq {k}: bf16 mode moved nothing ({ours})"
            );
            assert!(ours <= theirs, "{name} seq {k}: {ours} vs torch {theirs}");
            assert!(cross <= 2.0 * theirs, "{name} seq {k}: {cross} from torch");

            let g32 = nll_gradient(&train, &ex.ids);
            let g16 = {
                let _bf16 = autocast(Precision::Bf16);
                nll_gradient(&train, &ex.ids)
            };
            assert_eq!(g32.len(), g16.len());
            let (mut diff, mut norm) = (0f64, 0f64);
            for (a, b) in g16.iter().zip(&g32) {
                diff += ((a - b) as f64).powi(2);
                norm += (*b as f64).powi(2);
            }
            let rel = (diff / norm).sqrt();
            let torch_rel = tb["grad_rel_diff"].as_f64().unwrap();
            eprintln!("{name} seq {k}: gradient moved {rel:.3e} (torch autocast: {torch_rel:.3e})");
            assert!(
                rel > 1e-4,
                "{name} seq {k}: bf16 gradient moved nothing ({rel})"
            );
            assert!(
                rel <= 1.5 * torch_rel,
                "{name} seq {k}: {rel} vs torch {torch_rel}"
            );
        }
    }
}

/// A bf16 checkpoint (`fixtures/MODEL-bf16/`, written by `scripts/refs_bf16_weights.py` from the
/// f32 fixture) on the CPU: sampling and log-probs hold its matrices in bf16 (no f32 copy), norm
/// gains and biases in f32; training holds every weight in f32 (the master weights).
/// - In f32 products the log-probs are the bits of the same checkpoint held in f32 (each
///   product widens the bf16 weights exactly), within 1e-4 of the bf16 weights run in float64;
///   the KV-cache decode steps (packed bf16 panels) give the f32-held model's bits too.
/// - `--precision bf16` (autocast) gives the bits of the f32-held model under autocast (what
///   `update --precision bf16` computes on its f32 master weights), no further from float64
///   than torch's autocast on the same checkpoint, within twice torch's error of torch's own,
///   and the mode is really on. torch's plain bf16 inference (`dtype=torch.bfloat16`) is
///   printed beside.
/// - The update's gradient under autocast (f32 master weights) moves from the f32 gradient by at
///   most 1.5 × what autocast moves torch's from float64's, and moves at all.
#[test]
fn bf16_checkpoint_holds_bf16_weights_and_matches_torch_autocast() {
    use burn::tensor::DType;
    use rlcr::model::sgemm::{autocast, Precision};
    use rlcr::model::weights;
    for name in ["tiny-qwen2", "tiny-llama"] {
        let dir = fixtures().join(format!("{name}-bf16"));
        let path = fixtures()
            .join("refs")
            .join(format!("{name}-bf16.rand.json"));
        let refs: serde_json::Value = crate::support::json::read(&path);
        let refs = refs["sequences"].as_array().unwrap();
        assert_eq!(refs.len(), 4);
        let held = Model::load(&dir, &cpu()).unwrap();
        let t = &held.transformer;
        let mut mats = vec![t.embed.val().dtype()];
        mats.extend(t.lm_head.as_ref().map(|w| w.val().dtype()));
        let mut vecs = vec![t.norm.val().dtype()];
        for l in &t.layers {
            mats.extend([
                l.attn.qkv.val().dtype(),
                l.attn.o.val().dtype(),
                l.mlp.gate_up.val().dtype(),
                l.mlp.down.val().dtype(),
            ]);
            vecs.extend([l.input_norm.val().dtype(), l.post_norm.val().dtype()]);
            vecs.extend(l.attn.qkv_bias.as_ref().map(|b| b.val().dtype()));
        }
        assert!(mats.iter().all(|&d| d == DType::BF16), "{name}: {mats:?}");
        assert!(vecs.iter().all(|&d| d == DType::F32), "{name}: {vecs:?}");
        // The same checkpoint held in f32 (plain device), and for training (autodiff).
        let f32_held = {
            let config = model::ModelConfig::load(&dir).unwrap();
            let tensors = weights::read_checkpoint(&dir).unwrap();
            let (tr, _) =
                weights::build_with(&config, tensors, &cpu(), weights::Storage::F32).unwrap();
            Model {
                transformer: tr,
                ..Model::load(&dir, &cpu()).unwrap()
            }
        };
        assert_eq!(f32_held.transformer.embed.val().dtype(), DType::F32);
        let train = Model::load(&dir, &cpu().autodiff()).unwrap();
        assert_eq!(
            train.transformer.layers[0].attn.qkv.val().dtype(),
            DType::F32
        );

        for (k, r) in refs.iter().enumerate() {
            let nums = |key: &str| crate::support::json::f64s(&r[key]);
            let ids = crate::support::json::u32s(&r["input_ids"]);
            let (exact, torch_ac, torch_bf16) = (nums("exact"), nums("autocast"), nums("bf16"));
            let worst = |a: &[f64], b: &[f64]| {
                assert_eq!(a.len(), b.len());
                a.iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f64, f64::max)
            };
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let lp = seq_logprobs(&held, &ids);
            assert_eq!(
                bits(&lp),
                bits(&seq_logprobs(&f32_held, &ids)),
                "{name} seq {k}"
            );
            let d32 = worst(&lp, &exact);
            assert!(d32 < 1e-4, "{name} seq {k}: f32 products off by {d32}");
            let (lp16, lp16_f32_held) = {
                let _bf16 = autocast(Precision::Bf16);
                (seq_logprobs(&held, &ids), seq_logprobs(&f32_held, &ids))
            };
            assert_eq!(
                bits(&lp16),
                bits(&lp16_f32_held),
                "{name} seq {k}: autocast"
            );
            let (ours, theirs, plain) = (
                worst(&lp16, &exact),
                worst(&torch_ac, &exact),
                worst(&torch_bf16, &exact),
            );
            let cross = worst(&lp16, &torch_ac);
            eprintln!(
                "{name}-bf16 seq {k}: max |logprob - exact|: f32 products {d32:.1e}, rlcr bf16 \
                 {ours:.2e}, torch autocast {theirs:.2e}, torch bf16 model {plain:.2e}; rlcr vs \
                 torch autocast {cross:.2e}"
            );
            assert!(
                ours > 1e-3,
                "{name} seq {k}: bf16 mode moved nothing ({ours})"
            );
            assert!(ours <= theirs, "{name} seq {k}: {ours} vs torch {theirs}");
            assert!(cross <= 2.0 * theirs, "{name} seq {k}: {cross} from torch");

            let g32 = nll_gradient(&train, &ids);
            let g16 = {
                let _bf16 = autocast(Precision::Bf16);
                nll_gradient(&train, &ids)
            };
            let (mut diff, mut norm) = (0f64, 0f64);
            for (a, b) in g16.iter().zip(&g32) {
                diff += ((a - b) as f64).powi(2);
                norm += (*b as f64).powi(2);
            }
            let rel = (diff / norm).sqrt();
            let torch_rel = r["grad_rel_diff"].as_f64().unwrap();
            eprintln!("{name}-bf16 seq {k}: gradient moved {rel:.3e} (torch: {torch_rel:.3e})");
            assert!(rel > 1e-4, "{name} seq {k}: bf16 gradient moved nothing");
            assert!(
                rel <= 1.5 * torch_rel,
                "{name} seq {k}: {rel} vs {torch_rel}"
            );
        }

        // Decoding through the KV cache (packed panels of the bf16 matrices): the f32-held
        // model's bits, step by step.
        let prompts = vec![crate::support::json::u32s(&refs[0]["input_ids"])[..20].to_vec()];
        let run = |m: &Model| -> Vec<u32> {
            let mut cache = model::KvCache::new(&m.transformer, 1, 32);
            let mut out = Vec::new();
            let mut input = TokenBatch::left_padded(&prompts);
            for _ in 0..6 {
                let logits = model::read_f32(m.transformer.step(&mut cache, &input).unwrap());
                let logits = logits.unwrap();
                out.extend(logits.iter().map(|x| x.to_bits()));
                let next = (0..logits.len())
                    .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                    .unwrap() as u32;
                input = TokenBatch::step(&[next]);
            }
            out
        };
        assert_eq!(run(&held), run(&f32_held), "{name}: decode steps");
    }
}
