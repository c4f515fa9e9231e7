"""Timing phase, trusted side (SPEC §4–§6): run the timing child, then judge what it reported.

`run_timing` copies the submitted tree into a private directory, runs ``grader/child_timing.py``
there through `grader.sandbox.run_child` (limits from ``limits.timing``), stamps every message of
the child with its own clock, and reads the GPU's telemetry when each shape starts its warm-up,
after the first and the last timed visit (the shapes are timed in turns), and when each shape is
reported. Nothing the child computed is taken as a verdict. From the raw per-round samples this
module computes, per shape:

- medians of t_plain, t_ref and t_sub, and r = t_plain/t_sub, g = t_plain/t_ref as medians of
  per-round paired ratios with bootstrap intervals (`grader.stats`);
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

import enum
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

from grader import plausibility, stats, telemetry
from grader.config import TIMED_BLOCKS, Profile, Score, ScoringConfig, Shape
from grader.report import ShapeTiming, TimingReport

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
    """Analysis of one shape: the report row plus the bootstrap draws of its score."""

    timing: ShapeTiming
    status: TimingStatus
    score_draws: np.ndarray | None = None


def score_from(score: Score, r: float, g: float) -> float:
    """SPEC §5's shape score (delegates to `grader.config.Score.shape_score`)."""
    return score.shape_score(r, g)


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
) -> ShapeVerdict:
    """Judge one shape's raw samples: counts, floor, clocks, checks, tail, then r, g and score."""
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
    values = dict(t_plain_ms=medians["plain"], t_ref_ms=medians["ref"], t_sub_ms=medians["sub"])

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

    tail = float(np.median(np.asarray(raw.tail_ms["sub"], dtype=np.float64)))
    values["tail_ms"] = tail
    tail_limit = max(TAIL_LIMIT_MS, TAIL_LIMIT_FRACTION * medians["sub"])
    if tail > tail_limit:
        return _fail(label, TimingStatus.RULE_BROKEN,
                     f"work kept running for {tail:.3g} ms (median) after the step returned on "
                     f"the caller's stream (limit {tail_limit:.3g} ms): it ran on a stream the "
                     "caller never waited for", **values)

    idx = stats.resample_indices(rounds, resamples, BOOTSTRAP_SEED)
    r = stats.ratio_estimate(windows["plain"], windows["sub"], idx)
    g = stats.ratio_estimate(windows["plain"], windows["ref"], idx)
    r_draws = stats.bootstrap_medians(windows["plain"] / windows["sub"], idx)
    g_draws = stats.bootstrap_medians(windows["plain"] / windows["ref"], idx)
    draws = np.array([score.shape_score(a, b) for a, b in zip(r_draws, g_draws, strict=True)])
    value = score.shape_score(r.value, g.value)
    ci = stats.percentile_interval(draws)
    timing = ShapeTiming(
        label=label,
        r=r.value,
        g=g.value,
        r_ci=(r.ci.low, r.ci.high),
        g_ci=(g.ci.low, g.ci.high),
        score=value,
        score_ci=(min(ci.low, value), max(ci.high, value)),
        weight=score.dtype_weights[raw.shape.dtype],
        **values,
    )
    return ShapeVerdict(timing, TimingStatus.OK, draws)


def _as_util(value: Any) -> float:
    """A utilisation from JSON: a number, or "inf"/"nan" text; anything else is infinite."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.inf
    return math.inf if math.isnan(out) else out


def task_score(verdicts: Sequence[ShapeVerdict]) -> tuple[float, tuple[float, float] | None]:
    """Weighted mean of shape scores (SPEC §5) and its bootstrap interval; 0 if any failed."""
    if not verdicts or any(v.status is not TimingStatus.OK for v in verdicts):
        return 0.0, None
    weights = np.array([v.timing.weight for v in verdicts], dtype=np.float64)
    scores = np.array([v.timing.score for v in verdicts], dtype=np.float64)
    value = float(np.dot(weights, scores) / weights.sum())
    draws = np.stack([v.score_draws for v in verdicts])  # (shapes, resamples)
    mean_draws = weights @ draws / weights.sum()
    ci = stats.percentile_interval(mean_draws)
    return value, (min(ci.low, value), max(ci.high, value))


# ----------------------------------------------------------------------------- the run


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = width * done // total if total else width
    return "#" * filled + "." * (width - filled)


@dataclass
class _Listener:
    """Receives the child's messages: stamps them, snapshots telemetry, draws progress."""

    shapes: Sequence[Shape]
    progress: TextIO | None
    uuid: str | None = None
    started: dict[int, float] = field(default_factory=dict)
    finished: dict[int, float] = field(default_factory=dict)
    snapshots: list[telemetry.GpuSnapshot] = field(default_factory=list)
    messages: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def __call__(self, message: dict[str, Any]) -> None:
        now = time.monotonic()
        self.messages.append((now, message))
        event = message.get("event")
        index = message.get("index")
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
            label = self.shapes[index].label
            when = "before" if event == "shape_start" else "after"
            self.snapshots.append(telemetry.snapshot(f"{when} {label}", uuid=self.uuid))
            self._draw(index, event, message)
        elif event == "progress":
            visit, visits = message.get("visit"), message.get("visits")
            if isinstance(visit, int) and isinstance(visits, int) and 0 < visit <= visits:
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
    block = config.block
    return {
        "block": {"channels": block.channels, "expansion": block.expansion, "eps": block.eps,
                  "residual_scale": block.residual_scale},
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
    listener = _Listener(prof.shapes, progress)
    with tempfile.TemporaryDirectory(prefix="timing-") as tmp:
        workdir = Path(tmp) / "work"
        shutil.copytree(submission_root, workdir, ignore=shutil.ignore_patterns(".git"))
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(_job(config, prof, seed=seed,
                                            reference_module=reference_module, census=census,
                                            device="cpu" if dry_run_on_cpu else "cuda")))
        limits = ChildLimits.from_phase(config.limits.timing)
        result = run_child(CHILD_SCRIPT, workdir, [str(REPO_ROOT), str(job_path)], limits,
                           env_extra=env, on_message=listener, python=python)
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
             "warm-up rounds, medians of per-round paired ratios, 95% bootstrap intervals", head]
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
    "RawShape",
    "ShapeVerdict",
    "TimingStatus",
    "analyze_shape",
    "render_table",
    "run_timing",
    "score_from",
    "task_score",
]
