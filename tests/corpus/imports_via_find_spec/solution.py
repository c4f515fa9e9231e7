"""Known bad: probes for the reference with ``importlib.util.find_spec``, importing nothing.

Only asks whether a module ``reference`` could be found (it cannot: no reference/ in this tree,
the grader's checkout is not on sys.path). A probe is an attempted import by name all the same.
Expected: rule_broken, forbidden-import.
"""

import importlib.util

from naive_triton import DilatedResidualBlock

EXPECTED = "fail:rule_broken:forbidden-import"

_HAVE_REFERENCE = importlib.util.find_spec("reference") is not None
__all__ = ["DilatedResidualBlock"]
