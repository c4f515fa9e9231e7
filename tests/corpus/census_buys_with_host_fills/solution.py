"""Known bad, not caught yet (GPU only): the forward's normalization applied by PyTorch, its
elementwise ops redispatched past the census and paid for with fills of host tensors.

The naive Triton block (its conv, its statistics, its whole backward), except that the Function's
forward applies ``(y - mean) · rstd`` and the cast to the input's dtype with PyTorch's own
kernels, each called through ``OpOverload.redispatch``, which skips RecordFunction: no op is
recorded, and on a GPU each elementwise kernel runs with no op linked. Beside each, a decoy:
``aten::fill_`` of a host tensor with an eighth of the activation's elements.

The trick, by an author who has read grader/census.py as it is at commit d5bc7aa (the census
change of 2026-12-06, `KERNEL_SAFE_OPS`): a memory op that launches its own kernel (a fill, a
copy) may account for one unlinked library kernel of its step, of the "other" kind, up to its
size. A fill of a *host* tensor launches no kernel, and the census records no device per op, so
each decoy buys one hidden elementwise kernel whose grid is at most its elements. The hidden ops
are not recorded, so rule (d) (PyTorch arithmetic inside the Function) sees nothing either; the
CPU grade of the CI cases passes. Statistics (reductions) cannot be bought this way: a reduction
kernel needs a reduction op (`census_decoy_sums`).

What would catch it: the device of a memory op's tensor (a fill on the host launches nothing),
or a GPU kernel tied to its launch (the CUDA runtime's launch event inside the op's range).
Expected, once caught: rule_broken, torch-op-on-path.
"""

import torch
import triton
from naive_triton import BLOCK_L, BLOCK_N, _conv_fwd, _ConvNorm, _pow2, _stats
from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:torch-op-on-path"
GPU_ONLY = True
XFAIL = ("a fill of a host tensor launches no kernel, yet as a KERNEL_SAFE_OPS op it accounts "
         "for one unlinked elementwise kernel: the census records no device per op")


def _hidden(op, *args, **kwargs):
    """PyTorch's backend kernel for ``op``, called past the dispatcher's RecordFunction."""
    keys = torch._C.DispatchKeySet(torch._C._parse_dispatch_key(args[0].device.type.upper()))
    return op.redispatch(keys, *args, **kwargs)


def _decoy(elements: int) -> None:
    """A recorded ``aten::fill_`` that launches nothing on the GPU."""
    torch.empty(max(elements, 1), dtype=torch.float32).fill_(0.0)


class _HostFillConvNorm(_ConvNorm):
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
        _stats[(batch,)](y, mean, rstd, n, eps, BLOCK=BLOCK_N)
        centred = _hidden(torch.ops.aten.sub.Tensor, y, mean[:, None, None])
        _decoy(y.numel() // 8)
        yhat = _hidden(torch.ops.aten.mul.Tensor, centred, rstd[:, None, None])
        _decoy(y.numel() // 8)
        if x.dtype != torch.float32:
            yhat = _hidden(torch.ops.aten._to_copy.default, yhat, dtype=x.dtype)
            _decoy(y.numel() // 8)
        ctx.save_for_backward(x, w, y, mean, rstd)
        ctx.dilation = dilation
        return yhat


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _HostFillConvNorm.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(torch.nn.functional.gelu(self.fc1(yhat)))
