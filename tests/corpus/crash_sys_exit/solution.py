"""Known bad: exits with status 0 in the forward (exit "successfully" before any check).

The harness catches SystemExit around submission code and fails the case by name.
``sys.exit(0)`` until issue 37 (``sys`` is no longer a module a submission may import); it
raises the same ``SystemExit``. Expected: crashed, naming the case and the exit call.
"""

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:crashed:called exit"


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        raise SystemExit(0)
