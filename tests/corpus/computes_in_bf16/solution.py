"""Known bad: fp32 inputs computed in bf16 (a precision downgrade).

The naive Triton block, but the input is rounded to bf16 before the conv and ŷ is rounded to
bf16 after the normalization (Triton kernels, so the rules hold). bf16 keeps 8 bits of mantissa:
the fp32 forward budget (2e-4 absolute) is far away. Expected: gate_failed, forward.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from naive_triton import DilatedResidualBlock as _Naive
from naive_triton import _ConvNorm

EXPECTED = "fail:gate_failed:forward"


@triton.jit
def _through_bf16(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + offs, mask=offs < n).to(tl.float32)
    tl.store(dst + offs, v.to(tl.bfloat16).to(tl.float32).to(dst.dtype.element_ty), mask=offs < n)


def _round(t):
    t = t.contiguous()
    out = torch.empty_like(t)
    _through_bf16[(triton.cdiv(t.numel(), 1024),)](t, out, t.numel(), BLOCK=1024)
    return out


class _Bf16(_ConvNorm):
    @staticmethod
    def forward(ctx, x, weight, dilation, eps):
        return _round(_ConvNorm.forward(ctx, _round(x), weight, dilation, eps))


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _Bf16.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(F.gelu(self.fc1(yhat)))
