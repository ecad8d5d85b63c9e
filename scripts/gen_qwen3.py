#!/usr/bin/env python3
"""Make a random-weight Qwen3 checkpoint with transformers and its reference figures (float64).

    python3 scripts/gen_qwen3.py tiny OUT_MODEL_DIR OUT_REFS_DIR   # fixtures/tiny-qwen3 (committed)
    python3 scripts/gen_qwen3.py real OUT_MODEL_DIR OUT_REFS_DIR   # Qwen3-0.6B's head shapes

Shapes (both 2 layers, vocab 384, the tokenizer of `fixtures/tiny-qwen2`):
- `tiny`: hidden 64, 4 query heads and 2 KV heads of head_dim 32 (4·32 = 128 ≠ 64), intermediate
  128, untied LM head. About 0.6 MB, committed as `fixtures/tiny-qwen3`.
- `real`: Qwen3-0.6B's attention: hidden 1024, 16 query heads and 8 KV heads of head_dim 128
  (16·128 = 2048 ≠ 1024), intermediate 256, tied embeddings. About 60 MB, so the test generates
  it in a temporary folder instead of committing it.

Weights: transformers' own initialisation (normal, std 0.02) from `torch.manual_seed(SEED)`, then
every RMSNorm gain (the q/k head norms included) set to `1 + 0.2·N(0,1)` so that a forgotten or
misplaced norm changes the numbers. The chat template is a Qwen3-style template (`enable_thinking`
switch, `<think>` handling of earlier assistant turns) in `tokenizer_config.json`.

References, written to OUT_REFS_DIR as NAME.rand.f64.json, NAME.chat.f64.json,
NAME.update.f64.json and NAME.update_grad.safetensors (NAME = `tiny-qwen3` or `real-qwen3`), all
with the model in float64, every sequence alone and unpadded (layout of fixtures/refs/README.md):
- `rand`: four random id sequences (lengths 64, 40, 57, 23): `logprobs[t] = log p(ids[t+1] |
  ids[..=t])`, `greedy_next`, `entropy`, `logsumexp` per position, `last_logits_head` (16 logits).
- `chat`: conversations rendered by `apply_chat_template(..., add_generation_prompt=True,
  **kwargs)` with `kwargs` recorded per entry (`enable_thinking` false, true and absent; a
  multi-turn conversation whose earlier assistant turn has a `<think>` block): `messages`,
  `kwargs`, `rendered`, `input_ids` and the figures above.
- `update`: the gradient of the policy-gradient loss of an update at ratio 1 with token-mean
  aggregation, `L = -(1/N) Σ_rows Σ_t A_t · log p(response_t | ...)` over N response tokens,
  for rows `{context, response, advantages}` cut from the `rand` sequences; the gradient of every
  parameter, by its Hugging Face name and in its layout, in `NAME.update_grad.safetensors`
  (float32, rounded once from float64), and `loss`.

Exit codes: 0 success, 2 usage, 3 torch/transformers not importable (the test treats 3 as
"skipped" unless RLCR_REQUIRE_TORCH=1).
"""
import json
import math
import pathlib
import shutil
import sys

try:
    import torch
    import transformers
    from safetensors.torch import save_file
except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
    print(f"torch/transformers/safetensors not importable: {e}", file=sys.stderr)
    sys.exit(3)

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "fixtures" / "tiny-qwen2"

QWEN3_TEMPLATE = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

SHAPES = {
    "tiny": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 intermediate_size=128, tie_word_embeddings=False, seed=3),
    "real": dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=256, tie_word_embeddings=True, seed=4),
}


def make_model(shape, out):
    s = dict(SHAPES[shape])
    seed = s.pop("seed")
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(
        vocab_size=384, num_hidden_layers=2, rms_norm_eps=1e-6, max_position_embeddings=2048,
        rope_theta=1e6, bos_token_id=0, eos_token_id=2, pad_token_id=None, attention_bias=False,
        use_sliding_window=False, sliding_window=None, **s)
    m = transformers.Qwen3ForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    m.save_pretrained(out)
    for f in ("tokenizer.json", "generation_config.json"):
        shutil.copy(TOKENIZER / f, out / f)
    tc = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
    tc["chat_template"] = QWEN3_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")
    stray = out / "chat_template.jinja"
    if stray.exists():
        stray.unlink()
    return m


def figures(model, ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    lse = torch.logsumexp(logits, dim=-1)
    lp = logits - lse[:, None]
    ent = -(lp.exp() * lp).sum(-1)
    return {
        "input_ids": ids,
        "logprobs": [float(lp[t, ids[t + 1]]) for t in range(len(ids) - 1)],
        "greedy_next": [int(x) for x in logits.argmax(-1)],
        "entropy": [float(x) for x in ent],
        "logsumexp": [float(x) for x in lse],
        "last_logits_head": [float(x) for x in logits[-1, :16]],
    }


def rand_seqs():
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, 360, (n,), generator=g).tolist() for n in (64, 40, 57, 23)]


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in SHAPES:
        print(__doc__, file=sys.stderr)
        return 2
    shape, out, refs = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    name = f"{shape}-qwen3"
    out.mkdir(parents=True, exist_ok=True)
    refs.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    make_model(shape, out)
    m = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)
    m.train(False)
    meta = {"torch": torch.__version__, "transformers": transformers.__version__,
            "dtype": "float64", "shape": shape}

    seqs = rand_seqs()
    rand = dict(meta, sequences=[figures(m, s) for s in seqs])
    (refs / f"{name}.rand.f64.json").write_text(json.dumps(rand) + "\n")

    tok = transformers.AutoTokenizer.from_pretrained(out)
    prompts = (ROOT / "fixtures" / "refs" / "prompts.txt").read_text().splitlines()
    convs = []
    for p in prompts:
        for kw in ({"enable_thinking": False}, {"enable_thinking": True}, {}):
            convs.append(([{"role": "user", "content": p}], kw))
    multi = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": prompts[0]},
        {"role": "assistant", "content": "<think>\n12 plus 7\n</think>\n\n<answer>19</answer>"},
        {"role": "user", "content": prompts[1]},
    ]
    convs.append((multi, {"enable_thinking": False}))
    convs.append((multi, {}))
    chat = []
    for msgs, kw in convs:
        rendered = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **kw)
        ids = tok(rendered, add_special_tokens=False)["input_ids"]
        chat.append(dict(figures(m, ids), messages=msgs, kwargs=kw, rendered=rendered))
    (refs / f"{name}.chat.f64.json").write_text(json.dumps(dict(meta, sequences=chat)) + "\n")

    # The update's gradient: rows cut from the random sequences, advantages a fixed pattern.
    rows = []
    for j, s in enumerate(seqs):
        cut = 5 + 4 * j
        resp = s[cut:]
        adv = [round(math.sin(1.7 * t + j), 4) for t in range(len(resp))]
        rows.append({"context": s[:cut], "response": resp, "advantages": adv})
    n_tokens = sum(len(r["response"]) for r in rows)
    m.zero_grad(set_to_none=True)
    total = torch.zeros((), dtype=torch.float64)
    for r in rows:
        ids = r["context"] + r["response"]
        logits = m(input_ids=torch.tensor([ids])).logits[0]
        lp = torch.log_softmax(logits, dim=-1)
        c = len(r["context"])
        picked = lp[c - 1:len(ids) - 1].gather(1, torch.tensor(r["response"])[:, None])[:, 0]
        loss = -(picked * torch.tensor(r["advantages"], dtype=torch.float64)).sum() / n_tokens
        loss.backward()
        total += loss.detach()
    grads = {n: p.grad.float().contiguous() for n, p in m.named_parameters()}
    save_file(grads, str(refs / f"{name}.update_grad.safetensors"))
    for f in list(out.iterdir()) + list(refs.glob(f"{name}.*")):
        f.chmod(0o644)
    upd = dict(meta, rows=rows, loss=float(total), tokens=n_tokens,
               grad_norm=math.sqrt(sum(float(p.grad.pow(2).sum()) for p in m.parameters())))
    (refs / f"{name}.update.f64.json").write_text(json.dumps(upd) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
