"""Helpers for GPU timing tests and benchmarks: workspaces built on a copy of the reference."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

from grader.config import Profile, ScoringConfig, Shape

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "corpus_timing"
# A solution.py that submits the reference copied in by `make_workspace`: the reference timed
# against itself (reproducibility and interval-coverage benchmarks).
REFERENCE_SOLUTION = (
    '"""The reference as the submission."""\n\n'
    "from reference.block import DilatedResidualBlock\n"
)
_EXPECTED = re.compile(r"^Expected: (.+?)\s*$", re.MULTILINE)
_VERDICT = re.compile(r"^(\w+)(?: \((.+)\))?$")


def expected_verdicts(case: Path) -> list[tuple[str, str | None]]:
    """[(status, substring of the reason)] from the ``Expected:`` line of a case's docstring:
    ``Expected: <status> (<reason>)``, alternatives joined by `` or ``."""
    text = (case / "solution.py").read_text()
    match = _EXPECTED.search(text)
    if match is None:
        raise ValueError(f"{case}/solution.py has no 'Expected: <status> (<reason>)' line")
    out = []
    for part in match.group(1).split(" or "):
        verdict = _VERDICT.match(part.strip())
        if verdict is None:
            raise ValueError(f"{case}/solution.py: cannot read the verdict {part!r}")
        out.append((verdict.group(1), verdict.group(2)))
    return out


def make_workspace(dest: Path, solution: str, *, git: bool = False) -> Path:
    """A submission tree: ``reference/`` copied in (the submission's own files), ``solution.py``.

    Args:
        dest: Directory to create.
        solution: Text of ``solution.py``.
        git: Also make it a git repository with one commit (for a whole grade).
    """
    dest.mkdir(parents=True)
    shutil.copytree(REPO / "reference", dest / "reference",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (dest / "solution.py").write_text(solution)
    if git:
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "commit", "-q", "-m", "reference as submission"]):
            subprocess.run(cmd, cwd=dest, env=env, check=True)
    return dest


def with_profile(config: ScoringConfig, name: str, profile: Profile) -> ScoringConfig:
    """``config`` with one more timing profile."""
    profiles = {**config.timing.profiles, name: profile}
    return dataclasses.replace(config, timing=dataclasses.replace(config.timing,
                                                                  profiles=profiles))


def small_profile(warmup: int = 3, rounds: int = 12) -> Profile:
    """One GPU-bound fp32 shape (on an H200) and few rounds: enough to trip every defense."""
    return Profile(gpus=(), peak_device_memory_gib=10.0, warmup=warmup, rounds=rounds,
                   shapes=(Shape(batch=32, length=4096, dilation=1, dtype="float32"),),
                   description="timing regression corpus")
