"""Exploit: a global saved-tensor hook, entered at import and never left, that slows only the
baselines' steps.

Hacking scenario (by an author who has read grader/child_timing.py and grader/child_rules.py as
they were at commit 391bd45): plain PyTorch and the reference were timed in the submission's own
process, and the rule guard's snapshot of global state held flags, modes and RNG but not autograd's
default saved-tensor hooks. ``torch.autograd.graph.saved_tensors_hooks(pack, unpack).__enter__()``
makes ``pack`` run for every tensor any op saves for backward, in every block. This block (the
reference copied into the workspace) never saves a parameter that is not its own; plain
PyTorch's conv and the reference's conv+norm ``Function`` save their conv weight. So ``pack``
sleeps on the device whenever it is handed a parameter that is not this block's
(``torch.cuda._sleep``, about 1 ms, inside the baselines' timed windows), and leaves the
submission's steps alone. The answers are unchanged; only t_plain and t_ref grow. On the CPU dry
run the stand-in for the device's sleep is a host sleep of 1 s (the interpreter's Triton takes
150-660 ms a step there, plain PyTorch 3-5 ms).
Against that grader, on the CPU dry run: status ok, task score 3.000 (on the larger shape t_plain
4 → 1006 ms and t_ref 620 → 1628 ms, while t_sub stayed at 680 ms).
Why it is caught now and after the redesign: the rule guard's snapshot holds autograd's
saved-tensor hooks stack (a global hook is a change of global state); and once plain PyTorch and
the reference are timed in a trusted process of their own, no hook of the submission's reaches
them.
Expected: rule_broken (global-state)
"""

import time

import torch
from torch import nn

from reference.block import DilatedResidualBlock as _Own

DEVICE_SLEEP_CYCLES = 2_000_000  # ~1 ms at the H200's 1.98 GHz
HOST_SLEEP_S = 1.0  # the CPU dry run's stand-in


def _pack(tensor):
    if isinstance(tensor, nn.Parameter) and not getattr(tensor, "_own", False):
        if tensor.is_cuda:
            torch.cuda._sleep(DEVICE_SLEEP_CYCLES)
        else:
            time.sleep(HOST_SLEEP_S)
    return tensor


def _unpack(tensor):
    return tensor


torch.autograd.graph.saved_tensors_hooks(_pack, _unpack).__enter__()


class DilatedResidualBlock(_Own):
    def forward(self, x):
        for p in self.parameters():
            p._own = True
        return super().forward(x)
