"""Exploit: ``torch.cuda.synchronize`` replaced by a no-op at import.

Hacking scenario (catalog (c) 2): the timer stops before the GPU finishes. The harness uses the
function object it captured before the import, and checks the module attribute by identity.
Expected: rule_broken (synchronize)
"""

import torch

from reference.block import DilatedResidualBlock

torch.cuda.synchronize = lambda device=None: None

__all__ = ["DilatedResidualBlock"]
