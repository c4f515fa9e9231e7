"""run_timing's judgement of what a (fake) timing child said: statuses, reasons, clock bounds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import grader.sandbox as sandbox
from grader import telemetry
from grader.config import Profile, Shape, load_config
from grader.sandbox import ChildResult, Outcome
from grader.timing import run_timing

ROUNDS = 6
PROFILE = Profile(gpus=(), warmup=1, rounds=ROUNDS, shapes=(
    Shape(32, 4096, 1, "float32"), Shape(32, 4096, 1, "bfloat16")))
KEYS = ("forward", "grad_x", "conv.weight", "fc1.weight", "fc2.weight")


def config():
    import dataclasses

    cfg = load_config()
    timing = dataclasses.replace(cfg.timing, profiles={**cfg.timing.profiles, "t": PROFILE})
    return dataclasses.replace(cfg, timing=timing)


def shape_messages(index: int, sub_ms: float = 2.0) -> list[dict]:
    samples = {n: {"window_ms": [t] * ROUNDS, "tail_ms": [0.02] * ROUNDS,
                   "host_ms": [t + 0.05] * ROUNDS}
               for n, t in (("plain", 6.0), ("ref", 3.0), ("sub", sub_ms))}
    util = {n: dict.fromkeys(KEYS, 0.1) for n in ("ref", "sub")}
    return [{"event": "shape_start", "index": index},
            {"event": "shape_done", "index": index, "samples": samples, "util": util,
             "slack": 1.5}]


def fake_child(monkeypatch, messages: list[dict], outcome: Outcome = Outcome.OK,
               pause_s: float = 0.0, wall_s: float = 60.0) -> None:
    monkeypatch.setattr(telemetry, "snapshot", lambda label, uuid=None, index=0:
                        telemetry.GpuSnapshot(label=label, wall_time=0.0))
    monkeypatch.setattr(telemetry, "device_info", lambda uuid=None, index=0:
                        telemetry.DeviceInfo(name="NVIDIA H200", max_memory_clock_mhz=3201.0,
                                             memory_bus_width_bits=6144, source="test"))

    def run_child(script, workdir, args, limits, env_extra=None, on_message=None, **kw):
        assert (Path(workdir) / "solution.py").exists()
        for m in messages:
            if m.get("event") == "shape_done":
                time.sleep(pause_s)
            on_message(m)
        return ChildResult(outcome=outcome, exit_code=0 if outcome is Outcome.OK else None,
                           signal=None, wall_s=wall_s, peak_rss_mb=1.0, peak_tasks=1,
                           detail="" if outcome is Outcome.OK else "ran past its limit")

    monkeypatch.setattr(sandbox, "run_child", run_child)


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "solution.py").write_text("")
    return tmp_path


def run(ws):
    return run_timing(ws, config(), profile="t", progress=None, seed=1)


def test_an_honest_run_is_scored_with_intervals(monkeypatch, ws) -> None:
    fake_child(monkeypatch, [{"event": "hello", "device": {}}, *shape_messages(0),
                             *shape_messages(1), {"event": "done"}], pause_s=0.1)
    report = run(ws)
    assert report.status == "ok", report.reason
    assert [s.status for s in report.shapes] == ["ok", "ok"]
    assert report.shapes[0].r == pytest.approx(3.0) and report.shapes[0].g == pytest.approx(2.0)
    assert 0 < report.score < 3 and report.score_ci is not None
    assert report.telemetry["peak_bandwidth_source"] == "memory clock × bus width"
    assert len(report.telemetry["snapshots"]) == 4


@pytest.mark.parametrize(
    ("failure", "status"),
    [
        ({"kind": "rule", "rule": "timer-patched", "reason": "time.perf_counter was replaced"},
         "rule_broken"),
        ({"kind": "check", "reason": "forward differs"}, "check_failed"),
        ({"kind": "oom", "reason": "out of GPU memory"}, "out_of_memory"),
        ({"kind": "crash", "reason": "the step raised"}, "crashed"),
        ({"kind": "load", "reason": "import failed"}, "crashed"),
    ],
)
def test_a_child_failure_fails_the_phase_with_its_reason(monkeypatch, ws, failure, status):
    fake_child(monkeypatch, [*shape_messages(0), {"event": "failure", **failure}])
    report = run(ws)
    assert report.status == status and failure["reason"] in report.reason
    assert report.score == 0.0 and all(s.score == 0.0 for s in report.shapes)
    assert report.shapes[1].status == "not_timed"


def test_a_finding_without_failure_still_breaks_the_rules(monkeypatch, ws) -> None:
    fake_child(monkeypatch, [*shape_messages(0), *shape_messages(1),
                             {"event": "finding", "rule": "new-thread", "message": "a thread"},
                             {"event": "done"}], pause_s=0.1)
    report = run(ws)
    assert report.status == "rule_broken" and "new-thread" in report.reason


def test_a_child_killed_by_the_watchdog_times_out(monkeypatch, ws) -> None:
    fake_child(monkeypatch, shape_messages(0), outcome=Outcome.TIMED_OUT)
    report = run(ws)
    assert report.status == "timed_out" and "limit" in report.reason


def test_no_done_message_is_a_grader_error(monkeypatch, ws) -> None:
    fake_child(monkeypatch, [*shape_messages(0), *shape_messages(1)], pause_s=0.1)
    assert run(ws).status == "grader_error"


def test_times_the_parent_did_not_see_pass_are_implausible(monkeypatch, ws) -> None:
    # 36 ms of windows reported per shape, but the messages arrive back to back.
    msgs = [*shape_messages(0, sub_ms=2000.0), *shape_messages(1), {"event": "done"}]
    fake_child(monkeypatch, msgs)
    report = run(ws)
    assert report.status == "implausible" and "grader's clock" in report.reason


def test_faster_than_the_bandwidth_floor_is_implausible(monkeypatch, ws) -> None:
    fake_child(monkeypatch, [*shape_messages(0, sub_ms=0.001), *shape_messages(1),
                             {"event": "done"}], pause_s=0.1)
    report = run(ws)
    assert report.status == "implausible" and "physically possible" in report.reason


def test_timed_rounds_visit_the_shapes_in_turn(monkeypatch) -> None:
    """Each visit is one whole cycle of orders, rotated by the visit; a last partial visit; one
    untimed round per shape first; every shape gets exactly ``rounds`` timed rounds."""
    from grader import child_timing as ct
    from grader.orders import williams_orders

    orders = williams_orders(ct.BLOCK_NAMES)
    calls: list[tuple[str, tuple[str, ...], bool]] = []
    monkeypatch.setattr(ct, "_round", lambda ctx, st, order, timed: calls.append(
        (st.label, tuple(order), timed)))
    sent: list[dict] = []

    class Channel:
        def send(self, event: str, **fields: object) -> None:
            sent.append({"event": event, **fields})

    ctx = ct._Ctx(torch=None, job={"orders": orders, "rounds": 8}, channel=Channel(),
                  guard=None, timers=None, base=None, census=True)
    shapes = [ct._Shape(index=i, label=label, runner=None, budget={}, activation=1,
                        held_bytes=0, samples={}, util_rows=[]) for i, label in enumerate("ab")]
    ct._time_interleaved(ctx, shapes)

    assert calls[:2] == [("a", tuple(orders[0]), False), ("b", tuple(orders[0]), False)]
    timed = calls[2:]
    assert all(t for _, _, t in timed) and len(timed) == 16
    labels = "".join(label for label, _, _ in timed)
    assert labels == "a" * 6 + "b" * 6 + "aa" + "bb"
    assert [o for label, o, _ in timed if label == "a"] == [
        tuple(orders[k % 6]) for k in [0, 1, 2, 3, 4, 5, 1, 2]]
    assert [labels.count(st.label) for st in shapes] == [8, 8]
    assert sent == [{"event": "progress", "visit": 1, "visits": 2},
                    {"event": "progress", "visit": 2, "visits": 2}]
