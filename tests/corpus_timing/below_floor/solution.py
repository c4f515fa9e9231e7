"""Exploit: re-record the harness's own start event near the end of the step.

Hacking scenario: no timer function is replaced (identity checks pass); instead the submission
finds the harness's ``start`` event through the caller's frame and records it again from a hook
that runs at the end of backward, so the window covers only the last few microseconds. The
reported time is then below what moving the step's bytes at peak bandwidth takes: the parent's
bandwidth floor rejects it.
Expected: implausible (physically possible)
"""

import sys

import torch

from reference.block import DilatedResidualBlock as _Reference


def _harness_start() -> torch.cuda.Event | None:
    frame = sys._getframe(1)
    while frame is not None:
        event = frame.f_locals.get("start")
        if isinstance(event, torch.cuda.Event):
            return event
        frame = frame.f_back
    return None


class DilatedResidualBlock(_Reference):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = _harness_start()
        out = super().forward(x)
        if start is not None and x.requires_grad:
            x.register_hook(lambda g: (start.record(), g)[1])
        return out
