"""Timing phase, trusted side (SPEC §4–§6): run the timing child, then judge what it reported.

`run_timing` copies the submitted tree into a private directory, runs ``grader/child_timing.py``
there through `grader.sandbox.run_child` (limits from ``limits.timing``), stamps every message of
the child with its own clock, and reads the GPU's telemetry when each shape starts its warm-up,
after the first and the last timed visit (the shapes are timed in turns), and when each shape is
reported. Nothing the child computed is taken as a verdict. From the raw per-round samples this
module computes, per shape:

- medians of t_plain, t_ref and t_sub, and r = t_plain/t_sub, g = t_plain/t_ref as medians of
  per-round paired ratios with bootstrap intervals that resample whole visits (`grader.stats`
  says why: rounds of one visit share the device's slow state);
- the bandwidth floor: every sample of every block must be at least the bytes a step must move
  over the GPU's peak bandwidth (`grader.plausibility`);
- the clock bound: the timed windows of a shape add up to no more than the parent saw pass
  between its start and its report (with the shapes timed in turns, that span holds the other
  shapes' rounds too; the whole-run bound in `run_timing` is the tight one);
- the event window bounded by the same window on the child's host clock;
- the check numbers re-checked: the submission's utilisation against plain PyTorch within slack;
- the tail: work still running after the step returned on the caller's stream (a side stream
  the caller never waited for) is a broken rule, even though the window counted it;
- the score of SPEC §5 and its bootstrap interval.

Any failure makes the whole timing phase fail with score 0 and a reason: there is no partial
credit, because every failure here means a broken submission or a lie. Failed shapes keep their
own reasons in the report.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from grader import deadlines, plausibility, stats, telemetry
from grader.config import TIMED_BLOCKS, DeadlineRule, Profile, Score, ScoringConfig, Shape
from grader.orders import williams_orders
from grader.report import ShapeSamples, ShapeTiming, TimingReport
from grader.sandbox import ARM_EVENT, Deadline

CHILD_SCRIPT = Path(__file__).resolve().parent / "child_timing.py"
REPO_ROOT = Path(__file__).resolve().parent.parent
BLOCKS = TIMED_BLOCKS
UTIL_KEYS = ("forward", "grad_x", "conv.weight", "fc1.weight", "fc2.weight")
# Work left running after the step returned on the caller's stream. An honest step leaves only
# the synchronize-and-record latency (tens of µs); a step whose work runs on a stream the caller
# never waited for leaves most of the step.
TAIL_LIMIT_MS = 0.25
TAIL_LIMIT_FRACTION = 0.25
# Timed results are compared with plain PyTorch, not with the fp64 oracle. Plain itself uses at
# most half of every budget (SPEC §3 calibration) and the gate held the submission within the
# budget of the oracle, so |sub − plain| ≤ 1.5 budgets by the triangle inequality. The parent
# owns this number: it sends it to the child and judges with its own copy.
PLAIN_SLACK = 1.5
# The child's host clock may trail the event window only by launch and sync latency.
HOST_SLACK_MS = 0.5
# Grades of one input shape on one GPU draw the same rounds in the bootstrap: intervals are a
# property of the samples, not of the draw.
BOOTSTRAP_SEED = stats.DEFAULT_SEED
# The timing child times each shape in visits of one whole cycle of run orders (6 rounds; see
# `_time_interleaved` in grader/child_timing.py), the shapes taking turns: round i of every shape
# belongs to visit i // VISIT_ROUNDS, and visit v of all shapes is one stretch of time.
VISIT_ROUNDS = len(williams_orders(BLOCKS))
# Whole visits are resampled, read as Hesterberg's expanded percentile interval (grader/stats.py
# says why; bench/interval_coverage.py measures it against the others).
INTERVAL_METHOD = stats.IntervalMethod.VISITS


class TimingStatus(enum.StrEnum):
    """How the timing phase ended."""

    OK = "ok"  # every shape timed, checked and scored
    RULE_BROKEN = "rule_broken"  # a run-time rule broke while timed (timer patched, thread...)
    CHECK_FAILED = "check_failed"  # a timed step's result was wrong
    IMPLAUSIBLE = "implausible"  # a time below the bandwidth floor, or over the parent's clock
    CRASHED = "crashed"  # the child or the submission failed
    TIMED_OUT = "timed_out"  # past the timing phase's wall-clock limit
    OUT_OF_MEMORY = "out_of_memory"  # over a memory limit
    GRADER_ERROR = "grader_error"  # the grader failed, or the child's report was malformed
    NOT_TIMED = "not_timed"  # (a shape's status only) the run stopped before this shape


# ----------------------------------------------------------------------------- pure analysis


@dataclass(frozen=True)
class RawShape:
    """What the child reported for one shape, with the parent's clock.

    Attributes:
        shape: The profile's shape.
        window_ms: Per block, per timed round: start → device idle (event clock).
        tail_ms: Per block, per round: step returned → device idle.
        host_ms: Per block, per round: the same window on the child's host clock.
        util: Per block (``ref``, ``sub``): worst utilisation of each check against plain.
        slack: Utilisation allowed against plain PyTorch (the parent's `PLAIN_SLACK`).
        parent_s: Parent wall time between the shape's start and done messages.
    """

    shape: Shape
    window_ms: Mapping[str, Sequence[float]]
    tail_ms: Mapping[str, Sequence[float]]
    host_ms: Mapping[str, Sequence[float]]
    util: Mapping[str, Mapping[str, float]]
    slack: float
    parent_s: float


@dataclass(frozen=True)
class ShapeVerdict:
    """Analysis of one shape: the report row plus the bootstrap draws of its score.

    Attributes:
        timing: The report's row.
        status: ok, or why not.
        score_draws: The score in each resample of ``bootstrap`` (None unless ok).
        bootstrap: The grade's bootstrap the draws came from; `task_score` reads its interval
            with it.
    """

    timing: ShapeTiming
    status: TimingStatus
    score_draws: np.ndarray | None = None
    bootstrap: stats.Bootstrap | None = None


@dataclass(frozen=True)
class ShapeEstimate:
    """r, g and the score of one shape with their intervals, from one grade's bootstrap.

    Attributes:
        r: ``t_plain / t_sub``, median of per-round ratios, with its interval.
        g: ``t_plain / t_ref``, likewise.
        score: SPEC §5's score of (r, g).
        score_ci: Its interval: the score of each resample's (r, g), read as ``bootstrap`` says.
        score_draws: The score in each resample, for the task score's interval.
    """

    r: stats.RatioEstimate
    g: stats.RatioEstimate
    score: float
    score_ci: stats.Interval
    score_draws: np.ndarray


def score_from(score: Score, r: float, g: float) -> float:
    """SPEC §5's shape score (delegates to `grader.config.Score.shape_score`)."""
    return score.shape_score(r, g)


@functools.lru_cache(maxsize=16)
def grade_bootstrap(
    rounds: int,
    method: stats.IntervalMethod = INTERVAL_METHOD,
    resamples: int = stats.DEFAULT_RESAMPLES,
    visit_rounds: int = VISIT_ROUNDS,
) -> stats.Bootstrap:
    """The bootstrap every shape of a grade with ``rounds`` timed rounds shares.

    Drawn once (and cached): r, g and the score of every shape resample the same visits, so the
    task score's interval keeps the correlation of shapes timed in the same stretch of time.
    """
    boot = stats.Bootstrap.build(method, stats.visits_of(rounds, visit_rounds),
                                 resamples=resamples, seed=BOOTSTRAP_SEED)
    boot.indices.flags.writeable = False  # shared by every caller of the cache
    return boot


def estimate_shape(samples: ShapeSamples, score: Score,
                   bootstrap: stats.Bootstrap) -> ShapeEstimate:
    """r, g and the score of one shape's samples with the intervals of ``bootstrap``.

    The estimates are medians of per-round paired ratios whatever the bootstrap; only the
    intervals depend on it.

    Raises:
        ValueError: A time that is not finite and positive, or a bootstrap of another length.
    """
    if bootstrap.indices.shape[1] != len(samples.plain_ms):
        raise ValueError(f"bootstrap resamples {bootstrap.indices.shape[1]} rounds, the shape "
                         f"has {len(samples.plain_ms)}")
    r_ratios = stats.paired_ratios(samples.plain_ms, samples.sub_ms)
    g_ratios = stats.paired_ratios(samples.plain_ms, samples.ref_ms)
    r_draws, g_draws = bootstrap.medians(r_ratios), bootstrap.medians(g_ratios)
    r_value, g_value = float(np.median(r_ratios)), float(np.median(g_ratios))
    draws = np.array([score.shape_score(a, b) for a, b in zip(r_draws, g_draws, strict=True)])
    value = score.shape_score(r_value, g_value)
    return ShapeEstimate(
        r=stats.RatioEstimate(r_value, bootstrap.interval(r_draws, r_value)),
        g=stats.RatioEstimate(g_value, bootstrap.interval(g_draws, g_value)),
        score=value, score_ci=bootstrap.interval(draws, value), score_draws=draws)


def weighted_score(weights: Sequence[float], scores: Sequence[float],
                   draws: Sequence[np.ndarray],
                   bootstrap: stats.Bootstrap) -> tuple[float, stats.Interval]:
    """SPEC §5's task score, the weighted mean of shape scores, and its interval.

    ``draws[s][k]`` is shape s's score in resample k of the one ``bootstrap`` every shape shares,
    so resample k's task score is the weighted mean over shapes of column k.
    """
    w = np.asarray(weights, dtype=np.float64)
    value = float(np.dot(w, np.asarray(scores, dtype=np.float64)) / w.sum())
    mean_draws = w @ np.stack(list(draws)) / w.sum()  # (shapes,) @ (shapes, resamples)
    return value, bootstrap.interval(mean_draws, value)


def _fail(label: str, status: TimingStatus, reason: str, **values: Any) -> ShapeVerdict:
    return ShapeVerdict(ShapeTiming(label=label, score=0.0, status=status.value, reason=reason,
                                    **values), status)


def analyze_shape(
    raw: RawShape,
    score: Score,
    bandwidth: plausibility.Bandwidth,
    *,
    channels: int,
    expansion: int,
    rounds: int,
    resamples: int = stats.DEFAULT_RESAMPLES,
    bootstrap: stats.Bootstrap | None = None,
) -> ShapeVerdict:
    """Judge one shape's raw samples: counts, floor, clocks, checks, tail, then r, g and score.

    The intervals come from ``bootstrap``, by default the grade's (`grade_bootstrap`: whole
    visits of `VISIT_ROUNDS` rounds resampled, shared by every shape). The verdict's row carries
    the samples from the first check on, so a failed shape's numbers can be looked at too.
    """
    label = raw.shape.label
    for name in BLOCKS:
        for key, table in (("window", raw.window_ms), ("tail", raw.tail_ms),
                           ("host", raw.host_ms)):
            got = len(table.get(name, ()))
            if got != rounds:
                return _fail(label, TimingStatus.GRADER_ERROR,
                             f"{name}: {got} {key} samples reported, {rounds} expected")
    try:
        windows = {n: stats.as_samples(raw.window_ms[n], f"{n} window") for n in BLOCKS}
    except ValueError as exc:
        return _fail(label, TimingStatus.IMPLAUSIBLE, str(exc))
    medians = {n: float(np.median(windows[n])) for n in BLOCKS}
    boot = bootstrap if bootstrap is not None else grade_bootstrap(rounds, resamples=resamples)
    samples = ShapeSamples(plain_ms=tuple(windows["plain"].tolist()),
                           ref_ms=tuple(windows["ref"].tolist()),
                           sub_ms=tuple(windows["sub"].tolist()),
                           visit=tuple(stats.visits_of(rounds, VISIT_ROUNDS).tolist()))
    values = dict(t_plain_ms=medians["plain"], t_ref_ms=medians["ref"], t_sub_ms=medians["sub"],
                  samples=samples)

    bytes_moved = plausibility.step_bytes(batch=raw.shape.batch, length=raw.shape.length,
                                          channels=channels, expansion=expansion,
                                          dtype=raw.shape.dtype)
    floor = plausibility.floor_ms(bytes_moved, bandwidth)
    values["floor_ms"] = floor
    for name in BLOCKS:
        check = plausibility.check_floor(list(windows[name]), floor)
        if not check.ok:
            return _fail(label, TimingStatus.IMPLAUSIBLE, check.reason(name), **values)
        host = np.asarray(raw.host_ms[name], dtype=np.float64)
        over = np.flatnonzero(~(windows[name] <= host + HOST_SLACK_MS))
        if over.size:
            i = int(over[0])
            return _fail(label, TimingStatus.IMPLAUSIBLE,
                         f"{name}: event window {windows[name][i]:.4g} ms is longer than the "
                         f"host clock's {host[i]:.4g} ms for the same step", **values)
    bound = plausibility.ClockBound(
        reported_s=sum(float(w.sum()) for w in windows.values()) / 1e3, parent_s=raw.parent_s)
    if not bound.ok:
        return _fail(label, TimingStatus.IMPLAUSIBLE, bound.reason(), **values)

    sub_util = raw.util.get("sub", {})
    missing = [k for k in UTIL_KEYS if k not in sub_util]
    if missing:
        return _fail(label, TimingStatus.GRADER_ERROR, f"no check numbers for {missing}",
                     **values)
    worst_key = max(UTIL_KEYS, key=lambda k: _as_util(sub_util[k]))
    worst = _as_util(sub_util[worst_key])
    values["utilisation"] = worst
    if not worst <= raw.slack:
        return _fail(label, TimingStatus.CHECK_FAILED,
                     f"timed {worst_key} differs from plain PyTorch: utilisation {worst:.3g} > "
                     f"{raw.slack:g}", **values)

    tails = {n: float(np.median(np.asarray(raw.tail_ms[n], dtype=np.float64))) for n in BLOCKS}
    values["tail_ms"] = tails["sub"]
    # What the submission's tail holds beyond the baselines' in the same rounds: a neighbour on
    # the GPU (another grade, time-sliced with this one) delays every block's closing event
    # alike, and must not read as the submission's side-stream work.
    baseline_tail = max(tails["plain"], tails["ref"])
    tail = tails["sub"] - baseline_tail
    tail_limit = max(TAIL_LIMIT_MS, TAIL_LIMIT_FRACTION * medians["sub"])
    if tail > tail_limit:
        return _fail(label, TimingStatus.RULE_BROKEN,
                     f"work kept running for {tails['sub']:.3g} ms (median) after the step "
                     f"returned on the caller's stream, {tail:.3g} ms more than the baselines' "
                     f"{baseline_tail:.3g} ms (limit {tail_limit:.3g} ms): it ran on a stream the "
                     "caller never waited for", **values)

    est = estimate_shape(samples, score, boot)
    timing = ShapeTiming(
        label=label,
        r=est.r.value,
        g=est.g.value,
        r_ci=(est.r.ci.low, est.r.ci.high),
        g_ci=(est.g.ci.low, est.g.ci.high),
        score=est.score,
        score_ci=(est.score_ci.low, est.score_ci.high),
        weight=score.dtype_weights[raw.shape.dtype],
        **values,
    )
    return ShapeVerdict(timing, TimingStatus.OK, est.score_draws, boot)


def _as_util(value: Any) -> float:
    """A utilisation from JSON: a number, or "inf"/"nan" text; anything else is infinite."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.inf
    return math.inf if math.isnan(out) else out


def task_score(verdicts: Sequence[ShapeVerdict]) -> tuple[float, tuple[float, float] | None]:
    """Weighted mean of shape scores (SPEC §5) and its bootstrap interval; 0 if any failed.

    Raises:
        ValueError: The shapes were resampled with different bootstraps (a grader bug: the task
            score's interval needs one resample to mean the same visits for every shape).
    """
    if not verdicts or any(v.status is not TimingStatus.OK for v in verdicts):
        return 0.0, None
    boot = verdicts[0].bootstrap
    for v in verdicts:
        if v.bootstrap is None or not (v.bootstrap is boot or (
                v.bootstrap.level == boot.level
                and np.array_equal(v.bootstrap.indices, boot.indices))):
            raise ValueError(f"{v.timing.label} was resampled with another bootstrap than "
                             f"{verdicts[0].timing.label}")
    value, ci = weighted_score([v.timing.weight for v in verdicts],
                               [v.timing.score for v in verdicts],
                               [v.score_draws for v in verdicts], boot)
    return value, (ci.low, ci.high)


# ----------------------------------------------------------------------------- the run


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = width * done // total if total else width
    return "#" * filled + "." * (width - filled)


@dataclass
class _Stages:
    """The timing child's deadlines (`grader.deadlines`): each stage it announces gets
    ``floor + multiple × t_plain`` of the work it stands for, counted in the plain block's steps
    of each shape as the parent measured them before the child started.

    Stages: the import (from arming to the first shape), each shape's warm-up (the last one's
    also holds the untimed round of every shape and the first timed visit), each later timed
    visit, the closing census of every shape (the child runs them all before its first report),
    each later shape's report, the exit.
    """

    rule: DeadlineRule
    plain_s: Sequence[float]
    warmup: int
    rounds: int
    per_visit: int
    due: Deadline | None = None
    visit: int = 0

    def start(self, what: str, plain_s: float) -> None:
        self.due = Deadline(time.monotonic() + self.rule.seconds(plain_s),
                            f"{what}: {self.rule.describe(plain_s)}")

    def visit_rounds(self, visit: int) -> int:
        """Timed rounds of each shape in visit ``visit`` (1-based; the last may be partial)."""
        return max(0, min(self.per_visit, self.rounds - (visit - 1) * self.per_visit))

    def on(self, event: str, index: int | None, visit: int | None, label: str) -> None:
        """Move on to the stage that ``event`` opens (called for accepted messages only)."""
        every = sum(self.plain_s)
        last = len(self.plain_s) - 1
        if event == ARM_EVENT and self.due is None:
            self.start("importing solution.py and building the first shape", 0.0)
        elif event == "shape_start" and index is not None:
            work = self.warmup * self.plain_s[index]
            what = f"warming up {label}"
            if index == last:
                work += every * (1 + self.visit_rounds(1))
                what += ", one untimed round of every shape and the first timed visit"
            self.start(what, work)
        elif event == "progress" and visit == self.visit + 1:
            self.visit = visit
            if self.visit_rounds(visit + 1):
                self.start(f"timed visit {visit + 1}", every * self.visit_rounds(visit + 1))
            else:
                # grader/child_timing.py `_time_shapes`: one census step of every shape, then
                # the shapes' reports.
                self.start("the closing census of every shape", every)
        elif event == "shape_done" and index is not None:
            if index < last:
                self.start("reporting the next shape", 0.0)
            else:
                self.start("ending the timing child", 0.0)


@dataclass
class _Listener:
    """Receives the child's messages: stamps them, snapshots telemetry, draws progress, moves
    the deadline."""

    shapes: Sequence[Shape]
    progress: TextIO | None
    stages: _Stages | None = None
    uuid: str | None = None
    started: dict[int, float] = field(default_factory=dict)
    finished: dict[int, float] = field(default_factory=dict)
    snapshots: list[telemetry.GpuSnapshot] = field(default_factory=list)
    messages: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def deadline(self) -> Deadline | None:
        return self.stages.due if self.stages is not None else None

    def _stage(self, event: str, index: int | None = None, visit: int | None = None) -> None:
        if self.stages is not None:
            label = self.shapes[index].label if index is not None else ""
            self.stages.on(event, index, visit, label)

    def __call__(self, message: dict[str, Any]) -> None:
        now = time.monotonic()
        self.messages.append((now, message))
        event = message.get("event")
        index = message.get("index")
        if event == ARM_EVENT:
            self._stage(event)
        if event == "hello":
            device = message.get("device")
            if isinstance(device, dict) and isinstance(device.get("uuid"), str):
                self.uuid = device["uuid"]
        if event in ("shape_start", "shape_done") and isinstance(index, int):
            if not 0 <= index < len(self.shapes):
                return
            seen = self.started if event == "shape_start" else self.finished
            if index in seen or (event == "shape_done" and index not in self.started):
                return  # a repeat or an out-of-order message: the child's claims decide nothing
            seen[index] = now
            self._stage(event, index)
            label = self.shapes[index].label
            when = "before" if event == "shape_start" else "after"
            self.snapshots.append(telemetry.snapshot(f"{when} {label}", uuid=self.uuid))
            self._draw(index, event, message)
        elif event == "progress":
            visit, visits = message.get("visit"), message.get("visits")
            if isinstance(visit, int) and isinstance(visits, int) and 0 < visit <= visits:
                self._stage(event, visit=visit)
                if visit in (1, visits):
                    # The GPU's state while all shapes are timed: after the first visit and
                    # after the last.
                    self.snapshots.append(telemetry.snapshot(f"timed visit {visit}/{visits}",
                                                             uuid=self.uuid))
                self._print(f"[{_bar(visit, visits)}] {visit}/{visits} timed visits "
                            f"(all {len(self.shapes)} shapes in turn)")
        elif event == "failure":
            self._print(f"timing: {message.get('kind')}: {message.get('reason')}")

    def _draw(self, index: int, event: str, message: dict[str, Any]) -> None:
        # Shapes warm up one after another, are timed together (`progress` above), and are
        # judged one after another at the end.
        total = len(self.shapes)
        label = self.shapes[index].label
        if event == "shape_start":
            self._print(f"[{_bar(index, total)}] warming up {index + 1}/{total} {label}")
        else:
            self._print(f"[{_bar(index + 1, total)}] {index + 1}/{total} timed {label}")

    def _print(self, text: str) -> None:
        if self.progress is not None:
            print(text, file=self.progress, flush=True)


def _job(config: ScoringConfig, profile: Profile, *, seed: int, reference_module: str,
         census: bool, device: str = "cuda") -> dict[str, Any]:
    return {
        "block": dataclasses.asdict(config.block),
        "shapes": [{"batch": s.batch, "length": s.length, "dilation": s.dilation,
                    "dtype": s.dtype} for s in profile.shapes],
        "budgets": {name: {"forward_atol": b.forward_atol, "forward_rtol": b.forward_rtol,
                           "grad_rel": b.grad_rel} for name, b in config.budgets.items()},
        "warmup": profile.warmup,
        "rounds": profile.rounds,
        "seed": seed,
        "reference_module": reference_module,
        "census": census,
        "slack": PLAIN_SLACK,
        "device": device,
    }


def _raw_shapes(profile: Profile, listener: _Listener) -> dict[int, RawShape]:
    out: dict[int, RawShape] = {}
    for now, message in listener.messages:
        if message.get("event") != "shape_done":
            continue
        index = message.get("index")
        if not isinstance(index, int) or index in out or index not in listener.started:
            continue
        samples = message.get("samples")
        if not 0 <= index < len(profile.shapes) or not isinstance(samples, dict):
            continue

        def column(key: str, samples: dict[str, Any] = samples) -> dict[str, list[float]]:
            return {n: [float(v) for v in samples.get(n, {}).get(key, [])] for n in BLOCKS}

        try:
            out[index] = RawShape(
                shape=profile.shapes[index],
                window_ms=column("window_ms"),
                tail_ms=column("tail_ms"),
                host_ms=column("host_ms"),
                util={n: dict(message.get("util", {}).get(n, {})) for n in ("ref", "sub")},
                slack=PLAIN_SLACK,
                parent_s=now - listener.started[index],
            )
        except (TypeError, ValueError, AttributeError):
            continue
    return out


def _child_failure(listener: _Listener) -> dict[str, Any] | None:
    for _, message in listener.messages:
        if message.get("event") == "failure":
            return message
    return None


_FAILURE_STATUS = {
    "rule": TimingStatus.RULE_BROKEN,
    "check": TimingStatus.CHECK_FAILED,
    "oom": TimingStatus.OUT_OF_MEMORY,
    "load": TimingStatus.CRASHED,
    "crash": TimingStatus.CRASHED,
    "harness": TimingStatus.GRADER_ERROR,
}


def run_timing(
    submission_root: Path,
    config: ScoringConfig,
    *,
    profile: str | None = None,
    gpu: int | None = None,
    gpu_name: str | None = None,
    progress: TextIO | None = sys.stderr,
    seed: int | None = None,
    reference_module: str = "reference.block",
    census: bool = True,
    python: str = sys.executable,
    on_child: Callable[[Any], None] | None = None,
    triton_cache: Path | None = None,
    dry_run_on_cpu: bool = False,
) -> TimingReport:
    """Time a submission that passed the gate and score it (SPEC §4–§5).

    Args:
        submission_root: The exported submitted tree (holds ``solution.py``).
        config: The loaded `scoring.yaml`.
        profile: Timing profile name; default: the one for this GPU (``timing.profiles.*.gpus``).
        gpu: Index of the GPU to time on (the child sees only it); default: the caller's
            ``CUDA_VISIBLE_DEVICES`` if set, else GPU 0.
        gpu_name: GPU name for picking the profile when NVML cannot tell.
        progress: Where the progress bar goes (None: silent).
        seed: Seed of the timing inputs; default: fresh from the OS.
        reference_module: Module of the reference block (a stand-in in tests).
        census: Run the op log and Triton launch census on the submission's warm-up steps.
        python: Interpreter of the child.
        on_child: Called with the `grader.sandbox.ChildResult` (tests, debugging).
        triton_cache: Share this Triton cache between children (tests and benchmarks only: a
            grade compiles into its own private cache, so nothing carries over between grades).
        dry_run_on_cpu: Run the whole harness on the CPU with the Triton interpreter and the host
            clock (CI on machines without a GPU). Its times mean nothing; the report's telemetry
            says ``dry_run``, and the grade never calls it.

    Returns:
        The `TimingReport`; every failure is status ≠ ok with score 0 and a reason.
    """
    from grader.sandbox import ChildLimits, run_child

    started = time.monotonic()
    env: dict[str, str] = {}
    visible = str(gpu) if gpu is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible  # the sandbox's environment allow-list drops it
    if triton_cache is not None:
        env["TRITON_CACHE_DIR"] = str(triton_cache)
    if dry_run_on_cpu:
        env["TRITON_INTERPRET"] = "1"
    nvml_index = int(visible) if visible is not None and visible.strip().isdigit() else 0
    device = telemetry.device_info(index=nvml_index)
    name = profile or config.timing.profile_for_gpu(device.name or gpu_name)
    if name not in config.timing.profiles:
        raise ValueError(f"profile {name!r} is not one of {sorted(config.timing.profiles)}")
    prof = config.timing.profiles[name]
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    # The plain block's step on every shape, measured here before the child holds the device:
    # the unit of the child's deadlines.
    where = "cpu" if dry_run_on_cpu else f"cuda:{gpu if gpu is not None else 0}"
    # A parent that cannot see the GPU (tests with a stand-in child) gives every stage its floor.
    measurable = dry_run_on_cpu or torch.cuda.is_available()
    plain_s = [deadlines.shape_step_seconds(s.batch, s.length, s.dtype,
                                            dict(dataclasses.asdict(config.block),
                                                 dilation=s.dilation), where)
               if measurable else 0.0 for s in prof.shapes]
    stages = _Stages(config.limits.deadlines.for_device(where), plain_s, prof.warmup,
                     prof.rounds, VISIT_ROUNDS)
    listener = _Listener(prof.shapes, progress, stages)
    with tempfile.TemporaryDirectory(prefix="timing-") as tmp:
        workdir = Path(tmp) / "work"
        shutil.copytree(submission_root, workdir, ignore=shutil.ignore_patterns(".git"))
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(_job(config, prof, seed=seed,
                                            reference_module=reference_module, census=census,
                                            device="cpu" if dry_run_on_cpu else "cuda")))
        limits = ChildLimits.from_phase(config.limits.timing)
        result = run_child(CHILD_SCRIPT, workdir, [str(REPO_ROOT), str(job_path)], limits,
                           env_extra=env, on_message=listener, python=python,
                           deadline=listener.deadline, arm=True)
    if on_child is not None:
        on_child(result)

    hello = next((m for _, m in listener.messages if m.get("event") == "hello"), {})
    device = telemetry.merge_child(device, hello.get("device") or {})
    bandwidth = plausibility.peak_bandwidth(device.name, device.max_memory_clock_mhz,
                                            device.memory_bus_width_bits)
    raws = _raw_shapes(prof, listener)
    verdicts: list[ShapeVerdict] = []
    for index, shape in enumerate(prof.shapes):
        if index in raws:
            verdicts.append(analyze_shape(raws[index], config.score, bandwidth,
                                          channels=config.block.channels,
                                          expansion=config.block.expansion, rounds=prof.rounds))
        else:
            verdicts.append(_fail(shape.label, TimingStatus.NOT_TIMED,
                                  "the timing run stopped before this shape"))

    status, reason = TimingStatus.OK, ""
    failure = _child_failure(listener)
    findings = [m for _, m in listener.messages if m.get("event") == "finding"]
    if failure is not None:
        status = _FAILURE_STATUS.get(str(failure.get("kind")), TimingStatus.CRASHED)
        reason = str(failure.get("reason", "the timing child failed"))
        if failure.get("rule"):
            reason = f"{failure['rule']}: {reason}"
    elif findings:
        status = TimingStatus.RULE_BROKEN
        reason = f"{findings[0].get('rule')}: {findings[0].get('message')}"
    elif not result.ok:
        status = {
            "timed_out": TimingStatus.TIMED_OUT,
            "out_of_memory": TimingStatus.OUT_OF_MEMORY,
        }.get(result.outcome.value, TimingStatus.CRASHED)
        reason = f"the timing child {result.detail}"
    elif not any(m.get("event") == "done" for _, m in listener.messages):
        status, reason = TimingStatus.GRADER_ERROR, "the timing child ended without 'done'"
    if status is TimingStatus.OK:
        bad = next((v for v in verdicts if v.status is not TimingStatus.OK), None)
        if bad is not None:
            status, reason = bad.status, f"{bad.timing.label}: {bad.timing.reason}"
    if status is TimingStatus.OK:
        # Whole-run clock bound: everything the child reported against the child's lifetime.
        total = sum(sum(r.window_ms[n]) for r in raws.values() for n in BLOCKS) / 1e3
        bound = plausibility.ClockBound(total, result.wall_s)
        if not bound.ok:
            status, reason = TimingStatus.IMPLAUSIBLE, bound.reason()
    value, ci = task_score(verdicts) if status is TimingStatus.OK else (0.0, None)
    shapes = tuple(v.timing for v in verdicts)
    if status is not TimingStatus.OK:
        shapes = tuple(_zeroed(s) for s in shapes)
    return TimingReport(
        profile=name,
        shapes=shapes,
        score=value,
        score_ci=ci,
        status=status.value,
        reason=reason,
        rounds=prof.rounds,
        warmup=prof.warmup,
        wall_s=time.monotonic() - started,
        telemetry={
            "device": device.to_dict(),
            "dry_run": dry_run_on_cpu,
            "peak_bandwidth_bytes_per_s": bandwidth.bytes_per_s,
            "peak_bandwidth_source": bandwidth.source,
            "snapshots": [s.to_dict() for s in listener.snapshots],
            "child_wall_s": result.wall_s,
            "child_outcome": result.outcome.value,
            "child_peak_rss_mb": result.peak_rss_mb,
            "child_peak_tasks": result.peak_tasks,
            "child_armed_tasks": result.armed_tasks,
            "gpu_memory_accounting": next((m.get("gpu_memory") for _, m in listener.messages
                                           if m.get("event") == "accounting"), None),
            "plain_step_s": plain_s,
            "child_stderr_tail": result.stderr_tail[-2000:],
            "load_s": next((m.get("seconds") for _, m in listener.messages
                            if m.get("event") == "loaded"), None),
        },
    )


def _zeroed(s: ShapeTiming) -> ShapeTiming:
    """A shape row of a failed timing phase: its measurements stay, its score is 0."""
    from dataclasses import replace

    return replace(s, score=0.0)


# ----------------------------------------------------------------------------- for people


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _ci(pair: tuple[float, float] | None, spec: str = ".3f") -> str:
    return "" if pair is None else f"[{pair[0]:{spec}}, {pair[1]:{spec}}]"


def render_table(report: TimingReport) -> str:
    """Per-shape t_plain, t_ref, t_sub, r, g and score with intervals, then the task score."""
    head = (f"{'shape':<26} {'t_plain ms':>10} {'t_ref ms':>9} {'t_sub ms':>9} "
            f"{'r':>6} {'r 95% CI':<16} {'g':>6} {'g 95% CI':<16} {'score':>6} "
            f"{'score 95% CI':<16} status")
    lines = [f"timing profile {report.profile}: {report.rounds} rounds after {report.warmup} "
             "warm-up rounds, medians of per-round paired ratios, 95% bootstrap intervals "
             f"resampling whole visits of {VISIT_ROUNDS} rounds", head]
    for s in report.shapes:
        status = s.status if s.status == "ok" else f"{s.status}: {s.reason}"
        lines.append(
            f"{s.label:<26} {_fmt(s.t_plain_ms):>10} {_fmt(s.t_ref_ms):>9} "
            f"{_fmt(s.t_sub_ms):>9} {_fmt(s.r):>6} {_ci(s.r_ci):<16} {_fmt(s.g):>6} "
            f"{_ci(s.g_ci):<16} {s.score:>6.3f} {_ci(s.score_ci):<16} {status}")
    lines.append(f"task score {report.score:.4f} {_ci(report.score_ci, '.4f')}  "
                 f"status {report.status}{': ' + report.reason if report.reason else ''}")
    return "\n".join(lines)


__all__ = [
    "INTERVAL_METHOD",
    "VISIT_ROUNDS",
    "RawShape",
    "ShapeEstimate",
    "ShapeVerdict",
    "TimingStatus",
    "analyze_shape",
    "estimate_shape",
    "grade_bootstrap",
    "render_table",
    "run_timing",
    "score_from",
    "task_score",
    "weighted_score",
]
