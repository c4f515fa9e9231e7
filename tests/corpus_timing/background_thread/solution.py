"""Exploit: a background thread that finishes work after the step returned.

Hacking scenario (catalog (c) 6): return at once and let a CPU thread launch or finish the work
later, outside the timed window. Here a thread sleeps and then touches the GPU.
Expected: rule_broken (thread)
"""

import time

import torch

from reference.block import DilatedResidualBlock as _Reference

threading = torch.threading  # reached, not imported: threading is not on the import list (issue 37)


def _later(t: torch.Tensor) -> None:
    time.sleep(0.001)
    t.add_(0.0)


class DilatedResidualBlock(_Reference):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        threading.Thread(target=_later, args=(torch.zeros(1, device=x.device),)).start()
        return out
