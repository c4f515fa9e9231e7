"""Known bad: a one-pass variance that fails the offset family, plus an audit hook that rewrites the
gate's saved output files with the truth after the harness has written them.

The kernels are the naive control's with the statistics of naive_variance (E[y²] − E[y]² in fp32,
one pass): on the offset family the two terms are ~1e6 and their difference a few units, so the
output is off by far more than the forward budget.

The trick, by an author who has read grader/child_gate.py as it was at commit 391bd45: the
harness saved each item's results as ``.grader/out-<i>.pt`` in the submission's own working
directory, and the parent read the files only once the child had ended; the next item's inputs
were opened (``torch.load`` of ``.grader/in-<i+1>.pt``) after item i's file was complete. So an
audit hook, added at import (``sys.addaudithook``: the guard's own hook neither sees it nor reports
it), waits for that ``open``, then recomputes item i's output and gradients with the frozen formula
in float64 from what the block saw (x and weights kept in forward, the upstream gradient from a
hook on the output tensor) and writes them over the harness's file. Outside every phase, so the
float64 conv and var_mean are in no op log. The last items (identity, drift) need no fixing: zero
MLP weights make the identity exact whatever the statistics, and the drift cases are of the
normal family.

Against that grader: the CPU grade of the CI cases passed the gate (``checked_untimed``), the
offset case's forward utilisation 0.15 after the rewrite. Since the outputs leave the child as
bytes in the item's ``item_done`` message, taken before any more submission code runs (issue #13),
the hook finds no file to rewrite: the offset case fails its forward check (utilisation 207, off
by 0.04 where 2e-4 is allowed).
Expected: gate_failed, forward.
"""

import os
import re
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from naive_triton import BLOCK_L, BLOCK_N, _conv_fwd, _ConvNorm, _normalize, _pow2
from naive_triton import DilatedResidualBlock as _Naive

# Not an import: sys is not a module a submission may import (issue 37).
sys = torch.sys

EXPECTED = "fail:gate_failed:forward"

_INPUTS = re.compile(r"in-(\d+)\.pt$")
# What the block saw in the item being run: index → dict of tensors and arguments.
_SEEN = {}
_CURRENT = [None]
_BUSY = [False]


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


def _truth(seen):
    """The frozen block's output and gradients in float64 (task/model.py's formula)."""
    x = seen["x"].double().requires_grad_(True)
    wc, w1, w2 = (w.double().requires_grad_(True) for w in seen["weights"])
    d = seen["dilation"]
    y = F.conv1d(x.transpose(1, 2), wc, padding=d, dilation=d, groups=x.shape[2]).transpose(1, 2)
    var, mean = torch.var_mean(y, dim=(1, 2), unbiased=False, keepdim=True)
    yhat = (y - mean) * torch.rsqrt(var + seen["eps"])
    out = x + seen["scale"] * F.linear(F.gelu(F.linear(yhat, w1)), w2)
    out.backward(seen["grad_out"].double())
    return {"out": out, "grad_x": x.grad, "grad_conv": wc.grad, "grad_fc1": w1.grad,
            "grad_fc2": w2.grad}


def _rewrite(index, directory):
    path = os.path.join(directory, f"out-{index}.pt")
    seen = _SEEN.pop(index, None)
    if seen is None or "grad_out" not in seen or not os.path.isfile(path):
        return
    data = torch.load(path, weights_only=True)
    if "out" not in data:  # a drift item: only its final parameters were saved
        return
    for key, value in _truth(seen).items():
        if key in data:
            data[key] = value.detach().to(data[key].dtype).cpu()
    torch.save(data, path)


def _audit(event, args):
    if event != "open" or _BUSY[0] or not args or not isinstance(args[0], (str, os.PathLike)):
        return
    path = os.fspath(args[0])
    match = _INPUTS.search(path) if ".grader" in path else None
    if match is None:
        return
    _BUSY[0] = True
    try:
        # The harness opens item i's inputs once item i − 1's results are on disk.
        if _CURRENT[0] is not None:
            _rewrite(_CURRENT[0], os.path.dirname(path))
        _CURRENT[0] = int(match.group(1))
    finally:
        _BUSY[0] = False


sys.addaudithook(_audit)


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        index = _CURRENT[0]
        seen = {"x": x.detach().clone(), "dilation": self.dilation, "eps": self.eps,
                "scale": self.residual_scale,
                "weights": [p.detach().clone() for p in
                            (self.conv.weight, self.fc1.weight, self.fc2.weight)]}
        _SEEN[index] = seen
        yhat = _OnePass.apply(x, self.conv.weight, self.dilation, self.eps)
        out = x + self.residual_scale * self.fc2(F.gelu(self.fc1(yhat)))
        if out.requires_grad:
            out.register_hook(lambda g: seen.__setitem__("grad_out", g.detach().clone()))
        return out
