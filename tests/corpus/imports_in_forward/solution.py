"""Known bad: a forbidden import that waits until forward, where a load-time check is over.

Loading imports nothing forbidden. The first forward tries SciPy (a fast path "if available") and
falls back to the naive block when it is missing, as it is here: the import fails, the outputs are
right. Expected: rule_broken, forbidden-import (in a forward phase).
"""

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:forbidden-import"


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        try:
            import scipy.signal  # noqa: F401
        except ImportError:
            pass
        return super().forward(x)


__all__ = ["DilatedResidualBlock"]
