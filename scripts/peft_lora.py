#!/usr/bin/env python3
"""LoRA adapters through Hugging Face PEFT: the independent side of rlcr's adapter tests.

    python3 scripts/peft_lora.py make-fixture BASE OUT SEQS.json REFS.json R ALPHA TARGETS [rslora]
    python3 scripts/peft_lora.py logprobs TABLE.parquet BASE ADAPTER...
    python3 scripts/peft_lora.py auto-logprobs TABLE.parquet ADAPTER...
    python3 scripts/peft_lora.py merged BASE ADAPTER MERGED
    python3 scripts/peft_lora.py grad-fixture BASE ADAPTER SEQS.json OUT.json

make-fixture: PEFT builds a LoRA adapter on the model folder BASE (rank R, lora_alpha ALPHA,
target_modules TARGETS comma-separated, use_rslora when the last argument is `rslora`), with
PEFT's own initialisation for lora_A and a seeded random non-zero lora_B (a fresh adapter's B is
zero, which would test nothing), saves it with `save_pretrained` into OUT (base_model_name_or_path
rewritten relative to OUT), and writes to REFS.json the float64 log-probs of every sequence of
SEQS.json (`{"sequences": [{"input_ids": [...]}, ...]}`) under base + adapter.

logprobs: loads BASE with transformers and each ADAPTER with `PeftModel.from_pretrained` (no rlcr
code involved) and prints, as JSON, one entry per adapter: the float32 log-prob of every
`response_ids` token of the table given `context_ids` and the response tokens before it, one row
at a time (no padding): `[{"logprobs": [[...], ...]}, ...]`.

auto-logprobs: the same with `AutoPeftModelForCausalLM.from_pretrained(ADAPTER)`, which finds the
base model through the adapter's base_model_name_or_path (run it with HF_HUB_OFFLINE=1 to be sure
that the base is a folder, not a Hub download); the output adds each adapter's `base` as PEFT
resolved it.

merged: prints `{"max_abs_diff": x, "tensors": n}` comparing every tensor of the model folder
MERGED with PEFT's `merge_and_unload()` of BASE + ADAPTER (in float32), and fails when a tensor is
missing or mis-shaped.

grad-fixture: the float64 gradient of L = −Σ log p over every sequence of SEQS.json (each token
given the ones before it, from the second on) with respect to lora_A and lora_B of layer 0's
q_proj and layer 1's gate_proj and down_proj of ADAPTER on BASE, written to OUT.json in PEFT's
layouts (`{"loss": x, "grads": {name: {"shape": [...], "values": [...]}}}`).

Exit codes: 0 success, 1 a failed check, 3 torch/transformers/peft not importable (the tests treat
3 as "skipped" unless RLCR_REQUIRE_TORCH=1).
"""

import json
import os
import sys


def main() -> int:
    try:
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM
    except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
        print(f"torch/transformers/peft not importable: {e}", file=sys.stderr)
        return 3
    torch.set_num_threads(2)
    args = sys.argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, rest = args[0], args[1:]

    if cmd == "make-fixture" and len(rest) in (7, 8):
        base, out, seqs_path, refs_path, r, alpha, targets = rest[:7]
        rslora = len(rest) == 8 and rest[7] == "rslora"
        torch.manual_seed(1234)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        cfg = LoraConfig(
            r=int(r),
            lora_alpha=float(alpha),
            target_modules=targets.split(","),
            lora_dropout=0.0,
            use_rslora=rslora,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, cfg)
        g = torch.Generator().manual_seed(99)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        model.save_pretrained(out)
        card = os.path.join(out, "README.md")  # PEFT's generic model card: not a fixture
        if os.path.exists(card):
            os.remove(card)
        cfg_path = os.path.join(out, "adapter_config.json")
        with open(cfg_path) as f:
            c = json.load(f)
        c["base_model_name_or_path"] = os.path.relpath(base, out)
        with open(cfg_path, "w") as f:
            json.dump(c, f, indent=2, sort_keys=True)
            f.write("\n")
        model = model.double().eval()
        with open(seqs_path) as f:
            seqs = json.load(f)["sequences"]
        refs = []
        for s in seqs:
            ids = torch.tensor([s["input_ids"]])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0]
            lp = torch.log_softmax(logits[:-1], dim=-1)
            tok = lp.gather(1, ids[0, 1:, None])[:, 0]
            refs.append({"input_ids": s["input_ids"], "logprobs": tok.tolist()})
        import peft
        import transformers

        doc = {
            "adapter": os.path.basename(os.path.normpath(out)),
            "dtype": "float64",
            "peft": peft.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "sequences": refs,
        }
        with open(refs_path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        return 0

    def table_logprobs(model, table):
        import pyarrow.parquet as pq

        rows = pq.read_table(table, columns=["context_ids", "response_ids"]).to_pylist()
        out = []
        for row in rows:
            ctx, resp = row["context_ids"], row["response_ids"]
            if not resp:
                out.append([])
                continue
            ids = torch.tensor([ctx + resp])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].float()
            lp = torch.log_softmax(logits[len(ctx) - 1 : -1], dim=-1)
            out.append(lp.gather(1, torch.tensor(resp)[:, None])[:, 0].tolist())
        return out

    if cmd == "logprobs" and len(rest) >= 3:
        table, base, adapters = rest[0], rest[1], rest[2:]
        results = []
        for adapter in adapters:
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            model = PeftModel.from_pretrained(model, adapter).eval()
            results.append({"logprobs": table_logprobs(model, table)})
        json.dump(results, sys.stdout)
        return 0

    if cmd == "auto-logprobs" and len(rest) >= 2:
        from peft import AutoPeftModelForCausalLM

        table, adapters = rest[0], rest[1:]
        results = []
        for adapter in adapters:
            model = AutoPeftModelForCausalLM.from_pretrained(adapter, dtype=torch.float32).eval()
            base = model.peft_config["default"].base_model_name_or_path
            results.append({"base": base, "logprobs": table_logprobs(model, table)})
        json.dump(results, sys.stdout)
        return 0

    if cmd == "merged" and len(rest) == 3:
        from safetensors.torch import load_file

        base, adapter, merged = rest
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        want = model.state_dict()
        got = {}
        for name in sorted(os.listdir(merged)):
            if name.endswith(".safetensors"):
                got.update(load_file(os.path.join(merged, name)))
        worst = 0.0
        n = 0
        for k, v in want.items():
            if k == "lm_head.weight" and model.config.tie_word_embeddings:
                continue
            if k not in got:
                print(f"{merged}: missing {k}", file=sys.stderr)
                return 1
            if tuple(got[k].shape) != tuple(v.shape):
                print(f"{k}: shape {tuple(got[k].shape)} vs {tuple(v.shape)}", file=sys.stderr)
                return 1
            worst = max(worst, (got[k].double() - v.double()).abs().max().item())
            n += 1
        json.dump({"max_abs_diff": worst, "tensors": n}, sys.stdout)
        return 0

    if cmd == "grad-fixture" and len(rest) == 4:
        base, adapter, seqs_path, out = rest
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float64)
        model = PeftModel.from_pretrained(model, adapter, is_trainable=True).double()
        with open(seqs_path) as f:
            seqs = json.load(f)["sequences"]
        loss = 0.0
        for s in seqs:
            ids = torch.tensor([s["input_ids"]])
            lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
            loss = loss - lp.gather(1, ids[0, 1:, None]).sum()
        loss.backward()
        keep = ("layers.0.self_attn.q_proj.", "layers.1.mlp.gate_proj.", "layers.1.mlp.down_proj.")
        grads = {}
        for name, p in model.named_parameters():
            if "lora_" in name and any(k in name for k in keep):
                key = name.replace(".default.weight", ".weight")
                grads[key] = {"shape": list(p.shape), "values": p.grad.flatten().tolist()}
        with open(out, "w") as f:
            json.dump({"loss": loss.item(), "grads": grads}, f)
            f.write("\n")
        return 0

    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
