//! Qwen3 (`Qwen3ForCausalLM`) against Hugging Face transformers run in float64: log-probs, the
//! chat template with `enable_thinking`, and the gradient of an `update` step.
//!
//! `fixtures/tiny-qwen3` and its references in `fixtures/refs/tiny-qwen3.*` are written by
//! `scripts/gen_qwen3.py tiny` (head_dim 32 on a hidden size of 64, untied head). The same script
//! makes a checkpoint with Qwen3-0.6B's attention shapes (hidden 1024, 16 query and 8 KV heads of
//! head_dim 128, tied embeddings; ~60 MB, not committed) in a temporary folder for
//! [`qwen3_at_real_head_shapes_matches_transformers`].
use std::collections::BTreeMap;
use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Device, Tensor};
use rlcr::model::{self, weights, ChatOptions, Message, Model, ModelConfig};
use rlcr::train::data::TrainRow;
use rlcr::train::trainer::{batch_gradients, grads_to_host, TrainConfig};

use super::fixtures;
use super::model::check_refs;
use super::support::json::{read as json, u32s as ints};
use super::support::python::{script, Needs, Py};

/// Every parameter of a module by its module path (the layout [`grads_to_host`] uses).
fn params_by_path<M: Module>(m: &M) -> BTreeMap<String, Vec<f32>> {
    struct V {
        path: Vec<String>,
        out: BTreeMap<String, Vec<f32>>,
    }
    impl ModuleVisitor for V {
        fn enter_module(&mut self, name: &str, _c: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _c: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let v = model::read_f32(param.val()).unwrap();
            self.out.insert(self.path.join("."), v);
        }
    }
    let mut v = V {
        path: Vec::new(),
        out: BTreeMap::new(),
    };
    m.visit(&mut v);
    v.out
}

/// The policy loss of `update` at ratio 1 (behaviour log-probs = the model's own), token-mean:
/// its gradient is `-(1/N) Σ A_t ∇ log p_t`, the quantity `scripts/gen_qwen3.py` differentiates.
fn policy_config() -> TrainConfig {
    super::support::train::config(super::support::train::policy(0.0, 0.0), 2)
}

/// rlcr's gradient of the update in `NAME.update.f64.json` against torch's (float64) in
/// `NAME.update_grad.safetensors`, parameter by parameter; returns the relative L2 difference
/// over all parameters.
pub(crate) fn check_update_gradient(model_dir: &Path, refs: &Path, name: &str) -> f64 {
    let device = Device::flex().autodiff();
    let m = Model::load(model_dir, &device).unwrap();
    let upd = json(refs.join(format!("{name}.update.f64.json")));
    let mut rows: Vec<TrainRow> = upd["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let response = ints(&r["response"]);
            let n = response.len();
            TrainRow {
                context: ints(&r["context"]),
                response,
                old_logp: vec![0.0; n],
                adv: r["advantages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect(),
                mask: vec![true; n],
                ref_logp: None,
                is_confidence: false,
            }
        })
        .collect();
    // On-policy: the behaviour log-probs are the model's own, so every ratio is 1.
    let pairs: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|r| (r.context.as_slice(), r.response.as_slice()))
        .collect();
    let inner = m.transformer.valid();
    let lp = model::logprobs(&inner, &pairs, 4, false, None)
        .unwrap()
        .logprobs;
    for (r, l) in rows.iter_mut().zip(lp) {
        r.old_logp = l;
    }
    let refs_rows: Vec<&TrainRow> = rows.iter().collect();
    let (grads, _) = batch_gradients(&m.transformer, &refs_rows, &policy_config()).unwrap();
    let ours: BTreeMap<String, Vec<f32>> =
        grads_to_host(&m.transformer, &grads).into_iter().collect();

    // torch's gradient, by HF name and layout, built into a module of the same shape so that
    // both sit in rlcr's layout (fused q/k/v and gate/up, matrices [in, out]).
    let bytes = std::fs::read(refs.join(format!("{name}.update_grad.safetensors"))).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let config = ModelConfig::load(model_dir).unwrap();
    let host: BTreeMap<String, weights::HostTensor> = st
        .iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                weights::HostTensor {
                    dtype: v.dtype(),
                    shape: v.shape().to_vec(),
                    data: weights::decode_to_f32(v.dtype(), v.data()).unwrap(),
                },
            )
        })
        .collect();
    let (as_module, _) = weights::build(&config, host, &Device::flex()).unwrap();
    let theirs = params_by_path(&as_module);
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{name}: parameters with a gradient"
    );
    let (mut diff, mut norm) = (0f64, 0f64);
    for (path, g) in &ours {
        let t = &theirs[path];
        assert_eq!(g.len(), t.len(), "{name}: {path}");
        let (mut d, mut n) = (0f64, 0f64);
        for (a, b) in g.iter().zip(t) {
            d += (*a as f64 - *b as f64).powi(2);
            n += (*b as f64).powi(2);
        }
        let rel = (d / n.max(1e-300)).sqrt();
        assert!(n > 0.0, "{name}: torch's gradient of {path} is zero");
        assert!(
            rel < 1e-3,
            "{name}: gradient of {path} off by {rel:.2e} (relative L2)"
        );
        diff += d;
        norm += n;
    }
    let rel = (diff / norm).sqrt();
    let torch_norm = upd["grad_norm"].as_f64().unwrap();
    assert!(
        (norm.sqrt() - torch_norm).abs() < 1e-4 * torch_norm,
        "{name}: gradient norm {} vs torch {torch_norm}",
        norm.sqrt()
    );
    eprintln!("{name}: update gradient vs torch (float64): relative L2 {rel:.2e}");
    assert!(rel < 1e-4, "{name}: update gradient off by {rel:.2e}");
    rel
}

#[test]
fn tiny_qwen3_matches_transformers() {
    let m = Model::load(&fixtures().join("tiny-qwen3"), &Device::flex()).unwrap();
    assert!(m.config.qk_norm && m.config.head_dim * m.config.num_attention_heads != 64);
    let mut worst = 0f64;
    for kind in ["rand.f64", "chat.f64"] {
        worst = worst.max(check_refs(&m, &format!("tiny-qwen3.{kind}.json")));
    }
    eprintln!("tiny-qwen3: max |logprob - transformers float64| = {worst:.2e}");
}

/// The Qwen3-style template (in tokenizer_config.json) rendered with `enable_thinking` false,
/// true and absent, on a single turn and on a conversation with an earlier assistant turn whose
/// `<think>` block the template drops: text and ids as transformers' `apply_chat_template`.
#[test]
fn qwen3_chat_template_with_enable_thinking_matches_transformers() {
    let mut m = Model::load(&fixtures().join("tiny-qwen3"), &Device::flex()).unwrap();
    let refs = json(fixtures().join("refs/tiny-qwen3.chat.f64.json"));
    let mut seen_off = 0;
    for s in refs["sequences"].as_array().unwrap() {
        let messages: Vec<Message> = serde_json::from_value(s["messages"].clone()).unwrap();
        let kwargs: Vec<String> = s["kwargs"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let opts = ChatOptions {
            template: None,
            kwargs: ChatOptions::parse_kwargs(&kwargs).unwrap(),
        };
        m.set_chat_options(&opts).unwrap();
        let (rendered, ids) = m.encode_chat(&messages, true).unwrap();
        assert_eq!(
            rendered,
            s["rendered"].as_str().unwrap(),
            "kwargs {kwargs:?}"
        );
        assert_eq!(ids, ints(&s["input_ids"]), "kwargs {kwargs:?}");
        if rendered.ends_with("<think>\n\n</think>\n\n") {
            seen_off += 1;
        }
    }
    assert_eq!(
        seen_off, 3,
        "enable_thinking=false renders an empty think block"
    );
}

#[test]
fn qwen3_update_gradient_matches_torch() {
    check_update_gradient(
        &fixtures().join("tiny-qwen3"),
        &fixtures().join("refs"),
        "tiny-qwen3",
    );
}

/// Qwen3-0.6B's head shapes (hidden 1024 < 16 × 128): the checkpoint and its float64 references
/// are made by transformers in a temporary folder (`scripts/gen_qwen3.py real`). Skipped where
/// torch/transformers are not importable, unless `RLCR_REQUIRE_TORCH=1` (CI).
#[test]
fn qwen3_at_real_head_shapes_matches_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let (model_dir, refs) = (dir.path().join("model"), dir.path().join("refs"));
    let made = Py::script(script("gen_qwen3.py"), Needs::Torch)
        .arg("real")
        .arg(&model_dir)
        .arg(&refs)
        .stdout();
    if made.is_none() {
        return;
    }
    let m = Model::load(&model_dir, &Device::flex()).unwrap();
    let c = &m.config;
    assert_eq!(
        (
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim
        ),
        (1024, 16, 8, 128)
    );
    assert!(c.tie_word_embeddings && c.qk_norm);
    // An absolute path: `check_refs` joins it onto fixtures/refs, which keeps it as it is.
    let file = refs.join("real-qwen3.rand.f64.json");
    let worst = check_refs(&m, file.to_str().unwrap());
    eprintln!("real-qwen3: max |logprob - transformers float64| = {worst:.2e}");
    check_update_gradient(&model_dir, &refs, "real-qwen3");
}
