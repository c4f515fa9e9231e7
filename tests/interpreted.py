"""One Python run under the Triton interpreter, in a fresh process.

``TRITON_INTERPRET=1`` must be set before Triton kernels are imported, and the interpreter
detects no out-of-bounds access, so every interpreted check runs in a process of its own with a
timeout. The process prints its results as JSON on its last line of standard output.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy
import pytest
import triton

ROOT = Path(__file__).resolve().parent.parent


def run_interpreted(args: list[str], timeout: float) -> Any:
    """``python *args`` with ``TRITON_INTERPRET=1`` (one OpenMP thread, the repository on the
    path and as the working directory): the JSON on the last line it printed.

    Raises:
        RuntimeError: The process exited non-zero (its return code and standard error's tail).
        subprocess.TimeoutExpired: It ran past ``timeout`` seconds.
    """
    # Triton 3.6's interpreter turns a loop bound into an int with a NumPy call that NumPy 2.4
    # removed (TypeError: only 0-dimensional arrays ...); the device's image has NumPy 2.5.
    if _version(triton.__version__)[:2] == (3, 6) and _version(numpy.__version__) >= (2, 4):
        pytest.skip(f"Triton {triton.__version__}'s interpreter breaks with NumPy "
                    f"{numpy.__version__} (>= 2.4); requirements-cpu.txt pins numpy<2.4")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"runner rc={proc.returncode}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _version(text: str) -> tuple[int, ...]:
    """``"2.5.2"`` → ``(2, 5, 2)``; a suffix such as ``rc1`` or ``+cu130`` ends the numbers."""
    numbers = []
    for part in text.split("+")[0].split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        numbers.append(int(match.group()))
        if match.end() < len(part):
            break
    return tuple(numbers)


__all__ = ["run_interpreted"]
