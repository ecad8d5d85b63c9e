#!/usr/bin/env python3
"""Hugging Face transformers reference figures for rlcr's BENCHMARKS.md (CPU, fp32).

Runs the same workloads as rlcr's harnesses, with torch limited to THREADS threads (default 2):

  sample MODEL_DIR B NEW   sampling: B rows (B/8 distinct chat prompts, EOS ignored) x NEW new
                           tokens, temperature 1, no top-k/top-p (examples/bench_sample.rs)
  train B LEN [REPS [PRECISIONS [MODEL [MICRO]]]]
                           forward + backward of the causal-LM loss on a 38.9M-parameter Qwen2
                           config (hidden 512, 8 layers, 8 heads, 2 KV heads, FFN 1408, vocab
                           32000, tied), random weights, B rows x LEN tokens
                           (examples/bench_train.rs; RESULT train_*), then the full step with
                           global clipping and AdamW (RESULT step_*); PRECISIONS is a comma list
                           of fp32 (default) and bf16 (torch.autocast bf16, names end in _bf16);
                           MODEL qwen39m (default) or smollm2 (SmolLM2-135M's Llama shape, random
                           weights; names train_smollm2_*), MICRO rows per micro-batch (gradient
                           accumulation, default B); prints the peak RSS as RESULT rss_* (MiB)

  update NAME MODEL_DIR TABLE MICRO [REPS]
                           `rlcr update`'s step on the same folder and training table
                           (scripts/bench_models.py): the PPO clipped token loss (clip 0.2, dual
                           clip 3, token mean over the learnable tokens) of every row's response
                           tokens, gradients accumulated over micro-batches of MICRO rows,
                           global-norm clip 1 and AdamW (rlcr's defaults), a warm-up step first;
                           RESULT update_NAME counts every position of the rows (context +
                           response), as train_* does

  gemm                     the matrix products of that forward + backward, each alone
                           (examples/bench_gemm.rs): GFLOP/s instead of tokens/s

Each measurement prints one line `RESULT <name> <tokens/s> <tokens per CPU-second>` (after a
warm-up run); scripts/bench.sh collects them.

  python scripts/bench_transformers.py sample /tmp/smollm2-hf 8 128 [REPS]
  python scripts/bench_transformers.py train 8 256 [REPS] [fp32,bf16]
  python scripts/bench_transformers.py update qwen39m /tmp/rlcr-bench/qwen39m TABLE 8 [REPS]
  python scripts/bench_transformers.py gemm [REPS]

Needs torch and transformers (measured with torch 2.15 / transformers 5.23).
"""
import os
import sys
import time

THREADS = int(os.environ.get("THREADS", "2"))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

import torch  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()
torch.set_num_threads(THREADS)
torch.set_num_interop_threads(1)

QUESTIONS = [
    "What is 12 + 7?",
    "Name a prime number larger than 10.",
    "What is the capital of France?",
    "Count from one to five.",
]


def clocks():
    return time.perf_counter(), time.process_time()


def report(name, tokens, t0, c0):
    t1, c1 = clocks()
    wall, cpu = t1 - t0, c1 - c0
    print(
        f"RESULT {name} {tokens / wall:.2f} {tokens / cpu:.2f}"
        f"   # {tokens} tokens, {wall:.2f} s wall, {cpu:.2f} s CPU",
        flush=True,
    )


def sample(model_dir, batch, new, reps):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    # As many distinct prompts as rlcr's bench_sample uses (PROMPTS = BATCH by default).
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[j % len(QUESTIONS)]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for j in range(batch)
    ]
    enc = tok(texts, return_tensors="pt", padding=True)
    kw = dict(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new,
        min_new_tokens=new,  # ignore EOS: every row makes exactly NEW tokens
        pad_token_id=tok.pad_token_id,
    )
    with torch.inference_mode():
        torch.manual_seed(0)
        model.generate(**enc, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
        for _ in range(reps):
            t0, c0 = clocks()
            out = model.generate(**enc, **kw)
            made = (out.shape[1] - enc["input_ids"].shape[1]) * batch
            report(f"sample_b{batch}_n{new}", made, t0, c0)


def train(batch, length, reps, precisions=("fp32",), which="qwen39m", micro=None):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if which == "smollm2":
        cfg = LlamaConfig(
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
        )
        arch, tag = LlamaForCausalLM, "_smollm2"
    else:
        cfg = Qwen2Config(
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
        )
        arch, tag = Qwen2ForCausalLM, ""
    torch.manual_seed(0)
    model = arch(cfg).float()
    model.train()
    n = sum(p.numel() for p in model.parameters())
    print(f"# {which}: {n / 1e6:.1f}M parameters", flush=True)
    ids = (
        torch.arange(batch)[:, None] * 7919 + torch.arange(length)[None, :] * 104729
    ) % cfg.vocab_size
    micro = micro or batch

    def fwd_bwd(ctx):
        # Gradient accumulation over micro-batches (the same loss as one batch of equal rows).
        for s in range(0, batch, micro):
            part = ids[s:s + micro]
            with ctx:
                loss = model(input_ids=part, labels=part).loss * (part.shape[0] / batch)
            loss.backward()

    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for precision in precisions:
        suffix = "" if precision == "fp32" else "_bf16"
        name = f"b{batch}_l{length}{suffix}"
        ctx = (
            torch.autocast("cpu", dtype=torch.bfloat16)
            if precision == "bf16"
            else torch.autocast("cpu", enabled=False)
        )
        for rep in range(reps + 1):
            model.zero_grad(set_to_none=True)
            t0, c0 = clocks()
            fwd_bwd(ctx)
            if rep > 0:  # the first run is the warm-up
                report(f"train{tag}_{name}", batch * length, t0, c0)
        for rep in range(reps):  # warm already (the loop above)
            t0, c0 = clocks()
            model.zero_grad(set_to_none=True)
            fwd_bwd(ctx)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            report(f"step{tag}_{name}", batch * length, t0, c0)
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"RESULT rss{tag}_b{batch}_l{length} {rss:.0f} {rss:.0f}", flush=True)


def update(model_dir, table, micro, reps, name):
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM

    t = pq.read_table(table, columns=["context_ids", "response_ids", "response_logprobs",
                                      "token_advantages", "loss_mask"]).to_pylist()
    lens = {(len(r["context_ids"]), len(r["response_ids"])) for r in t}
    if len(lens) != 1:
        sys.exit(f"{table}: rows of different lengths {sorted(lens)}; this harness pads nothing")
    ctx, resp = lens.pop()
    ids = torch.tensor([r["context_ids"] + r["response_ids"] for r in t])
    old = torch.tensor([r["response_logprobs"] for r in t])
    adv = torch.tensor([r["token_advantages"] for r in t])
    mask = torch.tensor([r["loss_mask"] for r in t], dtype=torch.float32)
    n_tok = mask.sum()
    batch = ids.shape[0]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        for s in range(0, batch, micro):
            part = slice(s, s + micro)
            logits = model(input_ids=ids[part]).logits[:, ctx - 1:-1]
            lp = torch.log_softmax(logits.float(), dim=-1).gather(2, ids[part, ctx:, None])[..., 0]
            a = adv[part]
            ratio = torch.exp(lp - old[part])
            pg = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
            pg = torch.where(a < 0, torch.minimum(pg, -a * 3.0), pg)  # dual clip
            loss = (pg * mask[part]).sum() / n_tok
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()  # warm-up
    for _ in range(reps):
        t0, c0 = clocks()
        step()
        report(f"update_{name}", batch * (ctx + resp), t0, c0)
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"RESULT rss_update_{name} {rss:.0f} {rss:.0f}", flush=True)


def gemm(reps):
    n = 8 * 256
    shapes = [("qkv", 512, 768, 8), ("o", 512, 512, 8), ("gate_up", 512, 2816, 8),
              ("down", 1408, 512, 8), ("lm_head", 512, 32000, 1)]
    tf = tw = tc = 0.0
    for name, i, o, uses in shapes:
        x, w, dy = torch.randn(n, i), torch.randn(i, o), torch.randn(n, o)
        flop = 2.0 * n * i * o
        for kind, f in [("fwd", lambda: x @ w), ("dx", lambda: dy @ w.t()),
                        ("dw", lambda: x.t() @ dy)]:
            f()
            t0, c0 = clocks()
            for _ in range(reps):
                f()
            t1, c1 = clocks()
            wall, cpu = (t1 - t0) / reps, (c1 - c0) / reps
            print(f"RESULT gemm_{name}_{kind} {flop / wall * 1e-9:.2f} {flop / cpu * 1e-9:.2f}"
                  f"   # [{n}x{i}x{o}] {wall * 1e3:.1f} ms wall {cpu * 1e3:.1f} ms cpu", flush=True)
            tf, tw, tc = tf + flop * uses, tw + wall * uses, tc + cpu * uses
    print(f"RESULT gemm_all_fwd_bwd {tf / tw * 1e-9:.2f} {tf / tc * 1e-9:.2f}"
          f"   # {tf * 1e-9:.0f} GFLOP, {tw:.2f} s wall, {tc:.2f} s cpu", flush=True)


def main():
    a = sys.argv[1:]
    print(
        f"# torch {torch.__version__}, transformers {transformers.__version__}, "
        f"threads {torch.get_num_threads()}",
        flush=True,
    )
    if a and a[0] == "sample" and len(a) >= 4:
        sample(a[1], int(a[2]), int(a[3]), int(a[4]) if len(a) > 4 else 3)
    elif a and a[0] == "train" and len(a) >= 3:
        prec = tuple(a[4].split(",")) if len(a) > 4 else ("fp32",)
        which = a[5] if len(a) > 5 else "qwen39m"
        micro = int(a[6]) if len(a) > 6 else None
        train(int(a[1]), int(a[2]), int(a[3]) if len(a) > 3 else 3, prec, which, micro)
    elif a and a[0] == "update" and len(a) >= 5:
        update(a[2], a[3], int(a[4]), int(a[5]) if len(a) > 5 else 1, a[1])
    elif a and a[0] == "gemm":
        with torch.no_grad():
            gemm(int(a[1]) if len(a) > 1 else 3)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
