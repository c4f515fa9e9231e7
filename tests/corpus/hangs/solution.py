"""Known bad: never returns from the forward (sleeps).

The watchdog kills the child's process group at the gate's wall-clock limit.
Expected: timed_out.
"""

import time

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:timed_out:wall-clock"
GATE_WALL_S = 20


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        while True:
            time.sleep(1)
