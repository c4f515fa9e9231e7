"""Stage 2, prove: the correctness gate every candidate passes before it is timed. `Gate` runs
the reference block with a plan on the class's shapes and a few `scoring.yaml` cases, outputs
poisoned with NaN, against the fp64 oracle within the dtype's budgets (GPU or interpreter).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grader.checks import step_utilisation
from grader.config import Budget, Case, ScoringConfig
from reference.plans import Plan
from reference.tuning.shapes import ShapeGroup, TuneShape
from task.inputs import DTYPES, derive_seed, make_inputs
from task.oracle import OracleResult, oracle_step

# Extra scoring.yaml cases of the group's dtype per gate, besides the group's own shapes.
DEFAULT_GATE_CASES = 2


@dataclass(frozen=True)
class GateResult:
    """A plan's verdict from the correctness gate.

    Attributes:
        passed: Every check of every case within budget, every value finite.
        max_util: Largest error over budget seen (1.0 is the budget).
        worst: ``case/check`` of that largest utilisation.
        reason: Why it failed, empty if it passed.
    """

    passed: bool
    max_util: float
    worst: str = ""
    reason: str = ""


@dataclass(frozen=True)
class GateCase:
    """One input the gate checks a plan on.

    Attributes:
        name: Label for the log.
        shape: Input shape and dtype.
        family: Input family (`task.inputs.FAMILIES`).
        seed: Public seed (mixed with the run's secret).
        expansion, eps, residual_scale: The block's other constructor arguments.
    """

    name: str
    shape: TuneShape
    family: str
    seed: int
    expansion: int = 2
    eps: float = 1e-5
    residual_scale: float = 0.5


def pick_gate_cases(cases: Sequence[Case], dtype: str, count: int, smoke_only: bool
                    ) -> list[Case]:
    """``count`` scoring.yaml cases of a dtype, spread from the smallest to the largest.

    Small odd widths exercise masking, large lengths the group barrier and the offset family the
    statistics, so the picks are spread over the size order rather than taken from one end.
    """
    pool = sorted((c for c in cases if c.dtype == dtype and (c.smoke or not smoke_only)),
                  key=lambda c: (c.numel, c.name))
    if count <= 0 or not pool:
        return []
    if count >= len(pool):
        return pool
    if count == 1:
        return [pool[-1]]
    step = (len(pool) - 1) / (count - 1)
    return [pool[round(i * step)] for i in range(count)]


def gate_cases_for(group: ShapeGroup, config: ScoringConfig, extra: int, smoke_only: bool
                   ) -> list[GateCase]:
    """The group's own shapes (normal family) plus ``extra`` scoring.yaml cases of its dtype."""
    out = [GateCase(f"timed:{s.label}", s, "normal", 9000 + i, config.block.expansion,
                    config.block.eps, config.block.residual_scale)
           for i, s in enumerate(group.shapes)]
    for case in pick_gate_cases(config.correctness.cases, group.dtype, extra, smoke_only):
        shape = TuneShape(case.batch, case.length, case.channels, case.dilation, case.dtype)
        out.append(GateCase(case.name, shape, case.family, case.seeds[0], case.expansion,
                            case.eps, case.residual_scale))
    return out


@contextlib.contextmanager
def poisoned_outputs() -> Iterator[None]:
    """NaN-fill every buffer the reference launchers allocate, so an unwritten element fails."""
    import reference.conv_norm as conv_norm

    before = conv_norm.POISON_OUTPUTS
    conv_norm.POISON_OUTPUTS = True
    try:
        yield
    finally:
        conv_norm.POISON_OUTPUTS = before


class Gate:
    """Proves plans on a fixed list of cases; draws each case's inputs and truth once per run.

    Args:
        cases: What to check on.
        budgets: Per-dtype budgets from scoring.yaml.
        device: Where the reference block runs.
        secret: Mixed into every case's seed (fresh per tuner run).
    """

    def __init__(self, cases: Sequence[GateCase], budgets: Mapping[str, Budget],
                 device: torch.device, secret: int) -> None:
        self.cases = tuple(cases)
        self.budgets = budgets
        self.device = device
        self.secret = secret
        self._truth: dict[str, tuple[Any, OracleResult]] = {}

    def _inputs(self, case: GateCase) -> tuple[Any, OracleResult]:
        if case.name not in self._truth:
            s = case.shape
            inputs = make_inputs(batch=s.batch, length=s.length, channels=s.channels,
                                 expansion=case.expansion, family=case.family, dtype=s.dtype,
                                 seed=derive_seed(case.seed, self.secret), device=self.device)
            ref = oracle_step(inputs.x, inputs.conv_weight, inputs.fc1_weight, inputs.fc2_weight,
                              inputs.grad_out, dilation=s.dilation, eps=case.eps,
                              residual_scale=case.residual_scale)
            self._truth[case.name] = (inputs, ref)
        return self._truth[case.name]

    def check(self, plan: Plan | None, mlp_path: str | None = None) -> GateResult:
        """Run every case with ``plan`` (None: the block's own table or heuristic plan) on the
        scoring block, or with ``mlp_path`` given on the ceiling (`reference.ceiling`) with its
        linears on that path; the first failing case ends the check."""
        worst, where = 0.0, ""
        for case in self.cases:
            try:
                utils = self._check_case(plan, case, mlp_path)
            except Exception as exc:  # noqa: BLE001 - any crash of a candidate is a gate failure
                return GateResult(False, math.inf, case.name, f"{case.name}: {exc!r}")
            for check, util in utils.items():
                util = math.inf if math.isnan(util) else util
                if util > worst:
                    worst, where = util, f"{case.name}/{check}"
                if util > 1.0:
                    return GateResult(False, util, f"{case.name}/{check}",
                                      f"{case.name}/{check} at {util:.3g}x its budget")
        return GateResult(True, worst, where)

    def _check_case(self, plan: Plan | None, case: GateCase, mlp_path: str | None = None
                    ) -> dict[str, float]:
        from reference.block import DilatedResidualBlock
        from reference.ceiling import CeilingBlock

        inputs, ref = self._inputs(case)
        s = case.shape
        # A plan is proven on the scoring block (the one the grader times); an MLP path on the
        # ceiling, the only block that has one.
        cls = DilatedResidualBlock if mlp_path is None else CeilingBlock
        block = cls(s.channels, s.dilation, case.expansion, case.eps,
                    case.residual_scale).to(self.device, DTYPES[s.dtype])
        block.load_state_dict(inputs.state_dict())
        block.plan = plan
        if mlp_path is not None:
            block.split_mlp = mlp_path == "split"
        x = inputs.x.clone().requires_grad_(True)
        with poisoned_outputs():
            out = block(x)
            out.backward(inputs.grad_out)
        budget = self.budgets[s.dtype]
        if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype:
            return {"forward": math.inf}
        return step_utilisation(block, x, out, ref, budget)
