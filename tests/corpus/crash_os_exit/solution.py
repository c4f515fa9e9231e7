"""Known bad: os._exit(0) in the forward: the process ends with status 0 mid-case.

Status 0 must not read as success: the parent sees the case started and never finished.
Expected: crashed, "died here" on the first case.
"""

import os

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:crashed:died here"


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        os._exit(0)
