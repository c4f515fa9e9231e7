"""Known bad: imports the grader by calling ``__import__`` directly.

A call, not a statement: nothing for an AST scan of import statements, and the failure (the
grader is not on sys.path) is swallowed. Expected: rule_broken, forbidden-import.
"""

from naive_triton import DilatedResidualBlock

EXPECTED = "fail:rule_broken:forbidden-import"

try:
    _grader = __import__("grader", fromlist=["gate"])
except ImportError:
    _grader = None
__all__ = ["DilatedResidualBlock"]
