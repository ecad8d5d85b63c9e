#!/usr/bin/env python3
"""TRL reward functions as rlcr's external verifier.

    rlcr score --input trajectory.parquet -o scored.parquet \
      --verifier-cmd "trl_reward.py my_rewards:accuracy_reward"

(rlcr puts this script on the verifier command's PATH and in $RLCR_REWARDS, from any folder.)

Calls each FUNCTION the way TRL's GRPOTrainer does, batched:
`FUNCTION(prompts=[...], completions=[...], **columns)`, where every dataset column (the keys of
the rows' `extra_info`, which `prepare` fills with every column but the prompt, and the table's
own extra columns) is a keyword argument holding one value per row (None where a row lacks it),
with the type the dataset stored (text stays text: "7" is the str "7").
Standard format (default): `prompts` are the texts of the last user message and `completions` the
response texts. `--conversational`: `prompts` are the message lists the model answered (system
prompt included) and each completion is `[{"role": "assistant", "content": response}]`.

Several functions are summed as TRL does (`--weights 1,0.5`, default 1 each) into the reward
(rlcr's accuracy, `acc_reward`); each function's own value is kept as the reward component
`extra.FUNCTION`. MODULE is imported from PYTHONPATH or the working folder (or given as a path to
a .py file). A batch is
the requests available at once (up to 256): a function whose value for a row depends on the
other rows of its batch sees other batches than under TRL. A function that raises stops scoring
with an error that names the row (the batch is retried row by row to find it); so does a None
(TRL's "not applicable": rlcr needs a number for every answer) or a list of the wrong length.
"""
import argparse
import sys
import traceback

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import _protocol as p  # noqa: E402

TOOL = "trl_reward.py"


def columns_of(reqs):
    keys = []
    for r in reqs:
        for src in (r.get("extra_info"), r.get("columns")):
            if isinstance(src, dict):
                for k in src:
                    if k not in keys and k not in ("prompts", "completions"):
                        keys.append(k)

    def get(r, k):
        for src in (r.get("extra_info"), r.get("columns")):
            if isinstance(src, dict) and k in src:
                return src[k]
        return None

    return {k: [get(r, k) for r in reqs] for k in keys}


def prompt_of(req, conversational):
    msgs = req.get("messages")
    if not conversational:
        return req.get("prompt")
    if isinstance(msgs, list):
        if msgs and isinstance(msgs[-1], dict) and msgs[-1].get("role") == "assistant":
            msgs = msgs[:-1]  # a response prefix rlcr prefilled
        return msgs
    return [{"role": "user", "content": req.get("prompt") or ""}]


def call(fn, reqs, conversational):
    prompts = [prompt_of(r, conversational) for r in reqs]
    if conversational:
        completions = [[{"role": "assistant", "content": r.get("response", "")}] for r in reqs]
    else:
        completions = [r.get("response", "") for r in reqs]
    return fn(prompts=prompts, completions=completions, **columns_of(reqs))


def run(spec, fn, reqs, conversational):
    """The function's values on `reqs`, checked; errors name the row."""
    try:
        vals = call(fn, reqs, conversational)
    except Exception as e:
        # find the row: the batch again, one row at a time
        for r in reqs:
            try:
                call(fn, [r], conversational)
            except Exception as e1:
                traceback.print_exc(file=sys.stderr)
                p.fail_row(TOOL, r, f"{spec} raised on {p.where(r)}: {type(e1).__name__}: {e1}",
                           f"{spec} raised {type(e1).__name__}: {e1}")
        traceback.print_exc(file=sys.stderr)
        why = (f"{spec} raised on the batch of {p.where(reqs[0])} .. {p.where(reqs[-1])} "
               f"but on no row alone: {type(e).__name__}: {e}")
        p.fail_row(TOOL, reqs[0], why)
    try:
        vals = list(vals)
    except TypeError:
        p.fail_row(TOOL, reqs[0], f"{spec} returned {type(vals).__name__}, not a list, for the batch "
                                  f"starting at {p.where(reqs[0])}")
    if len(vals) != len(reqs):
        p.fail_row(TOOL, reqs[0], f"{spec} returned {len(vals)} values for {len(reqs)} completions "
                                  f"(batch starting at {p.where(reqs[0])})")
    out = []
    for r, v in zip(reqs, vals):
        if v is None:
            p.fail_row(TOOL, r, f"{spec} returned None for {p.where(r)}; rlcr needs a number for every "
                                "answer", f"{spec} returned None; rlcr needs a number for every answer")
        out.append(p.number(TOOL, spec, r, v, "the reward"))
    return out


def main():
    ap = argparse.ArgumentParser(prog=TOOL, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("functions", nargs="+", metavar="MODULE:FUNCTION")
    ap.add_argument("--conversational", action="store_true",
                    help="prompts as message lists, completions as [{role: assistant, content}]")
    ap.add_argument("--weights", help="comma-separated weights, one per function (default 1 each)")
    a = ap.parse_args()
    weights = [1.0] * len(a.functions)
    if a.weights:
        try:
            weights = [float(w) for w in a.weights.split(",")]
        except ValueError:
            p.fail(TOOL, f"--weights {a.weights!r}: not numbers")
        if len(weights) != len(a.functions):
            p.fail(TOOL, f"--weights has {len(weights)} values for {len(a.functions)} functions")
    fns = [(spec, p.load(TOOL, spec)) for spec in a.functions]
    for reqs in p.batches(TOOL):
        per_fn = [(spec.rpartition(":")[2], run(spec, fn, reqs, a.conversational)) for spec, fn in fns]
        out = []
        for i, r in enumerate(reqs):
            total = sum(w * vals[i] for w, (_, vals) in zip(weights, per_fn))
            extra = {name: vals[i] for name, vals in per_fn} if len(per_fn) > 1 else {}
            out.append(p.reply(r["id"], total, extra))
        p.write(out)


if __name__ == "__main__":
    main()
