#!/usr/bin/env python3
"""bf16 checkpoints of the fixture models and torch's figures on them, for bf16 weights.

    python3 scripts/refs_bf16_weights.py    # writes fixtures/MODEL-bf16/ and
                                            # fixtures/refs/MODEL-bf16.rand.json

For each of `tiny-qwen2` (tied embeddings, q/k/v biases) and `tiny-llama` (untied LM head):

- `fixtures/MODEL-bf16/`: the float32 fixture cast to bfloat16 (`model.to(torch.bfloat16)`, round
  to nearest even) and written by `save_pretrained`, every tensor BF16 in the safetensors file;
  the tokenizer and template files copied from the float32 folder.
- `fixtures/refs/MODEL-bf16.rand.json`: the four random sequences of `MODEL.rand.f64.json` (64 ids
  each), run alone, unpadded, through that bf16 checkpoint three ways:
  - `exact`: loaded in float64 (the bf16 values are exact in float64): the reference;
  - `autocast`: loaded in float32 under `torch.autocast("cpu", dtype=torch.bfloat16)` (linear
    layers, the LM head included, on bf16 operands; norms and softmax in f32): what a TRL/verl
    user's bf16 mixed-precision training computes;
  - `bf16`: loaded in bfloat16 (`dtype=torch.bfloat16`, every operation in bf16): plain bf16
    inference.
  Log-softmax in float64 on the logits each returns; `logprobs[t] = log p(ids[t+1] | ids[..=t])`.
  `grad_rel_diff`: `|g_autocast - g_exact| / |g_exact|` of the summed next-token NLL's gradient
  (L2 over every parameter at once), and `nll` of each mode.
"""
import json
import pathlib
import shutil

import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parent.parent
REFS = ROOT / "fixtures" / "refs"
COPIED = [
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
]


def run(model, ids, autocast, grad):
    x = torch.tensor([ids])
    ctx = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if autocast
        else torch.autocast("cpu", enabled=False)
    )
    model.zero_grad(set_to_none=True)
    with ctx:
        logits = model(input_ids=x).logits[0]
    lp = torch.log_softmax(logits.double(), dim=-1)
    target = torch.tensor(ids[1:])
    nll = -lp[:-1].gather(1, target[:, None]).sum()
    grads = None
    if grad:
        nll.backward()
        grads = {n: p.grad.double().clone() for n, p in model.named_parameters()}
    lps = [float(lp[t, ids[t + 1]]) for t in range(len(ids) - 1)]
    return lps, float(nll), grads


def main():
    torch.manual_seed(0)
    for name in ["tiny-qwen2", "tiny-llama"]:
        src_dir = ROOT / "fixtures" / name
        dst_dir = ROOT / "fixtures" / f"{name}-bf16"
        m = transformers.AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.float32)
        m = m.to(torch.bfloat16)
        if dst_dir.exists():
            shutil.rmtree(dst_dir)
        m.save_pretrained(dst_dir, safe_serialization=True)
        for f in COPIED:
            if (src_dir / f).exists():
                shutil.copy(src_dir / f, dst_dir / f)
        m64 = transformers.AutoModelForCausalLM.from_pretrained(dst_dir, dtype=torch.float64)
        m32 = transformers.AutoModelForCausalLM.from_pretrained(dst_dir, dtype=torch.float32)
        m16 = transformers.AutoModelForCausalLM.from_pretrained(dst_dir, dtype=torch.bfloat16)
        for mm in (m64, m32, m16):
            mm.train(False)
        src = json.loads((REFS / f"{name}.rand.f64.json").read_text())
        seqs = []
        for s in src["sequences"]:
            ids = s["input_ids"]
            ex, ex_nll, g64 = run(m64, ids, False, True)
            ac, ac_nll, gac = run(m32, ids, True, True)
            with torch.no_grad():
                b16, b16_nll, _ = run(m16, ids, False, False)
            diff = sum(float((gac[n] - g64[n]).pow(2).sum()) for n in g64) ** 0.5
            norm = sum(float(g64[n].pow(2).sum()) for n in g64) ** 0.5
            seqs.append(
                {
                    "input_ids": ids,
                    "exact": ex,
                    "autocast": ac,
                    "bf16": b16,
                    "nll": {"exact": ex_nll, "autocast": ac_nll, "bf16": b16_nll},
                    "grad_rel_diff": diff / norm,
                }
            )
        out = {
            "model_dir": f"fixtures/{name}-bf16",
            "modes": {
                "exact": "bf16 weights loaded in float64",
                "autocast": "bf16 weights loaded in float32, torch.autocast cpu bfloat16",
                "bf16": "bf16 weights loaded in bfloat16",
            },
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "sequences": seqs,
        }
        dst = REFS / f"{name}-bf16.rand.json"
        dst.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {dst_dir} and {dst}")


if __name__ == "__main__":
    main()
