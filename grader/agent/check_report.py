"""What one local check found (`CheckReport`, and its JSON) and the text an agent reads
(`render`): what was checked, each failure with both values, the timing and estimate table, what
to do next."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grader.agent.estimate import ScoreEstimate
from grader.report import CaseResult, ExitCode, RuleFinding, Status, TimingReport

# Failed cases shown in full; the rest are counted (all of them are in --json).
_SHOW_FAILED = 5


class Mode(enum.StrEnum):
    """Which cases the gate runs."""

    QUICK = "quick"
    FULL = "full"


@dataclass(frozen=True)
class CheckReport:
    """Everything one local check found.

    Attributes:
        status: The grader's status vocabulary: ``scored`` (passed and timed, score estimated),
            ``checked_untimed`` (passed, nothing timed), or the failure.
        reasons: Why, first reason first.
        next_steps: What to do now, in order.
        mode: ``quick`` or ``full``.
        source: What was checked (``working tree`` or ``commit <id>``).
        workspace: The workspace root.
        head: HEAD's commit id (what ``submit`` would send), or None before the first commit.
        uncommitted: ``git status`` lines of changes that ``submit`` would NOT send.
        device: ``cuda:0`` or ``cpu (triton interpreter)``.
        items_total: Gate items planned (cases × public seeds, identity, drift).
        cases: The gate's per-case results (fewer than planned when it stopped early).
        seeds: ``public`` (reproducible) or ``secret`` (mixed with a secret, as graded).
        findings: Run-time rule findings.
        advisories: The grader's static tripwire (advisory, decides nothing).
        max_utilisation: Largest error/budget over every check (how close to failing).
        timing: The timing phase's report, if it ran.
        estimate: The estimated score, if timing ran.
        reproduce: Failed item name → the command that writes a script rebuilding it locally.
        frames: Item name → where the submission raised in it (the last frames in its files).
        not_checked: What did not run, each with why.
        wall_s: Seconds the check took.
    """

    status: Status
    reasons: tuple[str, ...]
    next_steps: tuple[str, ...]
    mode: Mode
    source: str
    workspace: str
    head: str | None
    uncommitted: tuple[str, ...]
    device: str
    seeds: str = "public"
    items_total: int = 0
    cases: tuple[CaseResult, ...] = ()
    findings: tuple[RuleFinding, ...] = ()
    advisories: tuple[RuleFinding, ...] = ()
    max_utilisation: float | None = None
    timing: TimingReport | None = None
    estimate: ScoreEstimate | None = None
    reproduce: dict[str, str] = dataclasses.field(default_factory=dict)
    frames: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    not_checked: tuple[str, ...] = ()
    wall_s: float = 0.0

    @property
    def exit_code(self) -> int:
        """The grader's exit codes: 0 passed and timed, 3 passed untimed, ≥ 10 a failure."""
        return int(ExitCode.for_status(self.status))

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(self)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, CheckReport):
            out["exit_code"] = value.exit_code
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if type(value).__module__ == "numpy":
        # numpy scalars and arrays from the timing statistics: plain Python for JSON.
        return _jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


# ----------------------------------------------------------------------------- output


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def render(report: CheckReport) -> str:
    """The check for people: what was checked, each failure with both values, what to do."""
    lines = [
        f"checked: {report.source} of {report.workspace} on {report.device}, "
        f"{report.mode.value} gate, {report.seeds} seeds"
    ]
    if report.uncommitted:
        lines.append(
            f"note: {len(report.uncommitted)} uncommitted change(s) were checked but would NOT be "
            + (f"submitted (submit sends HEAD {report.head[:12]}): " if report.head else
               "submitted (there is no commit yet, so nothing can be submitted): ")
            + ", ".join(line[3:] for line in report.uncommitted[:6])
            + (" ..." if len(report.uncommitted) > 6 else "")
        )
    broken = _rule_broken_items(report)
    passed = sum(c.passed and c.name not in broken for c in report.cases)
    if report.items_total:
        stopped = len(report.cases) < report.items_total
        if report.findings:
            at = next((c.name for c in report.cases if c.name in broken), None)
            ran = f"stopped at the first rule break{' in ' + at if at else ''}"
        else:
            ran = f"{len(report.cases)} ran before the gate stopped"
        lines.append(
            f"gate: {passed} of {report.items_total} items passed"
            + (f" ({ran})" if stopped or report.findings else "")
            + f"; max envelope utilisation {_fmt(report.max_utilisation, '.3f')} "
            "(error / budget; > 1 fails)"
        )
    if report.cases and not any(not c.passed for c in report.cases) and not report.findings:
        lines.extend(_closest(report.cases))
    for f in report.findings:
        lines.append(f"RULE BROKEN  {f.rule} in {f.phase}: {f.message}")
    for f in report.advisories:
        lines.append(f"advisory (static scan, decides nothing): {f.rule} at {f.location}: "
                     f"{f.message}")
    failed = [c for c in report.cases if not c.passed]
    for case in failed[:_SHOW_FAILED]:
        b, length, ch = case.shape
        lines.append(
            f"FAILED  case {case.name} ({case.kind}, {case.dtype}, batch {b} × length {length} × "
            f"channels {ch}, dilation {case.dilation})"
        )
        bad = [ch_ for ch_ in case.checks if not ch_.passed]
        for check in bad:
            values = ""
            if check.name == "forward" and check.error is not None:
                # The budget is 1 by construction: the error is already a ratio to the allowance.
                values = f" max |err|/(atol+rtol·|ref|) = {check.error:.3g} (> 1 fails);"
            elif check.error is not None and check.budget is not None:
                values = f" error {check.error:.4g} vs budget {check.budget:.4g}"
                if check.utilisation is not None:
                    values += f" (utilisation {check.utilisation:.3g})"
            lines.append(f"    check {check.name}:{values} {check.detail}".rstrip())
        if not bad:
            lines.append(f"    {case.reason}")
        for frame in report.frames.get(case.name, ()):
            lines.append(f"      at {frame}")
        if case.name in report.reproduce:
            lines.append(f"    reproduce: {report.reproduce[case.name]}")
    if len(failed) > _SHOW_FAILED:
        lines.append(f"... and {len(failed) - _SHOW_FAILED} more failed items (a --json FILE "
                     "report has every one)")
    if report.estimate is not None:
        lines.extend(_render_estimate(report.estimate, report.timing))
    elif report.timing is not None:
        lines.append(f"timing: {report.timing.status} {report.timing.reason}")
    lines.append("")
    lines.append(f"status: {report.status.value}")
    # Every rule finding is listed (each needs its own fix); failed cases are often one bug.
    # A rule break printed above (RULE BROKEN) is not printed again.
    above = {f.reason for f in report.findings}
    reasons = [r for r in report.reasons if r not in above]
    if len(reasons) < len(report.reasons):
        lines.append(f"  - the {len(report.reasons) - len(reasons)} rule break(s) above")
    shown = len(reasons) if report.status is Status.RULE_BROKEN else _SHOW_FAILED
    for reason in reasons[:shown]:
        lines.append(f"  - {reason}")
    if len(reasons) > shown:
        lines.append(f"  ... and {len(reasons) - shown} more (a --json FILE report has "
                     "every one)")
    for item_ in report.not_checked:
        lines.append(f"not checked: {item_}")
    for step in report.next_steps:
        lines.append(f"next: {step}")
    lines.append(f"({report.wall_s:.1f} s; exit code {report.exit_code})")
    return "\n".join(lines)


def _rule_broken_items(report: CheckReport) -> set[str]:
    """Names of the gate items in which a run-time rule was broken (phase ``forward:<item>``,
    ``backward:<item>/step0``...)."""
    names = {c.name for c in report.cases}
    broken = set()
    for f in report.findings:
        item = f.phase.split(":", 1)[-1].split("/step")[0]
        if item in names:
            broken.add(item)
    return broken


def _closest(cases: Sequence[CaseResult], top: int = 3) -> list[str]:
    """The checks closest to their budget, the worst of each case, largest first."""
    worst = []
    for case in cases:
        numeric = [ch for ch in case.checks if ch.utilisation is not None]
        if numeric:
            check = max(numeric, key=lambda ch: ch.utilisation)
            worst.append((check.utilisation, case.name, check.name))
    worst.sort(key=lambda w: w[0], reverse=True)
    if not worst:
        return []
    return ["closest to the budget: " + ", ".join(
        f"{name} {check} {util:.3f}" for util, name, check in worst[:top])
        + " (a --json FILE report has every check's)"]  # fmt: skip


def _render_estimate(est: ScoreEstimate, timing: TimingReport | None) -> list[str]:
    lines = [
        "",
        f"timing (profile {est.profile}; plain PyTorch vs yours, the grader's protocol):",
        f"  {'shape':<24} {'plain ms':>9} {'yours ms':>9} {'r':>6} {'r 95% CI':<15} "
        f"{'noise':>6} {'g pub.':>6} {'target':>6} {'est.':>6}",
    ]
    for s in est.shapes:
        ci = "" if s.r_ci is None else f"[{s.r_ci[0]:.3f}, {s.r_ci[1]:.3f}]"
        lines.append(
            f"  {s.label:<24} {_fmt(s.t_plain_ms, '9.3f')} {_fmt(s.t_sub_ms, '9.3f')} "
            f"{_fmt(s.r, '6.3f')} {ci:<15} {_fmt(s.noise, '6.3f')} {_fmt(s.g, '6.2f')} "
            f"{_fmt(s.target, '6.2f')} {_fmt(s.score, '6.3f')}"
        )
    if timing is not None and timing.status != "ok":
        lines.append(f"  timing failed: {timing.status}: {timing.reason}")
    if est.basis is None:
        lines.append(f"  estimated score: none: {est.source}. The grade measures g in the same "
                     "run; r above is yours all the same.")
    else:
        tag = ("MODELLED published g of the scoring reference (predicted from DRAM bytes, not "
               "timed on this GPU)" if est.basis == "modelled"
               else "measured published g of the scoring reference")
        lines.append(
            f"  estimated score: {_fmt(est.score, '.3f')} from {tag}; noise = plain timed "
            "against itself (a ratio this far from 1 is chance). The grade measures g in the "
            "same run."
        )
    ceiling = [s for s in est.shapes if s.ceiling_g is not None]
    if ceiling:
        lines.append(
            "  information only, never in the score: the ceiling (a whole-step kernel's published "
            "g) on each shape, and your r over it: " + "; ".join(
                f"{s.label} g {s.ceiling_g:.2f}, r/g {_fmt(s.vs_ceiling, '.2f')}"
                for s in ceiling))  # fmt: skip
    return lines

