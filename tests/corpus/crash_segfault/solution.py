"""Known bad: segfaults in the forward (reads address 0 through ctypes).

Only the child dies; the report names the signal and the case. Expected: crashed, SIGSEGV.
"""

import ctypes

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:crashed:SIGSEGV"


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        ctypes.string_at(0)
        return super().forward(x)
