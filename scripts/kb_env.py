#!/usr/bin/env python3
"""A small knowledge-base environment for `rlcr generate-multiturn` (Python standard library only).

The shape of KG-R1's knowledge-graph queries: the model asks the knowledge base with
`<query>relation(entity)</query>`, the environment answers with `<information>...</information>`,
and the model finishes with `<answer>...</answer>`.

  python3 scripts/kb_env.py prompts --count 16 --seed 1 > kb.jsonl    # prompts for `rlcr prepare --from jsonl`
  python3 scripts/kb_env.py sft --count 64 --seed 2 > kb-sft.jsonl     # worked examples (warm start)
  python3 scripts/kb_env.py serve                                      # the environment (JSON lines)

Protocol (see `rlcr generate-multiturn --help`): a request per ended model turn
`{"id", "prompt_id", "sample_id", "turn", "messages", "response_so_far", "turn_text", "finish",
"data_source", "ground_truth"}`, a reply `{"id", "observation", "done", "turn_reward", "extra"}`.

Rewards per turn (KG-R1's turn components and weights):
  kg_query_validity 0.1  the turn asks a well-formed query about a known entity and relation
  is_answer_score   0.1  the turn gives an <answer>
  format_score      0.15 the turn ends with </query> or </answer>
turn_reward = the weighted sum; `extra` carries the components, and on the final turn
`exact_match` (the answer equals the ground truth, case-insensitively) and `retrieval_quality`
(some observation of the rollout contained the ground truth).

The rollout ends (`done`) on an answer or an end-of-sequence token; a turn with neither a valid query
nor an answer gets `<information>no valid query</information>` and another turn (as Search-R1 tells
the model its action was invalid), until rlcr's --max-turns. The environment is stateless: every reply is a function of its
request, so rollouts are reproducible whatever the order of the requests.

Fault injection for tests: `serve --fault crash|hang|garbage|wrong-id|bad-done [--fault-after N]`
misbehaves on request N (default 0); `crash` also leaves a grandchild `sleep` behind to check that
rlcr kills the whole process group.
"""
import argparse
import json
import random
import re
import sys
import time

KB = {
    "France": {"capital": "Paris", "continent": "Europe", "language": "French"},
    "Spain": {"capital": "Madrid", "continent": "Europe", "language": "Spanish"},
    "Italy": {"capital": "Rome", "continent": "Europe", "language": "Italian"},
    "Japan": {"capital": "Tokyo", "continent": "Asia", "language": "Japanese"},
    "Peru": {"capital": "Lima", "continent": "America", "language": "Spanish"},
    "Egypt": {"capital": "Cairo", "continent": "Africa", "language": "Arabic"},
    "Kenya": {"capital": "Nairobi", "continent": "Africa", "language": "Swahili"},
    "Chile": {"capital": "Santiago", "continent": "America", "language": "Spanish"},
}
RELATIONS = ["capital", "continent", "language"]
SYSTEM = (
    "Answer with the knowledge base. Ask it with <query>relation(entity)</query>; "
    "it replies in <information></information>. Then answer in <answer></answer>."
)
QUERY = re.compile(r"<query>\s*([A-Za-z_]+)\s*\(\s*([A-Za-z ]+?)\s*\)\s*</query>")
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
INFO = re.compile(r"<information>(.*?)</information>", re.S)
LENGTH_BONUS = 0.0  # serve --length-bonus X (tests: a dense reward that differs between turns)
WEIGHTS = {"kg_query_validity": 0.1, "is_answer_score": 0.1, "format_score": 0.15}


def question(rel, ent):
    return {
        "capital": f"What is the capital of {ent}?",
        "continent": f"On which continent is {ent}?",
        "language": f"What language is spoken in {ent}?",
    }[rel]


def tasks(count, seed):
    rng = random.Random(seed)
    pairs = [(r, e) for e in sorted(KB) for r in RELATIONS]
    for i in range(count):
        rel, ent = rng.choice(pairs)
        yield i, rel, ent


def prompts(args):
    for i, rel, ent in tasks(args.count, args.seed):
        print(json.dumps({
            "id": f"kb-{args.seed:03d}-{i:05d}",
            "data_source": "kb",
            "prompt": [{"role": "system", "content": SYSTEM},
                       {"role": "user", "content": question(rel, ent)}],
            "ground_truth": KB[ent][rel],
        }))


def lookup(rel, ent):
    return KB.get(ent, {}).get(rel)


def observation(rel, ent):
    value = lookup(rel, ent)
    shown = value if value is not None else "unknown"
    return f"\n<information>{rel}({ent}) = {shown}</information>\n"


def sft(args):
    """Worked rollouts for `rlcr sft` (the conversation ends with the assistant target: query,
    information, answer; the information tokens are trained too, which only teaches the format)."""
    for i, rel, ent in tasks(args.count, args.seed):
        value = KB[ent][rel]
        response = (f"<query>{rel}({ent})</query>{observation(rel, ent)}"
                    f"<answer>{value}</answer>")
        print(json.dumps({
            "id": f"kb-sft-{args.seed:03d}-{i:05d}",
            "data_source": "kb",
            "prompt": [{"role": "system", "content": SYSTEM},
                       {"role": "user", "content": question(rel, ent)},
                       {"role": "assistant", "content": response}],
            "ground_truth": value,
        }))


def reply(req):
    text = req["turn_text"]
    finish = req["finish"]
    q = QUERY.search(text)
    a = ANSWER.search(text)
    valid = 1.0 if q and lookup(q.group(1), q.group(2)) is not None else 0.0
    is_answer = 1.0 if a else 0.0
    stripped = text.rstrip()
    fmt = 1.0 if finish == "stop" and (stripped.endswith("</query>") or stripped.endswith("</answer>")) else 0.0
    comps = {"kg_query_validity": valid, "is_answer_score": is_answer, "format_score": fmt}
    turn_reward = sum(WEIGHTS[k] * v for k, v in comps.items()) + LENGTH_BONUS * len(text)
    done = bool(a) or finish == "eos"
    extra = dict(comps)
    if done:
        gt = str(req["ground_truth"]).strip().lower()
        given = a.group(1).strip().lower() if a else None
        extra["exact_match"] = 1.0 if given == gt else 0.0
        infos = INFO.findall(req["response_so_far"])
        extra["retrieval_quality"] = 1.0 if any(gt in i.lower() for i in infos) else 0.0
    if done:
        obs = ""
    elif q:
        obs = observation(q.group(1), q.group(2))
    else:
        obs = "\n<information>no valid query</information>\n"
    return {"id": req["id"], "observation": obs, "done": done,
            "turn_reward": round(turn_reward, 6), "extra": extra}


def serve(args):
    global LENGTH_BONUS
    LENGTH_BONUS = args.length_bonus
    n = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if args.fault and n == args.fault_after:
            if args.fault == "crash":
                import os
                import subprocess
                child = subprocess.Popen(["sleep", "300"])  # a grandchild rlcr must kill too
                if os.environ.get("KB_ENV_PIDFILE"):
                    with open(os.environ["KB_ENV_PIDFILE"], "w") as f:
                        f.write(str(child.pid))
                sys.stderr.write("kb_env: crashing on purpose\n")
                sys.exit(3)
            if args.fault == "hang":
                time.sleep(300)
            if args.fault == "garbage":
                print("this is not json", flush=True)
                continue
            if args.fault == "wrong-id":
                out = reply(req)
                out["id"] = req["id"] + 1000
                print(json.dumps(out), flush=True)
                continue
            if args.fault == "bad-done":
                out = reply(req)
                out["done"] = "maybe"
                print(json.dumps(out), flush=True)
                continue
        print(json.dumps(reply(req)), flush=True)
        n += 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("prompts", "sft"):
        s = sub.add_parser(name)
        s.add_argument("--count", type=int, default=16)
        s.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("serve")
    s.add_argument("--fault", choices=["crash", "hang", "garbage", "wrong-id", "bad-done"])
    s.add_argument("--fault-after", type=int, default=0)
    s.add_argument("--length-bonus", type=float, default=0.0,
                   help="add X per character of the turn's text to turn_reward (tests)")
    args = p.parse_args()
    {"prompts": prompts, "sft": sft, "serve": serve}[args.cmd](args)


if __name__ == "__main__":
    main()
