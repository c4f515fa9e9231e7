"""Known bad: the plain PyTorch block, with the harness's census and rule findings dropped on their
way to the parent.

At import, the module raises and catches an exception and walks its traceback's frames outwards
(``tb.tb_frame.f_back``: no audit event) to the harness; it disarms the harness's guard (as
disables_guard_via_frames does) and wraps the harness's channel writer so that ``census`` and
``finding`` messages never leave the child. Every other message goes out as the harness sends it,
so the channel's sequence numbers have no gap. The block is then the frozen PyTorch block.

The census itself sees every PyTorch op of every step; what it reports never arrives. Only the
parent can notice: an item that ends (``item_done``) with no census of any step, or with a step
announced and never reported (`grader.census.CensusLedger.close_item`, in ``grader/gate.py``'s
``item_done`` branch).
Expected: rule_broken, census-tampered.
"""

import sys

import torch
import torch.nn.functional as F
from torch import nn

EXPECTED = "fail:rule_broken:census-tampered"


def _harness():
    try:
        raise LookupError
    except LookupError:
        frame = sys.exc_info()[2].tb_frame
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "guard") and hasattr(owner, "channel"):
            return owner
        frame = frame.f_back
    return None


def _silence(harness):
    guard = harness.guard
    for name in ("check_launches", "check_autograd", "check_module", "_add"):
        setattr(guard, name, lambda *args, **kwargs: None)
    guard.findings.clear()
    send = harness.channel.send

    def filtered(event, *args, **kwargs):
        if event in ("census", "finding"):
            return None
        return send(event, *args, **kwargs)

    harness.channel.send = filtered


_HARNESS = _harness()
if _HARNESS is not None:
    _silence(_HARNESS)


class DilatedResidualBlock(nn.Module):
    def __init__(self, channels=128, dilation=1, expansion=2, eps=1e-5, residual_scale=0.5):
        super().__init__()
        self.dilation, self.eps, self.residual_scale = dilation, eps, residual_scale
        self.conv = nn.Conv1d(channels, channels, 3, dilation=dilation, padding=dilation,
                              groups=channels, bias=False)
        self.fc1 = nn.Linear(channels, expansion * channels, bias=False)
        self.fc2 = nn.Linear(expansion * channels, channels, bias=False)

    def forward(self, x):
        y = self.conv(x.transpose(1, 2)).transpose(1, 2)
        var, mean = torch.var_mean(y, dim=(1, 2), keepdim=True, correction=0)
        yhat = (y - mean) * torch.rsqrt(var + self.eps)
        return x + self.residual_scale * self.fc2(F.gelu(self.fc1(yhat)))
