"""The timing phase end to end without a GPU: a dry run on the CPU (Triton interpreter).

The whole path (the trusted baselines process and the sandboxed submission process, the slab
they share as a file, the authenticated channel, the rule guard and the launch census on every
step, rounds with values drawn from the parent's seeds, per-round checks by the baselines
process, the parent's clock and verdicts) runs with the host clock in place of CUDA events; the
times mean nothing, and the clock and drift rules are not judged on them. The GPU-only defenses
(streams, events, memory, the floor) are in test_timing_gpu.py.
"""

from __future__ import annotations

import dataclasses
import io
import time

import pytest
from timing_workspace import CORPUS, make_workspace, with_profile

from grader.config import Profile, Shape, load_config
from grader.timing import run_timing

# Two shapes, timed interleaved: two visits of one cycle (6 rounds) each.
PROFILE = Profile(gpus=(), warmup=1, rounds=12, alone_rounds=2,
                  shapes=(Shape(2, 64, 3, "float32"), Shape(1, 16, 1, "float32")))
CONFIG = with_profile(load_config(), "dry", PROFILE)


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("triton-cache")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "status", "reason"),
    [
        ("control_reference", "ok", ""),
        ("input_pointer_cache", "check_failed", "timed forward differs from"),
        # The reference runs in another process: there is nothing to borrow, and the block
        # runs its own copy.
        ("borrows_reference_kernels", "ok", ""),
        ("forges_channel_results", "rule_broken", "channel-tampering"),
        ("slows_baselines_via_autograd_hook", "rule_broken", "global-state"),
    ],
)
def test_dry_run_on_cpu(case: str, status: str, reason: str, tmp_path, triton_cache) -> None:
    ws = make_workspace(tmp_path / "ws", (CORPUS / case / "solution.py").read_text())
    progress = io.StringIO()
    report = run_timing(ws, CONFIG, profile="dry", progress=progress, triton_cache=triton_cache,
                        dry_run_on_cpu=True)
    detail = f"{report.status}: {report.reason} | {report.telemetry.get('child_stderr_tail')}"
    assert report.status == status, detail
    assert reason in report.reason.lower(), detail
    assert report.telemetry["dry_run"] is True
    if status == "ok":
        for shape in report.shapes:
            assert shape.status == "ok" and shape.utilisation is not None
            assert shape.utilisation <= 1.5 and shape.t_sub_ms > 0
        # The baselines alone first, then both shapes warm up, then their timed rounds take
        # turns.
        lines = progress.getvalue().splitlines()
        a, b = (s.label for s in PROFILE.shapes)
        assert lines == [f"baselines alone: warming up 1/2 {a}",
                         f"baselines alone: warming up 2/2 {b}",
                         "baselines alone: 1 rounds of each shape",
                         f"warming up 1/2 {a}", f"warming up 2/2 {b}",
                         "1/2 timed visits (all 2 shapes in turn)",
                         "2/2 timed visits (all 2 shapes in turn)",
                         "baselines alone again: 1 rounds of each shape"], progress.getvalue()


@pytest.mark.slow
def test_a_hang_while_timed_ends_at_its_stage_deadline(tmp_path, triton_cache) -> None:
    """The hang comes after the warm-ups, in a timed step: the step's deadline ends it."""
    rule = dataclasses.replace(CONFIG.limits.deadlines.cpu, floor_s=30.0, plain_multiple=300.0)
    config = dataclasses.replace(CONFIG, limits=dataclasses.replace(
        CONFIG.limits, deadlines=dataclasses.replace(CONFIG.limits.deadlines, cpu=rule)))
    ws = make_workspace(tmp_path / "ws",
                        (CORPUS / "hangs_while_timed" / "solution.py").read_text())
    started = time.monotonic()
    report = run_timing(ws, config, profile="dry", progress=None, triton_cache=triton_cache,
                        dry_run_on_cpu=True)
    assert report.status == "timed_out", report.reason
    assert "ran past its deadline: a step of sub in" in report.reason, report.reason
    assert report.score == 0.0
    assert time.monotonic() - started < 240
