"""What a grade produces: typed, frozen results, written as JSON and shown as a table.

Failure is data, never a missing number: every failed status carries score 0.0 and a reason.
Only a submission that passed every check that could run, but was not timed (no GPU, or no timing
engine), has ``score = None`` and the distinct status ``checked_untimed``, with the phases and
rules that were not checked listed by name.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.files import write_whole

GRADER_VERSION = "0.1.0"

# The first reason of a ``grader_error`` whose device was short of memory because of other
# processes (`grader.device_memory`): no verdict on the submission; the service grades it again
# (`grader.service.verdict.device_short`).
DEVICE_SHORT = "device short: "


class Status(enum.StrEnum):
    """Outcome of one grade."""

    SCORED = "scored"  # passed the gate and every rule, timed, scored
    CHECKED_UNTIMED = "checked_untimed"  # passed what could run; not timed (no GPU / no engine)
    INVALID_SUBMISSION = "invalid_submission"  # not a git repo, no solution.py, over tree limits
    LOAD_FAILED = "load_failed"  # import, constructor or state-dict keys failed
    RULE_BROKEN = "rule_broken"  # a run-time rule of CONTRACT §2 was broken
    GATE_FAILED = "gate_failed"  # a correctness check of CONTRACT §3 failed
    CRASHED = "crashed"  # the child exited or died before finishing
    TIMED_OUT = "timed_out"  # the child ran past its wall-clock limit
    OUT_OF_MEMORY = "out_of_memory"  # the child went over its memory limit or its GPU share
    TIMING_FAILED = "timing_failed"  # timing ran but rejected the submission (implausible...)
    GRADER_ERROR = "grader_error"  # the grader itself failed; not the submission's fault

    @property
    def passed(self) -> bool:
        return self in (Status.SCORED, Status.CHECKED_UNTIMED)

    @classmethod
    def of_timing(cls, timing_status: str) -> Status:
        """The grade's status for a `TimingReport.status` (``ok`` is scored)."""
        return {
            "ok": cls.SCORED,
            "rule_broken": cls.RULE_BROKEN,
            "timed_out": cls.TIMED_OUT,
            "out_of_memory": cls.OUT_OF_MEMORY,
            "crashed": cls.CRASHED,
            "grader_error": cls.GRADER_ERROR,
        }.get(timing_status, cls.TIMING_FAILED)  # check_failed, implausible


class ExitCode(enum.IntEnum):
    """Exit status of ``python -m grader grade``, one per `Status`."""

    SCORED = 0  # a score was produced (it may still be 0.0 for a slow submission)
    GRADER_ERROR = 1  # an exception inside the grader (Python's own default status)
    USAGE = 2  # bad command line (argparse's own status)
    CHECKED_UNTIMED = 3  # correct where checked, nothing timed
    INVALID_SUBMISSION = 10
    LOAD_FAILED = 11
    RULE_BROKEN = 12
    GATE_FAILED = 13
    CRASHED = 14
    TIMED_OUT = 15
    OUT_OF_MEMORY = 16
    TIMING_FAILED = 17

    @classmethod
    def for_status(cls, status: Status) -> ExitCode:
        return cls[status.name]


class Severity(enum.StrEnum):
    """How much a rule finding weighs."""

    VIOLATION = "violation"  # a run-time rule was broken: the grade fails
    ADVISORY = "advisory"  # a static tripwire or a note: reported, decides nothing


@dataclass(frozen=True)
class CheckResult:
    """One numeric or exact check of one case.

    Attributes:
        name: What was checked, e.g. ``forward``, ``grad_x``, ``dtype``, ``inputs_unchanged``.
        passed: Whether it held.
        error: Measured error (max normalised |Δ| for the forward, rel-L2 for gradients); None
            for exact checks.
        budget: The budget ``error`` is compared with (1.0 for the normalised forward check).
        utilisation: ``error / budget``; None for exact checks.
        detail: Why it failed, with both values (empty when it passed).
    """

    name: str
    passed: bool
    error: float | None = None
    budget: float | None = None
    utilisation: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class CaseResult:
    """One correctness case run with one public seed.

    Attributes:
        name: ``<case name>#<public seed>``.
        kind: ``case``, ``identity`` or ``drift``.
        dtype: The case's dtype name.
        shape: (batch, length, channels).
        dilation: The block's dilation.
        passed: Every check held.
        checks: The individual checks.
        max_utilisation: Largest utilisation among the checks (None if nothing numeric ran).
        reason: First failure, in a sentence (empty when passed).
        wall_s: Seconds the child spent on the case (as it reported; informational).
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int, int, int]
    dilation: int
    passed: bool
    checks: tuple[CheckResult, ...] = ()
    max_utilisation: float | None = None
    reason: str = ""
    wall_s: float | None = None


@dataclass(frozen=True)
class RuleFinding:
    """A rule of CONTRACT §2 seen broken (run time) or a suspicious construct (static tripwire).

    Attributes:
        rule: Stable identifier, e.g. ``torch-op-on-path``, ``global-state``, ``reads-grader``.
        severity: ``violation`` fails the grade; ``advisory`` only informs.
        source: ``runtime`` or ``static``.
        message: What was seen, with values.
        phase: Where: ``load``, ``case:<name>``, ``timing``; or a file for static findings.
        location: ``path:line`` for static findings.
    """

    rule: str
    severity: Severity
    source: str
    message: str
    phase: str = ""
    location: str = ""

    @property
    def reason(self) -> str:
        """The finding as a report's reason (``rule (phase): message``), where it decides one."""
        return f"{self.rule} ({self.phase}): {self.message}"


@dataclass(frozen=True)
class SystemInfo:
    """Where the grade ran.

    Attributes:
        device: ``cuda:<n>`` or ``cpu (triton interpreter)``.
        gpu_name, gpu_uuid, driver, cuda: GPU facts (None on CPU).
        python, torch, triton, numpy: Versions of the grading environment.
        platform: ``platform.platform()``.
        hostname: The machine's name.
        confinement: What the operating system enforces on the children that run submission
            code on this host (`grader.confinement.host_confinement`): Landlock's ABI and what it
            covers, seccomp, not dumpable; a host without Landlock says so.
    """

    device: str
    python: str
    torch: str
    triton: str
    numpy: str
    platform: str
    hostname: str = ""
    gpu_name: str | None = None
    gpu_uuid: str | None = None
    driver: str | None = None
    cuda: str | None = None
    confinement: str = ""


@dataclass(frozen=True)
class ShapeSamples:
    """One shape's timed windows as the child reported them, round by round, with their visits.

    Carried in the report so that an interval can be recomputed offline with any method
    (``bench/timing/interval_coverage.py``); the timing engine computes its own numbers from the
    same samples.

    Attributes:
        plain_ms, ref_ms, sub_ms: Per timed round, each block's window (start → device idle).
        visit: Per timed round, the visit it was timed in (rounds of one visit are consecutive).
        plain_tail_ms, ref_tail_ms, sub_tail_ms: Per timed round, each block's tail (the step
            returned on the caller's stream → device idle): the part of the window that holds
            the host's way back from its synchronization, not only the GPU's work (empty in
            reports written before they were kept).
    """

    plain_ms: tuple[float, ...]
    ref_ms: tuple[float, ...]
    sub_ms: tuple[float, ...]
    visit: tuple[int, ...]
    plain_tail_ms: tuple[float, ...] = ()
    ref_tail_ms: tuple[float, ...] = ()
    sub_tail_ms: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        names = ["plain_ms", "ref_ms", "sub_ms", "visit"]
        tails = ("plain_tail_ms", "ref_tail_ms", "sub_tail_ms")
        if any(getattr(self, name) for name in tails):
            names += tails
        counts = {name: len(getattr(self, name)) for name in names}
        if len(set(counts.values())) != 1:
            raise ValueError(f"samples of one shape must have one entry per round each, got "
                             f"{counts}")


@dataclass(frozen=True)
class ShapeTiming:
    """Timing of one shape (owned by the timing engine; see grader/timing.py).

    Attributes:
        label: The shape's label (``dtype:BxL:dD``).
        t_plain_ms, t_ref_ms, t_sub_ms: Median step times.
        r: ``t_plain / t_sub``.
        g: ``t_plain / t_ref``.
        r_ci, g_ci: Bootstrap confidence intervals of r and g.
        target: The r that scores 1 here, ``max(margin·g, min_target)`` with the settings this
            grade was scored with (CONTRACT §5): the report says what it was held to, whatever
            ``scoring.yaml`` says later. None where the shape was not scored, and in reports
            written before the field was added (2026-12-06).
        score: Score of the shape (CONTRACT §5).
        status: ``ok`` or why not (`grader.timing.TimingStatus` values).
        reason: Sentence for a non-ok status.
        score_ci: Bootstrap confidence interval of the score.
        weight: The shape's weight in the task score (its dtype's).
        floor_ms: Bandwidth floor of one step: bytes it must move over the GPU's peak bandwidth.
        utilisation: Worst check of the submission's timed steps against plain PyTorch, as a
            fraction of the dtype's budget.
        tail_ms: Median time the device kept working after the submission's step returned.
        samples: The per-round times r, g and the score were computed from (None when the
            shape was not timed, or its samples were malformed).
        t_plain_alone_ms, t_ref_alone_ms: Median steps of plain and the reference timed alone,
            before the submission's process imported anything.
        overhead_ms: The most a step's handshake cost around its window here (from the
            baselines' steps); a step's time is at least its parent wall less this.
        clock_disagreements: The submission's steps whose event window was shorter than that.
    """

    label: str
    t_plain_ms: float | None = None
    t_ref_ms: float | None = None
    t_sub_ms: float | None = None
    r: float | None = None
    g: float | None = None
    r_ci: tuple[float, float] | None = None
    g_ci: tuple[float, float] | None = None
    target: float | None = None
    score: float = 0.0
    status: str = "ok"
    reason: str = ""
    score_ci: tuple[float, float] | None = None
    weight: float = 1.0
    floor_ms: float | None = None
    utilisation: float | None = None
    tail_ms: float | None = None
    samples: ShapeSamples | None = None
    t_plain_alone_ms: float | None = None
    t_ref_alone_ms: float | None = None
    overhead_ms: float | None = None
    clock_disagreements: int | None = None


@dataclass(frozen=True)
class TimingReport:
    """Result of the timing phase (CONTRACT §4–§5). The timing engine may extend it.

    Attributes:
        profile: Profile name from `scoring.yaml`.
        shapes: Per-shape timings.
        score: Weighted mean of the shape scores.
        status: ``ok`` or why timing rejected the submission.
        reason: Sentence for a non-ok status.
        telemetry: GPU identity, peak bandwidth, clocks, temperature and power around each
            shape, and the timing child's resource use, by name.
        score_ci: Bootstrap confidence interval of the score (None when failed).
        rounds: Timed rounds per shape.
        warmup: Untimed warm-up rounds per shape.
        wall_s: Seconds the timing phase took, child start and compilation included.
    """

    profile: str
    shapes: tuple[ShapeTiming, ...] = ()
    score: float = 0.0
    status: str = "ok"
    reason: str = ""
    telemetry: dict[str, Any] = field(default_factory=dict)
    score_ci: tuple[float, float] | None = None
    rounds: int = 0
    warmup: int = 0
    wall_s: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimingReport:
        """A report's ``timing`` object read back (the service's dashboard plots it)."""
        return _from_jsonable(cls, data)


@dataclass(frozen=True)
class GradeReport:
    """Everything one grade found.

    Attributes:
        status: The outcome.
        score: The task score; 0.0 for every failure; None only for ``checked_untimed``.
        reasons: Why, first reason first (empty for a clean ``scored``).
        workspace: Path of the graded repository.
        commit: Commit id graded.
        tree: Git tree id of that commit.
        uncommitted_changes_ignored: The workspace had uncommitted changes that were not graded.
        checked: Phases and rules that ran, by name.
        not_checked: Phases and rules that did not run, each with why.
        cases: Per-case results of the gate, in order.
        max_utilisation: Largest utilisation over every case (how close to failing).
        findings: Rule findings, run-time violations first, then static advisories.
        system: Where it ran.
        grader_version: `GRADER_VERSION`.
        started_at: ISO-8601 UTC time the grade started.
        wall_s: Seconds the grade took.
        timing: The timing phase's result, if it ran.
        child_stderr_tail: Last lines the gate child wrote to stderr, when it failed (for a
            person reading a crash; written by submission code too, so never parsed).
    """

    status: Status
    score: float | None
    reasons: tuple[str, ...]
    workspace: str
    commit: str
    tree: str
    uncommitted_changes_ignored: bool
    checked: tuple[str, ...]
    not_checked: tuple[str, ...]
    cases: tuple[CaseResult, ...]
    max_utilisation: float | None
    findings: tuple[RuleFinding, ...]
    system: SystemInfo
    grader_version: str = GRADER_VERSION
    started_at: str = ""
    wall_s: float = 0.0
    timing: TimingReport | None = None
    child_stderr_tail: str = ""

    def __post_init__(self) -> None:
        if not self.status.passed and self.score != 0.0:
            raise ValueError(f"status {self.status} must carry score 0.0, got {self.score!r}")
        if self.status is Status.SCORED and self.score is None:
            raise ValueError("status scored needs a score, got None")
        if not self.status.passed and not self.reasons:
            raise ValueError(f"status {self.status} needs a reason")

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.for_status(self.status)

    def to_dict(self) -> dict[str, Any]:
        return _to_jsonable(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def write_json(self, path: str | Path) -> None:
        """The report as JSON at ``path``: written to a new file beside it, then renamed over it.
        Whatever stood at ``path`` (a link or a file a child of the same user made: in a
        container ``/out`` is writable by the submission's user) is replaced, never written
        through, and no reader sees half a report."""
        # mkstemp's 0600 would hide it from the executor's user.
        write_whole(path, (self.to_json() + "\n").encode(), mode=0o644)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GradeReport:
        return _from_jsonable(cls, data)

    @classmethod
    def from_json(cls, text: str) -> GradeReport:
        return cls.from_dict(json.loads(text))


def _to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf/nan; keep the fact as text
    return value


def _from_jsonable(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if value is None:
        return None
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        kwargs = {
            f.name: _from_jsonable(hints[f.name], value[f.name])
            for f in dataclasses.fields(tp)
            if f.name in value
        }
        return tp(**kwargs)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _from_jsonable(args[0], value) if len(args) == 1 else value
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_jsonable(args[0], v) for v in value)
        return tuple(_from_jsonable(a, v) for a, v in zip(args, value, strict=True))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if tp is float and isinstance(value, str):
        return float(value)
    return value


# ----------------------------------------------------------------------------- table


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def render_table(report: GradeReport) -> str:
    """The report for people: a summary, one line per case, findings, timing, what was skipped."""
    lines = []
    score = "none (not timed)" if report.score is None else f"{report.score:.4f}"
    lines.append(f"status: {report.status.value}    score: {score}")
    for reason in report.reasons:
        lines.append(f"  - {reason}")
    lines.append(
        f"workspace: {report.workspace}  commit: {report.commit[:12]}  tree: {report.tree[:12]}"
    )
    if report.uncommitted_changes_ignored:
        lines.append("note: the workspace has uncommitted changes; they were NOT graded")
    lines.append(
        f"device: {report.system.device}  torch {report.system.torch}  "
        f"triton {report.system.triton}  grader {report.grader_version}"
    )
    if report.system.confinement:
        lines.append(f"confinement: {report.system.confinement}")
    if report.cases:
        lines.append("")
        width = max(len(c.name) for c in report.cases)
        lines.append(f"{'case':<{width}}  {'kind':<8} {'dtype':<9} {'util':>7}  result")
        for case in report.cases:
            result = "ok" if case.passed else f"FAIL: {case.reason}"
            lines.append(
                f"{case.name:<{width}}  {case.kind:<8} {case.dtype:<9} "
                f"{_fmt(case.max_utilisation, '7.3f')}  {result}"
            )
        lines.append(f"max envelope utilisation: {_fmt(report.max_utilisation, '.3f')}")
    # A finding that is a reason above is not printed again.
    rest = [f for f in report.findings if f.reason not in report.reasons]
    if rest:
        lines.append("")
        lines.append("findings" + (" (besides the reasons above):" if len(rest) <
                                   len(report.findings) else ":"))  # fmt: skip
        for f in rest:
            where = f" [{f.location or f.phase}]" if (f.location or f.phase) else ""
            lines.append(f"  {f.severity.value:<9} {f.source:<7} {f.rule}{where}: {f.message}")
    if report.timing is not None:
        lines.append("")
        lines.append(render_timing(report.timing))
    if report.not_checked:
        lines.append("")
        lines.append("not checked:")
        lines.extend(f"  - {item}" for item in report.not_checked)
    if report.child_stderr_tail:
        lines.append("")
        lines.append("gate child's stderr (tail):")
        lines.extend(f"  | {line}" for line in report.child_stderr_tail.splitlines()[-15:])
    lines.append(f"\ngraded in {report.wall_s:.1f} s, started {report.started_at}")
    return "\n".join(lines)


def _visit_rounds(report: TimingReport) -> int | str:
    """Rounds per visit, read off the samples (the timing engine's `VISIT_ROUNDS`)."""
    for s in report.shapes:
        if s.samples is not None and s.samples.visit:
            return s.samples.visit.count(s.samples.visit[0])
    return "?"


def _ci(pair: tuple[float, float] | None, spec: str = ".3f") -> str:
    return "" if pair is None else f"[{pair[0]:{spec}}, {pair[1]:{spec}}]"


def render_timing(report: TimingReport) -> str:
    """Per-shape t_plain, t_ref, t_sub, r, g, the target r (score 1) and the score, with
    intervals, then the task score."""
    head = (f"{'shape':<26} {'t_plain ms':>10} {'t_ref ms':>9} {'t_sub ms':>9} "
            f"{'r':>6} {'r 95% CI':<16} {'g':>6} {'g 95% CI':<16} {'target':>6} "
            f"{'score':>6} {'score 95% CI':<16} status")
    lines = [f"timing profile {report.profile}: {report.rounds} rounds after {report.warmup} "
             "warm-up rounds, medians of per-round paired ratios, 95% bootstrap intervals "
             f"resampling whole visits of {_visit_rounds(report)} rounds", head]
    for s in report.shapes:
        status = s.status if s.status == "ok" else f"{s.status}: {s.reason}"
        f3 = {k: _fmt(getattr(s, k), ".3f")
              for k in ("t_plain_ms", "t_ref_ms", "t_sub_ms", "r", "g", "target")}
        lines.append(
            f"{s.label:<26} {f3['t_plain_ms']:>10} {f3['t_ref_ms']:>9} {f3['t_sub_ms']:>9} "
            f"{f3['r']:>6} {_ci(s.r_ci):<16} {f3['g']:>6} {_ci(s.g_ci):<16} "
            f"{f3['target']:>6} {s.score:>6.3f} {_ci(s.score_ci):<16} {status}")
    lines.append(f"task score {report.score:.4f} {_ci(report.score_ci, '.4f')}  "
                 f"status {report.status}{': ' + report.reason if report.reason else ''}")
    return "\n".join(lines)


__all__ = [
    "GRADER_VERSION",
    "DEVICE_SHORT",
    "CaseResult",
    "CheckResult",
    "ExitCode",
    "GradeReport",
    "RuleFinding",
    "Severity",
    "ShapeSamples",
    "ShapeTiming",
    "Status",
    "SystemInfo",
    "TimingReport",
    "render_table",
    "render_timing",
]
