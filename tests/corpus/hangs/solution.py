"""Known bad: never returns from the forward (sleeps).

The parent gives each gate item a deadline made from what the item needs (a floor for Triton's
compilation plus a multiple of the plain block's time on it); the watchdog kills the child's
process group once the item is overdue, long before the gate's wall-clock limit. CI lowers the
floor to 10 s. Expected: timed_out, naming the deadline of the item.
"""

import time

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:timed_out:ran past its deadline"
DEADLINE_FLOOR_S = 10


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        while True:
            time.sleep(1)
