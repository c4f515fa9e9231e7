"""The grader on a GPU: compiled Triton, rules on the CUDA path, a device-side fault.

Marked ``gpu``: conftest skips them without CUDA. Each is a real ``python -m grader grade`` on a
real workspace, with the reduced CI case list except where the whole gate is the point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from grader_helpers import (
    REPO,
    assert_verdict,
    ci_config,
    corpus_entries,
    corpus_params,
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


@pytest.mark.parametrize("name", corpus_params(GPU_ENTRIES))
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


# Every other entry: its verdict on the GPU too. GRADER_TEST_POOL_THREADS=64 sizes the children's
# pools as an unpinned child's would be on a 64-core host; run with pytest-xdist (-n 4) and the
# grades are each other's neighbours on the GPU.
POOL_THREADS = int(os.environ.get("GRADER_TEST_POOL_THREADS", "0")) or None


# An entry the grader cannot catch yet (its XFAIL says why) is a strict xfail here too.
@pytest.mark.parametrize("name", corpus_params([n for n in corpus_entries()
                                                if n not in GPU_ENTRIES]))
def test_every_corpus_entry_on_gpu(name: str, tmp_path: Path) -> None:
    expected = expected_of(name)
    ws = corpus_workspace(name, tmp_path / "ws")
    config = ci_config(tmp_path / "s.yaml", gate_wall_s=expected.gate_wall_s,
                       gate_memory_mb=expected.gate_memory_mb,
                       deadline_floor_s=expected.deadline_floor_s, pool_threads=POOL_THREADS)
    run = run_grade(ws, config, tmp_path / "r.json", "--profile", "smoke")
    report = run.report
    if expected.verdict == "pass" and report.status is Status.TIMING_FAILED \
            and report.timing is not None and report.timing.status == "void":
        # Run with -n 4 beside the timing corpus, the neighbours can move the smoke profile's
        # baselines (a 2x256 step is mostly launch overhead): `void` is the grader saying
        # "regrade", not a verdict on the entry, whose gate and rules must still pass clean.
        assert all(c.passed for c in report.cases) and not [
            f for f in report.findings if f.severity.value == "violation"], report.reasons
    else:
        assert_verdict(run, expected, untimed_pass=False)
    assert report.system.device.startswith("cuda")


def test_gpu_memory_accounting_ignores_a_neighbour() -> None:
    """This process holds 4 GiB on the GPU; a child reading its own memory from NVML sees only
    its own context and pool."""
    import torch

    hog = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    code = ("import json, torch; from grader.child import steps; torch.empty(1, device='cuda'); "
            "print(json.dumps(steps.process_gpu_bytes(torch)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    used, how = json.loads(out.stdout.splitlines()[-1])
    del hog
    if used is None:
        pytest.skip(f"NVML cannot account per process here: {how}")
    assert how == "nvml per-process"
    assert 0 < used < 2 << 30, used


# These fill the GPU: beside other grades (pytest -n 4 over this file) they would crowd them too.
# bench/gpu_session.sh crowded runs them alone, with GRADER_TEST_CROWDED=1.
crowding = pytest.mark.skipif(not os.environ.get("GRADER_TEST_CROWDED"),
                              reason="fills the GPU: run alone with GRADER_TEST_CROWDED=1")


def _hog(keep_gib: float, grow_keep_gib: float | None = None) -> subprocess.Popen[str]:
    """bench/grade/gpu_hog.py: a neighbour holding all but ``keep_gib`` of the GPU until its stdin
    closes (with ``grow_keep_gib``: all but that, once the grade's first process appears)."""
    cmd = [sys.executable, str(REPO / "bench" / "grade" / "gpu_hog.py"), "--keep-gib", str(keep_gib)]
    if grow_keep_gib is not None:
        cmd += ["--grow-keep-gib", str(grow_keep_gib)]
    hog = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    line = hog.stdout.readline() if hog.stdout is not None else ""  # once it holds the memory
    assert line.startswith(f"hog pid {hog.pid} holds "), (line, hog.poll())
    return hog


@crowding
@pytest.mark.parametrize("entry", ["naive_triton", "wrong_conv_grad"])
@pytest.mark.parametrize("mode", ["fill", "grow"])
def test_a_crowded_gpu_never_blames_the_submission(mode: str, entry: str, tmp_path: Path) -> None:
    """Issue 38: another process holds all but 4 GiB of the GPU (fill: the grade's start check
    refuses to begin) or fills it once the grade started (grow: whatever ran out is judged). The
    naive control ends scored or grader_error, the wrong gradient gate_failed or grader_error;
    a grader_error names the neighbour; never out_of_memory."""
    from grader import device_memory
    from grader.config import load_config
    from grader.report import DEVICE_SHORT

    ws = corpus_workspace(entry, tmp_path / "ws")
    peak = load_config().timing.profiles["smoke"].peak_device_memory_gib
    hog = _hog(4.0) if mode == "fill" else _hog(peak + 2.5, 2.0)
    try:
        seen = device_memory.read_device(index=0)
        run = run_grade(ws, ci_config(tmp_path / "s.yaml"), tmp_path / "r.json",
                        "--profile", "smoke", timeout=300)  # fmt: skip
    finally:
        if hog.stdin is not None:
            hog.stdin.close()
        hog.wait(30)
    report = run.report
    allowed = ({Status.SCORED, Status.GRADER_ERROR} if entry == "naive_triton"
               else {Status.GATE_FAILED, Status.GRADER_ERROR})  # fmt: skip
    assert report.status in allowed, report.reasons
    if mode == "fill":
        assert report.status is Status.GRADER_ERROR, report.reasons  # 4 GiB < the profile's peak
    if report.status is Status.GRADER_ERROR:
        assert report.reasons[0].startswith(DEVICE_SHORT), report.reasons
        # NVML names processes by the host's pids: inside a PID namespace the hog's differs.
        if seen is not None and hog.pid in {p.pid for p in seen.processes}:
            assert f"pid {hog.pid} " in report.reasons[0], report.reasons


@crowding
def test_a_crowded_gpu_still_blames_a_submission_over_its_own_share(tmp_path: Path) -> None:
    """Issue 38's other half: a submission that allocates GPU memory without bound is its own
    crowd; its process goes over its share and the verdict is out_of_memory."""
    from grader_helpers import NAIVE, make_workspace

    hoard = ("import torch\nfrom naive_triton import DilatedResidualBlock as _Naive\n\n"
             "_hoard = []\n\n\nclass DilatedResidualBlock(_Naive):\n"
             "    def forward(self, x):\n        while True:\n"
             "            _hoard.append(torch.empty(1 << 30, dtype=torch.uint8, "
             "device=x.device))\n")  # fmt: skip
    ws = make_workspace(tmp_path / "ws", {"naive_triton.py": NAIVE.read_text(),
                                          "solution.py": hoard})  # fmt: skip
    run = run_grade(ws, ci_config(tmp_path / "s.yaml"), tmp_path / "r.json",
                    "--profile", "smoke", timeout=300)  # fmt: skip
    assert run.report.status is Status.OUT_OF_MEMORY, run.report.reasons
    assert "over its share of 10.0 GiB" in run.report.reasons[0], run.report.reasons
