"""Known bad: starts a background thread during the forward.

A thread that outlives the call could finish work after the timer stops. The thread here just
sleeps. Expected: rule_broken, new-thread.
"""

import threading
import time

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:new-thread"


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        return super().forward(x)
