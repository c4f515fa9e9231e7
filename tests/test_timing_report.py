"""Rendering of the timing phase: table, plot, JSON, progress lines and the raw samples' shaping
(no GPU)."""

from __future__ import annotations

import dataclasses
import io
import json
import math

import pytest
from interleave_fakes import install

from grader import telemetry
from grader.config import Profile, Shape, load_config
from grader.plot import plot_speedups, target
from grader.report import ShapeTiming, TimingReport, render_timing
from grader.samples import ShapeRaw
from grader.timing_run import _overheads, run_timing

CONFIG = load_config()
SHAPE = Shape(32, 4096, 1, "float32")


def report() -> TimingReport:
    # The scored shape's target, 3.0, is margin 1.2 × g: settings other than scoring.yaml's.
    ok = ShapeTiming(label="float32:32x4096:d1", t_plain_ms=10.0, t_ref_ms=4.0, t_sub_ms=3.5,
                     r=2.857, g=2.5, r_ci=(2.8, 2.9), g_ci=(2.45, 2.55), target=3.0, score=1.04,
                     score_ci=(1.0, 1.08), weight=2.0, floor_ms=0.055, utilisation=0.2,
                     tail_ms=0.02)
    bad = ShapeTiming(label="bfloat16:64x8192:d64", t_plain_ms=9.0, t_ref_ms=3.0, t_sub_ms=0.001,
                      score=0.0, status="implausible", reason="sub: 40 step(s) faster than "
                      "physically possible")
    return TimingReport(profile="h200", shapes=(ok, bad), score=0.0, status="implausible",
                        reason="bfloat16:64x8192:d64: too fast", rounds=40, warmup=5,
                        telemetry={"device": {"name": "NVIDIA H200"}})


def test_table_shows_every_shape_with_intervals_and_reasons() -> None:
    text = render_timing(report())
    assert "float32:32x4096:d1" in text and "[2.800, 2.900]" in text and "[1.000, 1.080]" in text
    assert "implausible: sub: 40 step(s)" in text
    assert "task score 0.0000" in text and "40 rounds after 5 warm-up rounds" in text
    head, ok, bad = text.splitlines()[1:4]
    # The target column: the r that scores 1, "-" where the shape was not scored.
    end = head.index(" target ") + len(" target")
    assert (ok[end - 6:end], bad[end - 6:end]) == (" 3.000", "     -"), (head, ok, bad)


def test_the_plot_ticks_the_target_the_report_was_scored_against() -> None:
    """A report's own target wins over the settings the caller has now (the dashboard's
    scoring.yaml may differ from the one a worker graded with); a report written before shapes
    carried one falls back to those settings; a shape with neither has no tick."""
    ok, bad = report().shapes
    assert target(ok, CONFIG.score) == 3.0 != CONFIG.score.target(ok.g)
    older = dataclasses.replace(ok, target=None)
    assert target(older, CONFIG.score) == pytest.approx(CONFIG.score.target(2.5))
    assert target(older) is None and target(bad, CONFIG.score) is None


def test_plot_is_written_as_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = plot_speedups(report(), tmp_path / "speedups.png", CONFIG.score)
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timing_report_round_trips_through_json() -> None:
    from grader.report import _from_jsonable, _to_jsonable

    data = json.loads(json.dumps(_to_jsonable(report())))
    back = _from_jsonable(TimingReport, data)
    assert back == report()


def test_run_timing_draws_progress_by_phase(monkeypatch, tmp_path) -> None:
    """The progress lines of a run with the fake children (tests/interleave_fakes.py): the
    baselines alone, each shape's warm-up, each timed visit; the snapshots beside them."""
    install(monkeypatch)
    shapes = (Shape(32, 4096, 1, "float32"), Shape(32, 4096, 2, "bfloat16"))
    prof = Profile(gpus=(), warmup=1, rounds=18, alone_rounds=4, shapes=shapes,
                   peak_device_memory_gib=10.0)
    cfg = dataclasses.replace(CONFIG, timing=dataclasses.replace(
        CONFIG.timing, profiles={**CONFIG.timing.profiles, "t": prof}))
    (tmp_path / "solution.py").write_text("")
    out = io.StringIO()
    report = run_timing(tmp_path, cfg, profile="t", progress=out)
    assert report.status == "ok", report.reason
    a, b = (s.label for s in shapes)
    assert out.getvalue().splitlines() == [
        f"baselines alone: warming up 1/2 {a}",
        f"baselines alone: warming up 2/2 {b}",
        "baselines alone: 2 rounds of each shape",
        f"warming up 1/2 {a}",
        f"warming up 2/2 {b}",
        "1/3 timed visits (all 2 shapes in turn)",
        "2/3 timed visits (all 2 shapes in turn)",
        "3/3 timed visits (all 2 shapes in turn)",
        "baselines alone again: 2 rounds of each shape",
    ]
    assert [s["label"] for s in report.telemetry["snapshots"]] == [
        "baselines alone", f"before {a}", f"before {b}", "timed visit 1/3", "timed visit 3/3"]
    rows = render_timing(report).splitlines()[2:]
    assert [row.split()[0] for row in rows[:2]] == [a, b]
    assert all(row.endswith(" ok") for row in rows[:2]) and rows[2].endswith("status ok")


def test_a_silent_run_prints_nothing(monkeypatch, tmp_path, capsys) -> None:
    install(monkeypatch)
    prof = Profile(gpus=(), peak_device_memory_gib=10.0, warmup=1, rounds=6, alone_rounds=2,
                   shapes=(Shape(32, 4096, 1, "float32"),))
    cfg = dataclasses.replace(CONFIG, timing=dataclasses.replace(
        CONFIG.timing, profiles={**CONFIG.timing.profiles, "t": prof}))
    (tmp_path / "solution.py").write_text("")
    assert run_timing(tmp_path, cfg, profile="t", progress=None).status == "ok"
    assert capsys.readouterr() == ("", "")


def test_the_worst_utilisation_is_the_submissions_and_nan_is_infinite() -> None:
    """The judge reads the driver's samples as they are: the worst check of the submission's
    rows (the reference's row is the baselines' own), a NaN the worst there is."""
    measured = ShapeRaw(SHAPE)
    measured.util += [[[0.1, 0.2, 0.3, 0.4, 0.5], [0.5, 0.4, 0.3, 0.2, 0.1]],
                      [[0.3, 0.1, 0.1, 9.0, 0.1], [0.1, 0.9, 0.1, 0.1, 0.1]]]
    assert measured.worst_utilisation() == 0.9
    measured.util.append([[0.1] * 5, [0.1, 0.1, float("nan"), 0.1, 0.1]])
    assert measured.worst_utilisation() == math.inf
    # No round with the submission: no check numbers (the analysis says so).
    assert ShapeRaw(SHAPE).worst_utilisation() is None


def test_overheads_are_the_median_gap_of_each_block_over_every_shape() -> None:
    one, two = ShapeRaw(SHAPE), ShapeRaw(SHAPE)
    one.window_ms.update(plain=[5.0, 5.0], ref=[2.0], sub=[1.0, 1.0])
    one.wall_ms.update(plain=[5.2, 5.4], ref=[2.3], sub=[1.1, 1.2])
    two.window_ms.update(plain=[5.0], sub=[1.0])
    two.wall_ms.update(plain=[5.3], sub=[1.9])
    one.calibration_ms.extend([0.4, 0.6])
    two.calibration_ms.append(0.9)
    got = _overheads([one, two])
    assert got["plain"] == pytest.approx(0.3) and got["ref"] == pytest.approx(0.3)
    assert got["sub"] == pytest.approx(0.2) and got["cal"] == pytest.approx(0.6)
    assert _overheads([ShapeRaw(SHAPE)]) == {"plain": None, "ref": None, "sub": None, "cal": None}


def test_telemetry_without_a_gpu_says_so() -> None:
    info = telemetry.device_info()
    assert info.torch_version is not None
    snap = telemetry.snapshot("now")
    assert snap.label == "now"
    merged = telemetry.merge_child(telemetry.DeviceInfo(), {"name": "NVIDIA H200",
                                                            "l2_cache_bytes": 62914560})
    assert merged.name == "NVIDIA H200" and merged.l2_cache_bytes == 62914560
    assert merged.source.endswith("+child")
