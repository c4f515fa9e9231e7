"""CPU tests of the scoring reference (`reference.block.DilatedResidualBlock`, CONTRACT §8):
conv+norm in Triton through the interpreter, the MLP in PyTorch's own ops.

Each group of interpreted checks runs in a fresh process (`tests/reference_runner.py`, as in
tests/test_reference_cpu.py, which holds the kernels' and the ceiling's tests): every smoke case
of scoring.yaml in its own dtype and the small ones in every dtype, the zero-weight identity bit
for bit, bitwise-deterministic gradients, and what a step runs: PyTorch's linear and GELU
forward and backward, and no Triton kernel but conv+norm's. Every check stays within half of
its budget.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from interpreted import run_interpreted
from reference_runner import CONV_NORM_MODULES, block_class
from test_reference_cpu import RUNNER, SMOKE_CASES, TIMEOUT_S, WORKERS, assert_within

DTYPES = ("float32", "bfloat16", "float16")
# Smoke cases run in every dtype too: short, odd lengths, channels and dilations (the offset
# family stays fp32, as scoring.yaml has it).
EVERY_DTYPE_CASES = ("c1-l1", "c3-l2", "c5-l9-d4", "c8-l17-d20", "c33-l96-d3-ramp")
# A step small enough to interpret fast, odd in every dimension.
SMALL = {"batch": 2, "length": 9, "channels": 5, "dilation": 2, "seed": 3}


def block_specs() -> list[dict[str, Any]]:
    from grader.config import load_config

    cfg = load_config()
    cases = {c.name: c for c in (*cfg.correctness.cases, *cfg.correctness.drift.cases)}
    specs = [{"kind": "block", "case": name, "seed": seed}
             for name in SMOKE_CASES for seed in cases[name].seeds]
    specs += [{"kind": "block", "case": name, "seed": cases[name].seeds[0], "dtype": dtype}
              for name in EVERY_DTYPE_CASES for dtype in DTYPES if dtype != cases[name].dtype]
    return specs


def exact_specs() -> list[dict[str, Any]]:
    return [{"kind": kind, **SMALL, "dtype": dtype}
            for kind in ("identity", "determinism") for dtype in DTYPES]


def ops_specs() -> list[dict[str, Any]]:
    """The scoring block in every dtype, at an example of 4096 values (where the ceiling takes
    its Triton GELU), and the ceiling with its Triton GELU forced, the control that shows the
    check sees Triton kernels and Functions outside conv+norm when there are any."""
    specs = [{"kind": "step_ops", **SMALL, "dtype": dtype} for dtype in DTYPES]
    specs.append({"kind": "step_ops", "batch": 1, "length": 512, "channels": 8, "dilation": 3,
                  "dtype": "float32", "seed": 5})
    specs.append({"kind": "step_ops", **SMALL, "dtype": "float32", "block": "ceiling",
                  "norm_grad_min_elements": 0})
    return specs


def groups() -> dict[str, list[dict[str, Any]]]:
    specs = block_specs()
    half = len(specs) // 2
    return {"block-a": specs[:half], "block-b": specs[half:], "exact": exact_specs(),
            "ops": ops_specs()}


@pytest.fixture(scope="module")
def interpreted() -> Iterator[dict[str, Future[list[dict[str, Any]]]]]:
    """Every group's subprocess on a small pool up front; tests wait for their own."""
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    futures = {name: pool.submit(run_interpreted, [str(RUNNER), json.dumps(specs)], TIMEOUT_S)
               for name, specs in groups().items()}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def results_of(interpreted: dict[str, Future], name: str) -> list[dict[str, Any]]:
    return interpreted[name].result(timeout=TIMEOUT_S * len(interpreted))


def test_scoring_block_matches_the_oracle(interpreted: dict) -> None:
    """Output and the four gradients against fp64 on every smoke case (its seeds, its dtype),
    and the small ones in every dtype: within half of each budget."""
    specs = block_specs()
    assert_within(specs, results_of(interpreted, "block-a") + results_of(interpreted, "block-b"))


def test_scoring_block_identity_and_determinism(interpreted: dict) -> None:
    """Zero fc weights: out == x, x.grad == grad_out bit for bit, the weights' gradients exactly
    0; and two steps on the same inputs give the same output and gradients bit for bit; every
    dtype."""
    results = results_of(interpreted, "exact")
    assert len(results) == len(exact_specs())
    for spec, result in zip(exact_specs(), results, strict=True):
        assert result and all(v == 0.0 for v in result.values()), (spec, result)


def _kernel_modules(result: dict[str, Any]) -> set[str]:
    return {k.rsplit(".", 1)[0] for k in (*result["forward_kernels"], *result["backward_kernels"])}


def test_scoring_block_step_is_conv_norm_in_triton_and_the_mlp_in_pytorch(
        interpreted: dict) -> None:
    """The step's census as a CPU run can take it: conv+norm's Function and kernels, each way;
    PyTorch's own linear (mm, addmm) and GELU forward and backward; no other Triton kernel and
    no other custom autograd Function. The ceiling with its Triton GELU is caught (control)."""
    specs = ops_specs()
    results = results_of(interpreted, "ops")
    *scoring, ceiling = results
    for spec, result in zip(specs, scoring, strict=False):
        assert result["python_functions"] == ["ConvNormSkipFunctionBackward"], (spec, result)
        assert {"GeluBackward0", "AddmmBackward0"} <= set(result["graph"]), (spec, result)
        assert {"gelu", "addmm", "mm"} <= set(result["forward_ops"]), (spec, result)
        assert {"gelu_backward", "mm"} <= set(result["backward_ops"]), (spec, result)
        assert result["forward_kernels"] and result["backward_kernels"], (spec, result)
        assert _kernel_modules(result) <= set(CONV_NORM_MODULES), (spec, result)
    assert "GeluNormGradFunctionBackward" in ceiling["python_functions"], ceiling
    assert "reference.norm_grad" in _kernel_modules(ceiling), ceiling
    assert "gelu" not in ceiling["forward_ops"], ceiling


def test_scoring_block_has_no_switches() -> None:
    """The block that scores is one thing (CONTRACT §8): the ceiling's switches are not on it,
    a spec cannot set them, and both blocks keep the frozen block's arguments and keys."""
    import torch

    from reference.block import DilatedResidualBlock
    from reference.ceiling import CeilingBlock
    from task.model import DilatedResidualBlock as Frozen

    scoring = DilatedResidualBlock(8, 3)
    for name in ("split_mlp", "fuse_residual", "norm_grad_from_mlp", "norm_grad_min_elements"):
        assert not hasattr(scoring, name), name
        assert hasattr(CeilingBlock(8, 3), name), name
    with pytest.raises(ValueError, match="no switches"):
        block_class({"norm_grad_from_mlp": False})
    assert block_class({"block": "ceiling"}) is CeilingBlock
    keys = {k: v.shape for k, v in Frozen(8, 3).state_dict().items()}
    for cls in (DilatedResidualBlock, CeilingBlock):
        torch.manual_seed(0)
        block = cls(8, 3)
        torch.manual_seed(0)
        frozen = Frozen(8, 3)
        assert {k: v.shape for k, v in block.state_dict().items()} == keys
        assert all(torch.equal(a, b) for a, b in zip(block.state_dict().values(),
                                                     frozen.state_dict().values(), strict=True))
