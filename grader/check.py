"""The agent's local check: the grader's own gate on the public cases, then timing and an estimate.

Run from the workspace (the git repository holding ``solution.py``)::

    python -m grader.check            # quick gate (seconds), then timing on a GPU
    python -m grader.check --full     # every case of scoring.yaml, then timing
    python -m grader.check --case c5-l9-d4 --no-time   # one case, no timing

What it runs is the grader's code, not a copy: `grader.workspace.export_submission` exports the
tree, `grader.gate.run_gate` runs the correctness gate in a sandboxed child and checks it against
the fp64 oracle, `grader.timing.run_timing` times it. The differences from a grade, all on
purpose:

- **The working tree**, uncommitted edits included (as a dangling snapshot commit, so the export's
  limits apply); ``--commit REV`` checks a commit instead. ``submit`` sends HEAD only.
- **Public seeds only**: no secret is mixed in, so a failing case can be reproduced exactly with
  ``task.inputs.make_inputs(..., seed=derive_seed(public_seed))`` (the output prints the call).
- **Quick mode** runs the cases marked ``smoke`` (and, on a GPU, one production-width case per
  dtype); ``--full`` runs them all.
- **No reference**: the agent's environment does not have it. The timing child times plain PyTorch
  in the reference's slot (so the protocol is the grader's: three blocks, carry-over-balanced
  orders) and that plain-versus-plain ratio is shown as the noise of the measurement. The score
  is estimated from the reference's *published* speedups g for this GPU class
  (``published_speedups.json``).

Without a CUDA GPU the gate runs on the CPU through the Triton interpreter, and nothing is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader import worktree
from grader.config import Case, ConfigError, ScoringConfig, load_config
from grader.report import CaseResult, ExitCode, RuleFinding, Status, TimingReport
from grader.sandbox import ChildLimits
from grader.static_scan import scan_tree
from grader.workspace import SubmissionError, export_submission

PUBLISHED_PATH = Path(__file__).resolve().parent / "published_speedups.json"
# Where the grader's public part lives (scoring.yaml, PROMPT.md): the directory above the package.
KIT_ROOT = Path(__file__).resolve().parent.parent
# The timing child's reference slot: the frozen block itself, since the reference is not shipped.
PLAIN_AS_REFERENCE = "task.model"
# Failed cases shown in full; the rest are counted (all of them are in --json).
_SHOW_FAILED = 5

# What each run-time rule wants, in words an agent can act on (rule ids from grader.child_rules,
# grader.child_gate and grader.child_timing).
RULE_HINTS = {
    "torch-op-on-path": "the convolution and the normalization must run in your Triton kernels, "
    "not PyTorch ops (aten.convolution, var_mean, a sum or mean over the whole activation...): "
    "call conv_norm(...) from DilatedResidualBlock.forward (solution.py marks the lines)",
    "no-triton-kernel": "no Triton kernel defined in your workspace ran in this phase: forward and "
    "backward of conv + norm must launch your own @triton.jit kernels",
    "no-autograd-function": "x and conv.weight must go straight into your torch.autograd.Function "
    "(ConvNormFunction.apply), whose backward launches your kernels",
    "foreign-triton-kernel": "only Triton kernels defined in your workspace's files may run",
    "constructor-signature": "keep DilatedResidualBlock.__init__(self, channels=128, dilation=1, "
    "expansion=2, eps=1e-5, residual_scale=0.5) exactly",
    "state-dict": "keep exactly the parameters conv.weight (C,1,3), fc1.weight (E·C,C), "
    "fc2.weight (C,E·C)",
    "global-state": "do not change global torch state (TF32/cuDNN flags, default dtype, matmul "
    "precision, RNG, grad mode)",
    "patched-module": "do not replace or add attributes of torch, triton or other modules",
    "new-thread": "do not start threads",
    "new-process": "do not start processes",
    "compiler": "torch.compile / Dynamo / Inductor are not allowed",
    "torchscript": "TorchScript is not allowed",
    "fx": "torch.fx is not allowed",
    "reads-grader": "do not read the grader's or the reference's files",
    "reads-other-process": "do not read other processes",
    "timer-patched": "do not touch timers or synchronization functions",
    "stream-changed": "leave the current CUDA stream as you found it",
    "gpu-memory-hog": "free what you allocate; do not hold GPU memory across steps",
    "clock-mismatch": "the step's work must finish inside the timed window",
}


class Mode(enum.StrEnum):
    """Which cases the gate runs."""

    QUICK = "quick"
    FULL = "full"


@dataclass(frozen=True)
class Published:
    """The reference's published speedups for one timing profile.

    Attributes:
        profile: Profile name in ``scoring.yaml``.
        g: Shape label → g = t_plain / t_ref.
        provisional: True until the numbers are measurements of the frozen reference.
        source: Where the numbers come from.
    """

    profile: str
    g: dict[str, float]
    provisional: bool
    source: str


@dataclass(frozen=True)
class ShapeEstimate:
    """Estimated score of one timed shape.

    Attributes:
        label: Shape label (``dtype:BxL:dD``).
        weight: The shape's weight in the task score.
        t_plain_ms, t_sub_ms: Medians measured here.
        r: t_plain / t_yours (median of per-round ratios), with its 95% interval ``r_ci``.
        noise: Plain PyTorch timed against itself in the reference's slot: how far from 1 a
            ratio lands by chance on this machine.
        g: The reference's published speedup on this shape (None if none is published).
        target: The r that scores 1 (``max(margin·g, min_target)``).
        score: ``clamp(ln r / ln target, 0, cap)``, None without a published g.
    """

    label: str
    weight: float
    t_plain_ms: float | None
    t_sub_ms: float | None
    r: float | None
    r_ci: tuple[float, float] | None
    noise: float | None
    g: float | None
    target: float | None
    score: float | None


@dataclass(frozen=True)
class ScoreEstimate:
    """The task score the timing predicts, from published g.

    Attributes:
        profile: Timing profile.
        score: Weighted mean of the shape estimates (0.0 if timing failed; None if no g).
        provisional: The published g are placeholders, not measurements.
        source: Where the g come from.
        shapes: Per-shape estimates.
    """

    profile: str
    score: float | None
    provisional: bool
    source: str
    shapes: tuple[ShapeEstimate, ...]


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
        reproduce: Failed item name → how to rebuild its inputs, block and truth locally.
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


# ----------------------------------------------------------------------------- published g


def load_published(profile: str, path: Path = PUBLISHED_PATH) -> Published | None:
    """The published g of ``profile``, or None when the file has no entry for it.

    Raises:
        ConfigError: The file exists but is malformed.
    """
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the published speedups: {exc}") from exc
    entry = data.get("profiles", {}).get(profile)
    if entry is None:
        return None
    g = entry.get("g")
    if not isinstance(g, dict) or not all(
        isinstance(v, int | float) and v > 0 for v in g.values()
    ):
        raise ConfigError(f"{path}: profiles.{profile}.g must map shape labels to numbers > 0")
    return Published(
        profile=profile,
        g={str(k): float(v) for k, v in g.items()},
        provisional=entry.get("status") != "measured",
        source=str(entry.get("source", "")),
    )


def estimate(timing: TimingReport, published: Published | None, config: ScoringConfig) -> (
    ScoreEstimate
):
    """Score each timed shape with the measured r and the published g (SPEC §5's formula)."""
    shapes = []
    for s in timing.shapes:
        dtype = s.label.split(":", 1)[0]
        weight = config.score.dtype_weights.get(dtype, 1.0)
        g = published.g.get(s.label) if published else None
        ok = timing.status == "ok" and s.status == "ok" and s.r is not None
        score = None
        if g is not None:
            score = config.score.shape_score(s.r, g) if ok and s.r is not None else 0.0
        shapes.append(ShapeEstimate(
            label=s.label, weight=weight, t_plain_ms=s.t_plain_ms, t_sub_ms=s.t_sub_ms, r=s.r,
            r_ci=s.r_ci, noise=s.g, g=g, target=None if g is None else config.score.target(g),
            score=score,
        ))  # fmt: skip
    scored = [s for s in shapes if s.score is not None]
    total = None
    if scored and len(scored) == len(shapes):
        total = sum(s.weight * s.score for s in scored) / sum(s.weight for s in scored)
    if timing.status != "ok":
        total = 0.0
    return ScoreEstimate(
        profile=timing.profile,
        score=total,
        provisional=published.provisional if published else True,
        source=published.source if published else "no published g for this profile",
        shapes=tuple(shapes),
    )


# ----------------------------------------------------------------------------- gate


def select_cases(
    config: ScoringConfig, mode: Mode, *, gpu: bool, names: Sequence[str] = ()
) -> tuple[tuple[Case, ...], tuple[Case, ...]]:
    """(cases, drift cases) to run.

    Quick: the ``smoke`` cases; on a GPU also the largest case of each dtype, so bf16 and
    production widths are seen. Full: all. ``names`` (case names) narrows either.
    """
    cases = config.correctness.cases
    drift = config.correctness.drift.cases
    if names:
        wanted = set(names)
        known = {c.name for c in (*cases, *drift)}
        unknown = sorted(wanted - known)
        if unknown:
            raise ConfigError(
                f"no case named {unknown} in scoring.yaml; the names are: {sorted(known)}"
            )
        return (
            tuple(c for c in cases if c.name in wanted),
            tuple(c for c in drift if c.name in wanted),
        )
    if mode is Mode.FULL:
        return cases, drift
    quick = [c for c in cases if c.smoke]
    if gpu:
        largest: dict[str, Case] = {}
        for c in cases:
            if c.family == "normal" and (
                c.dtype not in largest or c.numel > largest[c.dtype].numel
            ):
                largest[c.dtype] = c
        quick += [c for c in largest.values() if c not in quick]
    return tuple(quick), tuple(c for c in drift if c.smoke)


def gate_verdict(result: Any) -> tuple[Status, tuple[str, ...]]:
    """Status and reasons of a `grader.gate.GateResult`, decided by the grader's own rule
    (`grader.grade`); a pass is ``checked_untimed`` until timing has run."""
    from grader.grade import _gate_status

    status, reasons = _gate_status(result)
    if status is Status.SCORED:
        return Status.CHECKED_UNTIMED, ()
    return status, tuple(reasons)


def _reproduce(item: Any) -> str:
    c = item.case
    zero = " with fc1/fc2 weights zeroed" if item.kind == "identity" else ""
    return (
        f"inputs{zero}: task.inputs.make_inputs(batch={c.batch}, length={c.length}, "
        f"channels={c.channels}, expansion={c.expansion}, family={c.family!r}, "
        f"dtype={c.dtype!r}, seed=task.inputs.derive_seed({item.public_seed})); block "
        f"DilatedResidualBlock(channels={c.channels}, dilation={c.dilation}, "
        f"expansion={c.expansion}, eps={c.eps!r}, residual_scale={c.residual_scale!r}); truth "
        "task.oracle.oracle_step(...)"
    )


# ----------------------------------------------------------------------------- the check


def _device(gpu: int | None) -> tuple[str, str, dict[str, str]]:
    """(child device, oracle device, extra child environment), as `grader.grade` picks them."""
    import torch

    if torch.cuda.is_available():
        index = 0 if gpu is None else gpu
        return "cuda:0", f"cuda:{index}", {"CUDA_VISIBLE_DEVICES": str(index)}
    # The kernels must be decorated with the interpreter on: set before the child imports them.
    return "cpu", "cpu", {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}


def run_check(
    workspace: str | Path | None = None,
    *,
    mode: Mode = Mode.QUICK,
    commit: str | None = None,
    cases: Sequence[str] = (),
    time_it: bool = True,
    profile: str | None = None,
    gpu: int | None = None,
    config: ScoringConfig | None = None,
    progress: Any = sys.stderr,
    secret: int | None = None,
) -> CheckReport:
    """Check a workspace: export, gate on public seeds, then (on a GPU) timing and an estimate.

    Args:
        workspace: Any directory inside the workspace; default the current directory.
        mode: Quick or full.
        commit: Check this commit instead of the working tree.
        cases: Only these case names.
        time_it: Time after a passed gate (GPU only).
        profile: Timing profile; default the GPU's (``scoring.yaml`` ``timing``).
        gpu: GPU index.
        config: The scoring config; default the grader's ``scoring.yaml``.
        progress: Where progress lines go (None: silent).
        secret: Mix this secret into every public seed, as a grade does (default: none, so
            every failure reproduces from the public seed).

    Raises:
        WorktreeError: Not in a git workspace.
        ConfigError: ``scoring.yaml`` or the case names are wrong.
    """
    from grader.gate import build_items, progress_bar, run_gate

    started = time.monotonic()
    config = config or load_config()
    root = worktree.find_root(workspace)
    where = worktree.state(root)
    device, oracle_device, env_extra = _device(gpu)
    on_gpu = device.startswith("cuda")
    shown_device = device if on_gpu else "cpu (triton interpreter)"
    chosen, drift = select_cases(config, mode, gpu=on_gpu, names=cases)
    base = dict(mode=mode, workspace=str(root), head=where.head, device=shown_device,
                seeds="public" if secret is None else "secret")  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="grader-check-") as tmp:
        try:
            rev = commit or worktree.snapshot_commit(root)
            uncommitted = () if commit else where.changes
            exported = export_submission(root, Path(tmp) / "tree", config.limits, rev=rev)
            source = f"commit {exported.commit[:12]}" if commit else "working tree"
        except (SubmissionError, worktree.WorktreeError) as exc:
            return CheckReport(
                status=Status.INVALID_SUBMISSION, reasons=(str(exc),),
                next_steps=_next_invalid(str(exc)), source=commit or "working tree",
                uncommitted=where.changes, wall_s=time.monotonic() - started, **base,
            )  # fmt: skip
        items = build_items(chosen, drift)
        limits = ChildLimits.from_phase(config.limits.gate)
        if progress is not None:
            print(
                f"gate ({mode.value}): {len(items)} items of {len(chosen) + len(drift)} cases, "
                f"{'public' if secret is None else 'secret'} seeds, on {shown_device}",
                file=progress,
                flush=True,
            )
            if mode is Mode.FULL and not on_gpu and not cases:
                print("note: --full without a GPU runs every case through the Triton "
                      "interpreter: expect tens of minutes (on the GPU: about a minute)",
                      file=progress, flush=True)  # fmt: skip
        # secret None: public seeds only (task.inputs.derive_seed), so failures reproduce.
        result = run_gate(
            exported.root, Path(tmp) / "gate", config, items, secret,  # type: ignore[arg-type]
            device=device, limits=limits, env_extra=env_extra,
            progress=progress_bar(progress) if progress is not None else None,
            oracle_device=oracle_device,
        )  # fmt: skip
        status, reasons = gate_verdict(result)
        utils = [c.max_utilisation for c in result.cases if c.max_utilisation is not None]
        failed = {c.name for c in result.cases if not c.passed}
        gate_part = dict(
            items_total=len(items), cases=result.cases, findings=result.findings,
            max_utilisation=max(utils) if utils else None,
            advisories=scan_tree(exported.root),
            reproduce={i.name: _reproduce(i) for i in items if i.name in failed}
            if secret is None else {},
        )  # fmt: skip
        not_checked = []
        if mode is Mode.QUICK and not cases:
            not_checked.append(
                "the other cases of scoring.yaml: quick mode (run --full before you submit)"
            )
        if secret is None:
            not_checked.append("secret seeds: the check uses the public seeds only")
        timing = est = None
        if status is Status.CHECKED_UNTIMED:
            if not on_gpu:
                not_checked.append("timing: no CUDA GPU here, nothing was timed")
            elif not time_it:
                not_checked.append("timing: --no-time")
            else:
                timing, est = _time(exported.root, config, profile, gpu, progress)
                status, reasons = _timing_verdict(timing, est)
        return CheckReport(
            status=status, reasons=reasons,
            next_steps=_next_steps(status, result, est, on_gpu, where, commit),
            source=source, uncommitted=uncommitted, timing=timing, estimate=est,
            not_checked=tuple(not_checked), wall_s=time.monotonic() - started,
            **base, **gate_part,
        )  # fmt: skip


def _time(
    root: Path, config: ScoringConfig, profile: str | None, gpu: int | None, progress: Any
) -> tuple[TimingReport, ScoreEstimate]:
    from grader.timing import run_timing

    timing = run_timing(
        root, config, profile=profile, gpu=0 if gpu is None else gpu, progress=progress,
        reference_module=PLAIN_AS_REFERENCE,
    )
    return timing, estimate(timing, load_published(timing.profile), config)


def _timing_verdict(
    timing: TimingReport, est: ScoreEstimate
) -> tuple[Status, tuple[str, ...]]:
    if timing.status == "ok":
        return Status.SCORED, ()
    return Status.of_timing(timing.status), (f"timing {timing.status}: {timing.reason}",)


def _next_invalid(reason: str) -> tuple[str, ...]:
    if "no solution.py" in reason:
        return ("put solution.py (defining DilatedResidualBlock) at the workspace root",)
    return ("fix what the reason names, then run python -m grader.check again",)


def _next_steps(
    status: Status,
    result: Any,
    est: ScoreEstimate | None,
    on_gpu: bool,
    where: worktree.WorktreeState,
    commit: str | None,
) -> tuple[str, ...]:
    steps: list[str] = []
    if status is Status.LOAD_FAILED:
        steps.append("fix the error above (python -c 'import solution' in the workspace shows "
                     "the full traceback), then check again")
    elif status is Status.RULE_BROKEN:
        for rule in dict.fromkeys(f.rule for f in result.findings):
            steps.append(f"{rule}: {RULE_HINTS.get(rule, 'see PROMPT.md §2')}")
    elif status is Status.GATE_FAILED:
        first = next(c for c in result.cases if not c.passed)
        steps.append(f"fix {first.name.split('#')[0]} first; rerun just it with "
                     f"python -m grader.check --case {first.name.split('#')[0]} --no-time")
    elif status in (Status.CRASHED, Status.TIMED_OUT, Status.OUT_OF_MEMORY):
        steps.append("run the failing case alone (--case NAME) and read the error above")
    elif status.passed:
        if est is not None and est.score is not None:
            steps.append("faster = higher score: improve the shapes with the lowest r")
        if not on_gpu:
            steps.append("on the GPU the same check also times your block and estimates a score")
        if commit is None and where.dirty:
            steps.append("commit your changes (git add -A && git commit -m '...'); submit "
                         "sends only the committed HEAD")
        steps.append("run python -m grader.check --full before you submit, then "
                     "python -m grader.submit --wait")
    else:
        steps.append("read the reason above; see PROMPT.md §4")
    return tuple(steps)


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
    passed = sum(c.passed for c in report.cases)
    if report.items_total:
        stopped = len(report.cases) < report.items_total
        lines.append(
            f"gate: {passed} of {report.items_total} items passed"
            + (f" ({len(report.cases)} ran before the gate stopped)" if stopped else "")
            + f"; max envelope utilisation {_fmt(report.max_utilisation, '.3f')} "
            "(error / budget; > 1 fails)"
        )
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
            if check.error is not None and check.budget is not None:
                values = f" error {check.error:.4g} vs budget {check.budget:.4g}"
                if check.utilisation is not None:
                    values += f" (utilisation {check.utilisation:.3g})"
            lines.append(f"    check {check.name}:{values} {check.detail}".rstrip())
        if not bad:
            lines.append(f"    {case.reason}")
        if case.name in report.reproduce:
            lines.append(f"    reproduce: {report.reproduce[case.name]}")
    if len(failed) > _SHOW_FAILED:
        lines.append(f"... and {len(failed) - _SHOW_FAILED} more failed items (see --json)")
    if report.estimate is not None:
        lines.extend(_render_estimate(report.estimate, report.timing))
    elif report.timing is not None:
        lines.append(f"timing: {report.timing.status} {report.timing.reason}")
    lines.append("")
    lines.append(f"status: {report.status.value}")
    for reason in report.reasons[:_SHOW_FAILED]:
        lines.append(f"  - {reason}")
    for item_ in report.not_checked:
        lines.append(f"not checked: {item_}")
    for step in report.next_steps:
        lines.append(f"next: {step}")
    lines.append(f"({report.wall_s:.1f} s; exit code {report.exit_code})")
    return "\n".join(lines)


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
    tag = "PROVISIONAL published g (placeholders, not measurements)" if est.provisional else (
        "published g")  # fmt: skip
    lines.append(
        f"  estimated score: {_fmt(est.score, '.3f')} from {tag}; noise = plain timed against "
        "itself (a ratio this far from 1 is chance). The grade measures g in the same run."
    )
    return lines


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m grader.check",
        description="Check your workspace with the grader's own gate (public seeds), then time "
        "it against plain PyTorch and estimate the score. Run it from the workspace.",
    )
    p.add_argument("--full", action="store_true", help="run every case (default: quick)")
    p.add_argument("--case", action="append", default=[], metavar="NAME",
                   help="run only this case of scoring.yaml (repeatable)")
    p.add_argument("--commit", metavar="REV", help="check this commit, not the working tree")
    p.add_argument("--no-time", action="store_true", help="stop after the gate")
    p.add_argument("--profile", help="timing profile (default: the GPU's)")
    p.add_argument("--gpu", type=int, help="GPU index (default 0)")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    p.add_argument("--workspace", metavar="DIR", help="workspace (default: the current directory)")
    p.add_argument("--where", action="store_true",
                   help="print where the statement, scoring.yaml and the store are, and exit")
    return p


def where() -> str:
    """Paths an agent needs: the statement, the scoring contract, published g, the store."""
    from grader.config import DEFAULT_PATH
    from grader.store import default_store_path

    prompt = next((p for p in (KIT_ROOT / "PROMPT.md", KIT_ROOT / "task" / "PROMPT.md")
                   if p.is_file()), None)
    return "\n".join([
        f"statement (PROMPT.md):  {prompt or 'not found under ' + str(KIT_ROOT)}",
        f"scoring contract:       {DEFAULT_PATH}",
        f"frozen block:           {KIT_ROOT / 'task' / 'model.py'}",
        f"published speedups:     {PUBLISHED_PATH}",
        f"submission store:       {default_store_path()}",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.where:
        print(where())
        return 0
    try:
        config = load_config()
        report = run_check(
            args.workspace,
            mode=Mode.FULL if args.full else Mode.QUICK,
            commit=args.commit,
            cases=args.case,
            time_it=not args.no_time,
            profile=args.profile,
            gpu=args.gpu,
            config=config,
        )
    except (worktree.WorktreeError, ConfigError) as exc:
        print(f"check: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    print(render(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        print(f"report written to {os.path.abspath(args.json)}")
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
