#!/usr/bin/env python3
"""Reference speed: TinyZero's countdown `compute_score` semantics in Python, on a bench table.

usage: bench_tinyzero_python.py TABLE.parquet [ROWS]

Scores the table's responses (after a TinyZero base prompt) with a re-implementation of
`compute_score` written from TinyZero's published rules (docs/math.md §1.1) (the functions of gen_countdown_fixtures.py, with
`eval`), no Parquet writing, and prints rows per CPU-second and the mean score (compare with
`rlcr score --countdown-compat tinyzero --reward-preset tinyzero`). Needs pyarrow.
"""
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

here = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("g", here / "gen_countdown_fixtures.py")
g = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g)

PREFIX = "User: ... Assistant: Let me solve this step by step.\n<think>"


def compute_score(s, gt):
    eq = g.extract_solution(s)
    if eq is None:
        return 0
    if not g.validate(eq, gt["numbers"]):
        return 0.1
    try:
        if not re.match(r"^[\d+\-*/().\s]+$", eq):
            return 0.1
        v = eval(eq, {"__builtins__": None}, {})
        return 1.0 if abs(v - gt["target"]) < 1e-5 else 0.1
    except Exception:
        return 0.1


def main():
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else None
    t = pq.read_table(sys.argv[1], columns=["response_text", "ground_truth"])
    if rows:
        t = t.slice(0, rows)
    resp = t.column("response_text").to_pylist()
    gts = [json.loads(x) for x in t.column("ground_truth").to_pylist()]
    c0 = time.process_time()
    scores = [compute_score(PREFIX + r, gt) for r, gt in zip(resp, gts)]
    c = time.process_time() - c0
    print(f"{len(scores)} rows, {c:.2f} CPU s: {len(scores) / c:,.0f} rows per CPU-second; "
          f"mean score {sum(scores) / len(scores):.6f}")


if __name__ == "__main__":
    main()
