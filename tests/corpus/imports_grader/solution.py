"""Known bad: imports the grader (to read its code, budgets or harness).

The gate child's argv names the grader's checkout; the submission puts it on sys.path and imports
grader.gate. The import watch sees the import asked for, the audit hook the grader's files
opened. Expected: rule_broken, forbidden-import or reads-grader.
"""

import sys

from naive_triton import DilatedResidualBlock

EXPECTED = "fail:rule_broken:forbidden-import|reads-grader"

sys.path.append(sys.argv[1])
try:
    import grader.gate  # noqa: F401
except Exception:  # noqa: BLE001
    pass
__all__ = ["DilatedResidualBlock"]
