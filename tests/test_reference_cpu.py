"""CPU tests of the reference kernels through the Triton interpreter, plus the plan interface.

The whole-block tests here are the ceiling's (`reference.ceiling.CeilingBlock`); the scoring
block's are in tests/test_reference_block.py.

Every interpreted group of checks goes to its own subprocess (`tests/reference_runner.py`) with
``TRITON_INTERPRET=1`` and a timeout: the interpreter must be enabled before the kernels are
imported, and it detects no out-of-bounds access, so a bad index can corrupt the heap of the
process that runs it. The interpreter runs one program per example (its programs execute one
after another, so a multi-program barrier would wait forever); the GPU tests cover groups.
Budgets are scoring.yaml's; every check must stay within half of its budget. The subprocesses
start together on a two-worker pool (the CI machine has two cores), each test waits for its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from interpreted import run_interpreted

from reference.norm_grad import MIN_EXAMPLE_ELEMENTS
from reference.plans import (
    DeviceInfo,
    Plan,
    PlanTable,
    heuristic_plan,
    load_table,
    plan_for,
    save_table,
    shape_class,
)

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "reference_runner.py"
TIMEOUT_S = 180
MAX_UTILISATION = 0.5
# The CI machine has 2 cores: two interpreter processes at a time.
WORKERS = 2


def _run_subprocess(specs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Run specs in a fresh interpreter-mode process and return its per-spec utilisations."""
    return run_interpreted([str(RUNNER), json.dumps(specs)], TIMEOUT_S)


# --- the interpreted spec groups, one subprocess each --------------------------------------------

LENGTHS = (1, 2, 9, 33)
KERNEL_GRID = [(dtype, channels) for dtype in ("float32", "float16") for channels in (1, 3, 5, 16)]
SMOKE_CASES = ["c1-l1", "c3-l2", "c5-l9-d4", "c8-l17-d20", "c7-l33-d2-f16", "c16-l1024-offset",
               "c12-l40-e1", "c33-l96-d3-ramp", "c31-l64-d2-burst", "c17-l32-b3-outlier",
               "drift-c9-l20-d3"]


def kernel_specs(dtype: str, channels: int) -> list[dict[str, Any]]:
    """Lengths 1–33, dilation 1, 4 and beyond the length (once where 4 is already beyond)."""
    pairs = [(length, dilation) for length in LENGTHS
             for dilation in sorted({1, 4, length + 3})]
    return [
        {"kind": "kernel", "batch": 1 + i % 3, "length": length, "channels": channels,
         "dilation": dilation, "dtype": dtype, "family": "normal", "seed": 100 * channels + i}
        for i, (length, dilation) in enumerate(pairs)
    ]


def offset_specs() -> list[dict[str, Any]]:
    return [
        {"kind": "kernel", "batch": 2, "length": 64, "channels": 16, "dilation": dilation,
         "dtype": "float32", "family": "offset", "seed": 7 + dilation}
        for dilation in (1, 4)
    ]


def split_specs() -> list[dict[str, Any]]:
    small = {"fwd_block_rows": 8, "bwd_block_rows": 4, "block_c": 4, "fwd_group": 1,
             "bwd_group": 1}
    return [
        {"kind": "kernel", "batch": 2, "length": 17, "channels": 6, "dilation": dilation,
         "dtype": "float32", "family": "normal", "seed": 11 + dilation, "plan": small}
        for dilation in (1, 5, 20)
    ]


def taps_specs() -> list[dict[str, Any]]:
    """The taps loaded once per program (Plan.taps_once) over several tiles of one channel
    block, the only layout where it changes the code; fp32 normal and offset, fp16."""
    plan = {"fwd_block_rows": 4, "bwd_block_rows": 4, "block_c": 16, "fwd_group": 1,
            "bwd_group": 1, "taps_once": 1}
    return [
        {"kind": "kernel", "batch": 2, "length": 33, "channels": 16, "dilation": dilation,
         "dtype": dtype, "family": family, "seed": 31 + dilation, "plan": plan}
        for dtype, family in (("float32", "normal"), ("float32", "offset"),
                              ("float16", "normal"))
        for dilation in (1, 5)
    ]


# The loop kernels (Plan.fwd_chain = bwd_chain = 0), which the heuristic no longer picks up to
# 128 channels: the kernel grid's lengths and dilations again, fp32 and fp16.
LOOP_PLAN = {"fwd_block_rows": 32, "bwd_block_rows": 32, "fwd_group": 1, "bwd_group": 1}


def loop_specs(dtype: str) -> list[dict[str, Any]]:
    return [{**spec, "plan": LOOP_PLAN} for channels in (3, 16)
            for spec in kernel_specs(dtype, channels)]


def chain_plan(rows: int) -> dict[str, int]:
    return {"fwd_block_rows": rows, "bwd_block_rows": rows, "fwd_num_warps": 1,
            "bwd_num_warps": 1, "fwd_group": 1, "bwd_group": 1, "fwd_chain": 1, "bwd_chain": 1}


def chain_specs() -> list[dict[str, Any]]:
    """The chain kernels with short tiles (2 and 4 positions), so chains span several tiles and
    the halo rows come from the neighbouring tiles: channels a power of two (16, 128, one
    warp's full width) and not (6, 33: masked channels), dilations 1, 3 and beyond the length,
    fp32 normal and offset, fp16; and one pass on each family."""
    specs = []
    for i, (channels, length, dilation, dtype, family, rows) in enumerate([
            (16, 37, 1, "float32", "normal", 4), (16, 37, 3, "float32", "offset", 2),
            (6, 23, 2, "float32", "normal", 4), (33, 19, 1, "float16", "normal", 2),
            (33, 10, 12, "float32", "normal", 4), (128, 12, 2, "float32", "normal", 4),
            (128, 9, 1, "float16", "normal", 2)]):
        specs.append({"kind": "kernel", "batch": 2, "length": length, "channels": channels,
                      "dilation": dilation, "dtype": dtype, "family": family, "seed": 60 + i,
                      "plan": chain_plan(rows)})
    for fwd, bwd in ((1, 0), (0, 1)):
        plan = {**LOOP_PLAN, "fwd_block_rows": 4, "bwd_block_rows": 4}
        for pass_, chain in (("fwd", fwd), ("bwd", bwd)):
            if chain:
                plan.update({f"{pass_}_chain": 1, f"{pass_}_num_warps": 1})
        specs.append({"kind": "kernel", "batch": 3, "length": 21, "channels": 12,
                      "dilation": 2, "dtype": "float32", "family": "normal", "seed": 70 + fwd,
                      "plan": plan})
    return specs


def block_specs(case: str) -> list[dict[str, Any]]:
    from grader.config import load_config

    cfg = load_config()
    seeds = {c.name: c.seeds for c in (*cfg.correctness.cases, *cfg.correctness.drift.cases)}
    return [{"kind": "block", "case": case, "seed": seed, "block": "ceiling"}
            for seed in seeds[case]]


def identity_specs() -> list[dict[str, Any]]:
    return [
        {"kind": "identity", "batch": 2, "length": 9, "channels": 5, "dilation": 2,
         "dtype": dtype, "seed": 3, "block": "ceiling"}
        for dtype in ("float32", "float16")
    ]


def residual_specs() -> list[dict[str, Any]]:
    """Both kernel families (the heuristic's chain kernels, then the loop kernels)."""
    return [{"kind": "residual", "batch": 2, "length": 9, "channels": 5, "dilation": d,
             "seed": 21 + d, **extra} for d in (1, 4) for extra in ({}, {"plan": LOOP_PLAN})]


def skip_specs() -> list[dict[str, Any]]:
    """The block's fused residual gradient against autograd's add: both kernel families, fp32
    and bf16, dilations 1 and 4 (spans of several tiles)."""
    return [{"kind": "skip", "batch": 2, "length": 11, "channels": 6, "dilation": d,
             "dtype": dtype, "seed": 31 + d, **extra}
            for d in (1, 4) for dtype in ("float32", "bfloat16")
            for extra in ({}, {"plan": LOOP_PLAN})]


# scoring.yaml cases for both of the block's normalization backwards: c1 and c2 from the MLP
# (`reference.norm_grad`) forced on examples below its size floor, and from the backward's own
# first pass (``norm_grad_from_mlp`` False); the offset family, uneven and short examples, fp16
# and the drift case; then the identity in three dtypes, each way.
NORM_GRAD_CASES = ["c16-l1024-offset", "c33-l96-d3-ramp", "c31-l64-d2-burst", "c12-l40-e1",
                   "c7-l33-d2-f16", "c8-l17-d20", "drift-c9-l20-d3"]
NORM_GRAD_WAYS = ({"norm_grad_min_elements": 0}, {"norm_grad_from_mlp": False})


def norm_grad_specs() -> list[dict[str, Any]]:
    specs = [{**spec, **way} for way in NORM_GRAD_WAYS
             for case in NORM_GRAD_CASES for spec in block_specs(case)[:1]]
    specs += [{"kind": "identity", "batch": 2, "length": 9, "channels": 5, "dilation": 2,
               "dtype": dtype, "seed": 3, "block": "ceiling", **way}
              for dtype in ("float32", "bfloat16", "float16") for way in NORM_GRAD_WAYS]
    # The GELU backward's kernel alone: rows not a multiple of its row block, hidden widths
    # over several column blocks.
    specs += [{"kind": "norm_grad_sums", "batch": 2, "length": 45, "channels": 6,
               "hidden": hidden, "dtype": dtype, "seed": 50 + hidden}
              for dtype in ("float32", "bfloat16", "float16") for hidden in (12, 130)]
    # The default's choice at the size floor: 4 × 1024 values and one row fewer.
    specs += [{"kind": "norm_way", "batch": 2, "length": length, "channels": 4, "dilation": 3,
               "dtype": "float32", "seed": 61}
              for length in (MIN_EXAMPLE_ELEMENTS // 4, MIN_EXAMPLE_ELEMENTS // 4 - 1)]
    # h over ±40: the tails, where Φ is 0 or 1 and e^(−h²/2) underflows.
    specs += [{"kind": "norm_grad_sums", "batch": 2, "length": 20, "channels": 6,
               "hidden": 40, "dtype": dtype, "seed": 59, "h_scale": 10.0}
              for dtype in ("float32", "bfloat16")]
    return specs


def all_groups() -> dict[str, list[dict[str, Any]]]:
    groups = {f"kernel-{d}-{c}": kernel_specs(d, c) for d, c in KERNEL_GRID}
    groups["offset"] = offset_specs()
    groups["split"] = split_specs()
    groups["taps"] = taps_specs()
    groups.update({f"loop-{dtype}": loop_specs(dtype) for dtype in ("float32", "float16")})
    groups["chain"] = chain_specs()
    groups.update({f"block-{case}": block_specs(case) for case in SMOKE_CASES})
    groups["identity"] = identity_specs()
    groups["residual"] = residual_specs()
    groups["skip"] = skip_specs()
    groups["norm-grad"] = norm_grad_specs()
    return groups


@pytest.fixture(scope="module")
def interpreted() -> Iterator[dict[str, Future[list[dict[str, float]]]]]:
    """Start every group's subprocess on a small pool up front; tests wait for their own."""
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    futures = {name: pool.submit(_run_subprocess, specs) for name, specs in all_groups().items()}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def results_of(interpreted: dict[str, Future], name: str) -> list[dict[str, float]]:
    return interpreted[name].result(timeout=TIMEOUT_S * len(interpreted))


def assert_within(specs: list[dict[str, Any]], results: list[dict[str, float]]) -> None:
    """Every check of every spec at most MAX_UTILISATION of its budget."""
    bad = [
        (spec, name, util)
        for spec, result in zip(specs, results, strict=True)
        for name, util in result.items()
        if not util <= MAX_UTILISATION
    ]
    assert not bad, f"over {MAX_UTILISATION} of budget: {bad}"


# --- interpreted kernel checks ---------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "channels"), KERNEL_GRID)
def test_conv_norm_matches_fp64(interpreted: dict, dtype: str, channels: int) -> None:
    """Lengths 1–33, dilation 1, 4 and beyond the length, batch 1–3, poisoned outputs."""
    assert_within(kernel_specs(dtype, channels),
                  results_of(interpreted, f"kernel-{dtype}-{channels}"))


def test_conv_norm_offset_family(interpreted: dict) -> None:
    """x ≈ 1000 + N(0, 1) with nearly equal taps: the shifted Chan combine must not cancel."""
    assert_within(offset_specs(), results_of(interpreted, "offset"))


def test_conv_norm_split_channels_and_residues(interpreted: dict) -> None:
    """Plans whose tiles split the channels (SPLIT_C path) or stack several residues."""
    assert_within(split_specs(), results_of(interpreted, "split"))


def test_conv_norm_taps_once(interpreted: dict) -> None:
    """Taps loaded once per program, over several tiles: within budget like the rest."""
    assert_within(taps_specs(), results_of(interpreted, "taps"))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_conv_norm_loop_kernels(interpreted: dict, dtype: str) -> None:
    """The loop kernels over the kernel grid's lengths and dilations (3 and 16 channels)."""
    assert_within(loop_specs(dtype), results_of(interpreted, f"loop-{dtype}"))


def test_conv_norm_chain_kernels(interpreted: dict) -> None:
    """The chain kernels over several tiles a chain, masked and full-width channels, fp32
    normal and offset, fp16, and each pass alone beside the loop kernel's other pass."""
    assert_within(chain_specs(), results_of(interpreted, "chain"))


CHAIN_VS_LOOP = r"""
import json, math, torch
from reference.conv_norm import conv_norm_backward, conv_norm_forward
from reference.plans import Plan
loop = Plan(fwd_block_rows=4, bwd_block_rows=4, fwd_group=1, bwd_group=1)
def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
out = []
for dtype, (batch, length, channels, dilation, rows) in [
        (torch.float32, (2, 17, 8, 3, 4)), (torch.float32, (2, 33, 5, 1, 8)),
        (torch.float32, (3, 40, 33, 20, 8)), (torch.float32, (1, 1, 1, 1, 8)),
        (torch.float32, (2, 9, 128, 12, 4)), (torch.float16, (2, 70, 100, 2, 16))]:
    gen = torch.Generator().manual_seed(batch * length + channels)
    x = (torch.randn(batch, length, channels, generator=gen) + 0.5).to(dtype)
    w = (torch.randn(channels, 1, 3, generator=gen) / math.sqrt(3)).to(dtype)
    g = torch.randn(batch, length, channels, generator=gen).to(dtype)
    res = torch.randn(batch, length, channels, generator=gen).to(dtype)
    chain = Plan(fwd_block_rows=rows, bwd_block_rows=rows, fwd_num_warps=1, bwd_num_warps=1,
                 fwd_group=1, bwd_group=1, fwd_chain=1, bwd_chain=1)
    y1, m1, r1 = conv_norm_forward(x, w, dilation, 1e-5, loop)
    y2, m2, r2 = conv_norm_forward(x, w, dilation, 1e-5, chain)
    dx1, dw1 = conv_norm_backward(g, x, w, m1, r1, dilation, loop, res)
    dx2, dw2 = conv_norm_backward(g, x, w, m1, r1, dilation, chain, res)
    out.append({"yhat": rel(y2, y1), "mean": rel(m2, m1), "rstd": rel(r2, r1),
                "dx": rel(dx2, dx1), "dw": rel(dw2, dw1)})
print(json.dumps(out))
"""


def test_chain_kernels_match_the_loop_kernels() -> None:
    """Far inside the fp64 budgets: the two families agree to fp32 rounding (the moments are
    summed over other tiles), and fp16 to one rounding of its outputs; with the residual
    gradient, dilations below, at and beyond the length, channels masked and full, one row."""
    results = run_interpreted(["-c", CHAIN_VS_LOOP], timeout=TIMEOUT_S)
    assert len(results) == 6
    for i, result in enumerate(results):
        bound = 1e-6 if i < 5 else 2e-3
        assert all(v <= bound for v in result.values()), (i, result)


TAPS_BITWISE = r"""
import json, math, torch
from reference.conv_norm import conv_norm_backward, conv_norm_forward
from reference.plans import Plan
out = []
for dtype in (torch.float32, torch.float16):
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 21, 16, generator=gen) + 3).to(dtype)
    w = (torch.randn(16, 1, 3, generator=gen) / math.sqrt(3)).to(dtype)
    g = torch.randn(2, 21, 16, generator=gen).to(dtype)
    runs = []
    for taps_once in (0, 1):
        plan = Plan(fwd_block_rows=4, bwd_block_rows=2, block_c=16, fwd_group=1, bwd_group=1,
                    taps_once=taps_once)
        yhat, mean, rstd = conv_norm_forward(x, w, 2, 1e-5, plan)
        runs.append((yhat, mean, rstd, *conv_norm_backward(g, x, w, mean, rstd, 2, plan, g)))
    out.append(all(torch.equal(a, b) for a, b in zip(*runs)))
print(json.dumps(out))
"""


def test_taps_once_changes_no_arithmetic() -> None:
    """Plan.taps_once moves the taps' load out of the tile loops, nothing else: every output,
    forward and backward (residual gradient included), is bitwise the same either way."""
    assert run_interpreted(["-c", TAPS_BITWISE], timeout=TIMEOUT_S) == [True, True]


# --- interpreted block checks ------------------------------------------------------------------


@pytest.mark.parametrize("case", SMOKE_CASES)
def test_block_matches_oracle(interpreted: dict, case: str) -> None:
    """The ceiling block's output and four gradients on scoring.yaml's smoke cases."""
    assert_within(block_specs(case), results_of(interpreted, f"block-{case}"))


def test_smoke_cases_are_all_interpreted() -> None:
    """Every smoke case of scoring.yaml (the ones a CPU grade runs) is in SMOKE_CASES."""
    from grader.config import load_config

    cfg = load_config()
    smoke = {c.name for c in (*cfg.correctness.cases, *cfg.correctness.drift.cases) if c.smoke}
    assert smoke == set(SMOKE_CASES), (sorted(smoke - set(SMOKE_CASES)),
                                       sorted(set(SMOKE_CASES) - smoke))


def test_block_zero_weight_identity(interpreted: dict) -> None:
    """fc weights zero ⇒ out == x, x.grad == grad_out bit for bit, other grads exactly 0."""
    for result in results_of(interpreted, "identity"):
        assert all(v == 0.0 for v in result.values()), result


def test_backward_residual_grad(interpreted: dict) -> None:
    """The launcher's residual_grad is added into dx in-kernel and leaves dw alone."""
    assert_within(residual_specs(), results_of(interpreted, "residual"))


def test_block_fuses_the_residual_gradient(interpreted: dict) -> None:
    """The block hands the skip's gradient to the conv+norm backward kernel (no separate add):
    x.grad within four roundings of autograd's add, everything else bit for bit the same."""
    assert_within(skip_specs(), results_of(interpreted, "skip"))


def test_norm_grad(interpreted: dict) -> None:
    """The GELU backward's dh, c1 and c2 (`reference.norm_grad`) within 4 roundings of fp64, and
    both of the block's normalization backwards (c1, c2 from the MLP on small examples too, and
    from a pass of its own): scoring.yaml cases within half of each budget, the identity bit for
    bit."""
    specs = norm_grad_specs()
    results = results_of(interpreted, "norm-grad")
    within = [(s, r) for s, r in zip(specs, results, strict=True) if s["kind"] != "identity"]
    assert_within([s for s, _ in within], [r for _, r in within])
    for spec, result in zip(specs, results, strict=True):
        if spec["kind"] == "identity":
            assert all(v == 0.0 for v in result.values()), (spec, result)


# --- host-side checks (no kernel runs) ---------------------------------------------------------


def test_cpu_tensor_without_interpreter_is_refused() -> None:
    """No silent PyTorch fallback: a CPU tensor without TRITON_INTERPRET is a ValueError."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("this process runs the interpreter")
    from reference.conv_norm import conv_norm_forward

    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        conv_norm_forward(torch.randn(1, 4, 3), torch.randn(3, 1, 3), 1, 1e-5)


def test_launcher_validation_names_both_values() -> None:
    from reference.conv_norm import conv_norm_forward

    with pytest.raises(ValueError, match=r"weight.shape=\(4, 1, 3\).*\(3, 1, 3\)"):
        conv_norm_forward(torch.randn(1, 4, 3), torch.randn(4, 1, 3), 1, 1e-5)
    with pytest.raises(ValueError, match="dilation=0"):
        conv_norm_forward(torch.randn(1, 4, 3), torch.randn(3, 1, 3), 0, 1e-5)


def test_plan_validation() -> None:
    with pytest.raises(ValueError, match="block_c=96"):
        Plan(block_c=96)
    with pytest.raises(ValueError, match="fwd_group=0"):
        Plan(fwd_group=0)
    with pytest.raises(ValueError, match="unknown Plan fields"):
        Plan.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="taps_once=2 must be 0 or 1"):
        Plan(taps_once=2)
    # Tables written before the field existed load with the taps loaded per tile.
    assert Plan.from_dict({"fwd_group": 4}).taps_once == 0
    with pytest.raises(ValueError, match="fwd_chain=2 must be 0 or 1"):
        Plan(fwd_chain=2)
    # The chain kernels run one warp a program: a plan that says otherwise is refused.
    with pytest.raises(ValueError, match="bwd_num_warps=4 must be 1 with bwd_chain=1"):
        Plan(bwd_chain=1, bwd_num_warps=4)
    # ... and tables written before the chain kernels load on the loop kernels.
    old = Plan.from_dict({"fwd_group": 4})
    assert (old.fwd_chain, old.bwd_chain) == (0, 0)


def test_shape_class_buckets() -> None:
    assert shape_class(32, 4096, 128, 1).key == "c128-l4096-d1-b32"
    assert shape_class(3, 1000, 100, 7).key == "c128-l1024-d8-b4"
    # Every dilation at or beyond the length behaves alike: capped at the length bucket.
    assert shape_class(2, 129, 33, 200).key == shape_class(2, 129, 33, 5000).key


def test_table_roundtrip_and_lookup(tmp_path: Path) -> None:
    plan = Plan(fwd_group=12, bwd_group=20)
    cls = shape_class(32, 4096, 128, 1)
    table = PlanTable(meta={"gpu": "X", "torch": "t", "triton": "3.6.0", "date": "d",
                            "method": "test"}, plans={"float32": {cls.key: plan}})
    path = tmp_path / "x.json"
    save_table(path, table)
    loaded = load_table(path)
    assert loaded.lookup(torch.float32, cls) == plan
    assert loaded.lookup(torch.bfloat16, cls) is None


def test_committed_tables_load() -> None:
    for path in (ROOT / "reference" / "plans").glob("*.json"):
        load_table(path)


def test_heuristic_and_plan_for() -> None:
    h200 = DeviceInfo(name="NVIDIA H200", sm_count=132, l2_bytes=60 * 2**20)
    plan = heuristic_plan(h200, torch.float32, 32, 4096, 128, 1)
    assert 1 <= plan.fwd_group <= h200.sm_count and 1 <= plan.bwd_group <= h200.sm_count
    # Up to 128 channels both passes on the chain kernels, one warp, 8 positions a tile.
    assert (plan.fwd_chain, plan.bwd_chain, plan.fwd_num_warps, plan.bwd_num_warps) == (1, 1, 1, 1)
    assert (plan.fwd_block_rows, plan.bwd_block_rows, plan.fwd_group) == (8, 8, 33)
    # Beyond, the loop kernels; taps once per program for 2-byte dtypes only (Plan.taps_once).
    wide = heuristic_plan(h200, torch.float32, 32, 4096, 256, 1)
    assert (wide.fwd_chain, wide.bwd_chain, wide.taps_once) == (0, 0, 0)
    assert heuristic_plan(h200, torch.bfloat16, 32, 4096, 256, 1).taps_once == 1
    assert heuristic_plan(h200, torch.float16, 32, 4096, 256, 1).taps_once == 1
    # On the CPU there is no L2 to size groups by: one program per example.
    cpu = plan_for("cpu", torch.float16, 2, 33, 7, 2)
    assert cpu.fwd_group == 1 and cpu.bwd_group == 1
