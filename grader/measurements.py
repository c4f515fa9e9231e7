"""What the timing run measured (`grader.interleave` fills it, `grader.timing_run` reads it): per
shape, its samples (`grader.samples.ShapeRaw`, which the judge reads as they are); for the run,
how it ended and what the children said.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grader import telemetry
from grader.samples import ShapeRaw
from grader.sandbox import ChildResult


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
        drain_by_block: After every step of the submission's process, how long the trusted
            probe found the device still busy (its leftover GPU work, on that step's wall), per
            block of that process's steps: ``sub`` (the submission's) and ``cal`` (the
            harness's calibration steps before the import, whose walls are the level and spread
            the submission's are judged against, `grader.timing`).
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
    drain_by_block: dict[str, list[float]] = field(default_factory=dict)
    busy_ms: list[float] = field(default_factory=list)


def number(message: dict[str, Any], key: str) -> float:
    """A child's message's number ``key``; NaN when it is missing or no number."""
    value = message.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return float("nan")
    return float(value)


__all__ = ["Interleaved", "number"]
