"""Timing phase, the run (CONTRACT §4, §6): measure the plain block, drive the two timing children,
judge what they measured.

`run_timing` measures the plain block's step on every shape (the unit of every deadline;
`prepare_timing`), runs `grader.interleave.run_interleaved` (the trusted baselines process and the
submission's process, one step at a time, every step timed by the parent's own clock), and judges
what was measured with `grader.timing` (`timing_report`). `TimingStart` does the same in two
parts, so that a gate and the timing's start can run side by side (issue 13's grade within
150 s); a grade uses it where its profile says so (``overlap_timing``, h200) or when asked
(`GradeOptions.overlap_timing`, ``grade --overlap-timing``; `TimingStart`'s docstring says why).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from grader import deadlines, interleave, plausibility, telemetry
from grader.child.hold import DEFAULT_HOST_WAIT
from grader.config import Profile, ScoringConfig
from grader.files import write_whole
from grader.report import ShapeTiming, TimingReport
from grader.samples import BLOCKS, ShapeRaw
from grader.timing import (
    ShapeVerdict,
    TimingStatus,
    analyze_shape,
    memory_verdict,
    task_score,
)
from grader.workspace import tree_changes

# A gate child's Triton cache handed to the timing child of the same submission (`TimingStart`)
# is copied only up to this size; past it the timing child compiles its own.
CARRIED_CACHE_BYTES = 1 << 30
# The timing child's own directories inside its copy of the tree (`grader.sandbox`: its TMPDIR
# and Triton cache), written by its harness before the submission is imported, and the files
# the sandbox sends its output to.
HARNESS_DIRS = (".tmp", ".triton")
HARNESS_FILES = (".child-stdout", ".child-stderr")

# Where progress lines go: a stream, a callable given each line, or nowhere.
Progress = TextIO | Callable[[str], None] | None


def run_timing(
    submission_root: Path,
    config: ScoringConfig,
    *,
    profile: str | None = None,
    gpu: int | None = None,
    gpu_name: str | None = None,
    progress: TextIO | None = sys.stderr,
    reference_module: str = "reference.block",
    census: bool = True,
    python: str = sys.executable,
    triton_cache: Path | None = None,
    dry_run_on_cpu: bool = False,
    host_wait: str = DEFAULT_HOST_WAIT,
) -> TimingReport:
    """Time a submission that passed the gate and score it (CONTRACT §4–§5).

    Args:
        submission_root: The exported submitted tree (holds ``solution.py``).
        config: The loaded `scoring.yaml`.
        profile: Timing profile name; default: the one for this GPU (``timing.profiles.*.gpus``).
        gpu: Index of the GPU to time on (the children see only it); default: the caller's
            ``CUDA_VISIBLE_DEVICES`` if set, else GPU 0.
        gpu_name: GPU name for picking the profile when NVML cannot tell.
        progress: Where the progress lines go (None: silent).
        reference_module: Module of the reference block (a stand-in in tests).
        census: Require a Triton kernel of the submission's own files in each of its steps.
        python: Interpreter of the children.
        triton_cache: Share this Triton cache between children (tests and benchmarks only: a
            grade's children compile into caches of their own, the gate child's copied into the
            timing child's by `TimingStart.finish`; nothing carries over between grades).
        dry_run_on_cpu: Run the whole harness on the CPU with the Triton interpreter and the host
            clock (CI on machines without a GPU). Its times mean nothing; the report's telemetry
            says ``dry_run``, and the grade never calls it.
        host_wait: How both children's hosts wait for the device (`grader.child.hold.HOST_WAITS`;
            a grade's: `grader.child.hold.DEFAULT_HOST_WAIT`; others are for benchmarks).

    Returns:
        The `TimingReport`; every failure is status ≠ ok with score 0 and a reason.
    """
    setup = prepare_timing(config, profile=profile, gpu=gpu, gpu_name=gpu_name,
                           triton_cache=triton_cache, dry_run_on_cpu=dry_run_on_cpu)
    with tempfile.TemporaryDirectory(prefix="timing-") as tmp:
        run = interleave.run_interleaved(
            submission_root, Path(tmp), config, setup.profile,
            **setup.children(config, reference_module, census, python, progress),
            host_wait=host_wait)
    return timing_report(run, setup, config)


@dataclass(frozen=True)
class TimingSetup:
    """What a timing run is decided with before its children start (`prepare_timing`).

    Attributes:
        started: `time.monotonic` at the start (the report's ``wall_s`` counts from it).
        name: The profile's name; ``profile`` the profile.
        device: The GPU as NVML tells it (the baselines process's facts are merged later).
        where: Where the plain block ran for ``plain_s`` (``cuda:N`` or ``cpu``).
        plain_s: The plain block's step per shape: the unit of every deadline.
        env: Added to both children's environments.
        dry_run: A dry run on the CPU.
    """

    started: float
    name: str
    profile: Profile
    device: telemetry.DeviceInfo
    where: str
    plain_s: list[float]
    env: dict[str, str]
    dry_run: bool

    def children(self, config: ScoringConfig, reference_module: str, census: bool, python: str,
                 progress: Progress) -> dict[str, Any]:  # fmt: skip
        """`grader.interleave.start_interleaved`'s keyword arguments."""
        return dict(plain_s=self.plain_s, device="cpu" if self.dry_run else "cuda", env=self.env,
                    rule=config.limits.deadlines.for_device(self.where),
                    reference_module=reference_module, census=census,
                    python=python, progress=sayer(progress), uuid=self.device.uuid)  # fmt: skip


def sayer(progress: Progress) -> Callable[[str], None]:
    """A line of progress to ``progress``: a stream, a callable taking the line, or nowhere."""
    def say(line: str) -> None:
        if callable(progress):
            progress(line)
        elif progress is not None:
            print(line, file=progress, flush=True)

    return say


def prepare_timing(config: ScoringConfig, *, profile: str | None, gpu: int | None,
                   gpu_name: str | None = None, triton_cache: Path | None = None,
                   dry_run_on_cpu: bool = False) -> TimingSetup:  # fmt: skip
    """The profile, the device and the plain block's step on every shape (`run_timing`'s
    arguments of the same names)."""
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
    # The plain block's step on every shape, measured here before the children hold the device:
    # the unit of the children's deadlines.
    where = "cpu" if dry_run_on_cpu else f"cuda:{gpu if gpu is not None else 0}"
    # A parent that cannot see the GPU (tests with a stand-in child) gives every step its floor.
    measurable = dry_run_on_cpu or torch.cuda.is_available()
    plain_s = [deadlines.shape_step_seconds(s.batch, s.length, s.dtype,
                                            dict(dataclasses.asdict(config.block),
                                                 dilation=s.dilation), where)
               if measurable else 0.0 for s in prof.shapes]
    return TimingSetup(started, name, prof, device, where, plain_s, env, dry_run_on_cpu)


def timing_report(run: interleave.Interleaved, setup: TimingSetup,
                  config: ScoringConfig) -> TimingReport:  # fmt: skip
    """Judge what a timing run measured (the module docstring's list) and score it."""
    prof, name, plain_s, dry_run_on_cpu = setup.profile, setup.name, setup.plain_s, setup.dry_run
    started, device = setup.started, setup.device
    device = telemetry.merge_child(device, run.device)
    bandwidth = plausibility.peak_bandwidth(device.name, device.max_memory_clock_mhz,
                                            device.memory_bus_width_bits)
    status, reason = TimingStatus(run.status), run.reason
    drains = [b for block in run.drain_by_block.values() for b in block]
    verdicts: list[ShapeVerdict] = []
    for index, shape in enumerate(prof.shapes):
        measured = run.shapes[index]
        if status is TimingStatus.OK or len(measured.window_ms["sub"]) == prof.rounds:
            verdicts.append(analyze_shape(measured, config.score, bandwidth,
                                          judge=config.timing.judge,
                                          channels=config.block.channels,
                                          expansion=config.block.expansion, rounds=prof.rounds,
                                          alone_rounds=prof.alone_rounds,
                                          dry_run=dry_run_on_cpu,
                                          process_sd=prof.process_sd,
                                          baseline_bound=prof.baseline_drift))
        else:
            not_timed = ShapeTiming(label=shape.label, score=0.0,
                                    status=TimingStatus.NOT_TIMED.value,
                                    reason="the timing run stopped before this shape was timed")
            verdicts.append(ShapeVerdict(not_timed, TimingStatus.NOT_TIMED))
    if status is TimingStatus.OK:
        why = memory_verdict(run.memory, prof, config.block.channels, config.timing.judge)
        if why:
            status, reason = TimingStatus.RULE_BROKEN, why
    if status is TimingStatus.OK:
        bad = next((v for v in verdicts if v.status is not TimingStatus.OK), None)
        if bad is not None:
            status, reason = bad.status, f"{bad.timing.label}: {bad.timing.reason}"
    value, ci = task_score(verdicts) if status is TimingStatus.OK else (0.0, None)
    shapes = tuple(v.timing for v in verdicts)
    if status is not TimingStatus.OK:
        shapes = tuple(_zeroed(s) for s in shapes)
    sub, base = run.submission, run.baselines
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
            "snapshots": [s.to_dict() for s in run.snapshots],
            "handshake_ms": run.handshake_ms,
            "hold": run.hold,
            "host_wait": run.host_wait,
            # The trusted probe (`grader.idle`): how long the
            # device stayed busy after the submission's process's steps (on their walls), and
            # what it found busy before a step (each such round ran again).
            "probe": {"drain_ms_max": max(drains, default=None),
                      "drain_ms_median": statistics.median(drains) if drains else None,
                      "drained_steps": sum(1 for b in drains if b > 0),
                      # Per block of that process (its own steps, the calibration steps before
                      # the import): a block whose steps leave the GPU slower to switch back
                      # than the harness's shows here (2026-12-06: 0.27 ms after the scoring
                      # reference's cuBLAS steps on an H100, 0.0 after the ceiling's).
                      "drain_ms_median_by_block": {
                          b: statistics.median(v) for b, v in sorted(run.drain_by_block.items())},
                      "busy_before_step_ms": run.busy_ms},
            "command_s": run.command_s,
            "step_overhead_ms": _overheads(run.shapes),
            "oracle_checks": {prof.shapes[i].label: {"rounds": len(raw.oracle_util),
                                                     "worst": max(raw.oracle_util, default=None)}
                              for i, raw in enumerate(run.shapes)},
            "alone_rounds": prof.alone_rounds,
            # r's between-process term in every interval (`grader.timing.estimate_shape`): what
            # a tool that recounts the samples needs to get the grade's intervals back.
            "process_sd": prof.process_sd,
            "child_wall_s": sub.wall_s if sub else None,
            "child_outcome": sub.outcome.value if sub else None,
            "child_peak_rss_mb": sub.peak_rss_mb if sub else None,
            "child_peak_tasks": sub.peak_tasks if sub else None,
            "child_armed_tasks": sub.armed_tasks if sub else None,
            "baselines_outcome": base.outcome.value if base else None,
            "baselines_stderr_tail": base.stderr_tail[-1000:] if base else "",
            "gpu_memory_accounting": run.memory.get("accounting"),
            "gpu_memory": {k: run.memory.get(k) for k in ("held_bytes", "foreign_bytes")},
            "plain_step_s": plain_s,
            "child_stderr_tail": sub.stderr_tail[-2000:] if sub else "",
            "load_s": run.load_s,
        },
    )


def _zeroed(s: ShapeTiming) -> ShapeTiming:
    """A shape row of a failed timing phase: its measurements stay, its score is 0."""
    from dataclasses import replace

    return replace(s, score=0.0)


def _overheads(shapes: Sequence[ShapeRaw]) -> dict[str, float | None]:
    """Per block, the median of what its steps cost around their event windows (the parent's
    wall less the window) over every timed step: the same step code for every block, so these
    should agree; ``cal``, the submission's process's calibration steps (the harness's block
    before the import), the level that process's own cost is judged against."""
    out: dict[str, float | None] = {}
    for name in BLOCKS:
        gaps = [w - e for raw in shapes
                for w, e in zip(raw.wall_ms[name], raw.window_ms[name], strict=False)]
        out[name] = float(np.median(gaps)) if gaps else None
    own = [c for raw in shapes for c in raw.calibration_ms]
    out["cal"] = float(np.median(own)) if own else None
    return out


class TimingStart:
    """A timing run begun before it is known whether it will time anything: the children start
    and the baselines warm up (`grader.interleave.start_interleaved`) in a thread, while the
    caller runs the gate; `finish` then times the submission, `cancel` ends the children.

    Nothing of the submission runs before `finish`: its process is armed and idle, it has imported
    nothing. The plain block's step per shape (the deadlines' unit) is measured here, before the
    thread starts, with the GPU still to ourselves.

    A grade uses it where its profile's ``overlap_timing`` says so (h200) or when asked
    (`GradeOptions.overlap_timing`, ``python -m grader grade --overlap-timing``;
    ``--sequential-timing`` refuses it; `bench/grade/grade_phases.py --overlap`). Before held steps
    (2026-12-02, `bench/results/grade-fast-h200-2026-12-02/`) its grades scored 0.8633-0.8809
    (one `implausible`) where sequential grades had scored 0.8788-0.8882. With held steps
    (2026-12-03, `bench/results/spin-h200-2026-12-03/`) three overlap grades of the
    reference-as-submission took 106-130 s and scored 0.8940-0.8960, against four sequential
    grades of 127-170 s and 0.8927-0.8967.

    Args: those of `run_timing` (``progress``: the stage lines of the start are held back and
        said when `finish` begins, so they do not tear the gate's progress bar).
    """

    def __init__(self, submission_root: Path, config: ScoringConfig, *, profile: str | None = None,
                 gpu: int | None = None, gpu_name: str | None = None,
                 progress: TextIO | None = sys.stderr, reference_module: str = "reference.block",
                 census: bool = True, python: str = sys.executable,
                 triton_cache: Path | None = None,
                 dry_run_on_cpu: bool = False) -> None:  # fmt: skip
        self.config = config
        self.progress = progress
        self.setup = prepare_timing(config, profile=profile, gpu=gpu, gpu_name=gpu_name,
                                    triton_cache=triton_cache, dry_run_on_cpu=dry_run_on_cpu)
        self.carry = triton_cache is None  # a shared cache needs nothing carried
        self.held: list[str] = []
        self.started: interleave.Started | None = None
        self.error: BaseException | None = None
        self.tmp = tempfile.TemporaryDirectory(prefix="timing-")
        kwargs = self.setup.children(config, reference_module, census, python, self.held.append)
        # The thread that starts the children lives until they end (`cancel`): each child dies
        # with the thread that started it (`grader.sandbox`'s PR_SET_PDEATHSIG).
        self._ready, self._release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._start, name="timing-start", daemon=True,
                                       args=(submission_root, kwargs))  # fmt: skip
        self.thread.start()

    def _start(self, submission_root: Path, kwargs: dict[str, Any]) -> None:
        try:
            self.started = interleave.start_interleaved(
                submission_root, Path(self.tmp.name), self.config, self.setup.profile, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised by finish
            self.error = exc
        finally:
            self._ready.set()
        self._release.wait()

    def wait(self) -> None:
        """Wait until the children have started, or failed to (``error``)."""
        self._ready.wait()

    def tree_changes(self, digests: tuple[tuple[str, str], ...]) -> list[str]:
        """How the timing child's copy of the tree (made before the gate ran, writable to the
        gate's children, who run as the grader's user) differs from the exported files
        (`grader.workspace.tree_changes`); its harness's own directories aside, which `finish`
        empties, and the sandbox's output files. Empty where the start failed (`finish` says
        why)."""
        self._ready.wait()
        if self.started is None:
            return []
        return tree_changes(self.started.sub_dir, digests, skip=HARNESS_DIRS + HARNESS_FILES)

    def finish(self, triton_cache: Path | None = None) -> TimingReport:
        """Time the submission and judge (`run_timing`'s report). ``triton_cache``: the gate
        child's Triton cache, copied into the timing child's (the same submission compiled
        it; bounded by `CARRIED_CACHE_BYTES`). Whatever the gate's children may have put in
        the timing child's `HARNESS_DIRS` meanwhile is removed first (the caller holds the rest
        of its tree to the export with `tree_changes`)."""
        self._ready.wait()
        try:
            if self.error is not None:
                raise self.error
            assert self.started is not None
            say = sayer(self.progress)
            for line in self.held:
                say(line)
            self.started.run.progress = say
            for name in HARNESS_DIRS:
                _empty(self.started.sub_dir / name)
            if triton_cache is not None and self.carry:
                carry_cache(triton_cache, self.started.sub_dir / ".triton")
            run = interleave.finish_interleaved(self.started)
        finally:
            self.cancel()
        return timing_report(run, self.setup, self.config)

    def cancel(self) -> None:
        """End both children and remove their directories (idempotent)."""
        self._ready.wait()
        if self.started is not None:
            interleave.cancel_interleaved(self.started)
        self._release.set()
        self.thread.join()
        with contextlib.suppress(OSError):
            self.tmp.cleanup()


def _empty(directory: Path) -> None:
    """Remove everything inside ``directory`` (links are removed, never followed); files the
    timing child has mapped stay mapped."""
    if directory.is_symlink() or not directory.is_dir():
        directory.unlink(missing_ok=True)
        directory.mkdir()
        return
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def carry_cache(source: Path, dest: Path, limit: int = CARRIED_CACHE_BYTES) -> int:
    """Copy the regular files of ``source`` (a Triton cache a child wrote) under ``dest``, links
    and anything else skipped, nothing at all past ``limit`` bytes; the bytes copied.

    Triton's group files (``__grp__*.json``) name their members by absolute path: those under
    ``source`` (written without ``..``) are renamed under ``dest`` and any other is dropped (a
    group that names the gate's directory sends the timing child into a directory its sandbox
    forbids). A group file that is not Triton's JSON is left out: that kernel is compiled again.
    A file ``dest`` already has is left alone (the child may have it mapped), and each new one is
    written whole and renamed into place.
    """
    files: list[Path] = []
    total = 0
    for root, _dirs, names in os.walk(source, followlinks=False):
        for name in names:
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                continue
            files.append(path)
            total += path.lstat().st_size
            if total > limit:
                return 0
    for path in files:
        target = dest / path.relative_to(source)
        if os.path.lexists(target):
            # Triton's cache is keyed by content, so an entry the child has is the same one; and
            # the child may have it mapped (its launcher's .so, loaded while it started): writing
            # that file again in place killed every overlapped grade with SIGSEGV on an H200.
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError, ValueError):
            data = (_regrouped(path.read_text(), source, dest).encode()
                    if path.name.startswith("__grp__") else path.read_bytes())
            # Never a half-written entry in the cache.
            write_whole(target, data)
    return total


def _regrouped(text: str, source: Path, dest: Path) -> str:
    """A Triton group file's JSON with its members moved from ``source`` to ``dest``; raises
    ValueError when it is not one."""
    data = json.loads(text)
    paths = data.get("child_paths") if isinstance(data, dict) else None
    if not isinstance(paths, dict):
        raise ValueError("not a Triton group file")
    moved = {}
    for member, where in paths.items():
        # Lexically normal first: "<source>/../x" is not under source, whatever is_relative_to
        # says of its words.
        if not isinstance(where, str) or os.path.normpath(where) != where:
            continue
        if Path(where).is_relative_to(source):
            moved[member] = str(dest / Path(where).relative_to(source))
    return json.dumps({"child_paths": moved})


__all__ = ["CARRIED_CACHE_BYTES", "TimingSetup", "TimingStart", "carry_cache", "prepare_timing",
           "run_timing", "timing_report"]
