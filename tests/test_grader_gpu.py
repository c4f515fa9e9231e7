"""The grader on a GPU: compiled Triton, rules on the CUDA path, a device-side fault.

Marked ``gpu``: conftest skips them without CUDA. Each is a real ``python -m grader grade`` on a
real workspace, with the reduced CI case list except where the whole gate is the point.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from grader_helpers import (
    assert_verdict,
    ci_config,
    corpus_workspace,
    expected_of,
    reference_workspace,
    run_grade,
)

from grader.report import Status

pytestmark = pytest.mark.gpu

# GPU-only entries plus those whose rule lives on the CUDA path (threads and state of the CUDA
# runtime, compiled kernels); the rest are covered on the CPU by test_grader_corpus.py.
GPU_ENTRIES = ("device_fault", "plain_pytorch", "starts_thread", "changes_tf32")


@pytest.mark.parametrize("name", GPU_ENTRIES)
def test_corpus_on_gpu(name: str, tmp_path: Path) -> None:
    expected = expected_of(name)
    ws = corpus_workspace(name, tmp_path / "ws")
    # No timing: the verdicts are the gate's and the rules'; timing has its own tests.
    run = run_grade(ws, ci_config(tmp_path / "s.yaml"), tmp_path / "r.json", "--profile", "smoke")
    if expected.verdict == "pass":
        assert run.report.status in (Status.SCORED, Status.CHECKED_UNTIMED, Status.TIMING_FAILED)
    else:
        assert_verdict(run, expected)
    assert run.report.system.device.startswith("cuda")


def test_naive_passes_ci_gate_on_gpu(tmp_path: Path) -> None:
    ws = corpus_workspace("naive_triton", tmp_path / "ws")
    run = run_grade(ws, ci_config(tmp_path / "s.yaml"), tmp_path / "r.json", "--profile", "smoke")
    assert all(c.passed for c in run.report.cases), run.report.reasons
    assert not [f for f in run.report.findings if f.severity.value == "violation"], run.report


def test_reference_copy_passes_ci_gate_on_gpu(tmp_path: Path) -> None:
    ws = reference_workspace(tmp_path / "ws")
    if ws is None:
        pytest.skip("reference/block.py does not exist yet")
    run = run_grade(ws, ci_config(tmp_path / "s.yaml"), tmp_path / "r.json", "--profile", "smoke")
    assert all(c.passed for c in run.report.cases), run.report.reasons
    assert not [f for f in run.report.findings if f.severity.value == "violation"], run.report
