#!/usr/bin/env python3
"""Per-iteration figures of the multi-turn loop (scripts/multiturn.mk), standard library only.

  python3 scripts/multiturn_curve.py RLCR runs/multiturn/iter-*/scored.parquet

reads each iteration's scored table and its rollouts table through `rlcr inspect` (the
`rlcr.multiturn_summary` metadata that generate-multiturn writes, and the column summaries) and
prints a TSV: iteration, mean turn reward, exact match, mean reward, turns per rollout, rollouts
ended by the environment, observation tokens, generation seconds.
"""
import json
import os
import re
import subprocess
import sys


def inspect(rlcr, path):
    return subprocess.run([rlcr, "inspect", path], check=True, capture_output=True, text=True).stdout


def column_mean(text, name):
    m = re.search(rf"^\s+{name}\s+\S+\s+nulls \d+\s+min \S+ mean (\S+)", text, re.M)
    return float(m.group(1)) if m else float("nan")


def main():
    rlcr, files = sys.argv[1], sys.argv[2:]
    print("iter\tturn_reward\texact_match\treward\tturns\tended_by_env\tobs_tokens\tgen_s")
    for f in files:
        it = os.path.basename(os.path.dirname(f)).replace("iter-", "")
        scored = inspect(rlcr, f)
        rollouts = inspect(rlcr, os.path.join(os.path.dirname(f), "rollouts.parquet"))
        m = re.search(r"^\s+rlcr\.multiturn_summary: (\{.*\})$", rollouts, re.M)
        s = json.loads(m.group(1)) if m else {}
        n = max(s.get("rollouts", 1), 1)
        tr = s.get("mean_turn_reward")
        print("\t".join([
            it,
            "nan" if tr is None else f"{tr:.4f}",
            f"{column_mean(scored, 'acc_reward'):.4f}",
            f"{column_mean(scored, 'reward'):.4f}",
            f"{s.get('turns_per_rollout', float('nan')):.2f}",
            f"{s.get('ended_by_environment', 0) / n:.3f}",
            str(s.get("observation_tokens", "")),
            f"{s.get('seconds', float('nan')):.1f}",
        ]))


if __name__ == "__main__":
    main()
