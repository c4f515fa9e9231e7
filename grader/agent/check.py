"""The agent's local check: the grader's own gate on the public cases, then timing and an estimate.

Run from the workspace (the git repository holding ``solution.py``)::

    python -m grader check            # quick gate (seconds), then timing on a GPU
    python -m grader check --full     # every case of scoring.yaml, then timing
    python -m grader check --case c5-l9-d4 --no-time   # one case, no timing

What it runs is the grader's code, not a copy: `grader.workspace.export_submission` exports the
tree, `grader.gate_run.run_gate` runs the correctness gate in a sandboxed child and checks it
against the fp64 oracle, `grader.gate.gate_status` gives its verdict,
`grader.timing_run.run_timing` times it. The differences from a grade, all on purpose:

- **The working tree**, uncommitted edits included (as a dangling snapshot commit, so the export's
  limits apply); ``--commit REV`` checks a commit instead. ``submit`` sends HEAD only.
- **Public seeds only**: no secret is mixed in, so a failing case can be reproduced exactly with
  ``task.inputs.make_inputs(..., seed=derive_seed(public_seed))``: ``--repro NAME`` writes a script
  that does it and compares the block with the fp64 oracle, outside the sandbox.
- **Quick mode** runs the cases marked ``smoke`` (and, on a GPU, one production-width case per
  dtype); ``--full`` runs them all.
- **No reference**: the agent's environment does not have it. The timing child times plain PyTorch
  in the reference's slot (so the protocol is the grader's: three blocks, carry-over-balanced
  orders) and that plain-versus-plain ratio is shown as the noise of the measurement. The score
  is estimated from the scoring reference's *published* speedups g for this GPU class
  (``published_speedups.json``; measured or modelled, the report says which); where none are
  published it says so and estimates no score. The ceiling's g (the whole-step block) are shown
  beside it as information, never in the score.

Without a CUDA GPU the gate runs on the CPU through the Triton interpreter, and nothing is timed.

Its parts: the report and its text (`grader.agent.check_report`), the estimate from published g
(`grader.agent.estimate`), what to do next (`grader.agent.hints`), ``--repro``
(`grader.agent.repro`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grader.agent import worktree
from grader.agent.check_report import CheckReport, Mode, render
from grader.agent.estimate import PUBLISHED_PATH, ScoreEstimate, estimate, published_entry
from grader.agent.hints import _next_invalid, _next_steps
from grader.agent.repro import KIT_ROOT, _reproduce, write_repro
from grader.config import Case, ConfigError, ScoringConfig, load_config
from grader.report import ExitCode, Status, TimingReport
from grader.sandbox import ChildLimits
from grader.static_scan import scan_tree
from grader.workspace import SubmissionError, export_submission

# The timing child's reference slot: the frozen block itself, since the reference is not shipped.
PLAIN_AS_REFERENCE = "task.model"


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
    """Status and reasons of a `grader.gate.GateResult`, decided by the gate's own rule
    (`grader.gate.gate_status`, as a grade decides it); a pass is ``checked_untimed`` until
    timing has run."""
    from grader.gate import gate_status

    status, reasons = gate_status(result)
    if status is Status.SCORED:
        return Status.CHECKED_UNTIMED, ()
    return status, tuple(reasons)


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
    from grader.gate import build_items
    from grader.gate_children import gate_processes
    from grader.gate_run import progress_bar, run_gate

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
            n_cases = len(chosen) + len(drift)
            # --case picks the cases itself; the mode then only says what a bare run would do.
            what = "chosen cases" if cases else mode.value
            print(
                f"gate ({what}): {len(items)} item{'s' * (len(items) != 1)} of {n_cases} "
                f"case{'s' * (n_cases != 1)}, {'public' if secret is None else 'secret'} seeds, "
                f"on {shown_device}",
                file=progress,
                flush=True,
            )
            if mode is Mode.FULL and not on_gpu and not cases:
                print("note: --full without a GPU runs every case through the Triton "
                      "interpreter: expect tens of minutes (on the GPU: about a minute)",
                      file=progress, flush=True)  # fmt: skip
        # secret None: public seeds only (task.inputs.derive_seed), so failures reproduce.
        bar = progress_bar(progress) if progress is not None else None
        try:
            result = run_gate(
                exported.root, Path(tmp) / "gate", config, items, secret,  # type: ignore[arg-type]
                device=device, limits=limits, env_extra=env_extra, progress=bar,
                oracle_device=oracle_device, processes=gate_processes(config.limits.gate_processes),
            )  # fmt: skip
        finally:
            if bar is not None:
                bar.end()  # what is printed next starts on a line of its own
        status, reasons = gate_verdict(result)
        utils = [c.max_utilisation for c in result.cases if c.max_utilisation is not None]
        failed = {c.name for c in result.cases if not c.passed}
        gate_part = dict(
            items_total=len(items), cases=result.cases, findings=result.findings,
            max_utilisation=max(utils) if utils else None,
            advisories=scan_tree(exported.root), frames=result.frames,
            reproduce={i.name: _reproduce(i) for i in items if i.name in failed}
            if secret is None else {},
        )  # fmt: skip
        not_checked = []
        if mode is Mode.QUICK and not cases:
            not_checked.append(
                "the other cases of scoring.yaml: quick mode (run --full before you submit)"
                if on_gpu else "the other cases of scoring.yaml: quick mode (--full runs them, "
                "slowly through the interpreter here; the GPU grade runs them all)"
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
            next_steps=_next_steps(status, result, est, on_gpu, where, commit, bool(cases)),
            source=source, uncommitted=uncommitted, timing=timing, estimate=est,
            not_checked=tuple(not_checked), wall_s=time.monotonic() - started,
            **base, **gate_part,
        )  # fmt: skip


def _time(
    root: Path, config: ScoringConfig, profile: str | None, gpu: int | None, progress: Any
) -> tuple[TimingReport, ScoreEstimate]:
    from grader.timing_run import run_timing

    timing = run_timing(
        root, config, profile=profile, gpu=0 if gpu is None else gpu, progress=progress,
        reference_module=PLAIN_AS_REFERENCE,
    )
    published, why = published_entry(timing.profile, "reference")
    ceiling, _ = published_entry(timing.profile, "ceiling")
    return timing, estimate(timing, published, config, ceiling=ceiling, why_none=why)


def _timing_verdict(
    timing: TimingReport, est: ScoreEstimate
) -> tuple[Status, tuple[str, ...]]:
    if timing.status == "ok":
        return Status.SCORED, ()
    return Status.of_timing(timing.status), (f"timing {timing.status}: {timing.reason}",)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m grader check",
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
    p.add_argument("--repro", metavar="NAME",
                   help="write scratch/repro_NAME.py: a script that runs your block on gate item "
                   "NAME (as a FAILED line names it) and checks it, outside the sandbox; and exit")
    p.add_argument("--where", action="store_true",
                   help="print where the statement, scoring.yaml and the store are, and exit")
    return p


def where() -> str:
    """Paths an agent needs: the statement, the scoring contract, published g, the store."""
    from grader.config import DEFAULT_PATH
    from grader.service.client import default_store_path

    prompt = next((p for p in (KIT_ROOT / "PROMPT.md", KIT_ROOT / "task" / "PROMPT.md")
                   if p.is_file()), None)
    return "\n".join([
        f"statement (PROMPT.md):  {prompt or 'not found under ' + str(KIT_ROOT)}",
        f"scoring contract:       {DEFAULT_PATH}",
        f"frozen block:           {KIT_ROOT / 'task' / 'model.py'}",
        f"published speedups:     {PUBLISHED_PATH}",
        f"submission store:       {default_store_path()}",
    ])


def _error_code(exc: Exception) -> int:
    """Not a repository is an invalid submission (10, as the workspace's README says); any
    other failure before the check runs is a usage error (2)."""
    if isinstance(exc, worktree.NotARepository):
        return int(ExitCode.INVALID_SUBMISSION)
    return int(ExitCode.USAGE)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.where:
        print(where())
        return 0
    if args.repro:
        try:
            root = worktree.find_root(args.workspace)
            path = write_repro(load_config(), args.repro, root)
        except (worktree.WorktreeError, ConfigError) as exc:
            print(f"check: {exc}", file=sys.stderr)
            return _error_code(exc)
        print(f"wrote {path}\nrun it from the workspace: python {path.relative_to(root)}  "
              "(your block on that item's public-seed inputs, checked as the gate does; "
              "no sandbox, no rule checks)")
        return 0
    try:
        config = load_config()
        if args.profile is not None and args.profile not in config.timing.profiles:
            print(f"check: --profile {args.profile!r} is not a profile of scoring.yaml (known: "
                  f"{', '.join(sorted(config.timing.profiles))})", file=sys.stderr)
            return int(ExitCode.USAGE)
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
        return _error_code(exc)
    print(render(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        print(f"report written to {os.path.abspath(args.json)}")
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
