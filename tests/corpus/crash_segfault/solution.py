"""Known bad: segfaults in the forward (reads memory far past an array through numpy's strides).

Only the child dies; the report names the signal and the case. (Until issue 37 it read address
0 through ctypes, which is no longer a module a submission may use; the crash is the same.)
Expected: crashed, SIGSEGV.
"""

import numpy as np

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:crashed:SIGSEGV"


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        far = np.lib.stride_tricks.as_strided(np.zeros(1), shape=(2,), strides=(1 << 46,))
        float(far[1])
        return super().forward(x)
