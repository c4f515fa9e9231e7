"""Known bad, not caught yet (GPU only): the forward's normalization statistics summed by matrix
products redispatched past the census, each riding on a visible MLP product's second kernel.

The naive Triton block (its conv, its normalize kernel, its whole backward), except that the
Function's forward sums each row of the conv's output (``y @ 1``) and each row's squares about
the mean (``c_r · c_r``, a batched product) with PyTorch's matrix products, called through
``OpOverload.redispatch``, which skips RecordFunction: no op is recorded, and on a GPU each
product's kernel runs with no op linked. Triton sums the rows per example (the naive
``_sum_rows``) and centres the conv's output (the naive ``_normalize`` with rstd 1).

The trick, by an author who has read grader/census.py as it is at commit d5bc7aa (the census
change of 2026-12-06, `_CAPACITY`): one product op accounts for two library kernels whether or
not kineto linked one of them (one bf16 ``addmm`` launched its main tiles' GEMM and its tail's
on an H100), so each visible product of the MLP (``fc1``, ``fc2``) leaves one slot a hidden
product kernel fills. The hidden products are not recorded, so rule (c) (products over the
activation with dims other than the MLP's, `reduces_by_matmul`) sees nothing; the CPU grade of
the CI cases passes.

What would catch it: tying each GEMM to its launch (the CUDA runtime's or driver's launch event
inside the op's range) where kineto left the kernel unlinked, and then a linked product accounting
for its split-K reduction only, as before. Expected, once caught: rule_broken, torch-op-on-path.
"""

import torch
import triton
from naive_triton import BLOCK_L, BLOCK_N, _conv_fwd, _ConvNorm, _normalize, _pow2, _sum_rows
from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:torch-op-on-path"
GPU_ONLY = True
XFAIL = ("a product op accounts for two library kernels, linked or not, so each visible MLP "
         "product carries one hidden product kernel (grader/census.py _CAPACITY)")


def _hidden(op, *args):
    """PyTorch's backend kernel for ``op``, called past the dispatcher's RecordFunction."""
    keys = torch._C.DispatchKeySet(torch._C._parse_dispatch_key(args[0].device.type.upper()))
    return op.redispatch(keys, *args)


def _per_example(rows: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """Each example's total of its ``length`` row values, summed by Triton."""
    part = rows.reshape(batch, length).t().contiguous()  # (length, batch)
    total = torch.empty(batch, device=rows.device, dtype=torch.float32)
    block = min(_pow2(batch), 1024)
    _sum_rows[(triton.cdiv(batch, block),)](part, total, length, batch, BLOCK=block)
    return total


class _ProductStatsConvNorm(_ConvNorm):
    @staticmethod
    def forward(ctx, x, weight, dilation, eps):
        x, w = x.contiguous(), weight.contiguous()
        batch, length, channels = x.shape
        n = length * channels
        y = torch.empty((batch, length, channels), device=x.device, dtype=torch.float32)
        _conv_fwd[(batch, triton.cdiv(length, BLOCK_L))](
            x, w, y, length, channels, dilation, BLOCK_L=BLOCK_L, BLOCK_C=_pow2(channels)
        )
        rows = y.view(batch * length, channels)
        ones = torch.ones(channels, 1, device=x.device, dtype=torch.float32)
        mean = _per_example(_hidden(torch.ops.aten.mm.default, rows, ones), batch, length) / n
        one = torch.ones(batch, device=x.device, dtype=torch.float32)
        centred = torch.empty_like(y)
        _normalize[(batch, triton.cdiv(n, BLOCK_N))](y, mean, one, centred, n, BLOCK=BLOCK_N)
        c = centred.view(batch * length, channels)
        squares = _hidden(torch.ops.aten.bmm.default, c[:, None, :], c[:, :, None])
        rstd = torch.rsqrt(_per_example(squares, batch, length) / n + eps)
        yhat = torch.empty_like(x)
        _normalize[(batch, triton.cdiv(n, BLOCK_N))](y, mean, rstd, yhat, n, BLOCK=BLOCK_N)
        ctx.save_for_backward(x, w, y, mean, rstd)
        ctx.dilation = dilation
        return yhat


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _ProductStatsConvNorm.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(torch.nn.functional.gelu(self.fc1(yhat)))
