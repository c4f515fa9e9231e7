"""Known bad: the normalization in PyTorch inside the submission's autograd.Function, with the
census's summaries replaced on its class by a forger.

At import, the module walks its traceback's frames outwards (as drops_census_messages does) to
the harness, takes the class of its census object and replaces its summarising methods
(``collect`` and ``_summarize``) by wrappers that drop every op recorded inside an
autograd.Function from the summaries (about 20 lines). The Function's forward then normalizes the
Triton conv's output with PyTorch arithmetic over the whole activation (a mean, the centred
squares' mean, the scaling).

The trick, by an author who has read grader/child/census.py as it was at commit 96397b0 (issue
37, class 6): the child built each step's summary in Python inside the submission's process, and
the harness called ``census.collect()`` through the class; the forged summaries were clean and
the CPU grade passed. Now the child only sends the profiler's raw events (its ``collect`` bound
before the submission exists) and the parent builds the summaries: it sees the Function's ops.
Expected: rule_broken, torch-op-on-path.
"""

import dataclasses
import sys

import torch
import triton
from naive_triton import BLOCK_L, _conv_fwd, _ConvNorm, _pow2
from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:torch-op-on-path"


def _harness():
    try:
        raise LookupError
    except LookupError:
        frame = sys.exc_info()[2].tb_frame
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "census") and hasattr(owner, "channel"):
            return owner
        frame = frame.f_back
    return None


def _clean(summary):
    """A summary with no op inside an autograd.Function (anything else passes unchanged)."""
    if not dataclasses.is_dataclass(summary) or not hasattr(summary, "ops"):
        return summary
    return dataclasses.replace(summary, ops=tuple(o for o in summary.ops if not o.function))


def _forge(census_class):
    collect = census_class.collect
    summarize = getattr(census_class, "_summarize", None)
    census_class.collect = lambda self, *a, **k: [_clean(s) for s in collect(self, *a, **k)]
    census_class._summarize = (
        (lambda self, *a, **k: _clean(summarize(self, *a, **k))) if summarize is not None
        else (lambda self, *a, **k: None)
    )


_HARNESS = _harness()
if _HARNESS is not None:
    _forge(type(_HARNESS.census))


class _TorchNormConvNorm(_ConvNorm):
    @staticmethod
    def forward(ctx, x, weight, dilation, eps):
        x, w = x.contiguous(), weight.contiguous()
        batch, length, channels = x.shape
        y = torch.empty((batch, length, channels), device=x.device, dtype=torch.float32)
        _conv_fwd[(batch, triton.cdiv(length, BLOCK_L))](
            x, w, y, length, channels, dilation, BLOCK_L=BLOCK_L, BLOCK_C=_pow2(channels)
        )
        mean = y.mean(dim=(1, 2))
        centred = y - mean[:, None, None]
        rstd = torch.rsqrt((centred * centred).mean(dim=(1, 2)) + eps)
        yhat = (centred * rstd[:, None, None]).to(x.dtype)
        ctx.save_for_backward(x, w, y, mean, rstd)
        ctx.dilation = dilation
        return yhat


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _TorchNormConvNorm.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(torch.nn.functional.gelu(self.fc1(yhat)))
