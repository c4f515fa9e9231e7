"""Known bad: calls sys.exit(0) in the forward (exit "successfully" before any check).

The harness catches SystemExit around submission code and fails the case by name.
Expected: crashed, naming the case and the exit call.
"""

import sys

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:crashed:called exit"


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        sys.exit(0)
