#!/usr/bin/env python3
"""Read TensorBoard run folders with TensorBoard's own reader and print their scalars as JSON.

Usage: check_tensorboard.py RUN_DIR...

Prints {RUN_DIR: {tag: [[step, value, wall_time], ...]}} (non-finite values as the strings
"nan", "inf", "-inf"). Exit code 3 when the tensorboard package is missing.
"""
import json
import math
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:  # the caller decides whether a missing package is a failure
    print(f"No module named tensorboard ({e})", file=sys.stderr)
    sys.exit(3)


def num(x):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


out = {}
for d in sys.argv[1:]:
    acc = EventAccumulator(d, size_guidance={"scalars": 0})
    acc.Reload()
    out[d] = {
        tag: [[e.step, num(e.value), e.wall_time] for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }
print(json.dumps(out))
