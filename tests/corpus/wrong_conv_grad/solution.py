"""Known bad: the naive Triton block with the conv-tap gradient's taps swapped (k ↔ 2−k).

A classic transpose mistake: dw[c, 0] and dw[c, 2] exchanged. Everything else is right.
Expected: gate_failed, grad_conv.
"""

import torch.nn.functional as F
from naive_triton import DilatedResidualBlock as _Naive
from naive_triton import _ConvNorm

EXPECTED = "fail:gate_failed:grad_conv"


class _SwappedTaps(_ConvNorm):
    @staticmethod
    def backward(ctx, dyhat):
        dx, dw, _, _ = _ConvNorm.backward(ctx, dyhat)
        return dx, dw.flip(-1), None, None


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _SwappedTaps.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(F.gelu(self.fc1(yhat)))
