"""The MLP path of one dtype (the plan table's ``mlp`` entry, `reference.plans.mlp_path_for`):
which way the block's two linears run on this GPU, decided by the same loop as a conv+norm plan.

Every path of `reference.plans.MLP_PATHS` is a candidate. Each goes through the gate first (the
whole block against the fp64 oracle on the dtype's largest timing shape and a few `scoring.yaml`
cases, outputs poisoned), then the survivors time the whole training step interleaved, as the
grader times it (forward and backward, host overhead included, L2 flushed). The incumbent (the
table's entry, else `reference.plans.heuristic_mlp_path`) yields only to a path faster beyond
noise (`freeze.pick_winner`); a re-verify uses the drift threshold as the gain instead.
`tuner.Tuner.tune_mlp` drives it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from reference.tuning.freeze import Decision
from reference.tuning.prove import GateResult
from reference.tuning.shapes import TuneShape
from task.inputs import DTYPES, make_inputs

# The interpreter's bf16 ``tl.dot`` is not the GPU's (the split's CPU tests patch the GPU's
# arithmetic in), so an interpreted gate of the split path would judge other arithmetic.
MLP_NEEDS_GPU = ("MLP path: not proven or timed without a GPU (the Triton interpreter's bf16 "
                 "tl.dot is not the GPU's); the table's mlp entries are left as they are")


@dataclass
class MLPReport:
    """What happened to one dtype's MLP path (JSON-ready through `to_json`).

    Attributes:
        dtype: Table dtype name.
        timed_shape: Label of the shape the step was timed on.
        incumbent: The path before this run (the table's entry, else the heuristic's).
        source: "table" or "heuristic".
        gates: Gate verdict per path.
        timings: Median, p20 and p80 of the step (ms) per timed path.
        decisions: Each challenger's promotion decision against the incumbent.
        winner: The path to freeze ("" when untimed).
        action: "kept", "promoted", "failed" (no path passed the gate) or "untimed".
        reason: Why, in words.
    """

    dtype: str
    timed_shape: str
    incumbent: str
    source: str
    gates: dict[str, GateResult] = field(default_factory=dict)
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    decisions: dict[str, Decision] = field(default_factory=dict)
    winner: str = ""
    action: str = ""
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # recurses into the dicts' GateResult and Decision


def block_step(path: str, shape: TuneShape, device: torch.device, expansion: int, eps: float,
               residual_scale: float, seed: int = 0
               ) -> tuple[Callable[[], None], Callable[[], None]]:
    """The ceiling's training step (`reference.ceiling`, the only block with an MLP path) with
    its linears on ``path``: (step, prepare).

    ``step`` runs the forward and the backward of the grader's step on one case's inputs (normal
    family, ``seed``); ``prepare`` drops the gradients the last step left, as the grader does
    between samples, so each sample allocates them afresh.
    """
    from reference.ceiling import CeilingBlock

    inputs = make_inputs(batch=shape.batch, length=shape.length, channels=shape.channels,
                         expansion=expansion, family="normal", dtype=shape.dtype, seed=seed,
                         device=device)
    block = CeilingBlock(shape.channels, shape.dilation, expansion, eps,
                         residual_scale).to(device, DTYPES[shape.dtype])
    block.load_state_dict(inputs.state_dict())
    block.split_mlp = path == "split"
    x = inputs.x.detach().clone().requires_grad_(True)
    grad_out = inputs.grad_out

    def prepare() -> None:
        x.grad = None
        for p in block.parameters():
            p.grad = None

    def step() -> None:
        block(x).backward(grad_out)

    return step, prepare


__all__ = ["MLP_NEEDS_GPU", "MLPReport", "block_step"]
