#!/usr/bin/env python3
"""The torch / transformers side of scripts/gpu_check.sh (one subcommand per step; every
subcommand prints one JSON object on stdout).

  env                                  torch, transformers, CUDA and GPU as torch sees them
  model KIND DIR [--tiny]              a model folder with random weights: KIND smollm2
                                       (SmolLM2-135M's Llama shape) or qwen05 (Qwen2.5-0.5B's
                                       Qwen2 shape), the fixtures' tokenizer; --tiny: the same
                                       architecture at a few MB (the dry run)
  parity TABLE MODEL COLUMN            rlcr's log-probs in TABLE's COLUMN against transformers on
                                       the GPU (float32, TF32 off) and in float64 (the reference;
                                       on the GPU too: float64 has no faster mode)
  parity-bf16 TABLE MODEL COLUMN       rlcr's `--precision bf16` log-probs in TABLE's COLUMN (a
                                       bf16 checkpoint) against float64 on the same weights, and
                                       transformers under torch.autocast bf16 on the GPU beside
  train-table MODEL OUT ROWS LEN       a training table of ROWS rows of LEN tokens (64 context,
                                       LEN-64 response, random ids), behaviour log-probs from
                                       transformers, advantages +1/-1 by row
  torch-step MODEL TABLE PRECISION     the full `rlcr update` step in torch on the same rows: PPO
                                       clipped loss (token-mean), backward, global clipping 1.0,
                                       AdamW; PRECISION fp32 or bf16 (torch.autocast); median
                                       time of 3 steps after one warm-up, peak memory, and the
                                       mean token entropy of the first forward, with its float64
                                       value (the reference of rlcr's `update` entropy too)
  generate MODEL PROMPTS N NEW         transformers `generate`, N rows (PROMPTS distinct chat
                                       prompts), NEW new tokens, temperature 1, EOS ignored
  profile LOG COMPILE_LOG STEPS        cubecl's kernel profile of one rlcr run (one line a
                                       launch, `| duration | kernel`, every launch timed alone)
                                       and its compilation log: launches, GPU-busy time and
                                       kernels compiled, in all and per STEPS (decode steps or
                                       optimizer steps), and the kernels that took the most time
  table RESULTS.json                   the summary table of a results file

The device is CUDA when torch sees one, else the CPU (the dry run).
"""
import json
import os
import re
import shutil
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
QUESTIONS = [
    "What is 12 + 7?",
    "Name a prime number larger than 10.",
    "What is the capital of France?",
    "Count from one to five.",
]


def out(obj):
    json.dump(obj, sys.stdout)
    sys.stdout.write("\n")


def torch_setup():
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return torch, dev


def sync(torch, dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def cmd_env():
    torch, dev = torch_setup()
    import transformers

    r = {"torch": torch.__version__, "transformers": transformers.__version__,
         "torch_cuda": torch.version.cuda, "device": dev}
    if dev == "cuda":
        p = torch.cuda.get_device_properties(0)
        r.update(gpu=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gib=round(
            p.total_memory / 2**30, 1), multiprocessors=p.multi_processor_count)
    out(r)


SHAPES = {
    # SmolLM2-135M (HuggingFaceTB/SmolLM2-135M-Instruct config.json).
    "smollm2": dict(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
                    tie_word_embeddings=True),
    # Qwen2.5-0.5B (Qwen/Qwen2.5-0.5B-Instruct config.json).
    "qwen05": dict(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                   num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                   rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                   tie_word_embeddings=True),
}
TINY = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


def cmd_model(kind, path, tiny):
    torch, _ = torch_setup()
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = dict(SHAPES[kind])
    arch = shape.pop("arch")
    if tiny:
        shape.update(TINY)
    fixture = os.path.join(ROOT, "fixtures", "tiny-llama" if arch == "llama" else "tiny-qwen2")
    with open(os.path.join(fixture, "config.json")) as f:
        fcfg = json.load(f)
    # initializer_range 0.1 (not 0.02): logits with a spread (std ~2), not a flat distribution,
    # so that log-prob differences are tested where they matter.
    common = dict(initializer_range=0.1, bos_token_id=fcfg["bos_token_id"],
                  eos_token_id=fcfg["eos_token_id"], **shape)
    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common)).float()
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common)).float()
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "generation_config.json"):
        src = os.path.join(fixture, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(path, name))
    n = sum(p.numel() for p in model.parameters())
    out({"model": kind, "tiny": tiny, "parameters_m": round(n / 1e6, 1)})


def read_rows(table, columns):
    import pyarrow.parquet as pq

    return pq.read_table(table, columns=columns).to_pylist()


def row_logprobs(torch, model, ctx, resp, dev):
    """Log-prob of every response token given the context and the response before it."""
    ids = torch.tensor([ctx + resp], device=dev)
    logits = model(input_ids=ids).logits[0]
    lp = torch.log_softmax(logits[len(ctx) - 1:-1], dim=-1)
    return lp.gather(1, ids[0, len(ctx):, None])[:, 0].double().cpu().tolist()


def cmd_parity(table, model_dir, column):
    torch, dev = torch_setup()
    from transformers import AutoModelForCausalLM

    rows = read_rows(table, ["context_ids", "response_ids", column])
    rows = [r for r in rows if r["response_ids"]]
    ref_m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).to(dev).eval()
    gpu_m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
    worst = {"rlcr_vs_f64": 0.0, "hf_vs_f64": 0.0, "rlcr_vs_hf": 0.0}
    n = 0
    with torch.no_grad():
        for r in rows:
            ctx, resp, mine = r["context_ids"], r["response_ids"], r[column]
            ref = row_logprobs(torch, ref_m, ctx, resp, dev)
            hf = row_logprobs(torch, gpu_m, ctx, resp, dev)
            for a, b, c in zip(mine, ref, hf):
                worst["rlcr_vs_f64"] = max(worst["rlcr_vs_f64"], abs(a - b))
                worst["hf_vs_f64"] = max(worst["hf_vs_f64"], abs(c - b))
                worst["rlcr_vs_hf"] = max(worst["rlcr_vs_hf"], abs(a - c))
                n += 1
    out({"rows": len(rows), "tokens": n, "hf_device": dev, **worst})


def cmd_parity_bf16(table, model_dir, column):
    torch, dev = torch_setup()
    from transformers import AutoModelForCausalLM

    rows = read_rows(table, ["context_ids", "response_ids", column])
    rows = [r for r in rows if r["response_ids"]]
    ref_m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).to(dev).eval()
    ac_m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
    worst = {"rlcr_vs_f64": 0.0, "autocast_vs_f64": 0.0}
    n = 0
    with torch.no_grad():
        for r in rows:
            ctx, resp, mine = r["context_ids"], r["response_ids"], r[column]
            ref = row_logprobs(torch, ref_m, ctx, resp, dev)
            with torch.autocast(dev, dtype=torch.bfloat16):
                ac = row_logprobs(torch, ac_m, ctx, resp, dev)
            for a, b, c in zip(mine, ref, ac):
                worst["rlcr_vs_f64"] = max(worst["rlcr_vs_f64"], abs(a - b))
                worst["autocast_vs_f64"] = max(worst["autocast_vs_f64"], abs(c - b))
                n += 1
    out({"rows": len(rows), "tokens": n, "hf_device": dev, **worst})


def cmd_train_table(model_dir, path, rows, length):
    torch, dev = torch_setup()
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    ctx_len = 64
    data = {k: [] for k in ("sample_type", "context_ids", "response_ids", "response_logprobs",
                            "token_advantages", "loss_mask")}
    with torch.no_grad():
        for i in range(rows):
            ids = torch.randint(3, vocab, (length,), generator=g).tolist()
            ctx, resp = ids[:ctx_len], ids[ctx_len:]
            data["sample_type"].append("answer")
            data["context_ids"].append(ctx)
            data["response_ids"].append(resp)
            data["response_logprobs"].append(row_logprobs(torch, model, ctx, resp, dev))
            data["token_advantages"].append([1.0 if i % 2 == 0 else -1.0] * len(resp))
            data["loss_mask"].append([True] * len(resp))
    schema = pa.schema([
        ("sample_type", pa.string()),
        ("context_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_logprobs", pa.list_(pa.float32())),
        ("token_advantages", pa.list_(pa.float32())),
        ("loss_mask", pa.list_(pa.bool_())),
    ])
    pq.write_table(pa.table(data, schema=schema), path)
    out({"rows": rows, "tokens_per_row": length, "response_tokens": rows * (length - ctx_len)})


def cmd_torch_step(model_dir, table, precision):
    torch, dev = torch_setup()
    from transformers import AutoModelForCausalLM

    rows = read_rows(table, ["context_ids", "response_ids", "response_logprobs",
                             "token_advantages"])
    ids = torch.tensor([r["context_ids"] + r["response_ids"] for r in rows], device=dev)
    ctx = len(rows[0]["context_ids"])
    old = torch.tensor([r["response_logprobs"] for r in rows], device=dev)
    adv = torch.tensor([r["token_advantages"] for r in rows], device=dev)
    n_tok = adv.numel()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    cast = torch.autocast(dev, dtype=torch.bfloat16, enabled=precision == "bf16")

    def step():
        opt.zero_grad(set_to_none=True)
        with cast:
            logits = model(input_ids=ids).logits[:, ctx - 1:-1]
        lp_all = torch.log_softmax(logits.float(), dim=-1)
        lp = lp_all.gather(2, ids[:, ctx:, None])[..., 0]
        with torch.no_grad():
            entropy = -(lp_all.exp() * lp_all).sum(-1).mean().item()
        ratio = torch.exp(lp - old)
        pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
        loss = pg.sum() / n_tok
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return entropy

    entropy = step()  # warm-up; its entropy is that of the input model
    times = []
    for _ in range(3):
        sync(torch, dev)
        t0 = time.perf_counter()
        step()
        sync(torch, dev)
        times.append(time.perf_counter() - t0)
    r = {"precision": precision, "seconds": statistics.median(times),
         "tokens_per_s": n_tok / statistics.median(times), "entropy": entropy}
    if dev == "cuda":
        r["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        r["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    del model, opt
    if dev == "cuda":
        torch.cuda.empty_cache()
    # The same entropy in float64, row by row, the reference of both precisions (rlcr's too).
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).to(dev).eval()
    total = 0.0
    with torch.no_grad():
        for row in ids:
            lp_all = torch.log_softmax(ref(input_ids=row[None]).logits[0, ctx - 1:-1], dim=-1)
            total += -(lp_all.exp() * lp_all).sum(-1).sum().item()
    r["entropy_f64"] = total / n_tok
    r["entropy_err"] = abs(r["entropy"] - r["entropy_f64"])
    out(r)


def cmd_generate(model_dir, prompts, n, new):
    torch, dev = torch_setup()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
    texts = [
        tok.apply_chat_template([{"role": "user", "content": QUESTIONS[j % len(QUESTIONS)]}],
                                tokenize=False, add_generation_prompt=True)
        for j in range(prompts)
    ]
    texts = [texts[j % prompts] for j in range(n)]
    enc = tok(texts, return_tensors="pt", padding=True).to(dev)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
              min_new_tokens=new, pad_token_id=tok.pad_token_id)
    with torch.inference_mode():
        torch.manual_seed(0)
        model.generate(**enc, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
        sync(torch, dev)
        t0 = time.perf_counter()
        o = model.generate(**enc, **kw)
        sync(torch, dev)
        secs = time.perf_counter() - t0
    made = (o.shape[1] - enc["input_ids"].shape[1]) * n
    out({"rows": n, "new_tokens": new, "tokens": made, "seconds": secs,
         "tokens_per_s": made / secs})


UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def seconds(text):
    """`2.518908ms`, `132.797µs`, `1.2s` (Rust's `Duration` debug form) in seconds, or None."""
    m = re.fullmatch(r"([0-9.]+)(ns|µs|us|ms|s)", text.strip())
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def cmd_profile(log, compile_log, steps):
    by_kernel = {}
    launches, busy, unmeasured = 0, 0.0, 0
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = [p.strip() for p in line.strip().strip("|").split("|", 1)]
            if len(parts) != 2:
                continue
            launches += 1
            secs = seconds(parts[0])
            # A kernel's name without the hash of its compile-time settings: one entry for every
            # shape of the same operation.
            name = re.sub(r"_[0-9a-f]{6,}", "", parts[1])
            k = by_kernel.setdefault(name, [0, 0.0])
            k[0] += 1
            if secs is None:
                unmeasured += 1
            else:
                k[1] += secs
                busy += secs
    compiled = 0
    if os.path.exists(compile_log):
        with open(compile_log, encoding="utf-8", errors="replace") as f:
            compiled = sum(1 for line in f if "Compiling kernel" in line)
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1][1])[:15]
    out({"launches": launches, "busy_s": busy, "unmeasured": unmeasured, "compiled": compiled,
         "steps": steps, "launches_per_step": launches / max(steps, 1),
         "busy_ms_per_step": 1e3 * busy / max(steps, 1),
         "top": [{"kernel": n, "launches": c, "ms": round(1e3 * t, 3)} for n, (c, t) in top]})


def short(kernel):
    """A kernel name without cubecl's argument-type segments (`TensorArgs`, `DynamicScalar`, …)."""
    keep = [p.strip() for p in kernel.split("|")]
    keep = [p for p in keep if p and p not in ("TensorArgs", "DynamicScalar", "DynamicSize", "()")
            and not p.startswith("__")]
    return " ".join(keep)


def fmt(v, spec):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, spec)


def cmd_table(path):
    with open(path) as f:
        res = json.load(f)
    lines = []
    env = res.get("env", {})
    lines.append("gpu_check ({}): {}".format(res.get("mode", "?"), ", ".join(
        f"{k} {env[k]}" for k in ("gpu", "driver", "cuda", "nvcc", "torch", "transformers",
                                  "rlcr_device", "commit") if env.get(k))))
    lines.append(f"{'check':<52} {'rlcr':>10} {'reference':>10} {'goal':>14}  ok")
    for row in res.get("rows", []):
        lines.append("{:<52} {:>10} {:>10} {:>14}  {}".format(
            row["check"][:52], fmt(row.get("rlcr"), ".3g"), fmt(row.get("ref"), ".3g"),
            row.get("goal", ""), {True: "yes", False: "NO", None: "-"}[row.get("ok")]))
    for name, prof in res.get("profiles", {}).items():
        lines.append(f"profile {name}: {prof['launches']} launches ({prof['launches_per_step']:.0f}"
                     f" a step), GPU busy {prof['busy_ms_per_step']:.2f} ms a step,"
                     f" {prof['compiled']} kernels compiled; most time:")
        for k in prof.get("top", [])[:8]:
            lines.append(f"  {k['ms']:>10.2f} ms {k['launches']:>7}x  {short(k['kernel'])[:70]}")
    for err in res.get("errors", []):
        lines.append(f"error: {err}")
    print("\n".join(lines))


def main():
    a = sys.argv[1:]
    if not a:
        sys.exit(__doc__)
    c = a[0]
    if c == "env":
        cmd_env()
    elif c == "model" and len(a) >= 3:
        cmd_model(a[1], a[2], "--tiny" in a[3:])
    elif c == "parity" and len(a) == 4:
        cmd_parity(a[1], a[2], a[3])
    elif c == "parity-bf16" and len(a) == 4:
        cmd_parity_bf16(a[1], a[2], a[3])
    elif c == "train-table" and len(a) == 5:
        cmd_train_table(a[1], a[2], int(a[3]), int(a[4]))
    elif c == "torch-step" and len(a) == 4:
        cmd_torch_step(a[1], a[2], a[3])
    elif c == "generate" and len(a) == 5:
        cmd_generate(a[1], int(a[2]), int(a[3]), int(a[4]))
    elif c == "profile" and len(a) == 4:
        cmd_profile(a[1], a[2], int(a[3]))
    elif c == "table" and len(a) == 2:
        cmd_table(a[1])
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
