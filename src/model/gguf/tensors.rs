//! llama.cpp tensor names → Hugging Face names, and llama.cpp's q/k row permutation.
//!
//! Names: one rule per line in [`hf_name`]; a name no rule knows is an error listing every such
//! name (better than a model that silently lacks a tensor).
//!
//! Permutation: llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.permute`) reorders the
//! rows of `q_proj` and `k_proj` (weights and biases) of Llama-family models so that its
//! interleaved-pair RoPE equals Hugging Face's rotate-half RoPE: the rows of each head, viewed as
//! `[2, head_dim/2]`, are transposed to `[head_dim/2, 2]`. For `k_proj` the head count is the KV
//! head count. [`unpermute_rows`] is the inverse (transformers' `reverse_permute_weights`), and
//! [`permute_rows`] the forward map, kept for the round-trip test and for anyone writing GGUF.
use anyhow::{bail, Result};

/// The Hugging Face name of a llama.cpp tensor, or `None` when no rule matches.
pub fn hf_name(gguf: &str) -> Option<String> {
    Some(match gguf {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        "output.weight" => "lm_head.weight".into(),
        _ => {
            let rest = gguf.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let (stem, kind) = part.rsplit_once('.')?;
            if kind != "weight" && kind != "bias" {
                return None;
            }
            let hf = match stem {
                "attn_norm" => "input_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                _ => return None,
            };
            format!("model.layers.{layer}.{hf}.{kind}")
        }
    })
}

/// Which head count a tensor's rows are permuted with, if any (Llama family only): `attn_q` by
/// the attention heads, `attn_k` by the KV heads.
pub fn permutation_heads(gguf: &str, n_head: usize, n_head_kv: usize) -> Option<usize> {
    let stem = gguf.strip_prefix("blk.")?.split('.').nth(1)?;
    match stem {
        "attn_q" => Some(n_head),
        "attn_k" => Some(n_head_kv),
        _ => None,
    }
}

/// The row pairs of llama.cpp's q/k permutation: `(HF row, GGUF row)` for every row of a
/// `len`-value `[rows, cols]` buffer of `n_head` heads, `(h·2d + i·d + j, h·2d + 2j + i)` with
/// `d = rows / n_head / 2`, `i ∈ {0,1}`, `j < d`.
fn row_pairs(
    len: usize,
    rows: usize,
    cols: usize,
    n_head: usize,
) -> Result<impl Iterator<Item = (usize, usize)>> {
    if rows.checked_mul(cols) != Some(len) {
        bail!("{len} values are not {rows} rows of {cols}");
    }
    if n_head == 0 || !rows.is_multiple_of(2 * n_head) {
        bail!("{rows} rows cannot be split into {n_head} heads of an even size");
    }
    let d = rows / n_head / 2;
    Ok((0..n_head).flat_map(move |h| {
        (0..2)
            .flat_map(move |i| (0..d).map(move |j| (h * 2 * d + i * d + j, h * 2 * d + 2 * j + i)))
    }))
}

/// llama.cpp's permutation: HF row `h·2d + i·d + j` goes to GGUF row `h·2d + 2j + i`
/// (`d = rows / n_head / 2`, `i ∈ {0,1}`, `j < d`). `data` is row-major `[rows, cols]`
/// (`cols = 1` for a bias).
pub fn permute_rows(data: &[f32], rows: usize, cols: usize, n_head: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; data.len()];
    for (hf, gg) in row_pairs(data.len(), rows, cols, n_head)? {
        out[gg * cols..(gg + 1) * cols].copy_from_slice(&data[hf * cols..(hf + 1) * cols]);
    }
    Ok(out)
}

/// The inverse of [`permute_rows`] (transformers' `reverse_permute_weights`): GGUF row
/// `h·2d + 2j + i` goes back to HF row `h·2d + i·d + j`.
pub fn unpermute_rows(data: &[f32], rows: usize, cols: usize, n_head: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; data.len()];
    for (hf, gg) in row_pairs(data.len(), rows, cols, n_head)? {
        out[hf * cols..(hf + 1) * cols].copy_from_slice(&data[gg * cols..(gg + 1) * cols]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output_norm.weight", "model.norm.weight"),
            ("output.weight", "lm_head.weight"),
            (
                "blk.0.attn_norm.weight",
                "model.layers.0.input_layernorm.weight",
            ),
            (
                "blk.29.ffn_norm.weight",
                "model.layers.29.post_attention_layernorm.weight",
            ),
            (
                "blk.3.attn_q.weight",
                "model.layers.3.self_attn.q_proj.weight",
            ),
            ("blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias"),
            (
                "blk.3.attn_k.weight",
                "model.layers.3.self_attn.k_proj.weight",
            ),
            ("blk.3.attn_v.bias", "model.layers.3.self_attn.v_proj.bias"),
            (
                "blk.3.attn_output.weight",
                "model.layers.3.self_attn.o_proj.weight",
            ),
            (
                "blk.12.ffn_gate.weight",
                "model.layers.12.mlp.gate_proj.weight",
            ),
            ("blk.12.ffn_up.weight", "model.layers.12.mlp.up_proj.weight"),
            (
                "blk.12.ffn_down.weight",
                "model.layers.12.mlp.down_proj.weight",
            ),
        ];
        for (g, h) in cases {
            assert_eq!(hf_name(g).as_deref(), Some(h), "{g}");
        }
        for bad in [
            "rope_freqs.weight",
            "blk.x.attn_q.weight",
            "blk.0.attn_q.scale",
            "blk.0.ffn_gate_exps.weight",
            "blk.0",
        ] {
            assert_eq!(hf_name(bad), None, "{bad}");
        }
        assert_eq!(permutation_heads("blk.1.attn_q.weight", 9, 3), Some(9));
        assert_eq!(permutation_heads("blk.1.attn_k.bias", 9, 3), Some(3));
        assert_eq!(permutation_heads("blk.1.attn_v.weight", 9, 3), None);
        assert_eq!(permutation_heads("token_embd.weight", 9, 3), None);
    }

    #[test]
    fn hand_permutation_one_head() {
        // One head of 4 rows (d = 2): HF rows r0 r1 | r2 r3 (the two rotate-half halves) become the
        // interleaved pairs r0 r2 r1 r3 in llama.cpp's order.
        let hf = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]; // 4 rows × 2 cols
        let gg = permute_rows(&hf, 4, 2, 1).unwrap();
        assert_eq!(gg, vec![0.0, 0.5, 2.0, 2.5, 1.0, 1.5, 3.0, 3.5]);
        assert_eq!(unpermute_rows(&gg, 4, 2, 1).unwrap(), hf.to_vec());
    }

    #[test]
    fn hand_permutation_two_heads_bias() {
        // Two heads of 6 rows (d = 3), a bias (cols = 1): per head a0 a1 a2 b0 b1 b2 → a0 b0 a1 b1 a2 b2.
        let hf: Vec<f32> = (0..12).map(|x| x as f32).collect();
        let gg = permute_rows(&hf, 12, 1, 2).unwrap();
        assert_eq!(gg, vec![0., 3., 1., 4., 2., 5., 6., 9., 7., 10., 8., 11.]);
        assert_eq!(unpermute_rows(&gg, 12, 1, 2).unwrap(), hf);
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(unpermute_rows(&[0.0; 6], 3, 2, 1).is_err()); // odd head size
        assert!(unpermute_rows(&[0.0; 8], 4, 2, 0).is_err()); // no heads
        assert!(unpermute_rows(&[0.0; 7], 4, 2, 1).is_err()); // wrong length
        assert!(unpermute_rows(&[0.0; 24], 12, 2, 4).is_err()); // 12 rows, 4 heads of 3
    }

    proptest! {
        #[test]
        fn unpermute_inverts_permute(
            n_head in 1usize..6, half in 1usize..9, cols in 1usize..7, seed in any::<u32>()
        ) {
            let rows = n_head * 2 * half;
            let data: Vec<f32> = (0..rows * cols).map(|i| i as f32 + (seed % 1000) as f32 * 1000.0).collect();
            let gg = permute_rows(&data, rows, cols, n_head).unwrap();
            prop_assert_eq!(unpermute_rows(&gg, rows, cols, n_head).unwrap(), data.clone());
            let back = permute_rows(&unpermute_rows(&data, rows, cols, n_head).unwrap(), rows, cols, n_head).unwrap();
            prop_assert_eq!(back, data);
        }
    }
}
