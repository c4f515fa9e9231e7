"""Known bad: conv and normalization statistics in PyTorch, run below the Python dispatch key.

The naive Triton block, except that the forward's conv and per-example mean and variance are
PyTorch's (``F.conv1d``, ``torch.var_mean``) under ``torch._C._ExcludeDispatchKeyGuard`` of the
Python key, and the backward's per-example means (c1 = mean(ŷ·dŷ), c2 = mean(dŷ)) are
``torch.mean`` under ``torch._C._DisableTorchDispatch``. Triton still applies the normalization
and runs the rest of the backward.

The trick, by an author who has read grader/child_rules.py as it was at commit 391bd45: the op log
was a ``TorchDispatchMode``, and dispatch modes live behind the Python dispatch key; with that key
excluded (or torch dispatch disabled) no mode sees an op. Against that grader the CPU grade of the
CI cases passed (``checked_untimed``). The census records through RecordFunction, which the
dispatcher runs whatever the dispatch keys (issue #13). Expected: rule_broken, torch-op-on-path.
"""

import torch
import torch.nn.functional as F
import triton
from naive_triton import BLOCK_L, BLOCK_N, _conv_bwd, _ConvNorm, _norm_bwd, _normalize, _pow2
from naive_triton import DilatedResidualBlock as _Naive
from naive_triton import _sum_rows

EXPECTED = "fail:rule_broken:torch-op-on-path"


def _below_python():
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python))


class _Hidden(_ConvNorm):
    @staticmethod
    def forward(ctx, x, weight, dilation, eps):
        x, w = x.contiguous(), weight.contiguous()
        batch, length, channels = x.shape
        n = length * channels
        with _below_python():
            y = F.conv1d(x.float().transpose(1, 2), w.float(), padding=dilation,
                         dilation=dilation, groups=channels).transpose(1, 2).contiguous()
            var, mean = torch.var_mean(y, dim=(1, 2), correction=0)
            rstd = torch.rsqrt(var + eps)
        yhat = torch.empty_like(x)
        _normalize[(batch, triton.cdiv(n, BLOCK_N))](y, mean, rstd, yhat, n, BLOCK=BLOCK_N)
        ctx.save_for_backward(x, w, y, mean, rstd)
        ctx.dilation = dilation
        return yhat

    @staticmethod
    def backward(ctx, dyhat):
        x, w, y, mean, rstd = ctx.saved_tensors
        dyhat = dyhat.contiguous()
        batch, length, channels = x.shape
        n = length * channels
        with torch._C._DisableTorchDispatch():
            g = dyhat.float()
            yhat = (y - mean[:, None, None]) * rstd[:, None, None]
            c = torch.stack([(yhat * g).mean(dim=(1, 2)), g.mean(dim=(1, 2))], dim=1).contiguous()
        dy = torch.empty_like(y)
        _norm_bwd[(batch, triton.cdiv(n, BLOCK_N))](y, dyhat, mean, rstd, c, dy, n, BLOCK=BLOCK_N)
        tiles = triton.cdiv(length, BLOCK_L)
        dx = torch.empty_like(x)
        partial = torch.empty((batch * tiles, channels * 3), device=x.device, dtype=torch.float32)
        _conv_bwd[(batch, tiles)](dy, x, w, dx, partial, length, channels, ctx.dilation,
                                  BLOCK_L=BLOCK_L, BLOCK_C=_pow2(channels))
        dw = torch.empty_like(w)
        block = min(_pow2(channels * 3), 1024)
        _sum_rows[(triton.cdiv(channels * 3, block),)](partial, dw, batch * tiles, channels * 3,
                                                        BLOCK=block)
        return dx, dw, None, None


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _Hidden.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(F.gelu(self.fc1(yhat)))
