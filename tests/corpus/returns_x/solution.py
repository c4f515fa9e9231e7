"""Known bad: returns its input (through a Triton copy kernel in an autograd.Function).

The weights are wired in with zero gradients, so every gradient exists. It passes the zero-weight
identity gate exactly (out == x, x.grad == grad_out, other grads 0), which is why the identity
check must never be the only gate. Expected: gate_failed on the forward check of ordinary cases;
the identity items themselves pass.
"""

import torch
import triton
import triton.language as tl
from torch import nn

EXPECTED = "fail:gate_failed:forward"
PASSING_KINDS = ("identity",)


@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def _triton_copy(t):
    t = t.contiguous()
    out = torch.empty_like(t)
    _copy[(triton.cdiv(t.numel(), 1024),)](t, out, t.numel(), BLOCK=1024)
    return out


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w0, w1, w2):
        ctx.save_for_backward(w0, w1, w2)
        return _triton_copy(x)

    @staticmethod
    def backward(ctx, g):
        w0, w1, w2 = ctx.saved_tensors
        return _triton_copy(g), torch.zeros_like(w0), torch.zeros_like(w1), torch.zeros_like(w2)


class DilatedResidualBlock(nn.Module):
    def __init__(self, channels=128, dilation=1, expansion=2, eps=1e-5, residual_scale=0.5):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 3, dilation=dilation, padding=dilation,
                              groups=channels, bias=False)
        self.fc1 = nn.Linear(channels, expansion * channels, bias=False)
        self.fc2 = nn.Linear(expansion * channels, channels, bias=False)

    def forward(self, x):
        return _Identity.apply(x, self.conv.weight, self.fc1.weight, self.fc2.weight)
