#!/usr/bin/env python3
"""Small datasets in the formats TRL and verl users keep on disk, for `rlcr prepare --input`.

Writes fixtures/data/ (committed; rerun to regenerate):
  trl-standard.parquet          TRL standard format: `prompt` text, `solution`, `level` (int)
  trl-conversational.jsonl      TRL conversational format: `prompt` as messages, `solution`
  verl.parquet                  verl's format: data_source, prompt list<struct<role, content>>,
                                ability, reward_model struct<style, ground_truth>,
                                extra_info struct<split, index, answer>
  gsm/train-0000{0,1}-of-00002.parquet   a sharded `question`/`answer` dataset (glob, template)
  gsm/test.json                 the same columns as a JSON array of records
  columns.json                  a JSON object of column lists (`datasets`' to_dict)
  expected.json                 for every case, the prompt rows rlcr must write, computed here
                                from the rows above (the mapping rules of `rlcr prepare --help`)
"""
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "data")


def gsm_rows(n, offset):
    rows = []
    for i in range(n):
        a, b = 3 + i + offset, 4 + 2 * i
        rows.append({"question": f"Tom has {a} apples and buys {b} more. How many apples?",
                     "answer": str(a + b)})
    return rows


def main():
    os.makedirs(os.path.join(OUT, "gsm"), exist_ok=True)
    expected = {}

    # TRL standard: prompt text.
    std = [{"prompt": f"What is {i} + {i + 1}?", "solution": str(2 * i + 1), "level": i % 3}
           for i in range(5)]
    pq.write_table(pa.Table.from_pylist(std), os.path.join(OUT, "trl-standard.parquet"))
    expected["trl-standard"] = [
        {"prompt_id": f"parquet-{n:06d}", "messages": [{"role": "user", "content": r["prompt"]}],
         "data_source": "parquet", "ground_truth": r["solution"],
         "extra_info": {"solution": r["solution"], "level": r["level"]}}
        for n, r in enumerate(std)]

    # TRL conversational: prompt as messages (a system turn on some rows).
    conv = []
    for i in range(4):
        msgs = [{"role": "user", "content": f"Name the capital of country #{i}."}]
        if i % 2:
            msgs.insert(0, {"role": "system", "content": "Answer briefly."})
        conv.append({"prompt": msgs, "solution": f"City{i}"})
    with open(os.path.join(OUT, "trl-conversational.jsonl"), "w") as f:
        for r in conv:
            f.write(json.dumps(r) + "\n")
    expected["trl-conversational"] = [
        {"prompt_id": f"jsonl-{n + 1:06d}", "messages": r["prompt"], "data_source": "jsonl",
         "ground_truth": r["solution"], "extra_info": {"solution": r["solution"]}}
        for n, r in enumerate(conv)]

    # verl: nested Parquet.
    verl = []
    for i in range(4):
        q = f"What is {i} * 7?"
        verl.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": q + " Let's think step by step."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(7 * i)},
            "extra_info": {"split": "train", "index": 10 + i, "answer": f"#### {7 * i}"},
        })
    pq.write_table(pa.Table.from_pylist(verl), os.path.join(OUT, "verl.parquet"))
    expected["verl"] = [
        {"prompt_id": f"openai/gsm8k-train-{r['extra_info']['index']}", "messages": r["prompt"],
         "data_source": "openai/gsm8k", "ground_truth": r["reward_model"]["ground_truth"],
         "extra_info": {**r["extra_info"], "data_source": r["data_source"], "ability": r["ability"],
                        "reward_model": r["reward_model"]}}
        for r in verl]

    # gsm: two shards + a JSON array; the prompt from a template, the label from `answer`.
    shards = [gsm_rows(3, 0), gsm_rows(2, 100)]
    for k, rows in enumerate(shards):
        pq.write_table(pa.Table.from_pylist(rows),
                       os.path.join(OUT, "gsm", f"train-{k:05d}-of-00002.parquet"))
    template = "{question}\n\nPut the final answer in <answer></answer>."
    exp = []
    for k, rows in enumerate(shards):
        for n, r in enumerate(rows):
            exp.append({"prompt_id": f"gsm-train-{k:05d}-of-00002-{n:06d}",
                        "messages": [{"role": "user", "content": template.format(**r)}],
                        "data_source": "gsm", "ground_truth": r["answer"], "extra_info": r})
    expected["gsm-train"] = exp
    test = gsm_rows(3, 50)
    with open(os.path.join(OUT, "gsm", "test.json"), "w") as f:
        json.dump(test, f, indent=1)
    expected["gsm-test"] = [
        {"prompt_id": f"gsm-{n:06d}",
         "messages": [{"role": "user", "content": template.format(**r)}],
         "data_source": "gsm", "ground_truth": r["answer"], "extra_info": r}
        for n, r in enumerate(test)]

    # JSON object of column lists; the prompt column (`--prompt-key question`) stays out of extra_info.
    cols = {"question": ["2+2?", "3+3?"], "label": [4, 6]}
    with open(os.path.join(OUT, "columns.json"), "w") as f:
        json.dump(cols, f)
    expected["columns"] = [
        {"prompt_id": f"json-{n:06d}", "messages": [{"role": "user", "content": q}],
         "data_source": "json", "ground_truth": l, "extra_info": {"label": l}}
        for n, (q, l) in enumerate(zip(cols["question"], cols["label"]))]

    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
