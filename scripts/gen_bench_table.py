#!/usr/bin/env python3
"""Write a synthetic countdown trajectory table for benchmarking `rlcr score`.

usage: gen_bench_table.py OUT.parquet [--rows 1000000] [--answers 8] [--seed 0]
                          [--context-tokens 100] [--response-tokens 120]

Rows are TinyZero-like countdown answer rows (G answers per prompt, no confidence rows): the
TinyZero user prompt in `messages`, 100 context tokens, 120 response tokens with log-probs (both
adjustable), a
~250-character response `<think>…</think>\\n<answer>…</answer>` whose equation is correct, wrong,
malformed or missing in fixed proportions, in row groups of 65,536 rows (zstd), as
generate-answers writes them. Needs pyarrow (no numpy).
"""
import argparse
import json
import random

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

RG = 65536


def token_lists(n, length, hi, seed):
    flat = pc.cast(pc.floor(pc.multiply(pc.random(n * length, initializer=seed), hi)), pa.int32())
    return pa.ListArray.from_arrays(pa.array(range(0, (n + 1) * length, length), pa.int32()), flat)


def logprob_lists(n, length, seed):
    flat = pc.cast(pc.negate(pc.multiply(pc.random(n * length, initializer=seed), 3.0)), pa.float32())
    return pa.ListArray.from_arrays(pa.array(range(0, (n + 1) * length, length), pa.int32()), flat)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--answers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--context-tokens", type=int, default=100)
    ap.add_argument("--response-tokens", type=int, default=120)
    a = ap.parse_args()
    CTX, RESP = a.context_tokens, a.response_tokens
    rng = random.Random(a.seed)
    span_t = pa.struct([("start", pa.int32()), ("end", pa.int32())])
    schema = pa.schema([
        ("prompt_id", pa.string(), False), ("sample_type", pa.string(), False), ("answer_idx", pa.int32(), False),
        ("confidence_idx", pa.int32()), ("sample_id", pa.string(), False), ("data_source", pa.string(), False),
        ("ground_truth", pa.string(), False), ("messages", pa.string(), False),
        ("context_ids", pa.list_(pa.int32()), False), ("response_ids", pa.list_(pa.int32()), False),
        ("response_text", pa.string(), False), ("response_logprobs", pa.list_(pa.float32()), False),
        ("finish_reason", pa.string(), False), ("answer_span", span_t),
    ])
    w = pq.ParquetWriter(a.out, schema, compression="zstd", compression_level=3)
    done = 0
    task = None
    while done < a.rows:
        n = min(RG, a.rows - done)
        cols = {k: [] for k in ["prompt_id", "sample_type", "answer_idx", "sample_id", "ground_truth", "messages", "response_text"]}
        for r in range(done, done + n):
            j, k = divmod(r, a.answers)
            if k == 0 or task is None:
                nums = [rng.randint(1, 99) for _ in range(rng.choice([3, 4]))]
                target = nums[0] * nums[1] + sum(nums[2:])
                gt = json.dumps({"target": target, "numbers": nums})
                msg = json.dumps([{"role": "user", "content": (
                    f"Using the numbers {nums}, create an equation that equals {target}. You can use basic "
                    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in "
                    "<think> </think> tags. And return the final answer in <answer> </answer> tags, for example "
                    "<answer> (1 + 2) / 3 </answer>.")}])
                task = (nums, target, gt, msg)
            nums, target, gt, msg = task
            rest = " + ".join(str(x) for x in nums[2:])
            kind = rng.random()
            if kind < 0.35:
                eq = f"{nums[0]} * {nums[1]} + {rest}"
            elif kind < 0.8:
                eq = f"{nums[1]} + {nums[0]} - {rest}"
            elif kind < 0.9:
                eq = f"({nums[0]} * {nums[1]}) = {target}"
            else:
                eq = None
            think = (f"Let me try {nums[0]} times {nums[1]}, which gives {nums[0] * nums[1]}. Then adding the rest "
                     f"gives {target}, so this works. Let me double check the arithmetic once more before answering.")
            text = f"{think}</think>\n<answer>{eq}</answer>" if eq else f"{think}</think>\nI could not find it."
            cols["prompt_id"].append(f"cd{j:07d}")
            cols["sample_type"].append("answer")
            cols["answer_idx"].append(k)
            cols["sample_id"].append(f"cd{j:07d}/a{k}")
            cols["ground_truth"].append(gt)
            cols["messages"].append(msg)
            cols["response_text"].append(text)
        b = pa.record_batch([
            pa.array(cols["prompt_id"], pa.string()), pa.array(cols["sample_type"], pa.string()),
            pa.array(cols["answer_idx"], pa.int32()), pa.nulls(n, pa.int32()),
            pa.array(cols["sample_id"], pa.string()), pa.array(["countdown"] * n, pa.string()),
            pa.array(cols["ground_truth"], pa.string()), pa.array(cols["messages"], pa.string()),
            token_lists(n, CTX, 150000, a.seed * 1000 + done), token_lists(n, RESP, 150000, a.seed * 1000 + done + 1),
            pa.array(cols["response_text"], pa.string()), logprob_lists(n, RESP, a.seed * 1000 + done + 2),
            pa.array(["stop"] * n, pa.string()),
            pa.StructArray.from_arrays([pa.array([0] * n, pa.int32()), pa.array([RESP] * n, pa.int32())], fields=list(span_t)),
        ], schema=schema)
        w.write_batch(b, row_group_size=RG)
        done += n
    w.close()


if __name__ == "__main__":
    main()
