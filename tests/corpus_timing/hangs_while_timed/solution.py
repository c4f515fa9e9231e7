"""A submission that hangs once its steps are being timed (a deadlock, an endless loop).

Honest for its first calls (the gate's process is another; here every shape's warm-up and the
untimed round), then, a few timed steps in, its forward never returns.
The timing child announces each stage (a shape's warm-up, each timed visit); the parent gives
every stage a deadline of its own (a floor plus a multiple of the plain block's time on the work
of that stage), so the hang ends once its stage is overdue, long before the timing phase's
wall-clock limit.
Expected: timed_out (ran past its deadline)
"""

import time

import torch

from reference.block import DilatedResidualBlock as _Reference

_CALLS = [0]


class DilatedResidualBlock(_Reference):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _CALLS[0] += 1
        # The corpus profile: 3 warm-up rounds and 1 untimed round before 12 timed ones.
        if _CALLS[0] > 8:
            while True:
                time.sleep(1)
        return super().forward(x)
