"""Known bad: imports the reference by a computed name, through importlib.import_module.

No import statement names the reference, so a scan for ``import reference`` finds nothing; the
name is assembled at run time and the failure swallowed. Expected: rule_broken, forbidden-import.
"""

import importlib

from naive_triton import DilatedResidualBlock

EXPECTED = "fail:rule_broken:forbidden-import"

try:
    _ref = importlib.import_module(".".join(("reference", "block")))
    DilatedResidualBlock = _ref.DilatedResidualBlock  # noqa: F811
except ImportError:
    pass
__all__ = ["DilatedResidualBlock"]
