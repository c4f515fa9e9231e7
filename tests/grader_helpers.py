"""Helpers for the grader's tests: real git workspaces, the corpus, a reduced CI config.

Workspaces are real git repositories committed in a temp dir; grades run as real subprocesses
(``python -m grader grade``), exactly as an operator runs them.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from grader.report import GradeReport, Status

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "corpus"
NAIVE = CORPUS / "naive_triton" / "solution.py"
# Reduced case list for CPU CI (the real grade runs every smoke case): a tiny odd width, the fp16
# case and the offset family (which traps a naive variance), plus the smoke drift case.
CI_CASES = ("c3-l2", "c7-l33-d2-f16", "c16-l1024-offset")
_GIT_ID = ["-c", "user.name=grader-tests", "-c", "user.email=tests@example.invalid"]


def git(cwd: Path, *args: str) -> str:
    out = subprocess.run(["git", *_GIT_ID, *args], cwd=cwd, check=True, capture_output=True,
                         text=True)  # fmt: skip
    return out.stdout.strip()


def make_workspace(path: Path, files: dict[str, str | bytes], message: str = "submit") -> Path:
    """A git repository at ``path`` holding ``files``, committed."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", message)
    return path


def corpus_entries() -> list[str]:
    return sorted(p.name for p in CORPUS.iterdir() if (p / "solution.py").is_file())


def corpus_params(names: list[str] | tuple[str, ...]) -> list[object]:
    """``names`` for ``pytest.mark.parametrize``: an entry the grader cannot catch yet (its
    ``XFAIL`` says why) is a strict xfail, so the day it is caught its test fails until the
    marker goes."""
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=expected_of(n).xfail))
            if expected_of(n).xfail else n for n in names]


@dataclass(frozen=True)
class Expected:
    """What a corpus entry declares about itself (module-level constants, read with ``ast``)."""

    verdict: str  # "pass" or "fail:<status>:<category>"
    passing_kinds: tuple[str, ...] = ()
    gpu_only: bool = False
    gate_wall_s: float | None = None
    gate_memory_mb: int | None = None
    deadline_floor_s: float | None = None  # the deadlines' floor, to catch a hang in CI time
    xfail: str = ""  # why the grader cannot catch it yet (the test is a strict xfail)

    @property
    def status(self) -> str:
        return "pass" if self.verdict == "pass" else self.verdict.split(":")[1]

    @property
    def category(self) -> str:
        return "" if self.verdict == "pass" else self.verdict.split(":", 2)[2]


def expected_of(name: str) -> Expected:
    tree = ast.parse((CORPUS / name / "solution.py").read_text())
    consts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.isupper():
                try:
                    consts[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return Expected(
        verdict=consts["EXPECTED"],
        passing_kinds=tuple(consts.get("PASSING_KINDS", ())),
        gpu_only=bool(consts.get("GPU_ONLY", False)),
        gate_wall_s=consts.get("GATE_WALL_S"),
        gate_memory_mb=consts.get("GATE_MEMORY_MB"),
        deadline_floor_s=consts.get("DEADLINE_FLOOR_S"),
        xfail=consts.get("XFAIL", ""),
    )


def corpus_workspace(name: str, path: Path) -> Path:
    """The entry's files, plus the naive control as the helper module ``naive_triton.py``."""
    files: dict[str, str | bytes] = {"naive_triton.py": NAIVE.read_text()}
    for f in (CORPUS / name).rglob("*"):
        if f.is_file() and "__pycache__" not in f.parts:
            files[f.relative_to(CORPUS / name).as_posix()] = f.read_bytes()
    return make_workspace(path, files)


def reference_workspace(path: Path) -> Path | None:
    """A workspace whose solution re-exports a *copy* of the repo's reference (None if absent).

    The copy is the submission's own code, so the path-based rule must let it pass.
    """
    src = REPO / "reference"
    if not (src / "block.py").is_file():
        return None
    files: dict[str, str | bytes] = {
        "solution.py": '"""Control: a copy of the reference."""\n\n'
        "from reference.block import DilatedResidualBlock\n\n"
        '__all__ = ["DilatedResidualBlock"]\nEXPECTED = "pass"\n'
    }
    for f in src.rglob("*"):
        if f.is_file() and "__pycache__" not in f.parts and f.suffix in (".py", ".json"):
            files[f"reference/{f.relative_to(src).as_posix()}"] = f.read_bytes()
    return make_workspace(path, files)


def ci_config(path: Path, cases: tuple[str, ...] = CI_CASES, *, gate_wall_s: float | None = None,
              gate_memory_mb: int | None = None, deadline_floor_s: float | None = None,
              pool_threads: int | None = None) -> Path:  # fmt: skip
    """scoring.yaml with a reduced case list (one seed each) and optional gate limits: the
    deadlines' floor (both devices), and the children's pool size (every phase; 64 is what an
    unpinned child would hold on a 64-core host)."""
    data = yaml.safe_load((REPO / "scoring.yaml").read_text())
    kept = [dict(c, seeds=c["seeds"][:1]) for c in data["correctness"]["cases"]
            if c["name"] in cases]  # fmt: skip
    assert len(kept) == len(cases), f"CI cases {cases} not all in scoring.yaml"
    for c in kept:
        c["smoke"] = True
    data["correctness"]["cases"] = kept
    if gate_wall_s is not None:
        data["limits"]["gate"]["wall_s"] = gate_wall_s
    if gate_memory_mb is not None:
        data["limits"]["gate"]["memory_mb"] = gate_memory_mb
    if deadline_floor_s is not None:
        for rule in data["limits"]["deadlines"].values():
            rule["floor_s"] = deadline_floor_s
    if pool_threads is not None:
        for phase in ("load", "gate", "timing"):
            data["limits"][phase]["pool_threads"] = pool_threads
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass(frozen=True)
class GradeRun:
    returncode: int
    report: GradeReport
    stdout: str
    stderr: str


def run_grade(workspace: Path, config: Path | None, out_json: Path, *extra: str,
              timeout: float = 900) -> GradeRun:  # fmt: skip
    """``python -m grader grade`` in a subprocess; the JSON report parsed back."""
    cmd = [sys.executable, "-m", "grader", "grade", str(workspace), "--json", str(out_json),
           "--quiet", *extra]  # fmt: skip
    if config is not None:
        cmd += ["--config", str(config)]
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    if not out_json.is_file():
        raise AssertionError(f"no report; rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    report = GradeReport.from_dict(json.loads(out_json.read_text()))
    return GradeRun(proc.returncode, report, proc.stdout, proc.stderr)


def assert_verdict(run: GradeRun, expected: Expected, *, untimed_pass: bool = True) -> None:
    """The report's status, exit code and reason category match what the entry declares."""
    report = run.report
    context = f"\nreasons: {report.reasons}\nstdout:\n{run.stdout[-3000:]}"
    assert run.returncode == int(report.exit_code), context
    if expected.verdict == "pass":
        want = {Status.CHECKED_UNTIMED, Status.SCORED} if untimed_pass else {Status.SCORED}
        assert report.status in want, context
        assert all(c.passed for c in report.cases), context
        return
    assert report.status.value == expected.status, context
    assert report.score == 0.0, context
    assert report.reasons, context
    alternatives = expected.category.split("|")
    if report.status is Status.RULE_BROKEN:
        rules = {f.rule for f in report.findings if f.severity.value == "violation"}
        assert rules & set(alternatives), f"rules {rules}{context}"
    elif report.status is Status.GATE_FAILED:
        failed = {ch.name for c in report.cases if not c.passed for ch in c.checks
                  if not ch.passed}  # fmt: skip
        assert any(f.startswith(a) for f in failed for a in alternatives), f"{failed}{context}"
    else:
        text = " ".join(report.reasons)
        assert any(a in text for a in alternatives), context
    for kind in expected.passing_kinds:
        cases = [c for c in report.cases if c.kind == kind]
        assert cases and all(c.passed for c in cases), f"{kind} should pass{context}"


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)
