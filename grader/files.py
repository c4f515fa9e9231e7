"""Files the trusted side writes whole: a new file beside the target, renamed over it.

A reader never sees half of one, and whatever stood at the path (a link a child of the same user
made, a file another process has mapped) is replaced, never written through. The grade's report
(`grader.report.GradeReport.write_json`), the store's blobs (`grader.service.store`) and the
Triton cache carried into the timing child (`grader.timing_run.carry_cache`) are written so.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_whole(path: str | Path, data: bytes, *, mode: int | None = None,
                sync: bool = False) -> None:  # fmt: skip
    """Write ``data`` at ``path`` as a new file renamed into place.

    Args:
        path: Where the file ends up; its directory must exist.
        data: The whole content.
        mode: The new file's permissions (else mkstemp's 0600).
        sync: Flush it to the disk before the rename (for what must survive a crash).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


__all__ = ["write_whole"]
