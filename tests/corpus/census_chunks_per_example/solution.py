"""Known bad: the forward's normalization in PyTorch arithmetic, one example at a time, inside the
submission's own autograd.Function.

The naive Triton block (its conv kernel, its whole backward), except that the Function's forward
normalizes with PyTorch: for each example ``b``, the mean, the variance and the normalized values
of ``y[b]`` (L·C elements). No forbidden op (no var, no layer_norm), and every op touches one
example: at batch 2, half the activation.

The trick, by an author who has read grader/census.py as it was at commit 96397b0 (issue 37,
class 5): the census judged each op by its own size, and an op below the activation was not
judged at all; the CPU grade of the CI cases passed. The census now judges each step in totals:
the elements that PyTorch arithmetic touched inside the submission's Functions, summed over the
step's ops, reach an activation's worth (here about six). Expected: rule_broken,
torch-op-on-path.
"""

import torch
import triton
from naive_triton import BLOCK_L, _conv_fwd, _ConvNorm, _pow2
from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:torch-op-on-path"


class _ChunkedConvNorm(_ConvNorm):
    @staticmethod
    def forward(ctx, x, weight, dilation, eps):
        x, w = x.contiguous(), weight.contiguous()
        batch, length, channels = x.shape
        y = torch.empty((batch, length, channels), device=x.device, dtype=torch.float32)
        _conv_fwd[(batch, triton.cdiv(length, BLOCK_L))](
            x, w, y, length, channels, dilation, BLOCK_L=BLOCK_L, BLOCK_C=_pow2(channels)
        )
        mean = torch.empty(batch, device=x.device, dtype=torch.float32)
        rstd = torch.empty(batch, device=x.device, dtype=torch.float32)
        yhat = torch.empty_like(x)
        for b in range(batch):  # one example at a time: every op below the activation
            chunk = y[b]
            m = chunk.mean()
            centred = chunk - m
            r = torch.rsqrt((centred * centred).mean() + eps)
            mean[b], rstd[b] = m, r
            yhat[b] = (centred * r).to(x.dtype)
        ctx.save_for_backward(x, w, y, mean, rstd)
        ctx.dilation = dilation
        return yhat


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _ChunkedConvNorm.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(torch.nn.functional.gelu(self.fc1(yhat)))
