#!/usr/bin/env python3
"""A verl reward function as rlcr's external verifier.

    rlcr score --input trajectory.parquet -o scored.parquet \
      --verifier-cmd "verl_reward.py my_rewards:compute_score"

(rlcr puts this script on the verifier command's PATH and in $RLCR_REWARDS, from any folder.)

Calls `compute_score(data_source, solution_str, ground_truth, extra_info)` (verl's signature) once
per answer row, with the row's `data_source`, its response text, its ground truth (the value `prepare`
stored, with its type: verl's `reward_model.ground_truth`, or the `--label-key` column; a label
stored as text is a str, "7" stays "7") and its `extra_info` (a dict: verl's own `extra_info`
plus the dataset's other columns). MODULE is imported from PYTHONPATH or the working folder (or
given as a path to a .py file).

The return value is a number (a bool counts as 0/1) or a dict: its "score" is the reward (rlcr's
accuracy, `acc_reward`), its other numeric entries become reward components `extra.NAME`. A
function that raises stops scoring with an error that names the row (here and in rlcr's own
message, through an error reply for that row); nothing is written.
"""
import sys
import traceback

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import _protocol as p  # noqa: E402

TOOL = "verl_reward.py"


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    spec = sys.argv[1]
    fn = p.load(TOOL, spec)
    for reqs in p.batches(TOOL):
        out = []
        for req in reqs:
            try:
                r = fn(req.get("data_source"), req.get("response", ""), req.get("ground_truth"),
                       req.get("extra_info"))
            except Exception as e:
                traceback.print_exc(file=sys.stderr)
                p.fail_row(TOOL, req, f"{spec} raised on {p.where(req)}: {type(e).__name__}: {e}",
                           f"{spec} raised {type(e).__name__}: {e}")
            if isinstance(r, dict):
                if "score" not in r:
                    p.fail_row(TOOL, req, f"{spec} returned a dict without \"score\" for {p.where(req)}",
                               f"{spec} returned a dict without \"score\"")
                correct = p.number(TOOL, spec, req, r["score"], "\"score\"")
                extra = {}
                for k, v in r.items():
                    if k == "score" or isinstance(v, str) or v is None:
                        continue
                    if isinstance(v, (bool, int, float)):
                        extra[k] = p.number(TOOL, spec, req, v, repr(k))
            else:
                correct = p.number(TOOL, spec, req, r, "the score")
                extra = {}
            out.append(p.reply(req["id"], correct, extra))
        p.write(out)


if __name__ == "__main__":
    main()
