"""What the two reward adapters share: loading `MODULE:FUNCTION`, reading rlcr's external
verifier requests (JSON lines on stdin), writing replies, and errors that name the row.

The protocol (docs/protocols.md): a request is `{"id", "sample_id", "data_source", "prompt",
"response", "answer", "ground_truth", "messages", "extra_info", "columns"}`, `id` being the row's
0-based position in the scored table; a reply `{"id", "correct": number, "extra": {name: number}}`,
or `{"id", "error": text}` when the row cannot be scored (rlcr then stops, naming that row).

rlcr writes these files (compiled into its binary) to a cache folder and puts it on the verifier
command's PATH and in $RLCR_REWARDS, so `verl_reward.py MODULE:FUNCTION` runs from any folder.
MODULE is imported from PYTHONPATH, then the working folder.
"""
import importlib
import importlib.util
import json
import math
import os
import select
import sys


def fail(tool, msg):
    print(f"{tool}: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def fail_row(tool, req, msg, why=None):
    """Stop on the row of `req`: `msg` (which names the row) on stderr, and an error reply for its
    id, whose text `why` (default `msg`) rlcr shows after its own name of the row."""
    print(f"{tool}: {msg}", file=sys.stderr, flush=True)
    sys.stdout.write(json.dumps({"id": req.get("id"), "error": why or msg}) + "\n")
    sys.stdout.flush()
    sys.exit(1)


def load(tool, spec):
    """The function `spec` names: `MODULE:FUNCTION` (the module found on PYTHONPATH or in the
    working folder, or a path to a .py file)."""
    # `python3 path/to/adapter.py` puts the adapter's folder on sys.path, not the working folder
    # (as `python -m` would): put it back, after PYTHONPATH's entries, so that the user's module
    # next to their data imports from wherever the adapter lives.
    cwd = os.getcwd()
    if cwd not in sys.path:
        first = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
        first.add(os.path.dirname(os.path.abspath(__file__)))
        at = 0
        while at < len(sys.path) and os.path.abspath(sys.path[at] or ".") in first:
            at += 1
        sys.path.insert(at, cwd)
    mod_name, sep, fn_name = spec.rpartition(":")
    if not sep or not mod_name or not fn_name:
        fail(tool, f"expected MODULE:FUNCTION, got {spec!r}")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            s = importlib.util.spec_from_file_location(os.path.basename(mod_name)[:-3] or "m", mod_name)
            if s is None or s.loader is None:
                fail(tool, f"cannot load {mod_name}")
            mod = importlib.util.module_from_spec(s)
            s.loader.exec_module(mod)
        else:
            mod = importlib.import_module(mod_name)
    except SystemExit:
        raise
    except Exception as e:  # the user's module failed to import
        fail(tool, f"cannot import {mod_name!r} (PYTHONPATH={os.environ.get('PYTHONPATH', '')!r}): "
                   f"{type(e).__name__}: {e}")
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        fail(tool, f"{mod_name!r} has no function {fn_name!r}")
    return fn


def where(req):
    return f"row {req.get('id')} (sample_id {req.get('sample_id')!r})"


def number(tool, spec, req, v, what):
    """`v` as a finite float, else an error naming the row."""
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    try:
        f = float(v)
    except (TypeError, ValueError):
        why = f"{spec} returned {type(v).__name__} {v!r} as {what}; expected a number"
        fail_row(tool, req, f"{spec} returned {type(v).__name__} {v!r} as {what} for {where(req)}; "
                            "expected a number", why)
    if not math.isfinite(f):
        fail_row(tool, req, f"{spec} returned {f} as {what} for {where(req)}; expected a finite number",
                 f"{spec} returned {f} as {what}; expected a finite number")
    return f


def reply(req_id, correct, extra):
    out = {"id": req_id, "correct": correct}
    if extra:
        out["extra"] = extra
    return json.dumps(out)


def parse(tool, line):
    try:
        req = json.loads(line)
    except ValueError as e:
        fail(tool, f"a request that is not JSON: {e}: {line[:200]!r}")
    if not isinstance(req, dict) or "id" not in req:
        fail(tool, f"a request without an id: {line[:200]!r}")
    return req


def batches(tool):
    """Lists of requests: every complete line available on stdin at once (rlcr pipelines up to 256
    requests), so batched reward functions see batches; one request per line otherwise."""
    fd = sys.stdin.fileno()
    buf = b""
    eof = False
    while not eof:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            eof = True
        buf += chunk
        while not eof and select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                eof = True
            buf += chunk
        *lines, buf = buf.split(b"\n")
        if eof and buf.strip():
            lines.append(buf)
        reqs = [parse(tool, ln.decode("utf-8")) for ln in lines if ln.strip()]
        if reqs:
            yield reqs


def write(lines):
    sys.stdout.write("".join(ln + "\n" for ln in lines))
    sys.stdout.flush()
