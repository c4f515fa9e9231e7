"""Known bad: the normalization's statistics summed by matrix products dressed as the MLP's.

The naive Triton kernels do the conv, apply the normalization and run the whole backward, in two
autograd.Functions (conv; normalize). Between them, outside both, PyTorch computes each example's
mean and variance as matrix products: with rows = y reshaped (M, C), M = batch·length, and a
selector P (M, H) whose column b is 1 on example b's rows, ``rows.t() @ P`` is every example's
per-channel sum; the second pass does the same on the centered squares (two passes, so the offset
family's large common mean does not cancel).

The trick, by an author who has read grader/child_rules.py as it was at commit 391bd45: the op log
flagged only conv/norm/variance ops and a few reductions (sum, mean, var...) over the whole
activation; a matrix product was none of them. Against that grader the CPU grade of the CI cases
passed (``checked_untimed``). Reading the census (issue #13), the author also gave the products
the MLP's dims, (C, M, H), so no dims check can tell them from fc1's and fc2's weight gradients;
but the forward of the MLP runs two products over the activation, and this forward runs four.
Expected: rule_broken, torch-op-on-path.
"""

import torch
import torch.nn.functional as F
import triton
from naive_triton import (
    BLOCK_L,
    BLOCK_N,
    _conv_bwd,
    _conv_fwd,
    _norm_bwd,
    _norm_bwd_reduce,
    _normalize,
    _pow2,
    _sum_rows,
)
from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:torch-op-on-path"


class _Conv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, dilation):
        x, w = x.contiguous(), weight.contiguous()
        batch, length, channels = x.shape
        y = torch.empty((batch, length, channels), device=x.device, dtype=torch.float32)
        _conv_fwd[(batch, triton.cdiv(length, BLOCK_L))](
            x, w, y, length, channels, dilation, BLOCK_L=BLOCK_L, BLOCK_C=_pow2(channels))
        ctx.save_for_backward(x, w)
        ctx.dilation = dilation
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy = dy.contiguous()
        batch, length, channels = x.shape
        tiles = triton.cdiv(length, BLOCK_L)
        dx = torch.empty_like(x)
        partial = torch.empty((batch * tiles, channels * 3), device=x.device, dtype=torch.float32)
        _conv_bwd[(batch, tiles)](dy, x, w, dx, partial, length, channels, ctx.dilation,
                                  BLOCK_L=BLOCK_L, BLOCK_C=_pow2(channels))
        dw = torch.empty_like(w)
        block = min(_pow2(channels * 3), 1024)
        _sum_rows[(triton.cdiv(channels * 3, block),)](partial, dw, batch * tiles, channels * 3,
                                                        BLOCK=block)
        return dx, dw, None


class _Normalize(torch.autograd.Function):
    """ŷ from y and its statistics; the backward is the norm's whole backward, in Triton."""

    @staticmethod
    def forward(ctx, y, mean, rstd, dtype):
        batch, length, channels = y.shape
        n = length * channels
        yhat = torch.empty(y.shape, device=y.device, dtype=dtype)
        _normalize[(batch, triton.cdiv(n, BLOCK_N))](y, mean, rstd, yhat, n, BLOCK=BLOCK_N)
        ctx.save_for_backward(y, mean, rstd)
        return yhat

    @staticmethod
    def backward(ctx, dyhat):
        y, mean, rstd = ctx.saved_tensors
        dyhat = dyhat.contiguous()
        batch, length, channels = y.shape
        n = length * channels
        c = torch.empty((batch, 2), device=y.device, dtype=torch.float32)
        _norm_bwd_reduce[(batch,)](y, dyhat, mean, rstd, c, n, BLOCK=BLOCK_N)
        dy = torch.empty_like(y)
        _norm_bwd[(batch, triton.cdiv(n, BLOCK_N))](y, dyhat, mean, rstd, c, dy, n, BLOCK=BLOCK_N)
        return dy, None, None, None


def _stats_by_products(y, width, eps):
    """Each example's mean and 1/sqrt(var + eps) from two products of the MLP's dims (C, M, H)."""
    batch, length, channels = y.shape
    rows = y.reshape(batch * length, channels)
    select = torch.zeros(batch * length, width, device=y.device, dtype=y.dtype)
    select[torch.arange(batch * length, device=y.device),
           torch.arange(batch * length, device=y.device) // length] = 1.0
    n = length * channels
    mean = (rows.t() @ select).sum(0)[:batch] / n
    centered = rows - mean.repeat_interleave(length)[:, None]
    var = ((centered * centered).t() @ select).sum(0)[:batch] / n
    return mean.contiguous(), torch.rsqrt(var + eps).contiguous()


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        y = _Conv.apply(x, self.conv.weight, self.dilation)
        if x.shape[0] > self.fc1.out_features:  # the selector needs a column per example
            return super().forward(x)
        with torch.no_grad():
            mean, rstd = _stats_by_products(y.detach(), self.fc1.out_features, self.eps)
        yhat = _Normalize.apply(y, mean, rstd, x.dtype)
        return x + self.residual_scale * self.fc2(F.gelu(self.fc1(yhat)))
