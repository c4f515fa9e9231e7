"""What the timing run measured (`grader.interleave` fills these; `grader.timing_run` and
`grader.timing` read them): per shape, the raw samples of every block; for the run, how it
ended and what the children said.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grader import telemetry
from grader.sandbox import ChildResult

BLOCKS = ("plain", "ref", "sub")
BASELINES = ("plain", "ref")


@dataclass
class ShapeRaw:
    """What was measured of one shape.

    Attributes:
        window_ms: Per block, per timed round: the child's event window (start → device idle).
        tail_ms: Per block, per round: the step returned → device idle.
        wall_ms: Per block, per round: the parent's ``go`` → ``done``.
        alone_ms: Per baseline: event windows of its rounds timed alone (half before the
            submission's process imported anything, half after the interleaved rounds), in the
            order taken.
        calibration_ms: The submission's process's steps of the harness's own block before the
            import: each one's parent's wall less its event window.
        util: Per round, [ref row, sub row]: utilisation of [forward, grad_x, conv, fc1, fc2]
            against plain, from the baselines process.
        oracle_util: The submission's worst utilisation in the rounds held to the fp64 oracle.
    """

    window_ms: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in BLOCKS})
    tail_ms: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in BLOCKS})
    wall_ms: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in BLOCKS})
    alone_ms: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in BASELINES})
    calibration_ms: list[float] = field(default_factory=list)
    util: list[list[list[float]]] = field(default_factory=list)
    oracle_util: list[float] = field(default_factory=list)


@dataclass
class Interleaved:
    """The whole run: per-shape measurements, how it ended, what the children said.

    Attributes:
        shapes: One `ShapeRaw` per profile shape (empty lists where not reached).
        status: ``ok`` or a `grader.timing.TimingStatus` value.
        reason: Why not ok.
        device: The baselines process's ``ready`` facts about the GPU.
        snapshots: GPU telemetry around the phases.
        baselines, submission: How each child ended.
        memory: The submission process's ``memory`` message (with how its GPU memory was read,
            ``accounting``).
        handshake_ms: Per process, the parent's round trip of an empty command (median).
        command_s: Per process and command: [how many, the parent's seconds waiting on them].
        load_s: Seconds the submission's import took.
        hold: How the steps were timed: ``held``, or ``unheld: <why>``.
        host_wait: Per process, how its host waits for the device in a synchronization
            (`grader.child.hold.set_host_wait`: the wait asked for, or ``auto: <why not>``).
        drain_ms: After every step of the submission's process, how long the trusted probe
            found the device still busy (its leftover GPU work, on that step's wall).
        busy_ms: Each time the probe before a step found the device busy with work nobody
            trusted started (that round ran again).
    """

    shapes: list[ShapeRaw]
    status: str = "ok"
    reason: str = ""
    device: dict[str, Any] = field(default_factory=dict)
    snapshots: list[telemetry.GpuSnapshot] = field(default_factory=list)
    baselines: ChildResult | None = None
    submission: ChildResult | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    handshake_ms: dict[str, float] = field(default_factory=dict)
    command_s: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    load_s: float | None = None
    hold: str = "unheld: not started"
    host_wait: dict[str, str] = field(default_factory=dict)
    drain_ms: list[float] = field(default_factory=list)
    busy_ms: list[float] = field(default_factory=list)


def number(message: dict[str, Any], key: str) -> float:
    """A child's message's number ``key``; NaN when it is missing or no number."""
    value = message.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return float("nan")
    return float(value)


__all__ = ["BASELINES", "BLOCKS", "Interleaved", "ShapeRaw", "number"]
