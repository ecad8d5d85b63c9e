#!/usr/bin/env python3
"""Load a model folder with Hugging Face transformers and print per-token log-probs as JSON.

    python3 scripts/hf_logprobs.py TABLE.parquet MODEL_DIR...       # rows of an rlcr table
    python3 scripts/hf_logprobs.py --to-bf16 SRC_DIR DST_DIR         # write a bf16 copy (tests)

The first form is the independent check that a folder written by `rlcr update` / `rlcr sft` is a
real Hugging Face checkpoint: it is loaded with `AutoModelForCausalLM.from_pretrained` (no rlcr
code involved), the loading report must list no missing, unexpected or mismatched tensors, and the
log-prob of every `response_ids` token given `context_ids` and the response tokens before it is
computed in float32, one row at a time (no padding). Output on stdout, one entry per model folder (torch is imported once):

    [{"dtype": "bfloat16", "architectures": [...], "logprobs": [[...], ...]}, ...]

where `dtype` is the dtype of the tensors in the folder as transformers reads it (the checkpoint's
own dtype, before the float32 upcast used for the computation).

Exit codes: 0 success, 1 a failed check, 3 torch/transformers/pyarrow not importable (the test
treats 3 as "skipped" unless RLCR_REQUIRE_TORCH=1).
"""

import glob
import json
import os
import shutil
import struct
import sys


def main() -> int:
    try:
        import pyarrow.parquet as pq
        import torch
        from transformers import AutoModelForCausalLM
    except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
        print(f"torch/transformers/pyarrow not importable: {e}", file=sys.stderr)
        return 3
    torch.set_num_threads(2)
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "--to-bf16":
        src, dst = args[1], args[2]
        m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
        m.save_pretrained(dst)
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                     "generation_config.json"):
            if os.path.exists(os.path.join(src, name)):
                shutil.copy(os.path.join(src, name), os.path.join(dst, name))
        return 0
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    table, models = args[0], args[1:]
    rows = pq.read_table(table, columns=["context_ids", "response_ids"]).to_pylist()
    results = []
    for model_dir in models:
        r = logprobs(model_dir, rows)
        if r is None:
            return 1
        results.append(r)
    json.dump(results, sys.stdout)
    return 0


def logprobs(model_dir, rows):
    import torch
    from transformers import AutoModelForCausalLM

    # The checkpoint's own dtype, read from the safetensors headers (not from config.json).
    dtypes = set()
    for f in glob.glob(os.path.join(model_dir, "*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        dtypes |= {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    names = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
    if len(dtypes) != 1:
        print(f"{model_dir}: mixed or no tensor dtypes {sorted(dtypes)}", file=sys.stderr)
        return None

    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, output_loading_info=True
    )
    bad = {k: v for k, v in info.items() if v}
    if bad:
        print(f"{model_dir}: transformers loading report: {bad}", file=sys.stderr)
        return None
    model.eval()
    out = []
    with torch.no_grad():
        for row in rows:
            ctx, resp = row["context_ids"], row["response_ids"]
            ids = torch.tensor([ctx + resp], dtype=torch.long)
            lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            n = len(ctx)
            out.append([lp[n - 1 + i, tok].item() for i, tok in enumerate(resp)])
    return {
        "dtype": names.get(dtypes.pop(), "unknown"),
        "architectures": model.config.architectures,
        "logprobs": out,
    }


if __name__ == "__main__":
    sys.exit(main())
