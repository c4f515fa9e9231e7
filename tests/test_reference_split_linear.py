"""Tests of `reference/split_linear.py`: CPU through the Triton interpreter, GPU in-process.

The interpreter runs in a subprocess (``TRITON_INTERPRET=1`` before the kernels are imported)
with the GPU's bf16 arithmetic patched in (`tests/test_reference_mlp.py`'s
`_gpu_bf16_semantics`), so the fp32 split into bf16 halves is checked as the GPU computes it.
The truth is fp64 on the same rounded inputs. fp32 must keep ~16 bits of every operand (relative
error under 2e-5: 150× inside the fp32 gradient budget); bf16/fp16 must be within a few units of
their own roundoff. Every buffer the launchers allocate is NaN-poisoned first.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from interpreted import run_interpreted

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TIMEOUT_S = 240
# Largest relative L2 error against fp64 per dtype: the gradients' split keeps ~16 bits of each
# fp32 operand (measured 4.4e-6 on an H200), the forward's ~22; half dtypes round their output
# (u = 2⁻⁸, 2⁻¹¹).
MAX_REL = {"float32": 2e-5, "bfloat16": 8e-3, "float16": 1e-3}
# (batch, length, K, N): odd sizes against 16-wide interpreter tiles, one row, a wide K.
SHAPES = ((2, 37, 33, 66), (1, 1, 16, 16), (3, 50, 128, 20))


def relative_errors(spec: dict[str, Any]) -> dict[str, float]:
    """y, dx and dw of `split_linear` against fp64 autograd, relative L2."""
    from reference import split_linear as sl
    from task.inputs import DTYPES

    sl.POISON_OUTPUTS = True
    dtype = DTYPES[spec["dtype"]]
    device = spec.get("device", "cpu")
    gen = torch.Generator().manual_seed(spec["seed"])
    b, length, k, n = spec["shape"]
    x = torch.randn(b, length, k, generator=gen, dtype=torch.float64).to(dtype)
    w = (torch.randn(n, k, generator=gen, dtype=torch.float64) / k**0.5).to(dtype)
    g = torch.randn(b, length, n, generator=gen, dtype=torch.float64).to(dtype)
    xd = x.to(device, copy=True).requires_grad_()
    wd = w.to(device, copy=True).requires_grad_()
    plan = sl.SplitLinearPlan(**spec["plan"]) if spec.get("plan") else None
    y = sl.split_linear(xd, wd, plan)
    y.backward(g.to(device))
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    yr = xr @ wr.t()
    yr.backward(g.double())
    yr = yr.detach()

    def rel(got: torch.Tensor, want: torch.Tensor) -> float:
        got = got.detach().double().cpu()
        if got.dtype != want.dtype or got.shape != want.shape:
            return float("inf")
        return float((got - want).norm() / want.norm())

    return {"y": rel(y, yr), "dx": rel(xd.grad, xr.grad), "dw": rel(wd.grad, wr.grad),
            "dtype_kept": 0.0 if y.dtype == wd.grad.dtype == xd.grad.dtype == dtype else 1.0}


def determinism(spec: dict[str, Any]) -> dict[str, float]:
    """Two runs of a weight gradient over many row slices give the same bits."""
    from reference import split_linear as sl
    from task.inputs import DTYPES

    dtype = DTYPES[spec["dtype"]]
    device = spec.get("device", "cpu")
    gen = torch.Generator().manual_seed(spec["seed"])
    rows, k, n = spec["sizes"]
    g = torch.randn(rows, n, generator=gen).to(dtype).to(device)
    x = torch.randn(rows, k, generator=gen).to(dtype).to(device)
    plan = sl.SplitLinearPlan(**spec["plan"]) if spec.get("plan") else None
    first = sl.matmul(g.t(), x, plan, slices=spec["slices"])
    second = sl.matmul(g.t(), x, plan, slices=spec["slices"])
    want = g.double().t() @ x.double()
    return {"bitwise": 0.0 if torch.equal(first, second) else 1.0,
            "rel": float((first.double() - want).norm() / want.norm())}


def _run(specs: list[dict[str, Any]]) -> list[dict[str, float]]:
    from reference_runner import block_check, identity_check

    checks = {"errors": relative_errors, "determinism": determinism, "block": block_check,
              "identity": identity_check}
    return [checks[s["kind"]](s) for s in specs]


def _interpreted(specs: list[dict[str, Any]]) -> list[dict[str, float]]:
    return run_interpreted([__file__, json.dumps(specs)], TIMEOUT_S)


SMALL = {"block_m": 16, "block_n": 16, "block_k": 16, "num_warps": 1, "num_stages": 1}


def test_split_linear_matches_fp64_in_every_dtype() -> None:
    """y, dx and dw within MAX_REL of fp64 at odd sizes, in every dtype, outputs in the input
    dtype; the weight gradient runs over several row slices."""
    specs = [{"kind": "errors", "dtype": dtype, "shape": shape, "seed": 10 * i + j,
              "plan": {**SMALL, "programs_per_sm": 3}}
             for i, dtype in enumerate(MAX_REL) for j, shape in enumerate(SHAPES)]
    results = _interpreted(specs)
    bad = [(s["dtype"], s["shape"], r) for s, r in zip(specs, results, strict=True)
           if r["dtype_kept"] or max(r["y"], r["dx"], r["dw"]) > MAX_REL[s["dtype"]]]
    assert not bad, bad
    # The splits are doing work: fp32's gradients (bf16 halves) err above fp32 roundoff and far
    # below bf16's; y (fp16 halves, ~22 bits) errs at least 8× less than they do.
    fp32 = [r for s, r in zip(specs, results, strict=True) if s["dtype"] == "float32"]
    assert all(1e-7 < min(r["dx"], r["dw"]) and 8 * r["y"] < max(r["dx"], r["dw"]) < 2e-5
               for r in fp32), fp32


def test_weight_gradient_slices_are_deterministic() -> None:
    """Row slices summed in order: the same bits run to run, for 1, 3 and 7 slices."""
    specs = [{"kind": "determinism", "dtype": "float32", "sizes": (97, 20, 33), "seed": 5,
              "slices": slices, "plan": SMALL} for slices in (1, 3, 7)]
    for spec, result in zip(specs, _interpreted(specs), strict=True):
        assert result["bitwise"] == 0.0, spec
        assert result["rel"] < 2e-5, (spec, result)


def test_reference_block_with_split_mlp_passes_the_oracle() -> None:
    """The ceiling block (`reference.ceiling`) with ``split_mlp`` on scoring.yaml cases (offset, ramp, burst,
    outlier, expansion 1, fp16, and the burst case in bf16): output and all four gradients
    within half of each budget against the fp64 oracle; zero weights give out == x and
    dx == grad_out bit for bit in every dtype."""
    cases = (("c16-l1024-offset", 1601, None), ("c33-l96-d3-ramp", 1801, None),
             ("c31-l64-d2-burst", 1901, None), ("c17-l32-b3-outlier", 2001, None),
             ("c12-l40-e1", 1701, None), ("c7-l33-d2-f16", 1501, None),
             ("c31-l64-d2-burst", 1901, "bfloat16"))
    specs = [{"kind": "block", "case": case, "seed": seed, "split_mlp": True, "block": "ceiling",
              **({"dtype": dtype} if dtype else {})} for case, seed, dtype in cases]
    specs += [{"kind": "identity", "batch": 2, "length": 17, "channels": 9, "dilation": 2,
               "dtype": dtype, "seed": 7, "split_mlp": True, "block": "ceiling"}
              for dtype in MAX_REL]
    results = _interpreted(specs)
    bad = [(s.get("case", s["dtype"]), name, util) for s, r in zip(specs, results, strict=True)
           for name, util in r.items()
           if not util <= (0.5 if s["kind"] == "block" else 0.0)]
    assert not bad, bad


def test_validation_names_both_values() -> None:
    from reference.split_linear import SplitLinearPlan, matmul, split_linear

    with pytest.raises(ValueError, match=r"a.shape=\(3, 4\) and b.shape=\(5, 2\)"):
        matmul(torch.zeros(3, 4), torch.zeros(5, 2))
    with pytest.raises(ValueError, match="must match"):
        matmul(torch.zeros(3, 4), torch.zeros(4, 2, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"x.shape=\(2, 3\) and w.shape=\(4, 5\)"):
        split_linear(torch.zeros(2, 3), torch.zeros(4, 5))
    with pytest.raises(ValueError, match="block_k=24"):
        SplitLinearPlan(block_k=24)
    with pytest.raises(ValueError, match="programs_per_sm=0"):
        SplitLinearPlan(programs_per_sm=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            matmul(torch.zeros(3, 4), torch.zeros(4, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(MAX_REL))
def test_gpu_mlp_sizes(dtype: str) -> None:
    """The MLP's products at 8·4096 rows (C = 128, H = 256) and an odd 3·1000 × 33 → 66, with
    the default plan: within MAX_REL of fp64, and the weight gradient bitwise reproducible."""
    for shape in ((8, 4096, 128, 256), (8, 4096, 256, 128), (3, 1000, 33, 66)):
        result = relative_errors({"dtype": dtype, "shape": shape, "seed": 3, "device": "cuda"})
        assert not result["dtype_kept"] and max(result["y"], result["dx"], result["dw"]) <= \
            MAX_REL[dtype], (shape, result)
    result = determinism({"dtype": dtype, "sizes": (8 * 4096, 128, 256), "seed": 4,
                          "slices": 66, "device": "cuda"})
    assert result["bitwise"] == 0.0 and result["rel"] <= MAX_REL[dtype], result


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        from test_reference_mlp import _gpu_bf16_semantics

        _gpu_bf16_semantics()
    print(json.dumps(_run(json.loads(sys.argv[1]))))
