"""Known bad: the forward's conv and statistics in PyTorch, hidden inside a torch.library custom op.

The naive Triton block (its kernels: the normalization applied by Triton, the whole backward),
except that the conv and the per-example mean and variance of the forward are PyTorch's
``F.conv1d`` and ``torch.var_mean``, inside the implementation of a custom op
``corpus_hides::conv_stats`` that the autograd.Function calls.

The trick, by an author who has read grader/child_rules.py as it was at commit 391bd45: the op log
was a ``TorchDispatchMode``; a mode sees the custom op, and its handler runs the op with the mode
switched off, so the aten ops of the op's Python implementation reach no mode. Against that grader
the CPU grade of the CI cases passed (``checked_untimed``). The census records below Python
dispatch (RecordFunction), inside the custom op too: ``aten.conv1d``, ``aten.var_mean`` and the
rest, nested under ``corpus_hides::conv_stats`` (issue #13). Expected: rule_broken,
torch-op-on-path.
"""

import torch
import torch.nn.functional as F
import triton
from naive_triton import BLOCK_N, _ConvNorm, _normalize
from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:torch-op-on-path"


@torch.library.custom_op("corpus_hides::conv_stats", mutates_args=())
def conv_stats(
    x: torch.Tensor, weight: torch.Tensor, dilation: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y = the depthwise conv of x (fp32), and each example's mean and 1/sqrt(var + eps)."""
    channels = x.shape[2]
    y = F.conv1d(x.float().transpose(1, 2), weight.float(), padding=dilation, dilation=dilation,
                 groups=channels).transpose(1, 2).contiguous()
    var, mean = torch.var_mean(y, dim=(1, 2), correction=0)
    return y, mean, torch.rsqrt(var + eps)


class _HiddenConvNorm(_ConvNorm):
    @staticmethod
    def forward(ctx, x, weight, dilation, eps):
        x, w = x.contiguous(), weight.contiguous()
        y, mean, rstd = conv_stats(x, w, dilation, eps)
        n = x.shape[1] * x.shape[2]
        yhat = torch.empty_like(x)
        _normalize[(x.shape[0], triton.cdiv(n, BLOCK_N))](y, mean, rstd, yhat, n, BLOCK=BLOCK_N)
        ctx.save_for_backward(x, w, y, mean, rstd)
        ctx.dilation = dilation
        return yhat


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _HiddenConvNorm.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(F.gelu(self.fc1(yhat)))
