"""Input families for the correctness cases: the weights, the input and an upstream gradient.

Public: the agent may generate the same families locally. What it cannot know is the secret seed
that the grader mixes into every case's public seed (`derive_seed`), so it cannot predict values.

Families (SPEC §3):
- ``normal``: x ~ N(0, 1), weights as PyTorch's default init of the frozen block.
- ``offset``: x ~ 1000 + N(0, 1) and the same centre-heavy taps ≈ (0.05, 0.9, 0.05) in every
  channel (each perturbed by 1e-4·N(0, 1)), so the conv output of all channels shares a mean ≈ 1000
  that is large against the spread of the whole example (variance ≈ 1.4 at length 8192). A
  variance computed as E[y²] − E[y]² in fp32 loses it. The taps are centre-heavy because the
  zero-padded edge rows lose the outer taps' share of the offset: with taps ≈ 1/3 they sat 333
  below the mean and dominated the variance (≈ 30 at length 8192), which hid the cancellation.
- ``scale``: x ~ N(0, 100²): large values whose squares overflow fp16.
- ``tiny``: x ~ N(0, 1e-3²): the variance is below eps, so eps must be added where the math says.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

FAMILIES = ("normal", "offset", "scale", "tiny")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass(frozen=True)
class BlockInputs:
    """Everything one block step consumes, already in the case's dtype and on its device.

    Attributes:
        x: (B, L, C) input.
        conv_weight: (C, 1, 3).
        fc1_weight: (E·C, C).
        fc2_weight: (C, E·C).
        grad_out: (B, L, C) upstream gradient.
    """

    x: torch.Tensor
    conv_weight: torch.Tensor
    fc1_weight: torch.Tensor
    fc2_weight: torch.Tensor
    grad_out: torch.Tensor

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The block's parameters under the frozen state-dict keys."""
        return {
            "conv.weight": self.conv_weight,
            "fc1.weight": self.fc1_weight,
            "fc2.weight": self.fc2_weight,
        }


def derive_seed(public_seed: int, secret_seed: int | None = None) -> int:
    """Mix a case's public seed with the grade's secret seed into a 63-bit generator seed.

    With no secret (local checks), the public seed alone decides the values.
    """
    text = f"{public_seed}:{'' if secret_seed is None else secret_seed}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def make_inputs(
    *,
    batch: int,
    length: int,
    channels: int,
    expansion: int,
    family: str,
    dtype: str,
    seed: int,
    device: torch.device | str = "cpu",
) -> BlockInputs:
    """Draw one case's weights, input and upstream gradient.

    Values are drawn in fp64 on the CPU from a private generator (so they do not depend on the
    device or on global RNG state), then cast to ``dtype`` and moved to ``device``.

    Args:
        batch, length, channels, expansion: The block's shape.
        family: One of ``FAMILIES``.
        dtype: One of ``DTYPES``' keys.
        seed: Generator seed (already mixed with any secret).
        device: Where the tensors go.

    Raises:
        ValueError: On an unknown family or dtype, or a non-positive size.
    """
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is not one of {FAMILIES}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {tuple(DTYPES)}")
    for name, value in (("batch", batch), ("length", length), ("channels", channels),
                        ("expansion", expansion)):
        if value < 1:
            raise ValueError(f"{name}={value} must be ≥ 1")
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    hidden = expansion * channels

    def uniform(shape: tuple[int, ...], bound: float) -> torch.Tensor:
        return (torch.rand(shape, generator=gen, dtype=f64) * 2.0 - 1.0) * bound

    # nn.Conv1d / nn.Linear default init: U(−1/√fan_in, 1/√fan_in).
    if family == "offset":
        centre_heavy = torch.tensor([0.05, 0.9, 0.05], dtype=f64)
        conv = centre_heavy + 1e-4 * torch.randn((channels, 1, 3), generator=gen, dtype=f64)
    else:
        conv = uniform((channels, 1, 3), 1.0 / math.sqrt(3.0))
    fc1 = uniform((hidden, channels), 1.0 / math.sqrt(channels))
    fc2 = uniform((channels, hidden), 1.0 / math.sqrt(hidden))
    noise = torch.randn((batch, length, channels), generator=gen, dtype=f64)
    x = {
        "normal": noise,
        "offset": 1000.0 + noise,
        "scale": 100.0 * noise,
        "tiny": 1e-3 * noise,
    }[family]
    grad_out = torch.randn((batch, length, channels), generator=gen, dtype=f64)
    target = DTYPES[dtype]
    return BlockInputs(
        *(t.to(dtype=target).to(device) for t in (x, conv, fc1, fc2, grad_out))
    )
