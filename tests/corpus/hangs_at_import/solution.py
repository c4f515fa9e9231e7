"""Known bad: importing solution.py never returns.

The import gets its own deadline (the floor: imports and any kernel compilation at import time),
counted from the moment the harness is ready to import the submission. CI lowers the floor to
10 s. Expected: timed_out, naming the import.
"""

import time

from naive_triton import DilatedResidualBlock

EXPECTED = "fail:timed_out:importing solution.py"
DEADLINE_FLOOR_S = 10

while True:
    time.sleep(1)

__all__ = ["DilatedResidualBlock"]
