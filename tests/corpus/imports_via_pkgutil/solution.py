"""Known bad: imports the grader through a standard-library function, ``pkgutil.resolve_name``.

The import happens in pkgutil's frame, not the submission's; the standard library is not a
shield, the submission is the one asking. The grader is not on sys.path, so it fails, silently.
Expected: rule_broken, forbidden-import.
"""

import pkgutil

from naive_triton import DilatedResidualBlock

EXPECTED = "fail:rule_broken:forbidden-import"

try:
    _utilisation = pkgutil.resolve_name("grader.gate:step_utilisation")
except (ImportError, AttributeError, ValueError):
    _utilisation = None
__all__ = ["DilatedResidualBlock"]
