"""The timing rounds' inputs (`grader.child_timing.ShapeRunner.new_values`) on the CPU.

Same tensors every round, new values from the harness's generator, and structure along length and
across examples, so a statistic that is only right on i.i.d. data fails the timed steps' checks.
"""

from __future__ import annotations

import pytest
import torch

from grader.child_timing import ShapeRunner
from task.model import DilatedResidualBlock

BATCH, LENGTH, CHANNELS = 6, 256, 16


def _runner(seed: int, dtype: str = "float32") -> ShapeRunner:
    blocks = {name: DilatedResidualBlock(CHANNELS, 2).to(getattr(torch, dtype))
              for name in ("plain", "ref", "sub")}
    shape = {"batch": BATCH, "length": LENGTH, "dilation": 2, "dtype": dtype}
    return ShapeRunner(torch, blocks, shape, {"channels": CHANNELS, "expansion": 2}, seed,
                       timer=None, flush=lambda: None, device="cpu")


def test_new_values_in_place_deterministic_and_fresh() -> None:
    a, b = _runner(7), _runner(7)
    pointers = [t.data_ptr() for t in (a.x, a.grad_out, *a.params["sub"])]
    a.new_values()
    b.new_values()
    assert torch.equal(a.x, b.x) and torch.equal(a.grad_out, b.grad_out)
    first = a.x.detach().clone()
    a.new_values()
    assert not torch.equal(a.x, first)
    assert [t.data_ptr() for t in (a.x, a.grad_out, *a.params["sub"])] == pointers
    # Three blocks, one set of weights; the snapshot is what the checks compare against.
    for name in ("ref", "sub"):
        assert all(torch.equal(p, q) for p, q in zip(a.params[name], a.params["plain"],
                                                     strict=True))
    assert torch.equal(a.snap[0], a.x.detach())


def test_new_values_are_not_iid() -> None:
    runner = _runner(8)
    runner.new_values()
    x, grad_out = runner.x.detach().double(), runner.grad_out.double()
    head = x[:, : LENGTH // 4]  # before every ramp's start row
    scale = head.std(dim=(1, 2))
    # Each example has its own scale, log-uniform in [1/4, 4]; grad_out follows it.
    assert scale.max() / scale.min() > 2.0, scale
    assert ((scale > 0.2) & (scale < 4.5)).all(), scale
    torch.testing.assert_close(grad_out[:, : LENGTH // 4].std(dim=(1, 2)), scale, rtol=0.1,
                               atol=0.0)
    # From a row in [L/4, 3L/4) the offset ramps to ±50 times the example's scale.
    tail = x[:, -4:].mean(dim=(1, 2)).abs() / scale
    assert (tail > 35.0).all() and (tail < 60.0).all(), tail
    assert head.mean(dim=(1, 2)).abs().max() < 0.5
    # The conv taps share a common 1/3, so the ramp moves every channel's conv output alike.
    conv = runner.params["plain"][0].detach()
    assert abs(conv.mean().item() - 1.0 / 3.0) < 0.1
    assert x.abs().max() < 300.0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_new_values_in_half_precision(dtype: str) -> None:
    runner = _runner(9, dtype)
    runner.new_values()
    assert runner.x.dtype == getattr(torch, dtype)
    assert torch.isfinite(runner.x.float()).all() and torch.isfinite(runner.grad_out.float()).all()
