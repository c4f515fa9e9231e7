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
  ``task.inputs.make_inputs(..., seed=derive_seed(public_seed))``: ``--repro NAME`` writes a script
  that does it and compares the block with the fp64 oracle, outside the sandbox.
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
# grader.census, grader.child_gate, grader.interleave and grader.child.submission).
RULE_HINTS = {
    "torch-op-on-path": "the convolution and the normalization must run in your Triton kernels, "
    "not PyTorch ops (aten.convolution, var_mean, a sum or mean over the whole activation, a "
    "reduction done as a matrix product, arithmetic on the activation inside your "
    "autograd.Function...): call conv_norm(...) from DilatedResidualBlock.forward (solution.py "
    "marks the lines)",
    "channel-tampering": "leave the grader's result channel alone: every message is authenticated "
    "and numbered, and one the grader did not expect (written to its file descriptor, repeated, "
    "answering another step) ends the run",
    "census-tampered": "leave the profiler alone: the grader records every op of every step, and "
    "a step it cannot see (profiler stopped or restarted, record_function switched off) breaks "
    "the rule",
    "host-copy": "keep the activation on the GPU: the conv and the norm run in your kernels, not "
    "on the host",
    "no-triton-kernel": "no Triton kernel defined in your workspace ran in this phase: forward and "
    "backward of conv + norm must launch your own @triton.jit kernels",
    "no-autograd-function": "x and conv.weight must go straight into your torch.autograd.Function "
    "(ConvNormFunction.apply), whose backward launches your kernels",
    "foreign-triton-kernel": "only Triton kernels defined in your workspace's files may run",
    "forbidden-import": "import only your own files, the standard library, torch, triton and "
    "numpy: asking for any other module (import, __import__, importlib, find_spec) breaks the "
    "rule even when the import fails or the error is caught",
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

# What a failing case of each input family (task/inputs.py, PROMPT.md §3) usually means.
FAMILY_HINTS = {
    "offset": "offset cases (x ≈ 1000 + N(0,1): every channel's conv output sits near 1000) fail "
    "when the variance is E[y²]−E[y]² in fp32: use a numerically stable variance, e.g. subtract "
    "a shift (one sample of the example) before summing, or merge per-tile (count, mean, M2) "
    "with Welford/Chan",
    "tiny": "tiny cases (x ~ N(0,1e-3²): the variance is below eps) fail when eps is missing or "
    "misplaced: eps must be added to the variance before the rsqrt, rstd = 1/sqrt(var + eps)",
    "scale": "scale cases (x ~ N(0,100²)) fail on large magnitudes: squares and sums overflow "
    "fp16, so accumulate the statistics in fp32 (the plain block normalizes in fp32 for "
    "bf16/fp16)",
    "ramp": "ramp cases (from a row partway through, x's scale and offset grow to ×10 and ±50 at "
    "the last row) fail when the statistics assume tiles alike: merge per-tile (count, mean, M2) "
    "with Chan's combine, keeping its n_a·n_b/n·δ² term and a partial last tile's true count; do "
    "not normalize per tile or estimate from some of the rows",
    "burst": "burst cases (a window of L/6 to L/3 rows at ±100 + N(0,30²) among N(0,1) rows) fail "
    "when the statistics come from some rows or tiles only, or are applied per tile: reduce over "
    "every row of the example, in fp32",
    "outlier": "outlier cases (one example of the batch at ×50, its upstream gradient too) fail "
    "when the statistics are pooled across the batch or read from another example: the mean, "
    "the variance and the backward's two sums are per example",
}
NON_FINITE_HINT = ("values that are not finite: an example whose variance is 0 (length·channels "
                   "= 1, as in c1-l1) needs eps in rsqrt(var + eps); also look for a division by "
                   "zero, a masked load without other=0.0, or fp16 overflow")  # fmt: skip


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
    from grader.grade import gate_status

    status, reasons = gate_status(result)
    if status is Status.SCORED:
        return Status.CHECKED_UNTIMED, ()
    return status, tuple(reasons)


def _reproduce(item: Any) -> str:
    return f"python -m grader.check --repro '{item.name}' writes a script that runs just this item"


def find_item(config: ScoringConfig, name: str) -> Any:
    """The gate item called ``name``: ``case#seed`` or ``case#seed/identity`` as a FAILED line
    names it, or a case name of ``scoring.yaml`` for its first public seed.

    Raises:
        ConfigError: No such case or seed.
    """
    from grader.gate import GateItem

    base, _, tail = name.partition("/")
    case_name, _, seed = base.partition("#")
    drift = config.correctness.drift.cases
    case = next((c for c in (*config.correctness.cases, *drift) if c.name == case_name), None)
    seeds = () if case is None else case.seeds
    if case is None or (seed and not (seed.isdigit() and int(seed) in seeds)) or tail not in (
            "", "identity"):  # fmt: skip
        raise ConfigError(f"no gate item named {name!r}: give a FAILED line's name (like "
                          "c1-l1#1101 or c1-l1#1101/identity) or a case name of scoring.yaml")
    kind = "identity" if tail else "drift" if case in drift else "case"
    public = int(seed) if seed else seeds[0]
    return GateItem(0, f"{case.name}#{public}{'/identity' if tail else ''}", kind, case, public)


_REPRO = '''"""Gate item {name}, rebuilt from its public seed: your block on its inputs, compared
with the fp64 oracle by the gate's own checks.

Written by python -m grader.check --repro '{name}'. It runs your solution.py in this
process (no sandbox, no rule checks), so the whole traceback, your prints and a debugger
(python -m pdb) work. Run it from the workspace: python {script}
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the workspace: solution.py
sys.path.append({kit!r})  # the task kit (task/, grader/), if not on PYTHONPATH
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    # No GPU: Triton kernels run in its interpreter, which must be on before triton is imported.
    os.environ["TRITON_INTERPRET"] = "1"

from grader.config import load_config  # noqa: E402
from grader.gate import exact_check, forward_check, rel_l2_check  # noqa: E402
from solution import DilatedResidualBlock  # noqa: E402
from task.inputs import derive_seed, make_inputs  # noqa: E402
from task.oracle import oracle_sgd, oracle_step  # noqa: E402

inputs = make_inputs({inputs},
                     seed=derive_seed({seed}), device=DEVICE)
state = inputs.state_dict()  # conv.weight, fc1.weight, fc2.weight
{zero}block = DilatedResidualBlock({block})
block = block.to(device=DEVICE, dtype=inputs.x.dtype)
block.load_state_dict(state)
params = dict(block.named_parameters())
x = inputs.x.clone().requires_grad_(True)
budget = load_config().budget({dtype!r})
{body}
for check in checks:
    util = "exact" if check.utilisation is None else f"utilisation {{check.utilisation:.3g}}"
    line = f"{{'ok  ' if check.passed else 'FAIL'}} {{check.name}}: {{util}} {{check.detail}}"
    print(line.rstrip())
# Exit 1 when a check failed, so a script or a shell loop can tell.
sys.exit(0 if all(check.passed for check in checks) else 1)
'''

_REPRO_STEP = '''out = block(x)
out.backward(inputs.grad_out)
grads = {{"grad_x": x.grad, **{{f"grad_{{k.split('.')[0]}}": p.grad for k, p in params.items()}}}}
'''

_REPRO_CASE = _REPRO_STEP + '''weights = (w.cpu() for w in state.values())
ref = oracle_step(inputs.x.cpu(), *weights, inputs.grad_out.cpu(), {kwargs})
checks = [forward_check(out.detach().cpu(), ref.out, budget)]
checks += [rel_l2_check(k, g.detach().cpu(), getattr(ref, k), budget.grad_rel)
           for k, g in grads.items()]'''

_REPRO_IDENTITY = _REPRO_STEP + '''# With fc1 and fc2 zero the block is the identity, bit for bit.
checks = [exact_check("identity_out", out.detach().cpu(), inputs.x.cpu()),
          exact_check("identity_grad_x", grads.pop("grad_x").cpu(), inputs.grad_out.cpu())]
checks += [exact_check(f"identity_{{k}}", g.cpu(), torch.zeros_like(g.cpu()))
           for k, g in grads.items()]'''

_REPRO_DRIFT = '''# SGD in place, each update rounded once from fp64, as the gate does.
for step in range({steps}):
    block(x).backward(inputs.grad_out)
    with torch.no_grad():
        for p in params.values():
            p.copy_((p.double() - {lr!r} * p.grad.double()).to(p.dtype))
            p.grad = None
    x.grad = None
ref = oracle_sgd(inputs.x.cpu(), {{k: v.cpu() for k, v in state.items()}}, inputs.grad_out.cpu(),
                 steps={steps}, lr={lr!r}, {kwargs})
checks = [rel_l2_check(f"drift_{{k}}", params[k].detach().cpu().double() - w.cpu().double(),
                       ref[k].cpu() - w.cpu().double(), budget.drift_rel)
          for k, w in state.items()]'''


def write_repro(config: ScoringConfig, name: str, root: Path) -> Path:
    """Write ``scratch/repro_<item>.py`` in the workspace ``root``: a script that rebuilds gate
    item ``name`` from its public seed, runs the block on it and checks it as the gate does."""
    item = find_item(config, name)
    c = item.case
    kwargs = f"dilation={c.dilation}, eps={c.eps!r}, residual_scale={c.residual_scale!r}"
    body = {"case": _REPRO_CASE, "identity": _REPRO_IDENTITY, "drift": _REPRO_DRIFT}[item.kind]
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in item.name)
    path = root / "scratch" / f"repro_{safe}.py"
    zero = ('state = {**state, "fc1.weight": state["fc1.weight"] * 0, '
            '"fc2.weight": state["fc2.weight"] * 0}\n') if item.kind == "identity" else ""
    text = _REPRO.format(
        name=item.name, script=path.relative_to(root), kit=str(KIT_ROOT), seed=item.public_seed,
        inputs=f"batch={c.batch}, length={c.length}, channels={c.channels}, "
        f"expansion={c.expansion}, family={c.family!r}, dtype={c.dtype!r}",
        block=f"channels={c.channels}, expansion={c.expansion}, {kwargs}", dtype=c.dtype,
        zero=zero, body=body.format(kwargs=kwargs, steps=config.correctness.drift.steps,
                                    lr=config.correctness.drift.lr),
    )  # fmt: skip
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


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
    narrowed: bool = False,
) -> tuple[str, ...]:
    """What to do now; ``narrowed``: the check ran only the cases named with ``--case``."""
    steps: list[str] = []
    first = next((c for c in result.cases if not c.passed), None)
    case = first.name.split("#")[0] if first is not None else "NAME"
    if status is Status.LOAD_FAILED:
        steps.append("fix the error above (python -c 'import solution' in the workspace shows "
                     "the full traceback), then check again")
    elif status is Status.RULE_BROKEN:
        for rule in dict.fromkeys(f.rule for f in result.findings):
            steps.append(f"{rule}: {RULE_HINTS.get(rule, 'see PROMPT.md §2')}")
    elif status is Status.GATE_FAILED:
        steps.append(f"fix {case} first; rerun just it with "
                     f"python -m grader.check --case {case} --no-time")
        steps.extend(_hints(result))
    elif status in (Status.CRASHED, Status.TIMED_OUT, Status.OUT_OF_MEMORY):
        what = {Status.CRASHED: "where it raised (the frames in your files, deepest last)",
                Status.TIMED_OUT: "which item ran past the gate's time limit (a loop that never "
                "ends, or a huge grid through the interpreter)",
                Status.OUT_OF_MEMORY: "which item ran out of memory"}[status]
        steps.append(f"read above {what}" if narrowed else
                     f"read above {what}; rerun just the first failing case with "
                     f"python -m grader.check --case {case} --no-time")
        if any("InterpreterError" in c.reason for c in result.cases):
            steps.append("an InterpreterError comes from the Triton interpreter (CPU), which runs "
                         "kernels as Python; README.md lists its pitfalls (e.g. a range() loop "
                         "variable is a plain int there, so .to() fails on it)")
        if first is not None:
            steps.append(f"to debug it outside the sandbox (whole traceback, prints, pdb): "
                         f"python -m grader.check --repro '{first.name}', then run the script "
                         "it writes")
    elif status.passed:
        if est is not None and est.score is not None:
            steps.append("faster = higher score: improve the shapes with the lowest r")
        if not on_gpu:
            steps.append("on the GPU the same check also times your block and estimates a score")
        if commit is None and where.dirty:
            steps.append("commit your changes (git add -A && git commit -m '...'); submit "
                         "sends only the committed HEAD")
        steps.append("run python -m grader.check --full before you submit, then "
                     "python -m grader.submit --wait" if on_gpu else
                     "python -m grader.submit --wait (--full is slow here: it runs every case "
                     "through the Triton interpreter, tens of minutes; the GPU grade runs every "
                     "case anyway)")
    else:
        steps.append("read the reason above; see PROMPT.md §4")
    return tuple(steps)


def _hints(result: Any) -> list[str]:
    """One hint per input family with a failing case, and one for values that are not finite."""
    failed = {c.name for c in result.cases if not c.passed}
    families = dict.fromkeys(i.case.family for i in result.items if i.name in failed)
    hints = [FAMILY_HINTS[f] for f in families if f in FAMILY_HINTS]
    if any("not finite" in ch.detail for c in result.cases if not c.passed for ch in c.checks):
        hints.append(NON_FINITE_HINT)
    return hints


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
    shown = len(report.reasons) if report.status is Status.RULE_BROKEN else _SHOW_FAILED
    for reason in report.reasons[:shown]:
        lines.append(f"  - {reason}")
    if len(report.reasons) > shown:
        lines.append(f"  ... and {len(report.reasons) - shown} more (a --json FILE report has "
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
    p.add_argument("--repro", metavar="NAME",
                   help="write scratch/repro_NAME.py: a script that runs your block on gate item "
                   "NAME (as a FAILED line names it) and checks it, outside the sandbox; and exit")
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
    if args.repro:
        try:
            root = worktree.find_root(args.workspace)
            path = write_repro(load_config(), args.repro, root)
        except (worktree.WorktreeError, ConfigError) as exc:
            print(f"check: {exc}", file=sys.stderr)
            return int(ExitCode.USAGE)
        print(f"wrote {path}\nrun it from the workspace: python {path.relative_to(root)}  "
              "(your block on that item's public-seed inputs, checked as the gate does; "
              "no sandbox, no rule checks)")
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
