"""Known bad: the plain PyTorch block, after switching the rule guard off through traceback frames.

The forward raises and catches an exception and walks its traceback's frames outwards
(``tb.tb_frame.f_back``: no ``sys._getframe``, no ``gc``, so no audit event) to the harness, whose
``guard`` it disarms: its op, launch and autograd checks become no-ops, and so does the method
that records a finding; what it had found is cleared. Then the block runs as the frozen PyTorch
block (``F.conv1d``, ``torch.var_mean``...), wrapped in one autograd.Function only so that the
backward, too, is the submission's code: no Triton kernel at all.

The trick, by an author who has read grader/child_rules.py and grader/child_gate.py as they were
at commit 391bd45: every run-time rule was a method of one object reachable from the harness's
frame. Against that grader the CPU grade of the CI cases passed (``checked_untimed``). Reading the
census too (issue #13), the author also stops the census's profiler around the PyTorch work of
each step and restarts it as the census does (``census._enable``, so the session's start time is
the census's own); but the step's range, opened by the harness before the step, is then missing
from the profile, and a range the submission opened in its place would not carry the nonce whose
hash the parent already holds. Expected: rule_broken, census-tampered.
"""

import sys

import torch
import torch.nn.functional as F
from torch import nn

EXPECTED = "fail:rule_broken:census-tampered"


def _harness():
    """The first object up the stack that holds a ``guard`` (the gate's Harness), or None."""
    try:
        raise LookupError
    except LookupError:
        frame = sys.exc_info()[2].tb_frame
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "guard"):
            return owner
        frame = frame.f_back
    return None


def _disarm(harness):
    guard = harness.guard
    for name in ("check_ops", "check_launches", "check_autograd", "check_module", "_add"):
        setattr(guard, name, lambda *args, **kwargs: None)
    guard.findings.clear()


class _Blind:
    """Around PyTorch work: the census's profiler stopped, then restarted the census's way."""

    def __enter__(self):
        harness = _harness()
        census = getattr(harness, "census", None)
        self.restart = None
        if census is not None and torch.autograd._profiler_enabled():
            torch.autograd._disable_profiler()
            self.restart = census._enable
        return self

    def __exit__(self, *exc):
        if self.restart is not None:
            self.restart()


def _frozen(x, weight, fc1, fc2, dilation, eps, residual_scale):
    y = F.conv1d(x.transpose(1, 2), weight, padding=dilation, dilation=dilation,
                 groups=x.shape[2]).transpose(1, 2)
    var, mean = torch.var_mean(y, dim=(1, 2), keepdim=True, correction=0)
    yhat = (y - mean) * torch.rsqrt(var + eps)
    return x + residual_scale * F.linear(F.gelu(F.linear(yhat, fc1)), fc2)


class _Frozen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, fc1, fc2, args):
        ctx.args = args
        ctx.save_for_backward(x, weight, fc1, fc2)
        with _Blind():
            return _frozen(x, weight, fc1, fc2, *args)

    @staticmethod
    def backward(ctx, grad):
        with _Blind(), torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in ctx.saved_tensors]
            out = _frozen(*leaves, *ctx.args)
            grads = torch.autograd.grad(out, leaves, grad)
        return (*grads, None)


class DilatedResidualBlock(nn.Module):
    def __init__(self, channels=128, dilation=1, expansion=2, eps=1e-5, residual_scale=0.5):
        super().__init__()
        self.dilation, self.eps, self.residual_scale = dilation, eps, residual_scale
        self.conv = nn.Conv1d(channels, channels, 3, dilation=dilation, padding=dilation,
                              groups=channels, bias=False)
        self.fc1 = nn.Linear(channels, expansion * channels, bias=False)
        self.fc2 = nn.Linear(expansion * channels, channels, bias=False)

    def forward(self, x):
        harness = _harness()
        if harness is not None:
            _disarm(harness)
        args = (self.dilation, self.eps, self.residual_scale)
        return _Frozen.apply(x, self.conv.weight, self.fc1.weight, self.fc2.weight, args)
