"""The correctness gate of SPEC §3, trusted side: inputs, ground truth, budgets, verdicts.

This module holds the secret seed, draws every item's inputs from it, computes the fp64 truth and
compares. It never imports submission code: one child (``grader/child/gate.py``) runs every item,
one at a time, told over its stdin; each item's inputs are written into the child's directory
just before its ``go`` and its outputs come back as bytes in the item's ``item_done`` frame, read
before the next item starts (so no submission code runs between the outputs and the parent).
A message the protocol does not expect now (an item that was not sent, a repeat) ends the child
as tampered.

Items: every case of `scoring.yaml` once per public seed; the zero-weight identity on one case per
dtype (the largest of that dtype), which must hold bit for bit; the training-drift cases.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grader import census
from grader.config import Budget, Case, DeadlineRule, ScoringConfig
from grader.deadlines import plain_step_seconds
from grader.report import CaseResult, CheckResult, RuleFinding, Severity
from grader.sandbox import (
    ARM_EVENT,
    ChildLimits,
    ChildResult,
    Deadline,
    Outcome,
    ProtocolError,
    run_child,
)
from task.inputs import DTYPES, BlockInputs, derive_seed, make_inputs
from task.oracle import oracle_sgd, oracle_step

REPO_ROOT = Path(__file__).resolve().parent.parent
CHILD_SCRIPT = Path(__file__).resolve().parent / "child" / "gate.py"
FORBIDDEN_DIRS = (REPO_ROOT / "grader", REPO_ROOT / "reference")
PARAM_KEYS = ("conv.weight", "fc1.weight", "fc2.weight")
GRAD_KEYS = ("grad_x", "grad_conv", "grad_fc1", "grad_fc2")
# A gradient whose reference is (near) zero has no relative scale; below this RMS per element the
# norm of the reference is replaced by it, so exact-zero truths still allow rounding noise.
_GRAD_NORM_FLOOR = 1e-6
_MAX_OUTPUT_BYTES = 2 << 30


@dataclass(frozen=True)
class GateItem:
    """One unit of work for the gate child.

    Attributes:
        index: Position in the job.
        name: ``<case>#<public seed>``, with ``/identity`` for the zero-weight check.
        kind: ``case``, ``identity`` or ``drift``.
        case: The case from `scoring.yaml`.
        public_seed: The case's public seed used.
    """

    index: int
    name: str
    kind: str
    case: Case
    public_seed: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.case.batch, self.case.length, self.case.channels)


@dataclass(frozen=True)
class GateResult:
    """What the gate found.

    Attributes:
        items: The items, in the order run.
        cases: One result per item (a missing output is a failed result with its reason).
        findings: Run-time rule findings the child reported.
        child: How the child ended.
        load_error: Traceback text when importing or constructing failed before any item.
        frames: Item name → where the submission raised in that item: the last frames of the
            traceback inside the submission's files (``file:line in function: source``).
    """

    items: tuple[GateItem, ...]
    cases: tuple[CaseResult, ...]
    findings: tuple[RuleFinding, ...]
    child: ChildResult
    load_error: str = ""
    frames: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases) and not self.findings


def build_items(
    cases: Sequence[Case], drift_cases: Sequence[Case], *, identity: bool = True
) -> tuple[GateItem, ...]:
    """Expand cases into items: one per public seed, identity checks, then drift cases."""
    items: list[GateItem] = []

    def add(name: str, kind: str, case: Case, seed: int) -> None:
        items.append(GateItem(len(items), name, kind, case, seed))

    for case in cases:
        for seed in case.seeds:
            add(f"{case.name}#{seed}", "case", case, seed)
    if identity:
        largest: dict[str, Case] = {}
        for case in cases:
            if case.dtype not in largest or case.numel > largest[case.dtype].numel:
                largest[case.dtype] = case
        for case in largest.values():
            add(f"{case.name}#{case.seeds[0]}/identity", "identity", case, case.seeds[0])
    for case in drift_cases:
        for seed in case.seeds:
            add(f"{case.name}#{seed}", "drift", case, seed)
    return tuple(items)


def item_inputs(item: GateItem, secret: int) -> BlockInputs:
    """The item's inputs, drawn from its public seed mixed with the secret (CPU tensors)."""
    c = item.case
    inputs = make_inputs(
        batch=c.batch,
        length=c.length,
        channels=c.channels,
        expansion=c.expansion,
        family=c.family,
        dtype=c.dtype,
        seed=derive_seed(item.public_seed, secret),
    )
    if item.kind == "identity":
        inputs = BlockInputs(
            x=inputs.x,
            conv_weight=inputs.conv_weight,
            fc1_weight=torch.zeros_like(inputs.fc1_weight),
            fc2_weight=torch.zeros_like(inputs.fc2_weight),
            grad_out=inputs.grad_out,
        )
    return inputs


def _job_item(item: GateItem, config: ScoringConfig) -> dict[str, Any]:
    c = item.case
    entry: dict[str, Any] = {
        "name": item.name,
        "kind": item.kind,
        "dtype": c.dtype,
        "block": c.block_args,
    }
    if item.kind == "drift":
        entry.update(steps=config.correctness.drift.steps, lr=config.correctness.drift.lr)
    return entry


# ----------------------------------------------------------------------------- checks


def forward_check(out: torch.Tensor, ref: torch.Tensor, budget: Budget) -> CheckResult:
    """Elementwise ``|out − ref| ≤ atol + rtol·|ref|``; error is the worst ratio (budget 1)."""
    out64 = out.to(torch.float64)
    if not torch.isfinite(out64).all():
        bad = int((~torch.isfinite(out64)).sum())
        return CheckResult("forward", False, math.inf, 1.0, math.inf,
                           f"{bad} of {out64.numel()} output values are not finite")  # fmt: skip
    diff = (out64 - ref).abs()
    allowed = budget.forward_atol + budget.forward_rtol * ref.abs()
    ratio = diff / allowed
    worst = float(ratio.max()) if ratio.numel() else 0.0
    passed = worst <= 1.0
    detail = ""
    if not passed:
        i = int(ratio.argmax())
        idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), ratio.shape))
        detail = (
            f"output off by {float(diff.flatten()[i]):.3g} at {idx} (got "
            f"{float(out64.flatten()[i]):.6g}, expected {float(ref.flatten()[i]):.6g}; allowed "
            f"{float(allowed.flatten()[i]):.3g}); {int((ratio > 1).sum())} values over budget"
        )
    return CheckResult("forward", passed, worst, 1.0, worst, detail)


def rel_l2_check(name: str, got: torch.Tensor, ref: torch.Tensor, budget: float) -> CheckResult:
    """``‖got − ref‖₂ / ‖ref‖₂ ≤ budget`` (the norm floored, see ``_GRAD_NORM_FLOOR``)."""
    got64 = got.to(torch.float64)
    if not torch.isfinite(got64).all():
        bad = int((~torch.isfinite(got64)).sum())
        return CheckResult(name, False, math.inf, budget, math.inf,
                           f"{bad} of {got64.numel()} values are not finite")  # fmt: skip
    ref_norm = float(ref.norm())
    floor = _GRAD_NORM_FLOOR * math.sqrt(max(ref.numel(), 1))
    error = float((got64 - ref).norm()) / max(ref_norm, floor)
    passed = error <= budget
    detail = "" if passed else f"relative L2 error {error:.3g} > budget {budget:.3g}"
    return CheckResult(name, passed, error, budget, error / budget, detail)


def forward_utilisation(out: torch.Tensor, ref: torch.Tensor, budget: Budget) -> float:
    """`forward_check`'s utilisation alone (inf when a value is not finite)."""
    return float(forward_check(out.detach(), ref, budget).utilisation)


def grad_utilisation(got: torch.Tensor | None, ref: torch.Tensor, budget: Budget) -> float:
    """`rel_l2_check`'s utilisation against ``budget.grad_rel`` (inf when missing)."""
    if got is None:
        return math.inf
    return float(rel_l2_check("grad", got.detach(), ref, budget.grad_rel).utilisation)


def step_utilisation(block: torch.nn.Module, x: torch.Tensor, out: torch.Tensor, ref: Any,
                     budget: Budget) -> dict[str, float]:
    """Utilisation of one training step's output and four gradients against the oracle's
    `task.oracle.oracle_step` result ``ref``: ``forward`` then `GRAD_KEYS` (x's and the
    weights' ``.grad``; inf where one is missing)."""
    grads = {"grad_x": x.grad}
    grads.update({key: getattr(block, key.removeprefix("grad_")).weight.grad
                  for key in GRAD_KEYS[1:]})
    return {"forward": forward_utilisation(out, ref.out, budget),
            **{key: grad_utilisation(got, getattr(ref, key), budget) for key, got in grads.items()}}


def exact_check(name: str, got: torch.Tensor, expected: torch.Tensor) -> CheckResult:
    """Bit-for-bit equality (same dtype and shape, equal values; -0.0 equals 0.0)."""
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return CheckResult(name, False, detail=(
            f"got {got.dtype} {tuple(got.shape)}, expected {expected.dtype} "
            f"{tuple(expected.shape)}"))  # fmt: skip
    differ = got != expected
    if got.dtype.is_floating_point:
        differ = differ & ~(torch.isnan(got) & torch.isnan(expected))
    count = int(differ.sum())
    if count == 0:
        return CheckResult(name, True)
    i = int(differ.flatten().nonzero()[0])
    return CheckResult(name, False, detail=(
        f"{count} of {got.numel()} values differ; first at flat index {i}: got "
        f"{float(got.flatten()[i])!r}, expected {float(expected.flatten()[i])!r}"))  # fmt: skip


def _meta_checks(meta: dict[str, Any], item: GateItem, device: str) -> list[CheckResult]:
    checks = []
    if not meta.get("is_tensor", False):
        return [CheckResult("type", False, detail=(
            f"forward returned {meta.get('type')}, not exactly torch.Tensor"))]  # fmt: skip
    checks.append(CheckResult("type", True))
    want_shape = list(item.shape)
    checks.append(CheckResult("shape", meta["shape"] == want_shape,
                              detail="" if meta["shape"] == want_shape else
                              f"output shape {meta['shape']}, input {want_shape}"))  # fmt: skip
    ok = meta["dtype"] == item.case.dtype
    checks.append(CheckResult("dtype", ok, detail="" if ok else
                              f"output dtype {meta['dtype']}, input {item.case.dtype}"))
    ok = meta["device"] == device
    checks.append(CheckResult("device", ok, detail="" if ok else
                              f"output on {meta['device']}, input on {device}"))
    if "grads_missing" in meta:
        missing = meta["grads_missing"]
        checks.append(CheckResult("gradients_present", not missing, detail="" if not missing else
                                  f"no gradient for {', '.join(missing)}"))  # fmt: skip
        wrong = {k: v for k, v in meta.get("grad_types", {}).items()
                 if v not in ("Tensor", "NoneType")}  # fmt: skip
        if wrong:
            checks.append(CheckResult("gradient_types", False,
                                      detail=f"gradients that are not torch.Tensor: {wrong}"))
    return checks


def _unchanged_checks(data: dict[str, Any], inputs: BlockInputs, kind: str) -> list[CheckResult]:
    checks = [_renamed(exact_check("input_unchanged", data["x_after"], inputs.x),
                       "the input x was modified")]  # fmt: skip
    if kind != "drift":
        after = data.get("params_after", {})
        for key, before in inputs.state_dict().items():
            got = after.get(key)
            if got is None:
                checks.append(CheckResult(f"{key}_unchanged", False, detail=f"{key} missing"))
                continue
            checks.append(_renamed(exact_check(f"{key}_unchanged", got, before),
                                   f"parameter {key} was modified by the forward/backward"))
    return checks


def _renamed(check: CheckResult, prefix: str) -> CheckResult:
    if check.passed:
        return check
    return dataclasses.replace(check, detail=f"{prefix}: {check.detail}")


def evaluate_item(
    item: GateItem,
    data: dict[str, Any],
    secret: int,
    config: ScoringConfig,
    device: str,
    oracle_device: str = "cpu",
    inputs: BlockInputs | None = None,
) -> list[CheckResult]:
    """All checks of one item, from the child's output file contents (``inputs``: the item's
    inputs if already drawn; else drawn again from the secret)."""
    inputs = inputs if inputs is not None else item_inputs(item, secret)
    meta = json.loads(data["meta"]) if "meta" in data else {}
    budget = config.budget(item.case.dtype)
    c = item.case
    kwargs = dict(dilation=c.dilation, eps=c.eps, residual_scale=c.residual_scale)
    checks: list[CheckResult] = []
    if item.kind == "drift":
        final = data.get("params_final")
        if final is None:
            checks = _meta_checks(meta, item, device)
            if all(ch.passed for ch in checks):
                checks.append(CheckResult("drift", False, detail="no final parameters"))
            return checks
        dev = torch.device(oracle_device)
        ref = oracle_sgd(
            inputs.x.to(dev),
            {k: v.to(dev) for k, v in inputs.state_dict().items()},
            inputs.grad_out.to(dev),
            steps=config.correctness.drift.steps,
            lr=config.correctness.drift.lr,
            **kwargs,
        )
        for key, start in inputs.state_dict().items():
            got = final.get(key)
            if type(got) is not torch.Tensor or got.shape != start.shape:
                checks.append(CheckResult(f"drift_{key}", False, detail=f"bad final {key}"))
                continue
            start64 = start.to(torch.float64)
            checks.append(rel_l2_check(f"drift_{key}", got.to(torch.float64) - start64,
                                       ref[key].cpu() - start64, budget.drift_rel))  # fmt: skip
        checks.extend(_unchanged_checks(data, inputs, item.kind))
        return checks

    checks.extend(_meta_checks(meta, item, device))
    if not all(ch.passed for ch in checks) or "out" not in data:
        checks.extend(_unchanged_checks(data, inputs, item.kind))
        return checks
    if item.kind == "identity":
        checks.append(exact_check("identity_out", data["out"], inputs.x))
        if "grad_x" in data:
            checks.append(exact_check("identity_grad_x", data["grad_x"], inputs.grad_out))
        for key, param in zip(GRAD_KEYS[1:], PARAM_KEYS, strict=True):
            if key in data:
                zero = torch.zeros_like(inputs.state_dict()[param])
                checks.append(exact_check(f"identity_{key}", data[key], zero))
        checks.extend(_unchanged_checks(data, inputs, item.kind))
        return checks

    dev = torch.device(oracle_device)
    ref = oracle_step(
        inputs.x.to(dev), inputs.conv_weight.to(dev), inputs.fc1_weight.to(dev),
        inputs.fc2_weight.to(dev), inputs.grad_out.to(dev), **kwargs,
    )  # fmt: skip
    checks.append(forward_check(data["out"], ref.out.cpu(), budget))
    for key in GRAD_KEYS:
        if key in data:
            got = data[key]
            want = getattr(ref, key).cpu()
            if got.shape != want.shape:
                checks.append(CheckResult(key, False, detail=(
                    f"shape {tuple(got.shape)}, expected {tuple(want.shape)}")))  # fmt: skip
                continue
            checks.append(rel_l2_check(key, got, want, budget.grad_rel))
    checks.extend(_unchanged_checks(data, inputs, item.kind))
    return checks


def case_result(item: GateItem, checks: list[CheckResult], wall_s: float | None,
                reason: str = "") -> CaseResult:  # fmt: skip
    """Fold checks into a `CaseResult` (the first failure is its reason)."""
    utils = [ch.utilisation for ch in checks if ch.utilisation is not None]
    failed = [ch for ch in checks if not ch.passed]
    if not reason and failed:
        reason = f"{failed[0].name}: {failed[0].detail}"
    return CaseResult(
        name=item.name,
        kind=item.kind,
        dtype=item.case.dtype,
        shape=item.shape,
        dilation=item.case.dilation,
        passed=not failed and not reason and bool(checks),
        checks=tuple(checks),
        max_utilisation=max(utils) if utils else None,
        reason=reason,
        wall_s=wall_s,
    )


# ----------------------------------------------------------------------------- the run


# The child reads its op and kernel census (stops, reads and restarts the profiler) after the
# first item, after every this many items and after the last: a restart costs 0.4-0.75 s on an
# H200 with CUPTI on, and once per item it was most of a grade's gate phase
# (`bench/results/trust-h200-2026-12-01`). Each item's outputs still leave at once; its census
# is judged at the next read. The read after the first item is there because most tampering
# starts with the first step, and a profiler tampered with for several items can abort the
# process (a `crashed` verdict, not the `census-tampered` it deserves).
CENSUS_EVERY = 8


class _Conversation:
    """Parent side of the protocol: hands out items one by one, remembers what the child said."""

    def __init__(self, items: Sequence[GateItem], secret: int, workdir: Path,
                 progress: Callable[[str, int, int], None] | None, rule: DeadlineRule,
                 plain_device: str, drift_steps: int) -> None:  # fmt: skip
        self.items = items
        self.secret = secret
        self.dir = workdir / ".grader"
        self.progress = progress
        self.rule = rule
        self.plain_device = plain_device
        self.drift_steps = drift_steps
        self.due: Deadline | None = None
        self.next = 0
        self.current: int | None = None
        self.done: dict[int, float] = {}
        self.failed: dict[int, dict[str, Any]] = {}
        self.outputs: dict[int, dict[str, Any] | str] = {}
        self.once: set[str] = set()
        self.findings: list[RuleFinding] = []
        self.load_error = ""
        # Inputs handed out, kept for the checks (drawing them again costs as much).
        self.inputs: dict[int, BlockInputs] = {}
        # Items after which the child reads its census (`CENSUS_EVERY`), and each announced
        # step's dims until its summary comes (summaries of several items arrive together).
        self.census_due: set[int] = set()
        self.census_dims: dict[str, census.BlockDims] = {}

    def deadline(self) -> Deadline | None:
        """The step the child is on now, and when it is overdue (`run_child` asks each poll)."""
        return self.due

    def _start(self, what: str, plain_s: float) -> None:
        self.due = Deadline(time.monotonic() + self.rule.seconds(plain_s),
                            f"{what}: {self.rule.describe(plain_s)}")

    def _send_next(self) -> str:
        if self.next >= len(self.items):
            self._start("ending the gate child", 0.0)
            return "end\n"
        item = self.items[self.next]
        self.next += 1
        inputs = item_inputs(item, self.secret)
        self.inputs[item.index] = inputs
        data = {"x": inputs.x, "grad_out": inputs.grad_out, **inputs.state_dict()}
        torch.save(data, self.dir / f"in-{item.index}.pt")
        steps = self.drift_steps if item.kind == "drift" else 1
        plain_s = plain_step_seconds(inputs, item.case.block_args, self.plain_device, steps=steps)
        # The clock starts once the item's inputs are ready and measured, as the child gets 'go'.
        self._start(f"item {item.name}", plain_s)
        if self.next == 1 or self.next % CENSUS_EVERY == 0 or self.next == len(self.items):
            self.census_due.add(item.index)
            return f"go {item.index} census\n"
        return f"go {item.index}\n"

    def __call__(self, message: dict[str, Any]) -> str | None:
        event = message.get("event")
        if event in (ARM_EVENT, "ready"):
            if event in self.once:
                raise ProtocolError(f"a second {event!r} message")
            self.once.add(event)
        if event == ARM_EVENT:
            self._start("importing solution.py", 0.0)
            return None
        if event == "ready":
            return self._send_next()
        if event == "item_start":
            if _int(message.get("index")) != self.next - 1 or self.current is not None:
                raise ProtocolError(f"item_start for item {message.get('index')!r}, but item "
                                    f"{self.next - 1} was the one sent")
            self.current = _int(message.get("index"))
            if self.progress is not None and self.current is not None:
                self.progress(self.items[self.current].name, len(self.done) + len(self.failed),
                              len(self.items))  # fmt: skip
            return None
        if event in ("item_done", "item_failed"):
            index = _int(message.get("index"))
            if index is None or index != self.current or index in self.done:
                raise ProtocolError(f"{event} for item {message.get('index')!r} while item "
                                    f"{self.current} was running")
            if event == "item_done":
                self.done[index] = _wall(message.get("wall_s"))
                # The outputs are read now, before the next item lets submission code run.
                self.outputs[index] = _outputs(message)
            else:
                self.failed[index] = message
            if index in self.census_due:
                # Every step announced since the last read must have brought its census by now:
                # a summary the child kept back (its writer filtered) is a step nobody saw.
                name = self.items[index].name
                ledger = census.ledger_for(self)
                found = ledger.close_item(name) if event == "item_done" else ledger.unsettled()
                self.findings.extend(census.rule_findings(found, name))
            self.current = None
            return self._send_next()
        if event == "finding":
            self.findings.append(RuleFinding(
                rule=str(message.get("rule")), severity=Severity.VIOLATION, source="runtime",
                message=str(message.get("message")), phase=str(message.get("phase"))))
            return None
        if event == "census":
            # A step announced, or its op and kernel census: judged here, not in the child.
            label = census.message_label(message)
            if "summary" in message:
                dims = self.census_dims.pop(label, None)
            else:
                item = self.items[self.current] if self.current is not None else None
                dims = census.BlockDims.of_case(item.case) if item is not None else None
                if dims is not None:
                    self.census_dims[label] = dims
            found = census.judge_message(message, dims, census.ledger_for(self),
                                         gpu=self.plain_device.startswith("cuda"))
            self.findings.extend(census.rule_findings(found, census.message_label(message)))
            return None
        if event == "load_failed":
            self.load_error = str(message.get("error", ""))
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _wall(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


# The task's dtypes, and fp64 (none is sent today, but a check of fp64 values would be).
_BLOB_DTYPES = {**DTYPES, "float64": torch.float64}


def _outputs(message: dict[str, Any]) -> dict[str, Any] | str:
    """An ``item_done`` message's outputs as the checks read them (``{"out": tensor,
    "params_after": {"conv.weight": tensor}, "meta": json}``), or why they cannot be read."""
    data: dict[str, Any] = {"meta": json.dumps(message.get("meta") or {})}
    total = 0
    for name, blob in (message.get("_blobs") or {}).items():
        dtype = _BLOB_DTYPES.get(blob.dtype)
        if dtype is None:
            return f"{name} has element type {blob.dtype!r}"
        numel = math.prod(blob.shape)
        itemsize = dtype.itemsize
        if numel * itemsize != len(blob.data) or min(blob.shape, default=1) < 0:
            return (f"{name} has {len(blob.data)} bytes, its shape {blob.shape} and type "
                    f"{blob.dtype} need {numel * itemsize}")
        total += len(blob.data)
        if total > _MAX_OUTPUT_BYTES:
            return f"the outputs hold more than {_MAX_OUTPUT_BYTES} bytes"
        tensor = torch.frombuffer(bytearray(blob.data), dtype=dtype) if numel else \
            torch.empty(0, dtype=dtype)
        tensor = tensor.reshape(blob.shape)
        group, _, key = name.partition("/")
        if key:
            data.setdefault(group, {})[key] = tensor
        else:
            data[name] = tensor
    return data


def run_gate(
    submission_dir: Path,
    workdir: Path,
    config: ScoringConfig,
    items: Sequence[GateItem],
    secret: int,
    *,
    device: str,
    limits: ChildLimits,
    env_extra: dict[str, str] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    oracle_device: str = "cpu",
) -> GateResult:
    """Run every item in one child and check its outputs here.

    Args:
        submission_dir: The exported tree (read-only to us; copied into ``workdir``).
        workdir: A fresh directory: the child's copy of the tree and its only writable place.
        config: The scoring config (budgets, drift steps).
        items: From `build_items`.
        secret: The grade's secret seed (never leaves this process).
        device: ``cuda:0`` (as the child sees it) or ``cpu``.
        limits: The child's limits.
        env_extra: Added to the child's environment (CUDA_VISIBLE_DEVICES, TRITON_INTERPRET).
        progress: Called with (item name, items finished, items total) as the child advances.
        oracle_device: Where the fp64 truth is computed.
    """
    if workdir.exists():
        shutil.rmtree(workdir)
    shutil.copytree(submission_dir, workdir)
    (workdir / ".grader").mkdir()
    job = {
        "device": device,
        "forbidden_dirs": [str(d) for d in FORBIDDEN_DIRS],
        "items": [_job_item(item, config) for item in items],
    }
    job_path = workdir / ".grader" / "job.json"
    job_path.write_text(json.dumps(job))
    talk = _Conversation(items, secret, workdir, progress,
                         config.limits.deadlines.for_device(device), oracle_device,
                         config.correctness.drift.steps)
    child = run_child(CHILD_SCRIPT, workdir, [str(REPO_ROOT), str(job_path)], limits,
                      env_extra=env_extra, on_message=talk, deadline=talk.deadline,
                      arm=True)  # fmt: skip

    cases: list[CaseResult] = []
    frames: dict[str, tuple[str, ...]] = {}
    for item in items:
        wall = talk.done.get(item.index)
        if item.index in talk.failed:
            message = talk.failed[item.index]
            error = str(message.get("error", "")).strip().splitlines()
            last = error[-1] if error else "unknown error"
            what = "called exit" if message.get("exit_call") else "raised"
            cases.append(case_result(item, [], None, f"the submission {what}: {last}"))
            frames[item.name] = _frames(message.get("frames"))
            continue
        if item.index not in talk.done:
            if talk.current == item.index:
                cases.append(case_result(item, [], None, f"the child died here: {_death(child)}"))
            continue  # never started: the child ended before it
        data = talk.outputs.pop(item.index)
        if isinstance(data, str):
            cases.append(case_result(item, [], wall, f"unreadable output: {data}"))
            continue
        try:
            checks = evaluate_item(item, data, secret, config, device, oracle_device,
                                   inputs=talk.inputs.pop(item.index, None))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - malformed outputs fail the item
            cases.append(case_result(item, [], wall, f"unreadable output: {exc!r}"))
            continue
        cases.append(case_result(item, checks, wall))
    return GateResult(tuple(items), tuple(cases), tuple(talk.findings), child, talk.load_error,
                      {name: f for name, f in frames.items() if f})


def _frames(value: Any) -> tuple[str, ...]:
    """The child's frame lines (its word only, shown to a person): a few short strings."""
    if not isinstance(value, list):
        return ()
    return tuple(v[:300] for v in value[-6:] if isinstance(v, str))


def _death(child: ChildResult) -> str:
    if child.outcome is Outcome.OK:
        return "it exited with status 0 before finishing the item (os._exit or sys.exit)"
    return child.detail or child.outcome.value


def progress_bar(stream: Any = sys.stderr) -> Callable[[str, int, int], None]:
    """A one-line progress bar on ``stream`` (stderr), redrawn in place on a terminal."""
    tty = hasattr(stream, "isatty") and stream.isatty()

    def show(name: str, done: int, total: int) -> None:
        width = 24
        filled = int(width * done / max(total, 1))
        line = f"gate [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name}"
        stream.write(("\r" + line.ljust(100)) if tty else line + "\n")
        stream.flush()

    return show


__all__ = [
    "DTYPES",
    "GateItem",
    "GateResult",
    "build_items",
    "case_result",
    "evaluate_item",
    "exact_check",
    "forward_check",
    "item_inputs",
    "progress_bar",
    "rel_l2_check",
    "run_gate",
]
