#!/usr/bin/env python3
"""Generate differential fixtures for rlcr's countdown verifier from CPython itself.

Writes, next to the repo's other score fixtures:
  fixtures/score/pyexpr_cases.jsonl   {"expr", "kind": int|float|complex|error, "value"}
  fixtures/score/tinyzero_cases.jsonl {"s", "target", "numbers", "score"}

`pyexpr_cases` are CPython's own `eval(expr, {"__builtins__": None}, {})` results on random
strings over TinyZero's character set; `tinyzero_cases` run a re-implementation of TinyZero's
`compute_score` written from the published description (docs/math.md §1.1): marker after the first
"Assistant:" (else "<|im_start|>assistant"), last line, last non-greedy <answer>, \\d+ validation,
character whitelist + eval, |v - target| < 1e-5. Run with CPython 3.11 (the figures rlcr's
evaluator mirrors); deterministic for a given seed.

usage: python3 scripts/gen_countdown_fixtures.py [--seed 0] [--n 1000]
"""
import argparse
import json
import math
import random
import re
import signal
import sys
import warnings
from pathlib import Path

warnings.simplefilter("ignore")
sys.setrecursionlimit(10000)


class Slow(Exception):
    pass


def _alarm(signum, frame):
    raise Slow()


signal.signal(signal.SIGALRM, _alarm)


def py_eval(expr):
    """(kind, printed value, value) of CPython's eval, or None when it is too slow to be a fair
    case."""
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    sys.set_int_max_str_digits(4300)
    try:
        v = eval(expr, {"__builtins__": None}, {})
        if isinstance(v, bool) or not isinstance(v, (int, float, complex)):
            return ("error", type(v).__name__, None)
        if isinstance(v, int):
            if v.bit_length() > 60000:
                return None
            sys.set_int_max_str_digits(0)  # printing only; eval above ran with the default limit
            try:
                return ("int", str(v), v)
            finally:
                sys.set_int_max_str_digits(4300)
        if isinstance(v, float):
            return ("float", repr(v), v)
        return ("complex", [repr(v.real), repr(v.imag)], v)
    except Slow:
        return None
    except BaseException as e:  # every exception is "no value" for TinyZero
        return ("error", type(e).__name__, None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def extract_solution(s):
    if "Assistant:" in s:
        s = s.split("Assistant:", 1)[1]
    elif "<|im_start|>assistant" in s:
        s = s.split("<|im_start|>assistant", 1)[1]
    else:
        return None
    s = s.split("\n")[-1]
    ms = list(re.finditer(r"<answer>(.*?)</answer>", s))
    return ms[-1].group(1).strip() if ms else None


def validate(eq, nums):
    try:
        found = sorted(int(n) for n in re.findall(r"\d+", eq))
        return found == sorted(nums)
    except Exception:
        return False


def evaluate(eq):
    if not re.match(r"^[\d+\-*/().\s]+$", eq):
        return ("error", "chars", None)
    return py_eval(eq)


def compute_score(s, target, nums):
    eq = extract_solution(s)
    if eq is None:
        return 0.0
    if not validate(eq, nums):
        return 0.1
    r = evaluate(eq)
    if r is None:
        return None
    kind, _, v = r
    if kind == "error":
        return 0.1
    try:
        return 1.0 if abs(v - target) < 1e-5 else 0.1
    except Exception:
        return 0.1


ATOMS = ["1", "2", "3", "7", "8", "25", "99", "0", "00", "07", "2.0", ".5", "3.", "100"]
OPS = ["+", "-", "*", "/", "//", "**"]


def rand_expr(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.35:
        a = rng.choice(ATOMS)
        return a
    if r < 0.45:
        return rng.choice(["-", "+", "--"]) + rand_expr(rng, depth + 1)
    if r < 0.6:
        return "(" + rand_expr(rng, depth + 1) + ")"
    if r < 0.65:
        # negative base, fractional exponent: complex results
        return f"({rng.choice(ATOMS)}-{rng.choice(ATOMS)})**({rng.choice(ATOMS)}/{rng.choice(ATOMS)})"
    op = rng.choice(OPS)
    sp = rng.choice(["", "", " ", "\t"])
    return rand_expr(rng, depth + 1) + sp + op + sp + rand_expr(rng, depth + 1)


NOISE = list("0123456789+-*/(). \t\r") + ["**", "//", "\x0c", "\x0b", "×", "=", "x", "\u0663", "\u00a0"]


def noisy(rng, s):
    s = list(s)
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        pos = rng.randint(0, len(s))
        if op < 0.5:
            s.insert(pos, rng.choice(NOISE))
        elif s and op < 0.8:
            del s[min(pos, len(s) - 1)]
        elif s:
            s[min(pos, len(s) - 1)] = rng.choice(NOISE)
    return "".join(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "fixtures" / "score"))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    fixed = ["(-8)**(1/3)", "(1-2)**(1/2)", "((1-2)**(1/2))**2", "2**-1", "-2**2", "2**3**2",
             "99**99//99**97", "10**400/10**399", "10**309/10", "1/10**400", "7.0//2", "-7//2",
             "-7.5//2", "7//-2.5", "0.0**0", "0**0", "(-2)**0.5*(-2)**0.5", "(1-2)**(1/2)/0.5",
             "(0-1)**(1/2)//1", "2**0.5**2", "(-1)**(1/3)**3", "((3-4)**(1/2))**-2",
             "((3-4)**(1/2))**101", "(-0.5)**(-0.5)", "9**9**2", "2**-1074", "2**-1075"]
    n_expr = 0
    with open(out / "pyexpr_cases.jsonl", "w") as f:
        exprs = fixed + [rand_expr(rng) for _ in range(a.n)] + [noisy(rng, rand_expr(rng)) for _ in range(a.n // 2)]
        for e in exprs:
            if not re.match(r"^[\d+\-*/().\s]+$", e):
                continue  # outside TinyZero's character set (e.g. `0x7` after noise): never evaluated
            r = py_eval(e)
            if r is None:
                continue
            f.write(json.dumps({"expr": e, "kind": r[0], "value": r[1] if r[0] != "error" else r[1]}) + "\n")
            n_expr += 1

    prefixes = [
        "User: {nums} {t} Assistant: Let me solve this step by step.\n<think>",
        "User: {nums} {t} Assistant: <think>",
        "<|im_start|>user\n{nums} {t}<|im_end|>\n<|im_start|>assistant\n<think>",
        "<|im_start|>user\n{nums} {t}<|im_end|>\n<|im_start|>assistant\n<think>",
        "",
    ]
    n_score = 0
    with open(out / "tinyzero_cases.jsonl", "w") as f:
        for _ in range(a.n):
            nums = [rng.randint(1, 99) for _ in range(rng.choice([3, 4]))]
            # an equation over the numbers, sometimes correct, sometimes perturbed
            ops = [rng.choice(["+", "-", "*", "/", "//", "**"] if rng.random() < 0.2 else ["+", "-", "*", "/"]) for _ in nums[1:]]
            order = nums[:]
            rng.shuffle(order)
            eq = str(order[0])
            for o, n in zip(ops, order[1:]):
                eq = f"({eq}{o}{n})" if rng.random() < 0.5 else f"{eq} {o} {n}"
            val = py_eval(eq)
            if val is None:
                continue
            if val[0] == "int" and abs(val[2]) < 2**62:
                target = val[2]
            elif val[0] == "float" and abs(val[2]) < 2**53:
                # rounded, or the float itself (integral or not); kept within 2**53 so that
                # JSON readers need no correctly-rounded big-number parsing
                target = round(val[2]) if rng.random() < 0.7 else val[2]
            else:
                target = rng.randint(1, 100)
            if rng.random() < 0.3:
                eq = noisy(rng, eq)
            body = rng.choice([
                f"reasoning</think>\n<answer>{eq}</answer>",
                f"reasoning</think> <answer>{eq}</answer><|im_end|>",
                f"r</think>\n<answer>{eq}</answer>\nDone.",
                f"r</think>\n<answer>1</answer> <answer> {eq} </answer>",
                f"Assistant: <answer>{eq}</answer>",
                f"r</think>\n<answer>\n{eq}</answer>",
                f"{eq}",
            ])
            s = rng.choice(prefixes).format(nums=nums, t=target) + body
            sc = compute_score(s, target, nums)
            if sc is None:
                continue
            f.write(json.dumps({"s": s, "target": target, "numbers": nums, "score": sc}) + "\n")
            n_score += 1
    print(f"wrote {n_expr} expression cases and {n_score} compute_score cases to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
