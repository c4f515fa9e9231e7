"""Rendering of the timing phase: table, plot, JSON, progress and message parsing (no GPU)."""

from __future__ import annotations

import io
import json

import pytest

from grader import telemetry
from grader.config import load_config
from grader.plot import plot_speedups
from grader.report import ShapeTiming, TimingReport
from grader.timing import _Listener, _raw_shapes, render_table

CONFIG = load_config()


def report() -> TimingReport:
    ok = ShapeTiming(label="float32:32x4096:d1", t_plain_ms=10.0, t_ref_ms=4.0, t_sub_ms=3.5,
                     r=2.857, g=2.5, r_ci=(2.8, 2.9), g_ci=(2.45, 2.55), score=1.04,
                     score_ci=(1.0, 1.08), weight=2.0, floor_ms=0.055, utilisation=0.2,
                     tail_ms=0.02)
    bad = ShapeTiming(label="bfloat16:64x8192:d64", t_plain_ms=9.0, t_ref_ms=3.0, t_sub_ms=0.001,
                      score=0.0, status="implausible", reason="sub: 40 step(s) faster than "
                      "physically possible")
    return TimingReport(profile="h200", shapes=(ok, bad), score=0.0, status="implausible",
                        reason="bfloat16:64x8192:d64: too fast", rounds=40, warmup=5,
                        telemetry={"device": {"name": "NVIDIA H200"}})


def test_table_shows_every_shape_with_intervals_and_reasons() -> None:
    text = render_table(report())
    assert "float32:32x4096:d1" in text and "[2.800, 2.900]" in text and "[1.000, 1.080]" in text
    assert "implausible: sub: 40 step(s)" in text
    assert "task score 0.0000" in text and "40 rounds after 5 warm-up rounds" in text


def test_plot_is_written_as_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = plot_speedups(report(), tmp_path / "speedups.png", CONFIG.score)
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timing_report_round_trips_through_json() -> None:
    from grader.report import _from_jsonable, _to_jsonable

    data = json.loads(json.dumps(_to_jsonable(report())))
    back = _from_jsonable(TimingReport, data)
    assert back == report()


def test_listener_stamps_messages_and_draws_progress(monkeypatch) -> None:
    monkeypatch.setattr(telemetry, "snapshot", lambda label, uuid=None: telemetry.GpuSnapshot(
        label=label, wall_time=0.0))
    prof = CONFIG.timing.profiles["smoke"]
    out = io.StringIO()
    listener = _Listener(prof.shapes, out)
    samples = {n: {"window_ms": [1.0] * prof.rounds, "tail_ms": [0.01] * prof.rounds,
                   "host_ms": [1.1] * prof.rounds} for n in ("plain", "ref", "sub")}
    util = {n: dict.fromkeys(("forward", "grad_x", "conv.weight", "fc1.weight", "fc2.weight"),
                             0.1) for n in ("ref", "sub")}
    listener({"event": "hello", "device": {"uuid": "GPU-x"}})
    listener({"event": "shape_start", "index": 0, "label": "x"})
    for visit in (1, 2, 3):
        listener({"event": "progress", "visit": visit, "visits": 3})
    listener({"event": "shape_done", "index": 0, "samples": samples, "util": util, "slack": 1.5})
    # Forged or malformed messages are ignored, never fatal.
    listener({"event": "shape_done", "index": 1, "samples": samples})  # never started
    listener({"event": "shape_start", "index": 99})
    listener({"event": "shape_done", "index": 0, "samples": "junk"})  # duplicate
    listener({"event": "progress", "visit": 4, "visits": 3})
    listener({"event": "progress", "visit": "1", "visits": None})
    raws = _raw_shapes(prof, listener)
    assert list(raws) == [0]
    assert raws[0].window_ms["sub"] == [1.0] * prof.rounds and raws[0].parent_s >= 0
    assert listener.uuid == "GPU-x"
    assert [s.label for s in listener.snapshots] == [
        f"before {prof.shapes[0].label}", "timed visit 1/3", "timed visit 3/3",
        f"after {prof.shapes[0].label}"]
    text = out.getvalue()
    assert f"warming up 1/2 {prof.shapes[0].label}" in text
    assert "[########################] 3/3 timed visits (all 2 shapes in turn)" in text
    assert "4/3" not in text
    assert f"1/2 timed {prof.shapes[0].label}" in text


def test_telemetry_without_a_gpu_says_so() -> None:
    info = telemetry.device_info()
    assert info.torch_version is not None
    snap = telemetry.snapshot("now")
    assert snap.label == "now"
    merged = telemetry.merge_child(telemetry.DeviceInfo(), {"name": "NVIDIA H200",
                                                            "l2_cache_bytes": 62914560})
    assert merged.name == "NVIDIA H200" and merged.l2_cache_bytes == 62914560
    assert merged.source.endswith("+child")
