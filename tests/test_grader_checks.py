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
