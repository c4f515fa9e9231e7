"""Known bad: the naive Triton block whose backward returns no gradient for the conv taps.

Forward and the input gradient are right; conv.weight.grad stays None. Expected: gate_failed,
gradients_present.
"""

import torch.nn.functional as F
from naive_triton import DilatedResidualBlock as _Naive
from naive_triton import _ConvNorm

EXPECTED = "fail:gate_failed:gradients_present"


class _NoTapGrad(_ConvNorm):
    @staticmethod
    def backward(ctx, dyhat):
        dx, _dw, _, _ = _ConvNorm.backward(ctx, dyhat)
        return dx, None, None, None


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _NoTapGrad.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(F.gelu(self.fc1(yhat)))
