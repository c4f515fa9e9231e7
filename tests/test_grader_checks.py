"""The gate's numeric and exact checks, and the identity, drift and case expansion."""

from __future__ import annotations

import math

import torch

from grader.checks import exact_check, forward_check, rel_l2_check
from grader.config import Budget, load_config
from grader.gate import build_items, item_inputs

BUDGET = Budget(forward_atol=2e-4, forward_rtol=0.0, grad_rel=3e-3, drift_rel=3e-3)


def test_forward_check_utilisation_and_detail() -> None:
    ref = torch.zeros(2, 3, dtype=torch.float64)
    out = torch.zeros(2, 3)
    out[1, 2] = 1e-4
    ok = forward_check(out, ref, BUDGET)
    assert ok.passed and math.isclose(ok.utilisation, 0.5, rel_tol=1e-3)
    out[0, 1] = 1e-3
    bad = forward_check(out, ref, BUDGET)
    assert not bad.passed and "(0, 1)" in bad.detail and "expected 0" in bad.detail


def test_non_finite_fails_every_check() -> None:
    ref = torch.ones(4, dtype=torch.float64)
    out = torch.tensor([1.0, float("nan"), 1.0, float("inf")])
    assert not forward_check(out, ref, BUDGET).passed
    assert "2 of 4" in rel_l2_check("grad_x", out, ref, 1.0).detail


def test_rel_l2_of_a_zero_reference_allows_rounding_noise_only() -> None:
    ref = torch.zeros(100, dtype=torch.float64)
    assert rel_l2_check("g", torch.full((100,), 1e-9), ref, 3e-3).passed
    assert not rel_l2_check("g", torch.full((100,), 1e-3), ref, 3e-3).passed


def test_exact_check_is_bitwise() -> None:
    a = torch.tensor([1.0, -0.0, 2.0])
    assert exact_check("x", a, torch.tensor([1.0, 0.0, 2.0])).passed
    assert not exact_check("x", a, torch.tensor([1.0, 0.0, 2.0 + 2**-22])).passed
    assert not exact_check("x", a.half(), a).passed


def test_items_identity_and_drift() -> None:
    config = load_config()
    items = build_items(config.smoke_cases(), config.correctness.drift.cases[:1])
    kinds = [i.kind for i in items]
    assert kinds.count("identity") == len({c.dtype for c in config.smoke_cases()})
    assert kinds[-1] == "drift"
    identity = next(i for i in items if i.kind == "identity")
    inputs = item_inputs(identity, secret=123)
    assert not inputs.fc1_weight.any() and not inputs.fc2_weight.any()
    assert inputs.conv_weight.any()


def test_secret_changes_the_values() -> None:
    config = load_config()
    (item, *_) = build_items(config.smoke_cases()[:1], ())
    a, b = item_inputs(item, 1), item_inputs(item, 2)
    assert not torch.equal(a.x, b.x)
    assert torch.equal(a.x, item_inputs(item, 1).x)


def _evidence(gen: torch.Generator, dtype: torch.dtype, zero_grad: bool) -> dict:
    from grader.child.steps import EVIDENCE

    shapes = {"out": (2, 16, 8), "grad_x": (2, 16, 8), "grad_conv": (8, 1, 3),
              "grad_fc1": (16, 8), "grad_fc2": (8, 16)}
    out = {k: (100 * torch.randn(shapes[k], generator=gen)).to(dtype) for k in EVIDENCE[:5]}
    if zero_grad:
        out["grad_conv"] = torch.zeros(shapes["grad_conv"], dtype=dtype)
    return out


def test_the_timed_checks_and_the_gate_share_one_formula() -> None:
    """`grader.child.steps.compare` (the baselines process's timed check) and the gate's
    `forward_check` / `rel_l2_check` give the same utilisations on the same evidence, bf16 and
    fp32, a zero reference gradient (the norm floor) and a non-finite answer included: before,
    the timed check ran the forward in fp32 and floored the norm at 1e-300, not 1e-6 per
    element."""
    from grader.child.steps import EVIDENCE, compare

    gen = torch.Generator().manual_seed(0)
    budget = {"forward_atol": 1e-2, "forward_rtol": 1e-2, "grad_rel": 1e-2}
    gate_budget = Budget(forward_atol=1e-2, forward_rtol=1e-2, grad_rel=1e-2, drift_rel=1e-2)
    for dtype in (torch.float32, torch.bfloat16):
        for zero_grad in (False, True):
            want = _evidence(gen, dtype, zero_grad)
            got = {k: v + (1e-3 * torch.randn(v.shape, generator=gen)).to(dtype)
                   for k, v in want.items()}
            if zero_grad:
                got["grad_conv"] = torch.full_like(got["grad_conv"], 1e-9)
            for bad in (False, True):
                if bad:
                    got["out"].view(-1)[3] = float("nan")
                    got["grad_fc1"].view(-1)[0] = float("inf")
                timed = compare(torch, got, want, budget).tolist()
                gate = [forward_check(got["out"], want["out"], gate_budget).utilisation]
                gate += [rel_l2_check(k, got[k], want[k], gate_budget.grad_rel).utilisation
                         for k in EVIDENCE[1:5]]
                assert timed == gate, (dtype, zero_grad, bad, timed, gate)
