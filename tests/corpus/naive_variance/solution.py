"""Known bad: variance as E[y²] − E[y]² in fp32, in one pass.

Correct on zero-mean inputs; on the offset family (inputs around 1000, the same centre-heavy taps in
every channel, so every channel's conv output shares a mean near 1000) the two terms are ~1e6 and
their difference a few units: fp32 cancels most of it away. Expected: gate_failed on the offset
case (forward or gradients).
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from naive_triton import BLOCK_L, BLOCK_N, _conv_fwd, _ConvNorm, _normalize, _pow2
from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:gate_failed:forward|grad"


@triton.jit
def _stats_one_pass(y_ptr, mean_ptr, rstd_ptr, N, eps, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    s1 = tl.zeros([BLOCK], dtype=tl.float32)
    s2 = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        v = tl.load(y_ptr + b * N + offs, mask=offs < N, other=0.0)
        s1 += v
        s2 += v * v
    mean = tl.sum(s1, axis=0) / N
    var = tl.maximum(tl.sum(s2, axis=0) / N - mean * mean, 0.0)
    tl.store(mean_ptr + b, mean)
    tl.store(rstd_ptr + b, 1.0 / tl.sqrt(var + eps))


class _OnePass(_ConvNorm):
    @staticmethod
    def forward(ctx, x, weight, dilation, eps):
        x, w = x.contiguous(), weight.contiguous()
        batch, length, channels = x.shape
        n = length * channels
        y = torch.empty(x.shape, device=x.device, dtype=torch.float32)
        _conv_fwd[(batch, triton.cdiv(length, BLOCK_L))](
            x, w, y, length, channels, dilation, BLOCK_L=BLOCK_L, BLOCK_C=_pow2(channels))
        mean = torch.empty(batch, device=x.device, dtype=torch.float32)
        rstd = torch.empty_like(mean)
        _stats_one_pass[(batch,)](y, mean, rstd, n, eps, BLOCK=BLOCK_N)
        yhat = torch.empty_like(x)
        _normalize[(batch, triton.cdiv(n, BLOCK_N))](y, mean, rstd, yhat, n, BLOCK=BLOCK_N)
        ctx.save_for_backward(x, w, y, mean, rstd)
        ctx.dilation = dilation
        return yhat


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _OnePass.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(F.gelu(self.fc1(yhat)))
