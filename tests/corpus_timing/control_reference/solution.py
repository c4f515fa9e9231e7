"""Control: the reference, copied into the workspace, as the submission.

Methodology: the test copies ``reference/`` into the workspace; this file only re-exports it.
On every shape r ≈ g, so the score is about ln g / ln(1.1·g).
Expected: ok
"""

from reference.block import DilatedResidualBlock

__all__ = ["DilatedResidualBlock"]
