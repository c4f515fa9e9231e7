"""``python -m grader grade`` as an operator runs it: exit codes, JSON, the uncommitted flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from grader_helpers import NAIVE, REPO, ci_config, make_workspace, run_grade

from grader.report import ExitCode, Status


def test_invalid_submission_exit_code(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"README.md": "no solution here\n"})
    run = run_grade(ws, None, tmp_path / "r.json", "--cpu")
    assert run.report.status is Status.INVALID_SUBMISSION
    assert run.returncode == ExitCode.INVALID_SUBMISSION
    assert run.report.score == 0.0 and "solution.py" in run.report.reasons[0]


def test_import_error_is_load_failed(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"solution.py": "import does_not_exist\n"})
    run = run_grade(ws, ci_config(tmp_path / "s.yaml"), tmp_path / "r.json", "--cpu")
    assert run.report.status is Status.LOAD_FAILED, run.report.reasons
    assert "does_not_exist" in run.report.reasons[0]


@pytest.mark.slow
def test_uncommitted_changes_are_ignored_and_said(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"solution.py": NAIVE.read_text()})
    (ws / "solution.py").write_text("raise SystemExit('this edit is not committed')\n")
    run = run_grade(ws, ci_config(tmp_path / "s.yaml"), tmp_path / "r.json", "--cpu")
    assert run.report.status is Status.CHECKED_UNTIMED, run.report.reasons
    assert run.report.uncommitted_changes_ignored
    assert run.report.score is None and run.returncode == ExitCode.CHECKED_UNTIMED
    assert "NOT graded" in run.stdout and "timing and score: no GPU" in run.stdout


def test_usage_error_exit_code() -> None:
    proc = subprocess.run([sys.executable, "-m", "grader", "grade"], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == ExitCode.USAGE
