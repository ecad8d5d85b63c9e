#!/usr/bin/env python3
"""Independent checks of rlcr's critic path (used by tests/integration/critic.rs).

  check_critic.py gae TABLE --gamma G --lam L --kl-coef B --dist final_token_only|turn_proportional
      recompute verl's GAE with numpy from the written table (rewards from reward_components and
      token_turn_ids, KL k1 in the reward from response_logprobs/ref_logprobs, the table's values and
      loss_mask; batch-wide masked whitening) and print the largest differences from the table's
      token_advantages, returns and trajectory_score as JSON.
  check_critic.py values CRITIC_DIR TABLE
      load the critic folder with transformers' AutoModelForTokenClassification and print the
      largest difference between its values (logits[..., 0] at the slot before each response token)
      and the table's `values` column as JSON.

Exit code 3 when numpy/pyarrow (or torch/transformers) are not installed.
"""
import json
import sys

try:
    import numpy as np
    import pyarrow.parquet as pq
except ImportError as e:  # pragma: no cover
    sys.stderr.write(f"skipped: {e}\n")
    sys.exit(3)


def rows(path):
    return pq.read_table(path).to_pylist()


def token_scores(row, dist, mask):
    """KG-R1's convert_structured_to_token_level."""
    n = len(mask)
    out = np.zeros(n)
    turn = {}
    glob = 0.0
    for c in row["reward_components"]:
        if c["name"].startswith("_raw_"):
            continue
        v = float(np.float32(c["value"])) * float(np.float32(c["weight"]))
        if c["turn"] < 0:
            glob += v
        else:
            turn[c["turn"]] = turn.get(c["turn"], 0.0) + v
    valid = np.flatnonzero(mask)
    if len(valid) == 0:
        return out
    if dist == "final_token_only":
        total = (sum(turn.values()) / len(turn) if turn else 0.0) + glob
        out[valid[-1]] += total
    else:
        ids = np.array(row["token_turn_ids"])
        for k, r in sorted(turn.items()):
            sel = np.flatnonzero(mask & (ids == k))
            if r != 0.0 and len(sel):
                out[sel] += r / len(sel)
        if glob != 0.0:
            out[valid] += glob / len(valid)
    return out


def gae(args):
    path = args[0]
    opts = dict(zip(args[1::2], args[2::2]))
    gamma, lam = float(opts["--gamma"]), float(opts["--lam"])
    beta, dist = float(opts["--kl-coef"]), opts["--dist"]
    data = rows(path)
    raw, rets, masks = [], [], []
    for row in data:
        mask = np.array(row["loss_mask"], dtype=bool)
        m = mask.astype(float)
        r = token_scores(row, dist, mask)
        if beta > 0:
            kl = np.array(row["response_logprobs"], float) - np.array(row["ref_logprobs"], float)
            r = r - beta * kl * m
        v = np.array(row["values"], float)
        n = len(mask)
        adv = np.zeros(n)
        nextv, last = 0.0, 0.0
        for t in reversed(range(n)):
            delta = r[t] + gamma * nextv - v[t]
            new = delta + gamma * lam * last
            nextv = v[t] * m[t] + (1 - m[t]) * nextv
            last = new * m[t] + (1 - m[t]) * last
            adv[t] = last
        raw.append(adv)
        rets.append(adv + v)
        masks.append(mask)
    flat = np.concatenate([a[mk] for a, mk in zip(raw, masks)])
    mean, var = flat.mean(), flat.var(ddof=1)
    worst = {"token_advantages": 0.0, "returns": 0.0, "trajectory_score": 0.0, "masked_nonzero": 0}
    for row, a, ret, mk in zip(data, raw, rets, masks):
        white = np.where(mk, (a - mean) / np.sqrt(var + 1e-8), 0.0)
        ta = np.array(row["token_advantages"], float)
        worst["token_advantages"] = max(worst["token_advantages"], float(np.abs(ta - white).max(initial=0)))
        worst["masked_nonzero"] += int(np.count_nonzero(ta[~mk]))
        got_ret = np.array(row["returns"], float)
        worst["returns"] = max(worst["returns"], float(np.abs((got_ret - ret)[mk]).max(initial=0)))
        ts = float((ret * mk).sum())
        worst["trajectory_score"] = max(worst["trajectory_score"], abs(row["trajectory_score"] - ts))
    worst["tokens"] = int(len(flat))
    worst["adv_std"] = float(flat.std())
    print(json.dumps(worst))


def values(args):
    try:
        import torch
        from transformers import AutoModelForTokenClassification
    except ImportError as e:  # pragma: no cover
        sys.stderr.write(f"skipped: {e}\n")
        sys.exit(3)
    critic, path = args
    model = AutoModelForTokenClassification.from_pretrained(critic, torch_dtype=torch.float32)
    model.eval()
    worst, count = 0.0, 0
    for row in rows(path):
        ctx, resp = row["context_ids"], row["response_ids"]
        if not resp:
            continue
        ids = torch.tensor([ctx + resp])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :, 0]
        ours = np.array(logits[len(ctx) - 1: len(ctx) + len(resp) - 1].tolist())
        got = np.array(row["values"], float)
        worst = max(worst, float(np.abs(ours - got).max()))
        count += len(resp)
    print(json.dumps({"max_abs_diff": worst, "tokens": count, "num_labels": model.config.num_labels}))


if __name__ == "__main__":
    {"gae": gae, "values": values}[sys.argv[1]](sys.argv[2:])
