#!/usr/bin/env python3
"""Random-weight Hugging Face folders and training tables for scripts/bench.sh's `rlcr update`
workloads (the same shapes as examples/bench_train.rs and scripts/bench_transformers.py train).

  model  qwen39m|smollm2 DIR [TOKENIZER_DIR]
                                a Hugging Face folder with random weights (transformers'
                                `from_config(...).save_pretrained`, float32, seed 0) and the
                                tokenizer of TOKENIZER_DIR with its special token ids (default
                                fixtures/tiny-qwen2's, 384 tokens: enough for `update`, which
                                reads token ids from the table; sampling wants a tokenizer of the
                                model's whole vocabulary, e.g. SmolLM2's for the smollm2 shape)
  table  qwen39m|smollm2 PATH ROWS LEN [CTX]
                                a training table as `rlcr update` reads it (schemas/trajectory.json):
                                ROWS rows of LEN tokens each, CTX context tokens (default 1) and
                                LEN − CTX response tokens, the ids examples/bench_train.rs uses,
                                response_logprobs −10, token_advantages ±1 alternating, every
                                response token learnable
  prompts PATH ROWS             a prompts table (schemas/prompts.json) of ROWS chat prompts, the
                                questions of scripts/bench_transformers.py's `sample` in its order

  python scripts/bench_models.py model qwen39m /tmp/rlcr-bench/qwen39m
  python scripts/bench_models.py table qwen39m /tmp/rlcr-bench/qwen39m-8x256.parquet 8 256

Nothing is rewritten when the output exists (delete it to make it again).
"""
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "fixtures", "tiny-qwen2")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")

# The shapes of examples/bench_train.rs (QWEN39M, SMOLLM2) and scripts/bench_transformers.py.
SHAPES = {
    "qwen39m": dict(
        arch="qwen2",
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
    "smollm2": dict(
        arch="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
}


def model(which, out, tokenizer=TOKENIZER):
    if os.path.exists(os.path.join(out, "config.json")):
        print(f"{out}: exists")
        return
    import json

    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    transformers.utils.logging.disable_progress_bar()

    shape = dict(SHAPES[which])
    arch = shape.pop("arch")
    config_cls, model_cls = (
        (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    )
    with open(os.path.join(tokenizer, "config.json")) as f:
        special = {k: v for k, v in json.load(f).items()
                   if k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    cfg = config_cls(**shape, **special)
    torch.manual_seed(0)
    m = model_cls(cfg).float()
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    m.save_pretrained(tmp, safe_serialization=True)
    for f in TOKENIZER_FILES:
        if os.path.exists(os.path.join(tokenizer, f)):
            shutil.copy(os.path.join(tokenizer, f), tmp)
    os.replace(tmp, out)
    n = sum(p.numel() for p in m.parameters())
    print(f"{out}: {which}, {n / 1e6:.1f}M parameters, random weights, tokenizer of {tokenizer}")


def table(which, path, rows, length, ctx=1):
    if os.path.exists(path):
        print(f"{path}: exists")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    vocab = min(SHAPES[which]["vocab_size"], 32000)  # as examples/bench_train.rs
    n = length - ctx
    data = {k: [] for k in ("prompt_id", "sample_id", "sample_type", "answer_idx", "context_ids",
                            "response_ids", "response_logprobs", "token_advantages",
                            "loss_mask")}
    for b in range(rows):
        ids = [(b * 7919 + t * 104729) % vocab for t in range(length)]
        data["prompt_id"].append(f"p{b}")
        data["sample_id"].append(f"p{b}/a0")
        data["sample_type"].append("answer")
        data["answer_idx"].append(0)
        data["context_ids"].append(ids[:ctx])
        data["response_ids"].append(ids[ctx:])
        data["response_logprobs"].append([-10.0] * n)
        data["token_advantages"].append([1.0 if (b + t) % 2 == 0 else -1.0 for t in range(n)])
        data["loss_mask"].append([True] * n)
    schema = pa.schema([
        ("prompt_id", pa.string()),
        ("sample_id", pa.string()),
        ("sample_type", pa.string()),
        ("answer_idx", pa.int32()),
        ("context_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_logprobs", pa.list_(pa.float32())),
        ("token_advantages", pa.list_(pa.float32())),
        ("loss_mask", pa.list_(pa.bool_())),
    ])
    tmp = path + ".tmp"
    pq.write_table(pa.table(data, schema=schema), tmp, compression="zstd")
    os.replace(tmp, path)
    print(f"{path}: {rows} rows x {length} tokens ({ctx} context + {n} response)")


def prompts(path, rows):
    if os.path.exists(path):
        print(f"{path}: exists")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    questions = [  # scripts/bench_transformers.py QUESTIONS
        "What is 12 + 7?",
        "Name a prime number larger than 10.",
        "What is the capital of France?",
        "Count from one to five.",
    ]
    msg = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    schema = pa.schema([("prompt_id", pa.string()), ("messages", msg),
                        ("data_source", pa.string()), ("ground_truth", pa.string())])
    data = {
        "prompt_id": [f"p{j}" for j in range(rows)],
        "messages": [[{"role": "user", "content": questions[j % len(questions)]}]
                     for j in range(rows)],
        "data_source": ["bench"] * rows,
        "ground_truth": ["{}"] * rows,
    }
    tmp = path + ".tmp"
    pq.write_table(pa.table(data, schema=schema), tmp, compression="zstd")
    os.replace(tmp, path)
    print(f"{path}: {rows} prompts")


def main():
    a = sys.argv[1:]
    if len(a) in (3, 4) and a[0] == "model" and a[1] in SHAPES:
        model(a[1], a[2], *a[3:])
    elif len(a) in (5, 6) and a[0] == "table" and a[1] in SHAPES:
        table(a[1], a[2], int(a[3]), int(a[4]), int(a[5]) if len(a) > 5 else 1)
    elif len(a) == 3 and a[0] == "prompts":
        prompts(a[1], int(a[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
