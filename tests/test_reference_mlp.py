"""Tests of the fused MLP (`reference/mlp.py`): CPU through the Triton interpreter, GPU in-process.

Every interpreted group of checks runs in its own subprocess with ``TRITON_INTERPRET=1`` and a
timeout, as in `tests/test_reference_cpu.py` (the interpreter must be enabled before the kernels
are imported and detects no out-of-bounds access). This file is its own runner:
``python tests/test_reference_mlp.py '<json specs>'`` prints one JSON result per spec.

The truth is fp64 autograd through the frozen block's MLP expression
``x + s·fc2(gelu(fc1(ŷ)))`` (`task/model.py`), on the same rounded inputs: independent of the
kernels' hand-written backward. Budgets are scoring.yaml's for the dtype; every check must stay
within half of its budget. Every buffer the launchers allocate is NaN-poisoned first, so an
element a kernel skips fails its check.

bf16: Triton 3.6's interpreter multiplies the raw uint16 bits of bf16 operands in ``tl.dot``
(its bf16 values are stored as uint16), which makes every bf16 product garbage, and its fp32 →
bf16 casts truncate where the GPU rounds to nearest even. The runner fixes both
(`_gpu_bf16_semantics`): dot operands are widened to fp32 first, as tensor cores do (products of
bf16 values are exact in fp32, accumulation fp32), and the cast rounds as torch does, so the bf16
path runs through the same kernels with the GPU's arithmetic. (Scalar 0-d casts are rare here;
the kernels cast only tiles.) The zero-weight identity needs neither fix.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch
from interpreted import run_interpreted

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TIMEOUT_S = 180
MAX_UTILISATION = 0.5
# The CI machine has 2 cores: two interpreter processes at a time.
WORKERS = 2
DTYPE_NAMES = ("float32", "float16", "bfloat16")


# --- the checks (run in the subprocess, or in-process on a GPU) ---------------------------------


def _gpu_bf16_semantics() -> None:
    """Give the interpreter the GPU's bf16 arithmetic: ``tl.dot`` reads bf16 operands as values,
    not as uint16 bits, and fp32 → bf16 casts round to nearest even instead of truncating."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_gpu_bf16", False):
        return
    create_dot = builder.create_dot
    cast_impl = builder.cast_impl

    def widen(handle: Any) -> Any:
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None)
        return interpreter.TensorHandle(data.view("float32"), tl.float32)

    def dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_imprecise: Any) -> Any:
        return create_dot(self, widen(a), widen(b), d, input_precision, max_imprecise)

    def cast(self: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            bits = rounded.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interpreter.TensorHandle(bits, tl.bfloat16)
        return cast_impl(self, src, dst_type)

    builder.create_dot = dot
    builder.cast_impl = cast
    builder._gpu_bf16 = True


def _inputs(spec: dict[str, Any]) -> dict[str, torch.Tensor]:
    """ŷ, x, g ~ N(0, 1) and nn.Linear's default-init ranges for W1, W2, drawn in fp64 on the
    CPU from the spec's seed and rounded to its dtype."""
    from task.inputs import DTYPES

    dtype = DTYPES[spec["dtype"]]
    gen = torch.Generator().manual_seed(spec["seed"])
    c = spec["channels"]
    h = spec.get("expansion", 2) * c
    rows = (spec["batch"], spec["length"], c)

    def draw(shape: tuple[int, ...], bound: float | None = None) -> torch.Tensor:
        if bound is None:
            t = torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            t = (2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1) * bound
        return t.to(dtype)

    return {"yhat": draw(rows), "x": draw(rows), "w1": draw((h, c), 1 / math.sqrt(c)),
            "w2": draw((c, h), 1 / math.sqrt(h)), "g": draw(rows)}


def _step(inp: dict[str, torch.Tensor], s: float, plan: Any, device: str
          ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One fused forward + backward: (out, gradients of yhat, x, w1, w2)."""
    from reference.mlp import fused_mlp

    leaves = {k: inp[k].to(device, copy=True).requires_grad_() for k in ("yhat", "x", "w1", "w2")}
    out = fused_mlp(leaves["yhat"], leaves["x"], leaves["w1"], leaves["w2"], s, plan)
    out.backward(inp["g"].to(device))
    return out.detach().cpu(), {k: v.grad.cpu() for k, v in leaves.items()}


def _plan(spec: dict[str, Any]) -> Any:
    from reference.mlp import MLPPlan

    return MLPPlan(**spec["plan"]) if spec.get("plan") else None


def accuracy_check(spec: dict[str, Any]) -> dict[str, float]:
    """Output and the four gradients against fp64 autograd, as utilisation of the dtype's budget
    (``grad_x_is_grad_out``: 0 when dx is the upstream gradient bit for bit, else inf).

    Spec keys: batch, length, channels, expansion (2), dtype, seed, s (0.5), plan (fields),
    device ("cpu").
    """
    import torch.nn.functional as F

    import reference.mlp as mlp
    from grader.checks import forward_utilisation, grad_utilisation
    from grader.config import load_config

    mlp.POISON_OUTPUTS = True
    s = spec.get("s", 0.5)
    inp = _inputs(spec)
    out, grads = _step(inp, s, _plan(spec), spec.get("device", "cpu"))

    ref = {k: inp[k].double().requires_grad_() for k in ("yhat", "x", "w1", "w2")}
    ref_out = ref["x"] + s * F.linear(F.gelu(F.linear(ref["yhat"], ref["w1"])), ref["w2"])
    ref_out.backward(inp["g"].double())
    budget = load_config().budget(spec["dtype"])
    return {
        "forward": forward_utilisation(out, ref_out.detach(), budget),
        "grad_x_is_grad_out": 0.0 if torch.equal(grads["x"], inp["g"]) else math.inf,
        **{f"grad_{k}": grad_utilisation(grads[k], ref[k].grad, budget)
           for k in ("yhat", "w1", "w2")},
    }


def determinism_check(spec: dict[str, Any]) -> dict[str, float]:
    """Two steps on the same inputs into freshly allocated (poisoned) buffers: 0 per output
    that is bitwise identical across them, inf otherwise. Spec keys as `accuracy_check`."""
    import reference.mlp as mlp

    mlp.POISON_OUTPUTS = True
    inp = _inputs(spec)
    first, second = (_step(inp, spec.get("s", 0.5), _plan(spec), spec.get("device", "cpu"))
                     for _ in range(2))

    def same(a: torch.Tensor, b: torch.Tensor) -> float:
        return 0.0 if torch.equal(a.view(torch.uint8), b.view(torch.uint8)) else math.inf

    return {"out": same(first[0], second[0]),
            **{f"grad_{k}": same(first[1][k], second[1][k]) for k in ("yhat", "w1", "w2")}}


def identity_check(spec: dict[str, Any]) -> dict[str, float]:
    """Zero W1 and W2: out == x and dx == g bit for bit, dyhat, dW1, dW2 exactly 0 (0 per check
    that holds, inf otherwise). Spec keys as `accuracy_check`."""
    import reference.mlp as mlp

    mlp.POISON_OUTPUTS = True
    inp = _inputs(spec)
    inp["w1"] = torch.zeros_like(inp["w1"])
    inp["w2"] = torch.zeros_like(inp["w2"])
    out, grads = _step(inp, spec.get("s", 0.5), _plan(spec), spec.get("device", "cpu"))

    def exact(ok: bool) -> float:
        return 0.0 if ok else math.inf

    return {
        "out_is_x": exact(torch.equal(out, inp["x"])),
        "grad_x_is_grad_out": exact(torch.equal(grads["x"], inp["g"])),
        **{f"grad_{k}_zero": exact(not grads[k].any() and not grads[k].isnan().any())
           for k in ("yhat", "w1", "w2")},
    }


CHECKS = {"accuracy": accuracy_check, "determinism": determinism_check,
          "identity": identity_check}


def run(spec: dict[str, Any]) -> dict[str, float]:
    """Dispatch one spec by its ``kind``."""
    if spec["kind"] not in CHECKS:
        raise ValueError(f"spec kind={spec['kind']!r} is not one of {sorted(CHECKS)}")
    return CHECKS[spec["kind"]](spec)


# --- the interpreted spec groups, one subprocess each --------------------------------------------

# (batch, length): 1, 34, 33 and 63 rows, against the interpreter plan's 32-row tiles.
ROWS = ((1, 1), (2, 17), (3, 11), (1, 63))
CHANNELS = (3, 9, 16, 33)


def accuracy_specs(dtype: str) -> list[dict[str, Any]]:
    """C ∈ {3, 9, 16, 33} (one or several hidden chunks, the last partial), odd row counts."""
    specs = [{"kind": "accuracy", "batch": b, "length": length, "channels": c, "dtype": dtype,
              "seed": 100 * c + k}
             for i, c in enumerate(CHANNELS) for k in (0, 2)
             for b, length in (ROWS[(i + k) % len(ROWS)],)]
    # Expansion 1 (scoring.yaml's c12-e1 case) and 3 (H = 27: no multiple of any chunk).
    specs.append({"kind": "accuracy", "batch": 2, "length": 20, "channels": 12, "expansion": 1,
                  "dtype": dtype, "seed": 7, "s": 1.0})
    specs.append({"kind": "accuracy", "batch": 1, "length": 1, "channels": 9, "expansion": 3,
                  "dtype": dtype, "seed": 8})
    return specs


def plan_specs() -> list[dict[str, Any]]:
    """Plans the heuristic does not pick: several contraction steps over C (BLOCK_K < C), 16-unit
    chunks, three uneven row groups of 16-row tiles, more groups than tiles, "tf32x3" (the
    interpreter ignores the precision: plumbing only), "bf16x3", negative and zero residual
    scales."""
    small = {"block_m": 16, "block_n": 16, "block_k": 16, "num_warps": 1, "num_stages": 1,
             "dw_block_m": 16, "dw_num_warps": 1, "dw_groups": 3}
    base = {"kind": "accuracy", "batch": 2, "length": 37, "channels": 33, "dtype": "float32"}
    return [
        {**base, "seed": 31, "plan": small},
        {**base, "seed": 32, "plan": {**small, "dw_groups": 100}, "s": -1.5},
        {**base, "seed": 33, "plan": {**small, "fp32_precision": "tf32x3"}},
        {**base, "seed": 34, "dtype": "float16", "plan": small, "s": 0.0},
        # The bf16 split runs in the interpreter with the GPU's bf16 arithmetic: a real check.
        {**base, "seed": 38, "plan": {**small, "fp32_precision": "bf16x3", "block_n": 64},
         "s": -1.5},
    ] + resident_specs()


# The resident kernels on the interpreter's one "SM": two programs, each walking several tiles.
RESIDENT = {"block_m": 16, "block_n": 16, "block_k": 16, "num_warps": 1, "num_stages": 1,
            "dw_block_m": 16, "dw_num_warps": 1, "dw_groups": 3, "resident": True,
            "resident_warps": 1, "programs_per_sm": 2}


def resident_specs() -> list[dict[str, Any]]:
    """Resident plans: C = 33 (padded channels), H = 27 (padded units), 74 and 63 rows (partial
    last tiles), a negative scale, every dtype."""
    base = {"kind": "accuracy", "batch": 2, "length": 37, "channels": 33, "plan": RESIDENT}
    return [
        {**base, "seed": 35, "dtype": "float32"},
        {**base, "seed": 39, "dtype": "float32",
         "plan": {**RESIDENT, "fp32_precision": "bf16x3", "block_n": 64}},
        {**base, "seed": 36, "dtype": "bfloat16", "channels": 9, "expansion": 3},
        {**base, "seed": 37, "dtype": "float16", "batch": 1, "length": 63, "channels": 16,
         "plan": {**RESIDENT, "block_m": 32}, "s": -1.5},
    ]


def determinism_specs() -> list[dict[str, Any]]:
    chunked = {"block_m": 16, "block_n": 32, "block_k": 32, "dw_block_m": 16, "dw_groups": 2,
               "num_warps": 1, "dw_num_warps": 1, "num_stages": 1}
    return [{"kind": "determinism", "batch": 3, "length": 29, "channels": 33, "dtype": dtype,
             "seed": 41, "plan": plan}
            for dtype in DTYPE_NAMES for plan in (chunked, RESIDENT)]


def identity_specs() -> list[dict[str, Any]]:
    return [{"kind": "identity", "batch": 2, "length": 17, "channels": c, "dtype": dtype,
             "seed": 51, "s": s, **({"plan": RESIDENT} if c == 33 else {})}
            for dtype in DTYPE_NAMES for c, s in ((9, 0.5), (33, 1.0))]


def wide_specs() -> list[dict[str, Any]]:
    """Production width: C = 128, H = 256, 300 rows (slow in the interpreter)."""
    return [{"kind": "accuracy", "batch": 3, "length": 100, "channels": 128, "dtype": dtype,
             "seed": 61} for dtype in DTYPE_NAMES]


GROUPS = {
    **{f"accuracy-{dtype}": accuracy_specs(dtype) for dtype in DTYPE_NAMES},
    "plans": plan_specs(),
    "determinism": determinism_specs(),
    "identity": identity_specs(),
}


def _run_subprocess(specs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Run specs in a fresh interpreter-mode process and return its per-spec results."""
    return run_interpreted([__file__, json.dumps(specs)], TIMEOUT_S)


@pytest.fixture(scope="module")
def interpreted() -> Iterator[dict[str, Future[list[dict[str, float]]]]]:
    """Start every group's subprocess on a small pool up front; tests wait for their own."""
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    futures = {name: pool.submit(_run_subprocess, specs) for name, specs in GROUPS.items()}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def assert_within(specs: list[dict[str, Any]], results: list[dict[str, float]],
                  limit: float = MAX_UTILISATION) -> None:
    """Every check of every spec at most ``limit`` (of its budget; exact checks give 0 or inf)."""
    bad = [(spec, name, util) for spec, result in zip(specs, results, strict=True)
           for name, util in result.items() if not util <= limit]
    assert not bad, f"over {limit}: {bad}"


# --- interpreted kernel checks ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_fused_mlp_matches_fp64(interpreted: dict, dtype: str) -> None:
    """Output and all four gradients, C ∈ {3, 9, 16, 33}, expansions 1–3, partial row tiles."""
    name = f"accuracy-{dtype}"
    assert_within(GROUPS[name], interpreted[name].result(timeout=TIMEOUT_S * len(GROUPS)))


def test_fused_mlp_plans(interpreted: dict) -> None:
    """Multi-step contraction, small chunks, uneven and clamped row groups, tf32x3, s ∈ {−1.5, 0},
    and the resident kernels (`resident_specs`)."""
    assert_within(GROUPS["plans"], interpreted["plans"].result(timeout=TIMEOUT_S * len(GROUPS)))


def test_fused_mlp_weight_grads_are_deterministic(interpreted: dict) -> None:
    """Two runs into fresh buffers give the same bits (output, dyhat, dW1, dW2), every dtype."""
    result = interpreted["determinism"].result(timeout=TIMEOUT_S * len(GROUPS))
    assert_within(GROUPS["determinism"], result, limit=0.0)


def test_fused_mlp_zero_weight_identity(interpreted: dict) -> None:
    """Zero weights: out == x, dx == g bit for bit, the other gradients exactly 0, every dtype."""
    result = interpreted["identity"].result(timeout=TIMEOUT_S * len(GROUPS))
    assert_within(GROUPS["identity"], result, limit=0.0)


@pytest.mark.slow
def test_fused_mlp_production_width() -> None:
    """C = 128 (H = 256, several hidden chunks and row tiles) in every dtype."""
    assert_within(wide_specs(), _run_subprocess(wide_specs()))


def test_kernels_use_no_atomics() -> None:
    """Determinism on the GPU rests on this: partials are written, never accumulated atomically
    (the interpreter runs programs in order, so the runs above cannot show a race)."""
    import triton

    import reference.mlp as mlp

    kernels = [f for f in vars(mlp).values() if isinstance(f, triton.runtime.JITFunction)]
    assert len(kernels) >= 7
    assert not [k.__name__ for k in kernels if "atomic" in inspect.getsource(k.fn)]


# --- host-side checks (no kernel runs) ---------------------------------------------------------


def test_cpu_tensor_without_interpreter_is_refused() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("this process runs the interpreter")
    from reference.mlp import mlp_forward

    t = torch.randn(2, 3)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        mlp_forward(t, t, torch.randn(6, 3), torch.randn(3, 6), 0.5)


def test_launcher_validation_names_both_values() -> None:
    from reference.mlp import MAX_CHANNELS, mlp_forward

    t = torch.randn(2, 3)
    with pytest.raises(ValueError, match=r"w2.shape=\(6, 3\).*\(3, 6\)"):
        mlp_forward(t, t, torch.randn(6, 3), torch.randn(6, 3), 0.5)
    with pytest.raises(ValueError, match=r"yhat.dtype=torch.float16.*float32"):
        mlp_forward(t.half(), t, torch.randn(6, 3), torch.randn(3, 6), 0.5)
    wide = torch.randn(1, MAX_CHANNELS + 1)
    with pytest.raises(ValueError, match="MAX_CHANNELS"):
        mlp_forward(wide, wide, torch.randn(2, MAX_CHANNELS + 1), torch.randn(MAX_CHANNELS + 1, 2),
                    0.5)


def test_plan_validation() -> None:
    from reference.mlp import MLPPlan

    with pytest.raises(ValueError, match="block_m=8"):
        MLPPlan(block_m=8)
    with pytest.raises(ValueError, match="block_n=48"):
        MLPPlan(block_n=48)
    with pytest.raises(ValueError, match="dw_groups=0"):
        MLPPlan(dw_groups=0)
    with pytest.raises(ValueError, match="'tf32'"):
        MLPPlan(fp32_precision="tf32")
    with pytest.raises(ValueError, match="block_n=32 must be ≥ 64 under fp32_precision='bf16x3'"):
        MLPPlan(block_n=32, fp32_precision="bf16x3")
    with pytest.raises(ValueError, match="resident_warps=3"):
        MLPPlan(resident_warps=3)
    with pytest.raises(ValueError, match="programs_per_sm=0"):
        MLPPlan(programs_per_sm=0)
    MLPPlan(block_n=64, fp32_precision="bf16x3", resident=True)


def test_resident_fits_by_weight_bytes() -> None:
    """Both weights, padded to powers of two, within RESIDENT_WEIGHT_BYTES: the task's width in
    half precision (exactly 128 KiB), not in fp32; any dtype at small widths."""
    from reference.mlp import resident_fits

    assert resident_fits(torch.bfloat16, 128, 256) and resident_fits(torch.float16, 128, 256)
    assert not resident_fits(torch.float32, 128, 256)
    assert not resident_fits(torch.bfloat16, 129, 258)  # pads to 256 × 512
    assert resident_fits(torch.float32, 33, 66)


def test_heuristic_plan() -> None:
    from reference.mlp import heuristic_mlp_plan
    from reference.plans import DeviceInfo

    h200 = DeviceInfo(name="NVIDIA H200", sm_count=132, l2_bytes=60 * 2**20)
    rows = 64 * 8192
    fp32 = heuristic_mlp_plan(h200, torch.float32, rows, 128, 256)
    bf16 = heuristic_mlp_plan(h200, torch.bfloat16, rows, 128, 256)
    assert fp32.fp32_precision == "ieee" and fp32.block_k == 128
    assert bf16.block_m >= fp32.block_m
    # About two weight-gradient programs per SM, never more groups than row tiles.
    assert fp32.dw_groups * (256 // fp32.block_n) >= 2 * h200.sm_count
    assert heuristic_mlp_plan(h200, torch.float32, 10, 3, 6).dw_groups == 1
    assert heuristic_mlp_plan(h200, torch.float32, 10, 3, 6).block_k == 16


# --- GPU checks (in-process) ---------------------------------------------------------------------

GPU_SHAPES = [(dtype, precision) for dtype in DTYPE_NAMES
              for precision in ("ieee", "tf32x3", "bf16x3")
              if dtype == "float32" or precision == "ieee"]


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "precision"), GPU_SHAPES)
def test_gpu_production_shapes(dtype: str, precision: str) -> None:
    """C = 128 at 8·4096 rows and an odd 3·1000 + C = 33, each within half the budget, and
    dW1/dW2 bitwise reproducible (tf32x3 and bf16x3 are the accuracy claims this proves or
    refutes)."""
    from reference.mlp import heuristic_mlp_plan
    from reference.plans import device_info

    for batch, length, channels in ((8, 4096, 128), (3, 1000, 33)):
        plan = heuristic_mlp_plan(device_info("cuda"), getattr(torch, dtype), batch * length,
                                  channels, 2 * channels)
        chunks = {"block_n": max(plan.block_n, 64)} if precision == "bf16x3" else {}
        spec = {"batch": batch, "length": length, "channels": channels, "dtype": dtype,
                "seed": 71, "device": "cuda",
                "plan": {**asdict(plan), "fp32_precision": precision, **chunks}}
        assert_within([spec], [accuracy_check(spec)])
        assert_within([spec], [determinism_check(spec)], limit=0.0)
        assert_within([spec], [identity_check(spec)], limit=0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_resident_production_shapes(dtype: str) -> None:
    """The resident kernels (weights on chip, act and da stored) at C = 128 over 8·4096 rows and
    an odd 3·1000 rows with C = 33: within half the budget, bitwise reproducible, the identity."""
    from reference.mlp import heuristic_mlp_plan, resident_fits
    from reference.plans import device_info

    assert resident_fits(getattr(torch, dtype), 128, 256)
    for batch, length, channels in ((8, 4096, 128), (3, 1000, 33)):
        plan = heuristic_mlp_plan(device_info("cuda"), getattr(torch, dtype), batch * length,
                                  channels, 2 * channels)
        spec = {"batch": batch, "length": length, "channels": channels, "dtype": dtype,
                "seed": 72, "device": "cuda",
                "plan": {**asdict(plan), "resident": True, "block_m": 64}}
        assert_within([spec], [accuracy_check(spec)])
        assert_within([spec], [determinism_check(spec)], limit=0.0)
        assert_within([spec], [identity_check(spec)], limit=0.0)


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        _gpu_bf16_semantics()
    print(json.dumps([run(spec) for spec in json.loads(sys.argv[1])]))
