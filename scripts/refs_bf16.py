#!/usr/bin/env python3
"""Reference figures of torch's bf16 autocast on the fixture models, for `update --precision bf16`.

    python3 scripts/refs_bf16.py            # writes fixtures/refs/MODEL.rand.bf16.json

For each of `tiny-qwen2` and `tiny-llama`, the four random sequences of `MODEL.rand.f64.json`
(64 ids each) run alone, unpadded, through transformers' model in float32 under
`torch.autocast("cpu", dtype=torch.bfloat16)` — what a TRL/verl user's bf16 mixed precision
computes: linear layers (the LM head included) and attention on bf16 operands, norms and the
softmax in f32. Log-softmax in float64 on the logits it returns. Written in the layout of the
other reference files (`fixtures/refs/README.md`): `logprobs[t] = log p(ids[t+1] | ids[..=t])`,
`logsumexp[t]` of the logits, and `grad_rel_diff`: how far autocast moves the gradient of the
summed next-token NLL over all parameters, `|g_bf16 - g_f64| / |g_f64|` (L2 over every parameter
at once, against the same model run in float64), so a test can hold rlcr's bf16 mode to torch's.
"""
import json
import pathlib

import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parent.parent
REFS = ROOT / "fixtures" / "refs"


def run(model, ids, autocast):
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
    lpd = lp.detach()
    lse = torch.logsumexp(logits.double(), dim=-1)
    target = torch.tensor(ids[1:])
    nll = -lp[:-1].gather(1, target[:, None]).sum()
    nll.backward()
    grads = {n: p.grad.double().clone() for n, p in model.named_parameters()}
    return lp, lse, grads


def main():
    torch.manual_seed(0)
    for name in ["tiny-qwen2", "tiny-llama"]:
        src = json.loads((REFS / f"{name}.rand.f64.json").read_text())
        path = ROOT / "fixtures" / name
        m32 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        m64 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
        m32.train(False)
        m64.train(False)
        seqs = []
        for s in src["sequences"]:
            ids = s["input_ids"]
            lp, lse, g = run(m32, ids, True)
            _, _, g64 = run(m64, ids, False)
            diff = sum(float((g[n] - g64[n]).pow(2).sum()) for n in g64) ** 0.5
            norm = sum(float(g64[n].pow(2).sum()) for n in g64) ** 0.5
            seqs.append(
                {
                    "input_ids": ids,
                    "logprobs": [float(lpd[t, ids[t + 1]]) for t in range(len(ids) - 1)],
                    "logsumexp": [float(v) for v in lse],
                    "grad_rel_diff": diff / norm,
                }
            )
        out = {
            "model_dir": f"fixtures/{name}",
            "dtype": "float32 weights, torch.autocast cpu bfloat16",
            "temperature": 1.0,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "sequences": seqs,
        }
        dst = REFS / f"{name}.rand.bf16.json"
        dst.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {dst}")


if __name__ == "__main__":
    main()
