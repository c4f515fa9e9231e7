"""Known bad: the forward's normalization statistics in PyTorch, its sums redispatched past the
census and paid for with one-element decoy sums.

The naive Triton block (its conv, its normalize kernel, its whole backward), except that the
Function's forward computes each example's mean and variance in PyTorch: the centred values and
their squares one example at a time, and the sums through ``OpOverload.redispatch`` to the
backend's kernel, which skips RecordFunction (no op recorded; on a GPU its reduce kernel runs with
no op linked). Beside each, one-element decoys ``y[b, :1, :1].sum()``, recorded reductions.

The trick, by an author who has read grader/census.py as it was at commit 96397b0 (issue 37,
class 5): on a GPU the parent allowed two unlinked library reductions per recorded reduction, so
the decoys bought the hidden sums' kernels; every op was below the activation; the CPU grade of
the CI cases passed. Now each library kernel needs an op of its own, one to one (a decoy's kernel
is linked to it: it buys nothing), and, what catches it on a CPU (no kernel records there): the
centring and the squares, each op half the activation, add up inside the Function to two
activations' worth of PyTorch arithmetic. Expected: rule_broken, torch-op-on-path.
"""

import torch
import triton
from naive_triton import BLOCK_L, BLOCK_N, _conv_fwd, _ConvNorm, _normalize, _pow2
from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:torch-op-on-path"

_SUM = torch.ops.aten.sum.dim_IntList


def _hidden_sum(t):
    """The backend's sum, called past the dispatcher's RecordFunction."""
    keys = torch._C.DispatchKeySet(torch._C._parse_dispatch_key(t.device.type.upper()))
    return _SUM.redispatch(keys, t, list(range(t.dim())))


class _DecoyConvNorm(_ConvNorm):
    @staticmethod
    def forward(ctx, x, weight, dilation, eps):
        x, w = x.contiguous(), weight.contiguous()
        batch, length, channels = x.shape
        n = length * channels
        y = torch.empty((batch, length, channels), device=x.device, dtype=torch.float32)
        _conv_fwd[(batch, triton.cdiv(length, BLOCK_L))](
            x, w, y, length, channels, dilation, BLOCK_L=BLOCK_L, BLOCK_C=_pow2(channels)
        )
        mean = torch.empty(batch, device=x.device, dtype=torch.float32)
        rstd = torch.empty(batch, device=x.device, dtype=torch.float32)
        for b in range(batch):
            chunk = y[b]
            m = _hidden_sum(chunk) / n
            centred = chunk - m
            squares = _hidden_sum(centred * centred)
            chunk[:1, :1].sum()  # decoys: recorded reductions of one element
            chunk[:1, :1].sum()
            mean[b] = m
            rstd[b] = torch.rsqrt(squares / n + eps)
        yhat = torch.empty_like(x)
        _normalize[(batch, triton.cdiv(n, BLOCK_N))](y, mean, rstd, yhat, n, BLOCK=BLOCK_N)
        ctx.save_for_backward(x, w, y, mean, rstd)
        ctx.dilation = dilation
        return yhat


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _DecoyConvNorm.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(torch.nn.functional.gelu(self.fc1(yhat)))
