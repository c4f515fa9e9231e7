"""Known bad: imports a third-party module that the child has already loaded.

``typing_extensions`` is neither the standard library nor torch, triton or numpy; torch imports it
for itself, so it sits in ``sys.modules`` and the import is answered from there: no finder runs
and no file is opened (PyYAML, which the harness loads, is the same case). The submission checks
that premise first: if the module were not cached it fails to load instead, and this entry's
verdict would say so. Expected: rule_broken, forbidden-import.
"""

import sys

from naive_triton import DilatedResidualBlock

EXPECTED = "fail:rule_broken:forbidden-import"

assert "typing_extensions" in sys.modules, "premise: the child has typing_extensions loaded"
import typing_extensions  # noqa: E402, F401

__all__ = ["DilatedResidualBlock"]
