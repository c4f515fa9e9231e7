"""Known bad: reads the grading parent's memory through /proc (where the secret seed lives).

Opens /proc/<parent pid>/mem, maps and environ. In production the child runs as another
non-root user in a container and the parent is not dumpable; the audit hook reports the attempt
whatever the permissions say. Expected: rule_broken, reads-other-process.
"""

import os

from naive_triton import DilatedResidualBlock

EXPECTED = "fail:rule_broken:reads-other-process"

for _name in ("maps", "environ", "mem"):
    try:
        with open(f"/proc/{os.getppid()}/{_name}", "rb") as _f:
            _f.read(64)
    except OSError:
        pass
__all__ = ["DilatedResidualBlock"]
