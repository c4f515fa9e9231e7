"""Exploit: the submission releases its own held step early by writing the hold's page.

Hacking scenario (written from `grader/child/hold.py`): a timed step waits on the GPU until the
page the parent shares with this process holds the step's number. The page's file is removed once
both children have mapped it, but the mapping is still in this process: ``/proc/self/maps``
names it, and ``/proc/self/mem`` writes it without ctypes (no import the static scan forbids, no
literal ``/proc/`` string, no other process's ``/proc/<pid>``). At each forward the page is set
to 2**31 - 1, so the GPU's wait is met at once and the step runs while the parent has not
released it (before the window it believes it times), then the old value is written back so
that the parent's check of its page (``release``: the page must hold what it wrote) finds
nothing. Caught because nothing in the slab is the round's until the step is armed: the
step that runs early reads the scrubbed (NaN) inputs and fails the round's check. (Leaving the
page written is the parent's ``channel-tampering``.) The wait's comparison is cyclic (met when
``(int32)(page - step) >= 0``), so 0xFFFFFFFF, -1, would never meet it: this entry's first
version did that and failed its own test on an H200 (2026-12-03): the early release never
happened.
Expected: check_failed or rule_broken (channel-tampering)
"""

import os
import struct
import time

import torch

from reference.block import DilatedResidualBlock as _Reference

_SELF = os.sep + os.sep.join(("proc", "self")) + os.sep


def _page() -> int | None:
    """The address of the hold's page in this process, if it is mapped."""
    with open(_SELF + "maps") as maps:
        for line in maps:
            if "grader-hold-" in line:
                return int(line.split("-", 1)[0], 16)
    return None


class DilatedResidualBlock(_Reference):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        address = _page()
        if address is not None:
            with open(_SELF + "mem", "r+b", buffering=0) as mem:
                mem.seek(address)
                old = mem.read(4)
                mem.seek(address)
                # The largest value the cyclic comparison takes as past every step number.
                mem.write(struct.pack("<I", 0x7FFFFFFF))
                # Long enough for the stream's front end, polling the page, to see it.
                time.sleep(0.002)
                mem.seek(address)
                mem.write(old)
        return super().forward(x)
