#!/usr/bin/env python3
"""Write the fixtures of `rlcr import` (fixtures/import/), in the formats the tools write.

    python3 scripts/import_fixtures.py fixtures/tiny-qwen2 fixtures/import

- verl/1.jsonl, verl/2.jsonl: `trainer.rollout_data_dir` dumps of two steps of a countdown run
  (RayPPOTrainer._dump_generations: input, output, gts, score, step; input and output decoded
  with skip_special_tokens=True, so the chat template's <|im_start|>/<|im_end|> are gone), two
  rollouts per prompt in RLCR's one-completion format
  (`</think> <answer> <analysis> <confidence>`), TinyZero's countdown score (1 / 0.1 / 0).
- trl/completions_4_f3b1c9e2a7d05e61.table.json: the `completions` table GRPOTrainer logs with
  log_completions=True, as W&B stores it (step as a string, the prompt rendered with the chat
  template, one column per reward function, advantage); no labels, as TRL logs none.
- trl/completions-with-labels.jsonl: the same rows as JSON lines with the dataset's labels
  joined as a `ground_truth` column; trl/completions_00004.parquet: the same rows as the Parquet
  file TRL writes beside the logged table (`completions/completions_{step:05d}.parquet`).
- openai-chat.jsonl: {"request", "response"} lines of chat completions from an OpenAI-compatible
  server (vLLM) with logprobs=True: two answers per question (n=2), then a confidence request per
  answer (the answer as the assistant message, a user message asking how sure it is); one
  request failed. Log-probs tokens are the model tokenizer's, with their bytes.

The texts are fixed below; only the log-prob tokens come from the tokenizer, so the file is the
same on every run.
"""

import json
import os
import sys

from tokenizers import Tokenizer

SYSTEM = "You are a helpful assistant."
COUNTDOWN = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in "
    "<think> </think> tags. And return the final answer in <answer> </answer> tags, for example "
    "<answer> (1 + 2) / 3 </answer>. Then analyse your answer in <analysis> </analysis> tags and "
    "state how sure you are, a number between 0 and 1, in <confidence> </confidence> tags."
)

# (step, numbers, target, [(completion, score)]) -- score: TinyZero's countdown 1 / 0.1 / 0.
VERL = [
    (1, [3, 5], 8, [
        (" 3 + 5 = 8.</think> <answer>3 + 5</answer> <analysis>Both numbers used once, the sum is 8.</analysis> <confidence>0.9</confidence>", 1.0),
        (" 5 - 3 = 2, no. 5 + 3.</think> <answer>5 - 3</answer> <analysis>I may have mixed up the operation.</analysis> <confidence>0.6</confidence>", 0.1),
    ]),
    (1, [4, 6], 24, [
        (" 4 * 6 = 24.</think> <answer>4 * 6</answer> <analysis>The product is 24.</analysis> <confidence>0.7</confidence>", 1.0),
        (" 6 + 4 = 10.</think> <answer>6 + 4</answer> <analysis>That gives 10, not 24.</analysis> <confidence>0.8</confidence>", 0.1),
    ]),
    (2, [2, 7], 14, [
        (" 2 * 7 = 14.</think> <answer>2 * 7</answer> <analysis>Correct product.</analysis> <confidence>0.95</confidence>", 1.0),
        (" 7 * 2 = 14.</think> <answer>7 * 2</answer> <analysis>Same product.</analysis> <confidence>0.85</confidence>", 1.0),
    ]),
    (2, [9, 3], 3, [
        (" 9 / 3 = 3.</think> <answer>9 / 3</answer> <analysis>Division gives 3.</analysis> <confidence>0.6</confidence>", 1.0),
        (" 9 - 3 = 6. Maybe 9 - 3 - 3, but 3 is used twice", 0.0),
    ]),
]

QUESTIONS = [("What is 7 + 5?", "12"), ("What is 9 * 3?", "27")]
ANSWERS = {
    "What is 7 + 5?": [
        "<think>7 plus 5 is 12.</think> <answer>12</answer>",
        "<think>7 plus 5 is 13.</think> <answer>13</answer>",
    ],
    "What is 9 * 3?": [
        "<think>9 times 3 is 27.</think> <answer>27</answer>",
        "<think>9 times 3 is 27.</think> <answer>27</answer> ",
    ],
}
CONFIDENCES = [
    "<analysis>Simple addition.</analysis> <confidence>0.9</confidence>",
    "<analysis>I added one too many.</analysis> <confidence>0.4</confidence>",
    "<analysis>Known product.</analysis> <confidence>0.8</confidence>",
    "<analysis>Same product as before.</analysis> <confidence>0.7</confidence>",
]
RLCR_SYSTEM = (
    "A conversation between User and Assistant. The assistant first thinks about the question in "
    "<think> </think> tags and then answers in <answer> </answer> tags."
)
QUERY = (
    "How confident are you that your answer is correct? Analyse it in <analysis> </analysis> "
    "tags, then give a number between 0 and 1 in <confidence> </confidence> tags."
)


def render(messages):
    """The tiny Qwen2 fixture's chat template (Qwen's ChatML), generation prompt added."""
    out = ""
    if messages[0]["role"] != "system":
        out += f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    for m in messages:
        out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


def logprobs(tok, text, seed):
    """vLLM's chat `logprobs.content` for `text` as the tokenizer splits it."""
    ids = tok.encode(text, add_special_tokens=False).ids
    content = []
    for i, t in enumerate(ids):
        piece = tok.decode([t], skip_special_tokens=False)
        lp = -round(0.02 + ((seed * 31 + i * 17) % 97) / 60.0, 4)
        content.append({"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []})
    assert "".join(c["token"] for c in content) == text, text
    return {"content": content}


def main():
    model, out = sys.argv[1], sys.argv[2]
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    os.makedirs(os.path.join(out, "verl"), exist_ok=True)
    os.makedirs(os.path.join(out, "trl"), exist_ok=True)

    steps = {}
    for step, nums, target, rollouts in VERL:
        prompt = COUNTDOWN.format(nums=nums, target=target)
        # skip_special_tokens=True drops <|im_start|> and <|im_end|>; the prefill stays.
        text = f"system\n{SYSTEM}\nuser\n{prompt}\nassistant\nLet me solve this step by step.\n<think>"
        for completion, score in rollouts:
            steps.setdefault(step, []).append({
                "input": text,
                "output": completion,
                "gts": {"target": target, "numbers": nums},
                "score": score,
                "step": step,
            })
    for step, lines in steps.items():
        with open(os.path.join(out, "verl", f"{step}.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n")

    # TRL: the rows of one logging step, prompts rendered with the chat template.
    columns = ["step", "prompt", "completion", "format_reward", "accuracy_reward", "advantage"]
    rows, labelled = [], []
    for _, nums, target, rollouts in VERL[:2]:
        prompt = render([{"role": "user", "content": COUNTDOWN.format(nums=nums, target=target)}])
        prompt += "Let me solve this step by step.\n<think>"
        rewards = [s for _, s in rollouts]
        mean = sum(1.0 if s == 1.0 else 0.0 for s in rewards) / len(rewards)
        for completion, score in rollouts:
            acc = 1.0 if score == 1.0 else 0.0
            row = ["4", prompt, completion, 1.0, acc, round(acc - mean, 4)]
            rows.append(row)
            d = dict(zip(columns, row))
            d["ground_truth"] = {"target": target, "numbers": nums}
            labelled.append(d)
    table = {
        "_type": "table",
        "columns": columns,
        "data": rows,
        "ncols": len(columns),
        "nrows": len(rows),
    }
    with open(os.path.join(out, "trl", "completions_4_f3b1c9e2a7d05e61.table.json"), "w") as f:
        json.dump(table, f)
    with open(os.path.join(out, "trl", "completions-with-labels.jsonl"), "w") as f:
        f.write("\n".join(json.dumps(x) for x in labelled) + "\n")
    # The Parquet file TRL writes beside the logged table (pandas' to_parquet goes through
    # pyarrow: int64, string, double, and a struct for the joined labels; step an integer).
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pa.Table.from_pylist([{**x, "step": int(x["step"])} for x in labelled])
    pq.write_table(t, os.path.join(out, "trl", "completions_00004.parquet"))

    # OpenAI chat completions, two turns.
    lines = []
    n = 0
    conf = iter(CONFIDENCES)
    for q, gold in QUESTIONS:
        messages = [{"role": "system", "content": RLCR_SYSTEM}, {"role": "user", "content": q}]
        choices = []
        for i, a in enumerate(ANSWERS[q]):
            choices.append({
                "index": i,
                "message": {"role": "assistant", "content": a, "tool_calls": []},
                "logprobs": logprobs(tok, a, n * 7 + i),
                "finish_reason": "stop",
                "stop_reason": None,
            })
        n += 1
        lines.append({
            "request": {"model": "tiny-qwen2", "messages": messages, "n": 2, "temperature": 1.0,
                        "max_tokens": 64, "logprobs": True, "metadata": {"data_source": "arith"}},
            "response": {"id": f"chatcmpl-{n:04d}", "object": "chat.completion", "created": 1733300000 + n,
                         "model": "tiny-qwen2", "choices": choices,
                         "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}},
            "ground_truth": gold,
        })
        for a in ANSWERS[q]:
            c = next(conf)
            n += 1
            lines.append({
                "request": {"model": "tiny-qwen2", "messages": messages + [
                    {"role": "assistant", "content": a}, {"role": "user", "content": QUERY}],
                    "n": 1, "temperature": 1.0, "max_tokens": 64, "logprobs": True,
                    "metadata": {"data_source": "arith"}},
                "response": {"id": f"chatcmpl-{n:04d}", "object": "chat.completion", "created": 1733300000 + n,
                             "model": "tiny-qwen2", "choices": [{
                                 "index": 0, "message": {"role": "assistant", "content": c, "tool_calls": []},
                                 "logprobs": logprobs(tok, c, n), "finish_reason": "stop", "stop_reason": None}],
                             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}},
                "ground_truth": gold,
            })
    lines.append({
        "request": {"model": "tiny-qwen2", "messages": [{"role": "user", "content": "What is 2 + 2?"}]},
        "response": None,
        "error": {"object": "error", "message": "The model `tiny-qwen2` does not exist.",
                  "type": "NotFoundError", "code": 404},
    })
    with open(os.path.join(out, "openai-chat.jsonl"), "w") as f:
        f.write("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n")


if __name__ == "__main__":
    main()
