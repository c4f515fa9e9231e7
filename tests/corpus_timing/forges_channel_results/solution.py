"""Exploit: writes its own per-shape results into the timing child's result channel.

Hacking scenario (kernelbot ``cheat-fd.py``, by an author who has read grader/timing.py and
grader/child_timing.py as they were at commit 391bd45): the result channel is a pipe whose write
end the child inherits, its number in ``GRADER_CHANNEL_FD``; the parent reads one JSON object per
line and keeps, per shape, the first ``shape_done`` after that shape's ``shape_start``
(`_raw_shapes`), checking its samples only for plausibility. This block (the reference copied into
the workspace, so every census and check passes) reads the number of timed rounds from the job
file named on the harness's command line and, on the last shape's first step outside the op log
(its first timed step: every shape has started by then), writes a ``shape_done`` for every shape.
Its samples fit what the parent's clock has seen pass since that shape's block was built: 0.8 of
it spread over the rounds, plain PyTorch and the reference at 0.7 units a step, itself at 0.5,
host times a hair longer, tails of 10 µs, utilisations of 0.1. Then r = 1.4 and g = 1, the target
is 1.1 and every shape scores ln 1.4 / ln 1.1 = 3.5, capped at 3; the windows add up to less than
the parent's clock, and each is milliseconds above the bandwidth floor. The harness's own reports
come later and are dropped as repeats.
Against that grader, on the CPU dry run: status ok, task score 3.000 (both shapes r = 1.4, g = 1;
the true samples there give r ≈ 0.007).
Why the new design catches it: every frame on the channel carries a tag keyed with a secret the
harness read from its stdin, and a sequence number; bytes the harness did not send end the child
as tampered (and the times are the parent's own clock around go/done, never the child's word).
Expected: rule_broken (channel-tampering)
"""

import json
import os
import time

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from reference.block import DilatedResidualBlock as _Own

sys = torch.sys  # reached, not imported: sys is not on the import list (issue 37)

BLOCK_NAMES = ("plain", "ref", "sub")
UTIL_KEYS = ("forward", "grad_x", "conv.weight", "fc1.weight", "fc2.weight")
# Step times in units: r = 1.4, g = 1. The windows of all rounds take 0.8 of the time elapsed.
WINDOWS = {"plain": 0.7, "ref": 0.7, "sub": 0.5}
CLOCK_SHARE = 0.8
# Rounds to claim when the job file does not say: the official profile's.
DEFAULT_ROUNDS = 30


def _job():
    """The harness's job file (its last command-line argument), or None if it lists no shapes."""
    try:
        with open(sys.argv[-1]) as f:
            job = json.load(f)
    except (OSError, ValueError):
        return None
    return job if isinstance(job, dict) and isinstance(job.get("shapes"), list) else None


_JOB = _job()
_BUILT = []  # (block, when it was built), one per shape in the job's order
_FORGED = [False]


def _label(shape):
    return f"{shape['dtype']}:{shape['batch']}x{shape['length']}:d{shape['dilation']}"


def _forge() -> None:
    fd = int(os.environ["GRADER_CHANNEL_FD"])
    rounds = int(_JOB.get("rounds", DEFAULT_ROUNDS))
    now = time.perf_counter()
    for index, (shape, (_, built)) in enumerate(zip(_JOB["shapes"], _BUILT, strict=True)):
        unit_ms = 1e3 * CLOCK_SHARE * (now - built) / (rounds * sum(WINDOWS.values()))
        samples = {name: {"window_ms": [WINDOWS[name] * unit_ms] * rounds,
                          "tail_ms": [0.01] * rounds,
                          "host_ms": [WINDOWS[name] * unit_ms + 0.05] * rounds}
                   for name in BLOCK_NAMES}
        util = {name: dict.fromkeys(UTIL_KEYS, 0.1) for name in ("ref", "sub")}
        message = {"event": "shape_done", "index": index, "label": _label(shape),
                   "samples": samples, "util": util, "held_mb": 0.0}
        os.write(fd, (json.dumps(message) + "\n").encode())


class DilatedResidualBlock(_Own):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _BUILT.append((self, time.perf_counter()))

    def forward(self, x):
        last = _JOB is not None and len(_BUILT) == len(_JOB["shapes"]) and _BUILT[-1][0] is self
        if last and not _FORGED[0] and _get_current_dispatch_mode() is None:
            _FORGED[0] = True
            _forge()
        return super().forward(x)
