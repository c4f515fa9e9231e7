"""Control: the reference, copied into the workspace, as the submission.

Methodology: the test copies ``reference/`` into the workspace; this file only re-exports it.
Expected: ok (r ≈ g on every shape, so the score is ln g / ln(1.1·g) within its interval)
"""

from reference.block import DilatedResidualBlock

__all__ = ["DilatedResidualBlock"]
