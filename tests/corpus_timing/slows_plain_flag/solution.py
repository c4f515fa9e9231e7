"""Exploit: slow plain PyTorch down by turning cuDNN off (its depthwise conv falls back).

Hacking scenario: change a global backend flag that only the baseline depends on.
Expected: rule_broken (cudnn.enabled)
"""

import torch

from reference.block import DilatedResidualBlock

torch.backends.cudnn.enabled = False

__all__ = ["DilatedResidualBlock"]
